/* LoRA adapters (model/adapter.h, backend/cpu/lora.c, docs/lora.md).
 *
 * The reference is independent of our adapter code: tests/models/gen_lora.py
 * writes random adapters for the tiny F32 Llama hf-llama-f32.gguf and, with
 * numpy, the same base with each adapter merged into its weights
 * (W + alpha/rank * B A). Running the base with the adapter must give the
 * merged model's logits up to float rounding; the PEFT folder of the same
 * adapter must give the GGUF form's logits exactly; a step mixing adapters
 * must give each row what it gets alone, bit for bit. Bad adapter files
 * are written here with the GGUF writer against a generated test model. */
#include "backend/backend.h"
#include "backend/cpu/lora.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "model/adapter.h"
#include "model/model.h"
#include "model/testmodel.h"
#include "session/session.h"
#include "unit/sha256_util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

enum { N_PROMPT = 12, MAX_SEQS = 4 };

static char g_dir[512];
static llm_model *g_base, *g_merged_a, *g_merged_b;
static llm_adapter *g_a, *g_b;

static const char *models_path(const char *name) {
    static char path[4][768];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", g_dir, name);
    return p;
}

static llm_model *load_model(const char *name) {
    llm_model *m = NULL;
    if (llmi_model_load(models_path(name), true, &m) != LLM_OK)
        fail_msg("%s: %s", name, llm_last_error());
    return m;
}

static llm_adapter *load_adapter(const llm_model *m, const char *name) {
    llm_adapter *a = NULL;
    if (llm_adapter_load(m, models_path(name), NULL, &a) != LLM_OK)
        fail_msg("%s: %s", name, llm_last_error());
    return a;
}

static int setup(void **state) {
    (void)state;
    const char *dir = getenv("LLM_TEST_MODELS");
    snprintf(g_dir, sizeof g_dir, "%s", dir ? dir : "build/test-models");
    if (access(models_path("lora-llama-a-merged.gguf"), R_OK) != 0) {
        print_message("skipping: %s has no LoRA test models (make test-models)\n", g_dir);
        return 0;
    }
    g_base = load_model("hf-llama-f32.gguf");
    g_merged_a = load_model("lora-llama-a-merged.gguf");
    g_merged_b = load_model("lora-llama-b-merged.gguf");
    g_a = load_adapter(g_base, "lora-llama-a.gguf");
    g_b = load_adapter(g_base, "lora-llama-b.gguf");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llm_adapter_free(g_a);
    llm_adapter_free(g_b);
    llm_model_free(g_base);
    llm_model_free(g_merged_a);
    llm_model_free(g_merged_b);
    return 0;
}

#define NEED_MODELS()                                                                              \
    do {                                                                                           \
        if (!g_base)                                                                               \
            skip();                                                                                \
    } while (0)

static llm_token prompt_token(int seq, int i) {
    return (llm_token)((i * 7919 + seq * 104729 + 13) % 49000);
}

static llm_session *engine_session(const llm_model *m, uint32_t threads) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = threads;
    sp.n_ctx = 64;
    sp.max_batch_tokens = 64;
    llm_session *s = NULL;
    assert_int_equal(llmi_session_create(m, &sp, &s), LLM_OK);
    return s;
}

/* Logits of every prompt position of sequences 0..n_seqs-1, sequence i
 * under adapters[i] at scales[i], all rows in one step when `together`,
 * else one step per sequence; out[i] holds N_PROMPT rows of n_vocab. */
static void run_seqs_from(int prompt0, const llm_model *m, int n_seqs,
                          const llm_adapter *const *adapters, const float *scales, bool together,
                          uint32_t threads, float **out) {
    llm_session *s = engine_session(m, threads);
    const uint32_t V = m->hp.n_vocab;
    llmi_kv_seq seqs[MAX_SEQS] = {{0}};
    llmi_batch_row rows[MAX_SEQS * N_PROMPT];
    float *logits = malloc((size_t)MAX_SEQS * N_PROMPT * V * sizeof *logits);
    assert_non_null(logits);
    for (int q = 0; q < n_seqs; q++) {
        assert_int_equal(llmi_kv_seq_reserve(s->kv, &seqs[q], N_PROMPT), LLM_OK);
        out[q] = malloc((size_t)N_PROMPT * V * sizeof *out[q]);
        assert_non_null(out[q]);
    }
    if (together) { /* rows interleaved across the sequences */
        uint32_t n = 0;
        for (int i = 0; i < N_PROMPT; i++)
            for (int q = 0; q < n_seqs; q++)
                rows[n++] = (llmi_batch_row){prompt_token(prompt0 + q, i),
                                             (uint32_t)i,
                                             &seqs[q],
                                             true,
                                             adapters[q],
                                             scales[q]};
        if (llmi_engine_run(s->eng, rows, n, logits) != LLM_OK)
            fail_msg("step: %s", llm_last_error());
        for (int i = 0; i < N_PROMPT; i++)
            for (int q = 0; q < n_seqs; q++)
                memcpy(out[q] + (size_t)i * V, logits + ((size_t)i * n_seqs + q) * V,
                       V * sizeof(float));
    } else {
        for (int q = 0; q < n_seqs; q++) {
            for (int i = 0; i < N_PROMPT; i++)
                rows[i] = (llmi_batch_row){prompt_token(prompt0 + q, i),
                                           (uint32_t)i,
                                           &seqs[q],
                                           true,
                                           adapters[q],
                                           scales[q]};
            if (llmi_engine_run(s->eng, rows, N_PROMPT, out[q]) != LLM_OK)
                fail_msg("step: %s", llm_last_error());
        }
    }
    for (int q = 0; q < n_seqs; q++)
        llmi_kv_seq_destroy(s->kv, &seqs[q]);
    free(logits);
    llmi_session_free(s);
}

static void run_seqs(const llm_model *m, int n_seqs, const llm_adapter *const *adapters,
                     const float *scales, bool together, uint32_t threads, float **out) {
    run_seqs_from(0, m, n_seqs, adapters, scales, together, threads, out);
}

/* max |a - b| / max |b| over n values. */
static double rel_err(const float *a, const float *b, size_t n) {
    double scale = 1e-30, err = 0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(b[i]));
        err = fmax(err, fabs((double)a[i] - b[i]));
    }
    return err / scale;
}

/* The adapter applied at run time against the merged model: the same
 * function of the weights, rounded differently. Each logit is a sum of
 * products of f32 values through 2 layers; the merged weights are rounded
 * once from float64 while the run adds s * B(Ax) in f32 after Wx, so the
 * two differ by a few ulps of the values summed, around 1e-6 of the
 * largest logit. 2e-5 leaves room for that and none for a wrong scale,
 * target or row order (those move the logits by 10-100 %). */
static void check_against_merged(const llm_adapter *a, const llm_model *merged) {
    const size_t n = (size_t)N_PROMPT * g_base->hp.n_vocab;
    const llm_adapter *with[1] = {a}, *none[1] = {NULL};
    const float one[1] = {1.0f};
    float *ours[1], *ref[1], *base[1];
    run_seqs(g_base, 1, with, one, false, 2, ours);
    run_seqs(merged, 1, none, one, false, 2, ref);
    run_seqs(g_base, 1, none, one, false, 2, base);
    double err = rel_err(ours[0], ref[0], n), moved = rel_err(base[0], ref[0], n);
    print_message("adapter vs merged: rel err %.3g; base vs merged: %.3g\n", err, moved);
    assert_true(err < 2e-5);
    assert_true(moved > 1e-2); /* the adapter changes the model: the check can fail */
    free(ours[0]);
    free(ref[0]);
    free(base[0]);
}

static void test_gguf_matches_merged(void **state) {
    (void)state;
    NEED_MODELS();
    assert_int_equal(g_a->n_pairs, 14);
    assert_int_equal(g_a->max_rank, 4);
    assert_int_equal(g_b->n_pairs, 6);
    check_against_merged(g_a, g_merged_a);
    check_against_merged(g_b, g_merged_b);
}

/* The PEFT folder of adapter a (B of q/k in the checkpoint's row order)
 * is the same adapter as its GGUF: the same logits, bit for bit. */
static void test_peft_matches_gguf(void **state) {
    (void)state;
    NEED_MODELS();
    llm_adapter *peft = load_adapter(g_base, "lora-llama-a");
    assert_int_equal(peft->n_pairs, g_a->n_pairs);
    /* The same weights in either form: the same content fingerprint (what
     * saved states name), another load id; adapter b differs. */
    assert_true(peft->fingerprint == g_a->fingerprint && peft->id != g_a->id);
    assert_true(g_b->fingerprint != g_a->fingerprint);
    const llm_adapter *ad[2] = {g_a, peft};
    const float one[2] = {1.0f, 1.0f};
    float *gguf_out[1], *peft_out[1];
    run_seqs(g_base, 1, ad, one, false, 2, gguf_out);
    run_seqs(g_base, 1, ad + 1, one, false, 2, peft_out);
    assert_memory_equal(gguf_out[0], peft_out[0],
                        (size_t)N_PROMPT * g_base->hp.n_vocab * sizeof(float));
    free(gguf_out[0]);
    free(peft_out[0]);
    llm_adapter_free(peft);
}

/* Two adapters, one at another scale, and no adapter in one step: each
 * sequence gets exactly what it gets alone, and the row without an adapter
 * what a step with no adapter at all gives. */
static void test_mixed_batch_bitwise(void **state) {
    (void)state;
    NEED_MODELS();
    const llm_adapter *ad[4] = {g_a, g_b, NULL, g_a};
    const float scales[4] = {1.0f, 1.0f, 1.0f, 0.5f};
    float *together[4], *alone[4];
    llmi_cpu_lora_test_inline_work(0); /* the pool's split, against one thread's */
    run_seqs(g_base, 4, ad, scales, true, 2, together);
    llmi_cpu_lora_test_inline_work(1u << 17);
    for (int q = 0; q < 4; q++) {
        const llm_adapter *one_ad[1] = {ad[q]};
        float *o[1];
        run_seqs_from(q, g_base, 1, one_ad, &scales[q], false, 1, o);
        alone[q] = o[0];
    }
    const size_t bytes = (size_t)N_PROMPT * g_base->hp.n_vocab * sizeof(float);
    for (int q = 0; q < 4; q++)
        assert_memory_equal(together[q], alone[q], bytes);
    /* scale 0.5 really is another update than 1.0 */
    assert_true(rel_err(together[3], together[0], bytes / sizeof(float)) > 1e-3);
    for (int q = 0; q < 4; q++) {
        free(together[q]);
        free(alone[q]);
    }
}

/* ---- against llama.cpp (tests/models/record_lora.py) ---- */

/* Our logits against llama.cpp's recorded top-20 of every position, for
 * the base and each adapter: |ours - theirs| / the row's std below `tol`,
 * where tol follows tests/models/README.md's table (F32 matrices: 1e-4;
 * an adapter with F16 matrices, whose activations llama.cpp rounds to f16
 * before multiplying them: 5e-3), and the same argmax wherever llama.cpp's
 * top-1/top-2 gap exceeds twice that. */
static void test_against_llama_cpp(void **state) {
    (void)state;
    NEED_MODELS();
    const char *data = getenv("LLM_TEST_DATA") ? getenv("LLM_TEST_DATA") : "tests";
    char path[768];
    snprintf(path, sizeof path, "%s/golden/lora-llama.txt", data);
    FILE *f = fopen(path, "r");
    if (!f) {
        print_message("skipping: %s is absent (tests/models/record_lora.py)\n", path);
        skip();
    }
    const uint32_t V = g_base->hp.n_vocab;
    static char line[8192];
    float *ours[1] = {NULL};
    double tol = 0, worst = 0, case_worst = 0;
    char case_name[160] = "";
    int n_cases = 0, n_rows = 0;
    while (fgets(line, sizeof line, f)) {
        char name[128], base_sha[80], ad_sha[80], hex[65];
        double scale;
        int pos;
        if (sscanf(line, "case %127s %lf %79s %79s", name, &scale, base_sha, ad_sha) == 4) {
            if (n_cases)
                print_message("  %s: worst %.3g std\n", case_name, case_worst);
            snprintf(case_name, sizeof case_name, "%s x %g", name, scale);
            case_worst = 0;
            assert_true(test_sha256_file(models_path("hf-llama-f32.gguf"), hex));
            if (strcmp(hex, base_sha) != 0)
                fail_msg("hf-llama-f32.gguf is not the file the reference was recorded on");
            llm_adapter *ad = NULL;
            if (strcmp(name, "-") != 0) {
                assert_true(test_sha256_file(models_path(name), hex));
                if (strcmp(hex, ad_sha) != 0)
                    fail_msg("%s is not the file the reference was recorded on", name);
                ad = load_adapter(g_base, name);
            }
            tol = strcmp(name, "lora-llama-a.gguf") == 0 ? 5e-3 : 1e-4;
            free(ours[0]);
            const llm_adapter *one[1] = {ad};
            const float sc[1] = {(float)scale};
            run_seqs_from(7, g_base, 1, one, sc, false, 1, ours);
            llm_adapter_free(ad);
            n_cases++;
            continue;
        }
        char *p = line;
        int used = 0;
        double std_dev;
        if (sscanf(p, "pos %d std %lf top%n", &pos, &std_dev, &used) != 2)
            continue;
        assert_non_null(ours[0]);
        assert_true(pos >= 0 && pos < N_PROMPT && std_dev > 0);
        const float *row = ours[0] + (size_t)pos * V;
        p += used;
        int id, k = 0, first = -1;
        double logit, top1 = 0, top2 = 0;
        while (sscanf(p, " %d:%lf%n", &id, &logit, &used) == 2) {
            p += used;
            assert_true(id >= 0 && (uint32_t)id < V);
            double err = fabs(row[id] - logit) / std_dev;
            worst = fmax(worst, err / tol);
            case_worst = fmax(case_worst, err);
            if (err >= tol)
                fail_msg("pos %d token %d: ours %.6g, llama.cpp %.6g (%.3g std, limit %g)", pos, id,
                         row[id], logit, err, tol);
            if (k == 0) {
                first = id;
                top1 = logit;
            } else if (k == 1) {
                top2 = logit;
            }
            k++;
        }
        assert_true(k >= 2);
        if ((top1 - top2) / std_dev > 2 * tol) {
            uint32_t best = 0;
            for (uint32_t t = 1; t < V; t++)
                if (row[t] > row[best])
                    best = t;
            assert_int_equal(best, first);
        }
        n_rows++;
    }
    fclose(f);
    free(ours[0]);
    print_message("  %s: worst %.3g std\n", case_name, case_worst);
    print_message("llama.cpp reference: %d cases, %d rows, worst error %.2f of its limit\n",
                  n_cases, n_rows, worst);
    assert_int_equal(n_cases, 3);
    assert_int_equal(n_rows, 3 * N_PROMPT);
}

/* ---- request level: llm_session_submit ---- */

static void generate(llm_session *s, const llm_token *prompt, size_t n, const llm_adapter *a,
                     llm_token *out, uint32_t n_out) {
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = n_out;
    rp.ignore_eos = true;
    rp.adapter = a;
    llm_request_id id;
    if (llm_session_submit(s, prompt, n, &rp, &id) != LLM_OK)
        fail_msg("submit: %s", llm_last_error());
    uint32_t got = 0;
    bool done = false;
    while (!done) {
        llm_event ev[8];
        size_t n_ev = 0;
        assert_int_equal(llm_session_step(s, ev, 8, sizeof ev[0], &n_ev), LLM_OK);
        for (size_t i = 0; i < n_ev; i++) {
            if (ev[i].token != LLM_TOKEN_NONE && got < n_out)
                out[got++] = ev[i].token;
            if (ev[i].finish_reason != LLM_FINISH_NONE)
                done = true;
        }
    }
    assert_int_equal(got, n_out);
}

static llm_session *request_session(const llm_model *m) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 128;
    sp.kv_block_size = 16;
    sp.prefix_cache = true;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(m, &sp, &s), LLM_OK);
    return s;
}

/* Greedy tokens with the adapter equal the merged model's, and the prefix
 * cache never hands one adapter's K/V to a request of another (or none). */
static void test_requests_and_prefix_cache(void **state) {
    (void)state;
    NEED_MODELS();
    enum { N = 40, GEN = 8 };
    llm_token prompt[N];
    for (int i = 0; i < N; i++)
        prompt[i] = prompt_token(7, i);
    llm_token base_ref[GEN], merged_ref[GEN], got[GEN];
    llm_session *s = request_session(g_merged_a);
    generate(s, prompt, N, NULL, merged_ref, GEN);
    llm_session_free(s);
    s = request_session(g_base);
    generate(s, prompt, N, NULL, base_ref, GEN); /* fills the prefix cache */
    assert_memory_not_equal(base_ref, merged_ref, sizeof base_ref);
    llm_session_stats st0 = {.struct_size = sizeof st0}, st1 = st0, st2 = st0;
    assert_int_equal(llm_session_get_stats(s, &st0), LLM_OK);
    generate(s, prompt, N, g_a, got, GEN); /* must not reuse the base's blocks */
    assert_memory_equal(got, merged_ref, sizeof got);
    assert_int_equal(llm_session_get_stats(s, &st1), LLM_OK);
    assert_int_equal(st1.prefix_hit_tokens, st0.prefix_hit_tokens);
    generate(s, prompt, N, g_a, got, GEN); /* its own blocks: a hit */
    assert_memory_equal(got, merged_ref, sizeof got);
    assert_int_equal(llm_session_get_stats(s, &st2), LLM_OK);
    assert_true(st2.prefix_hit_tokens > st1.prefix_hit_tokens);
    generate(s, prompt, N, NULL, got, GEN);
    assert_memory_equal(got, base_ref, sizeof got);
    llm_session_free(s);
}

/* ---- token level: llm_seq_set_adapter ---- */

/* The last prompt position's logits of a token-level sequence (adapter may
 * be NULL), into out (n_vocab floats); the session and sequence stay open
 * when *keep is not NULL. */
static void seq_logits(const llm_model *m, const llm_adapter *ad, float *out, llm_session **keep,
                       llm_seq_id *keep_seq) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 64;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(m, &sp, &s), LLM_OK);
    llm_seq_id seq;
    assert_int_equal(llm_seq_open(s, &seq), LLM_OK);
    assert_int_equal(llm_seq_set_adapter(s, seq, ad, 1.0f), LLM_OK);
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(N_PROMPT, &b), LLM_OK);
    for (int i = 0; i < N_PROMPT; i++)
        assert_int_equal(llm_batch_add(b, seq, (uint32_t)i, prompt_token(3, i), i == N_PROMPT - 1),
                         LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    const float *l = NULL;
    assert_int_equal(llm_session_logits(s, N_PROMPT - 1, &l), LLM_OK);
    memcpy(out, l, m->hp.n_vocab * sizeof *out);
    llm_batch_free(b);
    if (keep) {
        *keep = s;
        *keep_seq = seq;
    } else {
        llm_session_free(s);
    }
}

static void test_token_level(void **state) {
    (void)state;
    NEED_MODELS();
    const uint32_t V = g_base->hp.n_vocab;
    float *ours = malloc(V * sizeof *ours), *ref = malloc(V * sizeof *ref);
    float *fork_l = malloc(V * sizeof *fork_l);
    seq_logits(g_merged_a, NULL, ref, NULL, NULL);
    llm_session *s = NULL;
    llm_seq_id seq = -1, fork = -1;
    seq_logits(g_base, g_a, ours, &s, &seq);
    assert_true(rel_err(ours, ref, V) < 2e-5);
    /* The sequence holds tokens now: its adapter is fixed. */
    assert_int_equal(llm_seq_set_adapter(s, seq, NULL, 1.0f), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_set_adapter(s, 999, g_a, 1.0f), LLM_ERR_NOT_FOUND);
    /* A fork continues with the same adapter: one more token on each gives
     * the same logits. */
    assert_int_equal(llm_seq_fork(s, seq, &fork), LLM_OK);
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(2, &b), LLM_OK);
    assert_int_equal(llm_batch_add(b, seq, N_PROMPT, 1234, true), LLM_OK);
    assert_int_equal(llm_batch_add(b, fork, N_PROMPT, 1234, true), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    const float *l0 = NULL, *l1 = NULL;
    assert_int_equal(llm_session_logits(s, 0, &l0), LLM_OK);
    memcpy(fork_l, l0, V * sizeof *fork_l);
    assert_int_equal(llm_session_logits(s, 1, &l1), LLM_OK);
    assert_memory_equal(fork_l, l1, V * sizeof *fork_l);
    llm_batch_free(b);
    llm_session_free(s);
    /* An adapter of another model. */
    assert_int_equal(llm_session_create(g_merged_a, NULL, &s), LLM_OK);
    assert_int_equal(llm_seq_open(s, &seq), LLM_OK);
    assert_int_equal(llm_seq_set_adapter(s, seq, g_a, 1.0f), LLM_ERR_INVALID_ARGUMENT);
    llm_session_free(s);
    free(ours);
    free(ref);
    free(fork_l);
}

/* A request names an adapter of another model: refused at submit. */
static void test_adapter_of_other_model(void **state) {
    (void)state;
    NEED_MODELS();
    llm_session *s = request_session(g_merged_a);
    llm_token prompt[4] = {1, 2, 3, 4};
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.adapter = g_a; /* loaded for g_base */
    llm_request_id id;
    assert_int_equal(llm_session_submit(s, prompt, 4, &rp, &id), LLM_ERR_INVALID_ARGUMENT);
    rp.adapter = NULL;
    rp.adapter_scale = NAN; /* ignored without an adapter */
    assert_int_equal(llm_session_submit(s, prompt, 4, &rp, &id), LLM_OK);
    llm_session_free(s);
}

/* A backend whose table does not say it applies adapters never sees them. */
static void test_backend_without_lora(void **state) {
    (void)state;
    NEED_MODELS();
    llm_session *s = engine_session(g_base, 1);
    llmi_backend_ops ops = llmi_backend_cpu;
    ops.name = "cpu-without-lora";
    ops.lora = false;
    llmi_engine_config cfg = {.model = g_base,
                              .ops = &ops,
                              .backend = s->eng->backend,
                              .kv_block_size = 16,
                              .kv_blocks = 4,
                              .kv_type = LLM_KV_F32,
                              .max_rows = 16,
                              .max_ctx = 64};
    llmi_engine *e = NULL;
    assert_int_equal(llmi_engine_create(&cfg, &e), LLM_OK);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(e->kv, &seq, 1), LLM_OK);
    float *logits = malloc(g_base->hp.n_vocab * sizeof *logits);
    llmi_batch_row row = {5, 0, &seq, true, g_a, 1.0f};
    assert_int_equal(llmi_engine_run(e, &row, 1, logits), LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(llm_last_error(), "cpu-without-lora"));
    assert_non_null(strstr(llm_last_error(), "LLM_CUDA_LORA=1")); /* how to turn it on */
    assert_int_equal(seq.n_tokens, 0);
    row.adapter = NULL;
    assert_int_equal(llmi_engine_run(e, &row, 1, logits), LLM_OK);
    free(logits);
    llmi_kv_seq_destroy(e->kv, &seq);
    llmi_engine_free(e);
    llmi_session_free(s);
}

/* ---- bad adapter files, against a generated model ---- */

static llm_model *test_model(void) {
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p); /* llama: n_embd 64, 4 heads, 2 kv heads, n_ff 128 */
    const char *tmp = getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp";
    char path[600];
    snprintf(path, sizeof path, "%s/lora-base-%d.gguf", tmp, (int)getpid());
    assert_int_equal(llmi_testmodel_write(&p, path), LLM_OK);
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(path, false, &m), LLM_OK);
    remove(path);
    return m;
}

typedef struct gguf_case {
    const char *general_type, *adapter_type, *arch; /* "" = leave the key out */
    const char *name_a, *name_b;                    /* weight names; NULL = no tensor */
    uint64_t a_in, a_rank, b_rank, b_out;
    llmi_ttype type;
    bool nan;
    llm_status want;
    const char *msg; /* in the message */
} gguf_case;

static void write_case(const gguf_case *c, const char *path) {
    llmi_gguf_writer *w = NULL;
    assert_int_equal(llmi_gguf_writer_create(&w), LLM_OK);
    if (c->arch[0])
        assert_int_equal(llmi_gguf_w_str(w, "general.architecture", c->arch), LLM_OK);
    if (c->general_type[0])
        assert_int_equal(llmi_gguf_w_str(w, "general.type", c->general_type), LLM_OK);
    if (c->adapter_type[0])
        assert_int_equal(llmi_gguf_w_str(w, "adapter.type", c->adapter_type), LLM_OK);
    assert_int_equal(llmi_gguf_w_f32(w, "adapter.lora.alpha", 8.0f), LLM_OK);
    float *v = calloc(4096, sizeof *v);
    for (int i = 0; i < 4096; i++)
        v[i] = (float)((i * 37) % 17 - 8) / 64.0f;
    if (c->nan)
        v[5] = NAN;
    char name[128];
    if (c->name_a) {
        uint64_t ne[2] = {c->a_in, c->a_rank};
        snprintf(name, sizeof name, "%s.lora_a", c->name_a);
        assert_int_equal(llmi_gguf_w_tensor(w, name, c->type, 2, ne, v), LLM_OK);
    }
    if (c->name_b) {
        uint64_t ne[2] = {c->b_rank, c->b_out};
        snprintf(name, sizeof name, "%s.lora_b", c->name_b);
        assert_int_equal(llmi_gguf_w_tensor(w, name, LLMI_T_F32, 2, ne, v), LLM_OK);
    }
    assert_int_equal(llmi_gguf_writer_save(w, path), LLM_OK);
    llmi_gguf_writer_free(w);
    free(v);
}

static void expect_load(const llm_model *m, const char *path, llm_status want, const char *msg,
                        const char *label) {
    llm_adapter *a = (llm_adapter *)&a; /* must come back NULL on failure */
    llm_status st = llm_adapter_load(m, path, NULL, &a);
    if (st != want || (msg && !strstr(llm_last_error(), msg)))
        fail_msg("%s: got %s (%s), want %s with '%s'", label, llm_status_name(st),
                 st ? llm_last_error() : "", llm_status_name(want), msg ? msg : "");
    if (st != LLM_OK)
        assert_null(a);
    llm_adapter_free(a);
}

static void test_bad_gguf_adapters(void **state) {
    (void)state;
    llm_model *m = test_model();
    const char *Q = "blk.0.attn_q.weight";
    const gguf_case cases[] = {
        {"adapter", "lora", "llama", Q, Q, 64, 4, 4, 64, LLMI_T_F32, false, LLM_OK, NULL},
        {"adapter", "lora", "llama", "blk.1.ffn_down.weight", "blk.1.ffn_down.weight", 128, 2, 2,
         64, LLMI_T_F16, false, LLM_OK, NULL},
        {"", "lora", "llama", Q, Q, 64, 4, 4, 64, LLMI_T_F32, false, LLM_ERR_BAD_FORMAT,
         "general.type"},
        {"model", "lora", "llama", Q, Q, 64, 4, 4, 64, LLMI_T_F32, false, LLM_ERR_BAD_FORMAT,
         "not 'adapter'"},
        {"adapter", "", "llama", Q, Q, 64, 4, 4, 64, LLMI_T_F32, false, LLM_ERR_NOT_FOUND,
         "adapter.type"},
        {"adapter", "ia3", "llama", Q, Q, 64, 4, 4, 64, LLMI_T_F32, false, LLM_ERR_UNSUPPORTED,
         "ia3"},
        {"adapter", "lora", "qwen2", Q, Q, 64, 4, 4, 64, LLMI_T_F32, false, LLM_ERR_UNSUPPORTED,
         "architecture 'qwen2'"},
        {"adapter", "lora", "llama", Q, NULL, 64, 4, 4, 64, LLMI_T_F32, false, LLM_ERR_BAD_FORMAT,
         "has no 'blk.0.attn_q.weight.lora_b'"},
        {"adapter", "lora", "llama", NULL, NULL, 64, 4, 4, 64, LLMI_T_F32, false,
         LLM_ERR_BAD_FORMAT, "no tensors"},
        {"adapter", "lora", "llama", Q, Q, 32, 4, 4, 64, LLMI_T_F32, false, LLM_ERR_BAD_FORMAT,
         "32 columns; the base weight has 64"},
        {"adapter", "lora", "llama", Q, Q, 64, 4, 4, 32, LLMI_T_F32, false, LLM_ERR_BAD_FORMAT,
         "32 rows"},
        {"adapter", "lora", "llama", Q, Q, 64, 4, 8, 64, LLMI_T_F32, false, LLM_ERR_BAD_FORMAT,
         "rank 8, its other half rank 4"},
        {"adapter", "lora", "llama", "token_embd.weight", "token_embd.weight", 64, 4, 4, 64,
         LLMI_T_F32, false, LLM_ERR_UNSUPPORTED, "not a projection"},
        {"adapter", "lora", "llama", "blk.9.attn_q.weight", "blk.9.attn_q.weight", 64, 4, 4, 64,
         LLMI_T_F32, false, LLM_ERR_BAD_FORMAT, "layer 9"},
        {"adapter", "lora", "llama", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate_exps.weight", 64,
         4, 4, 64, LLMI_T_F32, false, LLM_ERR_UNSUPPORTED, "not a projection"},
        {"adapter", "lora", "llama", Q, Q, 64, 4, 4, 64, LLMI_T_Q8_0, false, LLM_ERR_UNSUPPORTED,
         "F32, F16 or BF16"},
        {"adapter", "lora", "llama", Q, Q, 64, 4, 4, 64, LLMI_T_F32, true, LLM_ERR_BAD_FORMAT,
         "not finite"},
    };
    const char *tmp = getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp";
    char path[600], label[64];
    snprintf(path, sizeof path, "%s/lora-bad-%d.gguf", tmp, (int)getpid());
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_case(&cases[i], path);
        snprintf(label, sizeof label, "case %zu", i);
        expect_load(m, path, cases[i].want, cases[i].msg, label);
    }
    /* A truncated copy of a good file, and no file at all. */
    write_case(&cases[0], path);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char buf[1 << 14];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(n > 200);
    for (size_t cut = 8; cut < n; cut += n / 7) {
        f = fopen(path, "wb");
        assert_int_equal(fwrite(buf, 1, cut, f), cut);
        fclose(f);
        llm_adapter *a = NULL;
        assert_int_equal(llm_adapter_load(m, path, NULL, &a), LLM_ERR_BAD_FORMAT);
        assert_null(a);
    }
    remove(path);
    expect_load(m, path, LLM_ERR_IO, NULL, "missing file");
    llm_adapter *a = NULL;
    assert_int_equal(llm_adapter_load(NULL, path, NULL, &a), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_adapter_load(m, NULL, NULL, &a), LLM_ERR_INVALID_ARGUMENT);
    llm_model_free(m);
}

/* A safetensors file of F32 matrices named names[i] with shapes[i]. */
static void write_safetensors(const char *path, int n, const char *const *names,
                              const uint64_t (*shapes)[2]) {
    char header[2048];
    size_t len = 0, off = 0;
    len += (size_t)snprintf(header + len, sizeof header - len, "{");
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)(shapes[i][0] * shapes[i][1] * 4);
        len += (size_t)snprintf(header + len, sizeof header - len,
                                "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%llu,%llu],"
                                "\"data_offsets\":[%zu,%zu]}",
                                i ? "," : "", names[i], (unsigned long long)shapes[i][0],
                                (unsigned long long)shapes[i][1], off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(header, 1, len, f);
    for (size_t i = 0; i < off / 4; i++) {
        float x = (float)((i * 13) % 11) / 32.0f;
        fwrite(&x, 4, 1, f);
    }
    fclose(f);
}

static void test_bad_peft_folders(void **state) {
    (void)state;
    llm_model *m = test_model();
    const char *tmp = getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp";
    char dir[600], cfg_path[700], st_path[700];
    snprintf(dir, sizeof dir, "%s/lora-peft-%d", tmp, (int)getpid());
    mkdir(dir, 0755);
    snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", dir);
    static const char *const good_names[] = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"};
    static const uint64_t good[2][2] = {{4, 64}, {64, 4}};
    static const uint64_t narrow[2][2] = {{4, 32}, {64, 4}};
    static const char *const embed_names[] = {
        "base_model.model.model.embed_tokens.lora_embedding_A",
        "base_model.model.model.embed_tokens.lora_embedding_B"};
    const char *plain = "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"bias\":\"none\","
                        "\"use_dora\":false,\"rank_pattern\":{},\"modules_to_save\":null}";
    const struct {
        const char *config;
        const char *const *names;
        const uint64_t (*shapes)[2];
        llm_status want;
        const char *msg;
    } cases[] = {
        {plain, good_names, good, LLM_OK, NULL},
        {"{\"r\":4,\"lora_alpha\":8,\"use_rslora\":true}", good_names, good, LLM_OK, NULL},
        {"{\"r\":4,\"lora_alpha\":8,\"use_dora\":true}", good_names, good, LLM_ERR_UNSUPPORTED,
         "use_dora"},
        {"{\"r\":4,\"lora_alpha\":8,\"rank_pattern\":{\"q_proj\":8}}", good_names, good,
         LLM_ERR_UNSUPPORTED, "rank_pattern"},
        {"{\"r\":4,\"lora_alpha\":8,\"bias\":\"all\"}", good_names, good, LLM_ERR_UNSUPPORTED,
         "bias"},
        {"{\"r\":8,\"lora_alpha\":8}", good_names, good, LLM_ERR_BAD_FORMAT, "config r is 8"},
        {"{\"r\":0,\"lora_alpha\":8}", good_names, good, LLM_ERR_BAD_FORMAT, "'r'"},
        {"{\"r\":4}", good_names, good, LLM_ERR_BAD_FORMAT, "lora_alpha"},
        {"{\"r\":4,", good_names, good, LLM_ERR_BAD_FORMAT, "not a JSON object"},
        {"{\"peft_type\":\"IA3\",\"r\":4,\"lora_alpha\":8}", good_names, good, LLM_ERR_UNSUPPORTED,
         "peft_type"},
        {plain, embed_names, good, LLM_ERR_UNSUPPORTED, "embed_tokens"},
        {plain, good_names, narrow, LLM_ERR_BAD_FORMAT, "the base weight has 64"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(cfg_path, "w");
        assert_non_null(f);
        fputs(cases[i].config, f);
        fclose(f);
        write_safetensors(st_path, 2, cases[i].names, cases[i].shapes);
        char label[64];
        snprintf(label, sizeof label, "PEFT case %zu", i);
        expect_load(m, dir, cases[i].want, cases[i].msg, label);
    }
    remove(st_path);
    expect_load(m, dir, LLM_ERR_IO, "adapter_model.safetensors", "no weights file");
    remove(cfg_path);
    rmdir(dir);
    llm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_matches_merged),
        cmocka_unit_test(test_peft_matches_gguf),
        cmocka_unit_test(test_mixed_batch_bitwise),
        cmocka_unit_test(test_against_llama_cpp),
        cmocka_unit_test(test_requests_and_prefix_cache),
        cmocka_unit_test(test_adapter_of_other_model),
        cmocka_unit_test(test_token_level),
        cmocka_unit_test(test_backend_without_lora),
        cmocka_unit_test(test_bad_gguf_adapters),
        cmocka_unit_test(test_bad_peft_folders),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
