/*
 * A program built against the oldest 1.x header: its params structs are the
 * smallest layouts llm.h ever had, and it calls the size-less
 * llm_*_params_init symbols. This file therefore does not include llm.h; it
 * declares what such a program saw. The library must write nothing past
 * these structs (guard bytes stay intact), fill their defaults, and honour
 * the fields they have.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct llm_model llm_model;
typedef struct llm_session llm_session;
typedef int32_t llm_token;
typedef int llm_status; /* an enum of int size */
enum { OLD_OK = 0, OLD_ERR_LIMIT = 7 };

typedef struct old_model_params {
    uint32_t struct_size;
    bool use_mmap;
} old_model_params;

typedef struct old_session_params {
    uint32_t struct_size, n_threads, n_ctx, max_batch_tokens;
    uint64_t kv_cache_bytes;
    int kv_type;
    uint32_t kv_block_size;
} old_session_params;

typedef struct old_sampling_params {
    uint32_t struct_size;
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    uint64_t seed;
} old_sampling_params;

typedef bool (*old_token_fn)(llm_token token, const char *piece, size_t len, void *user);

typedef struct old_generate_params {
    uint32_t struct_size;
    uint32_t max_new_tokens;
    const old_sampling_params *sampling;
    old_token_fn on_token;
    void *user;
    bool ignore_eos;
} old_generate_params;

typedef struct old_request_params {
    uint32_t struct_size;
    const old_sampling_params *sampling;
    uint32_t max_new_tokens;
    int32_t priority;
    bool ignore_eos;
    bool logprobs;
    const llm_token *stop_tokens;
    size_t n_stop_tokens;
    const char *const *stop_strings;
    size_t n_stop_strings;
} old_request_params;

/* The declarations of the old header, with its struct types. */
void llm_model_params_init(old_model_params *p);
void llm_session_params_init(old_session_params *p);
void llm_sampling_params_init(old_sampling_params *p);
void llm_generate_params_init(old_generate_params *p);
void llm_request_params_init(old_request_params *p);
llm_status llm_model_load(const char *path, const old_model_params *p, llm_model **out);
void llm_model_free(llm_model *m);
llm_status llm_session_create(const llm_model *m, const old_session_params *p,
                              llm_session **out);
void llm_session_free(llm_session *s);
llm_status llm_tokenize(const llm_model *m, const char *text, size_t len, uint32_t flags,
                        llm_token *tokens, size_t capacity, size_t *n);
llm_status llm_generate(llm_session *s, const llm_token *prompt, size_t n,
                        const old_generate_params *p, void *result);
llm_status llm_session_submit(llm_session *s, const llm_token *prompt, size_t n,
                              const old_request_params *p, uint64_t *id);
llm_status llm_session_cancel(llm_session *s, uint64_t id);

enum { GUARD = 64 };

/* Runs init on a struct of `size` bytes followed by guard bytes; checks
 * that struct_size is `size` and that no guard byte changed. */
#define INIT_GUARDED(T, init_fn, out)                                                              \
    do {                                                                                           \
        union {                                                                                    \
            T params;                                                                              \
            unsigned char bytes[sizeof(T) + GUARD];                                                \
        } buf;                                                                                     \
        memset(&buf, 0xA5, sizeof buf);                                                            \
        init_fn(&buf.params);                                                                      \
        assert_int_equal(buf.params.struct_size, sizeof(T));                                       \
        for (size_t i = sizeof(T); i < sizeof buf.bytes; i++)                                      \
            if (buf.bytes[i] != 0xA5)                                                              \
                fail_msg(#init_fn " wrote byte %zu of a %zu-byte struct", i, sizeof(T));           \
        (out) = buf.params;                                                                        \
    } while (0)

static void test_inits_stay_inside_old_structs(void **state) {
    (void)state;
    old_model_params mp;
    old_session_params sp;
    old_sampling_params smp;
    old_generate_params gp;
    old_request_params rp;
    INIT_GUARDED(old_model_params, llm_model_params_init, mp);
    INIT_GUARDED(old_session_params, llm_session_params_init, sp);
    INIT_GUARDED(old_sampling_params, llm_sampling_params_init, smp);
    INIT_GUARDED(old_generate_params, llm_generate_params_init, gp);
    INIT_GUARDED(old_request_params, llm_request_params_init, rp);
    /* and they are the defaults */
    assert_true(mp.use_mmap);
    assert_int_equal(sp.max_batch_tokens, 512);
    assert_int_equal(sp.kv_block_size, 16);
    assert_true(smp.temperature == 0.8f && smp.top_k == 40);
    assert_int_equal(gp.max_new_tokens, 128);
    assert_null(gp.on_token);
    assert_int_equal(rp.max_new_tokens, 256);
    assert_null(rp.stop_strings);
}

typedef struct collected {
    llm_token tokens[64];
    size_t n;
} collected;

static bool collect(llm_token token, const char *piece, size_t len, void *user) {
    (void)piece;
    (void)len;
    collected *c = user;
    if (token >= 0 && c->n < 64) c->tokens[c->n++] = token;
    return true;
}

typedef struct fixture {
    llm_model *model;
    llm_session *session;
    llm_token prompt[64];
    size_t n_prompt;
} fixture;

static int setup(void **state) {
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path) {
        fprintf(stderr, "LLM_TEST_MODEL is not set (make test sets it)\n");
        return -1;
    }
    fixture *f = calloc(1, sizeof *f);
    old_model_params mp;
    llm_model_params_init(&mp);
    if (llm_model_load(path, &mp, &f->model) != OLD_OK) return -1;
    old_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 48; /* an old field: honoured */
    if (llm_session_create(f->model, &sp, &f->session) != OLD_OK) return -1;
    static const char text[] = "The three primary colors are";
    if (llm_tokenize(f->model, text, sizeof text - 1, 1, f->prompt, 64, &f->n_prompt) != OLD_OK)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    llm_session_free(f->session);
    llm_model_free(f->model);
    free(f);
    return 0;
}

static collected generate(fixture *f, const old_sampling_params *smp, uint32_t n) {
    old_generate_params gp;
    llm_generate_params_init(&gp);
    collected c = {.n = 0};
    gp.max_new_tokens = n;
    gp.sampling = smp;
    gp.on_token = collect;
    gp.user = &c;
    gp.ignore_eos = true;
    assert_int_equal(llm_generate(f->session, f->prompt, f->n_prompt, &gp, NULL), OLD_OK);
    return c;
}

static void test_old_params_are_honoured(void **state) {
    fixture *f = *state;
    old_sampling_params greedy;
    llm_sampling_params_init(&greedy);
    greedy.temperature = 0.0f;
    collected a = generate(f, &greedy, 6), b = generate(f, &greedy, 6);
    assert_int_equal(a.n, 6); /* max_new_tokens and ignore_eos honoured */
    assert_memory_equal(a.tokens, b.tokens, sizeof a.tokens[0] * a.n);

    old_sampling_params hot;
    llm_sampling_params_init(&hot);
    hot.temperature = 1.5f;
    hot.top_k = 0;
    hot.top_p = 1.0f;
    hot.min_p = 0.0f;
    hot.seed = 7;
    collected s1 = generate(f, &hot, 12), s2 = generate(f, &hot, 12);
    assert_memory_equal(s1.tokens, s2.tokens, sizeof s1.tokens[0] * 12); /* seed honoured */
    hot.seed = 8;
    collected s3 = generate(f, &hot, 12);
    assert_memory_not_equal(s1.tokens, s3.tokens, sizeof s1.tokens[0] * 12);
    assert_memory_not_equal(s1.tokens, a.tokens, sizeof s1.tokens[0] * 6);

    /* n_ctx 48: a prompt of 48 tokens leaves no room */
    llm_token long_prompt[48];
    for (int i = 0; i < 48; i++) long_prompt[i] = f->prompt[i % (int)f->n_prompt];
    old_generate_params gp;
    llm_generate_params_init(&gp);
    assert_int_equal(llm_generate(f->session, long_prompt, 48, &gp, NULL), OLD_ERR_LIMIT);

    old_request_params rp;
    llm_request_params_init(&rp);
    uint64_t id = 0;
    assert_int_equal(llm_session_submit(f->session, long_prompt, 48, &rp, &id), OLD_ERR_LIMIT);
    assert_int_equal(llm_session_submit(f->session, f->prompt, f->n_prompt, &rp, &id), OLD_OK);
    assert_int_equal(llm_session_cancel(f->session, id), OLD_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inits_stay_inside_old_structs),
        cmocka_unit_test(test_old_params_are_honoured),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
