/* K-quant integer kernels (kernels_k.c gives the formula): Q4_K and Q6_K
 * weights x Q8_K activations, AVX2 (maddubs + madd) and AVX-512 VNNI
 * (512-bit maddubs + vpdpwssd).
 *
 * The weights' quants are unsigned (Q4_K: 0..15; Q6_K: 0..63, its offset of
 * 32 taken out at the end as 32 * sum_j sc_j * bsums_j), so maddubs takes
 * them as its unsigned operand against the signed activations: pairs of
 * products in int16 (at most 2 * 63 * 128, no saturation). A second
 * multiply-add with the sub-block's scale, broadcast over the int16 lanes
 * of that sub-block, gives int32 lanes that are summed over the
 * super-block exactly. Each super-block then adds (d_w * d_x) times its
 * converted lanes to the token's float accumulator (Q4_K also subtracts
 * (dmin_w * d_x) times the lanes of sum_j m_j * (bsums_2j + bsums_2j+1)).
 *
 * A weight super-block is unpacked once and multiplied with every token of
 * the tile (4 at AVX2, 8 at AVX-512); every token's arithmetic is the same
 * whatever the tile size, so results do not depend on n_tok. */
#include "backend/cpu/kernels_impl.h"

#if defined(LLMI_KERNELS_X86)

#include <immintrin.h>

#define T_AVX2 "avx2,fma,f16c"
#define T_VNNI "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define A2 __attribute__((target(T_AVX2)))
#define A2I inline __attribute__((always_inline, target(T_AVX2)))
#define V5 __attribute__((target(T_VNNI)))
#define V5I inline __attribute__((always_inline, target(T_VNNI)))

#define QK_K LLMI_QK_K
#define A2_TILE 4
#define V5_TILE 8

#define LOADU128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define LOADU256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define LOADU512(p) _mm512_loadu_si512((const void *)(p))

/* An f16 scale (F16C: exact, like llmi_f16_to_f32, without a call). */
static A2I float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* A Q4_K block's scales[12] as 8 scales (bytes 0-7) and 8 mins (8-15). */
static inline void q4k_unpack_scales(const uint8_t *s, uint8_t out[16]) {
    uint32_t u[3], v[4];
    memcpy(u, s, 12);
    v[0] = u[0] & 0x3f3f3f3fu;
    v[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
    v[2] = u[1] & 0x3f3f3f3fu;
    v[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
    memcpy(out, v, 16);
}

/* Token pointers of a tile: values, scales, sums of 16. */
typedef struct {
    const int8_t *qs;
    const float *d;
    const int16_t *bs;
} xrow;

static inline void tile_rows(const uint8_t *xq, size_t xs, int nt, int64_t nb, xrow *x) {
    for (int t = 0; t < nt; t++) {
        const uint8_t *p = xq + (size_t)t * xs;
        x[t].qs = (const int8_t *)p;
        x[t].d = (const float *)(const void *)(p + QK_K * nb);
        x[t].bs = (const int16_t *)(const void *)(x[t].d + nb);
    }
}

/* ---- AVX2 ------------------------------------------------------------------ */

static A2I float a2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 16 int16 lanes [m0, m0, m1, m1, ..., m7, m7] from the 8 min bytes. */
static A2I __m256i a2_mins_dup(const uint8_t *m8) {
    const __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)m8));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi16(v, v)),
                                   _mm_unpackhi_epi16(v, v), 1);
}

static A2I void a2_q4k(int nt, const llmi_weight *W, int64_t r0, int64_t r1, const uint8_t *xq,
                       size_t xs, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK_K;
    xrow x[A2_TILE];
    tile_rows(xq, xs, nt, nb, x);
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        __m256 acc[A2_TILE];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *blk = row + (size_t)i * sizeof(llmi_block_q4_k);
            const uint8_t *qs = blk + offsetof(llmi_block_q4_k, qs);
            const float dw = h2f(blk + offsetof(llmi_block_q4_k, d));
            const float mw = h2f(blk + offsetof(llmi_block_q4_k, dmin));
            uint8_t scm[16];
            q4k_unpack_scales(blk + offsetof(llmi_block_q4_k, scales), scm);
            __m256i sumi[A2_TILE];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                sumi[t] = _mm256_setzero_si256();
            for (int g = 0; g < 4; g++) {
                const __m256i q = LOADU256(qs + 32 * g);
                const __m256i lo = _mm256_and_si256(q, m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                const __m256i s0 = _mm256_set1_epi16(scm[2 * g]);
                const __m256i s1 = _mm256_set1_epi16(scm[2 * g + 1]);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const int8_t *xt = x[t].qs + QK_K * i + 64 * g;
                    const __m256i p0 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(lo, LOADU256(xt)), s0);
                    const __m256i p1 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, LOADU256(xt + 32)), s1);
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
                }
            }
            const __m256i mins = a2_mins_dup(scm + 8);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const float dx = x[t].d[i];
                const __m256i pm = _mm256_madd_epi16(LOADU256(x[t].bs + 16 * i), mins);
                acc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_set1_ps(dw * dx), acc[t]);
                acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_set1_ps(mw * dx), acc[t]);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = a2_hsum(acc[t]);
    }
}

/* Half h of a Q6_K block as 4 x 32 unsigned quants (0..63) in element order:
 * q[c] holds elements 128h + 32c .. 128h + 32c + 31. */
static A2I void a2_q6k_half(const uint8_t *blk, int h, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    const uint8_t *ql = blk + offsetof(llmi_block_q6_k, ql) + 64 * h;
    const __m256i b1 = LOADU256(ql), b2 = LOADU256(ql + 32);
    const __m256i bh = LOADU256(blk + offsetof(llmi_block_q6_k, qh) + 32 * h);
    q[0] =
        _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m3), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m3), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m3), 4));
}

static A2I void a2_q6k(int nt, const llmi_weight *W, int64_t r0, int64_t r1, const uint8_t *xq,
                       size_t xs, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK_K;
    xrow x[A2_TILE];
    tile_rows(xq, xs, nt, nb, x);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        __m256 acc[A2_TILE];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *blk = row + (size_t)i * sizeof(llmi_block_q6_k);
            const int8_t *sc = (const int8_t *)(blk + offsetof(llmi_block_q6_k, scales));
            const float dw = h2f(blk + offsetof(llmi_block_q6_k, d));
            __m256i sumi[A2_TILE];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                sumi[t] = _mm256_setzero_si256();
            for (int h = 0; h < 2; h++) {
                __m256i q[4];
                a2_q6k_half(blk, h, q);
                for (int c = 0; c < 4; c++) {
                    /* int16 lanes 0-7 come from elements 0-15 of the chunk
                     * (sub-block 8h+2c), lanes 8-15 from 16-31. */
                    const __m256i s =
                        _mm256_inserti128_si256(_mm256_set1_epi16(sc[8 * h + 2 * c]),
                                                _mm_set1_epi16(sc[8 * h + 2 * c + 1]), 1);
#pragma GCC unroll 8
                    for (int t = 0; t < nt; t++) {
                        const int8_t *xt = x[t].qs + QK_K * i + 128 * h + 32 * c;
                        sumi[t] = _mm256_add_epi32(
                            sumi[t],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(q[c], LOADU256(xt)), s));
                    }
                }
            }
            const __m256i sc16 = _mm256_cvtepi8_epi16(LOADU128(sc));
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const __m256i off =
                    _mm256_slli_epi32(_mm256_madd_epi16(LOADU256(x[t].bs + 16 * i), sc16), 5);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[t], off)),
                                         _mm256_set1_ps(dw * x[t].d[i]), acc[t]);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = a2_hsum(acc[t]);
    }
}

#define A2_ROWS(name, fn)                                                                          \
    static A2 void name(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq,           \
                        size_t xs, int nt, float *y, int64_t ldy) {                                \
        switch (nt) {                                                                              \
        case 1:                                                                                    \
            fn(1, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        case 2:                                                                                    \
            fn(2, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        case 3:                                                                                    \
            fn(3, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        default:                                                                                   \
            fn(4, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        }                                                                                          \
    }
A2_ROWS(a2_rows_q4_k, a2_q4k)
A2_ROWS(a2_rows_q6_k, a2_q6k)

const llmi_qrows_impl llmi_qrows_q4_k_avx2 = {A2_TILE, a2_rows_q4_k};
const llmi_qrows_impl llmi_qrows_q6_k_avx2 = {A2_TILE, a2_rows_q6_k};

/* ---- AVX-512 VNNI ------------------------------------------------------------
 *
 * One zmm covers 64 consecutive elements: Q4_K's low and high nibbles of a
 * 32-byte group (two sub-blocks), Q6_K's quarters (four sub-blocks).
 * vpdpwssd adds the maddubs pairs times the scales into the int32 lanes. */

static V5I __m512i v5_cat(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static V5I void v5_q4k(int nt, const llmi_weight *W, int64_t r0, int64_t r1, const uint8_t *xq,
                       size_t xs, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK_K;
    xrow x[V5_TILE];
    tile_rows(xq, xs, nt, nb, x);
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        __m512 acc[V5_TILE];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            acc[t] = _mm512_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *blk = row + (size_t)i * sizeof(llmi_block_q4_k);
            const uint8_t *qs = blk + offsetof(llmi_block_q4_k, qs);
            const float dw = h2f(blk + offsetof(llmi_block_q4_k, d));
            const float mw = h2f(blk + offsetof(llmi_block_q4_k, dmin));
            uint8_t scm[16];
            q4k_unpack_scales(blk + offsetof(llmi_block_q4_k, scales), scm);
            __m512i sumi[V5_TILE];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                sumi[t] = _mm512_setzero_si512();
            for (int g = 0; g < 4; g++) {
                const __m256i q = LOADU256(qs + 32 * g);
                const __m512i w =
                    v5_cat(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
                const __m512i s =
                    v5_cat(_mm256_set1_epi16(scm[2 * g]), _mm256_set1_epi16(scm[2 * g + 1]));
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++)
                    sumi[t] = _mm512_dpwssd_epi32(
                        sumi[t], _mm512_maddubs_epi16(w, LOADU512(x[t].qs + QK_K * i + 64 * g)), s);
            }
            const __m256i mins = a2_mins_dup(scm + 8);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const float dx = x[t].d[i];
                const __m256 pm =
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(LOADU256(x[t].bs + 16 * i), mins));
                acc[t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_set1_ps(dw * dx), acc[t]);
                acc[t] = _mm512_mask3_fnmadd_ps(_mm512_castps256_ps512(pm), _mm512_set1_ps(mw * dx),
                                                acc[t], 0x00FF);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
    }
}

/* vpermw indices spreading Q6_K's 16 scales (int16 lanes 0-15) over the
 * maddubs lanes of a zmm: 8 lanes per sub-block of 16 elements. Row q of
 * the table is quarter q (elements 64q .. 64q+63 of the super-block). */
static const uint16_t q6k_spread[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5,
     6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8,  8,  8,  8,  8,  8,  8,  8,  9,  9,  9,  9,  9,  9,  9,  9,
     10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
     14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

static V5I void v5_q6k(int nt, const llmi_weight *W, int64_t r0, int64_t r1, const uint8_t *xq,
                       size_t xs, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK_K;
    xrow x[V5_TILE];
    tile_rows(xq, xs, nt, nb, x);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        __m512 acc[V5_TILE];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            acc[t] = _mm512_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *blk = row + (size_t)i * sizeof(llmi_block_q6_k);
            const float dw = h2f(blk + offsetof(llmi_block_q6_k, d));
            const __m256i sc16 =
                _mm256_cvtepi8_epi16(LOADU128(blk + offsetof(llmi_block_q6_k, scales)));
            const __m512i sc512 = _mm512_castsi256_si512(sc16); /* lanes 16-31 unused */
            __m512i sumi[V5_TILE];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                sumi[t] = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                __m256i q[4];
                a2_q6k_half(blk, h, q);
                const __m512i wa = v5_cat(q[0], q[1]), wb = v5_cat(q[2], q[3]);
                const __m512i sa = _mm512_permutexvar_epi16(LOADU512(q6k_spread[2 * h]), sc512);
                const __m512i sb = _mm512_permutexvar_epi16(LOADU512(q6k_spread[2 * h + 1]), sc512);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const int8_t *xt = x[t].qs + QK_K * i + 128 * h;
                    sumi[t] =
                        _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(wa, LOADU512(xt)), sa);
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t],
                                                  _mm512_maddubs_epi16(wb, LOADU512(xt + 64)), sb);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                const __m256i off =
                    _mm256_slli_epi32(_mm256_madd_epi16(LOADU256(x[t].bs + 16 * i), sc16), 5);
                const __m512i s =
                    _mm512_mask_sub_epi32(sumi[t], 0x00FF, sumi[t], _mm512_castsi256_si512(off));
                acc[t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(dw * x[t].d[i]), acc[t]);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
    }
}

#define V5_ROWS(name, fn)                                                                          \
    static V5 void name(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq,           \
                        size_t xs, int nt, float *y, int64_t ldy) {                                \
        switch (nt) {                                                                              \
        case 1:                                                                                    \
            fn(1, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        case 2:                                                                                    \
            fn(2, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        case 3:                                                                                    \
            fn(3, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        case 4:                                                                                    \
            fn(4, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        case 5:                                                                                    \
            fn(5, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        case 6:                                                                                    \
            fn(6, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        case 7:                                                                                    \
            fn(7, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        default:                                                                                   \
            fn(8, w, r0, r1, xq, xs, y, ldy);                                                      \
            break;                                                                                 \
        }                                                                                          \
    }
V5_ROWS(v5_rows_q4_k, v5_q4k)
V5_ROWS(v5_rows_q6_k, v5_q6k)

const llmi_qrows_impl llmi_qrows_q4_k_vnni = {V5_TILE, v5_rows_q4_k};
const llmi_qrows_impl llmi_qrows_q6_k_vnni = {V5_TILE, v5_rows_q6_k};

#else
/* ISO C forbids an empty translation unit. */
typedef int llmi_kernels_k_x86_unused;
#endif
