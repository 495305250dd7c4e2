/* The shard arithmetic of GPU tensor parallelism (cuda/tp_shard.c), on
 * machines without a GPU:
 *   - heads, KV heads (split and replicated), FFN and vocabulary slices for
 *     random shapes (fixed, printed seeds): the slices tile each dimension
 *     in rank order, every rank's query heads read KV heads it holds, and
 *     the first holder of each KV head is the one the owner rule names;
 *   - which sizes split, against a brute force written here from the core's
 *     block table, for random and real models (SmolLM2, Gemma 3), and the
 *     refusal's message naming the sizes that work;
 *   - the column repack of every weight type: the repacked slice,
 *     dequantized by the core's reference code, equals the same columns of
 *     the dequantized whole row bit for bit; ranges off block boundaries are
 *     refused with nothing written;
 *   - rank models of test models of every type and of the real files: the
 *     rank's hyper-parameters, row views and repacked O and down slices;
 *   - the host assembly of logits from vocabulary slices and of K/V rows
 *     from the ranks' heads. */
#include "layout.h"
#include "tp.h"

#include "core/quant.h"
#include "model/testmodel.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
static float rng_float(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static const llmi_ttype weight_types[] = {LLMI_T_F32,  LLMI_T_F16,  LLMI_T_BF16, LLMI_T_Q4_0,
                                          LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1, LLMI_T_Q8_0,
                                          LLMI_T_Q4_K, LLMI_T_Q6_K};
#define N_TYPES (sizeof weight_types / sizeof weight_types[0])

/* ---- the block table ---- */

static void test_type_blocks_match_core(void **state) {
    (void)state;
    const llmi_ttype all[] = {LLMI_T_F32,  LLMI_T_F16,  LLMI_T_BF16, LLMI_T_Q4_0,
                              LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1, LLMI_T_Q8_0,
                              LLMI_T_Q8_1, LLMI_T_Q4_K, LLMI_T_Q6_K, LLMI_T_Q8_K};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const llmi_ttype_info *info = llmi_ttype_get(all[i]);
        uint32_t block = 0, bytes = 0;
        assert_non_null(info);
        assert_true(llmi_cuda_tp_type_block(all[i], &block, &bytes));
        assert_int_equal(block, info->block);
        assert_int_equal(bytes, info->block_bytes);
        assert_int_equal(llmi_cuda_tp_cols_row_bytes(all[i], 4 * block),
                         llmi_ttype_row_bytes(all[i], 4 * block));
    }
    uint32_t block, bytes;
    assert_false(llmi_cuda_tp_type_block((llmi_ttype)99, &block, &bytes));
    assert_int_equal(llmi_cuda_tp_cols_row_bytes(LLMI_T_Q4_K, 128), 0);
}

/* ---- shards of random shapes ---- */

static void check_shards(const llmi_hparams *hp, uint32_t n) {
    uint32_t head_end = 0, ff_end = 0, vocab_end = 0;
    const uint32_t group = hp->n_head / hp->n_head_kv; /* query heads per KV head */
    for (uint32_t r = 0; r < n; r++) {
        llmi_cuda_tp_shard sh;
        llmi_cuda_tp_shard_of(hp, n, r, &sh);
        /* Tiles in rank order. */
        assert_int_equal(sh.head0, head_end);
        assert_int_equal(sh.ff0, ff_end);
        assert_int_equal(sh.vocab0, vocab_end);
        head_end += sh.n_head;
        ff_end += sh.n_ff;
        vocab_end += sh.n_vocab;
        assert_true(sh.n_head > 0 && sh.n_ff > 0 && sh.n_vocab > 0 && sh.n_kv > 0);
        /* The rank's query heads read only KV heads it holds, as the
         * attention of a rank sees them: local head h reads local KV head
         * h / (n_head / n_kv). */
        assert_int_equal(sh.n_head % sh.n_kv, 0);
        for (uint32_t h = 0; h < sh.n_head; h++) {
            uint32_t kv = (sh.head0 + h) / group;
            assert_true(kv >= sh.kv0 && kv < sh.kv0 + sh.n_kv);
            assert_int_equal(kv - sh.kv0, h / (sh.n_head / sh.n_kv));
        }
        assert_true(sh.kv0 + sh.n_kv <= hp->n_head_kv);
    }
    assert_int_equal(head_end, hp->n_head);
    assert_int_equal(ff_end, hp->n_ff);
    assert_int_equal(vocab_end, hp->n_vocab);
    /* The owner of each KV head is the first rank holding it. */
    for (uint32_t k = 0; k < hp->n_head_kv; k++) {
        uint32_t first = n;
        for (uint32_t r = 0; r < n && first == n; r++) {
            uint32_t kv0, n_kv;
            llmi_cuda_tp_kv_heads(hp->n_head_kv, n, r, &kv0, &n_kv);
            if (k >= kv0 && k < kv0 + n_kv)
                first = r;
        }
        assert_true(first < n);
        assert_int_equal(llmi_cuda_tp_kv_owner(hp->n_head_kv, n, k), first);
    }
}

static void test_shards_random(void **state) {
    (void)state;
    uint64_t seed = 0x7a11e1u;
    printf("seed %#llx\n", (unsigned long long)seed);
    uint32_t checked = 0;
    for (int it = 0; it < 2000; it++) {
        llmi_hparams hp = {0};
        const uint32_t n = rng_range(&seed, 1, LLMI_CUDA_TP_MAX);
        /* Head counts that split: n_head_kv a multiple of n, or a divisor
         * of n; n_head a multiple of n and of n_head_kv. */
        if (rng_next(&seed) % 2)
            hp.n_head_kv = n * rng_range(&seed, 1, 4);
        else {
            uint32_t d[8], nd = 0;
            for (uint32_t k = 1; k <= n; k++)
                if (n % k == 0)
                    d[nd++] = k;
            hp.n_head_kv = d[rng_next(&seed) % nd];
        }
        uint32_t lcm = hp.n_head_kv;
        while (lcm % n)
            lcm += hp.n_head_kv;
        hp.n_head = lcm * rng_range(&seed, 1, 4);
        hp.n_ff = rng_range(&seed, n, 40000);
        hp.n_vocab = rng_range(&seed, n, 300000);
        check_shards(&hp, n);
        checked++;
    }
    printf("%u random shapes\n", checked);
}

/* ---- which sizes split: a brute force from the core's block table ---- */

static bool cols_ok(const llmi_weight *w, uint32_t c0, uint32_t n_cols) {
    if (!w->data)
        return true;
    const uint32_t b = llmi_ttype_get(w->type)->block;
    return c0 % b == 0 && n_cols % b == 0;
}

static bool expect_splits(const llm_model *m, uint32_t n) {
    const llmi_hparams *hp = &m->hp;
    if (n == 1)
        return true;
    if (hp->n_head % n || (hp->n_head_kv % n && n % hp->n_head_kv))
        return false;
    for (uint32_t r = 0; r < n; r++) {
        const uint32_t q = hp->n_head / n * hp->head_dim;
        const uint32_t f0 = (uint32_t)((uint64_t)hp->n_ff * r / n);
        const uint32_t f1 = (uint32_t)((uint64_t)hp->n_ff * (r + 1) / n);
        for (uint32_t l = 0; l < hp->n_layer; l++)
            if (!cols_ok(&m->layers[l].w[LLMI_ROLE_O], r * q, q) ||
                !cols_ok(&m->layers[l].w[LLMI_ROLE_DOWN], f0, f1 - f0))
                return false;
    }
    return true;
}

/* Checks llmi_cuda_tp_check at every size against the brute force;
 * returns the sizes that work, "1, 3" style, in ok. */
static void check_sizes(const llm_model *m, char *ok, size_t cap) {
    size_t len = 0;
    ok[0] = '\0';
    for (uint32_t n = 1; n <= LLMI_CUDA_TP_MAX; n++)
        if (expect_splits(m, n))
            len += (size_t)snprintf(ok + len, cap - len, "%s%u", len ? ", " : "", n);
    char want[96];
    snprintf(want, sizeof want, "(sizes that work: %s)", ok);
    for (uint32_t n = 0; n <= LLMI_CUDA_TP_MAX + 1; n++) {
        char why[512] = "";
        llm_status st = llmi_cuda_tp_check(m, n, why, sizeof why);
        const bool splits = n >= 1 && n <= LLMI_CUDA_TP_MAX && expect_splits(m, n);
        assert_int_equal(st, splits ? LLM_OK : LLM_ERR_UNSUPPORTED);
        if (!splits && !strstr(why, ok))
            fail_msg("tp %u: '%s' does not name the sizes that work (%s)", n, why, ok);
        if (!splits && n >= 1 && n <= LLMI_CUDA_TP_MAX && !strstr(why, want))
            fail_msg("tp %u: '%s' lacks '%s'", n, why, want);
    }
}

/* ---- rank models ---- */

/* Dequantizes row i of columns [c0, c0 + n_cols) of w (a whole row, cut
 * after) into out. */
static void whole_row_cols(const llmi_weight *w, int64_t i, uint32_t c0, uint32_t n_cols,
                           float *scratch, float *out) {
    llmi_dequantize_row(w->type, (const char *)w->data + (size_t)i * w->row_bytes, scratch,
                        w->cols);
    memcpy(out, scratch + c0, n_cols * sizeof *out);
}

static void check_cols_slice(const llmi_weight *whole, const llmi_weight *slice, uint32_t c0,
                             uint32_t n_cols) {
    assert_int_equal(slice->rows, whole->rows);
    assert_int_equal(slice->cols, n_cols);
    assert_int_equal(slice->type, whole->type);
    assert_int_equal(slice->row_bytes, llmi_ttype_row_bytes(whole->type, n_cols));
    float *scratch = malloc((size_t)whole->cols * sizeof *scratch);
    float *want = malloc((size_t)n_cols * sizeof *want),
          *got = malloc((size_t)n_cols * sizeof *got);
    assert_true(scratch && want && got);
    for (int64_t i = 0; i < whole->rows; i++) {
        whole_row_cols(whole, i, c0, n_cols, scratch, want);
        llmi_dequantize_row(slice->type, (const char *)slice->data + (size_t)i * slice->row_bytes,
                            got, n_cols);
        assert_memory_equal(got, want, n_cols * sizeof *got);
    }
    free(scratch);
    free(want);
    free(got);
}

static void check_rows_view(const llmi_weight *whole, const llmi_weight *view, uint64_t row0,
                            uint64_t n_rows) {
    if (!whole->data) {
        assert_null(view->data);
        return;
    }
    assert_ptr_equal(view->data, (const char *)whole->data + row0 * whole->row_bytes);
    assert_int_equal(view->rows, n_rows);
    assert_int_equal(view->cols, whole->cols);
    assert_int_equal(view->row_bytes, whole->row_bytes);
}

static void check_rank_models(const llm_model *m, uint32_t n) {
    const llmi_hparams *hp = &m->hp;
    const uint32_t hd = hp->head_dim;
    for (uint32_t r = 0; r < n; r++) {
        llmi_cuda_tp_rank rk;
        assert_int_equal(llmi_cuda_tp_rank_make(m, n, r, &rk), LLM_OK);
        const llmi_cuda_tp_shard *sh = &rk.shard;
        const llmi_hparams *rh = &rk.m.hp;
        assert_int_equal(rh->n_head, hp->n_head / n);
        assert_int_equal(rh->n_head_kv, sh->n_kv);
        assert_int_equal(rh->n_ff, sh->n_ff);
        assert_int_equal(rh->n_vocab, sh->n_vocab);
        assert_int_equal(rh->n_embd, hp->n_embd);
        assert_int_equal(rh->head_dim, hd);
        assert_int_equal(rh->n_layer, hp->n_layer);
        check_rows_view(&m->w[LLMI_ROLE_OUTPUT], &rk.m.w[LLMI_ROLE_OUTPUT], sh->vocab0,
                        sh->n_vocab);
        assert_ptr_equal(rk.m.w[LLMI_ROLE_TOKEN_EMBD].data, m->w[LLMI_ROLE_TOKEN_EMBD].data);
        assert_int_equal(rk.m.w[LLMI_ROLE_TOKEN_EMBD].rows, hp->n_vocab);
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            const llmi_weight *src = m->layers[l].w, *dst = rk.m.layers[l].w;
            check_rows_view(&src[LLMI_ROLE_Q], &dst[LLMI_ROLE_Q], (uint64_t)sh->head0 * hd,
                            (uint64_t)sh->n_head * hd);
            check_rows_view(&src[LLMI_ROLE_K], &dst[LLMI_ROLE_K], (uint64_t)sh->kv0 * hd,
                            (uint64_t)sh->n_kv * hd);
            check_rows_view(&src[LLMI_ROLE_V], &dst[LLMI_ROLE_V], (uint64_t)sh->kv0 * hd,
                            (uint64_t)sh->n_kv * hd);
            check_rows_view(&src[LLMI_ROLE_GATE], &dst[LLMI_ROLE_GATE], sh->ff0, sh->n_ff);
            check_rows_view(&src[LLMI_ROLE_UP], &dst[LLMI_ROLE_UP], sh->ff0, sh->n_ff);
            if (src[LLMI_ROLE_Q_BIAS].data) {
                assert_ptr_equal(dst[LLMI_ROLE_Q_BIAS].data,
                                 (const float *)src[LLMI_ROLE_Q_BIAS].data + sh->head0 * hd);
                assert_int_equal(dst[LLMI_ROLE_Q_BIAS].cols, sh->n_head * hd);
            }
            /* Replicated. */
            assert_memory_equal(&dst[LLMI_ROLE_ATTN_NORM], &src[LLMI_ROLE_ATTN_NORM],
                                sizeof(llmi_weight));
            assert_memory_equal(&dst[LLMI_ROLE_FFN_NORM], &src[LLMI_ROLE_FFN_NORM],
                                sizeof(llmi_weight));
            check_cols_slice(&src[LLMI_ROLE_O], &dst[LLMI_ROLE_O], sh->head0 * hd, sh->n_head * hd);
            check_cols_slice(&src[LLMI_ROLE_DOWN], &dst[LLMI_ROLE_DOWN], sh->ff0, sh->n_ff);
        }
        /* After the upload only shapes remain, over the whole tensors. */
        llmi_cuda_tp_rank_release_host(&rk, m);
        assert_null(rk.host);
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            assert_ptr_equal(rk.m.layers[l].w[LLMI_ROLE_O].data, m->layers[l].w[LLMI_ROLE_O].data);
            assert_int_equal(rk.m.layers[l].w[LLMI_ROLE_O].cols, sh->n_head * hd);
            assert_ptr_equal(rk.m.layers[l].w[LLMI_ROLE_DOWN].data,
                             m->layers[l].w[LLMI_ROLE_DOWN].data);
            assert_int_equal(rk.m.layers[l].w[LLMI_ROLE_DOWN].cols, sh->n_ff);
        }
        llmi_cuda_tp_rank_free(&rk);
    }
}

static llm_model *load_test_model(const llmi_testmodel_params *p) {
    const char *tmp = getenv("LLM_TEST_TMP");
    char path[512];
    snprintf(path, sizeof path, "%s/tp_shard_%d.gguf", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    assert_int_equal(llmi_testmodel_write(p, path), LLM_OK);
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(path, false, &m), LLM_OK);
    remove(path);
    return m;
}

/* Test models of every weight type: 8 heads of 64, 2 KV heads, n_embd 512,
 * n_ff 1024 (every slice of up to 4 ranks a whole number of 32-blocks;
 * 256-blocks only up to 2 ranks for O). */
static void test_rank_models_every_type(void **state) {
    (void)state;
    for (size_t t = 0; t < N_TYPES; t++) {
        llmi_testmodel_params p;
        llmi_testmodel_params_init(&p);
        p.n_embd = 512;
        p.n_head = 8;
        p.n_head_kv = 2;
        p.n_ff = 1024;
        p.n_layer = 2;
        p.type = weight_types[t];
        p.qkv_bias = true;
        p.seed = 100 + t;
        llm_model *m = load_test_model(&p);
        char ok[64];
        check_sizes(m, ok, sizeof ok);
        printf("%s: sizes that work %s\n", llmi_ttype_get(p.type)->name, ok);
        const bool k_quant = p.type == LLMI_T_Q4_K || p.type == LLMI_T_Q6_K;
        assert_string_equal(ok, k_quant ? "1, 2" : "1, 2, 4, 8");
        for (uint32_t n = 1; n <= LLMI_CUDA_TP_MAX; n++)
            if (expect_splits(m, n))
                check_rank_models(m, n);
        if (k_quant) {
            char why[512];
            assert_int_equal(llmi_cuda_tp_check(m, 4, why, sizeof why), LLM_ERR_UNSUPPORTED);
            printf("  tp 4: %s\n", why);
            assert_non_null(strstr(why, "rank 0's input columns [0, 128) of "
                                        "blk.0.attn_output.weight"));
            assert_non_null(strstr(why, "blocks of 256"));
            /* Making the rank model anyway is refused, not a bad copy. */
            llmi_cuda_tp_rank rk;
            assert_int_equal(llmi_cuda_tp_rank_make(m, 4, 1, &rk), LLM_ERR_UNSUPPORTED);
            assert_null(rk.host);
            assert_null(rk.m.layers);
        }
        llmi_model_free(m);
    }
}

/* Fewer KV heads than ranks, and heads that do not split. */
static void test_heads_refused_and_replicated(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_embd = 384;
    p.n_head = 6;
    p.n_head_kv = 3;
    p.n_ff = 384;
    p.type = LLMI_T_Q8_0;
    llm_model *m = load_test_model(&p);
    char ok[64], why[512];
    check_sizes(m, ok, sizeof ok);
    assert_string_equal(ok, "1, 3, 6");
    assert_int_equal(llmi_cuda_tp_check(m, 2, why, sizeof why), LLM_ERR_UNSUPPORTED);
    printf("%s\n", why);
    assert_non_null(strstr(why, "3 KV heads neither split in 2 nor replicate to 2"));
    assert_int_equal(llmi_cuda_tp_check(m, 4, why, sizeof why), LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "6 attention heads do not split in 4"));
    assert_int_equal(llmi_cuda_tp_check(m, 9, why, sizeof why), LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "groups of 1 to 8 GPUs"));
    check_rank_models(m, 6); /* 3 KV heads on 6 ranks: each held twice */
    llmi_model_free(m);
}

/* ---- the column repack of every type, random shapes ---- */

static void test_repack_every_type(void **state) {
    (void)state;
    uint64_t seed = 0xc0105u;
    printf("seed %#llx\n", (unsigned long long)seed);
    for (size_t t = 0; t < N_TYPES; t++) {
        const llmi_ttype type = weight_types[t];
        const uint32_t block = llmi_ttype_get(type)->block, blocks = rng_range(&seed, 2, 12);
        const uint32_t cols = block * blocks, rows = rng_range(&seed, 1, 9);
        const size_t rb = llmi_ttype_row_bytes(type, cols);
        float *x = malloc((size_t)cols * sizeof *x);
        uint8_t *data = malloc(rows * rb), *dst = malloc(rows * rb);
        assert_true(x && data && dst);
        for (uint32_t i = 0; i < rows; i++) {
            for (uint32_t c = 0; c < cols; c++)
                x[c] = rng_float(&seed) * 3.0f;
            llmi_quantize_row(type, x, data + (size_t)i * rb, cols);
        }
        const llmi_weight w = {data, type, rows, cols, rb};
        for (int k = 0; k < 20; k++) {
            const uint32_t b0 = rng_range(&seed, 0, blocks - 1);
            const uint32_t nb = rng_range(&seed, 1, blocks - b0);
            memset(dst, 0xA5, rows * rb);
            assert_true(llmi_cuda_tp_repack_cols(&w, b0 * block, nb * block, dst));
            const llmi_weight slice = {dst, type, rows, nb * block,
                                       llmi_cuda_tp_cols_row_bytes(type, nb * block)};
            check_cols_slice(&w, &slice, b0 * block, nb * block);
            /* Nothing past the slice's rows was written. */
            const size_t used = (size_t)rows * slice.row_bytes;
            for (size_t b = used; b < rows * rb; b++)
                assert_int_equal(dst[b], 0xA5);
        }
        /* Off a block boundary, or past the row: refused, nothing written. */
        memset(dst, 0xA5, rows * rb);
        if (block > 1) {
            assert_false(llmi_cuda_tp_repack_cols(&w, block / 2, block, dst));
            assert_false(llmi_cuda_tp_repack_cols(&w, 0, block + 1, dst));
        }
        assert_false(llmi_cuda_tp_repack_cols(&w, block, cols, dst));
        for (size_t b = 0; b < rows * rb; b++)
            assert_int_equal(dst[b], 0xA5);
        free(x);
        free(data);
        free(dst);
    }
}

/* ---- host assembly ---- */

static void test_place_logits(void **state) {
    (void)state;
    uint64_t seed = 0x10917u;
    printf("seed %#llx\n", (unsigned long long)seed);
    for (int it = 0; it < 50; it++) {
        const uint32_t n = rng_range(&seed, 1, LLMI_CUDA_TP_MAX);
        const uint32_t n_vocab = rng_range(&seed, n, 5000), rows = rng_range(&seed, 1, 7);
        float *want = malloc((size_t)rows * n_vocab * sizeof *want);
        float *got = malloc((size_t)rows * n_vocab * sizeof *got);
        float *slice = malloc((size_t)rows * n_vocab * sizeof *slice);
        assert_true(want && got && slice);
        for (size_t i = 0; i < (size_t)rows * n_vocab; i++)
            want[i] = rng_float(&seed);
        memset(got, 0xFF, (size_t)rows * n_vocab * sizeof *got); /* NaN poison */
        llmi_hparams hp = {.n_head = n, .n_head_kv = n, .n_ff = n, .n_vocab = n_vocab};
        for (uint32_t r = 0; r < n; r++) {
            llmi_cuda_tp_shard sh;
            llmi_cuda_tp_shard_of(&hp, n, r, &sh);
            /* What rank r's LM head computes: its vocabulary columns. */
            for (uint32_t i = 0; i < rows; i++)
                memcpy(slice + (size_t)i * sh.n_vocab, want + (size_t)i * n_vocab + sh.vocab0,
                       sh.n_vocab * sizeof *slice);
            llmi_cuda_tp_place_logits(got, rows, n_vocab, sh.vocab0, sh.n_vocab, slice);
        }
        assert_memory_equal(got, want, (size_t)rows * n_vocab * sizeof *got);
        free(want);
        free(got);
        free(slice);
    }
}

static void test_kv_rows(void **state) {
    (void)state;
    uint64_t seed = 0x4b5u;
    printf("seed %#llx\n", (unsigned long long)seed);
    const uint32_t shapes[][2] = {{2, 2}, {4, 2}, {2, 4}, {8, 8}, {3, 3}, {1, 4}, {8, 2}, {6, 3}};
    for (size_t sidx = 0; sidx < sizeof shapes / sizeof shapes[0]; sidx++) {
        const uint32_t n_head_kv = shapes[sidx][0], n = shapes[sidx][1];
        const size_t head_bytes = 2 * rng_range(&seed, 1, 64);
        const uint32_t rows = rng_range(&seed, 1, 16);
        const size_t full_bytes = rows * n_head_kv * head_bytes;
        uint8_t *full = malloc(full_bytes), *back = malloc(full_bytes);
        uint8_t *part[LLMI_CUDA_TP_MAX];
        assert_true(full && back);
        for (size_t b = 0; b < full_bytes; b++)
            full[b] = (uint8_t)rng_next(&seed);
        /* kv_write: each rank takes its heads. */
        for (uint32_t r = 0; r < n; r++) {
            uint32_t kv0, n_kv;
            llmi_cuda_tp_kv_heads(n_head_kv, n, r, &kv0, &n_kv);
            part[r] = malloc(rows * n_kv * head_bytes);
            assert_non_null(part[r]);
            llmi_cuda_tp_kv_gather(full, rows, n_head_kv, head_bytes, kv0, n_kv, part[r]);
            for (uint32_t i = 0; i < rows; i++)
                for (uint32_t h = 0; h < n_kv; h++)
                    assert_memory_equal(part[r] + (i * n_kv + h) * head_bytes,
                                        full + (i * n_head_kv + kv0 + h) * head_bytes, head_bytes);
        }
        /* kv_read: the first holder of each head puts it back. */
        memset(back, 0x5A, full_bytes);
        for (uint32_t r = 0; r < n; r++) {
            uint32_t kv0, n_kv;
            llmi_cuda_tp_kv_heads(n_head_kv, n, r, &kv0, &n_kv);
            if (llmi_cuda_tp_kv_owner(n_head_kv, n, kv0) == r)
                llmi_cuda_tp_kv_scatter(part[r], rows, n_head_kv, head_bytes, kv0, n_kv, back);
        }
        assert_memory_equal(back, full, full_bytes);
        for (uint32_t r = 0; r < n; r++)
            free(part[r]);
        free(full);
        free(back);
    }
}

/* ---- real models ---- */

static llm_model *real_model(const char *env) {
    const char *path = getenv(env);
    FILE *fp = path ? fopen(path, "rb") : NULL;
    if (!fp) {
        printf("%s not set or missing: skipped\n", env);
        return NULL;
    }
    fclose(fp);
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(path, true, &m), LLM_OK);
    return m;
}

static void test_smollm2(void **state) {
    (void)state;
    llm_model *m = real_model("LLM_TEST_MODEL");
    if (!m)
        skip();
    char ok[64], why[512];
    check_sizes(m, ok, sizeof ok);
    printf("SmolLM2 (%u heads, %u KV heads): sizes that work %s\n", m->hp.n_head, m->hp.n_head_kv,
           ok);
    assert_int_equal(llmi_cuda_tp_check(m, 2, why, sizeof why), LLM_ERR_UNSUPPORTED);
    printf("  tp 2: %s\n", why);
    assert_non_null(strstr(why, "9 attention heads do not split in 2"));
    if (expect_splits(m, 3))
        check_rank_models(m, 3);
    llmi_model_free(m);
}

static void test_gemma3(void **state) {
    (void)state;
    llm_model *m = real_model("LLM_TEST_MODEL_GEMMA3");
    if (!m)
        skip();
    char ok[64];
    check_sizes(m, ok, sizeof ok);
    printf("Gemma 3 (%u heads, %u KV head): sizes that work %s\n", m->hp.n_head, m->hp.n_head_kv,
           ok);
    for (uint32_t n = 2; n <= 4; n += 2)
        if (expect_splits(m, n))
            check_rank_models(m, n); /* one KV head: replicated on every rank */
    llmi_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_blocks_match_core),
        cmocka_unit_test(test_shards_random),
        cmocka_unit_test(test_repack_every_type),
        cmocka_unit_test(test_rank_models_every_type),
        cmocka_unit_test(test_heads_refused_and_replicated),
        cmocka_unit_test(test_place_logits),
        cmocka_unit_test(test_kv_rows),
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_gemma3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
