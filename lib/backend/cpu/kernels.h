/* CPU compute kernels: weight x activation products and the row-wise helpers
 * of the forward pass.
 *
 * llmi_matmul keeps activations in f32: a quantized weight row is dequantized
 * in registers and multiplied with f32 activations. llmi_matmul_act (below)
 * is what the forward pass uses: for quantized weights it rounds the
 * activations to 8 bits and takes integer dot products, as llama.cpp does.
 * Every kernel has a portable C version (the reference, and the only one off
 * x86-64) and, on x86-64, AVX2+FMA+F16C and AVX-512F versions chosen at run
 * time (cpu_features.h: the level, which this header's users may set).
 *
 * Determinism: at a given level, y[t][r] depends only on weight row r and
 * token t's activations: not on the thread count, nor on n_tok, nor on the
 * token's position in the batch. */
#ifndef LLMI_KERNELS_H
#define LLMI_KERNELS_H

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/threadpool.h"
#include "core/ttype.h"

#include <stddef.h>
#include <stdint.h>

/* Weights are llmi_weight views (core/ttype.h). */

/* Whether llmi_matmul supports weights of `type` (F32, F16, BF16, Q4_0,
 * Q4_1, Q8_0, Q4_K, Q6_K): exactly core's weight types (llmi_ttype_info
 * .weight), which the model loader accepts. */
int llmi_kernels_type_supported(uint32_t type);

/* y[t*rows + r] = sum_c W[r][c] * x[t*cols + c] for t < n_tok, for the rows
 * owned by thread ith of nth: rows are split in contiguous chunks of
 * LLMI_MATMUL_ROW_CHUNK. Each weight row is read once per call (tokens are
 * processed in tiles while the row is in cache). The type must be supported
 * and n_tok >= 0; x and y must not overlap. A block type whose cols is not a
 * multiple of its block gives NaN rows rather than reading past a row. */
#define LLMI_MATMUL_ROW_CHUNK 16
void llmi_matmul_part(const llmi_weight *w, const float *x, int n_tok, float *y, int ith, int nth);

/* llmi_matmul_part over every thread of `pool` (NULL: the calling thread). */
void llmi_matmul(llmi_pool *pool, const llmi_weight *w, const float *x, int n_tok, float *y);

/* ---- 8-bit activations ----------------------------------------------------
 *
 * Quantized weights multiply 8-bit activations with integer dot products,
 * exactly as llama.cpp's CPU backend does (its vec_dot_type): Q4_0 and Q8_0
 * weights pair with Q8_0 activations, Q4_1 weights with Q8_1, Q4_K and Q6_K
 * weights with Q8_K (kernels_k.c gives their formula). F32, F16 and BF16
 * weights keep f32 activations (llmi_matmul).
 *
 * Activations, per block of 32 (llama.cpp's x86 quantize_row_q8_0/_q8_1):
 *   amax = max|x|, d = amax / 127, stored as fp16(d);
 *   q = round-half-to-even(x * (127 / amax)), all 0 when amax == 0;
 *   Q8_1 also stores s = fp16(d * sum(q)) with the unrounded d.
 * Dot product of a weight row with a token, per block b:
 *   isum_b = sum_j wq_j * xq_j, exactly, in integers (Q4_0: wq = nibble - 8;
 *   Q4_1: wq = nibble; Q8_0: wq = the int8),
 *   y = sum_b (float)(d_w * d_x) * isum_b  [+ sum_b m_w * s_x for Q4_1],
 * summed in float. The portable and AVX-512 VNNI kernels sum in block order
 * into one accumulator, acc = fma((float)isum_b, d_w * d_x, acc) [then
 * acc = fma(m_w, s_x, acc)], and give the same bits; the AVX2 ones split the
 * sums over SIMD lanes. Levels differ from each other and from llama.cpp
 * only in the order (and fusing) of the float sums.
 *
 * That does not make a model's logits match llama.cpp's to rounding: a
 * last-bit difference anywhere upstream (a sum's order, rmsnorm, exp) moves
 * some x * 127/amax across a rounding boundary, the flipped quant moves the
 * next layer's inputs by far more than a last bit, and within a few layers
 * the two runs carry independent rounding noise. On SmolLM2-135M our three
 * levels differ from each other by as much as from llama.cpp (mean |logit
 * diff| about 0.2); only bit-identical arithmetic in every op would do better.
 *
 * Usage: llmi_act_prepare() quantizes n_tok rows once into caller-provided
 * scratch; then any number of llmi_matmul_act() calls with weights of the
 * same family (Q, K and V; gate and up) reuse it. */
typedef struct llmi_act {
    const float *f32;  /* the f32 rows, n_tok x cols (always set) */
    const void *q;     /* quantized rows; NULL for float weights */
    llmi_ttype q_type; /* LLMI_T_Q8_0, _Q8_1 or _Q8_K; LLMI_T_F32 when q is NULL */
    int n_tok;
    int64_t cols;
    size_t q_row_bytes; /* stride between tokens' rows in q */
} llmi_act;

/* A quantized row (nb = cols / 32 blocks) starts 64-byte aligned and holds
 *   int8_t qs[32 * nb]   block b's values at qs[32b .. 32b+31], in order;
 *   float d[nb]          at byte 32 * nb: fp16(d) widened to f32;
 *   float s[nb]          at byte 36 * nb, Q8_1: fp16(s) widened;
 *   int32_t c[nb]        at byte 36 * nb, Q8_0: -128 * sum(q) (for kernels
 *                        that take the weights as unsigned bytes, w + 128);
 * then zeros up to q_row_bytes (a multiple of 64). f32 scales spare the
 * kernels a conversion per token and block; the values are the fp16 ones.
 * A Q8_K row (nb = cols / 256 super-blocks) holds
 *   int8_t qs[256 * nb]   super-block i's values at qs[256i .. 256i+255];
 *   float d[nb]           at byte 256 * nb: the f32 scales;
 *   int16_t bsums[16*nb]  at byte 260 * nb: sums of 16 consecutive qs;
 * then zeros up to q_row_bytes; llmi_act_s does not apply to it. */
static inline const int8_t *llmi_act_qs(const llmi_act *a, int t) {
    return (const int8_t *)a->q + (size_t)t * a->q_row_bytes;
}
static inline const float *llmi_act_d(const llmi_act *a, int t) {
    return (const float *)(const void *)(llmi_act_qs(a, t) + a->cols);
}
static inline const float *llmi_act_s(const llmi_act *a, int t) {
    return llmi_act_d(a, t) + a->cols / 32;
}
static inline const int16_t *llmi_act_bsums(const llmi_act *a, int t) {
    return (const int16_t *)(const void *)(llmi_act_d(a, t) + a->cols / LLMI_QK_K);
}

/* The activation type that weights of `type` pair with: LLMI_T_Q8_0,
 * LLMI_T_Q8_1, LLMI_T_Q8_K, or LLMI_T_F32 for float (and unsupported)
 * types. */
llmi_ttype llmi_act_type(llmi_ttype weight_type);

/* Scratch bytes for llmi_act_prepare: 0 for float weights (and for a cols
 * that is not a positive multiple of 32, 256 for K-quants, or a size that
 * overflows: such an act has q NULL and llmi_matmul_act gives NaN). Any
 * alignment will do. */
size_t llmi_act_scratch_bytes(llmi_ttype weight_type, int64_t cols, int n_tok);

/* Fills *out for weights of weight_type: quantizes the n_tok rows of x
 * (n_tok x cols floats) into scratch (llmi_act_scratch_bytes of it), over
 * the threads of `pool` when n_tok is large. For float weights it only
 * records x. Keep x and scratch alive and unchanged while *out is used. */
void llmi_act_prepare(llmi_pool *pool, llmi_ttype weight_type, const float *x, int n_tok,
                      int64_t cols, void *scratch, llmi_act *out);

/* y[t*rows + r] = row r of w times token t of x, for t < x->n_tok: the
 * integer path above for quantized weights, llmi_matmul on x->f32 for float
 * ones. x must have been prepared for w's type family (asserted; NaN rows
 * when assertions are off) with x->cols == w->cols. Same row split, tiling
 * and determinism as llmi_matmul_part. */
void llmi_matmul_act_part(const llmi_weight *w, const llmi_act *x, float *y, int ith, int nth);
void llmi_matmul_act(llmi_pool *pool, const llmi_weight *w, const llmi_act *x, float *y);

/* ---- Packed weights --------------------------------------------------------
 *
 * At the AVX-512 VNNI level the integer kernels take 16 rows at once, one
 * row per vector lane, so the weights of 16 rows must be interleaved before
 * they are multiplied. From the model's rows that costs 16 separate memory
 * streams and a shuffle per block, every time; a decode, which uses each
 * weight once, stalls on it. A packed copy holds Q4_0, Q4_1, Q5_0, Q5_1
 * and Q8_0 weights already interleaved: groups of LLMI_WEIGHT_PACK_ROWS
 * rows, each group one contiguous run of block pairs (per pair: both
 * blocks' quants as the kernels' vectors take them, Q5's fifth bits, then
 * their f16 scales, and Q4_1's and Q5_1's f16 mins),
 * the same bytes per row as the model's (a 4-bit weight stays 4 bits). The
 * kernels read a weight's copy (llmi_weight.packed) at the VNNI level and
 * ignore it at others; with or without it they give the same bits. */

/* Bytes of w's packed copy (*group_bytes: of one group of rows), or 0 when
 * it has none at the current level: another type or level, or a cols that
 * is not a positive multiple of 32. */
size_t llmi_weight_packed_size(const llmi_weight *w, size_t *group_bytes);

/* Writes groups [g0, g1) of w's packed copy into dst (64-byte aligned, at
 * least llmi_weight_packed_size bytes; group g at g * group_bytes). Rows
 * past w->rows in the last group repeat the last row. Groups are
 * independent, so threads may pack disjoint ranges. */
void llmi_weight_pack(const llmi_weight *w, void *dst, int64_t g0, int64_t g1);

/* out = x / sqrt(mean(x^2) + eps) * weight; out may alias x. The mean is
 * accumulated in double. */
void llmi_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);
float llmi_dot_f32(const float *a, const float *b, int n);
/* y += a * x */
void llmi_axpy_f32(float *y, float a, const float *x, int n);
/* x = exp(x - max) / sum. Entries of -inf give 0; if all are -inf the result
 * is uniform. */
void llmi_softmax_inplace(float *x, int n);
/* gate = silu(gate) * up, silu(g) = g / (1 + exp(-g)). */
void llmi_silu_mul(float *gate_out, const float *up, int n);
/* gate = gelu(gate) * up with the tanh approximation (GeGLU):
 * gelu(g) = g/2 * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3))). */
void llmi_gelu_tanh_mul(float *gate_out, const float *up, int n);
/* y += x */
void llmi_add_inplace(float *y, const float *x, int n);

/* ---- f16 / bf16 rows (the KV cache) ----------------------------------------
 *
 * Conversions round to nearest even, like llmi_f32_to_f16 / llmi_f32_to_bf16,
 * and give the same bits as those for every input that is not a NaN (a NaN
 * stays a NaN; its payload may differ between levels). f16 overflows to inf
 * from 65520 on; its subnormals are kept. The dot products and axpys widen
 * each f16/bf16 element to f32 exactly and accumulate in f32 (levels 1 and 2
 * with F16C/AVX2/AVX-512 conversions and FMA, as llmi_dot_f32 does), so they
 * differ from llmi_dot_f32 on the widened row only in summation order. */
void llmi_f32_to_f16_row(const float *x, uint16_t *y, int n);
void llmi_f32_to_bf16_row(const float *x, uint16_t *y, int n);
float llmi_dot_f32_f16(const float *a, const uint16_t *b, int n);
float llmi_dot_f32_bf16(const float *a, const uint16_t *b, int n);
/* y += a * x */
void llmi_axpy_f16(float *y, float a, const uint16_t *x, int n);
void llmi_axpy_bf16(float *y, float a, const uint16_t *x, int n);

/* The row operations of one element type, for loops that look the level up
 * once (attention): rows are void pointers to elements of that type. For
 * LLMI_T_F32 store is a copy and dot/axpy are llmi_dot_f32/llmi_axpy_f32's
 * kernels (same results); for LLMI_T_F16 and LLMI_T_BF16 they are the
 * functions above. n > 0. For LLMI_T_Q8_0 and LLMI_T_Q4_0 (the quantized
 * KV cache) rows are GGUF blocks and n a multiple of 32: store is core's
 * reference quantizer (llmi_quantize_row, the same bits at every level),
 * dot and axpy work on the dequantized values d * q, factoring d out of
 * each block (kernels_kvq.c). */
typedef struct llmi_row_ops {
    void (*store)(void *dst, const float *src, int n); /* dst = round(src) */
    float (*dot)(const float *a, const void *b, int n);
    void (*axpy)(float *y, float a, const void *x, int n);
} llmi_row_ops;
/* The operations at the current kernel level; NULL for a type other than
 * LLMI_T_F32, LLMI_T_F16, LLMI_T_BF16, LLMI_T_Q8_0, LLMI_T_Q4_0 and
 * LLMI_T_FP8_E4M3 (blocks of 32 codes with an f32 scale, core/ttype.h: the
 * same block structure as Q8_0, values d * e4m3(q)). The pointer stays
 * valid for the process; fetch it again after llmi_kernels_set_level. */
const llmi_row_ops *llmi_row_ops_get(llmi_ttype type);

#endif
