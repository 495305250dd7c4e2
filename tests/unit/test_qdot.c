/* Quantized weights x 8-bit activations (kernels.h, "8-bit activations").
 *
 * The reference here is written from llama.cpp's formulas, independently of
 * the library's code: activations are rounded to Q8_0/Q8_1 blocks the way
 * llama.cpp's x86 quantize_row_q8_0/_q8_1 do (127/amax, round half to even,
 * computed below without rintf), and each output is
 *   sum_b (float)(d_w * d_x) * isum_b  [+ m_w * s_x for Q4_1 and Q5_1]
 * with exact integer isum_b, summed in double.
 *
 * Bound: the kernels differ from it only by float rounding of the per-lane
 * partial sums: each term of the sum goes through at most nb/2 + 8
 * accumulations and reductions (and Q4_1's m*s product one rounding), so
 *   |y - ref| <= (nb + 16) * 2^-23 * M,  M = sum_b |d_w d_x| sum_j |w_j x_j|
 *                                               + sum_b |m_w s_x|,
 * twice the worst case of (nb/2 + 8) roundings of 2^-24 relative to M.
 * That catches wrong scales, signs and nibbles, but not an isum off by one
 * (|d_w d_x| is about M / (32 * nb * 200) here). test_matmul_act_exact does:
 * with power-of-two scales and integer-valued activations every product
 * and partial sum is exact in float, so any summation order must give the
 * reference bit for bit.
 *
 * Seeds are fixed; outputs are poisoned with NaN before each call. */
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

static const llmi_ttype q_types[] = {LLMI_T_Q4_0, LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1,
                                     LLMI_T_Q8_0};
#define N_QTYPES (sizeof q_types / sizeof q_types[0])
static const int toks[] = {1, 2, 3, 5, 8, 17};
#define N_TOKS (sizeof toks / sizeof toks[0])

/* Weight types with a per-block minimum m (x = d*q + m). */
static int has_min(llmi_ttype t) { return t == LLMI_T_Q4_1 || t == LLMI_T_Q5_1; }

/* Activations: random rows of varied magnitude, and in every row some
 * blocks made to hit the edge cases of the rounding. */
static float *make_x(int n_tok, int64_t cols, uint64_t seed) {
    float *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
    assert_non_null(x);
    for (int t = 0; t < n_tok; t++) {
        float *row = x + t * cols;
        const float scale = 0.01f + (float)(t % 5);
        for (int64_t c = 0; c < cols; c++)
            row[c] = scale * rng_float(&seed);
        const int64_t nb = cols / 32;
        const int64_t kind = (int64_t)(rng_next(&seed) % 6);
        float *blk = row + 32 * (kind % nb);
        switch (kind) {
        case 0: /* amax 127: id = 1, so k + 0.5 are exact ties */
            for (int j = 0; j < 32; j++)
                blk[j] = (float)(j - 16) + 0.5f;
            blk[5] = 127.0f;
            blk[6] = -126.5f;
            break;
        case 1: /* id = 2: quarters are ties */
            for (int j = 0; j < 32; j++)
                blk[j] = 0.25f * (float)(2 * j - 31);
            blk[0] = -63.5f;
            break;
        case 2: /* all zero */
            memset(blk, 0, 32 * sizeof(float));
            break;
        case 3: /* one huge value among small ones */
            for (int j = 0; j < 32; j++)
                blk[j] = 1e-3f * rng_float(&seed);
            blk[17] = -3.0e4f;
            break;
        case 4: /* tiny: d is an fp16 subnormal or rounds to 0 */
            for (int j = 0; j < 32; j++)
                blk[j] = 1e-6f * rng_float(&seed);
            break;
        default: /* a single non-zero value */
            memset(blk, 0, 32 * sizeof(float));
            blk[31] = 0.375f;
            break;
        }
    }
    return x;
}

/* ---- llama.cpp's x86 activation rounding, written independently -------- */

typedef struct {
    uint16_t d, s;
    int8_t qs[32];
} ref_block;

/* Round half to even, exactly, without the FPU rounding mode. */
static int round_half_even(float v) {
    const double f = floor((double)v), diff = (double)v - f;
    long q = (long)f;
    if (diff > 0.5 || (diff == 0.5 && (q & 1)))
        q++;
    return (int)q;
}

static void ref_quantize(const float *x, int64_t nb, ref_block *out) {
    for (int64_t b = 0; b < nb; b++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = round_half_even(x[j] * id);
            assert_true(q >= -127 && q <= 127);
            out[b].qs[j] = (int8_t)q;
            sum += q;
        }
        out[b].d = llmi_f32_to_f16(d);
        out[b].s = llmi_f32_to_f16(d * (float)sum);
    }
}

/* ---- weights -------------------------------------------------------------- */

typedef struct {
    llmi_weight w;
    uint8_t *buf;
} test_weight;

/* Random bytes for the quants (every nibble value; Q8_0 includes -128,
 * which the files allow) and random f16 scales of both signs. */
static void make_weight(test_weight *tw, llmi_ttype type, int64_t rows, int64_t cols, size_t pad,
                        uint64_t seed) {
    const size_t rb = llmi_ttype_row_bytes(type, (uint64_t)cols);
    assert_true(rb > 0);
    tw->w = (llmi_weight){NULL, type, rows, cols, rb + pad};
    tw->buf = malloc(tw->w.row_bytes * (size_t)rows + 1);
    assert_non_null(tw->buf);
    uint8_t *base = tw->buf + (pad & 1); /* odd pads: unaligned rows */
    const size_t bs = llmi_ttype_get(type)->block_bytes;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = base + (size_t)r * tw->w.row_bytes;
        for (size_t i = 0; i < tw->w.row_bytes; i++)
            row[i] = (uint8_t)rng_next(&seed);
        const float mag = 0.001f + 0.02f * (float)(r % 7);
        for (int64_t b = 0; b < cols / 32; b++) {
            uint8_t *blk = row + (size_t)b * bs;
            uint16_t h = llmi_f32_to_f16(mag * rng_float(&seed));
            memcpy(blk, &h, 2);
            if (has_min(type)) {
                h = llmi_f32_to_f16(-8.0f * mag * (rng_float(&seed) + 0.2f));
                memcpy(blk + 2, &h, 2);
            }
        }
    }
    tw->w.data = base;
}

static float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return llmi_f16_to_f32(h);
}

/* Weight block b of a row as integers, its d and (Q4_1, Q5_1) m. GGUF's
 * layouts, spelled out here rather than taken from ttype.h: Q5_0 = d, qh[4],
 * qs[16]; Q5_1 = d, m, qh[4], qs[16]; element j's fifth bit is bit j of qh
 * read as a little-endian uint32. */
static void ref_wblock(llmi_ttype type, const uint8_t *row, int64_t b, int *w, float *d, float *m) {
    const uint8_t *blk = row + (size_t)b * llmi_ttype_get(type)->block_bytes;
    *d = h2f(blk);
    *m = has_min(type) ? h2f(blk + 2) : 0.0f;
    if (type == LLMI_T_Q8_0) {
        for (int j = 0; j < 32; j++)
            w[j] = (int8_t)blk[2 + j];
        return;
    }
    if (type == LLMI_T_Q5_0 || type == LLMI_T_Q5_1) {
        const uint8_t *qh = blk + (type == LLMI_T_Q5_1 ? 4 : 2), *qs = qh + 4;
        const uint32_t h =
            qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
        const int off = type == LLMI_T_Q5_0 ? 16 : 0;
        for (int j = 0; j < 32; j++) {
            const int nib = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
            w[j] = (nib + 16 * (int)((h >> j) & 1)) - off;
        }
        return;
    }
    const uint8_t *qs = blk + (type == LLMI_T_Q4_1 ? 4 : 2);
    const int off = type == LLMI_T_Q4_0 ? 8 : 0;
    for (int j = 0; j < 16; j++) {
        w[j] = (qs[j] & 15) - off;
        w[j + 16] = (qs[j] >> 4) - off;
    }
}

/* Checks y (n_tok x rows) against the formula; returns the worst
 * error / bound. */
static double check_formula(const test_weight *tw, const float *x, int n_tok, const float *y,
                            const char *what) {
    const llmi_ttype type = tw->w.type;
    const int64_t rows = tw->w.rows, cols = tw->w.cols, nb = cols / 32;
    ref_block *xb = malloc(sizeof(ref_block) * (size_t)(nb * n_tok));
    for (int t = 0; t < n_tok; t++)
        ref_quantize(x + t * cols, nb, xb + t * nb);
    double worst = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)tw->w.data + (size_t)r * tw->w.row_bytes;
        for (int t = 0; t < n_tok; t++) {
            double ref = 0.0, mag = 0.0;
            for (int64_t b = 0; b < nb; b++) {
                int w[32];
                float dw, mw;
                ref_wblock(type, row, b, w, &dw, &mw);
                const ref_block *xq = xb + t * nb + b;
                long isum = 0, asum = 0;
                for (int j = 0; j < 32; j++) {
                    isum += (long)w[j] * xq->qs[j];
                    asum += labs((long)w[j] * xq->qs[j]);
                }
                const float dd = dw * llmi_f16_to_f32(xq->d); /* rounded to float */
                ref += (double)dd * (double)isum;
                mag += fabs((double)dd) * (double)asum;
                if (has_min(type)) {
                    const double ms = (double)mw * llmi_f16_to_f32(xq->s);
                    ref += ms;
                    mag += fabs(ms);
                }
            }
            const double tol = (double)(nb + 16) * 0x1p-23 * mag;
            const double got = y[t * rows + r], err = fabs(got - ref);
            if (!(err <= tol))
                fail_msg("%s: y[t=%d][r=%lld] = %.9g, formula %.9g, |err| %.3g > bound %.3g", what,
                         t, (long long)r, got, ref, err, tol);
            if (tol > 0 && err / tol > worst)
                worst = err / tol;
        }
    }
    free(xb);
    return worst;
}

/* ---- activation quantization ---------------------------------------------- */

static void *alloc_scratch(llmi_ttype wt, int64_t cols, int n_tok) {
    size_t n = llmi_act_scratch_bytes(wt, cols, n_tok);
    assert_true(n > 0);
    void *p = malloc(n);
    assert_non_null(p);
    memset(p, 0xCD, n);
    return p;
}

/* Every level gives the same bytes, and those are llama.cpp's values. */
static void test_act_quantize(void **state) {
    (void)state;
    const int64_t cols_list[] = {32, 64, 96, 160, 576, 1536};
    const llmi_ttype fams[] = {LLMI_T_Q4_0, LLMI_T_Q4_1}; /* Q8_0 and Q8_1 activations */
    const int best = llmi_kernels_best_level();
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(3, &pool), LLM_OK);
    for (size_t f = 0; f < 2; f++) {
        const int q81 = fams[f] == LLMI_T_Q4_1;
        for (size_t ci = 0; ci < sizeof cols_list / sizeof cols_list[0]; ci++) {
            const int64_t cols = cols_list[ci], nb = cols / 32;
            for (size_t k = 0; k < N_TOKS; k++) {
                const int n_tok = toks[k];
                float *x = make_x(n_tok, cols, 0xAC7ull + ci * 131 + k);
                ref_block *ref = malloc(sizeof(ref_block) * (size_t)(nb * n_tok));
                for (int t = 0; t < n_tok; t++)
                    ref_quantize(x + t * cols, nb, ref + t * nb);
                void *first = NULL;
                llmi_act a0 = {0};
                for (int level = 0; level <= best; level++) {
                    llmi_kernels_set_level(level);
                    void *scratch = alloc_scratch(fams[f], cols, n_tok);
                    llmi_act a;
                    llmi_act_prepare(level % 2 ? pool : NULL, fams[f], x, n_tok, cols, scratch, &a);
                    assert_non_null(a.q);
                    assert_true(a.f32 == x);
                    assert_int_equal(a.q_type, q81 ? LLMI_T_Q8_1 : LLMI_T_Q8_0);
                    assert_int_equal(a.n_tok, n_tok);
                    assert_int_equal(a.q_row_bytes % 64, 0);
                    assert_int_equal((uintptr_t)a.q % 64, 0);
                    for (int t = 0; t < n_tok; t++) {
                        const int8_t *qs = llmi_act_qs(&a, t);
                        const float *d = llmi_act_d(&a, t), *s = llmi_act_s(&a, t);
                        for (int64_t b = 0; b < nb; b++) {
                            const ref_block *rb = ref + t * nb + b;
                            int32_t c = 0, csum = 0;
                            for (int j = 0; j < 32; j++)
                                csum += rb->qs[j];
                            memcpy(&c, &s[b], 4); /* Q8_0: c = -128 * sum(q) */
                            if (memcmp(qs + 32 * b, rb->qs, 32) != 0 ||
                                memcmp(&d[b], &(float){llmi_f16_to_f32(rb->d)}, 4) != 0 ||
                                (q81 && memcmp(&s[b], &(float){llmi_f16_to_f32(rb->s)}, 4) != 0) ||
                                (!q81 && c != -128 * csum))
                                fail_msg("level %d cols %lld n_tok %d: token %d block %lld differs "
                                         "from llama.cpp's rounding",
                                         level, (long long)cols, n_tok, t, (long long)b);
                        }
                        /* the padding is zeroed */
                        const uint8_t *row = (const uint8_t *)qs;
                        for (size_t i = (size_t)nb * 40; i < a.q_row_bytes; i++)
                            assert_int_equal(row[i], 0);
                    }
                    if (!first) {
                        first = scratch;
                        a0 = a;
                    } else {
                        assert_memory_equal(a.q, a0.q, a.q_row_bytes * (size_t)n_tok);
                        free(scratch);
                    }
                }
                free(first);
                free(ref);
                free(x);
            }
        }
    }
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

static void test_act_types(void **state) {
    (void)state;
    assert_int_equal(llmi_act_type(LLMI_T_Q4_0), LLMI_T_Q8_0);
    assert_int_equal(llmi_act_type(LLMI_T_Q8_0), LLMI_T_Q8_0);
    assert_int_equal(llmi_act_type(LLMI_T_Q4_1), LLMI_T_Q8_1);
    assert_int_equal(llmi_act_type(LLMI_T_Q5_0), LLMI_T_Q8_0);
    assert_int_equal(llmi_act_type(LLMI_T_Q5_1), LLMI_T_Q8_1);
    assert_int_equal(llmi_act_type(LLMI_T_F32), LLMI_T_F32);
    assert_int_equal(llmi_act_type(LLMI_T_F16), LLMI_T_F32);
    assert_int_equal(llmi_act_type(LLMI_T_BF16), LLMI_T_F32);
    /* Float weights need no scratch; neither do shapes that break the
     * contract. */
    assert_int_equal(llmi_act_scratch_bytes(LLMI_T_F32, 576, 8), 0);
    assert_int_equal(llmi_act_scratch_bytes(LLMI_T_BF16, 576, 8), 0);
    assert_int_equal(llmi_act_scratch_bytes(LLMI_T_Q4_0, 40, 8), 0);
    assert_int_equal(llmi_act_scratch_bytes(LLMI_T_Q4_0, 576, 0), 0);
    assert_int_equal(llmi_act_scratch_bytes(LLMI_T_Q4_0, INT64_MAX - 31, 2), 0);
    assert_true(llmi_act_scratch_bytes(LLMI_T_Q4_1, 576, 3) >= 3 * (576 + 18 * 8));
    float x[64] = {0};
    llmi_act a;
    llmi_act_prepare(NULL, LLMI_T_F16, x, 2, 32, NULL, &a);
    assert_true(a.f32 == x && a.q == NULL && a.q_type == LLMI_T_F32 && a.n_tok == 2);
    /* Q8_1 is a known type (llama.cpp's activation type), not a weight type. */
    const llmi_ttype_info *ti = llmi_ttype_get(LLMI_T_Q8_1);
    assert_non_null(ti);
    assert_string_equal(ti->name, "Q8_1");
    assert_int_equal(ti->block, 32);
    assert_int_equal(ti->block_bytes, 36);
    assert_false(llmi_kernels_type_supported(LLMI_T_Q8_1));
}

/* quant.c's Q8_1 follows ggml's reference: roundf(x / d), s = d * sum. */
static void test_q8_1_reference(void **state) {
    (void)state;
    uint64_t seed = 0x81;
    float x[96], back[96];
    for (int i = 0; i < 96; i++)
        x[i] = 3.0f * rng_float(&seed);
    for (int i = 32; i < 64; i++)
        x[i] = 0.0f;
    llmi_block_q8_1 q[3];
    llmi_quantize_row(LLMI_T_Q8_1, x, q, 96);
    llmi_dequantize_row(LLMI_T_Q8_1, q, back, 96);
    for (int b = 0; b < 3; b++) {
        float amax = 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            amax = fmaxf(amax, fabsf(x[32 * b + j]));
            sum += q[b].qs[j];
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        assert_int_equal(q[b].d, llmi_f32_to_f16(d));
        assert_int_equal(q[b].s, llmi_f32_to_f16((float)sum * d));
        for (int j = 0; j < 32; j++) {
            assert_int_equal(q[b].qs[j], (int)roundf(x[32 * b + j] * id));
            assert_true(back[32 * b + j] == (float)q[b].qs[j] * llmi_f16_to_f32(q[b].d));
            assert_true(fabsf(back[32 * b + j] - x[32 * b + j]) <= 0.57f * d);
        }
    }
    assert_int_equal(q[1].d, 0);
    assert_int_equal(q[1].s, 0);
}

/* ---- matmul against the formula ------------------------------------------ */

static void matmul_vs_formula(llmi_ttype type) {
    const int64_t shapes[][2] = {{1, 32},   {15, 64},   {16, 32},   {17, 160}, {37, 576},
                                 {100, 96}, {33, 1536}, {20, 2080}, {9, 4160}};
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    const int best = llmi_kernels_best_level();
    const uint64_t seed0 = 0x9D07000ull + (uint64_t)type;
    print_message("type %s: seed 0x%llx, levels 0..%d, VNNI %d\n", llmi_ttype_get(type)->name,
                  (unsigned long long)seed0, best, llmi_kernels_have_vnni());
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(2, &pool), LLM_OK);
    double worst[3] = {0, 0, 0};
    for (size_t s = 0; s < n_shapes; s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1];
        test_weight tw;
        make_weight(&tw, type, rows, cols, s % 3 == 1 ? 3 : 0, seed0 + s);
        float *x = make_x(17, cols, seed0 ^ (s << 32));
        for (size_t k = 0; k < N_TOKS; k++) {
            const int n_tok = toks[k];
            for (int level = 0; level <= best; level++) {
                llmi_kernels_set_level(level);
                void *scratch = alloc_scratch(type, cols, n_tok);
                llmi_act a;
                llmi_pool *p = (k + (size_t)level) % 2 ? pool : NULL;
                llmi_act_prepare(p, type, x, n_tok, cols, scratch, &a);
                float *y = nan_buf(n_tok * rows);
                llmi_matmul_act(p, &tw.w, &a, y);
                char what[96];
                snprintf(what, sizeof what, "%s %lldx%lld n_tok=%d level=%d",
                         llmi_ttype_get(type)->name, (long long)rows, (long long)cols, n_tok,
                         level);
                const double wr = check_formula(&tw, x, n_tok, y, what);
                if (wr > worst[level])
                    worst[level] = wr;
                free(y);
                free(scratch);
            }
        }
        free(x);
        free(tw.buf);
    }
    print_message("worst |err| / bound per level: %.3f %.3f %.3f\n", worst[0], worst[1], worst[2]);
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

static void test_matmul_act_q4_0(void **state) {
    (void)state;
    matmul_vs_formula(LLMI_T_Q4_0);
}
static void test_matmul_act_q4_1(void **state) {
    (void)state;
    matmul_vs_formula(LLMI_T_Q4_1);
}
static void test_matmul_act_q5_0(void **state) {
    (void)state;
    matmul_vs_formula(LLMI_T_Q5_0);
}
static void test_matmul_act_q5_1(void **state) {
    (void)state;
    matmul_vs_formula(LLMI_T_Q5_1);
}
static void test_matmul_act_q8_0(void **state) {
    (void)state;
    matmul_vs_formula(LLMI_T_Q8_0);
}

/* Exactness: activations k * 2^-4 with integer k in [-127, 127] and 127 in
 * every block (so d_x = 2^-4, 127/amax = 16 and the quants are k exactly),
 * weight scales of few bits. Every term is then a multiple of 2^-6 below
 * 2^24 * 2^-6 in total (cols <= 1024), so float sums in any order are exact
 * and equal the double reference. */
static void test_matmul_act_exact(void **state) {
    (void)state;
    const int64_t cols_list[] = {32, 96, 160, 1024};
    const int ntoks[] = {1, 3, 8, 17};
    const float dws[] = {0.25f, -0.5f, 0.125f, 1.0f}, mws[] = {-1.5f, 0.75f, -0.375f, 3.0f};
    const int best = llmi_kernels_best_level();
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(2, &pool), LLM_OK);
    uint64_t seed = 0xE7AC7;
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const llmi_ttype type = q_types[ti];
        for (size_t ci = 0; ci < sizeof cols_list / sizeof cols_list[0]; ci++) {
            const int64_t rows = 37, cols = cols_list[ci], nb = cols / 32;
            test_weight tw;
            make_weight(&tw, type, rows, cols, 0, seed++);
            const size_t bs = llmi_ttype_get(type)->block_bytes;
            for (int64_t r = 0; r < rows; r++) {
                uint8_t *row = (uint8_t *)tw.w.data + (size_t)r * tw.w.row_bytes;
                for (int64_t b = 0; b < nb; b++) {
                    uint16_t h = llmi_f32_to_f16(dws[rng_next(&seed) % 4]);
                    memcpy(row + (size_t)b * bs, &h, 2);
                    if (has_min(type)) {
                        h = llmi_f32_to_f16(mws[rng_next(&seed) % 4]);
                        memcpy(row + (size_t)b * bs + 2, &h, 2);
                    }
                }
            }
            float *x = malloc(sizeof(float) * (size_t)(17 * cols));
            for (int64_t i = 0; i < 17 * cols; i++)
                x[i] = (float)((int)(rng_next(&seed) % 255) - 127) * 0x1p-4f;
            for (int64_t b = 0; b < 17 * nb; b++)
                x[32 * b + (int)(rng_next(&seed) % 32)] =
                    (rng_next(&seed) & 1 ? 127 : -127) * 0x1p-4f;
            for (size_t k = 0; k < sizeof ntoks / sizeof ntoks[0]; k++) {
                const int n_tok = ntoks[k];
                /* The reference, from the formula in double (exact here). */
                float *ref = nan_buf(n_tok * rows);
                for (int t = 0; t < n_tok; t++) {
                    ref_block xb[32];
                    ref_quantize(x + t * cols, nb, xb);
                    for (int64_t r = 0; r < rows; r++) {
                        const uint8_t *row =
                            (const uint8_t *)tw.w.data + (size_t)r * tw.w.row_bytes;
                        double acc = 0.0;
                        for (int64_t b = 0; b < nb; b++) {
                            int w[32];
                            float dw, mw;
                            ref_wblock(type, row, b, w, &dw, &mw);
                            long isum = 0;
                            for (int j = 0; j < 32; j++) {
                                assert_true(xb[b].qs[j] * 0x1p-4f == x[t * cols + 32 * b + j]);
                                isum += (long)w[j] * xb[b].qs[j];
                            }
                            acc += (double)(dw * llmi_f16_to_f32(xb[b].d)) * (double)isum;
                            if (has_min(type))
                                acc += (double)mw * llmi_f16_to_f32(xb[b].s);
                        }
                        ref[t * rows + r] = (float)acc;
                        assert_true((double)ref[t * rows + r] == acc); /* exact */
                    }
                }
                for (int level = 0; level <= best; level++) {
                    llmi_kernels_set_level(level);
                    void *scratch = alloc_scratch(type, cols, n_tok);
                    llmi_act a;
                    llmi_act_prepare(pool, type, x, n_tok, cols, scratch, &a);
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
            free(x);
            free(tw.buf);
        }
    }
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

/* ---- determinism ---------------------------------------------------------- */

/* 1, 2 and 3 threads, hand-split parts up to 7, and one token at a time all
 * give the same bits at a level; so does preparing on a pool. */
static void test_matmul_act_deterministic(void **state) {
    (void)state;
    const int64_t rows = 203, cols = 2080; /* 65 blocks: two segments, a lone block */
    const int n_tok = 13;
    llmi_pool *pools[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        assert_int_equal(llmi_pool_create(i + 1, &pools[i]), LLM_OK);
    const int best = llmi_kernels_best_level();
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const llmi_ttype type = q_types[ti];
        test_weight tw;
        make_weight(&tw, type, rows, cols, 0, 0xD00Dull + ti);
        float *x = make_x(n_tok, cols, 0xBEEFull + ti);
        for (int level = 0; level <= best; level++) {
            llmi_kernels_set_level(level);
            void *scratch = alloc_scratch(type, cols, n_tok);
            llmi_act a;
            llmi_act_prepare(NULL, type, x, n_tok, cols, scratch, &a);
            float *ref = nan_buf(n_tok * rows);
            llmi_matmul_act(pools[0], &tw.w, &a, ref);
            for (int i = 1; i < 3; i++) {
                void *s2 = alloc_scratch(type, cols, n_tok);
                llmi_act a2;
                llmi_act_prepare(pools[i], type, x, n_tok, cols, s2, &a2);
                assert_memory_equal(a2.q, a.q, a.q_row_bytes * (size_t)n_tok);
                float *y = nan_buf(n_tok * rows);
                llmi_matmul_act(pools[i], &tw.w, &a2, y);
                assert_memory_equal(y, ref, sizeof(float) * (size_t)(n_tok * rows));
                free(y);
                free(s2);
            }
            for (int nth = 2; nth <= 7; nth++) {
                float *y = nan_buf(n_tok * rows);
                for (int ith = nth - 1; ith >= 0; ith--)
                    llmi_matmul_act_part(&tw.w, &a, y, ith, nth);
                assert_memory_equal(y, ref, sizeof(float) * (size_t)(n_tok * rows));
                free(y);
            }
            /* Token by token, and in batches of 5: batch-invariant. */
            void *s1 = alloc_scratch(type, cols, 5);
            for (int t0 = 0; t0 < n_tok; t0 += 5) {
                for (int bs = 1; bs <= 5; bs += 4) {
                    const int nt = bs < n_tok - t0 ? bs : n_tok - t0;
                    llmi_act a1;
                    llmi_act_prepare(pools[1], type, x + t0 * cols, nt, cols, s1, &a1);
                    float *y = nan_buf(nt * rows);
                    llmi_matmul_act(pools[1], &tw.w, &a1, y);
                    assert_memory_equal(y, ref + t0 * rows, sizeof(float) * (size_t)(nt * rows));
                    free(y);
                }
            }
            free(s1);
            free(ref);
            free(scratch);
        }
        free(x);
        free(tw.buf);
    }
    llmi_kernels_set_level(-1);
    for (int i = 0; i < 3; i++)
        llmi_pool_free(pools[i]);
}

/* The GEMM kernels: every n_tok from 1 to 40 and a large one, row counts
 * that are not multiples of the 16-row groups and K that spans several
 * panels. Per level, token t's outputs must not depend on the batch it is
 * computed in (the scheduler's tests rely on it), and the AVX-512 VNNI
 * kernels must give the portable kernels' bits (same arithmetic). */
static void test_matmul_act_gemm_tiles(void **state) {
    (void)state;
    /* 1300 rows: several row super-blocks at n_tok = 100 */
    const int64_t shapes[][2] = {{1, 32},    {15, 576},  {17, 64},  {47, 2080},
                                 {100, 576}, {33, 4160}, {1300, 64}};
    const int n_big = 100;
    const int best = llmi_kernels_best_level();
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(2, &pool), LLM_OK);
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        const llmi_ttype type = q_types[ti];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t rows = shapes[si][0], cols = shapes[si][1];
            const uint64_t seed = 0x6E3A0000ull + 16 * ti + si;
            test_weight tw;
            make_weight(&tw, type, rows, cols, si % 2 ? 3 : 0, seed);
            float *x = make_x(n_big, cols, seed ^ 0xF00D);
            void *scratch = alloc_scratch(type, cols, n_big);
            /* The portable kernels on all tokens: the reference bits. */
            llmi_kernels_set_level(LLMI_KLEVEL_C);
            llmi_act a;
            llmi_act_prepare(NULL, type, x, n_big, cols, scratch, &a);
            float *ref0 = nan_buf(n_big * rows);
            llmi_matmul_act(NULL, &tw.w, &a, ref0);
            char what[96];
            snprintf(what, sizeof what, "%s %lldx%lld n_tok=%d level 0", llmi_ttype_get(type)->name,
                     (long long)rows, (long long)cols, n_big);
            check_formula(&tw, x, n_big, ref0, what);
            for (int level = 1; level <= best; level++) {
                llmi_kernels_set_level(level);
                const int same_as_c = level == LLMI_KLEVEL_AVX512 && llmi_kernels_have_vnni();
                llmi_act_prepare(pool, type, x, n_big, cols, scratch, &a);
                float *ref = nan_buf(n_big * rows);
                llmi_matmul_act(NULL, &tw.w, &a, ref); /* one thread: all rows in one part */
                if (same_as_c && memcmp(ref, ref0, sizeof(float) * (size_t)(n_big * rows)) != 0)
                    fail_msg("%s %lldx%lld level %d: not the portable kernels' bits (seed 0x%llx)",
                             llmi_ttype_get(type)->name, (long long)rows, (long long)cols, level,
                             (unsigned long long)seed);
                for (int n_tok = 1; n_tok <= 40; n_tok++) {
                    const int off = (n_tok * 7) % (n_big - n_tok + 1); /* any place in the batch */
                    llmi_act a1;
                    llmi_act_prepare(NULL, type, x + off * cols, n_tok, cols, scratch, &a1);
                    float *y = nan_buf(n_tok * rows);
                    llmi_matmul_act(n_tok % 2 ? pool : NULL, &tw.w, &a1, y);
                    for (int t = 0; t < n_tok; t++)
                        if (memcmp(y + t * rows, ref + (off + t) * rows,
                                   sizeof(float) * (size_t)rows))
                            fail_msg("%s %lldx%lld level %d: token %d differs alone in a batch of "
                                     "%d (at %d) and in one of %d (seed 0x%llx)",
                                     llmi_ttype_get(type)->name, (long long)rows, (long long)cols,
                                     level, off + t, n_tok, t, n_big, (unsigned long long)seed);
                    free(y);
                }
                free(ref);
            }
            free(ref0);
            free(scratch);
            free(x);
            free(tw.buf);
        }
    }
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

/* Float weights go through llmi_matmul, bit for bit. */
static void test_matmul_act_float(void **state) {
    (void)state;
    const llmi_ttype types[] = {LLMI_T_F32, LLMI_T_F16, LLMI_T_BF16};
    const int64_t rows = 37, cols = 100;
    uint64_t seed = 0xF10A7;
    float *src = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++)
        src[i] = rng_float(&seed);
    float *x = make_x(5, cols, 0x1234); /* cols % 32 != 0: only blocks 0-2 special */
    for (size_t i = 0; i < 3; i++) {
        const size_t rb = llmi_ttype_row_bytes(types[i], (uint64_t)cols);
        uint8_t *buf = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++)
            llmi_quantize_row(types[i], src + r * cols, buf + (size_t)r * rb, cols);
        llmi_weight w = {buf, types[i], rows, cols, rb};
        assert_int_equal(llmi_act_scratch_bytes(types[i], cols, 5), 0);
        llmi_act a;
        llmi_act_prepare(NULL, types[i], x, 5, cols, NULL, &a);
        float *y = nan_buf(5 * rows), *ref = nan_buf(5 * rows);
        llmi_matmul_act(NULL, &w, &a, y);
        llmi_matmul(NULL, &w, x, 5, ref);
        assert_memory_equal(y, ref, sizeof(float) * (size_t)(5 * rows));
        free(y), free(ref), free(buf);
    }
    free(x);
    free(src);
}

/* A Q4_1 "row" of 40 columns breaks the contract: NaN, not a wild read. */
static void test_matmul_act_bad_cols(void **state) {
    (void)state;
    uint8_t data[2 * 40] = {0};
    float x[40] = {0}, y[2] = {1, 1};
    llmi_weight w = {data, LLMI_T_Q4_1, 2, 40, 40};
    llmi_act a;
    llmi_act_prepare(NULL, LLMI_T_Q4_1, x, 1, 40, NULL, &a);
    assert_null(a.q);
    llmi_matmul_act(NULL, &w, &a, y);
    assert_true(isnan(y[0]) && isnan(y[1]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_act_types),
        cmocka_unit_test(test_q8_1_reference),
        cmocka_unit_test(test_act_quantize),
        cmocka_unit_test(test_matmul_act_q4_0),
        cmocka_unit_test(test_matmul_act_q4_1),
        cmocka_unit_test(test_matmul_act_q5_0),
        cmocka_unit_test(test_matmul_act_q5_1),
        cmocka_unit_test(test_matmul_act_q8_0),
        cmocka_unit_test(test_matmul_act_exact),
        cmocka_unit_test(test_matmul_act_deterministic),
        cmocka_unit_test(test_matmul_act_gemm_tiles),
        cmocka_unit_test(test_matmul_act_float),
        cmocka_unit_test(test_matmul_act_bad_cols),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
