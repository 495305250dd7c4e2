/* Speculative decoding: exactness is tested, not assumed.
 *
 *  - greedy with speculation equals greedy without, token for token: both
 *    proposers, llm_generate and the scheduler, tiny random models (the
 *    draft a different random model of the same vocabulary, or the target
 *    itself, which must accept every draft) and SmolLM2 (LLM_TEST_MODEL);
 *  - sampling: the n-gram proposer gives exactly plain sampling's tokens;
 *    a sampling draft model gives the same tokens whatever k is and
 *    whatever runs beside it; and a chi-square test (p = 0.001) shows the
 *    first and second generated tokens follow the target's distribution,
 *    and that the same test fails when the verifier is broken on purpose;
 *    with a grammar, the tokens follow the target's distribution
 *    renormalised over what the grammar allows (chi-square again), and
 *    n-gram speculation gives plain decoding's tokens;
 *  - rollback: a soak of submits, steps and cancels with speculating
 *    requests in a small pool, KV invariants (target and draft pools) after
 *    every operation, everything free or cached at the end;
 *  - stop conditions apply token by token; vocabulary mismatches and bad
 *    parameters are refused; F16 KV stays exact; submit/cancel from other
 *    threads while the draft model runs; allocation failures at session
 *    create and in steps fail cleanly and change no output.
 * Seeds are fixed and printed. */
#include "feed_util.h"
#include "sched_util.h"

#include <math.h>
#include <pthread.h>

static llm_model *g_target, *g_draft; /* two random models, one vocabulary */

/* A session on `m` drafting with `draft` (may be NULL). n_blocks 0 = default. */
static llm_session *spec_session(const llm_model *m, const llm_model *draft, uint32_t n_ctx,
                                 uint32_t max_batch, uint32_t block_size, uint32_t n_blocks,
                                 bool prefix_cache) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    p.max_batch_tokens = max_batch;
    p.kv_block_size = block_size;
    p.prefix_cache = prefix_cache;
    p.draft_model = draft;
    if (n_blocks)
        p.kv_cache_bytes = (uint64_t)n_blocks *
                           llmi_kv_block_bytes(m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim,
                                               block_size);
    llm_session *s = NULL;
    llm_status st = create_test_session(m, &p, &s);
    if (st != LLM_OK) fail_msg("session: %s", llm_last_error());
    return s;
}

/* A prompt whose second half repeats its first: matches for the n-gram. */
static uint32_t repetitive_prompt(llm_token *t, uint32_t n, uint64_t *rng) {
    uint32_t half = n / 2;
    random_prompt(t, half, llmi_testmodel_n_vocab(), rng);
    for (uint32_t i = half; i < n; i++) t[i] = t[i - half];
    return n;
}

/* ---- llm_generate ---- */

typedef struct gen_out {
    llm_token toks[600];
    uint32_t n;
    char text[8192];
    size_t text_len;
    llm_generate_result res;
} gen_out;

static bool collect(llm_token tok, const char *piece, size_t len, void *user) {
    gen_out *o = user;
    if (tok != LLM_TOKEN_NONE) {
        assert_true(o->n < 600);
        o->toks[o->n++] = tok;
    }
    assert_true(o->text_len + len < sizeof o->text);
    memcpy(o->text + o->text_len, piece, len);
    o->text_len += len;
    return true;
}

static void generate(llm_session *s, const llm_token *prompt, uint32_t n, uint32_t max_new,
                     const llm_sampling_params *sp, uint32_t mode, uint32_t k, bool ignore_eos,
                     gen_out *out) {
    memset(out, 0, sizeof *out);
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = max_new;
    gp.sampling = sp;
    gp.on_token = collect;
    gp.user = out;
    gp.ignore_eos = ignore_eos;
    gp.spec_mode = mode;
    gp.spec_k = k;
    out->res.struct_size = sizeof out->res;
    llm_status st = llm_generate(s, prompt, n, &gp, &out->res);
    if (st != LLM_OK) fail_msg("generate: %s", llm_last_error());
}

static void expect_same_gen(const gen_out *a, const gen_out *b, const char *what) {
    if (a->n != b->n || memcmp(a->toks, b->toks, a->n * sizeof a->toks[0]) != 0) {
        uint32_t i = 0;
        while (i < a->n && i < b->n && a->toks[i] == b->toks[i]) i++;
        fail_msg("%s: %u vs %u tokens, first difference at %u", what, a->n, b->n, i);
    }
    assert_int_equal(a->res.finish_reason, b->res.finish_reason);
    assert_int_equal(a->text_len, b->text_len);
    assert_memory_equal(a->text, b->text, a->text_len);
}

static void test_ngram_proposer(void **state) {
    (void)state;
    llm_token out[8];
    uint32_t order = 0, len = 0;
    /* 1 2 3 4 1 2 3: the last 3 occurred at 0; 4 followed, then the period. */
    const llm_token a[] = {1, 2, 3, 4, 1, 2, 3};
    assert_int_equal(llmi_spec_ngram(a, 7, 6, out, &order, &len), 6);
    assert_int_equal(order, 3);
    assert_int_equal(len, 3);
    const llm_token want_a[] = {4, 1, 2, 3, 4, 1};
    assert_memory_equal(out, want_a, sizeof want_a);
    /* Only the last token matches (order 1), the most recent occurrence. */
    const llm_token b[] = {5, 9, 6, 9, 7, 8, 9};
    assert_int_equal(llmi_spec_ngram(b, 7, 2, out, &order, &len), 2);
    assert_int_equal(order, 1);
    assert_int_equal(len, 1);
    assert_int_equal(out[0], 7);
    assert_int_equal(out[1], 8);
    /* A constant run continues itself. */
    const llm_token c[] = {3, 3, 3};
    assert_int_equal(llmi_spec_ngram(c, 3, 4, out, &order, &len), 4);
    assert_int_equal(order, 2);
    assert_int_equal(len, 2);
    for (int i = 0; i < 4; i++) assert_int_equal(out[i], 3);
    /* Nothing matches. */
    const llm_token d[] = {1, 2, 3, 4};
    assert_int_equal(llmi_spec_ngram(d, 4, 4, out, &order, &len), 0);
    assert_int_equal(llmi_spec_ngram(d, 1, 4, out, &order, &len), 0);
    /* A long copy: the match reaches back 7 tokens (the 8th differs). */
    const llm_token e[] = {9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7};
    assert_int_equal(llmi_spec_ngram(e, 17, 3, out, &order, &len), 3);
    assert_int_equal(order, 3);
    assert_int_equal(len, 7);
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 0);
}

/* Greedy with speculation = greedy without, through llm_generate. */
static void test_generate_greedy_equal(void **state) {
    (void)state;
    llm_session *plain = spec_session(g_target, NULL, 1024, 64, 16, 64, true);
    llm_session *with_draft = spec_session(g_target, g_draft, 1024, 64, 16, 64, true);
    llm_session *self_draft = spec_session(g_target, g_target, 1024, 64, 16, 64, true);
    static gen_out base, out;
    uint64_t rng = 2024;
    printf("# seed 2024\n");
    uint64_t drafted = 0, accepted = 0, self_drafted = 0;
    for (int t = 0; t < 6; t++) {
        llm_token prompt[300];
        uint32_t n = rand_range(&rng, 1, 200);
        if (t % 2) repetitive_prompt(prompt, n, &rng);
        else random_prompt(prompt, n, g_target->hp.n_vocab, &rng);
        uint32_t max_new = rand_range(&rng, 20, 90);
        generate(plain, prompt, n, max_new, NULL, LLM_SPEC_NONE, 0, true, &base);
        assert_int_equal(base.n, max_new);
        static const struct {
            uint32_t mode, k;
            int session; /* 0 plain, 1 draft, 2 self */
        } runs[] = {{LLM_SPEC_NGRAM, 0, 0}, {LLM_SPEC_NGRAM, 5, 0}, {LLM_SPEC_NGRAM, 32, 1},
                    {LLM_SPEC_DRAFT, 0, 1}, {LLM_SPEC_DRAFT, 3, 1}, {LLM_SPEC_DRAFT, 4, 2}};
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
            llm_session *s = runs[i].session == 0 ? plain : runs[i].session == 1 ? with_draft
                                                                                 : self_draft;
            generate(s, prompt, n, max_new, NULL, runs[i].mode, runs[i].k, true, &out);
            char what[96];
            snprintf(what, sizeof what, "prompt %d (%u tokens), mode %u k %u%s", t, n,
                     runs[i].mode, runs[i].k, runs[i].session == 2 ? " (self-draft)" : "");
            expect_same_gen(&out, &base, what);
            if (runs[i].session == 2) { /* its own draft: every draft is accepted */
                assert_true(out.res.n_draft_tokens > 0);
                assert_int_equal(out.res.n_accepted_tokens, out.res.n_draft_tokens);
                self_drafted += out.res.n_draft_tokens;
            } else {
                drafted += out.res.n_draft_tokens;
                accepted += out.res.n_accepted_tokens;
            }
        }
    }
    printf("# other proposers: %llu drafted, %llu accepted; self-draft accepted all %llu\n",
           (unsigned long long)drafted, (unsigned long long)accepted,
           (unsigned long long)self_drafted);
    assert_true(accepted > 0 && accepted < drafted);
    llm_session_free(plain);
    llm_session_free(with_draft);
    llm_session_free(self_draft);
}

/* F16 KV (the draft model's too): still exact, and still every draft
 * accepted when the target drafts for itself. */
static void test_f16_kv(void **state) {
    (void)state;
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = 512;
    p.kv_type = LLM_KV_F16;
    p.kv_cache_bytes = 4u << 20;
    p.draft_model = g_target;
    llm_session *s = NULL;
    assert_int_equal(create_test_session(g_target, &p, &s), LLM_OK);
    static gen_out base, out;
    llm_token prompt[80];
    uint64_t rng = 1616;
    printf("# seed 1616\n");
    repetitive_prompt(prompt, 80, &rng);
    generate(s, prompt, 80, 60, NULL, LLM_SPEC_NONE, 0, true, &base);
    generate(s, prompt, 80, 60, NULL, LLM_SPEC_NGRAM, 0, true, &out);
    expect_same_gen(&out, &base, "f16 KV, n-gram");
    generate(s, prompt, 80, 60, NULL, LLM_SPEC_DRAFT, 5, true, &out);
    expect_same_gen(&out, &base, "f16 KV, self-draft");
    assert_true(out.res.n_draft_tokens > 0);
    assert_int_equal(out.res.n_accepted_tokens, out.res.n_draft_tokens);
    llm_session_free(s);
}

/* ---- the scheduler ---- */

typedef struct spec_req {
    llm_token prompt[400];
    uint32_t n_prompt, max_new, arrive_step;
    uint32_t mode, k;
    bool sampled;
    uint64_t seed;
} spec_req;

static llm_sampling_params g_sampling; /* for sampled requests */

static llm_request_id submit_spec(llm_session *s, const spec_req *r, uint32_t mode) {
    llm_request_params p;
    llm_request_params_init(&p);
    p.max_new_tokens = r->max_new;
    p.ignore_eos = true;
    p.logprobs = true;
    p.spec_mode = mode;
    p.spec_k = r->k;
    llm_sampling_params sp = g_sampling;
    sp.seed = r->seed;
    p.sampling = r->sampled ? &sp : NULL;
    llm_request_id id = 0;
    llm_status st = llmi_session_submit(s, r->prompt, r->n_prompt, &p, &id);
    if (st != LLM_OK) fail_msg("submit: %s", llmi_error_message());
    return id;
}

static void make_spec_reqs(spec_req *reqs, size_t n, uint64_t seed, bool sampled) {
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++) {
        spec_req *r = &reqs[i];
        r->n_prompt = rand_range(&rng, 1, 300);
        if (rand_range(&rng, 0, 1)) repetitive_prompt(r->prompt, r->n_prompt, &rng);
        else random_prompt(r->prompt, r->n_prompt, g_target->hp.n_vocab, &rng);
        r->max_new = rand_range(&rng, 1, 60);
        r->arrive_step = rand_range(&rng, 0, 20);
        r->mode = rand_range(&rng, 0, 2);
        r->k = rand_range(&rng, 0, 1) ? 0 : rand_range(&rng, 1, 8);
        /* An adaptive draft model may switch itself off, depending on
         * timing: then a sampled request's tokens would depend on when. */
        if (sampled && r->mode == LLM_SPEC_DRAFT && r->k == 0) r->k = 3;
        r->sampled = sampled;
        r->seed = rand_range(&rng, 0, 1000000);
    }
}

/* Each request alone in a fresh session (optionally with speculation). */
static void run_alone(const spec_req *reqs, size_t n, outcome *out, bool use_spec) {
    for (size_t i = 0; i < n; i++) {
        llm_session *s = spec_session(g_target, g_draft, 1024, 512, 16, 64, false);
        memset(&out[i], 0, sizeof out[i]);
        out[i].id = submit_spec(s, &reqs[i], use_spec ? reqs[i].mode : LLM_SPEC_NONE);
        drain(s, &out[i], 1);
        llmi_session_free(s);
    }
}

static void run_together(llm_session *s, const spec_req *reqs, size_t n, outcome *out) {
    memset(out, 0, n * sizeof *out);
    size_t submitted = 0;
    for (uint32_t step = 0;; step++) {
        for (size_t i = 0; i < n; i++)
            if (reqs[i].arrive_step == step) {
                out[i].id = submit_spec(s, &reqs[i], reqs[i].mode);
                submitted++;
            }
        step_once(s, out, n);
        check_invariants(s);
        llm_session_stats st = {sizeof st};
        llmi_session_stats(s, &st);
        if (submitted == n && st.n_running == 0 && st.n_waiting == 0) break;
        assert_true(step < 100000);
    }
}

static void expect_same_outcomes(const outcome *a, const outcome *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (a[i].n != b[i].n || memcmp(a[i].toks, b[i].toks, a[i].n * sizeof a[i].toks[0]))
            fail_msg("request %zu: %u tokens vs %u, or different tokens", i, a[i].n, b[i].n);
        /* The same rows give the same log-probabilities, bit for bit. */
        assert_memory_equal(a[i].logprobs, b[i].logprobs, a[i].n * sizeof(float));
        assert_int_equal(a[i].finish, b[i].finish);
        assert_int_equal(a[i].n_finish_events, 1);
        assert_int_equal(a[i].text_len, b[i].text_len);
        assert_memory_equal(a[i].text, b[i].text, a[i].text_len);
    }
}

static bool idle(llm_session *s) {
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    return st.n_running == 0 && st.n_waiting == 0;
}

static void expect_pools_idle(llm_session *s) {
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    assert_int_equal(st.blocks_used, 0);
    llmi_kv_prefix_clear(s->kv);
    check_invariants(s);
    assert_int_equal(s->kv->n_free, s->kv->n_blocks);
    if (s->spec.dkv) {
        llmi_kv_prefix_clear(s->spec.dkv);
        check_invariants(s);
        assert_int_equal(s->spec.dkv->n_free, s->spec.dkv->n_blocks);
    }
}

/* Speculating and plain requests in one continuous batch (a small token
 * budget: chunked prefills, drafts squeezed by the budget) give each
 * request exactly what plain decoding alone gives. */
static void sched_equal_alone(bool sampled, uint64_t seed) {
    enum { N = 16 };
    static spec_req reqs[N];
    static outcome together[N], alone[N], alone_spec[N];
    printf("# seed %llu, %s\n", (unsigned long long)seed, sampled ? "sampled" : "greedy");
    make_spec_reqs(reqs, N, seed, sampled);
    if (sampled) /* n-gram: plain sampling's tokens; draft: k-invariant */
        run_alone(reqs, N, alone_spec, true);
    run_alone(reqs, N, alone, false);
    llm_session *s = spec_session(g_target, g_draft, 1024, 48, 16, 512, true);
    run_together(s, reqs, N, together);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    printf("# %llu steps, %llu spec steps, %llu drafted, %llu accepted\n",
           (unsigned long long)st.steps, (unsigned long long)st.spec_steps,
           (unsigned long long)st.spec_draft_tokens, (unsigned long long)st.spec_accepted_tokens);
    assert_true(st.spec_accepted_tokens > 0 && st.spec_draft_tokens > st.spec_accepted_tokens);
    if (!sampled) {
        expect_same_outcomes(together, alone, N);
    } else {
        for (size_t i = 0; i < N; i++) {
            const outcome *want = reqs[i].mode == LLM_SPEC_DRAFT ? &alone_spec[i] : &alone[i];
            expect_same_outcomes(&together[i], want, 1);
            if (reqs[i].mode != LLM_SPEC_DRAFT) expect_same_outcomes(&alone_spec[i], &alone[i], 1);
        }
    }
    expect_pools_idle(s);
    llmi_session_free(s);
}

static void test_sched_greedy_equal_alone(void **state) {
    (void)state;
    sched_equal_alone(false, 515);
}

/* With sampling: n-gram requests give exactly plain sampling's tokens (the
 * verifier draws with plain sampling's random number), draft-model
 * requests the same tokens alone and in a batch. Penalties make every
 * position depend on the accepted drafts before it. */
static void test_sched_sampled_equal_alone(void **state) {
    (void)state;
    llm_sampling_params_init(&g_sampling);
    g_sampling.temperature = 0.7f;
    g_sampling.repeat_penalty = 1.2f;
    g_sampling.presence_penalty = 0.3f;
    sched_equal_alone(true, 616);
    llm_sampling_params_init(&g_sampling);
}

/* A sampling draft model decides every position with numbers keyed by
 * (seed, position): the tokens do not depend on k. */
static void test_draft_sampling_k_invariant(void **state) {
    (void)state;
    llm_session *s = spec_session(g_target, g_draft, 1024, 512, 16, 64, true);
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.temperature = 1.0f;
    sp.top_k = 20;
    static gen_out base, out;
    uint64_t rng = 4711;
    printf("# seed 4711\n");
    for (int t = 0; t < 4; t++) {
        llm_token prompt[64];
        uint32_t n = rand_range(&rng, 2, 60);
        random_prompt(prompt, n, g_target->hp.n_vocab, &rng);
        sp.seed = rng;
        generate(s, prompt, n, 50, &sp, LLM_SPEC_DRAFT, 1, true, &base);
        assert_true(base.res.n_accepted_tokens > 0);
        const uint32_t ks[] = {2, 5, 9, 32};
        for (size_t i = 0; i < 4; i++) {
            generate(s, prompt, n, 50, &sp, LLM_SPEC_DRAFT, ks[i], true, &out);
            char what[64];
            snprintf(what, sizeof what, "prompt %d, k %u", t, ks[i]);
            expect_same_gen(&out, &base, what);
        }
    }
    llm_session_free(s);
}

/* ---- the distribution ---- */

enum { N_SUPPORT = 6 };
static const llm_token support[N_SUPPORT] = {40, 41, 42, 43, 44, 45};

/* The sampling params of the chi-square test: every token but the support
 * banned, so p and q live on the same few tokens. */
static llm_logit_bias g_bans[400];
static void chi_params(llm_sampling_params *sp) {
    llm_sampling_params_init(sp);
    sp->temperature = 0.5f;
    sp->top_k = 0;
    sp->top_p = 1.0f;
    sp->min_p = 0.0f;
    size_t n = 0;
    for (uint32_t t = 0; t < g_target->hp.n_vocab; t++) {
        bool keep = false;
        for (int i = 0; i < N_SUPPORT; i++) keep |= support[i] == (llm_token)t;
        if (!keep) g_bans[n++] = (llm_logit_bias){(llm_token)t, -INFINITY};
    }
    sp->logit_bias = g_bans;
    sp->n_logit_bias = n;
}

static int support_index(llm_token t) {
    for (int i = 0; i < N_SUPPORT; i++)
        if (support[i] == t) return i;
    fail_msg("token %d outside the support", t);
    return -1;
}

/* The post-pipeline distribution of `m` after `hist`, over the support;
 * with `gs`, constrained by that grammar state. */
static void model_dist_g(const llm_model *m, const llm_token *hist, uint32_t n, uint32_t n_gen,
                         const llm_sampling_params *user, llmi_gstate *gs, double *out) {
    llm_session *s = spec_session(m, NULL, 256, 64, 16, 16, false);
    llm_sampling_params sp;
    assert_int_equal(llmi_sampling_params_read(user, m->hp.n_vocab, &sp), LLM_OK);
    llmi_kv_seq seq = {0};
    float *logits = malloc(m->hp.n_vocab * sizeof(float));
    assert_non_null(logits);
    assert_int_equal(test_feed(s, &seq, hist, n, logits), LLM_OK);
    llmi_candidate *c = NULL;
    s->sampler.grammar = gs;
    uint32_t nc = llmi_sample_dist(&s->sampler, logits, &sp, hist, n, n_gen, m->tok, &c);
    s->sampler.grammar = NULL;
    assert_int_equal(s->sampler.grammar_status, LLM_OK);
    for (int i = 0; i < N_SUPPORT; i++) out[i] = llmi_sample_prob(c, nc, support[i]);
    llmi_kv_seq_destroy(s->kv, &seq);
    free(logits);
    llm_session_free(s);
}

static void model_dist(const llm_model *m, const llm_token *hist, uint32_t n, uint32_t n_gen,
                       const llm_sampling_params *user, double *out) {
    model_dist_g(m, hist, n, n_gen, user, NULL, out);
}

/* Chi-square statistic of counts against probabilities; *df gets the
 * degrees of freedom (categories with expected count >= 5, the rest pooled). */
static double chi_square(const uint32_t *count, const double *prob, int n, uint32_t total,
                         int *df) {
    double chi = 0, pool_o = 0, pool_e = 0;
    int cats = 0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * total;
        if (e < 5) {
            pool_o += count[i];
            pool_e += e;
            continue;
        }
        chi += (count[i] - e) * (count[i] - e) / e;
        cats++;
    }
    if (pool_e > 0) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / (pool_e > 1e-9 ? pool_e : 1e-9);
        cats++;
    }
    *df = cats - 1;
    return chi;
}

/* Upper 0.001 quantiles of chi-square, df 1..10. */
static const double chi_crit_001[11] = {0,     10.83, 13.82, 16.27, 18.47, 20.52,
                                        22.46, 24.32, 26.12, 27.88, 29.59};

enum { CHI_SAMPLES = 3000 };

/* Draws CHI_SAMPLES two-token continuations with the draft model (k fixed
 * at 1: positions 1 and 2 both decided by draft and verifier) and returns
 * the chi-square statistics of both positions against the target. */
static void chi_run_g(llm_session *s, const llm_token *prompt, uint32_t n,
                      const llm_grammar *g, const double *p1,
                      const double p2[N_SUPPORT][N_SUPPORT], double *chi1, double *chi2,
                      int *df1, int *df2, double *accept_rate) {
    llm_sampling_params sp;
    chi_params(&sp);
    sp.grammar = g;
    uint32_t c1[N_SUPPORT] = {0}, c2[N_SUPPORT] = {0};
    uint64_t drafted = 0, accepted = 0;
    static gen_out out;
    for (uint32_t i = 0; i < CHI_SAMPLES; i++) {
        sp.seed = 1000 + i;
        generate(s, prompt, n, 2, &sp, LLM_SPEC_DRAFT, 1, true, &out);
        assert_int_equal(out.n, 2);
        c1[support_index(out.toks[0])]++;
        c2[support_index(out.toks[1])]++;
        drafted += out.res.n_draft_tokens;
        accepted += out.res.n_accepted_tokens;
    }
    double m2[N_SUPPORT] = {0}; /* marginal of position 2 */
    for (int x = 0; x < N_SUPPORT; x++)
        for (int y = 0; y < N_SUPPORT; y++) m2[y] += p1[x] * p2[x][y];
    *chi1 = chi_square(c1, p1, N_SUPPORT, CHI_SAMPLES, df1);
    *chi2 = chi_square(c2, m2, N_SUPPORT, CHI_SAMPLES, df2);
    *accept_rate = drafted ? (double)accepted / (double)drafted : 0;
}

static void chi_run(llm_session *s, const llm_token *prompt, uint32_t n, const double *p1,
                    const double p2[N_SUPPORT][N_SUPPORT], double *chi1, double *chi2, int *df1,
                    int *df2, double *accept_rate) {
    chi_run_g(s, prompt, n, NULL, p1, p2, chi1, chi2, df1, df2, accept_rate);
}

static void test_distribution_chi_square(void **state) {
    (void)state;
    llm_token prompt[12];
    uint64_t rng = 99;
    random_prompt(prompt, 12, g_target->hp.n_vocab, &rng);
    printf("# prompt seed 99, seeds 1000..%d, support %d tokens, temperature 0.5\n",
           1000 + CHI_SAMPLES - 1, N_SUPPORT);
    llm_sampling_params sp;
    chi_params(&sp);
    /* The target's distribution at position 1, and at position 2 after each
     * first token; the draft's at position 1 for comparison. */
    double p1[N_SUPPORT], q1[N_SUPPORT], p2[N_SUPPORT][N_SUPPORT];
    model_dist(g_target, prompt, 12, 0, &sp, p1);
    model_dist(g_draft, prompt, 12, 0, &sp, q1);
    llm_token hist[13];
    memcpy(hist, prompt, sizeof prompt);
    for (int x = 0; x < N_SUPPORT; x++) {
        hist[12] = support[x];
        model_dist(g_target, hist, 13, 1, &sp, p2[x]);
    }
    double tv = 0;
    for (int i = 0; i < N_SUPPORT; i++) tv += fabs(p1[i] - q1[i]) / 2;
    printf("# p1 = %.3f %.3f %.3f %.3f %.3f %.3f; q1 = %.3f %.3f %.3f %.3f %.3f %.3f; TV %.3f\n",
           p1[0], p1[1], p1[2], p1[3], p1[4], p1[5], q1[0], q1[1], q1[2], q1[3], q1[4], q1[5],
           tv);
    assert_true(tv > 0.1); /* the draft is different enough to be rejected */

    llm_session *s = spec_session(g_target, g_draft, 256, 64, 16, 16, false);
    static const char *const names[] = {"correct verifier", "broken: accept every draft",
                                        "broken: resample from p instead of the residual"};
    for (int mode = 0; mode < 3; mode++) {
        llmi_spec_test_break(mode);
        double chi1, chi2, acc;
        int df1, df2;
        chi_run(s, prompt, 12, p1, (const double(*)[N_SUPPORT])p2, &chi1, &chi2, &df1, &df2,
                &acc);
        llmi_spec_test_break(0);
        assert_true(df1 >= 1 && df1 <= 10 && df2 >= 1 && df2 <= 10);
        printf("# %s: acceptance %.3f; position 1 chi2 %.1f (df %d, p=0.001 threshold %.2f); "
               "position 2 chi2 %.1f (df %d, threshold %.2f)\n",
               names[mode], acc, chi1, df1, chi_crit_001[df1], chi2, df2, chi_crit_001[df2]);
        if (mode == 0) {
            assert_true(acc > 0.05 && acc < 0.95); /* rejections happen */
            assert_true(chi1 < chi_crit_001[df1]);
            assert_true(chi2 < chi_crit_001[df2]);
        } else { /* the test can fail: it does on a broken verifier */
            assert_true(chi1 > chi_crit_001[df1]);
            assert_true(chi2 > chi_crit_001[df2]);
        }
    }
    llm_session_free(s);
}

/* With a grammar (support tokens 40..45 are the bytes I..N): the first
 * token is one of I K L M, the second depends on it. The draft model knows
 * nothing of the grammar, so its drafts are often refused; the output must
 * still follow the target's distribution renormalised over what the
 * grammar allows, at both positions. */
static void test_grammar_chi_square(void **state) {
    (void)state;
    static const char text[] = "root ::= [IK] [JLMN] | [LM] [IJK]";
    llmi_grammar *g = NULL;
    assert_int_equal(llmi_grammar_from_ebnf(text, strlen(text), "root", &g), LLM_OK);
    assert_int_equal(llmi_grammar_bind_vocab(g, g_target->tok), LLM_OK);
    llm_token prompt[12];
    uint64_t rng = 99;
    random_prompt(prompt, 12, g_target->hp.n_vocab, &rng);
    llm_sampling_params sp;
    chi_params(&sp);
    sp.grammar = g;
    double p1[N_SUPPORT], p2[N_SUPPORT][N_SUPPORT];
    llmi_gstate *gs = NULL;
    assert_int_equal(llmi_gstate_create(g, &gs), LLM_OK);
    model_dist_g(g_target, prompt, 12, 0, &sp, gs, p1);
    assert_true(p1[1] == 0.0 && p1[5] == 0.0); /* J and N are not allowed first */
    llm_token hist[13];
    memcpy(hist, prompt, sizeof prompt);
    for (int x = 0; x < N_SUPPORT; x++) {
        memset(p2[x], 0, sizeof p2[x]);
        if (p1[x] == 0.0) continue;
        llmi_gstate *gx = NULL;
        assert_int_equal(llmi_gstate_fork(gs, &gx), LLM_OK);
        assert_int_equal(llmi_gstate_accept_token(gx, support[x]), LLM_OK);
        hist[12] = support[x];
        model_dist_g(g_target, hist, 13, 1, &sp, gx, p2[x]);
        llmi_gstate_free(gx);
    }
    llmi_gstate_free(gs);
    llm_session *s = spec_session(g_target, g_draft, 256, 64, 16, 16, false);
    double chi1, chi2, acc;
    int df1, df2;
    chi_run_g(s, prompt, 12, g, p1, (const double(*)[N_SUPPORT])p2, &chi1, &chi2, &df1, &df2,
              &acc);
    printf("# grammar: acceptance %.3f; position 1 chi2 %.1f (df %d, threshold %.2f); "
           "position 2 chi2 %.1f (df %d, threshold %.2f)\n",
           acc, chi1, df1, chi_crit_001[df1], chi2, df2, chi_crit_001[df2]);
    assert_true(df1 >= 1 && df2 >= 1);
    assert_true(chi1 < chi_crit_001[df1]);
    assert_true(chi2 < chi_crit_001[df2]);
    /* n-gram speculation under the grammar gives plain decoding's tokens */
    static gen_out plain, spec;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        sp.seed = seed;
        generate(s, prompt, 12, 8, &sp, LLM_SPEC_NONE, 0, true, &plain);
        generate(s, prompt, 12, 8, &sp, LLM_SPEC_NGRAM, 4, true, &spec);
        expect_same_gen(&plain, &spec, "grammar, n-gram");
        assert_int_equal(plain.n, 2);
        assert_int_equal(plain.res.finish_reason, LLM_FINISH_STOP);
    }
    llm_session_free(s);
    llmi_grammar_free(g);
}

/* ---- stop conditions ---- */

/* Stop tokens, stop strings and max_new_tokens end a speculating request
 * exactly where they end a plain one: nothing past the stop is emitted. */
static void test_stop_conditions(void **state) {
    (void)state;
    static spec_req r;
    static outcome base, out;
    uint64_t rng = 8;
    printf("# seed 8\n");
    r.n_prompt = repetitive_prompt(r.prompt, 40, &rng);
    for (uint32_t i = 0; i < r.n_prompt; i++) r.prompt[i] = 'a' + (r.prompt[i] % 26);
    r.max_new = 60;
    r.mode = LLM_SPEC_NONE;
    run_alone(&r, 1, &base, false);
    assert_int_equal(base.n, 60);
    llm_session *s = spec_session(g_target, g_draft, 1024, 512, 16, 64, false);
    for (uint32_t mode = LLM_SPEC_NGRAM; mode <= LLM_SPEC_DRAFT; mode++) {
        llm_request_params p;
        llm_request_params_init(&p);
        p.ignore_eos = true;
        p.spec_mode = mode;
        p.spec_k = 8;
        /* max_new_tokens: exactly that many, the same ones. */
        for (uint32_t m = 1; m <= 20; m += 3) {
            p.max_new_tokens = m;
            memset(&out, 0, sizeof out);
            assert_int_equal(llmi_session_submit(s, r.prompt, r.n_prompt, &p, &out.id), LLM_OK);
            drain(s, &out, 1);
            assert_int_equal(out.n, m);
            assert_memory_equal(out.toks, base.toks, m * sizeof(llm_token));
            assert_int_equal(out.finish, LLM_FINISH_LENGTH);
        }
        /* A stop token in the middle of a run of accepted drafts. */
        p.max_new_tokens = 60;
        p.stop_tokens = &base.toks[25];
        p.n_stop_tokens = 1;
        memset(&out, 0, sizeof out);
        assert_int_equal(llmi_session_submit(s, r.prompt, r.n_prompt, &p, &out.id), LLM_OK);
        drain(s, &out, 1);
        uint32_t first = 0;
        while (base.toks[first] != base.toks[25]) first++;
        assert_int_equal(out.finish, LLM_FINISH_STOP);
        assert_int_equal(out.n, first + 1);
        assert_int_equal(out.n_finish_events, 1);
        /* A stop string: its text and everything after it withheld. */
        char stop[8] = {0};
        size_t at = base.text_len * 2 / 3;
        while (at < base.text_len && ((unsigned char)base.text[at] & 0xc0) == 0x80) at++;
        size_t len = 1;
        while (at + len < base.text_len && ((unsigned char)base.text[at + len] & 0xc0) == 0x80)
            len++;
        memcpy(stop, base.text + at, len);
        const char *stops[] = {stop};
        p.stop_tokens = NULL;
        p.n_stop_tokens = 0;
        p.stop_strings = stops;
        p.n_stop_strings = 1;
        memset(&out, 0, sizeof out);
        assert_int_equal(llmi_session_submit(s, r.prompt, r.n_prompt, &p, &out.id), LLM_OK);
        drain(s, &out, 1);
        char *hit = strstr(base.text, stop);
        assert_non_null(hit);
        assert_int_equal(out.finish, LLM_FINISH_STOP);
        assert_int_equal(out.text_len, (size_t)(hit - base.text));
        assert_memory_equal(out.text, base.text, out.text_len);
    }
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    assert_true(st.spec_accepted_tokens > 0);
    expect_pools_idle(s);
    llmi_session_free(s);
}

/* ---- rollback soak ---- */

typedef struct soak {
    llm_session *s;
    llm_request_id live[128];
    size_t n_live;
    uint64_t rng;
    uint64_t submits, cancels, steps;
} soak;

static void soak_submit(soak *st, llm_token (*prefixes)[64]) {
    if (st->n_live == 128) return;
    llm_token prompt[200];
    uint32_t pre_len = rand_range(&st->rng, 0, 64);
    memcpy(prompt, prefixes[rand_range(&st->rng, 0, 2)], pre_len * sizeof *prompt);
    uint32_t n = pre_len + rand_range(&st->rng, 1, 60);
    if (rand_range(&st->rng, 0, 1))
        repetitive_prompt(prompt + pre_len, n - pre_len, &st->rng);
    else
        random_prompt(prompt + pre_len, n - pre_len, g_target->hp.n_vocab, &st->rng);
    llm_request_params p;
    llm_request_params_init(&p);
    p.max_new_tokens = rand_range(&st->rng, 1, 48);
    p.ignore_eos = rand_range(&st->rng, 0, 1);
    p.priority = (int32_t)rand_range(&st->rng, 0, 2);
    p.spec_mode = rand_range(&st->rng, 0, 2);
    p.spec_k = rand_range(&st->rng, 0, 1) ? 0 : rand_range(&st->rng, 1, 12);
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.seed = st->rng;
    if (rand_range(&st->rng, 0, 1)) p.sampling = &sp;
    llm_request_id id;
    assert_int_equal(llmi_session_submit(st->s, prompt, n, &p, &id), LLM_OK);
    st->live[st->n_live++] = id;
    st->submits++;
}

static void soak_step(soak *st) {
    llm_event ev[16];
    size_t n = 0;
    llm_status rc = llmi_session_step(st->s, ev, 16, sizeof ev[0], &n);
    if (rc != LLM_OK) fail_msg("step: %s", llmi_error_message());
    for (size_t i = 0; i < n; i++) {
        if (ev[i].finish_reason == LLM_FINISH_NONE) continue;
        size_t k = 0;
        while (k < st->n_live && st->live[k] != ev[i].request) k++;
        assert_true(k < st->n_live); /* finishes once, and only live requests */
        st->live[k] = st->live[--st->n_live];
    }
    st->steps++;
}

static void test_rollback_soak(void **state) {
    (void)state;
    soak st = {.rng = 20260214};
    printf("# soak seed %llu\n", (unsigned long long)st.rng);
    /* 40 blocks of 8 tokens, budget 40: preemption, chunks, budget-capped
     * drafts and drafts refused for want of free blocks. */
    st.s = spec_session(g_target, g_draft, 1024, 40, 8, 40, true);
    static llm_token prefixes[3][64];
    for (int i = 0; i < 3; i++) random_prompt(prefixes[i], 64, g_target->hp.n_vocab, &st.rng);
    enum { OPS = 4000 };
    for (int op = 0; op < OPS; op++) {
        uint32_t kind = rand_range(&st.rng, 0, 99);
        if (kind < 14) {
            soak_submit(&st, prefixes);
        } else if (kind < 19 && st.n_live > 0) {
            llm_request_id id = st.live[rand_range(&st.rng, 0, (uint32_t)st.n_live - 1)];
            assert_int_equal(llmi_session_cancel(st.s, id), LLM_OK);
            st.cancels++;
        } else {
            soak_step(&st);
        }
        check_invariants(st.s);
    }
    while (st.n_live > 0) { /* wind down: let some finish, cancel the rest */
        for (int i = 0; i < 50 && st.n_live > 0; i++) {
            soak_step(&st);
            check_invariants(st.s);
        }
        for (size_t i = 0; i < st.n_live; i++) llmi_session_cancel(st.s, st.live[i]);
        soak_step(&st);
        check_invariants(st.s);
    }
    llm_session_stats stats = {sizeof stats};
    llmi_session_stats(st.s, &stats);
    printf("# %d ops: %llu submits, %llu cancels, %llu steps; %llu preemptions, %llu spec steps, "
           "%llu drafted, %llu accepted\n",
           OPS, (unsigned long long)st.submits, (unsigned long long)st.cancels,
           (unsigned long long)st.steps, (unsigned long long)stats.preemptions,
           (unsigned long long)stats.spec_steps, (unsigned long long)stats.spec_draft_tokens,
           (unsigned long long)stats.spec_accepted_tokens);
    assert_true(stats.preemptions > 0);
    assert_true(stats.spec_accepted_tokens > 0);
    expect_pools_idle(st.s);
    llmi_session_free(st.s);
}

/* ---- concurrency ---- */

/* Submitters and cancellers on other threads while this one steps: the
 * draft model runs outside the session lock on in-flight requests only. */
typedef struct submitter {
    llm_session *s;
    uint64_t seed;
    llm_request_id ids[30];
    int n;
} submitter;

static void *submit_thread(void *arg) {
    submitter *t = arg;
    uint64_t rng = t->seed;
    for (int i = 0; i < 30; i++) {
        llm_token prompt[64];
        uint32_t n = rand_range(&rng, 2, 64);
        repetitive_prompt(prompt, n, &rng);
        llm_request_params p;
        llm_request_params_init(&p);
        p.max_new_tokens = rand_range(&rng, 1, 24);
        p.ignore_eos = true;
        p.spec_mode = rand_range(&rng, 0, 2);
        if (llmi_session_submit(t->s, prompt, n, &p, &t->ids[t->n]) == LLM_OK) t->n++;
        if (t->n > 2 && rand_range(&rng, 0, 2) == 0)
            llmi_session_cancel(t->s, t->ids[rand_range(&rng, 0, (uint32_t)t->n - 1)]);
    }
    return NULL;
}

static void test_concurrent_spec(void **state) {
    (void)state;
    llm_session *s = spec_session(g_target, g_draft, 1024, 96, 16, 96, true);
    submitter t[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        t[i] = (submitter){.s = s, .seed = 300u + (unsigned)i};
        pthread_create(&th[i], NULL, submit_thread, &t[i]);
    }
    size_t finished = 0;
    int joined = 0;
    for (int guard = 0; guard < 200000; guard++) {
        llm_event ev[32];
        size_t n = 0;
        assert_int_equal(llmi_session_step(s, ev, 32, sizeof ev[0], &n), LLM_OK);
        for (size_t i = 0; i < n; i++) finished += ev[i].finish_reason != LLM_FINISH_NONE;
        if (!joined && guard > 30) {
            for (int k = 0; k < 3; k++) pthread_join(th[k], NULL);
            joined = 1;
        }
        if (joined && n == 0 && idle(s)) break;
    }
    int submitted = 0;
    for (int i = 0; i < 3; i++) submitted += t[i].n;
    printf("# %d requests from 3 threads, %zu finished\n", submitted, finished);
    assert_int_equal(finished, (size_t)submitted);
    expect_pools_idle(s);
    llmi_session_free(s);
}

/* ---- refusals ---- */

/* The tiny model's file with its last token renamed: same size, another
 * vocabulary. */
static llm_model *renamed_model(void) {
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_ctx = 1024;
    p.seed = 777;
    p.type = LLMI_T_Q8_0;
    void *data = NULL;
    size_t size = 0;
    assert_int_equal(llmi_testmodel_to_memory(&p, &data, &size), LLM_OK);
    const char *name = "<|im_end|>";
    char *hit = memmem(data, size, name, strlen(name));
    assert_non_null(hit);
    hit[7] = 'X'; /* <|im_enX|> */
    char path[512];
    snprintf(path, sizeof path, "%s/spec-renamed.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
    llmi_free(data);
    llm_model *m = NULL;
    assert_int_equal(llm_model_load(path, NULL, &m), LLM_OK);
    remove(path);
    return m;
}

static void test_refusals(void **state) {
    (void)state;
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 1;
    sp.n_ctx = 256;
    llm_session *s = NULL;
    /* A vocabulary that differs in one token text. */
    llm_model *renamed = renamed_model();
    sp.draft_model = renamed;
    assert_int_equal(create_test_session(g_target, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
    assert_null(s);
    printf("# %s\n", llm_last_error());
    assert_non_null(strstr(llm_last_error(), "vocabulary"));
    assert_non_null(strstr(llm_last_error(), "<|im_enX|>"));
    llm_model_free(renamed);
    /* A different vocabulary size (SmolLM2's 49152 against 307). */
    const char *path = getenv("LLM_TEST_MODEL");
    llm_model *big = NULL;
    if (path && llm_model_load(path, NULL, &big) == LLM_OK) {
        sp.draft_model = big;
        assert_int_equal(create_test_session(g_target, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
        printf("# %s\n", llm_last_error());
        assert_non_null(strstr(llm_last_error(), "vocabulary"));
        llm_model_free(big);
    }
    /* Bad parameters. */
    sp.draft_model = NULL;
    assert_int_equal(create_test_session(g_target, &sp, &s), LLM_OK);
    llm_token prompt[4] = {1, 2, 3, 4};
    llm_request_params rp;
    llm_request_params_init(&rp);
    llm_request_id id;
    rp.spec_mode = LLM_SPEC_DRAFT; /* no draft model */
    assert_int_equal(llm_session_submit(s, prompt, 4, &rp, &id), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "draft_model"));
    rp.spec_mode = 3;
    assert_int_equal(llm_session_submit(s, prompt, 4, &rp, &id), LLM_ERR_INVALID_ARGUMENT);
    rp.spec_mode = LLM_SPEC_NGRAM;
    rp.spec_k = LLM_SPEC_MAX_K + 1;
    assert_int_equal(llm_session_submit(s, prompt, 4, &rp, &id), LLM_ERR_INVALID_ARGUMENT);
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.spec_mode = LLM_SPEC_DRAFT;
    assert_int_equal(llm_generate(s, prompt, 4, &gp, NULL), LLM_ERR_INVALID_ARGUMENT);
    /* A caller of the 1.0 header: spec_mode lies in its padding, ignored. */
    llm_request_params_init(&rp);
    rp.struct_size = 72;
    rp.spec_mode = 0xA5A5A5A5u;
    rp.max_new_tokens = 2;
    assert_int_equal(llm_session_submit(s, prompt, 4, &rp, &id), LLM_OK);
    llm_generate_params_init(&gp);
    gp.struct_size = 40;
    gp.spec_mode = 0xA5A5A5A5u;
    gp.max_new_tokens = 2;
    assert_int_equal(llm_generate(s, prompt, 4, &gp, NULL), LLM_OK);
    llm_session_free(s);
}

/* ---- allocation failures ---- */

/* Two speculating requests (n-gram greedy; a sampling draft model) run to
 * completion with the n-th allocation of the steps failing (0 = none). */
static int run_two_spec(llm_session *s, uint64_t n, outcome out[2]) {
    static spec_req r[2];
    uint64_t rng = 77;
    r[0].n_prompt = repetitive_prompt(r[0].prompt, 40, &rng);
    random_prompt(r[1].prompt, 20, g_target->hp.n_vocab, &rng);
    r[1].n_prompt = 20;
    r[0].max_new = 24;
    r[1].max_new = 20;
    r[0].k = 0;
    r[1].k = 2;
    r[1].sampled = true;
    r[1].seed = 5;
    memset(out, 0, 2 * sizeof *out);
    out[0].id = submit_spec(s, &r[0], LLM_SPEC_NGRAM);
    out[1].id = submit_spec(s, &r[1], LLM_SPEC_DRAFT);
    int failures = 0;
    if (n) llmi_alloc_fail_after(n);
    for (int guard = 0; guard < 10000; guard++) {
        llm_event ev[64];
        size_t k = 0;
        llm_status st = llmi_session_step(s, ev, 64, sizeof ev[0], &k);
        if (st != LLM_OK) {
            assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
            assert_int_equal(k, 0); /* a failed step delivers nothing */
            failures++;
        }
        for (size_t i = 0; i < k; i++) {
            outcome *o = find_outcome(out, 2, ev[i].request);
            assert_int_equal(o->n_finish_events, 0);
            if (ev[i].token != LLM_TOKEN_NONE) o->toks[o->n++] = ev[i].token;
            if (ev[i].finish_reason != LLM_FINISH_NONE) {
                o->finish = ev[i].finish_reason;
                o->n_finish_events++;
            }
        }
        uint64_t left = n ? alloc_disarm(n) : 0; /* the checks allocate: pause */
        check_invariants(s);
        if (left) llmi_alloc_fail_after(left);
        if (st == LLM_OK && k == 0 && idle(s)) return failures;
    }
    fail_msg("requests never finished (allocation %llu failing)", (unsigned long long)n);
    return failures;
}

static void test_alloc_failures(void **state) {
    (void)state;
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 1;
    sp.n_ctx = 256;
    sp.kv_cache_bytes = 4u << 20;
    sp.draft_model = g_draft;
    uint64_t n;
    for (n = 1; n < 100000; n++) { /* session create with a draft model */
        llm_session *s = (llm_session *)0x1;
        llmi_alloc_fail_after(n);
        llm_status st = create_test_session(g_target, &sp, &s);
        bool hit = alloc_disarm(n) == 0;
        if (st == LLM_OK) {
            llm_session_free(s);
            if (!hit) break;
            continue;
        }
        assert_true(hit);
        assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
        assert_null(s);
    }
    printf("# session create with a draft model: %llu failure points\n", (unsigned long long)(n - 1));
    outcome ref[2], out[2];
    llm_session *s = spec_session(g_target, g_draft, 256, 64, 16, 32, true);
    assert_int_equal(run_two_spec(s, 0, ref), 0);
    llmi_session_free(s);
    unsigned failed_steps = 0, errors = 0;
    for (n = 1; n < 100000; n++) { /* the steps */
        s = spec_session(g_target, g_draft, 256, 64, 16, 32, true);
        int failures = run_two_spec(s, n, out);
        bool hit = alloc_disarm(n) == 0;
        for (int i = 0; i < 2; i++) {
            assert_int_equal(out[i].n_finish_events, 1);
            /* A failed step changes nothing: the tokens are the clean run's
             * (a prefix of them when the request ended with an error). */
            if (out[i].finish == LLM_FINISH_ERROR) {
                errors++;
                assert_true(out[i].n <= ref[i].n);
            } else {
                assert_int_equal(out[i].n, ref[i].n);
            }
            assert_memory_equal(out[i].toks, ref[i].toks, out[i].n * sizeof(llm_token));
        }
        failed_steps += (unsigned)failures;
        expect_pools_idle(s);
        llmi_session_free(s);
        if (!hit) break;
    }
    printf("# steps: %llu failure points (%u failed steps, %u requests ended with an error)\n",
           (unsigned long long)(n - 1), failed_steps, errors);
    assert_true(n > 3);
}

/* ---- SmolLM2 ---- */

static void test_smollm2(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path) skip();
    llm_model *m = NULL;
    assert_int_equal(llm_model_load(path, NULL, &m), LLM_OK);
    const char *text =
        "<|im_start|>user\nRepeat the following text exactly: The lighthouse keeper climbed "
        "the stairs every evening at dusk, counting the steps as his father had taught him, "
        "and lit the lamp before the fishing boats came home.<|im_end|>\n"
        "<|im_start|>assistant\n";
    llm_token prompt[256];
    size_t n = 0;
    assert_int_equal(llm_tokenize(m, text, strlen(text), LLM_TOKENIZE_PARSE_SPECIAL, prompt, 256,
                                  &n),
                     LLM_OK);
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 512;
    sp.kv_cache_bytes = 64u << 20;
    sp.draft_model = m; /* its own draft */
    llm_session *s = NULL;
    llm_status st = try_test_session(m, &sp, &s);
    if (st == LLM_ERR_UNSUPPORTED)
        skip_refused_model(m);
    assert_int_equal(st, LLM_OK);
    static gen_out base, out;
    generate(s, prompt, (uint32_t)n, 48, NULL, LLM_SPEC_NONE, 0, false, &base);
    printf("# plain: %u tokens: %.*s\n", base.n, (int)base.text_len, base.text);
    generate(s, prompt, (uint32_t)n, 48, NULL, LLM_SPEC_NGRAM, 0, false, &out);
    printf("# n-gram: %u drafted, %u accepted in %u steps\n", out.res.n_draft_tokens,
           out.res.n_accepted_tokens, out.res.n_spec_steps);
    expect_same_gen(&out, &base, "SmolLM2 n-gram");
    assert_true(out.res.n_accepted_tokens * 2 > base.n); /* it copies */
    generate(s, prompt, (uint32_t)n, 48, NULL, LLM_SPEC_NGRAM, 8, false, &out);
    expect_same_gen(&out, &base, "SmolLM2 n-gram k 8");
    /* Its own draft accepts everything. */
    generate(s, prompt, (uint32_t)n, 16, NULL, LLM_SPEC_DRAFT, 4, false, &out);
    printf("# self-draft: %u drafted, %u accepted\n", out.res.n_draft_tokens,
           out.res.n_accepted_tokens);
    assert_int_equal(out.n, base.n < 16 ? base.n : 16);
    assert_memory_equal(out.toks, base.toks, out.n * sizeof(llm_token));
    assert_true(out.res.n_draft_tokens > 0);
    assert_int_equal(out.res.n_accepted_tokens, out.res.n_draft_tokens);
    llm_session_free(s);
    llm_model_free(m);
}

static int setup(void **state) {
    (void)state;
    g_target = tiny_model(1024, 31337);
    g_draft = tiny_model(1024, 777);
    llm_sampling_params_init(&g_sampling);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_target);
    llmi_model_free(g_draft);
    return 0;
}

int main(void) {
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_proposer),
        device_test(test_generate_greedy_equal),
        device_test(test_f16_kv),
        device_test(test_sched_greedy_equal_alone),
        device_test(test_sched_sampled_equal_alone),
        device_test(test_draft_sampling_k_invariant),
        device_test(test_distribution_chi_square),
        device_test(test_grammar_chi_square),
        device_test(test_stop_conditions),
        device_test(test_rollback_soak),
        device_test(test_concurrent_spec),
        device_test(test_refusals),
        device_test(test_alloc_failures),
        device_test(test_smollm2),
    };
    return run_device_tests(tests, setup, teardown);
}
