/* The byte layout of a state (state.h): little-endian fields, CRCs, zlib's
 * allocator and the header, written, parsed and checked against a session.
 * Saving (save.c) and loading (load.c) build on these. */
#include "state/format.h"

#include <string.h>

uint32_t llmi_state_crc_update(uint32_t crc, const void *data, size_t n) {
    const Bytef *p = data;
    while (n > 0) {
        uInt k = n > LLMI_STATE_ZMAX ? LLMI_STATE_ZMAX : (uInt)n;
        crc = (uint32_t)crc32(crc, p, k);
        p += k;
        n -= k;
    }
    return crc;
}

/* zlib allocates through llmi_calloc, so allocation-failure sweeps reach it
 * too. */
static voidpf z_alloc(voidpf opaque, uInt items, uInt size) {
    (void)opaque;
    return llmi_calloc(items, size);
}
static void z_free(voidpf opaque, voidpf p) {
    (void)opaque;
    llmi_free(p);
}

void llmi_state_zlib_hooks(z_stream *z) {
    z->zalloc = z_alloc;
    z->zfree = z_free;
}

llm_status llmi_state_io_error(const char *what, const char *path, int err) {
    return llmi_error(LLM_ERR_IO, "%s '%s': %s", what, path, strerror(err));
}

/* ---- header ---- */

static const char *kind_name(uint32_t kind) {
    return kind == LLMI_STATE_KIND_SEQUENCE ? "one sequence" : "a session";
}

/* Bytes of one token in the payload: its id, then K and V of every layer. */
static uint64_t token_bytes(uint32_t n_layer, uint64_t row_bytes) {
    return 4 + 2 * (uint64_t)n_layer * row_bytes;
}

bool llmi_state_raw_length(const llmi_state_header *h, uint64_t *out) {
    uint64_t per = token_bytes(h->n_layer, llmi_kv_row_bytes((llm_kv_type)h->kv_type, h->kv_dim));
    uint64_t fixed = (uint64_t)llmi_state_record_head(h->version) * h->n_records;
    if (h->n_tokens > (UINT64_MAX - fixed) / per)
        return false;
    *out = fixed + h->n_tokens * per;
    return true;
}

size_t llmi_state_header_write(const llmi_state_header *h, const char *name, uint8_t *p) {
    memcpy(p, LLMI_STATE_MAGIC, 8);
    llmi_state_put_u32(p + 8, h->version);
    llmi_state_put_u32(p + 12, h->header_len);
    llmi_state_put_u32(p + 16, h->kind);
    llmi_state_put_u32(p + 20, h->name_len);
    memcpy(p + 24, name, h->name_len);
    uint8_t *q = p + 24 + h->name_len;
    llmi_state_put_u64(q, h->fingerprint);
    llmi_state_put_u32(q + 8, h->n_layer);
    llmi_state_put_u32(q + 12, h->kv_dim);
    llmi_state_put_u32(q + 16, h->n_vocab);
    llmi_state_put_u32(q + 20, h->kv_type);
    llmi_state_put_u32(q + 24, h->n_records);
    llmi_state_put_u64(q + 28, h->n_tokens);
    llmi_state_put_u64(q + 36, h->raw_len);
    llmi_state_put_u64(q + 44, h->comp_len);
    llmi_state_put_u32(q + 52, h->crc);
    if (h->version >= 2)
        llmi_state_put_u32(q + 56, h->comp_crc);
    llmi_state_put_u32(p + h->header_len - 4, llmi_state_crc_update(0, p, h->header_len - 4));
    return h->header_len;
}

llm_status llmi_state_header_start(const uint8_t *p, size_t avail, uint32_t *header_len) {
    if (avail >= 8 && memcmp(p, LLMI_STATE_MAGIC, 8) != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "not a libllminfer state (magic is not LLMSTATE)");
    if (avail < 16)
        return llmi_error(LLM_ERR_BAD_FORMAT, "truncated: %zu bytes, a state header is at least %d",
                          avail, LLMI_STATE_HEADER_FIXED_V1);
    *header_len = llmi_state_get_u32(p + 12);
    if (*header_len < LLMI_STATE_HEADER_FIXED_V1 || *header_len > LLMI_STATE_MAX_HEADER)
        return llmi_error(LLM_ERR_BAD_FORMAT, "header length %u is out of range (%d..%d)",
                          *header_len, LLMI_STATE_HEADER_FIXED_V1, LLMI_STATE_MAX_HEADER);
    return LLM_OK;
}

llm_status llmi_state_header_read(const uint8_t *p, size_t avail, llmi_state_header *h) {
    memset(h, 0, sizeof *h);
    LLMI_TRY(llmi_state_header_start(p, avail, &h->header_len));
    uint32_t hl = h->header_len;
    if (hl > avail)
        return llmi_error(LLM_ERR_BAD_FORMAT, "truncated: the header is %u bytes, %zu present", hl,
                          avail);
    uint32_t stored = llmi_state_get_u32(p + hl - 4),
             computed = llmi_state_crc_update(0, p, hl - 4);
    if (stored != computed)
        return llmi_error(LLM_ERR_BAD_FORMAT, "header CRC mismatch (stored %08x, computed %08x)",
                          stored, computed);
    h->version = llmi_state_get_u32(p + 8);
    if (h->version == 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "state format version 0 does not exist");
    if (h->version > LLMI_STATE_VERSION)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "state format version %u is newer than this library's (%u)", h->version,
                          LLMI_STATE_VERSION);
    h->kind = llmi_state_get_u32(p + 16);
    h->name_len = llmi_state_get_u32(p + 20);
    if (h->name_len > LLMI_STATE_MAX_NAME ||
        hl != llmi_state_header_fixed(h->version) + h->name_len)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "header length %u does not fit a model name of %u bytes", hl,
                          h->name_len);
    size_t nc = h->name_len < sizeof h->name - 1 ? h->name_len : sizeof h->name - 1;
    for (size_t i = 0; i < nc; i++) {
        char c = (char)p[24 + i];
        h->name[i] = c >= 0x20 && c < 0x7f ? c : '?';
    }
    const uint8_t *q = p + 24 + h->name_len;
    h->fingerprint = llmi_state_get_u64(q);
    h->n_layer = llmi_state_get_u32(q + 8);
    h->kv_dim = llmi_state_get_u32(q + 12);
    h->n_vocab = llmi_state_get_u32(q + 16);
    h->kv_type = llmi_state_get_u32(q + 20);
    h->n_records = llmi_state_get_u32(q + 24);
    h->n_tokens = llmi_state_get_u64(q + 28);
    h->raw_len = llmi_state_get_u64(q + 36);
    h->comp_len = llmi_state_get_u64(q + 44);
    h->crc = llmi_state_get_u32(q + 52);
    if (h->version >= 2)
        h->comp_crc = llmi_state_get_u32(q + 56);
    if (h->kind != LLMI_STATE_KIND_SEQUENCE && h->kind != LLMI_STATE_KIND_SESSION)
        return llmi_error(LLM_ERR_BAD_FORMAT, "unknown state kind %u", h->kind);
    llmi_ttype kv_ttype;
    if (h->kv_type > LLM_KV_FP8_E4M3 || !llmi_kv_ttype((llm_kv_type)h->kv_type, &kv_ttype))
        return llmi_error(LLM_ERR_BAD_FORMAT, "unknown KV element type %u", h->kv_type);
    if (llmi_kv_row_bytes((llm_kv_type)h->kv_type, h->kv_dim) == 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "KV rows of %u elements are no whole %s blocks",
                          h->kv_dim, llmi_ttype_get(kv_ttype)->name);
    return LLM_OK;
}

llm_status llmi_state_header_check(llm_session *s, const llmi_state_header *h, uint32_t want_kind,
                                   uint64_t payload) {
    const llm_model *m = s->model;
    const llmi_hparams *hp = &m->hp;
    if (h->comp_len != payload)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: the header says %llu payload bytes, %llu %s",
                          payload < h->comp_len ? "truncated" : "trailing bytes",
                          (unsigned long long)h->comp_len, (unsigned long long)payload,
                          "follow it");
    if (h->fingerprint != m->fingerprint)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "the state belongs to model '%s' (fingerprint %016llx), this session "
                          "runs model '%s' (fingerprint %016llx)",
                          h->name, (unsigned long long)h->fingerprint, m->name,
                          (unsigned long long)m->fingerprint);
    if (h->n_layer != hp->n_layer || h->kv_dim != hp->n_head_kv * hp->head_dim ||
        h->n_vocab != hp->n_vocab)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "header shape (%u layers, kv_dim %u, %u tokens) contradicts its model "
                          "fingerprint",
                          h->n_layer, h->kv_dim, h->n_vocab);
    if (h->kind != want_kind)
        return llmi_error(
            LLM_ERR_INVALID_ARGUMENT, "the state holds %s; load it with %s", kind_name(h->kind),
            h->kind == LLMI_STATE_KIND_SEQUENCE ? "llm_seq_state_load" : "llm_session_state_load");
    if (h->kind == LLMI_STATE_KIND_SEQUENCE && h->n_records != 1)
        return llmi_error(LLM_ERR_BAD_FORMAT, "a sequence state with %u records", h->n_records);
    uint64_t raw;
    if (!llmi_state_raw_length(h, &raw) || raw != h->raw_len)
        return llmi_error(
            LLM_ERR_BAD_FORMAT, "payload length %llu does not match %u records of %llu tokens",
            (unsigned long long)h->raw_len, h->n_records, (unsigned long long)h->n_tokens);
    if (h->n_records > LLMI_STATE_MAX_RECORDS)
        return llmi_error(LLM_ERR_LIMIT, "the state has %u sequences, more than %u", h->n_records,
                          LLMI_STATE_MAX_RECORDS);
    uint32_t n_ctx = s->params.n_ctx, bs = s->params.kv_block_size;
    if (h->n_tokens > (uint64_t)h->n_records * n_ctx)
        return llmi_error(LLM_ERR_LIMIT,
                          "the state holds %llu tokens in %u sequences, more than "
                          "the context of %u allows",
                          (unsigned long long)h->n_tokens, h->n_records, n_ctx);
    /* Exact for one sequence; a lower bound for several (each rounds up to
     * whole blocks: the reservation per sequence catches the rest). */
    uint64_t blocks = (h->n_tokens + bs - 1) / bs;
    pthread_mutex_lock(&s->sched.lock);
    uint32_t avail = llmi_kv_available(s->kv);
    pthread_mutex_unlock(&s->sched.lock);
    if (blocks > avail)
        return llmi_error(LLM_ERR_LIMIT,
                          "the state needs %llu KV blocks of %u tokens, %u are available",
                          (unsigned long long)blocks, bs, avail);
    if (h->kind == LLMI_STATE_KIND_SESSION)
        for (size_t i = 0; i < s->n_seqs; i++)
            if (s->seqs[i])
                return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                                  "loading a session state needs a session without open "
                                  "sequences; sequence %zu is open",
                                  i);
    return LLM_OK;
}
