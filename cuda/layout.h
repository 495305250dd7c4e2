/* The CUDA backend's host-side arithmetic: where each weight lies in the
 * device arena, which models the kernels can run, how big a step's scratch
 * is and how it is cut, how a weight too large for the dequantization
 * scratch is cut into row chunks, and which matrix product a batch takes.
 * Pure functions of the model's shapes, no CUDA call: they are what can be
 * checked on a machine without a GPU (tests/cuda/test_layout.c), so every
 * size the backend allocates comes from here. C only (reads llm_model). */
#ifndef LLMI_CUDA_LAYOUT_H
#define LLMI_CUDA_LAYOUT_H

#include "backend/backend.h"
#include "kernels.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Offsets in the weight arena and the step scratch are multiples of this:
 * cuBLASLt's heuristics assume 256-byte aligned operands by default, and it
 * covers every vector width the kernels load. */
#define LLMI_CUDA_ALIGN ((size_t)256)
/* The tensor-core path dequantizes a weight into scratch a chunk of rows at
 * a time; a chunk is at most this many bytes (f32; bf16 chunks hold twice
 * the rows) unless LLMI_CUDA_CHUNK_ROWS rows of the matrix are larger. */
#define LLMI_CUDA_DEQUANT_CAP ((size_t)32 << 20)
/* Chunks are whole multiples of this many rows (or the whole matrix), so a
 * chunk's first output column stays 256-byte aligned in an f32 row. */
#define LLMI_CUDA_CHUNK_ROWS 64u
/* Logits are computed for at most this many bytes of rows at a time (device
 * scratch and pinned staging each); at least one row. */
#define LLMI_CUDA_LOGITS_CAP ((size_t)32 << 20)

/* Reserves `bytes` at the next LLMI_CUDA_ALIGN-aligned offset of an arena
 * whose used size is *size: sets *offset and grows *size. False (nothing
 * changed) when a size overflows. */
bool llmi_cuda_arena_add(size_t *size, size_t bytes, size_t *offset);

/* Layer roles the forward pass reads (the dense decoder: norms, Q/K/V/O and
 * their biases, QK-norm, post-norms, gate/up/down). Fused roles (QKV,
 * GATE_UP) are views the loader already split into these. */
bool llmi_cuda_layer_role_used(int role);
/* GGUF names of the roles, "%u" for the layer (as model/arch.c's table;
 * the plug-in cannot read the core's table). NULL for a role not used. */
const char *llmi_cuda_layer_role_name(int role);
const char *llmi_cuda_model_role_name(int role);
/* "Q4_K" for a weight type; "type <n>" in buf for one it does not know. */
const char *llmi_cuda_type_name(llmi_ttype type, char *buf, size_t cap);

/* LLM_OK when the backend can run `m`; else LLM_ERR_UNSUPPORTED with the
 * reason in `why` (the feature, or the tensor and its type): a LayerNorm
 * model, attention soft-caps, mixture-of-experts layers, LongRoPE factors,
 * a matrix whose type `type_ok` refuses (the kernels' list), a vector that
 * is not F32, an odd rope_dim. Records nothing: the caller reports `why`. */
llm_status llmi_cuda_model_check(const llm_model *m, bool (*type_ok)(llmi_ttype), char *why,
                                 size_t cap);

/* Where each weight goes in the device arena: offsets[i] for model role i
 * (i < LLMI_MODEL_ROLES), then layer l's role r at LLMI_MODEL_ROLES +
 * l * LLMI_LAYER_ROLES + r; SIZE_MAX for a weight that is absent or not
 * used. A tied output shares the embedding's offset. Weights are uploaded
 * as they lie in the file: rows * row_bytes bytes. False on overflow. */
size_t llmi_cuda_weight_slots(const llm_model *m);
bool llmi_cuda_weights_plan(const llm_model *m, size_t *offsets, size_t *total);
/* The weight a slot of llmi_cuda_weights_plan describes, or NULL. */
const llmi_weight *llmi_cuda_weight_at(const llm_model *m, size_t slot);

/* Rows of a [rows][cols] matrix dequantized at once into `scratch` bytes of
 * elem_bytes elements: all rows when they fit, else the most whole
 * multiples of LLMI_CUDA_CHUNK_ROWS that fit; 0 when not even that does. */
uint32_t llmi_cuda_chunk_rows(uint32_t rows, uint32_t cols, size_t elem_bytes, size_t scratch);

/* The matmul path of a batch of n_rows rows: the GEMV kernel up to
 * LLMI_CU_GEMV_MAX_ROWS rows, else dequantize + cuBLASLt. */
static inline bool llmi_cuda_use_gemv(uint32_t n_rows) { return n_rows <= LLMI_CU_GEMV_MAX_ROWS; }

/* Whether the tensor-core path multiplies a weight of `type` where it lies
 * (one matmul for the whole matrix) instead of converting it into scratch
 * first: when the stored type is already the operand type, BF16 with bf16
 * activations or F32 with f32 ones. F16 weights are converted to bf16 a
 * chunk at a time like quantized ones: cuBLASLt takes no f16 x bf16 mix,
 * f16 activations could overflow, and storing them as bf16 would cost the
 * GEMV path (and the CPU agreement) three mantissa bits. */
static inline bool llmi_cuda_gemm_in_place(llmi_ttype type, bool f32_act) {
    return f32_act ? type == LLMI_T_F32 : type == LLMI_T_BF16;
}

/* One step context's device scratch, cut from one allocation: byte offsets
 * of f32 activations for max_rows rows (x, xb: n_embd; q, att: q_dim; k,
 * v: kv_dim; gate, up: n_ff; hout: n_embd), the rows that want logits
 * (out_rows) and their logits (logit_rows rows per pass), the attention's
 * split-KV partials, and with the tensor-core path (max_rows >
 * LLMI_CU_GEMV_MAX_ROWS) the bf16 activations (act) and the dequantized
 * weight chunk (deq, deq_bytes). Absent buffers have size 0 and offset 0. */
/* q holds max_rows rows of q_dim + 2 kv_dim floats, so that a fused Q/K/V
 * product writes its rows [q | k | v] there; k and v are the unfused
 * products' own regions. */
typedef struct llmi_cuda_scratch {
    size_t x, xb, q, k, v, att, gate, up, hout, out_rows, logits, attn, act, deq;
    size_t deq_bytes;
    size_t size; /* bytes in all */
    uint32_t logit_rows;
    bool gemm;
} llmi_cuda_scratch;

/* One matrix of the rows of `n` matrices that lie one after another in
 * device memory: the same type, width and row pitch, each part starting
 * where the one before ends (the weight planner puts Q, K and V, and gate
 * and up, in consecutive slots; alignment padding breaks the run). A
 * product with the view computes every part's rows in one launch, each
 * output row as the part's own product computes it. False when a part is
 * absent or they do not lie so. */
bool llmi_cuda_stack_rows(const llmi_cu_matrix *const *parts, size_t n, llmi_cu_matrix *out);

/* The same for f32 vectors (biases: one row each), laid end to end: one
 * vector of their elements in order. True with out->data NULL when every
 * part is absent (no bias at all); false when only some are, or when they
 * do not lie end to end. */
bool llmi_cuda_join_vectors(const llmi_cu_matrix *const *parts, size_t n, llmi_cu_matrix *out);

/* The scratch of steps of up to max_rows rows (>= 1) whose attention needs
 * attn_floats floats (llmi_cu_attention_scratch_floats). With
 * batch_invariant (LLM_CUDA_BATCH_INVARIANT=1: every matmul on the
 * batch-invariant kernel, kernels.h) the bf16 activations are there for
 * any max_rows and no dequantization chunk is. False when a size
 * overflows. */
bool llmi_cuda_scratch_plan(const llm_model *m, uint32_t max_rows, size_t attn_floats,
                            bool batch_invariant, llmi_cuda_scratch *out);

/* The largest position of the step's rows (the attention grid's size). */
uint32_t llmi_cuda_max_pos(const uint32_t *pos, uint32_t n_rows);

/* Which rows of a step the prefill attention kernel takes (kernels.h,
 * llmi_cu_attention_args): runs of at least LLMI_CU_PREFILL_MIN_ROWS
 * consecutive rows of one sequence at consecutive positions, cut from the
 * run's first row into tiles of LLMI_CU_PREFILL_TILE rows (the last one
 * shorter), written to `tiles` as pairs {first row, rows}; every other row
 * goes, in order, to `decode`. Room needed: n_rows pairs and n_rows rows.
 * No tiles at all when head_dim is over LLMI_CU_PREFILL_MAX_HEAD_DIM. */
void llmi_cuda_prefill_plan(const uint32_t *pos, const uint32_t *seq, uint32_t n_rows,
                            uint32_t head_dim, uint32_t *tiles, uint32_t *n_tiles, uint32_t *decode,
                            uint32_t *n_decode);

/* ---- CUDA graphs of small steps ----
 * A step of a few rows (decode, speculative verification) is replayed from
 * a CUDA graph captured for its row bucket: the step is padded to the
 * bucket's row count, its descriptor repacked at fixed offsets of a fixed
 * device buffer, and the attention grid sized for a power of two of splits,
 * so that no launch parameter a graph bakes in varies between the steps
 * that share it. Padding rows write their K/V into a spare block of the KV
 * store that no sequence owns, and their logits are dropped. */

/* Steps of more rows run without a graph. */
#define LLMI_CUDA_GRAPH_MAX_ROWS 64u

/* The bucket of a step of n_rows rows: the smallest power of two >=
 * n_rows, capped at max_rows; 0 (no graph) when n_rows is over
 * LLMI_CUDA_GRAPH_MAX_ROWS or the bucket's logits do not fit in one pass of
 * logit_rows rows. */
uint32_t llmi_cuda_graph_rows(uint32_t n_rows, uint32_t max_rows, uint32_t logit_rows);
/* max_pos raised to the last position of a power of two of attention
 * splits (LLMI_CU_ATTN_SPLIT positions each): the grid a graph is keyed by. */
uint32_t llmi_cuda_graph_max_pos(uint32_t max_pos);

/* Word offsets of a repacked descriptor for buckets of up to max_rows rows
 * and blocks_cap block-table entries: token, pos, seq [max_rows];
 * block_start [max_rows + 2]; logit_rows [max_rows]; blocks [blocks_cap];
 * size words in all. */
typedef struct llmi_cuda_graph_words {
    size_t token, pos, seq, block_start, logit_rows, blocks, size;
    uint32_t max_rows, blocks_cap;
} llmi_cuda_graph_words;
void llmi_cuda_graph_layout(uint32_t max_rows, uint32_t blocks_cap, llmi_cuda_graph_words *out);
/* Writes `st` padded to `rows` rows (n_rows <= rows <= lay->max_rows) into
 * `words` (lay->size words): padding rows have token 0 at position 0 of an
 * extra sequence slot (n_seqs) whose table is the one block `spare`; the
 * logit rows are st's followed by row 0 up to `rows`. False when st's block
 * tables and the spare block exceed lay->blocks_cap. */
bool llmi_cuda_graph_pack(const llmi_step *st, uint32_t rows, uint32_t spare,
                          const llmi_cuda_graph_words *lay, uint32_t *words);

#endif
