/* Integer kernels for quantized weights x 8-bit activations (kernels.h,
 * "8-bit activations") at the AVX2 level (maddubs + madd); the AVX-512
 * VNNI level is kernels_q8_vnni.c.
 *
 * AVX2 multiplies bytes as unsigned x signed. Q4_1's and Q5_1's values are
 * unsigned already; for the signed weights of Q4_0 (nibble - 8), Q5_0
 * (5-bit value - 16) and Q8_0 it uses
 * llama.cpp's sign trick, |w| x (x with w's sign), computed once per weight
 * block (|w|) and once per token (the sign). The integer lanes (4 products
 * each, exact) are converted to float and accumulated with
 * fma(lanes, d_w * d_x, acc); a block's scale product is formed in float
 * before, as llama.cpp does. Even and odd blocks have separate accumulators;
 * the m_w * s_x terms of Q4_1 and Q5_1 are summed in vectors over the blocks and added to
 * them before the final reduction. Scales: the first 4 bytes of each block
 * (f16 d, and Q4_1's f16 m) are fetched with vpgatherdd and converted for 64
 * blocks at a time, and the products d_w * d_x for every token of the tile
 * are formed there as well, so the block loop only loads them. Every token's
 * arithmetic is the same whatever the tile size, so results do not depend on
 * n_tok.
 *
 * Activation quantization (used at both levels) follows llama.cpp's AVX2
 * quantize_row_q8_0/_q8_1 and gives the same bytes as the portable code. */
#include "backend/cpu/kernels_impl.h"

#if defined(LLMI_KERNELS_X86)

#include <immintrin.h>
#include <limits.h>
#include <stdalign.h>

#define T_AVX2 "avx2,fma,f16c"
#define A2 __attribute__((target(T_AVX2)))
#define A2I inline __attribute__((always_inline, target(T_AVX2)))

#define QK 32
#define SEG 64 /* blocks per scale segment; even, so pairs never straddle */
#define A2_TILE 4

#define LOADU128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define LOADU256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

/* ---- AVX2 ------------------------------------------------------------------ */

static A2I float a2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static A2I float a2_f16_round(float f) {
    return _mm_cvtss_f32(
        _mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
}

A2 void llmi_aquant_q8_avx2(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes) {
    int8_t *qs = (int8_t *)row;
    float *d = (float *)(void *)(row + QK * nb);
    float *s = d + nb;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < nb; b++, x += QK) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 mx = _mm256_andnot_ps(sign, v0);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v1));
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v2));
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v3));
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(mx, 1), _mm256_castps256_ps128(mx));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float db = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        enum { rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC };
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), rnd));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), rnd));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), rnd));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), rnd));
        if (q81) { /* the int32 values are in [-127, 127] unless x has NaN/inf */
            const __m256i t = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
            s[b] = a2_f16_round(db * (float)_mm_cvtsi128_si32(h));
        }
        /* int32 -> int16 -> int8 with saturation; the packs work within
         * 128-bit lanes, the permutation restores element order. */
        i0 = _mm256_packs_epi32(i0, i1);
        i2 = _mm256_packs_epi32(i2, i3);
        i0 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i0, i2), perm);
        _mm256_store_si256((__m256i *)(void *)(qs + b * QK), i0);
        if (!q81) { /* c = -128 * the sum of the stored bytes: sum(q + 128) - 4096 */
            const __m256i u = _mm256_sad_epu8(_mm256_xor_si256(i0, _mm256_set1_epi8(-128)),
                                              _mm256_setzero_si256());
            __m128i h = _mm_add_epi64(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
            h = _mm_add_epi64(h, _mm_unpackhi_epi64(h, h));
            ((int32_t *)(void *)s)[b] = -128 * (_mm_cvtsi128_si32(h) - 32 * 128);
        }
        d[b] = a2_f16_round(db);
    }
    const size_t used = (size_t)nb * (QK + 8);
    memset(row + used, 0, row_bytes - used);
}

/* The 32 weights of the block at blk as bytes in element order: signed for
 * Q4_0 (nibble - 8), Q5_0 (value - 16) and Q8_0, unsigned for Q4_1 and Q5_1. */
static A2I __m256i a2_wbytes(int qt, const uint8_t *blk) {
    const uint8_t *qs = blk + llmi_qt_qs_offset(qt);
    if (qt == LLMI_QT_Q8_0)
        return LOADU256(qs);
    const __m128i q = LOADU128(qs);
    __m256i v = _mm256_and_si256(
        _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
        _mm256_set1_epi8(15));
    if (llmi_qt_is_q5(qt)) {
        /* Byte j takes byte j/8 of qh, then keeps bit j%8 of it: 16 where
         * element j's fifth bit is set. */
        int32_t qh;
        memcpy(&qh, blk + llmi_qt_qh_offset(qt), 4);
        const __m256i spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh),
            _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
        const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    return qt == LLMI_QT_Q4_0   ? _mm256_sub_epi8(v, _mm256_set1_epi8(8))
           : qt == LLMI_QT_Q5_0 ? _mm256_sub_epi8(v, _mm256_set1_epi8(16))
                                : v;
}

/* Segment setup: converts the weight scales of blocks b0..b0+n-1 and forms
 * dd[t][i] = d_w * d_x for each token; Q4_1 and Q5_1 add m_w * s_x into
 * ms[t]. A block's first 4 bytes hold its f16 d in the low half and its m
 * (other types: quants or qh) in the high half. A gather is the cheapest way to get them:
 * storing them one by one and loading a vector back stalls, as the store
 * buffer cannot forward many small stores into one load. */
static A2I void a2_segment(int qt, int nt, const uint8_t *row, int64_t b0, int n,
                           const float *const *xd, int64_t nb, float (*dd)[SEG], __m256 *ms) {
    const int bs = (int)llmi_qt_block_bytes(qt);
    const __m256i offs =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bs));
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    for (int i = 0; i < n; i += 8) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), iota);
        const __m256i v = _mm256_mask_i32gather_epi32(
            _mm256_setzero_si256(),
            (const int *)(const void *)(row + (size_t)(b0 + i) * (size_t)bs), offs, m, 1);
        const __m256i vd = _mm256_and_si256(v, lo16);
        const __m256 dw = _mm256_cvtph_ps(
            _mm_packus_epi32(_mm256_castsi256_si128(vd), _mm256_extracti128_si256(vd, 1)));
        __m256 mw = _mm256_setzero_ps();
        if (llmi_qt_has_min(qt)) {
            const __m256i vm = _mm256_srli_epi32(v, 16);
            mw = _mm256_cvtph_ps(
                _mm_packus_epi32(_mm256_castsi256_si128(vm), _mm256_extracti128_si256(vm, 1)));
        }
        LLMI_UNROLL
        for (int t = 0; t < nt; t++) {
            const __m256 dx = _mm256_maskload_ps(xd[t] + b0 + i, m);
            _mm256_store_ps(dd[t] + i, _mm256_mul_ps(dw, dx));
            if (llmi_qt_has_min(qt))
                ms[t] = _mm256_fmadd_ps(mw, _mm256_maskload_ps(xd[t] + nb + b0 + i, m), ms[t]);
        }
    }
}

/* Block b (index i in its segment) times up to A2_TILE tokens into acc. */
static A2I void a2_step(int qt, int nt, const uint8_t *row, int64_t b, int i,
                        const int8_t *const *xqs, float (*dd)[SEG], __m256 *acc) {
    const __m256i w = a2_wbytes(qt, row + (size_t)b * llmi_qt_block_bytes(qt));
    const __m256i aw = llmi_qt_has_min(qt) ? w : _mm256_sign_epi8(w, w);
    const __m256i ones = _mm256_set1_epi16(1);
    LLMI_UNROLL
    for (int t = 0; t < nt; t++) {
        __m256i xv = _mm256_load_si256((const __m256i *)(const void *)(xqs[t] + b * QK));
        if (!llmi_qt_has_min(qt))
            xv = _mm256_sign_epi8(xv, w);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&dd[t][i]), acc[t]);
    }
}

static A2I void a2_qrows(int qt, int nt, const llmi_weight *W, int64_t r0, int64_t r1,
                         const uint8_t *xq, size_t xs, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK;
    const int8_t *xqs[A2_TILE];
    const float *xd[A2_TILE];
    for (int t = 0; t < nt; t++) {
        xqs[t] = (const int8_t *)(xq + (size_t)t * xs);
        xd[t] = (const float *)(const void *)(xq + (size_t)t * xs + QK * nb);
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        __m256 acc0[A2_TILE], acc1[A2_TILE], ms[A2_TILE];
        LLMI_UNROLL
        for (int t = 0; t < nt; t++)
            acc0[t] = acc1[t] = ms[t] = _mm256_setzero_ps();
        for (int64_t b0 = 0; b0 < nb; b0 += SEG) {
            const int n = nb - b0 < SEG ? (int)(nb - b0) : SEG;
            alignas(32) float dd[A2_TILE][SEG];
            a2_segment(qt, nt, row, b0, n, xd, nb, dd, ms);
            for (int i = 0; i < n; i += 2) {
                a2_step(qt, nt, row, b0 + i, i, xqs, dd, acc0);
                if (i + 1 < n)
                    a2_step(qt, nt, row, b0 + i + 1, i + 1, xqs, dd, acc1);
            }
        }
        LLMI_UNROLL
        for (int t = 0; t < nt; t++) {
            __m256 s = _mm256_add_ps(acc0[t], acc1[t]);
            if (llmi_qt_has_min(qt))
                s = _mm256_add_ps(s, ms[t]);
            y[t * ldy + r] = a2_hsum(s);
        }
    }
}

#define A2_QROWS(name, QT)                                                                         \
    static A2 void name(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq,           \
                        size_t xs, int nt, float *y, int64_t ldy) {                                \
        switch (nt) {                                                                              \
        case 1:                                                                                    \
            a2_qrows(QT, 1, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        case 2:                                                                                    \
            a2_qrows(QT, 2, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        case 3:                                                                                    \
            a2_qrows(QT, 3, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        default:                                                                                   \
            a2_qrows(QT, 4, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        }                                                                                          \
    }
A2_QROWS(a2_qrows_q4_0, LLMI_QT_Q4_0)
A2_QROWS(a2_qrows_q4_1, LLMI_QT_Q4_1)
A2_QROWS(a2_qrows_q8_0, LLMI_QT_Q8_0)
A2_QROWS(a2_qrows_q5_0, LLMI_QT_Q5_0)
A2_QROWS(a2_qrows_q5_1, LLMI_QT_Q5_1)

const llmi_qrows_impl llmi_qrows_q4_0_avx2 = {A2_TILE, a2_qrows_q4_0};
const llmi_qrows_impl llmi_qrows_q4_1_avx2 = {A2_TILE, a2_qrows_q4_1};
const llmi_qrows_impl llmi_qrows_q8_0_avx2 = {A2_TILE, a2_qrows_q8_0};
const llmi_qrows_impl llmi_qrows_q5_0_avx2 = {A2_TILE, a2_qrows_q5_0};
const llmi_qrows_impl llmi_qrows_q5_1_avx2 = {A2_TILE, a2_qrows_q5_1};

#else
/* ISO C forbids an empty translation unit. */
typedef int llmi_kernels_q8_x86_unused;
#endif
