/* What exact tensor parallelism (backend/tp) stands on: the CPU matmul of a
 * range of a weight's rows gives, for each row, the bits it gives in the
 * whole matrix (kernels.h, "Determinism"). For every weight type the CPU
 * multiplies, at every kernel level this CPU has, with 8-bit and with f32
 * activations, for 1 and for 7 tokens (one tile and several), over ranges
 * that start and end off every chunk and tile boundary, and for thread
 * counts 1 and 3: y of the range equals its rows of the whole y. */
#include "backend/cpu/kernels.h"
#include "core/quant.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

enum { ROWS = 83, MAX_TOK = 7 };

static uint64_t g_rng = 2026;

static float unit(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(g_rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

/* A ROWS x cols weight of `type` from random floats. */
static void *random_weight(llmi_ttype type, int64_t cols, llmi_weight *w) {
    const size_t rb = llmi_ttype_row_bytes(type, cols);
    uint8_t *data = llmi_malloc(rb * ROWS);
    float *row = llmi_malloc((size_t)cols * sizeof *row);
    assert_true(data && row);
    for (int r = 0; r < ROWS; r++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = unit();
        llmi_quantize_row(type, row, data + (size_t)r * rb, cols);
    }
    llmi_free(row);
    *w = (llmi_weight){data, type, ROWS, cols, rb};
    return data;
}

/* y = w x over n_tok tokens, with 8-bit activations unless f32. */
static void matmul(llmi_pool *pool, const llmi_weight *w, const float *x, int n_tok, bool f32,
                   void *scratch, float *y) {
    if (f32) {
        llmi_matmul(pool, w, x, n_tok, y);
        return;
    }
    llmi_act act;
    llmi_act_prepare(pool, w->type, x, n_tok, w->cols, scratch, &act);
    llmi_matmul_act(pool, w, &act, y);
}

/* Rows [r0, r1) of w against the whole: the same bits, for every token. */
static void check_range(llmi_pool *pool, const llmi_weight *w, const float *x, int n_tok, bool f32,
                        void *scratch, const float *whole, int64_t r0, int64_t r1) {
    llmi_weight part = *w;
    part.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    part.rows = r1 - r0;
    float y[MAX_TOK * ROWS];
    memset(y, 0xff, sizeof y);
    matmul(pool, &part, x, n_tok, f32, scratch, y);
    for (int t = 0; t < n_tok; t++)
        if (memcmp(y + t * part.rows, whole + t * ROWS + r0, (size_t)part.rows * sizeof *y))
            fail_msg("%s, level %d, %s activations, %d tokens: rows [%lld, %lld) token %d differ "
                     "from the whole matrix's",
                     llmi_ttype_get(w->type)->name, llmi_kernels_level(), f32 ? "f32" : "8-bit",
                     n_tok, (long long)r0, (long long)r1, t);
}

static void test_row_ranges_match_whole(void **state) {
    (void)state;
    const llmi_ttype types[] = {LLMI_T_F32,  LLMI_T_F16,  LLMI_T_BF16, LLMI_T_Q8_0, LLMI_T_Q4_0,
                                LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1, LLMI_T_Q4_K, LLMI_T_Q6_K};
    const int64_t ranges[][2] = {{0, ROWS}, {1, 82}, {17, 50}, {5, 6}, {27, 83}, {0, 28}};
    const int best = llmi_kernels_level();
    int n_checks = 0;
    for (int threads = 1; threads <= 3; threads += 2) {
        llmi_pool *pool = NULL;
        assert_int_equal(llmi_pool_create(threads, &pool), LLM_OK);
        for (int level = 0; level <= best; level++) {
            llmi_kernels_set_level(level);
            for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
                const int64_t cols = llmi_ttype_get(types[i])->block == 256 ? 512 : 96;
                llmi_weight w;
                void *data = random_weight(types[i], cols, &w);
                float *x = llmi_malloc((size_t)MAX_TOK * cols * sizeof *x);
                void *scratch = llmi_malloc(llmi_act_scratch_bytes(types[i], cols, MAX_TOK) + 1);
                assert_true(x && scratch);
                for (int64_t k = 0; k < MAX_TOK * cols; k++)
                    x[k] = unit();
                for (int f32 = 0; f32 < 2; f32++)
                    for (int n_tok = 1; n_tok <= MAX_TOK; n_tok += 6) {
                        float whole[MAX_TOK * ROWS];
                        matmul(pool, &w, x, n_tok, f32, scratch, whole);
                        for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++, n_checks++)
                            check_range(pool, &w, x, n_tok, f32, scratch, whole, ranges[r][0],
                                        ranges[r][1]);
                    }
                llmi_free(scratch);
                llmi_free(x);
                llmi_free(data);
            }
        }
        llmi_pool_free(pool);
    }
    llmi_kernels_set_level(-1);
    printf("# %d row ranges, 10 weight types, levels 0..%d, 1 and 3 threads: the whole "
           "matrix's bits\n",
           n_checks, best);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_ranges_match_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
