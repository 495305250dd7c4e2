/* How a model splits across tensor-parallel ranks (split.c): the limit on
 * ranks, the slice of a dimension each rank computes, and the KV heads each
 * holds. The lowest file of backend/tp/: the weight shards (shard.h) and the
 * tp backend (tp.h) both build on it. */
#ifndef LLMI_BACKEND_TP_SPLIT_H
#define LLMI_BACKEND_TP_SPLIT_H

#include "model/model.h"

#include <stdint.h>

#define LLMI_TP_MAX 8 /* ranks */

/* LLM_OK when `m` splits across n_ranks ranks; otherwise
 * LLM_ERR_UNSUPPORTED with a message naming what does not split and the
 * sizes that work. */
llm_status llmi_tp_check(const llm_model *m, uint32_t n_ranks);

/* Rank r's slice of a dimension of `full` elements: [*begin, *end), the
 * same rule for every split dimension (FFN columns, embedding features,
 * vocabulary rows), so slices of ranks in order tile the dimension. */
static inline void llmi_tp_slice(uint32_t full, uint32_t n_ranks, uint32_t rank, uint32_t *begin,
                                 uint32_t *end) {
    *begin = (uint32_t)((uint64_t)full * rank / n_ranks);
    *end = (uint32_t)((uint64_t)full * (rank + 1) / n_ranks);
}

/* KV heads [*kv0, *kv0 + *n_kv) of rank `rank` (llmi_tp_check passed). */
void llmi_tp_split_heads(uint32_t n_head_kv, uint32_t n_ranks, uint32_t rank, uint32_t *kv0,
                         uint32_t *n_kv);
/* The first rank holding KV head `head`. */
uint32_t llmi_tp_kv_owner(uint32_t n_head_kv, uint32_t n_ranks, uint32_t head);

#endif
