/* libFuzzer target: loading session state (lib/state) from arbitrary bytes.
 *
 * Each input is loaded into three sessions of a tiny model (F32 KV with
 * 16-token blocks, F16 KV with 8-token blocks and FP8 KV with 4-token
 * blocks: the converting paths),
 * first as it is, then "fixed up": the bytes after the header are taken as
 * a raw payload, compressed, and the header's model fields, token count,
 * lengths and CRCs rewritten to match, so that mutations get past the CRCs
 * into the record parser. Both as a sequence state and as a session state.
 *
 * What must hold after every load:
 *  - a refusal is BAD_FORMAT, UNSUPPORTED, INVALID_ARGUMENT or LIMIT (never
 *    OUT_OF_MEMORY: every allocation is bounded by the checked header) with
 *    a message, opens no sequence and keeps no KV block; the KV invariants
 *    hold;
 *  - an accepted state opened sequences of at most n_ctx tokens, all in the
 *    vocabulary; saving one again and loading that gives the same tokens
 *    and the same adapter to wait for, and a decode step on it works, or,
 *    for a record saved under a LoRA adapter (version 3), is refused with
 *    INVALID_ARGUMENT telling to call llm_seq_set_adapter.
 * Seeds (tests/fuzz/corpus/state) are states and raw payloads of this model
 * written by make_corpus.c. */
#include "fuzz_state.h"
#include "session/session.h"
#include "state/state.h"

#include "fuzz_util.h"

#include <math.h>
#include <zlib.h>

static llm_model *g_model;
enum { N_SESS = 3 };
static llm_session *g_sess[N_SESS];
static const llm_kv_type g_kv_types[N_SESS] = {LLM_KV_F32, LLM_KV_F16, LLM_KV_FP8_E4M3};
static const uint32_t g_block_sizes[N_SESS] = {16, 8, 4};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g_model = fuzz_state_model();
    FUZZ_CHECK(g_model, "tiny model: %s", llm_last_error());
    for (int i = 0; i < N_SESS; i++) {
        llm_session_params p;
        llm_session_params_init(&p);
        p.n_threads = 1;
        p.n_ctx = 48;
        p.max_batch_tokens = 16;
        p.kv_block_size = g_block_sizes[i];
        p.kv_type = g_kv_types[i];
        p.kv_cache_bytes =
            12 * llmi_kv_block_bytes_type(g_model->hp.n_layer,
                                          g_model->hp.n_head_kv * g_model->hp.head_dim,
                                          p.kv_block_size, p.kv_type);
        FUZZ_CHECK(llm_session_create(g_model, &p, &g_sess[i]) == LLM_OK, "session: %s",
                   llm_last_error());
    }
    return 0;
}

static size_t n_open(const llm_session *s) {
    size_t n = 0;
    for (size_t i = 0; i < s->n_seqs; i++)
        n += s->seqs[i] != NULL;
    return n;
}

static void check_refusal(llm_session *s, llm_status st, uint32_t free_before) {
    FUZZ_CHECK(st == LLM_ERR_BAD_FORMAT || st == LLM_ERR_UNSUPPORTED ||
                   st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_LIMIT,
               "status %s: %s", llm_status_name(st), llm_last_error());
    FUZZ_CHECK(llm_last_error()[0] != '\0', "refusal without a message");
    FUZZ_CHECK(n_open(s) == 0, "a refused load left %zu sequences open", n_open(s));
    FUZZ_CHECK(s->kv->n_free == free_before, "a refused load kept %u blocks",
               free_before - s->kv->n_free);
}

/* An accepted sequence: sane, re-savable with the same tokens, decodable. */
static void use_seq(llm_session *s, llm_seq_id id) {
    uint32_t n = 0;
    FUZZ_CHECK(llm_seq_length(s, id, &n) == LLM_OK, "length");
    FUZZ_CHECK(n <= s->params.n_ctx, "%u tokens, n_ctx %u", n, s->params.n_ctx);
    llm_token toks[64], again[64];
    size_t k = 0;
    FUZZ_CHECK(llm_seq_tokens(s, id, toks, 64, &k) == LLM_OK && k == n, "tokens");
    for (size_t i = 0; i < k; i++)
        FUZZ_CHECK(toks[i] >= 0 && (uint32_t)toks[i] < g_model->hp.n_vocab, "token %d", toks[i]);
    size_t bound = 0, size = 0;
    FUZZ_CHECK(llm_seq_state_save(s, id, NULL, 0, &bound) == LLM_ERR_BUFFER_TOO_SMALL, "bound");
    uint8_t *buf = malloc(bound);
    FUZZ_CHECK(llm_seq_state_save(s, id, buf, bound, &size) == LLM_OK, "re-save: %s",
               llm_last_error());
    llm_seq_id id2 = -1;
    llm_status st = llm_seq_state_load(s, buf, size, &id2);
    if (st == LLM_OK) {
        FUZZ_CHECK(llm_seq_tokens(s, id2, again, 64, &k) == LLM_OK && k == n &&
                       memcmp(toks, again, n * sizeof *toks) == 0,
                   "re-loaded tokens differ");
        const llmi_tseq *t1 = llmi_seq_find(s, id), *t2 = llmi_seq_find(s, id2);
        FUZZ_CHECK(t1->wait_fingerprint == t2->wait_fingerprint &&
                       memcmp(&t1->wait_scale, &t2->wait_scale, sizeof(float)) == 0,
                   "a re-save lost the adapter its sequence waits for");
        llm_seq_close(s, id2);
    } else {
        FUZZ_CHECK(st == LLM_ERR_LIMIT, "re-load: %s", llm_last_error()); /* KV full */
    }
    free(buf);
    /* A record saved under a LoRA adapter: the sequence waits for it, and
     * a decode says which adapter to set. */
    const llmi_tseq *t = llmi_seq_find(s, id);
    bool waiting = t->wait_fingerprint != 0;
    FUZZ_CHECK(waiting || t->wait_scale == 0.0f, "a scale without an adapter");
    FUZZ_CHECK(!waiting || isfinite(t->wait_scale), "scale %g", (double)t->wait_scale);
    if (n < s->params.n_ctx) {
        llm_batch *b = NULL;
        FUZZ_CHECK(llm_batch_create(1, &b) == LLM_OK, "batch");
        llm_batch_add(b, id, n, 1, true);
        st = llm_session_decode(s, b);
        if (waiting)
            FUZZ_CHECK(st == LLM_ERR_INVALID_ARGUMENT &&
                           strstr(llm_last_error(), "llm_seq_set_adapter"),
                       "decode of a sequence waiting for its adapter: %s", llm_last_error());
        else
            FUZZ_CHECK(st == LLM_OK || st == LLM_ERR_LIMIT, "decode: %s", llm_last_error());
        llm_batch_free(b);
    }
}

static void load_into(llm_session *s, const uint8_t *data, size_t size) {
    uint32_t free_before = s->kv->n_free;
    llm_seq_id id = 7;
    llm_status st = llm_seq_state_load(s, data, size, &id);
    if (st == LLM_OK) {
        use_seq(s, id);
        llm_seq_close(s, id);
    } else {
        FUZZ_CHECK(id == -1, "*out is %d after a refusal", id);
        check_refusal(s, st, free_before);
    }
    st = llm_session_state_load(s, data, size);
    if (st == LLM_OK) {
        for (size_t i = 0; i < s->n_seqs; i++)
            if (s->seqs[i])
                use_seq(s, (llm_seq_id)i);
        for (size_t i = 0; i < s->n_seqs; i++)
            if (s->seqs[i])
                llm_seq_close(s, (llm_seq_id)i);
    } else {
        check_refusal(s, st, free_before);
    }
    FUZZ_CHECK(s->kv->n_free == free_before, "blocks not returned");
    FUZZ_CHECK(llmi_session_check(s) == LLM_OK, "invariants: %s", llm_last_error());
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Header + raw payload -> a state with this model's identity and every
 * length and CRC right (offsets from the header's end, as state.h lays
 * them out; version 1 has no compressed CRC before the header CRC). NULL
 * when the input has no header to fix. */
static uint8_t *fix_up(const uint8_t *data, size_t size, size_t *out_size) {
    if (size < LLMI_STATE_HEADER_FIXED_V1 || memcmp(data, LLMI_STATE_MAGIC, 8) != 0)
        return NULL;
    uint32_t hl = get32(data + 12);
    if (hl < LLMI_STATE_HEADER_FIXED_V1 || hl > size)
        return NULL;
    const uint8_t *raw = data + hl;
    size_t raw_len = size - hl;
    uLong cap = compressBound(raw_len);
    uint8_t *out = malloc(hl + cap);
    memcpy(out, data, hl);
    uLongf comp = cap;
    FUZZ_CHECK(compress2(out + hl, &comp, raw, raw_len, 1) == Z_OK, "compress2");
    /* e: where version 1's header CRC would start, 4 bytes + the
     * compressed CRC before the end in version 2. */
    bool v1 = get32(data + 8) == 1;
    uint8_t *e = out + hl - (v1 ? 0 : 4);
    if (!v1)
        put32(e - 4, (uint32_t)crc32(0, out + hl, (uInt)comp));
    const llmi_hparams *hp = &g_model->hp;
    put64(e - 60, g_model->fingerprint);
    put32(e - 52, hp->n_layer);
    put32(e - 48, hp->n_head_kv * hp->head_dim);
    put32(e - 44, hp->n_vocab);
    uint32_t type = get32(e - 40), records = get32(e - 36);
    size_t row = llmi_kv_row_bytes((llm_kv_type)type, (uint64_t)hp->n_head_kv * hp->head_dim);
    uint64_t per = 4 + 2ull * hp->n_layer * (row ? row : 4ull * hp->n_head_kv * hp->head_dim);
    uint64_t heads =
        (uint64_t)(get32(data + 8) >= 3 ? LLMI_STATE_RECORD_HEAD : LLMI_STATE_RECORD_HEAD_V2) *
        records;
    if (raw_len >= heads && (raw_len - heads) % per == 0)
        put64(e - 32, (raw_len - heads) / per);
    put64(e - 24, raw_len);
    put64(e - 16, comp);
    put32(e - 8, (uint32_t)crc32(0, raw, (uInt)raw_len));
    put32(out + hl - 4, (uint32_t)crc32(0, out, hl - 4));
    *out_size = hl + comp;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int i = 0; i < N_SESS; i++)
        load_into(g_sess[i], data, size);
    size_t fixed_size = 0;
    uint8_t *fixed = fix_up(data, size, &fixed_size);
    if (fixed) {
        for (int i = 0; i < N_SESS; i++)
            load_into(g_sess[i], fixed, fixed_size);
        free(fixed);
    }
    return 0;
}
