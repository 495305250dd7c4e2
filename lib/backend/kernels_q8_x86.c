/* Integer kernels for quantized weights x 8-bit activations (kernels.h,
 * "8-bit activations"): AVX2 (maddubs + madd) and AVX-512 VNNI (vpdpbusd).
 *
 * Both multiply bytes as unsigned x signed. Q4_1's nibbles are unsigned
 * already; for the signed weights of Q4_0 (nibble - 8) and Q8_0 they use
 * llama.cpp's sign trick, |w| x (x with w's sign), computed once per weight
 * block (|w|) and once per token (the sign). The integer lanes (4 products
 * each, exact) are converted to float and accumulated with
 * fma(lanes, d_w * d_x, acc); a block's scale product is formed in float
 * before, as llama.cpp does. Even and odd blocks (AVX2) or block pairs
 * (AVX-512) have separate accumulators; Q4_1's m_w * s_x terms are summed
 * in vectors over the blocks and added to them before the final reduction.
 *
 * Scales: the first 4 bytes of each block (f16 d, and Q4_1's f16 m) are
 * fetched with vpgatherdd and converted for 64 blocks at a time, and the
 * products d_w * d_x for every token of the tile are formed there as well,
 * so the block loop only loads them. Every token's arithmetic is the same
 * whatever the tile size, so results do not depend on n_tok.
 *
 * Activation quantization (used at both levels) follows llama.cpp's AVX2
 * quantize_row_q8_0/_q8_1 and gives the same bytes as the portable code. */
#include "backend/kernels_impl.h"

#if defined(LLMI_KERNELS_X86)

#include <immintrin.h>
#include <stdalign.h>

#define T_AVX2 "avx2,fma,f16c"
#define T_VNNI "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define A2 __attribute__((target(T_AVX2)))
#define A2I inline __attribute__((always_inline, target(T_AVX2)))
#define V5 __attribute__((target(T_VNNI)))
#define V5I inline __attribute__((always_inline, target(T_VNNI)))

#define QK 32
#define SEG 64 /* blocks per scale segment; even, so pairs never straddle */
#define A2_TILE 4
#define V5_TILE 8

#define LOADU128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define LOADU256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

static inline size_t block_bytes(int qt) {
    return qt == LLMI_QT_Q4_0   ? sizeof(llmi_block_q4_0)
           : qt == LLMI_QT_Q4_1 ? sizeof(llmi_block_q4_1)
                                : sizeof(llmi_block_q8_0);
}

static inline size_t qs_offset(int qt) {
    return qt == LLMI_QT_Q4_0   ? offsetof(llmi_block_q4_0, qs)
           : qt == LLMI_QT_Q4_1 ? offsetof(llmi_block_q4_1, qs)
                                : offsetof(llmi_block_q8_0, qs);
}

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

static A2 void a2_quant(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes) {
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
        d[b] = a2_f16_round(db);
    }
    const size_t used = (size_t)nb * (q81 ? QK + 8 : QK + 4);
    memset(row + used, 0, row_bytes - used);
}

/* The 32 weights of a block as bytes in element order: signed for Q4_0
 * (nibble - 8) and Q8_0, unsigned nibbles for Q4_1. */
static A2I __m256i a2_wbytes(int qt, const uint8_t *qs) {
    if (qt == LLMI_QT_Q8_0)
        return LOADU256(qs);
    const __m128i q = LOADU128(qs);
    const __m256i v = _mm256_and_si256(
        _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
        _mm256_set1_epi8(15));
    return qt == LLMI_QT_Q4_0 ? _mm256_sub_epi8(v, _mm256_set1_epi8(8)) : v;
}

/* Segment setup: converts the weight scales of blocks b0..b0+n-1 and forms
 * dd[t][i] = d_w * d_x for each token; Q4_1 adds m_w * s_x into ms[t].
 * A block's first 4 bytes hold its f16 d in the low half and Q4_1's m (other
 * types: quants) in the high half. A gather is the cheapest way to get them:
 * storing them one by one and loading a vector back stalls, as the store
 * buffer cannot forward many small stores into one load. */
static A2I void a2_segment(int qt, int nt, const uint8_t *row, int64_t b0, int n,
                           const float *const *xd, int64_t nb, float (*dd)[SEG], __m256 *ms) {
    const int bs = (int)block_bytes(qt);
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
        if (qt == LLMI_QT_Q4_1) {
            const __m256i vm = _mm256_srli_epi32(v, 16);
            mw = _mm256_cvtph_ps(
                _mm_packus_epi32(_mm256_castsi256_si128(vm), _mm256_extracti128_si256(vm, 1)));
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const __m256 dx = _mm256_maskload_ps(xd[t] + b0 + i, m);
            _mm256_store_ps(dd[t] + i, _mm256_mul_ps(dw, dx));
            if (qt == LLMI_QT_Q4_1)
                ms[t] = _mm256_fmadd_ps(mw, _mm256_maskload_ps(xd[t] + nb + b0 + i, m), ms[t]);
        }
    }
}

/* Block b (index i in its segment) times up to A2_TILE tokens into acc. */
static A2I void a2_step(int qt, int nt, const uint8_t *row, int64_t b, int i,
                        const int8_t *const *xqs, float (*dd)[SEG], __m256 *acc) {
    const __m256i w = a2_wbytes(qt, row + (size_t)b * block_bytes(qt) + qs_offset(qt));
    const __m256i aw = qt == LLMI_QT_Q4_1 ? w : _mm256_sign_epi8(w, w);
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        __m256i xv = _mm256_load_si256((const __m256i *)(const void *)(xqs[t] + b * QK));
        if (qt != LLMI_QT_Q4_1)
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
#pragma GCC unroll 8
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
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            __m256 s = _mm256_add_ps(acc0[t], acc1[t]);
            if (qt == LLMI_QT_Q4_1)
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

const llmi_qkernel_set llmi_qkernels_avx2 = {
    .tile = A2_TILE,
    .rows = {[LLMI_QT_Q4_0] = a2_qrows_q4_0,
             [LLMI_QT_Q4_1] = a2_qrows_q4_1,
             [LLMI_QT_Q8_0] = a2_qrows_q8_0},
    .quant = a2_quant,
};

/* ---- AVX-512 VNNI ------------------------------------------------------------
 *
 * One zmm holds a pair of blocks (lanes 0-7 the even block, 8-15 the odd
 * one), so one vpdpbusd does 64 products; the pair's scale vector is the two
 * products d_w * d_x spread over 8 lanes each. A last unpaired block goes
 * through the lower half. */

/* Weights of blocks b and b+1 as 64 bytes: signed for Q4_0 and Q8_0,
 * unsigned nibbles for Q4_1. */
static V5I __m512i v5_wbytes2(int qt, const uint8_t *qa, const uint8_t *qb) {
    if (qt == LLMI_QT_Q8_0)
        return _mm512_inserti64x4(_mm512_castsi256_si512(LOADU256(qa)), LOADU256(qb), 1);
    /* [a | a | b | b] by 128-bit lanes; shifting the second copy of each
     * by 4 and masking gives [a_lo | a_hi | b_lo | b_hi]: elements in order. */
    const __m512i v =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(LOADU128(qa))),
                           _mm256_broadcastsi128_si256(LOADU128(qb)), 1);
    const __m512i w = _mm512_and_si512(
        _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(15));
    return qt == LLMI_QT_Q4_0 ? _mm512_sub_epi8(w, _mm512_set1_epi8(8)) : w;
}

static V5I void v5_segment(int qt, int nt, const uint8_t *row, int64_t b0, int n,
                           const float *const *xd, int64_t nb, float (*dd)[SEG], __m512 *ms) {
    const int bs = (int)block_bytes(qt);
    const __m512i offs =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(bs));
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offs,
                                                      row + (size_t)(b0 + i) * (size_t)bs, 1);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
        __m512 mw = _mm512_setzero_ps();
        if (qt == LLMI_QT_Q4_1)
            mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const __m512 dx = _mm512_maskz_loadu_ps(m, xd[t] + b0 + i);
            _mm512_store_ps(dd[t] + i, _mm512_mul_ps(dw, dx));
            if (qt == LLMI_QT_Q4_1)
                ms[t] = _mm512_fmadd_ps(mw, _mm512_maskz_loadu_ps(m, xd[t] + nb + b0 + i), ms[t]);
        }
    }
}

/* Blocks b, b+1 (index i in their segment) times up to V5_TILE tokens. */
static V5I void v5_pair(int qt, int nt, const uint8_t *row, int64_t b, int i,
                        const int8_t *const *xqs, float (*dd)[SEG], __m512 *acc) {
    const size_t bs = block_bytes(qt);
    const uint8_t *qa = row + (size_t)b * bs + qs_offset(qt);
    const __m512i w = v5_wbytes2(qt, qa, qa + bs);
    const __mmask64 neg = _mm512_movepi8_mask(w);
    const __m512i aw = qt == LLMI_QT_Q4_1 ? w : _mm512_abs_epi8(w);
    /* Lanes 0-7 take the pair's first scale, 8-15 its second. */
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i zero = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        __m512i xv = _mm512_load_si512((const void *)(xqs[t] + b * QK));
        if (qt != LLMI_QT_Q4_1)
            xv = _mm512_mask_sub_epi8(xv, neg, zero, xv);
        const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, aw, xv));
        const __m128 d2 =
            _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)&dd[t][i]));
        acc[t] =
            _mm512_fmadd_ps(p, _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d2)), acc[t]);
    }
}

/* A row's last block when it has no partner: lanes 0-7 of acc. */
static V5I void v5_single(int qt, int nt, const uint8_t *row, int64_t b, int i,
                          const int8_t *const *xqs, float (*dd)[SEG], __m512 *acc) {
    const __m256i w = a2_wbytes(qt, row + (size_t)b * block_bytes(qt) + qs_offset(qt));
    const __m256i aw = qt == LLMI_QT_Q4_1 ? w : _mm256_sign_epi8(w, w);
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        __m256i xv = _mm256_load_si256((const __m256i *)(const void *)(xqs[t] + b * QK));
        if (qt != LLMI_QT_Q4_1)
            xv = _mm256_sign_epi8(xv, w);
        const __m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, xv));
        acc[t] = _mm512_mask3_fmadd_ps(_mm512_castps256_ps512(p), _mm512_set1_ps(dd[t][i]), acc[t],
                                       0x00FF);
    }
}

static V5I void v5_qrows(int qt, int nt, const llmi_weight *W, int64_t r0, int64_t r1,
                         const uint8_t *xq, size_t xs, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK;
    const int8_t *xqs[V5_TILE];
    const float *xd[V5_TILE];
    for (int t = 0; t < nt; t++) {
        xqs[t] = (const int8_t *)(xq + (size_t)t * xs);
        xd[t] = (const float *)(const void *)(xq + (size_t)t * xs + QK * nb);
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        __m512 acc0[V5_TILE], acc1[V5_TILE], ms[V5_TILE];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            acc0[t] = acc1[t] = ms[t] = _mm512_setzero_ps();
        for (int64_t b0 = 0; b0 < nb; b0 += SEG) {
            const int n = nb - b0 < SEG ? (int)(nb - b0) : SEG;
            alignas(64) float dd[V5_TILE][SEG];
            v5_segment(qt, nt, row, b0, n, xd, nb, dd, ms);
            /* Pairs alternate between acc0 and acc1 (pair index parity). */
            int i = 0;
            for (; i + 3 < n; i += 4) {
                v5_pair(qt, nt, row, b0 + i, i, xqs, dd, acc0);
                v5_pair(qt, nt, row, b0 + i + 2, i + 2, xqs, dd, acc1);
            }
            if (i + 1 < n) {
                v5_pair(qt, nt, row, b0 + i, i, xqs, dd, acc0);
                if (i + 2 < n)
                    v5_single(qt, nt, row, b0 + i + 2, i + 2, xqs, dd, acc1);
            } else if (i < n) {
                v5_single(qt, nt, row, b0 + i, i, xqs, dd, acc0);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            __m512 s = _mm512_add_ps(acc0[t], acc1[t]);
            if (qt == LLMI_QT_Q4_1)
                s = _mm512_add_ps(s, ms[t]);
            y[t * ldy + r] = _mm512_reduce_add_ps(s);
        }
    }
}

#define V5_QROWS(name, QT)                                                                         \
    static V5 void name(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq,           \
                        size_t xs, int nt, float *y, int64_t ldy) {                                \
        switch (nt) {                                                                              \
        case 1:                                                                                    \
            v5_qrows(QT, 1, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        case 2:                                                                                    \
            v5_qrows(QT, 2, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        case 3:                                                                                    \
            v5_qrows(QT, 3, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        case 4:                                                                                    \
            v5_qrows(QT, 4, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        case 5:                                                                                    \
            v5_qrows(QT, 5, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        case 6:                                                                                    \
            v5_qrows(QT, 6, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        case 7:                                                                                    \
            v5_qrows(QT, 7, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        default:                                                                                   \
            v5_qrows(QT, 8, w, r0, r1, xq, xs, y, ldy);                                            \
            break;                                                                                 \
        }                                                                                          \
    }
V5_QROWS(v5_qrows_q4_0, LLMI_QT_Q4_0)
V5_QROWS(v5_qrows_q4_1, LLMI_QT_Q4_1)
V5_QROWS(v5_qrows_q8_0, LLMI_QT_Q8_0)

const llmi_qkernel_set llmi_qkernels_avx512vnni = {
    .tile = V5_TILE,
    .rows = {[LLMI_QT_Q4_0] = v5_qrows_q4_0,
             [LLMI_QT_Q4_1] = v5_qrows_q4_1,
             [LLMI_QT_Q8_0] = v5_qrows_q8_0},
    .quant = a2_quant,
};

#else
/* ISO C forbids an empty translation unit. */
typedef int llmi_kernels_q8_x86_unused;
#endif
