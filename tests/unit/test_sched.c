/* Continuous batching: outputs equal solo runs under any batch composition,
 * chunked prefill, preemption and prefix sharing; KV invariants hold after
 * every step; cancellation and limits behave. Tiny random models, greedy. */
#include "sched_util.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct req_spec {
    llm_token prompt[600];
    uint32_t n_prompt, max_new, arrive_step;
} req_spec;

static llm_model *g_model;

static llm_request_id submit(llm_session *s, const req_spec *r, bool logprobs) {
    llm_request_params p;
    llm_request_params_init(&p);
    p.max_new_tokens = r->max_new;
    p.ignore_eos = true;
    p.logprobs = logprobs;
    llm_request_id id = 0;
    llm_status st = llmi_session_submit(s, r->prompt, r->n_prompt, &p, &id);
    if (st != LLM_OK) fail_msg("submit: %s", llmi_error_message());
    return id;
}

/* Runs each request alone in its own session: the reference outputs. */
static void run_alone(const req_spec *reqs, size_t n, outcome *out, bool logprobs) {
    for (size_t i = 0; i < n; i++) {
        llm_session *s = new_session(g_model, 1, 1024, 512, 16, 0, false);
        memset(&out[i], 0, sizeof out[i]);
        out[i].id = submit(s, &reqs[i], logprobs);
        drain(s, &out[i], 1);
        llmi_session_free(s);
    }
}

static void make_specs(req_spec *reqs, size_t n, uint64_t seed, uint32_t max_prompt,
                       uint32_t max_new, uint32_t max_arrival) {
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++) {
        reqs[i].n_prompt = rand_range(&rng, 1, max_prompt);
        reqs[i].max_new = rand_range(&rng, 1, max_new);
        reqs[i].arrive_step = rand_range(&rng, 0, max_arrival);
        random_prompt(reqs[i].prompt, reqs[i].n_prompt, g_model->hp.n_vocab, &rng);
    }
}

/* Submits each request at its arrival step, steps until all finish. */
static void run_together(llm_session *s, const req_spec *reqs, size_t n, outcome *out,
                         bool logprobs) {
    memset(out, 0, n * sizeof *out);
    size_t submitted = 0;
    for (uint32_t step = 0; submitted < n || true; step++) {
        for (size_t i = 0; i < n; i++)
            if (reqs[i].arrive_step == step) {
                out[i].id = submit(s, &reqs[i], logprobs);
                submitted++;
            }
        step_once(s, out, submitted == n ? n : n);
        check_invariants(s);
        llm_session_stats st = {sizeof st};
        llmi_session_stats(s, &st);
        if (submitted == n && st.n_running == 0 && st.n_waiting == 0) break;
        assert_true(step < 100000);
    }
    drain(s, out, n);
}

static void expect_same(const outcome *a, const outcome *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (a[i].n != b[i].n || memcmp(a[i].toks, b[i].toks, a[i].n * sizeof a[i].toks[0]))
            fail_msg("request %zu: %u tokens together vs %u alone, or different tokens", i, a[i].n,
                     b[i].n);
        assert_int_equal(a[i].finish, LLM_FINISH_LENGTH);
        assert_int_equal(a[i].n_finish_events, 1);
        assert_int_equal(a[i].text_len, b[i].text_len);
        assert_memory_equal(a[i].text, b[i].text, a[i].text_len);
    }
}

static void expect_pool_idle(llm_session *s) {
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(st.blocks_free + st.blocks_cached, st.blocks_total);
    llmi_kv_prefix_clear(s->kv);
    check_invariants(s);
    assert_int_equal(s->kv->n_free, s->kv->n_blocks);
}

static void test_mixed_requests_match_alone(void **state) {
    (void)state;
    enum { N = 32 };
    static req_spec reqs[N];
    static outcome together[N], alone[N];
    printf("# seed 4242\n");
    make_specs(reqs, N, 4242, 300, 40, 30);
    run_alone(reqs, N, alone, false);
    /* A token budget of 64 forces long prompts into chunks mixed with decodes. */
    llm_session *s = new_session(g_model, 2, 1024, 64, 16, 0, true);
    run_together(s, reqs, N, together, false);
    expect_same(together, alone, N);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    printf("# %llu steps, %llu prompt tokens, %llu generated\n", (unsigned long long)st.steps,
           (unsigned long long)st.prompt_tokens, (unsigned long long)st.generated_tokens);
    expect_pool_idle(s);
    llmi_session_free(s);
}

/* new_session with K/V stored as kv_type (default pool size). */
static llm_session *new_session_kv(uint32_t threads, uint32_t max_batch, bool prefix_cache,
                                   llm_kv_type kv_type) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = threads;
    p.n_ctx = 1024;
    p.max_batch_tokens = max_batch;
    p.kv_block_size = 16;
    p.prefix_cache = prefix_cache;
    p.kv_type = kv_type;
    llm_session *s = NULL;
    if (create_test_session(g_model, &p, &s) != LLM_OK)
        fail_msg("session: %s", llmi_error_message());
    assert_int_equal(s->eng->layout.type, kv_type);
    return s;
}

/* The mixed-requests test with f16 K/V: batching and chunked prefill still
 * give exactly the solo runs' tokens, the solo runs using f16 K/V too (a
 * K/V row is rounded the same way whatever the batch; across KV types
 * outputs may differ). */
static void test_mixed_requests_match_alone_f16(void **state) {
    (void)state;
    enum { N = 32 };
    static req_spec reqs[N];
    static outcome together[N], alone[N];
    printf("# seed 4243, f16 KV\n");
    make_specs(reqs, N, 4243, 300, 40, 30);
    for (size_t i = 0; i < N; i++) {
        llm_session *s = new_session_kv(1, 512, false, LLM_KV_F16);
        memset(&alone[i], 0, sizeof alone[i]);
        alone[i].id = submit(s, &reqs[i], false);
        drain(s, &alone[i], 1);
        llmi_session_free(s);
    }
    llm_session *s = new_session_kv(2, 64, true, LLM_KV_F16);
    run_together(s, reqs, N, together, false);
    expect_same(together, alone, N);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    printf("# %llu steps, %llu prompt tokens, %llu generated\n", (unsigned long long)st.steps,
           (unsigned long long)st.prompt_tokens, (unsigned long long)st.generated_tokens);
    expect_pool_idle(s);
    llmi_session_free(s);
}

static void test_small_pool_preempts(void **state) {
    (void)state;
    enum { N = 16 };
    static req_spec reqs[N];
    static outcome together[N], alone[N];
    printf("# seed 99\n");
    make_specs(reqs, N, 99, 100, 60, 0);
    run_alone(reqs, N, alone, false);
    /* 24 blocks of 8 tokens: far less than the 16 requests need at once. */
    llm_session *s = new_session(g_model, 2, 1024, 128, 8, 24, true);
    run_together(s, reqs, N, together, false);
    expect_same(together, alone, N);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    printf("# preemptions %llu\n", (unsigned long long)st.preemptions);
    assert_true(st.preemptions > 0);
    expect_pool_idle(s);
    llmi_session_free(s);
}

static void test_prefix_cache(void **state) {
    (void)state;
    static req_spec reqs[2];
    static outcome with_cache[2], without[2];
    uint64_t rng = 7;
    random_prompt(reqs[0].prompt, 280, g_model->hp.n_vocab, &rng);
    memcpy(reqs[1].prompt, reqs[0].prompt, 256 * sizeof(llm_token));
    random_prompt(reqs[1].prompt + 256, 30, g_model->hp.n_vocab, &rng);
    reqs[0].n_prompt = 280;
    reqs[1].n_prompt = 286;
    reqs[0].max_new = reqs[1].max_new = 12;
    reqs[1].arrive_step = 1000000; /* submitted by hand below */
    for (int cached = 0; cached < 2; cached++) {
        outcome *out = cached ? with_cache : without;
        llm_session *s = new_session(g_model, 2, 1024, 512, 16, 0, cached);
        memset(out, 0, 2 * sizeof *out);
        out[0].id = submit(s, &reqs[0], true);
        drain(s, out, 1);
        llm_session_stats before = {sizeof before}, after = {sizeof after};
        llmi_session_stats(s, &before);
        out[1].id = submit(s, &reqs[1], true);
        drain(s, out, 2);
        llmi_session_stats(s, &after);
        uint64_t hit = after.prefix_hit_tokens - before.prefix_hit_tokens;
        uint64_t computed = after.prompt_tokens - before.prompt_tokens;
        printf("# prefix cache %s: second request reused %llu tokens, computed %llu\n",
               cached ? "on" : "off", (unsigned long long)hit, (unsigned long long)computed);
        if (cached) {
            assert_int_equal(hit, 256);
            assert_int_equal(computed, 30);
        } else {
            assert_int_equal(hit, 0);
            assert_int_equal(computed, 286);
        }
        llmi_session_free(s);
    }
    /* Same tokens and the same log-probabilities (bitwise: the cached K/V are
     * the values the first request computed). */
    assert_int_equal(with_cache[1].n, without[1].n);
    assert_memory_equal(with_cache[1].toks, without[1].toks, without[1].n * sizeof(llm_token));
    assert_memory_equal(with_cache[1].logprobs, without[1].logprobs, without[1].n * sizeof(float));
    assert_true(without[1].logprobs[0] < 0.0f);
}

static void test_cancel(void **state) {
    (void)state;
    static req_spec r;
    static outcome out[2];
    uint64_t rng = 11;
    random_prompt(r.prompt, 500, g_model->hp.n_vocab, &rng);
    r.n_prompt = 500;
    r.max_new = 100;
    /* Budget 32: the prompt takes 16 steps to prefill. */
    llm_session *s = new_session(g_model, 2, 1024, 32, 16, 0, false);
    memset(out, 0, sizeof out);
    out[0].id = submit(s, &r, false);
    for (int i = 0; i < 3; i++) step_once(s, out, 1);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    assert_true(st.blocks_used > 0);
    assert_int_equal(llmi_session_cancel(s, out[0].id), LLM_OK);
    llmi_session_stats(s, &st);
    assert_int_equal(st.blocks_used, 0); /* freed at once, mid-prefill */
    assert_int_equal(llmi_session_cancel(s, out[0].id), LLM_OK); /* again: harmless */
    drain(s, out, 1);
    assert_int_equal(llmi_session_cancel(s, out[0].id), LLM_ERR_NOT_FOUND); /* reported */
    assert_int_equal(out[0].finish, LLM_FINISH_CANCELLED);
    assert_int_equal(out[0].n, 0);
    /* Mid-decode. */
    r.n_prompt = 20;
    out[1].id = submit(s, &r, false);
    for (int i = 0; i < 6; i++) step_once(s, out, 2);
    assert_true(out[1].n >= 4);
    assert_int_equal(llmi_session_cancel(s, out[1].id), LLM_OK);
    llmi_session_stats(s, &st);
    assert_int_equal(st.blocks_used, 0);
    drain(s, out, 2);
    assert_int_equal(out[1].finish, LLM_FINISH_CANCELLED);
    assert_int_equal(out[1].n_finish_events, 1);
    assert_int_equal(llmi_session_cancel(s, 12345), LLM_ERR_NOT_FOUND);
    expect_pool_idle(s);
    llmi_session_free(s);
}

static void test_stop_conditions(void **state) {
    (void)state;
    static req_spec r;
    static outcome base, out;
    uint64_t rng = 5;
    random_prompt(r.prompt, 10, 256, &rng);
    for (uint32_t i = 0; i < 10; i++) r.prompt[i] = 'a' + (r.prompt[i] % 26); /* letters */
    r.n_prompt = 10;
    r.max_new = 40;
    run_alone(&r, 1, &base, false);
    assert_int_equal(base.n, 40);
    /* Stop token: the 6th generated token ends the request right there. */
    llm_session *s = new_session(g_model, 1, 1024, 512, 16, 0, false);
    llm_request_params p;
    llm_request_params_init(&p);
    p.max_new_tokens = 40;
    p.ignore_eos = true;
    p.stop_tokens = &base.toks[5];
    p.n_stop_tokens = 1;
    memset(&out, 0, sizeof out);
    assert_int_equal(llmi_session_submit(s, r.prompt, r.n_prompt, &p, &out.id), LLM_OK);
    drain(s, &out, 1);
    assert_int_equal(out.finish, LLM_FINISH_STOP);
    uint32_t first = 0;
    while (base.toks[first] != base.toks[5]) first++;
    assert_int_equal(out.n, first + 1);
    /* Stop string: a piece of the text from the middle; nothing of it (or
     * after it) is emitted. */
    char stop[8] = {0};
    size_t at = base.text_len / 2;
    while (at < base.text_len && ((unsigned char)base.text[at] & 0xc0) == 0x80) at++;
    size_t len = 1;
    while (at + len < base.text_len && ((unsigned char)base.text[at + len] & 0xc0) == 0x80) len++;
    memcpy(stop, base.text + at, len);
    const char *stops[] = {stop};
    p.stop_tokens = NULL;
    p.n_stop_tokens = 0;
    p.stop_strings = stops;
    p.n_stop_strings = 1;
    memset(&out, 0, sizeof out);
    assert_int_equal(llmi_session_submit(s, r.prompt, r.n_prompt, &p, &out.id), LLM_OK);
    drain(s, &out, 1);
    assert_int_equal(out.finish, LLM_FINISH_STOP);
    char *first_hit = strstr(base.text, stop);
    assert_non_null(first_hit);
    assert_int_equal(out.text_len, (size_t)(first_hit - base.text));
    assert_memory_equal(out.text, base.text, out.text_len);
    llmi_session_free(s);
}

static void test_limits(void **state) {
    (void)state;
    llm_session *s = new_session(g_model, 1, 64, 512, 16, 0, false);
    llm_token toks[80] = {0};
    llm_request_params p;
    llm_request_params_init(&p);
    llm_request_id id = 0;
    assert_int_equal(llmi_session_submit(s, toks, 64, &p, &id), LLM_ERR_LIMIT);
    assert_non_null(strstr(llmi_error_message(), "64"));
    assert_int_equal(llmi_session_submit(s, toks, 0, &p, &id), LLM_ERR_INVALID_ARGUMENT);
    toks[3] = 100000;
    assert_int_equal(llmi_session_submit(s, toks, 10, &p, &id), LLM_ERR_INVALID_ARGUMENT);
    toks[3] = 0;
    p.max_new_tokens = 0;
    assert_int_equal(llmi_session_submit(s, toks, 10, &p, &id), LLM_ERR_INVALID_ARGUMENT);
    p.max_new_tokens = 10;
    p.struct_size = 2;
    assert_int_equal(llmi_session_submit(s, toks, 10, &p, &id), LLM_ERR_INVALID_ARGUMENT);
    llm_request_params_init(&p);
    const char *bad[] = {""};
    p.stop_strings = bad;
    p.n_stop_strings = 1;
    assert_int_equal(llmi_session_submit(s, toks, 10, &p, &id), LLM_ERR_INVALID_ARGUMENT);
    llmi_session_free(s);
    /* A pool of 2 blocks of 16 cannot hold 40 tokens: refused up front. */
    s = new_session(g_model, 1, 1024, 512, 16, 2, false);
    llm_request_params_init(&p);
    p.max_new_tokens = 20;
    assert_int_equal(llmi_session_submit(s, toks, 20, &p, &id), LLM_ERR_LIMIT);
    assert_non_null(strstr(llmi_error_message(), "blocks"));
    p.max_new_tokens = 12;
    assert_int_equal(llmi_session_submit(s, toks, 20, &p, &id), LLM_OK);
    outcome o = {.id = id};
    drain(s, &o, 1);
    assert_int_equal(o.finish == LLM_FINISH_LENGTH || o.finish == LLM_FINISH_EOS, 1);
    llmi_session_free(s);
}

/* ---- concurrency: submitters and cancellers on other threads ---- */

typedef struct submitter {
    llm_session *s;
    unsigned seed;
    llm_request_id ids[40];
    int n;
} submitter;

static void *submit_thread(void *arg) {
    submitter *t = arg;
    uint64_t rng = t->seed;
    for (int i = 0; i < 40; i++) {
        llm_token prompt[64];
        uint32_t n = rand_range(&rng, 1, 64);
        random_prompt(prompt, n, g_model->hp.n_vocab, &rng);
        llm_request_params p;
        llm_request_params_init(&p);
        p.max_new_tokens = rand_range(&rng, 1, 20);
        p.ignore_eos = true;
        if (llmi_session_submit(t->s, prompt, n, &p, &t->ids[t->n]) == LLM_OK) t->n++;
        if (t->n > 2 && rand_range(&rng, 0, 2) == 0)
            llmi_session_cancel(t->s, t->ids[rand_range(&rng, 0, (uint32_t)t->n - 1)]);
    }
    return NULL;
}

/* Reads the stats while another thread steps (llm.h allows it): every
 * snapshot is consistent. Under ThreadSanitizer (make tsan) this also
 * checks that nothing the forward pass writes is read without the lock. */
typedef struct stats_poller {
    llm_session *s;
    atomic_bool stop;
    uint64_t n_polls;
    bool consistent;
} stats_poller;

static void *poll_stats(void *arg) {
    stats_poller *p = arg;
    while (!atomic_load(&p->stop)) {
        llm_session_stats st = {sizeof st};
        llmi_session_stats(p->s, &st);
        if (st.blocks_used + st.blocks_cached + st.blocks_free != st.blocks_total ||
            st.kv_tokens_used > (uint64_t)st.blocks_used * st.block_size)
            p->consistent = false;
        p->n_polls++;
    }
    return NULL;
}

static void test_concurrent_submit_cancel(void **state) {
    (void)state;
    llm_session *s = new_session(g_model, 2, 1024, 128, 16, 64, true);
    submitter t[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (submitter){.s = s, .seed = 100u + (unsigned)i};
        pthread_create(&th[i], NULL, submit_thread, &t[i]);
    }
    stats_poller poller = {.s = s, .consistent = true};
    pthread_t poll_th;
    pthread_create(&poll_th, NULL, poll_stats, &poller);
    /* Step while they submit; count finish events per id. */
    static outcome outs[160];
    size_t n_outs = 0;
    int joined = 0;
    for (int guard = 0; guard < 200000; guard++) {
        llm_event ev[32];
        size_t n = 0;
        assert_int_equal(llmi_session_step(s, ev, 32, sizeof ev[0], &n), LLM_OK);
        for (size_t i = 0; i < n; i++) {
            outcome *o = NULL;
            for (size_t k = 0; k < n_outs && !o; k++)
                if (outs[k].id == ev[i].request) o = &outs[k];
            if (!o) {
                o = &outs[n_outs++];
                memset(o, 0, sizeof *o);
                o->id = ev[i].request;
            }
            assert_int_equal(o->n_finish_events, 0);
            if (ev[i].finish_reason != LLM_FINISH_NONE) o->n_finish_events++;
        }
        if (joined == 0 && guard > 50) {
            for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
            joined = 1;
        }
        llm_session_stats st = {sizeof st};
        llmi_session_stats(s, &st);
        if (joined && n == 0 && st.n_running == 0 && st.n_waiting == 0) break;
    }
    atomic_store(&poller.stop, true);
    pthread_join(poll_th, NULL);
    assert_true(poller.consistent);
    assert_true(poller.n_polls > 0);
    int submitted = 0;
    for (int i = 0; i < 4; i++) submitted += t[i].n;
    printf("# %d requests submitted from 4 threads, %zu finished; stats read %llu times\n",
           submitted, n_outs, (unsigned long long)poller.n_polls);
    assert_int_equal(n_outs, (size_t)submitted);
    for (size_t k = 0; k < n_outs; k++) assert_int_equal(outs[k].n_finish_events, 1);
    check_invariants(s);
    expect_pool_idle(s);
    llmi_session_free(s);
}


/* ---- randomized soak over both APIs ---- */

typedef struct soak_state {
    llm_session *s;
    llm_request_id live[256];
    size_t n_live;
    llm_seq_id seqs[32];
    size_t n_seqs;
    llm_batch *batch;
    uint64_t rng;
    uint64_t ops[8];
} soak_state;

static void soak_submit(soak_state *st, llm_token (*prefixes)[96]) {
    if (st->n_live == 256) return;
    llm_token prompt[200];
    uint32_t pre = rand_range(&st->rng, 0, 3), pre_len = rand_range(&st->rng, 0, 96);
    memcpy(prompt, prefixes[pre], pre_len * sizeof *prompt);
    uint32_t n = pre_len + rand_range(&st->rng, 1, 60);
    random_prompt(prompt + pre_len, n - pre_len, g_model->hp.n_vocab, &st->rng);
    llm_request_params p;
    llm_request_params_init(&p);
    p.max_new_tokens = rand_range(&st->rng, 1, 40);
    p.ignore_eos = rand_range(&st->rng, 0, 1);
    p.priority = (int32_t)rand_range(&st->rng, 0, 2);
    llm_request_id id;
    assert_int_equal(llmi_session_submit(st->s, prompt, n, &p, &id), LLM_OK);
    st->live[st->n_live++] = id;
}

static void soak_step(soak_state *st) {
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
}

static void soak_token_level(soak_state *st, uint32_t op) {
    llm_session *s = st->s;
    if (op == 0 && st->n_seqs < 32) { /* open */
        assert_int_equal(llmi_seq_open(s, NULL, &st->seqs[st->n_seqs]), LLM_OK);
        st->n_seqs++;
        return;
    }
    if (st->n_seqs == 0) return;
    size_t k = rand_range(&st->rng, 0, (uint32_t)st->n_seqs - 1);
    llm_seq_id id = st->seqs[k];
    uint32_t len = 0;
    assert_int_equal(llmi_seq_length(s, id, &len), LLM_OK);
    if (op == 1 && st->n_seqs < 32) { /* fork */
        assert_int_equal(llmi_seq_open(s, &id, &st->seqs[st->n_seqs]), LLM_OK);
        st->n_seqs++;
    } else if (op == 2) { /* decode a few tokens */
        llmi_batch_clear(st->batch);
        uint32_t n = rand_range(&st->rng, 1, 12);
        if (len + n >= 1024) return;
        for (uint32_t i = 0; i < n; i++)
            llmi_batch_add(st->batch, id, len + i, (llm_token)rand_range(&st->rng, 0, 250),
                           i == n - 1);
        llm_status rc = llmi_session_decode(s, st->batch);
        assert_true(rc == LLM_OK || rc == LLM_ERR_LIMIT); /* the pool may be full */
        uint32_t after = 0;
        llmi_seq_length(s, id, &after);
        assert_int_equal(after, rc == LLM_OK ? len + n : len);
    } else if (op == 3) { /* truncate */
        assert_int_equal(llmi_seq_truncate(s, id, rand_range(&st->rng, 0, len)), LLM_OK);
    } else if (op == 4) { /* close */
        assert_int_equal(llmi_seq_close(s, id), LLM_OK);
        st->seqs[k] = st->seqs[--st->n_seqs];
    }
}

static void test_soak(void **state) {
    (void)state;
    soak_state st = {.rng = 20261129};
    printf("# soak seed %llu\n", (unsigned long long)st.rng);
    st.s = new_session(g_model, 1, 1024, 48, 8, 48, true);
    assert_int_equal(llmi_batch_create(64, &st.batch), LLM_OK);
    static llm_token prefixes[4][96];
    for (int i = 0; i < 4; i++) random_prompt(prefixes[i], 96, g_model->hp.n_vocab, &st.rng);
    enum { OPS = 12000 };
    for (int op = 0; op < OPS; op++) {
        uint32_t kind = rand_range(&st.rng, 0, 99);
        if (kind < 12) {
            soak_submit(&st, prefixes);
            st.ops[0]++;
        } else if (kind < 16 && st.n_live > 0) {
            llm_request_id id = st.live[rand_range(&st.rng, 0, (uint32_t)st.n_live - 1)];
            assert_int_equal(llmi_session_cancel(st.s, id), LLM_OK);
            st.ops[1]++;
        } else if (kind < 30) {
            soak_token_level(&st, rand_range(&st.rng, 0, 4));
            st.ops[2]++;
        } else {
            soak_step(&st);
            st.ops[3]++;
        }
        check_invariants(st.s);
    }
    /* Wind down: cancel what is left, drain, close sequences. */
    while (st.n_live > 0) {
        for (size_t i = 0; i < st.n_live; i++) llmi_session_cancel(st.s, st.live[i]);
        soak_step(&st);
        check_invariants(st.s);
    }
    while (st.n_seqs > 0) assert_int_equal(llmi_seq_close(st.s, st.seqs[--st.n_seqs]), LLM_OK);
    llm_session_stats stats = {sizeof stats};
    llmi_session_stats(st.s, &stats);
    printf("# %d ops: %llu submits, %llu cancels, %llu token-level, %llu steps; %llu preemptions, "
           "%llu prefix-hit tokens, %llu evictions, %llu CoW copies\n",
           OPS, (unsigned long long)st.ops[0], (unsigned long long)st.ops[1],
           (unsigned long long)st.ops[2], (unsigned long long)st.ops[3],
           (unsigned long long)stats.preemptions, (unsigned long long)stats.prefix_hit_tokens,
           (unsigned long long)st.s->kv->evictions, (unsigned long long)st.s->kv->cow_copies);
    assert_true(stats.preemptions > 0);
    assert_true(stats.prefix_hit_tokens > 0);
    expect_pool_idle(st.s);
    llmi_batch_free(st.batch);
    llmi_session_free(st.s);
}

static int setup(void **state) {
    (void)state;
    g_model = tiny_model(1024, 31337);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_model);
    return 0;
}

int main(void) {
    struct CMUnitTest tests[] = {
        device_test(test_mixed_requests_match_alone),
        device_test(test_mixed_requests_match_alone_f16),
        device_test(test_small_pool_preempts),
        device_test(test_prefix_cache),
        device_test(test_cancel),
        device_test(test_stop_conditions),
        device_test(test_limits),
        device_test(test_concurrent_submit_cancel),
        device_test(test_soak),
    };
    return run_device_tests(tests, setup, teardown);
}
