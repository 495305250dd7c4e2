/* The CPU forward pass against a plain double-precision reference written
 * here from the model definition, on random-weight models of several shapes
 * and weight types; plus invariants: batch splitting, thread count and KV
 * block layout do not change the result beyond float rounding. */
#include "engine/engine.h"
#include "backend/cpu/kernels.h"
#include "core/quant.h"
#include "model/testmodel.h"
#include "session/session.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

/* ---- reference model: dequantized weights, doubles, contiguous KV ---- */

static double *dequant_matrix(const llmi_weight *w) {
    double *out = malloc((size_t)w->rows * w->cols * sizeof *out);
    float *row = malloc((size_t)w->cols * sizeof *row);
    for (int64_t r = 0; r < w->rows; r++) {
        llmi_dequantize_row(w->type, (const uint8_t *)w->data + r * w->row_bytes, row, w->cols);
        for (int64_t c = 0; c < w->cols; c++) out[r * w->cols + c] = row[c];
    }
    free(row);
    return out;
}

static void ref_matvec(const llmi_weight *w, const double *x, double *y) {
    double *W = dequant_matrix(w);
    for (int64_t r = 0; r < w->rows; r++) {
        double s = 0;
        for (int64_t c = 0; c < w->cols; c++) s += W[r * w->cols + c] * x[c];
        y[r] = s;
    }
    free(W);
}

static void ref_rmsnorm(const double *x, const float *w, int n, double eps, double *out) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double scale = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void ref_rope(const llmi_hparams *hp, double *v, int n_heads, int pos) {
    for (int h = 0; h < n_heads; h++) {
        double *x = v + (size_t)h * hp->head_dim;
        for (uint32_t i = 0; i < hp->rope_dim / 2; i++) {
            double theta = pos * pow(hp->rope_base, -2.0 * i / hp->rope_dim);
            uint32_t a = 2 * i, b = 2 * i + 1; /* llama: adjacent pairs */
            double x0 = x[a], x1 = x[b];
            x[a] = x0 * cos(theta) - x1 * sin(theta);
            x[b] = x0 * sin(theta) + x1 * cos(theta);
        }
    }
}

/* Logits (n_tok x n_vocab) for every position of `toks`. */
static double *ref_forward(const llm_model *m, const llm_token *toks, int n_tok) {
    const llmi_hparams *hp = &m->hp;
    int E = (int)hp->n_embd, F = (int)hp->n_ff, V = (int)hp->n_vocab, hd = (int)hp->head_dim;
    int qd = (int)(hp->n_head * hp->head_dim), kvd = (int)(hp->n_head_kv * hp->head_dim);
    int L = (int)hp->n_layer, group = (int)(hp->n_head / hp->n_head_kv);
    double *kc = calloc((size_t)L * n_tok * kvd, sizeof *kc);
    double *vc = calloc((size_t)L * n_tok * kvd, sizeof *vc);
    double *logits = calloc((size_t)n_tok * V, sizeof *logits);
    double *x = calloc(E, sizeof *x), *xn = calloc(E, sizeof *xn), *q = calloc(qd, sizeof *q);
    double *o = calloc(qd, sizeof *o), *tmp = calloc(E > F ? E : F, sizeof *tmp);
    double *g = calloc(F, sizeof *g), *u = calloc(F, sizeof *u), *att = calloc(n_tok, sizeof *att);
    float *row = calloc(E, sizeof *row);
    for (int t = 0; t < n_tok; t++) {
        const llmi_weight *emb = &m->w[LLMI_ROLE_TOKEN_EMBD];
        llmi_dequantize_row(emb->type, (const uint8_t *)emb->data + toks[t] * emb->row_bytes,
                            row, E);
        for (int i = 0; i < E; i++) x[i] = row[i];
        for (int l = 0; l < L; l++) {
            const llmi_layer *ly = &m->layers[l];
            double *kt = kc + ((size_t)l * n_tok + t) * kvd, *vt = vc + ((size_t)l * n_tok + t) * kvd;
            ref_rmsnorm(x, ly->w[LLMI_ROLE_ATTN_NORM].data, E, hp->rms_eps, xn);
            ref_matvec(&ly->w[LLMI_ROLE_Q], xn, q);
            ref_matvec(&ly->w[LLMI_ROLE_K], xn, kt);
            ref_matvec(&ly->w[LLMI_ROLE_V], xn, vt);
            ref_rope(hp, q, (int)hp->n_head, t);
            ref_rope(hp, kt, (int)hp->n_head_kv, t);
            for (int h = 0; h < (int)hp->n_head; h++) {
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
            ref_matvec(&ly->w[LLMI_ROLE_O], o, tmp);
            for (int i = 0; i < E; i++) x[i] += tmp[i];
            ref_rmsnorm(x, ly->w[LLMI_ROLE_FFN_NORM].data, E, hp->rms_eps, xn);
            ref_matvec(&ly->w[LLMI_ROLE_GATE], xn, g);
            ref_matvec(&ly->w[LLMI_ROLE_UP], xn, u);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(&ly->w[LLMI_ROLE_DOWN], g, tmp);
            for (int i = 0; i < E; i++) x[i] += tmp[i];
        }
        ref_rmsnorm(x, m->w[LLMI_ROLE_OUTPUT_NORM].data, E, hp->rms_eps, xn);
        ref_matvec(&m->w[LLMI_ROLE_OUTPUT], xn, logits + (size_t)t * V);
    }
    free(kc); free(vc); free(x); free(xn); free(q); free(o); free(tmp);
    free(g); free(u); free(att); free(row);
    return logits;
}

/* ---- ours ---- */

static llm_model *make_model(llmi_ttype type, int n_head, int n_head_kv, bool tied,
                             uint64_t seed) {
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.type = type;
    p.n_head = (uint32_t)n_head;
    p.n_head_kv = (uint32_t)n_head_kv;
    p.tied_embeddings = tied;
    p.seed = seed;
    char path[512];
    snprintf(path, sizeof path, "%s/forward-%d-%llu.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp", (int)type,
             (unsigned long long)seed);
    assert_int_equal(llmi_testmodel_write(&p, path), LLM_OK);
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(path, true, &m), LLM_OK);
    remove(path);
    return m;
}

/* Our logits for every position, computed in chunks of `chunk` rows, with
 * K/V stored as kv_type. */
static float *our_forward_kv(const llm_model *m, const llm_token *toks, int n, int threads,
                             int chunk, uint32_t block_size_blocks_offset, llm_kv_type kv_type) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.kv_type = kv_type;
    sp.n_threads = (uint32_t)threads;
    sp.n_ctx = 128;
    sp.max_batch_tokens = (uint32_t)chunk;
    llm_session *s = NULL;
    assert_int_equal(llmi_session_create(m, &sp, &s), LLM_OK);
    /* Occupy some blocks first so the sequence's blocks are not 0, 1, 2... */
    llmi_kv_seq other = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &other, block_size_blocks_offset), LLM_OK);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &seq, (uint32_t)n), LLM_OK);
    uint32_t V = m->hp.n_vocab;
    float *logits = malloc((size_t)n * V * sizeof *logits);
    for (size_t i = 0; i < (size_t)n * V; i++) logits[i] = NAN;
    llmi_batch_row rows[128];
    for (int done = 0; done < n; done += chunk) {
        int k = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < k; i++)
            rows[i] = (llmi_batch_row){toks[done + i], (uint32_t)(done + i), &seq, true};
        assert_int_equal(llmi_engine_run(s->eng, rows, (uint32_t)k,
                                          logits + (size_t)done * V),
                         LLM_OK);
    }
    assert_int_equal(seq.n_tokens, n);
    llmi_kv_seq_destroy(s->kv, &seq);
    llmi_kv_seq_destroy(s->kv, &other);
    llmi_session_free(s);
    return logits;
}

static float *our_forward(const llm_model *m, const llm_token *toks, int n, int threads,
                          int chunk, uint32_t block_size_blocks_offset) {
    return our_forward_kv(m, toks, n, threads, chunk, block_size_blocks_offset, LLM_KV_F32);
}

/* Max |a-b| relative to the largest reference logit magnitude. */
static double max_rel_err(const float *a, const double *ref, size_t n) {
    double scale = 1e-9, err = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs(a[i] - ref[i]));
    return err / scale;
}

static void random_tokens(llm_token *t, int n, uint32_t vocab, unsigned seed) {
    srand(seed);
    for (int i = 0; i < n; i++) t[i] = (llm_token)(rand() % vocab);
}

static void check_type(llmi_ttype type, int n_head, int n_head_kv, bool tied) {
    uint64_t seed = 1000 + (uint64_t)type;
    printf("# type %d heads %d/%d tied %d seed %llu\n", (int)type, n_head, n_head_kv, tied,
           (unsigned long long)seed);
    llm_model *m = make_model(type, n_head, n_head_kv, tied, seed);
    enum { N = 37 };
    llm_token toks[N];
    random_tokens(toks, N, m->hp.n_vocab, (unsigned)seed);
    double *ref = ref_forward(m, toks, N);
    size_t nl = (size_t)N * m->hp.n_vocab;
    float *whole = our_forward(m, toks, N, 2, 64, 0);
    float *steps = our_forward(m, toks, N, 1, 1, 3);
    float *chunks = our_forward(m, toks, N, 3, 5, 7);
    /* Float weights: f32 accumulation over a few hundred terms per dot
     * product, ~8 matmuls deep: 1e-4 of the logit range is far above
     * rounding (~1e-6) and far below any real bug (which shows up at 1e-1).
     * Quantized weights: like llama.cpp, we round every matmul input to 8
     * bits (kernels.h), while the reference keeps it in double. Each
     * rounding moves an element by up to amax/254 of its block, about 0.5%
     * of a dot product's size on these random weights; 9 roundings in
     * sequence (4 per layer, 2 layers, and the output) add up in quadrature
     * to 1-2% of the logit range (measured: 1.0e-2 for Q8_0, 1.4e-2 for
     * Q4_0, 1.6e-2 for Q4_1, 1.3e-2 for Q5_0, 1.4e-2 for Q5_1). 5e-2 leaves a factor 3 of margin and still
     * fails a wrong scale, nibble order or block (30% and more); the
     * integer kernels themselves are checked exactly in test_qdot.c. */
    const double tol = llmi_act_type(type) == LLMI_T_F32 ? 1e-4 : 5e-2;
    double e1 = max_rel_err(whole, ref, nl), e2 = max_rel_err(steps, ref, nl),
           e3 = max_rel_err(chunks, ref, nl);
    printf("# rel err whole %.2e token-by-token %.2e chunked %.2e\n", e1, e2, e3);
    assert_true(e1 < tol);
    assert_true(e2 < tol);
    assert_true(e3 < tol);
    free(ref);
    free(whole);
    free(steps);
    free(chunks);
    llmi_model_free(m);
}

static void test_f32(void **s) { (void)s; check_type(LLMI_T_F32, 4, 2, false); }
static void test_f16(void **s) { (void)s; check_type(LLMI_T_F16, 4, 4, true); }
static void test_bf16(void **s) { (void)s; check_type(LLMI_T_BF16, 4, 1, false); }
static void test_q8_0(void **s) { (void)s; check_type(LLMI_T_Q8_0, 4, 2, true); }
static void test_q4_0(void **s) { (void)s; check_type(LLMI_T_Q4_0, 2, 2, false); }
static void test_q4_1(void **s) { (void)s; check_type(LLMI_T_Q4_1, 4, 2, false); }
static void test_q5_0(void **s) { (void)s; check_type(LLMI_T_Q5_0, 4, 2, true); }
static void test_q5_1(void **s) { (void)s; check_type(LLMI_T_Q5_1, 4, 1, false); }

/* Max |a-b| relative to the largest |b|. */
static double max_rel_diff(const float *a, const float *b, size_t n) {
    double scale = 1e-9, err = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs((double)a[i] - b[i]));
    return err / scale;
}

/* K/V stored as f16 and bf16: the logits stay within a few element
 * roundings of the f32-KV logits, at every kernel level.
 *
 * Tolerance. Rounding to nearest even moves each K/V element by at most u
 * of itself: u = 2^-11 for f16 (11-bit significand), 2^-8 for bf16 (8-bit).
 * A score q.k/sqrt(d) then moves by at most u*S, S = sum|q_i k_i|/sqrt(d);
 * the softmax weights by a relative 2uS; the attention output (a convex
 * combination of rounded V rows) by u(1 + 2S) of max|v|. S is at most 1.5
 * on these random models (measured), so each layer's attention output moves
 * by at most 4u of its size. It is one of two residual branches, and the
 * random, well-conditioned weights after it do not amplify relative errors
 * much, so two layers give a first-order worst case of about 2 * 4u = 8u of
 * the logit range. That is the tolerance: 3.9e-3 for f16, 3.1e-2 for bf16.
 * Errors of different elements mostly cancel: measured about 0.75u, a factor
 * 10 below. A wrong element (wrong offset or head, bytes read as the wrong
 * type) moves logits by tens of percent. Weights are F32, so no 8-bit
 * activation rounding (kernels.h) amplifies the tiny differences. */
static void test_kv_f16_bf16(void **state) {
    (void)state;
    llm_model *m = make_model(LLMI_T_F32, 4, 2, false, 4242);
    enum { N = 37 };
    llm_token toks[N];
    random_tokens(toks, N, m->hp.n_vocab, 4242);
    const size_t nl = (size_t)N * m->hp.n_vocab;
    const int best = llmi_kernels_best_level();
    for (int level = 0; level <= best; level++) {
        llmi_kernels_set_level(level);
        float *f32 = our_forward_kv(m, toks, N, 2, 64, 0, LLM_KV_F32);
        float *f16 = our_forward_kv(m, toks, N, 2, 64, 3, LLM_KV_F16);
        float *f16_steps = our_forward_kv(m, toks, N, 1, 1, 0, LLM_KV_F16);
        float *bf16 = our_forward_kv(m, toks, N, 3, 5, 7, LLM_KV_BF16);
        const double u16 = 0x1p-11, ub16 = 0x1p-8;
        double e16 = max_rel_diff(f16, f32, nl), e16s = max_rel_diff(f16_steps, f32, nl),
               eb16 = max_rel_diff(bf16, f32, nl);
        printf("# level %d: vs f32 KV: f16 %.2e (%.2f u), f16 token-by-token %.2e, bf16 %.2e "
               "(%.2f u)\n",
               level, e16, e16 / u16, e16s, eb16, eb16 / ub16);
        assert_true(e16 < 8 * u16);
        assert_true(e16s < 8 * u16);
        assert_true(eb16 < 8 * ub16);
        /* It is not the same as f32 KV: the rounding happened. */
        assert_true(e16 > 0 && eb16 > e16);
        free(f32);
        free(f16);
        free(f16_steps);
        free(bf16);
    }
    llmi_kernels_set_level(-1);
    llmi_model_free(m);
}

/* Rows of different sequences in one batch give each sequence's own result. */
static void test_mixed_sequences(void **state) {
    (void)state;
    llm_model *m = make_model(LLMI_T_Q8_0, 4, 2, false, 77);
    enum { N = 12 };
    llm_token a[N], b[N];
    random_tokens(a, N, m->hp.n_vocab, 5);
    random_tokens(b, N, m->hp.n_vocab, 6);
    float *la = our_forward(m, a, N, 2, 64, 0);
    float *lb = our_forward(m, b, N, 2, 64, 0);
    llm_session *s = NULL;
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 64;
    assert_int_equal(llmi_session_create(m, &sp, &s), LLM_OK);
    llmi_kv_seq sa = {0}, sb = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &sa, N), LLM_OK);
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &sb, N), LLM_OK);
    uint32_t V = m->hp.n_vocab;
    float *out = malloc((size_t)2 * N * V * sizeof *out);
    llmi_batch_row rows[2 * N];
    for (int i = 0; i < N; i++) { /* interleaved: a0 b0 a1 b1 ... */
        rows[2 * i] = (llmi_batch_row){a[i], (uint32_t)i, &sa, true};
        rows[2 * i + 1] = (llmi_batch_row){b[i], (uint32_t)i, &sb, true};
    }
    assert_int_equal(llmi_engine_run(s->eng, rows, 2 * N, out), LLM_OK);
    for (int i = 0; i < N; i++) {
        for (uint32_t v = 0; v < V; v++) {
            assert_float_equal(out[(size_t)(2 * i) * V + v], la[(size_t)i * V + v], 1e-4);
            assert_float_equal(out[(size_t)(2 * i + 1) * V + v], lb[(size_t)i * V + v], 1e-4);
        }
    }
    free(out);
    free(la);
    free(lb);
    llmi_kv_seq_destroy(s->kv, &sa);
    llmi_kv_seq_destroy(s->kv, &sb);
    llmi_session_free(s);
    llmi_model_free(m);
}

static void test_bad_rows(void **state) {
    (void)state;
    llm_model *m = make_model(LLMI_T_F32, 4, 2, true, 3);
    llm_session *s = NULL;
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_ctx = 32;
    sp.max_batch_tokens = 4;
    sp.n_threads = 1;
    uint32_t kv_dim = m->hp.n_head_kv * m->hp.head_dim;
    sp.kv_cache_bytes = 2 * llmi_kv_block_bytes(m->hp.n_layer, kv_dim, 16); /* 32 tokens */
    assert_int_equal(llmi_session_create(m, &sp, &s), LLM_OK);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &seq, 16), LLM_OK);
    float *out = malloc((size_t)8 * m->hp.n_vocab * sizeof *out);
    llmi_batch_row rows[8];
    for (int i = 0; i < 8; i++) rows[i] = (llmi_batch_row){1, (uint32_t)i, &seq, false};
    assert_int_equal(llmi_engine_run(s->eng, rows, 8, out), LLM_ERR_LIMIT);
    rows[0].token = (llm_token)m->hp.n_vocab;
    assert_int_equal(llmi_engine_run(s->eng, rows, 1, out), LLM_ERR_INVALID_ARGUMENT);
    rows[0] = (llmi_batch_row){1, 40, &seq, false};
    assert_int_equal(llmi_engine_run(s->eng, rows, 1, out), LLM_ERR_LIMIT);
    rows[0] = (llmi_batch_row){1, 20, &seq, false}; /* no block reserved there */
    assert_int_equal(llmi_engine_run(s->eng, rows, 1, out), LLM_ERR_INTERNAL);
    /* The pool runs dry: reserve fails cleanly and leaves the sequence as it was. */
    llmi_kv_seq big = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &big, 1000), LLM_ERR_LIMIT);
    assert_int_equal(big.n_blocks, 0);
    free(out);
    llmi_kv_seq_destroy(s->kv, &seq);
    assert_int_equal(s->kv->n_free, s->kv->n_blocks);
    llmi_session_free(s);
    llmi_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32),  cmocka_unit_test(test_f16),
        cmocka_unit_test(test_bf16), cmocka_unit_test(test_q8_0),
        cmocka_unit_test(test_q4_0), cmocka_unit_test(test_q4_1),
        cmocka_unit_test(test_q5_0), cmocka_unit_test(test_q5_1),
        cmocka_unit_test(test_mixed_sequences), cmocka_unit_test(test_bad_rows),
        cmocka_unit_test(test_kv_f16_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
