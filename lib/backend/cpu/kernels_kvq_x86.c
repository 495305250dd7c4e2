/* AVX2+FMA+F16C and AVX-512F row operations of the quantized KV cache
 * (kernels_kvq.c gives the formulas and is the reference).
 *
 * Per block the integers are widened to f32 exactly (VPMOVSXBD, then
 * VCVTDQ2PS), multiplied with the query's 32 floats in FMA lanes (4 ymm or
 * 2 zmm), and the block's lane vector is scaled by d into an accumulator
 * vector with one more FMA; one horizontal sum at the end. axpy scales the
 * widened integers by a * d per block. Results differ from the portable
 * ones only in the order of the float sums (the dot) or not at all (axpy,
 * which rounds each y element once per call in both, bar FMA fusing).
 *
 * FP8 E4M3 codes are widened exactly without a table: a normal code's
 * exponent and mantissa bits, shifted into f32's place, need only the
 * exponent rebiased (an integer add); a subnormal one is its 3-bit
 * integer times 2^-9; S.1111.111 is NaN. No step reads or makes a
 * subnormal float, so a host that sets the denormals-are-zero flag gets
 * the same values. The block scale is f32 already. */
#include "backend/cpu/kernels_impl.h"

#if defined(LLMI_KERNELS_X86)

#include <immintrin.h>
#include <math.h>

#define A2 __attribute__((target("avx2,fma,f16c")))
#define A2I inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define A5 __attribute__((target("avx512f,avx2,fma,f16c")))
#define A5I inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))

static inline __m128i ld128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

/* Block scales are widened with F16C (VCVTPH2PS, exact like
 * llmi_f16_to_f32) rather than a call per block. */

/* A Q4_0 block's 16 bytes as two vectors of 16 signed bytes: elements
 * 0..15 (low nibbles) and 16..31 (high nibbles), each minus 8. */
static A2I void q4_0_bytes(const llmi_block_q4_0 *b, __m128i *lo, __m128i *hi) {
    const __m128i raw = ld128(b->qs), mask = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    *lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);
    *hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);
}

/* ---- AVX2 ---- */

/* 8 signed bytes at lane offset `half` (0 or 8) of v as floats. */
static A2I __m256 a2_i8_ps(__m128i v, int half) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(half ? _mm_srli_si128(v, 8) : v));
}

static A2I float a2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The block's four vectors of 8 values (elements 0-7, 8-15, 16-23, 24-31). */
static A2I void a2_q8_0(const llmi_block_q8_0 *b, __m256 q[4]) {
    const __m128i v0 = ld128(b->qs), v1 = ld128(b->qs + 16);
    q[0] = a2_i8_ps(v0, 0);
    q[1] = a2_i8_ps(v0, 1);
    q[2] = a2_i8_ps(v1, 0);
    q[3] = a2_i8_ps(v1, 1);
}

static A2I void a2_q4_0(const llmi_block_q4_0 *b, __m256 q[4]) {
    __m128i lo, hi;
    q4_0_bytes(b, &lo, &hi);
    q[0] = a2_i8_ps(lo, 0);
    q[1] = a2_i8_ps(lo, 1);
    q[2] = a2_i8_ps(hi, 0);
    q[3] = a2_i8_ps(hi, 1);
}

static A2I __m256 a2_block_dot(const float *a, const __m256 q[4]) {
    __m256 s = _mm256_mul_ps(_mm256_loadu_ps(a), q[0]);
    s = _mm256_fmadd_ps(_mm256_loadu_ps(a + 8), q[1], s);
    s = _mm256_fmadd_ps(_mm256_loadu_ps(a + 16), q[2], s);
    return _mm256_fmadd_ps(_mm256_loadu_ps(a + 24), q[3], s);
}

static A2I void a2_block_axpy(float *y, float ad, const __m256 q[4]) {
    const __m256 va = _mm256_set1_ps(ad);
    for (int k = 0; k < 4; k++)
        _mm256_storeu_ps(y + 8 * k, _mm256_fmadd_ps(va, q[k], _mm256_loadu_ps(y + 8 * k)));
}

#define A2_KVQ(T)                                                                                  \
    A2 float llmi_kvq_dot_##T##_avx2(const float *a, const void *bv, int n) {                      \
        const llmi_block_##T *b = bv;                                                              \
        __m256 acc = _mm256_setzero_ps(), q[4];                                                    \
        for (int i = 0; i < n / LLMI_QK; i++, a += LLMI_QK) {                                      \
            a2_##T(&b[i], q);                                                                      \
            acc = _mm256_fmadd_ps(a2_block_dot(a, q), _mm256_set1_ps(_cvtsh_ss(b[i].d)), acc);     \
        }                                                                                          \
        return a2_hsum(acc);                                                                       \
    }                                                                                              \
    A2 void llmi_kvq_axpy_##T##_avx2(float *y, float a, const void *xv, int n) {                   \
        const llmi_block_##T *x = xv;                                                              \
        __m256 q[4];                                                                               \
        for (int i = 0; i < n / LLMI_QK; i++, y += LLMI_QK) {                                      \
            a2_##T(&x[i], q);                                                                      \
            a2_block_axpy(y, a *_cvtsh_ss(x[i].d), q);                                             \
        }                                                                                          \
    }
A2_KVQ(q8_0)
A2_KVQ(q4_0)

/* Eight E4M3 codes (8 bytes at p) as floats, exactly
 * (llmi_fp8_e4m3_to_f32's values). */
static A2I __m256 a2_fp8_ps(const uint8_t *p) {
    const __m256i u = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i em = _mm256_and_si256(u, _mm256_set1_epi32(0x7f));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x80)), 24);
    const __m256 normal = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23)));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0x1p-9f));
    __m256 mag = _mm256_blendv_ps(
        normal, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), em)));
    mag = _mm256_blendv_ps(mag, _mm256_set1_ps(NAN),
                           _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f))));
    return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}

static A2I void a2_fp8_e4m3(const llmi_block_fp8_e4m3 *b, __m256 q[4]) {
    for (int k = 0; k < 4; k++)
        q[k] = a2_fp8_ps(b->qs + 8 * k);
}

A2 float llmi_kvq_dot_fp8_e4m3_avx2(const float *a, const void *bv, int n) {
    const llmi_block_fp8_e4m3 *b = bv;
    __m256 acc = _mm256_setzero_ps(), q[4];
    for (int i = 0; i < n / LLMI_QK; i++, a += LLMI_QK) {
        a2_fp8_e4m3(&b[i], q);
        acc = _mm256_fmadd_ps(a2_block_dot(a, q), _mm256_set1_ps(b[i].d), acc);
    }
    return a2_hsum(acc);
}

A2 void llmi_kvq_axpy_fp8_e4m3_avx2(float *y, float a, const void *xv, int n) {
    const llmi_block_fp8_e4m3 *x = xv;
    __m256 q[4];
    for (int i = 0; i < n / LLMI_QK; i++, y += LLMI_QK) {
        a2_fp8_e4m3(&x[i], q);
        a2_block_axpy(y, a * x[i].d, q);
    }
}

/* ---- AVX-512 ---- */

static A5I void a5_q8_0(const llmi_block_q8_0 *b, __m512 q[2]) {
    q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ld128(b->qs)));
    q[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ld128(b->qs + 16)));
}

static A5I void a5_q4_0(const llmi_block_q4_0 *b, __m512 q[2]) {
    __m128i lo, hi;
    q4_0_bytes(b, &lo, &hi);
    q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
    q[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
}

#define A5_KVQ(T)                                                                                  \
    A5 float llmi_kvq_dot_##T##_avx512(const float *a, const void *bv, int n) {                    \
        const llmi_block_##T *b = bv;                                                              \
        __m512 acc = _mm512_setzero_ps(), q[2];                                                    \
        for (int i = 0; i < n / LLMI_QK; i++, a += LLMI_QK) {                                      \
            a5_##T(&b[i], q);                                                                      \
            __m512 s = _mm512_mul_ps(_mm512_loadu_ps(a), q[0]);                                    \
            s = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16), q[1], s);                                 \
            acc = _mm512_fmadd_ps(s, _mm512_set1_ps(_cvtsh_ss(b[i].d)), acc);                      \
        }                                                                                          \
        return _mm512_reduce_add_ps(acc);                                                          \
    }                                                                                              \
    A5 void llmi_kvq_axpy_##T##_avx512(float *y, float a, const void *xv, int n) {                 \
        const llmi_block_##T *x = xv;                                                              \
        __m512 q[2];                                                                               \
        for (int i = 0; i < n / LLMI_QK; i++, y += LLMI_QK) {                                      \
            a5_##T(&x[i], q);                                                                      \
            const __m512 va = _mm512_set1_ps(a * _cvtsh_ss(x[i].d));                               \
            _mm512_storeu_ps(y, _mm512_fmadd_ps(va, q[0], _mm512_loadu_ps(y)));                    \
            _mm512_storeu_ps(y + 16, _mm512_fmadd_ps(va, q[1], _mm512_loadu_ps(y + 16)));          \
        }                                                                                          \
    }
A5_KVQ(q8_0)
A5_KVQ(q4_0)

/* Sixteen E4M3 codes (16 bytes at p) as floats, as a2_fp8_ps. */
static A5I __m512 a5_fp8_ps(const uint8_t *p) {
    const __m512i u = _mm512_cvtepu8_epi32(ld128(p));
    const __m512i em = _mm512_and_si512(u, _mm512_set1_epi32(0x7f));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x80)), 24);
    const __m512i normal =
        _mm512_add_epi32(_mm512_slli_epi32(em, 20), _mm512_set1_epi32(120 << 23));
    const __m512i sub =
        _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(0x1p-9f)));
    __m512i mag =
        _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(em, _mm512_set1_epi32(8)), normal, sub);
    mag = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(em, _mm512_set1_epi32(0x7f)), mag,
                                  _mm512_set1_epi32(0x7fc00000));
    return _mm512_castsi512_ps(_mm512_or_si512(mag, sign));
}

A5 float llmi_kvq_dot_fp8_e4m3_avx512(const float *a, const void *bv, int n) {
    const llmi_block_fp8_e4m3 *b = bv;
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n / LLMI_QK; i++, a += LLMI_QK) {
        __m512 s = _mm512_mul_ps(_mm512_loadu_ps(a), a5_fp8_ps(b[i].qs));
        s = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16), a5_fp8_ps(b[i].qs + 16), s);
        acc = _mm512_fmadd_ps(s, _mm512_set1_ps(b[i].d), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

A5 void llmi_kvq_axpy_fp8_e4m3_avx512(float *y, float a, const void *xv, int n) {
    const llmi_block_fp8_e4m3 *x = xv;
    for (int i = 0; i < n / LLMI_QK; i++, y += LLMI_QK) {
        const __m512 va = _mm512_set1_ps(a * x[i].d);
        _mm512_storeu_ps(y, _mm512_fmadd_ps(va, a5_fp8_ps(x[i].qs), _mm512_loadu_ps(y)));
        _mm512_storeu_ps(y + 16,
                         _mm512_fmadd_ps(va, a5_fp8_ps(x[i].qs + 16), _mm512_loadu_ps(y + 16)));
    }
}

#else
/* ISO C forbids an empty translation unit. */
typedef int llmi_kernels_kvq_x86_unused;
#endif
