/* Sampler: each processor against hand-computed values on small logit
 * arrays, parameter validation, the drawn distribution against the exact one
 * (chi-square), determinism of (seed, stream, position), top-N
 * log-probabilities, and through the scheduler: seeded sampled requests give
 * the same tokens alone, batched with others, and with other thread counts. */
#include "sched_util.h"

#include "sample/sample.h"

#include <math.h>

/* ---- helpers ---- */

static llm_sampling_params params(float temperature, int32_t top_k, float top_p, float min_p) {
    llm_sampling_params p;
    llm_sampling_params_init(&p);
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

/* The plain distribution: T = 1, no filters; candidate logits are then the
 * processed logits. */
static llm_sampling_params plain(void) { return params(1.0f, 0, 1.0f, 0.0f); }

static llm_sampling_params validated(const llm_sampling_params *in, uint32_t n_vocab) {
    llm_sampling_params out;
    llm_status st = llmi_sampling_params_read(in, n_vocab, &out);
    if (st != LLM_OK) fail_msg("params: %s", llmi_error_message());
    return out;
}

static const llmi_candidate *find(const llmi_candidate *c, uint32_t n, llm_token id) {
    for (uint32_t i = 0; i < n; i++)
        if (c[i].id == id) return &c[i];
    return NULL;
}

/* Processed logit of `id` (fails when the token was dropped). */
static float logit_of(const llmi_candidate *c, uint32_t n, llm_token id) {
    const llmi_candidate *x = find(c, n, id);
    if (!x) fail_msg("token %d is not a candidate", id);
    return x->logit;
}

static void expect_sorted_normalised(const llmi_candidate *c, uint32_t n) {
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        sum += c[i].p;
        if (i > 0) assert_true(c[i - 1].p >= c[i].p);
    }
    if (fabs(sum - 1.0) > 1e-5) fail_msg("probabilities sum to %.9f", sum);
}

/* p of the candidates equals softmax(w / T) over `ids` (hand-listed). */
static void expect_softmax(const llmi_candidate *c, uint32_t n, const llm_token *ids,
                           const double *w, uint32_t k, double T) {
    assert_int_equal(n, k);
    double z = 0.0;
    for (uint32_t i = 0; i < k; i++) z += exp(w[i] / T);
    for (uint32_t i = 0; i < k; i++) {
        assert_int_equal(c[i].id, ids[i]);
        double want = exp(w[i] / T) / z;
        if (fabs(c[i].p - want) > 1e-6)
            fail_msg("p[%d] = %.8f, expected %.8f", ids[i], (double)c[i].p, want);
    }
    expect_sorted_normalised(c, n);
}

static bool counts_clean(const llmi_sampler *s) {
    for (uint32_t i = 0; i < s->n_vocab; i++)
        if (s->counts[i]) return false;
    return true;
}

/* ---- processors ---- */

static void test_logit_bias(void **state) {
    (void)state;
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, 4), LLM_OK);
    const float logits[4] = {1.0f, 2.0f, 3.0f, 0.0f};
    /* Entries for one token add up; -INFINITY bans. */
    llm_logit_bias bias[3] = {{0, 5.0f}, {2, -INFINITY}, {0, 0.5f}};
    llm_sampling_params in = plain();
    in.logit_bias = bias;
    in.n_logit_bias = 3;
    llm_sampling_params p = validated(&in, 4);
    llmi_candidate *c;
    uint32_t n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    assert_int_equal(n, 3); /* token 2 is banned */
    assert_null(find(c, n, 2));
    assert_true(logit_of(c, n, 0) == 6.5f);
    assert_true(logit_of(c, n, 1) == 2.0f);
    assert_true(logit_of(c, n, 3) == 0.0f);
    expect_softmax(c, n, (llm_token[]){0, 1, 3}, (double[]){6.5, 2.0, 0.0}, 3, 1.0);
    /* Greedy sees the bias too. */
    in.temperature = 0.0f;
    p = validated(&in, 4);
    n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    assert_int_equal(n, 1);
    assert_int_equal(c[0].id, 0);
    assert_true(c[0].p == 1.0f);
    /* A ban of the best token moves greedy to the next one. */
    llm_logit_bias ban = {2, -INFINITY};
    in.logit_bias = &ban;
    in.n_logit_bias = 1;
    p = validated(&in, 4);
    assert_int_equal(llmi_sample(&s, logits, &p, NULL, 0, 0, NULL, 0, 0), 1);
    llmi_sampler_destroy(&s);
}

static void test_repeat_penalty(void **state) {
    (void)state;
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, 5), LLM_OK);
    const float logits[5] = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
    const llm_token hist[4] = {0, 1, 1, 4};
    llm_sampling_params in = plain();
    in.repeat_penalty = 2.0f;
    in.repeat_last_n = 64;
    llm_sampling_params p = validated(&in, 5);
    llmi_candidate *c;
    uint32_t n = llmi_sample_dist(&s, logits, &p, hist, 4, 0, NULL, &c);
    assert_int_equal(n, 5);
    /* positive logits divided, negative ones multiplied, once per token */
    assert_true(logit_of(c, n, 0) == 1.0f);
    assert_true(logit_of(c, n, 1) == -2.0f);
    assert_true(logit_of(c, n, 2) == 0.5f);
    assert_true(logit_of(c, n, 3) == 3.0f);
    assert_true(logit_of(c, n, 4) == 0.5f);
    assert_true(counts_clean(&s));
    /* Window of the last 2 tokens {1, 4}: token 0 is no longer penalised. */
    in.repeat_last_n = 2;
    p = validated(&in, 5);
    n = llmi_sample_dist(&s, logits, &p, hist, 4, 0, NULL, &c);
    assert_true(logit_of(c, n, 0) == 2.0f);
    assert_true(logit_of(c, n, 1) == -2.0f);
    assert_true(logit_of(c, n, 4) == 0.5f);
    /* 0 = off; -1 = the whole history. */
    in.repeat_last_n = 0;
    p = validated(&in, 5);
    n = llmi_sample_dist(&s, logits, &p, hist, 4, 0, NULL, &c);
    for (llm_token t = 0; t < 5; t++) assert_true(logit_of(c, n, t) == logits[t]);
    in.repeat_last_n = -1;
    p = validated(&in, 5);
    n = llmi_sample_dist(&s, logits, &p, hist, 4, 0, NULL, &c);
    assert_true(logit_of(c, n, 0) == 1.0f);
    /* A penalty below 1 rewards repetition. */
    in.repeat_penalty = 0.5f;
    p = validated(&in, 5);
    n = llmi_sample_dist(&s, logits, &p, hist, 4, 0, NULL, &c);
    assert_true(logit_of(c, n, 0) == 4.0f);
    assert_true(logit_of(c, n, 1) == -0.5f);
    assert_true(counts_clean(&s));
    llmi_sampler_destroy(&s);
}

static void test_presence_frequency(void **state) {
    (void)state;
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, 4), LLM_OK);
    const float logits[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    const llm_token hist[4] = {0, 0, 0, 2};
    llm_sampling_params in = plain();
    in.presence_penalty = 0.5f;
    in.frequency_penalty = 0.25f;
    llm_sampling_params p = validated(&in, 4);
    llmi_candidate *c;
    uint32_t n = llmi_sample_dist(&s, logits, &p, hist, 4, 0, NULL, &c);
    /* logit - presence * [count > 0] - frequency * count */
    assert_true(logit_of(c, n, 0) == 1.0f - 0.5f - 0.75f);
    assert_true(logit_of(c, n, 1) == 1.0f);
    assert_true(logit_of(c, n, 2) == 1.0f - 0.5f - 0.25f);
    assert_true(logit_of(c, n, 3) == 1.0f);
    /* Order: bias, then the repetition penalty, then presence/frequency:
     * (1 + 1) / 2 - 0.5 - 0.25 * 3 = -0.25. */
    llm_logit_bias b = {0, 1.0f};
    in.logit_bias = &b;
    in.n_logit_bias = 1;
    in.repeat_penalty = 2.0f;
    p = validated(&in, 4);
    n = llmi_sample_dist(&s, logits, &p, hist, 4, 0, NULL, &c);
    assert_true(logit_of(c, n, 0) == -0.25f);
    assert_true(logit_of(c, n, 2) == 1.0f / 2.0f - 0.5f - 0.25f);
    /* The counts were reset: the same params without history change nothing. */
    n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    assert_true(logit_of(c, n, 0) == 2.0f);
    assert_true(logit_of(c, n, 2) == 1.0f);
    assert_true(counts_clean(&s));
    /* Ids outside the vocabulary in the history are ignored. */
    const llm_token odd[3] = {-5, 99, 3};
    n = llmi_sample_dist(&s, logits, &p, odd, 3, 0, NULL, &c);
    assert_true(logit_of(c, n, 3) == 1.0f / 2.0f - 0.5f - 0.25f);
    assert_true(counts_clean(&s));
    /* No allocation per call: with every allocation failing it still works. */
    llmi_alloc_fail_after(1);
    n = llmi_sample_dist(&s, logits, &p, hist, 4, 0, NULL, &c);
    llmi_alloc_fail_after(0);
    assert_true(logit_of(c, n, 0) == -0.25f);
    llmi_sampler_destroy(&s);
}

static llm_model *g_tiny;

static void test_min_tokens(void **state) {
    (void)state;
    const llmi_tokenizer *tok = g_tiny->tok;
    uint32_t V = g_tiny->hp.n_vocab;
    llm_token eog[8];
    uint32_t n_eog = 0;
    for (uint32_t i = 0; i < V; i++)
        if (llmi_tokenizer_is_eog(tok, (llm_token)i)) eog[n_eog++] = (llm_token)i;
    assert_true(n_eog >= 1 && n_eog <= 8);
    float *logits = calloc(V, sizeof *logits);
    for (uint32_t i = 0; i < V; i++) logits[i] = (float)(i % 7) * 0.1f;
    logits[eog[0]] = 10.0f; /* the model wants to stop */
    logits[3] = 5.0f;       /* the best other token */
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, V), LLM_OK);
    llm_sampling_params in = params(0.0f, 0, 1.0f, 0.0f);
    in.min_tokens = 3;
    llm_sampling_params p = validated(&in, V);
    /* 2 generated < 3: every EOG token is banned; at 3 the ban ends. */
    assert_int_equal(llmi_sample(&s, logits, &p, NULL, 0, 2, tok, 0, 0), 3);
    assert_int_equal(llmi_sample(&s, logits, &p, NULL, 0, 3, tok, 0, 0), eog[0]);
    /* No tokenizer: nothing known to ban. */
    assert_int_equal(llmi_sample(&s, logits, &p, NULL, 0, 0, NULL, 0, 0), eog[0]);
    /* The sampled distribution has no EOG token while banned. */
    in.temperature = 1.0f;
    p = validated(&in, V);
    llmi_candidate *c;
    uint32_t n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, tok, &c);
    assert_int_equal(n, V - n_eog);
    for (uint32_t j = 0; j < n_eog; j++) assert_null(find(c, n, eog[j]));
    /* Where the bias already bans every other token, the ban yields. */
    llm_logit_bias *bans = calloc(V, sizeof *bans);
    size_t nb = 0;
    for (uint32_t i = 0; i < V; i++)
        if (!llmi_tokenizer_is_eog(tok, (llm_token)i))
            bans[nb++] = (llm_logit_bias){(llm_token)i, -INFINITY};
    in.temperature = 0.0f;
    in.logit_bias = bans;
    in.n_logit_bias = nb;
    p = validated(&in, V);
    assert_int_equal(llmi_sample(&s, logits, &p, NULL, 0, 0, tok, 0, 0), eog[0]);
    free(bans);
    free(logits);
    llmi_sampler_destroy(&s);
}

static void test_greedy(void **state) {
    (void)state;
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, 5), LLM_OK);
    const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, NAN};
    llm_sampling_params p = validated(NULL, 5); /* NULL = greedy */
    assert_true(p.temperature == 0.0f);
    llmi_candidate *c;
    assert_int_equal(llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c), 1);
    assert_int_equal(c[0].id, 1); /* lowest id on ties, NaN never wins */
    assert_true(c[0].p == 1.0f);
    /* top_k = 1 is greedy at any temperature. */
    llm_sampling_params in = params(5.0f, 1, 1.0f, 0.0f);
    p = validated(&in, 5);
    for (uint64_t pos = 0; pos < 20; pos++)
        assert_int_equal(llmi_sample(&s, logits, &p, NULL, 0, 0, NULL, 9, pos), 1);
    /* Nothing finite: the largest raw logit wins. */
    const float none[3] = {-INFINITY, NAN, -INFINITY};
    llmi_sampler s3;
    assert_int_equal(llmi_sampler_init(&s3, 3), LLM_OK);
    in = plain();
    p = validated(&in, 3);
    assert_int_equal(llmi_sample_dist(&s3, none, &p, NULL, 0, 0, NULL, &c), 1);
    assert_int_equal(c[0].id, 0);
    assert_int_equal(llmi_argmax(none, 3), 0);
    llmi_sampler_destroy(&s3);
    llmi_sampler_destroy(&s);
}

static void test_top_k(void **state) {
    (void)state;
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, 8), LLM_OK);
    const float logits[8] = {0.1f, 1.0f, -2.0f, 1.0f, 3.0f, 0.0f, 2.0f, -1.0f};
    llm_sampling_params in = params(1.0f, 3, 1.0f, 0.0f);
    llm_sampling_params p = validated(&in, 8);
    llmi_candidate *c;
    uint32_t n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    /* 3.0 (id 4), 2.0 (id 6), then the tie at 1.0 goes to the lower id 1. */
    expect_softmax(c, n, (llm_token[]){4, 6, 1}, (double[]){3.0, 2.0, 1.0}, 3, 1.0);
    in.top_k = 4;
    p = validated(&in, 8);
    n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    expect_softmax(c, n, (llm_token[]){4, 6, 1, 3}, (double[]){3.0, 2.0, 1.0, 1.0}, 4, 1.0);
    /* top_k >= n_vocab keeps everything. */
    in.top_k = 100;
    p = validated(&in, 8);
    assert_int_equal(llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c), 8);
    /* A large vocabulary in adversarial (ascending, descending, flat) orders
     * keeps exactly the k best. */
    enum { BIG = 5000 };
    llmi_sampler sb;
    assert_int_equal(llmi_sampler_init(&sb, BIG), LLM_OK);
    float *big = malloc(BIG * sizeof *big);
    for (int order = 0; order < 3; order++) {
        for (int i = 0; i < BIG; i++)
            big[i] = order == 0 ? (float)i * 1e-3f : order == 1 ? -(float)i * 1e-3f : 1.0f;
        in.top_k = 37;
        p = validated(&in, BIG);
        n = llmi_sample_dist(&sb, big, &p, NULL, 0, 0, NULL, &c);
        assert_int_equal(n, 37);
        for (uint32_t i = 0; i < n; i++) {
            llm_token want = order == 0 ? BIG - 1 - (llm_token)i : (llm_token)i;
            assert_int_equal(c[i].id, want);
        }
    }
    free(big);
    llmi_sampler_destroy(&sb);
    llmi_sampler_destroy(&s);
}

static void test_temperature(void **state) {
    (void)state;
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, 3), LLM_OK);
    const float logits[3] = {1.0f, 0.0f, -1.0f};
    llm_sampling_params in = params(0.5f, 0, 1.0f, 0.0f);
    llm_sampling_params p = validated(&in, 3);
    llmi_candidate *c;
    uint32_t n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    /* p ∝ e^2, e^0, e^-2 */
    expect_softmax(c, n, (llm_token[]){0, 1, 2}, (double[]){1.0, 0.0, -1.0}, 3, 0.5);
    assert_true(fabs(c[0].p - exp(2.0) / (exp(2.0) + 1.0 + exp(-2.0))) < 1e-6);
    in.temperature = 2.0f;
    p = validated(&in, 3);
    n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    expect_softmax(c, n, (llm_token[]){0, 1, 2}, (double[]){1.0, 0.0, -1.0}, 3, 2.0);
    llmi_sampler_destroy(&s);
}

static void test_top_p_min_p(void **state) {
    (void)state;
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, 4), LLM_OK);
    /* softmax gives 0.4, 0.3, 0.2, 0.1 */
    const float logits[4] = {logf(0.2f), logf(0.4f), logf(0.1f), logf(0.3f)};
    llmi_candidate *c;
    /* top-p 0.65: 0.4 + 0.3 = 0.7 reaches it -> {1, 3}, renormalised 4/7, 3/7. */
    llm_sampling_params in = params(1.0f, 0, 0.65f, 0.0f);
    llm_sampling_params p = validated(&in, 4);
    uint32_t n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    assert_int_equal(n, 2);
    assert_int_equal(c[0].id, 1);
    assert_int_equal(c[1].id, 3);
    assert_true(fabs(c[0].p - 4.0 / 7.0) < 1e-6 && fabs(c[1].p - 3.0 / 7.0) < 1e-6);
    /* top-p 0.75: three tokens, 4/9, 3/9, 2/9. */
    in.top_p = 0.75f;
    p = validated(&in, 4);
    n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    assert_int_equal(n, 3);
    assert_int_equal(c[2].id, 0);
    assert_true(fabs(c[2].p - 2.0 / 9.0) < 1e-6);
    /* top-p 0.3: the best token alone. */
    in.top_p = 0.3f;
    p = validated(&in, 4);
    n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
    assert_int_equal(n, 1);
    assert_true(c[0].p == 1.0f);
    /* min-p 0.3: floor 0.3 * 0.4 = 0.12 drops 0.1 -> 4/9, 3/9, 2/9; the same
     * with and without top-k (two code paths). */
    for (int32_t k = 0; k <= 4; k += 4) {
        in = params(1.0f, k, 1.0f, 0.3f);
        p = validated(&in, 4);
        n = llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c);
        assert_int_equal(n, 3);
        assert_int_equal(c[0].id, 1);
        assert_int_equal(c[1].id, 3);
        assert_int_equal(c[2].id, 0);
        assert_true(fabs(c[0].p - 4.0 / 9.0) < 1e-6);
        assert_true(fabs(c[2].p - 2.0 / 9.0) < 1e-6);
    }
    /* min-p 0.8: floor 0.32 keeps only the best. */
    in = params(1.0f, 0, 1.0f, 0.8f);
    p = validated(&in, 4);
    assert_int_equal(llmi_sample_dist(&s, logits, &p, NULL, 0, 0, NULL, &c), 1);
    assert_int_equal(c[0].id, 1);
    llmi_sampler_destroy(&s);
}

static void test_pick(void **state) {
    (void)state;
    const llmi_candidate c[3] = {{7, 0, 0.5f}, {2, 0, 0.3f}, {5, 0, 0.2f}};
    assert_int_equal(llmi_sample_pick(c, 3, 0.0), 7);
    assert_int_equal(llmi_sample_pick(c, 3, 0.49), 7);
    assert_int_equal(llmi_sample_pick(c, 3, 0.5), 2);
    assert_int_equal(llmi_sample_pick(c, 3, 0.79), 2);
    assert_int_equal(llmi_sample_pick(c, 3, 0.81), 5);
    assert_int_equal(llmi_sample_pick(c, 3, 0.999999), 5);
    assert_int_equal(llmi_sample_pick(c, 1, 0.7), 7);
    /* Rounding past the total falls on the last token with p > 0. */
    const llmi_candidate z[3] = {{1, 0, 0.6f}, {2, 0, 0.39f}, {3, 0, 0.0f}};
    assert_int_equal(llmi_sample_pick(z, 3, 0.9999), 2);
    assert_true(llmi_sample_prob(c, 3, 2) == 0.3f);
    assert_true(llmi_sample_prob(c, 3, 9) == 0.0f);
}

/* ---- parameters ---- */

static void expect_invalid(const llm_sampling_params *in, uint32_t n_vocab, const char *needle) {
    llm_sampling_params out;
    llm_status st = llmi_sampling_params_read(in, n_vocab, &out);
    if (st != LLM_ERR_INVALID_ARGUMENT)
        fail_msg("expected LLM_ERR_INVALID_ARGUMENT mentioning '%s', got %s", needle,
                 llm_status_name(st));
    if (!strstr(llmi_error_message(), needle))
        fail_msg("message '%s' does not mention '%s'", llmi_error_message(), needle);
    assert_null(out.logit_bias);
}

static void test_params_validation(void **state) {
    (void)state;
    llm_sampling_params d;
    llm_sampling_params_init(&d);
    assert_int_equal(d.struct_size, sizeof d);
    assert_true(d.temperature == 0.8f && d.top_k == 40 && d.top_p == 0.95f && d.min_p == 0.05f);
    assert_true(d.repeat_penalty == 1.0f && d.repeat_last_n == 64);
    assert_true(d.presence_penalty == 0.0f && d.frequency_penalty == 0.0f);
    assert_null(d.logit_bias);
    assert_int_equal(d.n_logit_bias, 0);
    assert_int_equal(d.min_tokens, 0);
    assert_int_equal(d.seed, 0);

    llm_sampling_params p;
#define BAD(field, value, needle)                                                                  \
    do {                                                                                           \
        p = d;                                                                                     \
        p.field = value;                                                                           \
        expect_invalid(&p, 10, needle);                                                            \
    } while (0)
    BAD(temperature, -0.1f, "temperature");
    BAD(temperature, INFINITY, "temperature");
    BAD(temperature, NAN, "temperature");
    BAD(top_k, -1, "top_k");
    BAD(top_p, 0.0f, "top_p");
    BAD(top_p, 1.5f, "top_p");
    BAD(min_p, -0.5f, "min_p");
    BAD(min_p, 1.01f, "min_p");
    BAD(repeat_penalty, 0.0f, "repeat_penalty");
    BAD(repeat_penalty, -1.0f, "repeat_penalty");
    BAD(repeat_penalty, INFINITY, "repeat_penalty");
    BAD(repeat_penalty, NAN, "repeat_penalty");
    BAD(repeat_last_n, -2, "repeat_last_n");
    BAD(presence_penalty, NAN, "presence_penalty");
    BAD(presence_penalty, -INFINITY, "presence_penalty");
    BAD(frequency_penalty, INFINITY, "frequency_penalty");
    BAD(n_logit_bias, 2, "logit_bias is NULL");
    BAD(struct_size, 2, "struct_size");
    BAD(struct_size, 1u << 20, "struct_size");
#undef BAD
    llm_logit_bias b[2] = {{3, 1.0f}, {10, 1.0f}};
    p = d;
    p.logit_bias = b;
    p.n_logit_bias = 2;
    expect_invalid(&p, 10, "logit_bias[1].token 10");
    b[1].token = -1;
    expect_invalid(&p, 10, "logit_bias[1].token -1");
    b[1] = (llm_logit_bias){4, NAN};
    expect_invalid(&p, 10, "logit_bias[1].bias");
    b[1].bias = INFINITY;
    expect_invalid(&p, 10, "logit_bias[1].bias");
    b[1].bias = -INFINITY;
    llm_sampling_params ok;
    assert_int_equal(llmi_sampling_params_read(&p, 10, &ok), LLM_OK);
    assert_ptr_equal(ok.logit_bias, b); /* read borrows */
    /* Banning every token is refused (duplicates do not count twice). */
    llm_logit_bias all[5] = {{0, -INFINITY}, {1, -INFINITY}, {2, -INFINITY}, {1, -INFINITY},
                             {2, -INFINITY}};
    p.logit_bias = all;
    p.n_logit_bias = 5;
    assert_int_equal(llmi_sampling_params_read(&p, 4, &ok), LLM_OK);
    expect_invalid(&p, 3, "bans every token");
    /* Ranges that are fine. */
    p = d;
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.repeat_last_n = -1;
    p.repeat_penalty = 0.5f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    p.min_tokens = 1000;
    assert_int_equal(llmi_sampling_params_read(&p, 10, &ok), LLM_OK);

    /* A caller built against the 1.0 header (struct ends after seed) gets
     * the defaults for every newer field, whatever follows in memory. */
    union {
        llm_sampling_params p;
        unsigned char bytes[sizeof(llm_sampling_params)];
    } old;
    memset(&old, 0xFF, sizeof old);
    old.p.struct_size = (uint32_t)(offsetof(llm_sampling_params, seed) + sizeof(uint64_t));
    old.p.temperature = 0.7f;
    old.p.top_k = 5;
    old.p.top_p = 0.9f;
    old.p.min_p = 0.0f;
    old.p.seed = 77;
    assert_int_equal(llmi_sampling_params_read(&old.p, 10, &ok), LLM_OK);
    assert_true(ok.temperature == 0.7f && ok.top_k == 5 && ok.seed == 77);
    assert_true(ok.repeat_penalty == 1.0f && ok.repeat_last_n == 64);
    assert_null(ok.logit_bias);
    assert_int_equal(ok.n_logit_bias, 0);
    assert_int_equal(ok.min_tokens, 0);

    /* copy owns its bias array: the caller's may change afterwards. */
    llm_logit_bias mine[2] = {{1, 2.0f}, {2, -INFINITY}};
    p = d;
    p.logit_bias = mine;
    p.n_logit_bias = 2;
    llm_sampling_params owned;
    assert_int_equal(llmi_sampling_params_copy(&p, 10, &owned), LLM_OK);
    assert_ptr_not_equal(owned.logit_bias, mine);
    mine[0].bias = 100.0f;
    assert_true(owned.logit_bias[0].bias == 2.0f);
    llmi_sampling_params_free(&owned);
    assert_null(owned.logit_bias);
    /* A copy that cannot allocate owns nothing. */
    llmi_alloc_fail_after(1);
    assert_int_equal(llmi_sampling_params_copy(&p, 10, &owned), LLM_ERR_OUT_OF_MEMORY);
    llmi_alloc_fail_after(0);
    assert_null(owned.logit_bias);
    /* n_logit_bias 0 never keeps a pointer. */
    p.n_logit_bias = 0;
    assert_int_equal(llmi_sampling_params_copy(&p, 10, &owned), LLM_OK);
    assert_null(owned.logit_bias);
    llmi_sampling_params_free(&owned);
}

/* ---- distribution ---- */

static const float k_logits[8] = {2.0f, 1.5f, 1.2f, 0.8f, 0.5f, 0.1f, -0.3f, -1.0f};

/* The exact distribution of the pipeline in double precision (logits are
 * already in descending order): softmax(logits / T) over the top k,
 * truncated by top-p and min-p, renormalised. Returns the tokens kept. */
static int reference(double T, int k, double top_p, double min_p, double *q) {
    int n = k > 0 && k < 8 ? k : 8;
    double w[8], sum = 0.0;
    for (int i = 0; i < n; i++) sum += w[i] = exp((k_logits[i] - k_logits[0]) / T);
    int keep = n;
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += w[i] / sum;
        if (cum >= top_p) {
            keep = i + 1;
            break;
        }
    }
    while (keep > 1 && w[keep - 1] < min_p * w[0]) keep--;
    double mass = 0.0;
    for (int i = 0; i < keep; i++) mass += w[i];
    for (int i = 0; i < 8; i++) q[i] = i < keep ? w[i] / mass : 0.0;
    return keep;
}

/* Pearson's statistic of the counts against q over the kept tokens; a
 * token drawn outside them makes it infinite. */
static double chi_square(const uint32_t *counts, const double *q, uint32_t n_draws) {
    double x2 = 0.0;
    for (int i = 0; i < 8; i++) {
        if (q[i] == 0.0) {
            if (counts[i]) return INFINITY;
            continue;
        }
        double e = q[i] * n_draws, d = counts[i] - e;
        x2 += d * d / e;
    }
    return x2;
}

/* Upper 0.1% points of the chi-square distribution, by degrees of freedom. */
static const double k_chi2_999[8] = {0, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322};

typedef struct dist_case {
    float T;
    int32_t k;
    float top_p, min_p;
    float wrong_T; /* 0: no wrong-temperature check */
} dist_case;

static void test_distribution_chi_square(void **state) {
    (void)state;
    enum { DRAWS = 200000 };
    const dist_case cases[] = {
        {0.8f, 6, 0.9f, 0.0f, 1.0f},   /* top-k then top-p: 5 tokens */
        {1.2f, 0, 1.0f, 0.0f, 1.3f},   /* plain softmax: 8 tokens */
        {1.0f, 0, 0.8f, 0.1f, 0.0f},   /* top-p: 4 tokens */
        {0.7f, 0, 0.95f, 0.15f, 0.0f}, /* min-p after top-p: 4 tokens */
        {0.7f, 7, 0.95f, 0.15f, 0.0f}, /* the same through top-k's path */
    };
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, 8), LLM_OK);
    const uint64_t seed = 20240611, stream = 3;
    print_message("seed %llu, stream %llu, %d draws at positions 0..%d\n",
                  (unsigned long long)seed, (unsigned long long)stream, DRAWS, DRAWS - 1);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const dist_case *dc = &cases[ci];
        llm_sampling_params in = params(dc->T, dc->k, dc->top_p, dc->min_p);
        in.seed = seed + ci;
        llm_sampling_params p = validated(&in, 8);
        uint32_t counts[8] = {0};
        for (uint32_t pos = 0; pos < DRAWS; pos++)
            counts[llmi_sample(&s, k_logits, &p, NULL, 0, 0, NULL, stream, pos)]++;
        double q[8];
        int keep = reference(dc->T, dc->k, dc->top_p, dc->min_p, q);
        /* The sampler's own distribution agrees with the reference. */
        llmi_candidate *c;
        uint32_t n = llmi_sample_dist(&s, k_logits, &p, NULL, 0, 0, NULL, &c);
        assert_int_equal(n, keep);
        for (uint32_t i = 0; i < n; i++) assert_true(fabs(c[i].p - q[c[i].id]) < 1e-6);
        double x2 = chi_square(counts, q, DRAWS), crit = k_chi2_999[keep - 1];
        print_message("T=%.2f top_k=%d top_p=%.2f min_p=%.2f: %d tokens, chi2 = %.3f "
                      "(df %d, fail above %.3f at p = 0.001)\n",
                      (double)dc->T, dc->k, (double)dc->top_p, (double)dc->min_p, keep, x2,
                      keep - 1, crit);
        if (!(x2 < crit)) fail_msg("chi-square %.3f >= %.3f", x2, crit);
        if (dc->wrong_T > 0.0f) {
            /* The test has power: the wrong temperature is rejected. */
            double qw[8];
            assert_int_equal(reference(dc->wrong_T, dc->k, dc->top_p, dc->min_p, qw), keep);
            double xw = chi_square(counts, qw, DRAWS);
            print_message("  against T=%.2f instead: chi2 = %.1f (rejected)\n",
                          (double)dc->wrong_T, xw);
            assert_true(xw > crit);
        }
    }
    llmi_sampler_destroy(&s);
}

static void test_determinism(void **state) {
    (void)state;
    llmi_sampler a, b;
    assert_int_equal(llmi_sampler_init(&a, 8), LLM_OK);
    assert_int_equal(llmi_sampler_init(&b, 8), LLM_OK);
    llm_sampling_params in = params(1.5f, 0, 1.0f, 0.0f);
    in.seed = 4242;
    llm_sampling_params p = validated(&in, 8);
    uint32_t distinct = 0, differ_stream = 0, differ_seed = 0;
    bool seen[8] = {false};
    llm_sampling_params other = p;
    other.seed = 4243;
    for (uint64_t pos = 0; pos < 500; pos++) {
        llm_token x = llmi_sample(&a, k_logits, &p, NULL, 0, 0, NULL, 11, pos);
        /* Same key, other sampler, after unrelated calls: same token. */
        llmi_sample(&b, k_logits, &p, NULL, 0, 0, NULL, 12, pos * 7 + 1);
        assert_int_equal(llmi_sample(&b, k_logits, &p, NULL, 0, 0, NULL, 11, pos), x);
        assert_int_equal(llmi_sample(&a, k_logits, &p, NULL, 0, 0, NULL, 11, pos), x);
        differ_stream += llmi_sample(&a, k_logits, &p, NULL, 0, 0, NULL, 12, pos) != x;
        differ_seed += llmi_sample(&a, k_logits, &other, NULL, 0, 0, NULL, 11, pos) != x;
        if (!seen[x]) distinct++;
        seen[x] = true;
    }
    assert_int_equal(distinct, 8);
    assert_true(differ_stream > 100 && differ_seed > 100);
    assert_true(llmi_rng_uniform(1, 2, 3) == llmi_rng_uniform(1, 2, 3));
    llmi_sampler_destroy(&a);
    llmi_sampler_destroy(&b);
}

static void test_logprobs_top(void **state) {
    (void)state;
    llmi_sampler s;
    assert_int_equal(llmi_sampler_init(&s, 6), LLM_OK);
    const float logits[6] = {0.0f, 3.0f, NAN, 3.0f, -1.0f, 1.0f};
    llm_token t[8];
    float lp[8];
    double z = 1.0 + 2.0 * exp(3.0) + exp(-1.0) + exp(1.0);
    assert_int_equal(llmi_logprobs_top(&s, logits, 3, t, lp), 3);
    assert_int_equal(t[0], 1); /* ties: lower id first */
    assert_int_equal(t[1], 3);
    assert_int_equal(t[2], 5);
    assert_true(fabs(lp[0] - (3.0 - log(z))) < 1e-6);
    assert_true(fabs(lp[2] - (1.0 - log(z))) < 1e-6);
    /* More than the vocabulary: all of it, NaN last as -infinity. */
    assert_int_equal(llmi_logprobs_top(&s, logits, 8, t, lp), 6);
    assert_int_equal(t[5], 2);
    assert_true(isinf(lp[5]) && lp[5] < 0);
    double mass = 0.0;
    for (int i = 0; i < 6; i++) mass += exp(lp[i]);
    assert_true(fabs(mass - 1.0) < 1e-6);
    assert_int_equal(llmi_logprobs_top(&s, logits, 0, t, lp), 0);
    llmi_sampler_destroy(&s);
}

/* ---- through the scheduler ---- */

enum { N_SEEDED = 8, N_OTHER = 8, TOP_N = 5 };

typedef struct sreq {
    llm_token prompt[160];
    uint32_t n_prompt, max_new, arrive_step;
    llm_sampling_params sp;
    llm_logit_bias bias[2];
} sreq;

typedef struct sout {
    llm_request_id id;
    llm_token toks[64];
    float lp[64];
    llm_token top[64][TOP_N];
    float top_lp[64][TOP_N];
    uint32_t n_top[64];
    uint32_t n;
    llm_finish_reason finish;
} sout;

static void make_sreqs(sreq *r, size_t n, uint64_t rng_seed, uint32_t max_prompt, bool seeded) {
    uint64_t rng = rng_seed;
    uint32_t V = g_tiny->hp.n_vocab;
    for (size_t i = 0; i < n; i++) {
        r[i].n_prompt = rand_range(&rng, 1, max_prompt);
        r[i].max_new = rand_range(&rng, 8, 40);
        r[i].arrive_step = rand_range(&rng, 0, 12);
        random_prompt(r[i].prompt, r[i].n_prompt, V, &rng);
        llm_sampling_params_init(&r[i].sp);
        r[i].sp.temperature = 0.6f + 0.1f * (float)(i % 8);
        r[i].sp.top_k = i % 3 == 0 ? 0 : 20;
        r[i].sp.top_p = i % 2 ? 0.9f : 1.0f;
        r[i].sp.min_p = i % 4 == 1 ? 0.0f : 0.02f;
        r[i].sp.seed = rng_seed * 1000 + i;
        r[i].sp.repeat_penalty = 1.2f;
        r[i].sp.repeat_last_n = i % 2 ? 16 : -1;
        r[i].sp.presence_penalty = 0.3f;
        r[i].sp.frequency_penalty = 0.1f;
        r[i].sp.min_tokens = 4;
        r[i].bias[0] = (llm_logit_bias){(llm_token)rand_range(&rng, 0, V - 1), -INFINITY};
        r[i].bias[1] = (llm_logit_bias){(llm_token)rand_range(&rng, 0, V - 1), 2.0f};
        r[i].sp.logit_bias = r[i].bias;
        r[i].sp.n_logit_bias = 2;
        if (!seeded) r[i].sp.temperature = i % 2 ? 0.0f : 1.0f;
    }
}

static llm_request_id submit_s(llm_session *s, sreq *r) {
    llm_request_params p;
    llm_request_params_init(&p);
    p.max_new_tokens = r->max_new;
    p.ignore_eos = true;
    p.logprobs = true;
    p.top_logprobs = TOP_N;
    /* The params live on this stack frame only: the request must copy them,
     * bias list included. Scribbled on after submit, the ban of bias[0] turns
     * into a huge boost, which expect_same_s would see. */
    llm_logit_bias bias[2] = {r->bias[0], r->bias[1]};
    llm_sampling_params sp = r->sp;
    sp.logit_bias = bias;
    p.sampling = &sp;
    llm_request_id id = 0;
    llm_status st = llmi_session_submit(s, r->prompt, r->n_prompt, &p, &id);
    if (st != LLM_OK) fail_msg("submit: %s", llmi_error_message());
    bias[0].bias = 1e30f;
    sp.temperature = 99.0f;
    return id;
}

/* One step; records the events of requests with an outcome, checks the
 * top-N lists. Returns the number of events. */
static size_t step_s(llm_session *s, sout *outs, size_t n_outs) {
    llm_event ev[64];
    size_t n = 0;
    if (llmi_session_step(s, ev, 64, sizeof ev[0], &n) != LLM_OK)
        fail_msg("step: %s", llmi_error_message());
    for (size_t e = 0; e < n; e++) {
        sout *o = NULL;
        for (size_t i = 0; i < n_outs && !o; i++)
            if (outs[i].id == ev[e].request) o = &outs[i];
        if (!o) continue; /* another request */
        if (ev[e].finish_reason != LLM_FINISH_NONE) o->finish = ev[e].finish_reason;
        if (ev[e].token == LLM_TOKEN_NONE) {
            assert_int_equal(ev[e].n_top, 0);
            assert_null(ev[e].top_tokens);
            continue;
        }
        assert_true(o->n < 64);
        uint32_t k = o->n++;
        o->toks[k] = ev[e].token;
        o->lp[k] = ev[e].logprob;
        o->n_top[k] = ev[e].n_top;
        assert_int_equal(ev[e].n_top, TOP_N);
        assert_non_null(ev[e].top_tokens);
        assert_non_null(ev[e].top_logprobs);
        assert_int_equal((uintptr_t)ev[e].top_logprobs % sizeof(float), 0);
        double mass = 0.0;
        bool found = false;
        for (uint32_t j = 0; j < TOP_N; j++) {
            o->top[k][j] = ev[e].top_tokens[j];
            o->top_lp[k][j] = ev[e].top_logprobs[j];
            mass += exp(ev[e].top_logprobs[j]);
            if (j > 0) assert_true(ev[e].top_logprobs[j - 1] >= ev[e].top_logprobs[j]);
            if (ev[e].top_tokens[j] == ev[e].token) {
                found = true;
                assert_true(fabsf(ev[e].top_logprobs[j] - ev[e].logprob) < 1e-5f);
            }
        }
        assert_true(mass <= 1.0 + 1e-5);
        if (!found) assert_true(ev[e].logprob <= ev[e].top_logprobs[TOP_N - 1] + 1e-5f);
    }
    return n;
}

static bool idle(llm_session *s) {
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    return st.n_running == 0 && st.n_waiting == 0;
}

static void drain_s(llm_session *s, sout *outs, size_t n_outs) {
    for (int guard = 0; guard < 100000; guard++) {
        size_t n = step_s(s, outs, n_outs);
        check_invariants(s);
        if (n == 0 && idle(s)) return;
    }
    fail_msg("requests never finished");
}

/* Each seeded request alone in its own session. The random stream of a
 * request is its id, so each gets the id it has in the batched runs (the
 * seeded requests are submitted first there): earlier ids are taken by
 * requests cancelled before any step, which never compute anything. */
static void run_alone_s(sreq *reqs, sout *out) {
    for (size_t i = 0; i < N_SEEDED; i++) {
        llm_session *s = new_session(g_tiny, 1, 512, 512, 16, 0, false);
        llm_token one = 5;
        for (size_t d = 0; d < i; d++) {
            llm_request_id id = 0;
            assert_int_equal(llmi_session_submit(s, &one, 1, NULL, &id), LLM_OK);
            assert_int_equal(llmi_session_cancel(s, id), LLM_OK);
        }
        memset(&out[i], 0, sizeof out[i]);
        out[i].id = submit_s(s, &reqs[i]);
        assert_int_equal(out[i].id, i + 1);
        drain_s(s, &out[i], 1);
        llm_session_stats st = {sizeof st};
        llmi_session_stats(s, &st);
        assert_int_equal(st.generated_tokens, reqs[i].max_new);
        llmi_session_free(s);
    }
}

/* The seeded requests first (ids 1..N_SEEDED), then others arriving over
 * the first steps; steps until everything finished. */
static void run_mixed_s(llm_session *s, sreq *seeded, sreq *others, sout *out) {
    memset(out, 0, N_SEEDED * sizeof *out);
    for (size_t i = 0; i < N_SEEDED; i++) out[i].id = submit_s(s, &seeded[i]);
    size_t submitted = 0;
    for (uint32_t step = 0; submitted < N_OTHER || !idle(s); step++) {
        for (size_t i = 0; i < N_OTHER; i++)
            if (others[i].arrive_step == step) {
                submit_s(s, &others[i]);
                submitted++;
            }
        step_s(s, out, N_SEEDED);
        check_invariants(s);
        assert_true(step < 100000);
    }
    drain_s(s, out, N_SEEDED);
}

static void expect_same_s(const sout *a, const sout *b, const sreq *reqs, const char *what) {
    for (size_t i = 0; i < N_SEEDED; i++) {
        assert_int_equal(a[i].finish, LLM_FINISH_LENGTH);
        assert_int_equal(a[i].n, reqs[i].max_new);
        if (a[i].n != b[i].n || memcmp(a[i].toks, b[i].toks, a[i].n * sizeof a[i].toks[0]))
            fail_msg("%s: request %zu sampled different tokens", what, i);
        for (uint32_t k = 0; k < a[i].n; k++) /* banned by logit_bias */
            assert_int_not_equal(a[i].toks[k], reqs[i].bias[0].token);
        for (uint32_t k = 0; k < a[i].n; k++) {
            assert_memory_equal(a[i].top[k], b[i].top[k], sizeof a[i].top[k]);
            for (uint32_t j = 0; j < TOP_N; j++)
                assert_true(fabsf(a[i].top_lp[k][j] - b[i].top_lp[k][j]) < 1e-5f);
        }
    }
}

static void test_sched_seeded_independent(void **state) {
    (void)state;
    static sreq seeded[N_SEEDED], others[N_OTHER];
    static sout alone[N_SEEDED], mixed[N_SEEDED], threads[N_SEEDED];
    print_message("request seeds 77000.., prompt seed 77; others: prompt seed 78\n");
    make_sreqs(seeded, N_SEEDED, 77, 100, true);
    make_sreqs(others, N_OTHER, 78, 150, false);
    run_alone_s(seeded, alone);
    /* Sampling really happened: the tokens are not all the greedy ones. */
    uint32_t distinct = 0;
    for (uint32_t k = 1; k < alone[0].n; k++) distinct += alone[0].toks[k] != alone[0].toks[0];
    assert_true(distinct > 0);
    /* 2 threads, a budget of 32 tokens per step: chunked prefill mixed with
     * other requests' decodes, prefix cache on. */
    llm_session *s = new_session(g_tiny, 2, 512, 32, 16, 0, true);
    run_mixed_s(s, seeded, others, mixed);
    expect_same_s(mixed, alone, seeded, "batched with others");
    llmi_session_free(s);
    /* 4 threads, a pool of 30 blocks of 8 tokens: preemption and recompute. */
    s = new_session(g_tiny, 4, 512, 512, 8, 30, true);
    run_mixed_s(s, seeded, others, threads);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    print_message("4 threads, small pool: %llu preemptions\n", (unsigned long long)st.preemptions);
    assert_true(st.preemptions > 0);
    expect_same_s(threads, alone, seeded, "4 threads, preempted");
    llmi_session_free(s);
}

static void test_sched_params_errors(void **state) {
    (void)state;
    llm_session *s = new_session(g_tiny, 1, 256, 64, 16, 0, false);
    llm_token prompt[2] = {1, 2};
    llm_request_params p;
    llm_request_params_init(&p);
    assert_int_equal(p.top_logprobs, 0);
    llm_request_id id = 0;
    p.top_logprobs = 21;
    assert_int_equal(llmi_session_submit(s, prompt, 2, &p, &id), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmi_error_message(), "top_logprobs"));
    p.top_logprobs = 0;
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    llm_logit_bias b = {(llm_token)g_tiny->hp.n_vocab, 1.0f};
    sp.logit_bias = &b;
    sp.n_logit_bias = 1;
    p.sampling = &sp;
    assert_int_equal(llmi_session_submit(s, prompt, 2, &p, &id), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmi_error_message(), "logit_bias[0].token"));
    /* A caller with the 1.0 event struct (no top fields) still gets events. */
    b.token = 3;
    p.top_logprobs = 3;
    p.max_new_tokens = 2;
    assert_int_equal(llmi_session_submit(s, prompt, 2, &p, &id), LLM_OK);
    size_t old_size = offsetof(llm_event, top_tokens);
    union {
        llm_event ev;
        unsigned char bytes[sizeof(llm_event)];
    } ev[4];
    memset(ev, 0xA5, sizeof ev);
    size_t n = 0, got = 0;
    for (int guard = 0; guard < 100 && got < 2; guard++) {
        assert_int_equal(llmi_session_step(s, &ev[0].ev, 1, old_size, &n), LLM_OK);
        if (n == 1) {
            got++;
            /* nothing written past the caller's struct */
            for (size_t i = old_size; i < sizeof(llm_event); i++)
                assert_int_equal(ev[0].bytes[i], 0xA5);
        }
    }
    assert_int_equal(got, 2);
    llmi_session_free(s);
}

static int setup(void **state) {
    (void)state;
    g_tiny = tiny_model(512, 31);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_tiny);
    return 0;
}

int main(void) {
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_repeat_penalty),
        cmocka_unit_test(test_presence_frequency),
        cmocka_unit_test(test_min_tokens),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_p_min_p),
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_params_validation),
        cmocka_unit_test(test_distribution_chi_square),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_logprobs_top),
        device_test(test_sched_seeded_independent),
        device_test(test_sched_params_errors),
    };
    return run_device_tests(tests, setup, teardown);
}
