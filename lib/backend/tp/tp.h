/* Tensor parallelism on CPU ranks: a backend that drives N CPU backend
 * instances (ranks) as threads of one process. Each rank holds a shard of
 * the weights and the K/V of its heads (shard.c). The split is exact: every
 * output element of every matmul is computed by one rank with the whole
 * input row, as on one CPU, so logits are bit-identical at any TP size
 * (docs/tensor-parallel.md). LoRA adapters follow the same split: each
 * rank adds the update to its own output columns only, from the whole
 * input row (backend/cpu/lora.h), so they keep the bits too. The ranks
 * meet at all-gathers through a communicator (comm.c). */
#ifndef LLMI_BACKEND_TP_H
#define LLMI_BACKEND_TP_H

#include "backend/backend.h"
#include "backend/tp/split.h"

/* The table for `n_ranks` ranks (1 .. LLMI_TP_MAX), named "tp"; NULL
 * outside that range. One table per size, so that the shared weights
 * (keyed by table) of each size are loaded once. */
const llmi_backend_ops *llmi_backend_tp(uint32_t n_ranks);

/* ---- the communicator ----
 *
 * An ops table, so that a communicator of device ranks (NCCL) can stand in
 * for the in-process one. Collectives are called by every rank of the
 * communicator, in the same order, with the same sizes; each returns once
 * this rank's part is done. An error names the rank that saw it. A
 * collective that can fail on one rank alone must make the others' fail
 * too (NCCL: abort the communicator), or they would wait forever. */
typedef struct llmi_tp_comm_ops {
    llm_status (*barrier)(void *ctx, uint32_t rank);
    /* x (n floats) becomes the sum over ranks of their x, added in rank
     * order (((x0 + x1) + x2) + ...): the same bits on every rank, every
     * run. */
    llm_status (*all_reduce)(void *ctx, uint32_t rank, float *x, size_t n);
    /* out[r * bytes .. (r + 1) * bytes) = rank r's x, on every rank. */
    llm_status (*all_gather)(void *ctx, uint32_t rank, const void *x, size_t bytes, void *out);
    /* x (bytes) becomes rank `root`'s x on every rank. */
    llm_status (*broadcast)(void *ctx, uint32_t rank, uint32_t root, void *x, size_t bytes);
    /* Accepts NULL. */
    void (*free)(void *ctx);
} llmi_tp_comm_ops;

typedef struct llmi_tp_comm {
    const llmi_tp_comm_ops *ops;
    void *ctx;
    uint32_t n_ranks;
} llmi_tp_comm;

/* The in-process communicator of n_ranks threads (comm.c): all-reduces of
 * up to max_floats floats, all-gathers and broadcasts of up to max_bytes
 * per rank; larger ones are refused with LLM_ERR_LIMIT. */
llm_status llmi_tp_comm_local(uint32_t n_ranks, size_t max_floats, size_t max_bytes,
                              llmi_tp_comm *out);

#ifdef LLMI_TEST_HOOKS
/* The communicator of a tp step (a step_create result of llmi_backend_tp),
 * for tests that wrap it. */
llmi_tp_comm *llmi_tp_step_comm(void *step);
#endif

#endif
