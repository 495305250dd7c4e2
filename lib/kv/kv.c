/* Block pool and per-sequence block tables. */
#include "kv/kv.h"

size_t llmi_kv_block_bytes(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size) {
    return (size_t)2 * n_layer * kv_dim * block_size * sizeof(float);
}

llm_status llmi_kv_create(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size,
                          uint32_t n_blocks, llmi_kv **out) {
    *out = NULL;
    if (n_layer == 0 || kv_dim == 0 || block_size == 0 || n_blocks == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "KV cache with a zero dimension");
    size_t per_layer;
    if (!llmi_mul_ok((size_t)n_blocks * block_size, (size_t)kv_dim * sizeof(float), &per_layer))
        return llmi_error(LLM_ERR_LIMIT, "KV cache of %u blocks overflows", n_blocks);
    llmi_kv *kv = llmi_calloc(1, sizeof *kv);
    if (!kv) return llmi_oom("KV cache");
    kv->n_layer = n_layer;
    kv->kv_dim = kv_dim;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->k = llmi_calloc(n_layer, sizeof *kv->k);
    kv->v = llmi_calloc(n_layer, sizeof *kv->v);
    kv->free_stack = llmi_calloc(n_blocks, sizeof *kv->free_stack);
    if (!kv->k || !kv->v || !kv->free_stack) goto oom;
    for (uint32_t l = 0; l < n_layer; l++) {
        kv->k[l] = llmi_malloc_aligned(per_layer);
        kv->v[l] = llmi_malloc_aligned(per_layer);
        if (!kv->k[l] || !kv->v[l]) goto oom;
    }
    /* Hand out low block ids first: stack top is the end of the array. */
    for (uint32_t i = 0; i < n_blocks; i++) kv->free_stack[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    *out = kv;
    return LLM_OK;
oom:
    llmi_kv_free(kv);
    return llmi_oom("KV cache blocks");
}

void llmi_kv_free(llmi_kv *kv) {
    if (!kv) return;
    for (uint32_t l = 0; kv->k && l < kv->n_layer; l++) llmi_free_aligned(kv->k[l]);
    for (uint32_t l = 0; kv->v && l < kv->n_layer; l++) llmi_free_aligned(kv->v[l]);
    llmi_free(kv->k);
    llmi_free(kv->v);
    llmi_free(kv->free_stack);
    llmi_free(kv);
}

llm_status llmi_kv_seq_reserve(llmi_kv *kv, llmi_kv_seq *seq, uint32_t n_tokens) {
    uint32_t need = (uint32_t)(((uint64_t)n_tokens + kv->block_size - 1) / kv->block_size);
    if (need <= seq->n_blocks) return LLM_OK;
    uint32_t extra = need - seq->n_blocks;
    if (extra > kv->n_free)
        return llmi_error(LLM_ERR_LIMIT,
                          "KV cache full: %u tokens need %u more blocks, %u of %u free",
                          n_tokens, extra, kv->n_free, kv->n_blocks);
    if (need > seq->cap) {
        uint32_t cap = seq->cap ? seq->cap : 8;
        while (cap < need) cap *= 2;
        uint32_t *t = llmi_realloc(seq->blocks, (size_t)cap * sizeof *t);
        if (!t) return llmi_oom("block table");
        seq->blocks = t;
        seq->cap = cap;
    }
    while (seq->n_blocks < need) seq->blocks[seq->n_blocks++] = kv->free_stack[--kv->n_free];
    return LLM_OK;
}

void llmi_kv_seq_release(llmi_kv *kv, llmi_kv_seq *seq) {
    while (seq->n_blocks > 0) kv->free_stack[kv->n_free++] = seq->blocks[--seq->n_blocks];
    seq->n_tokens = 0;
}

void llmi_kv_seq_destroy(llmi_kv *kv, llmi_kv_seq *seq) {
    llmi_kv_seq_release(kv, seq);
    llmi_free(seq->blocks);
    memset(seq, 0, sizeof *seq);
}
