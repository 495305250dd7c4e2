/* The tp backend's weight shards (shard.c). */
#ifndef LLMI_BACKEND_TP_SHARD_H
#define LLMI_BACKEND_TP_SHARD_H

#include "backend/cpu/cpu.h"
#include "backend/tp/split.h"

#include <inttypes.h>
#include <stdio.h>

/* One llm_model per rank, whose weights are views of the model's
 * tensors; hp carries the rank's n_head, n_head_kv, n_ff and n_vocab. Only
 * what the CPU step reads is meaningful (not the tokenizer's ownership: the
 * shards own nothing but their layer arrays). */
typedef struct llmi_tp_weights {
    uint32_t n_ranks;
    llm_model shard[LLMI_TP_MAX];
    uint32_t vocab0[LLMI_TP_MAX]; /* the first output row of each rank */
    /* Each rank's first KV head, FFN column and embedding feature. */
    uint32_t kv0[LLMI_TP_MAX], ff0[LLMI_TP_MAX], embd0[LLMI_TP_MAX];
    /* Each rank's CPU weights: its views with packed copies of its slices
     * (backend/cpu/cpu.h), what its step reads. */
    llmi_cpu_weights *cpu[LLMI_TP_MAX];
} llmi_tp_weights;

llm_status llmi_tp_weights_create(const llm_model *m, uint32_t n_ranks, llmi_tp_weights **out);
void llmi_tp_weights_free(llmi_tp_weights *w);

#endif
