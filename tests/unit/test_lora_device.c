/* LoRA adapters on the test device (LLM_TEST_BACKEND, tests/unit/
 * device_util.h) against the CPU backend, on a generated Llama model with
 * random adapters written here with the GGUF writer. Under
 * LLM_TEST_BACKEND=cuda (make device-check) this is the CUDA backend's
 * LoRA path (cuda/lora.c, opt-in: the test sets LLM_CUDA_LORA=1); on the
 * CPU it checks the CPU against itself, bit for bit.
 *
 * Each case runs a prompt step of four sequences' rows interleaved (48
 * rows: the matmul path of wide steps) and a decode step of one row each
 * (4 rows: the GEMV path), rows with different adapters and rows without
 * one in the same steps:
 *   mixed       adapters of rank 1, 8 and 64 targeting every projection of
 *               every layer, and a sequence without adapter;
 *   per target  for each of Q, K, V, O, gate, up, down alone (rank 8), the
 *               same adapter at two scales: an update landing on the wrong
 *               columns of the fused Q/K/V product, or not at all, fails.
 * Checks: each row's logits within tol * max |ref| of the CPU's (tol 1e-3,
 * the backend conformance suite's for f32 activations: the device sums in
 * another order than the CPU, in the base model's products and attention
 * as in the adapters' dot products, each a relative error near 1e-6 per
 * layer); every adapter row past position 0 moved by more than 20 tol
 * from the same row without adapter (so a dropped update cannot pass; at
 * position 0 a Q or K update cannot move anything); rows without adapter
 * the same bits as in a step where no row has one. */
#include "backend/backend.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "model/adapter.h"
#include "model/model.h"
#include "model/testmodel.h"
#include "unit/device_util.h"

#include <math.h>
#include <unistd.h>

enum { N_SEQS = 4, N_PROMPT = 12, N_OUT = N_SEQS * (N_PROMPT + 1) };

static const double TOL = 1e-3;

static llm_model *g_model;

static const char *const target_names[LLMI_LORA_TARGETS] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

static uint64_t rng;
static float uniform(float lo, float hi) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((double)(rng >> 11) * 0x1.0p-53);
}

static void target_shape(const llmi_hparams *hp, llmi_lora_target t, uint32_t *in, uint32_t *out) {
    const uint32_t q = hp->n_head * hp->head_dim, kv = hp->n_head_kv * hp->head_dim;
    switch (t) {
    case LLMI_LORA_Q:
        *in = hp->n_embd, *out = q;
        break;
    case LLMI_LORA_K:
    case LLMI_LORA_V:
        *in = hp->n_embd, *out = kv;
        break;
    case LLMI_LORA_O:
        *in = q, *out = hp->n_embd;
        break;
    case LLMI_LORA_GATE:
    case LLMI_LORA_UP:
        *in = hp->n_embd, *out = hp->n_ff;
        break;
    default:
        *in = hp->n_ff, *out = hp->n_embd;
        break;
    }
}

/* An adapter of `rank` on the targets in `mask` (bit t: target t) of every
 * layer, alpha = rank (so alpha / rank = 1), values from `seed`. */
static llm_adapter *make_adapter(uint32_t rank, uint32_t mask, uint64_t seed) {
    const llmi_hparams *hp = &g_model->hp;
    rng = seed;
    printf("# adapter: rank %u, targets 0x%x, seed %llu\n", rank, mask, (unsigned long long)seed);
    llmi_gguf_writer *w = NULL;
    assert_int_equal(llmi_gguf_writer_create(&w), LLM_OK);
    assert_int_equal(llmi_gguf_w_str(w, "general.architecture", "llama"), LLM_OK);
    assert_int_equal(llmi_gguf_w_str(w, "general.type", "adapter"), LLM_OK);
    assert_int_equal(llmi_gguf_w_str(w, "adapter.type", "lora"), LLM_OK);
    assert_int_equal(llmi_gguf_w_f32(w, "adapter.lora.alpha", (float)rank), LLM_OK);
    float *v = malloc((size_t)rank * 4096 * sizeof *v);
    assert_non_null(v);
    for (uint32_t l = 0; l < hp->n_layer; l++)
        for (uint32_t t = 0; t < LLMI_LORA_TARGETS; t++) {
            if (!(mask >> t & 1))
                continue;
            uint32_t in, out;
            target_shape(hp, (llmi_lora_target)t, &in, &out);
            assert_true(in <= 4096 && out <= 4096);
            char name[128];
            const float ra = 1.0f / sqrtf((float)in), rb = 3.0f / sqrtf((float)rank);
            for (size_t i = 0; i < (size_t)rank * in; i++)
                v[i] = uniform(-ra, ra);
            uint64_t ne_a[2] = {in, rank};
            snprintf(name, sizeof name, "blk.%u.%s.weight.lora_a", l, target_names[t]);
            assert_int_equal(llmi_gguf_w_tensor(w, name, LLMI_T_F32, 2, ne_a, v), LLM_OK);
            for (size_t i = 0; i < (size_t)rank * out; i++)
                v[i] = uniform(-rb, rb);
            uint64_t ne_b[2] = {rank, out};
            snprintf(name, sizeof name, "blk.%u.%s.weight.lora_b", l, target_names[t]);
            assert_int_equal(llmi_gguf_w_tensor(w, name, LLMI_T_F32, 2, ne_b, v), LLM_OK);
        }
    free(v);
    const char *tmp = getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp";
    char path[600];
    snprintf(path, sizeof path, "%s/lora-device-%d.gguf", tmp, (int)getpid());
    assert_int_equal(llmi_gguf_writer_save(w, path), LLM_OK);
    llmi_gguf_writer_free(w);
    llm_adapter *a = NULL;
    if (llm_adapter_load(g_model, path, NULL, &a) != LLM_OK)
        fail_msg("loading the adapter: %s", llm_last_error());
    remove(path);
    return a;
}

static llmi_engine *make_engine(bool on_device) {
    llmi_engine_config cfg = {.model = g_model,
                              .backend_cfg = {.n_threads = 2},
                              .kv_block_size = 16,
                              .kv_blocks = 16,
                              .kv_type = LLM_KV_F32,
                              .max_rows = 64,
                              .max_ctx = 64};
    llmi_engine *e = NULL;
    llm_status st = on_device ? create_test_engine(&cfg, &e) : llmi_engine_create(&cfg, &e);
    if (st != LLM_OK)
        fail_msg("engine: %s", llm_last_error());
    llmi_engine_set_f32_activations(e, true);
    return e;
}

static llm_token token_of(int seq, int i) {
    return (llm_token)((i * 31 + seq * 17 + 5) % (int)(g_model->hp.n_vocab - 1));
}

/* The prompt step and the decode step of N_SEQS sequences, sequence q
 * under ad[q] at sc[q]: out holds N_OUT rows of logits, the prompt's rows
 * (position-major, interleaved) then the decode rows. */
static void run_steps(llmi_engine *e, const llm_adapter *const *ad, const float *sc, float *out) {
    const uint32_t V = g_model->hp.n_vocab;
    llmi_kv_seq seqs[N_SEQS] = {{0}};
    llmi_batch_row rows[N_SEQS * N_PROMPT];
    for (int q = 0; q < N_SEQS; q++)
        assert_int_equal(llmi_kv_seq_reserve(e->kv, &seqs[q], N_PROMPT + 1), LLM_OK);
    uint32_t n = 0;
    for (int i = 0; i < N_PROMPT; i++)
        for (int q = 0; q < N_SEQS; q++)
            rows[n++] = (llmi_batch_row){token_of(q, i), (uint32_t)i, &seqs[q], true, ad[q], sc[q]};
    if (llmi_engine_run(e, rows, n, out) != LLM_OK)
        fail_msg("prompt step: %s", llm_last_error());
    for (int q = 0; q < N_SEQS; q++)
        rows[q] = (llmi_batch_row){token_of(q, N_PROMPT), N_PROMPT, &seqs[q], true, ad[q], sc[q]};
    if (llmi_engine_run(e, rows, N_SEQS, out + (size_t)n * V) != LLM_OK)
        fail_msg("decode step: %s", llm_last_error());
    for (int q = 0; q < N_SEQS; q++)
        llmi_kv_seq_destroy(e->kv, &seqs[q]);
}

static int row_seq(uint32_t r) {
    return (int)(r < N_SEQS * N_PROMPT ? r % N_SEQS : r - N_SEQS * N_PROMPT);
}

/* The checks of the file's comment for one assignment of adapters. */
static void check_case(const char *what, const llm_adapter *const *ad, const float *sc) {
    const uint32_t V = g_model->hp.n_vocab;
    const size_t bytes = (size_t)N_OUT * V * sizeof(float);
    float *dev = malloc(bytes), *ref = malloc(bytes), *dev_plain = malloc(bytes);
    assert_non_null(dev);
    assert_non_null(ref);
    assert_non_null(dev_plain);
    const llm_adapter *none[N_SEQS] = {NULL};
    const float ones[N_SEQS] = {1, 1, 1, 1};
    llmi_engine *d = make_engine(true), *c = make_engine(false);
    run_steps(d, ad, sc, dev);
    run_steps(d, none, ones, dev_plain);
    run_steps(c, ad, sc, ref);
    llmi_engine_free(d);
    llmi_engine_free(c);
    double worst = 0.0, least_moved = INFINITY;
    for (uint32_t r = 0; r < N_OUT; r++) {
        const float *dr = dev + (size_t)r * V, *rr = ref + (size_t)r * V;
        const float *pr = dev_plain + (size_t)r * V;
        double amax = 0.0, err = 0.0, moved = 0.0;
        for (uint32_t i = 0; i < V; i++) {
            amax = fmax(amax, fabs(rr[i]));
            err = fmax(err, fabs((double)dr[i] - rr[i]));
            moved = fmax(moved, fabs((double)dr[i] - pr[i]));
        }
        if (!(err <= TOL * amax))
            fail_msg("%s: row %u: max |device - cpu| %.3g of max |cpu| %.3g", what, r, err, amax);
        worst = fmax(worst, err / amax);
        if (ad[row_seq(r)]) {
            /* At position 0 attention has one key: its weight is 1 whatever
             * q and k are, so Q and K updates cannot move that row. */
            if (r < N_SEQS)
                continue;
            if (!(moved > 20 * TOL * amax))
                fail_msg("%s: row %u: the adapter moved the logits by only %.3g of %.3g", what, r,
                         moved, amax);
            least_moved = fmin(least_moved, moved / amax);
        } else if (memcmp(dr, pr, V * sizeof(float)) != 0) {
            fail_msg("%s: row %u has no adapter but differs from a step without adapters", what, r);
        }
    }
    printf("# %s: worst relative error %.3g, least relative move %.3g\n", what, worst, least_moved);
    free(dev);
    free(ref);
    free(dev_plain);
}

static llmi_engine *device_engine_with_lora(void) {
    llmi_engine *d = make_engine(true);
    if (llmi_engine_has_lora(d))
        return d;
    /* A device without adapters (a CUDA tensor-parallel group) refuses them,
     * naming the opt-in of the CUDA backend. */
    llm_adapter *a = make_adapter(1, 1, 7);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(d->kv, &seq, 1), LLM_OK);
    float *logits = malloc(g_model->hp.n_vocab * sizeof *logits);
    llmi_batch_row row = {5, 0, &seq, true, a, 1.0f};
    assert_int_equal(llmi_engine_run(d, &row, 1, logits), LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(llm_last_error(), "LLM_CUDA_LORA"));
    printf("# skipped: backend '%s' does not apply adapters\n", d->ops->name);
    free(logits);
    llmi_kv_seq_destroy(d->kv, &seq);
    llm_adapter_free(a);
    llmi_engine_free(d);
    return NULL;
}

static void test_mixed(void **state) {
    (void)state;
    llmi_engine *probe = device_engine_with_lora();
    if (!probe)
        skip();
    llmi_engine_free(probe);
    const uint32_t all = (1u << LLMI_LORA_TARGETS) - 1;
    llm_adapter *r1 = make_adapter(1, all, 11), *r8 = make_adapter(8, all, 12),
                *r64 = make_adapter(64, all, 13);
    const llm_adapter *ad[N_SEQS] = {r1, NULL, r8, r64};
    const float sc[N_SEQS] = {1.0f, 1.0f, 0.7f, 1.0f};
    check_case("ranks 1, 8, 64 on every target", ad, sc);
    llm_adapter_free(r1);
    llm_adapter_free(r8);
    llm_adapter_free(r64);
}

static void test_per_target(void **state) {
    (void)state;
    llmi_engine *probe = device_engine_with_lora();
    if (!probe)
        skip();
    llmi_engine_free(probe);
    for (uint32_t t = 0; t < LLMI_LORA_TARGETS; t++) {
        llm_adapter *a = make_adapter(8, 1u << t, 100 + t);
        const llm_adapter *ad[N_SEQS] = {NULL, a, NULL, a};
        const float sc[N_SEQS] = {1.0f, 1.0f, 1.0f, -0.5f};
        char what[64];
        snprintf(what, sizeof what, "rank 8 on %s alone", target_names[t]);
        check_case(what, ad, sc);
        llm_adapter_free(a);
    }
}

static int setup(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p); /* llama: n_embd 64, 4 heads, 2 KV heads, n_ff 128 */
    const char *tmp = getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp";
    char path[600];
    snprintf(path, sizeof path, "%s/lora-device-base-%d.gguf", tmp, (int)getpid());
    if (llmi_testmodel_write(&p, path) != LLM_OK ||
        llmi_model_load(path, false, &g_model) != LLM_OK)
        return -1;
    remove(path);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llm_model_free(g_model);
    return 0;
}

int main(void) {
    /* The CUDA backend applies adapters only when asked (read when its
     * table is first used); graphs off, so that the steps without adapters
     * run eagerly as steps with adapters always do, and rows without one
     * can be compared bit for bit. */
    setenv("LLM_CUDA_LORA", "1", 1);
    setenv("LLM_CUDA_GRAPHS", "0", 1);
    struct CMUnitTest tests[] = {
        device_test(test_mixed),
        device_test(test_per_target),
    };
    return run_device_tests(tests, setup, teardown);
}
