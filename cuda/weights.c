/* A model's weights on a CUDA device: every tensor the forward pass reads,
 * uploaded once, in its file's type, into one device allocation at the
 * offsets llmi_cuda_weights_plan gives (a tied output is the embedding's
 * copy). Models the kernels cannot run are refused here, before anything is
 * allocated, naming the tensor or the feature. */
#include "cuda_backend.h"
#include "upload.h"

#include <stdlib.h>
#include <unistd.h>

void llmi_cuda_weights_free(void *weights) {
    llmi_cuda_weights *w = weights;
    if (!w)
        return;
    if (w->arena) {
        cudaSetDevice(w->device);
        cudaFree(w->arena);
    }
    free(w->mats);
    free(w);
}

enum {
    STAGING_BUFFERS = 3,
    STAGING_BYTES = 64u << 20,
    STAGING_THREADS = 8, /* most threads filling a buffer */
};

typedef struct staging {
    char *arena;
    cudaStream_t stream;
    cudaEvent_t sent[STAGING_BUFFERS];
} staging;

static llm_status staging_wait(void *ctx, unsigned slot) {
    staging *g = ctx;
    /* An event never recorded counts as complete. */
    return llmi_cuda_call(cudaEventSynchronize(g->sent[slot]), "uploading the weights");
}

static llm_status staging_send(void *ctx, unsigned slot, const char *buffer,
                               const llmi_upload_seg *segs, size_t n) {
    staging *g = ctx;
    for (size_t i = 0; i < n; i++)
        LLMI_TRY(llmi_cuda_call(cudaMemcpyAsync(g->arena + segs[i].dst, buffer + segs[i].staged,
                                                segs[i].bytes, cudaMemcpyHostToDevice, g->stream),
                                "uploading the weights"));
    return llmi_cuda_call(cudaEventRecord(g->sent[slot], g->stream), "uploading the weights");
}

/* The items through pinned staging buffers (upload.h). Returns
 * LLM_ERR_UNSUPPORTED, having copied nothing, when pinned memory or a
 * stream cannot be had: the caller then copies from pageable memory. */
static llm_status upload_staged(char *arena, const llmi_upload_item *items, size_t n,
                                size_t total) {
    size_t each = total < STAGING_BYTES ? total : STAGING_BYTES;
    unsigned n_buffers = total <= each ? 1 : STAGING_BUFFERS;
    staging g = {.arena = arena};
    char *buffers[STAGING_BUFFERS] = {NULL};
    unsigned made_events = 0, made_buffers = 0;
    bool ok = cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking) == cudaSuccess;
    if (!ok)
        g.stream = NULL;
    while (ok && made_events < n_buffers)
        if ((ok = cudaEventCreateWithFlags(&g.sent[made_events], cudaEventDisableTiming) ==
                  cudaSuccess))
            made_events++;
    while (ok && made_buffers < n_buffers)
        if ((ok = cudaMallocHost((void **)&buffers[made_buffers], each) == cudaSuccess))
            made_buffers++;
    llm_status st = LLM_ERR_UNSUPPORTED;
    if (ok) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        unsigned threads = cores < 1                 ? 1
                           : cores > STAGING_THREADS ? STAGING_THREADS
                                                     : (unsigned)cores;
        const llmi_upload_ops ops = {staging_wait, staging_send, &g};
        st = llmi_upload_run(items, n, buffers, n_buffers, each, threads, &ops);
        llm_status done = llmi_cuda_call(cudaStreamSynchronize(g.stream), "uploading the weights");
        if (st == LLM_OK)
            st = done;
    } else {
        cudaGetLastError(); /* the failed allocation is not this upload's error */
    }
    for (unsigned i = 0; i < made_buffers; i++)
        cudaFreeHost(buffers[i]);
    for (unsigned i = 0; i < made_events; i++)
        cudaEventDestroy(g.sent[i]);
    if (g.stream)
        cudaStreamDestroy(g.stream);
    return st;
}

/* Copies every planned weight into the arena and describes it in w->mats. */
static llm_status upload(llmi_cuda_weights *w, const llm_model *m, const size_t *offsets,
                         size_t n) {
    llmi_upload_item *items = malloc((n ? n : 1) * sizeof *items);
    if (!items)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: CUDA upload list");
    size_t n_items = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        if (offsets[i] == SIZE_MAX)
            continue;
        const llmi_weight *src = llmi_cuda_weight_at(m, i);
        char *dst = (char *)w->arena + offsets[i];
        const bool shared = i == LLMI_ROLE_OUTPUT && offsets[i] == offsets[LLMI_ROLE_TOKEN_EMBD];
        if (!shared) {
            items[n_items++] = (llmi_upload_item){
                .src = src->data, .bytes = (size_t)src->rows * src->row_bytes, .dst = offsets[i]};
            total += (size_t)src->rows * src->row_bytes;
        }
        w->mats[i] = (llmi_cu_matrix){.data = dst,
                                      .type = src->type,
                                      .rows = (uint32_t)src->rows,
                                      .cols = (uint32_t)src->cols,
                                      .row_bytes = src->row_bytes};
    }
    llm_status st = upload_staged(w->arena, items, n_items, total);
    if (st == LLM_ERR_UNSUPPORTED) {
        llmi_cuda_log(LLM_LOG_WARN, "CUDA: no pinned staging memory; uploading the weights "
                                    "from pageable memory (slower)");
        st = LLM_OK;
        for (size_t i = 0; st == LLM_OK && i < n_items; i++)
            st = llmi_cuda_call(cudaMemcpy((char *)w->arena + items[i].dst, items[i].src,
                                           items[i].bytes, cudaMemcpyHostToDevice),
                                "uploading the weights");
        /* Copies from pageable memory may still be in flight on the legacy
         * stream, which the instances' non-blocking streams do not wait for. */
        if (st == LLM_OK)
            st = llmi_cuda_call(cudaDeviceSynchronize(), "uploading the weights");
    }
    free(items);
    return st;
}

llm_status llmi_cuda_weights_load(const llm_model *m, int32_t device, void **out) {
    *out = NULL;
    char why[320];
    llm_status st = llmi_cuda_model_check(m, llmi_cu_type_supported, why, sizeof why);
    if (st != LLM_OK)
        return llmi_cuda_error(st, "%s", why);
    uint32_t n_dev = 0;
    llmi_cuda_device_count(&n_dev);
    if (device < 0 || (uint32_t)device >= n_dev)
        return llmi_cuda_error(LLM_ERR_INVALID_ARGUMENT, "CUDA device %d does not exist",
                               (int)device);
    const size_t n = llmi_cuda_weight_slots(m);
    size_t *offsets = malloc(n * sizeof *offsets);
    llmi_cuda_weights *w = calloc(1, sizeof *w);
    if (w)
        w->mats = calloc(n, sizeof *w->mats);
    if (!offsets || !w || !w->mats) {
        free(offsets);
        llmi_cuda_weights_free(w);
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: CUDA weight table");
    }
    w->device = device;
    w->n_layer = m->hp.n_layer;
    size_t total = 0;
    if (!llmi_cuda_weights_plan(m, offsets, &total))
        st = llmi_cuda_error(LLM_ERR_LIMIT, "the model's weights overflow the address space");
    if (st == LLM_OK)
        st = llmi_cuda_use_device(device);
    if (st == LLM_OK)
        st = llmi_cuda_alloc(&w->arena, total, "the weights");
    if (st == LLM_OK)
        st = upload(w, m, offsets, n);
    free(offsets);
    if (st != LLM_OK) {
        llmi_cuda_weights_free(w);
        return st;
    }
    w->bytes = total;
    llmi_cuda_log(LLM_LOG_INFO, "CUDA device %d: %.1f MiB of weights uploaded", (int)device,
                  (double)total / 1048576.0);
    *out = w;
    return LLM_OK;
}
