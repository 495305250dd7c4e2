/* Tensor parallelism across GPUs in the CUDA plug-in: one process drives N
 * GPUs, each rank with its own instance (device, stream, cuBLASLt), weight
 * shard, KV shard and step, and an NCCL communicator (nccl_comm.h, loaded
 * only when a group is opened). The classic Megatron split, not the CPU's
 * exact one (docs/tensor-parallel.md):
 *   Q, K, V (and biases): the rank's heads (rows);
 *   gate, up: its slice of the n_ff rows;
 *   O, down: the same slices of their input columns (row-parallel): each
 *     rank's product is a partial sum, all-reduced (NCCL) after each;
 *   output (LM head): its vocabulary rows; each rank's logits go into the
 *     host logits at its column offset;
 *   embeddings, norms, QK-norms, RoPE factors: replicated;
 *   fewer KV heads than ranks (N a multiple of n_head_kv): each rank holds
 *     the KV head its query heads use (copies).
 *
 * The shard arithmetic below (tp_shard.c) is pure host code: no CUDA call,
 * no core function, so tests/cuda/test_tp_shard.c checks it without a GPU.
 * C only (reads llm_model). */
#ifndef LLMI_CUDA_TP_H
#define LLMI_CUDA_TP_H

#include "backend/backend.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LLMI_CUDA_TP_MAX 8 /* ranks of one group */

/* Rank r's share of each split dimension. */
typedef struct llmi_cuda_tp_shard {
    uint32_t head0, n_head;   /* query heads */
    uint32_t kv0, n_kv;       /* KV heads */
    uint32_t ff0, n_ff;       /* FFN features: gate/up rows, down columns */
    uint32_t vocab0, n_vocab; /* output rows, logit columns */
} llmi_cuda_tp_shard;

/* Elements per block and bytes per block of a weight type (1 and the
 * element size for F32, F16, BF16); false for a type it does not know. */
bool llmi_cuda_tp_type_block(llmi_ttype type, uint32_t *block, uint32_t *block_bytes);

/* Rank r of n's slice [*begin, *end) of a dimension of `full` elements:
 * [full * r / n, full * (r + 1) / n), as the CPU ranks cut theirs. */
void llmi_cuda_tp_slice(uint32_t full, uint32_t n, uint32_t r, uint32_t *begin, uint32_t *end);

/* KV heads [*kv0, *kv0 + *n_kv) of rank r of n (n_head_kv a multiple of
 * n, or n a multiple of n_head_kv). */
void llmi_cuda_tp_kv_heads(uint32_t n_head_kv, uint32_t n, uint32_t r, uint32_t *kv0,
                           uint32_t *n_kv);

/* Rank r's shard of a model with hyper-parameters hp across n ranks
 * (llmi_cuda_tp_check passed). */
void llmi_cuda_tp_shard_of(const llmi_hparams *hp, uint32_t n, uint32_t r, llmi_cuda_tp_shard *out);

/* The first rank holding KV head `head`. */
uint32_t llmi_cuda_tp_kv_owner(uint32_t n_head_kv, uint32_t n, uint32_t head);

/* LLM_OK when m splits across n ranks (1 .. LLMI_CUDA_TP_MAX); else
 * LLM_ERR_UNSUPPORTED with `why` naming what does not split and the sizes
 * that do: heads as for the CPU ranks (n_head a multiple of n; n_head_kv a
 * multiple of n, or n a multiple of n_head_kv), and every rank's column
 * range of O and down on a block boundary of their types (32 or 256
 * elements for quantized ones). Records nothing. */
llm_status llmi_cuda_tp_check(const llm_model *m, uint32_t n, char *why, size_t cap);

/* Columns [c0, c0 + n_cols) of every row of w, packed as rows of their own
 * into dst (w->rows rows of llmi_cuda_tp_cols_row_bytes bytes). c0 and
 * n_cols must be multiples of the type's block (llmi_cuda_tp_check);
 * false otherwise, with dst untouched. */
size_t llmi_cuda_tp_cols_row_bytes(llmi_ttype type, uint32_t n_cols);
bool llmi_cuda_tp_repack_cols(const llmi_weight *w, uint32_t c0, uint32_t n_cols, void *dst);

/* Rank r's model: a shallow copy of m whose hp carries the rank's n_head,
 * n_head_kv, n_ff and n_vocab and whose weights are views of m's (rows of
 * Q/K/V/biases, gate/up, output) or, for O and down, column slices
 * repacked into host memory the rank model owns until
 * llmi_cuda_tp_rank_release_host. The tokenizer and file are m's
 * (borrowed). */
typedef struct llmi_cuda_tp_rank {
    llm_model m;
    llmi_cuda_tp_shard shard;
    void *host; /* the repacked O and down slices */
} llmi_cuda_tp_rank;

/* LLM_ERR_OUT_OF_MEMORY (records nothing) or LLM_OK. */
llm_status llmi_cuda_tp_rank_make(const llm_model *m, uint32_t n, uint32_t r,
                                  llmi_cuda_tp_rank *out);
/* Frees the repacked host slices once they are on the device: the rank
 * model's O and down then point at m's whole tensors with the slice's
 * shape (only shapes are read after the upload: the step's scratch plan). */
void llmi_cuda_tp_rank_release_host(llmi_cuda_tp_rank *rk, const llm_model *m);
void llmi_cuda_tp_rank_free(llmi_cuda_tp_rank *rk);

/* Puts a rank's logits, n_rows rows of n_slice floats (dense), into
 * rows of n_vocab floats at columns [vocab0, vocab0 + n_slice). */
void llmi_cuda_tp_place_logits(float *out, uint32_t n_rows, uint32_t n_vocab, uint32_t vocab0,
                               uint32_t n_slice, const float *slice);

/* K/V rows as the core sees them (`full`: n rows of n_head_kv heads of
 * head_bytes bytes, heads in order) and as a rank holds them (`part`: n
 * rows of its heads [kv0, kv0 + n_kv)). Gather copies the rank's heads out
 * of full rows (kv_write); scatter puts them into full rows (kv_read, from
 * the first rank holding each head). */
void llmi_cuda_tp_kv_gather(const void *full, uint32_t n, uint32_t n_head_kv, size_t head_bytes,
                            uint32_t kv0, uint32_t n_kv, void *part);
void llmi_cuda_tp_kv_scatter(const void *part, uint32_t n, uint32_t n_head_kv, size_t head_bytes,
                             uint32_t kv0, uint32_t n_kv, void *full);

/* ---- tp.c: the group's backend table (needs CUDA and NCCL) ---- */

/* The table of the group of n ranks on devices[0 .. n) (the core checked
 * them): made once per distinct device list, kept for the process. At
 * most LLMI_CUDA_TP_GROUPS lists; LLM_ERR_LIMIT past that. */
#define LLMI_CUDA_TP_GROUPS 8
llm_status llmi_cuda_tp_group(uint32_t n, const int32_t *devices, const llmi_backend_ops **out);

#endif
