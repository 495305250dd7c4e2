/* Session state: token-level sequences to bytes and files and back (format
 * in state.h). Saving streams the K/V rows straight out of the KV blocks
 * into deflate; loading inflates straight into KV blocks reserved for
 * sequences that stay private until the whole payload checked out, so
 * neither direction holds a copy of the raw payload. zlib allocates through
 * llmi_calloc, so allocation-failure sweeps reach it too. */
#include "state/state.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* K/V rows and tokens are copied in host order. The library already needs
 * a little-endian host (GGUF weights are used in place). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "lib/state assumes a little-endian host"
#endif

enum {
    CHUNK = 1 << 18,   /* file I/O and compressed-input chunk */
    ZMAX = 1 << 30,    /* largest avail_in / avail_out handed to zlib (uInt) */
    SCRATCH = 1 << 16, /* rows converted between KV types per round */
};

/* ---- little-endian fields ---- */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

/* CRC-32 of any length (zlib's crc32 takes uInt lengths). */
static uint32_t crc_update(uint32_t crc, const void *data, size_t n) {
    const Bytef *p = data;
    while (n > 0) {
        uInt k = n > ZMAX ? ZMAX : (uInt)n;
        crc = (uint32_t)crc32(crc, p, k);
        p += k;
        n -= k;
    }
    return crc;
}

static voidpf z_alloc(voidpf opaque, uInt items, uInt size) {
    (void)opaque;
    return llmi_calloc(items, size);
}
static void z_free(voidpf opaque, voidpf p) {
    (void)opaque;
    llmi_free(p);
}

/* ---- header ---- */

typedef struct hdr {
    uint32_t version, header_len, kind, name_len;
    char name[128]; /* printable copy for messages, possibly cut */
    uint64_t fingerprint;
    uint32_t n_layer, kv_dim, n_vocab, kv_type, n_records;
    uint64_t n_tokens, raw_len, comp_len;
    uint32_t crc;
} hdr;

static const char *kind_name(uint32_t kind) {
    return kind == LLMI_STATE_KIND_SEQUENCE ? "one sequence" : "a session";
}

/* Bytes of one token in the payload: its id, then K and V of every layer. */
static uint64_t token_bytes(uint32_t n_layer, uint32_t kv_dim, uint32_t elem_size) {
    return 4 + 2 * (uint64_t)n_layer * kv_dim * elem_size;
}

/* The raw length R records of T tokens take; false on overflow. */
static bool raw_length(const hdr *h, uint64_t *out) {
    uint64_t per = token_bytes(h->n_layer, h->kv_dim, llmi_kv_type_size(h->kv_type));
    uint64_t fixed = 8 * (uint64_t)h->n_records;
    if (h->n_tokens > (UINT64_MAX - fixed) / per)
        return false;
    *out = fixed + h->n_tokens * per;
    return true;
}

/* Serialises h (its comp_len and crc as they are) with header CRC; returns
 * the length, h->header_len. */
static size_t header_write(const hdr *h, const char *name, uint8_t *p) {
    memcpy(p, LLMI_STATE_MAGIC, 8);
    put_u32(p + 8, h->version);
    put_u32(p + 12, h->header_len);
    put_u32(p + 16, h->kind);
    put_u32(p + 20, h->name_len);
    memcpy(p + 24, name, h->name_len);
    uint8_t *q = p + 24 + h->name_len;
    put_u64(q, h->fingerprint);
    put_u32(q + 8, h->n_layer);
    put_u32(q + 12, h->kv_dim);
    put_u32(q + 16, h->n_vocab);
    put_u32(q + 20, h->kv_type);
    put_u32(q + 24, h->n_records);
    put_u64(q + 28, h->n_tokens);
    put_u64(q + 36, h->raw_len);
    put_u64(q + 44, h->comp_len);
    put_u32(q + 52, h->crc);
    put_u32(q + 56, crc_update(0, p, h->header_len - 4));
    return h->header_len;
}

/* Reads the first 16 bytes: magic and header length. */
static llm_status header_start(const uint8_t *p, size_t avail, uint32_t *header_len) {
    if (avail >= 8 && memcmp(p, LLMI_STATE_MAGIC, 8) != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "not a libllminfer state (magic is not LLMSTATE)");
    if (avail < 16)
        return llmi_error(LLM_ERR_BAD_FORMAT, "truncated: %zu bytes, a state header is at least %d",
                          avail, LLMI_STATE_HEADER_FIXED);
    *header_len = get_u32(p + 12);
    if (*header_len < LLMI_STATE_HEADER_FIXED || *header_len > LLMI_STATE_MAX_HEADER)
        return llmi_error(LLM_ERR_BAD_FORMAT, "header length %u is out of range (%d..%d)",
                          *header_len, LLMI_STATE_HEADER_FIXED, LLMI_STATE_MAX_HEADER);
    return LLM_OK;
}

/* Parses and checks the header bytes by themselves: CRC, version, layout. */
static llm_status header_read(const uint8_t *p, size_t avail, hdr *h) {
    memset(h, 0, sizeof *h);
    LLMI_TRY(header_start(p, avail, &h->header_len));
    uint32_t hl = h->header_len;
    if (hl > avail)
        return llmi_error(LLM_ERR_BAD_FORMAT, "truncated: the header is %u bytes, %zu present", hl,
                          avail);
    uint32_t stored = get_u32(p + hl - 4), computed = crc_update(0, p, hl - 4);
    if (stored != computed)
        return llmi_error(LLM_ERR_BAD_FORMAT, "header CRC mismatch (stored %08x, computed %08x)",
                          stored, computed);
    h->version = get_u32(p + 8);
    if (h->version == 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "state format version 0 does not exist");
    if (h->version > LLMI_STATE_VERSION)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "state format version %u is newer than this library's (%u)", h->version,
                          LLMI_STATE_VERSION);
    h->kind = get_u32(p + 16);
    h->name_len = get_u32(p + 20);
    if (h->name_len > LLMI_STATE_MAX_NAME || hl != LLMI_STATE_HEADER_FIXED + h->name_len)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "header length %u does not fit a model name of %u bytes", hl,
                          h->name_len);
    size_t nc = h->name_len < sizeof h->name - 1 ? h->name_len : sizeof h->name - 1;
    for (size_t i = 0; i < nc; i++) {
        char c = (char)p[24 + i];
        h->name[i] = c >= 0x20 && c < 0x7f ? c : '?';
    }
    const uint8_t *q = p + 24 + h->name_len;
    h->fingerprint = get_u64(q);
    h->n_layer = get_u32(q + 8);
    h->kv_dim = get_u32(q + 12);
    h->n_vocab = get_u32(q + 16);
    h->kv_type = get_u32(q + 20);
    h->n_records = get_u32(q + 24);
    h->n_tokens = get_u64(q + 28);
    h->raw_len = get_u64(q + 36);
    h->comp_len = get_u64(q + 44);
    h->crc = get_u32(q + 52);
    if (h->kind != LLMI_STATE_KIND_SEQUENCE && h->kind != LLMI_STATE_KIND_SESSION)
        return llmi_error(LLM_ERR_BAD_FORMAT, "unknown state kind %u", h->kind);
    if (h->kv_type > LLM_KV_BF16)
        return llmi_error(LLM_ERR_BAD_FORMAT, "unknown KV element type %u", h->kv_type);
    return LLM_OK;
}

/* Checks a header against the session, before any payload byte is read.
 * `payload` is the number of bytes after the header. */
static llm_status header_check(llm_session *s, const hdr *h, uint32_t want_kind, uint64_t payload) {
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
    if (!raw_length(h, &raw) || raw != h->raw_len)
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

/* ---- saving: raw bytes -> deflate -> caller buffer or file ---- */

typedef struct sink {
    z_stream z;
    bool z_ready;
    uint32_t crc; /* of the raw bytes so far */
    uint64_t raw; /* raw bytes so far */
    /* buffer: deflate writes into out[0, cap) directly */
    uint8_t *out;
    uint64_t cap, used; /* used: bytes of out handed to zlib so far */
    /* file: deflate writes into chunk, flushed to fd at offset off */
    int fd;
    const char *path;
    uint8_t *chunk;
    uint64_t off;
} sink;

static llm_status io_error(const char *what, const char *path, int err) {
    return llmi_error(LLM_ERR_IO, "%s '%s': %s", what, path, strerror(err));
}

static llm_status write_all(int fd, const char *path, const uint8_t *p, size_t n, uint64_t off) {
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return io_error("cannot write", path, errno);
        if (w == 0)
            return io_error("cannot write", path, EIO);
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return LLM_OK;
}

/* Gives deflate more output room: the file chunk after writing it out, or
 * the next part of the caller's buffer. */
static llm_status sink_room(sink *k) {
    if (k->fd >= 0) {
        size_t n = CHUNK - k->z.avail_out;
        LLMI_TRY(write_all(k->fd, k->path, k->chunk, n, k->off));
        k->off += n;
        k->z.next_out = k->chunk;
        k->z.avail_out = CHUNK;
        return LLM_OK;
    }
    if (k->used == k->cap) /* the bound given to the caller did not hold */
        return llmi_error(LLM_ERR_INTERNAL, "compressed state exceeds its size bound");
    uint64_t n = k->cap - k->used > ZMAX ? ZMAX : k->cap - k->used;
    k->z.next_out = k->out + k->used;
    k->z.avail_out = (uInt)n;
    k->used += n;
    return LLM_OK;
}

static llm_status sink_init(sink *k) {
    k->z.zalloc = z_alloc;
    k->z.zfree = z_free;
    int zr = deflateInit(&k->z, 1);
    if (zr == Z_MEM_ERROR)
        return llmi_oom("deflate state");
    if (zr != Z_OK)
        return llmi_error(LLM_ERR_INTERNAL, "deflateInit failed (%d)", zr);
    k->z_ready = true;
    if (k->fd < 0)
        return sink_room(k);
    k->z.next_out = k->chunk;
    k->z.avail_out = CHUNK;
    return LLM_OK;
}

/* Compresses n raw bytes; flush = Z_FINISH (with n == 0) ends the stream. */
static llm_status sink_put(sink *k, const void *data, size_t n, int flush) {
    if (n)
        k->crc = crc_update(k->crc, data, n);
    k->raw += n;
    const Bytef *p = data;
    do {
        size_t piece = n > ZMAX ? ZMAX : n;
        int f = piece == n ? flush : Z_NO_FLUSH;
        k->z.next_in = (Bytef *)(uintptr_t)p; /* zlib does not write through it */
        k->z.avail_in = (uInt)piece;
        for (;;) {
            if (k->z.avail_out == 0)
                LLMI_TRY(sink_room(k));
            int zr = deflate(&k->z, f);
            if (zr == Z_STREAM_END)
                break; /* Z_FINISH only */
            if (zr != Z_OK && zr != Z_BUF_ERROR)
                return llmi_error(LLM_ERR_INTERNAL, "deflate failed (%d)", zr);
            if (f == Z_NO_FLUSH && k->z.avail_in == 0)
                break;
        }
        if (piece) /* p may be NULL when n is 0 */
            p += piece;
        n -= piece;
    } while (n > 0);
    return LLM_OK;
}

/* Compressed bytes in the caller's buffer so far (buffer sink). */
static uint64_t sink_size(const sink *k) { return k->used - k->z.avail_out; }

static void sink_end(sink *k) {
    if (k->z_ready)
        deflateEnd(&k->z);
    k->z_ready = false;
}

/* Rows [0, n) of one layer's K or V in position order: each block's rows
 * are contiguous, so one put per block. */
static llm_status put_rows(sink *k, const llmi_kv *kv, const llmi_kv_seq *q, uint32_t layer, bool v,
                           uint32_t n) {
    for (uint32_t pos = 0; pos < n;) {
        uint32_t run = kv->block_size - pos % kv->block_size;
        if (run > n - pos)
            run = n - pos;
        const uint8_t *row = v ? llmi_kv_v(kv, layer, q, pos) : llmi_kv_k(kv, layer, q, pos);
        LLMI_TRY(sink_put(k, row, (size_t)run * kv->row_bytes, Z_NO_FLUSH));
        pos += run;
    }
    return LLM_OK;
}

static llm_status put_record(sink *k, const llmi_kv *kv, llm_seq_id id, const llmi_tseq *t) {
    uint8_t head[8];
    uint32_t n = t->kv.n_tokens;
    put_u32(head, (uint32_t)id);
    put_u32(head + 4, n);
    LLMI_TRY(sink_put(k, head, 8, Z_NO_FLUSH));
    LLMI_TRY(sink_put(k, t->tokens, (size_t)n * sizeof(llm_token), Z_NO_FLUSH));
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        LLMI_TRY(put_rows(k, kv, &t->kv, l, false, n));
        LLMI_TRY(put_rows(k, kv, &t->kv, l, true, n));
    }
    return LLM_OK;
}

/* What a save writes: the sequences (one, or all open ones) and the header
 * fields known before compressing. */
typedef struct plan {
    hdr h;
    llm_seq_id one; /* kind 1: its id */
    uint64_t bound; /* header + compressBound(raw) */
} plan;

static llm_status make_plan(llm_session *s, const llm_seq_id *seq, plan *p) {
    const llm_model *m = s->model;
    hdr *h = &p->h;
    memset(p, 0, sizeof *p);
    h->version = LLMI_STATE_VERSION;
    h->name_len = (uint32_t)strlen(m->name);
    h->header_len = LLMI_STATE_HEADER_FIXED + h->name_len;
    h->fingerprint = m->fingerprint;
    h->n_layer = s->kv->n_layer;
    h->kv_dim = s->kv->kv_dim;
    h->n_vocab = m->hp.n_vocab;
    h->kv_type = (uint32_t)s->kv->type;
    if (seq) {
        llmi_tseq *t = llmi_seq_find(s, *seq);
        if (!t)
            return llmi_error(LLM_ERR_NOT_FOUND, "sequence %d is not open", *seq);
        h->kind = LLMI_STATE_KIND_SEQUENCE;
        h->n_records = 1;
        h->n_tokens = t->kv.n_tokens;
        p->one = *seq;
    } else {
        h->kind = LLMI_STATE_KIND_SESSION;
        for (size_t i = 0; i < s->n_seqs; i++)
            if (s->seqs[i]) {
                h->n_records++;
                h->n_tokens += s->seqs[i]->n_tokens;
            }
    }
    if (!raw_length(h, &h->raw_len) || (sizeof(uLong) < 8 && h->raw_len > ULONG_MAX))
        return llmi_error(LLM_ERR_LIMIT, "state of %llu tokens is too large",
                          (unsigned long long)h->n_tokens);
    uint64_t zb = compressBound((uLong)h->raw_len);
    if (zb > (uint64_t)SIZE_MAX - h->header_len)
        return llmi_error(LLM_ERR_LIMIT, "state of %llu tokens is too large",
                          (unsigned long long)h->n_tokens);
    p->bound = h->header_len + zb;
    return LLM_OK;
}

/* Streams every record of the plan into k and finishes the stream. */
static llm_status write_payload(llm_session *s, const plan *p, sink *k) {
    LLMI_TRY(sink_init(k));
    if (p->h.kind == LLMI_STATE_KIND_SEQUENCE) {
        LLMI_TRY(put_record(k, s->kv, p->one, llmi_seq_find(s, p->one)));
    } else {
        for (size_t i = 0; i < s->n_seqs; i++)
            if (s->seqs[i])
                LLMI_TRY(put_record(k, s->kv, (llm_seq_id)i, llmi_tseq_of(s->seqs[i])));
    }
    LLMI_TRY(sink_put(k, NULL, 0, Z_FINISH));
    if (k->raw != p->h.raw_len) /* the plan and the records disagree: a bug */
        return llmi_error(LLM_ERR_INTERNAL, "state payload is %llu bytes, planned %llu",
                          (unsigned long long)k->raw, (unsigned long long)p->h.raw_len);
    return LLM_OK;
}

llm_status llmi_state_save(llm_session *s, const llm_seq_id *seq, void *buf, size_t capacity,
                           size_t *size) {
    *size = 0;
    plan p;
    LLMI_TRY(make_plan(s, seq, &p));
    if (!buf || capacity < p.bound) {
        *size = (size_t)p.bound;
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL,
                          "the state needs up to %llu bytes, capacity %zu",
                          (unsigned long long)p.bound, buf ? capacity : 0);
    }
    uint8_t *out = buf;
    sink k = {.fd = -1, .out = out + p.h.header_len, .cap = capacity - p.h.header_len};
    llm_status st = write_payload(s, &p, &k);
    if (st == LLM_OK) {
        p.h.comp_len = sink_size(&k);
        p.h.crc = k.crc;
        *size = header_write(&p.h, s->model->name, out) + (size_t)p.h.comp_len;
    }
    sink_end(&k);
    return st;
}

/* PATH.tmp, allocated. */
static llm_status tmp_path(const char *path, char **out) {
    size_t n = strlen(path);
    *out = llmi_malloc(n + 5);
    if (!*out)
        return llmi_oom("state file name");
    memcpy(*out, path, n);
    memcpy(*out + n, ".tmp", 5);
    return LLM_OK;
}

/* fsync of the directory holding path, so the rename itself is durable. */
static llm_status sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash) {
        memcpy(dir, ".", 2);
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        if (n >= sizeof dir)
            return LLM_OK; /* cannot name it: the file itself is synced */
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return io_error("cannot open the directory", dir, errno);
    int r = fsync(fd);
    int err = errno;
    close(fd);
    /* Some file systems cannot sync directories; the data is synced. */
    if (r != 0 && err != EINVAL && err != EROFS)
        return io_error("cannot sync", dir, err);
    return LLM_OK;
}

llm_status llmi_state_save_file(llm_session *s, const llm_seq_id *seq, const char *path) {
    plan p;
    LLMI_TRY(make_plan(s, seq, &p));
    char *tmp = NULL;
    LLMI_TRY(tmp_path(path, &tmp));
    uint8_t *hbuf = llmi_malloc(p.h.header_len);
    sink k = {.fd = -1, .path = tmp, .chunk = llmi_malloc(CHUNK), .off = p.h.header_len};
    llm_status st = LLM_OK;
    bool created = false;
    if (!hbuf || !k.chunk) {
        st = llmi_oom("state file buffers");
        goto done;
    }
    k.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (k.fd < 0) {
        st = io_error("cannot create", tmp, errno);
        goto done;
    }
    created = true;
    if ((st = write_payload(s, &p, &k)) != LLM_OK)
        goto done;
    /* The last partial chunk, then the header in front of the payload. */
    size_t tail = CHUNK - k.z.avail_out;
    if ((st = write_all(k.fd, tmp, k.chunk, tail, k.off)) != LLM_OK)
        goto done;
    p.h.comp_len = k.off + tail - p.h.header_len;
    p.h.crc = k.crc;
    header_write(&p.h, s->model->name, hbuf);
    if ((st = write_all(k.fd, tmp, hbuf, p.h.header_len, 0)) != LLM_OK)
        goto done;
    if (fsync(k.fd) != 0) {
        st = io_error("cannot sync", tmp, errno);
        goto done;
    }
    int fd = k.fd;
    k.fd = -1;
    if (close(fd) != 0) {
        st = io_error("cannot close", tmp, errno);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = io_error("cannot rename the state file to", path, errno);
        goto done;
    }
    st = sync_dir(path);
done:
    sink_end(&k);
    if (k.fd >= 0)
        close(k.fd);
    if (st != LLM_OK && created)
        unlink(tmp); /* never leave PATH.tmp behind */
    llmi_free(k.chunk);
    llmi_free(hbuf);
    llmi_free(tmp);
    return st;
}

/* ---- loading: caller buffer or file -> inflate -> KV blocks ---- */

typedef struct source {
    z_stream z;
    bool z_ready;
    uint32_t crc;
    uint64_t raw, raw_len; /* raw bytes produced so far, and the most allowed */
    /* buffer: the compressed bytes not yet handed to zlib */
    const uint8_t *in;
    uint64_t in_left;
    /* file: the rest of the payload, read CHUNK bytes at a time */
    int fd;
    const char *path;
    uint8_t *chunk;
    uint64_t file_left;
} source;

static llm_status bad_payload(const char *what) {
    return llmi_error(LLM_ERR_BAD_FORMAT, "corrupt payload: %s", what);
}

/* Refills zlib's input when there is more payload (else leaves it empty). */
static llm_status source_refill(source *r) {
    if (r->fd < 0) {
        if (r->in_left == 0)
            return LLM_OK;
        uint64_t n = r->in_left > ZMAX ? ZMAX : r->in_left;
        r->z.next_in = (Bytef *)(uintptr_t)r->in;
        r->z.avail_in = (uInt)n;
        r->in += n;
        r->in_left -= n;
        return LLM_OK;
    }
    if (r->file_left == 0)
        return LLM_OK;
    size_t want = r->file_left > CHUNK ? CHUNK : (size_t)r->file_left;
    ssize_t got;
    do
        got = read(r->fd, r->chunk, want);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        return io_error("cannot read", r->path, errno);
    if (got == 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "truncated: '%s' ended %llu bytes early", r->path,
                          (unsigned long long)r->file_left);
    r->z.next_in = r->chunk;
    r->z.avail_in = (uInt)got;
    r->file_left -= (uint64_t)got;
    return LLM_OK;
}

/* Inflates into out, up to n bytes; *got = bytes produced. Stops early only
 * at the end of the stream. */
static llm_status source_inflate(source *r, uint8_t *out, size_t n, size_t *got, bool *end) {
    *got = 0;
    *end = false;
    while (*got < n) {
        /* With the input used up, zlib may still hold output: only a call
         * that makes no progress at all means the stream was cut short. */
        if (r->z.avail_in == 0)
            LLMI_TRY(source_refill(r));
        size_t want = n - *got > ZMAX ? ZMAX : n - *got;
        r->z.next_out = out + *got;
        r->z.avail_out = (uInt)want;
        int zr = inflate(&r->z, Z_NO_FLUSH);
        *got += want - r->z.avail_out;
        if (zr == Z_BUF_ERROR && r->z.avail_in == 0)
            return bad_payload("the compressed stream ends early");
        if (zr == Z_STREAM_END) {
            *end = true;
            return LLM_OK;
        }
        if (zr == Z_MEM_ERROR)
            return llmi_oom("inflate window");
        if (zr == Z_NEED_DICT)
            return bad_payload("the stream asks for a dictionary");
        if (zr == Z_DATA_ERROR)
            return llmi_error(LLM_ERR_BAD_FORMAT, "corrupt payload: %s",
                              r->z.msg ? r->z.msg : "zlib data error");
        if (zr != Z_OK && zr != Z_BUF_ERROR)
            return llmi_error(LLM_ERR_INTERNAL, "inflate failed (%d)", zr);
    }
    return LLM_OK;
}

/* Exactly n raw bytes. Never asks zlib for more than the header's raw
 * length (a decompression bomb ends here). */
static llm_status source_read(source *r, void *out, size_t n) {
    if (n > r->raw_len - r->raw)
        return bad_payload("its records are longer than the header says");
    size_t got;
    bool end;
    LLMI_TRY(source_inflate(r, out, n, &got, &end));
    if (got < n)
        return bad_payload("the stream ends before its records do");
    r->crc = crc_update(r->crc, out, n);
    r->raw += n;
    return LLM_OK;
}

/* After the last record: the stream must end here, with its last input
 * byte, and the CRC must match. */
static llm_status source_finish(source *r, const hdr *h) {
    if (r->raw != h->raw_len)
        return bad_payload("its records are shorter than the header says");
    uint8_t extra;
    size_t got;
    bool end = false;
    while (!end) {
        LLMI_TRY(source_inflate(r, &extra, 1, &got, &end));
        if (got)
            return bad_payload("the stream holds more than its records");
    }
    if (r->z.avail_in == 0)
        LLMI_TRY(source_refill(r));
    if (r->z.avail_in != 0)
        return bad_payload("bytes follow the compressed stream");
    if (r->crc != h->crc)
        return llmi_error(LLM_ERR_BAD_FORMAT, "payload CRC mismatch (stored %08x, computed %08x)",
                          h->crc, r->crc);
    return LLM_OK;
}

/* Sequences built by a load, private until published. */
typedef struct built {
    llmi_tseq **seq;
    llm_seq_id *id;
    uint32_t n, cap;
} built;

static void built_free(llm_session *s, built *b) {
    for (uint32_t i = 0; i < b->n; i++)
        llmi_tseq_free(s, &b->seq[i]->kv, true);
    llmi_free(b->seq);
    llmi_free(b->id);
}

/* Converts n elements between KV element types (through f32). */
static void convert(const uint8_t *src, llm_kv_type st, uint8_t *dst, llm_kv_type dt, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float f;
        uint16_t h;
        if (st == LLM_KV_F32) {
            memcpy(&f, src + 4 * i, 4);
        } else {
            memcpy(&h, src + 2 * i, 2);
            f = st == LLM_KV_F16 ? llmi_f16_to_f32(h) : llmi_bf16_to_f32(h);
        }
        if (dt == LLM_KV_F32) {
            memcpy(dst + 4 * i, &f, 4);
        } else {
            h = dt == LLM_KV_F16 ? llmi_f32_to_f16(f) : llmi_f32_to_bf16(f);
            memcpy(dst + 2 * i, &h, 2);
        }
    }
}

/* Rows [0, n) of one layer's K or V, written into the reserved blocks: in
 * place when the types agree, else through `scratch`. */
static llm_status get_rows(source *r, const llmi_kv *kv, const llmi_kv_seq *q, uint32_t layer,
                           bool v, uint32_t n, llm_kv_type ft, uint8_t *scratch) {
    size_t frow = (size_t)kv->kv_dim * llmi_kv_type_size(ft);
    size_t per_round = SCRATCH / frow ? SCRATCH / frow : 1;
    for (uint32_t pos = 0; pos < n;) {
        uint32_t run = kv->block_size - pos % kv->block_size;
        if (run > n - pos)
            run = n - pos;
        uint8_t *dst = v ? llmi_kv_v(kv, layer, q, pos) : llmi_kv_k(kv, layer, q, pos);
        if (ft == kv->type) {
            LLMI_TRY(source_read(r, dst, (size_t)run * kv->row_bytes));
        } else {
            for (uint32_t done = 0; done < run;) {
                uint32_t k = run - done > per_round ? (uint32_t)per_round : run - done;
                LLMI_TRY(source_read(r, scratch, k * frow));
                convert(scratch, ft, dst + (size_t)done * kv->row_bytes, kv->type,
                        (size_t)k * kv->kv_dim);
                done += k;
            }
        }
        pos += run;
    }
    return LLM_OK;
}

/* One record into a new private sequence appended to b. */
static llm_status get_record(llm_session *s, source *r, const hdr *h, uint32_t index,
                             uint64_t *tokens_seen, built *b, uint8_t *scratch) {
    uint8_t head[8];
    LLMI_TRY(source_read(r, head, 8));
    llm_seq_id id = (llm_seq_id)get_u32(head);
    uint32_t n = get_u32(head + 4);
    if (h->kind == LLMI_STATE_KIND_SESSION && id < 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "record %u: sequence id %d is negative", index, id);
    if (h->kind == LLMI_STATE_KIND_SESSION && id > LLMI_STATE_MAX_SEQ_ID)
        return llmi_error(LLM_ERR_LIMIT, "record %u: sequence id %d exceeds %d", index, id,
                          LLMI_STATE_MAX_SEQ_ID);
    /* Checked first: a corrupt count is a format error, not a limit. */
    if (n > h->n_tokens - *tokens_seen || (h->kind == LLMI_STATE_KIND_SEQUENCE && n != h->n_tokens))
        return bad_payload("its records hold other token counts than the header says");
    if (n > s->params.n_ctx)
        return llmi_error(LLM_ERR_LIMIT, "record %u: %u tokens exceed the context of %u", index, n,
                          s->params.n_ctx);
    *tokens_seen += n;
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? 2 * b->cap : 4;
        if (cap > h->n_records)
            cap = h->n_records;
        llmi_tseq **ns = llmi_realloc(b->seq, cap * sizeof *ns);
        if (ns)
            b->seq = ns;
        llm_seq_id *ni = ns ? llmi_realloc(b->id, cap * sizeof *ni) : NULL;
        if (ni)
            b->id = ni;
        if (!ns || !ni)
            return llmi_oom("loaded sequences");
        b->cap = cap;
    }
    llmi_tseq *t = llmi_calloc(1, sizeof *t);
    if (!t)
        return llmi_oom("sequence");
    b->seq[b->n] = t;
    b->id[b->n++] = id;
    LLMI_TRY(llmi_tseq_reserve(t, n));
    pthread_mutex_lock(&s->sched.lock);
    llm_status st = llmi_kv_seq_reserve(s->kv, &t->kv, n);
    pthread_mutex_unlock(&s->sched.lock);
    LLMI_TRY(st);
    LLMI_TRY(source_read(r, t->tokens, (size_t)n * sizeof(llm_token)));
    for (uint32_t i = 0; i < n; i++)
        if (t->tokens[i] < 0 || (uint32_t)t->tokens[i] >= h->n_vocab)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "record %u: token %u is %d, outside the vocabulary of %u", index, i,
                              t->tokens[i], h->n_vocab);
    for (uint32_t l = 0; l < s->kv->n_layer; l++) {
        LLMI_TRY(get_rows(r, s->kv, &t->kv, l, false, n, (llm_kv_type)h->kv_type, scratch));
        LLMI_TRY(get_rows(r, s->kv, &t->kv, l, true, n, (llm_kv_type)h->kv_type, scratch));
    }
    t->kv.n_tokens = n;
    return LLM_OK;
}

/* Publishes the built sequences: under a new id (kind 1), or under their
 * saved ids in a session without open sequences (kind 2). Nothing is
 * published on failure. Under the lock. */
static llm_status publish(llm_session *s, const hdr *h, built *b, llm_seq_id *out) {
    if (h->kind == LLMI_STATE_KIND_SEQUENCE) {
        llm_seq_id id;
        LLMI_TRY(llmi_seq_new_slot(s, &id));
        s->seqs[id] = &b->seq[0]->kv;
        *out = id;
        return LLM_OK;
    }
    size_t need = s->n_seqs;
    for (uint32_t i = 0; i < b->n; i++)
        if ((size_t)b->id[i] + 1 > need)
            need = (size_t)b->id[i] + 1;
    if (need > s->n_seqs) {
        llmi_kv_seq **t = llmi_realloc(s->seqs, need * sizeof *t);
        if (!t)
            return llmi_oom("sequence table");
        s->seqs = t;
        for (size_t i = s->n_seqs; i < need; i++)
            s->seqs[i] = NULL;
        s->n_seqs = need;
    }
    for (uint32_t i = 0; i < b->n; i++) {
        if (s->seqs[b->id[i]]) { /* a duplicate id: take back what was placed */
            for (uint32_t j = 0; j < i; j++)
                s->seqs[b->id[j]] = NULL;
            return llmi_error(LLM_ERR_BAD_FORMAT, "sequence id %d appears twice", b->id[i]);
        }
        s->seqs[b->id[i]] = &b->seq[i]->kv;
    }
    return LLM_OK;
}

/* Everything after the header checks: inflate the records, verify, publish. */
static llm_status load_payload(llm_session *s, const hdr *h, source *r, llm_seq_id *out) {
    built b = {0};
    uint8_t *scratch = NULL;
    r->raw_len = h->raw_len;
    r->z.zalloc = z_alloc;
    r->z.zfree = z_free;
    llm_status st = LLM_OK;
    int zr = inflateInit(&r->z);
    if (zr == Z_MEM_ERROR)
        return llmi_oom("inflate state");
    if (zr != Z_OK)
        return llmi_error(LLM_ERR_INTERNAL, "inflateInit failed (%d)", zr);
    r->z_ready = true;
    if (h->kv_type != (uint32_t)s->kv->type) {
        size_t frow = (size_t)h->kv_dim * llmi_kv_type_size((llm_kv_type)h->kv_type);
        scratch = llmi_malloc(frow > SCRATCH ? frow : SCRATCH);
        if (!scratch)
            st = llmi_oom("KV conversion buffer");
    }
    uint64_t tokens_seen = 0;
    for (uint32_t i = 0; i < h->n_records && st == LLM_OK; i++)
        st = get_record(s, r, h, i, &tokens_seen, &b, scratch);
    if (st == LLM_OK)
        st = source_finish(r, h);
    if (st == LLM_OK) {
        pthread_mutex_lock(&s->sched.lock);
        st = publish(s, h, &b, out);
        pthread_mutex_unlock(&s->sched.lock);
    }
    if (st == LLM_OK) {
        b.n = 0; /* the session owns them now */
    }
    built_free(s, &b);
    llmi_free(scratch);
    inflateEnd(&r->z);
    r->z_ready = false;
    return st;
}

llm_status llmi_state_load(llm_session *s, const void *data, size_t size, llm_seq_id *out) {
    if (out)
        *out = -1;
    const uint8_t *p = data;
    hdr h;
    LLMI_TRY(header_read(p, size, &h));
    uint32_t want = out ? LLMI_STATE_KIND_SEQUENCE : LLMI_STATE_KIND_SESSION;
    LLMI_TRY(header_check(s, &h, want, size - h.header_len));
    source r = {.fd = -1, .in = p + h.header_len, .in_left = h.comp_len};
    return load_payload(s, &h, &r, out);
}

/* Reads exactly n bytes at the current offset; a short file is BAD_FORMAT. */
static llm_status read_exact(int fd, const char *path, uint8_t *p, size_t n, size_t *got) {
    *got = 0;
    while (*got < n) {
        ssize_t k = read(fd, p + *got, n - *got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return io_error("cannot read", path, errno);
        if (k == 0)
            break;
        *got += (size_t)k;
    }
    return LLM_OK;
}

static llm_status load_file(llm_session *s, int fd, const char *path, llm_seq_id *out) {
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return io_error("cannot stat", path, errno);
    if (!S_ISREG(sb.st_mode))
        return io_error("cannot load", path, S_ISDIR(sb.st_mode) ? EISDIR : EINVAL);
    uint8_t start[16];
    size_t got;
    uint32_t hl;
    LLMI_TRY(read_exact(fd, path, start, 16, &got));
    LLMI_TRY(header_start(start, got, &hl));
    uint8_t *hb = llmi_malloc(hl);
    if (!hb)
        return llmi_oom("state header");
    memcpy(hb, start, 16);
    hdr h;
    llm_status st = read_exact(fd, path, hb + 16, hl - 16, &got);
    if (st == LLM_OK)
        st = header_read(hb, 16 + got, &h);
    llmi_free(hb);
    LLMI_TRY(st);
    uint64_t file_size = (uint64_t)sb.st_size;
    uint64_t payload = file_size > hl ? file_size - hl : 0;
    uint32_t want = out ? LLMI_STATE_KIND_SEQUENCE : LLMI_STATE_KIND_SESSION;
    LLMI_TRY(header_check(s, &h, want, payload));
    source r = {.fd = fd, .path = path, .chunk = llmi_malloc(CHUNK), .file_left = h.comp_len};
    if (!r.chunk)
        return llmi_oom("state read buffer");
    st = load_payload(s, &h, &r, out);
    llmi_free(r.chunk);
    return st;
}

llm_status llmi_state_load_file(llm_session *s, const char *path, llm_seq_id *out) {
    if (out)
        *out = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return io_error("cannot open", path, errno);
    llm_status st = load_file(s, fd, path, out);
    close(fd);
    if (st != LLM_OK && st != LLM_ERR_IO)
        llmi_error_prefix("loading '%s'", path);
    return st;
}

/* ---- exported functions ----
 * Kept with the module (argument checks, then the functions above) rather
 * than in lib/api/api.c. */

#define STATE_ARG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, __VA_ARGS__);                              \
    } while (0)

LLM_API llm_status llm_seq_tokens(llm_session *s, llm_seq_id seq, llm_token *tokens,
                                  size_t capacity, size_t *n_tokens) {
    STATE_ARG(s && n_tokens, "llm_seq_tokens: NULL argument");
    STATE_ARG(tokens || capacity == 0, "llm_seq_tokens: tokens is NULL with capacity %zu",
              capacity);
    *n_tokens = 0;
    return llmi_seq_tokens(s, seq, tokens, capacity, n_tokens);
}

LLM_API llm_status llm_seq_state_save(llm_session *s, llm_seq_id seq, void *buf, size_t capacity,
                                      size_t *size) {
    STATE_ARG(s && size, "llm_seq_state_save: NULL argument");
    return llmi_state_save(s, &seq, buf, capacity, size);
}

LLM_API llm_status llm_seq_state_load(llm_session *s, const void *data, size_t size,
                                      llm_seq_id *out) {
    STATE_ARG(out, "llm_seq_state_load: out is NULL");
    *out = -1;
    STATE_ARG(s && data, "llm_seq_state_load: NULL argument");
    return llmi_state_load(s, data, size, out);
}

LLM_API llm_status llm_seq_state_save_file(llm_session *s, llm_seq_id seq, const char *path) {
    STATE_ARG(s && path, "llm_seq_state_save_file: NULL argument");
    return llmi_state_save_file(s, &seq, path);
}

LLM_API llm_status llm_seq_state_load_file(llm_session *s, const char *path, llm_seq_id *out) {
    STATE_ARG(out, "llm_seq_state_load_file: out is NULL");
    *out = -1;
    STATE_ARG(s && path, "llm_seq_state_load_file: NULL argument");
    return llmi_state_load_file(s, path, out);
}

LLM_API llm_status llm_session_state_save(llm_session *s, void *buf, size_t capacity,
                                          size_t *size) {
    STATE_ARG(s && size, "llm_session_state_save: NULL argument");
    return llmi_state_save(s, NULL, buf, capacity, size);
}

LLM_API llm_status llm_session_state_load(llm_session *s, const void *data, size_t size) {
    STATE_ARG(s && data, "llm_session_state_load: NULL argument");
    return llmi_state_load(s, data, size, NULL);
}

LLM_API llm_status llm_session_state_save_file(llm_session *s, const char *path) {
    STATE_ARG(s && path, "llm_session_state_save_file: NULL argument");
    return llmi_state_save_file(s, NULL, path);
}

LLM_API llm_status llm_session_state_load_file(llm_session *s, const char *path) {
    STATE_ARG(s && path, "llm_session_state_load_file: NULL argument");
    return llmi_state_load_file(s, path, NULL);
}
