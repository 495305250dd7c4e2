/* Loading: caller buffer or file -> inflate -> KV blocks. The payload
 * inflates straight into KV blocks reserved for sequences that stay private
 * until the whole payload checked out, so a load never holds a copy of the
 * raw payload and publishes nothing when any check fails. */
#include "core/quant.h"
#include "state/format.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bytes of rows converted between KV types per round. */
enum { SCRATCH = 1 << 16 };

typedef struct source {
    z_stream z;
    bool z_ready;
    uint32_t crc;          /* of the raw bytes inflated so far */
    uint32_t comp_crc;     /* of the compressed bytes handed to zlib so far */
    uint64_t raw, raw_len; /* raw bytes produced so far, and the most allowed */
    /* buffer: the compressed bytes not yet handed to zlib */
    const uint8_t *in;
    uint64_t in_left;
    /* file: the rest of the payload, read LLMI_STATE_CHUNK bytes at a time */
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
        uint64_t n = r->in_left > LLMI_STATE_ZMAX ? LLMI_STATE_ZMAX : r->in_left;
        r->z.next_in = (Bytef *)(uintptr_t)r->in;
        r->z.avail_in = (uInt)n;
        r->comp_crc = llmi_state_crc_update(r->comp_crc, r->in, (size_t)n);
        r->in += n;
        r->in_left -= n;
        return LLM_OK;
    }
    if (r->file_left == 0)
        return LLM_OK;
    size_t want = r->file_left > LLMI_STATE_CHUNK ? LLMI_STATE_CHUNK : (size_t)r->file_left;
    ssize_t got;
    do
        got = read(r->fd, r->chunk, want);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        return llmi_state_io_error("cannot read", r->path, errno);
    if (got == 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "truncated: '%s' ended %llu bytes early", r->path,
                          (unsigned long long)r->file_left);
    r->z.next_in = r->chunk;
    r->z.avail_in = (uInt)got;
    r->comp_crc = llmi_state_crc_update(r->comp_crc, r->chunk, (size_t)got);
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
        size_t want = n - *got > LLMI_STATE_ZMAX ? LLMI_STATE_ZMAX : n - *got;
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
    r->crc = llmi_state_crc_update(r->crc, out, n);
    r->raw += n;
    return LLM_OK;
}

/* After the last record: the stream must end here, with its last input
 * byte (so every compressed byte went through comp_crc), and the CRCs must
 * match. */
static llm_status source_finish(source *r, const llmi_state_header *h) {
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
    if (h->version >= 2 && r->comp_crc != h->comp_crc)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "compressed payload CRC mismatch (stored %08x, computed %08x)",
                          h->comp_crc, r->comp_crc);
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

/* Converts n_rows rows of kv_dim elements between KV element types,
 * through f32 (`f32`: kv_dim floats): a float type widens exactly, F16 and
 * BF16 round to nearest even, Q8_0 and Q4_0 quantize with core's reference
 * quantizer, as the CPU backend does when it computes a row, and
 * dequantize exactly (x = d * q). Both types are known and kv_dim is a
 * whole number of blocks of both (the header and engine checks). */
static void convert(const uint8_t *src, llm_kv_type st, uint8_t *dst, llm_kv_type dt, size_t n_rows,
                    uint32_t kv_dim, float *f32) {
    llmi_ttype s_t = LLMI_T_F32, d_t = LLMI_T_F32;
    llmi_kv_ttype(st, &s_t);
    llmi_kv_ttype(dt, &d_t);
    const size_t s_row = llmi_kv_row_bytes(st, kv_dim), d_row = llmi_kv_row_bytes(dt, kv_dim);
    for (size_t r = 0; r < n_rows; r++) {
        llmi_dequantize_row(s_t, src + r * s_row, f32, kv_dim);
        llmi_quantize_row(d_t, f32, dst + r * d_row, kv_dim);
    }
}

/* Rows [0, n) of one layer's K or V, written into the reserved blocks of
 * the backend's KV store through `scratch` (allocated in load_payload: the
 * file's rows, then the converted rows when the types differ, then one row
 * of floats to convert through). */
static llm_status get_rows(source *r, llmi_engine *e, const llmi_kv_seq *q, uint32_t layer, bool v,
                           uint32_t n, llm_kv_type ft, uint8_t *scratch) {
    const llm_kv_type kt = e->layout.type;
    size_t frow = llmi_kv_row_bytes(ft, e->layout.kv_dim);
    size_t row = frow > e->kv_row_bytes ? frow : e->kv_row_bytes;
    uint32_t per_round = SCRATCH / row ? (uint32_t)(SCRATCH / row) : 1;
    uint8_t *converted = scratch + (size_t)per_round * row;
    float *f32 =
        (float *)(((uintptr_t)(scratch + 2 * (size_t)per_round * row) + 15) & ~(uintptr_t)15);
    for (uint32_t pos = 0; pos < n;) {
        uint32_t k = n - pos < per_round ? n - pos : per_round;
        LLMI_TRY(source_read(r, scratch, k * frow));
        if (ft != kt)
            convert(scratch, ft, converted, kt, k, e->layout.kv_dim, f32);
        LLMI_TRY(llmi_engine_kv_write(e, q, layer, v, pos, k, ft == kt ? scratch : converted));
        pos += k;
    }
    return LLM_OK;
}

/* One record into a new private sequence appended to b. */
static llm_status get_record(llm_session *s, source *r, const llmi_state_header *h, uint32_t index,
                             uint64_t *tokens_seen, built *b, uint8_t *scratch) {
    uint8_t head[LLMI_STATE_RECORD_HEAD] = {0}; /* versions 1 and 2: no adapter */
    LLMI_TRY(source_read(r, head, llmi_state_record_head(h->version)));
    llm_seq_id id = (llm_seq_id)llmi_state_get_u32(head);
    uint32_t n = llmi_state_get_u32(head + 4);
    uint64_t fingerprint = llmi_state_get_u64(head + 8);
    uint32_t scale_bits = llmi_state_get_u32(head + 16);
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    if (!fingerprint && scale_bits)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "record %u: an adapter scale (bits %08x) without an adapter", index,
                          scale_bits);
    if (fingerprint && !isfinite(scale))
        return llmi_error(LLM_ERR_BAD_FORMAT, "record %u: adapter scale %g is not finite", index,
                          (double)scale);
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
    for (uint32_t l = 0; l < s->eng->layout.n_layer; l++) {
        LLMI_TRY(get_rows(r, s->eng, &t->kv, l, false, n, (llm_kv_type)h->kv_type, scratch));
        LLMI_TRY(get_rows(r, s->eng, &t->kv, l, true, n, (llm_kv_type)h->kv_type, scratch));
    }
    t->kv.n_tokens = n;
    /* Its K/V were computed under that adapter: it decodes again only once
     * llm_seq_set_adapter gives it the same one (session/decode.c). */
    t->wait_fingerprint = fingerprint;
    t->wait_scale = fingerprint ? scale : 0.0f;
    return LLM_OK;
}

/* Publishes the built sequences: under a new id (kind 1), or under their
 * saved ids in a session without open sequences (kind 2). Nothing is
 * published on failure. Under the lock. */
static llm_status publish(llm_session *s, const llmi_state_header *h, built *b, llm_seq_id *out) {
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
static llm_status load_payload(llm_session *s, const llmi_state_header *h, source *r,
                               llm_seq_id *out) {
    built b = {0};
    uint8_t *scratch = NULL;
    r->raw_len = h->raw_len;
    llmi_state_zlib_hooks(&r->z);
    llm_status st = LLM_OK;
    int zr = inflateInit(&r->z);
    if (zr == Z_MEM_ERROR)
        return llmi_oom("inflate state");
    if (zr != Z_OK)
        return llmi_error(LLM_ERR_INTERNAL, "inflateInit failed (%d)", zr);
    r->z_ready = true;
    {
        size_t frow = llmi_kv_row_bytes((llm_kv_type)h->kv_type, h->kv_dim);
        size_t row = frow > s->eng->kv_row_bytes ? frow : s->eng->kv_row_bytes;
        /* The file's rows, the converted rows, one row of floats. */
        scratch = llmi_malloc(2 * (row > SCRATCH ? row : SCRATCH) +
                              (size_t)h->kv_dim * sizeof(float) + 16);
        if (!scratch)
            st = llmi_oom("KV rows buffer");
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
    llmi_state_header h;
    LLMI_TRY(llmi_state_header_read(p, size, &h));
    uint32_t want = out ? LLMI_STATE_KIND_SEQUENCE : LLMI_STATE_KIND_SESSION;
    LLMI_TRY(llmi_state_header_check(s, &h, want, size - h.header_len));
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
            return llmi_state_io_error("cannot read", path, errno);
        if (k == 0)
            break;
        *got += (size_t)k;
    }
    return LLM_OK;
}

static llm_status load_file(llm_session *s, int fd, const char *path, llm_seq_id *out) {
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return llmi_state_io_error("cannot stat", path, errno);
    if (!S_ISREG(sb.st_mode))
        return llmi_state_io_error("cannot load", path, S_ISDIR(sb.st_mode) ? EISDIR : EINVAL);
    /* Opened without blocking (a FIFO would wait for a writer); reads of
     * the regular file it is are ordinary blocking reads again. */
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    uint8_t start[16];
    size_t got;
    uint32_t hl;
    LLMI_TRY(read_exact(fd, path, start, 16, &got));
    LLMI_TRY(llmi_state_header_start(start, got, &hl));
    uint8_t *hb = llmi_malloc(hl);
    if (!hb)
        return llmi_oom("state header");
    memcpy(hb, start, 16);
    llmi_state_header h;
    llm_status st = read_exact(fd, path, hb + 16, hl - 16, &got);
    if (st == LLM_OK)
        st = llmi_state_header_read(hb, 16 + got, &h);
    llmi_free(hb);
    LLMI_TRY(st);
    uint64_t file_size = (uint64_t)sb.st_size;
    uint64_t payload = file_size > hl ? file_size - hl : 0;
    uint32_t want = out ? LLMI_STATE_KIND_SEQUENCE : LLMI_STATE_KIND_SESSION;
    LLMI_TRY(llmi_state_header_check(s, &h, want, payload));
    source r = {
        .fd = fd, .path = path, .chunk = llmi_malloc(LLMI_STATE_CHUNK), .file_left = h.comp_len};
    if (!r.chunk)
        return llmi_oom("state read buffer");
    st = load_payload(s, &h, &r, out);
    llmi_free(r.chunk);
    return st;
}

llm_status llmi_state_load_file(llm_session *s, const char *path, llm_seq_id *out) {
    if (out)
        *out = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return llmi_state_io_error("cannot open", path, errno);
    llm_status st = load_file(s, fd, path, out);
    close(fd);
    if (st != LLM_OK && st != LLM_ERR_IO)
        llmi_error_prefix("loading '%s'", path);
    return st;
}
