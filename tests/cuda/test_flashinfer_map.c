/* The mapping of a step's attention rows onto FlashInfer's paged KV cache
 * (cuda/flashinfer_map.h), on machines without a GPU. Random steps (fixed
 * seeds): sequences with block tables of distinct blocks in random order,
 * laid out with gaps and out of order in `blocks`; requests that are
 * tiles (runs of one sequence at consecutive positions, from any start)
 * and single rows (a list, or every row). FlashInfer's own arithmetic is
 * written out here from its documented layout (paged_kv_t's get_length, an
 * NHD element at page * stride_page + entry * stride_n + head * stride_h,
 * its causal query position kv_len - qo_len + i and its sliding-window
 * mask) and checked against the step itself: each request's query count
 * and positions, its key count, every key's element offset against the
 * slot our block table names, and the window's keys against ours. */
#include "flashinfer_map.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t rng_range(uint64_t *s, uint32_t lo, uint32_t hi) { /* [lo, hi] */
    return lo + (uint32_t)(rng_next(s) % ((uint64_t)hi - lo + 1));
}

enum { MAX_SEQS = 6, MAX_ROWS = 400, MAX_REQS = 64, MAX_TABLE = 128 };

typedef struct step {
    uint32_t n_seqs, block_size, n_head_kv, head_dim, kv_dim;
    uint32_t seq_len[MAX_SEQS];
    uint32_t table[MAX_SEQS][MAX_TABLE]; /* the test's own block tables */
    uint32_t block_start[MAX_SEQS], *blocks, n_blocks;
    uint32_t n_rows, pos[MAX_ROWS], seq[MAX_ROWS];
    uint32_t tiles[2 * MAX_REQS], n_tiles;
    uint32_t singles[MAX_ROWS], n_singles;
} step;

/* Sequences with distinct random blocks; `blocks` holds their tables in a
 * shuffled order of sequences with a gap before each. */
static void make_tables(step *st, uint64_t *rng) {
    st->n_seqs = rng_range(rng, 1, MAX_SEQS);
    uint32_t total = 0;
    for (uint32_t s = 0; s < st->n_seqs; s++) {
        st->seq_len[s] = rng_range(rng, 1, 40 * st->block_size);
        if (st->seq_len[s] > MAX_TABLE * st->block_size)
            st->seq_len[s] = MAX_TABLE * st->block_size;
        total += llmi_fi_pages(st->seq_len[s], st->block_size);
    }
    const uint32_t pool = 2 * total + 7;
    uint32_t *perm = malloc(4 * pool);
    assert_non_null(perm);
    for (uint32_t i = 0; i < pool; i++)
        perm[i] = i;
    for (uint32_t i = pool - 1; i > 0; i--) {
        const uint32_t j = (uint32_t)(rng_next(rng) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    uint32_t next = 0, order[MAX_SEQS];
    for (uint32_t s = 0; s < st->n_seqs; s++) {
        order[s] = s;
        for (uint32_t i = 0; i < llmi_fi_pages(st->seq_len[s], st->block_size); i++)
            st->table[s][i] = perm[next++];
    }
    for (uint32_t s = st->n_seqs - 1; s > 0; s--) {
        const uint32_t j = (uint32_t)(rng_next(rng) % (s + 1)), t = order[s];
        order[s] = order[j];
        order[j] = t;
    }
    st->n_blocks = total + 3 * st->n_seqs;
    st->blocks = malloc(4 * st->n_blocks);
    assert_non_null(st->blocks);
    memset(st->blocks, 0xff, 4 * st->n_blocks);
    uint32_t at = 0;
    for (uint32_t k = 0; k < st->n_seqs; k++) {
        const uint32_t s = order[k], n = llmi_fi_pages(st->seq_len[s], st->block_size);
        at += rng_range(rng, 0, 3); /* a gap no sequence owns */
        if (at + n > st->n_blocks)
            at = st->n_blocks - n;
        st->block_start[s] = at;
        memcpy(st->blocks + at, st->table[s], 4 * n);
        at += n;
    }
    free(perm);
}

/* Rows: runs of one sequence at consecutive positions (each a tile of 1 ..
 * 32 rows) and single rows anywhere, in random order. */
static void make_rows(step *st, uint64_t *rng) {
    st->n_rows = st->n_tiles = st->n_singles = 0;
    const uint32_t n_parts = rng_range(rng, 1, 24);
    for (uint32_t p = 0; p < n_parts; p++) {
        const uint32_t s = rng_range(rng, 0, st->n_seqs - 1), len = st->seq_len[s];
        if (rng_range(rng, 0, 2) == 0 && st->n_rows < MAX_ROWS) {
            st->singles[st->n_singles++] = st->n_rows;
            st->seq[st->n_rows] = s;
            st->pos[st->n_rows++] = rng_range(rng, 0, len - 1);
            continue;
        }
        uint32_t rows = rng_range(rng, 1, 32);
        if (rows > len)
            rows = len;
        if (st->n_rows + rows > MAX_ROWS || st->n_tiles == MAX_REQS)
            continue;
        const uint32_t first_pos = rng_range(rng, 0, len - rows);
        st->tiles[2 * st->n_tiles] = st->n_rows;
        st->tiles[2 * st->n_tiles++ + 1] = rows;
        for (uint32_t i = 0; i < rows; i++) {
            st->seq[st->n_rows] = s;
            st->pos[st->n_rows++] = first_pos + i;
        }
    }
}

/* FlashInfer's paged_kv_t::get_length. */
static uint32_t fi_length(const int32_t *indptr, const int32_t *last_page_len, uint32_t b,
                          uint32_t page_size) {
    if (indptr[b + 1] == indptr[b])
        return 0;
    return (uint32_t)(indptr[b + 1] - indptr[b] - 1) * page_size + (uint32_t)last_page_len[b];
}

/* DefaultAttention's sliding-window mask for query i of a request of
 * qo_len queries over kv_len keys. */
static bool fi_sees(int32_t window_left, uint32_t qo_len, uint32_t kv_len, uint32_t i, uint32_t k) {
    const uint32_t wl = window_left >= 0 ? (uint32_t)window_left : kv_len;
    const bool causal = k + qo_len <= kv_len + i; /* MaskMode::kCausal */
    return causal && k + qo_len + wl >= kv_len + i;
}

static void check_requests(const step *st, const llmi_fi_requests *reqs) {
    int32_t q_indptr[MAX_ROWS + 1], kv_indptr[MAX_ROWS + 1], last[MAX_ROWS];
    const uint32_t pages =
        llmi_fi_plan(reqs, st->pos, st->block_size, -1, 16, 0, q_indptr, kv_indptr, last, NULL);
    assert_int_equal(kv_indptr[reqs->n], pages);
    int32_t *indices = malloc(4 * (pages + 1));
    assert_non_null(indices);
    uint32_t rows_before = 0;
    for (uint32_t b = 0; b < reqs->n; b++) { /* as the gather kernel fills them */
        const llmi_fi_run run = llmi_fi_request(reqs, b);
        const uint32_t n = llmi_fi_pages(llmi_fi_kv_len(st->pos, run), st->block_size);
        assert_int_equal(kv_indptr[b + 1] - kv_indptr[b], n);
        for (uint32_t i = 0; i < n; i++)
            indices[kv_indptr[b] + i] = llmi_fi_page(st->seq, st->block_start, st->blocks, run, i);
    }
    const uint32_t windows[] = {0, 1, 5, st->block_size, 77};
    for (uint32_t b = 0; b < reqs->n; b++) {
        const llmi_fi_run run = llmi_fi_request(reqs, b);
        const uint32_t s = st->seq[run.first_row];
        /* Queries: packed in request order, at the request's last positions. */
        assert_int_equal(q_indptr[b], rows_before);
        const uint32_t qo_len = (uint32_t)(q_indptr[b + 1] - q_indptr[b]);
        assert_int_equal(qo_len, run.n_rows);
        rows_before += qo_len;
        const uint32_t kv_len = fi_length(kv_indptr, last, b, st->block_size);
        assert_true(last[b] >= 1 && (uint32_t)last[b] <= st->block_size);
        for (uint32_t i = 0; i < qo_len; i++) {
            assert_int_equal(st->seq[run.first_row + i], s);
            assert_int_equal(kv_len - qo_len + i, st->pos[run.first_row + i]);
        }
        /* Keys: every element FlashInfer addresses is the one our slot holds. */
        const uint64_t stride_page = (uint64_t)st->block_size * st->kv_dim;
        for (uint32_t k = 0; k < kv_len; k++) {
            const uint32_t page = (uint32_t)indices[kv_indptr[b] + k / st->block_size];
            const uint64_t slot =
                (uint64_t)st->table[s][k / st->block_size] * st->block_size + k % st->block_size;
            for (uint32_t h = 0; h < st->n_head_kv; h++) {
                const uint32_t d = (h * 7 + k) % st->head_dim;
                const uint64_t fi = page * stride_page +
                                    (uint64_t)(k % st->block_size) * st->kv_dim +
                                    (uint64_t)h * st->head_dim + d;
                const uint64_t ours = slot * st->kv_dim + (uint64_t)h * st->head_dim + d;
                if (fi != ours)
                    fail_msg("request %u key %u head %u: FlashInfer reads element %llu, our "
                             "slot is at %llu",
                             b, k, h, (unsigned long long)fi, (unsigned long long)ours);
            }
        }
        /* KV splits of single rows: FlashInfer's chunks of the CTAs we
         * launch cover the keys from its first visible one to the last,
         * each once, and every key our window keeps. */
        if (qo_len == 1) {
            const uint32_t chunks[] = {7, 256};
            for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
                for (size_t c = 0; c < 2; c++) {
                    const int32_t wl = llmi_fi_window_left(windows[w]);
                    const uint32_t wl_eff = wl >= 0 ? (uint32_t)wl : kv_len;
                    const uint32_t start = kv_len > 1 + wl_eff ? kv_len - (1 + wl_eff) : 0;
                    const uint32_t n = llmi_fi_kv_chunks(kv_len, wl, 16, chunks[c]);
                    uint32_t next = start;
                    for (uint32_t t = 0; t < n; t++) {
                        uint32_t lo = t * chunks[c] + start, hi = lo + chunks[c];
                        lo = lo < kv_len ? lo : kv_len;
                        hi = hi < kv_len ? hi : kv_len;
                        assert_int_equal(lo, next);
                        next = hi;
                    }
                    assert_int_equal(next, kv_len);
                    const uint32_t p = st->pos[run.first_row];
                    if (windows[w] && p + 1 > windows[w])
                        assert_int_equal(start, p + 1 - windows[w]);
                    else
                        assert_int_equal(start, 0);
                }
        }
        /* Windows: the keys a query sees are ours, p - k < window. */
        for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
            const int32_t wl = llmi_fi_window_left(windows[w]);
            for (uint32_t i = 0; i < qo_len; i++) {
                const uint32_t p = st->pos[run.first_row + i];
                for (uint32_t k = 0; k < kv_len; k++) {
                    const bool ours = k <= p && (windows[w] == 0 || p - k < windows[w]);
                    if (fi_sees(wl, qo_len, kv_len, i, k) != ours)
                        fail_msg("request %u query %u (position %u) key %u window %u: "
                                 "FlashInfer %d, ours %d",
                                 b, i, p, k, windows[w], !ours, ours);
                }
            }
        }
    }
    free(indices);
    /* The partial rows of KV splits: each request's rows x its chunks. */
    int32_t o_indptr[MAX_ROWS + 1], q2[MAX_ROWS + 1], kv2[MAX_ROWS + 1], last2[MAX_ROWS];
    const int32_t wl = llmi_fi_window_left(5);
    assert_int_equal(
        llmi_fi_plan(reqs, st->pos, st->block_size, wl, 16, 256, q2, kv2, last2, o_indptr), pages);
    assert_memory_equal(q2, q_indptr, 4 * (reqs->n + 1));
    assert_memory_equal(kv2, kv_indptr, 4 * (reqs->n + 1));
    assert_memory_equal(last2, last, 4 * reqs->n);
    assert_int_equal(o_indptr[0], 0);
    for (uint32_t b = 0; b < reqs->n; b++) {
        const llmi_fi_run run = llmi_fi_request(reqs, b);
        const uint32_t kv_len = llmi_fi_kv_len(st->pos, run);
        assert_int_equal(o_indptr[b + 1] - o_indptr[b],
                         run.n_rows * llmi_fi_kv_chunks(kv_len, wl, 16, 256));
    }
}

static void test_random_steps(void **state) {
    (void)state;
    const uint32_t block_sizes[] = {1, 3, 16, 32};
    for (uint32_t trial = 0; trial < 200; trial++) {
        uint64_t rng = 0xf1a5u + trial;
        step st;
        memset(&st, 0, sizeof st);
        st.block_size = block_sizes[trial % 4];
        st.n_head_kv = rng_range(&rng, 1, 8);
        st.head_dim = trial % 2 ? 128 : 64;
        st.kv_dim = st.n_head_kv * st.head_dim + (trial % 3 == 0 ? 8 : 0);
        make_tables(&st, &rng);
        make_rows(&st, &rng);
        const llmi_fi_requests tiles = {st.tiles, NULL, st.n_tiles};
        const llmi_fi_requests singles = {NULL, st.singles, st.n_singles};
        const llmi_fi_requests every_row = {NULL, NULL, st.n_rows};
        check_requests(&st, &tiles);
        check_requests(&st, &singles);
        check_requests(&st, &every_row);
        free(st.blocks);
    }
}

/* A hand-made step: positions 0..4 of a sequence whose table is {9, 2}
 * with blocks of 4, then a single row at position 6 of the same sequence. */
static void test_small_step_by_hand(void **state) {
    (void)state;
    const uint32_t block_start[1] = {1}, blocks[3] = {77, 9, 2};
    const uint32_t pos[6] = {0, 1, 2, 3, 4, 6}, seq[6] = {0, 0, 0, 0, 0, 0};
    const uint32_t tiles[4] = {0, 5, 5, 1};
    const llmi_fi_requests reqs = {tiles, NULL, 2};
    int32_t q_indptr[3], kv_indptr[3], last[2], indices[4];
    assert_int_equal(llmi_fi_plan(&reqs, pos, 4, -1, 16, 0, q_indptr, kv_indptr, last, NULL), 4);
    const int32_t want_q[3] = {0, 5, 6}, want_kv[3] = {0, 2, 4}, want_last[2] = {1, 3};
    assert_memory_equal(q_indptr, want_q, sizeof want_q);
    assert_memory_equal(kv_indptr, want_kv, sizeof want_kv);
    assert_memory_equal(last, want_last, sizeof want_last);
    for (uint32_t b = 0; b < 2; b++)
        for (int32_t i = 0; i < kv_indptr[b + 1] - kv_indptr[b]; i++)
            indices[kv_indptr[b] + i] =
                llmi_fi_page(seq, block_start, blocks, llmi_fi_request(&reqs, b), (uint32_t)i);
    const int32_t want_indices[4] = {9, 2, 9, 2};
    assert_memory_equal(indices, want_indices, sizeof want_indices);
    assert_int_equal(llmi_fi_window_left(0), -1);
    assert_int_equal(llmi_fi_window_left(1), 0);
    assert_int_equal(llmi_fi_window_left(4096), 4095);
    /* KV chunks: 600 keys in chunks of 256 -> 3; a window of 100 -> 1
     * (100 + 16 keys at most); no keys still one chunk. */
    assert_int_equal(llmi_fi_kv_chunks(600, -1, 16, 256), 3);
    assert_int_equal(llmi_fi_kv_chunks(600, 99, 16, 256), 1);
    assert_int_equal(llmi_fi_kv_chunks(600, 299, 16, 256), 2);
    assert_int_equal(llmi_fi_kv_chunks(0, -1, 16, 256), 1);
}

/* Query tiles of a request: rows x group packed rows in tiles of
 * cta_tile_q, the last one partly used. */
static void test_query_tiles(void **state) {
    (void)state;
    for (uint32_t rows = 1; rows <= 32; rows++)
        for (uint32_t group = 1; group <= 8; group++) {
            const uint32_t ctas[] = {16, 64, 128};
            for (size_t c = 0; c < 3; c++) {
                const uint32_t t = llmi_fi_qo_tiles(rows, group, ctas[c]);
                assert_true(t * ctas[c] >= rows * group);
                assert_true((t - 1) * ctas[c] < rows * group);
            }
        }
    /* What attention_flashinfer.cu's launches assume. */
    assert_int_equal(llmi_fi_qo_tiles(1, 8, 16), 1);
    assert_int_equal(llmi_fi_qo_tiles(32, 4, 128), 1);
    assert_int_equal(llmi_fi_qo_tiles(32, 8, 128), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_step_by_hand),
        cmocka_unit_test(test_query_tiles),
        cmocka_unit_test(test_random_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
