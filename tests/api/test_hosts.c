/* What hosts in other languages rely on (Go, Python, Rust bindings): error
 * messages that do not depend on the calling thread, a log sink swapped as
 * one, an interrupt for a running call, and buffer sizes that count the
 * NUL. Through llm.h and the shared library, on the real SmolLM2 model. */
#include <llm.h>

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

static llm_model *g_model;

static llm_session *session(uint32_t n_ctx, uint32_t max_batch) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 1;
    p.n_ctx = n_ctx;
    p.max_batch_tokens = max_batch;
    p.kv_cache_bytes = 192u << 20; /* ~4,000 tokens of SmolLM2 in F32 */
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(g_model, &p, &s), LLM_OK);
    return s;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- errors ---- */

static void test_error_buffers_of_constructors(void **state) {
    (void)state;
    char msg[256];
    llm_model_params mp;
    llm_model_params_init(&mp);
    mp.error_message = msg;
    mp.error_capacity = sizeof msg;
    llm_model *m = NULL;
    memset(msg, 'x', sizeof msg);
    assert_int_equal(llm_model_load("/nonexistent/dir/model.gguf", &mp, &m), LLM_ERR_IO);
    assert_null(m);
    assert_non_null(strstr(msg, "/nonexistent/dir/model.gguf"));
    assert_string_equal(msg, llm_last_error());

    /* cut to fit, still terminated */
    char tiny[8];
    mp.error_message = tiny;
    mp.error_capacity = sizeof tiny;
    assert_int_equal(llm_model_load("/nonexistent/dir/model.gguf", &mp, &m), LLM_ERR_IO);
    assert_int_equal(strlen(tiny), sizeof tiny - 1);
    assert_memory_equal(tiny, llm_last_error(), sizeof tiny - 1);

    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 100000;
    sp.error_message = msg;
    sp.error_capacity = sizeof msg;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(g_model, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
    assert_null(s);
    assert_non_null(strstr(msg, "n_threads"));
    msg[0] = '\0';
    assert_int_equal(llm_session_create(NULL, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "model"));
}

typedef struct failer {
    llm_session *s;
    llm_status got;
} failer;

/* Fails a call on the session from another thread. */
static void *fail_on_other_thread(void *arg) {
    failer *f = arg;
    llm_token bad = 1 << 30;
    llm_request_id id;
    f->got = llm_session_submit(f->s, &bad, 1, NULL, &id);
    return NULL;
}

static void test_session_last_error_from_any_thread(void **state) {
    (void)state;
    llm_session *s = session(64, 64);
    llm_status st = LLM_ERR_INTERNAL;
    char buf[512];
    size_t need = 0;
    assert_int_equal(llm_session_last_error(s, &st, buf, sizeof buf, &need), LLM_OK);
    assert_int_equal(st, LLM_OK);
    assert_string_equal(buf, "");
    assert_int_equal(need, 1);

    failer f = {s, LLM_OK};
    pthread_t t;
    pthread_create(&t, NULL, fail_on_other_thread, &f);
    pthread_join(t, NULL);
    assert_int_equal(f.got, LLM_ERR_INVALID_ARGUMENT);
    /* this thread made no failing call: its own message says nothing of it */
    assert_null(strstr(llm_last_error(), "vocabulary"));
    assert_int_equal(llm_session_last_error(s, &st, buf, sizeof buf, &need), LLM_OK);
    assert_int_equal(st, LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(buf, "1073741824"));
    assert_int_equal(need, strlen(buf) + 1);

    /* size query, then an exact buffer */
    assert_int_equal(llm_session_last_error(s, &st, NULL, 0, &need), LLM_OK);
    char *exact = malloc(need);
    assert_int_equal(llm_session_last_error(s, &st, exact, need, NULL), LLM_OK);
    assert_string_equal(exact, buf);
    free(exact);

    /* argument errors of session calls count too; a success keeps it */
    size_t n_events;
    assert_int_equal(llm_session_step(s, NULL, 0, sizeof(llm_event), &n_events),
                     LLM_ERR_INVALID_ARGUMENT);
    llm_session_stats stats = {sizeof stats};
    assert_int_equal(llm_session_get_stats(s, &stats), LLM_OK);
    assert_int_equal(llm_session_last_error(s, &st, buf, sizeof buf, NULL), LLM_OK);
    assert_int_equal(st, LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(buf, "event array"));
    assert_int_equal(llm_seq_close(s, 12345), LLM_ERR_NOT_FOUND);
    assert_int_equal(llm_session_last_error(s, &st, buf, sizeof buf, NULL), LLM_OK);
    assert_int_equal(st, LLM_ERR_NOT_FOUND);

    assert_int_equal(llm_session_last_error(NULL, &st, buf, sizeof buf, NULL),
                     LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_last_error(s, &st, NULL, 4, NULL), LLM_ERR_INVALID_ARGUMENT);
    llm_session_free(s);
}

/* ---- the log sink ---- */

typedef struct sink_tag {
    int id;
    atomic_int running;
} sink_tag;

static sink_tag tag_a = {1, 0}, tag_b = {2, 0};
static atomic_long mixed, delivered;

static void sink_a(llm_log_level level, const char *message, void *user) {
    (void)level;
    (void)message;
    sink_tag *t = user;
    atomic_fetch_add(&t->running, 1);
    if (t->id != 1) atomic_fetch_add(&mixed, 1);
    atomic_fetch_add(&delivered, 1);
    atomic_fetch_sub(&t->running, 1);
}

static void sink_b(llm_log_level level, const char *message, void *user) {
    (void)level;
    (void)message;
    sink_tag *t = user;
    atomic_fetch_add(&t->running, 1);
    if (t->id != 2) atomic_fetch_add(&mixed, 1);
    atomic_fetch_add(&delivered, 1);
    atomic_fetch_sub(&t->running, 1);
}

static atomic_bool stop_logging;

/* Every failing call logs its error at LLM_LOG_DEBUG. */
static void *log_a_lot(void *arg) {
    (void)arg;
    llm_token t;
    size_t n;
    while (!atomic_load(&stop_logging)) llm_tokenize(g_model, "a", 1, 1u << 20, &t, 1, &n);
    return NULL;
}

static void test_log_sink_swaps_as_one(void **state) {
    (void)state;
    atomic_store(&stop_logging, false);
    atomic_store(&mixed, 0);
    atomic_store(&delivered, 0);
    llm_log_set(sink_a, LLM_LOG_DEBUG, &tag_a);
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, log_a_lot, NULL);
    long old_sink_running_after_swap = 0;
    /* At least 20000 swaps, and until the loggers have delivered 5000
     * messages meanwhile (bounded: 2 million swaps). */
    for (int i = 0; i < 20000 || (atomic_load(&delivered) < 5000 && i < 2000000); i++) {
        bool to_b = i % 2 == 0;
        llm_log_set(to_b ? sink_b : sink_a, LLM_LOG_DEBUG, to_b ? &tag_b : &tag_a);
        /* the old sink has returned and gets no new call */
        old_sink_running_after_swap += atomic_load(to_b ? &tag_a.running : &tag_b.running);
    }
    atomic_store(&stop_logging, true);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    llm_log_set(NULL, LLM_LOG_INFO, NULL);
    print_message("%ld messages delivered while swapping\n", atomic_load(&delivered));
    assert_true(atomic_load(&delivered) >= 5000);
    assert_int_equal(atomic_load(&mixed), 0);
    assert_int_equal(old_sink_running_after_swap, 0);
}

/* A sink that logs through the library, or swaps the sink, must not hang. */
static atomic_int reentered;
static void reentrant_sink(llm_log_level level, const char *message, void *user) {
    (void)level;
    (void)message;
    (void)user;
    atomic_fetch_add(&reentered, 1);
    llm_token t;
    size_t n;
    llm_tokenize(g_model, "a", 1, 1u << 20, &t, 1, &n); /* logs: dropped */
    llm_log_set(NULL, LLM_LOG_INFO, NULL);               /* ignored */
}

static void test_log_sink_reentry(void **state) {
    (void)state;
    atomic_store(&reentered, 0);
    llm_log_set(reentrant_sink, LLM_LOG_DEBUG, NULL);
    llm_token t;
    size_t n;
    llm_tokenize(g_model, "a", 1, 1u << 20, &t, 1, &n);
    llm_tokenize(g_model, "a", 1, 1u << 20, &t, 1, &n);
    llm_log_set(NULL, LLM_LOG_INFO, NULL);
    assert_int_equal(atomic_load(&reentered), 2);
}

/* ---- interrupts ---- */

typedef struct interrupter {
    llm_session *s;
    atomic_bool stop;
    atomic_int sent;
    int delay_ms;
} interrupter;

static void *interrupt_later(void *arg) {
    interrupter *it = arg;
    sleep_ms(it->delay_ms);
    llm_session_interrupt(it->s);
    atomic_fetch_add(&it->sent, 1);
    return NULL;
}

/* 60 interrupts, 1 to 12 ms apart: many land inside steps, and the
 * requests then finish undisturbed. */
static void *interrupt_often(void *arg) {
    interrupter *it = arg;
    for (int i = 0; i < 60 && !atomic_load(&it->stop); i++) {
        llm_session_interrupt(it->s);
        atomic_fetch_add(&it->sent, 1);
        sleep_ms(1 + (i * 7) % 12);
    }
    return NULL;
}

typedef struct tokens {
    llm_token v[256];
    size_t n;
} tokens;

static bool collect(llm_token token, const char *piece, size_t len, void *user) {
    (void)piece;
    (void)len;
    tokens *t = user;
    if (token != LLM_TOKEN_NONE && t->n < 256) t->v[t->n++] = token;
    return true;
}

static size_t long_prompt(llm_token *out, size_t cap) {
    static const char unit[] = "The quick brown fox jumps over the lazy dog near the river bank. ";
    size_t n = 0, k = 0;
    llm_token t[64];
    assert_int_equal(llm_tokenize(g_model, unit, sizeof unit - 1, 0, t, 64, &k), LLM_OK);
    while (n + k <= cap) {
        memcpy(out + n, t, k * sizeof *t);
        n += k;
    }
    return n;
}

static void test_interrupt_generate_during_prefill(void **state) {
    (void)state;
    llm_session *s = session(2048, 64);
    static llm_token prompt[700];
    size_t n = long_prompt(prompt, 700);
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 8;
    tokens got = {.n = 0};
    gp.on_token = collect;
    gp.user = &got;
    interrupter it = {.s = s, .delay_ms = 30};
    pthread_t th;
    pthread_create(&th, NULL, interrupt_later, &it);
    llm_generate_result r = {sizeof r};
    llm_status st = llm_generate(s, prompt, n, &gp, &r);
    pthread_join(th, NULL);
    /* The prompt takes ~11 chunked steps of 64 tokens: far longer than 30 ms. */
    assert_int_equal(st, LLM_ERR_CANCELLED);
    assert_int_equal(r.finish_reason, LLM_FINISH_CANCELLED);
    assert_int_equal(got.n, 0);
    llm_session_stats stats = {sizeof stats};
    assert_int_equal(llm_session_get_stats(s, &stats), LLM_OK);
    assert_int_equal(stats.n_running + stats.n_waiting, 0);
    assert_int_equal(stats.blocks_used, 0);

    /* An interrupt while nothing runs has no effect on the next call, and
     * the interrupted one left nothing behind: the same tokens as a fresh
     * session. */
    llm_session_interrupt(s);
    tokens again = {.n = 0};
    gp.user = &again;
    assert_int_equal(llm_generate(s, prompt, 100, &gp, &r), LLM_OK);
    llm_session *fresh = session(2048, 64);
    tokens want = {.n = 0};
    gp.user = &want;
    assert_int_equal(llm_generate(fresh, prompt, 100, &gp, &r), LLM_OK);
    assert_int_equal(again.n, want.n);
    assert_memory_equal(again.v, want.v, want.n * sizeof want.v[0]);
    llm_session_free(fresh);
    llm_session_free(s);
}

/* Steps interrupted again and again change no request: repeating them
 * gives exactly the tokens of an undisturbed run. */
static void run_requests(llm_session *s, const llm_token *prompt, size_t n, tokens out[2],
                         interrupter *it, int *cancelled_steps) {
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 16;
    rp.ignore_eos = true;
    llm_request_id ids[2];
    assert_int_equal(llm_session_submit(s, prompt, n, &rp, &ids[0]), LLM_OK);
    assert_int_equal(llm_session_submit(s, prompt + 7, n - 7, &rp, &ids[1]), LLM_OK);
    out[0].n = out[1].n = 0;
    pthread_t th;
    if (it) pthread_create(&th, NULL, interrupt_often, it);
    int finished = 0;
    for (int guard = 0; finished < 2 && guard < 100000; guard++) {
        llm_event ev[8];
        size_t got = 0;
        llm_status st = llm_session_step(s, ev, 8, sizeof ev[0], &got);
        if (st == LLM_ERR_CANCELLED) {
            assert_int_equal(got, 0);
            ++*cancelled_steps;
            continue;
        }
        assert_int_equal(st, LLM_OK);
        for (size_t i = 0; i < got; i++) {
            tokens *t = &out[ev[i].request == ids[0] ? 0 : 1];
            if (ev[i].token != LLM_TOKEN_NONE) t->v[t->n++] = ev[i].token;
            if (ev[i].finish_reason != LLM_FINISH_NONE) finished++;
        }
    }
    if (it) {
        atomic_store(&it->stop, true);
        pthread_join(th, NULL);
    }
    assert_int_equal(finished, 2);
}

static void test_interrupted_steps_change_nothing(void **state) {
    (void)state;
    static llm_token prompt[160];
    size_t n = long_prompt(prompt, 160);
    tokens want[2], got[2];
    int cancelled = 0;
    llm_session *quiet = session(1024, 32);
    run_requests(quiet, prompt, n, want, NULL, &cancelled);
    llm_session_free(quiet);
    assert_int_equal(cancelled, 0);

    llm_session *s = session(1024, 32);
    interrupter it = {.s = s};
    run_requests(s, prompt, n, got, &it, &cancelled);
    print_message("%d of the steps were interrupted (%d interrupts sent)\n", cancelled,
                  atomic_load(&it.sent));
    assert_true(cancelled > 0);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(got[r].n, 16);
        assert_memory_equal(got[r].v, want[r].v, 16 * sizeof got[r].v[0]);
    }
    llm_session_stats stats = {sizeof stats};
    assert_int_equal(llm_session_get_stats(s, &stats), LLM_OK);
    assert_int_equal(stats.blocks_used, 0);
    llm_session_free(s);
}

static void test_interrupt_decode_applies_nothing(void **state) {
    (void)state;
    llm_session *s = session(2048, 32);
    static llm_token prompt[500];
    size_t n = long_prompt(prompt, 500);
    llm_seq_id q;
    assert_int_equal(llm_seq_open(s, &q), LLM_OK);
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create((uint32_t)n, &b), LLM_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(llm_batch_add(b, q, (uint32_t)i, prompt[i], i + 1 == n), LLM_OK);
    interrupter it = {.s = s, .delay_ms = 20};
    pthread_t th;
    pthread_create(&th, NULL, interrupt_later, &it);
    llm_status st = llm_session_decode(s, b);
    pthread_join(th, NULL);
    assert_int_equal(st, LLM_ERR_CANCELLED);
    uint32_t len = 99;
    assert_int_equal(llm_seq_length(s, q, &len), LLM_OK);
    assert_int_equal(len, 0); /* all rows or none */
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    assert_int_equal(llm_seq_length(s, q, &len), LLM_OK);
    assert_int_equal(len, n);
    llm_batch_free(b);
    llm_session_interrupt(NULL); /* a no-op */
    llm_session_free(s);
}

static int setup(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path) {
        fprintf(stderr, "LLM_TEST_MODEL is not set (make test sets it)\n");
        return -1;
    }
    return llm_model_load(path, NULL, &g_model) == LLM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    llm_model_free(g_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_buffers_of_constructors),
        cmocka_unit_test(test_session_last_error_from_any_thread),
        cmocka_unit_test(test_log_sink_swaps_as_one),
        cmocka_unit_test(test_log_sink_reentry),
        cmocka_unit_test(test_interrupt_generate_during_prefill),
        cmocka_unit_test(test_interrupted_steps_change_nothing),
        cmocka_unit_test(test_interrupt_decode_applies_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
