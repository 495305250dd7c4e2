/* AVX2+FMA+F16C and AVX-512F kernels.
 *
 * The library is built without -march flags, so each function carries its
 * own target attribute and kernels_dispatch.c picks them at run time. Helpers are
 * always_inline with the same (or a smaller) target, which GCC and Clang
 * require for inlining intrinsics across target boundaries.
 *
 * AVX2 matmul structure: a row is walked in chunks of 32 elements (one quant
 * block). A chunk is dequantized once into 4 ymm and then multiplied with
 * each of up to `tile` tokens: the per-token chunk sum is formed in a
 * temporary and added (or, for Q4_0/Q8_0, fused with the block scale d) into
 * the token's accumulator; even and odd chunks have separate accumulators.
 * The temporaries of different chunks are independent, so the only
 * loop-carried chain is one add/fma per two chunks, and the arithmetic of a
 * token is the same whatever the tile size: results do not depend on n_tok.
 * The rows functions are instantiated for every tile size with
 * constant-folded loops so that the accumulators live in registers. Block
 * scales (f16) are converted for 64 blocks at a time before the chunk loop
 * (gather_scales).
 *
 * AVX-512 is a register-blocked GEMM with the portable kernels' arithmetic
 * (its section below). */
#include "backend/cpu/kernels_impl.h"

#if defined(LLMI_KERNELS_X86)

#include <immintrin.h>
#include <limits.h>
#include <stdalign.h>

#define T_AVX2 "avx2,fma,f16c"
#define T_AVX512 "avx512f,avx2,fma,f16c"
#define A2 __attribute__((target(T_AVX2)))
#define A2I inline __attribute__((always_inline, target(T_AVX2)))
#define A5 __attribute__((target(T_AVX512)))
#define A5I inline __attribute__((always_inline, target(T_AVX512)))

#define CHUNK 32
#define A2_TILE 4 /* 4 accumulators + 4 weights + temporaries fit 16 ymm */

static inline uint16_t ld16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* Element c of a float-type row, for the tail of rows whose length is not a
 * multiple of 32 (quant rows never have one). */
static inline float elem(int kt, const uint8_t *row, int64_t c) {
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

static float tail_dot(int kt, const uint8_t *row, int64_t c0, int64_t cols, const float *x) {
    float s = 0.0f;
    for (int64_t c = c0; c < cols; c++)
        s += elem(kt, row, c) * x[c];
    return s;
}

/* Blocks per scale segment (see gather_scales). */
#define SEG 64

/* Scales per block: d, or d and m (Q4_1). */
#define NSC(kt) ((kt) == LLMI_KT_Q4_1 ? 2 : 1)

/* Copies the f16 scales of blocks b0..b0+n-1 (d, or d and m) into one
 * contiguous array, zero-padded to a multiple of 16, for a vector
 * conversion. Converting one block's scale on its own (insert, convert,
 * broadcast) costs as many shuffle-port uops as the whole dequantization;
 * converted in bulk, the main loop gets each scale with a broadcast load,
 * which needs no ALU port at all. */
static inline int gather_scales(int kt, const uint8_t *row, int64_t b0, int n, uint16_t *h) {
    const size_t bs = kt == LLMI_KT_Q4_0   ? sizeof(llmi_block_q4_0)
                      : kt == LLMI_KT_Q4_1 ? sizeof(llmi_block_q4_1)
                                           : sizeof(llmi_block_q8_0);
    const uint8_t *blk = row + (size_t)b0 * bs;
    int i = 0;
    for (; i < n * NSC(kt); i += NSC(kt), blk += bs)
        memcpy(h + i, blk, 2 * NSC(kt));
    for (; i % 16; i++)
        h[i] = 0;
    return i;
}

/* Types whose chunk weights are integers scaled by one factor per block. */
#define SCALED(kt) ((kt) == LLMI_KT_Q4_0 || (kt) == LLMI_KT_Q8_0)
/* Types with f16 scales in their blocks. */
#define HAS_SCALES(kt) (SCALED(kt) || (kt) == LLMI_KT_Q4_1)

#define LOADL(p) _mm_loadl_epi64((const __m128i *)(const void *)(p))
#define LOADU128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define LOADU256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

/* ---- AVX2 ------------------------------------------------------------------ */

static A2I float a2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static A2I void a2_scales(int kt, const uint8_t *row, int64_t b0, int n, float *sc) {
    uint16_t h[2 * SEG];
    const int n16 = gather_scales(kt, row, b0, n, h);
    for (int i = 0; i < n16; i += 8)
        _mm256_store_ps(sc + i, _mm256_cvtph_ps(LOADU128(h + i)));
}

/* Chunk b of a row: w[k] holds elements 8k..8k+7; *d the block scale for
 * SCALED types, from the converted scales sc (d, and m for Q4_1). In Q4
 * blocks byte j holds element j (low nibble) and j+16 (high nibble), so
 * zero-extending bytes 0-7 gives elements 0-7 and 16-23. */
static A2I void a2_chunk(int kt, const uint8_t *row, int64_t b, const float *sc, __m256 w[4],
                         __m256 *d) {
    switch (kt) {
    case LLMI_KT_Q4_0: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q4_0);
        const uint8_t *qs = blk + offsetof(llmi_block_q4_0, qs);
        const __m256i v0 = _mm256_cvtepu8_epi32(LOADL(qs));
        const __m256i v1 = _mm256_cvtepu8_epi32(LOADL(qs + 8));
        const __m256i lo = _mm256_set1_epi32(15), off = _mm256_set1_epi32(8);
        w[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v0, lo), off));
        w[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v1, lo), off));
        w[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v0, 4), off));
        w[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v1, 4), off));
        *d = _mm256_set1_ps(sc[0]);
        break;
    }
    case LLMI_KT_Q4_1: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q4_1);
        const uint8_t *qs = blk + offsetof(llmi_block_q4_1, qs);
        const __m256i v0 = _mm256_cvtepu8_epi32(LOADL(qs));
        const __m256i v1 = _mm256_cvtepu8_epi32(LOADL(qs + 8));
        const __m256i lo = _mm256_set1_epi32(15);
        const __m256 dd = _mm256_set1_ps(sc[0]), m = _mm256_set1_ps(sc[1]);
        w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, lo)), dd, m);
        w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, lo)), dd, m);
        w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), dd, m);
        w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), dd, m);
        break;
    }
    case LLMI_KT_Q8_0: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q8_0);
        const uint8_t *qs = blk + offsetof(llmi_block_q8_0, qs);
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(LOADL(qs + 8 * k)));
        *d = _mm256_set1_ps(sc[0]);
        break;
    }
    case LLMI_KT_F16: {
        const uint8_t *p = row + b * CHUNK * 2;
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_cvtph_ps(LOADU128(p + 16 * k));
        break;
    }
    case LLMI_KT_BF16: {
        const uint8_t *p = row + b * CHUNK * 2;
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(LOADU128(p + 16 * k)), 16));
        break;
    }
    default: { /* F32 */
        const float *p = (const float *)(const void *)(row + b * CHUNK * 4);
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_loadu_ps(p + 8 * k);
        break;
    }
    }
}

/* Chunk b times up to A2_TILE tokens into acc[t]. */
static A2I void a2_step(int kt, int nt, const uint8_t *row, int64_t b, const float *sc,
                        const float *x, int64_t cols, __m256 *acc) {
    __m256 w[4], d = _mm256_setzero_ps();
    a2_chunk(kt, row, b, sc, w, &d);
    const float *xb = x + b * CHUNK;
    LLMI_UNROLL
    for (int t = 0; t < nt; t++) {
        const float *xt = xb + t * cols;
        __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(xt));
        s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), s);
        s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), s);
        s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), s);
        acc[t] = SCALED(kt) ? _mm256_fmadd_ps(s, d, acc[t]) : _mm256_add_ps(acc[t], s);
    }
}

static A2I void a2_rows(int kt, int nt, const llmi_weight *W, int64_t r0, int64_t r1,
                        const float *x, float *y, int64_t ldy) {
    const int64_t cols = W->cols, nb = cols / CHUNK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        __m256 acc0[A2_TILE], acc1[A2_TILE];
        LLMI_UNROLL
        for (int t = 0; t < nt; t++)
            acc0[t] = acc1[t] = _mm256_setzero_ps();
        for (int64_t b0 = 0; b0 < nb; b0 += SEG) {
            const int n = nb - b0 < SEG ? (int)(nb - b0) : SEG;
            alignas(64) float sc[2 * SEG];
            if (HAS_SCALES(kt))
                a2_scales(kt, row, b0, n, sc);
            for (int i = 0; i < n; i += 2) {
                a2_step(kt, nt, row, b0 + i, sc + i * NSC(kt), x, cols, acc0);
                if (i + 1 < n)
                    a2_step(kt, nt, row, b0 + i + 1, sc + (i + 1) * NSC(kt), x, cols, acc1);
            }
        }
        LLMI_UNROLL
        for (int t = 0; t < nt; t++) {
            float v = a2_hsum(_mm256_add_ps(acc0[t], acc1[t]));
            if (nb * CHUNK < cols)
                v += tail_dot(kt, row, nb * CHUNK, cols, x + t * cols);
            y[t * ldy + r] = v;
        }
    }
}

#define A2_ROWS(name, KT)                                                                          \
    static A2 void name(const llmi_weight *w, int64_t r0, int64_t r1, const float *x, int nt,      \
                        float *y, int64_t ldy) {                                                   \
        switch (nt) {                                                                              \
        case 1:                                                                                    \
            a2_rows(KT, 1, w, r0, r1, x, y, ldy);                                                  \
            break;                                                                                 \
        case 2:                                                                                    \
            a2_rows(KT, 2, w, r0, r1, x, y, ldy);                                                  \
            break;                                                                                 \
        case 3:                                                                                    \
            a2_rows(KT, 3, w, r0, r1, x, y, ldy);                                                  \
            break;                                                                                 \
        default:                                                                                   \
            a2_rows(KT, 4, w, r0, r1, x, y, ldy);                                                  \
            break;                                                                                 \
        }                                                                                          \
    }
A2_ROWS(a2_rows_f32, LLMI_KT_F32)
A2_ROWS(a2_rows_f16, LLMI_KT_F16)
A2_ROWS(a2_rows_bf16, LLMI_KT_BF16)
A2_ROWS(a2_rows_q4_0, LLMI_KT_Q4_0)
A2_ROWS(a2_rows_q4_1, LLMI_KT_Q4_1)
A2_ROWS(a2_rows_q8_0, LLMI_KT_Q8_0)

static A2 float a2_dot(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float r = a2_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

static A2 void a2_axpy(float *y, float a, const float *x, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static A2 double a2_sumsq(const float *x, int n) {
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    __m256d s = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double r = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++)
        r += (double)x[i] * x[i];
    return r;
}

/* f16 / bf16 rows. Elements are widened exactly (VCVTPH2PS; bf16 is the
 * high half of an f32) and fed to the same FMA accumulation as a2_dot. */

static A2I __m256 a2_ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(LOADU128(p)); }
static A2I __m256 a2_ld_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(LOADU128(p)), 16));
}

#define A2_DOT16(name, LD, CVT)                                                                    \
    static A2 float name(const float *a, const void *bv, int n) {                                  \
        const uint16_t *b = bv;                                                                    \
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                                \
        int i = 0;                                                                                 \
        for (; i + 32 <= n; i += 32) {                                                             \
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LD(b + i), s0);                           \
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), LD(b + i + 8), s1);                   \
            s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), LD(b + i + 16), s2);                 \
            s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), LD(b + i + 24), s3);                 \
        }                                                                                          \
        for (; i + 8 <= n; i += 8)                                                                 \
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LD(b + i), s0);                           \
        float r = a2_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));            \
        for (; i < n; i++)                                                                         \
            r += a[i] * CVT(b[i]);                                                                 \
        return r;                                                                                  \
    }
A2_DOT16(a2_dot_f16, a2_ld_f16, llmi_f16_to_f32)
A2_DOT16(a2_dot_bf16, a2_ld_bf16, llmi_bf16_to_f32)

#define A2_AXPY16(name, LD, CVT)                                                                   \
    static A2 void name(float *y, float a, const void *xv, int n) {                                \
        const uint16_t *x = xv;                                                                    \
        const __m256 va = _mm256_set1_ps(a);                                                       \
        int i = 0;                                                                                 \
        for (; i + 8 <= n; i += 8)                                                                 \
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, LD(x + i), _mm256_loadu_ps(y + i)));       \
        for (; i < n; i++)                                                                         \
            y[i] += a * CVT(x[i]);                                                                 \
    }
A2_AXPY16(a2_axpy_f16, a2_ld_f16, llmi_f16_to_f32)
A2_AXPY16(a2_axpy_bf16, a2_ld_bf16, llmi_bf16_to_f32)

static A2 void a2_store_f16(void *dst, const float *x, int n) {
    uint16_t *y = dst;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(
            (__m128i *)(void *)(y + i),
            _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        y[i] = llmi_f32_to_f16(x[i]);
}

/* llmi_f32_to_bf16 on 8 lanes: add 0x7fff plus the lowest kept bit, keep the
 * high half; a NaN keeps its high half with the quiet bit set. */
static A2 void a2_store_bf16(void *dst, const float *x, int n) {
    uint16_t *y = dst;
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1),
                  quiet = _mm256_set1_epi32(0x40);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i v = _mm256_castps_si256(_mm256_loadu_ps(x + i));
        const __m256i hi = _mm256_srli_epi32(v, 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, abs_mask), inf);
        __m256i r = _mm256_add_epi32(v, _mm256_add_epi32(bias, _mm256_and_si256(hi, one)));
        r = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16), _mm256_or_si256(hi, quiet), nan);
        /* 8 dwords below 2^16 to 8 words: pack within lanes, then join. */
        r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(void *)(y + i), _mm256_castsi256_si128(r));
    }
    for (; i < n; i++)
        y[i] = llmi_f32_to_bf16(x[i]);
}

static A2 void a2_store_f32(void *dst, const float *x, int n) {
    memcpy(dst, x, (size_t)n * sizeof *x);
}
static A2 float a2_dot_f32v(const float *a, const void *b, int n) { return a2_dot(a, b, n); }
static A2 void a2_axpy_f32v(float *y, float a, const void *x, int n) { a2_axpy(y, a, x, n); }

const llmi_rows_impl llmi_rows_f32_avx2 = {A2_TILE, a2_rows_f32};
const llmi_rows_impl llmi_rows_f16_avx2 = {A2_TILE, a2_rows_f16};
const llmi_rows_impl llmi_rows_bf16_avx2 = {A2_TILE, a2_rows_bf16};
const llmi_rows_impl llmi_rows_q4_0_avx2 = {A2_TILE, a2_rows_q4_0};
const llmi_rows_impl llmi_rows_q4_1_avx2 = {A2_TILE, a2_rows_q4_1};
const llmi_rows_impl llmi_rows_q8_0_avx2 = {A2_TILE, a2_rows_q8_0};

const llmi_kernel_set llmi_kernels_avx2 = {
    .dot = a2_dot,
    .axpy = a2_axpy,
    .sumsq = a2_sumsq,
    .row_ops = {[LLMI_RT_F32] = {a2_store_f32, a2_dot_f32v, a2_axpy_f32v},
                [LLMI_RT_F16] = {a2_store_f16, a2_dot_f16, a2_axpy_f16},
                [LLMI_RT_BF16] = {a2_store_bf16, a2_dot_bf16, a2_axpy_bf16},
                [LLMI_RT_Q8_0] = {llmi_kvq_store_q8_0, llmi_kvq_dot_q8_0_avx2,
                                  llmi_kvq_axpy_q8_0_avx2},
                [LLMI_RT_Q4_0] = {llmi_kvq_store_q4_0, llmi_kvq_dot_q4_0_avx2,
                                  llmi_kvq_axpy_q4_0_avx2},
                [LLMI_RT_FP8_E4M3] = {llmi_kvq_store_fp8_e4m3, llmi_kvq_dot_fp8_e4m3_avx2,
                                      llmi_kvq_axpy_fp8_e4m3_avx2}},
};

/* ---- AVX-512 --------------------------------------------------------------- */

/* The f32-activation matmul is a register-blocked GEMM. Per (row, token) its
 * arithmetic is fixed: 16 lane sums, lane l adding w[16c + l] * x[16c + l]
 * for c = 0, 1, ... with FMA (a last partial step zero-padded), then the
 * tree lane i + lane i+8, then + 4, + 2, + 1. The portable kernels
 * (kernels.c, c_rows) compute exactly that, so the bits agree, and a token's
 * result does not depend on the tile it is computed in.
 *
 * The micro-kernel keeps A5_R rows x A5_N tokens of lane sums in 24 zmm. Per
 * step of 16 columns it widens A5_R weight vectors (F16: vcvtph2ps; BF16: a
 * shift; quant blocks: q * d, exact, or Q4_1's fma(q, d, m)), loads A5_N
 * activation vectors into registers, and does the 24 FMAs: each widened
 * weight serves 6 tokens and each activation load 4 rows. A transposed
 * reduction folds 8 vectors of lane sums at a time into 8 results. Rows are
 * walked in blocks of about A5_BLOCK_BYTES of weights, which stay in L2
 * while every token tile passes over them; a tile's activations (A5_N rows)
 * stay in L1 while the row tiles of a block pass. */
#define A5_R 4
#define A5_N 6
#define A5_BLOCK_BYTES (1024 * 1024)

/* Columns 16c .. 16c+15 of a row (quant rows: half c & 1 of block c >> 1),
 * widened to f32. */
static A5I __m512 a5_wstep(int kt, const uint8_t *row, int64_t c) {
    switch (kt) {
    case LLMI_KT_F16:
        return _mm512_cvtph_ps(LOADU256(row + 32 * c));
    case LLMI_KT_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(LOADU256(row + 32 * c)), 16));
    case LLMI_KT_Q4_0:
    case LLMI_KT_Q4_1: {
        /* Byte j of a block holds element j (low nibble) and j + 16 (high
         * nibble); VPERMPS looks the value up with the low 4 bits of each
         * index, so the low half needs no mask and the high one a shift. */
        const int q41 = kt == LLMI_KT_Q4_1;
        const uint8_t *blk =
            row + (c >> 1) * (int64_t)(q41 ? sizeof(llmi_block_q4_1) : sizeof(llmi_block_q4_0));
        __m512i v = _mm512_cvtepu8_epi32(LOADU128(blk + (q41 ? 4 : 2)));
        if (c & 1)
            v = _mm512_srli_epi32(v, 4);
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(ld16(blk)));
        const __m512 tab = q41 ? _mm512_fmadd_ps(iota, d, _mm512_set1_ps(_cvtsh_ss(ld16(blk + 2))))
                               : _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(8.0f)), d);
        return _mm512_permutexvar_ps(v, tab);
    }
    case LLMI_KT_Q8_0: {
        const uint8_t *blk = row + (c >> 1) * (int64_t)sizeof(llmi_block_q8_0);
        const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(LOADU128(blk + 2 + 16 * (c & 1))));
        return _mm512_mul_ps(q, _mm512_set1_ps(_cvtsh_ss(ld16(blk))));
    }
    default: /* F32 */
        return _mm512_loadu_ps((const float *)(const void *)(row + 64 * c));
    }
}

/* Folds 8 vectors of lane sums into their 8 sums (the tree above, for 8
 * vectors at once: 24 operations instead of 72). Values rather than a
 * pointer, so that Clang keeps acc in registers. */
static A5I void a5_reduce8(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 b0, __m512 b1,
                           __m512 b2, __m512 b3, float *out) {
    const __m512 v[8] = {a0, a1, a2, a3, b0, b1, b2, b3};
    __m512 p[4], q[2];
    LLMI_UNROLL
    for (int k = 0; k < 4; k++) /* lanes i + i+8: [v2k s8[0..3], s8[4..7] | v2k+1 ...] */
        p[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
    LLMI_UNROLL
    for (int k = 0; k < 2; k++) /* + 4: 128-bit lane j holds vector 4k+j's s4 */
        q[k] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(p[2 * k], p[2 * k + 1], 0xDD));
    /* + 2: lane j holds [s2 of vector j | s2 of vector 4+j] */
    const __m512d q0 = _mm512_castps_pd(q[0]), q1 = _mm512_castps_pd(q[1]);
    __m512 r = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(q0, q1)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(q0, q1)));
    /* + 1: vector j's sum in element 4j, vector 4+j's in 4j+2 */
    r = _mm512_add_ps(r, _mm512_permute_ps(r, 0xB1));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm256_storeu_ps(out, _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, r)));
}

/* A5_R rows (wr; the first nr are stored) x N tokens (x, stride cols) into
 * y[t * ldy + r]. */
static A5I void a5_tile(int kt, int N, const uint8_t *const *wr, const float *x, int64_t cols,
                        float *y, int64_t ldy, int nr, int64_t pf) {
    const int64_t ns = cols / 16, tail = cols - ns * 16;
    /* A float row's last partial step, widened before the accumulators are
     * live (elem calls a function). */
    alignas(64) float tw[A5_R][16];
    if (tail) {
        for (int r = 0; r < A5_R; r++)
            for (int j = 0; j < 16; j++)
                tw[r][j] = j < tail ? elem(kt, wr[r], ns * 16 + j) : 0.0f;
    }
    __m512 acc[A5_N][A5_R];
    LLMI_UNROLL
    for (int t = 0; t < N; t++) {
        LLMI_UNROLL
        for (int r = 0; r < A5_R; r++)
            acc[t][r] = _mm512_setzero_ps();
    }
    /* Bytes per step, for the prefetch of the next row tile (pf bytes on)
     * when this tile is the first to read these rows: the A5_R row streams
     * are more than the hardware prefetchers keep ahead of. */
    const int64_t sb = kt == LLMI_KT_F32    ? 64
                       : kt == LLMI_KT_Q4_0 ? 9
                       : kt == LLMI_KT_Q4_1 ? 10
                       : kt == LLMI_KT_Q8_0 ? 17
                                            : 32;
    for (int64_t c = 0; c < ns; c++) {
        __m512 w[A5_R];
        if (pf) {
            LLMI_UNROLL
            for (int r = 0; r < A5_R; r++)
                _mm_prefetch((const char *)wr[r] + sb * c + pf, _MM_HINT_T0);
        }
        LLMI_UNROLL
        for (int r = 0; r < A5_R; r++)
            w[r] = a5_wstep(kt, wr[r], c);
        LLMI_UNROLL
        for (int t = 0; t < N; t++) {
            __m512 xv = _mm512_loadu_ps(x + t * cols + 16 * c);
            __asm__("" : "+v"(xv)); /* one load for the 4 rows, not 4 folded ones */
            LLMI_UNROLL
            for (int r = 0; r < A5_R; r++)
                acc[t][r] = _mm512_fmadd_ps(w[r], xv, acc[t][r]);
        }
    }
    if (tail) { /* float rows only: the last step, zero-padded */
        const __mmask16 m = (__mmask16)((1u << tail) - 1);
        __m512 w[A5_R];
        LLMI_UNROLL
        for (int r = 0; r < A5_R; r++)
            w[r] = _mm512_load_ps(tw[r]);
        LLMI_UNROLL
        for (int t = 0; t < N; t++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * cols + 16 * ns);
            LLMI_UNROLL
            for (int r = 0; r < A5_R; r++)
                acc[t][r] = _mm512_fmadd_ps(w[r], xv, acc[t][r]);
        }
    }
    /* Vector i of the tile, token-major (zero past the end). */
#define A5_ACC(i) ((i) < N * A5_R ? acc[(i) / A5_R][(i) % A5_R] : _mm512_setzero_ps())
    alignas(64) float s[A5_N * A5_R + 8];
    LLMI_UNROLL
    for (int i = 0; i < N * A5_R; i += 8)
        a5_reduce8(A5_ACC(i), A5_ACC(i + 1), A5_ACC(i + 2), A5_ACC(i + 3), A5_ACC(i + 4),
                   A5_ACC(i + 5), A5_ACC(i + 6), A5_ACC(i + 7), s + i);
#undef A5_ACC
    LLMI_UNROLL
    for (int t = 0; t < N; t++)
        for (int r = 0; r < nr; r++)
            y[t * ldy + r] = s[t * A5_R + r];
}

typedef void (*a5_tile_fn)(const uint8_t *const *wr, const float *x, int64_t cols, float *y,
                           int64_t ldy, int nr, int64_t pf);
#define A5_TILE_FN(KT, N)                                                                          \
    static A5 void a5_tile_##KT##_##N(const uint8_t *const *wr, const float *x, int64_t cols,      \
                                      float *y, int64_t ldy, int nr, int64_t pf) {                 \
        a5_tile(LLMI_KT_##KT, N, wr, x, cols, y, ldy, nr, pf);                                     \
    }
#define A5_TILES(KT)                                                                               \
    A5_TILE_FN(KT, 1)                                                                              \
    A5_TILE_FN(KT, 2)                                                                              \
    A5_TILE_FN(KT, 3)                                                                              \
    A5_TILE_FN(KT, 4)                                                                              \
    A5_TILE_FN(KT, 5)                                                                              \
    A5_TILE_FN(KT, 6)
A5_TILES(F32)
A5_TILES(F16)
A5_TILES(BF16)
A5_TILES(Q4_0)
A5_TILES(Q4_1)
A5_TILES(Q8_0)
#define A5_TILE_ROW(KT)                                                                            \
    [LLMI_KT_##KT] = {a5_tile_##KT##_1, a5_tile_##KT##_2, a5_tile_##KT##_3,                        \
                      a5_tile_##KT##_4, a5_tile_##KT##_5, a5_tile_##KT##_6}
static const a5_tile_fn a5_tiles[LLMI_KT_COUNT][A5_N] = {
    A5_TILE_ROW(F32),  A5_TILE_ROW(F16),  A5_TILE_ROW(BF16),
    A5_TILE_ROW(Q4_0), A5_TILE_ROW(Q4_1), A5_TILE_ROW(Q8_0),
};

/* Rows [r0, r1) for all nt tokens (any number: its tile is INT_MAX). */
static A5I void a5_gemm(int kt, const llmi_weight *W, int64_t r0, int64_t r1, const float *x,
                        int nt, float *y, int64_t ldy) {
    const int64_t cols = W->cols;
    int64_t mb = W->row_bytes ? (int64_t)(A5_BLOCK_BYTES / W->row_bytes) : 256;
    mb = mb > 256 ? 256 : mb < A5_R ? A5_R : mb - mb % A5_R;
    /* Token tiles of balanced sizes (8 = 4 + 4, not 6 + 2). */
    const int ntiles = (nt + A5_N - 1) / A5_N;
    for (int64_t rb = r0; rb < r1; rb += mb) {
        const int64_t re = rb + mb < r1 ? rb + mb : r1;
        for (int i = 0, t0 = 0; i < ntiles; i++) {
            const int n = nt / ntiles + (i < nt % ntiles);
            /* The first tile over a block brings it from memory: it prefetches
             * the next row tile (the last one of a block, the next block's
             * first rows; past r1 they are only prefetched). */
            const int64_t pf = i == 0 ? (int64_t)(A5_R * W->row_bytes) : 0;
            for (int64_t r = rb; r < re; r += A5_R) {
                const int nr = re - r < A5_R ? (int)(re - r) : A5_R;
                const uint8_t *wr[A5_R]; /* missing rows repeat the last one */
                for (int j = 0; j < A5_R; j++)
                    wr[j] = (const uint8_t *)W->data +
                            (size_t)(r + (j < nr ? j : nr - 1)) * W->row_bytes;
                a5_tiles[kt][n - 1](wr, x + t0 * cols, cols, y + t0 * ldy + r, ldy, nr, pf);
            }
            t0 += n;
        }
    }
}

#define A5_GEMM(name, KT)                                                                          \
    static A5 void name(const llmi_weight *w, int64_t r0, int64_t r1, const float *x, int nt,      \
                        float *y, int64_t ldy) {                                                   \
        a5_gemm(KT, w, r0, r1, x, nt, y, ldy);                                                     \
    }
A5_GEMM(a5_rows_f32, LLMI_KT_F32)
A5_GEMM(a5_rows_f16, LLMI_KT_F16)
A5_GEMM(a5_rows_bf16, LLMI_KT_BF16)
A5_GEMM(a5_rows_q4_0, LLMI_KT_Q4_0)
A5_GEMM(a5_rows_q4_1, LLMI_KT_Q4_1)
A5_GEMM(a5_rows_q8_0, LLMI_KT_Q8_0)

static A5 float a5_dot(const float *a, const float *b, int n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    if (i + 16 <= n) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        i += 16;
    }
    if (i < n) { /* masked loads do not touch the lanes past the end */
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static A5 void a5_axpy(float *y, float a, const float *x, int n) {
    const __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(
            y + i, m,
            _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static A5 double a5_sumsq(const float *x, int n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi =
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    double r = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; i < n; i++)
        r += (double)x[i] * x[i];
    return r;
}

/* f16 / bf16 rows: as the AVX2 ones, 16 lanes. */

static A5I __m512 a5_ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(LOADU256(p)); }
static A5I __m512 a5_ld_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(LOADU256(p)), 16));
}

#define A5_DOT16(name, LD, CVT)                                                                    \
    static A5 float name(const float *a, const void *bv, int n) {                                  \
        const uint16_t *b = bv;                                                                    \
        __m512 s0 = _mm512_setzero_ps(), s1 = s0;                                                  \
        int i = 0;                                                                                 \
        for (; i + 32 <= n; i += 32) {                                                             \
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), LD(b + i), s0);                           \
            s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), LD(b + i + 16), s1);                 \
        }                                                                                          \
        if (i + 16 <= n) {                                                                         \
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), LD(b + i), s0);                           \
            i += 16;                                                                               \
        }                                                                                          \
        float r = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));                                     \
        for (; i < n; i++)                                                                         \
            r += a[i] * CVT(b[i]);                                                                 \
        return r;                                                                                  \
    }
A5_DOT16(a5_dot_f16, a5_ld_f16, llmi_f16_to_f32)
A5_DOT16(a5_dot_bf16, a5_ld_bf16, llmi_bf16_to_f32)

#define A5_AXPY16(name, LD, CVT)                                                                   \
    static A5 void name(float *y, float a, const void *xv, int n) {                                \
        const uint16_t *x = xv;                                                                    \
        const __m512 va = _mm512_set1_ps(a);                                                       \
        int i = 0;                                                                                 \
        for (; i + 16 <= n; i += 16)                                                               \
            _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, LD(x + i), _mm512_loadu_ps(y + i)));       \
        for (; i < n; i++)                                                                         \
            y[i] += a * CVT(x[i]);                                                                 \
    }
A5_AXPY16(a5_axpy_f16, a5_ld_f16, llmi_f16_to_f32)
A5_AXPY16(a5_axpy_bf16, a5_ld_bf16, llmi_bf16_to_f32)

static A5 void a5_store_f16(void *dst, const float *x, int n) {
    uint16_t *y = dst;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256(
            (__m256i *)(void *)(y + i),
            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        y[i] = llmi_f32_to_f16(x[i]);
}

/* As a2_store_bf16 (not VCVTNEPS2BF16, which flushes subnormals). */
static A5 void a5_store_bf16(void *dst, const float *x, int n) {
    uint16_t *y = dst;
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1),
                  quiet = _mm512_set1_epi32(0x40);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i v = _mm512_castps_si512(_mm512_loadu_ps(x + i));
        const __m512i hi = _mm512_srli_epi32(v, 16);
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(v, abs_mask), inf);
        __m512i r = _mm512_add_epi32(v, _mm512_add_epi32(bias, _mm512_and_si512(hi, one)));
        r = _mm512_mask_blend_epi32(nan, _mm512_srli_epi32(r, 16), _mm512_or_si512(hi, quiet));
        _mm256_storeu_si256((__m256i *)(void *)(y + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++)
        y[i] = llmi_f32_to_bf16(x[i]);
}

static A5 void a5_store_f32(void *dst, const float *x, int n) {
    memcpy(dst, x, (size_t)n * sizeof *x);
}
static A5 float a5_dot_f32v(const float *a, const void *b, int n) { return a5_dot(a, b, n); }
static A5 void a5_axpy_f32v(float *y, float a, const void *x, int n) { a5_axpy(y, a, x, n); }

const llmi_rows_impl llmi_rows_f32_avx512 = {INT_MAX, a5_rows_f32};
const llmi_rows_impl llmi_rows_f16_avx512 = {INT_MAX, a5_rows_f16};
const llmi_rows_impl llmi_rows_bf16_avx512 = {INT_MAX, a5_rows_bf16};
const llmi_rows_impl llmi_rows_q4_0_avx512 = {INT_MAX, a5_rows_q4_0};
const llmi_rows_impl llmi_rows_q4_1_avx512 = {INT_MAX, a5_rows_q4_1};
const llmi_rows_impl llmi_rows_q8_0_avx512 = {INT_MAX, a5_rows_q8_0};

const llmi_kernel_set llmi_kernels_avx512 = {
    .dot = a5_dot,
    .axpy = a5_axpy,
    .sumsq = a5_sumsq,
    .row_ops = {[LLMI_RT_F32] = {a5_store_f32, a5_dot_f32v, a5_axpy_f32v},
                [LLMI_RT_F16] = {a5_store_f16, a5_dot_f16, a5_axpy_f16},
                [LLMI_RT_BF16] = {a5_store_bf16, a5_dot_bf16, a5_axpy_bf16},
                [LLMI_RT_Q8_0] = {llmi_kvq_store_q8_0, llmi_kvq_dot_q8_0_avx512,
                                  llmi_kvq_axpy_q8_0_avx512},
                [LLMI_RT_Q4_0] = {llmi_kvq_store_q4_0, llmi_kvq_dot_q4_0_avx512,
                                  llmi_kvq_axpy_q4_0_avx512},
                [LLMI_RT_FP8_E4M3] = {llmi_kvq_store_fp8_e4m3, llmi_kvq_dot_fp8_e4m3_avx512,
                                      llmi_kvq_axpy_fp8_e4m3_avx512}},
};

#else
/* ISO C forbids an empty translation unit. */
typedef int llmi_kernels_x86_unused;
#endif
