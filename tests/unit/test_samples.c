/* Several samples per request (llm_request_params::n_samples): each sample
 * gives exactly the tokens of a one-sample request with its seed, whatever
 * shares its steps, preemption and speculation included; the prompt is
 * computed once and its KV blocks shared; every sample ends with exactly one
 * finish event, on cancel and on allocation failure too. Under a grammar,
 * each sample follows it on its own and still equals its one-sample
 * request. */
#include "sched_util.h"

#include "sample/sample.h"

enum { MAX_SAMPLES = 8 };

/* Every sample of one request. */
typedef struct sampled {
    llm_request_id id;
    uint32_t n_samples;
    outcome s[MAX_SAMPLES];
} sampled;

static llm_model *g_model;

/* Applies one step's events; events name their sample. Returns the step's
 * status (a failed step delivers nothing). */
static llm_status step_samples(llm_session *s, sampled *reqs, size_t n_reqs, size_t *n_ev) {
    llm_event ev[64];
    size_t n = 0;
    llm_status st = llmi_session_step(s, ev, 64, sizeof ev[0], &n);
    *n_ev = n;
    if (st != LLM_OK) {
        assert_int_equal(n, 0);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        sampled *r = NULL;
        for (size_t j = 0; j < n_reqs; j++)
            if (reqs[j].id == ev[i].request) r = &reqs[j];
        if (!r) fail_msg("event for unknown request %llu", (unsigned long long)ev[i].request);
        if (ev[i].sample_index >= r->n_samples)
            fail_msg("sample index %u of a request with %u samples", ev[i].sample_index,
                     r->n_samples);
        outcome *o = &r->s[ev[i].sample_index];
        if (o->n_finish_events) fail_msg("event after sample %u finished", ev[i].sample_index);
        if (ev[i].token != LLM_TOKEN_NONE) {
            assert_true(o->n < MAX_OUT);
            o->toks[o->n++] = ev[i].token;
        }
        assert_true(o->text_len + ev[i].text_len < sizeof o->text);
        memcpy(o->text + o->text_len, ev[i].text, ev[i].text_len);
        o->text_len += ev[i].text_len;
        if (ev[i].finish_reason != LLM_FINISH_NONE) {
            o->finish = ev[i].finish_reason;
            o->n_finish_events++;
            if (ev[i].finish_reason == LLM_FINISH_ERROR)
                assert_int_equal(ev[i].status, LLM_ERR_OUT_OF_MEMORY);
        }
    }
    return LLM_OK;
}

static bool idle(llm_session *s) {
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    return st.n_running == 0 && st.n_waiting == 0;
}

/* Steps until idle, checking invariants after each step. */
static void drain_samples(llm_session *s, sampled *reqs, size_t n_reqs) {
    for (int guard = 0; guard < 100000; guard++) {
        size_t n = 0;
        if (step_samples(s, reqs, n_reqs, &n) != LLM_OK)
            fail_msg("step: %s", llmi_error_message());
        check_invariants(s);
        if (n == 0 && idle(s)) return;
    }
    fail_msg("requests never finished");
}

static void submit(llm_session *s, const llm_token *prompt, uint32_t n_prompt,
                   const llm_request_params *p, sampled *out) {
    memset(out, 0, sizeof *out);
    out->n_samples = p->n_samples ? p->n_samples : 1;
    if (llmi_session_submit(s, prompt, n_prompt, p, &out->id) != LLM_OK)
        fail_msg("submit: %s", llmi_error_message());
}

static void sampling_params(llm_sampling_params *sp, uint64_t seed) {
    llm_sampling_params_init(sp);
    sp->temperature = 1.0f;
    sp->top_p = 0.95f;
    sp->seed = seed;
}

/* The tokens of a one-sample request with `seed`, alone in a fresh session. */
static void reference(const llm_token *prompt, uint32_t n_prompt, const llm_request_params *p,
                      uint64_t seed, outcome *out) {
    llm_session *s = new_session(g_model, 1, 256, 64, 16, 0, false);
    llm_sampling_params sp = *p->sampling;
    sp.seed = seed;
    llm_request_params q = *p;
    q.sampling = &sp;
    q.n_samples = 1;
    sampled r;
    submit(s, prompt, n_prompt, &q, &r);
    drain_samples(s, &r, 1);
    *out = r.s[0];
    llmi_session_free(s);
}

static void expect_same(const outcome *got, const outcome *want, uint32_t index) {
    if (got->n != want->n || memcmp(got->toks, want->toks, want->n * sizeof(llm_token)) != 0)
        fail_msg("sample %u: %u tokens differ from the one-sample request's %u", index, got->n,
                 want->n);
    assert_int_equal(got->finish, want->finish);
    assert_int_equal(got->n_finish_events, 1);
    assert_int_equal(got->text_len, want->text_len);
    assert_memory_equal(got->text, want->text, want->text_len);
}

/* Sample i = the one-sample request with llmi_sample_seed(seed, i); the
 * prompt is computed once; with other requests beside it, with and without
 * the prefix cache, and with speculation (prompt lookup keeps plain
 * sampling's tokens). */
static void check_samples_match(bool prefix_cache, uint32_t spec_mode) {
    llm_token prompt[40], other[25];
    uint64_t rng = 11;
    random_prompt(prompt, 40, g_model->hp.n_vocab, &rng);
    random_prompt(other, 25, g_model->hp.n_vocab, &rng);
    llm_sampling_params sp;
    sampling_params(&sp, 1234);
    llm_request_params p;
    llm_request_params_init(&p);
    p.sampling = &sp;
    p.max_new_tokens = 20;
    p.ignore_eos = true;
    p.n_samples = 5;
    p.spec_mode = spec_mode;
    outcome ref[5];
    for (uint32_t i = 0; i < 5; i++) reference(prompt, 40, &p, llmi_sample_seed(1234, i), &ref[i]);
    assert_true(llmi_sample_seed(1234, 0) == 1234); /* sample 0 = the plain request */
    int distinct = 0;
    for (uint32_t i = 1; i < 5; i++)
        distinct += memcmp(ref[i].toks, ref[0].toks, ref[0].n * sizeof(llm_token)) != 0;
    assert_true(distinct >= 3); /* the samples are different draws */

    llm_session *s = new_session(g_model, 2, 256, 24, 16, 0, prefix_cache);
    sampled reqs[2];
    llm_request_params q = p;
    q.n_samples = 1;
    q.sampling = NULL;
    q.spec_mode = LLM_SPEC_NONE;
    submit(s, other, 25, &q, &reqs[0]);
    submit(s, prompt, 40, &p, &reqs[1]);
    drain_samples(s, reqs, 2);
    for (uint32_t i = 0; i < 5; i++) expect_same(&reqs[1].s[i], &ref[i], i);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    assert_int_equal(st.prompt_tokens, 40 + 25); /* the shared prompt once */
    assert_int_equal(st.generated_tokens, 5 * 20 + 20);
    llmi_session_free(s);
}

/* Four samples under a grammar: each is the one-sample request with its
 * seed, each text is in the grammar's language, and each ends when the
 * grammar completes (STOP) or at an end-of-generation token it allows. */
static void test_samples_grammar(void **state) {
    (void)state;
    static const char re[] = "[a-z]{1,6}(,[a-z]{1,6}){0,3}\\.";
    llmi_grammar *g = NULL;
    assert_int_equal(llmi_grammar_from_regex(re, strlen(re), &g), LLM_OK);
    assert_int_equal(llmi_grammar_bind_vocab(g, g_model->tok), LLM_OK);
    llm_token prompt[8];
    uint64_t rng = 5;
    random_prompt(prompt, 8, g_model->hp.n_vocab, &rng);
    llm_sampling_params sp;
    sampling_params(&sp, 77);
    sp.grammar = g;
    llm_request_params p;
    llm_request_params_init(&p);
    p.sampling = &sp;
    p.max_new_tokens = 64;
    p.n_samples = 4;
    llm_session *s = new_session(g_model, 1, 256, 64, 16, 0, false);
    sampled r;
    submit(s, prompt, 8, &p, &r);
    drain_samples(s, &r, 1);
    for (uint32_t i = 0; i < 4; i++) {
        outcome want;
        reference(prompt, 8, &p, llmi_sample_seed(77, i), &want);
        expect_same(&r.s[i], &want, i);
        assert_true(r.s[i].finish == LLM_FINISH_STOP || r.s[i].finish == LLM_FINISH_EOS);
        llmi_gstate *gs = NULL;
        assert_int_equal(llmi_gstate_create(g, &gs), LLM_OK);
        if (llmi_gstate_accept_bytes(gs, r.s[i].text, r.s[i].text_len) != LLM_OK ||
            !llmi_gstate_can_end(gs))
            fail_msg("sample %u: '%.*s' is not in the grammar", i, (int)r.s[i].text_len,
                     r.s[i].text);
        llmi_gstate_free(gs);
    }
    llmi_session_free(s);
    llmi_grammar_free(g);
}

static void test_samples_match_single_requests(void **state) {
    (void)state;
    check_samples_match(false, LLM_SPEC_NONE);
    check_samples_match(true, LLM_SPEC_NONE);
    check_samples_match(true, LLM_SPEC_NGRAM);
}

/* Greedy samples are all the greedy continuation. */
static void test_greedy_samples_equal(void **state) {
    (void)state;
    llm_token prompt[30];
    uint64_t rng = 5;
    random_prompt(prompt, 30, g_model->hp.n_vocab, &rng);
    llm_request_params p;
    llm_request_params_init(&p);
    p.max_new_tokens = 16;
    p.ignore_eos = true;
    llm_session *s = new_session(g_model, 1, 256, 64, 16, 0, true);
    sampled one, three;
    submit(s, prompt, 30, &p, &one);
    drain_samples(s, &one, 1);
    p.n_samples = 3;
    p.spec_mode = LLM_SPEC_NGRAM;
    submit(s, prompt, 30, &p, &three);
    drain_samples(s, &three, 1);
    for (uint32_t i = 0; i < 3; i++) expect_same(&three.s[i], &one.s[0], i);
    llmi_session_free(s);
}

/* The samples share the prompt's blocks: after the first token the pool
 * holds the prompt once plus at most one copied block per sample. */
static void test_samples_share_prompt_blocks(void **state) {
    (void)state;
    llm_token prompt[70]; /* 4 full blocks of 16 and a partial one */
    uint64_t rng = 9;
    random_prompt(prompt, 70, g_model->hp.n_vocab, &rng);
    llm_sampling_params sp;
    sampling_params(&sp, 7);
    llm_request_params p;
    llm_request_params_init(&p);
    p.sampling = &sp;
    p.max_new_tokens = 8;
    p.ignore_eos = true;
    p.n_samples = 6;
    llm_session *s = new_session(g_model, 1, 256, 128, 16, 0, false);
    sampled r;
    submit(s, prompt, 70, &p, &r);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    assert_int_equal(st.n_waiting, 6);
    size_t n = 0;
    assert_int_equal(step_samples(s, &r, 1, &n), LLM_OK); /* prefill + first tokens */
    assert_int_equal(n, 6);
    check_invariants(s);
    llmi_session_stats(s, &st);
    assert_int_equal(st.n_running, 6);
    assert_int_equal(st.n_waiting, 0);
    assert_int_equal(st.blocks_used, 5); /* nothing written since the fork */
    assert_int_equal(step_samples(s, &r, 1, &n), LLM_OK);
    check_invariants(s);
    llmi_session_stats(s, &st);
    assert_true(st.blocks_used <= 4 + 6); /* full blocks shared, partial ones copied */
    drain_samples(s, &r, 1);
    for (uint32_t i = 0; i < 6; i++) {
        assert_int_equal(r.s[i].n, 8);
        assert_int_equal(r.s[i].finish, LLM_FINISH_LENGTH);
    }
    llmi_session_stats(s, &st);
    assert_int_equal(st.blocks_used, 0);
    llmi_session_free(s);
}

/* A pool too small for every sample at once: samples get preempted and
 * recomputed, and still give the tokens of the roomy run. */
static void test_samples_small_pool(void **state) {
    (void)state;
    llm_token prompt[36];
    uint64_t rng = 21;
    random_prompt(prompt, 36, g_model->hp.n_vocab, &rng);
    llm_sampling_params sp;
    sampling_params(&sp, 99);
    llm_request_params p;
    llm_request_params_init(&p);
    p.sampling = &sp;
    p.max_new_tokens = 40;
    p.ignore_eos = true;
    p.n_samples = 4;
    sampled big, small;
    llm_session *s = new_session(g_model, 1, 256, 64, 16, 0, false);
    submit(s, prompt, 36, &p, &big);
    drain_samples(s, &big, 1);
    llmi_session_free(s);
    for (int cache = 0; cache < 2; cache++) {
        s = new_session(g_model, 1, 256, 64, 16, 12, cache); /* 4 x 5 blocks wanted */
        submit(s, prompt, 36, &p, &small);
        drain_samples(s, &small, 1);
        llm_session_stats st = {sizeof st};
        llmi_session_stats(s, &st);
        assert_true(st.preemptions > 0);
        for (uint32_t i = 0; i < 4; i++) expect_same(&small.s[i], &big.s[i], i);
        llmi_session_free(s);
    }
}

/* Cancel before the samples start and while they run: one CANCELLED finish
 * per sample, every block back, and the id is then unknown. */
static void test_samples_cancel(void **state) {
    (void)state;
    llm_token prompt[20];
    uint64_t rng = 3;
    random_prompt(prompt, 20, g_model->hp.n_vocab, &rng);
    llm_sampling_params sp;
    sampling_params(&sp, 5);
    llm_request_params p;
    llm_request_params_init(&p);
    p.sampling = &sp;
    p.max_new_tokens = 30;
    p.ignore_eos = true;
    p.n_samples = 4;
    for (int when = 0; when < 3; when++) { /* before any step, mid-prefill, running */
        llm_session *s = new_session(g_model, 1, 256, 8, 16, 0, true);
        sampled r;
        submit(s, prompt, 20, &p, &r);
        size_t n = 0;
        for (int i = 0; i < (when == 0 ? 0 : when == 1 ? 1 : 6); i++) {
            assert_int_equal(step_samples(s, &r, 1, &n), LLM_OK);
            check_invariants(s);
        }
        assert_int_equal(llmi_session_cancel(s, r.id), LLM_OK);
        assert_int_equal(llmi_session_cancel(s, r.id), LLM_OK); /* harmless until reported */
        drain_samples(s, &r, 1);
        for (uint32_t i = 0; i < 4; i++) {
            assert_int_equal(r.s[i].n_finish_events, 1);
            assert_int_equal(r.s[i].finish, LLM_FINISH_CANCELLED);
            if (when < 2) assert_int_equal(r.s[i].n, 0);
        }
        assert_int_equal(llmi_session_cancel(s, r.id), LLM_ERR_NOT_FOUND);
        llm_session_stats st = {sizeof st};
        llmi_session_stats(s, &st);
        assert_int_equal(st.blocks_used, 0);
        llmi_session_free(s);
    }
}

/* Samples finishing in the step they start (one token each; a stop token),
 * and samples ending at different times. */
static void test_samples_finish_independently(void **state) {
    (void)state;
    llm_token prompt[24];
    uint64_t rng = 17;
    random_prompt(prompt, 24, g_model->hp.n_vocab, &rng);
    llm_sampling_params sp;
    sampling_params(&sp, 31);
    llm_request_params p;
    llm_request_params_init(&p);
    p.sampling = &sp;
    p.max_new_tokens = 1;
    p.ignore_eos = true;
    p.n_samples = 7;
    llm_session *s = new_session(g_model, 1, 256, 64, 16, 0, false);
    sampled r;
    submit(s, prompt, 24, &p, &r);
    size_t n = 0;
    assert_int_equal(step_samples(s, &r, 1, &n), LLM_OK);
    assert_int_equal(n, 7); /* one token and finish per sample */
    assert_true(idle(s));
    for (uint32_t i = 0; i < 7; i++) {
        assert_int_equal(r.s[i].n, 1);
        assert_int_equal(r.s[i].finish, LLM_FINISH_LENGTH);
    }
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    assert_int_equal(st.blocks_used, 0);

    /* Stop at the token sample 0 produced second: the samples stop wherever
     * they meet it (or run to the limit), each with its own finish. */
    p.max_new_tokens = 40;
    p.n_samples = 1;
    sampled first;
    submit(s, prompt, 24, &p, &first);
    drain_samples(s, &first, 1);
    llm_token stop = first.s[0].toks[1];
    p.stop_tokens = &stop;
    p.n_stop_tokens = 1;
    p.n_samples = 6;
    submit(s, prompt, 24, &p, &r);
    drain_samples(s, &r, 1);
    assert_int_equal(r.s[0].n, 2);
    assert_int_equal(r.s[0].finish, LLM_FINISH_STOP);
    for (uint32_t i = 1; i < 6; i++) {
        outcome *o = &r.s[i];
        assert_int_equal(o->n_finish_events, 1);
        bool stopped = o->toks[o->n - 1] == stop;
        assert_int_equal(o->finish, stopped ? LLM_FINISH_STOP : LLM_FINISH_LENGTH);
        for (uint32_t j = 0; j + 1 < o->n; j++) assert_true(o->toks[j] != stop);
    }
    llmi_session_free(s);
}

static void test_samples_params(void **state) {
    (void)state;
    llm_session *s = new_session(g_model, 1, 256, 64, 16, 0, false);
    llm_token prompt[4] = {5, 6, 7, 8};
    llm_request_params p;
    llm_request_params_init(&p);
    assert_int_equal(p.n_samples, 1);
    p.max_new_tokens = 3;
    llm_request_id id = 0;
    p.n_samples = LLM_MAX_SAMPLES + 1;
    assert_int_equal(llmi_session_submit(s, prompt, 4, &p, &id), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llmi_error_message(), "n_samples"));
    assert_true(idle(s));
    /* 0, and callers whose struct ends before n_samples: one sample. */
    sampled r[2];
    p.n_samples = 0;
    submit(s, prompt, 4, &p, &r[0]);
    p.n_samples = 9;
    p.struct_size = offsetof(llm_request_params, n_samples);
    submit(s, prompt, 4, &p, &r[1]);
    r[1].n_samples = 1;
    drain_samples(s, r, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(r[i].s[0].n_finish_events, 1);
        assert_int_equal(r[i].s[0].n, 3);
    }
    /* The most samples. */
    p.struct_size = sizeof p;
    p.n_samples = LLM_MAX_SAMPLES;
    p.max_new_tokens = 1;
    llm_request_id big = 0;
    assert_int_equal(llmi_session_submit(s, prompt, 4, &p, &big), LLM_OK);
    uint32_t finishes = 0, seen[LLM_MAX_SAMPLES] = {0};
    for (int guard = 0; guard < 100 && !idle(s); guard++) {
        llm_event ev[32];
        size_t n = 0;
        do {
            assert_int_equal(llmi_session_step(s, ev, 32, sizeof ev[0], &n), LLM_OK);
            for (size_t i = 0; i < n; i++) {
                assert_int_equal(ev[i].request, big);
                assert_true(ev[i].sample_index < LLM_MAX_SAMPLES);
                if (ev[i].finish_reason != LLM_FINISH_NONE) {
                    finishes++;
                    seen[ev[i].sample_index]++;
                }
            }
        } while (n == 32);
    }
    assert_int_equal(finishes, LLM_MAX_SAMPLES);
    for (uint32_t i = 0; i < LLM_MAX_SAMPLES; i++) assert_int_equal(seen[i], 1);
    check_invariants(s);
    llmi_session_free(s);
}

/* Allocation failures while a request with several samples runs beside a
 * plain one: a failing step changes nothing, or fails one sample (which
 * then ends with LLM_FINISH_ERROR after a prefix of its clean tokens); every
 * sample gets exactly one finish, and the rest match the clean run. */
static int run_with_failure(llm_session *s, const llm_token *pa, const llm_token *pb,
                            uint64_t fail_at, sampled out[2], bool *hit) {
    llm_sampling_params sp;
    sampling_params(&sp, 77);
    llm_request_params p;
    llm_request_params_init(&p);
    p.sampling = &sp;
    p.max_new_tokens = 12;
    p.ignore_eos = true;
    p.n_samples = 3;
    submit(s, pa, 30, &p, &out[0]);
    p.n_samples = 1;
    p.sampling = NULL;
    submit(s, pb, 18, &p, &out[1]);
    int failures = 0;
    *hit = false;
    if (fail_at) llmi_alloc_fail_after(fail_at);
    for (int guard = 0; guard < 10000; guard++) {
        size_t k = 0;
        llm_status st = step_samples(s, out, 2, &k);
        if (st != LLM_OK) {
            assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
            failures++;
        }
        /* The checks allocate: pause the countdown around them. */
        uint64_t left = 0;
        if (fail_at && !*hit) {
            left = alloc_disarm(fail_at);
            *hit = left == 0;
        }
        check_invariants(s);
        if (left) llmi_alloc_fail_after(left);
        if (st == LLM_OK && k == 0 && idle(s)) {
            llmi_alloc_fail_after(0);
            return failures;
        }
    }
    fail_msg("requests never finished");
    return failures;
}

static void test_samples_alloc_failures(void **state) {
    (void)state;
    llm_token pa[30], pb[18];
    uint64_t rng = 41;
    random_prompt(pa, 30, g_model->hp.n_vocab, &rng);
    random_prompt(pb, 18, g_model->hp.n_vocab, &rng);
    sampled ref[2];
    bool hit = false;
    llm_session *s = new_session(g_model, 1, 256, 16, 16, 8, true);
    assert_int_equal(run_with_failure(s, pa, pb, 0, ref, &hit), 0);
    llmi_session_free(s);
    uint64_t n;
    unsigned errors = 0, failed_steps = 0;
    for (n = 1; n < 100000; n++) {
        s = new_session(g_model, 1, 256, 16, 16, 8, true);
        sampled out[2];
        failed_steps += (unsigned)run_with_failure(s, pa, pb, n, out, &hit);
        for (int r = 0; r < 2; r++)
            for (uint32_t i = 0; i < out[r].n_samples; i++) {
                outcome *o = &out[r].s[i], *w = &ref[r].s[i];
                assert_int_equal(o->n_finish_events, 1);
                if (o->finish == LLM_FINISH_ERROR) {
                    errors++;
                    assert_true(o->n <= w->n);
                    assert_memory_equal(o->toks, w->toks, o->n * sizeof(llm_token));
                } else {
                    expect_same(o, w, i);
                }
            }
        llmi_session_free(s);
        if (!hit) break;
    }
    printf("# samples: %llu allocation failure points (%u failed steps, %u samples ended with "
           "LLM_FINISH_ERROR)\n",
           (unsigned long long)(n - 1), failed_steps, errors);
    assert_true(n > 10);
}

static int setup(void **state) {
    (void)state;
    g_model = tiny_model(256, 4242);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_model);
    return 0;
}

int main(void) {
    struct CMUnitTest tests[] = {
        device_test(test_samples_match_single_requests),
        device_test(test_samples_grammar),
        device_test(test_greedy_samples_equal),
        device_test(test_samples_share_prompt_blocks),
        device_test(test_samples_small_pool),
        device_test(test_samples_cancel),
        device_test(test_samples_finish_independently),
        device_test(test_samples_params),
        device_test(test_samples_alloc_failures),
    };
    return run_device_tests(tests, setup, teardown);
}
