/* NCCL for tensor parallelism across GPUs, loaded with dlopen
 * (libnccl.so.2) the first time a tensor-parallel size above 1 asks for
 * it: the plug-in neither links NCCL nor needs it installed otherwise.
 *
 * Every failure is a status and a message naming the rank: a missing
 * library or entry point is LLM_ERR_UNSUPPORTED; an NCCL or CUDA error,
 * and a collective or a join that does not finish within its time-out,
 * are LLM_ERR_BACKEND (the communicator is then aborted, so no rank waits
 * forever for a peer that is gone). */
#ifndef LLMI_CUDA_NCCL_COMM_H
#define LLMI_CUDA_NCCL_COMM_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LLMI_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef struct llmi_nccl_comm llmi_nccl_comm;

/* Loads NCCL once (the file LLM_NCCL_LIBRARY names, else libnccl.so.2)
 * and resolves its entry points; *version is NCCL's (e.g. 22807 for
 * 2.28.7). Thread-safe; later calls return the first call's result. */
llm_status llmi_nccl_load(int *version);

/* One process driving n GPUs (n >= 1): out[r] is rank r's communicator,
 * on devices[r]. */
llm_status llmi_nccl_comm_init_all(uint32_t n, const int32_t *devices, llmi_nccl_comm **out);

/* Several processes, one GPU each: rank 0 makes the id, the host hands it
 * to the other processes, and each joins with its rank and the world
 * size on `device`, waiting at most timeout_ms for the others. */
llm_status llmi_nccl_unique_id(uint8_t id[LLMI_NCCL_ID_BYTES]);
llm_status llmi_nccl_comm_join(const uint8_t id[LLMI_NCCL_ID_BYTES], uint32_t rank,
                               uint32_t world, int32_t device, uint32_t timeout_ms,
                               llmi_nccl_comm **out);

uint32_t llmi_nccl_comm_rank(const llmi_nccl_comm *c);
/* Destroys a healthy communicator, aborts one that failed; NULL is a no-op. */
void llmi_nccl_comm_free(llmi_nccl_comm *c);

/* Collectives on f32 device buffers, enqueued on `stream` (every rank calls
 * the same ones in the same order; with one process driving several GPUs,
 * the calls of all ranks go between llmi_nccl_group_begin and _end). */
llm_status llmi_nccl_all_reduce(llmi_nccl_comm *c, const float *send, float *recv, size_t n,
                                cudaStream_t stream);
/* recv[r * n .. (r + 1) * n) = rank r's send, on every rank. */
llm_status llmi_nccl_all_gather(llmi_nccl_comm *c, const float *send, float *recv, size_t n,
                                cudaStream_t stream);
llm_status llmi_nccl_broadcast(llmi_nccl_comm *c, const float *send, float *recv, size_t n,
                               uint32_t root, cudaStream_t stream);
llm_status llmi_nccl_group_begin(void);
llm_status llmi_nccl_group_end(void);

/* Waits until `stream` is done, watching the communicator: an NCCL error,
 * or timeout_ms passing, aborts it and fails naming the rank. */
llm_status llmi_nccl_wait(llmi_nccl_comm *c, cudaStream_t stream, uint32_t timeout_ms);

#ifdef __cplusplus
}
#endif

#endif
