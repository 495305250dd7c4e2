/* The host side of the CUDA backend's LoRA updates (cuda/lora_plan.c),
 * without a GPU:
 *   grouping  random row -> adapter maps (rows without an adapter among
 *             them) against a plain per-adapter scan: each adapter's
 *             segment holds exactly its rows, ascending, and rows without
 *             an adapter are in none; a row naming an adapter past the
 *             step's list is refused;
 *   layout    adapters with pairs of ranks 1, 8 and 64, odd widths and
 *             absent pairs: every matrix starts 16-byte aligned, A before
 *             B, none overlaps another, the total is tight, and an upload
 *             through the offsets (as lora.c copies) reads back every
 *             pair's values; sizes that overflow are refused. */
#include "lora_plan.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static uint64_t rng;
static uint32_t rnd(uint32_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33) % n;
}

static void check_grouping(const uint32_t *row_adapter, uint32_t n_rows, uint32_t n_adapters) {
    uint32_t *rows = malloc((n_rows + 1) * sizeof *rows);
    uint32_t *seg = malloc((n_adapters + 1) * sizeof *seg);
    assert_non_null(rows);
    assert_non_null(seg);
    assert_true(llmi_cuda_lora_group(row_adapter, n_rows, n_adapters, rows, seg));
    assert_int_equal(seg[0], 0);
    uint32_t with = 0;
    for (uint32_t a = 0; a < n_adapters; a++) {
        /* The reference: adapter a's rows, scanned in order. */
        uint32_t at = seg[a];
        assert_true(seg[a] <= seg[a + 1]);
        for (uint32_t r = 0; r < n_rows; r++)
            if (row_adapter[r] == a + 1) {
                assert_true(at < seg[a + 1]);
                assert_int_equal(rows[at], r);
                at++;
            }
        assert_int_equal(at, seg[a + 1]);
    }
    for (uint32_t r = 0; r < n_rows; r++)
        with += row_adapter[r] != 0;
    assert_int_equal(seg[n_adapters], with);
    free(rows);
    free(seg);
}

static void test_grouping(void **state) {
    (void)state;
    rng = 20261204;
    printf("# seed 20261204\n");
    for (int round = 0; round < 500; round++) {
        const uint32_t n_rows = rnd(300), n_adapters = rnd(6);
        uint32_t *ra = malloc((n_rows + 1) * sizeof *ra);
        assert_non_null(ra);
        /* Mostly clustered (a request's prompt rows) with scattered decode
         * rows, some without an adapter. */
        for (uint32_t r = 0; r < n_rows; r++)
            ra[r] = r && rnd(4) ? ra[r - 1] : rnd(n_adapters + 1);
        check_grouping(ra, n_rows, n_adapters);
        free(ra);
    }
    /* No row has an adapter; every row the same one. */
    const uint32_t none[5] = {0}, same[5] = {2, 2, 2, 2, 2};
    check_grouping(none, 5, 3);
    check_grouping(same, 5, 2);
}

static void test_grouping_refuses_unknown_adapter(void **state) {
    (void)state;
    const uint32_t ra[4] = {1, 0, 3, 1};
    uint32_t rows[4], seg[3];
    assert_false(llmi_cuda_lora_group(ra, 4, 2, rows, seg));
    assert_false(llmi_cuda_lora_group(ra, 4, 0, rows, seg));
}

enum { N_LAYER = 3 };

typedef struct fake_adapter {
    llm_adapter a;
    llmi_lora_pair pairs[N_LAYER * LLMI_LORA_TARGETS];
} fake_adapter;

/* Pairs of every target on layers 0 and 2 (ranks 1, 8, 64 in turn, widths
 * odd and even), none on layer 1 but V; values that name their place. */
static void make_adapter(fake_adapter *f) {
    memset(f, 0, sizeof *f);
    f->a.pairs = f->pairs;
    static const uint32_t ranks[3] = {1, 8, 64};
    uint32_t i = 0;
    for (uint32_t l = 0; l < N_LAYER; l++)
        for (uint32_t t = 0; t < LLMI_LORA_TARGETS; t++) {
            if (l == 1 && t != LLMI_LORA_V)
                continue;
            llmi_lora_pair *p = &f->pairs[l * LLMI_LORA_TARGETS + t];
            p->rank = ranks[i % 3];
            p->in = 33 + 4 * t + l;
            p->out = 64 + 7 * t;
            p->alpha_scale = 1.0f;
            p->a = malloc((size_t)p->rank * p->in * sizeof(float));
            p->b = malloc((size_t)p->rank * p->out * sizeof(float));
            assert_non_null(p->a);
            assert_non_null(p->b);
            for (size_t j = 0; j < (size_t)p->rank * p->in; j++)
                p->a[j] = (float)(i * 100000 + j);
            for (size_t j = 0; j < (size_t)p->rank * p->out; j++)
                p->b[j] = -(float)(i * 100000 + j);
            i++;
        }
}

static void free_adapter(fake_adapter *f) {
    for (uint32_t i = 0; i < N_LAYER * LLMI_LORA_TARGETS; i++) {
        free(f->pairs[i].a);
        free(f->pairs[i].b);
    }
}

typedef struct span {
    size_t at, n;
} span;

static int by_start(const void *x, const void *y) {
    const span *a = x, *b = y;
    return a->at < b->at ? -1 : a->at > b->at;
}

static void test_layout(void **state) {
    (void)state;
    fake_adapter f;
    make_adapter(&f);
    size_t off[2 * N_LAYER * LLMI_LORA_TARGETS], total = 0;
    assert_true(llmi_cuda_lora_layout(&f.a, N_LAYER, off, &total));
    span spans[2 * N_LAYER * LLMI_LORA_TARGETS];
    size_t n_spans = 0, end = 0;
    for (uint32_t i = 0; i < N_LAYER * LLMI_LORA_TARGETS; i++) {
        const llmi_lora_pair *p = &f.pairs[i];
        if (!p->a) {
            assert_true(off[2 * i] == LLMI_CUDA_LORA_ABSENT);
            assert_true(off[2 * i + 1] == LLMI_CUDA_LORA_ABSENT);
            continue;
        }
        assert_int_equal(off[2 * i] % LLMI_CUDA_LORA_ALIGN, 0);
        assert_int_equal(off[2 * i + 1] % LLMI_CUDA_LORA_ALIGN, 0);
        assert_true(off[2 * i] < off[2 * i + 1]);
        spans[n_spans++] = (span){off[2 * i], (size_t)p->rank * p->in};
        spans[n_spans++] = (span){off[2 * i + 1], (size_t)p->rank * p->out};
        const size_t e = off[2 * i + 1] + (size_t)p->rank * p->out;
        end = e > end ? e : end;
    }
    qsort(spans, n_spans, sizeof *spans, by_start);
    for (size_t i = 1; i < n_spans; i++)
        assert_true(spans[i - 1].at + spans[i - 1].n <= spans[i].at);
    assert_true(total >= end && total - end < LLMI_CUDA_LORA_ALIGN);
    /* An upload through the offsets, read back pair by pair. */
    float *dev = malloc(total * sizeof *dev);
    assert_non_null(dev);
    for (size_t j = 0; j < total; j++)
        dev[j] = 0.5f; /* not a value of any matrix */
    for (uint32_t i = 0; i < N_LAYER * LLMI_LORA_TARGETS; i++) {
        const llmi_lora_pair *p = &f.pairs[i];
        if (!p->a)
            continue;
        memcpy(dev + off[2 * i], p->a, (size_t)p->rank * p->in * sizeof(float));
        memcpy(dev + off[2 * i + 1], p->b, (size_t)p->rank * p->out * sizeof(float));
    }
    for (uint32_t i = 0; i < N_LAYER * LLMI_LORA_TARGETS; i++) {
        const llmi_lora_pair *p = &f.pairs[i];
        if (!p->a)
            continue;
        assert_memory_equal(dev + off[2 * i], p->a, (size_t)p->rank * p->in * sizeof(float));
        assert_memory_equal(dev + off[2 * i + 1], p->b, (size_t)p->rank * p->out * sizeof(float));
    }
    free(dev);
    /* Through llmi_adapter_pair, as lora.c reads it: layer 1's Q is absent. */
    assert_null(llmi_adapter_pair(&f.a, 1, LLMI_LORA_Q)->a);
    assert_true(off[2 * (1 * LLMI_LORA_TARGETS + LLMI_LORA_Q)] == LLMI_CUDA_LORA_ABSENT);
    free_adapter(&f);
}

static void test_layout_overflow(void **state) {
    (void)state;
    llmi_lora_pair pairs[LLMI_LORA_TARGETS];
    memset(pairs, 0, sizeof pairs);
    float dummy = 0.0f;
    for (uint32_t t = 0; t < 2; t++)
        pairs[t] = (llmi_lora_pair){&dummy, &dummy, UINT32_MAX, UINT32_MAX, UINT32_MAX, 1.0f};
    llm_adapter a;
    memset(&a, 0, sizeof a);
    a.pairs = pairs;
    size_t off[2 * LLMI_LORA_TARGETS], total = 0;
    assert_false(llmi_cuda_lora_layout(&a, 1, off, &total));
    /* An adapter of no pairs takes nothing. */
    memset(pairs, 0, sizeof pairs);
    assert_true(llmi_cuda_lora_layout(&a, 1, off, &total));
    assert_int_equal(total, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grouping),
        cmocka_unit_test(test_grouping_refuses_unknown_adapter),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_layout_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
