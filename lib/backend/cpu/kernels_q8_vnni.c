/* Integer kernels for quantized weights x 8-bit activations (kernels.h,
 * "8-bit activations") at the AVX-512 VNNI level: a register-blocked GEMM
 * over rows repacked for vpdpbusd, from the weights where they lie or from
 * their packed copy (kernels.h, "Packed weights"). */
#include "backend/cpu/kernels_impl.h"

#if defined(LLMI_KERNELS_X86)

#include <immintrin.h>
#include <limits.h>
#include <stdalign.h>
#include <string.h>

#define T_VNNI "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define V5 __attribute__((target(T_VNNI)))
#define V5I inline __attribute__((always_inline, target(T_VNNI)))

#define QK 32

#define LOADU128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define LOADU256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

/* ---- AVX-512 VNNI: a register-blocked GEMM ------------------------------------
 *
 * One zmm lane per weight row. A group of 16 rows is repacked, block by
 * block, into 8 zmm of unsigned weight bytes (zmm q, lane r: row r's weights
 * 4q..4q+3), so one vpdpbusd with 4 activation bytes of a token broadcast
 * adds 4 products to the block sums of 16 rows at once; 8 of them give 16
 * exact isum_b. Then, for the 16 rows at once,
 *   acc = fma((float)isum_b, d_w * d_x, acc)   [Q4_1, Q5_1: acc = fma(m_w, s_x, acc)]
 * which is the portable kernels' arithmetic lane by lane (the same bits), with
 * no horizontal sums and no per-token fix-ups. vpdpbusd multiplies unsigned
 * by signed bytes: Q4_1's and Q5_1's values are unsigned already; Q4_0
 * (nibble - 8), Q5_0 (value - 16) and Q8_0 weights get +128, which adds 128 * sum(x) to the block
 * sum; the sum starts from the activation row's c = -128 * sum(x) instead of 0.
 *
 * Blocking: the micro-kernel keeps V5_R groups x V5_N tokens of float
 * accumulators and as many block sums in registers: per 4-byte step it loads
 * V5_R weight vectors and broadcasts V5_N activation words for V5_R * V5_N
 * vpdpbusd. The rows are walked in panels of V5_R groups x up to V5_KC
 * blocks, repacked once into a stack buffer that stays in L1 while every
 * token tile passes over it; between the panels of one row range the
 * accumulators wait in y (a float store and load are exact). The
 * repacking costs about as much as the products of a few tokens, so it is
 * amortized for prompts and batches, and single-token decode, bound by memory
 * bandwidth, does not notice it. Every token's arithmetic is the same in any
 * tile, so results do not depend on n_tok. */

#define V5_R 2                   /* groups of 16 rows per micro-kernel */
#define V5_N 4                   /* tokens per micro-kernel */
#define V5_KC 18                 /* most blocks per panel: V5_R * V5_KC * 640 bytes of stack */
#define V5_SB_BYTES (512 * 1024) /* outputs per row super-block */

/* Panel bytes per group and block: 8 x 64 weight bytes, 16 f32 d (and m). */
static inline int v5_pb(int qt) { return llmi_qt_has_min(qt) ? 640 : 576; }

/* Q5: adds 16 to the bytes of the nibble vectors lo and hi of dword j
 * whose fifth bit is set in vh (lane r: row r's qh). Lane r's byte k of lo
 * is element 4j+k, of hi element 16+4j+k: its fifth bit is bit 4j+k (resp.
 * 16+4j+k) of row r's qh. Each byte takes the qh byte holding that bit
 * (byte j/2, resp. 2 + j/2, of its own dword), then tests it. */
static V5I void v5_add_fifth_bits(__m512i vh, int j, __m512i *lo, __m512i *hi) {
    const __m512i sixteen = _mm512_set1_epi8(16);
    const __m512i pick_lo = _mm512_set1_epi32(0x01010101 * (j / 2));
    const __m512i pick_hi = _mm512_set1_epi32(0x01010101 * (2 + j / 2));
    const __m512i lane = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0);
    const __m512i bit = _mm512_set1_epi32((int32_t)(0x08040201u << (4 * (j % 2))));
    const __m512i blo = _mm512_shuffle_epi8(vh, _mm512_add_epi8(lane, pick_lo));
    const __m512i bhi = _mm512_shuffle_epi8(vh, _mm512_add_epi8(lane, pick_hi));
    *lo = _mm512_mask_add_epi8(*lo, _mm512_test_epi8_mask(blo, bit), *lo, sixteen);
    *hi = _mm512_mask_add_epi8(*hi, _mm512_test_epi8_mask(bhi, bit), *hi, sixteen);
}

/* Repacks blocks b0 .. b0+kc-1 of the 16 rows starting at row0 (row stride
 * rs; only the first nv exist, the other lanes repeat the last one) into
 * out: kc * v5_pb(qt) bytes. */
static V5I void v5_pack(int qt, const uint8_t *row0, size_t rs, int nv, int64_t b0, int kc,
                        uint8_t *out) {
    const size_t bs = llmi_qt_block_bytes(qt), qo = llmi_qt_qs_offset(qt);
    const int pb = v5_pb(qt);
    const uint8_t *rp[16];
    alignas(64) int32_t idx[16];
    for (int i = 0; i < 16; i++) {
        const size_t r = (size_t)(i < nv ? i : nv - 1);
        rp[i] = row0 + r * rs + (size_t)b0 * bs;
        idx[i] = (int32_t)(r * rs); /* used only when 15 * rs fits */
    }
    const int gather = rs <= (size_t)INT32_MAX / 16;
    const __m512i gidx = _mm512_load_si512(idx);
    for (int kb = 0; kb < kc; kb++, out += pb) {
        const size_t off = (size_t)kb * bs;
        /* Scales: each block's first 4 bytes (f16 d, then the f16 m of
         * Q4_1 and Q5_1); Q5's qh. Copying them through memory instead
         * stalls on store forwarding. */
        __m512i v, vh = _mm512_setzero_si512();
        if (gather) {
            v = _mm512_i32gather_epi32(gidx, rp[0] + off, 1);
            if (llmi_qt_is_q5(qt))
                vh = _mm512_i32gather_epi32(gidx, rp[0] + off + llmi_qt_qh_offset(qt), 1);
        } else {
            alignas(64) uint32_t h[16], hh[16];
            for (int i = 0; i < 16; i++) {
                memcpy(&h[i], rp[i] + off, 4);
                if (llmi_qt_is_q5(qt))
                    memcpy(&hh[i], rp[i] + off + llmi_qt_qh_offset(qt), 4);
            }
            v = _mm512_load_si512(h);
            if (llmi_qt_is_q5(qt))
                vh = _mm512_load_si512(hh);
        }
        _mm512_store_ps(out + 512, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
        if (llmi_qt_has_min(qt))
            _mm512_store_ps(out + 576,
                            _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))));
        if (qt == LLMI_QT_Q8_0) {
            /* 16 rows x 8 dwords, transposed in three rounds of two-source
             * permutes: z[a] = rows 2a, 2a+1; then 4 rows x 4 dwords; then
             * 8 rows x 2 dwords; then 16 rows x 1 dword. */
            __m512i z[8], a[4], b[4], c[4], d[4], e[4], f[4];
            LLMI_UNROLL
            for (int i = 0; i < 8; i++)
                z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(LOADU256(rp[2 * i] + off + qo)),
                                          LOADU256(rp[2 * i + 1] + off + qo), 1);
            const __m512i ia =
                _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
            const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(4));
            const __m512i ic =
                _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
            const __m512i id = _mm512_add_epi32(ic, _mm512_set1_epi32(8));
            LLMI_UNROLL
            for (int i = 0; i < 4; i++) {
                a[i] = _mm512_permutex2var_epi32(z[2 * i], ia, z[2 * i + 1]);
                b[i] = _mm512_permutex2var_epi32(z[2 * i], ib, z[2 * i + 1]);
            }
            LLMI_UNROLL
            for (int i = 0; i < 2; i++) {
                c[i] = _mm512_permutex2var_epi32(a[2 * i], ic, a[2 * i + 1]);
                d[i] = _mm512_permutex2var_epi32(a[2 * i], id, a[2 * i + 1]);
                e[i] = _mm512_permutex2var_epi32(b[2 * i], ic, b[2 * i + 1]);
                f[i] = _mm512_permutex2var_epi32(b[2 * i], id, b[2 * i + 1]);
            }
            const __m512i *src[4] = {c, d, e, f};
            const __m512i flip = _mm512_set1_epi8(-128);
            LLMI_UNROLL
            for (int j = 0; j < 4; j++) {
                _mm512_store_si512(
                    out + 128 * j,
                    _mm512_xor_si512(_mm512_shuffle_i64x2(src[j][0], src[j][1], 0x44), flip));
                _mm512_store_si512(
                    out + 128 * j + 64,
                    _mm512_xor_si512(_mm512_shuffle_i64x2(src[j][0], src[j][1], 0xEE), flip));
            }
        } else {
            /* 16 rows x 4 dwords of nibble pairs: z[a] = rows 4a..4a+3; then
             * 8 rows x 2 dwords; then 16 rows x 1 dword, split into low
             * nibbles (weights 4j..4j+3) and high ones (16+4j..16+4j+3). */
            __m512i z[4];
            LLMI_UNROLL
            for (int i = 0; i < 4; i++) {
                __m512i t = _mm512_castsi128_si512(LOADU128(rp[4 * i] + off + qo));
                t = _mm512_inserti32x4(t, LOADU128(rp[4 * i + 1] + off + qo), 1);
                t = _mm512_inserti32x4(t, LOADU128(rp[4 * i + 2] + off + qo), 2);
                z[i] = _mm512_inserti32x4(t, LOADU128(rp[4 * i + 3] + off + qo), 3);
            }
            const __m512i i01 =
                _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
            const __m512i i23 = _mm512_add_epi32(i01, _mm512_set1_epi32(2));
            const __m512i p0 = _mm512_permutex2var_epi32(z[0], i01, z[1]);
            const __m512i q0 = _mm512_permutex2var_epi32(z[0], i23, z[1]);
            const __m512i p1 = _mm512_permutex2var_epi32(z[2], i01, z[3]);
            const __m512i q1 = _mm512_permutex2var_epi32(z[2], i23, z[3]);
            const __m512i w[4] = {
                _mm512_shuffle_i64x2(p0, p1, 0x44), _mm512_shuffle_i64x2(p0, p1, 0xEE),
                _mm512_shuffle_i64x2(q0, q1, 0x44), _mm512_shuffle_i64x2(q0, q1, 0xEE)};
            /* The unsigned bytes vpdpbusd takes: Q4_0 and Q5_0 are offset
             * by 128 (nibble + 120, value + 112). */
            const __m512i m4 = _mm512_set1_epi8(15);
            const __m512i o = _mm512_set1_epi8(qt == LLMI_QT_Q5_0 ? 112 : 120);
            LLMI_UNROLL
            for (int j = 0; j < 4; j++) {
                __m512i lo = _mm512_and_si512(w[j], m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w[j], 4), m4);
                if (llmi_qt_is_q5(qt))
                    v5_add_fifth_bits(vh, j, &lo, &hi);
                if (qt == LLMI_QT_Q4_0 || qt == LLMI_QT_Q5_0) {
                    lo = _mm512_add_epi8(lo, o);
                    hi = _mm512_add_epi8(hi, o);
                }
                _mm512_store_si512(out + 64 * j, lo);
                _mm512_store_si512(out + 64 * (4 + j), hi);
            }
        }
    }
}

/* One block's step of every (group, token) accumulator: the exact block
 * sums is[g][t] times d_w * d_x (and Q4_1's and Q5_1's m_w * s_x added),
 * in this order, whatever the kernel; xd[t] are the tokens' scales, from
 * the block's own index (xd[t][nb] is its s, nb blocks on). */
static V5I void v5_block_acc(int qt, int R, int N, __m512i is[V5_R][V5_N], const __m512 *dw,
                             const __m512 *mw, const float *const *xd, int64_t nb,
                             __m512 acc[V5_R][V5_N]) {
    LLMI_UNROLL
    for (int t = 0; t < N; t++) {
        const __m512 dx = _mm512_set1_ps(xd[t][0]);
        LLMI_UNROLL
        for (int g = 0; g < R; g++) {
            acc[g][t] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[g][t]), _mm512_mul_ps(dw[g], dx), acc[g][t]);
            if (llmi_qt_has_min(qt))
                acc[g][t] = _mm512_fmadd_ps(mw[g], _mm512_set1_ps(xd[t][nb]), acc[g][t]);
        }
    }
}

/* The accumulators to y (token t at y + t * ldy, group g at + 16 g; the
 * last group's lanes in mlast). */
static V5I void v5_store(int R, int N, __m512 acc[V5_R][V5_N], float *y, int64_t ldy,
                         __mmask16 mlast) {
    LLMI_UNROLL
    for (int g = 0; g < R; g++) {
        const __mmask16 m = g == R - 1 ? mlast : (__mmask16)0xFFFF;
        LLMI_UNROLL
        for (int t = 0; t < N; t++)
            _mm512_mask_storeu_ps(y + t * ldy + 16 * g, m, acc[g][t]);
    }
}

/* The micro-kernel: R groups (R <= V5_R; the last one's valid lanes in
 * mlast) x N tokens over kc blocks of a panel (group stride gs), starting at
 * block b0 of the activation rows xr[t]; y points at the first row of the
 * first group for token 0 (token t at + t * ldy). The accumulators start at
 * 0 (first) or from y. */
static V5I void v5_tile(int qt, int R, int N, const uint8_t *panel, size_t gs, int kc,
                        const uint8_t *const *xr, int64_t nb, int64_t b0, float *y, int64_t ldy,
                        __mmask16 mlast, int first) {
    const int pb = v5_pb(qt);
    __m512 acc[V5_R][V5_N];
    const uint8_t *xq[V5_N];
    const float *xd[V5_N];
    LLMI_UNROLL
    for (int t = 0; t < N; t++) {
        xq[t] = xr[t] + (size_t)QK * (size_t)b0;
        xd[t] = (const float *)(const void *)(xr[t] + QK * nb) + b0;
    }
    LLMI_UNROLL
    for (int g = 0; g < R; g++) {
        const __mmask16 m = g == R - 1 ? mlast : (__mmask16)0xFFFF;
        LLMI_UNROLL
        for (int t = 0; t < N; t++)
            acc[g][t] =
                first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y + t * ldy + 16 * g);
    }
    for (int kb = 0; kb < kc; kb++) {
        const uint8_t *pk = panel + (size_t)kb * (size_t)pb;
        __m512i is[V5_R][V5_N];
        LLMI_UNROLL
        for (int t = 0; t < N; t++) {
            /* Q8_0 rows: c at the place of Q8_1's s (kernels.h). */
            const __m512i c0 = llmi_qt_has_min(qt)
                                   ? _mm512_setzero_si512()
                                   : _mm512_set1_epi32(((const int32_t *)(xd[t] + nb))[kb]);
            LLMI_UNROLL
            for (int g = 0; g < R; g++)
                is[g][t] = c0;
        }
        LLMI_UNROLL
        for (int q = 0; q < 8; q++) {
            __m512i xv[V5_N];
            LLMI_UNROLL
            for (int t = 0; t < N; t++) {
                int32_t v;
                memcpy(&v, xq[t] + QK * kb + 4 * q, 4);
                xv[t] = _mm512_set1_epi32(v);
            }
            LLMI_UNROLL
            for (int g = 0; g < R; g++) {
                const __m512i wv = _mm512_load_si512(pk + (size_t)g * gs + 64 * q);
                LLMI_UNROLL
                for (int t = 0; t < N; t++)
                    is[g][t] = _mm512_dpbusd_epi32(is[g][t], wv, xv[t]);
            }
        }
        __m512 dw[V5_R], mw[V5_R];
        LLMI_UNROLL
        for (int g = 0; g < R; g++) {
            dw[g] = _mm512_load_ps(pk + (size_t)g * gs + 512);
            mw[g] = llmi_qt_has_min(qt) ? _mm512_load_ps(pk + (size_t)g * gs + 576) : dw[g];
        }
        const float *xdb[V5_N];
        LLMI_UNROLL
        for (int t = 0; t < N; t++)
            xdb[t] = xd[t] + kb;
        v5_block_acc(qt, R, N, is, dw, mw, xdb, nb, acc);
    }
    v5_store(R, N, acc, y, ldy, mlast);
}

typedef void (*v5_tile_fn)(const uint8_t *panel, size_t gs, int kc, const uint8_t *const *xr,
                           int64_t nb, int64_t b0, float *y, int64_t ldy, __mmask16 mlast,
                           int first);

#define V5_TILE_FN(QT, R, N)                                                                       \
    static V5 void v5_tile_##QT##_##R##_##N(const uint8_t *panel, size_t gs, int kc,               \
                                            const uint8_t *const *xr, int64_t nb, int64_t b0,      \
                                            float *y, int64_t ldy, __mmask16 mlast, int first) {   \
        v5_tile(LLMI_QT_##QT, R, N, panel, gs, kc, xr, nb, b0, y, ldy, mlast, first);              \
    }
/* Every tile shape (R <= V5_R groups, N <= V5_N tokens) of a kernel: F
 * defines one, and the table row of type QT lists them, P_QT_R_N. */
#define V5_TILE_SHAPES(F, QT)                                                                      \
    F(QT, 1, 1) F(QT, 1, 2) F(QT, 1, 3) F(QT, 1, 4) F(QT, 2, 1) F(QT, 2, 2) F(QT, 2, 3) F(QT, 2, 4)
#define V5_TILE_ROW(P, QT)                                                                         \
    [LLMI_QT_##QT] = {                                                                             \
        {P##_##QT##_1_1, P##_##QT##_1_2, P##_##QT##_1_3, P##_##QT##_1_4},                          \
        {P##_##QT##_2_1, P##_##QT##_2_2, P##_##QT##_2_3, P##_##QT##_2_4},                          \
    }
#define V5_TILE_TABLE(P)                                                                           \
    {                                                                                              \
        V5_TILE_ROW(P, Q4_0), V5_TILE_ROW(P, Q4_1), V5_TILE_ROW(P, Q8_0), V5_TILE_ROW(P, Q5_0),    \
            V5_TILE_ROW(P, Q5_1),                                                                  \
    }
V5_TILE_SHAPES(V5_TILE_FN, Q4_0)
V5_TILE_SHAPES(V5_TILE_FN, Q4_1)
V5_TILE_SHAPES(V5_TILE_FN, Q8_0)
V5_TILE_SHAPES(V5_TILE_FN, Q5_0)
V5_TILE_SHAPES(V5_TILE_FN, Q5_1)
static const v5_tile_fn v5_tiles[LLMI_QT_COUNT][V5_R][V5_N] = V5_TILE_TABLE(v5_tile);

/* ---- packed weights (kernels.h, "Packed weights") ---------------------------
 *
 * A group of 16 rows is a run of block pairs. A pair holds, for its blocks
 * h = 0 and 1: the quants at h * v5p_qbytes, as vectors whose lane r is row
 * r's dword: Q8_0's dwords 0..7 of qs, each byte + 128 (the unsigned bytes
 * vpdpbusd takes); Q4's dwords 0..3 of qs, whose low nibbles are the
 * weights 4j..4j+3 and high ones 16+4j..16+4j+3, so that one AND, or a
 * shift and an AND, gives the vector a panel holds (Q5: the same nibbles,
 * then block 0's and block 1's qh, a dword per row, 128 bytes). Then the 16
 * rows' f16 d of block 0 and of block 1 (64 bytes), and for Q4_1 and Q5_1
 * their f16 m. An odd
 * block count leaves the last pair's second half zero and unread. Every size
 * is a multiple of 64, so every load is aligned. */

#ifndef V5P_AHEAD
#define V5P_AHEAD 4
#endif

static inline size_t v5p_qbytes(int qt) { return qt == LLMI_QT_Q8_0 ? 512 : 256; }
/* Where a pair's qh (Q5: both blocks' 16 dwords), d and m start. */
static inline size_t v5p_qh_off(int qt) { return 2 * v5p_qbytes(qt); }
static inline size_t v5p_d_off(int qt) { return v5p_qh_off(qt) + (llmi_qt_is_q5(qt) ? 128 : 0); }
static inline size_t v5p_pair_bytes(int qt) {
    return v5p_d_off(qt) + (llmi_qt_has_min(qt) ? 128 : 64);
}

size_t llmi_v5p_group_bytes(int qt, int64_t nb) {
    return (size_t)(nb + 1) / 2 * v5p_pair_bytes(qt);
}

void llmi_v5p_pack(int qt, const llmi_weight *w, uint8_t *dst, int64_t g0, int64_t g1) {
    const int64_t nb = w->cols / QK;
    const size_t pb = v5p_pair_bytes(qt), qb = v5p_qbytes(qt), gs = llmi_v5p_group_bytes(qt, nb);
    const size_t bs = llmi_qt_block_bytes(qt), qo = llmi_qt_qs_offset(qt);
    const int nd = qt == LLMI_QT_Q8_0 ? 8 : 4; /* quant dwords per block and row */
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *out = dst + (size_t)g * gs;
        memset(out, 0, gs);
        for (int r = 0; r < 16; r++) {
            const int64_t row = 16 * g + r < w->rows ? 16 * g + r : w->rows - 1;
            const uint8_t *src = (const uint8_t *)w->data + (size_t)row * w->row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = src + (size_t)b * bs;
                uint8_t *pk = out + (size_t)(b / 2) * pb;
                const size_t h = (size_t)(b % 2);
                for (int j = 0; j < nd; j++) {
                    uint32_t v;
                    memcpy(&v, blk + qo + 4 * j, 4);
                    if (qt == LLMI_QT_Q8_0)
                        v ^= 0x80808080u;
                    memcpy(pk + h * qb + 64 * (size_t)j + 4 * (size_t)r, &v, 4);
                }
                if (llmi_qt_is_q5(qt))
                    memcpy(pk + v5p_qh_off(qt) + 64 * h + 4 * (size_t)r,
                           blk + llmi_qt_qh_offset(qt), 4);
                memcpy(pk + v5p_d_off(qt) + 32 * h + 2 * (size_t)r, blk, 2);
                if (llmi_qt_has_min(qt))
                    memcpy(pk + v5p_d_off(qt) + 64 + 32 * h + 2 * (size_t)r, blk + 2, 2);
            }
        }
    }
}

/* Group g of W's packed copy. */
static inline const uint8_t *v5p_group(const llmi_weight *W, int64_t g) {
    return (const uint8_t *)W->packed + (size_t)g * W->packed_group_bytes;
}

/* The panel v5_pack makes of blocks b0 .. b0+kc-1, from a packed group. */
static V5I void v5p_unpack(int qt, const uint8_t *grp, int64_t b0, int kc, uint8_t *out) {
    const size_t pb = v5p_pair_bytes(qt), qb = v5p_qbytes(qt);
    const int opb = v5_pb(qt);
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i o = _mm512_set1_epi8(qt == LLMI_QT_Q4_0 ? 120 : qt == LLMI_QT_Q5_0 ? 112 : 0);
    for (int kb = 0; kb < kc; kb++, out += opb) {
        const int64_t b = b0 + kb;
        const uint8_t *pk = grp + (size_t)(b / 2) * pb;
        const size_t h = (size_t)(b % 2);
        if (qt == LLMI_QT_Q8_0) {
            LLMI_UNROLL
            for (int q = 0; q < 8; q++)
                _mm512_store_si512(out + 64 * q, _mm512_load_si512(pk + h * qb + 64 * q));
        } else {
            const __m512i vh = llmi_qt_is_q5(qt) ? _mm512_load_si512(pk + v5p_qh_off(qt) + 64 * h)
                                                 : _mm512_setzero_si512();
            LLMI_UNROLL
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_load_si512(pk + h * qb + 64 * j);
                __m512i lo = _mm512_and_si512(v, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (llmi_qt_is_q5(qt))
                    v5_add_fifth_bits(vh, j, &lo, &hi);
                _mm512_store_si512(out + 64 * j, _mm512_add_epi8(lo, o));
                _mm512_store_si512(out + 64 * (4 + j), _mm512_add_epi8(hi, o));
            }
        }
        const uint8_t *ps = pk + v5p_d_off(qt) + 32 * h;
        _mm512_store_ps(out + 512,
                        _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)ps)));
        if (llmi_qt_has_min(qt))
            _mm512_store_ps(out + 576, _mm512_cvtph_ps(_mm256_load_si256(
                                           (const __m256i *)(const void *)(ps + 64))));
    }
}

/* R groups (the last one's valid lanes in mlast) x N tokens over every
 * block, straight from the packed copy: each block's weights are expanded
 * in registers once for all N tokens. The arithmetic is v5_tile's (a Q4_0
 * block sum starts from c / 16 = -8 * sum(x), as its weights are the
 * nibbles themselves, not + 120): the same integers, the same float
 * operations in the same order, so the same bits. */
static V5I void v5p_tile(int qt, int R, int N, const uint8_t *grp, size_t gs, int64_t nb,
                         const uint8_t *const *xr, float *y, int64_t ldy, __mmask16 mlast) {
    const size_t pb = v5p_pair_bytes(qt), qb = v5p_qbytes(qt);
    __m512 acc[V5_R][V5_N];
    const float *xd[V5_N];
    LLMI_UNROLL
    for (int t = 0; t < N; t++)
        xd[t] = (const float *)(const void *)(xr[t] + QK * nb);
    LLMI_UNROLL
    for (int g = 0; g < R; g++) {
        LLMI_UNROLL
        for (int t = 0; t < N; t++)
            acc[g][t] = _mm512_setzero_ps();
    }
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++) {
        if (b % 2 == 0) {
            LLMI_UNROLL
            for (int g = 0; g < R; g++) {
                const char *ahead =
                    (const char *)grp + (size_t)g * gs + (size_t)(b / 2 + V5P_AHEAD) * pb;
                for (size_t o = 0; o < pb; o += 64)
                    _mm_prefetch(ahead + o, _MM_HINT_T0);
            }
        }
        const uint8_t *pk = grp + (size_t)(b / 2) * pb + (size_t)(b % 2) * qb;
        const uint8_t *ps = grp + (size_t)(b / 2) * pb + v5p_d_off(qt) + 32 * (size_t)(b % 2);
        const uint8_t *ph = grp + (size_t)(b / 2) * pb + v5p_qh_off(qt) + 64 * (size_t)(b % 2);
        __m512i is[V5_R][V5_N];
        LLMI_UNROLL
        for (int t = 0; t < N; t++) {
            __m512i c0 = _mm512_setzero_si512();
            if (!llmi_qt_has_min(qt))
                c0 = _mm512_set1_epi32(((const int32_t *)(xd[t] + nb))[b]);
            if (qt == LLMI_QT_Q4_0)
                c0 = _mm512_srai_epi32(c0, 4); /* -8 * sum(x) */
            if (qt == LLMI_QT_Q5_0)
                c0 = _mm512_srai_epi32(c0, 3); /* -16 * sum(x) */
            LLMI_UNROLL
            for (int g = 0; g < R; g++)
                is[g][t] = c0;
        }
        const uint8_t *xb[V5_N];
        LLMI_UNROLL
        for (int t = 0; t < N; t++)
            xb[t] = xr[t] + (size_t)QK * (size_t)b;
        if (qt == LLMI_QT_Q8_0) {
            LLMI_UNROLL
            for (int q = 0; q < 8; q++) {
                __m512i xv[V5_N];
                LLMI_UNROLL
                for (int t = 0; t < N; t++) {
                    int32_t v;
                    memcpy(&v, xb[t] + 4 * q, 4);
                    xv[t] = _mm512_set1_epi32(v);
                }
                LLMI_UNROLL
                for (int g = 0; g < R; g++) {
                    const __m512i wv = _mm512_load_si512(pk + (size_t)g * gs + 64 * q);
                    LLMI_UNROLL
                    for (int t = 0; t < N; t++)
                        is[g][t] = _mm512_dpbusd_epi32(is[g][t], wv, xv[t]);
                }
            }
        } else {
            LLMI_UNROLL
            for (int j = 0; j < 4; j++) {
                __m512i xlo[V5_N], xhi[V5_N];
                LLMI_UNROLL
                for (int t = 0; t < N; t++) {
                    int32_t lo, hi;
                    memcpy(&lo, xb[t] + 4 * j, 4);
                    memcpy(&hi, xb[t] + 16 + 4 * j, 4);
                    xlo[t] = _mm512_set1_epi32(lo);
                    xhi[t] = _mm512_set1_epi32(hi);
                }
                LLMI_UNROLL
                for (int g = 0; g < R; g++) {
                    const __m512i v = _mm512_load_si512(pk + (size_t)g * gs + 64 * j);
                    __m512i lo = _mm512_and_si512(v, m4);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    if (llmi_qt_is_q5(qt))
                        v5_add_fifth_bits(_mm512_load_si512(ph + (size_t)g * gs), j, &lo, &hi);
                    LLMI_UNROLL
                    for (int t = 0; t < N; t++) {
                        is[g][t] = _mm512_dpbusd_epi32(is[g][t], lo, xlo[t]);
                        is[g][t] = _mm512_dpbusd_epi32(is[g][t], hi, xhi[t]);
                    }
                }
            }
        }
        __m512 dw[V5_R], mw[V5_R];
        LLMI_UNROLL
        for (int g = 0; g < R; g++) {
            const uint8_t *sg = ps + (size_t)g * gs;
            dw[g] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)sg));
            mw[g] =
                llmi_qt_has_min(qt)
                    ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(const void *)(sg + 64)))
                    : dw[g];
        }
        const float *xdb[V5_N];
        LLMI_UNROLL
        for (int t = 0; t < N; t++)
            xdb[t] = xd[t] + b;
        v5_block_acc(qt, R, N, is, dw, mw, xdb, nb, acc);
    }
    v5_store(R, N, acc, y, ldy, mlast);
}

typedef void (*v5p_tile_fn)(const uint8_t *grp, size_t gs, int64_t nb, const uint8_t *const *xr,
                            float *y, int64_t ldy, __mmask16 mlast);

#define V5P_TILE_FN(QT, R, N)                                                                      \
    static V5 void v5p_tile_##QT##_##R##_##N(const uint8_t *grp, size_t gs, int64_t nb,            \
                                             const uint8_t *const *xr, float *y, int64_t ldy,      \
                                             __mmask16 mlast) {                                    \
        v5p_tile(LLMI_QT_##QT, R, N, grp, gs, nb, xr, y, ldy, mlast);                              \
    }
V5_TILE_SHAPES(V5P_TILE_FN, Q4_0)
V5_TILE_SHAPES(V5P_TILE_FN, Q4_1)
V5_TILE_SHAPES(V5P_TILE_FN, Q8_0)
V5_TILE_SHAPES(V5P_TILE_FN, Q5_0)
V5_TILE_SHAPES(V5P_TILE_FN, Q5_1)
static const v5p_tile_fn v5p_tiles[LLMI_QT_COUNT][V5_R][V5_N] = V5_TILE_TABLE(v5p_tile);

/* Prefetches the weight bytes of rows [rg, re), blocks [b1, b1 + kc] (one
 * block more: the next panel's first bytes may share its line). */
static inline void v5_prefetch(const llmi_weight *W, int64_t rg, int64_t re, int64_t b1, int64_t nb,
                               int kc) {
    const size_t bs = llmi_ttype_get(W->type)->block_bytes;
    const int64_t be = b1 + kc + 1 < nb ? b1 + kc + 1 : nb;
    for (int64_t r = rg; r < re; r++) {
        const char *p = (const char *)W->data + (size_t)r * W->row_bytes;
        for (size_t o = (size_t)b1 * bs; o < (size_t)be * bs; o += 64)
            _mm_prefetch(p + o, _MM_HINT_T0);
    }
}

/* Rows [r0, r1) for all nt tokens (any number: its tile is INT_MAX).
 * The rows go in super-blocks whose outputs (nt x sb floats) stay in L2;
 * within one, the K panels go outside the row panels, so that the tokens'
 * activations of one K panel stay in L2 while every row panel uses them. A
 * single token tile (decode) takes the rows one panel at a time instead. */
static V5I void v5_gemm(int qt, int packed, const llmi_weight *W, int64_t r0, int64_t r1,
                        const uint8_t *xq, size_t xs, int nt, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK;
    const int pb = v5_pb(qt);
    alignas(64) uint8_t panel[V5_R * V5_KC * 640];
    /* Balanced panels: nb = 48 gives 3 x 16 rather than 18 + 18 + 12. */
    const int64_t nchunks = nb > 0 ? (nb + V5_KC - 1) / V5_KC : 1;
    const int ntiles = (nt + V5_N - 1) / V5_N;
    int64_t sb = 16 * V5_R;
    if (ntiles > 1) {
        sb = V5_SB_BYTES / (4 * (int64_t)nt);
        sb = sb < 16 * V5_R ? 16 * V5_R : sb - sb % (16 * V5_R);
    }
    for (int64_t rs = r0; rs < r1; rs += sb) {
        const int64_t re = rs + sb < r1 ? rs + sb : r1;
        int64_t b0 = 0;
        for (int64_t c = 0; c < nchunks; c++) {
            const int kc = (int)(nb / nchunks + (c < nb % nchunks));
            const size_t gs = (size_t)kc * (size_t)pb;
            for (int64_t rg = rs; rg < re; rg += 16 * V5_R) {
                const int64_t left = re - rg;
                const int R = left >= 16 * V5_R ? V5_R : (int)((left + 15) / 16);
                const int nv = (int)(left - 16 * (R - 1) < 16 ? left - 16 * (R - 1) : 16);
                const __mmask16 mlast = (__mmask16)((1u << nv) - 1);
                /* The next panel's rows (32 streams, more than the hardware
                 * prefetchers follow) come while this one is packed and
                 * used: the next rows of this K panel, or the next K panel. */
                if (!packed) { /* a packed group is one run: the hardware follows it */
                    if (rg + 16 * V5_R < re)
                        v5_prefetch(W, rg + 16 * V5_R, rg + 32 * V5_R < re ? rg + 32 * V5_R : re,
                                    b0, nb, kc);
                    else if (c + 1 < nchunks)
                        v5_prefetch(W, rs, rs + 16 * V5_R < re ? rs + 16 * V5_R : re, b0 + kc, nb,
                                    kc);
                    else
                        v5_prefetch(W, re, re + 16 * V5_R < r1 ? re + 16 * V5_R : r1, 0, nb, kc);
                }
                for (int g = 0; g < R; g++) {
                    if (packed)
                        v5p_unpack(qt, v5p_group(W, rg / 16 + g), b0, kc, panel + (size_t)g * gs);
                    else
                        v5_pack(qt, (const uint8_t *)W->data + (size_t)(rg + 16 * g) * W->row_bytes,
                                W->row_bytes, g == R - 1 ? nv : 16, b0, kc, panel + (size_t)g * gs);
                }
                for (int i = 0, t0 = 0; i < ntiles; i++) { /* balanced: 6 = 3 + 3 */
                    const int n = nt / ntiles + (i < nt % ntiles);
                    const uint8_t *xr[V5_N];
                    for (int t = 0; t < n; t++)
                        xr[t] = xq + (size_t)(t0 + t) * xs;
                    v5_tiles[qt][R - 1][n - 1](panel, gs, kc, xr, nb, b0, y + t0 * ldy + rg, ldy,
                                               mlast, c == 0);
                    t0 += n;
                }
            }
            b0 += kc;
        }
    }
}

/* Rows [r0, r1) from the packed copy: up to V5_N tokens straight from it,
 * more through panels (v5p_unpack), as v5_gemm does. */
static V5I void v5p_rows(int qt, const llmi_weight *W, int64_t r0, int64_t r1, const uint8_t *xq,
                         size_t xs, int nt, float *y, int64_t ldy) {
    if (nt > V5_N) {
        v5_gemm(qt, 1, W, r0, r1, xq, xs, nt, y, ldy);
        return;
    }
    const int64_t nb = W->cols / QK;
    const uint8_t *xr[V5_N];
    for (int t = 0; t < nt; t++)
        xr[t] = xq + (size_t)t * xs;
    for (int64_t rg = r0; rg < r1; rg += 16 * V5_R) {
        const int64_t left = r1 - rg;
        const int R = left >= 16 * V5_R ? V5_R : (int)((left + 15) / 16);
        const int nv = (int)(left - 16 * (R - 1) < 16 ? left - 16 * (R - 1) : 16);
        v5p_tiles[qt][R - 1][nt - 1](v5p_group(W, rg / 16), W->packed_group_bytes, nb, xr, y + rg,
                                     ldy, (__mmask16)((1u << nv) - 1));
    }
}

/* Per type: the entry points over the model's rows and over a packed copy. */
#define V5_ENTRIES(t, QT)                                                                          \
    static V5 void v5_gemm_##t(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq,    \
                               size_t xs, int nt, float *y, int64_t ldy) {                         \
        v5_gemm(LLMI_QT_##QT, 0, w, r0, r1, xq, xs, nt, y, ldy);                                   \
    }                                                                                              \
    static V5 void v5p_rows_##t(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq,   \
                                size_t xs, int nt, float *y, int64_t ldy) {                        \
        v5p_rows(LLMI_QT_##QT, w, r0, r1, xq, xs, nt, y, ldy);                                     \
    }                                                                                              \
    const llmi_qrows_impl llmi_qrows_##t##_vnni = {INT_MAX, v5_gemm_##t};                          \
    const llmi_qrows_impl llmi_qrows_##t##_vnni_packed = {INT_MAX, v5p_rows_##t};
V5_ENTRIES(q4_0, Q4_0)
V5_ENTRIES(q4_1, Q4_1)
V5_ENTRIES(q8_0, Q8_0)
V5_ENTRIES(q5_0, Q5_0)
V5_ENTRIES(q5_1, Q5_1)

#else
/* ISO C forbids an empty translation unit. */
typedef int llmi_kernels_q8_vnni_unused;
#endif
