/* Every architecture row against llama.cpp on tiny random-weight models.
 *
 * tests/models/gen_arch_models.py writes one small GGUF per entry of its
 * table into $LLM_TEST_MODELS/arch/ and, in --record mode, llama.cpp's
 * outputs on it into tests/models/arch-reference/<name>.txt. Each reference
 * file here is one test: the model must be the file the reference was
 * recorded on (same sha256, so a drifting generator fails loudly instead of
 * comparing against the wrong numbers), and then
 *   - teacher-forced logits of 3 token sequences, evaluated in one batch:
 *     |ours - llama.cpp| on the recorded top-20 and 32 fixed ids of every
 *     position, relative to that row's full-vocabulary standard deviation,
 *     at most TOL_F32 (f32 activations) or TOL_8BIT (8-bit activations),
 *     TOL_GELU_F16 for GeGLU models (llama.cpp's f16 gelu table);
 *   - the same argmax at every position whose recorded top-1/top-2 gap is
 *     larger than twice the allowed error (no recorded model has a closer
 *     one: see the printed minimum);
 *   - 16 greedy tokens after 2 prompts, fed one token at a time, identical
 *     up to a step where llama.cpp's top two were within GREEDY_NEAR_TIE.
 * For F32 and F16 weights our matmuls keep f32 activations
 * (step_set_f32_activations). llama.cpp does too for F32 weights, but rounds
 * them to f16 for F16 weights, which is most of the difference measured on
 * those models; for quantized weights both sides quantize activations to 8
 * bits (our default path). tests/models/README.md has the numbers. */
#include "feed_util.h"
#include "sha256_util.h"

#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

enum { MAX_SEQ = 256, MAX_TOP = 32, MAX_SUB = 64, LINE = 8192, MAX_MODELS = 64 };

/* Relative logit error allowed, max |diff| / (row std), by what llama.cpp
 * does to the activations (the reference's "activations" line). Measured
 * maxima are in tests/models/README.md; these leave a factor 3 or more. */
static const double TOL_F32 = 1e-4;  /* both sides f32: summation order only */
static const double TOL_F16 = 5e-3;  /* llama.cpp rounds activations to f16 */
static const double TOL_8BIT = 2e-2; /* both sides 8-bit, rounding differently */
/* F32 weights, but llama.cpp's GeGLU reads gelu from a table indexed by the
 * f16-rounded input and holding f16 values (GGML_GELU_FP16); ours is f32. */
static const double TOL_GELU_F16 = 5e-3;

typedef struct ref_case {
    char name[64];
} ref_case;

static ref_case g_cases[MAX_MODELS];

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

static size_t parse_ids(char **s, llm_token *out, size_t cap) {
    size_t n = 0;
    for (;;) {
        while (**s == ' ') (*s)++;
        if (**s == '\0' || **s == '\n' || **s == '|') return n;
        char *end;
        long v = strtol(*s, &end, 10);
        if (end == *s) fail_msg("bad number at '%.20s'", *s);
        if (n < cap) out[n] = (llm_token)v;
        n++;
        *s = end;
    }
}

/* Teacher-forced logits of every position of toks, from an empty sequence. */
static float *all_logits(llm_session *s, const llm_token *toks, size_t n) {
    uint32_t V = s->model->hp.n_vocab;
    float *logits = malloc(n * V * sizeof *logits);
    assert_non_null(logits);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &seq, (uint32_t)n), LLM_OK);
    llmi_batch_row *rows = calloc(n, sizeof *rows);
    for (size_t i = 0; i < n; i++) rows[i] = (llmi_batch_row){toks[i], (uint32_t)i, &seq, true};
    assert_int_equal(llmi_engine_run(s->eng, rows, (uint32_t)n, logits), LLM_OK);
    free(rows);
    llmi_kv_seq_destroy(s->kv, &seq);
    return logits;
}

typedef struct ref_stats {
    int positions, values, argmax_checked, argmax_wrong;
    double max_rel;       /* max |diff| / std */
    double min_gap_rel;   /* smallest recorded top-1/top-2 gap / std */
    int greedy_prompts, greedy_same, greedy_steps;
} ref_stats;

/* Compares one "top" line (and, through *sub_row, the next "sub" line). */
static void check_top(const char *line, const float *logits, uint32_t V, size_t n_toks,
                      double tol, ref_stats *st, const float **row_out, double *std_out) {
    int si, pos, off = 0;
    double std;
    if (sscanf(line, "top %d %d %lf :%n", &si, &pos, &std, &off) != 3 || off == 0)
        fail_msg("bad line: %.80s", line);
    assert_true(pos >= 0 && (size_t)pos < n_toks && std > 0);
    const float *row = logits + (size_t)pos * V;
    const char *p = line + off;
    int ids[MAX_TOP];
    double want[MAX_TOP];
    int k = 0, used = 0;
    while (k < MAX_TOP && sscanf(p, " %d:%lf%n", &ids[k], &want[k], &used) == 2) {
        assert_true(ids[k] >= 0 && (uint32_t)ids[k] < V);
        p += used;
        double rel = fabs(row[ids[k]] - want[k]) / std;
        if (rel > st->max_rel) st->max_rel = rel;
        k++;
        st->values++;
    }
    assert_true(k >= 2);
    double gap = (want[0] - want[1]) / std;
    if (gap < st->min_gap_rel) st->min_gap_rel = gap;
    if (gap > 2 * tol) {
        st->argmax_checked++;
        if (llmi_argmax(row, V) != (llm_token)ids[0] && st->argmax_wrong++ < 3)
            printf("# position %d of sequence %d: argmax %d, llama.cpp %d (gap %.4f std)\n", pos,
                   si, llmi_argmax(row, V), ids[0], gap);
    }
    st->positions++;
    *row_out = row;
    *std_out = std;
}

static void check_sub(const char *line, const float *row, double std, const int *subset,
                      int n_subset, ref_stats *st) {
    const char *p = strchr(line, ':');
    assert_non_null(p);
    p++;
    for (int i = 0; i < n_subset; i++) {
        double want;
        int used = 0;
        if (sscanf(p, " %lf%n", &want, &used) != 1) fail_msg("short sub line: %.80s", line);
        p += used;
        double rel = fabs(row[subset[i]] - want) / std;
        if (rel > st->max_rel) st->max_rel = rel;
        st->values++;
    }
}

/* Recorded greedy steps closer than this (top-1 minus top-2 logit) may go
 * either way on another CPU's summation order; comparison stops there. */
static const double GREEDY_NEAR_TIE = 1e-3;

/* `greedy` is the recorded "greedy" line, `margin` its "margin" line. */
static void check_greedy(llm_session *s, char *greedy, char *margin, ref_stats *st) {
    uint32_t V = s->model->hp.n_vocab;
    llm_token prompt[MAX_SEQ], want[MAX_SEQ];
    char *p = strchr(greedy, ':');
    assert_non_null(p);
    p++;
    size_t n_prompt = parse_ids(&p, prompt, MAX_SEQ);
    assert_true(*p == '|' && n_prompt > 0 && n_prompt <= MAX_SEQ);
    p++;
    size_t n_want = parse_ids(&p, want, MAX_SEQ);
    assert_true(n_want > 0 && n_want <= MAX_SEQ);
    double margins[MAX_SEQ];
    p = strchr(margin, ':');
    assert_non_null(p);
    p++;
    for (size_t i = 0; i < n_want; i++) {
        int used = 0;
        if (sscanf(p, " %lf%n", &margins[i], &used) != 1) fail_msg("short margin line");
        p += used;
    }
    float *logits = malloc(V * sizeof *logits);
    llmi_kv_seq seq = {0};
    assert_int_equal(test_feed(s, &seq, prompt, n_prompt, logits), LLM_OK);
    size_t same = 0, compared = n_want;
    for (size_t i = 0; i < n_want; i++) {
        if (margins[i] < GREEDY_NEAR_TIE) {
            compared = i;
            break;
        }
        llm_token t = llmi_argmax(logits, V);
        if (t != want[i]) break;
        same++;
        if (i + 1 < n_want) assert_int_equal(test_feed(s, &seq, &t, 1, logits), LLM_OK);
    }
    llmi_kv_seq_destroy(s->kv, &seq);
    free(logits);
    st->greedy_prompts++;
    st->greedy_steps += (int)compared;
    if (same == compared) st->greedy_same++;
    else printf("# greedy prompt %d: first difference at step %zu of %zu\n", st->greedy_prompts - 1,
                same, compared);
}

/* Runs the model of reference `name` loaded with `row` (NULL: the table's
 * row for its architecture) on the recorded inputs; *tol_out is the
 * tolerance its activations line sets. */
/* When set, compare_reference replaces the loaded model's linear RoPE
 * scales (test_rope_scaling_matters). */
static bool g_rope_override;
static float g_rope_global, g_rope_windowed;

static void compare_reference(const char *name, const llmi_arch *arch_row, ref_stats *out,
                              double *tol_out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/arch-reference/%s.txt", env_or("LLM_TEST_DATA", "tests"),
             name);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    char *line = malloc(LINE);
    llm_model *m = NULL;
    llm_session *s = NULL;
    bool f32 = true;
    char act[16] = "f32";
    int subset[MAX_SUB], n_subset = 0;
    llm_token toks[MAX_SEQ];
    size_t n_toks = 0;
    float *logits = NULL;
    const float *row = NULL;
    double row_std = 1, tol = TOL_F32;
    ref_stats st = {.min_gap_rel = INFINITY};
    char *greedy = NULL; /* a "greedy" line waiting for its "margin" line */
    while (fgets(line, LINE, f)) {
        if (line[0] == '#') continue;
        if (strncmp(line, "model ", 6) == 0) {
            char file_name[64], want_sha[65], got_sha[65], model_path[1024];
            assert_int_equal(sscanf(line, "model %63s %64s", file_name, want_sha), 2);
            assert_string_equal(file_name, name);
            snprintf(model_path, sizeof model_path, "%s/arch/%s.gguf",
                     env_or("LLM_TEST_MODELS", "build/test-models"), name);
            if (!test_sha256_file(model_path, got_sha))
                fail_msg("cannot read %s (make test-models writes it)", model_path);
            if (strcmp(got_sha, want_sha) != 0)
                fail_msg("%s has sha256 %s but the reference was recorded on %s: the generator "
                         "changed; record again (tests/models/README.md)",
                         model_path, got_sha, want_sha);
            if (llmi_model_load_arch(model_path, true, arch_row, &m) != LLM_OK)
                fail_msg("loading %s: %s", model_path, llmi_error_message());
            if (g_rope_override) {
                m->hp.rope_freq_scale = g_rope_global;
                m->hp.features.swa_rope_freq_scale = g_rope_windowed;
            }
        } else if (strncmp(line, "activations ", 12) == 0) {
            assert_int_equal(sscanf(line + 12, "%15s", act), 1);
            f32 = strncmp(line + 12, "8bit", 4) != 0;
            tol = strncmp(line + 12, "f32-gelu-f16", 12) == 0 ? TOL_GELU_F16
                  : strncmp(line + 12, "f32", 3) == 0          ? TOL_F32
                  : strncmp(line + 12, "f16", 3) == 0          ? TOL_F16
                                                               : TOL_8BIT;
        } else if (strncmp(line, "subset ", 7) == 0) {
            char *p = strchr(line, ':') + 1;
            llm_token ids[MAX_SUB];
            n_subset = (int)parse_ids(&p, ids, MAX_SUB);
            assert_true(n_subset > 0 && n_subset <= MAX_SUB);
            for (int i = 0; i < n_subset; i++) subset[i] = ids[i];
        } else if (strncmp(line, "seq ", 4) == 0 || strncmp(line, "greedy ", 7) == 0) {
            assert_non_null(m);
            if (!s) {
                llm_session_params p;
                llm_session_params_init(&p);
                p.n_ctx = 128;
                p.n_threads = 1;
                assert_int_equal(llmi_session_create(m, &p, &s), LLM_OK);
                llmi_engine_set_f32_activations(s->eng, f32);
            }
            if (line[0] == 'g') {
                free(greedy);
                greedy = strdup(line);
                continue;
            }
            char *p = strchr(line, ':') + 1;
            n_toks = parse_ids(&p, toks, MAX_SEQ);
            assert_true(n_toks > 0 && n_toks <= MAX_SEQ);
            free(logits);
            logits = all_logits(s, toks, n_toks);
        } else if (strncmp(line, "margin ", 7) == 0) {
            assert_non_null(greedy);
            check_greedy(s, greedy, line, &st);
            free(greedy);
            greedy = NULL;
        } else if (strncmp(line, "top ", 4) == 0) {
            assert_non_null(logits);
            check_top(line, logits, m->hp.n_vocab, n_toks, tol, &st, &row, &row_std);
        } else if (strncmp(line, "sub ", 4) == 0) {
            assert_non_null(row);
            for (int i = 0; i < n_subset; i++) assert_true((uint32_t)subset[i] < m->hp.n_vocab);
            check_sub(line, row, row_std, subset, n_subset, &st);
        }
    }
    fclose(f);
    free(line);
    free(logits);
    free(greedy);
    llmi_session_free(s);
    llmi_model_free(m);
    printf("# %s (%s activations in llama.cpp): %d positions, %d logits, max |diff| %.2e std (limit %.0e), "
           "argmax checked at %d (smallest gap %.3f std), greedy %d/%d identical (%d steps)\n",
           name, act, st.positions, st.values, st.max_rel, tol,
           st.argmax_checked, st.min_gap_rel, st.greedy_same, st.greedy_prompts, st.greedy_steps);
    *out = st;
    *tol_out = tol;
}

static void run_case(void **state) {
    const ref_case *c = *state;
    ref_stats st;
    double tol;
    compare_reference(c->name, NULL, &st, &tol);
    assert_true(st.positions >= 50);
    assert_true(st.max_rel <= tol);
    assert_true(st.argmax_checked >= st.positions * 3 / 4);
    assert_int_equal(st.argmax_wrong, 0);
    assert_true(st.greedy_prompts >= 2);
    assert_int_equal(st.greedy_same, st.greedy_prompts);
    assert_true(st.greedy_steps >= 8 * st.greedy_prompts);
}

/* The reference model with rope_freqs is one where the divisors change the
 * logits far beyond the tolerance, so agreeing with llama.cpp shows they
 * are applied as llama.cpp applies them. */
static void test_rope_freqs_matter(void **state) {
    (void)state;
    llmi_arch without = *llmi_arch_find("llama");
    without.model[LLMI_ROLE_ROPE_FREQS] = LLMI_ABSENT;
    ref_stats st;
    double tol;
    printf("# without rope_freqs:\n");
    compare_reference("llama3-rope-freqs", &without, &st, &tol);
    assert_true(st.max_rel > 100 * tol);
}

/* On the gemma3 reference model (window 5 over sequences of up to 40) the
 * window, and the windowed layers' own rope base, each change the logits
 * far beyond the tolerance: agreeing with llama.cpp shows both are applied
 * as llama.cpp applies them (including the mask's p - q < window). */
static void test_sliding_window_matters(void **state) {
    (void)state;
    llmi_arch no_window = *llmi_arch_find("gemma3"), one_base = no_window;
    no_window.swa = LLMI_SWA_NONE;
    one_base.swa_rope_base = 0;
    ref_stats st;
    double tol;
    printf("# without the window:\n");
    compare_reference("gemma3", &no_window, &st, &tol);
    assert_true(st.max_rel > 20 * tol);
    printf("# with the file's rope base on every layer:\n");
    compare_reference("gemma3", &one_base, &st, &tol);
    assert_true(st.max_rel > 20 * tol);
}

/* Linear RoPE scaling: on both scaled reference models, ignoring the
 * factor (the file's positions unscaled) or scaling gemma3's windowed
 * layers too (which llama.cpp does not) changes the logits far beyond the
 * tolerance, so agreeing with llama.cpp shows the factor is applied where
 * and as llama.cpp applies it. The hparams are patched after loading. */
static void test_rope_scaling_matters(void **state) {
    (void)state;
    static const struct {
        const char *name;
        float global, windowed;
    } cases[] = {{"llama-rope-linear", 1.0f, 1.0f},
                 {"gemma3-rope-linear", 1.0f, 1.0f},
                 {"gemma3-rope-linear", 0.125f, 0.125f}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ref_stats st;
        double tol;
        printf("# %s with freq_scale %g (global) / %g (windowed):\n", cases[i].name,
               (double)cases[i].global, (double)cases[i].windowed);
        g_rope_override = true;
        g_rope_global = cases[i].global;
        g_rope_windowed = cases[i].windowed;
        compare_reference(cases[i].name, NULL, &st, &tol);
        g_rope_override = false;
        assert_true(st.max_rel > 20 * tol);
    }
}

/* The generator's malformed files: refused with the status and a message
 * naming the tensor. */
static void test_bad_files(void **state) {
    (void)state;
    static const struct {
        const char *file;
        llm_status want;
        const char *message;
    } cases[] = {
        {"phi3-missing-qkv", LLM_ERR_BAD_FORMAT, "tensor 'blk.0.attn_qkv.weight' is missing"},
        {"phi3-short-qkv", LLM_ERR_BAD_FORMAT,
         "tensor 'blk.0.attn_qkv.weight' has shape [64, 64] (2 dims), expected [64, 128]"},
        {"phi3-unfused-up", LLM_ERR_BAD_FORMAT,
         "tensor 'blk.0.ffn_up.weight' has shape [64, 96] (2 dims), expected [64, 192]"},
        {"phi3-rope-factors", LLM_ERR_UNSUPPORTED,
         "tensor 'rope_factors_long.weight' (LongRoPE scaling of 128k-context models) is not "
         "supported"},
        {"llama-zero-rope-freqs", LLM_ERR_BAD_FORMAT,
         "tensor 'rope_freqs.weight' has factor 0 at 0 (must be > 0)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/arch/%s.gguf",
                 env_or("LLM_TEST_MODELS", "build/test-models"), cases[i].file);
        llm_model *m = (llm_model *)0x1;
        llm_status st = llmi_model_load(path, true, &m);
        printf("# %s: %s\n", cases[i].file, llmi_error_message());
        assert_null(m);
        assert_int_equal(st, cases[i].want);
        assert_non_null(strstr(llmi_error_message(), cases[i].message));
        assert_non_null(strstr(llmi_error_message(), path));
    }
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const ref_case *)a)->name, ((const ref_case *)b)->name);
}

int main(void) {
    char dir_path[1024];
    snprintf(dir_path, sizeof dir_path, "%s/models/arch-reference",
             env_or("LLM_TEST_DATA", "tests"));
    DIR *dir = opendir(dir_path);
    if (!dir) {
        fprintf(stderr, "cannot open %s\n", dir_path);
        return 1;
    }
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL && n < MAX_MODELS) {
        size_t len = strlen(e->d_name);
        if (len <= 4 || len - 4 >= sizeof g_cases[0].name || strcmp(e->d_name + len - 4, ".txt"))
            continue;
        memcpy(g_cases[n].name, e->d_name, len - 4);
        g_cases[n].name[len - 4] = '\0';
        n++;
    }
    closedir(dir);
    qsort(g_cases, n, sizeof g_cases[0], by_name);
    if (n == 0) {
        fprintf(stderr, "no reference files in %s\n", dir_path);
        return 1;
    }
    struct CMUnitTest tests[MAX_MODELS + 4];
    for (size_t i = 0; i < n; i++)
        tests[i] = (struct CMUnitTest){g_cases[i].name, run_case, NULL, NULL, &g_cases[i]};
    tests[n++] = (struct CMUnitTest){"rope_freqs_matter", test_rope_freqs_matter, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"sliding_window_matters", test_sliding_window_matters, NULL,
                                     NULL, NULL};
    tests[n++] = (struct CMUnitTest){"rope_scaling_matters", test_rope_scaling_matters, NULL, NULL,
                                     NULL};
    tests[n++] = (struct CMUnitTest){"bad_files", test_bad_files, NULL, NULL, NULL};
    return _cmocka_run_group_tests("arch_reference", tests, n, NULL, NULL);
}
