/* Black-box tests of the progress callback (llm_progress_fn, since 1.3):
 * llm_model_load reports the file read, llm_session_create the weights'
 * upload and the warm-up; each phase climbs monotonically to its total,
 * and a callback that returns false cancels cleanly (LLM_ERR_CANCELLED,
 * nothing returned; ASan's leak check covers "nothing left"). */
#include <llm.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#define MAX_CALLS 4096

typedef struct call {
    llm_progress_phase phase;
    uint64_t done, total;
} call;

typedef struct recorder {
    call calls[MAX_CALLS];
    size_t n;
    /* Cancel at the first call of this phase whose done reaches cancel_at
     * (cancel_phase < 0: never). */
    int cancel_phase;
    uint64_t cancel_at;
    bool cancelled;
} recorder;

static bool record(llm_progress_phase phase, uint64_t done, uint64_t total, void *user) {
    recorder *r = user;
    if (r->n < MAX_CALLS)
        r->calls[r->n++] = (call){phase, done, total};
    if ((int)phase == r->cancel_phase && done >= r->cancel_at) {
        r->cancelled = true;
        return false;
    }
    return true;
}

static const char *model_path(void) { return getenv("LLM_TEST_MODEL"); }

static uint64_t file_size(const char *path) {
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return (uint64_t)sb.st_size;
}

/* The calls of `phase`, in order: monotonic `done`, one `total`, ending at
 * it. Returns how many there were. */
static size_t check_phase(const recorder *r, llm_progress_phase phase, uint64_t want_total) {
    size_t n = 0;
    uint64_t last = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (r->calls[i].phase != phase)
            continue;
        assert_int_equal(r->calls[i].total, want_total);
        assert_true(r->calls[i].done >= last);
        assert_true(r->calls[i].done <= r->calls[i].total);
        last = r->calls[i].done;
        n++;
    }
    assert_true(n >= 2);
    assert_int_equal(last, want_total);
    return n;
}

static llm_model *load_with(recorder *r, bool use_mmap, llm_status want) {
    llm_model_params mp;
    llm_model_params_init(&mp);
    mp.use_mmap = use_mmap;
    mp.progress = record;
    mp.progress_user = r;
    llm_model *m = (llm_model *)0x1;
    llm_status st = llm_model_load(model_path(), &mp, &m);
    if (st != want)
        fail_msg("load: %s %s", llm_status_name(st), llm_last_error());
    if (want != LLM_OK)
        assert_null(m);
    return m;
}

static void test_phase_names(void **state) {
    (void)state;
    assert_string_equal(llm_progress_phase_name(LLM_PROGRESS_READ), "read");
    assert_string_equal(llm_progress_phase_name(LLM_PROGRESS_UPLOAD), "upload");
    assert_string_equal(llm_progress_phase_name(LLM_PROGRESS_WARMUP), "warm-up");
    assert_string_equal(llm_progress_phase_name((llm_progress_phase)99), "unknown");
}

static void test_load_reports_the_file_read(void **state) {
    (void)state;
    const uint64_t size = file_size(model_path());
    static recorder r = {.cancel_phase = -1};
    r.n = 0;
    llm_model *m = load_with(&r, false, LLM_OK);
    /* Read in 64 MiB chunks: the start, and one call per chunk. */
    size_t n = check_phase(&r, LLM_PROGRESS_READ, size);
    assert_int_equal(n, 1 + (size + (64u << 20) - 1) / (64u << 20));
    for (size_t i = 0; i < r.n; i++)
        assert_int_equal(r.calls[i].phase, LLM_PROGRESS_READ);
    llm_model_free(m);

    r.n = 0; /* mapped: reported at once */
    m = load_with(&r, true, LLM_OK);
    assert_int_equal(check_phase(&r, LLM_PROGRESS_READ, size), 2);
    llm_model_free(m);
}

static void test_session_reports_upload_then_warmup(void **state) {
    (void)state;
    llm_model *m = load_with(&(recorder){.cancel_phase = -1}, true, LLM_OK);
    llm_model_info info = {sizeof info};
    assert_int_equal(llm_model_get_info(m, &info), LLM_OK);
    static recorder r = {.cancel_phase = -1};
    r.n = 0;
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.kv_cache_bytes = 8u << 20;
    sp.progress = record;
    sp.progress_user = &r;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(m, &sp, &s), LLM_OK);
    check_phase(&r, LLM_PROGRESS_UPLOAD, info.weight_bytes);
    check_phase(&r, LLM_PROGRESS_WARMUP, 2);
    /* Upload first, warm-up after, and nothing else. */
    size_t i = 0;
    while (i < r.n && r.calls[i].phase == LLM_PROGRESS_UPLOAD)
        i++;
    assert_true(i > 0);
    while (i < r.n && r.calls[i].phase == LLM_PROGRESS_WARMUP)
        i++;
    assert_int_equal(i, r.n);
    /* The session works. */
    llm_token tok[8];
    size_t n_tok = 0;
    assert_int_equal(llm_tokenize(m, "Hello", 5, LLM_TOKENIZE_ADD_SPECIAL, tok, 8, &n_tok), LLM_OK);
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 2;
    llm_generate_result res = {sizeof res};
    assert_int_equal(llm_generate(s, tok, n_tok, &gp, &res), LLM_OK);
    assert_int_equal(res.n_generated_tokens, 2);
    llm_session_free(s);
    llm_model_free(m);
}

static void test_cancelling_the_load(void **state) {
    (void)state;
    const uint64_t size = file_size(model_path());
    /* At the start, in the middle (a read chunk), and at the very end. */
    const uint64_t at[] = {0, 1, size};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        for (int mmap_on = 0; mmap_on <= 1; mmap_on++) {
            static recorder r;
            r = (recorder){.cancel_phase = LLM_PROGRESS_READ, .cancel_at = at[k]};
            load_with(&r, mmap_on, LLM_ERR_CANCELLED);
            assert_true(r.cancelled);
            assert_non_null(strstr(llm_last_error(), "cancelled by the progress callback"));
        }
    }
    /* The model loads afterwards. */
    llm_model_free(load_with(&(recorder){.cancel_phase = -1}, true, LLM_OK));
}

static void test_cancelling_the_session(void **state) {
    (void)state;
    llm_model *m = load_with(&(recorder){.cancel_phase = -1}, true, LLM_OK);
    const struct {
        llm_progress_phase phase;
        uint64_t at;
    } cases[] = {{LLM_PROGRESS_UPLOAD, 0},
                 {LLM_PROGRESS_UPLOAD, 1},
                 {LLM_PROGRESS_WARMUP, 0},
                 {LLM_PROGRESS_WARMUP, 1},
                 {LLM_PROGRESS_WARMUP, 2}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        static recorder r;
        r = (recorder){.cancel_phase = (int)cases[k].phase, .cancel_at = cases[k].at};
        char err[256] = "";
        llm_session_params sp;
        llm_session_params_init(&sp);
        sp.kv_cache_bytes = 8u << 20;
        sp.progress = record;
        sp.progress_user = &r;
        sp.error_message = err;
        sp.error_capacity = sizeof err;
        llm_session *s = (llm_session *)0x1;
        assert_int_equal(llm_session_create(m, &sp, &s), LLM_ERR_CANCELLED);
        assert_null(s);
        assert_true(r.cancelled);
        assert_non_null(strstr(err, llm_progress_phase_name(cases[k].phase)));
    }
    /* A session without a callback, or whose callback agrees, still works. */
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(m, NULL, &s), LLM_OK);
    llm_session_free(s);
    llm_model_free(m);
}

/* A Hugging Face folder (tests/models, LLM_TEST_MODELS) is reported read
 * at once, as a mapping is, and can be cancelled the same way. */
static void test_hf_folder(void **state) {
    (void)state;
    const char *dir = getenv("LLM_TEST_MODELS");
    if (!dir)
        skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/hf-llama-f32", dir);
    struct stat sb;
    if (stat(path, &sb) != 0)
        skip();
    static recorder r;
    r = (recorder){.cancel_phase = -1};
    llm_model_params mp;
    llm_model_params_init(&mp);
    mp.progress = record;
    mp.progress_user = &r;
    llm_model *m = NULL;
    assert_int_equal(llm_model_load(path, &mp, &m), LLM_OK);
    assert_int_equal(r.n, 2);
    assert_true(r.calls[1].total > 0);
    check_phase(&r, LLM_PROGRESS_READ, r.calls[1].total);
    llm_model_free(m);
    r = (recorder){.cancel_phase = LLM_PROGRESS_READ, .cancel_at = 1};
    m = (llm_model *)0x1;
    assert_int_equal(llm_model_load(path, &mp, &m), LLM_ERR_CANCELLED);
    assert_null(m);
}

/* A caller built against 1.2 (struct_size without the new fields) gets no
 * calls whatever the bytes past its struct hold. */
static void test_old_struct_size_ignores_the_fields(void **state) {
    (void)state;
    static recorder r = {.cancel_phase = LLM_PROGRESS_READ, .cancel_at = 0};
    r.n = 0;
    llm_model_params mp;
    llm_model_params_init(&mp);
    mp.progress = record;
    mp.progress_user = &r;
    mp.struct_size = (uint32_t)offsetof(llm_model_params, progress);
    llm_model *m = NULL;
    assert_int_equal(llm_model_load(model_path(), &mp, &m), LLM_OK);
    assert_int_equal(r.n, 0);
    llm_model_free(m);
}

int main(void) {
    if (!model_path()) {
        fprintf(stderr, "LLM_TEST_MODEL is not set (make test sets it)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_phase_names),
        cmocka_unit_test(test_load_reports_the_file_read),
        cmocka_unit_test(test_session_reports_upload_then_warmup),
        cmocka_unit_test(test_cancelling_the_load),
        cmocka_unit_test(test_cancelling_the_session),
        cmocka_unit_test(test_hf_folder),
        cmocka_unit_test(test_old_struct_size_ignores_the_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
