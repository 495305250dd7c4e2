/* K-quants (Q4_K, Q6_K weights; Q8_K activations).
 *
 * The references here are written from the GGUF layouts and llama.cpp's
 * formulas, independently of the library's code:
 *   - dequantization decodes each element from its own (byte, bits)
 *     address, with ggml's float operations in ggml's order, and must match
 *     llmi_dequantize_row bit for bit;
 *   - Q8_K is ggml's quantize_row_q8_K_ref (iscale = -127 / signed max,
 *     round half to even, d = 1 / iscale, sums of 16);
 *   - each matmul output is sum_i (float)(d_w*d_x) * isum_i [- (float)(dmin_w
 *     *d_x) * msum_i for Q4_K] with exact integer isum/msum, in double.
 * Every kernel level must be within float summation-order rounding of that
 * sum: each term goes through at most 2*nsb + 8 float additions or
 * roundings of at most 2^-24 of the running magnitude, so
 *   |y - ref| <= (2*nsb + 16) * 2^-23 * M,  M = sum of |terms| (as integers
 *   times their scale products; for Q6_K the terms of q*x and 32*x apart,
 *   since kernels may take the offset of 32 out only at the end),
 * twice the worst case. test_matmul_exact makes every term and partial sum
 * exact (power-of-two scales, activations k/16 with 127/16 in every
 * super-block), so there every level must equal the reference bit for bit:
 * the integer parts are exact.
 *
 * Seeds are fixed and printed; outputs are poisoned with NaN before each
 * call; random inputs are never all zero. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_impl.h"
#include "core/quant.h"
#include "backend/cpu/threadpool.h"
#include "core/core.h"
#include "core/ttype.h"
#include "model/model.h"
#include "model/testmodel.h"

#define QK_K 256

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1]. */
static float rng_float(uint64_t *s) {
    return (float)((double)(rng_next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static float *nan_buf(int64_t n) {
    float *y = malloc(sizeof(float) * (size_t)n);
    assert_non_null(y);
    for (int64_t i = 0; i < n; i++)
        y[i] = NAN;
    return y;
}

static float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return llmi_f16_to_f32(h);
}

static void f2h(uint8_t *p, float f) {
    const uint16_t h = llmi_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static const llmi_ttype k_types[] = {LLMI_T_Q4_K, LLMI_T_Q6_K};
static const int toks[] = {1, 2, 3, 5, 8, 17};
#define N_TOKS (sizeof toks / sizeof toks[0])

/* ---- independent decoding ---------------------------------------------------
 *
 * Q4_K block: d @0, dmin @2, scales[12] @4, qs[128] @16. Q6_K block:
 * ql[128] @0, qh[64] @128, scales[16] @192, d @208. */

/* Bits [lo, lo+n) of a little-endian byte string. */
static int bits(const uint8_t *p, int lo, int n) {
    int v = 0;
    for (int k = 0; k < n; k++)
        v |= ((p[(lo + k) / 8] >> ((lo + k) % 8)) & 1) << k;
    return v;
}

/* Q4_K sub-block j's 6-bit scale and min, from the bit addresses: j < 4:
 * scale bits 0-5 of byte j, min bits 0-5 of byte j+4; j >= 4: scale low
 * nibble of byte j+4 and bits 6-7 of byte j-4, min high nibble of byte j+4
 * and bits 6-7 of byte j. */
static void ref_q4k_sm(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = bits(s, 8 * j, 6);
        *m = bits(s, 8 * (j + 4), 6);
    } else {
        *sc = bits(s, 8 * (j + 4), 4) | bits(s, 8 * (j - 4) + 6, 2) << 4;
        *m = bits(s, 8 * (j + 4) + 4, 4) | bits(s, 8 * j + 6, 2) << 4;
    }
}

/* Element e of a Q4_K block: its quant (0..15). */
static int ref_q4k_q(const uint8_t *blk, int e) {
    const int byte = 16 + 32 * (e / 64) + e % 32;
    return (e % 64) < 32 ? blk[byte] & 15 : blk[byte] >> 4;
}

/* Element e of a Q6_K block: its quant (0..63). */
static int ref_q6k_q(const uint8_t *blk, int e) {
    const int h = e / 128, k = e % 128, c = k / 32, l = k % 32;
    const uint8_t lb = blk[64 * h + l + 32 * (c & 1)];
    const int low = c < 2 ? lb & 15 : lb >> 4;
    const int high = bits(blk + 128 + 32 * h + l, 2 * c, 2);
    return low | high << 4;
}

static void ref_dequant(llmi_ttype type, const uint8_t *blk, float *y) {
    if (type == LLMI_T_Q4_K) {
        const float d = h2f(blk), dmin = h2f(blk + 2);
        for (int e = 0; e < QK_K; e++) {
            int sc, m;
            ref_q4k_sm(blk + 4, e / 32, &sc, &m);
            const float ds = d * (float)sc, dm = dmin * (float)m;
            volatile float p = ds * (float)ref_q4k_q(blk, e); /* no contraction */
            y[e] = p - dm;
        }
    } else {
        const float d = h2f(blk + 208);
        for (int e = 0; e < QK_K; e++) {
            const int8_t sc = (int8_t)blk[192 + e / 16];
            y[e] = d * (float)sc * (float)(ref_q6k_q(blk, e) - 32);
        }
    }
}

/* Random block bytes, with scales of moderate size and both signs. */
static void random_block(llmi_ttype type, uint8_t *blk, float mag, uint64_t *seed) {
    const size_t bb = llmi_ttype_get(type)->block_bytes;
    for (size_t i = 0; i < bb; i++)
        blk[i] = (uint8_t)rng_next(seed);
    if (type == LLMI_T_Q4_K) {
        f2h(blk, mag * rng_float(seed));
        f2h(blk + 2, mag * rng_float(seed));
    } else {
        f2h(blk + 208, mag * rng_float(seed));
    }
}

static void test_types(void **state) {
    (void)state;
    const struct {
        llmi_ttype t;
        const char *name;
        uint32_t bytes;
    } want[] = {{LLMI_T_Q4_K, "Q4_K", 144}, {LLMI_T_Q6_K, "Q6_K", 210}, {LLMI_T_Q8_K, "Q8_K", 292}};
    for (size_t i = 0; i < 3; i++) {
        const llmi_ttype_info *ti = llmi_ttype_get(want[i].t);
        assert_non_null(ti);
        assert_string_equal(ti->name, want[i].name);
        assert_int_equal(ti->block, 256);
        assert_int_equal(ti->block_bytes, want[i].bytes);
    }
    assert_int_equal(LLMI_T_Q4_K, 12);
    assert_int_equal(LLMI_T_Q6_K, 14);
    assert_int_equal(LLMI_T_Q8_K, 15);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_Q4_K, 1536), 6 * 144);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_Q6_K, 576), 0);
    assert_true(llmi_kernels_type_supported(LLMI_T_Q4_K));
    assert_true(llmi_kernels_type_supported(LLMI_T_Q6_K));
    assert_false(llmi_kernels_type_supported(LLMI_T_Q8_K));
    assert_int_equal(llmi_act_type(LLMI_T_Q4_K), LLMI_T_Q8_K);
    assert_int_equal(llmi_act_type(LLMI_T_Q6_K), LLMI_T_Q8_K);
    assert_int_equal(llmi_act_scratch_bytes(LLMI_T_Q4_K, 576, 4), 0);
    assert_int_equal(llmi_act_scratch_bytes(LLMI_T_Q6_K, 512, 0), 0);
    assert_int_equal(llmi_act_scratch_bytes(LLMI_T_Q6_K, INT64_MAX - 255, 2), 0);
    assert_true(llmi_act_scratch_bytes(LLMI_T_Q4_K, 512, 3) >= 3 * 2 * 292);
}

/* llmi_dequantize_row equals the independent decoding bit for bit. */
static void test_dequant(void **state) {
    (void)state;
    uint64_t seed = 0xDE0A17ull;
    print_message("seed 0x%llx\n", (unsigned long long)seed);
    for (size_t ti = 0; ti < 2; ti++) {
        const llmi_ttype type = k_types[ti];
        const size_t bb = llmi_ttype_get(type)->block_bytes;
        enum { NB = 64 };
        uint8_t *row = malloc(bb * NB);
        for (int b = 0; b < NB; b++)
            random_block(type, row + bb * b, b % 8 == 0 ? 1e-5f : 0.5f, &seed);
        float *got = nan_buf(NB * QK_K), want[QK_K];
        llmi_dequantize_row(type, row, got, NB * QK_K);
        for (int b = 0; b < NB; b++) {
            ref_dequant(type, row + bb * b, want);
            for (int e = 0; e < QK_K; e++)
                if (memcmp(&got[b * QK_K + e], &want[e], 4) != 0)
                    fail_msg("%s block %d element %d: %.9g, independently %.9g",
                             llmi_ttype_get(type)->name, b, e, got[b * QK_K + e], want[e]);
        }
        free(got);
        free(row);
    }
}

/* ---- Q8_K ------------------------------------------------------------------ */

static int round_half_even(float v) {
    const double f = floor((double)v), diff = (double)v - f;
    long q = (long)f;
    if (diff > 0.5 || (diff == 0.5 && (q & 1)))
        q++;
    return (int)q;
}

typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bs[16];
} ref_q8k;

static void ref_quant_q8k(const float *x, ref_q8k *y) {
    memset(y, 0, sizeof *y);
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK_K; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    if (amax == 0.0f)
        return;
    const float iscale = -127.0f / max;
    for (int j = 0; j < QK_K; j++) {
        const int q = round_half_even(iscale * x[j]);
        assert_true(q >= -127 && q <= 128);
        y->qs[j] = (int8_t)(q > 127 ? 127 : q);
        y->bs[j / 16] = (int16_t)(y->bs[j / 16] + y->qs[j]);
    }
    y->d = 1.0f / iscale;
}

/* Activations of varied magnitude with, in each row, one super-block made
 * to hit an edge case of the rounding. */
static float *make_x(int n_tok, int64_t cols, uint64_t seed) {
    float *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
    assert_non_null(x);
    for (int t = 0; t < n_tok; t++) {
        float *row = x + t * cols;
        const float scale = 0.01f + (float)(t % 5);
        for (int64_t c = 0; c < cols; c++)
            row[c] = scale * rng_float(&seed);
        const int64_t nb = cols / QK_K;
        const int64_t kind = (int64_t)(rng_next(&seed) % 5);
        float *blk = row + QK_K * (kind % nb);
        switch (kind) {
        case 0: /* max -127: iscale 1, halves are ties */
            for (int j = 0; j < QK_K; j++)
                blk[j] = (float)(j % 200 - 100) + 0.5f;
            blk[7] = -127.0f;
            break;
        case 1: /* all zero */
            memset(blk, 0, QK_K * sizeof(float));
            break;
        case 2: /* one huge positive value among small ones */
            for (int j = 0; j < QK_K; j++)
                blk[j] = 1e-3f * rng_float(&seed);
            blk[100] = 3.0e4f;
            break;
        case 3: /* tiny */
            for (int j = 0; j < QK_K; j++)
                blk[j] = 1e-30f * rng_float(&seed);
            break;
        default:
            break;
        }
    }
    return x;
}

/* quant.c's Q8_K and the prepared activations (every level, with and
 * without a pool) equal ggml's reference. */
static void test_q8k(void **state) {
    (void)state;
    const int64_t cols_list[] = {256, 512, 1536};
    const int best = llmi_kernels_best_level();
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(3, &pool), LLM_OK);
    for (size_t ci = 0; ci < 3; ci++) {
        const int64_t cols = cols_list[ci], nb = cols / QK_K;
        for (size_t k = 0; k < N_TOKS; k++) {
            const int n_tok = toks[k];
            float *x = make_x(n_tok, cols, 0x8CAull + 31 * ci + k);
            ref_q8k *ref = malloc(sizeof *ref * (size_t)(nb * n_tok));
            llmi_block_q8_k *blk = malloc(sizeof *blk * (size_t)(nb * n_tok));
            for (int t = 0; t < n_tok; t++)
                for (int64_t i = 0; i < nb; i++)
                    ref_quant_q8k(x + t * cols + QK_K * i, &ref[t * nb + i]);
            llmi_quantize_row(LLMI_T_Q8_K, x, blk, n_tok * cols);
            for (int64_t i = 0; i < nb * n_tok; i++) {
                assert_memory_equal(&blk[i].d, &ref[i].d, 4);
                assert_memory_equal(blk[i].qs, ref[i].qs, QK_K);
                assert_memory_equal(blk[i].bsums, ref[i].bs, 32);
            }
            for (int level = 0; level <= best; level++) {
                llmi_kernels_set_level(level);
                const size_t sb = llmi_act_scratch_bytes(LLMI_T_Q4_K, cols, n_tok);
                void *scratch = malloc(sb);
                memset(scratch, 0xCD, sb);
                llmi_act a;
                llmi_act_prepare(level % 2 ? pool : NULL, LLMI_T_Q6_K, x, n_tok, cols, scratch, &a);
                assert_int_equal(a.q_type, LLMI_T_Q8_K);
                assert_int_equal((uintptr_t)a.q % 64, 0);
                assert_int_equal(a.q_row_bytes % 64, 0);
                for (int t = 0; t < n_tok; t++) {
                    const int8_t *qs = llmi_act_qs(&a, t);
                    const float *d = llmi_act_d(&a, t);
                    const int16_t *bs = llmi_act_bsums(&a, t);
                    for (int64_t i = 0; i < nb; i++) {
                        const ref_q8k *r = &ref[t * nb + i];
                        assert_memory_equal(qs + QK_K * i, r->qs, QK_K);
                        assert_memory_equal(&d[i], &r->d, 4);
                        assert_memory_equal(bs + 16 * i, r->bs, 32);
                    }
                    const uint8_t *row = (const uint8_t *)qs;
                    for (size_t b = (size_t)nb * 292; b < a.q_row_bytes; b++)
                        assert_int_equal(row[b], 0);
                }
                free(scratch);
            }
            free(blk);
            free(ref);
            free(x);
        }
    }
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

/* ---- quantize -> dequantize --------------------------------------------- */

/* Relative RMS error of the round trip over rows of a few distributions;
 * all-zero and constant super-blocks come back exactly (Q6_K) or within
 * the fp16 rounding of their scale (Q4_K). */
static void test_roundtrip(void **state) {
    (void)state;
    const int64_t n = 64 * QK_K;
    float *x = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
    uint8_t *q = malloc(llmi_ttype_row_bytes(LLMI_T_Q6_K, n));
    /* Bounds: about 1.4x the errors measured at the seed below (uniform:
     * Q4_K 0.046, Q6_K 0.011; gaussian-like: Q4_K 0.085, Q6_K 0.021). A
     * 4-bit grid over a sub-block's range has an RMS error of range/52
     * (6-bit: range/218), which is ~0.067 (0.016) of a uniform row's RMS. */
    const double bound[2][2] = {{0.065, 0.12}, {0.016, 0.03}};
    uint64_t seed = 0x7217ull;
    print_message("seed 0x%llx\n", (unsigned long long)seed);
    for (int dist = 0; dist < 2; dist++) {
        for (int64_t i = 0; i < n; i++) {
            const float u = rng_float(&seed);
            /* dist 1: sum of 3 uniforms, times a per-super-block scale */
            x[i] = dist == 0 ? u
                             : (u + rng_float(&seed) + rng_float(&seed)) *
                                   (0.01f + (float)((i / QK_K) % 7));
        }
        for (size_t ti = 0; ti < 2; ti++) {
            const llmi_ttype type = k_types[ti];
            llmi_quantize_row(type, x, q, n);
            llmi_dequantize_row(type, q, back, n);
            double se = 0, sx = 0, worst = 0;
            for (int64_t b = 0; b < n / QK_K; b++) {
                double bse = 0, bsx = 0;
                for (int j = 0; j < QK_K; j++) {
                    const double e = (double)back[b * QK_K + j] - x[b * QK_K + j];
                    bse += e * e;
                    bsx += (double)x[b * QK_K + j] * x[b * QK_K + j];
                }
                se += bse;
                sx += bsx;
                worst = fmax(worst, sqrt(bse / bsx));
            }
            const double rel = sqrt(se / sx);
            print_message("%s dist %d: relative RMS error %.4f (worst super-block %.4f)\n",
                          llmi_ttype_get(type)->name, dist, rel, worst);
            assert_true(rel < bound[ti][dist]);
            assert_true(worst < 1.5 * bound[ti][dist]);
        }
    }
    /* zero and constant super-blocks */
    for (int j = 0; j < QK_K; j++) {
        x[j] = 0.0f;
        x[QK_K + j] = 0.75f;
        x[2 * QK_K + j] = -1.25f;
    }
    for (size_t ti = 0; ti < 2; ti++) {
        llmi_quantize_row(k_types[ti], x, q, 3 * QK_K);
        llmi_dequantize_row(k_types[ti], q, back, 3 * QK_K);
        for (int j = 0; j < 3 * QK_K; j++)
            assert_true(fabsf(back[j] - x[j]) <= 2e-3f * fabsf(x[j]));
        for (int j = 0; j < QK_K; j++)
            assert_true(back[j] == 0.0f);
    }
    free(q);
    free(back);
    free(x);
}

/* ---- matmul against the formula ------------------------------------------ */

typedef struct {
    llmi_weight w;
    uint8_t *buf;
} test_weight;

static void make_weight(test_weight *tw, llmi_ttype type, int64_t rows, int64_t cols, size_t pad,
                        uint64_t seed) {
    const size_t rb = llmi_ttype_row_bytes(type, (uint64_t)cols);
    assert_true(rb > 0);
    tw->w = (llmi_weight){NULL, type, rows, cols, rb + pad};
    tw->buf = malloc(tw->w.row_bytes * (size_t)rows + 1);
    assert_non_null(tw->buf);
    uint8_t *base = tw->buf + (pad & 1); /* odd pads: unaligned rows */
    const size_t bb = llmi_ttype_get(type)->block_bytes;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = base + (size_t)r * tw->w.row_bytes;
        for (size_t i = 0; i < tw->w.row_bytes; i++)
            row[i] = (uint8_t)rng_next(&seed);
        for (int64_t b = 0; b < cols / QK_K; b++)
            random_block(type, row + bb * b, 0.001f + 0.01f * (float)(r % 7), &seed);
    }
    tw->w.data = base;
}

/* Super-block i of a row against a token: the integer sums and scales. */
static void ref_terms(llmi_ttype type, const uint8_t *blk, const ref_q8k *xq, long *isum,
                      long *msum, long *iabs, long *mabs, float *dw, float *mw) {
    *isum = *msum = *iabs = *mabs = 0;
    if (type == LLMI_T_Q4_K) {
        *dw = h2f(blk);
        *mw = h2f(blk + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            ref_q4k_sm(blk + 4, j, &sc, &m);
            long s = 0, a = 0, b32 = 0;
            for (int l = 0; l < 32; l++) {
                const long p = (long)ref_q4k_q(blk, 32 * j + l) * xq->qs[32 * j + l];
                s += p;
                a += labs(p);
                b32 += xq->qs[32 * j + l];
            }
            *isum += sc * s;
            *iabs += sc * a;
            *msum += m * b32;
            *mabs += m * labs(b32);
        }
    } else {
        *dw = h2f(blk + 208);
        *mw = 0.0f;
        for (int j = 0; j < 16; j++) {
            const int sc = (int8_t)blk[192 + j];
            long s = 0, a = 0, b = 0;
            for (int l = 0; l < 16; l++) {
                const int q = ref_q6k_q(blk, 16 * j + l), xv = xq->qs[16 * j + l];
                s += (long)(q - 32) * xv;
                a += labs((long)(q - 32) * xv) + (long)q * labs(xv);
                b += xv;
            }
            *isum += sc * s;
            /* The kernels may sum q * x and 32 * sum(x) apart (the offset
             * taken out at the end): those magnitudes count too. */
            *iabs += labs(sc) * (a + 32 * labs(b));
        }
    }
}

/* Reference output and magnitude M for row r, token t. */
static void ref_output(const test_weight *tw, int64_t r, const ref_q8k *xq, double *ref,
                       double *mag) {
    const llmi_ttype type = tw->w.type;
    const int64_t nb = tw->w.cols / QK_K;
    const size_t bb = llmi_ttype_get(type)->block_bytes;
    const uint8_t *row = (const uint8_t *)tw->w.data + (size_t)r * tw->w.row_bytes;
    *ref = *mag = 0.0;
    for (int64_t i = 0; i < nb; i++) {
        long isum, msum, iabs, mabs;
        float dw, mw;
        ref_terms(type, row + bb * i, &xq[i], &isum, &msum, &iabs, &mabs, &dw, &mw);
        const float dd = dw * xq[i].d, dm = mw * xq[i].d; /* rounded to float */
        *ref += (double)dd * (double)isum - (double)dm * (double)msum;
        *mag += fabs((double)dd) * (double)iabs + fabs((double)dm) * (double)mabs;
    }
}

static ref_q8k *ref_acts(const float *x, int n_tok, int64_t cols) {
    const int64_t nb = cols / QK_K;
    ref_q8k *xq = malloc(sizeof *xq * (size_t)(nb * n_tok));
    for (int t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < nb; i++)
            ref_quant_q8k(x + t * cols + QK_K * i, &xq[t * nb + i]);
    return xq;
}

static void *act_for(llmi_pool *pool, const test_weight *tw, const float *x, int n_tok,
                     llmi_act *a) {
    const size_t sb = llmi_act_scratch_bytes(tw->w.type, tw->w.cols, n_tok);
    assert_true(sb > 0);
    void *scratch = malloc(sb);
    memset(scratch, 0xCD, sb);
    llmi_act_prepare(pool, tw->w.type, x, n_tok, tw->w.cols, scratch, a);
    return scratch;
}

static void matmul_vs_formula(llmi_ttype type) {
    const int64_t shapes[][2] = {{1, 256},   {15, 512},  {16, 256},  {17, 768},
                                 {37, 1536}, {33, 2304}, {100, 256}, {3, 4096}};
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    const int best = llmi_kernels_best_level();
    const uint64_t seed0 = 0x4B0000ull + (uint64_t)type;
    print_message("type %s: seed 0x%llx, levels 0..%d, VNNI %d\n", llmi_ttype_get(type)->name,
                  (unsigned long long)seed0, best, llmi_kernels_have_vnni());
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(2, &pool), LLM_OK);
    double worst[3] = {0, 0, 0}, worst_c[3] = {0, 0, 0};
    for (size_t s = 0; s < n_shapes; s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1], nb = cols / QK_K;
        test_weight tw;
        make_weight(&tw, type, rows, cols, s % 3 == 1 ? 3 : 0, seed0 + s);
        float *x = make_x(17, cols, seed0 ^ (s << 32));
        ref_q8k *xq = ref_acts(x, 17, cols);
        for (size_t k = 0; k < N_TOKS; k++) {
            const int n_tok = toks[k];
            float *yc = NULL;
            for (int level = 0; level <= best; level++) {
                llmi_kernels_set_level(level);
                llmi_act a;
                llmi_pool *p = (k + (size_t)level) % 2 ? pool : NULL;
                void *scratch = act_for(p, &tw, x, n_tok, &a);
                float *y = nan_buf(n_tok * rows);
                llmi_matmul_act(p, &tw.w, &a, y);
                const double tol_unit = (double)(2 * nb + 16) * 0x1p-23;
                for (int t = 0; t < n_tok; t++)
                    for (int64_t r = 0; r < rows; r++) {
                        double ref, mag;
                        ref_output(&tw, r, xq + t * nb, &ref, &mag);
                        const double got = y[t * rows + r], err = fabs(got - ref);
                        const double tol = tol_unit * mag;
                        if (!(err <= tol))
                            fail_msg("%s %lldx%lld n_tok=%d level=%d: y[%d][%lld] = %.9g, "
                                     "formula %.9g, |err| %.3g > bound %.3g",
                                     llmi_ttype_get(type)->name, (long long)rows, (long long)cols,
                                     n_tok, level, t, (long long)r, got, ref, err, tol);
                        if (tol > 0)
                            worst[level] = fmax(worst[level], err / tol);
                        /* and against the portable C kernel */
                        if (yc) {
                            const double dc = fabs(got - yc[t * rows + r]);
                            if (!(dc <= 2 * tol))
                                fail_msg("%s level %d vs C: %.9g vs %.9g",
                                         llmi_ttype_get(type)->name, level, got, yc[t * rows + r]);
                            if (tol > 0)
                                worst_c[level] = fmax(worst_c[level], dc / tol);
                        }
                    }
                free(scratch);
                if (!yc)
                    yc = y;
                else
                    free(y);
            }
            free(yc);
        }
        free(xq);
        free(x);
        free(tw.buf);
    }
    print_message("worst |err| / bound per level: %.3f %.3f %.3f; vs C: %.3f %.3f\n", worst[0],
                  worst[1], worst[2], worst_c[1], worst_c[2]);
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

static void test_matmul_q4_k(void **state) {
    (void)state;
    matmul_vs_formula(LLMI_T_Q4_K);
}
static void test_matmul_q6_k(void **state) {
    (void)state;
    matmul_vs_formula(LLMI_T_Q6_K);
}

/* Exactness: weight scales 2^-1..2^-3, activations k/16 with |k| <= 15 and
 * one -127/16 or 127/16 per super-block (so d_x = -+1/16 and the quants are
 * -+k exactly), Q6_K scales within +-16. Every term is then a multiple of
 * 2^-7 and the sum of their magnitudes stays below 2^24 * 2^-7 (asserted),
 * so any order of float sums is exact: every level must give the reference
 * bit for bit, whatever the tile, thread or row split. */
static void test_matmul_exact(void **state) {
    (void)state;
    const int64_t cols_list[] = {256, 512, 768};
    const int ntoks[] = {1, 3, 8, 17};
    const float pw[] = {0.25f, -0.5f, 0.125f, 0.25f};
    const int best = llmi_kernels_best_level();
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(2, &pool), LLM_OK);
    uint64_t seed = 0xE8AC7ull;
    print_message("seed 0x%llx\n", (unsigned long long)seed);
    for (size_t ti = 0; ti < 2; ti++) {
        const llmi_ttype type = k_types[ti];
        for (size_t ci = 0; ci < 3; ci++) {
            const int64_t rows = 37, cols = cols_list[ci], nb = cols / QK_K;
            test_weight tw;
            make_weight(&tw, type, rows, cols, ci, seed++);
            const size_t bb = llmi_ttype_get(type)->block_bytes;
            for (int64_t r = 0; r < rows; r++) {
                uint8_t *row = (uint8_t *)tw.w.data + (size_t)r * tw.w.row_bytes;
                for (int64_t i = 0; i < nb; i++) {
                    uint8_t *blk = row + bb * i;
                    if (type == LLMI_T_Q4_K) {
                        f2h(blk, pw[rng_next(&seed) % 4]);
                        f2h(blk + 2, pw[rng_next(&seed) % 4]);
                    } else {
                        f2h(blk + 208, pw[rng_next(&seed) % 4]);
                        for (int j = 0; j < 16; j++)
                            blk[192 + j] = (uint8_t)(int8_t)((int)(rng_next(&seed) % 33) - 16);
                    }
                }
            }
            float *x = malloc(sizeof(float) * (size_t)(17 * cols));
            for (int64_t i = 0; i < 17 * cols; i++)
                x[i] = (float)((int)(rng_next(&seed) % 31) - 15) * 0x1p-4f;
            for (int64_t i = 0; i < 17 * nb; i++)
                x[QK_K * i + (int)(rng_next(&seed) % QK_K)] =
                    (rng_next(&seed) & 1 ? 127 : -127) * 0x1p-4f;
            ref_q8k *xq = ref_acts(x, 17, cols);
            for (size_t k = 0; k < sizeof ntoks / sizeof ntoks[0]; k++) {
                const int n_tok = ntoks[k];
                float *ref = nan_buf(n_tok * rows);
                for (int t = 0; t < n_tok; t++)
                    for (int64_t r = 0; r < rows; r++) {
                        double v, mag;
                        ref_output(&tw, r, xq + t * nb, &v, &mag);
                        assert_true(mag < 0x1p24 * 0x1p-7);
                        ref[t * rows + r] = (float)v;
                        assert_true((double)ref[t * rows + r] == v);
                    }
                for (int level = 0; level <= best; level++) {
                    llmi_kernels_set_level(level);
                    llmi_act a;
                    void *scratch = act_for(pool, &tw, x, n_tok, &a);
                    float *y = nan_buf(n_tok * rows);
                    llmi_matmul_act(level % 2 ? pool : NULL, &tw.w, &a, y);
                    for (int64_t i = 0; i < n_tok * rows; i++)
                        if (y[i] != ref[i])
                            fail_msg("%s cols %lld n_tok %d level %d: y[%lld] = %.9g, exactly %.9g",
                                     llmi_ttype_get(type)->name, (long long)cols, n_tok, level,
                                     (long long)i, y[i], ref[i]);
                    free(y);
                    free(scratch);
                }
                free(ref);
            }
            free(xq);
            free(x);
            free(tw.buf);
        }
    }
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

/* ---- determinism ---------------------------------------------------------- */

/* 1-3 threads, hand-split parts up to 7, and tokens one at a time or five
 * at a time give the same bits at every level, for the integer and the f32
 * paths. */
static void test_deterministic(void **state) {
    (void)state;
    const int64_t rows = 203, cols = 1280;
    const int n_tok = 13;
    llmi_pool *pools[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        assert_int_equal(llmi_pool_create(i + 1, &pools[i]), LLM_OK);
    const int best = llmi_kernels_best_level();
    for (size_t ti = 0; ti < 2; ti++) {
        const llmi_ttype type = k_types[ti];
        test_weight tw;
        make_weight(&tw, type, rows, cols, 0, 0xD00Dull + ti);
        float *x = make_x(n_tok, cols, 0xBEEFull + ti);
        for (int level = 0; level <= best; level++) {
            llmi_kernels_set_level(level);
            for (int path = 0; path < 2; path++) { /* 0: Q8_K, 1: f32 */
                llmi_act a;
                void *scratch = act_for(NULL, &tw, x, n_tok, &a);
                float *ref = nan_buf(n_tok * rows);
                if (path == 0)
                    llmi_matmul_act(pools[0], &tw.w, &a, ref);
                else
                    llmi_matmul(pools[0], &tw.w, x, n_tok, ref);
                for (int i = 1; i < 3; i++) {
                    float *y = nan_buf(n_tok * rows);
                    if (path == 0)
                        llmi_matmul_act(pools[i], &tw.w, &a, y);
                    else
                        llmi_matmul(pools[i], &tw.w, x, n_tok, y);
                    assert_memory_equal(y, ref, sizeof(float) * (size_t)(n_tok * rows));
                    free(y);
                }
                for (int nth = 2; nth <= 7; nth++) {
                    float *y = nan_buf(n_tok * rows);
                    for (int ith = nth - 1; ith >= 0; ith--) {
                        if (path == 0)
                            llmi_matmul_act_part(&tw.w, &a, y, ith, nth);
                        else
                            llmi_matmul_part(&tw.w, x, n_tok, y, ith, nth);
                    }
                    assert_memory_equal(y, ref, sizeof(float) * (size_t)(n_tok * rows));
                    free(y);
                }
                for (int t0 = 0; t0 < n_tok; t0 += 5) {
                    for (int bs = 1; bs <= 5; bs += 4) {
                        const int nt = bs < n_tok - t0 ? bs : n_tok - t0;
                        llmi_act a1;
                        void *s1 = act_for(pools[1], &tw, x + t0 * cols, nt, &a1);
                        float *y = nan_buf(nt * rows);
                        if (path == 0)
                            llmi_matmul_act(pools[1], &tw.w, &a1, y);
                        else
                            llmi_matmul(pools[1], &tw.w, x + t0 * cols, nt, y);
                        assert_memory_equal(y, ref + t0 * rows,
                                            sizeof(float) * (size_t)(nt * rows));
                        free(y);
                        free(s1);
                    }
                }
                free(ref);
                free(scratch);
            }
        }
        free(x);
        free(tw.buf);
    }
    llmi_kernels_set_level(-1);
    for (int i = 0; i < 3; i++)
        llmi_pool_free(pools[i]);
}

/* The f32 path: dequantized weights times f32 activations, within float
 * rounding of the double product. */
static void test_matmul_f32(void **state) {
    (void)state;
    const int best = llmi_kernels_best_level();
    for (size_t ti = 0; ti < 2; ti++) {
        const llmi_ttype type = k_types[ti];
        const int64_t rows = 45, cols = 768;
        test_weight tw;
        make_weight(&tw, type, rows, cols, 1, 0xF32ull + ti);
        float *x = make_x(17, cols, 0xF33ull + ti);
        float *w = malloc(sizeof(float) * (size_t)cols);
        for (int level = 0; level <= best; level++) {
            llmi_kernels_set_level(level);
            for (size_t k = 0; k < N_TOKS; k++) {
                const int n_tok = toks[k];
                float *y = nan_buf(n_tok * rows);
                llmi_matmul(NULL, &tw.w, x, n_tok, y);
                for (int64_t r = 0; r < rows; r++) {
                    llmi_dequantize_row(type, (const uint8_t *)tw.w.data + r * tw.w.row_bytes, w,
                                        cols);
                    for (int t = 0; t < n_tok; t++) {
                        double ref = 0, mag = 0;
                        for (int64_t c = 0; c < cols; c++) {
                            ref += (double)w[c] * x[t * cols + c];
                            mag += fabs((double)w[c] * x[t * cols + c]);
                        }
                        const double err = fabs(y[t * rows + r] - ref);
                        assert_true(err <= (double)(cols / 8 + 16) * 0x1p-23 * mag);
                    }
                }
                free(y);
            }
        }
        free(w);
        free(x);
        free(tw.buf);
    }
    llmi_kernels_set_level(-1);
}

/* A K-quant "row" of 576 columns breaks the contract: NaN, not a wild read. */
static void test_bad_cols(void **state) {
    (void)state;
    uint8_t data[2 * 324] = {0};
    float x[576] = {0}, y[2] = {1, 1};
    for (size_t ti = 0; ti < 2; ti++) {
        llmi_weight w = {data, k_types[ti], 2, 576, 324};
        llmi_act a;
        llmi_act_prepare(NULL, w.type, x, 1, 576, NULL, &a);
        assert_null(a.q);
        llmi_matmul_act(NULL, &w, &a, y);
        assert_true(isnan(y[0]) && isnan(y[1]));
        y[0] = y[1] = 1;
        llmi_matmul(NULL, &w, x, 1, y);
        assert_true(isnan(y[0]) && isnan(y[1]));
    }
}

/* ---- a model ------------------------------------------------------------- */

/* Last-position logits of a random testmodel (n_embd 256, n_ff 512) whose
 * matrices, token_embd included, are of `type`. */
static float *model_logits(llmi_ttype type, uint32_t *n_vocab) {
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_embd = 256;
    p.n_ff = 512;
    p.type = type;
    p.seed = 77;
    char path[512];
    snprintf(path, sizeof path, "%s/kquant-%d.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp", (int)type);
    assert_int_equal(llmi_testmodel_write(&p, path), LLM_OK);
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(path, true, &m), LLM_OK);
    remove(path);
    assert_int_equal(m->w[LLMI_ROLE_TOKEN_EMBD].type, type);
    assert_int_equal(m->layers[0].w[LLMI_ROLE_DOWN].type, type);
    assert_int_equal(m->layers[0].w[LLMI_ROLE_DOWN].row_bytes, llmi_ttype_row_bytes(type, 512));
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 64;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(m, &sp, &s), LLM_OK);
    llm_seq_id seq;
    assert_int_equal(llm_seq_open(s, &seq), LLM_OK);
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(16, &b), LLM_OK);
    for (uint32_t i = 0; i < 9; i++)
        assert_int_equal(llm_batch_add(b, seq, i, (llm_token)(17 * i + 3), i == 8), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    const float *lg = NULL;
    assert_int_equal(llm_session_logits(s, 8, &lg), LLM_OK);
    *n_vocab = m->hp.n_vocab;
    float *out = malloc(sizeof(float) * *n_vocab);
    memcpy(out, lg, sizeof(float) * *n_vocab);
    llm_batch_free(b);
    llm_session_free(s);
    llmi_model_free(m);
    return out;
}

/* Q4_K and Q6_K models load (token_embd too) and run; their logits follow
 * the F32 model's within the quantization noise: the relative RMS
 * difference is about 2^-4 per bit of precision lost (measured 0.04 for
 * Q6_K, 0.2 for Q4_K at these weights); a wrong scale, nibble or embedding
 * row gives ~1. */
static void test_model(void **state) {
    (void)state;
    uint32_t nv = 0, nv2 = 0;
    float *ref = model_logits(LLMI_T_F32, &nv);
    const double bound[2] = {0.4, 0.1};
    for (size_t ti = 0; ti < 2; ti++) {
        float *lg = model_logits(k_types[ti], &nv2);
        assert_int_equal(nv, nv2);
        double se = 0, sr = 0, mean = 0;
        for (uint32_t i = 0; i < nv; i++)
            mean += ref[i] / nv;
        for (uint32_t i = 0; i < nv; i++) {
            assert_true(isfinite(lg[i]));
            se += ((double)lg[i] - ref[i]) * ((double)lg[i] - ref[i]);
            sr += (ref[i] - mean) * (ref[i] - mean);
        }
        const double rel = sqrt(se / sr);
        print_message("%s model: relative RMS logit difference to F32 %.4f\n",
                      llmi_ttype_get(k_types[ti])->name, rel);
        assert_true(rel < bound[ti]);
        free(lg);
    }
    free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),        cmocka_unit_test(test_dequant),
        cmocka_unit_test(test_q8k),          cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_matmul_q4_k),  cmocka_unit_test(test_matmul_q6_k),
        cmocka_unit_test(test_matmul_exact), cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_matmul_f32),   cmocka_unit_test(test_bad_cols),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
