/* Mixture-of-experts FFN: the loader's expert roles and keys, the routed
 * FFN of the CPU backend (backend/cpu/moe.c) and the qwen3moe and Llama
 * (Mixtral) rows. Models are tiny random files from model/testmodel.c; the
 * reference is a double-precision forward pass written here from the
 * published definition (llama.cpp's build_moe_ffn: softmax over the
 * router's logits, the expert_used_count largest, their weights divided by
 * their sum, a SwiGLU per expert), reading tensors by GGUF name. */
#include "backend/cpu/moe.h"
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

typedef struct ref_spec {
    bool neox;   /* rope pairs (i, i + d/2) */
    bool norm_w; /* chosen weights divided by their sum */
} ref_spec;

/* ---- reference ---- */

/* F32 tensor `fmt` (layer l) as doubles (all its dimensions), or NULL. */
static double *tensor(const llm_model *m, const char *fmt, int l) {
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    const llmi_gguf_tensor *t = llmi_gguf_find_tensor(m->file, name);
    if (!t) return NULL;
    assert_int_equal(t->type, LLMI_T_F32);
    size_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) n *= (size_t)t->ne[d];
    double *out = malloc(n * sizeof *out);
    for (size_t i = 0; i < n; i++) out[i] = ((const float *)t->data)[i];
    return out;
}

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

/* Smallest gap between the k-th and (k+1)-th router probability seen by
 * the reference: a routing decision closer than float rounding could go
 * either way, and the test must not hinge on one. */
static double g_min_gap;

/* out[E] = the routed FFN of layer l at the normed row xn. */
static void ref_moe(const llm_model *m, const ref_spec *spec, int l, const double *xn,
                    double *out) {
    int E = (int)m->hp.n_embd, NE = (int)m->hp.features.n_expert;
    int K = (int)m->hp.features.n_expert_used, F = (int)m->hp.features.n_ff_exp;
    double *router = tensor(m, "blk.%d.ffn_gate_inp.weight", l);
    double *gate = tensor(m, "blk.%d.ffn_gate_exps.weight", l);
    double *up = tensor(m, "blk.%d.ffn_up_exps.weight", l);
    double *down = tensor(m, "blk.%d.ffn_down_exps.weight", l);
    double *p = malloc(NE * sizeof *p), *g = malloc(F * sizeof *g), *u = malloc(F * sizeof *u);
    double *y = malloc(E * sizeof *y);
    int *order = malloc(NE * sizeof *order);
    matvec(router, NE, E, xn, p);
    double mx = -INFINITY, sum = 0;
    for (int e = 0; e < NE; e++) mx = fmax(mx, p[e]);
    for (int e = 0; e < NE; e++) sum += (p[e] = exp(p[e] - mx));
    for (int e = 0; e < NE; e++) p[e] /= sum;
    /* Insertion sort by (prob descending, index ascending). */
    for (int e = 0; e < NE; e++) {
        int j = e;
        while (j > 0 && p[order[j - 1]] < p[e]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = e;
    }
    if (K < NE) g_min_gap = fmin(g_min_gap, p[order[K - 1]] - p[order[K]]);
    double wsum = 0;
    for (int j = 0; j < K; j++) wsum += p[order[j]];
    for (int i = 0; i < E; i++) out[i] = 0;
    for (int j = 0; j < K; j++) {
        int e = order[j];
        double w = spec->norm_w ? p[e] / wsum : p[e];
        matvec(gate + (size_t)e * F * E, F, E, xn, g);
        matvec(up + (size_t)e * F * E, F, E, xn, u);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        matvec(down + (size_t)e * E * F, E, F, g, y);
        for (int i = 0; i < E; i++) out[i] += w * y[i];
    }
    /* Qwen2-MoE's shared expert, gated by a sigmoid. */
    double *sh_inp = tensor(m, "blk.%d.ffn_gate_inp_shexp.weight", l);
    if (sh_inp) {
        int FS = (int)m->hp.features.n_ff_shexp;
        double *sg = tensor(m, "blk.%d.ffn_gate_shexp.weight", l);
        double *su = tensor(m, "blk.%d.ffn_up_shexp.weight", l);
        double *sd = tensor(m, "blk.%d.ffn_down_shexp.weight", l);
        double *hg = malloc(FS * sizeof *hg), *hu = malloc(FS * sizeof *hu), gate_logit = 0;
        matvec(sg, FS, E, xn, hg);
        matvec(su, FS, E, xn, hu);
        for (int i = 0; i < FS; i++) hg[i] = hg[i] / (1 + exp(-hg[i])) * hu[i];
        matvec(sd, E, FS, hg, y);
        for (int i = 0; i < E; i++) gate_logit += sh_inp[i] * xn[i];
        for (int i = 0; i < E; i++) out[i] += y[i] / (1 + exp(-gate_logit));
        free(sg); free(su); free(sd); free(hg); free(hu);
    }
    free(sh_inp);
    free(router); free(gate); free(up); free(down);
    free(p); free(g); free(u); free(y); free(order);
}

/* Logits (n_tok x n_vocab) for every position of toks. */
static double *ref_forward(const llm_model *m, const ref_spec *spec, const llm_token *toks,
                           int n_tok) {
    const llmi_hparams *hp = &m->hp;
    int E = (int)hp->n_embd, V = (int)hp->n_vocab, hd = (int)hp->head_dim;
    int nh = (int)hp->n_head, nkv = (int)hp->n_head_kv, L = (int)hp->n_layer;
    int qd = nh * hd, kvd = nkv * hd, group = nh / nkv;
    double eps = hp->rms_eps;
    double *kc = calloc((size_t)L * n_tok * kvd, sizeof *kc);
    double *vc = calloc((size_t)L * n_tok * kvd, sizeof *vc);
    double *logits = calloc((size_t)n_tok * V, sizeof *logits);
    double *x = calloc(E, sizeof *x), *xn = calloc(E, sizeof *xn), *q = calloc(qd, sizeof *q);
    double *o = calloc(qd, sizeof *o), *tmp = calloc(E, sizeof *tmp), *att = calloc(n_tok, 8);
    double *emb = tensor(m, "token_embd.weight", 0), *out = tensor(m, "output.weight", 0);
    double *out_norm = tensor(m, "output_norm.weight", 0);
    for (int t = 0; t < n_tok; t++) {
        for (int i = 0; i < E; i++) x[i] = emb[(size_t)toks[t] * E + i];
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
            double *fn = tensor(m, "blk.%d.ffn_norm.weight", l);
            double *kt = kc + ((size_t)l * n_tok + t) * kvd, *vt = vc + ((size_t)l * n_tok + t) * kvd;
            rmsnorm(xn, x, an, E, eps);
            matvec(wq, qd, E, xn, q);
            matvec(wk, kvd, E, xn, kt);
            matvec(wv, kvd, E, xn, vt);
            if (bq)
                for (int i = 0; i < qd; i++) q[i] += bq[i];
            if (bk)
                for (int i = 0; i < kvd; i++) kt[i] += bk[i], vt[i] += bv[i];
            if (qn)
                for (int h = 0; h < nh; h++) rmsnorm(q + h * hd, q + h * hd, qn, hd, eps);
            if (kn)
                for (int h = 0; h < nkv; h++) rmsnorm(kt + h * hd, kt + h * hd, kn, hd, eps);
            rope(q, nh, hd, t, hp->rope_base, spec->neox);
            rope(kt, nkv, hd, t, hp->rope_base, spec->neox);
            for (int h = 0; h < nh; h++) {
                int kh = h / group;
                double mx = -INFINITY, sum = 0;
                for (int p = 0; p <= t; p++) {
                    const double *kp = kc + ((size_t)l * n_tok + p) * kvd + kh * hd;
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += q[h * hd + i] * kp[i];
                    att[p] = s / sqrt(hd);
                    if (att[p] > mx) mx = att[p];
                }
                for (int p = 0; p <= t; p++) sum += (att[p] = exp(att[p] - mx));
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int p = 0; p <= t; p++)
                        acc += att[p] / sum * vc[((size_t)l * n_tok + p) * kvd + kh * hd + i];
                    o[h * hd + i] = acc;
                }
            }
            matvec(wo, E, qd, o, tmp);
            for (int i = 0; i < E; i++) x[i] += tmp[i];
            rmsnorm(xn, x, fn, E, eps);
            ref_moe(m, spec, l, xn, tmp);
            for (int i = 0; i < E; i++) x[i] += tmp[i];
            double *all[] = {an, wq, wk, wv, bq, bk, bv, qn, kn, wo, fn};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
        }
        rmsnorm(xn, x, out_norm, E, eps);
        matvec(out ? out : emb, V, E, xn, logits + (size_t)t * V);
    }
    free(kc); free(vc); free(x); free(xn); free(q); free(o); free(tmp); free(att);
    free(emb); free(out); free(out_norm);
    return logits;
}

/* ---- ours ---- */

static const char *tmp_path(const char *tag) {
    static char path[512];
    snprintf(path, sizeof path, "%s/moe-%s.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp", tag);
    return path;
}

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
    llmi_batch_row rows[64];
    for (int done = 0; done < n; done += chunk) {
        int k = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < k; i++)
            rows[i] = (llmi_batch_row){toks[done + i], (uint32_t)(done + i), &seq, true};
        assert_int_equal(llmi_engine_run(s->eng, rows, (uint32_t)k, logits + (size_t)done * V),
                         LLM_OK);
    }
    llmi_kv_seq_destroy(s->kv, &seq);
    llmi_session_free(s);
    return logits;
}

static double max_rel_err(const float *a, const double *ref, size_t n) {
    double scale = 1e-9, err = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs(a[i] - ref[i]));
    return err / scale;
}

static void init_params(llmi_testmodel_params *p, const char *arch, uint64_t seed) {
    llmi_testmodel_params_init(p);
    p->arch = arch;
    p->seed = seed;
    p->n_ctx = 64;
    p->n_expert = 8;
    p->n_expert_used = 3;
    p->n_ff_exp = 32;
}

/* A MoE row for test files: attention, then a routed FFN (and a shared
 * expert when the file has one). */
static llmi_arch moe_row(const char *name) {
    llmi_arch a = {.name = name};
    const llmi_layer_role req[] = {LLMI_ROLE_ATTN_NORM,  LLMI_ROLE_Q,         LLMI_ROLE_K,
                                   LLMI_ROLE_V,          LLMI_ROLE_O,         LLMI_ROLE_FFN_NORM,
                                   LLMI_ROLE_FFN_ROUTER, LLMI_ROLE_GATE_EXPS, LLMI_ROLE_UP_EXPS,
                                   LLMI_ROLE_DOWN_EXPS};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) a.layer[req[i]] = LLMI_REQUIRED;
    const llmi_layer_role shared[] = {LLMI_ROLE_SHEXP_GATE_INP, LLMI_ROLE_GATE_SHEXP,
                                      LLMI_ROLE_UP_SHEXP, LLMI_ROLE_DOWN_SHEXP};
    for (size_t i = 0; i < 4; i++) a.layer[shared[i]] = LLMI_OPTIONAL;
    a.model[LLMI_ROLE_TOKEN_EMBD] = LLMI_REQUIRED;
    a.model[LLMI_ROLE_OUTPUT_NORM] = LLMI_REQUIRED;
    a.model[LLMI_ROLE_OUTPUT] = LLMI_OPTIONAL;
    a.experts = LLMI_REQUIRED;
    a.expert_ff = LLMI_EXPERT_FF_KEY;
    a.expert_weights_norm = true;
    return a;
}

/* Ours against the reference, whole batch on 2 threads and token by token
 * on 1 (F32 weights: agreement to ~1e-6 of the logit range expected, 1e-4
 * asserted, as in test_arch); with `off` (the same file through a row that
 * changes one MoE choice) clearly different. */
static void check(const char *what, const llmi_testmodel_params *p, const llmi_arch *row,
                  const ref_spec *spec, const llmi_arch *off) {
    printf("# %s: arch '%s' seed %llu\n", what, p->arch, (unsigned long long)p->seed);
    llm_model *m = NULL;
    assert_int_equal(load(p, row, &m), LLM_OK);
    assert_int_equal(m->hp.features.n_expert, p->n_expert);
    enum { N = 23 };
    llm_token toks[N];
    srand((unsigned)p->seed);
    for (int i = 0; i < N; i++) toks[i] = (llm_token)(rand() % m->hp.n_vocab);
    size_t nl = (size_t)N * m->hp.n_vocab;
    g_min_gap = INFINITY;
    double *ref = ref_forward(m, spec, toks, N);
    printf("#   closest routing decision: prob gap %.2e\n", g_min_gap);
    assert_true(g_min_gap > 1e-5);
    float *whole = our_forward(m, toks, N, 2, N), *steps = our_forward(m, toks, N, 1, 1);
    double e1 = max_rel_err(whole, ref, nl), e2 = max_rel_err(steps, ref, nl);
    printf("#   rel err whole %.2e token-by-token %.2e\n", e1, e2);
    assert_true(e1 < 1e-4);
    assert_true(e2 < 1e-4);
    if (off) {
        llm_model *m_off = NULL;
        assert_int_equal(load(p, off, &m_off), LLM_OK);
        float *other = our_forward(m_off, toks, N, 2, N);
        double d = max_rel_err(other, ref, nl);
        printf("#   with the choice changed: rel diff %.2e\n", d);
        assert_true(d > 1e-2);
        free(other);
        llmi_model_free(m_off);
    }
    free(ref);
    free(whole);
    free(steps);
    llmi_model_free(m);
}

/* ---- the rows ---- */

static void expect(const llmi_testmodel_params *p, const llmi_arch *row, llm_status want,
                   const char *substr) {
    llm_model *m = (llm_model *)0x1;
    llm_status st = load(p, row, &m);
    printf("# '%s': %s\n", p->arch, llmi_error_message());
    if (st != want || !strstr(llmi_error_message(), substr))
        fail_msg("got %d '%s', want %d containing '%s'", st, llmi_error_message(), want, substr);
    assert_null(m);
}


static void test_qwen3moe(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "qwen3moe", 31);
    p.qk_norm = true;
    p.head_dim = 32;
    ref_spec spec = {.neox = true, .norm_w = true};
    llmi_arch off = *llmi_arch_find("qwen3moe");
    off.expert_weights_norm = false;
    check("qwen3moe: 8 experts, 3 used, renormalized", &p, NULL, &spec, &off);

    /* Without expert_feed_forward_length an expert is n_ff /
     * expert_used_count wide (testmodel then writes them n_ff wide). */
    init_params(&p, "qwen3moe", 32);
    p.qk_norm = true;
    p.n_ff_exp = 0;
    p.n_expert_used = 1;
    llm_model *m = NULL;
    assert_int_equal(load(&p, NULL, &m), LLM_OK);
    assert_int_equal(m->hp.features.n_ff_exp, p.n_ff);
    assert_int_equal(m->hp.features.n_expert_used, 1);
    assert_true(m->hp.features.expert_weights_norm);
    assert_null(m->layers[0].w[LLMI_ROLE_GATE].data);
    assert_non_null(m->layers[0].w[LLMI_ROLE_GATE_EXPS].data);
    llmi_model_free(m);
    p.n_expert_used = 2;
    expect(&p, NULL, LLM_ERR_BAD_FORMAT,
           "tensor 'blk.0.ffn_gate_exps.weight' has shape [64, 128, 8] (3 dims), expected "
           "[64, 64, 8]");
}

/* Qwen2-MoE: biases, routed experts without renormalization, and a
 * shared expert of its own width. */
static void test_qwen2moe(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "qwen2moe", 37);
    p.qkv_bias = true;
    p.n_expert_used = 2;
    p.n_ff_shexp = 96;
    ref_spec spec = {.neox = true};
    llmi_arch off = *llmi_arch_find("qwen2moe");
    off.layer[LLMI_ROLE_SHEXP_GATE_INP] = off.layer[LLMI_ROLE_GATE_SHEXP] = LLMI_ABSENT;
    off.layer[LLMI_ROLE_UP_SHEXP] = off.layer[LLMI_ROLE_DOWN_SHEXP] = LLMI_ABSENT;
    check("qwen2moe: 8 experts, 2 used, shared expert 96 wide", &p, NULL, &spec, &off);
    assert_false(llmi_arch_find("qwen2moe")->expert_weights_norm);

    /* The shared expert is part of the row: a file without it is refused. */
    p.n_ff_shexp = 0;
    expect(&p, NULL, LLM_ERR_BAD_FORMAT, "tensor 'blk.0.ffn_gate_inp_shexp.weight' is missing");
}

/* Mixtral: a Llama file with experts as wide as feed_forward_length. */
static void test_mixtral(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "llama", 34);
    p.n_expert = 4;
    p.n_expert_used = 2;
    p.n_ff_exp = 0;
    p.n_ff = 64;
    ref_spec spec = {.norm_w = true};
    llmi_arch off = *llmi_arch_find("llama");
    off.expert_weights_norm = false;
    check("llama with experts (Mixtral): 4 experts, 2 used", &p, NULL, &spec, &off);

    /* The same row still loads dense Llama files. */
    llmi_testmodel_params d;
    llmi_testmodel_params_init(&d);
    d.arch = "llama";
    llm_model *m = NULL;
    assert_int_equal(load(&d, NULL, &m), LLM_OK);
    assert_int_equal(m->hp.features.n_expert, 0);
    assert_null(m->layers[0].w[LLMI_ROLE_FFN_ROUTER].data);
    assert_non_null(m->layers[0].w[LLMI_ROLE_GATE].data);
    llmi_model_free(m);
}

/* All experts used, no renormalization: a dense mixture, so routing ties
 * cannot matter and every expert's weight counts. */
static void test_all_experts(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "test-moe-all", 35);
    p.n_expert = 4;
    p.n_expert_used = 4;
    llmi_arch row = moe_row("test-moe-all");
    row.expert_weights_norm = false;
    ref_spec spec = {0};
    check("4 of 4 experts, weights as the softmax gives them", &p, &row, &spec, NULL);
}

/* ---- the routed FFN on its own ---- */

/* The rows of x through layer 0's routed FFN and shared expert, all at once
 * and each alone, on 1 and 3 threads, in two batch orders: the same bits
 * every time. */
static void check_batch_invariance(llmi_ttype type, uint32_t n_embd, uint32_t n_ff_exp) {
    llmi_testmodel_params p;
    init_params(&p, "test-moe-batch", 36);
    p.type = type;
    p.n_embd = n_embd;
    p.n_head = 4;
    p.n_ff = n_ff_exp;
    p.n_ff_exp = n_ff_exp;
    p.n_expert = 16;
    p.n_expert_used = 4;
    p.n_ff_shexp = n_ff_exp;
    p.n_layer = 1;
    llmi_arch row = moe_row("test-moe-batch");
    llm_model *m = NULL;
    assert_int_equal(load(&p, &row, &m), LLM_OK);
    enum { N = 19 };
    const uint32_t E = n_embd;
    float *x = malloc((size_t)N * E * sizeof *x), *xr = malloc((size_t)N * E * sizeof *xr);
    float *all = malloc((size_t)N * E * sizeof *all), *one = malloc(E * sizeof *one);
    float *rev = malloc((size_t)N * E * sizeof *rev), *t1 = malloc((size_t)N * E * sizeof *t1);
    srand(7);
    for (size_t i = 0; i < (size_t)N * E; i++) x[i] = (float)rand() / RAND_MAX * 2 - 1;
    for (int r = 0; r < N; r++) memcpy(xr + (size_t)r * E, x + (size_t)(N - 1 - r) * E, E * 4);
    llmi_pool *pool3 = NULL;
    assert_int_equal(llmi_pool_create(3, &pool3), LLM_OK);
    llmi_cpu_moe *moe = NULL;
    assert_int_equal(llmi_cpu_moe_create(m, N, &moe), LLM_OK);
    for (int f32 = 0; f32 < 2; f32++) {
        llmi_cpu_moe_run(moe, pool3, &m->layers[0], x, N, f32, all);
        llmi_cpu_moe_run(moe, NULL, &m->layers[0], x, N, f32, t1);
        assert_memory_equal(all, t1, (size_t)N * E * sizeof *all);
        llmi_cpu_moe_run(moe, pool3, &m->layers[0], xr, N, f32, rev);
        for (int r = 0; r < N; r++) {
            llmi_cpu_moe_run(moe, pool3, &m->layers[0], x + (size_t)r * E, 1, f32, one);
            assert_memory_equal(one, all + (size_t)r * E, E * sizeof *one);
            assert_memory_equal(rev + (size_t)(N - 1 - r) * E, all + (size_t)r * E,
                                E * sizeof *one);
        }
        double mag = 0;
        for (size_t i = 0; i < (size_t)N * E; i++) mag = fmax(mag, fabs(all[i]));
        assert_true(mag > 1e-3 && isfinite(mag)); /* not all zeros or NaN */
    }
    llmi_cpu_moe_free(moe);
    llmi_pool_free(pool3);
    free(x); free(xr); free(all); free(one); free(rev); free(t1);
    llmi_model_free(m);
}

static void test_batch_invariance(void **state) {
    (void)state;
    check_batch_invariance(LLMI_T_F32, 64, 32);
    check_batch_invariance(LLMI_T_Q8_0, 64, 64);
    check_batch_invariance(LLMI_T_Q4_K, 256, 256);
}

/* Top-k: ties go to the lower index, NaN ranks last, weights renormalize. */
static void test_select(void **state) {
    (void)state;
    uint32_t ex[4];
    float w[4];
    const float tied[4] = {0.2f, 0.3f, 0.3f, 0.2f};
    llmi_moe_select(tied, 4, 3, false, ex, w);
    assert_int_equal(ex[0], 1);
    assert_int_equal(ex[1], 2);
    assert_int_equal(ex[2], 0);
    assert_true(w[0] == 0.3f && w[2] == 0.2f);
    llmi_moe_select(tied, 4, 2, true, ex, w);
    assert_true(w[0] == 0.5f && w[1] == 0.5f);

    const float flat[4] = {0.25f, 0.25f, 0.25f, 0.25f};
    llmi_moe_select(flat, 4, 4, false, ex, w);
    for (uint32_t j = 0; j < 4; j++) assert_int_equal(ex[j], j);

    const float nan[4] = {NAN, 0.5f, NAN, 0.5f};
    llmi_moe_select(nan, 4, 3, false, ex, w);
    assert_int_equal(ex[0], 1);
    assert_int_equal(ex[1], 3);
    assert_int_equal(ex[2], 0);

    /* A zero sum is clamped as llama.cpp clamps it: weights 0, not NaN. */
    const float zero[4] = {0, 0, 0, 0};
    llmi_moe_select(zero, 4, 2, true, ex, w);
    assert_true(w[0] == 0.0f && w[1] == 0.0f);

    const float skew[4] = {0.1f, 0.6f, 0.2f, 0.1f};
    llmi_moe_select(skew, 4, 2, true, ex, w);
    assert_int_equal(ex[0], 1);
    assert_int_equal(ex[1], 2);
    assert_float_equal(w[0] + w[1], 1.0f, 1e-6f);
    assert_float_equal(w[0], 0.75f, 1e-6f);
}

/* ---- refusals ---- */

static void test_refusals(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_arch row = moe_row("test-moe-bad");

    init_params(&p, "test-moe-bad", 41);
    p.n_expert_used = 9;
    expect(&p, &row, LLM_ERR_BAD_FORMAT,
           "test-moe-bad.expert_used_count = 9 is out of range (1..expert_count 8)");
    p.n_expert_used = 0;
    expect(&p, &row, LLM_ERR_BAD_FORMAT, "expert_used_count = 0 is out of range");

    /* No expert keys at all, for a row that needs them. */
    init_params(&p, "test-moe-bad", 41);
    p.n_expert = 0;
    expect(&p, &row, LLM_ERR_BAD_FORMAT, "test-moe-bad.expert_count");
    expect(&p, NULL, LLM_ERR_UNSUPPORTED, "supported: llama, qwen2, qwen3, phi3, qwen2moe, qwen3moe");
    p.arch = "qwen3moe";
    p.qk_norm = true;
    expect(&p, NULL, LLM_ERR_BAD_FORMAT, "qwen3moe.expert_count");

    init_params(&p, "test-moe-bad", 41);
    p.n_expert = 600;
    p.n_expert_used = 2;
    p.n_layer = 1;
    expect(&p, &row, LLM_ERR_BAD_FORMAT, "expert_count = 600 is out of range (1..512)");

    /* Tensor shapes: the row's expert width (n_ff = 128) is not the
     * file's (expert_feed_forward_length = 32, which this row ignores). */
    init_params(&p, "test-moe-bad", 41);
    llmi_arch as_ff = row;
    as_ff.expert_ff = LLMI_EXPERT_FF_IS_FF;
    expect(&p, &as_ff, LLM_ERR_BAD_FORMAT,
           "tensor 'blk.0.ffn_gate_exps.weight' has shape [64, 32, 8] (3 dims), expected "
           "[64, 128, 8]");

    /* A dense row reading a MoE file finds no dense FFN. */
    llmi_arch dense = row;
    dense.experts = LLMI_ABSENT;
    dense.layer[LLMI_ROLE_GATE] = dense.layer[LLMI_ROLE_UP] = LLMI_REQUIRED;
    dense.layer[LLMI_ROLE_DOWN] = LLMI_REQUIRED;
    expect(&p, &dense, LLM_ERR_BAD_FORMAT, "tensor 'blk.0.ffn_gate.weight' is missing");

    /* A MoE file whose row wants experts the file lacks. */
    init_params(&p, "test-moe-bad", 41);
    p.n_expert = 0;
    llmi_arch optional = row;
    optional.experts = LLMI_OPTIONAL;
    optional.layer[LLMI_ROLE_GATE] = optional.layer[LLMI_ROLE_UP] = LLMI_REQUIRED;
    optional.layer[LLMI_ROLE_DOWN] = LLMI_REQUIRED;
    llm_model *m = NULL;
    assert_int_equal(load(&p, &optional, &m), LLM_OK); /* dense: expert roles not looked up */
    llmi_model_free(m);

    /* GeGLU experts are not implemented. */
    init_params(&p, "test-moe-bad", 41);
    llmi_arch geglu = row;
    geglu.ffn_act = LLMI_FFN_GEGLU;
    expect(&p, &geglu, LLM_ERR_UNSUPPORTED, "experts with a GeGLU FFN");
}

/* The fingerprint (KV reuse across models, saved state) tells apart models
 * that differ only in how many experts they use. */
static void test_fingerprint(void **state) {
    (void)state;
    llmi_testmodel_params p;
    init_params(&p, "qwen3moe", 42);
    p.qk_norm = true;
    llm_model *a = NULL, *b = NULL;
    assert_int_equal(load(&p, NULL, &a), LLM_OK);
    p.n_expert_used = 2;
    assert_int_equal(load(&p, NULL, &b), LLM_OK);
    assert_true(a->fingerprint != b->fingerprint);
    llmi_model_free(a);
    llmi_model_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_select),       cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_qwen3moe),     cmocka_unit_test(test_qwen2moe),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_all_experts),  cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_fingerprint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
