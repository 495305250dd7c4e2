/* Saved states of sequences decoded under a LoRA adapter (lib/state,
 * session/decode.c, docs/lora.md):
 *
 *  - an adapter's fingerprint is a function of its content: two loads of
 *    one file share it, another alpha or other weights change it;
 *  - a record names the adapter and scale its K/V were computed with (read
 *    here from the raw payload with zlib, by the layout state.h documents);
 *  - a restored sequence refuses to decode, and so do its forks, until
 *    llm_seq_set_adapter gives it an adapter of the same fingerprint at the
 *    same scale (another adapter, another scale, none: refused, naming
 *    both); then it continues exactly as the sequence that was never saved
 *    (same tokens, bitwise the same logits; greedy and seeded sampling),
 *    which the base model does not (so the test can tell);
 *  - a waiting sequence saves what it waits for; it closes and truncates
 *    as usual; a session state mixes records with and without adapters;
 *  - every single-byte corruption of a state with an adapter is refused,
 *    and so are adapter fields that contradict each other (rebuilt with
 *    valid CRCs).
 * The adapter is random (fixed seed) for the generated test model. */
#include "gguf/gguf.h"
#include "model/adapter.h"
#include "sched_util.h"
#include "state/state.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static llm_model *g_model;
static uint32_t g_vocab;
static char g_dir[512];
static char g_path_x[600], g_path_y[600];

enum { PROMPT = 13, STEPS = 12, SAVE_AT = 5 };
static const float SCALE = 0.75f;

/* ---- an adapter for the test model ---- */

static float rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffff) / 65536.0f - 0.5f;
}

/* Rank-4 pairs on q and v of every layer and on ffn_down of layer 0, with
 * values of the given seed; alpha 8. */
static void write_adapter(const char *path, uint64_t seed, float alpha) {
    static const llmi_layer_role roles[] = {LLMI_ROLE_Q, LLMI_ROLE_V, LLMI_ROLE_DOWN};
    llmi_gguf_writer *w = NULL;
    assert_int_equal(llmi_gguf_writer_create(&w), LLM_OK);
    assert_int_equal(llmi_gguf_w_str(w, "general.architecture", g_model->hp.arch), LLM_OK);
    assert_int_equal(llmi_gguf_w_str(w, "general.type", "adapter"), LLM_OK);
    assert_int_equal(llmi_gguf_w_str(w, "adapter.type", "lora"), LLM_OK);
    assert_int_equal(llmi_gguf_w_f32(w, "adapter.lora.alpha", alpha), LLM_OK);
    const uint64_t rank = 4;
    float *v = malloc(4096 * rank * sizeof *v);
    assert_non_null(v);
    for (uint32_t l = 0; l < g_model->hp.n_layer; l++)
        for (size_t r = 0; r < sizeof roles / sizeof *roles; r++) {
            if (roles[r] == LLMI_ROLE_DOWN && l > 0)
                continue;
            const llmi_weight *wt = &g_model->layers[l].w[roles[r]];
            assert_true((uint64_t)(wt->rows > wt->cols ? wt->rows : wt->cols) <= 4096);
            char base[128], name[160];
            snprintf(base, sizeof base, llmi_layer_roles[roles[r]].name, l);
            uint64_t ne_a[2] = {(uint64_t)wt->cols, rank}, ne_b[2] = {rank, (uint64_t)wt->rows};
            for (size_t i = 0; i < 4096 * rank; i++)
                v[i] = rnd(&seed) * 0.5f;
            snprintf(name, sizeof name, "%s.lora_a", base);
            assert_int_equal(llmi_gguf_w_tensor(w, name, LLMI_T_F32, 2, ne_a, v), LLM_OK);
            for (size_t i = 0; i < 4096 * rank; i++)
                v[i] = rnd(&seed) * 0.5f;
            snprintf(name, sizeof name, "%s.lora_b", base);
            assert_int_equal(llmi_gguf_w_tensor(w, name, LLMI_T_F32, 2, ne_b, v), LLM_OK);
        }
    assert_int_equal(llmi_gguf_writer_save(w, path), LLM_OK);
    llmi_gguf_writer_free(w);
    free(v);
}

static llm_adapter *load_adapter(const char *path) {
    llm_adapter *a = NULL;
    if (llm_adapter_load(g_model, path, NULL, &a) != LLM_OK)
        fail_msg("%s: %s", path, llm_last_error());
    return a;
}

/* ---- sessions and decoding ---- */

static llm_session *make_session(uint32_t n_blocks) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = 128;
    p.max_batch_tokens = 32;
    p.kv_block_size = 8;
    p.kv_cache_bytes =
        (uint64_t)n_blocks *
        llmi_kv_block_bytes(g_model->hp.n_layer, g_model->hp.n_head_kv * g_model->hp.head_dim, 8);
    llm_session *s = NULL;
    if (llm_session_create(g_model, &p, &s) != LLM_OK)
        fail_msg("session: %s", llm_last_error());
    return s;
}

static llm_status try_decode(llm_session *s, llm_seq_id seq, uint32_t pos, const llm_token *t,
                             uint32_t n) {
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(n, &b), LLM_OK);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(llm_batch_add(b, seq, pos + i, t[i], i == n - 1), LLM_OK);
    llm_status st = llm_session_decode(s, b);
    llm_batch_free(b);
    return st;
}

/* Decodes; returns the last row's logits (borrowed until the next decode). */
static const float *decode(llm_session *s, llm_seq_id seq, uint32_t pos, const llm_token *t,
                           uint32_t n) {
    if (try_decode(s, seq, pos, t, n) != LLM_OK)
        fail_msg("decode: %s", llm_last_error());
    const float *lg = NULL;
    assert_int_equal(llm_session_logits(s, n - 1, &lg), LLM_OK);
    return lg;
}

static void prompt(llm_token *t) {
    uint64_t rng = 4242;
    random_prompt(t, PROMPT, g_vocab, &rng);
    printf("# prompt seed 4242\n");
}

/* Samples `n` tokens after `logits` (the logits of position pos - 1) with
 * `sm`, feeding each; toks/out receive each token and the logits that
 * followed it. */
static void generate(llm_session *s, llm_sampler *sm, llm_seq_id seq, llm_token *history,
                     uint32_t pos, const float *logits, uint32_t n, float *out) {
    for (uint32_t i = 0; i < n; i++) {
        llm_token t;
        assert_int_equal(
            llm_sampler_sample(sm, logits, history, pos + i, pos + i - PROMPT, pos + i, &t),
            LLM_OK);
        history[pos + i] = t;
        logits = decode(s, seq, pos + i, &t, 1);
        memcpy(out + (size_t)i * g_vocab, logits, g_vocab * sizeof(float));
    }
}

static uint8_t *save_seq(llm_session *s, llm_seq_id seq, size_t *size) {
    size_t bound = 0;
    assert_int_equal(llm_seq_state_save(s, seq, NULL, 0, &bound), LLM_ERR_BUFFER_TOO_SMALL);
    uint8_t *buf = malloc(bound);
    assert_non_null(buf);
    if (llm_seq_state_save(s, seq, buf, bound, size) != LLM_OK)
        fail_msg("save: %s", llm_last_error());
    return buf;
}

static void expect_error(llm_status st, llm_status want, const char *a, const char *b) {
    if (st != want)
        fail_msg("got %s (%s), want %s", llm_status_name(st), st ? llm_last_error() : "",
                 llm_status_name(want));
    if (a && !strstr(llm_last_error(), a))
        fail_msg("'%s' not in: %s", a, llm_last_error());
    if (b && !strstr(llm_last_error(), b))
        fail_msg("'%s' not in: %s", b, llm_last_error());
}

static void hex(char *buf, uint64_t v) { snprintf(buf, 17, "%016llx", (unsigned long long)v); }

/* ---- the raw payload, by the documented layout ---- */

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }
static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Inflates a version 3 state's payload (malloc'ed). */
static uint8_t *raw_payload(const uint8_t *st, size_t size, size_t *n) {
    uint32_t hl = le32(st + 12);
    assert_int_equal(le32(st + 8), 3);
    uint64_t raw = le64(st + hl - 28), comp = le64(st + hl - 20);
    assert_int_equal(comp, size - hl);
    uint8_t *out = malloc(raw);
    uLongf got = (uLongf)raw;
    assert_int_equal(uncompress(out, &got, st + hl, (uLong)comp), Z_OK);
    assert_int_equal(got, raw);
    *n = (size_t)raw;
    return out;
}

/* The state with `raw` as its payload, every length and CRC right. */
static uint8_t *rebuild(const uint8_t *st, const uint8_t *raw, size_t n, size_t *size) {
    uint32_t hl = le32(st + 12);
    uLongf comp = compressBound((uLong)n);
    uint8_t *o = malloc(hl + comp);
    assert_int_equal(compress2(o + hl, &comp, raw, (uLong)n, 1), Z_OK);
    memcpy(o, st, hl);
    put_le(o + hl - 20, comp, 8);
    put_le(o + hl - 12, (uint32_t)crc32(0, raw, (uInt)n), 4);
    put_le(o + hl - 8, (uint32_t)crc32(0, o + hl, (uInt)comp), 4);
    put_le(o + hl - 4, (uint32_t)crc32(0, o, hl - 4), 4);
    *size = hl + comp;
    return o;
}

/* ---- tests ---- */

static void test_fingerprint(void **state) {
    (void)state;
    llm_adapter *x1 = load_adapter(g_path_x), *x2 = load_adapter(g_path_x);
    llm_adapter *y = load_adapter(g_path_y);
    assert_true(x1->id != x2->id);
    assert_true(x1->fingerprint != 0 && x1->fingerprint == x2->fingerprint);
    assert_true(y->fingerprint != x1->fingerprint);
    /* Another alpha, same matrices; and the same content written again. */
    char path[640];
    snprintf(path, sizeof path, "%s/alpha.gguf", g_dir);
    write_adapter(path, 7, 16.0f);
    llm_adapter *z = load_adapter(path);
    assert_true(z->fingerprint != x1->fingerprint);
    llm_adapter_free(z);
    write_adapter(path, 7, 8.0f);
    z = load_adapter(path);
    assert_true(z->fingerprint == x1->fingerprint);
    /* One value changed by one bit changes it. */
    float *a = (float *)llmi_adapter_pair(z, 0, LLMI_LORA_Q)->a;
    uint32_t bits;
    memcpy(&bits, &a[3], 4);
    bits ^= 1;
    memcpy(&a[3], &bits, 4);
    assert_true(llmi_adapter_fingerprint(z) != x1->fingerprint);
    llm_adapter_free(z);
    unlink(path);
    printf("# fingerprints: x %016llx, y %016llx\n", (unsigned long long)x1->fingerprint,
           (unsigned long long)y->fingerprint);
    llm_adapter_free(x1);
    llm_adapter_free(x2);
    llm_adapter_free(y);
}

/* The sequence never saved: STEPS tokens after the prompt under x at
 * SCALE with `sp`; the state after SAVE_AT of them. */
static void straight(const llm_sampling_params *sp, llm_token *hist, float *logits, uint8_t **st,
                     size_t *st_size) {
    llm_adapter *x = load_adapter(g_path_x);
    llm_session *s = make_session(64);
    llm_sampler *sm = NULL;
    assert_int_equal(llm_sampler_create(g_model, sp, 0, &sm), LLM_OK);
    llm_seq_id a;
    assert_int_equal(llm_seq_open(s, &a), LLM_OK);
    assert_int_equal(llm_seq_set_adapter(s, a, x, SCALE), LLM_OK);
    prompt(hist);
    const float *lg = decode(s, a, 0, hist, PROMPT);
    generate(s, sm, a, hist, PROMPT, lg, SAVE_AT, logits);
    *st = save_seq(s, a, st_size);
    generate(s, sm, a, hist, PROMPT + SAVE_AT, logits + (size_t)(SAVE_AT - 1) * g_vocab,
             STEPS - SAVE_AT, logits + (size_t)SAVE_AT * g_vocab);
    llm_sampler_free(sm);
    llm_session_free(s);
    llm_adapter_free(x);
}

static void restore_and_continue(const llm_sampling_params *sp, const char *what) {
    llm_token hist[PROMPT + STEPS], hist2[PROMPT + STEPS];
    float *want = malloc((size_t)STEPS * g_vocab * sizeof *want);
    float *got = malloc((size_t)STEPS * g_vocab * sizeof *got);
    uint8_t *st = NULL;
    size_t size = 0;
    straight(sp, hist, want, &st, &size);

    /* The record names x and SCALE. */
    llm_adapter *x = load_adapter(g_path_x), *y = load_adapter(g_path_y);
    size_t n = 0;
    uint8_t *raw = raw_payload(st, size, &n);
    assert_int_equal(le32(raw + 4), PROMPT + SAVE_AT);
    assert_true(le64(raw + 8) == x->fingerprint);
    float sc;
    uint32_t sb = le32(raw + 16);
    memcpy(&sc, &sb, 4);
    assert_true(sc == SCALE);
    free(raw);

    /* A fresh session: the sequence waits for x. */
    llm_session *s = make_session(64);
    llm_seq_id b = -1;
    if (llm_seq_state_load(s, st, size, &b) != LLM_OK)
        fail_msg("load: %s", llm_last_error());
    char fx[17], fy[17];
    hex(fx, x->fingerprint);
    hex(fy, y->fingerprint);
    llm_token next = 1;
    expect_error(try_decode(s, b, PROMPT + SAVE_AT, &next, 1), LLM_ERR_INVALID_ARGUMENT, fx,
                 "llm_seq_set_adapter");
    expect_error(llm_seq_set_adapter(s, b, y, SCALE), LLM_ERR_INVALID_ARGUMENT, fx, fy);
    expect_error(llm_seq_set_adapter(s, b, x, 0.5f), LLM_ERR_INVALID_ARGUMENT, "0.75", "0.5");
    expect_error(llm_seq_set_adapter(s, b, NULL, 0.0f), LLM_ERR_INVALID_ARGUMENT, fx, "no adapter");
    /* Still waiting after the refusals. */
    expect_error(try_decode(s, b, PROMPT + SAVE_AT, &next, 1), LLM_ERR_INVALID_ARGUMENT, fx, NULL);
    uint32_t len = 0;
    assert_int_equal(llm_seq_length(s, b, &len), LLM_OK);
    assert_int_equal(len, PROMPT + SAVE_AT);

    /* A fork waits too; the base model would continue otherwise. */
    llm_seq_id f;
    assert_int_equal(llm_seq_fork(s, b, &f), LLM_OK);
    expect_error(try_decode(s, f, PROMPT + SAVE_AT, &next, 1), LLM_ERR_INVALID_ARGUMENT, fx, NULL);

    /* Another load of x's file: same fingerprint, so it is the adapter. */
    assert_int_equal(llm_seq_set_adapter(s, b, x, SCALE), LLM_OK);
    memcpy(hist2, hist, (PROMPT + SAVE_AT) * sizeof *hist);
    llm_sampler *sm = NULL;
    assert_int_equal(llm_sampler_create(g_model, sp, 0, &sm), LLM_OK);
    generate(s, sm, b, hist2, PROMPT + SAVE_AT, want + (size_t)(SAVE_AT - 1) * g_vocab,
             STEPS - SAVE_AT, got + (size_t)SAVE_AT * g_vocab);
    assert_memory_equal(hist2, hist, sizeof hist);
    assert_memory_equal(got + (size_t)SAVE_AT * g_vocab, want + (size_t)SAVE_AT * g_vocab,
                        (size_t)(STEPS - SAVE_AT) * g_vocab * sizeof(float));

    /* The base model on the same tokens gives other logits: a restore that
     * dropped the adapter would not pass the comparison above. */
    llm_seq_id base;
    assert_int_equal(llm_seq_open(s, &base), LLM_OK);
    const float *lg = decode(s, base, 0, hist, PROMPT + SAVE_AT + 1);
    assert_true(memcmp(lg, want + (size_t)SAVE_AT * g_vocab, g_vocab * sizeof(float)) != 0);
    assert_int_equal(llm_seq_close(s, f), LLM_OK); /* a waiting sequence closes */
    assert_int_equal(llm_seq_close(s, base), LLM_OK);
    printf("# %s: %d tokens after a restore at %d under x: identical tokens and logits\n", what,
           STEPS - SAVE_AT, SAVE_AT);
    llm_sampler_free(sm);
    check_invariants(s);
    llm_session_free(s);
    llm_adapter_free(x);
    llm_adapter_free(y);
    free(st);
    free(want);
    free(got);
}

static void test_continue_greedy(void **state) {
    (void)state;
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.temperature = 0.0f;
    restore_and_continue(&sp, "greedy");
}

static void test_continue_seeded(void **state) {
    (void)state;
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.seed = 99;
    restore_and_continue(&sp, "seeded (seed 99)");
}

/* A waiting sequence: a re-save gives the saved bytes; truncated to empty
 * it takes any adapter; a session state mixes records. */
static void test_waiting_sequences(void **state) {
    (void)state;
    llm_adapter *x = load_adapter(g_path_x), *y = load_adapter(g_path_y);
    llm_token p[PROMPT];
    prompt(p);
    llm_session *s = make_session(64);
    llm_seq_id a, plain;
    assert_int_equal(llm_seq_open(s, &a), LLM_OK);
    assert_int_equal(llm_seq_set_adapter(s, a, x, SCALE), LLM_OK);
    decode(s, a, 0, p, PROMPT);
    assert_int_equal(llm_seq_open(s, &plain), LLM_OK);
    decode(s, plain, 0, p, PROMPT);
    size_t size = 0, size2 = 0;
    uint8_t *st = save_seq(s, a, &size);

    llm_session *t = make_session(64);
    llm_seq_id b;
    assert_int_equal(llm_seq_state_load(t, st, size, &b), LLM_OK);
    uint8_t *again = save_seq(t, b, &size2);
    assert_int_equal(size2, size);
    assert_memory_equal(again, st, size);
    free(again);
    /* Truncated but not empty: still x's K/V. */
    assert_int_equal(llm_seq_truncate(t, b, 3), LLM_OK);
    expect_error(llm_seq_set_adapter(t, b, y, SCALE), LLM_ERR_INVALID_ARGUMENT, NULL, NULL);
    /* Empty: no K/V left, any adapter (or none) may follow; until one is
     * set it still waits. */
    assert_int_equal(llm_seq_truncate(t, b, 0), LLM_OK);
    expect_error(try_decode(t, b, 0, p, 1), LLM_ERR_INVALID_ARGUMENT, "llm_seq_set_adapter", NULL);
    assert_int_equal(llm_seq_set_adapter(t, b, y, 1.0f), LLM_OK);
    decode(t, b, 0, p, 2);
    assert_int_equal(llm_seq_close(t, b), LLM_OK);

    /* A session state: the record without an adapter decodes at once. */
    free(st);
    st = NULL;
    size_t bound = 0;
    assert_int_equal(llm_session_state_save(s, NULL, 0, &bound), LLM_ERR_BUFFER_TOO_SMALL);
    st = malloc(bound);
    assert_int_equal(llm_session_state_save(s, st, bound, &size), LLM_OK);
    llm_session_free(t);
    t = make_session(64);
    assert_int_equal(llm_session_state_load(t, st, size), LLM_OK);
    decode(t, plain, PROMPT, p, 1);
    expect_error(try_decode(t, a, PROMPT, p, 1), LLM_ERR_INVALID_ARGUMENT, NULL, NULL);
    /* One waiting row refuses the whole batch, and nothing was applied. */
    llm_batch *bt = NULL;
    assert_int_equal(llm_batch_create(2, &bt), LLM_OK);
    assert_int_equal(llm_batch_add(bt, plain, PROMPT + 1, p[0], true), LLM_OK);
    assert_int_equal(llm_batch_add(bt, a, PROMPT, p[0], true), LLM_OK);
    expect_error(llm_session_decode(t, bt), LLM_ERR_INVALID_ARGUMENT, NULL, NULL);
    uint32_t len = 0;
    assert_int_equal(llm_seq_length(t, plain, &len), LLM_OK);
    assert_int_equal(len, PROMPT + 1);
    assert_int_equal(llm_seq_set_adapter(t, a, x, SCALE), LLM_OK);
    assert_int_equal(llm_session_decode(t, bt), LLM_OK);
    llm_batch_free(bt);
    check_invariants(t);
    llm_session_free(t);
    llm_session_free(s);
    free(st);
    llm_adapter_free(x);
    llm_adapter_free(y);
}

/* Every single-byte change of a state with an adapter is refused; adapter
 * fields that contradict each other are refused with valid CRCs too. */
static void test_corrupt_adapter_fields(void **state) {
    (void)state;
    llm_adapter *x = load_adapter(g_path_x);
    llm_token p[PROMPT];
    prompt(p);
    llm_session *s = make_session(64);
    llm_seq_id a;
    assert_int_equal(llm_seq_open(s, &a), LLM_OK);
    assert_int_equal(llm_seq_set_adapter(s, a, x, SCALE), LLM_OK);
    decode(s, a, 0, p, PROMPT);
    size_t size = 0;
    uint8_t *st = save_seq(s, a, &size);
    llm_session *t = make_session(64);
    uint32_t free_before = t->kv->n_free;
    uint8_t *bad = malloc(size);
    unsigned tried = 0;
    static const uint8_t masks[] = {0xff, 0x01, 0x80};
    for (size_t i = 0; i < size; i++)
        for (size_t k = 0; k < sizeof masks; k++) {
            memcpy(bad, st, size);
            bad[i] ^= masks[k];
            llm_seq_id id = 5;
            llm_status r = llm_seq_state_load(t, bad, size, &id);
            if (r == LLM_OK)
                fail_msg("byte %zu ^ %02x accepted", i, masks[k]);
            assert_int_equal(id, -1);
            tried++;
        }
    assert_int_equal(t->kv->n_free, free_before);
    free(bad);

    /* Valid CRCs, fields that contradict each other. */
    size_t n = 0, sz = 0;
    uint8_t *raw = raw_payload(st, size, &n);
    struct {
        uint64_t fingerprint;
        uint32_t scale_bits;
        const char *msg;
    } cases[] = {
        {0, 0x3f400000u, "without an adapter"}, /* 0.75 of no adapter */
        {x->fingerprint, 0x7fc00000u, "not finite"},
        {x->fingerprint, 0x7f800000u, "not finite"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        put_le(raw + 8, cases[c].fingerprint, 8);
        put_le(raw + 16, cases[c].scale_bits, 4);
        uint8_t *r = rebuild(st, raw, n, &sz);
        llm_seq_id id = 5;
        expect_error(llm_seq_state_load(t, r, sz, &id), LLM_ERR_BAD_FORMAT, cases[c].msg, NULL);
        free(r);
    }
    /* No adapter at all: a plain sequence that decodes at once. */
    put_le(raw + 8, 0, 8);
    put_le(raw + 16, 0, 4);
    uint8_t *r = rebuild(st, raw, n, &sz);
    llm_seq_id id = -1;
    assert_int_equal(llm_seq_state_load(t, r, sz, &id), LLM_OK);
    decode(t, id, PROMPT, p, 1);
    free(r);
    free(raw);
    printf("# %u single-byte corruptions of a state with an adapter refused\n", tried);
    check_invariants(t);
    llm_session_free(t);
    llm_session_free(s);
    free(st);
    llm_adapter_free(x);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "%s/state-lora-%d",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp", (int)getpid());
    if (mkdir(g_dir, 0755) != 0 && errno != EEXIST)
        return -1;
    g_model = tiny_model(256, 1);
    g_vocab = g_model->hp.n_vocab;
    snprintf(g_path_x, sizeof g_path_x, "%s/x.gguf", g_dir);
    snprintf(g_path_y, sizeof g_path_y, "%s/y.gguf", g_dir);
    write_adapter(g_path_x, 7, 8.0f);
    write_adapter(g_path_y, 8, 8.0f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(g_path_x);
    unlink(g_path_y);
    rmdir(g_dir);
    llmi_model_free(g_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_continue_greedy),
        cmocka_unit_test(test_continue_seeded),
        cmocka_unit_test(test_waiting_sequences),
        cmocka_unit_test(test_corrupt_adapter_fields),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
