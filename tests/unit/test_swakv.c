/* Sliding windows give back KV blocks: for a model whose every layer is
 * windowed (a Llama file with attention.sliding_window), the scheduler
 * releases each request's blocks that lie wholly before its window. The
 * same requests run in a session that keeps every block (the scheduler's
 * swa_release off) must give bit-identical tokens and log-probabilities
 * (plain, sampled, several samples, prompt-lookup speculation), while the
 * releasing session holds at most ceil((window + k) / block_size) + 1
 * blocks per sequence (k: the draft length) and its invariants hold after
 * every step. The engine refuses a row whose window reaches a released
 * block; token-level sequences keep all their blocks. */
#include "sched_util.h"

enum { WINDOW = 6, BLOCK = 4, N_CTX = 256, MAX_SAMPLES = 3, MAX_REQS = 2 };

static llm_model *g_model;

static llm_model *windowed_model(uint64_t seed) {
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_ctx = N_CTX;
    p.seed = seed;
    p.type = LLMI_T_Q8_0;
    p.sliding_window = WINDOW;
    return model_from_params(&p, "swakv");
}

/* What one run gave: per request and sample, tokens and log-probabilities;
 * the most blocks in use after any step, and whether KV usage ever fell
 * while requests were running. */
typedef struct run_result {
    outcome out[MAX_REQS][MAX_SAMPLES];
    uint32_t max_blocks_used;
    bool usage_fell;
    uint64_t spec_draft_tokens, spec_accepted_tokens;
} run_result;

static void run(bool release, const llm_request_params *params, uint32_t n_reqs,
                uint32_t bound_per_seq, run_result *res) {
    memset(res, 0, sizeof *res);
    llm_session *s = new_session(g_model, 2, N_CTX, 64, BLOCK, 0, true);
    s->sched.swa_release = release;
    llm_request_id ids[MAX_REQS];
    llm_token prompt[MAX_REQS][20];
    uint64_t rng = 77;
    for (uint32_t r = 0; r < n_reqs; r++) {
        random_prompt(prompt[r], 20, g_model->hp.n_vocab, &rng);
        if (llmi_session_submit(s, prompt[r], 20, &params[r], &ids[r]) != LLM_OK)
            fail_msg("submit: %s", llmi_error_message());
    }
    uint64_t last_tokens_used = 0;
    for (int guard = 0; guard < 10000; guard++) {
        llm_event ev[64];
        size_t n = 0;
        if (llmi_session_step(s, ev, 64, sizeof ev[0], &n) != LLM_OK)
            fail_msg("step: %s", llmi_error_message());
        for (size_t i = 0; i < n; i++) {
            uint32_t r = 0;
            while (r < n_reqs && ids[r] != ev[i].request)
                r++;
            assert_true(r < n_reqs && ev[i].sample_index < MAX_SAMPLES);
            outcome *o = &res->out[r][ev[i].sample_index];
            if (ev[i].token != LLM_TOKEN_NONE) {
                assert_true(o->n < MAX_OUT);
                o->logprobs[o->n] = ev[i].logprob;
                o->toks[o->n++] = ev[i].token;
            }
            if (ev[i].finish_reason != LLM_FINISH_NONE) {
                o->finish = ev[i].finish_reason;
                o->n_finish_events++;
            }
        }
        check_invariants(s);
        llm_session_stats st = {sizeof st};
        llmi_session_stats(s, &st);
        if (st.blocks_used > res->max_blocks_used)
            res->max_blocks_used = st.blocks_used;
        uint32_t n_seqs = st.n_running + st.n_waiting;
        if (release && n_seqs && st.blocks_used > n_seqs * bound_per_seq)
            fail_msg("step %d: %u blocks in use for %u sequences, bound %u each", guard,
                     st.blocks_used, n_seqs, bound_per_seq);
        if (st.n_running && st.kv_tokens_used < last_tokens_used)
            res->usage_fell = true;
        last_tokens_used = st.kv_tokens_used;
        res->spec_draft_tokens = st.spec_draft_tokens;
        res->spec_accepted_tokens = st.spec_accepted_tokens;
        if (n == 0 && st.n_running == 0 && st.n_waiting == 0)
            break;
    }
    llmi_session_free(s);
}

static void expect_identical(const run_result *a, const run_result *b, uint32_t n_reqs,
                             uint32_t n_samples) {
    for (uint32_t r = 0; r < n_reqs; r++)
        for (uint32_t k = 0; k < n_samples; k++) {
            const outcome *x = &a->out[r][k], *y = &b->out[r][k];
            assert_int_equal(x->n_finish_events, 1);
            assert_int_equal(y->n_finish_events, 1);
            assert_int_equal(x->n, y->n);
            assert_true(x->n > 100);
            for (uint32_t i = 0; i < x->n; i++) {
                if (x->toks[i] != y->toks[i])
                    fail_msg("request %u sample %u token %u: %d with release, %d without", r, k, i,
                             x->toks[i], y->toks[i]);
                if (memcmp(&x->logprobs[i], &y->logprobs[i], sizeof(float)) != 0)
                    fail_msg("request %u sample %u token %u: logprob %.9g with release, %.9g "
                             "without",
                             r, k, i, (double)x->logprobs[i], (double)y->logprobs[i]);
            }
        }
}

static uint32_t bound(uint32_t k) { return (WINDOW + k + BLOCK - 1) / BLOCK + 1; }

static void compare(const llm_request_params *params, uint32_t n_reqs, uint32_t n_samples,
                    uint32_t k) {
    run_result *with = llmi_calloc(1, sizeof *with), *without = llmi_calloc(1, sizeof *without);
    assert_non_null(with);
    assert_non_null(without);
    run(true, params, n_reqs, bound(k), with);
    run(false, params, n_reqs, 0, without);
    expect_identical(with, without, n_reqs, n_samples);
    printf("# %u request(s) x %u sample(s), k %u: at most %u blocks in use with release, %u "
           "without\n",
           n_reqs, n_samples, k, with->max_blocks_used, without->max_blocks_used);
    assert_true(with->usage_fell);
    assert_true(with->spec_draft_tokens == without->spec_draft_tokens);
    assert_true(with->spec_accepted_tokens == without->spec_accepted_tokens);
    if (k) {
        printf("# %llu draft tokens, %llu accepted\n", (unsigned long long)with->spec_draft_tokens,
               (unsigned long long)with->spec_accepted_tokens);
        assert_true(with->spec_accepted_tokens > 0);
    }
    assert_true(with->max_blocks_used < without->max_blocks_used);
    llmi_free(with);
    llmi_free(without);
}

static void test_model_is_windowed(void **state) {
    (void)state;
    assert_int_equal(g_model->hp.features.swa, LLMI_SWA_ALL);
    assert_int_equal(g_model->hp.features.swa_window, WINDOW);
}

/* A greedy and a sampled request side by side. */
static void test_plain(void **state) {
    (void)state;
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.temperature = 1.0f;
    sp.seed = 99;
    llm_request_params p[2];
    for (int i = 0; i < 2; i++) {
        llm_request_params_init(&p[i]);
        p[i].max_new_tokens = 160;
        p[i].ignore_eos = true;
        p[i].logprobs = true;
    }
    p[1].sampling = &sp;
    compare(p, 2, 1, 0);
}

/* Samples share the prompt's blocks (holes included) and release their own. */
static void test_samples(void **state) {
    (void)state;
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.temperature = 1.0f;
    sp.seed = 5;
    llm_request_params p;
    llm_request_params_init(&p);
    p.max_new_tokens = 140;
    p.ignore_eos = true;
    p.logprobs = true;
    p.sampling = &sp;
    p.n_samples = MAX_SAMPLES;
    compare(&p, 1, MAX_SAMPLES, 0);
}

/* Prompt-lookup drafts reserve up to k blocks ahead and are rolled back. */
static void test_speculation(void **state) {
    (void)state;
    llm_request_params p[2];
    for (int i = 0; i < 2; i++) {
        llm_request_params_init(&p[i]);
        p[i].max_new_tokens = 160;
        p[i].ignore_eos = true;
        p[i].logprobs = true;
        p[i].spec_mode = LLM_SPEC_NGRAM;
        p[i].spec_k = 4;
    }
    compare(p, 2, 1, 4);
}

/* The engine hands no released block to the backend for a position a layer
 * reads: a row whose window reaches a hole is refused, one whose window
 * starts at the first held position runs; state reads of released
 * positions are refused too. The engine runs on the test device: the
 * refusals are the engine's, before any backend, and the step that runs
 * must run there. */
static void test_engine_refuses_holes(void **state) {
    (void)state;
    llmi_engine_config cfg = {.model = g_model,
                              .backend_cfg = {1, 0},
                              .kv_block_size = BLOCK,
                              .kv_blocks = 16,
                              .kv_type = LLM_KV_F32,
                              .max_rows = 16,
                              .max_ctx = N_CTX};
    llmi_engine *e = NULL;
    assert_int_equal(create_test_engine(&cfg, &e), LLM_OK);
    llmi_kv_seq seq = {0};
    const llmi_kv_seq *all[] = {&seq};
    float *logits = llmi_malloc(g_model->hp.n_vocab * sizeof *logits);
    assert_non_null(logits);
    llm_token prompt[12];
    uint64_t rng = 3;
    random_prompt(prompt, 12, g_model->hp.n_vocab, &rng);
    assert_int_equal(llmi_kv_seq_reserve(e->kv, &seq, 12), LLM_OK);
    for (uint32_t i = 0; i < 12; i++)
        e->rows[i] = (llmi_batch_row){prompt[i], i, &seq, i == 11};
    assert_int_equal(llmi_engine_run(e, e->rows, 12, logits), LLM_OK);
    assert_int_equal(seq.n_tokens, 12);
    /* Position 12 reads 7..12: block 1 (4..7) must stay, block 0 may go. */
    assert_int_equal(llmi_kv_seq_release_before(e->kv, &seq, 7), 1);
    assert_int_equal(llmi_kv_check(e->kv, all, 1), LLM_OK);
    llmi_kv_seq_truncate(e->kv, &seq, 9); /* rewind inside what is held */
    assert_int_equal(llmi_kv_seq_release_before(e->kv, &seq, 8), 1); /* now 0..7 released */
    assert_int_equal(llmi_kv_seq_reserve(e->kv, &seq, 10), LLM_OK);
    /* Position 9 would read 4..9, partly released. */
    e->rows[0] = (llmi_batch_row){prompt[9], 9, &seq, true};
    assert_int_equal(llmi_engine_run(e, e->rows, 1, logits), LLM_ERR_INTERNAL);
    assert_non_null(strstr(llmi_error_message(), "released"));
    assert_int_equal(seq.n_tokens, 9);
    /* Rows 9..13 together: row 9 alone is enough to refuse the step. */
    assert_int_equal(llmi_kv_seq_reserve(e->kv, &seq, 14), LLM_OK);
    for (uint32_t i = 9; i < 14; i++)
        e->rows[i - 9] = (llmi_batch_row){prompt[i % 12], i, &seq, i == 13};
    assert_int_equal(llmi_engine_run(e, e->rows, 5, logits), LLM_ERR_INTERNAL);
    /* A row at 13 reads 8..13, all held: the check lets it through (the
     * slots 9..12 were reserved but never computed; only the check matters
     * here, not the logits). */
    seq.n_tokens = 13;
    e->rows[0] = (llmi_batch_row){prompt[1], 13, &seq, true};
    assert_int_equal(llmi_engine_run(e, e->rows, 1, logits), LLM_OK);
    float buf[64];
    assert_true(e->kv_row_bytes <= sizeof buf);
    assert_int_equal(llmi_engine_kv_read(e, &seq, 0, false, 7, 1, buf), LLM_ERR_INTERNAL);
    assert_int_equal(llmi_engine_kv_read(e, &seq, 0, false, 8, 1, buf), LLM_OK);
    assert_int_equal(llmi_kv_check(e->kv, all, 1), LLM_OK);
    llmi_kv_seq_destroy(e->kv, &seq);
    llmi_free(logits);
    llmi_engine_free(e);
}

/* Token-level sequences keep every block (they can be rewound anywhere
 * and saved whole): a long decode holds all its blocks, and truncation to
 * the start still works. */
static void test_token_level_keeps_blocks(void **state) {
    (void)state;
    llm_session *s = new_session(g_model, 1, N_CTX, 64, BLOCK, 0, true);
    llm_batch *b = NULL;
    assert_int_equal(llmi_batch_create(8, &b), LLM_OK);
    llm_seq_id id;
    assert_int_equal(llmi_seq_open(s, NULL, &id), LLM_OK);
    llm_token t[40];
    uint64_t rng = 9;
    random_prompt(t, 40, g_model->hp.n_vocab, &rng);
    for (uint32_t p = 0; p < 40; p++) {
        llmi_batch_clear(b);
        assert_int_equal(llmi_batch_add(b, id, p, t[p], true), LLM_OK);
        if (llmi_session_decode(s, b) != LLM_OK)
            fail_msg("decode: %s", llmi_error_message());
    }
    check_invariants(s);
    llm_session_stats st = {sizeof st};
    llmi_session_stats(s, &st);
    assert_int_equal(st.blocks_used, 40 / BLOCK);
    assert_int_equal(llmi_seq_truncate(s, id, 2), LLM_OK);
    llmi_batch_clear(b);
    assert_int_equal(llmi_batch_add(b, id, 2, t[2], true), LLM_OK);
    assert_int_equal(llmi_session_decode(s, b), LLM_OK);
    check_invariants(s);
    llmi_batch_free(b);
    llmi_session_free(s);
}

static int setup(void **state) {
    (void)state;
    g_model = windowed_model(31);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_model);
    return 0;
}

int main(void) {
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_is_windowed),
        device_test(test_engine_refuses_holes),
        device_test(test_token_level_keeps_blocks),
        device_test(test_plain),
        device_test(test_samples),
        device_test(test_speculation),
    };
    return run_device_tests(tests, setup, teardown);
}
