/* Block-paged KV cache. Memory is a pool of fixed-size blocks (block_size
 * token slots, all layers); a sequence owns a block table mapping position p
 * to (table[p / block_size], p % block_size). Attention reads through the
 * table, so sequences never need contiguous memory and never move. */
#ifndef LLMI_KV_H
#define LLMI_KV_H

#include "core/core.h"

#include <stdbool.h>

typedef struct llmi_kv {
    uint32_t n_layer, kv_dim, block_size, n_blocks;
    /* Per layer: n_blocks * block_size * kv_dim floats, block-major. */
    float **k, **v;
    uint32_t *free_stack; /* ids of free blocks */
    uint32_t n_free;
} llmi_kv;

typedef struct llmi_kv_seq {
    uint32_t *blocks;  /* block table */
    uint32_t n_blocks; /* blocks held */
    uint32_t cap;      /* table capacity */
    uint32_t n_tokens; /* positions [0, n_tokens) hold valid K/V */
} llmi_kv_seq;

llm_status llmi_kv_create(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size,
                          uint32_t n_blocks, llmi_kv **out);
void llmi_kv_free(llmi_kv *kv);
/* Bytes one block takes (K and V, all layers). */
size_t llmi_kv_block_bytes(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size);

/* Ensures `seq` has blocks for positions [0, n_tokens). On failure
 * (LLM_ERR_LIMIT: pool exhausted) the sequence is unchanged. */
llm_status llmi_kv_seq_reserve(llmi_kv *kv, llmi_kv_seq *seq, uint32_t n_tokens);
/* Returns every block to the pool and empties the sequence. */
void llmi_kv_seq_release(llmi_kv *kv, llmi_kv_seq *seq);
void llmi_kv_seq_destroy(llmi_kv *kv, llmi_kv_seq *seq);

static inline float *llmi_kv_k(const llmi_kv *kv, uint32_t layer, const llmi_kv_seq *seq,
                               uint32_t pos) {
    size_t slot = (size_t)seq->blocks[pos / kv->block_size] * kv->block_size +
                  pos % kv->block_size;
    return kv->k[layer] + slot * kv->kv_dim;
}
static inline float *llmi_kv_v(const llmi_kv *kv, uint32_t layer, const llmi_kv_seq *seq,
                               uint32_t pos) {
    size_t slot = (size_t)seq->blocks[pos / kv->block_size] * kv->block_size +
                  pos % kv->block_size;
    return kv->v[layer] + slot * kv->kv_dim;
}

#endif
