/* LoRA adapters under tensor parallelism on CPU ranks (backend/tp,
 * backend/cpu/lora.h) against the CPU backend with the same adapters,
 * written here with the GGUF writer (random values).
 *
 * test_tp.c asserts that the tp backend computes the CPU backend's bits
 * (every output element by one rank, from the whole input row); adapters
 * keep that promise, so the comparisons are bitwise, not within a
 * tolerance:
 *   - A prompt step (four sequences' rows interleaved: the matmul path)
 *     and three greedy decode steps (the one-row-per-sequence path) with
 *     adapters of rank 1 and rank 8 on every target of every layer, the
 *     rank-8 one at two scales, and a sequence without adapter, all in the
 *     same steps: logits, greedy tokens and every layer's K/V are the CPU
 *     backend's bits at TP 2 and 3 (KV heads split and replicated; slices
 *     of uneven width whose columns start off the kernels' vector groups,
 *     which lora.c's windows exist for), with 8-bit and f32 activations,
 *     at every kernel level this CPU has. The rows of the sequence without
 *     adapter are the bits of a step without adapters; each adapter row
 *     past position 0 moved (an update dropped on every backend alike
 *     cannot pass).
 *   - Greedy requests with adapters through sessions give the CPU
 *     backend's tokens at TP 2 and 3.
 *   - A warm step allocates nothing: with every allocation failing, the
 *     next step with adapters still runs and gives the same bits.
 *   - An adapter whose matrices do not fit a projection (built in memory:
 *     the loader refuses such files) is refused with
 *     LLM_ERR_INVALID_ARGUMENT naming adapter, layer and projection, on
 *     one CPU and on every rank alike (no rank left waiting at a gather);
 *     the same engine then runs the good adapter.
 *   - SmolLM2-135M (LLM_TEST_MODEL) at TP 3 with adapters on all 30
 *     layers: the CPU backend's bits. */
#include "backend/cpu/cpu_features.h"
#include "backend/tp/tp.h"
#include "gguf/gguf.h"
#include "model/adapter.h"
#include "sched_util.h"

#include <math.h>
#include <unistd.h>

enum { N_SEQS = 4, PROMPT = 10, DECODES = 3, N_CTX = 64 };
enum { N_ROWS = N_SEQS * PROMPT + DECODES * N_SEQS, N_POS = PROMPT + DECODES };

static const char *const target_names[LLMI_LORA_TARGETS] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

static uint64_t g_rng;
static float uniform(float lo, float hi) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((double)(g_rng >> 11) * 0x1.0p-53);
}

static void target_shape(const llmi_hparams *hp, llmi_lora_target t, uint32_t *in, uint32_t *out) {
    const uint32_t q = hp->n_head * hp->head_dim, kv = hp->n_head_kv * hp->head_dim;
    const uint32_t ins[LLMI_LORA_TARGETS] = {hp->n_embd, hp->n_embd, hp->n_embd, q,
                                             hp->n_embd, hp->n_embd, hp->n_ff};
    const uint32_t outs[LLMI_LORA_TARGETS] = {q,        kv,       kv,        hp->n_embd,
                                              hp->n_ff, hp->n_ff, hp->n_embd};
    *in = ins[t];
    *out = outs[t];
}

/* An adapter of `rank` on every target of every layer of m, alpha = rank,
 * values from `seed`, through a GGUF file and the loader. */
static llm_adapter *make_adapter(const llm_model *m, uint32_t rank, uint64_t seed) {
    const llmi_hparams *hp = &m->hp;
    g_rng = seed;
    llmi_gguf_writer *w = NULL;
    assert_int_equal(llmi_gguf_writer_create(&w), LLM_OK);
    assert_int_equal(llmi_gguf_w_str(w, "general.architecture", "llama"), LLM_OK);
    assert_int_equal(llmi_gguf_w_str(w, "general.type", "adapter"), LLM_OK);
    assert_int_equal(llmi_gguf_w_str(w, "adapter.type", "lora"), LLM_OK);
    assert_int_equal(llmi_gguf_w_f32(w, "adapter.lora.alpha", (float)rank), LLM_OK);
    float *v = malloc((size_t)rank * 4096 * sizeof *v);
    assert_non_null(v);
    for (uint32_t l = 0; l < hp->n_layer; l++)
        for (uint32_t t = 0; t < LLMI_LORA_TARGETS; t++) {
            uint32_t in, out;
            target_shape(hp, (llmi_lora_target)t, &in, &out);
            assert_true(in <= 4096 && out <= 4096);
            const float ra = 1.0f / sqrtf((float)in), rb = 3.0f / sqrtf((float)rank);
            char name[128];
            for (size_t i = 0; i < (size_t)rank * in; i++)
                v[i] = uniform(-ra, ra);
            uint64_t ne_a[2] = {in, rank};
            snprintf(name, sizeof name, "blk.%u.%s.weight.lora_a", l, target_names[t]);
            assert_int_equal(llmi_gguf_w_tensor(w, name, LLMI_T_F32, 2, ne_a, v), LLM_OK);
            for (size_t i = 0; i < (size_t)rank * out; i++)
                v[i] = uniform(-rb, rb);
            uint64_t ne_b[2] = {rank, out};
            snprintf(name, sizeof name, "blk.%u.%s.weight.lora_b", l, target_names[t]);
            assert_int_equal(llmi_gguf_w_tensor(w, name, LLMI_T_F32, 2, ne_b, v), LLM_OK);
        }
    free(v);
    char path[600];
    snprintf(path, sizeof path, "%s/tp-lora-%d.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp", (int)getpid());
    assert_int_equal(llmi_gguf_writer_save(w, path), LLM_OK);
    llmi_gguf_writer_free(w);
    llm_adapter *a = NULL;
    if (llm_adapter_load(m, path, NULL, &a) != LLM_OK)
        fail_msg("loading the adapter: %s", llm_last_error());
    remove(path);
    return a;
}

static llmi_engine *engine_on(const llm_model *m, const llmi_backend_ops *ops, bool f32) {
    llmi_engine_config cfg = {.model = m,
                              .ops = ops,
                              .backend_cfg = {2, 0},
                              .kv_block_size = 4,
                              .kv_blocks = 32,
                              .kv_type = LLM_KV_F32,
                              .max_rows = N_SEQS * PROMPT,
                              .max_ctx = N_CTX};
    llmi_engine *e = NULL;
    if (llmi_engine_create(&cfg, &e) != LLM_OK)
        fail_msg("engine: %s", llm_last_error());
    llmi_engine_set_f32_activations(e, f32);
    return e;
}

static llm_token argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (llm_token)best;
}

/* What a run of the steps gives: logits of every row (the prompt step's
 * rows position-major, then each decode step's), the greedy tokens, and
 * K then V of every layer and position of every sequence. */
typedef struct run_out {
    float *logits; /* [N_ROWS][V] */
    llm_token tok[DECODES][N_SEQS];
    float *kv; /* [N_SEQS][n_layer][2][N_POS][kv_dim] */
} run_out;

static void run_out_init(run_out *o, const llm_model *m) {
    const size_t kv_dim = (size_t)m->hp.n_head_kv * m->hp.head_dim;
    o->logits = llmi_malloc((size_t)N_ROWS * m->hp.n_vocab * sizeof(float));
    o->kv = llmi_malloc((size_t)N_SEQS * m->hp.n_layer * 2 * N_POS * kv_dim * sizeof(float));
    assert_true(o->logits && o->kv);
    memset(o->logits, 0xff, (size_t)N_ROWS * m->hp.n_vocab * sizeof(float)); /* NaN */
}

static void run_out_free(run_out *o) {
    llmi_free(o->logits);
    llmi_free(o->kv);
}

/* The prompt step, then DECODES greedy steps; sequence q runs under ad[q]
 * at sc[q]. With `fail_allocs`, every allocation fails during the last
 * decode step (the steps before it warmed the engine up). */
static void run_steps(llmi_engine *e, const llm_adapter *const *ad, const float *sc, run_out *o,
                      bool fail_allocs) {
    const llm_model *m = e->model;
    const uint32_t V = m->hp.n_vocab;
    llmi_kv_seq seqs[N_SEQS] = {{0}};
    llmi_batch_row rows[N_SEQS * PROMPT];
    for (int q = 0; q < N_SEQS; q++)
        assert_int_equal(llmi_kv_seq_reserve(e->kv, &seqs[q], N_POS), LLM_OK);
    uint32_t n = 0;
    for (uint32_t i = 0; i < PROMPT; i++)
        for (int q = 0; q < N_SEQS; q++) {
            const llm_token t = (llm_token)((i * 31 + (uint32_t)q * 17 + 5) % (V - 1));
            rows[n++] = (llmi_batch_row){t, i, &seqs[q], true, ad[q], sc[q]};
        }
    if (llmi_engine_run(e, rows, n, o->logits) != LLM_OK)
        fail_msg("prompt step: %s", llm_last_error());
    const float *last = o->logits + (size_t)(n - N_SEQS) * V;
    for (uint32_t d = 0; d < DECODES; d++) {
        for (int q = 0; q < N_SEQS; q++) {
            o->tok[d][q] = argmax(last + (size_t)q * V, V);
            rows[q] = (llmi_batch_row){o->tok[d][q], PROMPT + d, &seqs[q], true, ad[q], sc[q]};
        }
        float *out = o->logits + ((size_t)N_SEQS * PROMPT + (size_t)d * N_SEQS) * V;
        const bool fail = fail_allocs && d == DECODES - 1;
        if (fail)
            llmi_alloc_fail_after(1);
        const llm_status st = llmi_engine_run(e, rows, N_SEQS, out);
        const bool fired = fail && alloc_disarm(1) == 0;
        if (fired)
            fail_msg("decode step %u allocated memory once warm (%s)", d,
                     st != LLM_OK ? llm_last_error() : "and did not fail");
        if (st != LLM_OK)
            fail_msg("decode step %u: %s", d, llm_last_error());
        last = out;
    }
    const size_t kv_dim = (size_t)m->hp.n_head_kv * m->hp.head_dim;
    float *kv = o->kv;
    for (int q = 0; q < N_SEQS; q++)
        for (uint32_t l = 0; l < m->hp.n_layer; l++)
            for (int v = 0; v < 2; v++, kv += N_POS * kv_dim)
                assert_int_equal(llmi_engine_kv_read(e, &seqs[q], l, v, 0, N_POS, kv), LLM_OK);
    for (int q = 0; q < N_SEQS; q++)
        llmi_kv_seq_destroy(e->kv, &seqs[q]);
}

/* The sequence of row r of run_out's logits. */
static int row_seq(uint32_t r) { return (int)(r % N_SEQS); }

/* The first differing float of a and b (n floats), or n. */
static size_t first_diff(const float *a, const float *b, size_t n) {
    size_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], sizeof *a) == 0)
        i++;
    return i;
}

/* TP n against the CPU backend on m with adapters r1 and r8, at the
 * current kernel level. */
static void compare(const llm_model *m, uint32_t n, bool f32, const llm_adapter *r1,
                    const llm_adapter *r8) {
    const llmi_hparams *hp = &m->hp;
    const uint32_t V = hp->n_vocab;
    const size_t n_logits = (size_t)N_ROWS * V,
                 n_kv = (size_t)N_SEQS * hp->n_layer * 2 * N_POS * hp->n_head_kv * hp->head_dim;
    const llm_adapter *ad[N_SEQS] = {r1, NULL, r8, r8};
    const float sc[N_SEQS] = {1.0f, 1.0f, 0.7f, -0.5f};
    const llm_adapter *none[N_SEQS] = {NULL};
    run_out ref, got, plain;
    run_out_init(&ref, m);
    run_out_init(&got, m);
    run_out_init(&plain, m);
    llmi_engine *cpu = engine_on(m, &llmi_backend_cpu, f32);
    run_steps(cpu, ad, sc, &ref, false);
    llmi_engine_free(cpu);
    llmi_engine *tp = engine_on(m, llmi_backend_tp(n), f32);
    run_steps(tp, ad, sc, &got, true); /* warm: no allocation in its last step */
    run_steps(tp, none, sc, &plain, false);
    llmi_engine_free(tp);

    const size_t first = first_diff(ref.logits, got.logits, n_logits);
    if (first < n_logits)
        fail_msg("TP %u (level %d, %s activations): row %zu logit %zu is %.9g, CPU backend %.9g", n,
                 llmi_kernels_level(), f32 ? "f32" : "8-bit", first / V, first % V,
                 (double)got.logits[first], (double)ref.logits[first]);
    assert_memory_equal(ref.tok, got.tok, sizeof ref.tok);
    const size_t kv_first = first_diff(ref.kv, got.kv, n_kv);
    if (kv_first < n_kv)
        fail_msg("TP %u: K/V element %zu is %.9g, CPU backend %.9g", n, kv_first,
                 (double)got.kv[kv_first], (double)ref.kv[kv_first]);
    /* Rows without adapter: a step without adapters' bits. Adapter rows
     * past position 0 (where attention has one key whatever Q and K are):
     * moved. */
    double least_moved = INFINITY;
    for (uint32_t r = 0; r < N_ROWS; r++) {
        const float *g = got.logits + (size_t)r * V, *p = plain.logits + (size_t)r * V;
        if (!ad[row_seq(r)]) {
            if (memcmp(g, p, V * sizeof *g) != 0)
                fail_msg("TP %u: row %u has no adapter but differs from a step without any", n, r);
            continue;
        }
        if (r < N_SEQS)
            continue;
        double moved = 0, amax = 0;
        for (uint32_t i = 0; i < V; i++) {
            moved = fmax(moved, fabs((double)g[i] - p[i]));
            amax = fmax(amax, fabs((double)p[i]));
        }
        least_moved = fmin(least_moved, moved / amax);
    }
    if (!(least_moved > 1e-2))
        fail_msg("TP %u: an adapter row moved by only %.3g of its largest logit", n, least_moved);
    printf("# TP %u, %u KV heads, embd %u, ff %u, level %d, %s activations: logits, tokens and "
           "K/V bit-identical to the CPU backend (adapter rows moved >= %.3g)\n",
           n, hp->n_head_kv, hp->n_embd, hp->n_ff, llmi_kernels_level(), f32 ? "f32" : "8-bit",
           least_moved);
    run_out_free(&ref);
    run_out_free(&got);
    run_out_free(&plain);
}

/* compare at TP sizes `sizes` (0-terminated), both activations, every
 * kernel level of this CPU. */
static void compare_all(const llmi_testmodel_params *p, const char *tag, const uint32_t *sizes) {
    llm_model *m = model_from_params(p, tag);
    llm_adapter *r1 = make_adapter(m, 1, 11), *r8 = make_adapter(m, 8, 12);
    const int best = llmi_kernels_level();
    for (int level = 0; level <= best; level++) {
        llmi_kernels_set_level(level);
        for (const uint32_t *n = sizes; *n; n++) {
            compare(m, *n, false, r1, r8);
            compare(m, *n, true, r1, r8);
        }
    }
    llmi_kernels_set_level(-1);
    llm_adapter_free(r1);
    llm_adapter_free(r8);
    llmi_model_free(m);
}

/* 12 heads of 32, n_embd 128, n_ff 384, Q8_0 matrices. */
static void split_params(llmi_testmodel_params *p, uint32_t n_head_kv, uint64_t seed) {
    llmi_testmodel_params_init(p);
    p->n_ctx = N_CTX;
    p->seed = seed;
    p->type = LLMI_T_Q8_0;
    p->n_embd = 128;
    p->n_head = 12;
    p->head_dim = 32;
    p->n_head_kv = n_head_kv;
    p->n_ff = 384;
}

/* Six KV heads split at TP 2 and 3; embedding slices 42/43/43 at TP 3 (O
 * and down updates off the 16-float groups). */
static void test_kv_heads_split(void **state) {
    (void)state;
    llmi_testmodel_params p;
    split_params(&p, 6, 41);
    compare_all(&p, "tp-lora-split", (const uint32_t[]){2, 3, 0});
}

/* One KV head, replicated on every rank at TP 2 and 3. */
static void test_kv_heads_replicated(void **state) {
    (void)state;
    llmi_testmodel_params p;
    split_params(&p, 1, 42);
    compare_all(&p, "tp-lora-repl", (const uint32_t[]){2, 3, 0});
}

/* n_embd 64 and n_ff 96 at TP 3 (embedding slices 21/21/22) and at TP 4
 * (FFN slices of 24: gate and up updates off the 16-float groups too). */
static void test_uneven_slices(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_ctx = N_CTX;
    p.seed = 43;
    p.type = LLMI_T_Q8_0;
    p.n_head = 12;
    p.head_dim = 16;
    p.n_head_kv = 12;
    p.n_ff = 96;
    compare_all(&p, "tp-lora-uneven", (const uint32_t[]){3, 4, 0});
}

/* Greedy requests, three adapters (two of them one adapter at two scales)
 * and one without, through a session on ops. */
static void greedy_requests(const llm_model *m, const llmi_backend_ops *ops,
                            const llm_adapter *const *ad, const float *sc, outcome *outs) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = N_CTX;
    p.max_batch_tokens = 16;
    p.kv_block_size = 4;
    p.prefix_cache = true;
    llmi_session_device dev = {ops, 0};
    llm_session *s = NULL;
    if (llmi_session_create_on(m, &p, &dev, &s) != LLM_OK)
        fail_msg("session: %s", llm_last_error());
    uint64_t rng = 77;
    llm_token prompt[12];
    random_prompt(prompt, 12, m->hp.n_vocab, &rng);
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.temperature = 0.0f;
    memset(outs, 0, N_SEQS * sizeof *outs);
    for (int r = 0; r < N_SEQS; r++) {
        llm_request_params q;
        llm_request_params_init(&q);
        q.max_new_tokens = 16;
        q.ignore_eos = true;
        q.sampling = &sp;
        q.adapter = ad[r];
        q.adapter_scale = sc[r];
        if (llmi_session_submit(s, prompt, 12, &q, &outs[r].id) != LLM_OK)
            fail_msg("submit: %s", llm_last_error());
    }
    drain(s, outs, N_SEQS);
    llmi_session_free(s);
}

static void test_session_greedy(void **state) {
    (void)state;
    llmi_testmodel_params p;
    split_params(&p, 6, 44);
    llm_model *m = model_from_params(&p, "tp-lora-session");
    llm_adapter *r1 = make_adapter(m, 1, 21), *r8 = make_adapter(m, 8, 22);
    const llm_adapter *ad[N_SEQS] = {r8, NULL, r1, r8};
    const float sc[N_SEQS] = {1.0f, 1.0f, 1.0f, 0.5f};
    outcome ref[N_SEQS], got[N_SEQS];
    greedy_requests(m, &llmi_backend_cpu, ad, sc, ref);
    /* The adapters change what is generated (else this could not fail). */
    assert_true(memcmp(ref[0].toks, ref[1].toks, sizeof ref[0].toks) != 0);
    for (uint32_t n = 2; n <= 3; n++) {
        greedy_requests(m, llmi_backend_tp(n), ad, sc, got);
        for (int r = 0; r < N_SEQS; r++) {
            assert_int_equal(got[r].n, 16);
            assert_int_equal(ref[r].n, got[r].n);
            for (uint32_t i = 0; i < got[r].n; i++)
                if (got[r].toks[i] != ref[r].toks[i])
                    fail_msg("TP %u: request %d token %u: %d, CPU %d", n, r, i, got[r].toks[i],
                             ref[r].toks[i]);
        }
        printf("# TP %u: greedy requests under adapters give the CPU backend's tokens\n", n);
    }
    llm_adapter_free(r1);
    llm_adapter_free(r8);
    llmi_model_free(m);
}

/* One step of a row with adapter ad; returns its status. */
static llm_status one_step(llmi_engine *e, const llm_adapter *ad, float *logits) {
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(e->kv, &seq, 2), LLM_OK);
    llmi_batch_row rows[2] = {{5, 0, &seq, false, ad, 1.0f}, {9, 1, &seq, true, ad, 1.0f}};
    const llm_status st = llmi_engine_run(e, rows, 2, logits);
    llmi_kv_seq_destroy(e->kv, &seq);
    return st;
}

static void test_bad_shapes(void **state) {
    (void)state;
    llmi_testmodel_params p;
    split_params(&p, 6, 45);
    llm_model *m = model_from_params(&p, "tp-lora-bad");
    llm_adapter *a = make_adapter(m, 8, 31);
    float *ref = llmi_malloc(m->hp.n_vocab * sizeof *ref),
          *got = llmi_malloc(m->hp.n_vocab * sizeof *got);
    assert_true(ref && got);
    llmi_engine *cpu = engine_on(m, &llmi_backend_cpu, false);
    assert_int_equal(one_step(cpu, a, ref), LLM_OK);
    /* A of O one column short of the gathered attention row; B of gate
     * half as long as the FFN (each rank's slice would still fit in it,
     * but the projection does not). */
    static const struct {
        llmi_lora_target t;
        int d_in, d_out;
        const char *name;
    } cases[] = {{LLMI_LORA_O, -1, 0, "layer 1, o"}, {LLMI_LORA_GATE, 0, -192, "layer 1, gate"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        llmi_lora_pair *pair = &a->pairs[1 * LLMI_LORA_TARGETS + cases[c].t];
        const llmi_lora_pair saved = *pair;
        pair->in = (uint32_t)((int)pair->in + cases[c].d_in);
        pair->out = (uint32_t)((int)pair->out + cases[c].d_out);
        for (uint32_t n = 1; n <= 3; n++) {
            llmi_engine *e = n == 1 ? cpu : engine_on(m, llmi_backend_tp(n), false);
            assert_int_equal(one_step(e, a, got), LLM_ERR_INVALID_ARGUMENT);
            printf("# %s %u: %s\n", n == 1 ? "CPU" : "TP", n, llm_last_error());
            assert_non_null(strstr(llm_last_error(), cases[c].name));
            assert_non_null(strstr(llm_last_error(), "LoRA adapter"));
            if (n > 1) { /* the same engine goes on with the good adapter */
                *pair = saved;
                assert_int_equal(one_step(e, a, got), LLM_OK);
                assert_memory_equal(ref, got, m->hp.n_vocab * sizeof *ref);
                pair->in = (uint32_t)((int)pair->in + cases[c].d_in);
                pair->out = (uint32_t)((int)pair->out + cases[c].d_out);
                llmi_engine_free(e);
            }
        }
        *pair = saved;
    }
    llmi_engine_free(cpu);
    llmi_free(ref);
    llmi_free(got);
    llm_adapter_free(a);
    llmi_model_free(m);
}

/* SmolLM2-135M (LLM_TEST_MODEL; 9 heads, 3 KV heads, Q4_1) at TP 3 with
 * random adapters on every projection of its 30 layers, 8-bit
 * activations: the CPU backend's bits. */
static void test_smollm2(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path || access(path, R_OK) != 0) {
        print_message("skipping: LLM_TEST_MODEL is not set\n");
        skip();
    }
    llm_model *m = NULL;
    if (llmi_model_load(path, true, &m) != LLM_OK)
        fail_msg("%s: %s", path, llm_last_error());
    llm_adapter *r1 = make_adapter(m, 1, 51), *r8 = make_adapter(m, 8, 52);
    compare(m, 3, false, r1, r8);
    llm_adapter_free(r1);
    llm_adapter_free(r8);
    llmi_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_heads_split), cmocka_unit_test(test_kv_heads_replicated),
        cmocka_unit_test(test_uneven_slices),  cmocka_unit_test(test_session_greedy),
        cmocka_unit_test(test_bad_shapes),     cmocka_unit_test(test_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
