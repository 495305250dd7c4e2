/* Our tokenizer and forward pass against llama.cpp (through llama-cpp-python)
 * on the real SmolLM2-135M-Instruct Q4_1 file. The reference data and the
 * script that made it are in tests/golden/.
 *
 * Two arithmetic modes are checked.
 *
 * f32 activations (the closest to exact arithmetic): llama.cpp rounds
 * activations to 8 bits (q8_1) before each Q4_1 matmul, so its logits carry
 * rounding noise: a float64 NumPy forward pass over the same dequantized
 * weights differs from llama.cpp by 0.1-0.3 typically and up to 1.7 at worst,
 * on logits of size 5-30, and picks llama.cpp's top-1 at 98.0% of positions
 * (the misses are near-ties). So here we require a mean |diff| <= 0.25 and a
 * max |diff| <= 2.0 on llama.cpp's top-5 logits, top-1 agreement >= 98%, the
 * same top-1 at EVERY position where llama.cpp's top-1 leads its top-2 by
 * more than 0.5 (rounding cannot flip those), and at least 4 of 5 greedy
 * continuations identical.
 *
 * 8-bit activations (the default, as llama.cpp computes): both we and
 * llama.cpp round activations, so each side carries its own rounding noise
 * and near-ties fall either way. Our own three SIMD levels, which differ only
 * in float summation order, land between 97.4% and 99.3% top-1 agreement with
 * llama.cpp and differ from each other by as much as from llama.cpp. So we
 * require the same logit bounds, top-1 >= 97%, 100% where llama.cpp's margin
 * exceeds 0.5, and every greedy continuation identical up to a position where
 * our logits for our token and llama.cpp's differ by less than 0.5.
 *
 * A real bug (wrong RoPE pairing, off-by-one position, bad dequantization)
 * moves logits by several units and fails all of these.
 *
 * Gemma 3 270M (Q5_0/Q8_0/Q4_K/Q6_K, LLM_TEST_MODEL_GEMMA3) gets the same
 * checks on its own files (tests/golden/gemma3-*.txt: prompts starting with
 * <bos>, 16-token greedy runs, one past the 512-position sliding window)
 * with the bounds of gemma3_golden below, greedy in 8-bit arithmetic only;
 * its tokenizer is checked from the GGUF's metadata alone.
 *
 * The forward passes run on the device of LLM_TEST_BACKEND / LLM_TEST_TP
 * (device_util.h; tokenization needs none), with the same bounds: a backend
 * that keeps f32 activations (step_set_f32_activations) computes what the
 * CPU does up to float summation order, far inside the bounds above, and
 * its default arithmetic rounds activations no coarser than 8 bits (the
 * CUDA backend: bf16 into its matmuls of more than 8 rows). A backend
 * without the f32 entry skips the f32 tests rather than run them in its
 * default arithmetic under the f32 bounds. A model the device cannot split
 * (tensor parallelism) skips its tests. LLM_TEST_FILTER=test_smollm2_*
 * runs the SmolLM2 tests only (no Gemma 3 file needed). */
#include "device_util.h"
#include "feed_util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

enum { MAX_TOK = 1024, LINE = 65536 };

/* One model's reference files and what we require of our results. */
typedef struct golden_spec {
    const char *prefix;     /* tests/golden/<prefix>-*.txt */
    const char *model_env;  /* environment variable naming the GGUF file */
    int min_tok_rows;
    int min_positions;
    double min_agree_f32, min_agree_8bit; /* teacher-forced top-1 agreement */
    double max_mean_diff, max_diff;       /* on llama.cpp's top-5 logits */
    double clear_margin;                  /* top-1 must agree above this llama.cpp margin */
    int greedy_prompts, min_identical_f32;
    uint32_t n_ctx; /* as in the file's header */
} golden_spec;

static const golden_spec smollm2_golden = {
    .prefix = "smollm2", .model_env = "LLM_TEST_MODEL", .min_tok_rows = 40,
    .min_positions = 200, .min_agree_f32 = 0.98, .min_agree_8bit = 0.97,
    .max_mean_diff = 0.25, .max_diff = 2.0, .clear_margin = 0.5,
    .greedy_prompts = 5, .min_identical_f32 = 4, .n_ctx = 512,
};

static const golden_spec gemma3_golden = {
    .prefix = "gemma3", .model_env = "LLM_TEST_MODEL_GEMMA3", .min_tok_rows = 100,
    .min_positions = 150, .min_agree_f32 = 0.96, .min_agree_8bit = 0.95,
    .max_mean_diff = 0.25, .max_diff = 2.0, .clear_margin = 0.5,
    .greedy_prompts = 4, .n_ctx = 1024, /* greedy with 8-bit activations only */
};

static llm_model *g_model; /* the model of the test that runs */
static llm_model *g_smollm2, *g_gemma3;

static FILE *open_golden(const golden_spec *g, const char *kind) {
    char path[1024];
    const char *dir = getenv("LLM_TEST_DATA");
    snprintf(path, sizeof path, "%s/golden/%s-%s.txt", dir ? dir : "tests", g->prefix, kind);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    return f;
}

/* Parses whitespace-separated ints from s until end or '|'; returns count. */
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

static size_t unhex(const char *h, char *out) {
    if (h[0] == '-') return 0;
    size_t n = 0;
    for (; h[0] && h[1] && h[0] != ' '; h += 2) {
        unsigned v;
        sscanf(h, "%2x", &v);
        out[n++] = (char)v;
    }
    return n;
}

static void tokenization(const golden_spec *g, const llmi_tokenizer *tok) {
    FILE *f = open_golden(g, "tokenize");
    char *line = malloc(LINE), *text = malloc(LINE);
    llm_token want[MAX_TOK], got[MAX_TOK];
    int rows = 0, same = 0;
    while (fgets(line, LINE, f)) {
        if (strncmp(line, "tok ", 4) != 0) continue;
        int special, add_bos, off = 0;
        char hex[LINE / 2];
        if (sscanf(line, "tok %d %d %32767s :%n", &special, &add_bos, hex, &off) != 3)
            fail_msg("bad row: %s", line);
        size_t len = unhex(hex, text);
        char *p = line + off;
        size_t n_want = parse_ids(&p, want, MAX_TOK), n_got = 0;
        uint32_t flags = (special ? LLM_TOKENIZE_PARSE_SPECIAL : 0) |
                         (add_bos ? LLM_TOKENIZE_ADD_SPECIAL : 0);
        assert_int_equal(llmi_tokenize(tok, text, len, flags, got, MAX_TOK, &n_got), LLM_OK);
        rows++;
        if (n_got == n_want && memcmp(got, want, n_got * sizeof *got) == 0) {
            same++;
        } else {
            printf("# mismatch on text %.*s (special %d): want %zu tokens, got %zu\n", (int)len,
                   text, special, n_want, n_got);
        }
    }
    fclose(f);
    free(line);
    free(text);
    printf("# %s tokenization: %d/%d rows identical to llama.cpp\n", g->prefix, same, rows);
    assert_true(rows >= g->min_tok_rows);
    assert_int_equal(same, rows);
}

/* A build without Q5_0 weights (the Gemma 3 file's attention and FFN
 * type) cannot read the file at all; that, and only that, skips the test. */
static void skip_without_q5_0(const golden_spec *g, const char *path) {
    if (strstr(llmi_error_message(), "(Q5_0), which is not supported")) {
        printf("# SKIPPED: %s=%s needs Q5_0 support: %s\n", g->model_env, path,
               llmi_error_message());
        skip();
    }
}

static void test_smollm2_tokenization(void **state) {
    (void)state;
    tokenization(&smollm2_golden, g_smollm2->tok);
}

/* From the file's metadata only: the tokenizer needs none of the weights. */
static void test_gemma3_tokenization(void **state) {
    (void)state;
    const char *path = getenv(gemma3_golden.model_env);
    if (!path) fail_msg("%s is not set", gemma3_golden.model_env);
    llmi_gguf *file = NULL;
    llmi_tokenizer *tok = NULL;
    if (llmi_gguf_open(path, true, &file) != LLM_OK) {
        skip_without_q5_0(&gemma3_golden, path);
        fail_msg("%s=%s: %s", gemma3_golden.model_env, path, llmi_error_message());
    }
    if (llmi_tokenizer_load(file, &tok) != LLM_OK)
        fail_msg("%s=%s: %s", gemma3_golden.model_env, path, llmi_error_message());
    assert_int_equal(llmi_tokenizer_n_vocab(tok), 262144);
    assert_true(llmi_tokenizer_add_bos(tok));
    assert_int_equal(llmi_tokenizer_bos(tok), 2);
    tokenization(&gemma3_golden, tok);
    /* As llama.cpp's vocabulary says: <eos> (1) and <end_of_turn> (106)
     * end generation, <start_of_turn> (105) does not. */
    assert_true(llmi_tokenizer_is_eog(tok, 1));
    assert_true(llmi_tokenizer_is_eog(tok, 106));
    assert_false(llmi_tokenizer_is_eog(tok, 105));
    /* <0xNN> byte tokens come back as their bytes, and no leading space is
     * dropped or added (add_space_prefix false). */
    const char text[] = " a\x01\xe2\x82\xac b";
    llm_token ids[32];
    size_t n = 0, n_text = 0;
    char back[64];
    assert_int_equal(llmi_tokenize(tok, text, sizeof text - 1, 0, ids, 32, &n), LLM_OK);
    assert_int_equal(llmi_detokenize(tok, ids, n, 0, back, sizeof back, &n_text), LLM_OK);
    assert_int_equal(n_text, sizeof text - 1);
    assert_memory_equal(back, text, n_text);
    llmi_tokenizer_free(tok);
    llmi_gguf_close(file);
}

/* Teacher-forced logits of every position of `toks`. */
static float *all_logits(llm_session *s, const llm_token *toks, size_t n) {
    uint32_t V = g_model->hp.n_vocab;
    float *logits = malloc(n * V * sizeof *logits);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &seq, (uint32_t)n), LLM_OK);
    llmi_batch_row *rows = calloc(n, sizeof *rows);
    for (size_t i = 0; i < n; i++) rows[i] = (llmi_batch_row){toks[i], (uint32_t)i, &seq, true};
    assert_int_equal(llmi_engine_run(s->eng, rows, (uint32_t)n, logits), LLM_OK);
    free(rows);
    llmi_kv_seq_destroy(s->kv, &seq);
    return logits;
}

/* A session on the test device; made before a test holds anything else,
 * since the device may refuse the model (the test then skips). */
static llm_session *make_session(const golden_spec *g, uint32_t threads, bool f32_activations) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_ctx = g->n_ctx;
    p.n_threads = threads;
    llm_session *s = NULL;
    if (create_test_session(g_model, &p, &s) != LLM_OK)
        fail_msg("session for %s: %s", g->prefix, llm_last_error());
    if (f32_activations && !s->eng->ops->step_set_f32_activations) {
        printf("# skipped: backend '%s' has no f32 activations (step_set_f32_activations)\n",
               s->eng->ops->name);
        llm_session_free(s);
        skip();
    }
    llmi_engine_set_f32_activations(s->eng, f32_activations);
    return s;
}

static void teacher_forced(const golden_spec *g, bool f32_activations) {
    llm_session *s = make_session(g, 2, f32_activations);
    FILE *f = open_golden(g, "logits");
    char *line = malloc(LINE);
    llm_token toks[MAX_TOK];
    size_t n_toks = 0;
    float *logits = NULL;
    uint32_t V = g_model->hp.n_vocab;
    int positions = 0, top1_same = 0, values = 0, clear = 0, clear_same = 0;
    double sum_diff = 0, max_diff = 0;
    while (fgets(line, LINE, f)) {
        if (strncmp(line, "prompt ", 7) == 0) {
            char *p = strchr(line, ':') + 1;
            n_toks = parse_ids(&p, toks, MAX_TOK);
            free(logits);
            logits = all_logits(s, toks, n_toks);
        } else if (strncmp(line, "pos ", 4) == 0) {
            int pi, pos, top1, off = 0;
            sscanf(line, "pos %d %d %d :%n", &pi, &pos, &top1, &off);
            assert_true(pos >= 0 && (size_t)pos < n_toks);
            const float *row = logits + (size_t)pos * V;
            positions++;
            top1_same += llmi_argmax(row, V) == top1;
            char *p = line + off;
            double ref[5];
            for (int k = 0; k < 5; k++) {
                int id;
                double want;
                int used = 0;
                sscanf(p, " %d:%lf%n", &id, &want, &used);
                p += used;
                ref[k] = want;
                double d = fabs(row[id] - want);
                sum_diff += d;
                values++;
                if (d > max_diff) max_diff = d;
            }
            if (ref[0] - ref[1] > g->clear_margin) {
                clear++;
                clear_same += llmi_argmax(row, V) == top1;
            }
        }
    }
    fclose(f);
    free(line);
    free(logits);
    const char *backend = s->eng->ops->name; /* static text of the backend's table */
    llm_session_free(s);
    double agree = (double)top1_same / positions, mean = sum_diff / values;
    printf("# %s on %s, %s activations, teacher-forced: %d positions, top-1 agreement %.2f%% "
           "(%d/%d where llama.cpp's margin > %.2f), logit |diff| mean %.4f max %.4f\n",
           g->prefix, backend, f32_activations ? "f32" : "8-bit", positions, 100 * agree, clear_same,
           clear, g->clear_margin, mean, max_diff);
    assert_true(positions >= g->min_positions);
    assert_true(agree >= (f32_activations ? g->min_agree_f32 : g->min_agree_8bit));
    assert_true(mean <= g->max_mean_diff);
    assert_true(max_diff <= g->max_diff);
    assert_int_equal(clear_same, clear);
}

static void greedy(const golden_spec *g, bool f32_activations) {
    llm_session *s = make_session(g, 2, f32_activations);
    FILE *f = open_golden(g, "greedy");
    char *line = malloc(LINE);
    llmi_kv_seq seq = {0};
    float *logits = malloc(g_model->hp.n_vocab * sizeof(float));
    assert_non_null(logits);
    int prompts = 0, identical = 0, near_tie_only = 0;
    while (fgets(line, LINE, f)) {
        if (strncmp(line, "greedy ", 7) != 0) continue;
        llm_token prompt[MAX_TOK], want[MAX_TOK], got[MAX_TOK];
        char *p = strchr(line, ':') + 1;
        size_t n_prompt = parse_ids(&p, prompt, MAX_TOK);
        assert_true(*p == '|');
        p++;
        size_t n_want = parse_ids(&p, want, MAX_TOK);
        llmi_kv_seq_release(s->kv, &seq);
        assert_int_equal(test_feed(s, &seq, prompt, n_prompt, logits), LLM_OK);
        size_t n_got = 0;
        for (; n_got < n_want; n_got++) {
            got[n_got] = llmi_argmax(logits, g_model->hp.n_vocab);
            if (llmi_tokenizer_is_eog(g_model->tok, got[n_got])) {
                n_got++;
                break;
            }
            assert_int_equal(test_feed(s, &seq, &got[n_got], 1, logits), LLM_OK);
        }
        size_t first_diff = 0;
        while (first_diff < n_want && first_diff < n_got && got[first_diff] == want[first_diff])
            first_diff++;
        bool same = n_got == n_want && first_diff == n_want;
        double margin = 0;
        if (!same && first_diff < n_want && first_diff < n_got) {
            /* Our logits at the divergence, for our token and llama.cpp's. */
            llmi_kv_seq_release(s->kv, &seq);
            llm_token ctx[2 * MAX_TOK];
            memcpy(ctx, prompt, n_prompt * sizeof *ctx);
            memcpy(ctx + n_prompt, want, first_diff * sizeof *ctx);
            assert_int_equal(test_feed(s, &seq, ctx, n_prompt + first_diff, logits),
                             LLM_OK);
            margin = logits[got[first_diff]] - logits[want[first_diff]];
        }
        printf("# %s, %s greedy prompt %d: %s (first difference at %zu of %zu, our margin "
               "%.3f)\n",
               g->prefix, f32_activations ? "f32" : "8-bit", prompts, same ? "identical" : "differs",
               first_diff, n_want, margin);
        prompts++;
        identical += same;
        near_tie_only += same || margin < g->clear_margin;
    }
    fclose(f);
    free(line);
    llmi_kv_seq_destroy(s->kv, &seq);
    free(logits);
    const char *backend = s->eng->ops->name; /* static text of the backend's table */
    llm_session_free(s);
    printf("# %s on %s, %s greedy: %d/%d continuations identical\n", g->prefix, backend,
           f32_activations ? "f32" : "8-bit", identical, prompts);
    assert_int_equal(prompts, g->greedy_prompts);
    if (f32_activations) assert_true(identical >= g->min_identical_f32);
    assert_int_equal(near_tie_only, prompts);
}

/* The model of a spec, loaded on first use and kept for the group. */
static llm_model *use_model(const golden_spec *g, llm_model **slot) {
    if (!*slot) {
        const char *path = getenv(g->model_env);
        if (!path) fail_msg("%s is not set", g->model_env);
        if (llmi_model_load(path, true, slot) != LLM_OK) {
            skip_without_q5_0(g, path);
            fail_msg("cannot load %s=%s: %s", g->model_env, path, llmi_error_message());
        }
    }
    return g_model = *slot;
}

#define GOLDEN_TESTS(name, spec, slot)                                                             \
    static void test_##name##teacher_forced_f32(void **state) {                                   \
        (void)state;                                                                               \
        use_model(&spec, &slot);                                                                   \
        teacher_forced(&spec, true);                                                               \
    }                                                                                              \
    static void test_##name##teacher_forced_8bit(void **state) {                                  \
        (void)state;                                                                               \
        use_model(&spec, &slot);                                                                   \
        teacher_forced(&spec, false);                                                              \
    }                                                                                              \
    static void test_##name##greedy_f32(void **state) {                                           \
        (void)state;                                                                               \
        use_model(&spec, &slot);                                                                   \
        greedy(&spec, true);                                                                       \
    }                                                                                              \
    static void test_##name##greedy_8bit(void **state) {                                          \
        (void)state;                                                                               \
        use_model(&spec, &slot);                                                                   \
        greedy(&spec, false);                                                                      \
    }

GOLDEN_TESTS(smollm2_, smollm2_golden, g_smollm2)

/* Gemma 3: greedy runs in the default 8-bit arithmetic only. With f32
 * activations every quantized matmul dequantizes its weights, and each step
 * multiplies the 262144-row output matrix, so the greedy runs (one with a
 * 629-token prompt) would take most of the test's time, under ASan
 * minutes; the teacher-forced logits cover the f32 path. */
static void test_gemma3_teacher_forced_f32(void **state) {
    (void)state;
    use_model(&gemma3_golden, &g_gemma3);
    teacher_forced(&gemma3_golden, true);
}
static void test_gemma3_teacher_forced_8bit(void **state) {
    (void)state;
    use_model(&gemma3_golden, &g_gemma3);
    teacher_forced(&gemma3_golden, false);
}
static void test_gemma3_greedy_8bit(void **state) {
    (void)state;
    use_model(&gemma3_golden, &g_gemma3);
    greedy(&gemma3_golden, false);
}

static int setup(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path || llmi_model_load(path, true, &g_smollm2) != LLM_OK) {
        fprintf(stderr, "cannot load the model at LLM_TEST_MODEL=%s: %s\n", path ? path : "(unset)",
                llmi_error_message());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_smollm2);
    llmi_model_free(g_gemma3);
    return 0;
}

int main(void) {
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2_tokenization),
        device_test(test_smollm2_teacher_forced_f32),
        device_test(test_smollm2_teacher_forced_8bit),
        device_test(test_smollm2_greedy_f32),
        device_test(test_smollm2_greedy_8bit),
        cmocka_unit_test(test_gemma3_tokenization),
        device_test(test_gemma3_teacher_forced_f32),
        device_test(test_gemma3_teacher_forced_8bit),
        device_test(test_gemma3_greedy_8bit),
    };
    return run_device_tests(tests, setup, teardown);
}
