/* The CUDA plug-in's kernels, as the host code (backend.c, step.c, ...)
 * launches them. Each launcher enqueues its work on `stream` and returns
 * cudaGetLastError() after the launch; none synchronizes, allocates or
 * reads device memory from the host, so a step made of them can be
 * captured into a CUDA graph. Pointers are device pointers. Activations are
 * f32 rows, row r of a [rows][dim] array at r * stride floats.
 *
 * The arithmetic of a kernel (dequantizing a block, a block-table lookup,
 * a RoPE angle, merging split-KV partial results) lives in
 * __host__ __device__ functions of cuda/device_math.h, which host tests
 * check against the CPU backend's code on machines without a GPU.
 *
 * Results never depend on what else is in the batch: a row's output comes
 * from the same reduction order whatever the other rows are. One choice is
 * the host's: attention rows it gives the prefill kernel (runs of rows of
 * one sequence) round differently from rows it gives the split kernel. */
#ifndef LLMI_CUDA_KERNELS_H
#define LLMI_CUDA_KERNELS_H

#include "core/ttype.h"

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix on the device in its file's layout: `rows` rows (output
 * features) of `cols` elements, row o at data + o * row_bytes. */
typedef struct llmi_cu_matrix {
    const void *data;
    llmi_ttype type;
    uint32_t rows, cols;
    size_t row_bytes;
} llmi_cu_matrix;

/* Whether the GEMV, dequantization and embedding kernels take `type`: F32,
 * F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K. */
bool llmi_cu_type_supported(llmi_ttype type);

/* ---- matrix products ---- */

/* Rows the GEMV kernel takes at once. Larger batches use a tensor-core GEMM
 * (cuBLASLt) on weights dequantized with llmi_cu_dequantize. */
#define LLMI_CU_GEMV_MAX_ROWS 8

/* y[r][o] = sum_i W[o][i] * x[r][i] (+ bias[o] when bias is not NULL), for
 * r < n_rows (1 .. LLMI_CU_GEMV_MAX_ROWS) and o < W.rows; x is [n_rows] rows
 * of W.cols floats at x_stride, y [n_rows] rows at y_stride. f32
 * accumulation; the weight is read once for all rows. */
cudaError_t llmi_cu_gemv(cudaStream_t stream, const llmi_cu_matrix *w, const float *x,
                         uint32_t x_stride, uint32_t n_rows, const float *bias, float *y,
                         uint32_t y_stride);

/* Rows [row0, row0 + n_rows) of W as bf16 (out_bf16 true; out is
 * __nv_bfloat16 [n_rows][W.cols]) or f32 (out is float [n_rows][W.cols]):
 * the tensor-core path's operand. */
cudaError_t llmi_cu_dequantize(cudaStream_t stream, const llmi_cu_matrix *w, uint32_t row0,
                               uint32_t n_rows, bool out_bf16, void *out);

/* out[r][i] = bf16(x[r][i]) for n_rows rows of dim (x at x_stride floats,
 * out dense): activations for the tensor-core path. */
cudaError_t llmi_cu_f32_to_bf16(cudaStream_t stream, const float *x, uint32_t x_stride,
                                uint32_t n_rows, uint32_t dim, void *out);

/* The batch-invariant matmul (kernels_matmul_tc.cu, used for every row
 * count when the environment has LLM_CUDA_BATCH_INVARIANT=1):
 * y[r][o] = sum_i W[o][i] * x[r][i] (+ bias[o]) for r < n_rows (any
 * count) on tensor cores, x bf16 ([n_rows] rows at x_stride elements,
 * 16-byte aligned, x_stride a multiple of 8), f32 accumulation over i in
 * one fixed order per element (cuda/matmul_tc_math.h), so row r's bits do
 * not depend on n_rows or on the other rows. Takes BF16, F16, Q8_0, Q4_0
 * (exactly: the weight's value is not rounded), Q4_1, Q5_0, Q5_1 and Q4_K
 * (each weight rounded to bf16) with cols a multiple of 64 (256 for Q4_K)
 * and aligned rows (llmi_cu_mm_tc_takes); cudaErrorInvalidValue for
 * anything else. */
bool llmi_cu_mm_tc_takes(const llmi_cu_matrix *w);
cudaError_t llmi_cu_mm_tc(cudaStream_t stream, const llmi_cu_matrix *w, const void *x,
                          uint32_t x_stride, uint32_t n_rows, const float *bias, float *y,
                          uint32_t y_stride);

/* ---- element-wise and row-wise ---- */

/* x[r] = scale * dequantized row tokens[r] of the embedding matrix (x dense,
 * [n_rows][W.cols]). Tokens were checked by the core. */
cudaError_t llmi_cu_embed(cudaStream_t stream, const llmi_cu_matrix *emb, const int32_t *tokens,
                          uint32_t n_rows, float scale, float *x);

/* out[r] = rmsnorm(x[r]) * w for n_rows rows of dim (out may be x; both
 * dense). Also QK-norm: n_rows * n_heads rows of head_dim. */
cudaError_t llmi_cu_rmsnorm(cudaStream_t stream, const float *x, const float *w, float eps,
                            uint32_t n_rows, uint32_t dim, float *out);

/* The residual add fused with the next norm: x[r] += delta[r] (first
 * normed with delta_norm_w when it is not NULL: post-norms), then
 * out[r] = rmsnorm(x[r]) * w when w is not NULL. Dense [n_rows][dim]. */
cudaError_t llmi_cu_add_rmsnorm(cudaStream_t stream, float *x, const float *delta,
                                const float *delta_norm_w, const float *w, float eps,
                                uint32_t n_rows, uint32_t dim, float *out);

/* Rotary embedding in place on n_heads heads of head_dim per row (rows at
 * stride floats): the first rope_dim dimensions of each head, pairs laid
 * out by `layout` (model/arch.h: 0 adjacent, 1 halves). Angle of pair i at
 * position p: (p / freq_div[i] when freq_div is not NULL) * freq_scale *
 * base^(-2i / rope_dim), computed as the CPU's rope_table does. */
cudaError_t llmi_cu_rope(cudaStream_t stream, float *x, uint32_t stride, const uint32_t *pos,
                         uint32_t n_rows, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim,
                         int layout, float base, float freq_scale, const float *freq_div);

/* gate[r][i] = act(gate[r][i]) * up[r][i], act SiLU (gelu false) or GELU
 * with the tanh approximation; dense [n_rows][n]. */
cudaError_t llmi_cu_glu(cudaStream_t stream, float *gate, const float *up, uint32_t n_rows,
                        uint32_t n, bool gelu);

/* x[i] = tanh(x[i] / cap) * cap for n floats (logit soft-cap). */
cudaError_t llmi_cu_softcap(cudaStream_t stream, float *x, size_t n, float cap);

/* dst[i] = src[rows[i]] for n rows of dim floats (the rows that want
 * logits). */
cudaError_t llmi_cu_gather_rows(cudaStream_t stream, const float *src, const uint32_t *rows,
                                uint32_t n, uint32_t dim, float *dst);

/* ---- paged KV cache ----
 * A layer's K (or V) is [n_slots][kv_dim] elements of the cache type
 * (LLMI_T_F32, F16 or BF16), slot = block * block_size + pos % block_size
 * (backend/backend.h). */

/* Writes row r of k and v (f32 [n_rows][kv_dim] at k_stride / v_stride) at
 * slot(seq[r], pos[r]) of this layer's caches, rounding to nearest even for
 * f16 and bf16 as the CPU does. */
cudaError_t llmi_cu_kv_store(cudaStream_t stream, void *k_cache, void *v_cache,
                             llmi_ttype cache_type, uint32_t kv_dim, const float *k,
                             uint32_t k_stride, const float *v, uint32_t v_stride,
                             const uint32_t *pos, const uint32_t *seq, const uint32_t *block_start,
                             const uint32_t *blocks, uint32_t block_size, uint32_t n_rows);

/* Positions a split-KV partial covers. Fixed, so that a row's result never
 * depends on the batch. */
#define LLMI_CU_ATTN_SPLIT 256

typedef struct llmi_cu_attention_args {
    const float *q; /* [n_rows] rows of n_head * head_dim at q_stride, roped */
    uint32_t q_stride;
    float *out; /* [n_rows] rows of n_head * head_dim at out_stride */
    uint32_t out_stride;
    const void *k_cache, *v_cache; /* this layer's, holding every row's own K/V */
    llmi_ttype cache_type;
    uint32_t n_rows, n_head, n_head_kv, head_dim, kv_dim, block_size;
    const uint32_t *pos, *seq, *block_start, *blocks; /* as in llmi_step */
    uint32_t max_pos;                                 /* >= every pos[r]: sizes the grid */
    float scale;     /* 1/sqrt(head_dim) unless the model says otherwise */
    uint32_t window; /* a query at p sees keys at q with p - q < window; 0: all q <= p */
    float *scratch;  /* llmi_cu_attention_scratch_floats(...) floats */
    /* Appended; all zero: every row takes the split kernel, as before.
     * n_tiles > 0: the prefill kernel takes the rows of n_tiles tiles
     * (pairs {first row, rows} at `tiles`, device memory, laid out by
     * llmi_cuda_prefill_plan: 1 .. LLMI_CU_PREFILL_TILE consecutive rows of
     * one sequence at consecutive positions, their K/V already stored) and
     * the split kernel only the n_decode_rows rows listed at decode_rows.
     * The host counts both, so the grid sizes are known at launch. */
    const uint32_t *tiles;
    uint32_t n_tiles;
    const uint32_t *decode_rows;
    uint32_t n_decode_rows;
} llmi_cu_attention_args;

/* The prefill kernel's query tile (rows of one sequence per CTA and head),
 * the shortest run of rows it is given (shorter runs and long contexts of
 * few rows parallelize better split over their keys), and the largest
 * head it takes (its shared memory holds the tile's queries and 32 keys'
 * K and V in f32). */
#define LLMI_CU_PREFILL_TILE 32u
#define LLMI_CU_PREFILL_MIN_ROWS 32u
#define LLMI_CU_PREFILL_MAX_HEAD_DIM 256u

/* Scratch the attention of n_rows rows over at most max_ctx positions
 * needs (split-KV partials). */
size_t llmi_cu_attention_scratch_floats(uint32_t n_rows, uint32_t n_head, uint32_t head_dim,
                                        uint32_t max_ctx);

/* Causal attention of each row over its sequence's keys at positions
 * [first, pos[r]] (first = pos - window + 1 with a window, else 0), GQA
 * (head h reads KV head h / (n_head / n_head_kv)), softmax in f32. The
 * split kernel processes a row's keys in splits of LLMI_CU_ATTN_SPLIT
 * positions whose partial results (max, sum, weighted values) are merged
 * in split order. The prefill kernel (tiles) streams the keys of a tile's
 * sequence once per tile and head, 32 positions at a time aligned to
 * multiples of 32, with an online softmax; a row's result there depends
 * only on its own position and keys too, but differs in rounding from the
 * split kernel's. Plain f32 FMA, unless the tensor-core kernel below takes
 * the tiles. With LLM_CUDA_ATTN=flashinfer (read once) and a plug-in built
 * with FLASHINFER=1, FlashInfer takes every row of the layers it takes
 * (attention_flashinfer.h) instead. */
cudaError_t llmi_cu_attention(cudaStream_t stream, const llmi_cu_attention_args *a);

/* The tensor-core prefill kernel (kernels_attention_tc.cu: FlashAttention-2
 * on mma.sync, keys in aligned chunks of 64, Q and the softmax weights
 * rounded to the cache's 16-bit type, f32 accumulation). It takes F16 and
 * BF16 caches (16-byte aligned, kv_dim a multiple of 8) with head_dim 64 or
 * 128 (llmi_cu_prefill_tc_takes). llmi_cu_prefill_tc launches it over a's
 * tiles only. llmi_cu_attention runs it in place of the f32 prefill kernel
 * when the environment has LLM_CUDA_ATTN_TC=1 (read once) and it takes the
 * layer; llmi_cu_attention_tc does so whatever the environment says and
 * refuses (cudaErrorInvalidValue) a layer it does not take: for tests and
 * benchmarks. A row's result does not depend on its tile here either. */
bool llmi_cu_prefill_tc_takes(const llmi_cu_attention_args *a);
cudaError_t llmi_cu_prefill_tc(cudaStream_t stream, const llmi_cu_attention_args *a);
cudaError_t llmi_cu_attention_tc(cudaStream_t stream, const llmi_cu_attention_args *a);

/* Copies the first n_slots slots of block src to block dst, in each of the
 * n_layers (K and V) arrays of `caches` (a device array of 2 * n_layers
 * pointers: layer l's K at [2l], V at [2l + 1]); row_bytes per slot. */
cudaError_t llmi_cu_kv_copy_block(cudaStream_t stream, void *const *caches, uint32_t n_layers,
                                  size_t row_bytes, uint32_t block_size, uint32_t dst, uint32_t src,
                                  uint32_t n_slots);

/* ---- LoRA (kernels_lora.cu) ---- */

/* The two halves of the LoRA update of the rows rows[0 .. n_rows) (device
 * array of row indices, each listed once) of one adapter's pair:
 * shrink: t[i][k] = sum_j a[k][j] * x[rows[i]][j], a [rank][in] row-major,
 * f32 accumulation, t dense [n_rows][rank];
 * expand: y[rows[i]][o] += (scale * t[i][k]) * b[k][o] for k in order, b
 * [rank][out] (B transposed, model/adapter.h). Rows not listed are not
 * touched. 16-byte aligned a and x with in and x_stride multiples of 4 take
 * 128-bit loads. */
cudaError_t llmi_cu_lora_shrink(cudaStream_t stream, const float *a, uint32_t rank, uint32_t in,
                                const float *x, uint32_t x_stride, const uint32_t *rows,
                                uint32_t n_rows, float *t);
cudaError_t llmi_cu_lora_expand(cudaStream_t stream, const float *b, uint32_t rank, uint32_t out,
                                const float *t, float scale, const uint32_t *rows, uint32_t n_rows,
                                float *y, uint32_t y_stride);

#ifdef __cplusplus
}
#endif

#endif
