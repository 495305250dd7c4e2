/* Black-box tests of the standalone sampler (llm_sampler_*) on the real
 * model's logits, taken through the token-level API; top-N log-probabilities
 * of requests; error paths; grammars through llm.h (a JSON schema driving
 * llm_sampler token by token, the mask, compile errors). Needs
 * LLM_TEST_MODEL. */
#include <llm.h>

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static llm_model *g_model;
static llm_model_info g_info;
static uint32_t g_vocab;
static float *g_logits; /* after "The capital of France is" */
static llm_token g_prompt[64];
static size_t g_n_prompt;

static const char *const k_prompt = "The capital of France is";

/* Logits of the prompt's last token through the token-level API. */
static llm_status compute_logits(void) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 256;
    sp.kv_cache_bytes = 32u << 20;
    llm_session *s = NULL;
    llm_batch *b = NULL;
    llm_seq_id seq;
    const float *lg = NULL;
    llm_status st = llm_session_create(g_model, &sp, &s);
    if (st == LLM_OK)
        st = llm_tokenize(g_model, k_prompt, strlen(k_prompt), 0, g_prompt, 64, &g_n_prompt);
    if (st == LLM_OK && g_n_prompt < 5) st = LLM_ERR_INTERNAL;
    if (st == LLM_OK) st = llm_seq_open(s, &seq);
    if (st == LLM_OK) st = llm_batch_create(64, &b);
    for (size_t i = 0; i < g_n_prompt && st == LLM_OK; i++)
        st = llm_batch_add(b, seq, (uint32_t)i, g_prompt[i], i == g_n_prompt - 1);
    if (st == LLM_OK) st = llm_session_decode(s, b);
    if (st == LLM_OK) st = llm_session_logits(s, (uint32_t)g_n_prompt - 1, &lg);
    if (st == LLM_OK) {
        g_logits = malloc(g_vocab * sizeof *g_logits);
        memcpy(g_logits, lg, g_vocab * sizeof *g_logits);
    }
    llm_batch_free(b);
    llm_session_free(s);
    return st;
}

static llm_token argmax(const float *l) {
    llm_token best = 0;
    for (uint32_t i = 1; i < g_vocab; i++)
        if (l[i] > l[best]) best = (llm_token)i;
    return best;
}

static llm_sampler *make(const llm_sampling_params *p, uint64_t stream) {
    llm_sampler *s = NULL;
    llm_status st = llm_sampler_create(g_model, p, stream, &s);
    if (st != LLM_OK) fail_msg("llm_sampler_create: %s", llm_last_error());
    return s;
}

static llm_token sample(llm_sampler *s, const float *logits, const llm_token *hist, size_t n,
                        uint32_t n_gen, uint64_t pos) {
    llm_token t = LLM_TOKEN_NONE;
    llm_status st = llm_sampler_sample(s, logits, hist, n, n_gen, pos, &t);
    if (st != LLM_OK) fail_msg("llm_sampler_sample: %s", llm_last_error());
    assert_true(t >= 0 && (uint32_t)t < g_vocab);
    return t;
}

static void test_greedy_and_logprobs(void **state) {
    (void)state;
    llm_sampler *s = make(NULL, 0); /* NULL params: greedy */
    llm_token best = argmax(g_logits);
    for (uint64_t pos = 0; pos < 4; pos++) assert_int_equal(sample(s, g_logits, NULL, 0, 0, pos), best);
    char text[64];
    size_t len = 0;
    assert_int_equal(llm_detokenize(g_model, &best, 1, 0, text, sizeof text, &len), LLM_OK);
    printf("# '%s' -> '%s'\n", k_prompt, text);

    enum { TOP = 10 };
    llm_token tok[TOP];
    float lp[TOP];
    uint32_t n = 0;
    assert_int_equal(llm_sampler_logprobs(s, g_logits, TOP, tok, lp, &n), LLM_OK);
    assert_int_equal(n, TOP);
    assert_int_equal(tok[0], best);
    /* log-softmax of the raw logits, computed here in double */
    double mx = g_logits[best], z = 0.0;
    for (uint32_t i = 0; i < g_vocab; i++) z += exp((double)g_logits[i] - mx);
    double mass = 0.0;
    for (uint32_t j = 0; j < n; j++) {
        double want = (double)g_logits[tok[j]] - mx - log(z);
        if (fabs(lp[j] - want) > 1e-4) fail_msg("logprob %u: %g vs %g", j, lp[j], want);
        if (j > 0) assert_true(lp[j - 1] >= lp[j]);
        assert_true(lp[j] <= 0.0f);
        mass += exp(lp[j]);
    }
    printf("# top-%d mass %.4f, p(top) %.4f\n", TOP, mass, exp(lp[0]));
    assert_true(mass <= 1.0 + 1e-5);
    /* Asking for more than the vocabulary gives all of it, summing to 1. */
    llm_token *all_t = malloc((g_vocab + 5) * sizeof *all_t);
    float *all_lp = malloc((g_vocab + 5) * sizeof *all_lp);
    assert_int_equal(llm_sampler_logprobs(s, g_logits, g_vocab + 5, all_t, all_lp, &n), LLM_OK);
    assert_int_equal(n, g_vocab);
    mass = 0.0;
    for (uint32_t j = 0; j < n; j++) mass += exp(all_lp[j]);
    assert_true(fabs(mass - 1.0) < 1e-3);
    free(all_t);
    free(all_lp);
    assert_int_equal(llm_sampler_logprobs(s, g_logits, 0, NULL, NULL, &n), LLM_OK);
    assert_int_equal(n, 0);
    llm_sampler_free(s);
}

static void test_seeded(void **state) {
    (void)state;
    llm_sampling_params p;
    llm_sampling_params_init(&p);
    p.temperature = 1.5f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.01f;
    p.seed = 31337;
    printf("# seed %llu\n", (unsigned long long)p.seed);
    llm_sampler *a = make(&p, 5), *b = make(&p, 5), *c = make(&p, 6);
    int differ = 0, not_greedy = 0;
    llm_token best = argmax(g_logits);
    for (uint64_t pos = 0; pos < 64; pos++) {
        llm_token x = sample(a, g_logits, NULL, 0, 0, pos);
        assert_int_equal(sample(b, g_logits, NULL, 0, 0, pos), x); /* same key */
        assert_int_equal(sample(a, g_logits, NULL, 0, 0, pos), x); /* again */
        differ += sample(c, g_logits, NULL, 0, 0, pos) != x;       /* other stream */
        not_greedy += x != best;
    }
    assert_true(differ > 0 && not_greedy > 0);
    llm_sampler_free(a);
    llm_sampler_free(b);
    llm_sampler_free(c);

    /* The sampled frequency of the best token agrees with the log-probs:
     * T = 1 and top-40, so p' = p(best) / mass of the top 40. */
    llm_sampling_params_init(&p);
    p.temperature = 1.0f;
    p.top_k = 40;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 7;
    llm_sampler *s = make(&p, 0);
    llm_token tok[40];
    float lp[40];
    uint32_t n = 0;
    assert_int_equal(llm_sampler_logprobs(s, g_logits, 40, tok, lp, &n), LLM_OK);
    double mass = 0.0;
    for (uint32_t j = 0; j < 40; j++) mass += exp(lp[j]);
    double q = exp(lp[0]) / mass;
    enum { DRAWS = 4000 };
    int hits = 0;
    for (uint64_t pos = 0; pos < DRAWS; pos++) hits += sample(s, g_logits, NULL, 0, 0, pos) == tok[0];
    double sigma = sqrt(q * (1 - q) / DRAWS);
    printf("# p'(best) %.4f, sampled %.4f (%d draws, seed 7)\n", q, (double)hits / DRAWS, DRAWS);
    assert_true(fabs((double)hits / DRAWS - q) < 5 * sigma);
    llm_sampler_free(s);
}

/* The most likely token of g_logits outside `window` (from the top 10). */
static llm_token best_not_in(const llm_token *tok, const llm_token *window, size_t n) {
    for (int j = 0; j < 10; j++) {
        bool in = false;
        for (size_t i = 0; i < n; i++) in |= window[i] == tok[j];
        if (!in) return tok[j];
    }
    fail_msg("the top 10 are all in the window");
    return LLM_TOKEN_NONE;
}

static void test_bias_penalties_min_tokens(void **state) {
    (void)state;
    llm_token tok[10];
    float lp[10];
    uint32_t n = 0;
    llm_sampler *g = make(NULL, 0);
    assert_int_equal(llm_sampler_logprobs(g, g_logits, 10, tok, lp, &n), LLM_OK);
    llm_sampler_free(g);

    llm_sampling_params p;
    llm_sampling_params_init(&p);
    p.temperature = 0.0f;
    /* Ban the best token: greedy takes the second. */
    llm_logit_bias ban = {tok[0], -INFINITY};
    p.logit_bias = &ban;
    p.n_logit_bias = 1;
    llm_sampler *s = make(&p, 0);
    ban.token = tok[2]; /* copied at create: no effect */
    assert_int_equal(sample(s, g_logits, NULL, 0, 0, 0), tok[1]);
    llm_sampler_free(s);
    /* Boost the third. */
    llm_logit_bias boost = {tok[2], 100.0f};
    p.logit_bias = &boost;
    s = make(&p, 0);
    assert_int_equal(sample(s, g_logits, NULL, 0, 0, 0), tok[2]);
    llm_sampler_free(s);

    /* A huge repetition penalty on a history holding the best token. */
    p.logit_bias = NULL;
    p.n_logit_bias = 0;
    p.repeat_penalty = 1000.0f;
    p.repeat_last_n = 4;
    s = make(&p, 0);
    llm_token hist[6];
    memcpy(hist, g_prompt, 5 * sizeof *hist);
    hist[5] = tok[0];
    assert_int_equal(sample(s, g_logits, hist, 6, 1, 6), best_not_in(tok, hist + 2, 4));
    assert_true(best_not_in(tok, hist + 2, 4) != tok[0]);
    /* Outside the window it no longer counts. */
    hist[0] = tok[0];
    hist[5] = g_prompt[0];
    assert_int_equal(sample(s, g_logits, hist, 6, 1, 6), best_not_in(tok, hist + 2, 4));
    llm_sampler_free(s);
    /* Presence penalty alone, over the whole history. */
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 1000.0f;
    p.repeat_last_n = -1;
    s = make(&p, 0);
    assert_int_equal(sample(s, g_logits, hist, 6, 0, 6), best_not_in(tok, hist, 6));
    assert_true(best_not_in(tok, hist, 6) != tok[0]);
    llm_sampler_free(s);

    /* min_tokens: make end-of-turn the best token; it is banned until
     * min_tokens tokens were generated. */
    llm_token eog = g_info.eot != LLM_TOKEN_NONE ? g_info.eot : g_info.eos;
    assert_true(eog != LLM_TOKEN_NONE);
    float *l = malloc(g_vocab * sizeof *l);
    memcpy(l, g_logits, g_vocab * sizeof *l);
    l[eog] = 1000.0f;
    llm_sampling_params_init(&p);
    p.temperature = 0.0f;
    p.min_tokens = 2;
    s = make(&p, 0);
    llm_token t0 = sample(s, l, NULL, 0, 0, 0), t1 = sample(s, l, NULL, 0, 1, 1);
    assert_true(t0 != eog && t0 != g_info.eos && t0 != g_info.eot);
    assert_int_equal(t0, tok[0]);
    assert_int_equal(t1, tok[0]);
    assert_int_equal(sample(s, l, NULL, 0, 2, 2), eog);
    llm_sampler_free(s);
    free(l);
}

static void test_errors(void **state) {
    (void)state;
    llm_sampler *s = (llm_sampler *)&s;
    llm_sampling_params p;
    llm_sampling_params_init(&p);
    /* NULL arguments */
    assert_int_equal(llm_sampler_create(NULL, &p, 0, &s), LLM_ERR_INVALID_ARGUMENT);
    assert_null(s);
    assert_int_equal(llm_sampler_create(g_model, &p, 0, NULL), LLM_ERR_INVALID_ARGUMENT);
    /* bad params, each refused with *out NULL and a message naming the field */
    const char *needles[] = {"top_p", "repeat_penalty", "repeat_last_n", "temperature",
                             "frequency_penalty", "struct_size", "struct_size"};
    for (int i = 0; i < 7; i++) {
        llm_sampling_params_init(&p);
        switch (i) {
        case 0: p.top_p = 0.0f; break;
        case 1: p.repeat_penalty = 0.0f; break;
        case 2: p.repeat_last_n = -7; break;
        case 3: p.temperature = -1.0f; break;
        case 4: p.frequency_penalty = NAN; break;
        case 5: p.struct_size = 0; break;
        case 6: p.struct_size = 1u << 20; break;
        }
        s = (llm_sampler *)&s;
        assert_int_equal(llm_sampler_create(g_model, &p, 0, &s), LLM_ERR_INVALID_ARGUMENT);
        assert_null(s);
        if (!strstr(llm_last_error(), needles[i]))
            fail_msg("'%s' does not name %s", llm_last_error(), needles[i]);
    }
    /* Tokens outside the model's vocabulary (logits of another model). */
    llm_sampling_params_init(&p);
    llm_logit_bias b = {(llm_token)g_vocab, 1.0f};
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    assert_int_equal(llm_sampler_create(g_model, &p, 0, &s), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "vocabulary"));
    p.n_logit_bias = 3;
    p.logit_bias = NULL;
    assert_int_equal(llm_sampler_create(g_model, &p, 0, &s), LLM_ERR_INVALID_ARGUMENT);

    s = make(NULL, 0);
    llm_token out = 0;
    llm_token hist[2] = {1, (llm_token)g_vocab};
    assert_int_equal(llm_sampler_sample(s, g_logits, hist, 2, 0, 0, &out),
                     LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(out, LLM_TOKEN_NONE);
    assert_non_null(strstr(llm_last_error(), "history[1]"));
    hist[1] = -3;
    assert_int_equal(llm_sampler_sample(s, g_logits, hist, 2, 0, 0, &out),
                     LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_sampler_sample(s, g_logits, NULL, 2, 0, 0, &out),
                     LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_sampler_sample(s, NULL, NULL, 0, 0, 0, &out), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_sampler_sample(s, g_logits, NULL, 0, 0, 0, NULL),
                     LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_sampler_sample(NULL, g_logits, NULL, 0, 0, 0, &out),
                     LLM_ERR_INVALID_ARGUMENT);
    uint32_t n = 7;
    llm_token t[2];
    float lp[2];
    assert_int_equal(llm_sampler_logprobs(s, g_logits, 2, NULL, lp, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(n, 0);
    assert_int_equal(llm_sampler_logprobs(s, g_logits, 2, t, NULL, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_sampler_logprobs(s, NULL, 2, t, lp, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_sampler_logprobs(s, g_logits, 2, t, lp, NULL), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_sampler_logprobs(NULL, g_logits, 2, t, lp, &n), LLM_ERR_INVALID_ARGUMENT);
    llm_sampler_free(s);
    llm_sampler_free(NULL);

    /* A caller built against the 1.0 header: struct ends after seed, the
     * newer fields take their defaults. */
    union {
        llm_sampling_params p;
        unsigned char bytes[sizeof(llm_sampling_params)];
    } old;
    memset(&old, 0xEE, sizeof old);
    old.p.struct_size = (uint32_t)(offsetof(llm_sampling_params, seed) + sizeof(uint64_t));
    old.p.temperature = 0.0f;
    old.p.top_k = 40;
    old.p.top_p = 0.95f;
    old.p.min_p = 0.05f;
    old.p.seed = 1;
    s = make(&old.p, 0);
    llm_token hist3[3] = {argmax(g_logits), argmax(g_logits), argmax(g_logits)};
    /* no penalties by default: the repeated best token is still chosen */
    assert_int_equal(sample(s, g_logits, hist3, 3, 3, 3), argmax(g_logits));
    llm_sampler_free(s);
}

/* Top-N log-probabilities of a request's tokens agree with the sampler's
 * on the same logits. */
static void test_request_top_logprobs(void **state) {
    (void)state;
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 256;
    sp.kv_cache_bytes = 32u << 20;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(g_model, &sp, &s), LLM_OK);
    llm_request_params rp;
    llm_request_params_init(&rp);
    assert_int_equal(rp.top_logprobs, 0);
    rp.max_new_tokens = 4;
    rp.logprobs = true;
    rp.top_logprobs = 21;
    llm_request_id id = 0;
    assert_int_equal(llm_session_submit(s, g_prompt, g_n_prompt, &rp, &id),
                     LLM_ERR_INVALID_ARGUMENT);
    rp.top_logprobs = 5;
    assert_int_equal(llm_session_submit(s, g_prompt, g_n_prompt, &rp, &id), LLM_OK);
    llm_sampler *smp = make(NULL, 0);
    llm_token want_t[5];
    float want_lp[5];
    uint32_t n = 0;
    assert_int_equal(llm_sampler_logprobs(smp, g_logits, 5, want_t, want_lp, &n), LLM_OK);
    llm_sampler_free(smp);
    bool first = true, done = false;
    for (int guard = 0; guard < 100 && !done; guard++) {
        llm_event ev[8];
        size_t got = 0;
        assert_int_equal(llm_session_step(s, ev, 8, sizeof ev[0], &got), LLM_OK);
        for (size_t i = 0; i < got; i++) {
            done |= ev[i].finish_reason != LLM_FINISH_NONE;
            if (ev[i].token == LLM_TOKEN_NONE) continue;
            assert_int_equal(ev[i].n_top, 5);
            double mass = 0.0;
            for (uint32_t j = 0; j < 5; j++) {
                if (j) assert_true(ev[i].top_logprobs[j - 1] >= ev[i].top_logprobs[j]);
                mass += exp(ev[i].top_logprobs[j]);
            }
            assert_true(mass <= 1.0 + 1e-5);
            assert_int_equal(ev[i].token, ev[i].top_tokens[0]); /* greedy */
            assert_true(fabsf(ev[i].logprob - ev[i].top_logprobs[0]) < 1e-5f);
            if (first) {
                for (uint32_t j = 0; j < 5; j++) {
                    assert_int_equal(ev[i].top_tokens[j], want_t[j]);
                    assert_true(fabsf(ev[i].top_logprobs[j] - want_lp[j]) < 1e-3f);
                }
                first = false;
            }
        }
    }
    assert_true(done && !first);
    llm_session_free(s);
}

static int setup(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path || llm_model_load(path, NULL, &g_model) != LLM_OK) return -1;
    g_info = (llm_model_info){sizeof g_info};
    llm_model_get_info(g_model, &g_info);
    g_vocab = g_info.n_vocab;
    if (compute_logits() != LLM_OK) {
        fprintf(stderr, "computing logits: %s\n", llm_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(g_logits);
    llm_model_free(g_model);
    return 0;
}

static bool mask_bit(const uint32_t *m, llm_token t) { return (m[t / 32] >> (t % 32)) & 1; }

/* A schema drives llm_sampler token by token on the real model: every
 * drawn token is in the mask the state reports, the state completes, and
 * the text is the object the schema describes. */
static void test_grammar_sampler(void **state) {
    (void)state;
    static const char schema[] = "{\"type\":\"object\",\"properties\":{\"city\":{\"enum\":["
                                 "\"Paris\",\"Rome\"]},\"population\":{\"type\":\"integer\"}},"
                                 "\"required\":[\"city\",\"population\"]}";
    llm_grammar *g = NULL;
    assert_int_equal(llm_grammar_compile_json_schema(g_model, schema, strlen(schema), NULL, &g),
                     LLM_OK);
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.grammar = g;
    sp.seed = 3;
    llm_sampler *smp = NULL;
    assert_int_equal(llm_sampler_create(g_model, &sp, 0, &smp), LLM_OK);
    llm_grammar_state *gs = NULL;
    assert_int_equal(llm_grammar_state_create(g, &gs), LLM_OK);
    size_t words = (g_vocab + 31) / 32;
    uint32_t *mask = malloc(words * 4);
    assert_int_equal(llm_grammar_state_fill_mask(gs, mask, words - 1), LLM_ERR_BUFFER_TOO_SMALL);
    /* the model's own logits after the prompt, then random-ish ones: the
     * grammar decides what is drawn either way */
    float *lg = malloc(g_vocab * sizeof *lg);
    memcpy(lg, g_logits, g_vocab * sizeof *lg);
    char text[512];
    llm_token drawn[100];
    size_t len = 0, n_drawn = 0;
    bool done = false;
    for (int i = 0; i < 100 && !done; i++) {
        assert_int_equal(llm_grammar_state_fill_mask(gs, mask, words), LLM_OK);
        llm_token t;
        assert_int_equal(llm_sampler_sample(smp, lg, NULL, 0, 0, (uint64_t)i, &t), LLM_OK);
        assert_true(mask_bit(mask, t));
        assert_int_equal(llm_grammar_state_accept_token(gs, t), LLM_OK);
        drawn[n_drawn++] = t;
        assert_int_equal(llm_grammar_state_is_complete(gs, &done), LLM_OK);
        for (uint32_t k = 0; k < g_vocab; k++) lg[k] = (float)((k * 7919u + (uint32_t)i) % 97);
    }
    assert_true(done);
    assert_int_equal(llm_detokenize(g_model, drawn, n_drawn, 0, text, sizeof text, &len), LLM_OK);
    static const char paris[] = "{\"city\":\"Paris\",\"population\":",
                      rome[] = "{\"city\":\"Rome\",\"population\":";
    if (strncmp(text, paris, strlen(paris)) != 0 && strncmp(text, rome, strlen(rome)) != 0)
        fail_msg("unexpected text '%s'", text);
    assert_int_equal(text[len - 1], '}');
    /* a complete grammar allows only end-of-generation; after it, nothing */
    llm_token t;
    assert_int_equal(llm_sampler_sample(smp, lg, NULL, 0, 0, 999, &t), LLM_OK);
    llm_grammar_state *fork = NULL; /* t is an end-of-generation token */
    assert_int_equal(llm_grammar_state_fork(gs, &fork), LLM_OK);
    assert_int_equal(llm_grammar_state_accept_token(fork, t), LLM_OK);
    assert_int_equal(llm_grammar_state_fill_mask(fork, mask, words), LLM_OK);
    for (size_t w = 0; w < words; w++) assert_int_equal(mask[w], 0);
    llm_grammar_state_free(fork);
    assert_int_equal(llm_sampler_sample(smp, lg, NULL, 0, 0, 1000, &t), LLM_ERR_INVALID_ARGUMENT);
    bool can_end = false;
    assert_int_equal(llm_grammar_state_can_end(gs, &can_end), LLM_OK);
    assert_true(can_end);
    assert_int_equal(llm_grammar_state_rollback(gs, 1), LLM_OK);
    assert_int_equal(llm_grammar_state_is_complete(gs, &done), LLM_OK);
    assert_false(done);
    free(mask);
    free(lg);
    llm_grammar_state_free(gs);
    llm_sampler_free(smp);
    llm_grammar_free(g);
}

static void test_grammar_errors(void **state) {
    (void)state;
    llm_grammar *g = (llm_grammar *)1;
    assert_int_equal(llm_grammar_compile_ebnf(g_model, "root ::= (", 10, NULL, &g),
                     LLM_ERR_INVALID_ARGUMENT);
    assert_null(g);
    assert_non_null(strstr(llm_last_error(), "1:10"));
    static const char s[] = "{\"type\":\"integer\",\"multipleOf\":3}";
    assert_int_equal(llm_grammar_compile_json_schema(g_model, s, strlen(s), NULL, &g),
                     LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(llm_last_error(), "/multipleOf"));
    assert_int_equal(llm_grammar_compile_regex(g_model, "a(?!b)", 6, NULL, &g),
                     LLM_ERR_UNSUPPORTED);
    llm_grammar_params gp;
    llm_grammar_params_init(&gp);
    gp.whitespace = 7;
    assert_int_equal(llm_grammar_compile_regex(g_model, "a", 1, &gp, &g),
                     LLM_ERR_INVALID_ARGUMENT);
    gp.whitespace = LLM_GRAMMAR_WS_COMPACT;
    gp.root = "start";
    assert_int_equal(llm_grammar_compile_ebnf(g_model, "start ::= \"x\"", 13, &gp, &g), LLM_OK);
    llm_grammar_state *gs = NULL;
    assert_int_equal(llm_grammar_state_create(g, &gs), LLM_OK);
    llm_token toks[4];
    size_t n = 0;
    assert_int_equal(llm_tokenize(g_model, "y", 1, 0, toks, 4, &n), LLM_OK);
    assert_int_equal(llm_grammar_state_accept_token(gs, toks[0]), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_grammar_state_accept_token(gs, -1), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_grammar_state_rollback(gs, 1), LLM_ERR_INVALID_ARGUMENT);
    llm_grammar_state_free(gs);
    llm_grammar_free(g);
    llm_grammar_free(NULL);
    llm_grammar_state_free(NULL);
}

/* Feeds `text` (tokenized plainly) to a fresh state of `g`; returns the
 * status of the first refused token, or LLM_OK with `*can_end`. */
static llm_status feed(const llm_grammar *g, const char *text, bool *can_end) {
    llm_token toks[128];
    size_t n = 0;
    assert_int_equal(llm_tokenize(g_model, text, strlen(text), 0, toks, 128, &n), LLM_OK);
    llm_grammar_state *gs = NULL;
    assert_int_equal(llm_grammar_state_create(g, &gs), LLM_OK);
    llm_status st = LLM_OK;
    for (size_t i = 0; i < n && st == LLM_OK; i++)
        st = llm_grammar_state_accept_token(gs, toks[i]);
    *can_end = false;
    if (st == LLM_OK)
        assert_int_equal(llm_grammar_state_can_end(gs, can_end), LLM_OK);
    llm_grammar_state_free(gs);
    return st;
}

/* A schema's GBNF wrapped in a rule of the host's (as llm-serve forces a
 * tool call) accepts exactly the wrapped JSON the schema allows. */
static void test_grammar_schema_to_ebnf(void **state) {
    (void)state;
    static const char schema[] = "{\"type\":\"object\",\"properties\":{\"city\":{\"enum\":["
                                 "\"Paris\",\"Rome\"]}},\"required\":[\"city\"],"
                                 "\"additionalProperties\":false}";
    size_t need = 0;
    assert_int_equal(llm_grammar_schema_to_ebnf(schema, strlen(schema), NULL, NULL, 0, &need),
                     LLM_ERR_BUFFER_TOO_SMALL);
    assert_true(need > 10);
    static const char wrapper[] = "call-wrap ::= \"<tool_call>\\n\" root \"\\n</tool_call>\"\n";
    char *text = malloc(need + sizeof wrapper);
    size_t got = 0;
    assert_int_equal(llm_grammar_schema_to_ebnf(schema, strlen(schema), NULL, text, need - 1, &got),
                     LLM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(llm_grammar_schema_to_ebnf(schema, strlen(schema), NULL, text, need, &got),
                     LLM_OK);
    assert_int_equal(got, need);
    assert_int_equal(strlen(text) + 1, need);
    assert_non_null(strstr(text, "root ::= "));
    assert_null(strstr(text, "call"));
    strcat(text, wrapper);
    llm_grammar_params gp;
    llm_grammar_params_init(&gp);
    gp.root = "call-wrap";
    llm_grammar *g = NULL;
    if (llm_grammar_compile_ebnf(g_model, text, strlen(text), &gp, &g) != LLM_OK)
        fail_msg("%s\n%s", llm_last_error(), text);
    bool can_end = false;
    assert_int_equal(feed(g, "<tool_call>\n{\"city\":\"Rome\"}\n</tool_call>", &can_end), LLM_OK);
    assert_true(can_end);
    assert_int_equal(feed(g, "<tool_call>\n{\"city\":\"Rome\"}", &can_end), LLM_OK);
    assert_false(can_end);
    assert_int_equal(feed(g, "<tool_call>\n{\"city\":\"Oslo\"}", &can_end),
                     LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(feed(g, "{\"city\":\"Rome\"}", &can_end), LLM_ERR_INVALID_ARGUMENT);
    llm_grammar_free(g);
    free(text);
    static const char bad[] = "{\"type\":\"integer\",\"multipleOf\":3}";
    assert_int_equal(llm_grammar_schema_to_ebnf(bad, strlen(bad), NULL, NULL, 0, &need),
                     LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(llm_last_error(), "/multipleOf"));
    assert_non_null(strstr(llm_last_error(), "llm_grammar_schema_to_ebnf"));
    assert_int_equal(llm_grammar_schema_to_ebnf("{", 1, NULL, NULL, 0, &need),
                     LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_grammar_schema_to_ebnf(schema, strlen(schema), NULL, NULL, 0, NULL),
                     LLM_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_logprobs),
        cmocka_unit_test(test_seeded),
        cmocka_unit_test(test_bias_penalties_min_tokens),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_request_top_logprobs),
        cmocka_unit_test(test_grammar_sampler),
        cmocka_unit_test(test_grammar_errors),
        cmocka_unit_test(test_grammar_schema_to_ebnf),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
