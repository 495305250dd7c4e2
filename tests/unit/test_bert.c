/* BERT encoders (the "bert" architecture row, the CPU encoder forward pass,
 * embeddings of whole inputs) on sentence-transformers' all-MiniLM-L6-v2
 * read from its Hugging Face folder ($LLM_TEST_MODEL_MINILM, `make
 * model-minilm`; every test skips when it is absent).
 *
 * The reference is tests/golden/minilm-embed.txt, recorded by
 * tests/golden/make_bert_golden.py with a NumPy forward pass written from
 * the BERT paper's equations (tests/golden/bert_reference.py, float64) and
 * the `tokenizers` package's ids: our tokenizer must give the same ids, and
 * our mean-pooled, normalized vectors (the model's Pooling config) a cosine
 * of at least 0.9999 to the reference for every sentence; per-token states
 * too. Then: batching changes nothing, inputs never split across passes,
 * and inputs past the learned positions or a pass are refused. */
#include "device_util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

enum { MAX_TEXTS = 16, MAX_IDS = 256, MAX_EMBD = 384, LINE = 1 << 16 };

typedef struct golden {
    size_t n_texts, n_embd, n_none;
    char text[MAX_TEXTS][1024];
    size_t text_len[MAX_TEXTS];
    llm_token ids[MAX_TEXTS][MAX_IDS];
    size_t n_ids[MAX_TEXTS];
    float mean[MAX_TEXTS][MAX_EMBD];
    float none[MAX_IDS][MAX_EMBD]; /* per-token states of text 0 */
} golden;

static llm_model *g_model;
static golden *g_ref;

static size_t parse_floats(const char *s, float *out, size_t cap) {
    size_t n = 0;
    for (;;) {
        char *end;
        float v = strtof(s, &end);
        if (end == s)
            return n;
        if (n < cap)
            out[n] = v;
        n++;
        s = end;
    }
}

static size_t unhex(const char *h, char *out, size_t cap) {
    size_t n = 0;
    for (; h[0] && h[1] && h[0] != ' ' && n < cap; h += 2) {
        unsigned v;
        if (sscanf(h, "%2x", &v) != 1)
            break;
        out[n++] = (char)v;
    }
    return n;
}

static void load_golden(golden *g) {
    char path[1024];
    const char *dir = getenv("LLM_TEST_DATA");
    snprintf(path, sizeof path, "%s/golden/minilm-embed.txt", dir ? dir : "tests");
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    char *line = malloc(LINE);
    assert_non_null(line);
    while (fgets(line, LINE, f)) {
        char *colon = strstr(line, " : ");
        unsigned i = 0, pos = 0;
        char hex[2048];
        if (line[0] == '#' || !colon)
            continue;
        if (sscanf(line, "text %u %2047s", &i, hex) == 2 && i < MAX_TEXTS) {
            g->text_len[i] = unhex(hex, g->text[i], sizeof g->text[i]);
            char *s = colon + 3, *end;
            size_t n = 0;
            for (long v; (v = strtol(s, &end, 10)), end != s && n < MAX_IDS; s = end)
                g->ids[i][n++] = (llm_token)v;
            g->n_ids[i] = n;
            if (i + 1 > g->n_texts)
                g->n_texts = i + 1;
        } else if (sscanf(line, "mean %u", &i) == 1 && i < MAX_TEXTS) {
            g->n_embd = parse_floats(colon + 3, g->mean[i], MAX_EMBD);
        } else if (sscanf(line, "none 0 %u", &pos) == 1 && pos < MAX_IDS) {
            assert_int_equal(parse_floats(colon + 3, g->none[pos], MAX_EMBD), g->n_embd);
            if (pos + 1 > g->n_none)
                g->n_none = pos + 1;
        }
    }
    free(line);
    fclose(f);
    assert_true(g->n_texts >= 10);
    assert_int_equal(g->n_embd, MAX_EMBD);
    assert_true(g->n_none == g->n_ids[0]);
}

static double cosine(const float *a, const float *b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)a[i] - b[i]) > m)
            m = fabs((double)a[i] - b[i]);
    return m;
}

static llm_session *new_session(uint32_t max_batch) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = 1024;
    p.max_batch_tokens = max_batch;
    llm_session *s = NULL;
    assert_int_equal(create_test_session(g_model, &p, &s), LLM_OK);
    return s;
}

/* Embeds golden texts [first, first + n) in one call, normalized with the
 * model's pooling. */
static llm_status embed_texts(llm_session *s, size_t first, size_t n, llm_pooling pooling,
                              float *out, size_t cap) {
    const llm_token *inputs[MAX_TEXTS];
    size_t lens[MAX_TEXTS];
    for (size_t i = 0; i < n; i++) {
        inputs[i] = g_ref->ids[first + i];
        lens[i] = g_ref->n_ids[first + i];
    }
    llm_embed_params ep;
    llm_embed_params_init(&ep);
    ep.pooling = pooling;
    size_t n_out = 0;
    return llm_session_embed(s, inputs, lens, n, &ep, out, cap, &n_out);
}

#define NEED_MODEL()                                                                               \
    do {                                                                                           \
        if (!g_model)                                                                              \
            skip();                                                                                \
    } while (0)

/* WordPiece ids with [CLS] ... [SEP], as `tokenizers` gives them. */
static void test_tokens(void **state) {
    (void)state;
    NEED_MODEL();
    for (size_t i = 0; i < g_ref->n_texts; i++) {
        llm_token got[MAX_IDS];
        size_t n = 0;
        assert_int_equal(llm_tokenize(g_model, g_ref->text[i], g_ref->text_len[i],
                                      LLM_TOKENIZE_ADD_SPECIAL, got, MAX_IDS, &n),
                         LLM_OK);
        assert_int_equal(n, g_ref->n_ids[i]);
        assert_memory_equal(got, g_ref->ids[i], n * sizeof *got);
    }
}

static void test_mean_pooled(void **state) {
    (void)state;
    NEED_MODEL();
    llm_pooling pooling;
    assert_int_equal(llm_model_pooling(g_model, &pooling), LLM_OK);
    assert_int_equal(pooling, LLM_POOLING_MEAN); /* 1_Pooling/config.json */
    llm_session *s = new_session(512);
    static float out[MAX_TEXTS * MAX_EMBD];
    assert_int_equal(embed_texts(s, 0, g_ref->n_texts, LLM_POOLING_MODEL, out, sizeof out / 4),
                     LLM_OK);
    double worst_cos = 1, worst_diff = 0;
    for (size_t i = 0; i < g_ref->n_texts; i++) {
        const float *v = out + i * MAX_EMBD;
        double c = cosine(v, g_ref->mean[i], MAX_EMBD),
               d = max_abs_diff(v, g_ref->mean[i], MAX_EMBD);
        if (c < 0.9999)
            fail_msg("text %zu: cosine %.7f to the reference (want >= 0.9999)", i, c);
        worst_cos = c < worst_cos ? c : worst_cos;
        worst_diff = d > worst_diff ? d : worst_diff;
    }
    print_message("%zu sentences: min cosine %.8f, max abs diff %.3g\n", g_ref->n_texts, worst_cos,
                  worst_diff);
    assert_true(worst_diff < 1e-4);
    llm_session_free(s);
}

/* Every token's final state: full (bidirectional) attention, so the first
 * token's state already depends on the last one. */
static void test_per_token(void **state) {
    (void)state;
    NEED_MODEL();
    llm_session *s = new_session(512);
    static float out[MAX_IDS * MAX_EMBD];
    assert_int_equal(embed_texts(s, 0, 1, LLM_POOLING_NONE, out, sizeof out / 4), LLM_OK);
    double worst = 1;
    for (size_t p = 0; p < g_ref->n_none; p++) {
        double c = cosine(out + p * MAX_EMBD, g_ref->none[p], MAX_EMBD);
        worst = c < worst ? c : worst;
    }
    print_message("%zu tokens: min cosine %.8f\n", g_ref->n_none, worst);
    assert_true(worst >= 0.9999);
    llm_session_free(s);
}

/* Alone or together, in one pass or several (inputs wait for the next pass
 * rather than split), the vectors are the same. */
static void test_batching(void **state) {
    (void)state;
    NEED_MODEL();
    static float together[MAX_TEXTS * MAX_EMBD], alone[MAX_EMBD], small[MAX_TEXTS * MAX_EMBD];
    const size_t n = g_ref->n_texts;
    llm_session *s = new_session(512);
    assert_int_equal(embed_texts(s, 0, n, LLM_POOLING_MEAN, together, n * MAX_EMBD), LLM_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(embed_texts(s, i, 1, LLM_POOLING_MEAN, alone, MAX_EMBD), LLM_OK);
        assert_true(max_abs_diff(alone, together + i * MAX_EMBD, MAX_EMBD) < 1e-6);
    }
    llm_session_free(s);
    /* passes of 160 rows: the longest input (about 110 tokens) cannot share
     * one with most of the others */
    size_t longest = 0;
    for (size_t i = 0; i < n; i++)
        longest = g_ref->n_ids[i] > longest ? g_ref->n_ids[i] : longest;
    assert_true(longest > 80 && longest < 160);
    s = new_session(160);
    assert_int_equal(embed_texts(s, 0, n, LLM_POOLING_MEAN, small, n * MAX_EMBD), LLM_OK);
    assert_true(max_abs_diff(small, together, n * MAX_EMBD) < 1e-6);
    llm_session_free(s);
}

static void test_limits(void **state) {
    (void)state;
    NEED_MODEL();
    static llm_token ids[600];
    static float out[600 * MAX_EMBD];
    for (size_t i = 0; i < 600; i++)
        ids[i] = 1037; /* "a" */
    const llm_token *in = ids;
    llm_embed_params ep;
    llm_embed_params_init(&ep);
    size_t n_out = 0, n = 513;
    /* past the 512 learned positions */
    llm_session *s = new_session(1024);
    assert_int_equal(llm_session_embed(s, &in, &n, 1, &ep, out, MAX_EMBD, &n_out),
                     LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "512 positions"));
    n = 512;
    assert_int_equal(llm_session_embed(s, &in, &n, 1, &ep, out, MAX_EMBD, &n_out), LLM_OK);
    llm_session_free(s);
    /* longer than one pass: never split */
    s = new_session(64);
    n = 65;
    assert_int_equal(llm_session_embed(s, &in, &n, 1, &ep, out, MAX_EMBD, &n_out), LLM_ERR_LIMIT);
    assert_non_null(strstr(llm_last_error(), "one pass"));
    n = 64;
    assert_int_equal(llm_session_embed(s, &in, &n, 1, &ep, out, MAX_EMBD, &n_out), LLM_OK);
    llm_session_free(s);
}

static int setup(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL_MINILM");
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/model.safetensors", path ? path : "");
    FILE *f = path ? fopen(cfg, "rb") : NULL;
    if (!f) {
        fprintf(stderr, "all-MiniLM-L6-v2 not found (LLM_TEST_MODEL_MINILM=%s): tests skip\n",
                path ? path : "(unset)");
        return 0;
    }
    fclose(f);
    if (llm_model_load(path, NULL, &g_model) != LLM_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, llm_last_error());
        return -1;
    }
    g_ref = calloc(1, sizeof *g_ref);
    if (!g_ref)
        return -1;
    load_golden(g_ref);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llm_model_free(g_model);
    free(g_ref);
    return 0;
}

int main(void) {
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens), device_test(test_mean_pooled), device_test(test_per_token),
        device_test(test_batching),    device_test(test_limits),
    };
    return run_device_tests(tests, setup, teardown);
}
