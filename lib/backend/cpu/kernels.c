/* The portable float-activation kernels and the row-wise helpers.
 *
 * The portable kernels are the reference for the SIMD ones (kernels_x86.c)
 * and the only implementation off x86-64. A weight row is walked in chunks
 * of 32 elements (one quant block), each chunk is dequantized once and
 * multiplied with up to `tile` tokens. A product of a row and a token is
 * the AVX-512 GEMM's, bit for bit: 16 lane sums, lane l accumulating
 * w[16c + l] * x[16c + l] for c = 0, 1, ... with fused multiply-adds (the
 * last step zero-padded), then the tree lane i + lane i+8, + 4, + 2, + 1. */
#include "backend/cpu/kernels_impl.h"
#include "core/quant.h"

#include <math.h>

#define CHUNK 32
#define C_TILE 4

/* ---- portable C ------------------------------------------------------- */

/* GGUF data is little-endian; memcpy because blocks are only 2-aligned and
 * rows need not be aligned at all. */
static uint16_t ld16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

static float c_elem(int kt, const uint8_t *row, int64_t c) {
    switch (kt) {
    case LLMI_KT_F32: {
        float f;
        memcpy(&f, row + c * 4, 4);
        return f;
    }
    case LLMI_KT_F16:
        return llmi_f16_to_f32(ld16(row + c * 2));
    default:
        return llmi_bf16_to_f32(ld16(row + c * 2));
    }
}

/* Chunk b of a row (cols elements), dequantized into w[32]: q * d (exact
 * in float) for Q4_0 and Q8_0, fma(q, d, m) for Q4_1; a float row's
 * elements, zero past its end. */
static void c_chunk(int kt, const uint8_t *row, int64_t cols, int64_t b, float *w) {
    switch (kt) {
    case LLMI_KT_Q4_0: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q4_0);
        const uint8_t *qs = blk + offsetof(llmi_block_q4_0, qs);
        const float d = llmi_f16_to_f32(ld16(blk));
        for (int j = 0; j < 16; j++) {
            w[j] = (float)((qs[j] & 15) - 8) * d;
            w[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
        break;
    }
    case LLMI_KT_Q4_1: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q4_1);
        const uint8_t *qs = blk + offsetof(llmi_block_q4_1, qs);
        const float d = llmi_f16_to_f32(ld16(blk)), m = llmi_f16_to_f32(ld16(blk + 2));
        for (int j = 0; j < 16; j++) {
            w[j] = fmaf((float)(qs[j] & 15), d, m);
            w[j + 16] = fmaf((float)(qs[j] >> 4), d, m);
        }
        break;
    }
    case LLMI_KT_Q8_0: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q8_0);
        const int8_t *qs = (const int8_t *)(blk + offsetof(llmi_block_q8_0, qs));
        const float d = llmi_f16_to_f32(ld16(blk));
        for (int j = 0; j < 32; j++)
            w[j] = (float)qs[j] * d;
        break;
    }
    default:
        for (int j = 0; j < CHUNK; j++)
            w[j] = b * CHUNK + j < cols ? c_elem(kt, row, b * CHUNK + j) : 0.0f;
        break;
    }
}

/* The tree over 16 lane sums: i + i+8, then + 4, + 2, + 1. */
static float c_tree16(const float *s) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++)
        s8[i] = s[i] + s[i + 8];
    for (int i = 0; i < 4; i++)
        s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++)
        s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

static void c_rows(int kt, const llmi_weight *W, int64_t r0, int64_t r1, const float *x, int nt,
                   float *y, int64_t ldy) {
    const int64_t cols = W->cols, nc = (cols + CHUNK - 1) / CHUNK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        float s[C_TILE][16] = {{0}};
        for (int64_t b = 0; b < nc; b++) {
            float w[CHUNK];
            c_chunk(kt, row, cols, b, w);
            for (int t = 0; t < nt; t++) {
                const float *xt = x + t * cols + b * CHUNK;
                for (int k = 0; k < CHUNK && b * CHUNK + k < cols; k += 16)
                    for (int l = 0; l < 16; l++) /* a step past the end adds w * x = 0 * 0 */
                        s[t][l] =
                            fmaf(w[k + l], b * CHUNK + k + l < cols ? xt[k + l] : 0.0f, s[t][l]);
            }
        }
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = c_tree16(s[t]);
    }
}

#define C_ROWS(name, KT)                                                                           \
    static void c_##name(const llmi_weight *w, int64_t r0, int64_t r1, const float *x, int nt,     \
                         float *y, int64_t ldy) {                                                  \
        c_rows(KT, w, r0, r1, x, nt, y, ldy);                                                      \
    }                                                                                              \
    const llmi_rows_impl llmi_##name##_c = {C_TILE, c_##name};
C_ROWS(rows_f32, LLMI_KT_F32)
C_ROWS(rows_f16, LLMI_KT_F16)
C_ROWS(rows_bf16, LLMI_KT_BF16)
C_ROWS(rows_q4_0, LLMI_KT_Q4_0)
C_ROWS(rows_q4_1, LLMI_KT_Q4_1)
C_ROWS(rows_q8_0, LLMI_KT_Q8_0)

/* ---- the dequantizing f32 path (K-quants, Q5) ------------------------------ */

#define DQ_TILE 8
#define DQ_SPAN 256       /* elements dequantized at a time: a K-quant super-block */
#define DQ_SPAN_BYTES 256 /* bytes of the widest span, a Q6_K super-block (210) */
_Static_assert(sizeof(llmi_block_q6_k) <= DQ_SPAN_BYTES &&
                   8 * sizeof(llmi_block_q5_1) <= DQ_SPAN_BYTES,
               "a span's blocks fit the copy");

/* y[t*ldy + r] for r in [r0, r1), t < nt <= DQ_TILE, token t at x + t*cols:
 * per span of DQ_SPAN elements (or the row's last, shorter one, whole
 * blocks), acc[t] += llmi_dot_f32(dequantized span, x). */
static void dq_rows(const llmi_weight *W, int64_t r0, int64_t r1, const float *x, int nt, float *y,
                    int64_t ldy) {
    const llmi_ttype_info *ti = llmi_ttype_get(W->type);
    const int64_t cols = W->cols;
    const int64_t span = DQ_SPAN - DQ_SPAN % ti->block;
    const size_t span_bytes = (size_t)(span / ti->block) * ti->block_bytes;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        float acc[DQ_TILE] = {0};
        for (int64_t c0 = 0, off = 0; c0 < cols; c0 += span, off += (int64_t)span_bytes) {
            const int64_t n = cols - c0 < span ? cols - c0 : span;
            float w[DQ_SPAN];
            /* A copy: the reference reads blocks through their structs, and
             * rows need not be aligned. */
            _Alignas(16) uint8_t blk[DQ_SPAN_BYTES];
            memcpy(blk, row + off, (size_t)(n / ti->block) * ti->block_bytes);
            llmi_dequantize_row(W->type, blk, w, n);
            for (int t = 0; t < nt; t++)
                acc[t] += llmi_dot_f32(w, x + t * cols + c0, (int)n);
        }
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = acc[t];
    }
}

const llmi_rows_impl llmi_rows_dequant_f32 = {DQ_TILE, dq_rows};

static float c_dot(const float *a, const float *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            s[l] += a[i + l] * b[i + l];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

static void c_axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

static double c_sumsq(const float *x, int n) {
    double s[4] = {0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++)
            s[l] += (double)x[i + l] * x[i + l];
    double r = (s[0] + s[1]) + (s[2] + s[3]);
    for (; i < n; i++)
        r += (double)x[i] * x[i];
    return r;
}

/* f16 / bf16 rows: the same 8-lane order as c_dot. */

/* llmi_f16_to_f32 without calls or branches: the exponent and mantissa
 * bits, moved to their f32 places, read as an f32 that is 2^-112 times the
 * value (subnormal halves land on f32 subnormals), so one exact multiply
 * by 2^112 rescales them; inf and NaN get the all-ones f32 exponent. */
static inline float c_f16(uint16_t h) {
    uint32_t o = (uint32_t)(h & 0x7fff) << 13;
    float f;
    memcpy(&f, &o, 4);
    f *= 0x1p112f;
    memcpy(&o, &f, 4);
    o |= (h & 0x7c00) == 0x7c00 ? 0x7f800000u : 0;
    o |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &o, 4);
    return f;
}

static float c_dot_f16(const float *a, const void *bv, int n) {
    const uint16_t *b = bv;
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            s[l] += a[i + l] * c_f16(b[i + l]);
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++)
        r += a[i] * c_f16(b[i]);
    return r;
}

static float c_dot_bf16(const float *a, const void *bv, int n) {
    const uint16_t *b = bv;
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            s[l] += a[i + l] * llmi_bf16_to_f32(b[i + l]);
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++)
        r += a[i] * llmi_bf16_to_f32(b[i]);
    return r;
}

static void c_axpy_f16(float *y, float a, const void *xv, int n) {
    const uint16_t *x = xv;
    int i = 0;
    for (; i + 8 <= n; i += 8) /* fixed trip count: vectorizes at -O2 */
        for (int l = 0; l < 8; l++)
            y[i + l] += a * c_f16(x[i + l]);
    for (; i < n; i++)
        y[i] += a * c_f16(x[i]);
}

static void c_axpy_bf16(float *y, float a, const void *xv, int n) {
    const uint16_t *x = xv;
    int i = 0;
    for (; i + 8 <= n; i += 8) /* fixed trip count: vectorizes at -O2 */
        for (int l = 0; l < 8; l++)
            y[i + l] += a * llmi_bf16_to_f32(x[i + l]);
    for (; i < n; i++)
        y[i] += a * llmi_bf16_to_f32(x[i]);
}

static void c_store_f16(void *dst, const float *x, int n) {
    uint16_t *y = dst;
    for (int i = 0; i < n; i++)
        y[i] = llmi_f32_to_f16(x[i]);
}

static void c_store_bf16(void *dst, const float *x, int n) {
    uint16_t *y = dst;
    for (int i = 0; i < n; i++)
        y[i] = llmi_f32_to_bf16(x[i]);
}

/* F32 rows as llmi_row_ops: the level's own dot and axpy behind a void
 * pointer (a tail call). */
static void c_store_f32(void *dst, const float *x, int n) { memcpy(dst, x, (size_t)n * sizeof *x); }
static float c_dot_f32v(const float *a, const void *b, int n) { return c_dot(a, b, n); }
static void c_axpy_f32v(float *y, float a, const void *x, int n) { c_axpy(y, a, x, n); }

static const llmi_kernel_set c_kernels = {
    .dot = c_dot,
    .axpy = c_axpy,
    .sumsq = c_sumsq,
    .row_ops = {[LLMI_RT_F32] = {c_store_f32, c_dot_f32v, c_axpy_f32v},
                [LLMI_RT_F16] = {c_store_f16, c_dot_f16, c_axpy_f16},
                [LLMI_RT_BF16] = {c_store_bf16, c_dot_bf16, c_axpy_bf16},
                [LLMI_RT_Q8_0] = {llmi_kvq_store_q8_0, llmi_kvq_dot_q8_0_c, llmi_kvq_axpy_q8_0_c},
                [LLMI_RT_Q4_0] = {llmi_kvq_store_q4_0, llmi_kvq_dot_q4_0_c, llmi_kvq_axpy_q4_0_c},
                [LLMI_RT_FP8_E4M3] = {llmi_kvq_store_fp8_e4m3, llmi_kvq_dot_fp8_e4m3_c,
                                      llmi_kvq_axpy_fp8_e4m3_c}},
};

/* ---- the current level's row helpers ------------------------------------ */

const llmi_kernel_set *llmi_kernels_current(void) {
    switch (llmi_kernels_level()) {
#if defined(LLMI_KERNELS_X86)
    case LLMI_KLEVEL_AVX2:
        return &llmi_kernels_avx2;
    case LLMI_KLEVEL_AVX512:
        return &llmi_kernels_avx512;
#endif
    default:
        return &c_kernels;
    }
}

/* ---- row-wise helpers --------------------------------------------------- */

void llmi_rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
    if (n <= 0)
        return;
    double ss = llmi_kernels_current()->sumsq(x, n);
    float scale = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++)
        out[i] = x[i] * scale * weight[i];
}

float llmi_dot_f32(const float *a, const float *b, int n) {
    return n > 0 ? llmi_kernels_current()->dot(a, b, n) : 0.0f;
}

void llmi_axpy_f32(float *y, float a, const float *x, int n) {
    if (n > 0)
        llmi_kernels_current()->axpy(y, a, x, n);
}

void llmi_softmax_inplace(float *x, int n) {
    if (n <= 0)
        return;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    if (mx == -INFINITY) { /* everything masked: no preference */
        for (int i = 0; i < n; i++)
            x[i] = 1.0f / (float)n;
        return;
    }
    /* The largest term is exp(0) = 1, so the sum is in [1, n]: no overflow,
     * and double keeps it exact enough for any context length. */
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        float e = expf(x[i] - mx);
        x[i] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

void llmi_silu_mul(float *gate_out, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate_out[i];
        /* exp(-g) overflows to inf for g < -88: g / inf = -0, the limit. */
        gate_out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void llmi_gelu_tanh_mul(float *gate_out, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate_out[i];
        float t = tanhf(0.7978845608f * g * (1.0f + 0.044715f * g * g));
        gate_out[i] = 0.5f * g * (1.0f + t) * up[i];
    }
}

void llmi_add_inplace(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++)
        y[i] += x[i];
}

/* ---- f16 / bf16 rows ---------------------------------------------------- */

static int rt_index(llmi_ttype type) {
    switch (type) {
    case LLMI_T_F32:
        return LLMI_RT_F32;
    case LLMI_T_F16:
        return LLMI_RT_F16;
    case LLMI_T_BF16:
        return LLMI_RT_BF16;
    case LLMI_T_Q8_0:
        return LLMI_RT_Q8_0;
    case LLMI_T_Q4_0:
        return LLMI_RT_Q4_0;
    case LLMI_T_FP8_E4M3:
        return LLMI_RT_FP8_E4M3;
    default:
        return -1;
    }
}

const llmi_row_ops *llmi_row_ops_get(llmi_ttype type) {
    const int rt = rt_index(type);
    return rt < 0 ? NULL : &llmi_kernels_current()->row_ops[rt];
}

void llmi_f32_to_f16_row(const float *x, uint16_t *y, int n) {
    if (n > 0)
        llmi_kernels_current()->row_ops[LLMI_RT_F16].store(y, x, n);
}

void llmi_f32_to_bf16_row(const float *x, uint16_t *y, int n) {
    if (n > 0)
        llmi_kernels_current()->row_ops[LLMI_RT_BF16].store(y, x, n);
}

float llmi_dot_f32_f16(const float *a, const uint16_t *b, int n) {
    return n > 0 ? llmi_kernels_current()->row_ops[LLMI_RT_F16].dot(a, b, n) : 0.0f;
}

float llmi_dot_f32_bf16(const float *a, const uint16_t *b, int n) {
    return n > 0 ? llmi_kernels_current()->row_ops[LLMI_RT_BF16].dot(a, b, n) : 0.0f;
}

void llmi_axpy_f16(float *y, float a, const uint16_t *x, int n) {
    if (n > 0)
        llmi_kernels_current()->row_ops[LLMI_RT_F16].axpy(y, a, x, n);
}

void llmi_axpy_bf16(float *y, float a, const uint16_t *x, int n) {
    if (n > 0)
        llmi_kernels_current()->row_ops[LLMI_RT_BF16].axpy(y, a, x, n);
}
