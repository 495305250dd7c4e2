/* Tensor parallelism on CPU ranks: a backend that drives N CPU backend
 * instances (ranks) as threads of one process. Each rank holds a shard of
 * the weights (column-parallel Q/K/V and gate/up, row-parallel O and down,
 * vocab-parallel output; embeddings and norms replicated) and the K/V of its
 * heads; the ranks meet at one all-reduce after each O and down matmul
 * (comm.c), summed in rank order so results never depend on timing.
 * docs/tensor-parallel.md describes it for users. */
#ifndef LLMI_BACKEND_TP_H
#define LLMI_BACKEND_TP_H

#include "backend/backend.h"

#define LLMI_TP_MAX 8 /* ranks */

/* The table for `n_ranks` ranks (1 .. LLMI_TP_MAX), named "tp"; NULL
 * outside that range. One table per size, so that the shared weights
 * (keyed by table) of each size are loaded once. */
const llmi_backend_ops *llmi_backend_tp(uint32_t n_ranks);

/* LLM_OK when `m` splits across n_ranks ranks; otherwise
 * LLM_ERR_UNSUPPORTED with a message naming what does not split and the
 * sizes that work. */
llm_status llmi_tp_check(const llm_model *m, uint32_t n_ranks);

/* ---- the communicator (comm.c) ---- */

/* Ranks of one process meeting at barriers. Collectives are called by every
 * rank, in the same order; each returns once all ranks took part. */
typedef struct llmi_tp_comm llmi_tp_comm;

llm_status llmi_tp_comm_create(uint32_t n_ranks, size_t max_floats, llmi_tp_comm **out);
void llmi_tp_comm_free(llmi_tp_comm *c);
void llmi_tp_barrier(llmi_tp_comm *c);
/* x (n <= max_floats) becomes the sum over ranks of their x, added in rank
 * order (((x0 + x1) + x2) + ...) on every rank: the same bits every run. */
void llmi_tp_all_reduce(llmi_tp_comm *c, uint32_t rank, float *x, size_t n);
/* out[r * n .. (r + 1) * n) = rank r's x, on every rank. */
void llmi_tp_all_gather(llmi_tp_comm *c, uint32_t rank, const float *x, size_t n, float *out);
/* x (n floats) becomes rank `root`'s x on every rank. */
void llmi_tp_broadcast(llmi_tp_comm *c, uint32_t rank, uint32_t root, float *x, size_t n);

#endif
