/* The CPU backend's table: instances are thread pools, weights are the
 * model's own (memory-mapped or read) tensors and packed copies of its
 * matrices (weights.c), KV stores are host arrays. */
#include "backend/cpu/cpu.h"
#include "kv/kv.h"

static llm_status cpu_open(const llmi_backend_config *cfg, void **out) {
    *out = NULL;
    if (cfg->device != 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "the CPU backend has only device 0, not %d",
                          (int)cfg->device);
    if (cfg->n_threads == 0 || cfg->n_threads > LLMI_POOL_MAX_THREADS)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "%u CPU threads", cfg->n_threads);
    llmi_pool *pool;
    LLMI_TRY(llmi_pool_create((int)cfg->n_threads, &pool));
    *out = pool;
    return LLM_OK;
}

static void cpu_close(void *backend) { llmi_pool_free(backend); }

static llm_status cpu_weights_load(const llm_model *m, int32_t device, void **out) {
    *out = NULL;
    if (device != 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "the CPU backend has only device 0, not %d",
                          (int)device);
    llmi_cpu_weights *cw;
    LLMI_TRY(llmi_cpu_weights_load(m, &cw));
    *out = cw;
    return LLM_OK;
}

static void cpu_weights_free(void *weights) { llmi_cpu_weights_free(weights); }

static void cpu_kv_free(void *ctx) {
    llmi_cpu_kv *kv = ctx;
    if (!kv)
        return;
    for (uint32_t l = 0; kv->k && l < kv->layout.n_layer; l++)
        llmi_free_aligned(kv->k[l]);
    for (uint32_t l = 0; kv->v && l < kv->layout.n_layer; l++)
        llmi_free_aligned(kv->v[l]);
    llmi_free(kv->k);
    llmi_free(kv->v);
    llmi_free(kv);
}

static llm_status cpu_kv_create(void *backend, const llmi_kv_layout *layout, void **out) {
    (void)backend;
    *out = NULL;
    llmi_ttype ttype;
    if (!llmi_kv_ttype(layout->type, &ttype))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "KV store of unknown element type %d",
                          (int)layout->type);
    /* Block types need whole blocks per head (the engine checks head_dim). */
    const size_t row_bytes = llmi_kv_row_bytes(layout->type, layout->kv_dim);
    const size_t head_bytes = llmi_kv_row_bytes(layout->type, layout->head_dim);
    if (row_bytes == 0 || (layout->head_dim && head_bytes == 0))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "a %s KV store needs rows (%u) and heads (%u) of whole blocks",
                          llmi_ttype_get(ttype)->name, layout->kv_dim, layout->head_dim);
    size_t slots, per_layer;
    if (!llmi_mul_ok(layout->n_blocks, layout->block_size, &slots) ||
        !llmi_mul_ok(slots, row_bytes, &per_layer))
        return llmi_error(LLM_ERR_LIMIT, "KV store of %u blocks overflows", layout->n_blocks);
    llmi_cpu_kv *kv = llmi_calloc(1, sizeof *kv);
    if (!kv)
        return llmi_oom("KV store");
    kv->layout = *layout;
    kv->elem_size = llmi_kv_type_size(layout->type);
    kv->row_bytes = row_bytes;
    kv->head_bytes = head_bytes;
    kv->k = llmi_calloc(layout->n_layer, sizeof *kv->k);
    kv->v = llmi_calloc(layout->n_layer, sizeof *kv->v);
    if (!kv->k || !kv->v)
        goto oom;
    for (uint32_t l = 0; l < layout->n_layer; l++) {
        kv->k[l] = llmi_malloc_aligned(per_layer);
        kv->v[l] = llmi_malloc_aligned(per_layer);
        if (!kv->k[l] || !kv->v[l])
            goto oom;
    }
    *out = kv;
    return LLM_OK;
oom:
    cpu_kv_free(kv);
    return llmi_oom("KV store blocks");
}

static llm_status cpu_kv_copy(void *ctx, uint32_t dst, uint32_t src, uint32_t n_slots) {
    llmi_cpu_kv *kv = ctx;
    uint32_t bs = kv->layout.block_size;
    size_t bytes = (size_t)n_slots * kv->row_bytes;
    for (uint32_t l = 0; bytes && l < kv->layout.n_layer; l++) {
        memcpy(llmi_cpu_kv_row(kv, l, false, dst * bs), llmi_cpu_kv_row(kv, l, false, src * bs),
               bytes);
        memcpy(llmi_cpu_kv_row(kv, l, true, dst * bs), llmi_cpu_kv_row(kv, l, true, src * bs),
               bytes);
    }
    return LLM_OK;
}

static llm_status cpu_kv_read(void *ctx, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                              void *dst) {
    llmi_cpu_kv *kv = ctx;
    memcpy(dst, llmi_cpu_kv_row(kv, layer, v, slot), (size_t)n * kv->row_bytes);
    return LLM_OK;
}

static llm_status cpu_kv_write(void *ctx, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                               const void *src) {
    llmi_cpu_kv *kv = ctx;
    memcpy(llmi_cpu_kv_row(kv, layer, v, slot), src, (size_t)n * kv->row_bytes);
    return LLM_OK;
}

/* Steps run synchronously on the calling thread and the pool. */
static llm_status cpu_sync(void *backend) {
    (void)backend;
    return LLM_OK;
}

const llmi_backend_ops llmi_backend_cpu = {
    .version = LLMI_BACKEND_VERSION,
    .name = "cpu",
    .probe = NULL,
    .open = cpu_open,
    .close = cpu_close,
    .weights_load = cpu_weights_load,
    .weights_free = cpu_weights_free,
    .kv_create = cpu_kv_create,
    .kv_free = cpu_kv_free,
    .kv_copy = cpu_kv_copy,
    .kv_read = cpu_kv_read,
    .kv_write = cpu_kv_write,
    .step_create = llmi_cpu_step_create,
    .step_free = llmi_cpu_step_free,
    .step_run = llmi_cpu_step_run,
    .sync = cpu_sync,
    .step_set_f32_activations = llmi_cpu_step_set_f32_activations,
    .step_run_hidden = llmi_cpu_step_run_hidden,
    .lora = true, /* lora.c */
};
