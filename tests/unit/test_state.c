/* Session state (lib/state): token-level sequences saved and loaded back.
 *
 *  - round trips continue exactly: logits after a load are bitwise those of
 *    the original sequence (F32, F16, BF16 KV; other block sizes), and close
 *    when the KV type is converted;
 *  - llm_seq_tokens follows decode, truncate, fork and load;
 *  - every prefix and every single-byte corruption of a state is refused
 *    with nothing opened and no KV block kept; another model's state, a
 *    newer version, limits, NULL arguments, unknown sequences;
 *  - session states keep ids (a fork and a gap among them) and need a
 *    session without sequences; files: I/O errors, no PATH.tmp left, the
 *    old file kept when a save fails;
 *  - allocation-failure sweeps over save and load (buffer, file, session,
 *    KV type conversion): OUT_OF_MEMORY, no leak (LeakSanitizer in
 *    `make check`), the session usable after each;
 *  - SmolLM2 when LLM_TEST_MODEL is set.
 * Prompts are random with the fixed seeds printed. */
#include "sched_util.h"
#include "state/state.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static llm_model *g_model, *g_other;
static uint32_t g_vocab;
static char g_dir[512];

enum { MAX_STEPS = 8, PROMPT = 21 };

/* ---- helpers ---- */

static llm_session *make_session(const llm_model *m, llm_kv_type type, uint32_t block_size,
                                 uint32_t n_blocks, uint32_t n_ctx) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    p.max_batch_tokens = 32;
    p.kv_block_size = block_size;
    p.kv_type = type;
    p.kv_cache_bytes =
        (uint64_t)n_blocks * llmi_kv_block_bytes_ex(m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim,
                                                    block_size, llmi_kv_type_size(type));
    llm_session *s = NULL;
    if (create_test_session(m, &p, &s) != LLM_OK)
        fail_msg("session: %s", llm_last_error());
    return s;
}

static void path_of(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void prompt_tokens(llm_token *t, uint32_t n, uint64_t seed) {
    uint64_t rng = seed;
    random_prompt(t, n, g_vocab, &rng);
}

/* Decodes tokens at positions pos.. in one batch; returns the last row's
 * logits (borrowed until the next decode). */
static const float *decode(llm_session *s, llm_seq_id seq, uint32_t pos, const llm_token *t,
                           uint32_t n) {
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(n, &b), LLM_OK);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(llm_batch_add(b, seq, pos + i, t[i], i == n - 1), LLM_OK);
    llm_status st = llm_session_decode(s, b);
    if (st != LLM_OK)
        fail_msg("decode: %s", llm_last_error());
    llm_batch_free(b);
    const float *lg = NULL;
    assert_int_equal(llm_session_logits(s, n - 1, &lg), LLM_OK);
    return lg;
}

static llm_token argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (llm_token)best;
}

/* Greedy continuation: n steps from `logits`; the tokens fed and each
 * step's logits. */
static void greedy(llm_session *s, llm_seq_id seq, uint32_t pos, const float *logits, uint32_t n,
                   llm_token *toks, float *out) {
    for (uint32_t i = 0; i < n; i++) {
        toks[i] = argmax(logits, g_vocab);
        logits = decode(s, seq, pos + i, &toks[i], 1);
        memcpy(out + (size_t)i * g_vocab, logits, g_vocab * sizeof(float));
    }
}

/* Feeds the given tokens one per decode; each step's logits. */
static void feed(llm_session *s, llm_seq_id seq, uint32_t pos, const llm_token *toks, uint32_t n,
                 float *out) {
    for (uint32_t i = 0; i < n; i++) {
        const float *lg = decode(s, seq, pos + i, &toks[i], 1);
        memcpy(out + (size_t)i * g_vocab, lg, g_vocab * sizeof(float));
    }
}

/* Saves seq into a malloc'ed buffer of the size bound; checks the bound
 * protocol on the way. */
static uint8_t *save_seq(llm_session *s, llm_seq_id seq, size_t *size) {
    size_t bound = 0, small = 0;
    assert_int_equal(llm_seq_state_save(s, seq, NULL, 0, &bound), LLM_ERR_BUFFER_TOO_SMALL);
    assert_true(bound > LLMI_STATE_HEADER_FIXED);
    uint8_t *buf = malloc(bound);
    assert_non_null(buf);
    assert_int_equal(llm_seq_state_save(s, seq, buf, bound - 1, &small), LLM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(small, bound);
    if (llm_seq_state_save(s, seq, buf, bound, size) != LLM_OK)
        fail_msg("save: %s", llm_last_error());
    assert_true(*size <= bound && *size > LLMI_STATE_HEADER_FIXED);
    return buf;
}

static uint8_t *save_session(llm_session *s, size_t *size) {
    size_t bound = 0;
    assert_int_equal(llm_session_state_save(s, NULL, 0, &bound), LLM_ERR_BUFFER_TOO_SMALL);
    uint8_t *buf = malloc(bound);
    assert_non_null(buf);
    if (llm_session_state_save(s, buf, bound, size) != LLM_OK)
        fail_msg("session save: %s", llm_last_error());
    return buf;
}

static size_t n_open(const llm_session *s) {
    size_t n = 0;
    for (size_t i = 0; i < s->n_seqs; i++)
        n += s->seqs[i] != NULL;
    return n;
}

static uint32_t free_blocks(const llm_session *s) { return s->kv->n_free; }

static void check_tokens(llm_session *s, llm_seq_id seq, const llm_token *want, uint32_t n) {
    llm_token got[512];
    size_t n_got = 0;
    assert_true(n <= 512);
    assert_int_equal(llm_seq_tokens(s, seq, got, 512, &n_got), LLM_OK);
    assert_int_equal(n_got, n);
    if (n)
        assert_memory_equal(got, want, n * sizeof *want);
    uint32_t len = 0;
    assert_int_equal(llm_seq_length(s, seq, &len), LLM_OK);
    assert_int_equal(len, n);
}

/* Loads as a sequence state and expects a refusal (want == LLM_OK: any
 * status but LLM_OK) that opened nothing and kept no block. */
static llm_status expect_refused(llm_session *s, const void *data, size_t size, llm_status want) {
    size_t open_before = n_open(s);
    uint32_t free_before = free_blocks(s);
    llm_seq_id id = 12345;
    llm_status st = llm_seq_state_load(s, data, size, &id);
    if (want != LLM_OK && st != want)
        fail_msg("load of %zu bytes: %s (%s), want %s", size, llm_status_name(st), llm_last_error(),
                 llm_status_name(want));
    if (st == LLM_OK)
        fail_msg("a corrupt state of %zu bytes was accepted", size);
    assert_true(llm_last_error()[0] != '\0');
    assert_int_equal(id, -1);
    assert_int_equal(n_open(s), open_before);
    assert_int_equal(free_blocks(s), free_before);
    return st;
}

/* Header CRC over [0, hl - 4), as the format says. */
static void fix_header_crc(uint8_t *p) {
    uint32_t hl =
        (uint32_t)p[12] | (uint32_t)p[13] << 8 | (uint32_t)p[14] << 16 | (uint32_t)p[15] << 24;
    uint32_t c = (uint32_t)crc32(0, p, hl - 4);
    for (int i = 0; i < 4; i++)
        p[hl - 4 + i] = (uint8_t)(c >> (8 * i));
}

static uint64_t get_u64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* The raw payload of a state, inflated here with zlib's uncompress from
 * the layout the format documents (malloc'ed). */
static uint8_t *raw_payload(const uint8_t *st, size_t size, size_t *raw_len) {
    uint32_t hl =
        (uint32_t)st[12] | (uint32_t)st[13] << 8 | (uint32_t)st[14] << 16 | (uint32_t)st[15] << 24;
    /* Version 3: ... raw len, comp len, raw CRC, comp CRC, header CRC. */
    assert_int_equal(st[8], 3);
    uint64_t n = get_u64le(st + hl - 28), comp = get_u64le(st + hl - 20);
    assert_int_equal(comp, size - hl);
    uint32_t comp_crc = (uint32_t)st[hl - 8] | (uint32_t)st[hl - 7] << 8 |
                        (uint32_t)st[hl - 6] << 16 | (uint32_t)st[hl - 5] << 24;
    assert_int_equal(comp_crc, (uint32_t)crc32(0, st + hl, (uInt)comp));
    uint8_t *raw = malloc(n + 1);
    uLongf got = (uLongf)n;
    assert_int_equal(uncompress(raw, &got, st + hl, (uLong)comp), Z_OK);
    assert_int_equal(got, n);
    uint32_t crc = (uint32_t)st[hl - 12] | (uint32_t)st[hl - 11] << 8 |
                   (uint32_t)st[hl - 10] << 16 | (uint32_t)st[hl - 9] << 24;
    assert_int_equal(crc, (uint32_t)crc32(0, raw, (uInt)n));
    *raw_len = (size_t)n;
    return raw;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A version 3 state of one sequence rewritten as `version` (1 or 2) wrote
 * it: the record without its adapter fields, the header without the
 * compressed CRC for version 1 (malloc'ed). The record must name no
 * adapter: older versions cannot say one. */
static uint8_t *as_old_version(const uint8_t *st, size_t size, uint32_t version, size_t *out) {
    uint32_t hl =
        (uint32_t)st[12] | (uint32_t)st[13] << 8 | (uint32_t)st[14] << 16 | (uint32_t)st[15] << 24;
    size_t n = 0;
    uint8_t *raw = raw_payload(st, size, &n);
    for (int i = 8; i < 20; i++) /* fingerprint and scale of no adapter */
        assert_int_equal(raw[i], 0);
    memmove(raw + 8, raw + 20, n - 20);
    n -= 12;
    uint32_t nhl = version == 1 ? hl - 4 : hl;
    uLongf comp = compressBound((uLong)n);
    uint8_t *o = malloc(nhl + comp);
    assert_non_null(o);
    assert_int_equal(compress2(o + nhl, &comp, raw, (uLong)n, 1), Z_OK);
    memcpy(o, st, hl - 28); /* up to the raw length */
    uint8_t *e = o + nhl;   /* the end of the new header */
    put_le(o + 8, version, 4);
    put_le(o + 12, nhl, 4);
    int c = version == 1 ? 0 : 4; /* the compressed CRC's bytes */
    put_le(e - 24 - c, n, 8);
    put_le(e - 16 - c, comp, 8);
    put_le(e - 8 - c, (uint32_t)crc32(0, raw, (uInt)n), 4);
    if (c)
        put_le(e - 8, (uint32_t)crc32(0, o + nhl, (uInt)comp), 4);
    fix_header_crc(o);
    free(raw);
    *out = nhl + comp;
    return o;
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* A session with one sequence holding a random prompt; *logits = a copy of
 * the prompt's last logits. */
static llm_session *prompted(llm_kv_type type, uint32_t bs, uint64_t seed, llm_seq_id *seq,
                             llm_token *prompt, float *logits) {
    llm_session *s = make_session(g_model, type, bs, 64, 256);
    prompt_tokens(prompt, PROMPT, seed);
    assert_int_equal(llm_seq_open(s, seq), LLM_OK);
    const float *lg = decode(s, *seq, 0, prompt, PROMPT);
    if (logits)
        memcpy(logits, lg, g_vocab * sizeof(float));
    return s;
}

/* ---- round trips ---- */

/* Saves a prompted sequence of save_type, continues it greedily; loads the
 * state into a session of load_type and load_bs and feeds the same tokens.
 * Exact: every step's logits bitwise equal, and a re-save gives the same
 * bytes. Else: close (relative to the largest logit). */
static void round_trip(llm_kv_type save_type, llm_kv_type load_type, uint32_t load_bs, bool exact) {
    const uint64_t seed = 1000 + save_type * 10 + load_type;
    printf("# round trip kv %d -> %d, block 16 -> %u, prompt seed %llu\n", save_type, load_type,
           load_bs, (unsigned long long)seed);
    llm_token prompt[PROMPT], toks[MAX_STEPS];
    float *first = malloc(g_vocab * sizeof(float));
    float *ref = malloc((size_t)MAX_STEPS * g_vocab * sizeof(float));
    float *got = malloc((size_t)MAX_STEPS * g_vocab * sizeof(float));
    llm_seq_id a;
    llm_session *s1 = prompted(save_type, 16, seed, &a, prompt, first);
    size_t size = 0;
    uint8_t *state = save_seq(s1, a, &size);
    greedy(s1, a, PROMPT, first, MAX_STEPS, toks, ref);

    llm_session *s2 = make_session(g_model, load_type, load_bs, 128, 256);
    llm_seq_id other, b = -1;
    assert_int_equal(llm_seq_open(s2, &other), LLM_OK); /* the load gets a fresh id */
    if (llm_seq_state_load(s2, state, size, &b) != LLM_OK)
        fail_msg("load: %s", llm_last_error());
    assert_int_equal(b, other + 1);
    check_tokens(s2, b, prompt, PROMPT);
    if (exact) { /* lossless: the same payload comes out again, but the id */
        size_t size2 = 0, n1 = 0, n2 = 0;
        uint8_t *again = save_seq(s2, b, &size2);
        uint8_t *r1 = raw_payload(state, size, &n1), *r2 = raw_payload(again, size2, &n2);
        assert_int_equal(n1, n2);
        assert_int_equal(r1[0], a);
        assert_int_equal(r2[0], b);
        assert_memory_equal(r1 + 4, r2 + 4, n1 - 4);
        free(r1);
        free(r2);
        free(again);
    }
    feed(s2, b, PROMPT, toks, MAX_STEPS, got);
    for (uint32_t i = 0; i < MAX_STEPS; i++) {
        const float *r = ref + (size_t)i * g_vocab, *g = got + (size_t)i * g_vocab;
        if (exact) {
            if (memcmp(r, g, g_vocab * sizeof(float)) != 0)
                fail_msg("step %u: logits differ after the load", i);
            continue;
        }
        double diff = 0, scale = max_abs(r, g_vocab);
        for (uint32_t v = 0; v < g_vocab; v++)
            diff = fmax(diff, fabs((double)r[v] - g[v]));
        if (i == 0 || i == MAX_STEPS - 1)
            printf("#   step %u: max |diff| %.3g, max |logit| %.3g\n", i, diff, scale);
        assert_true(diff <= 0.05 * scale + 1e-4); /* f16 rounding, over 8 steps */
    }
    llm_token all[PROMPT + MAX_STEPS];
    memcpy(all, prompt, sizeof prompt);
    memcpy(all + PROMPT, toks, sizeof toks);
    check_tokens(s1, a, all, PROMPT + MAX_STEPS);
    check_tokens(s2, b, all, PROMPT + MAX_STEPS);
    check_invariants(s2);
    free(state);
    free(first);
    free(ref);
    free(got);
    llm_session_free(s1);
    llm_session_free(s2);
}

static void test_round_trip_f32(void **state) {
    (void)state;
    round_trip(LLM_KV_F32, LLM_KV_F32, 16, true);
    round_trip(LLM_KV_F32, LLM_KV_F32, 8, true);
    round_trip(LLM_KV_F32, LLM_KV_F32, 5, true);
}

static void test_round_trip_f16_bf16(void **state) {
    (void)state;
    round_trip(LLM_KV_F16, LLM_KV_F16, 16, true);
    round_trip(LLM_KV_F16, LLM_KV_F16, 8, true);
    round_trip(LLM_KV_BF16, LLM_KV_BF16, 32, true);
}

static void test_round_trip_converted(void **state) {
    (void)state;
    round_trip(LLM_KV_F32, LLM_KV_F16, 16, false);
    round_trip(LLM_KV_F32, LLM_KV_BF16, 8, false);
    round_trip(LLM_KV_F16, LLM_KV_F32, 16, false);
    round_trip(LLM_KV_BF16, LLM_KV_F16, 16, false);
}

/* ---- llm_seq_tokens ---- */

static void test_seq_tokens(void **state) {
    (void)state;
    llm_session *s = make_session(g_model, LLM_KV_F32, 8, 64, 256);
    llm_token p[40], got[40];
    prompt_tokens(p, 40, 7);
    printf("# prompt seed 7\n");
    llm_seq_id a, b, f;
    size_t n = 99;
    assert_int_equal(llm_seq_open(s, &a), LLM_OK);
    assert_int_equal(llm_seq_tokens(s, a, NULL, 0, &n), LLM_OK); /* empty */
    assert_int_equal(n, 0);
    decode(s, a, 0, p, 10);
    check_tokens(s, a, p, 10);
    assert_int_equal(llm_seq_tokens(s, a, got, 9, &n), LLM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, 10);
    assert_int_equal(llm_seq_tokens(s, a, NULL, 0, &n), LLM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, 10);
    assert_int_equal(llm_seq_tokens(s, a, NULL, 5, &n), LLM_ERR_INVALID_ARGUMENT);

    /* One batch over two sequences. */
    assert_int_equal(llm_seq_open(s, &b), LLM_OK);
    llm_batch *bt = NULL;
    assert_int_equal(llm_batch_create(8, &bt), LLM_OK);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(llm_batch_add(bt, a, 10 + i, p[10 + i], false), LLM_OK);
        assert_int_equal(llm_batch_add(bt, b, i, p[20 + i], i == 2), LLM_OK);
    }
    assert_int_equal(llm_session_decode(s, bt), LLM_OK);
    check_tokens(s, a, p, 13);
    check_tokens(s, b, p + 20, 3);

    /* A refused decode records nothing. */
    llm_batch_clear(bt);
    assert_int_equal(llm_batch_add(bt, a, 13, p[13], false), LLM_OK);
    assert_int_equal(llm_batch_add(bt, b, 9, p[13], false), LLM_OK); /* wrong position */
    assert_int_equal(llm_session_decode(s, bt), LLM_ERR_INVALID_ARGUMENT);
    check_tokens(s, a, p, 13);
    check_tokens(s, b, p + 20, 3);
    llm_batch_free(bt);

    /* Truncate, then grow again with other tokens. */
    assert_int_equal(llm_seq_truncate(s, a, 6), LLM_OK);
    check_tokens(s, a, p, 6);
    decode(s, a, 6, p + 30, 2);
    llm_token want[8];
    memcpy(want, p, 6 * sizeof *p);
    memcpy(want + 6, p + 30, 2 * sizeof *p);
    check_tokens(s, a, want, 8);

    /* A fork starts with its source's tokens; each then goes its own way. */
    assert_int_equal(llm_seq_fork(s, a, &f), LLM_OK);
    check_tokens(s, f, want, 8);
    decode(s, f, 8, p + 35, 3);
    check_tokens(s, a, want, 8);
    llm_token wf[11];
    memcpy(wf, want, sizeof want);
    memcpy(wf + 8, p + 35, 3 * sizeof *p);
    check_tokens(s, f, wf, 11);

    /* Loaded. */
    size_t size = 0;
    uint8_t *st = save_seq(s, f, &size);
    llm_seq_id l;
    assert_int_equal(llm_seq_state_load(s, st, size, &l), LLM_OK);
    check_tokens(s, l, wf, 11);
    free(st);

    /* Unknown and closed sequences; NULL arguments. */
    assert_int_equal(llm_seq_close(s, b), LLM_OK);
    assert_int_equal(llm_seq_tokens(s, b, got, 40, &n), LLM_ERR_NOT_FOUND);
    assert_int_equal(llm_seq_tokens(s, 77, got, 40, &n), LLM_ERR_NOT_FOUND);
    assert_int_equal(llm_seq_tokens(s, -1, got, 40, &n), LLM_ERR_NOT_FOUND);
    assert_int_equal(llm_seq_tokens(NULL, a, got, 40, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_tokens(s, a, got, 40, NULL), LLM_ERR_INVALID_ARGUMENT);
    check_invariants(s);
    llm_session_free(s);
}

/* ---- refusals ---- */

static void test_prefixes(void **state) {
    (void)state;
    llm_seq_id a;
    llm_token p[PROMPT];
    llm_session *s = prompted(LLM_KV_F32, 16, 11, &a, p, NULL);
    size_t size = 0;
    uint8_t *buf = save_seq(s, a, &size);
    llm_session *t = make_session(g_model, LLM_KV_F32, 16, 64, 256);
    llm_seq_id keep;
    assert_int_equal(llm_seq_open(t, &keep), LLM_OK); /* one open, untouched throughout */
    for (size_t len = 0; len < size; len++) {
        uint8_t *cut = malloc(len ? len : 1); /* exactly len bytes: ASan sees overreads */
        memcpy(cut, buf, len);
        expect_refused(t, cut, len, LLM_ERR_BAD_FORMAT);
        free(cut);
    }
    /* Trailing bytes are refused too. */
    uint8_t *longer = malloc(size + 1);
    memcpy(longer, buf, size);
    longer[size] = 0;
    expect_refused(t, longer, size + 1, LLM_ERR_BAD_FORMAT);
    free(longer);
    printf("# %zu prefixes of a %zu-byte state refused\n", size, size);
    llm_seq_id ok;
    assert_int_equal(llm_seq_state_load(t, buf, size, &ok), LLM_OK);
    check_tokens(t, ok, p, PROMPT);
    check_invariants(t);
    free(buf);
    llm_session_free(s);
    llm_session_free(t);
}

/* Every single-byte corruption of one saved state is refused, the session
 * unchanged. Returns the number of loads tried; counts[status & 15]. */
static unsigned corrupt_every_byte(llm_session *t, const uint8_t *buf, size_t size,
                                   unsigned counts[16]) {
    uint32_t hl = LLMI_STATE_HEADER_FIXED + (uint32_t)strlen(g_model->name);
    size_t stride = size > 65536 ? size / 65536 + 1 : 1;
    unsigned tried = 0;
    uint8_t *bad = malloc(size);
    assert_non_null(bad);
    static const uint8_t masks[] = {0xff, 0x01, 0x80};
    for (size_t i = 0; i < size; i += stride) {
        for (size_t k = 0; k < sizeof masks; k++) {
            memcpy(bad, buf, size);
            bad[i] ^= masks[k];
            llm_status st = expect_refused(t, bad, size, i < hl ? LLM_ERR_BAD_FORMAT : LLM_OK);
            counts[st & 15]++;
            tried++;
        }
    }
    free(bad);
    return tried;
}

/* Several states (prompts and KV types): a deflate stream has bits that
 * change no output byte (the code lengths of unused symbols, say), so a
 * check of the raw payload alone misses a flip there on some states and
 * not others. The format's CRC of the compressed bytes refuses them all. */
static void test_corruption(void **state) {
    (void)state;
    static const llm_kv_type types[] = {LLM_KV_F32, LLM_KV_F16, LLM_KV_BF16};
    unsigned counts[16] = {0}, tried = 0;
    llm_session *t = make_session(g_model, LLM_KV_F32, 16, 64, 256);
    for (uint64_t seed = 12; seed < 18; seed++) {
        llm_seq_id a;
        llm_token p[PROMPT];
        llm_session *s = prompted(types[seed % 3], 16, seed, &a, p, NULL);
        size_t size = 0;
        uint8_t *buf = save_seq(s, a, &size);
        tried += corrupt_every_byte(t, buf, size, counts);
        free(buf);
        llm_session_free(s);
    }
    printf("# %u single-byte corruptions of 6 states refused: %u BAD_FORMAT, %u LIMIT, %u other\n",
           tried, counts[LLM_ERR_BAD_FORMAT], counts[LLM_ERR_LIMIT],
           tried - counts[LLM_ERR_BAD_FORMAT] - counts[LLM_ERR_LIMIT]);
    check_invariants(t);
    llm_session_free(t);
}

static void test_other_model_and_version(void **state) {
    (void)state;
    llm_seq_id a;
    llm_token p[PROMPT];
    llm_session *s = prompted(LLM_KV_F32, 16, 13, &a, p, NULL);
    size_t size = 0;
    uint8_t *buf = save_seq(s, a, &size);

    /* Same shape and name, other weights. */
    assert_true(g_other->fingerprint != g_model->fingerprint);
    llm_session *o = make_session(g_other, LLM_KV_F32, 16, 64, 256);
    expect_refused(o, buf, size, LLM_ERR_INVALID_ARGUMENT);
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)g_other->fingerprint);
    assert_non_null(strstr(llm_last_error(), fp));
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)g_model->fingerprint);
    assert_non_null(strstr(llm_last_error(), fp));
    assert_non_null(strstr(llm_last_error(), g_model->name));
    llm_session_free(o);

    /* The fingerprint is a function of the file: loading again gives it. */
    llm_model *again = tiny_model(256, 1);
    assert_true(again->fingerprint == g_model->fingerprint);
    llmi_model_free(again);

    uint8_t *v = malloc(size);
    memcpy(v, buf, size);
    v[8] = 4; /* version 4, CRC fixed: refused as newer */
    fix_header_crc(v);
    expect_refused(s, v, size, LLM_ERR_UNSUPPORTED);
    v[8] = 0;
    fix_header_crc(v);
    expect_refused(s, v, size, LLM_ERR_BAD_FORMAT);
    v[8] = 1; /* version 1 says its header is 4 bytes shorter */
    fix_header_crc(v);
    expect_refused(s, v, size, LLM_ERR_BAD_FORMAT);
    v[8] = 2; /* version 2's records are 12 bytes shorter: the lengths disagree */
    fix_header_crc(v);
    expect_refused(s, v, size, LLM_ERR_BAD_FORMAT);
    assert_non_null(strstr(llm_last_error(), "does not match"));
    v[8] = 3; /* and back: valid again */
    fix_header_crc(v);
    assert_memory_equal(v, buf, size);
    free(v);

    /* The same state as versions 1 (no compressed CRC) and 2 wrote it (no
     * adapter fields) loads with the same tokens and as bitwise the same
     * K/V (a re-save is the version 3 state), and a flip inside its payload
     * is still refused by the CRCs or by zlib. */
    llm_session *t = make_session(g_model, LLM_KV_F32, 16, 64, 256);
    for (uint32_t version = 1; version <= 2; version++) {
        size_t old_size = 0;
        uint8_t *old = as_old_version(buf, size, version, &old_size);
        assert_int_equal(old[8], version);
        llm_seq_id b = -1;
        if (llm_seq_state_load(t, old, old_size, &b) != LLM_OK)
            fail_msg("version %u load: %s", version, llm_last_error());
        check_tokens(t, b, p, PROMPT);
        size_t again_size = 0;
        uint8_t *resaved = save_seq(t, b, &again_size);
        assert_int_equal(again_size, size);
        assert_memory_equal(resaved, buf, size);
        free(resaved);
        assert_int_equal(llm_seq_close(t, b), LLM_OK);
        old[old_size - 1] ^= 0xff;
        expect_refused(t, old, old_size, LLM_ERR_BAD_FORMAT);
        free(old);
    }
    llm_session_free(t);
    free(buf);
    llm_session_free(s);
}

static void test_limits(void **state) {
    (void)state;
    llm_seq_id a;
    llm_token p[PROMPT];
    llm_session *s = prompted(LLM_KV_F32, 16, 14, &a, p, NULL);
    size_t size = 0;
    uint8_t *buf = save_seq(s, a, &size);

    llm_session *t = make_session(g_model, LLM_KV_F32, 16, 64, 16); /* n_ctx 16 < 21 */
    expect_refused(t, buf, size, LLM_ERR_LIMIT);
    llm_session_free(t);
    t = make_session(g_model, LLM_KV_F32, 16, 1, 256); /* one block of 16 */
    expect_refused(t, buf, size, LLM_ERR_LIMIT);
    llm_session_free(t);
    /* Enough blocks in total, but another sequence holds most of them. */
    t = make_session(g_model, LLM_KV_F32, 8, 4, 256);
    llm_seq_id b;
    assert_int_equal(llm_seq_open(t, &b), LLM_OK);
    decode(t, b, 0, p, 9); /* 2 of 4 blocks; the state needs 3 */
    expect_refused(t, buf, size, LLM_ERR_LIMIT);
    assert_int_equal(llm_seq_truncate(t, b, 8), LLM_OK); /* now 3 are free */
    llm_seq_id c;
    assert_int_equal(llm_seq_state_load(t, buf, size, &c), LLM_OK);
    assert_int_equal(free_blocks(t), 0);
    check_invariants(t);
    llm_session_free(t);

    /* Session states: too many tokens for the blocks left. */
    uint8_t *ss = NULL;
    size_t ss_size = 0;
    llm_seq_id f;
    assert_int_equal(llm_seq_fork(s, a, &f), LLM_OK); /* shares blocks here, not in the file */
    ss = save_session(s, &ss_size);
    t = make_session(g_model, LLM_KV_F32, 16, 3, 256); /* 2 + 2 blocks needed */
    uint32_t before = free_blocks(t);
    assert_int_equal(llm_session_state_load(t, ss, ss_size), LLM_ERR_LIMIT);
    assert_int_equal(n_open(t), 0);
    assert_int_equal(free_blocks(t), before);
    llm_session_free(t);
    free(ss);
    free(buf);
    llm_session_free(s);
}

static void test_arguments(void **state) {
    (void)state;
    llm_seq_id a, id = 5;
    llm_token p[PROMPT];
    llm_session *s = prompted(LLM_KV_F32, 16, 15, &a, p, NULL);
    size_t size = 0, n = 0;
    uint8_t *buf = save_seq(s, a, &size);
    char path[600];
    path_of(path, sizeof path, "args.state");

    assert_int_equal(llm_seq_state_save(NULL, a, buf, size, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_state_save(s, a, buf, size, NULL), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_state_load(NULL, buf, size, &id), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(id, -1);
    assert_int_equal(llm_seq_state_load(s, NULL, size, &id), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_state_load(s, buf, size, NULL), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_state_save_file(NULL, a, path), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_state_save_file(s, a, NULL), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_state_load_file(s, NULL, &id), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_seq_state_load_file(s, path, NULL), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_state_save(NULL, buf, size, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_state_save(s, buf, size, NULL), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_state_load(s, NULL, 10), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_state_load(NULL, buf, size), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_state_save_file(s, NULL), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_state_load_file(NULL, path), LLM_ERR_INVALID_ARGUMENT);
    assert_false(file_exists(path));

    /* Unknown and closed sequences. */
    assert_int_equal(llm_seq_state_save(s, 99, NULL, 0, &n), LLM_ERR_NOT_FOUND);
    assert_int_equal(llm_seq_state_save(s, -3, buf, size, &n), LLM_ERR_NOT_FOUND);
    assert_int_equal(llm_seq_state_save_file(s, 99, path), LLM_ERR_NOT_FOUND);
    assert_false(file_exists(path));

    /* Each kind only through its own function. */
    llm_session *t = make_session(g_model, LLM_KV_F32, 16, 64, 256);
    assert_int_equal(llm_session_state_load(t, buf, size), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(n_open(t), 0);
    size_t ss_size = 0;
    uint8_t *ss = save_session(s, &ss_size);
    expect_refused(t, ss, ss_size, LLM_ERR_INVALID_ARGUMENT);
    free(ss);

    /* Not a state at all. */
    static const char junk[] = "GGUF and more bytes than a header, but not a state at all, no";
    expect_refused(t, junk, sizeof junk, LLM_ERR_BAD_FORMAT);
    assert_non_null(strstr(llm_last_error(), "magic"));

    /* An empty sequence saves and loads. */
    llm_seq_id e, e2;
    assert_int_equal(llm_seq_open(s, &e), LLM_OK);
    size_t es = 0;
    uint8_t *eb = save_seq(s, e, &es);
    assert_int_equal(llm_seq_state_load(t, eb, es, &e2), LLM_OK);
    check_tokens(t, e2, NULL, 0);
    decode(t, e2, 0, p, 3);
    check_tokens(t, e2, p, 3);
    free(eb);
    llm_session_free(t);
    free(buf);
    llm_session_free(s);
}

/* ---- session states ---- */

typedef struct three {
    llm_seq_id id[3];
    llm_token toks[3][64];
    uint32_t n[3];
} three;

/* Sequences 0 (a prompt), 2 (a fork of 0 that went on) and 3 (another
 * prompt); 1 was closed, a gap the load must keep. */
static llm_session *three_seqs(llm_kv_type type, three *t) {
    llm_session *s = make_session(g_model, type, 16, 64, 256);
    llm_token p[64];
    prompt_tokens(p, 64, 21);
    printf("# session state: prompt seed 21\n");
    llm_seq_id ids[4];
    for (int i = 0; i < 2; i++)
        assert_int_equal(llm_seq_open(s, &ids[i]), LLM_OK);
    decode(s, ids[0], 0, p, 20);
    assert_int_equal(llm_seq_fork(s, ids[0], &ids[2]), LLM_OK);
    decode(s, ids[2], 20, p + 20, 5);
    assert_int_equal(llm_seq_open(s, &ids[3]), LLM_OK);
    decode(s, ids[3], 0, p + 40, 7);
    assert_int_equal(llm_seq_close(s, ids[1]), LLM_OK);
    t->id[0] = ids[0], t->id[1] = ids[2], t->id[2] = ids[3];
    assert_int_equal(t->id[0], 0);
    assert_int_equal(t->id[1], 2);
    assert_int_equal(t->id[2], 3);
    memcpy(t->toks[0], p, 20 * sizeof *p);
    t->n[0] = 20;
    memcpy(t->toks[1], p, 25 * sizeof *p);
    t->n[1] = 25;
    memcpy(t->toks[2], p + 40, 7 * sizeof *p);
    t->n[2] = 7;
    return s;
}

/* The loaded session holds the same sequences under the same ids, and each
 * continues with bitwise the same logits. */
static void check_three(llm_session *orig, llm_session *s, const three *t) {
    assert_int_equal(n_open(s), 3);
    uint32_t len;
    assert_int_equal(llm_seq_length(s, 1, &len), LLM_ERR_NOT_FOUND);
    for (int i = 0; i < 3; i++) {
        check_tokens(s, t->id[i], t->toks[i], t->n[i]);
        llm_token next = (llm_token)(100 + i);
        float *want = malloc(g_vocab * sizeof(float));
        memcpy(want, decode(orig, t->id[i], t->n[i], &next, 1), g_vocab * sizeof(float));
        const float *got = decode(s, t->id[i], t->n[i], &next, 1);
        assert_memory_equal(got, want, g_vocab * sizeof(float));
        free(want);
        assert_int_equal(llm_seq_truncate(orig, t->id[i], t->n[i]), LLM_OK);
        assert_int_equal(llm_seq_truncate(s, t->id[i], t->n[i]), LLM_OK);
    }
    check_invariants(s);
}

static void test_session_state(void **state) {
    (void)state;
    three t;
    llm_session *s = three_seqs(LLM_KV_F32, &t);
    size_t size = 0;
    uint8_t *buf = save_session(s, &size);

    llm_session *u = make_session(g_model, LLM_KV_F32, 8, 64, 256);
    assert_int_equal(llm_session_state_load(u, buf, size), LLM_OK);
    check_three(s, u, &t);
    /* A new sequence takes the gap. */
    llm_seq_id gap;
    assert_int_equal(llm_seq_open(u, &gap), LLM_OK);
    assert_int_equal(gap, 1);
    /* Refused while sequences are open; nothing changes. */
    uint32_t before = free_blocks(u);
    assert_int_equal(llm_session_state_load(u, buf, size), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "open"));
    assert_int_equal(n_open(u), 4);
    assert_int_equal(free_blocks(u), before);
    llm_session_free(u);

    /* Through a file. */
    char path[600], tmp[620];
    path_of(path, sizeof path, "session.state");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_equal(llm_session_state_save_file(s, path), LLM_OK);
    assert_false(file_exists(tmp));
    u = make_session(g_model, LLM_KV_F32, 32, 64, 256);
    assert_int_equal(llm_session_state_load_file(u, path), LLM_OK);
    check_three(s, u, &t);
    llm_session_free(u);

    /* Prefixes of a session state. */
    u = make_session(g_model, LLM_KV_F32, 16, 64, 256);
    for (size_t len = 0; len < size; len += 7) {
        assert_int_equal(llm_session_state_load(u, buf, len), LLM_ERR_BAD_FORMAT);
        assert_int_equal(n_open(u), 0);
    }
    /* An empty session state. */
    size_t es = 0;
    uint8_t *eb = save_session(u, &es);
    assert_int_equal(llm_session_state_load(u, eb, es), LLM_OK);
    assert_int_equal(n_open(u), 0);
    free(eb);
    check_invariants(u);
    llm_session_free(u);
    remove(path);
    free(buf);
    llm_session_free(s);
}

/* ---- files ---- */

static void test_files(void **state) {
    (void)state;
    llm_seq_id a, b;
    llm_token p[PROMPT];
    llm_session *s = prompted(LLM_KV_F16, 16, 31, &a, p, NULL);
    char path[600], tmp[620], bad[700];
    path_of(path, sizeof path, "seq.state");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    remove(path);

    assert_int_equal(llm_seq_state_save_file(s, a, path), LLM_OK);
    assert_true(file_exists(path));
    assert_false(file_exists(tmp));
    /* The file holds exactly what the buffer save gives. */
    size_t size = 0;
    uint8_t *buf = save_seq(s, a, &size);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t *fb = malloc(size + 1);
    assert_int_equal(fread(fb, 1, size + 1, f), size);
    fclose(f);
    assert_memory_equal(fb, buf, size);
    free(fb);

    llm_session *t = make_session(g_model, LLM_KV_F16, 8, 64, 256);
    assert_int_equal(llm_seq_state_load_file(t, path, &b), LLM_OK);
    check_tokens(t, b, p, PROMPT);

    /* Overwriting an existing file. */
    decode(s, a, PROMPT, p, 2);
    assert_int_equal(llm_seq_state_save_file(s, a, path), LLM_OK);
    assert_false(file_exists(tmp));
    llm_seq_id c;
    assert_int_equal(llm_seq_state_load_file(t, path, &c), LLM_OK);
    llm_token p2[PROMPT + 2];
    memcpy(p2, p, sizeof p);
    memcpy(p2 + PROMPT, p, 2 * sizeof *p);
    check_tokens(t, c, p2, PROMPT + 2);

    /* I/O errors. */
    uint32_t before = free_blocks(t);
    size_t open_before = n_open(t);
    llm_seq_id id = 7;
    path_of(bad, sizeof bad, "missing.state");
    assert_int_equal(llm_seq_state_load_file(t, bad, &id), LLM_ERR_IO);
    assert_int_equal(id, -1);
    assert_non_null(strstr(llm_last_error(), strerror(ENOENT)));
    assert_int_equal(llm_session_state_load_file(t, bad), LLM_ERR_IO);
    assert_int_equal(llm_seq_state_load_file(t, g_dir, &id), LLM_ERR_IO); /* a directory */
    /* A FIFO with no writer: refused at once, not a read that waits for
     * one (the alarm fails the test instead of hanging it). */
    char fifo[620];
    path_of(fifo, sizeof fifo, "a-fifo.state");
    remove(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    assert_int_equal(llm_seq_state_load_file(t, fifo, &id), LLM_ERR_IO);
    assert_non_null(strstr(llm_last_error(), fifo));
    assert_int_equal(llm_session_state_load_file(t, fifo), LLM_ERR_IO);
    alarm(0);
    remove(fifo);
    path_of(bad, sizeof bad, "no/such/dir/x.state");
    assert_int_equal(llm_seq_state_save_file(s, a, bad), LLM_ERR_IO);
    assert_non_null(strstr(llm_last_error(), strerror(ENOENT)));
    assert_int_equal(llm_session_state_save_file(s, bad), LLM_ERR_IO);
    /* PATH is a directory: the rename fails, PATH.tmp is removed. */
    char dir[620], dir_tmp[640];
    path_of(dir, sizeof dir, "a-directory");
    snprintf(dir_tmp, sizeof dir_tmp, "%s.tmp", dir);
    mkdir(dir, 0755);
    assert_int_equal(llm_seq_state_save_file(s, a, dir), LLM_ERR_IO);
    assert_false(file_exists(dir_tmp));
    rmdir(dir);

    /* Truncated and extended files. */
    char cut[620];
    path_of(cut, sizeof cut, "cut.state");
    /* Every length below 100, then every 97th, then the last ones. */
    for (size_t len = 0; len <= size + 1; len = len < 100 || len + 1 >= size ? len + 1
                                                : len + 97 < size            ? len + 97
                                                                             : size - 1) {
        f = fopen(cut, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, len < size ? len : size, f), len < size ? len : size);
        if (len > size)
            fputc(0, f);
        fclose(f);
        llm_status st = llm_seq_state_load_file(t, cut, &id);
        if (len == size) {
            assert_int_equal(st, LLM_OK);
            assert_int_equal(llm_seq_close(t, id), LLM_OK);
            continue;
        }
        if (st != LLM_ERR_BAD_FORMAT)
            fail_msg("file of %zu bytes: %s (%s)", len, llm_status_name(st), llm_last_error());
        assert_non_null(strstr(llm_last_error(), cut)); /* names the file */
        assert_int_equal(n_open(t), open_before);
        assert_int_equal(free_blocks(t), before);
    }
    remove(cut);
    remove(path);
    check_invariants(t);
    free(buf);
    llm_session_free(t);
    llm_session_free(s);
}

/* ---- allocation-failure sweeps ---- */

static void arm(uint64_t n) { llmi_alloc_fail_after(n); }

static bool fired(uint64_t n) { return alloc_disarm(n) == 0; }

static void expect_oom(llm_status st, const char *what, uint64_t n) {
    if (st != LLM_ERR_OUT_OF_MEMORY)
        fail_msg("%s, allocation %llu failing: %s (%s), want LLM_ERR_OUT_OF_MEMORY", what,
                 (unsigned long long)n, llm_status_name(st), llm_last_error());
}

static void read_file(const char *path, uint8_t **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc(*size + 1);
    assert_int_equal(fread(*data, 1, *size, f), *size);
    fclose(f);
}

enum { SAVE_BUF, SAVE_FILE, SAVE_SESSION_FILE };

static void sweep_save(int how) {
    static const char *const names[] = {"save", "save to file", "session save to file"};
    llm_seq_id a;
    llm_token p[PROMPT];
    llm_session *s = prompted(LLM_KV_F32, 16, 41, &a, p, NULL);
    size_t ref_size = 0, size = 0;
    uint8_t *ref = save_seq(s, a, &ref_size);
    uint8_t *buf = malloc(ref_size + 4096);
    size_t bound = 0;
    assert_int_equal(llm_seq_state_save(s, a, NULL, 0, &bound), LLM_ERR_BUFFER_TOO_SMALL);
    char path[600], tmp[620];
    path_of(path, sizeof path, "sweep.state");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    /* An older file at PATH: a failed save must leave it as it is. */
    FILE *f = fopen(path, "wb");
    fputs("old", f);
    fclose(f);
    uint64_t n;
    for (n = 1; n < 10000; n++) {
        free(buf);
        buf = malloc(bound);
        arm(n);
        llm_status st = how == SAVE_BUF    ? llm_seq_state_save(s, a, buf, bound, &size)
                        : how == SAVE_FILE ? llm_seq_state_save_file(s, a, path)
                                           : llm_session_state_save_file(s, path);
        bool hit = fired(n);
        assert_false(file_exists(tmp));
        if (st == LLM_OK) {
            assert_false(hit);
            break;
        }
        assert_true(hit);
        expect_oom(st, names[how], n);
        uint8_t *old;
        size_t old_size;
        read_file(path, &old, &old_size);
        assert_int_equal(old_size, 3);
        assert_memory_equal(old, "old", 3);
        free(old);
        check_tokens(s, a, p, PROMPT); /* the sequence is untouched */
    }
    if (how == SAVE_BUF) {
        assert_int_equal(size, ref_size);
        assert_memory_equal(buf, ref, size);
    } else if (how == SAVE_FILE) {
        uint8_t *got;
        size_t got_size;
        read_file(path, &got, &got_size);
        assert_int_equal(got_size, ref_size);
        assert_memory_equal(got, ref, ref_size);
        free(got);
    }
    printf("# %s: %llu allocation failure points, each clean\n", names[how],
           (unsigned long long)(n - 1));
    assert_true(n > 1);
    remove(path);
    check_invariants(s);
    free(buf);
    free(ref);
    llm_session_free(s);
}

static void test_oom_save(void **state) {
    (void)state;
    sweep_save(SAVE_BUF);
    sweep_save(SAVE_FILE);
    sweep_save(SAVE_SESSION_FILE);
}

enum { LOAD_BUF, LOAD_FILE, LOAD_SESSION, LOAD_CONVERT };

static void sweep_load(int how) {
    static const char *const names[] = {"load", "load from file", "session load",
                                        "load with KV conversion"};
    three t;
    llm_session *s = three_seqs(LLM_KV_F32, &t);
    size_t size = 0;
    uint8_t *buf = how == LOAD_SESSION ? save_session(s, &size) : save_seq(s, t.id[1], &size);
    char path[600];
    path_of(path, sizeof path, "sweep-load.state");
    if (how == LOAD_FILE)
        assert_int_equal(llm_seq_state_save_file(s, t.id[1], path), LLM_OK);
    llm_session *u =
        make_session(g_model, how == LOAD_CONVERT ? LLM_KV_BF16 : LLM_KV_F32, 8, 64, 256);
    uint32_t before = free_blocks(u);
    uint64_t n;
    llm_seq_id id = -1;
    llm_status st = LLM_OK;
    for (n = 1; n < 100000; n++) {
        id = 99;
        arm(n);
        if (how == LOAD_SESSION)
            st = llm_session_state_load(u, buf, size);
        else if (how == LOAD_FILE)
            st = llm_seq_state_load_file(u, path, &id);
        else
            st = llm_seq_state_load(u, buf, size, &id);
        bool hit = fired(n);
        if (st == LLM_OK) {
            assert_false(hit);
            break;
        }
        assert_true(hit);
        expect_oom(st, names[how], n);
        if (how != LOAD_SESSION)
            assert_int_equal(id, -1);
        assert_int_equal(n_open(u), 0);
        assert_int_equal(free_blocks(u), before);
        check_invariants(u);
    }
    printf("# %s: %llu allocation failure points, session usable after each\n", names[how],
           (unsigned long long)(n - 1));
    assert_true(n > 3);
    /* The successful load is complete and decodes. */
    if (how == LOAD_SESSION) {
        check_three(s, u, &t);
    } else {
        check_tokens(u, id, t.toks[1], t.n[1]);
        llm_token next = 5;
        decode(u, id, t.n[1], &next, 1);
    }
    check_invariants(u);
    remove(path);
    free(buf);
    llm_session_free(u);
    llm_session_free(s);
}

static void test_oom_load(void **state) {
    (void)state;
    sweep_load(LOAD_BUF);
    sweep_load(LOAD_FILE);
    sweep_load(LOAD_SESSION);
    sweep_load(LOAD_CONVERT);
}

/* ---- SmolLM2 ---- */

static void test_smollm2(void **state) {
    (void)state;
    /* A tiny model's state, which SmolLM2's sessions must refuse; made
     * first, since the test device may refuse a model, and a skip then
     * must leave nothing allocated. */
    llm_seq_id ta;
    llm_token tp[PROMPT];
    llm_session *tiny = prompted(LLM_KV_F32, 16, 51, &ta, tp, NULL);
    size_t ts = 0;
    uint8_t *tb = save_seq(tiny, ta, &ts);
    llm_session_free(tiny);
    const char *path = getenv("LLM_TEST_MODEL");
    llm_model *m = NULL;
    if (!path || llm_model_load(path, NULL, &m) != LLM_OK) {
        free(tb);
        printf("# LLM_TEST_MODEL unset or not loadable: skipped\n");
        skip();
    }
    static const char text[] = "The capital of France is";
    llm_token prompt[32], toks[3];
    size_t n = 0;
    assert_int_equal(
        llm_tokenize(m, text, sizeof text - 1, LLM_TOKENIZE_ADD_SPECIAL, prompt, 32, &n), LLM_OK);
    uint32_t V = m->hp.n_vocab;
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = 64;
    sp.kv_cache_bytes =
        8 * llmi_kv_block_bytes(m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim, 16);
    llm_session *s1 = NULL, *s2 = NULL;
    llm_status st = try_test_session(m, &sp, &s1);
    if (st == LLM_ERR_UNSUPPORTED) {
        free(tb);
        skip_refused_model(m);
    }
    assert_int_equal(st, LLM_OK);
    sp.kv_block_size = 8;
    assert_int_equal(create_test_session(m, &sp, &s2), LLM_OK);
    llm_seq_id a, b;
    assert_int_equal(llm_seq_open(s1, &a), LLM_OK);
    llm_batch *bt = NULL;
    assert_int_equal(llm_batch_create(32, &bt), LLM_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(llm_batch_add(bt, a, (uint32_t)i, prompt[i], i == n - 1), LLM_OK);
    assert_int_equal(llm_session_decode(s1, bt), LLM_OK);
    const float *lg;
    assert_int_equal(llm_session_logits(s1, (uint32_t)n - 1, &lg), LLM_OK);
    size_t size = 0;
    size_t bound = 0;
    assert_int_equal(llm_seq_state_save(s1, a, NULL, 0, &bound), LLM_ERR_BUFFER_TOO_SMALL);
    uint8_t *buf = malloc(bound);
    assert_int_equal(llm_seq_state_save(s1, a, buf, bound, &size), LLM_OK);
    printf("# SmolLM2: %zu-token state is %zu bytes (bound %zu)\n", n, size, bound);
    float *ref = malloc(3 * (size_t)V * sizeof(float));
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t best = 0;
        for (uint32_t v = 1; v < V; v++)
            if (lg[v] > lg[best])
                best = v;
        toks[i] = (llm_token)best;
        llm_batch_clear(bt);
        assert_int_equal(llm_batch_add(bt, a, (uint32_t)n + i, toks[i], true), LLM_OK);
        assert_int_equal(llm_session_decode(s1, bt), LLM_OK);
        assert_int_equal(llm_session_logits(s1, 0, &lg), LLM_OK);
        memcpy(ref + (size_t)i * V, lg, V * sizeof(float));
    }
    assert_int_equal(llm_seq_state_load(s2, buf, size, &b), LLM_OK);
    for (uint32_t i = 0; i < 3; i++) {
        llm_batch_clear(bt);
        assert_int_equal(llm_batch_add(bt, b, (uint32_t)n + i, toks[i], true), LLM_OK);
        assert_int_equal(llm_session_decode(s2, bt), LLM_OK);
        assert_int_equal(llm_session_logits(s2, 0, &lg), LLM_OK);
        assert_memory_equal(lg, ref + (size_t)i * V, V * sizeof(float));
    }
    /* The tiny model's state is refused, naming both models. */
    llm_seq_id id;
    assert_int_equal(llm_seq_state_load(s2, tb, ts, &id), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), g_model->name));
    assert_non_null(strstr(llm_last_error(), m->name));
    free(tb);
    free(ref);
    free(buf);
    llm_batch_free(bt);
    llm_session_free(s1);
    llm_session_free(s2);
    llm_model_free(m);
}

/* ---- setup ---- */

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "%s/state-test-%d",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp", (int)getpid());
    if (mkdir(g_dir, 0755) != 0 && errno != EEXIST)
        return -1;
    g_model = tiny_model(256, 1);
    g_other = tiny_model(256, 2); /* same shape and name, other weights */
    g_vocab = g_model->hp.n_vocab;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_model);
    llmi_model_free(g_other);
    rmdir(g_dir);
    return 0;
}

int main(void) {
    struct CMUnitTest tests[] = {
        device_test(test_round_trip_f32),
        device_test(test_round_trip_f16_bf16),
        device_test(test_round_trip_converted),
        device_test(test_seq_tokens),
        device_test(test_prefixes),
        device_test(test_corruption),
        device_test(test_other_model_and_version),
        device_test(test_limits),
        device_test(test_arguments),
        device_test(test_session_state),
        device_test(test_files),
        device_test(test_oom_save),
        device_test(test_oom_load),
        device_test(test_smollm2),
    };
    return run_device_tests(tests, setup, teardown);
}
