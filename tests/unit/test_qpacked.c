/* Packed weights (backend/cpu/kernels.h, "Packed weights"): a Q4_0, Q4_1,
 * Q5_0, Q5_1 or Q8_0 weight multiplied through its packed copy at the
 * AVX-512 VNNI level gives the portable kernels' bits (the reference: kernels_q8.c, checked
 * against the dot-product formula by test_qdot), for any token count, row
 * count, block count (odd ones leave half a pair empty) and row slice; the
 * copy is made only where a kernel reads it; a model's logits are the same
 * with the CPU backend's copies (the default) and without (LLM_CPU_PACK=0).
 * The comparisons need AVX-512 VNNI (skipped without). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/threadpool.h"
#include "core/core.h"
#include "core/quant.h"
#include "core/ttype.h"
#include "engine/engine.h"
#include "session/session.h"

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_float(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0);
}

/* Random quants (every nibble and byte value, Q8_0's -128 included) and
 * random f16 scales and mins of both signs; rows `pad` bytes apart beyond
 * their size, so they are not always aligned. */
static uint8_t *make_rows(llmi_ttype type, int64_t rows, int64_t cols, size_t pad, uint64_t seed,
                          llmi_weight *w) {
    const size_t rb = llmi_ttype_row_bytes(type, (uint64_t)cols) + pad;
    uint8_t *buf = malloc(rb * (size_t)rows + 1);
    assert_non_null(buf);
    uint8_t *base = buf + (pad & 1);
    const size_t bs = llmi_ttype_get(type)->block_bytes;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = base + (size_t)r * rb;
        for (size_t i = 0; i < rb; i++)
            row[i] = (uint8_t)rng_next(&seed);
        for (int64_t b = 0; b < cols / 32; b++) {
            uint16_t h = llmi_f32_to_f16(0.01f * rng_float(&seed));
            memcpy(row + (size_t)b * bs, &h, 2);
            if (type == LLMI_T_Q4_1 || type == LLMI_T_Q5_1) {
                h = llmi_f32_to_f16(-0.05f * (rng_float(&seed) + 1.2f));
                memcpy(row + (size_t)b * bs + 2, &h, 2);
            }
        }
    }
    *w = (llmi_weight){base, type, rows, cols, rb};
    return buf;
}

static float *make_x(int n, int64_t cols, uint64_t seed) {
    float *x = malloc(sizeof(float) * (size_t)(n * cols));
    assert_non_null(x);
    for (int64_t i = 0; i < n * cols; i++)
        x[i] = 2.0f * rng_float(&seed) + (i % 5 == 0 ? 0.5f : 0.0f);
    return x;
}

/* y = w x at the current level, every element first set to NaN. */
static float *product(llmi_pool *pool, const llmi_weight *w, const float *x, int n_tok) {
    void *scratch = malloc(llmi_act_scratch_bytes(w->type, w->cols, n_tok));
    float *y = malloc(sizeof(float) * (size_t)(n_tok * w->rows));
    assert_non_null(scratch);
    assert_non_null(y);
    for (int64_t i = 0; i < n_tok * w->rows; i++)
        y[i] = NAN;
    llmi_act a;
    llmi_act_prepare(pool, w->type, x, n_tok, w->cols, scratch, &a);
    llmi_matmul_act(pool, w, &a, y);
    free(scratch);
    return y;
}

/* The packed copy of w, made in two calls over halves of the groups. */
static void *pack(llmi_weight *w) {
    size_t gb;
    const size_t n = llmi_weight_packed_size(w, &gb);
    assert_true(n > 0);
    const int64_t groups = (w->rows + LLMI_WEIGHT_PACK_ROWS - 1) / LLMI_WEIGHT_PACK_ROWS;
    assert_int_equal(n, (size_t)groups * gb);
    assert_int_equal(gb % 64, 0);
    void *p = llmi_malloc_aligned(n);
    assert_non_null(p);
    memset(p, 0xA5, n);
    llmi_weight_pack(w, p, groups / 2, groups);
    llmi_weight_pack(w, p, 0, groups / 2);
    w->packed = p;
    w->packed_group_bytes = gb;
    return p;
}

static const llmi_ttype types[] = {LLMI_T_Q4_0, LLMI_T_Q4_1, LLMI_T_Q8_0, LLMI_T_Q5_0, LLMI_T_Q5_1};

static void test_packed_matches_portable(void **state) {
    (void)state;
    if (!llmi_kernels_have_vnni())
        skip();
    /* Odd block counts (1, 3, 65), one panel and several, a last group of
     * 1..15 rows, and 1300 rows: several row super-blocks at 100 tokens. */
    const int64_t shapes[][2] = {{1, 32},  {15, 576},  {17, 64},   {47, 2080},
                                 {33, 96}, {64, 2048}, {1300, 64}, {40, 1536}};
    const int n_toks[] = {1, 2, 3, 4, 5, 8, 9, 100};
    const int n_big = 100;
    llmi_pool *pool = NULL;
    assert_int_equal(llmi_pool_create(2, &pool), LLM_OK);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t rows = shapes[si][0], cols = shapes[si][1];
            const uint64_t seed = 0x9AC0000ull + 16 * ti + si;
            llmi_weight w;
            uint8_t *buf = make_rows(types[ti], rows, cols, si % 2 ? 3 : 0, seed, &w);
            float *x = make_x(n_big, cols, seed ^ 0xBEEF);
            llmi_kernels_set_level(LLMI_KLEVEL_C);
            float *ref = product(NULL, &w, x, n_big);
            llmi_kernels_set_level(LLMI_KLEVEL_AVX512);
            void *p = pack(&w);
            for (size_t ni = 0; ni < sizeof n_toks / sizeof n_toks[0]; ni++) {
                const int n = n_toks[ni];
                float *y = product(ni % 2 ? pool : NULL, &w, x, n);
                for (int t = 0; t < n; t++)
                    if (memcmp(y + t * rows, ref + t * rows, sizeof(float) * (size_t)rows))
                        fail_msg("%s %lldx%lld packed, %d tokens: token %d is not the portable "
                                 "kernels' (seed 0x%llx)",
                                 llmi_ttype_get(types[ti])->name, (long long)rows, (long long)cols,
                                 n, t, (unsigned long long)seed);
                free(y);
            }
            /* Row slices: one starting at a group keeps the copy, another
             * drops it; both give the slice's rows of the whole. */
            const int64_t starts[] = {16, 1};
            for (int k = 0; k < 2; k++) {
                if (rows <= starts[k])
                    continue;
                const llmi_weight s =
                    llmi_weight_rows(w, (uint64_t)starts[k], (uint64_t)(rows - starts[k]));
                assert_true((s.packed != NULL) == (starts[k] % LLMI_WEIGHT_PACK_ROWS == 0));
                float *y = product(pool, &s, x, 3);
                for (int t = 0; t < 3; t++)
                    if (memcmp(y + t * s.rows, ref + t * rows + starts[k],
                               sizeof(float) * (size_t)s.rows))
                        fail_msg("%s %lldx%lld rows from %lld: token %d differs",
                                 llmi_ttype_get(types[ti])->name, (long long)rows, (long long)cols,
                                 (long long)starts[k], t);
                free(y);
            }
            llmi_free_aligned(p);
            free(ref);
            free(x);
            free(buf);
        }
    }
    llmi_kernels_set_level(-1);
    llmi_pool_free(pool);
}

/* A copy that would not be read is never made: other levels, other types,
 * block types whose cols is not a multiple of 32. A stale copy is ignored
 * below the VNNI level. */
static void test_packed_only_where_read(void **state) {
    (void)state;
    size_t gb;
    llmi_weight w;
    static uint8_t kq[4 * 144];
    w = (llmi_weight){kq, LLMI_T_Q4_K, 4, 256, 144}; /* K-quants have no packed layout */
    assert_int_equal(llmi_weight_packed_size(&w, &gb), 0);
    uint8_t *buf = make_rows(LLMI_T_F16, 4, 64, 0, 7, &w);
    w.type = LLMI_T_F16;
    assert_int_equal(llmi_weight_packed_size(&w, &gb), 0);
    free(buf);
    buf = make_rows(LLMI_T_Q4_0, 20, 64, 0, 9, &w);
    w.cols = 40;
    assert_int_equal(llmi_weight_packed_size(&w, &gb), 0);
    w.cols = 64;
    llmi_kernels_set_level(LLMI_KLEVEL_AVX2);
    assert_int_equal(llmi_weight_packed_size(&w, &gb), 0);
    if (llmi_kernels_have_vnni()) {
        float *x = make_x(2, 64, 11);
        float *ref = product(NULL, &w, x, 2);
        llmi_kernels_set_level(LLMI_KLEVEL_AVX512);
        void *p = pack(&w);
        memset(p, 0x11, llmi_weight_packed_size(&w, &gb)); /* wrong values */
        llmi_kernels_set_level(LLMI_KLEVEL_AVX2);
        float *y = product(NULL, &w, x, 2);
        assert_memory_equal(y, ref, sizeof(float) * 2 * 20);
        llmi_kernels_set_level(LLMI_KLEVEL_AVX512);
        float *yp = product(NULL, &w, x, 2);
        assert_memory_not_equal(yp, ref, sizeof(float) * 2 * 20); /* the copy is what is read */
        free(yp);
        free(y);
        free(ref);
        free(x);
        llmi_free_aligned(p);
    }
    llmi_kernels_set_level(-1);
    free(buf);
}

/* The logits of n prompt tokens in one step, then of 3 single-token
 * decodes, from a fresh session over a freshly loaded model. */
static float *model_logits(const char *path, const llm_token *toks, int n) {
    llm_model *m = NULL;
    assert_int_equal(llm_model_load(path, NULL, &m), LLM_OK);
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 64;
    llm_session *s = NULL;
    assert_int_equal(llmi_session_create(m, &sp, &s), LLM_OK);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &seq, (uint32_t)n), LLM_OK);
    const uint32_t V = m->hp.n_vocab;
    float *logits = malloc((size_t)n * V * sizeof *logits);
    assert_non_null(logits);
    llmi_batch_row rows[64];
    for (int i = 0; i < n - 3; i++)
        rows[i] = (llmi_batch_row){toks[i], (uint32_t)i, &seq, true};
    assert_int_equal(llmi_engine_run(s->eng, rows, (uint32_t)(n - 3), logits), LLM_OK);
    for (int i = n - 3; i < n; i++) {
        rows[0] = (llmi_batch_row){toks[i], (uint32_t)i, &seq, true};
        assert_int_equal(llmi_engine_run(s->eng, rows, 1, logits + (size_t)i * V), LLM_OK);
    }
    llmi_kv_seq_destroy(s->kv, &seq);
    llmi_session_free(s);
    llm_model_free(m);
    return logits;
}

static void test_model_same_logits(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path || !llmi_kernels_have_vnni())
        skip();
    llm_model *m = NULL;
    assert_int_equal(llm_model_load(path, NULL, &m), LLM_OK);
    const uint32_t V = m->hp.n_vocab;
    /* The backend packs every matrix it has a layout for. */
    llmi_cpu_weights *cw = NULL;
    assert_int_equal(llmi_cpu_weights_load(m, &cw), LLM_OK);
    size_t want = 0, gb;
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        for (int r = 0; r < LLMI_LAYER_ROLES; r++)
            if (cw->layers[l].w[r].packed)
                want += llmi_weight_packed_size(&cw->layers[l].w[r], &gb);
    if (cw->w[LLMI_ROLE_OUTPUT].packed)
        want += llmi_weight_packed_size(&cw->w[LLMI_ROLE_OUTPUT], &gb);
    assert_true(cw->packed_bytes > 0);
    assert_int_equal(cw->packed_bytes, want);
    assert_non_null(cw->layers[0].w[LLMI_ROLE_Q].packed);
    assert_null(m->layers[0].w[LLMI_ROLE_Q].packed); /* the model's views stay as they were */
    llmi_cpu_weights_free(cw);
    llm_model_free(m);

    llm_token toks[24];
    for (int i = 0; i < 24; i++)
        toks[i] = (llm_token)(100 + 37 * i) % (llm_token)V;
    float *packed = model_logits(path, toks, 24);
    setenv("LLM_CPU_PACK", "0", 1);
    float *plain = model_logits(path, toks, 24);
    unsetenv("LLM_CPU_PACK");
    assert_memory_equal(packed, plain, sizeof(float) * 24 * V);
    free(packed);
    free(plain);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_matches_portable),
        cmocka_unit_test(test_packed_only_where_read),
        cmocka_unit_test(test_model_same_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
