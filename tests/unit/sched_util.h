/* Shared helpers for the scheduler tests: a tiny random model, request
 * drivers that collect each request's tokens, text and finish reason.
 * Sessions made here (new_session) run on the device of LLM_TEST_BACKEND /
 * LLM_TEST_TP (device_util.h): tests that make them are device tests. */
#ifndef TEST_SCHED_UTIL_H
#define TEST_SCHED_UTIL_H

#include "device_util.h"
#include "model/testmodel.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

enum { MAX_OUT = 256, MAX_REQ = 512 };

typedef struct outcome {
    llm_request_id id;
    llm_token toks[MAX_OUT];
    float logprobs[MAX_OUT];
    uint32_t n;
    char text[4 * MAX_OUT * 8];
    size_t text_len;
    llm_finish_reason finish;
    int n_finish_events;
} outcome;

/* Loads the test model `p` describes, through a file (the loader's path). */
static inline llm_model *model_from_params(const llmi_testmodel_params *p, const char *tag) {
    void *data = NULL;
    size_t size = 0;
    assert_int_equal(llmi_testmodel_to_memory(p, &data, &size), LLM_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/%s-%llu.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp", tag,
             (unsigned long long)p->seed);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
    llmi_free(data);
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(path, false, &m), LLM_OK);
    remove(path);
    return m;
}

static inline llm_model *tiny_model(uint32_t n_ctx, uint64_t seed) {
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_ctx = n_ctx;
    p.seed = seed;
    p.type = LLMI_T_Q8_0;
    return model_from_params(&p, "sched");
}

static inline llm_session *new_session(const llm_model *m, uint32_t threads, uint32_t n_ctx,
                                       uint32_t max_batch, uint32_t block_size,
                                       uint32_t n_blocks, bool prefix_cache) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = threads;
    p.n_ctx = n_ctx;
    p.max_batch_tokens = max_batch;
    p.kv_block_size = block_size;
    p.prefix_cache = prefix_cache;
    if (n_blocks)
        p.kv_cache_bytes = (uint64_t)n_blocks *
                           llmi_kv_block_bytes(m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim,
                                               block_size);
    llm_session *s = NULL;
    llm_status st = create_test_session(m, &p, &s);
    if (st != LLM_OK)
        fail_msg("session: %s", llm_last_error());
    return s;
}

static inline outcome *find_outcome(outcome *outs, size_t n, llm_request_id id) {
    for (size_t i = 0; i < n; i++)
        if (outs[i].id == id) return &outs[i];
    fail_msg("event for unknown request %llu", (unsigned long long)id);
    return NULL;
}

/* Applies one step's events to the outcomes. Returns events seen. */
static inline size_t step_once(llm_session *s, outcome *outs, size_t n_outs) {
    llm_event ev[64];
    size_t n = 0;
    llm_status st = llmi_session_step(s, ev, 64, sizeof ev[0], &n);
    if (st != LLM_OK) fail_msg("step: %s", llmi_error_message());
    for (size_t i = 0; i < n; i++) {
        outcome *o = find_outcome(outs, n_outs, ev[i].request);
        assert_int_equal(o->n_finish_events, 0); /* nothing after the finish */
        if (ev[i].token != LLM_TOKEN_NONE) {
            assert_true(o->n < MAX_OUT);
            o->logprobs[o->n] = ev[i].logprob;
            o->toks[o->n++] = ev[i].token;
        }
        assert_int_equal(ev[i].text[ev[i].text_len], '\0'); /* text may hold NUL bytes */
        assert_true(o->text_len + ev[i].text_len < sizeof o->text);
        memcpy(o->text + o->text_len, ev[i].text, ev[i].text_len);
        o->text_len += ev[i].text_len;
        o->text[o->text_len] = '\0';
        if (ev[i].finish_reason != LLM_FINISH_NONE) {
            o->finish = ev[i].finish_reason;
            o->n_finish_events++;
        }
    }
    return n;
}

static inline void check_invariants(llm_session *s) {
    llm_status st = llmi_session_check(s);
    if (st != LLM_OK) fail_msg("invariant: %s", llmi_error_message());
    /* Shared blocks count once: waste is never negative. */
    llm_session_stats stats = {sizeof stats};
    llmi_session_stats(s, &stats);
    assert_true(stats.kv_tokens_used <= (uint64_t)stats.blocks_used * stats.block_size);
    assert_int_equal(stats.blocks_used + stats.blocks_cached + stats.blocks_free,
                     stats.blocks_total);
}

/* Steps until no request is left, checking invariants after every step. */
static inline void drain(llm_session *s, outcome *outs, size_t n_outs) {
    for (int guard = 0; guard < 100000; guard++) {
        size_t n = step_once(s, outs, n_outs);
        check_invariants(s);
        llm_session_stats st = {sizeof st};
        llmi_session_stats(s, &st);
        if (n == 0 && st.n_running == 0 && st.n_waiting == 0) return;
    }
    fail_msg("requests never finished");
}

static inline void random_prompt(llm_token *t, uint32_t n, uint32_t vocab, uint64_t *rng) {
    for (uint32_t i = 0; i < n; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (llm_token)((*rng >> 33) % (vocab - 8)); /* below the control tokens */
    }
}

static inline uint32_t rand_range(uint64_t *rng, uint32_t lo, uint32_t hi) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (uint32_t)((*rng >> 33) % (hi - lo + 1));
}

/* Allocation-failure countdowns (llmi_alloc_fail_after). Disarms and
 * returns the countdown: r when the r-th allocation from now would have
 * failed, 0 when the armed failure already happened. At most `max` probe
 * allocations (the countdown never exceeds what was armed). Sweeps use it
 * to pause the countdown around checks that allocate themselves. */
static inline uint64_t alloc_disarm(uint64_t max) {
    for (uint64_t i = 1; i <= max; i++) {
        void *p = llmi_malloc(1);
        if (!p) return i; /* the countdown just ran out: disarmed */
        llmi_free(p);
    }
    llmi_alloc_fail_after(0);
    return 0;
}

#endif
