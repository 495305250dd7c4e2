/* Architecture rows (model/arch.h) and the forward-pass features they
 * switch on. Each feature is checked on a tiny random model that carries it
 * (written by model/testmodel.c) against a plain double-precision reference
 * written here from the published model definitions: it reads the tensors by
 * their GGUF names, not through our loader's roles, and is told the features
 * by the test, not by our row. A second run with the feature's row switched
 * off shows that the feature changes the logits, so agreement means
 * something. Rows that need a feature the forward pass lacks must be refused
 * with a message naming it. */
#include "engine/engine.h"
#include "model/model.h"
#include "model/testmodel.h"
#include "session/session.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

/* What the reference does; set by each test from the model definition. */
typedef struct ref_spec {
    bool neox;            /* rope pairs (i, i + d/2) instead of (2i, 2i+1) */
    bool geglu;           /* gelu_tanh(gate) * up instead of silu(gate) * up */
    double embd_scale;    /* 1, or sqrt(n_embd) */
    double logit_softcap; /* 0 = none */
    int window;           /* > 0: windowed layers see positions q with t - q < window */
    int period;           /* 0: every layer windowed; else layer l global when
                             l % period == period - 1 */
    double swa_rope_base; /* > 0: RoPE base of the windowed layers */
} ref_spec;

static bool ref_windowed(const ref_spec *spec, int l) {
    return spec->window > 0 && (spec->period == 0 || l % spec->period != spec->period - 1);
}

/* ---- reference: tensors by GGUF name, doubles, contiguous KV ---- */

/* F32 tensor `fmt` (with layer l) as doubles, or NULL when the file lacks it. */
static double *tensor(const llm_model *m, const char *fmt, int l) {
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    const llmi_gguf_tensor *t = llmi_gguf_find_tensor(m->file, name);
    if (!t) return NULL;
    assert_int_equal(t->type, LLMI_T_F32);
    size_t n = (size_t)(t->ne[0] * (t->n_dims > 1 ? t->ne[1] : 1));
    double *out = malloc(n * sizeof *out);
    for (size_t i = 0; i < n; i++) out[i] = ((const float *)t->data)[i];
    return out;
}

/* y[rows] = W x, W row-major [rows][cols] (GGUF ne = {cols, rows}). */
static void matvec(const double *W, int rows, int cols, const double *x, double *y) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += W[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rmsnorm(double *out, const double *x, const double *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double scale = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void rope(double *v, int n_heads, int hd, int pos, double base, bool neox) {
    for (int h = 0; h < n_heads; h++) {
        double *x = v + (size_t)h * hd;
        for (int i = 0; i < hd / 2; i++) {
            double theta = pos * pow(base, -2.0 * i / hd);
            int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
            double x0 = x[a], x1 = x[b];
            x[a] = x0 * cos(theta) - x1 * sin(theta);
            x[b] = x0 * sin(theta) + x1 * cos(theta);
        }
    }
}

static void add(double *y, const double *b, int n) {
    for (int i = 0; i < n; i++) y[i] += b[i];
}

/* Logits (n_tok x n_vocab) for every position of `toks`. */
static double *ref_forward(const llm_model *m, const ref_spec *spec, const llm_token *toks,
                           int n_tok) {
    const llmi_hparams *hp = &m->hp; /* sizes only */
    int E = (int)hp->n_embd, F = (int)hp->n_ff, V = (int)hp->n_vocab, hd = (int)hp->head_dim;
    int nh = (int)hp->n_head, nkv = (int)hp->n_head_kv, L = (int)hp->n_layer;
    int qd = nh * hd, kvd = nkv * hd, group = nh / nkv;
    double eps = hp->rms_eps;
    double *kc = calloc((size_t)L * n_tok * kvd, sizeof *kc);
    double *vc = calloc((size_t)L * n_tok * kvd, sizeof *vc);
    double *logits = calloc((size_t)n_tok * V, sizeof *logits);
    double *x = calloc(E, sizeof *x), *xn = calloc(E, sizeof *xn), *q = calloc(qd, sizeof *q);
    double *o = calloc(qd, sizeof *o), *tmp = calloc(E, sizeof *tmp), *att = calloc(n_tok, 8);
    double *g = calloc(F, sizeof *g), *u = calloc(F, sizeof *u);
    double *emb = tensor(m, "token_embd.weight", 0), *out = tensor(m, "output.weight", 0);
    double *out_norm = tensor(m, "output_norm.weight", 0);
    for (int t = 0; t < n_tok; t++) {
        for (int i = 0; i < E; i++) x[i] = emb[(size_t)toks[t] * E + i] * spec->embd_scale;
        for (int l = 0; l < L; l++) {
            double *an = tensor(m, "blk.%d.attn_norm.weight", l);
            double *wq = tensor(m, "blk.%d.attn_q.weight", l);
            double *wk = tensor(m, "blk.%d.attn_k.weight", l);
            double *wv = tensor(m, "blk.%d.attn_v.weight", l);
            double *bq = tensor(m, "blk.%d.attn_q.bias", l);
            double *bk = tensor(m, "blk.%d.attn_k.bias", l);
            double *bv = tensor(m, "blk.%d.attn_v.bias", l);
            double *qn = tensor(m, "blk.%d.attn_q_norm.weight", l);
            double *kn = tensor(m, "blk.%d.attn_k_norm.weight", l);
            double *wo = tensor(m, "blk.%d.attn_output.weight", l);
            double *pan = tensor(m, "blk.%d.post_attention_norm.weight", l);
            double *fn = tensor(m, "blk.%d.ffn_norm.weight", l);
            double *wg = tensor(m, "blk.%d.ffn_gate.weight", l);
            double *wu = tensor(m, "blk.%d.ffn_up.weight", l);
            double *wd = tensor(m, "blk.%d.ffn_down.weight", l);
            double *pfn = tensor(m, "blk.%d.post_ffw_norm.weight", l);
            double *kt = kc + ((size_t)l * n_tok + t) * kvd, *vt = vc + ((size_t)l * n_tok + t) * kvd;
            rmsnorm(xn, x, an, E, eps);
            matvec(wq, qd, E, xn, q);
            matvec(wk, kvd, E, xn, kt);
            matvec(wv, kvd, E, xn, vt);
            if (bq) add(q, bq, qd), add(kt, bk, kvd), add(vt, bv, kvd);
            if (qn)
                for (int h = 0; h < nh; h++) rmsnorm(q + h * hd, q + h * hd, qn, hd, eps);
            if (kn)
                for (int h = 0; h < nkv; h++) rmsnorm(kt + h * hd, kt + h * hd, kn, hd, eps);
            bool win = ref_windowed(spec, l);
            double base = win && spec->swa_rope_base > 0 ? spec->swa_rope_base : hp->rope_base;
            int first = win && t >= spec->window ? t - spec->window + 1 : 0;
            rope(q, nh, hd, t, base, spec->neox);
            rope(kt, nkv, hd, t, base, spec->neox);
            for (int h = 0; h < nh; h++) {
                int kh = h / group;
                double mx = -INFINITY, sum = 0;
                for (int p = first; p <= t; p++) {
                    const double *kp = kc + ((size_t)l * n_tok + p) * kvd + kh * hd;
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += q[h * hd + i] * kp[i];
                    att[p] = s / sqrt(hd);
                    if (att[p] > mx) mx = att[p];
                }
                for (int p = first; p <= t; p++) sum += (att[p] = exp(att[p] - mx));
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int p = first; p <= t; p++)
                        acc += att[p] / sum * vc[((size_t)l * n_tok + p) * kvd + kh * hd + i];
                    o[h * hd + i] = acc;
                }
            }
            matvec(wo, E, qd, o, tmp);
            if (pan) rmsnorm(tmp, tmp, pan, E, eps);
            add(x, tmp, E);
            rmsnorm(xn, x, fn, E, eps);
            matvec(wg, F, E, xn, g);
            matvec(wu, F, E, xn, u);
            for (int i = 0; i < F; i++) {
                double a = g[i];
                g[i] = spec->geglu
                           ? 0.5 * a * (1 + tanh(sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)))
                           : a / (1 + exp(-a));
                g[i] *= u[i];
            }
            matvec(wd, E, F, g, tmp);
            if (pfn) rmsnorm(tmp, tmp, pfn, E, eps);
            add(x, tmp, E);
            double *all[] = {an, wq, wk, wv, bq, bk, bv, qn, kn, wo, pan, fn, wg, wu, wd, pfn};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
        }
        rmsnorm(xn, x, out_norm, E, eps);
        double *lg = logits + (size_t)t * V;
        matvec(out ? out : emb, V, E, xn, lg);
        if (spec->logit_softcap > 0)
            for (int i = 0; i < V; i++)
                lg[i] = spec->logit_softcap * tanh(lg[i] / spec->logit_softcap);
    }
    free(kc); free(vc); free(x); free(xn); free(q); free(o); free(tmp); free(att);
    free(g); free(u); free(emb); free(out); free(out_norm);
    return logits;
}

/* ---- ours ---- */

static const char *tmp_path(const char *tag) {
    static char path[512];
    snprintf(path, sizeof path, "%s/arch-%s.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp", tag);
    return path;
}

/* Loads p's file with `row` (NULL: the table's row); status and model. */
static llm_status load(const llmi_testmodel_params *p, const llmi_arch *row, llm_model **m) {
    const char *path = tmp_path(p->arch);
    assert_int_equal(llmi_testmodel_write(p, path), LLM_OK);
    llm_status st = row ? llmi_model_load_arch(path, true, row, m)
                        : llmi_model_load(path, true, m);
    remove(path);
    return st;
}

/* Our logits for every position, in chunks of `chunk` rows. */
static float *our_forward(const llm_model *m, const llm_token *toks, int n, int threads,
                          int chunk) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = (uint32_t)threads;
    sp.n_ctx = 64;
    sp.max_batch_tokens = (uint32_t)chunk;
    llm_session *s = NULL;
    assert_int_equal(llmi_session_create(m, &sp, &s), LLM_OK);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &seq, (uint32_t)n), LLM_OK);
    uint32_t V = m->hp.n_vocab;
    float *logits = malloc((size_t)n * V * sizeof *logits);
    for (size_t i = 0; i < (size_t)n * V; i++) logits[i] = NAN;
    llmi_batch_row rows[64];
    for (int done = 0; done < n; done += chunk) {
        int k = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < k; i++)
            rows[i] = (llmi_batch_row){toks[done + i], (uint32_t)(done + i), &seq, true};
        assert_int_equal(
            llmi_engine_run(s->eng, rows, (uint32_t)k, logits + (size_t)done * V),
            LLM_OK);
    }
    llmi_kv_seq_destroy(s->kv, &seq);
    llmi_session_free(s);
    return logits;
}

/* Max |a-b| relative to the largest |b|. */
static double max_rel_err(const float *a, const double *ref, size_t n) {
    double scale = 1e-9, err = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs(a[i] - ref[i]));
    return err / scale;
}

/* The pre-norm decoder (attention + gated FFN) every test row starts from. */
static llmi_arch base_row(const char *name) {
    llmi_arch a = {.name = name};
    const llmi_layer_role req[] = {LLMI_ROLE_ATTN_NORM, LLMI_ROLE_Q,        LLMI_ROLE_K,
                                   LLMI_ROLE_V,         LLMI_ROLE_O,        LLMI_ROLE_FFN_NORM,
                                   LLMI_ROLE_GATE,      LLMI_ROLE_UP,       LLMI_ROLE_DOWN};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) a.layer[req[i]] = LLMI_REQUIRED;
    a.model[LLMI_ROLE_TOKEN_EMBD] = LLMI_REQUIRED;
    a.model[LLMI_ROLE_OUTPUT_NORM] = LLMI_REQUIRED;
    a.model[LLMI_ROLE_OUTPUT] = LLMI_OPTIONAL;
    return a;
}

static void init_params(llmi_testmodel_params *p, const char *arch, uint64_t seed) {
    llmi_testmodel_params_init(p);
    p->arch = arch;
    p->seed = seed;
    p->n_ctx = 64;
}

/* Our logits on p's file with `row` (NULL: the table's) against the
 * reference told `spec`, whole-batch and token by token; and, if `off` is
 * given, that the same file through `off` (the feature switched off) gives
 * logits that differ clearly. F32 weights: f32 accumulation over a few
 * hundred terms, ~10 matmuls and norms deep, rounds at ~1e-6 of the logit
 * range; 1e-4 is far above that and far below any real bug (1e-2 and up,
 * which is also what `off` must show). */
static void check(const char *what, const llmi_testmodel_params *p, const llmi_arch *row,
                  const ref_spec *spec, const llmi_arch *off) {
    printf("# %s: arch '%s' seed %llu\n", what, p->arch, (unsigned long long)p->seed);
    llm_model *m = NULL;
    assert_int_equal(load(p, row, &m), LLM_OK);
    enum { N = 23 };
    llm_token toks[N];
    srand((unsigned)p->seed);
    for (int i = 0; i < N; i++) toks[i] = (llm_token)(rand() % m->hp.n_vocab);
    size_t nl = (size_t)N * m->hp.n_vocab;
    double *ref = ref_forward(m, spec, toks, N);
    float *whole = our_forward(m, toks, N, 2, N), *steps = our_forward(m, toks, N, 1, 1);
    double e1 = max_rel_err(whole, ref, nl), e2 = max_rel_err(steps, ref, nl);
    printf("#   rel err whole %.2e token-by-token %.2e\n", e1, e2);
    assert_true(e1 < 1e-4);
    assert_true(e2 < 1e-4);
    if (off) {
        llm_model *m_off = NULL;
        assert_int_equal(load(p, off, &m_off), LLM_OK);
        float *plain = our_forward(m_off, toks, N, 2, N);
        double d = max_rel_err(plain, ref, nl);
        printf("#   without the feature: rel diff %.2e\n", d);
        assert_true(d > 1e-2);
        free(plain);
        llmi_model_free(m_off);
    }
    free(ref);
    free(whole);
    free(steps);
    llmi_model_free(m);
}

/* ---- features ---- */

static void test_qwen2_row(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "qwen2", 11);
    p.qkv_bias = true;
    ref_spec spec = {.neox = true, .embd_scale = 1};
    llmi_arch plain = base_row("qwen2"); /* adjacent rope, biases ignored */
    check("qwen2 (Q/K/V bias, neox rope)", &p, NULL, &spec, &plain);
    assert_int_equal(llmi_arch_find("qwen2")->rope, LLMI_ROPE_HALVES);
}

static void test_qk_norm(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "test-qk-norm", 12);
    p.qk_norm = true;
    p.head_dim = 32; /* n_head * head_dim = 128 != n_embd = 64, as in Qwen3 */
    llmi_arch row = base_row("test-qk-norm"), off = row;
    row.rope = off.rope = LLMI_ROPE_HALVES;
    row.layer[LLMI_ROLE_Q_NORM] = row.layer[LLMI_ROLE_K_NORM] = LLMI_REQUIRED;
    ref_spec spec = {.neox = true, .embd_scale = 1};
    check("QK-norm, head_dim 32", &p, &row, &spec, &off);
}

static void test_post_norms(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "test-post-norms", 13);
    p.post_norms = true;
    llmi_arch row = base_row("test-post-norms"), off = row;
    row.layer[LLMI_ROLE_POST_ATTN_NORM] = row.layer[LLMI_ROLE_POST_FFN_NORM] = LLMI_OPTIONAL;
    ref_spec spec = {.embd_scale = 1};
    check("post-attention and post-FFN norms", &p, &row, &spec, &off);
}

static void test_geglu(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "test-geglu", 14);
    p.weight_scale = 0.3f; /* gate values large enough for gelu and silu to part */
    llmi_arch row = base_row("test-geglu"), off = row;
    row.ffn_act = LLMI_FFN_GEGLU;
    ref_spec spec = {.geglu = true, .embd_scale = 1};
    check("GeGLU (tanh GELU)", &p, &row, &spec, &off);
}

static void test_embd_scale(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "test-embd-scale", 15);
    llmi_arch row = base_row("test-embd-scale"), off = row;
    row.embd_scale = LLMI_EMBD_SCALE_SQRT_EMBD;
    ref_spec spec = {.embd_scale = sqrt(64.0)};
    check("embedding scale sqrt(n_embd)", &p, &row, &spec, &off);
}

static void test_logit_softcap(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "test-softcap", 16);
    p.logit_softcap = 0.5f; /* random logits reach ~1: the cap bends them */
    llmi_arch row = base_row("test-softcap"), off = row;
    row.logit_softcap_key = "final_logit_softcapping";
    ref_spec spec = {.embd_scale = 1, .logit_softcap = 0.5};
    check("final-logit soft-cap from the file's key", &p, &row, &spec, &off);
    /* Without the key, the row's default applies. */
    p.logit_softcap = 0;
    row.logit_softcap = 0.5f;
    check("final-logit soft-cap from the row's default", &p, &row, &spec, &off);
}

/* Everything at once, as a Gemma-3-like model without sliding windows:
 * tied output, one KV head, head_dim != n_embd / n_head. */
static void test_all_features(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "test-all", 17);
    p.qk_norm = p.post_norms = p.tied_embeddings = true;
    p.n_head_kv = 1;
    p.head_dim = 24;
    p.logit_softcap = 2.0f;
    llmi_arch row = base_row("test-all");
    row.layer[LLMI_ROLE_Q_NORM] = row.layer[LLMI_ROLE_K_NORM] = LLMI_REQUIRED;
    row.layer[LLMI_ROLE_POST_ATTN_NORM] = row.layer[LLMI_ROLE_POST_FFN_NORM] = LLMI_REQUIRED;
    row.ffn_act = LLMI_FFN_GEGLU;
    row.rope = LLMI_ROPE_HALVES;
    row.embd_scale = LLMI_EMBD_SCALE_SQRT_EMBD;
    row.logit_softcap_key = "final_logit_softcapping";
    ref_spec spec = {.neox = true, .geglu = true, .embd_scale = 8, .logit_softcap = 2};
    check("all features together", &p, &row, &spec, NULL);
}

/* Sliding windows on every layer: the llama row when the file names a
 * window (Mistral v0.1), a window much shorter than the sequence. */
static void test_swa_all(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "llama", 18);
    p.sliding_window = 5;
    llm_model *m = NULL;
    assert_int_equal(load(&p, NULL, &m), LLM_OK);
    assert_int_equal(m->hp.features.swa, LLMI_SWA_ALL);
    assert_int_equal(m->hp.features.swa_window, 5);
    assert_true(llmi_layer_windowed(&m->hp.features, 0) && llmi_layer_windowed(&m->hp.features, 1));
    llmi_model_free(m);
    llmi_arch off = base_row("llama");
    ref_spec spec = {.embd_scale = 1, .window = 5};
    check("sliding window 5 on every layer (llama row)", &p, NULL, &spec, &off);
    /* A window of 1: each position sees itself only. */
    p.sliding_window = 1;
    spec.window = 1;
    check("sliding window 1 on every layer", &p, NULL, &spec, &off);

    /* Without the key (every llama.cpp Llama file) there is no window. */
    p.sliding_window = 0;
    assert_int_equal(load(&p, NULL, &m), LLM_OK);
    assert_int_equal(m->hp.features.swa, LLMI_SWA_NONE);
    assert_false(llmi_layer_windowed(&m->hp.features, 0));
    llmi_model_free(m);
}

/* Every third layer global (layers 0, 1, 3 windowed, 2 global). */
static void test_swa_periodic(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "test-swa", 19);
    p.n_layer = 4;
    p.sliding_window = 4;
    llmi_arch row = base_row("test-swa"), off = row;
    row.swa = LLMI_SWA_PERIODIC;
    row.swa_period = 3;
    ref_spec spec = {.embd_scale = 1, .window = 4, .period = 3};
    check("sliding window 4, every 3rd layer global", &p, &row, &spec, &off);
    /* All layers windowed is a different model: the global layer counts. */
    llmi_arch all = row;
    all.swa = LLMI_SWA_ALL;
    llm_model *m = NULL;
    assert_int_equal(load(&p, &row, &m), LLM_OK);
    const bool want[] = {true, true, false, true};
    for (uint32_t l = 0; l < 4; l++)
        assert_int_equal(llmi_layer_windowed(&m->hp.features, l), want[l]);
    llmi_model_free(m);
    ref_spec spec_all = spec;
    spec_all.period = 0;
    check("sliding window 4 on every layer", &p, &all, &spec_all, &row);
}

/* Windowed layers with their own RoPE base; the window is longer than the
 * sequence, so the base is all that differs from the plain model. */
static void test_swa_rope_base(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "test-swa-base", 20);
    p.sliding_window = 64;
    llmi_arch row = base_row("test-swa-base");
    row.swa = LLMI_SWA_PERIODIC;
    row.swa_period = 2; /* layer 0 windowed, layer 1 global */
    row.swa_rope_base = 100.0f;
    llmi_arch off = row;
    off.swa_rope_base = 0; /* the file's 10000 everywhere */
    ref_spec spec = {.embd_scale = 1, .window = 64, .period = 2, .swa_rope_base = 100};
    check("windowed layers' RoPE base 100, global 10000", &p, &row, &spec, &off);
    /* The base is part of what makes K/V reusable. */
    llm_model *a = NULL, *b = NULL;
    assert_int_equal(load(&p, &row, &a), LLM_OK);
    assert_int_equal(load(&p, &off, &b), LLM_OK);
    assert_true(a->hp.features.swa_rope_base == 100.0f);
    assert_true(b->hp.features.swa_rope_base == 10000.0f);
    assert_true(a->fingerprint != b->fingerprint);
    llmi_model_free(a);
    llmi_model_free(b);
}

/* The gemma3 row of the table on a tiny Gemma-3-shaped file: every
 * feature at once, 6 layers with the 6th global, global rope base 1e6 and
 * the windowed layers' 10000. */
static void test_gemma3_row(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "gemma3", 22);
    p.n_layer = 6;
    p.qk_norm = p.post_norms = p.tied_embeddings = true;
    p.n_head_kv = 1;
    p.head_dim = 32;
    p.rope_base = 1e6f;
    p.sliding_window = 6;
    p.weight_scale = 0.3f;
    ref_spec spec = {.neox = true,
                     .geglu = true,
                     .embd_scale = 8,
                     .window = 6,
                     .period = 6,
                     .swa_rope_base = 10000};
    const llmi_arch *row = llmi_arch_find("gemma3");
    assert_non_null(row);
    llmi_arch off = *row;
    off.swa = LLMI_SWA_NONE;
    check("gemma3 row", &p, NULL, &spec, &off);
    llm_model *m = NULL;
    assert_int_equal(load(&p, NULL, &m), LLM_OK);
    assert_true(m->hp.tied_embeddings);
    assert_int_equal(m->hp.features.swa_window, 6);
    assert_true(m->hp.features.swa_rope_base == 10000.0f);
    assert_true(m->hp.rope_base == 1e6f);
    llmi_model_free(m);
    /* The window key is required for gemma3. */
    p.sliding_window = 0;
    llm_model *bad = (llm_model *)0x1;
    assert_int_equal(load(&p, NULL, &bad), LLM_ERR_BAD_FORMAT);
    assert_non_null(strstr(llmi_error_message(), "gemma3.attention.sliding_window"));
    assert_null(bad);
}

/* ---- refusals ---- */

static void expect(const llmi_testmodel_params *p, const llmi_arch *row, llm_status want,
                   const char *substr) {
    llm_model *m = (llm_model *)0x1;
    llm_status st = load(p, row, &m);
    printf("# '%s': %s\n", p->arch, llmi_error_message());
    if (st != want || !strstr(llmi_error_message(), substr))
        fail_msg("got %d '%s', want %d containing '%s'", st, llmi_error_message(), want, substr);
    assert_null(m);
}

static void test_refusals(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "gpt-99", 21);
    expect(&p, NULL, LLM_ERR_UNSUPPORTED,
           "'gpt-99' is not supported (supported: llama, qwen2, qwen3, phi3, qwen2moe, qwen3moe, "
           "gemma3, bert)");

    /* A row whose name is not the file's. */
    llmi_arch other = base_row("llama");
    init_params(&p, "test-name", 21);
    expect(&p, &other, LLM_ERR_INVALID_ARGUMENT, "test-name");

    /* qwen2 requires its biases. */
    init_params(&p, "qwen2", 21);
    expect(&p, NULL, LLM_ERR_BAD_FORMAT, "tensor 'blk.0.attn_q.bias' is missing");

    /* Sliding windows: the window key is required unless the row says
     * otherwise. */
    llmi_arch swa = base_row("test-swa");
    swa.swa = LLMI_SWA_PERIODIC;
    swa.swa_period = 6;
    init_params(&p, "test-swa", 21);
    expect(&p, &swa, LLM_ERR_BAD_FORMAT, "test-swa.attention.sliding_window");

    /* Attention soft-cap: refused when the file sets it, fine when not. */
    llmi_arch cap = base_row("test-attn-cap");
    cap.attn_softcap_key = "attn_logit_softcapping";
    init_params(&p, "test-attn-cap", 21);
    p.attn_softcap = 50;
    expect(&p, &cap, LLM_ERR_UNSUPPORTED, "attention logit soft-capping is not implemented yet");
    p.attn_softcap = 0;
    llm_model *m = NULL;
    assert_int_equal(load(&p, &cap, &m), LLM_OK);
    assert_true(m->hp.features.attn_softcap == 0.0f);
    llmi_model_free(m);

    /* Linear RoPE scaling (Gemma 3 4B and up): the global layers' positions
     * divided by the factor, the windowed layers' not. */
    init_params(&p, "gemma3", 21);
    p.qk_norm = p.post_norms = p.tied_embeddings = true;
    p.sliding_window = 8;
    p.rope_scaling = 8;
    assert_int_equal(load(&p, NULL, &m), LLM_OK);
    assert_true(m->hp.rope_freq_scale == 0.125f);
    assert_true(m->hp.features.swa_rope_freq_scale == 1.0f);
    uint64_t scaled_fp = llmi_model_fingerprint(m);
    llmi_model_free(m);
    p.rope_scaling = 1;
    assert_int_equal(load(&p, NULL, &m), LLM_OK);
    assert_true(m->hp.rope_freq_scale == 1.0f);
    assert_true(scaled_fp != llmi_model_fingerprint(m));
    llmi_model_free(m);
    p.rope_scaling = 4;
    p.rope_scaling_type = "yarn";
    expect(&p, NULL, LLM_ERR_UNSUPPORTED, "RoPE scaling (gemma3.rope.scaling.type 'yarn', "
                                          "factor 4) is not implemented (only 'linear')");
    p.rope_scaling_type = NULL;
    p.rope_scaling = 0;
    /* Gemma 3 27B (62 layers, head_dim not n_embd / n_head): its attention
     * scale is not implemented, so it is refused. */
    p.n_layer = 62;
    p.n_embd = 32;
    p.n_ff = 32;
    p.head_dim = 16;
    expect(&p, NULL, LLM_ERR_UNSUPPORTED,
           "Gemma 3 27B's attention scale 1/sqrt(n_embd / n_head) = 1/sqrt(8) is not implemented");
    p.head_dim = 0;
    assert_int_equal(load(&p, NULL, &m), LLM_OK);
    llmi_model_free(m);

    llmi_arch ln = base_row("test-layernorm");
    ln.norm = LLMI_NORM_LAYER;
    init_params(&p, "test-layernorm", 21);
    expect(&p, &ln, LLM_ERR_UNSUPPORTED, "LayerNorm is implemented for encoders (post-norm) only");
}

/* The table: every row names its architecture once and starts from the
 * tensors every decoder has. */
static void test_table(void **state) {
    (void)state;
    char list[256];
    llmi_arch_supported_list(list, sizeof list);
    assert_string_equal(list, "llama, qwen2, qwen3, phi3, qwen2moe, qwen3moe, gemma3, bert");
    char small[8];
    llmi_arch_supported_list(small, sizeof small);
    assert_string_equal(small, "llama, ");
    const char *names[] = {"llama", "qwen2", "qwen3", "phi3", "gemma3"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const llmi_arch *a = llmi_arch_find(names[i]);
        assert_non_null(a);
        assert_string_equal(a->name, names[i]);
        /* Q, K and V come separately or fused, never both. */
        bool fused = a->layer[LLMI_ROLE_QKV] == LLMI_REQUIRED;
        assert_int_equal(a->layer[LLMI_ROLE_Q], fused ? LLMI_ABSENT : LLMI_REQUIRED);
        assert_int_equal(a->layer[LLMI_ROLE_UP],
                         a->layer[LLMI_ROLE_GATE_UP] == LLMI_REQUIRED ? LLMI_ABSENT : LLMI_REQUIRED);
        assert_int_equal(a->model[LLMI_ROLE_OUTPUT], LLMI_OPTIONAL);
    }
    assert_null(llmi_arch_find("llama2"));
    for (int r = 0; r < LLMI_LAYER_ROLES; r++)
        assert_non_null(strstr(llmi_layer_roles[r].name, "blk.%u."));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen2_row),     cmocka_unit_test(test_qk_norm),
        cmocka_unit_test(test_post_norms),    cmocka_unit_test(test_geglu),
        cmocka_unit_test(test_embd_scale),    cmocka_unit_test(test_logit_softcap),
        cmocka_unit_test(test_all_features),  cmocka_unit_test(test_swa_all),
        cmocka_unit_test(test_swa_periodic),  cmocka_unit_test(test_swa_rope_base),
        cmocka_unit_test(test_gemma3_row),    cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
