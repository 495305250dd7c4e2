/* A model's weights on a CUDA device: every tensor the forward pass reads,
 * uploaded once, in its file's type, into one device allocation at the
 * offsets llmi_cuda_weights_plan gives (a tied output is the embedding's
 * copy). Models the kernels cannot run are refused here, before anything is
 * allocated, naming the tensor or the feature. */
#include "cuda_backend.h"

#include <stdlib.h>

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

/* Copies every planned weight into the arena and describes it in w->mats. */
static llm_status upload(llmi_cuda_weights *w, const llm_model *m, const size_t *offsets,
                         size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (offsets[i] == SIZE_MAX)
            continue;
        const llmi_weight *src = llmi_cuda_weight_at(m, i);
        char *dst = (char *)w->arena + offsets[i];
        const bool shared = i == LLMI_ROLE_OUTPUT && offsets[i] == offsets[LLMI_ROLE_TOKEN_EMBD];
        if (!shared) {
            llm_status st =
                llmi_cuda_call(cudaMemcpy(dst, src->data, (size_t)src->rows * src->row_bytes,
                                          cudaMemcpyHostToDevice),
                               "uploading the weights");
            if (st != LLM_OK)
                return st;
        }
        w->mats[i] = (llmi_cu_matrix){.data = dst,
                                      .type = src->type,
                                      .rows = (uint32_t)src->rows,
                                      .cols = (uint32_t)src->cols,
                                      .row_bytes = src->row_bytes};
    }
    /* Copies from pageable memory may still be in flight on the legacy
     * stream, which the instances' non-blocking streams do not wait for. */
    return llmi_cuda_call(cudaDeviceSynchronize(), "uploading the weights");
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
