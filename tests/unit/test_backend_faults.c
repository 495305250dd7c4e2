/* Backend-failure sweeps. llmi_backend_fault_inject(N, status) makes the
 * N-th forward-pass call from now (create or run, of the target model or
 * the draft model) fail with `status` before it does anything. For
 * N = 1, 2, 3, ... until the operation finishes without reaching call N:
 *
 *  (a) session create, without and with a draft model, both statuses: the
 *      status comes back, *out is NULL, nothing leaks (LSan in make check);
 *  (b) llm_generate, plain (greedy and sampling), LLM_SPEC_NGRAM and
 *      LLM_SPEC_DRAFT (sampling):
 *      LLM_ERR_BACKEND, finish LLM_FINISH_ERROR, the tokens streamed before
 *      are a prefix of the fault-free run's; the same session then generates
 *      exactly the fault-free tokens;
 *  (c) request stepping, four requests at once (greedy; seeded sampling
 *      with logprobs sharing the first one's prefix; n-gram speculation;
 *      draft-model speculation with sampling) in a small token budget and
 *      a KV pool small enough for preemptions: a failed step returns the
 *      status and no events, the caller keeps stepping, and every request
 *      ends with exactly the fault-free tokens, log-probabilities, text and
 *      finish reason; llmi_sched_check (target and draft KV pools) after
 *      every step; every block free or cached at the end;
 *  (d) llm_session_decode: a failed decode leaves every sequence's length
 *      unchanged and its retry gives logits identical (memcmp) to the
 *      fault-free run's;
 *  (e) the interface itself: a backend plugged in through
 *      an engine on another backend table is used, and a backend that fails after
 *      computing (a device error at the end of a pass) changes no length.
 *
 * Sweeps (c) and (d) alternate LLM_ERR_BACKEND (odd N) and
 * LLM_ERR_OUT_OF_MEMORY (even N). Sweeps (b)-(d) run twice: with faults
 * before the pass does anything (llmi_backend_fault_inject) and with late
 * faults, after the backend wrote K/V and logits, as a device error seen at
 * the end of a pass (llmi_backend_fault_inject_late). Each sweep prints its
 * failure points.
 * Tiny random models (seeds 4242 and 777); fixed prompts and seeds. */
#include "sched_util.h"

#include "backend/backend.h"

static llm_model *g_target, *g_draft;

enum { N_CTX = 256, BLOCK = 8, POOL_STEPS = 5 };

/* Late faults: a failing run fails after the backend ran (K/V and logits
 * written), like a device error reported at the end of a pass. */
static bool g_late;
static const char *mode_name(void) { return g_late ? "late" : "early"; }

/* Arms the fault: the n-th backend call from now fails with `st`. */
static void arm(uint64_t n, llm_status st) {
    if (g_late)
        llmi_backend_fault_inject_late(n, st);
    else
        llmi_backend_fault_inject(n, st);
}
/* Disarms; true when call n was reached (so it failed). */
static bool fired(uint64_t n) {
    bool hit = llmi_backend_fault_calls() >= n;
    llmi_backend_fault_inject(0, LLM_OK);
    return hit;
}
static llm_status status_for(uint64_t n) {
    return n % 2 ? LLM_ERR_BACKEND : LLM_ERR_OUT_OF_MEMORY;
}

static void expect_injected(llm_status st, llm_status want, const char *what, uint64_t n) {
    if (st != want)
        fail_msg("%s, backend call %llu failing: status %s (%s), want %s", what,
                 (unsigned long long)n, llm_status_name(st), llmi_error_message(),
                 llm_status_name(want));
    if (!strstr(llmi_error_message(), "injected backend fault"))
        fail_msg("%s, backend call %llu failing: message '%s'", what, (unsigned long long)n,
                 llmi_error_message());
}

static llm_session_params session_params(bool draft, uint32_t max_batch, uint32_t n_blocks) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = N_CTX;
    p.max_batch_tokens = max_batch;
    p.kv_block_size = BLOCK;
    p.prefix_cache = true;
    p.draft_model = draft ? g_draft : NULL;
    p.kv_cache_bytes =
        (uint64_t)n_blocks * llmi_kv_block_bytes(g_target->hp.n_layer,
                                                 g_target->hp.n_head_kv * g_target->hp.head_dim,
                                                 BLOCK);
    return p;
}

static llm_session *make_session(bool draft, uint32_t max_batch, uint32_t n_blocks) {
    llm_session_params p = session_params(draft, max_batch, n_blocks);
    llm_session *s = NULL;
    if (llmi_session_create(g_target, &p, &s) != LLM_OK)
        fail_msg("session: %s", llmi_error_message());
    return s;
}

static bool idle(llm_session *s) {
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    return st.n_running == 0 && st.n_waiting == 0;
}

/* Every block of both pools free or cached; then, with the prefix caches
 * cleared, every block free. */
static void expect_pools_idle(llm_session *s) {
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    assert_int_equal(st.blocks_used, 0);
    llmi_kv_prefix_clear(s->kv);
    assert_int_equal(s->kv->n_free, s->kv->n_blocks);
    if (s->spec.dkv) {
        llmi_kv_prefix_clear(s->spec.dkv);
        assert_int_equal(s->spec.dkv->n_free, s->spec.dkv->n_blocks);
    }
    check_invariants(s);
}

/* ---- (a) session create ---- */

static void sweep_create(bool draft, llm_status status) {
    llm_session_params p = session_params(draft, 16, 32);
    uint64_t n;
    for (n = 1; n < 1000; n++) {
        llm_session *s = (llm_session *)0x1;
        arm(n, status);
        llm_status st = llmi_session_create(g_target, &p, &s);
        bool hit = fired(n);
        if (st == LLM_OK) {
            assert_false(hit);
            assert_non_null(s);
            llmi_session_free(s);
            break;
        }
        assert_true(hit);
        expect_injected(st, status, "session create", n);
        assert_null(s);
    }
    printf("# (a) session create, %s, %s: %llu backend failure points, each clean\n",
           draft ? "with a draft model" : "no draft model", llm_status_name(status),
           (unsigned long long)(n - 1));
    assert_int_equal(n - 1, draft ? 2 : 1); /* the target's forward pass, the draft's */
}

static void test_session_create(void **state) {
    (void)state;
    sweep_create(false, LLM_ERR_BACKEND);
    sweep_create(false, LLM_ERR_OUT_OF_MEMORY);
    sweep_create(true, LLM_ERR_BACKEND);
    sweep_create(true, LLM_ERR_OUT_OF_MEMORY);
}

/* ---- (b) llm_generate ---- */

typedef struct gen_out {
    llm_token toks[MAX_OUT];
    uint32_t n;
    char text[4096];
    size_t text_len;
    llm_generate_result res;
} gen_out;

static bool collect(llm_token tok, const char *piece, size_t len, void *user) {
    gen_out *o = user;
    if (tok != LLM_TOKEN_NONE) {
        assert_true(o->n < MAX_OUT);
        o->toks[o->n++] = tok;
    }
    assert_true(o->text_len + len < sizeof o->text);
    memcpy(o->text + o->text_len, piece, len);
    o->text_len += len;
    return true;
}

typedef struct gen_case {
    const char *name;
    uint32_t mode, k;
    bool sampled;
} gen_case;

static llm_status generate(llm_session *s, const gen_case *c, const llm_token *prompt,
                           uint32_t n_prompt, gen_out *out) {
    memset(out, 0, sizeof *out);
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.temperature = 0.9f;
    sp.seed = 1234;
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 12;
    gp.ignore_eos = true;
    gp.sampling = c->sampled ? &sp : NULL;
    gp.on_token = collect;
    gp.user = out;
    gp.spec_mode = c->mode;
    gp.spec_k = c->k;
    out->res.struct_size = sizeof out->res;
    return llmi_session_generate(s, prompt, n_prompt, &gp, &out->res);
}

static void expect_same_gen(const gen_out *a, const gen_out *ref, const char *what, uint64_t n) {
    if (a->n != ref->n || memcmp(a->toks, ref->toks, a->n * sizeof a->toks[0]) != 0)
        fail_msg("%s (backend call %llu failed before): %u tokens, want %u, or other tokens",
                 what, (unsigned long long)n, a->n, ref->n);
    assert_int_equal(a->res.finish_reason, ref->res.finish_reason);
    assert_int_equal(a->text_len, ref->text_len);
    assert_memory_equal(a->text, ref->text, a->text_len);
}

static void sweep_generate(void) {
    static const gen_case cases[] = {
        {"plain", LLM_SPEC_NONE, 0, false},
        {"plain sampling", LLM_SPEC_NONE, 0, true},
        {"n-gram", LLM_SPEC_NGRAM, 0, false},
        {"draft model, sampling", LLM_SPEC_DRAFT, 2, true},
    };
    llm_token prompt[24];
    uint64_t rng = 99;
    random_prompt(prompt, 12, llmi_testmodel_n_vocab(), &rng);
    memcpy(prompt + 12, prompt, 12 * sizeof *prompt); /* repeats: n-gram matches */
    llm_session *s = make_session(true, 16, 64);
    static gen_out ref, out, again;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const gen_case *gc = &cases[c];
        if (generate(s, gc, prompt, 24, &ref) != LLM_OK)
            fail_msg("%s: %s", gc->name, llmi_error_message());
        assert_int_equal(ref.n, 12);
        uint64_t n;
        for (n = 1; n < 10000; n++) {
            arm(n, LLM_ERR_BACKEND);
            llm_status st = generate(s, gc, prompt, 24, &out);
            bool hit = fired(n);
            if (!hit) {
                assert_int_equal(st, LLM_OK);
                expect_same_gen(&out, &ref, gc->name, n);
                break;
            }
            expect_injected(st, LLM_ERR_BACKEND, gc->name, n);
            assert_int_equal(out.res.finish_reason, LLM_FINISH_ERROR);
            /* what it streamed before the failure is the fault-free start */
            assert_true(out.n <= ref.n);
            assert_memory_equal(out.toks, ref.toks, out.n * sizeof(llm_token));
            check_invariants(s);
            /* the session still works, and gives exactly the same tokens */
            if (generate(s, gc, prompt, 24, &again) != LLM_OK)
                fail_msg("%s after a failure: %s", gc->name, llmi_error_message());
            expect_same_gen(&again, &ref, gc->name, n);
        }
        printf("# (b) llm_generate, %s, %s faults: %llu backend failure points (%u spec "
               "steps), session usable after each\n",
               gc->name, mode_name(), (unsigned long long)(n - 1), ref.res.n_spec_steps);
        assert_true(n > 3);
    }
    llmi_session_free(s);
}

/* ---- (c) request stepping ---- */

enum { N_REQ = 4 };

typedef struct req_set {
    llm_token prompt[N_REQ][32];
    uint32_t n_prompt[N_REQ];
} req_set;

static void make_reqs(req_set *rs) {
    uint64_t rng = 4711;
    /* 0: greedy, 20 tokens */
    random_prompt(rs->prompt[0], 20, llmi_testmodel_n_vocab(), &rng);
    rs->n_prompt[0] = 20;
    /* 1: seeded sampling, its first 16 tokens those of 0 (two blocks to share) */
    memcpy(rs->prompt[1], rs->prompt[0], 16 * sizeof(llm_token));
    random_prompt(rs->prompt[1] + 16, 3, llmi_testmodel_n_vocab(), &rng);
    rs->n_prompt[1] = 19;
    /* 2: n-gram speculation on a prompt that repeats itself */
    random_prompt(rs->prompt[2], 12, llmi_testmodel_n_vocab(), &rng);
    memcpy(rs->prompt[2] + 12, rs->prompt[2], 12 * sizeof(llm_token));
    rs->n_prompt[2] = 24;
    /* 3: draft-model speculation with sampling */
    random_prompt(rs->prompt[3], 17, llmi_testmodel_n_vocab(), &rng);
    rs->n_prompt[3] = 17;
}

static void submit_reqs(llm_session *s, const req_set *rs, outcome *out) {
    memset(out, 0, N_REQ * sizeof *out);
    for (int i = 0; i < N_REQ; i++) {
        llm_sampling_params sp;
        llm_sampling_params_init(&sp);
        sp.temperature = 0.9f;
        sp.seed = 100u + (uint64_t)i;
        llm_request_params p;
        llm_request_params_init(&p);
        p.max_new_tokens = i == 2 ? 14 : 10;
        p.ignore_eos = true;
        p.logprobs = true;
        p.sampling = i == 1 || i == 3 ? &sp : NULL;
        p.spec_mode = i == 2 ? LLM_SPEC_NGRAM : i == 3 ? LLM_SPEC_DRAFT : LLM_SPEC_NONE;
        /* Fixed k: an adaptive draft model may switch itself off, which
         * would make a sampling request's tokens depend on timing; and
         * with no adaptive choice the backend calls of a run do not depend
         * on timing either, so the sweep reaches every call of the
         * fault-free run. */
        p.spec_k = i == 3 ? 2 : i == 2 ? 4 : 0;
        if (llmi_session_submit(s, rs->prompt[i], rs->n_prompt[i], &p, &out[i].id) != LLM_OK)
            fail_msg("submit: %s", llmi_error_message());
    }
}

/* One step; applies its events. Returns the step's status. */
static llm_status step_events(llm_session *s, outcome *outs, size_t *n_ev) {
    llm_event ev[64];
    size_t n = 0;
    llm_status st = llmi_session_step(s, ev, 64, sizeof ev[0], &n);
    *n_ev = n;
    if (st != LLM_OK) {
        assert_int_equal(n, 0); /* a failed step delivers nothing */
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        outcome *o = find_outcome(outs, N_REQ, ev[i].request);
        if (o->n_finish_events != 0)
            fail_msg("event for request %llu after its finish", (unsigned long long)o->id);
        if (ev[i].token != LLM_TOKEN_NONE) {
            assert_true(o->n < MAX_OUT);
            o->logprobs[o->n] = ev[i].logprob;
            o->toks[o->n++] = ev[i].token;
        }
        assert_true(o->text_len + ev[i].text_len < sizeof o->text);
        memcpy(o->text + o->text_len, ev[i].text, ev[i].text_len);
        o->text_len += ev[i].text_len;
        if (ev[i].finish_reason != LLM_FINISH_NONE) {
            o->finish = ev[i].finish_reason;
            o->n_finish_events++;
            if (ev[i].finish_reason == LLM_FINISH_ERROR)
                fail_msg("request %llu ended with an error (%s)", (unsigned long long)o->id,
                         llm_status_name(ev[i].status));
        }
    }
    return LLM_OK;
}

/* Runs the four requests to the end with backend call n failing (0 =
 * none). Returns the failed steps. */
static int run_reqs(llm_session *s, const req_set *rs, uint64_t n, outcome *out) {
    submit_reqs(s, rs, out);
    llm_status want = status_for(n);
    int failures = 0;
    arm(n, want); /* n = 0: off, and the call count starts here too */
    for (int guard = 0; guard < 10000; guard++) {
        size_t k = 0;
        llm_status st = step_events(s, out, &k);
        if (st != LLM_OK) {
            expect_injected(st, want, "step", n);
            failures++;
        }
        check_invariants(s); /* no backend calls */
        if (st == LLM_OK && k == 0 && idle(s)) return failures;
    }
    fail_msg("requests never finished (backend call %llu failing)", (unsigned long long)n);
    return failures;
}

static void expect_same_outcomes(const outcome *a, const outcome *ref, uint64_t n) {
    for (int i = 0; i < N_REQ; i++) {
        if (a[i].n != ref[i].n || memcmp(a[i].toks, ref[i].toks, a[i].n * sizeof(llm_token)))
            fail_msg("request %d, backend call %llu failing: %u tokens, want %u, or other "
                     "tokens",
                     i, (unsigned long long)n, a[i].n, ref[i].n);
        assert_memory_equal(a[i].logprobs, ref[i].logprobs, a[i].n * sizeof(float));
        assert_int_equal(a[i].n_finish_events, 1);
        assert_int_equal(a[i].finish, ref[i].finish);
        assert_int_equal(a[i].text_len, ref[i].text_len);
        assert_memory_equal(a[i].text, ref[i].text, a[i].text_len);
    }
}

static void sweep_steps(void) {
    static req_set rs;
    static outcome ref[N_REQ], out[N_REQ];
    make_reqs(&rs);
    /* A budget of 12 tokens: chunked prefills, drafts squeezed; a pool of 5
     * blocks of 8 tokens: preemptions, and recomputation from the prefix
     * cache. */
    llm_session *s = make_session(true, 12, POOL_STEPS);
    assert_int_equal(run_reqs(s, &rs, 0, ref), 0);
    uint64_t calls = llmi_backend_fault_calls();
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    expect_pools_idle(s);
    llmi_session_free(s);
    printf("# (c) ref: %u %u %u %u tokens, %llu steps, %llu backend calls, %llu prefix hit "
           "tokens, %llu preemptions, %llu drafted, %llu accepted\n",
           ref[0].n, ref[1].n, ref[2].n, ref[3].n, (unsigned long long)st.steps,
           (unsigned long long)calls, (unsigned long long)st.prefix_hit_tokens,
           (unsigned long long)st.preemptions, (unsigned long long)st.spec_draft_tokens,
           (unsigned long long)st.spec_accepted_tokens);
    for (int i = 0; i < N_REQ; i++) assert_int_equal(ref[i].finish, LLM_FINISH_LENGTH);
    assert_true(st.prefix_hit_tokens > 0);
    assert_true(st.preemptions > 0);
    assert_true(st.spec_draft_tokens > 0);

    uint64_t n;
    unsigned failed_steps = 0;
    for (n = 1; n < 100000; n++) {
        s = make_session(true, 12, POOL_STEPS);
        int failures = run_reqs(s, &rs, n, out);
        bool hit = fired(n);
        expect_same_outcomes(out, ref, n);
        assert_int_equal(failures, hit ? 1 : 0);
        failed_steps += (unsigned)failures;
        expect_pools_idle(s);
        llmi_session_free(s);
        if (!hit) break;
    }
    printf("# (c) steps, %s faults: %llu backend failure points (%u failed steps), every "
           "request exact after each\n",
           mode_name(), (unsigned long long)(n - 1), failed_steps);
    assert_int_equal(n - 1, calls);
}

/* ---- (d) token level ---- */

enum { N_DECODES = 3, MAX_LOGIT_ROWS = 16 };

typedef struct decode_log {
    uint32_t n_rows[N_DECODES];
    float *logits[N_DECODES]; /* [MAX_LOGIT_ROWS][n_vocab] each */
} decode_log;

/* A batch being filled, with its want-logits flags. */
typedef struct batch_fill {
    llm_batch *bt;
    uint32_t n;
    bool want[32];
} batch_fill;

static void add_row(batch_fill *bf, llm_seq_id seq, uint32_t pos, llm_token tok, bool want) {
    assert_true(bf->n < 32);
    assert_int_equal(llmi_batch_add(bf->bt, seq, pos, tok, want), LLM_OK);
    bf->want[bf->n++] = want;
}

/* The batch of decode d over sequences a, b, c (c forked from a after the
 * first decode). Rows stay within max_batch_tokens (one forward pass). */
static void fill_batch(batch_fill *bf, int d, const llm_seq_id *id) {
    llmi_batch_clear(bf->bt);
    bf->n = 0;
    if (d == 0) {
        for (uint32_t i = 0; i < 10; i++) add_row(bf, id[0], i, (llm_token)(i * 7 % 250 + 3), i == 9);
        for (uint32_t i = 0; i < 5; i++) add_row(bf, id[1], i, (llm_token)(i * 11 % 250 + 5), true);
    } else if (d == 1) {
        add_row(bf, id[0], 10, 42, true);
        add_row(bf, id[1], 5, 43, true);
        add_row(bf, id[2], 10, 44, true);
        add_row(bf, id[2], 11, 45, true);
    } else {
        for (uint32_t i = 0; i < 3; i++) add_row(bf, id[2], 12 + i, (llm_token)(60 + i), i == 2);
        add_row(bf, id[0], 11, 46, true);
        add_row(bf, id[1], 6, 47, false);
    }
}

static void seq_lengths(llm_session *s, const llm_seq_id *id, int n_ids, uint32_t *len) {
    for (int i = 0; i < n_ids; i++) assert_int_equal(llmi_seq_length(s, id[i], &len[i]), LLM_OK);
}

/* The script, retrying a decode that fails; the logits of every decode go
 * to `log`. Returns the failed decodes. */
static int decode_script(llm_session *s, llm_batch *bt, uint64_t n, decode_log *log) {
    uint32_t V = g_target->hp.n_vocab;
    batch_fill bf = {bt, 0, {0}};
    llm_seq_id id[3] = {-1, -1, -1};
    int n_ids = 2, failures = 0;
    assert_int_equal(llmi_seq_open(s, NULL, &id[0]), LLM_OK);
    assert_int_equal(llmi_seq_open(s, NULL, &id[1]), LLM_OK);
    for (int d = 0; d < N_DECODES; d++) {
        if (d == 1) {
            assert_int_equal(llmi_seq_open(s, &id[0], &id[2]), LLM_OK);
            n_ids = 3;
        }
        fill_batch(&bf, d, id);
        uint32_t before[3], after[3];
        seq_lengths(s, id, n_ids, before);
        llm_status st = llmi_session_decode(s, bt);
        if (st != LLM_OK) {
            expect_injected(st, status_for(n), "decode", n);
            failures++;
            seq_lengths(s, id, n_ids, after);
            assert_memory_equal(after, before, (size_t)n_ids * sizeof before[0]);
            const float *lg = NULL;
            assert_int_not_equal(llmi_session_logits(s, 0, &lg), LLM_OK); /* none */
            check_invariants(s);
            st = llmi_session_decode(s, bt); /* the retry */
        }
        if (st != LLM_OK) fail_msg("decode %d: %s", d, llmi_error_message());
        uint32_t k = 0;
        for (uint32_t r = 0; r < bf.n; r++) {
            if (!bf.want[r]) continue;
            const float *lg = NULL;
            assert_int_equal(llmi_session_logits(s, r, &lg), LLM_OK);
            assert_true(k < MAX_LOGIT_ROWS);
            memcpy(log->logits[d] + (size_t)k++ * V, lg, V * sizeof *lg);
        }
        log->n_rows[d] = k;
        check_invariants(s);
    }
    for (int i = 0; i < n_ids; i++) assert_int_equal(llmi_seq_close(s, id[i]), LLM_OK);
    return failures;
}

static void decode_log_init(decode_log *log) {
    for (int d = 0; d < N_DECODES; d++) {
        log->logits[d] = calloc((size_t)MAX_LOGIT_ROWS * g_target->hp.n_vocab, sizeof(float));
        assert_non_null(log->logits[d]);
    }
}

static void decode_log_free(decode_log *log) {
    for (int d = 0; d < N_DECODES; d++) free(log->logits[d]);
}

static void sweep_decode(void) {
    uint32_t V = g_target->hp.n_vocab;
    decode_log ref, got;
    decode_log_init(&ref);
    decode_log_init(&got);
    llm_batch *bt = NULL;
    assert_int_equal(llmi_batch_create(32, &bt), LLM_OK);
    llm_session *s = make_session(false, 16, 32);
    assert_int_equal(decode_script(s, bt, 0, &ref), 0);
    llmi_session_free(s);
    uint64_t n;
    unsigned failed = 0;
    for (n = 1; n < 1000; n++) {
        s = make_session(false, 16, 32);
        arm(n, status_for(n));
        int failures = decode_script(s, bt, n, &got);
        bool hit = fired(n);
        assert_int_equal(failures, hit ? 1 : 0);
        failed += (unsigned)failures;
        for (int d = 0; d < N_DECODES; d++) {
            assert_int_equal(got.n_rows[d], ref.n_rows[d]);
            if (memcmp(got.logits[d], ref.logits[d], (size_t)ref.n_rows[d] * V * sizeof(float)))
                fail_msg("decode %d, backend call %llu failing: logits differ", d,
                         (unsigned long long)n);
        }
        expect_pools_idle(s);
        llmi_session_free(s);
        if (!hit) break;
    }
    printf("# (d) decode, %s faults: %llu backend failure points (%u failed decodes), "
           "lengths unchanged and retries exact\n",
           mode_name(), (unsigned long long)(n - 1), failed);
    assert_int_equal(n - 1, N_DECODES);
    llmi_batch_free(bt);
    decode_log_free(&ref);
    decode_log_free(&got);
}

/* Each sweep with early and with late faults. */
static void test_generate(void **state) {
    (void)state;
    for (int late = 0; late < 2; late++) {
        g_late = late;
        sweep_generate();
    }
    g_late = false;
}

static void test_steps(void **state) {
    (void)state;
    for (int late = 0; late < 2; late++) {
        g_late = late;
        sweep_steps();
    }
    g_late = false;
}

static void test_decode(void **state) {
    (void)state;
    for (int late = 0; late < 2; late++) {
        g_late = late;
        sweep_decode();
    }
    g_late = false;
}

/* A batch larger than max_batch_tokens runs as several forward passes.
 * llm.h promises that a decode applies all rows or none: a failure in a
 * later pass rolls back the sequences the earlier passes extended. */
static void test_decode_chunks(void **state) {
    (void)state;
    uint32_t V = g_target->hp.n_vocab;
    llm_batch *bt = NULL;
    assert_int_equal(llmi_batch_create(64, &bt), LLM_OK);
    float *ref = calloc(2 * (size_t)V, sizeof(float));
    assert_non_null(ref);
    uint64_t n;
    for (n = 0; n < 100; n++) { /* n = 0: the fault-free reference */
        llm_session *s = make_session(false, 16, 32);
        llm_seq_id a = -1, b = -1;
        assert_int_equal(llmi_seq_open(s, NULL, &a), LLM_OK);
        assert_int_equal(llmi_seq_open(s, NULL, &b), LLM_OK);
        llmi_batch_clear(bt);
        for (uint32_t i = 0; i < 20; i++) { /* 40 rows: three passes of 16 */
            assert_int_equal(llmi_batch_add(bt, a, i, (llm_token)(i + 9), i == 19), LLM_OK);
            assert_int_equal(llmi_batch_add(bt, b, i, (llm_token)(i + 90), i == 19), LLM_OK);
        }
        if (n) arm(n, LLM_ERR_BACKEND);
        llm_status st = llmi_session_decode(s, bt);
        bool hit = n && fired(n);
        if (st != LLM_OK) {
            assert_true(hit);
            expect_injected(st, LLM_ERR_BACKEND, "chunked decode", n);
            uint32_t la = 99, lb = 99;
            assert_int_equal(llmi_seq_length(s, a, &la), LLM_OK);
            assert_int_equal(llmi_seq_length(s, b, &lb), LLM_OK);
            if (la != 0 || lb != 0)
                fail_msg("backend call %llu failing: a failed decode left lengths %u and %u",
                         (unsigned long long)n, la, lb);
            check_invariants(s);
            st = llmi_session_decode(s, bt);
            if (st != LLM_OK) fail_msg("retry: %s", llmi_error_message());
        }
        assert_int_equal(st, LLM_OK);
        for (uint32_t j = 0; j < 2; j++) {
            const float *lg = NULL;
            assert_int_equal(llmi_session_logits(s, 38 + j, &lg), LLM_OK);
            if (n == 0)
                memcpy(ref + (size_t)j * V, lg, V * sizeof *lg);
            else
                assert_memory_equal(lg, ref + (size_t)j * V, V * sizeof *lg);
        }
        llmi_session_free(s);
        if (n && !hit) break;
    }
    printf("# chunked decode: %llu backend failure points\n", (unsigned long long)(n - 1));
    assert_int_equal(n - 1, 3);
    free(ref);
    llmi_batch_free(bt);
}

/* ---- (e) the interface ---- */

static unsigned g_runs, g_loads, g_unloads;
static bool g_fail_after_run;

/* The CPU step, then (optionally) a failure as if the device reported an
 * error at the very end: K/V and logits are written, and still no length
 * may move. */
static llm_status wrap_run(void *step, void *kv, const llmi_step *st, float *logits) {
    g_runs++;
    LLMI_TRY(llmi_backend_cpu.step_run(step, kv, st, logits));
    if (g_fail_after_run) return llmi_error(LLM_ERR_BACKEND, "device lost (test)");
    return LLM_OK;
}

static llm_status wrap_weights_load(const llm_model *m, int32_t device, void **out) {
    g_loads++;
    return llmi_backend_cpu.weights_load(m, device, out);
}

static void wrap_weights_free(void *w) {
    g_unloads++;
    llmi_backend_cpu.weights_free(w);
}

static llmi_backend_ops wrapped_ops(void) {
    llmi_backend_ops ops = llmi_backend_cpu;
    ops.name = "wrapped-cpu";
    ops.step_run = wrap_run;
    ops.weights_load = wrap_weights_load;
    ops.weights_free = wrap_weights_free;
    ops.step_set_f32_activations = NULL; /* optional */
    return ops;
}

static llmi_engine *wrapped_engine(const llmi_backend_ops *ops, llm_session *s) {
    llmi_engine_config cfg = {.model = g_target,
                              .ops = ops,
                              .backend = s->eng->backend,
                              .kv_block_size = 16,
                              .kv_blocks = 4,
                              .kv_type = LLM_KV_F32,
                              .max_rows = 16,
                              .max_ctx = N_CTX};
    llmi_engine *e = NULL;
    assert_int_equal(llmi_engine_create(&cfg, &e), LLM_OK);
    return e;
}

static void test_interface(void **state) {
    (void)state;
    uint32_t V = g_target->hp.n_vocab;
    llm_session *s = make_session(false, 16, 32);
    assert_string_equal(s->eng->ops->name, "cpu");
    const llmi_backend_ops wrapped = wrapped_ops();
    g_loads = g_unloads = 0;
    llmi_engine *f = wrapped_engine(&wrapped, s);
    llmi_engine *f2 = wrapped_engine(&wrapped, s); /* the weights are shared */
    assert_int_equal(g_loads, 1);
    llmi_engine_free(f2);
    assert_int_equal(g_unloads, 0);
    assert_ptr_equal(f->ops, &wrapped);
    llmi_engine_set_f32_activations(f, false); /* NULL op: ignored */
    llmi_kv_seq sa = {0}, sb = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &sa, 12), LLM_OK);
    assert_int_equal(llmi_kv_seq_reserve(f->kv, &sb, 12), LLM_OK);
    llmi_batch_row ra[12], rb[12];
    for (uint32_t i = 0; i < 12; i++) {
        ra[i] = (llmi_batch_row){(llm_token)(i * 5 + 1), i, &sa, i == 11};
        rb[i] = (llmi_batch_row){(llm_token)(i * 5 + 1), i, &sb, i == 11};
    }
    float *la = calloc(V, sizeof(float)), *lb = calloc(V, sizeof(float));
    assert_non_null(la);
    assert_non_null(lb);
    /* A step that fails at its end changes no length; the retry is exact. */
    g_runs = 0;
    g_fail_after_run = true;
    assert_int_equal(llmi_engine_run(f, rb, 12, lb), LLM_ERR_BACKEND);
    assert_int_equal(sb.n_tokens, 0);
    g_fail_after_run = false;
    assert_int_equal(llmi_engine_run(f, rb, 12, lb), LLM_OK);
    assert_int_equal(sb.n_tokens, 12);
    assert_int_equal(g_runs, 2);
    assert_int_equal(llmi_engine_run(s->eng, ra, 12, la), LLM_OK);
    assert_int_equal(sa.n_tokens, 12);
    assert_memory_equal(la, lb, V * sizeof(float)); /* the same backend underneath */
    /* Rows are checked before any backend sees them. */
    ra[0].token = (llm_token)V;
    assert_int_equal(llmi_engine_run(f, ra, 1, la), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(g_runs, 2);
    llmi_kv_seq_destroy(s->kv, &sa);
    llmi_kv_seq_destroy(f->kv, &sb);
    llmi_engine_free(f);
    assert_int_equal(g_unloads, 1);
    llmi_engine_free(NULL);
    free(la);
    free(lb);
    llmi_session_free(s);
}

/* The registry: by name, in order, versions and required entries checked. */
static void test_registry(void **state) {
    (void)state;
    const llmi_backend_ops *list[LLMI_BACKEND_MAX];
    assert_int_equal(llmi_backend_list(list, LLMI_BACKEND_MAX), 1);
    assert_ptr_equal(list[0], &llmi_backend_cpu);
    assert_ptr_equal(llmi_backend_find("cpu"), &llmi_backend_cpu);
    assert_null(llmi_backend_find("wrapped-cpu"));
    assert_null(llmi_backend_find(NULL));
    static llmi_backend_ops ops;
    ops = wrapped_ops();
    assert_int_equal(llmi_backend_register(&ops), LLM_OK);
    assert_ptr_equal(llmi_backend_find("wrapped-cpu"), &ops);
    assert_int_equal(llmi_backend_list(list, 1), 2); /* the count, even past cap */
    assert_ptr_equal(list[0], &llmi_backend_cpu);
    llmi_backend_ops bad = ops;
    bad.version = 0;
    assert_int_equal(llmi_backend_register(&bad), LLM_ERR_UNSUPPORTED);
    bad.version = LLMI_BACKEND_VERSION + 1;
    assert_int_equal(llmi_backend_register(&bad), LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(llm_last_error(), "interface version"));
    bad = ops;
    bad.step_run = NULL;
    assert_int_equal(llmi_backend_register(&bad), LLM_ERR_INVALID_ARGUMENT);
    bad = ops;
    bad.name = NULL;
    assert_int_equal(llmi_backend_register(&bad), LLM_ERR_INVALID_ARGUMENT);
    bad = ops;
    bad.step_set_f32_activations = NULL; /* optional */
    bad.probe = NULL;
    assert_int_equal(llmi_backend_register(&bad), LLM_OK); /* replaces by name */
    assert_ptr_equal(llmi_backend_find("wrapped-cpu"), &bad);
    llmi_backend_unregister("wrapped-cpu");
    llmi_backend_unregister("cpu"); /* never */
    llmi_backend_unregister("absent");
    assert_int_equal(llmi_backend_list(list, LLMI_BACKEND_MAX), 1);
    assert_ptr_equal(llmi_backend_find("cpu"), &llmi_backend_cpu);
}

/* ---- setup ---- */

static int setup(void **state) {
    (void)state;
    g_target = tiny_model(1024, 4242);
    g_draft = tiny_model(1024, 777);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_backend_fault_inject(0, LLM_OK);
    llmi_model_free(g_target);
    llmi_model_free(g_draft);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_session_create), cmocka_unit_test(test_generate),
        cmocka_unit_test(test_steps),          cmocka_unit_test(test_decode),
        cmocka_unit_test(test_decode_chunks),  cmocka_unit_test(test_interface),
        cmocka_unit_test(test_registry),
    };
    if (getenv("LLM_TEST_FILTER")) cmocka_set_test_filter(getenv("LLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
