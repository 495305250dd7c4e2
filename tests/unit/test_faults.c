/* Allocation-failure sweeps. For N = 1, 2, 3, ... the N-th allocation from
 * the start of an operation fails (llmi_alloc_fail_after), until N is past
 * the operation's last allocation:
 *
 *  (a) model load from a temp file, mmap and read paths;
 *  (b) session create;
 *  (c) llmi_sched_submit;
 *  (d) the llmi_sched_step calls that run two requests to completion (with
 *      chunked prefill, stop strings, logprobs and preemption);
 *  (e) the token-level API: seq open, decode, fork, decode both, close.
 *
 * Every failure must be LLM_ERR_OUT_OF_MEMORY with nothing half-made left
 * behind (the suite runs under LeakSanitizer in `make check`); for (c)-(e)
 * the session must stay usable: with injection off, a request runs to
 * completion and llmi_sched_check passes. Each sweep prints how many failure
 * points it tried.
 *
 * Whether the injected failure happened is probed afterwards: while the
 * countdown is still armed, one of the next N allocations fails. The same
 * probe pauses the countdown around invariant checks, which allocate. */
#include "sched_util.h"

static llm_model *g_model;
static char g_path[512];

/* Arms the countdown: the n-th allocation from now fails. */
static void arm(uint64_t n) { llmi_alloc_fail_after(n); }

/* Disarms; returns whether the armed failure happened since arm(n). */
static bool fired(uint64_t n) { return alloc_disarm(n) == 0; }

static void expect_oom(llm_status st, const char *what, uint64_t n) {
    if (st != LLM_ERR_OUT_OF_MEMORY)
        fail_msg("%s, allocation %llu failing: status %d (%s), want LLM_ERR_OUT_OF_MEMORY", what,
                 (unsigned long long)n, (int)st, llmi_error_message());
    assert_true(llmi_error_message()[0] != '\0');
}

/* ---- helpers: a request run to completion ---- */

/* One step; applies the events to outs (nothing after a finish, ERROR
 * finishes carry LLM_ERR_OUT_OF_MEMORY). Returns the step's status. */
static llm_status step_events(llm_session *s, outcome *outs, size_t n_outs, size_t *n_ev) {
    llm_event ev[64];
    size_t n = 0;
    llm_status st = llmi_session_step(s, ev, 64, sizeof ev[0], &n);
    *n_ev = n;
    if (st != LLM_OK) {
        assert_int_equal(n, 0); /* a failed step delivers nothing; the next one does */
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        outcome *o = find_outcome(outs, n_outs, ev[i].request);
        if (o->n_finish_events != 0)
            fail_msg("event for request %llu after its finish", (unsigned long long)o->id);
        if (ev[i].token != LLM_TOKEN_NONE) {
            assert_true(o->n < MAX_OUT);
            o->logprobs[o->n] = ev[i].logprob;
            o->toks[o->n++] = ev[i].token;
        }
        assert_int_equal(ev[i].text[ev[i].text_len], '\0');
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

/* With injection off: one request runs to completion, invariants hold after
 * every step, and nothing is left running or waiting. */
static void run_clean_request(llm_session *s) {
    llm_token prompt[20];
    for (int i = 0; i < 20; i++)
        prompt[i] = (llm_token)(i * 7 % 300);
    llm_request_params p;
    llm_request_params_init(&p);
    p.max_new_tokens = 6;
    p.ignore_eos = true;
    outcome o = {0};
    if (llmi_session_submit(s, prompt, 20, &p, &o.id) != LLM_OK)
        fail_msg("clean submit: %s", llmi_error_message());
    for (int guard = 0; guard < 1000; guard++) {
        size_t n = 0;
        llm_status st = step_events(s, &o, 1, &n);
        if (st != LLM_OK)
            fail_msg("clean step: %s", llmi_error_message());
        check_invariants(s);
        if (o.n_finish_events)
            break;
    }
    assert_int_equal(o.n_finish_events, 1);
    assert_int_equal(o.finish, LLM_FINISH_LENGTH);
    assert_int_equal(o.n, 6);
    size_t n = 0;
    assert_int_equal(step_events(s, &o, 1, &n), LLM_OK);
    assert_int_equal(n, 0);
    assert_true(idle(s));
    check_invariants(s);
}

/* ---- (a) model load ---- */

static void sweep_load(bool use_mmap) {
    uint64_t n;
    unsigned handled = 0;
    for (n = 1; n < 100000; n++) {
        llm_model *m = (llm_model *)0x1;
        arm(n);
        llm_status st = llmi_model_load(g_path, use_mmap, &m);
        bool hit = fired(n);
        if (st == LLM_OK) {
            assert_non_null(m);
            llmi_model_free(m);
            if (!hit)
                break;
            handled++; /* failure absorbed (an optional allocation) */
            continue;
        }
        assert_true(hit);
        expect_oom(st, use_mmap ? "model load (mmap)" : "model load (read)", n);
        assert_null(m);
    }
    printf("# (a) model load, %s: %llu allocation failure points (%u absorbed), each clean\n",
           use_mmap ? "mmap" : "read", (unsigned long long)(n - 1), handled);
    assert_true(n > 10);
}

static void test_model_load(void **state) {
    (void)state;
    sweep_load(true);
    sweep_load(false);
}

/* ---- (b) session create ---- */

static llm_session_params session_params(void) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = 128;
    p.max_batch_tokens = 16;
    p.kv_block_size = 8;
    p.prefix_cache = true;
    /* 8 blocks of 8 tokens: two requests of 40 + 20 tokens cannot both
     * hold all their blocks, so the newer one gets preempted. */
    p.kv_cache_bytes = 8 * llmi_kv_block_bytes(g_model->hp.n_layer,
                                               g_model->hp.n_head_kv * g_model->hp.head_dim, 8);
    return p;
}

static llm_session *fresh_session(void) {
    llm_session_params p = session_params();
    llm_session *s = NULL;
    if (llmi_session_create(g_model, &p, &s) != LLM_OK)
        fail_msg("session: %s", llmi_error_message());
    return s;
}

static void test_session_create(void **state) {
    (void)state;
    llm_session_params p = session_params();
    uint64_t n;
    for (n = 1; n < 100000; n++) {
        llm_session *s = (llm_session *)0x1;
        arm(n);
        llm_status st = llmi_session_create(g_model, &p, &s);
        bool hit = fired(n);
        if (st == LLM_OK) {
            assert_false(hit);
            run_clean_request(s);
            llmi_session_free(s);
            break;
        }
        assert_true(hit);
        expect_oom(st, "session create", n);
        assert_null(s);
    }
    printf("# (b) session create: %llu allocation failure points, each clean\n",
           (unsigned long long)(n - 1));
    assert_true(n > 5);
}

/* ---- (c) submit ---- */

static const char *const g_stops[] = {"zzzz never", "\xc3\xa9t\xc3\xa9 never"};

static void request_params(llm_request_params *p, uint32_t max_new) {
    static const llm_token stop_tokens[] = {1}; /* '"': may or may not occur */
    llm_request_params_init(p);
    p->max_new_tokens = max_new;
    p->ignore_eos = true;
    p->logprobs = true;
    p->stop_tokens = stop_tokens;
    p->n_stop_tokens = 1;
    p->stop_strings = g_stops;
    p->n_stop_strings = 2;
}

static void test_submit(void **state) {
    (void)state;
    llm_token prompt[30];
    for (int i = 0; i < 30; i++)
        prompt[i] = (llm_token)(i * 11 % 300);
    llm_request_params p;
    request_params(&p, 5);
    uint64_t n;
    for (n = 1; n < 100000; n++) {
        llm_session *s = fresh_session(); /* first submit: the queue is allocated too */
        llm_request_id id = 0;
        arm(n);
        llm_status st = llmi_session_submit(s, prompt, 30, &p, &id);
        bool hit = fired(n);
        if (st != LLM_OK) {
            assert_true(hit);
            expect_oom(st, "submit", n);
            assert_int_equal(id, 0);
            check_invariants(s);
            assert_true(idle(s)); /* nothing was queued */
        } else {
            assert_false(hit);
            for (int guard = 0; guard < 1000 && !idle(s); guard++) { /* it runs normally */
                size_t k = 0;
                llm_event ev[8];
                assert_int_equal(llmi_session_step(s, ev, 8, sizeof ev[0], &k), LLM_OK);
                check_invariants(s);
            }
            assert_true(idle(s));
        }
        run_clean_request(s);
        llmi_session_free(s);
        if (st == LLM_OK)
            break;
    }
    printf("# (c) submit: %llu allocation failure points, session usable after each\n",
           (unsigned long long)(n - 1));
    assert_true(n > 3);
}

/* ---- (d) steps ---- */

typedef struct two_req {
    llm_token pa[40], pb[20];
} two_req;

static void two_prompts(two_req *t) {
    for (int i = 0; i < 40; i++)
        t->pa[i] = (llm_token)(i * 13 % 300);
    for (int i = 0; i < 20; i++)
        t->pb[i] = i < 16 ? t->pa[i] : (llm_token)(i * 5 % 300);
}

/* Submits both (injection off), then steps until both finish with the
 * countdown armed at n (0 = off). Returns how many steps failed. */
static int run_two(llm_session *s, const two_req *t, uint64_t n, outcome out[2]) {
    llm_request_params pa, pb;
    request_params(&pa, 24);
    request_params(&pb, 30);
    pa.n_stop_tokens = pb.n_stop_tokens = 0; /* run to the length limit */
    pb.logprobs = false;
    memset(out, 0, 2 * sizeof *out);
    if (llmi_session_submit(s, t->pa, 40, &pa, &out[0].id) != LLM_OK ||
        llmi_session_submit(s, t->pb, 20, &pb, &out[1].id) != LLM_OK)
        fail_msg("submit: %s", llmi_error_message());
    int failures = 0;
    if (n)
        arm(n);
    for (int guard = 0; guard < 10000; guard++) {
        size_t k = 0;
        llm_status st = step_events(s, out, 2, &k);
        if (st != LLM_OK) {
            expect_oom(st, "step", n);
            failures++;
        }
        uint64_t left = n ? alloc_disarm(n) : 0; /* the check allocates: pause the countdown */
        check_invariants(s);
        if (left)
            arm(left);
        if (st == LLM_OK && k == 0 && idle(s))
            return failures;
    }
    fail_msg("requests never finished (allocation %llu failing)", (unsigned long long)n);
    return failures;
}

static void test_steps(void **state) {
    (void)state;
    two_req t;
    two_prompts(&t);
    outcome ref[2];
    llm_session *s = fresh_session();
    assert_int_equal(run_two(s, &t, 0, ref), 0);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    llmi_session_free(s);
    printf("# ref: %u+%u tokens, finish %d %d, preemptions %llu, prefix hits %llu\n", ref[0].n,
           ref[1].n, ref[0].finish, ref[1].finish, (unsigned long long)st.preemptions,
           (unsigned long long)st.prefix_hit_tokens);
    assert_true(st.preemptions > 0); /* the scenario does preempt */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ref[i].finish, LLM_FINISH_LENGTH);
        assert_int_equal(ref[i].n_finish_events, 1);
    }

    uint64_t n;
    unsigned n_failed_steps = 0, n_error_finishes = 0;
    for (n = 1; n < 100000; n++) {
        s = fresh_session();
        outcome out[2];
        int failures = run_two(s, &t, n, out);
        bool hit = fired(n);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(out[i].n_finish_events, 1);
            if (out[i].finish == LLM_FINISH_ERROR) {
                /* what it delivered before the failure is what a clean run gives */
                n_error_finishes++;
                assert_true(out[i].n <= ref[i].n);
                assert_memory_equal(out[i].toks, ref[i].toks, out[i].n * sizeof(llm_token));
            } else {
                assert_int_equal(out[i].finish, ref[i].finish);
                assert_int_equal(out[i].n, ref[i].n);
                assert_memory_equal(out[i].toks, ref[i].toks, ref[i].n * sizeof(llm_token));
                assert_int_equal(out[i].text_len, ref[i].text_len);
                assert_memory_equal(out[i].text, ref[i].text, ref[i].text_len);
            }
        }
        n_failed_steps += (unsigned)failures;
        if (!hit) {
            assert_int_equal(failures, 0);
            run_clean_request(s);
            llmi_session_free(s);
            break;
        }
        run_clean_request(s);
        llmi_session_free(s);
    }
    printf("# (d) steps: %llu allocation failure points (%u failed steps, %u requests ended "
           "with LLM_FINISH_ERROR), session usable after each\n",
           (unsigned long long)(n - 1), n_failed_steps, n_error_finishes);
    assert_true(n > 5);
}

/* ---- (e) token level ---- */

/* The scripted operations; stops at the first failure and returns it. */
static llm_status token_level_script(llm_session *s, llm_batch *b) {
    llm_seq_id a = -1, f = -1;
    const float *lg = NULL;
    LLMI_TRY(llmi_seq_open(s, NULL, &a));
    llmi_batch_clear(b);
    for (uint32_t i = 0; i < 20; i++)
        LLMI_TRY(llmi_batch_add(b, a, i, (llm_token)(i * 3 % 300), i == 19));
    LLMI_TRY(llmi_session_decode(s, b));
    LLMI_TRY(llmi_session_logits(s, 19, &lg));
    LLMI_TRY(llmi_seq_open(s, &a, &f));
    llm_seq_id more[3];
    for (int i = 0; i < 3; i++)
        LLMI_TRY(llmi_seq_open(s, NULL, &more[i]));
    llmi_batch_clear(b);
    for (uint32_t i = 0; i < 5; i++) {
        LLMI_TRY(llmi_batch_add(b, a, 20 + i, (llm_token)(i + 40), true));
        LLMI_TRY(llmi_batch_add(b, f, 20 + i, (llm_token)(i + 80), true));
        LLMI_TRY(llmi_batch_add(b, more[2], i, (llm_token)(i + 120), i == 4));
    }
    LLMI_TRY(llmi_session_decode(s, b));
    LLMI_TRY(llmi_session_logits(s, 14, &lg));
    LLMI_TRY(llmi_seq_truncate(s, f, 10));
    LLMI_TRY(llmi_seq_close(s, a));
    return LLM_OK;
}

static void close_all(llm_session *s) {
    for (size_t i = 0; i < s->n_seqs; i++)
        if (s->seqs[i])
            assert_int_equal(llmi_seq_close(s, (llm_seq_id)i), LLM_OK);
}

static void test_token_level(void **state) {
    (void)state;
    uint64_t n;
    for (n = 1; n < 100000; n++) {
        llm_session *s = fresh_session();
        llm_batch *b = NULL;
        arm(n);
        llm_status st = llmi_batch_create(32, &b);
        if (st == LLM_OK)
            st = token_level_script(s, b);
        bool hit = fired(n);
        if (st != LLM_OK) {
            assert_true(hit);
            expect_oom(st, "token-level call", n);
        }
        check_invariants(s);
        /* still usable: the script runs cleanly, then a request */
        close_all(s);
        llmi_batch_free(b);
        b = NULL;
        assert_int_equal(llmi_batch_create(32, &b), LLM_OK);
        if (token_level_script(s, b) != LLM_OK)
            fail_msg("clean script: %s", llmi_error_message());
        check_invariants(s);
        close_all(s);
        run_clean_request(s);
        llmi_batch_free(b);
        llmi_session_free(s);
        if (st == LLM_OK) {
            assert_false(hit);
            break;
        }
    }
    printf("# (e) token level: %llu allocation failure points, session usable after each\n",
           (unsigned long long)(n - 1));
    assert_true(n > 5);
}

/* ---- setup ---- */

static int setup(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.type = LLMI_T_Q8_0;
    p.n_ctx = 256;
    snprintf(g_path, sizeof g_path, "%s/faults-model.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp");
    if (llmi_testmodel_write(&p, g_path) != LLM_OK)
        return -1;
    return llmi_model_load(g_path, false, &g_model) == LLM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_model);
    remove(g_path);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_load),  cmocka_unit_test(test_session_create),
        cmocka_unit_test(test_submit),      cmocka_unit_test(test_steps),
        cmocka_unit_test(test_token_level),
    };
    if (getenv("LLM_TEST_FILTER"))
        cmocka_set_test_filter(getenv("LLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
