/* Backend conformance suite: runs a backend, chosen by name, against the
 * CPU backend (the reference) on the same inputs, through the same engine
 * code the sessions use (engine/engine.h), so a new backend (the CUDA
 * plug-in) runs it unchanged on its device.
 *
 * Backend under test: LLM_TEST_BACKEND (default "cpu"), looked up with
 * llmi_backend_find. A name that is not registered, or whose probe says it
 * cannot run here, skips every test with the reason. For "cpu" the suite
 * registers a copy of the CPU table under the name "cpu-conformance" (its
 * own functions counting the calls, then the CPU's) and tests that, so the
 * default run goes through the registry and a table other than the
 * reference's, with its own instance, weights and KV store. For "tp<N>"
 * (N = 1 .. 8) it registers the tensor-parallel table of N CPU ranks
 * (backend/tp) under that name: exact too, so bit-identical. A model a
 * backend refuses as LLM_ERR_UNSUPPORTED (a shape that does not split in N)
 * skips its case with the reason.
 *
 * Both engines ask for f32 activations (llmi_engine_set_f32_activations;
 * a backend without the entry computes as it does). Logits compare:
 *   - bit-identical when the backend runs the CPU's code (the default run);
 *   - otherwise max |dut - ref| <= tol * max |ref| per logits row, with
 *     tol (conf_tolerance) 1e-3 for a backend that has
 *     step_set_f32_activations (4e-3 with a bf16 KV cache), and for one
 *     without it (it may round or quantize activations) 1e-2 with float
 *     weights and 1.5e-1 with quantized weights (the CPU's own 8-bit
 *     activations are up to 1e-1 off its f32 path on these models, so
 *     that check is coarse: a backend should implement the entry);
 *     LLM_TEST_TOL=<x> overrides. Where the reference's top-2 gap exceeds
 *     max(1e-2, 2 tol) of max |ref|, the argmax must agree.
 * K/V elements read back (kv_read) compare the same way.
 * Every logits buffer is poisoned (a NaN payload) before a step; a step
 * must write exactly its wanted rows, all finite, and nothing past them.
 * Inputs are random with fixed seeds, printed with each case.
 *
 * Tests:
 *   table           the table under test comes from the registry, has a
 *                   supported version and every required entry;
 *   weights/<type>  F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (n_embd
 *                   96, 6 heads, 2 KV heads, vocabulary 307) and Q4_K, Q6_K
 *                   (n_embd 256, n_ff 256, 1 KV head): mixed steps agree;
 *   odd_shapes      n_embd 72 / 48 / 160, head_dim set apart from n_embd,
 *                   MQA and no GQA, 3 layers, tied embeddings, vocabulary
 *                   320 / 308, block sizes 16, 5, 7;
 *   kv/<type>       f32, f16, bf16 KV caches; q8_0, q4_0 (head_dim 32), which
 *                   a backend without them must refuse as LLM_ERR_UNSUPPORTED
 *                   (the case is then skipped);
 *   block_tables    4-slot blocks handed out in shuffled order (the tables
 *                   of the backend under test are checked non-consecutive
 *                   and unlike the reference's);
 *   mixed_batches   six sequences, prefill chunks and decode rows
 *                   interleaved in one step, logits on random rows, a
 *                   one-row step and an all-logits step;
 *   prefix_fork     a prefix-cache match computes the rest like a fresh
 *                   sequence; a fork then a reserve copies the shared
 *                   partial block (kv_copy) and both branches decode like
 *                   a sequence computed from scratch;
 *   state           K/V read back (kv_read) agree with the reference; rows
 *                   written (kv_write) into another sequence, across
 *                   backends both ways, read back equal and decode like
 *                   the original;
 *   truncate        truncate (blocks freed and retaken by another sequence)
 *                   and recompute: the logits equal the first run's;
 *   kv_copy         kv_copy copies exactly n_slots slots of block src to
 *                   block dst, K and V of every layer, and nothing else;
 *   kv_rows         kv_write/kv_read round trips in pieces that cross and
 *                   end at block boundaries, other blocks untouched;
 *   failed_step     an early and a late injected fault and a step_run that
 *                   fails after running change no sequence length; the
 *                   retry agrees with the reference;
 *   copier_failure  llmi_kv_seq_reserve returns a failing copier's status
 *                   (a bookkeeping pool, and the engine on a table whose
 *                   kv_copy fails) and the pool's invariants hold. */
#include "conformance.h"

#include "backend/tp/tp.h"
#include "model/model.h"

conf_backend g_dut;

/* ---- the wrapped CPU table of the default run ---- */

static struct { unsigned long step_run, kv_copy, kv_read, kv_write; } g_calls;
static bool g_wrapped; /* the backend under test is the wrapped CPU table */

static llm_status w_step_run(void *step, void *kv, const llmi_step *st, float *logits) {
    g_calls.step_run++;
    return llmi_backend_cpu.step_run(step, kv, st, logits);
}
static llm_status w_kv_copy(void *kv, uint32_t dst, uint32_t src, uint32_t n) {
    g_calls.kv_copy++;
    return llmi_backend_cpu.kv_copy(kv, dst, src, n);
}
static llm_status w_kv_read(void *kv, uint32_t l, bool v, uint32_t slot, uint32_t n, void *dst) {
    g_calls.kv_read++;
    return llmi_backend_cpu.kv_read(kv, l, v, slot, n, dst);
}
static llm_status w_kv_write(void *kv, uint32_t l, bool v, uint32_t slot, uint32_t n,
                             const void *src) {
    g_calls.kv_write++;
    return llmi_backend_cpu.kv_write(kv, l, v, slot, n, src);
}

static llmi_backend_ops g_wrapped_ops;
static char g_tp_name[8];
static llmi_backend_ops g_tp_ops; /* "tp<N>": backend/tp's table of N ranks */
static bool g_tp_registered;

/* "tp<N>" with N in 1 .. LLMI_TP_MAX: N, else 0. */
static uint32_t tp_ranks(const char *name) {
    if (strncmp(name, "tp", 2) != 0 || name[2] < '1' || name[2] > '9' || name[3])
        return 0;
    const uint32_t n = (uint32_t)(name[2] - '0');
    return n <= LLMI_TP_MAX ? n : 0;
}

/* In the default run, the counter moved since `before`: the call went to
 * the table under test. */
#define EXPECT_CALLED(field, before)                                                               \
    do {                                                                                           \
        if (g_wrapped)                                                                             \
            assert_true(g_calls.field > (before));                                                 \
    } while (0)

static int setup(void **state) {
    (void)state;
    const char *name = getenv("LLM_TEST_BACKEND");
    if (!name || !*name)
        name = "cpu";
    memset(&g_dut, 0, sizeof g_dut);
    if (strcmp(name, "cpu") == 0) {
        g_wrapped_ops = llmi_backend_cpu;
        g_wrapped_ops.name = "cpu-conformance";
        g_wrapped_ops.step_run = w_step_run;
        g_wrapped_ops.kv_copy = w_kv_copy;
        g_wrapped_ops.kv_read = w_kv_read;
        g_wrapped_ops.kv_write = w_kv_write;
        if (llmi_backend_register(&g_wrapped_ops) != LLM_OK) {
            printf("register: %s\n", llmi_error_message());
            return -1;
        }
        name = g_wrapped_ops.name;
        g_wrapped = true;
    } else if (tp_ranks(name) && !llmi_backend_find(name)) {
        g_tp_ops = *llmi_backend_tp(tp_ranks(name));
        snprintf(g_tp_name, sizeof g_tp_name, "%s", name);
        g_tp_ops.name = g_tp_name;
        if (llmi_backend_register(&g_tp_ops) != LLM_OK) {
            printf("register: %s\n", llmi_error_message());
            return -1;
        }
        g_tp_registered = true;
    }
    const llmi_backend_ops *ops = llmi_backend_find(name);
    llm_status st;
    if (!ops) {
        snprintf(g_dut.why, sizeof g_dut.why,
                 "backend '%s' (LLM_TEST_BACKEND) is not registered in this build", name);
    } else if (ops->probe && (st = ops->probe()) != LLM_OK) {
        snprintf(g_dut.why, sizeof g_dut.why, "backend '%s' cannot run here: %s (%s)", name,
                 llmi_error_message(), llm_status_name(st));
    } else {
        g_dut.ops = ops;
    }
    if (!g_dut.ops) {
        printf("# %s: every test skips\n", g_dut.why);
        return 0;
    }
    g_dut.exact = g_wrapped || ops->step_run == llmi_backend_cpu.step_run || g_tp_registered;
    g_dut.f32_act = ops->step_set_f32_activations != NULL;
    const char *tol = getenv("LLM_TEST_TOL");
    if (tol && *tol) {
        g_dut.tol_override = strtod(tol, NULL);
        g_dut.exact = false;
    }
    if (g_dut.exact)
        printf("# backend under test '%s' against the reference 'cpu': logits bit-identical\n",
               ops->name);
    else if (g_dut.tol_override > 0)
        printf("# backend under test '%s' against the reference 'cpu': logits within %.3g of "
               "max |logit| (LLM_TEST_TOL)\n",
               ops->name, g_dut.tol_override);
    else
        printf("# backend under test '%s' against the reference 'cpu': logits within %s of "
               "max |logit|\n",
               ops->name,
               g_dut.f32_act ? "1e-3 (4e-3 with a bf16 KV cache)"
                             : "1e-2 (float weights) or 1.5e-1 (quantized weights)");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_backend_fault_inject(0, LLM_OK);
    if (g_wrapped)
        llmi_backend_unregister(g_wrapped_ops.name);
    if (g_tp_registered)
        llmi_backend_unregister(g_tp_ops.name);
    return 0;
}

/* ---- table ---- */

static void test_table(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    const llmi_backend_ops *ops = g_dut.ops;
    assert_ptr_equal(llmi_backend_find(ops->name), ops);
    assert_true(ops->version >= LLMI_BACKEND_VERSION_MIN && ops->version <= LLMI_BACKEND_VERSION);
    assert_non_null(ops->open);
    assert_non_null(ops->close);
    assert_non_null(ops->weights_load);
    assert_non_null(ops->weights_free);
    assert_non_null(ops->kv_create);
    assert_non_null(ops->kv_free);
    assert_non_null(ops->kv_copy);
    assert_non_null(ops->kv_read);
    assert_non_null(ops->kv_write);
    assert_non_null(ops->step_create);
    assert_non_null(ops->step_free);
    assert_non_null(ops->step_run);
    assert_non_null(ops->sync);
    assert_ptr_not_equal(ops, &llmi_backend_cpu); /* never the reference's own table */
    const llmi_backend_ops *list[LLMI_BACKEND_MAX];
    size_t n = llmi_backend_list(list, LLMI_BACKEND_MAX);
    bool listed = false;
    for (size_t i = 0; i < n && i < LLMI_BACKEND_MAX; i++)
        listed |= list[i] == ops;
    assert_true(listed);
    printf("# '%s': interface version %u, %s f32 activations\n", ops->name, ops->version,
           ops->step_set_f32_activations ? "with" : "without");
}

/* ---- mixed steps ---- */

/* Random steps on sequences [0, n_seqs): each step, each sequence sits out,
 * decodes one token or takes a prefill chunk; rows of the sequences are
 * interleaved (each sequence's in position order) and a random third of
 * them want logits (at least one). Sequences stop at max_len. */
static void run_mixed(conf_pair *p, uint64_t seed, uint32_t n_seqs, uint32_t n_steps,
                      uint32_t max_len) {
    uint64_t rng = seed;
    unsigned long runs = g_calls.step_run;
    uint32_t total_rows = 0, total_logits = 0;
    for (uint32_t t = 0; t < n_steps; t++) {
        uint32_t take[CONF_MAX_SEQS] = {0}, start[CONF_MAX_SEQS], n = 0;
        for (uint32_t s = 0; s < n_seqs; s++) {
            uint32_t len = p->dut.seq[s].n_tokens, k;
            start[s] = len;
            switch (conf_range(&rng, 0, 3)) {
            case 0:
                k = 0;
                break;
            case 1:
                k = 1;
                break;
            default:
                k = conf_range(&rng, 2, len ? 9 : 20);
            }
            if (len == 0 && k == 0)
                k = conf_range(&rng, 1, 12);
            if (len + k > max_len)
                k = max_len - len;
            if (n + k > CONF_MAX_ROWS)
                k = CONF_MAX_ROWS - n;
            take[s] = k;
            n += k;
            conf_pair_reserve(p, s, len + k);
        }
        if (n == 0) /* every sequence sat out */
            continue;
        conf_row rows[CONF_MAX_ROWS];
        uint32_t left[CONF_MAX_SEQS], got = 0, n_want = 0;
        memcpy(left, take, sizeof left);
        for (uint32_t r = 0; r < n; r++) {
            uint32_t pick = conf_rand(&rng) % (n - r), s = 0; /* a row of the remaining ones */
            while (pick >= left[s])
                pick -= left[s++];
            uint32_t pos = start[s] + (take[s] - left[s]);
            left[s]--;
            rows[r] = (conf_row){(llm_token)(conf_rand(&rng) % p->n_vocab), pos, s,
                                 conf_range(&rng, 0, 2) == 0};
            n_want += rows[r].want;
            got++;
        }
        if (n_want == 0)
            rows[conf_rand(&rng) % n].want = true;
        total_logits += conf_pair_step(p, rows, got);
        total_rows += got;
        for (uint32_t s = 0; s < n_seqs; s++)
            assert_int_equal(p->dut.seq[s].n_tokens, start[s] + take[s]);
    }
    EXPECT_CALLED(step_run, runs);
    printf("#   %s: seed %llu, %u rows, %u logits rows, max error %.3g of max |logit|\n", p->what,
           (unsigned long long)seed, total_rows, total_logits, p->max_err);
}

static void mixed_case(const llmi_testmodel_params *mp, llm_kv_type kv_type, uint32_t block_size,
                       uint64_t seed, const char *what) {
    llm_model *m = conf_model(mp);
    if (conf_refused_kv(m, kv_type)) {
        llmi_model_free(m);
        return;
    }
    conf_pair p;
    conf_pair_open(&p, m, kv_type, block_size, 4 * 160 / block_size + 8, seed ^ 0x5eed, what);
    run_mixed(&p, seed, 4, 12, 160);
    conf_pair_close(&p);
    llmi_model_free(m);
}

/* ---- weights/<type> ---- */

typedef struct type_case {
    llmi_ttype type;
    const char *name;
} type_case;

static const type_case k_types[] = {
    {LLMI_T_F32, "F32"},   {LLMI_T_F16, "F16"},   {LLMI_T_BF16, "BF16"}, {LLMI_T_Q8_0, "Q8_0"},
    {LLMI_T_Q4_0, "Q4_0"}, {LLMI_T_Q4_1, "Q4_1"}, {LLMI_T_Q5_0, "Q5_0"}, {LLMI_T_Q5_1, "Q5_1"},
    {LLMI_T_Q4_K, "Q4_K"}, {LLMI_T_Q6_K, "Q6_K"},
};

static void test_weights(void **state) {
    CONF_REQUIRE_BACKEND();
    const type_case *c = *state;
    llmi_testmodel_params mp;
    conf_params(&mp, c->type, 100 + (uint64_t)c->type);
    if (llmi_ttype_get(c->type)->block == 256) { /* K-quants: 256-element rows */
        mp.n_embd = 256;
        mp.n_head = 4;
        mp.n_head_kv = 1;
        mp.n_ff = 256;
    }
    char what[64];
    snprintf(what, sizeof what, "weights %s", c->name);
    mixed_case(&mp, LLM_KV_F32, 16, 1000 + (uint64_t)c->type, what);
}

/* ---- odd_shapes ---- */

static void test_odd_shapes(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    llmi_testmodel_params mp;
    /* n_embd 72 in 9 heads of 8, 3 KV heads, 3 layers, tied embeddings,
     * vocabulary 320 */
    conf_params(&mp, LLMI_T_F32, 201);
    mp.n_layer = 3;
    mp.n_embd = 72;
    mp.n_head = 9;
    mp.n_head_kv = 3;
    mp.n_ff = 100;
    mp.n_vocab_pad = 13;
    mp.tied_embeddings = true;
    mixed_case(&mp, LLM_KV_F32, 16, 2001, "n_embd 72, 9 heads / 3 KV heads, tied");
    /* n_embd 48, 4 heads of 20 (head_dim apart from n_embd), one KV head */
    conf_params(&mp, LLMI_T_F16, 202);
    mp.n_embd = 48;
    mp.n_head = 4;
    mp.n_head_kv = 1;
    mp.head_dim = 20;
    mp.n_ff = 88;
    mixed_case(&mp, LLM_KV_F16, 5, 2002, "n_embd 48, head_dim 20, MQA, block 5");
    /* Q8_0, n_embd 160 in 5 heads of 32, no GQA, vocabulary 308 */
    conf_params(&mp, LLMI_T_Q8_0, 203);
    mp.n_embd = 160;
    mp.n_head = 5;
    mp.n_head_kv = 5;
    mp.n_ff = 96;
    mp.n_vocab_pad = 1;
    mixed_case(&mp, LLM_KV_BF16, 7, 2003, "Q8_0 n_embd 160, 5 KV heads, block 7");
}

/* ---- kv/<type> ---- */

typedef struct kv_case {
    llm_kv_type type;
    const char *name;
} kv_case;

static const kv_case k_kv[] = {{LLM_KV_F32, "f32"}, {LLM_KV_F16, "f16"}, {LLM_KV_BF16, "bf16"}};
/* The quantized caches: mixed steps only (the row and copy tests below
 * read elements of the float types). */
static const kv_case k_kvq[] = {
    {LLM_KV_Q8_0, "q8_0"}, {LLM_KV_Q4_0, "q4_0"}, {LLM_KV_FP8_E4M3, "fp8"}};

static void test_kv_type(void **state) {
    CONF_REQUIRE_BACKEND();
    const kv_case *c = *state;
    llmi_testmodel_params mp;
    conf_params(&mp, LLMI_T_F16, 300 + (uint64_t)c->type);
    if (llmi_kv_type_blocked(c->type)) /* whole blocks of 32 per head; 2 KV heads */
        mp.head_dim = 32;
    char what[64];
    snprintf(what, sizeof what, "KV %s", c->name);
    mixed_case(&mp, c->type, 8, 3000 + (uint64_t)c->type, what);
}

/* ---- block_tables, mixed_batches ---- */

static llm_model *g_model; /* conf_params(Q8_0), for the tests below */

static bool contiguous(const llmi_kv_seq *s) {
    for (uint32_t i = 1; i < s->n_blocks; i++)
        if (s->blocks[i] != s->blocks[i - 1] + 1)
            return false;
    return true;
}

static void test_block_tables(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    conf_pair p;
    conf_pair_open(&p, g_model, LLM_KV_F32, 4, 5 * 64 / 4 + 4, 4004, "block tables");
    run_mixed(&p, 4005, 5, 8, 64);
    uint32_t scattered = 0, differ = 0;
    for (uint32_t s = 0; s < 5; s++) {
        const llmi_kv_seq *a = &p.ref.seq[s], *b = &p.dut.seq[s];
        scattered += !contiguous(b);
        assert_int_equal(a->n_blocks, b->n_blocks);
        differ += memcmp(a->blocks, b->blocks, a->n_blocks * sizeof *a->blocks) != 0;
    }
    printf("#   5 sequences: %u on non-consecutive blocks, %u with tables unlike the "
           "reference's\n",
           scattered, differ);
    assert_true(scattered >= 4);
    assert_int_equal(differ, 5);
    conf_pair_close(&p);
}

static void test_mixed_batches(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    conf_pair p;
    conf_pair_open(&p, g_model, LLM_KV_F16, 8, 6 * 80 / 8 + 8, 5005, "mixed batches");
    run_mixed(&p, 5006, 6, 10, 80);
    /* one row; then every row of a step wants logits */
    conf_row one = {7, p.dut.seq[2].n_tokens, 2, true};
    conf_pair_reserve(&p, 2, one.pos + 1);
    conf_pair_step(&p, &one, 1);
    conf_row rows[12];
    uint64_t rng = 5007;
    for (uint32_t r = 0; r < 12; r++) {
        uint32_t s = r % 3;
        rows[r] = (conf_row){(llm_token)(conf_rand(&rng) % p.n_vocab),
                             p.dut.seq[s].n_tokens + r / 3, s, true};
    }
    for (uint32_t s = 0; s < 3; s++)
        conf_pair_reserve(&p, s, p.dut.seq[s].n_tokens + 4);
    assert_int_equal(conf_pair_step(&p, rows, 12), 12);
    printf("#   one-row and all-logits steps: max error %.3g\n", p.max_err);
    conf_pair_close(&p);
}

/* ---- prefix_fork ---- */

/* Compares logits of one backend with itself (a recomputation, a forked
 * sequence): bit-identical for the CPU's code, else within tolerance. */
static void expect_same_logits(const conf_pair *p, const float *a, const float *b, uint32_t rows,
                               const char *what) {
    conf_compare(a, b, rows, p->n_vocab, g_dut.exact, p->tol, what);
}

static void prefill(conf_pair *p, uint32_t s, const llm_token *toks, uint32_t from, uint32_t to,
                    uint32_t want_from) {
    conf_row rows[CONF_MAX_ROWS];
    assert_true(to - from <= CONF_MAX_ROWS);
    for (uint32_t i = from; i < to; i++)
        rows[i - from] = (conf_row){toks[i], i, s, i >= want_from};
    conf_pair_reserve(p, s, to);
    conf_pair_step(p, rows, to - from);
}

static void check_pools(const conf_pair *p, uint32_t n_seqs) {
    const conf_side *sides[2] = {&p->ref, &p->dut};
    for (int i = 0; i < 2; i++) {
        const llmi_kv_seq *seqs[CONF_MAX_SEQS];
        for (uint32_t s = 0; s < n_seqs; s++)
            seqs[s] = &sides[i]->seq[s];
        if (llmi_kv_check(sides[i]->e->kv, seqs, n_seqs) != LLM_OK)
            fail_msg("%s: pool: %s", p->what, llmi_error_message());
    }
}

static void test_prefix_fork(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    enum { BS = 8, P = 2 * BS + 5 };
    conf_pair p;
    conf_pair_open(&p, g_model, LLM_KV_F16, BS, 40, 6006, "prefix and fork");
    const size_t V = p.n_vocab;
    float *first = malloc(5 * V * sizeof(float)), *branch = malloc(V * sizeof(float));
    assert_non_null(first);
    assert_non_null(branch);
    uint64_t rng = 6007;
    llm_token h0[P + 1], h1[P + 4], h3[P + 1];
    for (uint32_t i = 0; i < P; i++)
        h0[i] = (llm_token)(conf_rand(&rng) % V);
    /* seq 0: the prefix, logits of its last row; registered */
    prefill(&p, 0, h0, 0, P, P - 1);
    memcpy(first, p.dut.logits, V * sizeof(float));
    llmi_kv_seq_commit(p.ref.e->kv, &p.ref.seq[0], h0);
    llmi_kv_seq_commit(p.dut.e->kv, &p.dut.seq[0], h0);
    /* seq 1: the same P tokens then 3 more: the cache covers 2 blocks */
    memcpy(h1, h0, sizeof h0);
    for (uint32_t i = P; i < P + 4; i++)
        h1[i] = (llm_token)(conf_rand(&rng) % V);
    uint64_t hits = p.dut.e->kv->prefix_hit_tokens;
    assert_int_equal(llmi_kv_prefix_match(p.ref.e->kv, &p.ref.seq[1], h1, P + 4), 2 * BS);
    assert_int_equal(llmi_kv_prefix_match(p.dut.e->kv, &p.dut.seq[1], h1, P + 4), 2 * BS);
    assert_int_equal(p.dut.e->kv->prefix_hit_tokens, hits + 2 * BS);
    prefill(&p, 1, h1, 2 * BS, P + 4, P - 1);
    expect_same_logits(&p, first, p.dut.logits, 1, "prefix match: position P-1 as computed alone");
    /* seq 2: a fork of seq 0; reserving one more position copies the
     * shared partial block (P % BS valid slots) on both sides */
    assert_int_equal(llmi_kv_seq_fork(p.ref.e->kv, &p.ref.seq[0], &p.ref.seq[2]), LLM_OK);
    assert_int_equal(llmi_kv_seq_fork(p.dut.e->kv, &p.dut.seq[0], &p.dut.seq[2]), LLM_OK);
    uint64_t cow = p.dut.e->kv->cow_copies;
    unsigned long copies = g_calls.kv_copy;
    conf_pair_reserve(&p, 2, P + 1);
    conf_pair_reserve(&p, 0, P + 1);
    assert_int_equal(p.dut.e->kv->cow_copies, cow + 1);
    EXPECT_CALLED(kv_copy, copies);
    assert_int_not_equal(p.dut.seq[2].blocks[2], p.dut.seq[0].blocks[2]);
    assert_int_equal(p.dut.seq[2].blocks[1], p.dut.seq[0].blocks[1]); /* full blocks stay shared */
    check_pools(&p, 3);
    /* both branches write position P of what was one block */
    llm_token x = (llm_token)(conf_rand(&rng) % V), y = (llm_token)((x + 1) % (llm_token)V);
    conf_row rows[2] = {{x, P, 2, true}, {y, P, 0, true}};
    conf_pair_step(&p, rows, 2);
    memcpy(branch, p.dut.logits, V * sizeof(float));
    memcpy(first + V, p.dut.logits + V, V * sizeof(float));
    /* seq 3, from scratch: the prefix then x, like the fork's branch */
    memcpy(h3, h0, sizeof h0);
    h3[P] = x;
    prefill(&p, 3, h3, 0, P + 1, P);
    expect_same_logits(&p, branch, p.dut.logits, 1, "fork branch as computed alone");
    /* and seq 0's branch continued as if never forked: y then x */
    h3[P] = y;
    llmi_kv_seq_release(p.ref.e->kv, &p.ref.seq[3]);
    llmi_kv_seq_release(p.dut.e->kv, &p.dut.seq[3]);
    prefill(&p, 3, h3, 0, P + 1, P);
    expect_same_logits(&p, first + V, p.dut.logits, 1, "forked original as computed alone");
    check_pools(&p, 4);
    printf("#   seed 6007, prefix %u tokens in blocks of %u: max error %.3g\n", P, BS, p.max_err);
    free(first);
    free(branch);
    conf_pair_close(&p);
}

/* ---- state ---- */

/* Element i of a raw KV row buffer as f32. */
static float kv_elem(llm_kv_type t, const void *buf, size_t i) {
    if (t == LLM_KV_F32)
        return ((const float *)buf)[i];
    uint16_t h = ((const uint16_t *)buf)[i];
    return t == LLM_KV_F16 ? llmi_f16_to_f32(h) : llmi_bf16_to_f32(h);
}

/* K/V of the backend under test against the reference's. */
static void compare_kv(const conf_pair *p, llm_kv_type t, const void *ref, const void *got,
                       size_t n, const char *what) {
    if (g_dut.exact) {
        if (memcmp(ref, got, n * llmi_kv_type_size(t)) != 0)
            fail_msg("%s differ", what);
        return;
    }
    double amax = 0, err = 0;
    for (size_t i = 0; i < n; i++) {
        float a = kv_elem(t, ref, i), b = kv_elem(t, got, i);
        amax = fmax(amax, fabs(a));
        err = fmax(err, fabs((double)a - b));
    }
    assert_true(amax > 0);
    if (!(err <= p->tol * amax))
        fail_msg("%s: max |error| %.3g of max |x| %.3g, tolerance %.3g", what, err, amax, p->tol);
}

static void test_state(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    enum { BS = 8, L = 2 * BS + 5 };
    const llm_kv_type T = LLM_KV_F16;
    conf_pair p;
    conf_pair_open(&p, g_model, T, BS, 24, 7007, "state");
    const size_t V = p.n_vocab, row = p.dut.e->kv_row_bytes;
    const uint32_t n_layer = p.dut.e->layout.n_layer;
    uint8_t *r = malloc(L * row), *d = malloc(L * row), *back = malloc(L * row);
    assert_non_null(r);
    assert_non_null(d);
    assert_non_null(back);
    uint64_t rng = 7007;
    llm_token toks[L];
    for (uint32_t i = 0; i < L; i++)
        toks[i] = (llm_token)(conf_rand(&rng) % V);
    prefill(&p, 0, toks, 0, L, L - 1);
    conf_pair_reserve(&p, 1, L);
    unsigned long reads = g_calls.kv_read, writes = g_calls.kv_write;
    for (uint32_t l = 0; l < n_layer; l++) {
        for (int v = 0; v < 2; v++) {
            char what[64];
            snprintf(what, sizeof what, "layer %u %s", l, v ? "V" : "K");
            assert_int_equal(llmi_engine_kv_read(p.ref.e, &p.ref.seq[0], l, v, 0, L, r), LLM_OK);
            assert_int_equal(llmi_engine_kv_read(p.dut.e, &p.dut.seq[0], l, v, 0, L, d), LLM_OK);
            compare_kv(&p, T, r, d, (size_t)L * row / llmi_kv_type_size(T), what);
            /* each side's seq 1 gets the other's rows; they read back as written */
            assert_int_equal(llmi_engine_kv_write(p.dut.e, &p.dut.seq[1], l, v, 0, L, r), LLM_OK);
            assert_int_equal(llmi_engine_kv_write(p.ref.e, &p.ref.seq[1], l, v, 0, L, d), LLM_OK);
            assert_int_equal(llmi_engine_kv_read(p.dut.e, &p.dut.seq[1], l, v, 0, L, back), LLM_OK);
            assert_memory_equal(back, r, L * row);
            assert_int_equal(llmi_engine_kv_read(p.ref.e, &p.ref.seq[1], l, v, 0, L, back), LLM_OK);
            assert_memory_equal(back, d, L * row);
        }
    }
    EXPECT_CALLED(kv_read, reads);
    EXPECT_CALLED(kv_write, writes);
    p.ref.seq[1].n_tokens = p.dut.seq[1].n_tokens = L;
    /* the next token on the original and on the copy */
    llm_token x = (llm_token)(conf_rand(&rng) % V);
    conf_row rows[2] = {{x, L, 0, true}, {x, L, 1, true}};
    conf_pair_reserve(&p, 0, L + 1);
    conf_pair_reserve(&p, 1, L + 1);
    conf_pair_step(&p, rows, 2);
    expect_same_logits(&p, p.dut.logits, p.dut.logits + V, 1,
                       "decode on K/V written from the reference");
    printf("#   seed 7007, %u positions, %u layers, f16 KV: max error %.3g\n", L, n_layer,
           p.max_err);
    free(r);
    free(d);
    free(back);
    check_pools(&p, 2);
    conf_pair_close(&p);
}

/* ---- truncate ---- */

static void test_truncate(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    enum { BS = 8, N0 = 30, N1 = 36, T = 13, K = N1 - N0 + 1 };
    conf_pair p;
    conf_pair_open(&p, g_model, LLM_KV_F32, BS, 12, 8008, "truncate and recompute");
    const size_t V = p.n_vocab;
    float *first = malloc(K * V * sizeof(float));
    assert_non_null(first);
    uint64_t rng = 8008;
    llm_token toks[N1], other[20];
    for (uint32_t i = 0; i < N1; i++)
        toks[i] = (llm_token)(conf_rand(&rng) % V);
    for (uint32_t i = 0; i < 20; i++)
        other[i] = (llm_token)(conf_rand(&rng) % V);
    /* a prefill, then decode steps: logits of positions N0-1 .. N1-1 */
    prefill(&p, 0, toks, 0, N0, N0 - 1);
    memcpy(first, p.dut.logits, V * sizeof(float));
    for (uint32_t i = N0; i < N1; i++) {
        prefill(&p, 0, toks, i, i + 1, i);
        memcpy(first + (size_t)(i - N0 + 1) * V, p.dut.logits, V * sizeof(float));
    }
    /* preempted down to T; another sequence takes the freed blocks */
    llmi_kv_seq_truncate(p.ref.e->kv, &p.ref.seq[0], T);
    llmi_kv_seq_truncate(p.dut.e->kv, &p.dut.seq[0], T);
    assert_int_equal(p.dut.seq[0].n_blocks, (T + BS - 1) / BS);
    prefill(&p, 1, other, 0, 20, 19);
    check_pools(&p, 2);
    /* recomputed in one step */
    prefill(&p, 0, toks, T, N1, N0 - 1);
    expect_same_logits(&p, first, p.dut.logits, K, "recomputed after truncation");
    printf("#   seed 8008, %u tokens truncated to %u and recomputed: max error %.3g\n", N1, T,
           p.max_err);
    free(first);
    conf_pair_close(&p);
}

/* ---- kv_copy, kv_rows: the KV store through the engine ---- */

/* Random finite elements of type t. */
static void fill_kv(llm_kv_type t, void *buf, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) {
        float x = conf_unit(rng);
        if (t == LLM_KV_F32)
            ((float *)buf)[i] = x;
        else
            ((uint16_t *)buf)[i] = t == LLM_KV_F16 ? llmi_f32_to_f16(x) : llmi_f32_to_bf16(x);
    }
}

/* A host image of a whole KV store: [layer][K, V][slot][row bytes]. */
typedef struct kv_image {
    llmi_engine *e;
    llmi_kv_seq all; /* every block, in id order: slot = position */
    size_t row, per;
    uint8_t *img, *back;
} kv_image;

static void image_open(kv_image *k, llmi_engine *e) {
    memset(k, 0, sizeof *k);
    k->e = e;
    const llmi_kv_layout *lo = &e->layout;
    k->all.n_blocks = k->all.cap = lo->n_blocks;
    k->all.blocks = malloc(lo->n_blocks * sizeof(uint32_t));
    assert_non_null(k->all.blocks);
    for (uint32_t b = 0; b < lo->n_blocks; b++)
        k->all.blocks[b] = b;
    k->row = e->kv_row_bytes;
    k->per = (size_t)lo->n_blocks * lo->block_size * k->row;
    k->img = malloc(2 * lo->n_layer * k->per);
    k->back = malloc(k->per);
    assert_non_null(k->img);
    assert_non_null(k->back);
}

static uint8_t *image_at(kv_image *k, uint32_t l, bool v, uint32_t slot) {
    return k->img + ((size_t)l * 2 + v) * k->per + (size_t)slot * k->row;
}

/* Writes the whole image to the store. */
static void image_store(kv_image *k) {
    const uint32_t n = k->e->layout.n_blocks * k->e->layout.block_size;
    for (uint32_t l = 0; l < k->e->layout.n_layer; l++)
        for (int v = 0; v < 2; v++)
            assert_int_equal(llmi_engine_kv_write(k->e, &k->all, l, v, 0, n, image_at(k, l, v, 0)),
                             LLM_OK);
}

/* Reads the whole store back: it equals the image. */
static void image_check(kv_image *k, const char *what) {
    const llmi_kv_layout *lo = &k->e->layout;
    const uint32_t n = lo->n_blocks * lo->block_size;
    for (uint32_t l = 0; l < lo->n_layer; l++)
        for (int v = 0; v < 2; v++) {
            assert_int_equal(llmi_engine_kv_read(k->e, &k->all, l, v, 0, n, k->back), LLM_OK);
            const uint8_t *want = image_at(k, l, v, 0);
            for (uint32_t s = 0; s < n; s++)
                if (memcmp(k->back + s * k->row, want + s * k->row, k->row) != 0)
                    fail_msg("%s: layer %u %s slot %u (block %u) differs", what, l, v ? "V" : "K",
                             s, s / lo->block_size);
        }
}

static void image_close(kv_image *k) {
    free(k->all.blocks);
    free(k->img);
    free(k->back);
}

static void test_kv_copy(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    enum { BS = 8, NB = 6 };
    static const uint32_t cases[][3] = {/* dst, src, n_slots */
                                        {3, 1, 5},      {0, 4, BS}, {5, 2, 1},
                                        {2, 5, BS - 1}, {1, 3, 2},  {4, 0, BS}};
    for (size_t t = 0; t < sizeof k_kv / sizeof k_kv[0]; t++) {
        llmi_engine *e = conf_engine(g_dut.ops, g_model, k_kv[t].type, BS, NB, 0);
        kv_image k;
        image_open(&k, e);
        uint64_t rng = 9009 + t;
        fill_kv(k_kv[t].type, k.img,
                2 * e->layout.n_layer * k.per / llmi_kv_type_size(k_kv[t].type), &rng);
        image_store(&k);
        image_check(&k, "written");
        unsigned long copies = g_calls.kv_copy;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            uint32_t dst = cases[c][0], src = cases[c][1], n = cases[c][2];
            /* no step in between: the copy is ordered before the reads */
            assert_int_equal(e->ops->kv_copy(e->kv_store, dst, src, n), LLM_OK);
            for (uint32_t l = 0; l < e->layout.n_layer; l++)
                for (int v = 0; v < 2; v++)
                    memcpy(image_at(&k, l, v, dst * BS), image_at(&k, l, v, src * BS), n * k.row);
            char what[96];
            snprintf(what, sizeof what, "KV %s: after kv_copy(dst %u, src %u, %u slots)",
                     k_kv[t].name, dst, src, n);
            image_check(&k, what);
        }
        EXPECT_CALLED(kv_copy, copies);
        printf("#   KV %s: seed %llu, %zu copies exact\n", k_kv[t].name,
               (unsigned long long)(9009 + t), sizeof cases / sizeof cases[0]);
        image_close(&k);
        llmi_engine_free(e);
    }
}

static void test_kv_rows(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    enum { BS = 8, NB = 8, N = 3 * BS };
    static const uint32_t writes[] = {0, 7, 9, 16, 17, N}; /* piece bounds */
    static const uint32_t reads[] = {0, 1, 15, N};
    static const uint32_t edges[] = {7, 8, 15, 16, 23};
    for (size_t t = 0; t < sizeof k_kv / sizeof k_kv[0]; t++) {
        const llm_kv_type T = k_kv[t].type;
        llmi_engine *e = conf_engine(g_dut.ops, g_model, T, BS, NB, 10010 + t);
        kv_image k;
        image_open(&k, e);
        uint64_t rng = 10010 + t;
        const size_t per_row = k.row / llmi_kv_type_size(T);
        fill_kv(T, k.img, 2 * e->layout.n_layer * k.per / llmi_kv_type_size(T), &rng);
        image_store(&k); /* the background every other block keeps */
        llmi_kv_seq s = {0};
        assert_int_equal(llmi_kv_seq_reserve(e->kv, &s, N), LLM_OK);
        assert_false(contiguous(&s) && s.blocks[0] == 0);
        uint8_t *buf = malloc(N * k.row), *back = malloc(N * k.row);
        assert_non_null(buf);
        assert_non_null(back);
        for (uint32_t l = 0; l < e->layout.n_layer; l++) {
            for (int v = 0; v < 2; v++) {
                fill_kv(T, buf, N * per_row, &rng);
                for (size_t i = 0; i + 1 < sizeof writes / sizeof writes[0]; i++) {
                    uint32_t a = writes[i], n = writes[i + 1] - a;
                    assert_int_equal(llmi_engine_kv_write(e, &s, l, v, a, n, buf + a * k.row),
                                     LLM_OK);
                }
                for (size_t i = 0; i + 1 < sizeof reads / sizeof reads[0]; i++) {
                    uint32_t a = reads[i], n = reads[i + 1] - a;
                    assert_int_equal(llmi_engine_kv_read(e, &s, l, v, a, n, back + a * k.row),
                                     LLM_OK);
                }
                assert_memory_equal(back, buf, N * k.row);
                /* single slots at block edges */
                for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
                    fill_kv(T, buf + edges[i] * k.row, per_row, &rng);
                    assert_int_equal(
                        llmi_engine_kv_write(e, &s, l, v, edges[i], 1, buf + edges[i] * k.row),
                        LLM_OK);
                }
                assert_int_equal(llmi_engine_kv_read(e, &s, l, v, 0, N, back), LLM_OK);
                assert_memory_equal(back, buf, N * k.row);
                for (uint32_t pos = 0; pos < N; pos++)
                    memcpy(image_at(&k, l, v, llmi_kv_slot(e->kv, &s, pos)), buf + pos * k.row,
                           k.row);
            }
        }
        char what[64];
        snprintf(what, sizeof what, "KV %s rows", k_kv[t].name);
        image_check(&k, what); /* the other blocks and layers untouched */
        printf("#   KV %s: seed %llu, blocks %u %u %u\n", k_kv[t].name,
               (unsigned long long)(10010 + t), s.blocks[0], s.blocks[1], s.blocks[2]);
        free(buf);
        free(back);
        llmi_kv_seq_destroy(e->kv, &s);
        image_close(&k);
        llmi_engine_free(e);
    }
}

/* ---- failed_step ---- */

static const llmi_backend_ops *g_real; /* the table a failing copy wraps */

static llm_status failing_run(void *step, void *kv, const llmi_step *st, float *logits) {
    LLMI_TRY(g_real->step_run(step, kv, st, logits));
    return llmi_error(LLM_ERR_BACKEND, "device lost (conformance test)");
}

static llm_status failing_copy(void *kv, uint32_t dst, uint32_t src, uint32_t n) {
    (void)kv;
    (void)dst;
    (void)src;
    (void)n;
    return llmi_error(LLM_ERR_BACKEND, "copy failed (conformance test)");
}

static void expect_failed_step(conf_pair *p, const conf_row *rows, uint32_t n, llm_status want,
                               const char *what) {
    uint32_t before[CONF_MAX_SEQS];
    for (uint32_t s = 0; s < CONF_MAX_SEQS; s++)
        before[s] = p->dut.seq[s].n_tokens;
    llmi_batch_row br[CONF_MAX_ROWS];
    for (uint32_t r = 0; r < n; r++)
        br[r] =
            (llmi_batch_row){rows[r].token, rows[r].pos, &p->dut.seq[rows[r].seq], rows[r].want};
    conf_poison(p->dut.logits, (CONF_MAX_ROWS + 1) * p->n_vocab);
    llm_status st = llmi_engine_run(p->dut.e, br, n, p->dut.logits);
    llmi_backend_fault_inject(0, LLM_OK);
    if (st != want)
        fail_msg("%s: status %s (%s), want %s", what, llm_status_name(st), llmi_error_message(),
                 llm_status_name(want));
    for (uint32_t s = 0; s < CONF_MAX_SEQS; s++)
        if (p->dut.seq[s].n_tokens != before[s])
            fail_msg("%s: sequence %u length %u, was %u", what, s, p->dut.seq[s].n_tokens,
                     before[s]);
}

static void test_failed_step(void **state) {
    (void)state;
    CONF_REQUIRE_BACKEND();
    conf_pair p;
    conf_pair_open(&p, g_model, LLM_KV_F32, 8, 16, 11011, "failed step");
    uint64_t rng = 11011;
    llm_token t0[16], t1[16];
    for (uint32_t i = 0; i < 16; i++) {
        t0[i] = (llm_token)(conf_rand(&rng) % p.n_vocab);
        t1[i] = (llm_token)(conf_rand(&rng) % p.n_vocab);
    }
    prefill(&p, 0, t0, 0, 10, 9);
    prefill(&p, 1, t1, 0, 5, 4);
    /* decode seq 0, continue seq 1's prefill across its block boundary */
    conf_row rows[6] = {{t0[10], 10, 0, true}};
    for (uint32_t i = 0; i < 5; i++)
        rows[1 + i] = (conf_row){t1[5 + i], 5 + i, 1, i == 4};
    conf_pair_reserve(&p, 0, 11);
    conf_pair_reserve(&p, 1, 10);
    llmi_backend_fault_inject(1, LLM_ERR_BACKEND);
    expect_failed_step(&p, rows, 6, LLM_ERR_BACKEND, "fault before the step");
    llmi_backend_fault_inject_late(1, LLM_ERR_OUT_OF_MEMORY);
    expect_failed_step(&p, rows, 6, LLM_ERR_OUT_OF_MEMORY, "fault after the step ran");
    /* a step_run that runs, then reports a device error */
    llmi_backend_ops failing = *p.dut.e->ops;
    failing.step_run = failing_run;
    g_real = p.dut.e->ops;
    p.dut.e->ops = &failing;
    expect_failed_step(&p, rows, 6, LLM_ERR_BACKEND, "step_run failing after it ran");
    p.dut.e->ops = g_real;
    /* the retry agrees with the reference */
    conf_pair_step(&p, rows, 6);
    assert_int_equal(p.dut.seq[0].n_tokens, 11);
    assert_int_equal(p.dut.seq[1].n_tokens, 10);
    check_pools(&p, 2);
    printf("#   seed 11011: three failed steps changed no length; retry max error %.3g\n",
           p.max_err);
    conf_pair_close(&p);
}

/* ---- copier_failure ---- */

static struct {
    llm_status status;
    unsigned calls;
    uint32_t dst, src, n;
} g_copier;

static llm_status test_copier(void *ctx, uint32_t dst, uint32_t src, uint32_t n) {
    (void)ctx;
    g_copier.calls++;
    g_copier.dst = dst;
    g_copier.src = src;
    g_copier.n = n;
    if (g_copier.status != LLM_OK)
        return llmi_error(g_copier.status, "copier fails (test)");
    return LLM_OK;
}

static void expect_pool(const llmi_kv *kv, const llmi_kv_seq *a, const llmi_kv_seq *b) {
    const llmi_kv_seq *seqs[2] = {a, b};
    if (llmi_kv_check(kv, seqs, 2) != LLM_OK)
        fail_msg("pool: %s", llmi_error_message());
}

/* a holds 6 tokens (a full block and 2 slots of 4-slot blocks); b shares it
 * and reserving b's 7th position copies the shared partial block. */
static void fork_six(llmi_kv *kv, llmi_kv_seq *a, llmi_kv_seq *b) {
    assert_int_equal(llmi_kv_seq_reserve(kv, a, 6), LLM_OK);
    a->n_tokens = 6;
    assert_int_equal(llmi_kv_seq_fork(kv, a, b), LLM_OK);
    expect_pool(kv, a, b);
}

static void expect_reserve_fails(llmi_kv *kv, llmi_kv_seq *a, llmi_kv_seq *b, llm_status want) {
    uint32_t avail = llmi_kv_available(kv), blocks[2] = {b->blocks[0], b->blocks[1]};
    uint64_t cow = kv->cow_copies;
    llm_status st = llmi_kv_seq_reserve(kv, b, 7);
    if (st != want)
        fail_msg("reserve with a failing copier: %s (%s), want %s", llm_status_name(st),
                 llmi_error_message(), llm_status_name(want));
    assert_int_equal(b->n_tokens, 6);
    assert_int_equal(b->n_blocks, 2);
    assert_int_equal(b->blocks[0], blocks[0]);
    assert_int_equal(b->blocks[1], blocks[1]);
    assert_int_equal(llmi_kv_available(kv), avail);
    assert_int_equal(kv->cow_copies, cow);
    expect_pool(kv, a, b);
}

static void test_copier_failure(void **state) {
    (void)state;
    /* a bookkeeping pool with a copier that fails */
    llmi_kv *kv = NULL;
    assert_int_equal(llmi_kv_create(4, 8, &kv), LLM_OK);
    llmi_kv_set_copier(kv, test_copier, NULL);
    llmi_kv_seq a = {0}, b = {0};
    fork_six(kv, &a, &b);
    memset(&g_copier, 0, sizeof g_copier);
    g_copier.status = LLM_ERR_BACKEND;
    expect_reserve_fails(kv, &a, &b, LLM_ERR_BACKEND);
    g_copier.status = LLM_ERR_OUT_OF_MEMORY;
    expect_reserve_fails(kv, &a, &b, LLM_ERR_OUT_OF_MEMORY);
    assert_int_equal(g_copier.calls, 2);
    assert_int_equal(g_copier.src, a.blocks[1]);
    assert_int_equal(g_copier.n, 2);
    g_copier.status = LLM_OK;
    assert_int_equal(llmi_kv_seq_reserve(kv, &b, 7), LLM_OK);
    assert_int_equal(g_copier.calls, 3);
    assert_int_equal(g_copier.dst, b.blocks[1]);
    assert_int_not_equal(b.blocks[1], a.blocks[1]);
    assert_int_equal(kv->cow_copies, 1);
    expect_pool(kv, &a, &b);
    llmi_kv_seq_destroy(kv, &a);
    llmi_kv_seq_destroy(kv, &b);
    assert_int_equal(llmi_kv_check(kv, NULL, 0), LLM_OK);
    assert_int_equal(kv->n_free, 8);
    llmi_kv_free(kv);

    /* the engine on the backend under test, its kv_copy failing */
    if (!g_dut.ops) {
        printf("# engine part skipped: %s\n", g_dut.why);
        return;
    }
    llmi_engine *e = conf_engine(g_dut.ops, g_model, LLM_KV_F32, 4, 8, 12012);
    const llmi_backend_ops *real = e->ops;
    llmi_backend_ops failing = *real;
    failing.kv_copy = failing_copy;
    fork_six(e->kv, &a, &b);
    e->ops = &failing;
    expect_reserve_fails(e->kv, &a, &b, LLM_ERR_BACKEND);
    assert_non_null(strstr(llmi_error_message(), "copy failed"));
    e->ops = real;
    assert_int_equal(llmi_kv_seq_reserve(e->kv, &b, 7), LLM_OK);
    expect_pool(e->kv, &a, &b);
    llmi_kv_seq_destroy(e->kv, &a);
    llmi_kv_seq_destroy(e->kv, &b);
    llmi_engine_free(e);
}

/* ---- main ---- */

static int group_setup(void **state) {
    if (setup(state) != 0)
        return -1;
    llmi_testmodel_params mp;
    conf_params(&mp, LLMI_T_Q8_0, 42);
    g_model = conf_model(&mp);
    return 0;
}

static int group_teardown(void **state) {
    llmi_model_free(g_model);
    return teardown(state);
}

#define TYPE_TEST(i)                                                                               \
    { "weights/" #i, test_weights, NULL, NULL, (void *)&k_types[i] }
#define KV_TEST(i)                                                                                 \
    { "kv/" #i, test_kv_type, NULL, NULL, (void *)&k_kv[i] }
#define KVQ_TEST(i)                                                                                \
    { "kv/q" #i, test_kv_type, NULL, NULL, (void *)&k_kvq[i] }

int main(void) {
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        TYPE_TEST(0),
        TYPE_TEST(1),
        TYPE_TEST(2),
        TYPE_TEST(3),
        TYPE_TEST(4),
        TYPE_TEST(5),
        TYPE_TEST(6),
        TYPE_TEST(7),
        TYPE_TEST(8),
        TYPE_TEST(9),
        cmocka_unit_test(test_odd_shapes),
        KV_TEST(0),
        KV_TEST(1),
        KV_TEST(2),
        KVQ_TEST(0),
        KVQ_TEST(1),
        KVQ_TEST(2),
        cmocka_unit_test(test_block_tables),
        cmocka_unit_test(test_mixed_batches),
        cmocka_unit_test(test_prefix_fork),
        cmocka_unit_test(test_state),
        cmocka_unit_test(test_truncate),
        cmocka_unit_test(test_kv_copy),
        cmocka_unit_test(test_kv_rows),
        cmocka_unit_test(test_failed_step),
        cmocka_unit_test(test_copier_failure),
    };
    /* readable names: weights/F16, kv/bf16 */
    enum { N_TYPES = sizeof k_types / sizeof k_types[0] };
    _Static_assert(N_TYPES == 10, "one TYPE_TEST per k_types entry");
    enum { N_KV = sizeof k_kv / sizeof k_kv[0], N_KVQ = sizeof k_kvq / sizeof k_kvq[0] };
    static char names[N_TYPES + N_KV + N_KVQ][32];
    for (size_t i = 0; i < N_TYPES; i++) {
        snprintf(names[i], sizeof names[i], "weights/%s", k_types[i].name);
        tests[1 + i].name = names[i];
    }
    for (size_t i = 0; i < N_KV + N_KVQ; i++) {
        snprintf(names[N_TYPES + i], sizeof names[N_TYPES + i], "kv/%s",
                 i < N_KV ? k_kv[i].name : k_kvq[i - N_KV].name);
        tests[2 + N_TYPES + i].name = names[N_TYPES + i];
    }
    if (getenv("LLM_TEST_FILTER"))
        cmocka_set_test_filter(getenv("LLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
