/* Helpers of the backend conformance suite: models, engines, pairs of
 * engines and the logits comparison (conformance.h). */
#include "conformance.h"

#include "model/model.h"

#include <unistd.h>

/* ---- models ---- */

llm_model *conf_model(const llmi_testmodel_params *p) {
    void *data = NULL;
    size_t size = 0;
    if (llmi_testmodel_to_memory(p, &data, &size) != LLM_OK)
        fail_msg("test model: %s", llmi_error_message());
    char path[512];
    const char *tmp = getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp";
    snprintf(path, sizeof path, "%s/conformance-%ld-%llu.gguf", tmp, (long)getpid(),
             (unsigned long long)p->seed);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
    llmi_free(data);
    llm_model *m = NULL;
    llm_status st = llmi_model_load(path, false, &m);
    remove(path);
    if (st != LLM_OK)
        fail_msg("load test model: %s", llmi_error_message());
    return m;
}

void conf_params(llmi_testmodel_params *p, llmi_ttype type, uint64_t seed) {
    llmi_testmodel_params_init(p);
    p->n_layer = 2;
    p->n_embd = 96;
    p->n_head = 6;
    p->n_head_kv = 2;
    p->n_ff = 160;
    p->n_ctx = CONF_CTX;
    p->type = type;
    p->seed = seed;
    p->weight_scale = 0.25f; /* logits spread enough for argmax checks */
}

/* ---- engines ---- */

void conf_shuffle_pool(llmi_kv *kv, uint64_t seed) {
    uint32_t n = llmi_kv_available(kv);
    llmi_kv_seq *s = calloc(n ? n : 1, sizeof *s);
    assert_non_null(s);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(llmi_kv_seq_reserve(kv, &s[i], 1), LLM_OK);
    uint64_t rng = seed;
    for (uint32_t i = n; i > 1; i--) { /* Fisher-Yates */
        uint32_t j = conf_rand(&rng) % i;
        llmi_kv_seq t = s[i - 1];
        s[i - 1] = s[j];
        s[j] = t;
    }
    for (uint32_t i = 0; i < n; i++)
        llmi_kv_seq_destroy(kv, &s[i]);
    free(s);
}

llmi_engine *conf_engine(const llmi_backend_ops *ops, const llm_model *m, llm_kv_type kv_type,
                         uint32_t block_size, uint32_t n_blocks, uint64_t shuffle_seed) {
    llmi_engine_config cfg = {.model = m,
                              .ops = ops,
                              .backend_cfg = {.n_threads = CONF_THREADS, .device = 0},
                              .kv_block_size = block_size,
                              .kv_blocks = n_blocks,
                              .kv_type = kv_type,
                              .max_rows = CONF_MAX_ROWS,
                              .max_ctx = CONF_CTX};
    llmi_engine *e = NULL;
    llm_status st = llmi_engine_create(&cfg, &e);
    if (st != LLM_OK)
        fail_msg("engine on '%s': %s", ops->name, llmi_error_message());
    /* The reference keeps f32 activations (the higher-precision path); the
     * backend under test takes them where it can (ignored otherwise). */
    llmi_engine_set_f32_activations(e, true);
    if (shuffle_seed)
        conf_shuffle_pool(e->kv, shuffle_seed);
    return e;
}

bool conf_refused(const llm_model *m) { return conf_refused_kv(m, LLM_KV_F32); }

bool conf_refused_kv(const llm_model *m, llm_kv_type kv_type) {
    llmi_engine_config cfg = {.model = m,
                              .ops = g_dut.ops,
                              .backend_cfg = {.n_threads = CONF_THREADS, .device = 0},
                              .kv_block_size = 16,
                              .kv_blocks = 4,
                              .kv_type = kv_type,
                              .max_rows = 1,
                              .max_ctx = 16};
    llmi_engine *e = NULL;
    llm_status st = llmi_engine_create(&cfg, &e);
    llmi_engine_free(e);
    if (st == LLM_ERR_UNSUPPORTED) {
        printf("#   skipped on '%s': %s\n", g_dut.ops->name, llmi_error_message());
        return true;
    }
    return false;
}

/* ---- poison ---- */

static const uint32_t POISON = 0x7fc0dead;

void conf_poison(float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        memcpy(&x[i], &POISON, sizeof POISON);
}

bool conf_is_poison(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &POISON, sizeof POISON) != 0)
            return false;
    return true;
}

/* ---- pairs ---- */

double conf_tolerance(const llm_model *m, llm_kv_type kv_type) {
    if (g_dut.tol_override > 0)
        return g_dut.tol_override;
    if (g_dut.f32_act)
        /* A quantized cache: a backend quantizes its own (slightly other)
         * rows, and a value near a rounding boundary lands a whole step
         * away (1/254 of a block's range for Q8_0, 1/16 for Q4_0; for FP8
         * one E4M3 step, 1/8 to 1/16 of the value itself, up to 1/14 of
         * the block's largest): a first guess, validated only on the CPU's
         * own tables so far. */
        return kv_type == LLM_KV_BF16       ? 4e-3
               : kv_type == LLM_KV_Q8_0     ? 2e-2
               : kv_type == LLM_KV_FP8_E4M3 ? 5e-2
               : kv_type == LLM_KV_Q4_0     ? 1e-1
                                            : 1e-3;
    bool quantized = llmi_ttype_get(m->layers[0].w[LLMI_ROLE_Q].type)->block > 1 ||
                     llmi_ttype_get(m->w[LLMI_ROLE_OUTPUT].type)->block > 1;
    return quantized ? 1.5e-1 : 1e-2;
}

static void side_open(conf_pair *p, conf_side *sd, const llmi_backend_ops *ops, llm_kv_type kv_type,
                      uint32_t block_size, uint32_t n_blocks, uint64_t shuffle_seed) {
    memset(sd, 0, sizeof *sd);
    sd->e = conf_engine(ops, p->m, kv_type, block_size, n_blocks, shuffle_seed);
    sd->logits = malloc((size_t)(CONF_MAX_ROWS + 1) * p->n_vocab * sizeof(float));
    assert_non_null(sd->logits);
}

static void side_close(conf_side *sd) {
    for (uint32_t s = 0; s < CONF_MAX_SEQS; s++)
        llmi_kv_seq_destroy(sd->e->kv, &sd->seq[s]);
    assert_int_equal(llmi_kv_check(sd->e->kv, NULL, 0), LLM_OK);
    llmi_engine_free(sd->e);
    free(sd->logits);
}

void conf_pair_open(conf_pair *p, const llm_model *m, llm_kv_type kv_type, uint32_t block_size,
                    uint32_t n_blocks, uint64_t shuffle_seed, const char *what) {
    memset(p, 0, sizeof *p);
    p->m = m;
    p->n_vocab = m->hp.n_vocab;
    p->what = what;
    p->tol = conf_tolerance(m, kv_type);
    /* The reference's blocks in order, the backend under test's scattered. */
    side_open(p, &p->ref, &llmi_backend_cpu, kv_type, block_size, n_blocks, 0);
    side_open(p, &p->dut, g_dut.ops, kv_type, block_size, n_blocks, shuffle_seed);
}

void conf_pair_close(conf_pair *p) {
    side_close(&p->ref);
    side_close(&p->dut);
}

void conf_pair_reserve(conf_pair *p, uint32_t s, uint32_t n_tokens) {
    conf_side *sides[2] = {&p->ref, &p->dut};
    for (int i = 0; i < 2; i++) {
        llm_status st = llmi_kv_seq_reserve(sides[i]->e->kv, &sides[i]->seq[s], n_tokens);
        if (st != LLM_OK)
            fail_msg("%s: reserve %u tokens of sequence %u: %s", p->what, n_tokens, s,
                     llmi_error_message());
    }
}

uint32_t conf_side_step(const conf_pair *p, conf_side *sd, const conf_row *rows, uint32_t n) {
    llmi_batch_row br[CONF_MAX_ROWS];
    assert_true(n <= CONF_MAX_ROWS);
    uint32_t n_logits = 0;
    for (uint32_t r = 0; r < n; r++) {
        br[r] = (llmi_batch_row){rows[r].token, rows[r].pos, &sd->seq[rows[r].seq], rows[r].want};
        n_logits += rows[r].want;
    }
    const size_t V = p->n_vocab;
    conf_poison(sd->logits, (CONF_MAX_ROWS + 1) * V);
    llm_status st = llmi_engine_run(sd->e, br, n, sd->logits);
    if (st != LLM_OK)
        fail_msg("%s: step of %u rows on '%s': %s", p->what, n, sd->e->ops->name,
                 llmi_error_message());
    /* Exactly n_logits rows written, every one finite. */
    if (!conf_is_poison(sd->logits + n_logits * V, V))
        fail_msg("%s: '%s' wrote logits past its %u rows", p->what, sd->e->ops->name, n_logits);
    for (size_t i = 0; i < n_logits * V; i++)
        if (!isfinite(sd->logits[i]))
            fail_msg("%s: '%s' left logit %zu of row %zu not finite (%g)", p->what,
                     sd->e->ops->name, i % V, i / V, (double)sd->logits[i]);
    return n_logits;
}

uint32_t conf_pair_step(conf_pair *p, const conf_row *rows, uint32_t n) {
    uint32_t k = conf_side_step(p, &p->ref, rows, n);
    conf_side_step(p, &p->dut, rows, n);
    for (uint32_t s = 0; s < CONF_MAX_SEQS; s++)
        assert_int_equal(p->ref.seq[s].n_tokens, p->dut.seq[s].n_tokens);
    double err =
        conf_compare(p->ref.logits, p->dut.logits, k, p->n_vocab, g_dut.exact, p->tol, p->what);
    if (err > p->max_err)
        p->max_err = err;
    return k;
}

/* ---- comparison ---- */

double conf_compare(const float *ref, const float *got, uint32_t n_rows, uint32_t n_vocab,
                    bool exact, double tol, const char *what) {
    double worst = 0;
    for (uint32_t r = 0; r < n_rows; r++) {
        const float *a = ref + (size_t)r * n_vocab, *b = got + (size_t)r * n_vocab;
        if (exact) {
            if (memcmp(a, b, n_vocab * sizeof *a) != 0) {
                uint32_t i = 0;
                while (a[i] == b[i])
                    i++;
                fail_msg("%s: logits row %u differ (must be bit-identical): [%u] %.9g vs %.9g",
                         what, r, i, (double)a[i], (double)b[i]);
            }
            continue;
        }
        double amax = 0, err = 0;
        uint32_t top = 0, gtop = 0;
        for (uint32_t i = 0; i < n_vocab; i++) {
            amax = fmax(amax, fabs(a[i]));
            err = fmax(err, fabs((double)a[i] - b[i]));
            if (a[i] > a[top])
                top = i;
            if (b[i] > b[gtop])
                gtop = i;
        }
        uint32_t second = top == 0 ? 1 : 0;
        for (uint32_t i = 0; i < n_vocab; i++)
            if (i != top && a[i] > a[second])
                second = i;
        assert_true(amax > 0); /* never compare zeros */
        double rel = err / amax;
        if (!(rel <= tol))
            fail_msg("%s: logits row %u: max |error| %.3g = %.3g of max |logit| %.3g, "
                     "tolerance %.3g",
                     what, r, err, rel, amax, tol);
        double gap = ((double)a[top] - a[second]) / amax;
        if (gap > fmax(1e-2, 2 * tol) && gtop != top)
            fail_msg("%s: logits row %u: argmax %u, the reference's is %u (gap %.3g)", what, r,
                     gtop, top, gap);
        worst = fmax(worst, rel);
    }
    return worst;
}
