/* Black-box tests of the engine API through llm.h on the real model:
 * token-level sequences (fork shares KV copy-on-write, truncate rolls back)
 * and request-level submit/step/cancel/stats. */
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
static uint32_t g_vocab;

static llm_session *session(uint32_t n_ctx) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    p.kv_cache_bytes = 64u << 20;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(g_model, &p, &s), LLM_OK);
    return s;
}

static size_t tokenize(const char *text, llm_token *out, size_t cap) {
    size_t n = 0;
    assert_int_equal(llm_tokenize(g_model, text, strlen(text), 0, out, cap, &n), LLM_OK);
    return n;
}

/* Decodes toks into seq starting at its current length; copies the last
 * row's logits into out. */
static void feed(llm_session *s, llm_batch *b, llm_seq_id seq, const llm_token *toks, size_t n,
                 float *out) {
    uint32_t len = 0;
    assert_int_equal(llm_seq_length(s, seq, &len), LLM_OK);
    llm_batch_clear(b);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(llm_batch_add(b, seq, len + (uint32_t)i, toks[i], i == n - 1), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    const float *lg = NULL;
    assert_int_equal(llm_session_logits(s, (uint32_t)n - 1, &lg), LLM_OK);
    memcpy(out, lg, g_vocab * sizeof *out);
}

static void expect_close(const float *a, const float *b) {
    double worst = 0;
    for (uint32_t i = 0; i < g_vocab; i++) worst = fmax(worst, fabs(a[i] - b[i]));
    if (worst > 1e-4) fail_msg("logits differ by %g", worst);
}

static void test_fork_and_truncate(void **state) {
    (void)state;
    llm_session *s = session(256);
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(64, &b), LLM_OK);
    llm_token prompt[64], x, y;
    size_t n = tokenize("The quick brown fox jumps over the lazy dog because", prompt, 64);
    x = prompt[1];
    y = prompt[2];
    float *la = malloc(g_vocab * sizeof(float)), *lb = malloc(g_vocab * sizeof(float));
    float *lc = malloc(g_vocab * sizeof(float)), *tmp = malloc(g_vocab * sizeof(float));
    llm_seq_id A, B, C;
    assert_int_equal(llm_seq_open(s, &A), LLM_OK);
    feed(s, b, A, prompt, n, tmp);
    assert_int_equal(llm_seq_fork(s, A, &B), LLM_OK);
    feed(s, b, A, &x, 1, la); /* A's partial last block is shared: copied on write */
    feed(s, b, B, &y, 1, lb);
    /* A fresh sequence computing the same tokens in one batch agrees. */
    llm_token px[65];
    memcpy(px, prompt, n * sizeof *px);
    px[n] = x;
    assert_int_equal(llm_seq_open(s, &C), LLM_OK);
    feed(s, b, C, px, n + 1, lc);
    expect_close(la, lc);
    /* Roll A back and take B's branch: B's logits. */
    assert_int_equal(llm_seq_truncate(s, A, (uint32_t)n), LLM_OK);
    feed(s, b, A, &y, 1, la);
    expect_close(la, lb);
    uint32_t len = 0;
    assert_int_equal(llm_seq_length(s, A, &len), LLM_OK);
    assert_int_equal(len, n + 1);
    /* Errors. */
    llm_batch_clear(b);
    assert_int_equal(llm_batch_add(b, A, 3, x, true), LLM_OK); /* not where A ends */
    assert_int_equal(llm_session_decode(s, b), LLM_ERR_INVALID_ARGUMENT);
    llm_batch_clear(b);
    assert_int_equal(llm_batch_add(b, 77, 0, x, true), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_ERR_NOT_FOUND);
    llm_batch_clear(b);
    assert_int_equal(llm_batch_add(b, A, len, (llm_token)g_vocab, true), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_ERR_INVALID_ARGUMENT);
    llm_batch_clear(b);
    assert_int_equal(llm_batch_add(b, A, len, x, false), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    const float *lg;
    assert_int_equal(llm_session_logits(s, 0, &lg), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_logits(s, 5, &lg), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_truncate(s, A, 1000), LLM_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 64; i++) llm_batch_add(b, A, 0, x, false);
    assert_int_equal(llm_batch_add(b, A, 0, x, false), LLM_ERR_LIMIT);
    assert_int_equal(llm_seq_close(s, A), LLM_OK);
    assert_int_equal(llm_seq_close(s, A), LLM_ERR_NOT_FOUND);
    assert_int_equal(llm_seq_fork(s, A, &B), LLM_ERR_NOT_FOUND);
    llm_batch *none = (llm_batch *)0x1;
    assert_int_equal(llm_batch_create(0, &none), LLM_ERR_INVALID_ARGUMENT);
    assert_null(none);
    free(la), free(lb), free(lc), free(tmp);
    llm_batch_free(b);
    llm_batch_free(NULL);
    llm_session_free(s); /* frees the sequences still open */
}

static void test_requests(void **state) {
    (void)state;
    llm_session *s = session(512);
    llm_token prompt[64];
    size_t n = tokenize("<|im_start|>user\nList three colours.<|im_end|>\n<|im_start|>assistant\n",
                        prompt, 64);
    /* Needs PARSE_SPECIAL for the chat markers. */
    assert_int_equal(llm_tokenize(g_model,
                                  "<|im_start|>user\nList three colours.<|im_end|>\n"
                                  "<|im_start|>assistant\n",
                                  68, LLM_TOKENIZE_PARSE_SPECIAL, prompt, 64, &n),
                     LLM_OK);
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 48;
    rp.logprobs = true;
    llm_request_id a = 0, c = 0;
    assert_int_equal(llm_session_submit(s, prompt, n, &rp, &a), LLM_OK);
    assert_int_equal(llm_session_submit(s, prompt, n, &rp, &c), LLM_OK);
    assert_true(a != 0 && c != a);
    char text[4096] = "";
    int finished = 0, steps = 0;
    llm_finish_reason why = LLM_FINISH_NONE;
    /* An older caller with a shorter event struct still works. */
    size_t small = offsetof(llm_event, finish_reason) + sizeof(llm_finish_reason);
    char buf[8 * sizeof(llm_event)];
    while (finished < 2 && steps++ < 500) {
        size_t got = 0;
        assert_int_equal(llm_session_step(s, (llm_event *)buf, 4, small, &got), LLM_OK);
        for (size_t i = 0; i < got; i++) {
            llm_event ev;
            memset(&ev, 0, sizeof ev);
            memcpy(&ev, buf + i * small, small);
            if (ev.request == a) {
                strncat(text, ev.text, ev.text_len);
                if (ev.token != LLM_TOKEN_NONE) assert_true(ev.logprob <= 0.0f);
                if (ev.finish_reason) why = ev.finish_reason;
            } else if (steps == 3) {
                assert_int_equal(llm_session_cancel(s, c), LLM_OK);
            }
            finished += ev.finish_reason != LLM_FINISH_NONE;
        }
    }
    printf("# answer: %s\n", text);
    assert_int_equal(finished, 2);
    assert_int_equal(why, LLM_FINISH_EOS);
    assert_true(strlen(text) > 5);
    llm_session_stats st = {sizeof st};
    assert_int_equal(llm_session_get_stats(s, &st), LLM_OK);
    assert_int_equal(st.n_running + st.n_waiting, 0);
    assert_int_equal(st.blocks_used, 0);
    assert_true(st.generated_tokens > 0);
    assert_true(st.prefix_hit_tokens > 0 || n < 32); /* the second shares the first's prompt */
    assert_int_equal(llm_session_cancel(s, a), LLM_ERR_NOT_FOUND);
    /* Argument errors. */
    size_t got;
    llm_event ev[2];
    assert_int_equal(llm_session_step(s, ev, 2, 3, &got), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_step(s, NULL, 0, sizeof ev[0], &got), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_submit(s, NULL, 3, &rp, &a), LLM_ERR_INVALID_ARGUMENT);
    st.struct_size = 1;
    assert_int_equal(llm_session_get_stats(s, &st), LLM_ERR_INVALID_ARGUMENT);
    llm_session_free(s);
}

static int setup(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path || llm_model_load(path, NULL, &g_model) != LLM_OK) return -1;
    llm_model_info info = {sizeof info};
    llm_model_get_info(g_model, &info);
    g_vocab = info.n_vocab;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llm_model_free(g_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_and_truncate),
        cmocka_unit_test(test_requests),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
