/* Saving: raw bytes -> deflate -> caller buffer or file. The K/V rows
 * stream straight out of the KV blocks into deflate, so a save never holds
 * a copy of the raw payload. A file is written to PATH.tmp, fsync'ed and
 * renamed over PATH. */
#include "model/adapter.h"
#include "state/format.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct sink {
    z_stream z;
    bool z_ready;
    uint32_t crc;      /* of the raw bytes so far */
    uint32_t comp_crc; /* file: of the compressed bytes written so far */
    uint64_t raw;      /* raw bytes so far */
    /* buffer: deflate writes into out[0, cap) directly */
    uint8_t *out;
    uint64_t cap, used; /* used: bytes of out handed to zlib so far */
    /* file: deflate writes into chunk, flushed to fd at offset off */
    int fd;
    const char *path;
    uint8_t *chunk;
    uint64_t off;
} sink;

static llm_status write_all(int fd, const char *path, const uint8_t *p, size_t n, uint64_t off) {
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return llmi_state_io_error("cannot write", path, errno);
        if (w == 0)
            return llmi_state_io_error("cannot write", path, EIO);
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
        size_t n = LLMI_STATE_CHUNK - k->z.avail_out;
        k->comp_crc = llmi_state_crc_update(k->comp_crc, k->chunk, n);
        LLMI_TRY(write_all(k->fd, k->path, k->chunk, n, k->off));
        k->off += n;
        k->z.next_out = k->chunk;
        k->z.avail_out = LLMI_STATE_CHUNK;
        return LLM_OK;
    }
    if (k->used == k->cap) /* the bound given to the caller did not hold */
        return llmi_error(LLM_ERR_INTERNAL, "compressed state exceeds its size bound");
    uint64_t n = k->cap - k->used > LLMI_STATE_ZMAX ? LLMI_STATE_ZMAX : k->cap - k->used;
    k->z.next_out = k->out + k->used;
    k->z.avail_out = (uInt)n;
    k->used += n;
    return LLM_OK;
}

static llm_status sink_init(sink *k) {
    llmi_state_zlib_hooks(&k->z);
    int zr = deflateInit(&k->z, 1);
    if (zr == Z_MEM_ERROR)
        return llmi_oom("deflate state");
    if (zr != Z_OK)
        return llmi_error(LLM_ERR_INTERNAL, "deflateInit failed (%d)", zr);
    k->z_ready = true;
    if (k->fd < 0)
        return sink_room(k);
    k->z.next_out = k->chunk;
    k->z.avail_out = LLMI_STATE_CHUNK;
    return LLM_OK;
}

/* Compresses n raw bytes; flush = Z_FINISH (with n == 0) ends the stream. */
static llm_status sink_put(sink *k, const void *data, size_t n, int flush) {
    if (n)
        k->crc = llmi_state_crc_update(k->crc, data, n);
    k->raw += n;
    const Bytef *p = data;
    do {
        size_t piece = n > LLMI_STATE_ZMAX ? LLMI_STATE_ZMAX : n;
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

enum { SCRATCH = 1 << 16 };

/* Rows [0, n) of one layer's K or V in position order, read from the
 * backend's KV store through `scratch` (SCRATCH bytes, at least a row). */
static llm_status put_rows(sink *k, llmi_engine *e, const llmi_kv_seq *q, uint32_t layer, bool v,
                           uint32_t n, uint8_t *scratch) {
    uint32_t per_round = SCRATCH / e->kv_row_bytes ? (uint32_t)(SCRATCH / e->kv_row_bytes) : 1;
    for (uint32_t pos = 0; pos < n;) {
        uint32_t run = n - pos < per_round ? n - pos : per_round;
        LLMI_TRY(llmi_engine_kv_read(e, q, layer, v, pos, run, scratch));
        LLMI_TRY(sink_put(k, scratch, (size_t)run * e->kv_row_bytes, Z_NO_FLUSH));
        pos += run;
    }
    return LLM_OK;
}

static llm_status put_record(sink *k, llmi_engine *e, llm_seq_id id, const llmi_tseq *t,
                             uint8_t *scratch) {
    uint8_t head[LLMI_STATE_RECORD_HEAD];
    uint32_t n = t->kv.n_tokens;
    /* The adapter the K/V were computed with: the one set, or, for a
     * restored sequence still waiting for it, the one it waits for. */
    uint64_t fingerprint = t->adapter ? t->adapter->fingerprint : t->wait_fingerprint;
    float scale = t->adapter ? t->adapter_scale : t->wait_fingerprint ? t->wait_scale : 0.0f;
    uint32_t scale_bits;
    memcpy(&scale_bits, &scale, sizeof scale_bits);
    llmi_state_put_u32(head, (uint32_t)id);
    llmi_state_put_u32(head + 4, n);
    llmi_state_put_u64(head + 8, fingerprint);
    llmi_state_put_u32(head + 16, scale_bits);
    LLMI_TRY(sink_put(k, head, sizeof head, Z_NO_FLUSH));
    LLMI_TRY(sink_put(k, t->tokens, (size_t)n * sizeof(llm_token), Z_NO_FLUSH));
    for (uint32_t l = 0; l < e->layout.n_layer; l++) {
        LLMI_TRY(put_rows(k, e, &t->kv, l, false, n, scratch));
        LLMI_TRY(put_rows(k, e, &t->kv, l, true, n, scratch));
    }
    return LLM_OK;
}

/* What a save writes: the sequences (one, or all open ones) and the header
 * fields known before compressing. */
typedef struct plan {
    llmi_state_header h;
    llm_seq_id one; /* kind 1: its id */
    uint64_t bound; /* header + compressBound(raw) */
} plan;

static llm_status make_plan(llm_session *s, const llm_seq_id *seq, plan *p) {
    const llm_model *m = s->model;
    llmi_state_header *h = &p->h;
    memset(p, 0, sizeof *p);
    h->version = LLMI_STATE_VERSION;
    h->name_len = (uint32_t)strlen(m->name);
    h->header_len = LLMI_STATE_HEADER_FIXED + h->name_len;
    h->fingerprint = m->fingerprint;
    h->n_layer = s->eng->layout.n_layer;
    h->kv_dim = s->eng->layout.kv_dim;
    h->n_vocab = m->hp.n_vocab;
    h->kv_type = (uint32_t)s->eng->layout.type;
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
    if (!llmi_state_raw_length(h, &h->raw_len) || (sizeof(uLong) < 8 && h->raw_len > ULONG_MAX))
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
static llm_status write_records(llm_session *s, const plan *p, sink *k, uint8_t *scratch) {
    if (p->h.kind == LLMI_STATE_KIND_SEQUENCE)
        return put_record(k, s->eng, p->one, llmi_seq_find(s, p->one), scratch);
    for (size_t i = 0; i < s->n_seqs; i++)
        if (s->seqs[i])
            LLMI_TRY(put_record(k, s->eng, (llm_seq_id)i, llmi_tseq_of(s->seqs[i]), scratch));
    return LLM_OK;
}

static llm_status write_payload(llm_session *s, const plan *p, sink *k) {
    LLMI_TRY(sink_init(k));
    size_t bytes = s->eng->kv_row_bytes > SCRATCH ? s->eng->kv_row_bytes : SCRATCH;
    uint8_t *scratch = llmi_malloc(bytes);
    if (!scratch)
        return llmi_oom("state rows");
    llm_status st = write_records(s, p, k, scratch);
    llmi_free(scratch);
    LLMI_TRY(st);
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
        p.h.comp_crc = llmi_state_crc_update(0, out + p.h.header_len, (size_t)p.h.comp_len);
        *size = llmi_state_header_write(&p.h, s->model->name, out) + (size_t)p.h.comp_len;
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
        return llmi_state_io_error("cannot open the directory", dir, errno);
    int r = fsync(fd);
    int err = errno;
    close(fd);
    /* Some file systems cannot sync directories; the data is synced. */
    if (r != 0 && err != EINVAL && err != EROFS)
        return llmi_state_io_error("cannot sync", dir, err);
    return LLM_OK;
}

llm_status llmi_state_save_file(llm_session *s, const llm_seq_id *seq, const char *path) {
    plan p;
    LLMI_TRY(make_plan(s, seq, &p));
    char *tmp = NULL;
    LLMI_TRY(tmp_path(path, &tmp));
    uint8_t *hbuf = llmi_malloc(p.h.header_len);
    sink k = {.fd = -1, .path = tmp, .chunk = llmi_malloc(LLMI_STATE_CHUNK), .off = p.h.header_len};
    llm_status st = LLM_OK;
    bool created = false;
    if (!hbuf || !k.chunk) {
        st = llmi_oom("state file buffers");
        goto done;
    }
    k.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (k.fd < 0) {
        st = llmi_state_io_error("cannot create", tmp, errno);
        goto done;
    }
    created = true;
    if ((st = write_payload(s, &p, &k)) != LLM_OK)
        goto done;
    /* The last partial chunk, then the header in front of the payload. */
    size_t tail = LLMI_STATE_CHUNK - k.z.avail_out;
    if ((st = write_all(k.fd, tmp, k.chunk, tail, k.off)) != LLM_OK)
        goto done;
    p.h.comp_len = k.off + tail - p.h.header_len;
    p.h.crc = k.crc;
    p.h.comp_crc = llmi_state_crc_update(k.comp_crc, k.chunk, tail);
    llmi_state_header_write(&p.h, s->model->name, hbuf);
    if ((st = write_all(k.fd, tmp, hbuf, p.h.header_len, 0)) != LLM_OK)
        goto done;
    if (fsync(k.fd) != 0) {
        st = llmi_state_io_error("cannot sync", tmp, errno);
        goto done;
    }
    int fd = k.fd;
    k.fd = -1;
    if (close(fd) != 0) {
        st = llmi_state_io_error("cannot close", tmp, errno);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = llmi_state_io_error("cannot rename the state file to", path, errno);
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
