/* Kernels and thread pool.
 *
 * Matmul: every weight type at every kernel level the CPU has, against a
 * double-precision reference computed from llmi_dequantize_row. Weights are
 * random, non-zero and quantized with llmi_quantize_row; seeds are fixed and
 * printed. Outputs are poisoned with NaN first so an unwritten element fails.
 *
 * Error bound: |y - ref| <= (cols/32 + 48) * 2^-23 * sum_c |W[r][c] x[c]|.
 * A product passes through at most cols/32 chunk accumulations, ~10 roundings
 * inside a chunk and the final reduction, and up to 31 more for the scalar
 * tail of float rows: (cols/32 + 45) roundings of relative size 2^-24, here
 * with a factor 2 of margin. The dequantization differs from the reference's
 * by at most an ulp of |d*q| + |m| (the kernels fuse d*q + m), which the
 * margin covers for these weights. One wrong element costs about
 * 1/cols of sum|Wx|, far above the bound. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/threadpool.h"
#include "core/core.h"
#include "core/quant.h"
#include "core/ttype.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1], never exactly 0. */
static float rng_float(uint64_t *s) {
    float f = (float)((double)(rng_next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    return f == 0.0f ? 0.5f : f;
}

static const llmi_ttype all_types[] = {LLMI_T_F32,  LLMI_T_F16,  LLMI_T_BF16, LLMI_T_Q4_0,
                                       LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1, LLMI_T_Q8_0};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

static int is_block_type(llmi_ttype t) {
    return t == LLMI_T_Q4_0 || t == LLMI_T_Q4_1 || t == LLMI_T_Q5_0 || t == LLMI_T_Q5_1 ||
           t == LLMI_T_Q8_0;
}

typedef struct {
    llmi_weight w;
    uint8_t *buf;
    double *deq; /* rows x cols, the reference's weights */
} test_weight;

/* Random weights of `type`; row_bytes gets `pad` extra bytes so rows are not
 * packed back to back (and, with odd pads, not aligned). */
static void make_weight(test_weight *tw, llmi_ttype type, int64_t rows, int64_t cols, size_t pad,
                        uint64_t seed) {
    size_t rb = llmi_ttype_row_bytes(type, (uint64_t)cols);
    assert_true(rb > 0);
    tw->w = (llmi_weight){0};
    tw->w.type = type;
    tw->w.rows = rows;
    tw->w.cols = cols;
    tw->w.row_bytes = rb + pad;
    tw->buf = malloc(tw->w.row_bytes * (size_t)rows + 1);
    tw->deq = malloc(sizeof(double) * (size_t)(rows * cols));
    float *src = malloc(sizeof(float) * (size_t)cols);
    float *back = malloc(sizeof(float) * (size_t)cols);
    uint8_t *tmp = malloc(rb); /* aligned staging for the reference code */
    assert_non_null(tw->buf);
    assert_non_null(tw->deq);
    memset(tw->buf, 0xA5, tw->w.row_bytes * (size_t)rows + 1);
    /* Odd pads also shift the data by one byte: kernels must not assume
     * alignment beyond what the block layout gives. */
    uint8_t *base = tw->buf + (pad & 1);
    for (int64_t r = 0; r < rows; r++) {
        /* Rows of different magnitude, with a non-zero offset so that Q4_1's
         * m matters. */
        float scale = 0.25f + (float)(r % 7), off = 0.1f * (float)(r % 3);
        for (int64_t c = 0; c < cols; c++)
            src[c] = scale * (rng_float(&seed) + off);
        llmi_quantize_row(type, src, tmp, cols);
        llmi_dequantize_row(type, tmp, back, cols);
        memcpy(base + (size_t)r * tw->w.row_bytes, tmp, rb);
        for (int64_t c = 0; c < cols; c++)
            tw->deq[r * cols + c] = back[c];
    }
    tw->w.data = base;
    free(src);
    free(back);
    free(tmp);
}

static void free_weight(test_weight *tw) {
    free(tw->buf);
    free(tw->deq);
}

static float *make_x(int64_t n, uint64_t seed) {
    float *x = malloc(sizeof(float) * (size_t)n);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_float(&seed);
    return x;
}

static float *nan_buf(int64_t n) {
    float *y = malloc(sizeof(float) * (size_t)n);
    assert_non_null(y);
    for (int64_t i = 0; i < n; i++)
        y[i] = NAN;
    return y;
}

/* Checks y against the double reference; returns the worst error/bound. */
static double check_matmul(const test_weight *tw, const float *x, int n_tok, const float *y,
                           const char *what) {
    const int64_t rows = tw->w.rows, cols = tw->w.cols;
    const double tol = (double)(cols / 32 + 48) * 0x1p-23;
    double worst = 0.0;
    for (int t = 0; t < n_tok; t++) {
        for (int64_t r = 0; r < rows; r++) {
            double ref = 0.0, mag = 0.0;
            for (int64_t c = 0; c < cols; c++) {
                double p = tw->deq[r * cols + c] * (double)x[t * cols + c];
                ref += p;
                mag += fabs(p);
            }
            double got = y[t * rows + r];
            double err = fabs(got - ref);
            if (!(err <= tol * mag)) {
                fail_msg("%s: y[t=%d][r=%lld] = %.9g, reference %.9g, |err| %.3g > bound %.3g",
                         what, t, (long long)r, got, ref, err, tol * mag);
            }
            if (mag > 0 && err / (tol * mag) > worst)
                worst = err / (tol * mag);
        }
    }
    return worst;
}

/* ---- matmul against the reference --------------------------------------- */

static void matmul_vs_reference(llmi_ttype type) {
    const int64_t shapes_q[][2] = {{1, 32},   {15, 64},  {16, 32},   {17, 160},
                                   {37, 576}, {100, 96}, {300, 1024}};
    const int64_t shapes_f[][2] = {{1, 1},    {3, 7},    {17, 40},   {16, 33},
                                   {37, 576}, {5, 1000}, {130, 1024}};
    const int toks[] = {1, 2, 3, 5, 8, 17};
    const int best = llmi_kernels_best_level();
    const uint64_t seed0 = 0x5EED0000ull + (uint64_t)type;
    print_message("type %s: seed 0x%llx, levels 0..%d\n", llmi_ttype_get(type)->name,
                  (unsigned long long)seed0, best);
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(2, &pool), LLM_OK);
    for (size_t s = 0; s < 7; s++) {
        const int64_t rows = is_block_type(type) ? shapes_q[s][0] : shapes_f[s][0];
        const int64_t cols = is_block_type(type) ? shapes_q[s][1] : shapes_f[s][1];
        test_weight tw;
        make_weight(&tw, type, rows, cols, s % 3 == 1 ? 3 : 0, seed0 + s);
        float *x = make_x(17 * cols, seed0 ^ (s << 32));
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            const int n_tok = toks[k];
            for (int level = 0; level <= best; level++) {
                llmi_kernels_set_level(level);
                assert_int_equal(llmi_kernels_level(), level);
                float *y = nan_buf(n_tok * rows);
                char what[96];
                snprintf(what, sizeof what, "%s %lldx%lld n_tok=%d level=%d",
                         llmi_ttype_get(type)->name, (long long)rows, (long long)cols, n_tok,
                         level);
                /* Alternate between the pool and a plain call. */
                if ((k + (size_t)level) % 2) {
                    llmi_matmul(pool, &tw.w, x, n_tok, y);
                } else {
                    llmi_matmul(NULL, &tw.w, x, n_tok, y);
                }
                check_matmul(&tw, x, n_tok, y, what);
                free(y);
            }
        }
        free(x);
        free_weight(&tw);
    }
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

static void test_matmul_f32(void **state) {
    (void)state;
    matmul_vs_reference(LLMI_T_F32);
}
static void test_matmul_f16(void **state) {
    (void)state;
    matmul_vs_reference(LLMI_T_F16);
}
static void test_matmul_bf16(void **state) {
    (void)state;
    matmul_vs_reference(LLMI_T_BF16);
}
static void test_matmul_q4_0(void **state) {
    (void)state;
    matmul_vs_reference(LLMI_T_Q4_0);
}
static void test_matmul_q4_1(void **state) {
    (void)state;
    matmul_vs_reference(LLMI_T_Q4_1);
}
static void test_matmul_q5_0(void **state) {
    (void)state;
    matmul_vs_reference(LLMI_T_Q5_0);
}
static void test_matmul_q5_1(void **state) {
    (void)state;
    matmul_vs_reference(LLMI_T_Q5_1);
}
static void test_matmul_q8_0(void **state) {
    (void)state;
    matmul_vs_reference(LLMI_T_Q8_0);
}

/* ---- determinism -------------------------------------------------------- */

/* 1, 2 and 3 threads (and hand-split parts up to 7) give bitwise identical
 * results, and so does computing one token at a time: each (row, token) is
 * computed by one thread with the same arithmetic. */
static void test_matmul_deterministic(void **state) {
    (void)state;
    const int64_t rows = 203, cols = 256;
    const int n_tok = 13;
    llmi_pool *pools[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        assert_int_equal(llmi_pool_create(i + 1, &pools[i]), LLM_OK);
    const int best = llmi_kernels_best_level();
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        test_weight tw;
        make_weight(&tw, all_types[ti], rows, cols, 0, 0xD00Dull + ti);
        float *x = make_x(n_tok * cols, 0xBEEFull + ti);
        for (int level = 0; level <= best; level++) {
            llmi_kernels_set_level(level);
            float *ref = nan_buf(n_tok * rows);
            llmi_matmul(pools[0], &tw.w, x, n_tok, ref);
            for (int i = 1; i < 3; i++) {
                float *y = nan_buf(n_tok * rows);
                llmi_matmul(pools[i], &tw.w, x, n_tok, y);
                assert_memory_equal(y, ref, sizeof(float) * (size_t)(n_tok * rows));
                free(y);
            }
            for (int nth = 2; nth <= 7; nth++) {
                float *y = nan_buf(n_tok * rows);
                for (int ith = nth - 1; ith >= 0; ith--)
                    llmi_matmul_part(&tw.w, x, n_tok, y, ith, nth);
                assert_memory_equal(y, ref, sizeof(float) * (size_t)(n_tok * rows));
                free(y);
            }
            /* Token by token: batch-invariant. */
            float *y1 = nan_buf(rows);
            for (int t = 0; t < n_tok; t++) {
                llmi_matmul(pools[1], &tw.w, x + t * cols, 1, y1);
                assert_memory_equal(y1, ref + t * rows, sizeof(float) * (size_t)rows);
            }
            free(y1);
            free(ref);
        }
        free(x);
        free_weight(&tw);
    }
    llmi_kernels_set_level(-1);
    for (int i = 0; i < 3; i++)
        llmi_pool_free(pools[i]);
}

/* The GEMM kernels: every n_tok from 1 to 40 and a large one, row counts
 * that are not multiples of the row tile, columns with a partial last step.
 * Per level, token t's outputs must not depend on the batch it is computed
 * in; the AVX-512 kernels must give the portable kernels' bits (the same
 * arithmetic), except for Q5 weights, whose f32 path dequantizes and takes
 * each level's own llmi_dot_f32. */
static void test_matmul_gemm_tiles(void **state) {
    (void)state;
    /* The last shapes span several row blocks of the AVX-512 kernels. */
    const int64_t shapes_q[][2] = {{1, 32}, {7, 576}, {17, 64}, {45, 1536}, {130, 96}, {260, 64}};
    const int64_t shapes_f[][2] = {{1, 7}, {7, 576}, {17, 40}, {45, 1000}, {130, 33}, {260, 40}};
    const int n_big = 100;
    const int best = llmi_kernels_best_level();
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(2, &pool), LLM_OK);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const llmi_ttype type = all_types[ti];
        for (size_t si = 0; si < sizeof shapes_q / sizeof shapes_q[0]; si++) {
            const int64_t rows = is_block_type(type) ? shapes_q[si][0] : shapes_f[si][0];
            const int64_t cols = is_block_type(type) ? shapes_q[si][1] : shapes_f[si][1];
            const uint64_t seed = 0x7113E000ull + 16 * ti + si;
            test_weight tw;
            make_weight(&tw, type, rows, cols, si % 2 ? 3 : 0, seed);
            float *x = make_x(n_big * cols, seed ^ 0xF00D);
            llmi_kernels_set_level(LLMI_KLEVEL_C);
            float *ref0 = nan_buf(n_big * rows);
            llmi_matmul(NULL, &tw.w, x, n_big, ref0);
            char what[96];
            snprintf(what, sizeof what, "%s %lldx%lld n_tok=%d level 0", llmi_ttype_get(type)->name,
                     (long long)rows, (long long)cols, n_big);
            check_matmul(&tw, x, n_big, ref0, what);
            for (int level = 1; level <= best; level++) {
                llmi_kernels_set_level(level);
                float *ref = nan_buf(n_big * rows);
                llmi_matmul(NULL, &tw.w, x, n_big, ref); /* one thread: all rows in one part */
                if (level == LLMI_KLEVEL_AVX512 && type != LLMI_T_Q5_0 && type != LLMI_T_Q5_1 &&
                    memcmp(ref, ref0, sizeof(float) * (size_t)(n_big * rows)) != 0)
                    fail_msg("%s %lldx%lld level %d: not the portable kernels' bits (seed 0x%llx)",
                             llmi_ttype_get(type)->name, (long long)rows, (long long)cols, level,
                             (unsigned long long)seed);
                for (int n_tok = 1; n_tok <= 40; n_tok++) {
                    const int off = (n_tok * 7) % (n_big - n_tok + 1); /* any place in the batch */
                    float *y = nan_buf(n_tok * rows);
                    llmi_matmul(n_tok % 2 ? pool : NULL, &tw.w, x + off * cols, n_tok, y);
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
            free(x);
            free_weight(&tw);
        }
    }
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

/* A Q4_0 "row" of 40 columns breaks the contract: NaN, not a wild read. */
static void test_matmul_bad_cols(void **state) {
    (void)state;
    uint8_t data[2 * 40] = {0};
    float x[40] = {0}, y[2] = {1, 1};
    llmi_weight w = {data, LLMI_T_Q4_0, 2, 40, 40};
    llmi_matmul(NULL, &w, x, 1, y);
    assert_true(isnan(y[0]) && isnan(y[1]));
}

static void test_kernel_levels(void **state) {
    (void)state;
    const int best = llmi_kernels_best_level();
    assert_true(best >= LLMI_KLEVEL_C && best <= LLMI_KLEVEL_AVX512);
    print_message("best kernel level: %d\n", best);
    llmi_kernels_set_level(99);
    assert_int_equal(llmi_kernels_level(), best);
    llmi_kernels_set_level(0);
    assert_int_equal(llmi_kernels_level(), 0);
    llmi_kernels_set_level(-1);
    assert_int_equal(llmi_kernels_level(), best);
    for (size_t i = 0; i < N_TYPES; i++)
        assert_true(llmi_kernels_type_supported(all_types[i]));
    assert_false(llmi_kernels_type_supported(10)); /* Q2_K */
    assert_false(llmi_kernels_type_supported(1000));
}

/* ---- row helpers -------------------------------------------------------- */

static const int helper_sizes[] = {1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 576, 1001};
#define N_HELPER_SIZES (sizeof helper_sizes / sizeof helper_sizes[0])

static void test_dot_axpy(void **state) {
    (void)state;
    const int best = llmi_kernels_best_level();
    for (int level = 0; level <= best; level++) {
        llmi_kernels_set_level(level);
        for (size_t k = 0; k < N_HELPER_SIZES; k++) {
            const int n = helper_sizes[k];
            float *a = make_x(n, 11 + (uint64_t)n), *b = make_x(n, 22 + (uint64_t)n);
            double ref = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                ref += (double)a[i] * b[i];
                mag += fabs((double)a[i] * b[i]);
            }
            /* Same bound as matmul, with n/8 lane accumulations. */
            double got = llmi_dot_f32(a, b, n);
            assert_true(fabs(got - ref) <= (n / 8 + 16) * 0x1p-23 * mag);

            float *y = make_x(n + 1, 33 + (uint64_t)n);
            float *y0 = malloc(sizeof(float) * (size_t)(n + 1));
            memcpy(y0, y, sizeof(float) * (size_t)(n + 1));
            llmi_axpy_f32(y, -0.75f, a, n);
            for (int i = 0; i < n; i++) {
                double r = (double)y0[i] - 0.75 * a[i];
                assert_true(fabs(y[i] - r) <= 0x1p-23 * (fabs(y0[i]) + fabs(a[i])));
            }
            assert_true(y[n] == y0[n]); /* nothing past the end */
            free(a), free(b), free(y), free(y0);
        }
        assert_true(llmi_dot_f32(NULL, NULL, 0) == 0.0f);
    }
    llmi_kernels_set_level(-1);
}

/* f16 / bf16 rows (the KV cache): conversions give llmi_f32_to_f16/bf16's
 * bits at every level; dot products and axpys with f16/bf16 rows against
 * double references on the widened elements, with llmi_dot_f32's bounds
 * (the widening is exact, so only the f32 accumulation rounds). */

/* Inputs that exercise every path of the conversions: random magnitudes
 * from 2^-30 to 2^20 (f16 subnormals below 2^-14, overflow from 65520),
 * exact halfway cases for both types, +-0, +-inf and the f16 limits. */
static float *conv_inputs(int n, uint64_t seed) {
    static const float special[] = {
        0.0f,           -0.0f,      INFINITY,        -INFINITY,       65504.0f,
        65519.0f,       65520.0f,   -65520.0f,       0x1p-14f,        0x1p-24f,
        0x1p-25f,       0x1.8p-24f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1.0f + 0x1p-8f,
        1.0f + 0x3p-8f, 0x1p-130f,  3.0e38f};
    const int n_special = (int)(sizeof special / sizeof special[0]);
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    uint64_t s = seed;
    for (int i = 0; i < n; i++) {
        if (i % 5 == 3) {
            x[i] = special[(i / 5) % n_special];
        } else {
            int e = (int)(rng_next(&s) % 51) - 30;
            x[i] = ldexpf(rng_float(&s), e);
        }
    }
    return x;
}

static void test_f16_bf16_rows(void **state) {
    (void)state;
    const int best = llmi_kernels_best_level();
    assert_null(llmi_row_ops_get(LLMI_T_Q4_1));
    for (int level = 0; level <= best; level++) {
        llmi_kernels_set_level(level);
        const llmi_row_ops *o32 = llmi_row_ops_get(LLMI_T_F32);
        const llmi_row_ops *o16 = llmi_row_ops_get(LLMI_T_F16);
        const llmi_row_ops *ob16 = llmi_row_ops_get(LLMI_T_BF16);
        assert_non_null(o32);
        assert_non_null(o16);
        assert_non_null(ob16);
        for (size_t k = 0; k < N_HELPER_SIZES; k++) {
            const int n = helper_sizes[k];
            /* Conversions: bit-exact against the scalar ones, nothing
             * written past the end. */
            float *c = conv_inputs(n, 44 + (uint64_t)n);
            uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(n + 1));
            uint16_t *hb = malloc(sizeof(uint16_t) * (size_t)(n + 1));
            h[n] = hb[n] = 0xabcd;
            llmi_f32_to_f16_row(c, h, n);
            llmi_f32_to_bf16_row(c, hb, n);
            for (int i = 0; i < n; i++) {
                if (h[i] != llmi_f32_to_f16(c[i]) || hb[i] != llmi_f32_to_bf16(c[i]))
                    fail_msg("level %d n %d: %a converts to f16 %04x bf16 %04x, want %04x %04x",
                             level, n, (double)c[i], h[i], hb[i], llmi_f32_to_f16(c[i]),
                             llmi_f32_to_bf16(c[i]));
            }
            assert_true(h[n] == 0xabcd && hb[n] == 0xabcd);
            /* Through the ops table too. */
            uint16_t *h2 = malloc(sizeof(uint16_t) * (size_t)n);
            o16->store(h2, c, n);
            assert_memory_equal(h2, h, sizeof(uint16_t) * (size_t)n);
            ob16->store(h2, c, n);
            assert_memory_equal(h2, hb, sizeof(uint16_t) * (size_t)n);
            float *c2 = malloc(sizeof(float) * (size_t)n);
            o32->store(c2, c, n);
            assert_memory_equal(c2, c, sizeof(float) * (size_t)n);
            free(c), free(c2), free(h2);

            /* Dot products with rows of values in [-1, 1]. */
            float *a = make_x(n, 55 + (uint64_t)n), *b = make_x(n, 66 + (uint64_t)n);
            llmi_f32_to_f16_row(b, h, n);
            llmi_f32_to_bf16_row(b, hb, n);
            double r16 = 0, rb16 = 0, m16 = 0, mb16 = 0;
            for (int i = 0; i < n; i++) {
                double w16 = llmi_f16_to_f32(h[i]), wb16 = llmi_bf16_to_f32(hb[i]);
                r16 += (double)a[i] * w16;
                rb16 += (double)a[i] * wb16;
                m16 += fabs((double)a[i] * w16);
                mb16 += fabs((double)a[i] * wb16);
            }
            const float d16 = llmi_dot_f32_f16(a, h, n), db16 = llmi_dot_f32_bf16(a, hb, n);
            if (fabs(d16 - r16) > (n / 8 + 16) * 0x1p-23 * m16 ||
                fabs(db16 - rb16) > (n / 8 + 16) * 0x1p-23 * mb16)
                fail_msg("level %d n %d: dot f16 %g (want %g), bf16 %g (want %g)", level, n,
                         (double)d16, r16, (double)db16, rb16);
            /* The ops table holds the same functions, and for f32 the same
             * kernels as llmi_dot_f32 / llmi_axpy_f32: identical results. */
            assert_true(o16->dot(a, h, n) == d16);
            assert_true(ob16->dot(a, hb, n) == db16);
            assert_true(o32->dot(a, b, n) == llmi_dot_f32(a, b, n));

            /* axpy: y += a * x, nothing past the end. */
            float *y0 = make_x(n + 1, 77 + (uint64_t)n);
            float *y = malloc(sizeof(float) * (size_t)(n + 1));
            float *yb = malloc(sizeof(float) * (size_t)(n + 1));
            memcpy(y, y0, sizeof(float) * (size_t)(n + 1));
            memcpy(yb, y0, sizeof(float) * (size_t)(n + 1));
            llmi_axpy_f16(y, -0.75f, h, n);
            llmi_axpy_bf16(yb, -0.75f, hb, n);
            for (int i = 0; i < n; i++) {
                double p16 = -0.75 * llmi_f16_to_f32(h[i]), pb16 = -0.75 * llmi_bf16_to_f32(hb[i]);
                if (fabs(y[i] - (y0[i] + p16)) > 0x1p-23 * (fabs(y0[i]) + fabs(p16)) ||
                    fabs(yb[i] - (y0[i] + pb16)) > 0x1p-23 * (fabs(y0[i]) + fabs(pb16)))
                    fail_msg("level %d n %d: axpy element %d", level, n, i);
            }
            assert_true(y[n] == y0[n] && yb[n] == y0[n]);
            float *y2 = malloc(sizeof(float) * (size_t)(n + 1));
            memcpy(y2, y0, sizeof(float) * (size_t)(n + 1));
            o16->axpy(y2, -0.75f, h, n);
            assert_memory_equal(y2, y, sizeof(float) * (size_t)n);
            memcpy(y2, y0, sizeof(float) * (size_t)(n + 1));
            ob16->axpy(y2, -0.75f, hb, n);
            assert_memory_equal(y2, yb, sizeof(float) * (size_t)n);
            memcpy(y, y0, sizeof(float) * (size_t)(n + 1));
            memcpy(y2, y0, sizeof(float) * (size_t)(n + 1));
            llmi_axpy_f32(y, 0.3f, a, n);
            o32->axpy(y2, 0.3f, a, n);
            assert_memory_equal(y2, y, sizeof(float) * (size_t)n);
            free(a), free(b), free(h), free(hb), free(y0), free(y), free(yb), free(y2);
        }
        /* Widening is exact for every one of the 65536 patterns: y = 0 + 1 * x
         * is x (up to the sign of zero), NaN for NaN. */
        uint16_t *all = malloc(sizeof(uint16_t) * 65536);
        float *wide = malloc(sizeof(float) * 65536);
        for (int i = 0; i < 65536; i++)
            all[i] = (uint16_t)i;
        for (int bf = 0; bf < 2; bf++) {
            memset(wide, 0, sizeof(float) * 65536);
            (bf ? ob16 : o16)->axpy(wide, 1.0f, all, 65536);
            for (int i = 0; i < 65536; i++) {
                float want = bf ? llmi_bf16_to_f32(all[i]) : llmi_f16_to_f32(all[i]);
                if (isnan(want) ? !isnan(wide[i]) : wide[i] != want)
                    fail_msg("level %d: %s %04x widens to %a, want %a", level, bf ? "bf16" : "f16",
                             i, (double)wide[i], (double)want);
            }
        }
        free(all), free(wide);
        /* NaN stays NaN (payloads may differ between levels). */
        float nanrow[17];
        uint16_t hn[17];
        for (int i = 0; i < 17; i++)
            nanrow[i] = i % 2 ? NAN : -NAN;
        llmi_f32_to_f16_row(nanrow, hn, 17);
        for (int i = 0; i < 17; i++)
            assert_true(isnan(llmi_f16_to_f32(hn[i])));
        llmi_f32_to_bf16_row(nanrow, hn, 17);
        for (int i = 0; i < 17; i++)
            assert_true(isnan(llmi_bf16_to_f32(hn[i])));
        assert_true(llmi_dot_f32_f16(NULL, NULL, 0) == 0.0f);
        assert_true(llmi_dot_f32_bf16(NULL, NULL, 0) == 0.0f);
        llmi_f32_to_f16_row(NULL, NULL, 0);
        llmi_axpy_bf16(NULL, 1.0f, NULL, 0);
    }
    llmi_kernels_set_level(-1);
}

static void test_rmsnorm(void **state) {
    (void)state;
    const int best = llmi_kernels_best_level();
    for (int level = 0; level <= best; level++) {
        llmi_kernels_set_level(level);
        for (size_t k = 0; k < N_HELPER_SIZES; k++) {
            const int n = helper_sizes[k];
            float *x = make_x(n, 44 + (uint64_t)n), *w = make_x(n, 55 + (uint64_t)n);
            for (int i = 0; i < n; i++)
                x[i] *= 100.0f; /* scale must not matter */
            float *out = nan_buf(n);
            const float eps = 1e-5f;
            double ss = 0;
            for (int i = 0; i < n; i++)
                ss += (double)x[i] * x[i];
            double scale = 1.0 / sqrt(ss / n + eps);
            llmi_rmsnorm(out, x, w, n, eps);
            for (int i = 0; i < n; i++) {
                double r = x[i] * scale * w[i];
                assert_true(fabs(out[i] - r) <= 4 * 0x1p-24 * fabs(r) + 1e-30);
            }
            llmi_rmsnorm(x, x, w, n, eps); /* in place */
            assert_memory_equal(x, out, sizeof(float) * (size_t)n);
            free(x), free(w), free(out);
        }
    }
    llmi_kernels_set_level(-1);
    /* All zeros: eps keeps it finite. */
    float z[4] = {0, 0, 0, 0}, w[4] = {1, 1, 1, 1}, o[4];
    llmi_rmsnorm(o, z, w, 4, 1e-6f);
    for (int i = 0; i < 4; i++)
        assert_true(o[i] == 0.0f);
}

static void test_softmax(void **state) {
    (void)state;
    for (size_t k = 0; k < N_HELPER_SIZES; k++) {
        const int n = helper_sizes[k];
        float *x = make_x(n, 66 + (uint64_t)n);
        for (int i = 0; i < n; i++)
            x[i] *= 30.0f;
        if (n > 3)
            x[2] = -INFINITY; /* a masked position */
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++)
            mx = x[i] > mx ? x[i] : mx;
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int i = 0; i < n; i++)
            sum += ref[i] = exp((double)x[i] - mx);
        float *xin = malloc(sizeof(float) * (size_t)n);
        memcpy(xin, x, sizeof(float) * (size_t)n);
        llmi_softmax_inplace(x, n);
        double total = 0;
        for (int i = 0; i < n; i++) {
            double r = ref[i] / sum;
            /* x - max is rounded to float, an absolute error up to
             * 2^-24 |x - max| that exp turns into a relative one; expf and
             * the normalization add a few ulp. */
            double z = fabs((double)xin[i] - mx);
            double bound = r == 0.0 ? 0.0 : (16 + z) * 0x1p-24 * r + 1e-38;
            if (!(fabs(x[i] - r) <= bound))
                fail_msg("softmax n=%d: x[%d] = %.9g gives %.9g, reference %.9g", n, i, xin[i],
                         x[i], r);
            total += x[i];
        }
        if (n > 3)
            assert_true(x[2] == 0.0f);
        assert_true(fabs(total - 1.0) <= 1e-5);
        free(x), free(ref), free(xin);
    }
    /* Huge logits must not overflow. */
    float big[3] = {1000.0f, 999.0f, -1000.0f};
    llmi_softmax_inplace(big, 3);
    assert_true(fabs(big[0] - 1.0 / (1.0 + exp(-1.0))) < 1e-6);
    assert_true(big[2] == 0.0f);
    /* Fully masked: uniform rather than NaN. */
    float masked[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    llmi_softmax_inplace(masked, 4);
    for (int i = 0; i < 4; i++)
        assert_true(masked[i] == 0.25f);
    llmi_softmax_inplace(NULL, 0);
}

static void test_silu_mul_add(void **state) {
    (void)state;
    const int n = 1001;
    float *g = make_x(n, 77), *u = make_x(n, 88);
    for (int i = 0; i < n; i++)
        g[i] *= 20.0f;
    g[0] = -200.0f; /* exp(200) overflows: the result must be -0, not NaN */
    g[1] = 200.0f;
    float *g0 = malloc(sizeof(float) * n);
    memcpy(g0, g, sizeof(float) * n);
    llmi_silu_mul(g, u, n);
    for (int i = 0; i < n; i++) {
        double gg = g0[i];
        double r = gg / (1.0 + exp(-gg)) * u[i];
        assert_true(fabs(g[i] - r) <= 8 * 0x1p-24 * fabs(r) + 1e-37);
    }
    float *y = make_x(n, 99);
    float *y0 = malloc(sizeof(float) * n);
    memcpy(y0, y, sizeof(float) * n);
    llmi_add_inplace(y, u, n);
    for (int i = 0; i < n; i++)
        assert_true(y[i] == y0[i] + u[i]);
    free(g), free(u), free(g0), free(y), free(y0);
}

/* ---- thread pool -------------------------------------------------------- */

#define MAX_POOL 8

struct pool_probe {
    atomic_int seen[MAX_POOL];
    int plain[MAX_POOL]; /* non-atomic writes: the run must publish them */
    atomic_int bad_nth;
    int run;
    int nth;
};

static void probe_task(void *ctx, int ith, int nth) {
    struct pool_probe *p = ctx;
    if (nth != p->nth || ith < 0 || ith >= nth) {
        atomic_fetch_add(&p->bad_nth, 1);
        return;
    }
    atomic_fetch_add(&p->seen[ith], 1);
    p->plain[ith] = p->run;
}

static void run_probe(llmi_pool *pool, int n, int runs, int sleep_us) {
    struct pool_probe p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < MAX_POOL; i++)
        atomic_init(&p.seen[i], 0);
    atomic_init(&p.bad_nth, 0);
    p.nth = n;
    for (int r = 1; r <= runs; r++) {
        p.run = r;
        llmi_pool_run(pool, probe_task, &p);
        for (int i = 0; i < n; i++) {
            assert_int_equal(atomic_load(&p.seen[i]), r); /* exactly once per run */
            assert_int_equal(p.plain[i], r);
        }
        if (sleep_us) {
            struct timespec ts = {0, sleep_us * 1000L};
            nanosleep(&ts, NULL);
        }
    }
    for (int i = n; i < MAX_POOL; i++)
        assert_int_equal(atomic_load(&p.seen[i]), 0);
    assert_int_equal(atomic_load(&p.bad_nth), 0);
}

static void test_pool_runs(void **state) {
    (void)state;
    for (int n = 1; n <= MAX_POOL; n++) {
        llmi_pool *pool = NULL;
        assert_int_equal(llmi_pool_create(n, &pool), LLM_OK);
        assert_non_null(pool);
        assert_int_equal(llmi_pool_size(pool), n);
        /* Back to back (workers spinning), then spaced out past the spin
         * window so that workers go to sleep and must be woken. */
        run_probe(pool, n, n <= 4 ? 20000 : 2000, 0);
        run_probe(pool, n, 10, 1000);
        llmi_pool_free(pool);
    }
    /* A NULL pool runs inline as one thread. */
    assert_int_equal(llmi_pool_size(NULL), 1);
    run_probe(NULL, 1, 3, 0);
    llmi_pool_free(NULL);
}

/* Share 0 (the caller's) waits until every other share has started, which
 * only workers can do: proves that workers run shares, including right after
 * sleeping (runs spaced past the spin window must wake them up). */
struct pool_wait {
    atomic_int started;
    atomic_int timeouts;
};

static void wait_task(void *ctx, int ith, int nth) {
    struct pool_wait *w = ctx;
    if (ith != 0) {
        atomic_fetch_add(&w->started, 1);
        return;
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (atomic_load(&w->started) < nth - 1) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 20) { /* a lost wake-up; fail, don't hang */
            atomic_fetch_add(&w->timeouts, 1);
            return;
        }
    }
}

static void test_pool_workers_run(void **state) {
    (void)state;
    for (int n = 2; n <= 4; n++) {
        llmi_pool *pool = NULL;
        assert_int_equal(llmi_pool_create(n, &pool), LLM_OK);
        for (int r = 0; r < 220; r++) {
            struct pool_wait w;
            atomic_init(&w.started, 0);
            atomic_init(&w.timeouts, 0);
            llmi_pool_run(pool, wait_task, &w);
            assert_int_equal(atomic_load(&w.timeouts), 0);
            assert_int_equal(atomic_load(&w.started), n - 1);
            if (r >= 200) {
                struct timespec ts = {0, 2000000};
                nanosleep(&ts, NULL);
            }
        }
        llmi_pool_free(pool);
    }
}

static void test_pool_args(void **state) {
    (void)state;
    llmi_pool *pool = (llmi_pool *)&pool;
    assert_int_equal(llmi_pool_create(0, &pool), LLM_ERR_INVALID_ARGUMENT);
    assert_null(pool);
    assert_int_equal(llmi_pool_create(-3, &pool), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llmi_pool_create(LLMI_POOL_MAX_THREADS + 1, &pool), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llmi_pool_create(2, NULL), LLM_ERR_INVALID_ARGUMENT);
    /* Failing allocations leave nothing behind (the sanitizer build checks
     * for leaks). */
    for (uint64_t k = 1; k <= 3; k++) {
        llmi_alloc_fail_after(k);
        llm_status st = llmi_pool_create(3, &pool);
        llmi_alloc_fail_after(0);
        if (st == LLM_OK) {
            llmi_pool_free(pool);
        } else {
            assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
            assert_null(pool);
        }
    }
    /* Created and freed without ever running. */
    assert_int_equal(llmi_pool_create(4, &pool), LLM_OK);
    llmi_pool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_levels),     cmocka_unit_test(test_matmul_f32),
        cmocka_unit_test(test_matmul_f16),        cmocka_unit_test(test_matmul_bf16),
        cmocka_unit_test(test_matmul_q4_0),       cmocka_unit_test(test_matmul_q4_1),
        cmocka_unit_test(test_matmul_q5_0),       cmocka_unit_test(test_matmul_q5_1),
        cmocka_unit_test(test_matmul_q8_0),       cmocka_unit_test(test_matmul_deterministic),
        cmocka_unit_test(test_matmul_gemm_tiles), cmocka_unit_test(test_matmul_bad_cols),
        cmocka_unit_test(test_dot_axpy),          cmocka_unit_test(test_f16_bf16_rows),
        cmocka_unit_test(test_rmsnorm),           cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_silu_mul_add),      cmocka_unit_test(test_pool_runs),
        cmocka_unit_test(test_pool_workers_run),  cmocka_unit_test(test_pool_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
