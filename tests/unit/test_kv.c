/* KV block pool: reserve / truncate / release, fork with copy-on-write, the
 * prefix cache (hits, LRU eviction, collision safety), a randomized soak that
 * checks every invariant after every operation, and allocation failures;
 * all of it on pools of f32, f16 and bf16 elements.
 *
 * The pool is bookkeeping; its blocks' bytes live in a CPU backend KV store
 * (the copy-on-write copies go through the store's kv_copy), and the tests
 * check both together. K/V contents are written as a function of what a
 * real forward pass would make them depend on (the token prefix up to the position, the layer and
 * the dimension), so a wrong block after a copy, a match or an eviction shows
 * up as wrong data. Seeds are fixed and printed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/cpu.h"
#include "kv/kv.h"

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t rnd(uint64_t *s, uint32_t n) { return n ? (uint32_t)(splitmix(s) % n) : 0; }

/* The element type every pool of a test group holds (main runs the tests
 * once per type); pools are made by kv_new. */
static llm_kv_type g_type = LLM_KV_F32;

/* The CPU KV store holding each test pool's bytes (a few pools at once). */
typedef struct store_entry {
    const llmi_kv *kv;
    llmi_cpu_kv *store;
} store_entry;
static store_entry g_stores[8];

static llmi_cpu_kv *store_of(const llmi_kv *kv) {
    for (size_t i = 0; i < 8; i++)
        if (g_stores[i].kv == kv)
            return g_stores[i].store;
    fail_msg("no store for pool %p", (const void *)kv);
    return NULL;
}

static llm_status kv_new(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size, uint32_t n_blocks,
                         llmi_kv **out) {
    *out = NULL;
    llmi_kv_layout layout = {n_layer, kv_dim, block_size, n_blocks, g_type};
    void *store = NULL;
    if (n_layer == 0 || kv_dim == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "KV cache with a zero dimension");
    llm_status st = llmi_kv_create(block_size, n_blocks, out);
    if (st == LLM_OK)
        st = llmi_backend_cpu.kv_create(NULL, &layout, &store);
    if (st != LLM_OK) {
        llmi_kv_free(*out);
        *out = NULL;
        return st;
    }
    size_t i = 0;
    while (i < 8 && g_stores[i].kv)
        i++;
    assert_true(i < 8);
    g_stores[i] = (store_entry){*out, store};
    llmi_kv_set_copier(*out, llmi_backend_cpu.kv_copy, store);
    llmi_cpu_kv *cs = store;
    assert_int_equal(cs->elem_size, llmi_kv_type_size(g_type));
    assert_int_equal(cs->row_bytes, (size_t)kv_dim * llmi_kv_type_size(g_type));
    return LLM_OK;
}

static void kv_del(llmi_kv *kv) {
    for (size_t i = 0; kv && i < 8; i++)
        if (g_stores[i].kv == kv) {
            llmi_backend_cpu.kv_free(g_stores[i].store);
            g_stores[i] = (store_entry){0};
        }
    llmi_kv_free(kv);
}

static uint8_t *row_k(const llmi_kv *kv, uint32_t layer, const llmi_kv_seq *seq, uint32_t pos) {
    return llmi_cpu_kv_row(store_of(kv), layer, false, llmi_kv_slot(kv, seq, pos));
}
static uint8_t *row_v(const llmi_kv *kv, uint32_t layer, const llmi_kv_seq *seq, uint32_t pos) {
    return llmi_cpu_kv_row(store_of(kv), layer, true, llmi_kv_slot(kv, seq, pos));
}

/* The bits of the element for (key, layer, dim, K or V): an exactly
 * representable float for f32, any 16-bit pattern for f16 and bf16 (the
 * pool only moves bytes). */
static uint32_t val(const llmi_kv *kv, uint64_t key, uint32_t layer, uint32_t d, int is_v) {
    uint64_t s = key ^ ((uint64_t)layer << 40) ^ ((uint64_t)d << 50) ^ ((uint64_t)is_v << 62);
    uint64_t h = splitmix(&s);
    if (store_of(kv)->elem_size == 2)
        return (uint32_t)(h & 0xffff);
    float f = (float)(h & 0xffffff);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void put(const llmi_kv *kv, uint8_t *row, uint32_t d, uint32_t bits) {
    if (store_of(kv)->elem_size == 2) {
        uint16_t h = (uint16_t)bits;
        memcpy(row + 2 * (size_t)d, &h, 2);
    } else {
        memcpy(row + 4 * (size_t)d, &bits, 4);
    }
}

static uint32_t get(const llmi_kv *kv, const uint8_t *row, uint32_t d) {
    if (store_of(kv)->elem_size == 2) {
        uint16_t h;
        memcpy(&h, row + 2 * (size_t)d, 2);
        return h;
    }
    uint32_t u;
    memcpy(&u, row + 4 * (size_t)d, 4);
    return u;
}

static void write_pos(llmi_kv *kv, const llmi_kv_seq *seq, uint32_t pos, uint64_t key) {
    for (uint32_t l = 0; l < store_of(kv)->layout.n_layer; l++)
        for (uint32_t d = 0; d < store_of(kv)->layout.kv_dim; d++) {
            put(kv, row_k(kv, l, seq, pos), d, val(kv, key, l, d, 0));
            put(kv, row_v(kv, l, seq, pos), d, val(kv, key, l, d, 1));
        }
}

static bool pos_ok(const llmi_kv *kv, const llmi_kv_seq *seq, uint32_t pos, uint64_t key) {
    for (uint32_t l = 0; l < store_of(kv)->layout.n_layer; l++)
        for (uint32_t d = 0; d < store_of(kv)->layout.kv_dim; d++)
            if (get(kv, row_k(kv, l, seq, pos), d) != val(kv, key, l, d, 0) ||
                get(kv, row_v(kv, l, seq, pos), d) != val(kv, key, l, d, 1))
                return false;
    return true;
}

/* Key of position p: hash of tokens[0..p], as the forward pass's K/V there
 * depends on the whole prefix. keys[p] for p < n. */
static void prefix_keys(const llm_token *t, uint32_t n, uint64_t *keys) {
    uint64_t h = 12345;
    for (uint32_t p = 0; p < n; p++) {
        h ^= (uint64_t)(uint32_t)t[p] + 0x100000000ull * p;
        keys[p] = splitmix(&h);
    }
}

/* Reserves and "computes" positions [seq->n_tokens, n) of seq. */
static void feed(llmi_kv *kv, llmi_kv_seq *seq, const uint64_t *keys, uint32_t n) {
    assert_int_equal(llmi_kv_seq_reserve(kv, seq, n), LLM_OK);
    for (uint32_t p = seq->n_tokens; p < n; p++)
        write_pos(kv, seq, p, keys[p]);
    seq->n_tokens = n;
}

/* Positions before llmi_kv_seq_first_pos were released: nothing to read. */
static void verify(const llmi_kv *kv, const llmi_kv_seq *seq, const uint64_t *keys) {
    for (uint32_t p = llmi_kv_seq_first_pos(kv, seq); p < seq->n_tokens; p++)
        if (!pos_ok(kv, seq, p, keys[p]))
            fail_msg("position %u holds wrong K/V", p);
}

static void check(const llmi_kv *kv, const llmi_kv_seq *const *seqs, size_t n) {
    llm_status st = llmi_kv_check(kv, seqs, n);
    if (st != LLM_OK)
        fail_msg("%s", llmi_error_message());
}

typedef struct snap {
    llmi_kv_seq seq;
    uint32_t blocks[64];
    uint32_t n_free, n_cached;
    uint64_t evictions, cow, hits;
} snap;

static void take(snap *s, const llmi_kv *kv, const llmi_kv_seq *seq) {
    assert_true(seq->n_blocks <= 64);
    s->seq = *seq;
    if (seq->n_blocks)
        memcpy(s->blocks, seq->blocks, seq->n_blocks * sizeof *s->blocks);
    s->n_free = kv->n_free;
    s->n_cached = kv->n_cached;
    s->evictions = kv->evictions;
    s->cow = kv->cow_copies;
    s->hits = kv->prefix_hit_tokens;
}

static void same(const snap *s, const llmi_kv *kv, const llmi_kv_seq *seq) {
    assert_int_equal(seq->n_blocks, s->seq.n_blocks);
    assert_int_equal(seq->n_tokens, s->seq.n_tokens);
    assert_int_equal(seq->n_hashed, s->seq.n_hashed);
    assert_true(seq->last_hash == s->seq.last_hash);
    if (seq->n_blocks)
        assert_memory_equal(seq->blocks, s->blocks, seq->n_blocks * sizeof *s->blocks);
    assert_int_equal(kv->n_free, s->n_free);
    assert_int_equal(kv->n_cached, s->n_cached);
    assert_true(kv->evictions == s->evictions);
    assert_true(kv->cow_copies == s->cow);
    assert_true(kv->prefix_hit_tokens == s->hits);
}

static void test_create_args(void **state) {
    (void)state;
    llmi_kv *kv = (llmi_kv *)1;
    assert_int_equal(kv_new(0, 4, 4, 4, &kv), LLM_ERR_INVALID_ARGUMENT);
    assert_null(kv);
    assert_int_equal(kv_new(1, 4, 0, 4, &kv), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(kv_new(1, 4, 4, 0, &kv), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(kv_new(1, UINT32_MAX, UINT32_MAX, UINT32_MAX, &kv), LLM_ERR_LIMIT);
    kv = (llmi_kv *)1;
    void *store = (void *)1;
    llmi_kv_layout bad = {1, 4, 4, 4, (llm_kv_type)6};
    assert_int_equal(llmi_backend_cpu.kv_create(NULL, &bad, &store), LLM_ERR_INVALID_ARGUMENT);
    assert_null(store);
    /* Block types need rows (and heads) of whole blocks of 32. */
    store = (void *)1;
    llmi_kv_layout partial = {1, 48, 4, 4, LLM_KV_Q8_0, 48};
    assert_int_equal(llmi_backend_cpu.kv_create(NULL, &partial, &store), LLM_ERR_UNSUPPORTED);
    assert_null(store);
    store = (void *)1;
    llmi_kv_layout split = {1, 64, 4, 4, LLM_KV_Q4_0, 16};
    assert_int_equal(llmi_backend_cpu.kv_create(NULL, &split, &store), LLM_ERR_UNSUPPORTED);
    assert_null(store);
    assert_int_equal(llmi_kv_row_bytes(LLM_KV_Q8_0, 64), 2 * 34);
    assert_int_equal(llmi_kv_row_bytes(LLM_KV_Q4_0, 64), 2 * 18);
    assert_int_equal(llmi_kv_row_bytes(LLM_KV_Q8_0, 48), 0);
    assert_int_equal(llmi_kv_row_bytes(LLM_KV_F16, 3), 6);
    assert_int_equal(llmi_kv_row_bytes(LLM_KV_FP8_E4M3, 64), 2 * 36);
    assert_int_equal(llmi_kv_row_bytes(LLM_KV_FP8_E4M3, 48), 0);
    assert_int_equal(llmi_kv_row_bytes((llm_kv_type)6, 64), 0);
    assert_int_equal(llmi_kv_block_bytes_type(2, 64, 4, LLM_KV_Q8_0), 2 * 2 * 4 * 2 * 34);
    assert_int_equal(llmi_kv_type_size(LLM_KV_F32), 4);
    assert_int_equal(llmi_kv_type_size(LLM_KV_F16), 2);
    assert_int_equal(llmi_kv_type_size(LLM_KV_BF16), 2);
    assert_int_equal(llmi_kv_type_size(LLM_KV_Q8_0), 0); /* sizes of blocks: row_bytes */
    assert_int_equal(llmi_kv_block_bytes(2, 3, 4), 2 * 2 * 3 * 4 * sizeof(float));
    assert_int_equal(llmi_kv_block_bytes_ex(2, 3, 4, 2), 2 * 2 * 3 * 4 * 2);
    assert_int_equal(kv_new(2, 3, 4, 5, &kv), LLM_OK);
    assert_int_equal(kv->n_free, 5);
    assert_int_equal(llmi_kv_available(kv), 5);
    /* Rows are row_bytes apart, blocks block_size rows. */
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(kv, &seq, 6), LLM_OK);
    llmi_cpu_kv *cs = store_of(kv);
    assert_ptr_equal(row_k(kv, 1, &seq, 1), row_k(kv, 1, &seq, 0) + 3 * cs->elem_size);
    assert_ptr_equal(row_v(kv, 0, &seq, 5),
                     cs->v[0] + ((size_t)seq.blocks[1] * 4 + 1) * cs->row_bytes);
    assert_int_equal(llmi_kv_slot(kv, &seq, 5), seq.blocks[1] * 4 + 1);
    llmi_kv_seq_destroy(kv, &seq);
    check(kv, NULL, 0);
    kv_del(kv);
    llmi_kv_free(NULL);
}

static void test_reserve_release_truncate(void **state) {
    (void)state;
    llmi_kv *kv;
    assert_int_equal(kv_new(2, 3, 4, 8, &kv), LLM_OK);
    llmi_kv_seq a = {0}, b = {0};
    const llmi_kv_seq *all[] = {&a, &b};
    uint64_t keys[64];
    llm_token toks[64];
    for (int i = 0; i < 64; i++)
        toks[i] = i;
    prefix_keys(toks, 64, keys);

    assert_int_equal(llmi_kv_seq_blocks_needed(kv, &a, 10), 3);
    assert_int_equal(llmi_kv_seq_reserve(kv, &a, 0), LLM_OK);
    assert_int_equal(a.n_blocks, 0);
    feed(kv, &a, keys, 10);
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(kv->n_free, 5);
    /* Low ids first. */
    assert_int_equal(a.blocks[0], 0);
    assert_int_equal(a.blocks[2], 2);
    check(kv, all, 2);
    /* Within the held blocks: nothing new. */
    assert_int_equal(llmi_kv_seq_blocks_needed(kv, &a, 12), 0);
    assert_int_equal(llmi_kv_seq_reserve(kv, &a, 12), LLM_OK);
    assert_int_equal(kv->n_free, 5);
    /* Reserve ahead, then truncate trims the unwritten blocks. */
    assert_int_equal(llmi_kv_seq_reserve(kv, &a, 20), LLM_OK);
    assert_int_equal(a.n_blocks, 5);
    assert_int_equal(a.n_tokens, 10);
    llmi_kv_seq_truncate(kv, &a, 10);
    assert_int_equal(a.n_blocks, 3);
    assert_int_equal(kv->n_free, 5);
    llmi_kv_seq_truncate(kv, &a, 5);
    assert_int_equal(a.n_blocks, 2);
    assert_int_equal(a.n_tokens, 5);
    assert_int_equal(kv->n_free, 6);
    llmi_kv_seq_truncate(kv, &a, 9); /* cannot grow */
    assert_int_equal(a.n_tokens, 5);
    assert_int_equal(a.n_blocks, 2);
    verify(kv, &a, keys);
    check(kv, all, 2);
    feed(kv, &a, keys, 16);
    verify(kv, &a, keys);

    /* LIMIT: the pool has 8 blocks. */
    assert_int_equal(llmi_kv_seq_blocks_needed(kv, &b, 33), 9);
    snap s;
    take(&s, kv, &b);
    assert_int_equal(llmi_kv_seq_reserve(kv, &b, 33), LLM_ERR_LIMIT);
    same(&s, kv, &b);
    feed(kv, &b, keys, 16); /* 4 + 4 blocks: full */
    assert_int_equal(kv->n_free, 0);
    take(&s, kv, &a);
    assert_int_equal(llmi_kv_seq_reserve(kv, &a, 17), LLM_ERR_LIMIT);
    same(&s, kv, &a);
    check(kv, all, 2);

    llmi_kv_seq_release(kv, &a);
    assert_int_equal(a.n_blocks, 0);
    assert_int_equal(a.n_tokens, 0);
    assert_non_null(a.blocks); /* table memory kept */
    assert_int_equal(kv->n_free, 4);
    check(kv, all, 2);
    llmi_kv_seq_destroy(kv, &a);
    assert_null(a.blocks);
    assert_int_equal(a.cap, 0);
    llmi_kv_seq_destroy(kv, &b);
    assert_int_equal(kv->n_free, 8);
    check(kv, all, 2);
    /* Table growth past the first capacity. */
    assert_int_equal(llmi_kv_seq_reserve(kv, &a, 32), LLM_OK);
    assert_int_equal(a.n_blocks, 8);
    llmi_kv_seq_destroy(kv, &a);
    kv_del(kv);
    llmi_kv *big;
    assert_int_equal(kv_new(1, 1, 2, 100, &big), LLM_OK);
    assert_int_equal(llmi_kv_seq_reserve(big, &a, 199), LLM_OK);
    assert_int_equal(a.n_blocks, 100);
    assert_true(a.cap >= 100);
    check(big, all, 1);
    llmi_kv_seq_destroy(big, &a);
    kv_del(big);
}

static void test_fork_cow(void **state) {
    (void)state;
    llmi_kv *kv;
    assert_int_equal(kv_new(2, 4, 4, 16, &kv), LLM_OK);
    llm_token tp[32], tc[32];
    uint64_t kp[32], kc[32];
    for (int i = 0; i < 32; i++)
        tp[i] = tc[i] = 100 + i;
    for (int i = 10; i < 32; i++)
        tc[i] = 500 + i; /* child diverges at 10 */
    prefix_keys(tp, 32, kp);
    prefix_keys(tc, 32, kc);

    llmi_kv_seq p = {0}, c = {0}, g = {0};
    const llmi_kv_seq *all[] = {&p, &c, &g};
    feed(kv, &p, kp, 10);
    assert_int_equal(llmi_kv_seq_fork(kv, &p, &c), LLM_OK);
    assert_int_equal(c.n_blocks, 3);
    assert_int_equal(c.n_tokens, 10);
    assert_ptr_not_equal(c.blocks, p.blocks);
    for (int i = 0; i < 3; i++)
        assert_int_equal(kv->ref[p.blocks[i]], 2);
    assert_int_equal(kv->n_free, 13);
    check(kv, all, 3);
    /* Forking into a sequence that is not empty is refused. */
    assert_int_equal(llmi_kv_seq_fork(kv, &c, &p), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llmi_kv_seq_fork(kv, &c, &c), LLM_ERR_INVALID_ARGUMENT);

    /* Child writes 10..13: copies block 2, adds block 3. */
    assert_int_equal(llmi_kv_seq_blocks_needed(kv, &c, 14), 2);
    feed(kv, &c, kc, 14);
    assert_int_equal(kv->cow_copies, 1);
    assert_int_equal(c.blocks[0], p.blocks[0]); /* full shared blocks not copied */
    assert_int_equal(c.blocks[1], p.blocks[1]);
    assert_int_not_equal(c.blocks[2], p.blocks[2]);
    assert_int_equal(kv->ref[p.blocks[0]], 2);
    assert_int_equal(kv->ref[p.blocks[2]], 1);
    assert_int_equal(kv->ref[c.blocks[2]], 1);
    verify(kv, &p, kp); /* parent unchanged */
    verify(kv, &c, kc); /* child: parent's 0..9 plus its own 10..13 */
    check(kv, all, 3);

    /* Parent continues in its now private block: no copy. */
    feed(kv, &p, kp, 12);
    assert_int_equal(kv->cow_copies, 1);
    verify(kv, &p, kp);
    verify(kv, &c, kc);

    /* Blocks reserved ahead of n_tokens are shared by a fork as well; writing
     * them replaces them (nothing to copy) in whichever sequence writes. */
    assert_int_equal(llmi_kv_seq_reserve(kv, &p, 24), LLM_OK);
    assert_int_equal(p.n_blocks, 6);
    assert_int_equal(llmi_kv_seq_fork(kv, &p, &g), LLM_OK);
    uint32_t before_free = kv->n_free;
    feed(kv, &g, kp, 24); /* blocks 3,4,5 shared: three replacements */
    assert_int_equal(kv->cow_copies, 4);
    assert_int_equal(kv->n_free, before_free - 3);
    feed(kv, &p, kp, 24); /* now private */
    assert_int_equal(kv->cow_copies, 4);
    verify(kv, &p, kp);
    verify(kv, &g, kp);
    verify(kv, &c, kc);
    check(kv, all, 3);

    /* Fork of a block-aligned sequence: the next write starts a new block. */
    llmi_kv_seq_destroy(kv, &g);
    llmi_kv_seq_truncate(kv, &p, 8);
    assert_int_equal(llmi_kv_seq_fork(kv, &p, &g), LLM_OK);
    feed(kv, &g, kp, 12);
    assert_int_equal(kv->cow_copies, 4);
    verify(kv, &g, kp);
    check(kv, all, 3);

    llmi_kv_seq_destroy(kv, &p);
    check(kv, all, 3);
    verify(kv, &c, kc);
    verify(kv, &g, kp);
    llmi_kv_seq_destroy(kv, &c);
    llmi_kv_seq_destroy(kv, &g);
    assert_int_equal(kv->n_free, 16);
    check(kv, all, 3);
    kv_del(kv);
}

static void test_prefix_basic(void **state) {
    (void)state;
    llmi_kv *kv;
    assert_int_equal(kv_new(2, 2, 4, 8, &kv), LLM_OK);
    llm_token ta[16], tb[16], tx[16];
    uint64_t ka[16], kb[16], kx[16];
    for (int i = 0; i < 16; i++) {
        ta[i] = 7 * i + 1;
        tb[i] = i < 10 ? ta[i] : 900 + i;
        tx[i] = 5000 + i;
    }
    prefix_keys(ta, 16, ka);
    prefix_keys(tb, 16, kb);
    prefix_keys(tx, 16, kx);
    llmi_kv_seq a = {0}, b = {0}, c = {0};
    const llmi_kv_seq *all[] = {&a, &b, &c};

    feed(kv, &a, ka, 14);
    llmi_kv_seq_commit(kv, &a, ta);
    assert_int_equal(a.n_hashed, 3);
    check(kv, all, 3);
    llmi_kv_seq_commit(kv, &a, ta); /* idempotent */
    assert_int_equal(a.n_hashed, 3);
    uint32_t a_blocks[4];
    memcpy(a_blocks, a.blocks, sizeof a_blocks);
    llmi_kv_seq_release(kv, &a);
    assert_int_equal(kv->n_cached, 3);
    assert_int_equal(kv->n_free, 5);
    assert_int_equal(llmi_kv_available(kv), 8);
    check(kv, all, 3);

    /* Common prefix of 10 tokens: two whole blocks. */
    assert_int_equal(llmi_kv_prefix_match(kv, &b, tb, 16), 8);
    assert_int_equal(b.n_tokens, 8);
    assert_int_equal(b.n_blocks, 2);
    assert_int_equal(b.n_hashed, 2);
    assert_int_equal(b.blocks[0], a_blocks[0]);
    assert_int_equal(b.blocks[1], a_blocks[1]);
    assert_int_equal(kv->prefix_hit_tokens, 8);
    assert_int_equal(kv->n_cached, 1);
    verify(kv, &b, kb);
    check(kv, all, 3);
    /* A second match of a live registered block shares it. */
    assert_int_equal(llmi_kv_prefix_match(kv, &c, ta, 7), 4);
    assert_int_equal(c.blocks[0], a_blocks[0]);
    assert_int_equal(kv->ref[a_blocks[0]], 2);
    assert_int_equal(kv->prefix_hit_tokens, 12);
    check(kv, all, 3);
    /* Matching needs an empty sequence. */
    assert_int_equal(llmi_kv_prefix_match(kv, &c, ta, 16), 0);
    assert_int_equal(c.n_tokens, 4);
    llmi_kv_seq_release(kv, &c);
    assert_int_equal(llmi_kv_prefix_match(kv, &c, ta, 3), 0);
    assert_int_equal(c.n_blocks, 0);
    check(kv, all, 3);

    /* b continues with its own tokens and commits them. */
    feed(kv, &b, kb, 16);
    verify(kv, &b, kb);
    llmi_kv_seq_commit(kv, &b, tb);
    assert_int_equal(b.n_hashed, 4);
    check(kv, all, 3);
    /* Truncating into a registered block keeps it registered until written. */
    llmi_kv_seq_truncate(kv, &b, 6);
    assert_int_equal(b.n_hashed, 1);
    assert_int_equal(b.n_blocks, 2);
    check(kv, all, 3);
    /* Blocks 1 (held by b) and 2, 3 (cached) still match. */
    assert_int_equal(llmi_kv_prefix_match(kv, &c, tb, 16), 16);
    assert_int_equal(c.blocks[1], b.blocks[1]);
    verify(kv, &c, kb);
    llmi_kv_seq_release(kv, &c);
    assert_int_equal(llmi_kv_prefix_match(kv, &c, tb, 8), 8);
    uint64_t cow = kv->cow_copies;
    feed(kv, &b, kx, 8); /* b writes other data into shared block 1: copy */
    assert_int_equal(kv->cow_copies, cow + 1);
    assert_int_not_equal(c.blocks[1], b.blocks[1]);
    verify(kv, &c, kb);
    check(kv, all, 3);
    /* Held once and registered: writing unregisters it instead. */
    llmi_kv_seq_release(kv, &c);
    assert_int_equal(llmi_kv_prefix_match(kv, &c, tb, 8), 8);
    assert_int_equal(kv->ref[c.blocks[1]], 1);
    llmi_kv_seq_truncate(kv, &c, 5);
    assert_int_equal(c.n_hashed, 1);
    cow = kv->cow_copies;
    feed(kv, &c, kx, 8);
    assert_int_equal(kv->cow_copies, cow);
    check(kv, all, 3);
    llmi_kv_seq_release(kv, &c);
    assert_int_equal(llmi_kv_prefix_match(kv, &c, tb, 16), 4); /* block 1 is gone */
    llmi_kv_seq_release(kv, &c);
    llmi_kv_seq_release(kv, &b);
    check(kv, all, 3);

    /* A duplicate computed without matching stays unregistered. */
    llmi_kv_prefix_clear(kv);
    assert_int_equal(kv->n_free, 8);
    assert_int_equal(kv->n_cached, 0);
    feed(kv, &a, ka, 8);
    llmi_kv_seq_commit(kv, &a, ta);
    feed(kv, &b, ka, 8);
    llmi_kv_seq_commit(kv, &b, ta);
    assert_int_equal(b.n_hashed, 2);
    check(kv, all, 3);
    llmi_kv_seq_release(kv, &b);
    assert_int_equal(kv->n_cached, 0); /* b's duplicates went to the free stack */
    assert_int_equal(kv->n_free, 6);
    /* prefix_clear also unregisters blocks in use. */
    llmi_kv_prefix_clear(kv);
    assert_int_equal(llmi_kv_prefix_match(kv, &b, ta, 8), 0);
    llmi_kv_seq_release(kv, &a);
    assert_int_equal(kv->n_free, 8);
    check(kv, all, 3);

    llmi_kv_seq_destroy(kv, &a);
    llmi_kv_seq_destroy(kv, &b);
    llmi_kv_seq_destroy(kv, &c);
    kv_del(kv);
}

static void test_prefix_lru(void **state) {
    (void)state;
    llmi_kv *kv;
    assert_int_equal(kv_new(1, 2, 4, 8, &kv), LLM_OK);
    llm_token t[4][4];
    uint64_t k[4][4];
    for (int s = 0; s < 4; s++) {
        for (int i = 0; i < 4; i++)
            t[s][i] = 10 * s + i;
        prefix_keys(t[s], 4, k[s]);
    }
    llmi_kv_seq q[4] = {{0}}, big = {0};
    const llmi_kv_seq *all[] = {&q[0], &q[1], &q[2], &q[3], &big};
    uint64_t junk[32];
    llm_token jt[32];
    for (int i = 0; i < 32; i++)
        jt[i] = 1000 + i;
    prefix_keys(jt, 32, junk);

    /* Cache X=0, Y=1, Z=2, released in that order: LRU X, Y, Z. */
    for (int s = 0; s < 3; s++) {
        feed(kv, &q[s], k[s], 4);
        llmi_kv_seq_commit(kv, &q[s], t[s]);
    }
    for (int s = 0; s < 3; s++)
        llmi_kv_seq_release(kv, &q[s]);
    assert_int_equal(kv->n_cached, 3);
    assert_int_equal(kv->n_free, 5);
    /* Touch X: match and release it again, so Y is now the oldest. */
    assert_int_equal(llmi_kv_prefix_match(kv, &q[0], t[0], 4), 4);
    llmi_kv_seq_release(kv, &q[0]);
    check(kv, all, 5);

    /* The free stack goes first: no evictions while it lasts. */
    feed(kv, &big, junk, 20);
    assert_int_equal(kv->n_free, 0);
    assert_int_equal(kv->evictions, 0);
    assert_int_equal(kv->n_cached, 3);
    /* Then the least recently used: Y. */
    feed(kv, &big, junk, 24);
    assert_int_equal(kv->evictions, 1);
    assert_int_equal(kv->n_cached, 2);
    check(kv, all, 5);
    assert_int_equal(llmi_kv_prefix_match(kv, &q[1], t[1], 4), 0); /* evicted: miss */
    assert_int_equal(llmi_kv_prefix_match(kv, &q[0], t[0], 4), 4);
    assert_int_equal(llmi_kv_prefix_match(kv, &q[2], t[2], 4), 4);
    verify(kv, &q[0], k[0]);
    verify(kv, &q[2], k[2]);
    assert_int_equal(kv->n_cached, 0);
    assert_int_equal(llmi_kv_available(kv), 0);
    snap s;
    take(&s, kv, &big);
    assert_int_equal(llmi_kv_seq_reserve(kv, &big, 25), LLM_ERR_LIMIT);
    same(&s, kv, &big);
    /* Release Z then X: Z is evicted first. */
    llmi_kv_seq_release(kv, &q[2]);
    llmi_kv_seq_release(kv, &q[0]);
    feed(kv, &big, junk, 28);
    assert_int_equal(kv->evictions, 2);
    assert_int_equal(llmi_kv_prefix_match(kv, &q[2], t[2], 4), 0);
    assert_int_equal(llmi_kv_prefix_match(kv, &q[0], t[0], 4), 4);
    verify(kv, &q[0], k[0]);
    check(kv, all, 5);
    for (int i = 0; i < 4; i++)
        llmi_kv_seq_destroy(kv, &q[i]);
    llmi_kv_seq_destroy(kv, &big);
    assert_int_equal(kv->n_free + kv->n_cached, 8);
    check(kv, all, 5);
    kv_del(kv);
}

/* With every hash forced to 0, equal hashes must not attach wrong blocks. */
static void test_prefix_collision(void **state) {
    (void)state;
    llmi_kv *kv;
    assert_int_equal(kv_new(1, 2, 4, 8, &kv), LLM_OK);
    llmi_kv_test_hash_bits(kv, 0);
    llm_token t1[8] = {1, 2, 3, 4, 1, 2, 3, 4}, t2[8] = {5, 6, 7, 8, 1, 2, 3, 4};
    uint64_t k1[8], k2[8];
    prefix_keys(t1, 8, k1);
    prefix_keys(t2, 8, k2);
    llmi_kv_seq a = {0}, b = {0};
    const llmi_kv_seq *all[] = {&a, &b};
    feed(kv, &a, k1, 4);
    llmi_kv_seq_commit(kv, &a, t1);
    feed(kv, &b, k2, 4);
    llmi_kv_seq_commit(kv, &b, t2); /* hash taken by a's block: stays unregistered */
    assert_int_equal(b.n_hashed, 1);
    check(kv, all, 2);
    llmi_kv_seq_release(kv, &a);
    llmi_kv_seq_release(kv, &b);
    assert_int_equal(kv->n_cached, 1);
    /* Same hash, different tokens: rejected. */
    assert_int_equal(llmi_kv_prefix_match(kv, &b, t2, 8), 0);
    /* Block 1 of t1 has t1's block-0 tokens and hash but another position
     * and parent: only block 0 matches. */
    assert_int_equal(llmi_kv_prefix_match(kv, &a, t1, 8), 4);
    verify(kv, &a, k1);
    check(kv, all, 2);
    feed(kv, &a, k1, 8);
    llmi_kv_seq_commit(kv, &a, t1); /* block 1: hash taken, unregistered */
    check(kv, all, 2);
    llmi_kv_seq_destroy(kv, &a);
    llmi_kv_seq_destroy(kv, &b);
    llmi_kv_prefix_clear(kv);
    assert_int_equal(kv->n_free, 8);
    check(kv, all, 2);
    kv_del(kv);
}

/* ---- sliding-window release ---- */

static void test_release_before(void **state) {
    (void)state;
    llmi_kv *kv;
    assert_int_equal(kv_new(2, 2, 4, 12, &kv), LLM_OK);
    llm_token t[24];
    uint64_t k[24];
    for (int i = 0; i < 24; i++)
        t[i] = 3 * i + 2;
    prefix_keys(t, 24, k);
    llmi_kv_seq a = {0}, b = {0}, c = {0}, twin = {0};
    const llmi_kv_seq *all[] = {&a, &b, &c, &twin};

    feed(kv, &a, k, 14);
    llmi_kv_seq_commit(kv, &a, t);
    uint32_t first_blocks[2] = {a.blocks[0], a.blocks[1]};
    /* Position 9 lies in block 2: blocks 0 and 1 lie wholly before it. */
    assert_int_equal(llmi_kv_seq_release_before(kv, &a, 9), 2);
    assert_int_equal(a.n_holes, 2);
    assert_int_equal(llmi_kv_seq_first_pos(kv, &a), 8);
    assert_int_equal(a.blocks[0], LLMI_KV_HOLE);
    assert_int_equal(a.blocks[1], LLMI_KV_HOLE);
    assert_int_equal(a.n_blocks, 4);
    /* Registered, held by nobody else: into the prefix cache. */
    assert_int_equal(kv->n_cached, 2);
    assert_int_equal(kv->ref[first_blocks[0]], 0);
    assert_int_equal(llmi_kv_seq_release_before(kv, &a, 9), 0); /* idempotent */
    verify(kv, &a, k);
    check(kv, all, 4);

    /* The released blocks still serve a prefix match, with their data. */
    assert_int_equal(llmi_kv_prefix_match(kv, &b, t, 24), 12);
    assert_int_equal(b.blocks[0], first_blocks[0]);
    verify(kv, &b, k);
    check(kv, all, 4);
    llmi_kv_seq_release(kv, &b);

    /* A fork keeps the holes and shares the rest. */
    assert_int_equal(llmi_kv_seq_fork(kv, &a, &c), LLM_OK);
    assert_int_equal(c.n_holes, 2);
    assert_int_equal(c.blocks[1], LLMI_KV_HOLE);
    assert_int_equal(kv->ref[a.blocks[2]], 2);
    feed(kv, &c, k, 20);
    verify(kv, &c, k);
    check(kv, all, 4);

    /* Truncation stops at the first live position; the chain resumes from
     * the last hole's hash. */
    uint64_t hash3 = 0;
    feed(kv, &a, k, 16);
    llmi_kv_seq_commit(kv, &a, t);
    hash3 = a.last_hash;
    llmi_kv_seq_truncate(kv, &a, 3);
    assert_int_equal(a.n_tokens, 8);
    assert_int_equal(a.n_blocks, 2);
    assert_int_equal(a.n_hashed, 2);
    assert_true(a.last_hash == a.hole_hash);
    check(kv, all, 4);
    feed(kv, &a, k, 16);
    llmi_kv_seq_commit(kv, &a, t);
    assert_true(a.last_hash == hash3);
    verify(kv, &a, k);
    check(kv, all, 4);

    /* Released before hashing: commit hashes the holes from the tokens,
     * giving the same chain as a sequence that kept its blocks. */
    llmi_kv_prefix_clear(kv);
    llmi_kv_seq_release(kv, &c);
    feed(kv, &c, k, 17);
    assert_int_equal(llmi_kv_seq_release_before(kv, &c, 100), 4); /* up to n_tokens */
    assert_int_equal(c.n_hashed, 0);
    assert_int_equal(kv->n_cached, 0); /* unregistered: freed */
    check(kv, all, 4);
    llmi_kv_seq_commit(kv, &c, t);
    assert_int_equal(c.n_hashed, 4);
    check(kv, all, 4);
    feed(kv, &twin, k, 17);
    llmi_kv_seq_commit(kv, &twin, t);
    assert_true(twin.last_hash == c.last_hash);
    assert_true(twin.last_hash == c.hole_hash);

    /* A block-aligned sequence can lose every block and grow again. */
    llmi_kv_seq_truncate(kv, &c, 16);
    assert_int_equal(c.n_blocks, 4);
    assert_int_equal(llmi_kv_seq_blocks_needed(kv, &c, 18), 1);
    feed(kv, &c, k, 18);
    verify(kv, &c, k);
    check(kv, all, 4);

    /* The check sees a hole out of place and a broken chain past holes. */
    assert_int_equal(a.n_holes, 2);
    a.n_holes = 1;
    assert_int_equal(llmi_kv_check(kv, all, 4), LLM_ERR_INTERNAL);
    assert_non_null(strstr(llmi_error_message(), "hole"));
    a.n_holes = 2;
    a.hole_hash ^= 1;
    assert_int_equal(llmi_kv_check(kv, all, 4), LLM_ERR_INTERNAL);
    assert_non_null(strstr(llmi_error_message(), "chain"));
    a.hole_hash ^= 1;
    check(kv, all, 4);

    llmi_kv_seq_destroy(kv, &a);
    llmi_kv_seq_destroy(kv, &b);
    llmi_kv_seq_destroy(kv, &c);
    llmi_kv_seq_destroy(kv, &twin);
    check(kv, all, 4);
    llmi_kv_prefix_clear(kv);
    assert_int_equal(kv->n_free, 12);
    kv_del(kv);
}

/* ---- randomized soak ---- */

enum { SOAK_SEQS = 8, SOAK_LEN = 64, SOAK_PREFIXES = 3, SOAK_OPS = 30000 };

typedef struct slot {
    bool live;
    llmi_kv_seq seq;
    llm_token tok[SOAK_LEN];
    uint64_t key[SOAK_LEN];
} slot;

static void soak_tokens(uint64_t *rng, llm_token (*prefix)[SOAK_LEN], slot *s, uint32_t from) {
    uint32_t p = rnd(rng, SOAK_PREFIXES), shared = rnd(rng, SOAK_LEN + 1);
    for (uint32_t i = from; i < SOAK_LEN; i++)
        s->tok[i] = i < shared && from == 0 ? prefix[p][i] : (llm_token)rnd(rng, 4);
    prefix_keys(s->tok, SOAK_LEN, s->key);
}

static void test_soak(void **state) {
    (void)state;
    const uint32_t bs = 4, n_blocks = 40;
    uint64_t seed = 0x4b56c0ffee;
    const char *env = getenv("LLM_TEST_SEED");
    if (env)
        seed = strtoull(env, NULL, 0);
    printf("# soak seed 0x%llx, %d ops, %u blocks of %u\n", (unsigned long long)seed, SOAK_OPS,
           n_blocks, bs);
    uint64_t rng = seed;
    llmi_kv *kv;
    assert_int_equal(kv_new(2, 2, bs, n_blocks, &kv), LLM_OK);
    static llm_token prefix[SOAK_PREFIXES][SOAK_LEN];
    for (int p = 0; p < SOAK_PREFIXES; p++)
        for (int i = 0; i < SOAK_LEN; i++)
            prefix[p][i] = (llm_token)(100 * (p + 1) + rnd(&rng, 50));
    static slot sl[SOAK_SEQS];
    memset(sl, 0, sizeof sl);
    const llmi_kv_seq *live[SOAK_SEQS];
    uint64_t n_ops[8] = {0}, n_limit = 0, n_match_calls = 0, n_clear = 0;

    for (int op = 0; op < SOAK_OPS; op++) {
        uint32_t i = rnd(&rng, SOAK_SEQS);
        slot *s = &sl[i];
        uint32_t kind = rnd(&rng, 100);
        if (!s->live) {
            /* Open: match a prefix, maybe fork instead. */
            uint32_t j = rnd(&rng, SOAK_SEQS);
            if (kind < 30 && sl[j].live && j != i) {
                assert_int_equal(llmi_kv_seq_fork(kv, &sl[j].seq, &s->seq), LLM_OK);
                memcpy(s->tok, sl[j].tok, sizeof s->tok);
                memcpy(s->key, sl[j].key, sizeof s->key);
                n_ops[0]++;
            } else {
                soak_tokens(&rng, prefix, s, 0);
                uint32_t max = rnd(&rng, SOAK_LEN + 1);
                uint32_t got = llmi_kv_prefix_match(kv, &s->seq, s->tok, max);
                assert_true(got % bs == 0 && got <= max);
                assert_int_equal(s->seq.n_tokens, got);
                n_match_calls++;
                n_ops[1]++;
            }
            s->live = true;
        } else if (kind < 40) {
            /* Extend. */
            uint32_t n = s->seq.n_tokens + 1 + rnd(&rng, 24);
            if (n > SOAK_LEN)
                n = SOAK_LEN;
            uint32_t need = llmi_kv_seq_blocks_needed(kv, &s->seq, n);
            uint32_t nb_before = s->seq.n_blocks;
            snap before;
            take(&before, kv, &s->seq);
            llm_status st = llmi_kv_seq_reserve(kv, &s->seq, n);
            if (st == LLM_ERR_LIMIT) {
                assert_true(need > before.n_free + before.n_cached);
                same(&before, kv, &s->seq);
                n_limit++;
            } else {
                assert_int_equal(st, LLM_OK);
                uint32_t added = s->seq.n_blocks - nb_before;
                assert_int_equal(kv->cow_copies - before.cow + added, need);
                /* Cached blocks are evicted only when the free stack is empty. */
                uint32_t evict = need > before.n_free ? need - before.n_free : 0;
                assert_int_equal(kv->evictions - before.evictions, evict);
                for (uint32_t p = s->seq.n_tokens; p < n; p++)
                    write_pos(kv, &s->seq, p, s->key[p]);
                if (n > s->seq.n_tokens)
                    s->seq.n_tokens = n;
            }
            n_ops[2]++;
        } else if (kind < 45) {
            /* A window moving on: release what lies before some position. */
            uint32_t first = llmi_kv_seq_first_pos(kv, &s->seq);
            uint32_t pos = rnd(&rng, s->seq.n_tokens + bs);
            uint32_t held = s->seq.n_blocks - s->seq.n_holes;
            uint32_t got = llmi_kv_seq_release_before(kv, &s->seq, pos);
            uint32_t cut = (pos < s->seq.n_tokens ? pos : s->seq.n_tokens) / bs;
            assert_int_equal(got, cut > first / bs ? cut - first / bs : 0);
            assert_int_equal(s->seq.n_blocks - s->seq.n_holes, held - got);
            n_ops[6]++;
        } else if (kind < 65) {
            llmi_kv_seq_commit(kv, &s->seq, s->tok);
            assert_int_equal(s->seq.n_hashed, s->seq.n_tokens / bs);
            n_ops[3]++;
        } else if (kind < 77) {
            uint32_t first = llmi_kv_seq_first_pos(kv, &s->seq);
            uint32_t n = first + rnd(&rng, s->seq.n_tokens - first + 1);
            llmi_kv_seq_truncate(kv, &s->seq, n);
            assert_int_equal(s->seq.n_tokens, n);
            if (rnd(&rng, 2)) {
                for (uint32_t p = n; p < SOAK_LEN; p++)
                    s->tok[p] = (llm_token)rnd(&rng, 4);
                prefix_keys(s->tok, SOAK_LEN, s->key);
            }
            n_ops[4]++;
        } else if (kind < 99) {
            if (rnd(&rng, 4) == 0)
                llmi_kv_seq_destroy(kv, &s->seq);
            else
                llmi_kv_seq_release(kv, &s->seq);
            s->live = false;
            n_ops[5]++;
        } else if (rnd(&rng, 10) == 0) {
            llmi_kv_prefix_clear(kv);
            assert_int_equal(kv->n_cached, 0);
            n_clear++;
        }
        size_t n_live = 0;
        for (int k = 0; k < SOAK_SEQS; k++) {
            if (!sl[k].live)
                continue;
            live[n_live++] = &sl[k].seq;
            verify(kv, &sl[k].seq, sl[k].key);
        }
        llm_status st = llmi_kv_check(kv, live, n_live);
        if (st != LLM_OK)
            fail_msg("op %d: %s", op, llmi_error_message());
    }
    printf("# soak: %llu forks, %llu opens with match, %llu extends (%llu LIMIT), %llu commits, "
           "%llu truncates, %llu releases, %llu clears, %llu window releases\n",
           (unsigned long long)n_ops[0], (unsigned long long)n_ops[1], (unsigned long long)n_ops[2],
           (unsigned long long)n_limit, (unsigned long long)n_ops[3], (unsigned long long)n_ops[4],
           (unsigned long long)n_ops[5], (unsigned long long)n_clear, (unsigned long long)n_ops[6]);
    printf("# soak: %llu prefix hit tokens, %llu evictions, %llu CoW copies\n",
           (unsigned long long)kv->prefix_hit_tokens, (unsigned long long)kv->evictions,
           (unsigned long long)kv->cow_copies);
    assert_true(kv->prefix_hit_tokens > 0);
    assert_true(kv->evictions > 0);
    assert_true(kv->cow_copies > 0);
    assert_true(n_limit > 0);
    for (int k = 0; k < SOAK_SEQS; k++)
        llmi_kv_seq_destroy(kv, &sl[k].seq);
    check(kv, NULL, 0);
    assert_int_equal(kv->n_free + kv->n_cached, n_blocks);
    llmi_kv_prefix_clear(kv);
    assert_int_equal(kv->n_free, n_blocks);
    check(kv, NULL, 0);
    kv_del(kv);
}

/* ---- allocation failures ---- */

static void test_alloc_failures(void **state) {
    (void)state;
    llmi_kv *kv = NULL;
    int n;
    for (n = 1;; n++) {
        llmi_alloc_fail_after((uint64_t)n);
        llm_status st = kv_new(3, 2, 4, 16, &kv);
        llmi_alloc_fail_after(0);
        if (st == LLM_OK)
            break;
        assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
        assert_null(kv);
        assert_true(n < 100);
    }
    assert_true(n > 10);
    llm_token t[64];
    uint64_t k[64];
    for (int i = 0; i < 64; i++)
        t[i] = i;
    prefix_keys(t, 64, k);
    llmi_kv_seq a = {0}, b = {0};
    const llmi_kv_seq *all[] = {&a, &b};

    /* First table allocation. */
    snap s;
    take(&s, kv, &a);
    llmi_alloc_fail_after(1);
    assert_int_equal(llmi_kv_seq_reserve(kv, &a, 5), LLM_ERR_OUT_OF_MEMORY);
    llmi_alloc_fail_after(0);
    same(&s, kv, &a);
    check(kv, all, 2);
    /* Growth past 8 entries, with a shared partial block to copy: nothing
     * is copied or allocated when the table cannot grow. */
    feed(kv, &a, k, 30);
    llmi_kv_seq_commit(kv, &a, t);
    assert_int_equal(llmi_kv_seq_fork(kv, &a, &b), LLM_OK);
    take(&s, kv, &b);
    llmi_alloc_fail_after(1);
    assert_int_equal(llmi_kv_seq_reserve(kv, &b, 40), LLM_ERR_OUT_OF_MEMORY);
    llmi_alloc_fail_after(0);
    same(&s, kv, &b);
    check(kv, all, 2);
    feed(kv, &b, k, 40);
    verify(kv, &b, k);
    llmi_kv_seq_destroy(kv, &b);
    /* Fork into an empty table. */
    take(&s, kv, &a);
    llmi_alloc_fail_after(1);
    assert_int_equal(llmi_kv_seq_fork(kv, &a, &b), LLM_ERR_OUT_OF_MEMORY);
    llmi_alloc_fail_after(0);
    same(&s, kv, &a);
    assert_int_equal(b.n_blocks, 0);
    check(kv, all, 2);
    /* Match: a failed table growth gives a shorter match. */
    feed(kv, &a, k, 40);
    llmi_kv_seq_commit(kv, &a, t);
    llmi_kv_seq_release(kv, &a);
    llmi_alloc_fail_after(1);
    assert_int_equal(llmi_kv_prefix_match(kv, &b, t, 40), 0);
    llmi_alloc_fail_after(0);
    check(kv, all, 2);
    llmi_alloc_fail_after(2);
    assert_int_equal(llmi_kv_prefix_match(kv, &b, t, 40), 32);
    llmi_alloc_fail_after(0);
    verify(kv, &b, k);
    check(kv, all, 2);
    llmi_kv_seq_destroy(kv, &a);
    llmi_kv_seq_destroy(kv, &b);
    kv_del(kv);
}

static int use_f32(void **state) {
    (void)state;
    g_type = LLM_KV_F32;
    return 0;
}
static int use_f16(void **state) {
    (void)state;
    g_type = LLM_KV_F16;
    return 0;
}
static int use_bf16(void **state) {
    (void)state;
    g_type = LLM_KV_BF16;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_args),    cmocka_unit_test(test_reserve_release_truncate),
        cmocka_unit_test(test_fork_cow),       cmocka_unit_test(test_prefix_basic),
        cmocka_unit_test(test_prefix_lru),     cmocka_unit_test(test_prefix_collision),
        cmocka_unit_test(test_release_before), cmocka_unit_test(test_soak),
        cmocka_unit_test(test_alloc_failures),
    };
    /* Every test on a pool of each element type. */
    int failed = cmocka_run_group_tests_name("kv f32", tests, use_f32, NULL);
    failed += cmocka_run_group_tests_name("kv f16", tests, use_f16, NULL);
    failed += cmocka_run_group_tests_name("kv bf16", tests, use_bf16, NULL);
    return failed;
}
