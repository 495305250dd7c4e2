/* Copying a model's weights to a device through pinned staging buffers.
 *
 * A plain cudaMemcpy from pageable memory (a mapped file) runs at the speed
 * of one thread touching the pages and the driver's own bounce buffer:
 * about 5 GB/s on an H200 host, 3 s for 16 GB. Here several threads copy
 * the file's bytes into one of a few pinned buffers while the previous
 * buffer travels to the device, so the two overlap and the page faults
 * are spread over cores.
 *
 * This file is the host side, free of CUDA so that host tests run it: the
 * caller hands the device side in as two operations (weights.c: wait for a
 * buffer's event; enqueue its copies on a stream and record the event). */
#ifndef LLMI_CUDA_UPLOAD_H
#define LLMI_CUDA_UPLOAD_H

#include <llm.h>

#include <stddef.h>

/* One tensor: `bytes` host bytes at `src` go to offset `dst` of the
 * destination. */
typedef struct llmi_upload_item {
    const void *src;
    size_t bytes;
    size_t dst;
} llmi_upload_item;

/* A run of a staging buffer: `bytes` at offset `staged` of the buffer go to
 * offset `dst` of the destination. */
typedef struct llmi_upload_seg {
    size_t staged, dst, bytes;
} llmi_upload_seg;

typedef struct llmi_upload_ops {
    /* Returns once staging buffer `slot` may be written again (its last
     * send has been read). */
    llm_status (*wait)(void *ctx, unsigned slot);
    /* Starts copying the `n` segments of `buffer` (staging buffer `slot`)
     * to the destination; `segs` may be reused once this returns. */
    llm_status (*send)(void *ctx, unsigned slot, const char *buffer, const llmi_upload_seg *segs,
                       size_t n);
    void *ctx;
} llmi_upload_ops;

/* Copies every item through `n_buffers` staging buffers of `buffer_bytes`
 * each, used in turn, filling each with up to `n_threads` threads. Returns
 * the first failing operation's status (LLM_ERR_OUT_OF_MEMORY if its own
 * segment table cannot be allocated); the caller waits for the last sends
 * to finish. */
llm_status llmi_upload_run(const llmi_upload_item *items, size_t n_items, char *const *buffers,
                           unsigned n_buffers, size_t buffer_bytes, unsigned n_threads,
                           const llmi_upload_ops *ops);

#endif
