/* llm-synth: random-weight Llama GGUFs of real shapes, for GPU benchmarks
 * (docs/device-check.md) where no real checkpoint may be downloaded.
 *
 *   llm-synth --shape 1b|8b|tiny --type bf16|q8_0|q4_k [--layers N]
 *             [--seed S] [--threads N] [--dry-run] -o PATH
 *   llm-synth --info PATH
 *
 * Shapes: 1b is Llama-3.2-1B (16 layers, n_embd 2048, 32/8 heads, n_ff
 * 8192, vocabulary 128256, tied embeddings); 8b is Llama-3.1-8B (32
 * layers, 4096, 32/8 heads, 14336, 128256, an output matrix of its own);
 * tiny (2 layers, 256, 4/2 heads, 512, 4096) runs anywhere. Every matrix,
 * the token embedding included, is of --type; norms are F32. The
 * tokenizer is the test models' GPT-2 byte-level one (model/testmodel.h)
 * padded with unused tokens to the vocabulary size, so the loader reads
 * these files as it reads a converted checkpoint.
 *
 * Speed matters more than realism: the 8b BF16 file is 16 GB. Weights are
 * written as their stored bits straight from a counter-based generator
 * (random bf16 of small magnitude; Q8_0 and Q4_K blocks with random
 * quants and a fixed scale), filled by several threads into a large buffer
 * that goes out in big write(2) calls. The same options always give the
 * same bytes, whatever the thread count.
 *
 * --info prints what a benchmark needs to judge a model file: weight bytes,
 * the bytes one generated token reads, and the multiply-accumulates per
 * token. Exit status: 0 ok, 1 usage, 2 runtime error. */
#include "gguf/gguf.h"
#include "model/testmodel.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct shape {
    const char *name;
    uint32_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab;
    bool tied;
    float rope_base;
} shape;

static const shape shapes[] = {
    {"1b", 16, 2048, 32, 8, 8192, 128256, true, 500000.0f},
    {"8b", 32, 4096, 32, 8, 14336, 128256, false, 500000.0f},
    {"tiny", 2, 256, 4, 2, 512, 4096, false, 10000.0f},
};

typedef struct options {
    const shape *shape;
    shape s; /* after --layers */
    llmi_ttype type;
    uint64_t seed;
    long threads;
    const char *out, *info;
    bool dry_run; /* print the file's size only */
} options;

enum { ALIGN = 32, MAX_THREADS = 64 };
#define BUF_BYTES ((size_t)64 << 20)

static void usage(FILE *f) {
    fprintf(f, "usage: llm-synth --shape 1b|8b|tiny --type bf16|q8_0|q4_k -o PATH [options]\n"
               "       llm-synth --info PATH\n"
               "  --layers N    override the shape's layer count (a quick file for a CPU)\n"
               "  --seed S      weights (default 1)\n"
               "  --threads N   generator threads (default: online CPUs, at most 64)\n"
               "  --dry-run     print the size the file would have; write nothing\n"
               "  --info PATH   print a model file's weight bytes, bytes read per generated\n"
               "                token and parameters per token, as JSON\n");
}

static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || !*s || *end || *s == '-' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* 0 ok, 1 usage error (printed), -1 help. */
static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->seed = 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : cpus;
    o->type = (llmi_ttype)-1;
    uint64_t layers = 0, v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return -1;
        if (!strcmp(a, "--dry-run")) {
            o->dry_run = true;
            continue;
        }
        if (!val) {
            fprintf(stderr, "llm-synth: unknown option or missing value: %s\n", a);
            return 1;
        }
        bool ok = true;
        if (!strcmp(a, "-o"))
            o->out = val;
        else if (!strcmp(a, "--info"))
            o->info = val;
        else if (!strcmp(a, "--shape")) {
            ok = false;
            for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
                if (!strcmp(val, shapes[k].name)) {
                    o->shape = &shapes[k];
                    ok = true;
                }
        } else if (!strcmp(a, "--type")) {
            o->type = !strcmp(val, "bf16")   ? LLMI_T_BF16
                      : !strcmp(val, "q8_0") ? LLMI_T_Q8_0
                      : !strcmp(val, "q4_k") ? LLMI_T_Q4_K
                                             : (llmi_ttype)-1;
            ok = (int)o->type >= 0;
        } else if (!strcmp(a, "--layers"))
            ok = parse_u64(val, 1, 1024, &layers);
        else if (!strcmp(a, "--seed"))
            ok = parse_u64(val, 0, UINT64_MAX, &o->seed);
        else if (!strcmp(a, "--threads")) {
            ok = parse_u64(val, 1, MAX_THREADS, &v);
            o->threads = (long)v;
        } else {
            fprintf(stderr, "llm-synth: unknown option '%s'\n", a);
            return 1;
        }
        if (!ok) {
            fprintf(stderr, "llm-synth: bad value '%s' for %s\n", val, a);
            return 1;
        }
        i++;
    }
    if (o->info)
        return 0;
    if (!o->shape || (int)o->type < 0 || !o->out) {
        fprintf(stderr, "llm-synth: --shape, --type and -o are required\n");
        return 1;
    }
    o->s = *o->shape;
    if (layers)
        o->s.n_layer = (uint32_t)layers;
    return 0;
}

/* ---- tensor table ---- */

typedef struct tensor {
    char name[48];
    llmi_ttype type;
    uint64_t ne[2];
    uint32_t n_dims;
    size_t nbytes;
    uint64_t offset; /* in the data section */
} tensor;

static size_t align_up(size_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

static llm_status add(tensor *t, size_t *n, uint64_t *data, const char *name, llmi_ttype type,
                      uint64_t ne0, uint64_t ne1) {
    tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->type = type;
    x->ne[0] = ne0;
    x->ne[1] = ne1;
    x->n_dims = ne1 > 1 ? 2 : 1;
    x->nbytes = llmi_ttype_row_bytes(type, ne0) * ne1;
    if (!x->nbytes)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "%s: %llu columns are not whole %s blocks",
                          name, (unsigned long long)ne0, llmi_ttype_get(type)->name);
    x->offset = *data;
    *data = align_up(*data + x->nbytes);
    return LLM_OK;
}

/* llama.cpp's tensor names and order. Returns the count in *n. */
static llm_status plan(const shape *s, llmi_ttype type, tensor *t, size_t *n, uint64_t *data) {
    uint32_t e = s->n_embd, hd = e / s->n_head, q = s->n_head * hd, kv = s->n_head_kv * hd;
    char nm[48];
    *n = 0;
    *data = 0;
    LLMI_TRY(add(t, n, data, "token_embd.weight", type, e, s->n_vocab));
    for (uint32_t l = 0; l < s->n_layer; l++) {
#define LAYER(suffix, ty, a, b)                                                                    \
    snprintf(nm, sizeof nm, "blk.%u." suffix ".weight", l);                                        \
    LLMI_TRY(add(t, n, data, nm, ty, a, b))
        LAYER("attn_norm", LLMI_T_F32, e, 1);
        LAYER("attn_q", type, e, q);
        LAYER("attn_k", type, e, kv);
        LAYER("attn_v", type, e, kv);
        LAYER("attn_output", type, q, e);
        LAYER("ffn_norm", LLMI_T_F32, e, 1);
        LAYER("ffn_gate", type, e, s->n_ff);
        LAYER("ffn_up", type, e, s->n_ff);
        LAYER("ffn_down", type, s->n_ff, e);
#undef LAYER
    }
    LLMI_TRY(add(t, n, data, "output_norm.weight", LLMI_T_F32, e, 1));
    if (!s->tied)
        LLMI_TRY(add(t, n, data, "output.weight", type, e, s->n_vocab));
    return LLM_OK;
}

/* ---- metadata ---- */

typedef struct obuf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} obuf;

static void put(obuf *b, const void *d, size_t n) {
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
}
static void put_u32(obuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(obuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(obuf *b, const char *s, uint64_t n) {
    put_u64(b, n);
    put(b, s, n);
}
static void kv_u32(obuf *b, const char *k, uint32_t v) {
    put_str(b, k, strlen(k));
    put_u32(b, LLMI_GGUF_U32);
    put_u32(b, v);
}
static void kv_f32(obuf *b, const char *k, float v) {
    put_str(b, k, strlen(k));
    put_u32(b, LLMI_GGUF_F32);
    put(b, &v, 4);
}
static void kv_str(obuf *b, const char *k, const char *v) {
    put_str(b, k, strlen(k));
    put_u32(b, LLMI_GGUF_STRING);
    put_str(b, v, strlen(v));
}

/* Re-serialises one entry read from a file (little-endian host). */
static void kv_copy(obuf *b, const llmi_gguf_kv *kv) {
    put_str(b, kv->key.ptr, kv->key.len);
    put_u32(b, kv->type);
    if (kv->type == LLMI_GGUF_STRING) {
        put_str(b, kv->str.ptr, kv->str.len);
    } else if (kv->type == LLMI_GGUF_ARRAY) {
        put_u32(b, kv->arr_type);
        put_u64(b, kv->arr_len);
        if (kv->arr_type == LLMI_GGUF_STRING)
            for (uint64_t i = 0; i < kv->arr_len; i++)
                put_str(b, kv->arr_strs[i].ptr, kv->arr_strs[i].len);
        else
            put(b, kv->arr_data, kv->arr_len * llmi_gguf_vtype_size(kv->arr_type));
    } else if (kv->type == LLMI_GGUF_F32) {
        float f = (float)kv->scalar.f;
        put(b, &f, 4);
    } else if (kv->type == LLMI_GGUF_F64) {
        put(b, &kv->scalar.f, 8);
    } else if (kv->type == LLMI_GGUF_BOOL) {
        uint8_t v = kv->scalar.b;
        put(b, &v, 1);
    } else {
        put(b, &kv->scalar.u, llmi_gguf_vtype_size(kv->type)); /* the low bytes: same for signed */
    }
}

static uint32_t file_type(llmi_ttype t) {
    return t == LLMI_T_BF16 ? 32 : t == LLMI_T_Q8_0 ? 7 : 14; /* llama.cpp: MOSTLY_Q4_K_S */
}

/* The key/value section: the tokenizer of a test model padded to the
 * vocabulary, then this shape's hyper-parameters. Returns the entry count. */
static llm_status metadata(const options *o, obuf *b, uint64_t *n_kv) {
    llmi_testmodel_params tp;
    llmi_testmodel_params_init(&tp);
    tp.n_layer = 1;
    tp.n_embd = 32;
    tp.n_head = 2;
    tp.n_head_kv = 1;
    tp.n_ff = 32;
    if (o->s.n_vocab < llmi_testmodel_n_vocab())
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "vocabulary below %u tokens",
                          llmi_testmodel_n_vocab());
    tp.n_vocab_pad = o->s.n_vocab - llmi_testmodel_n_vocab();
    void *img = NULL;
    size_t size = 0;
    llmi_gguf *g = NULL;
    LLMI_TRY(llmi_testmodel_to_memory(&tp, &img, &size));
    llm_status st = llmi_gguf_open_memory(img, size, &g);
    if (st != LLM_OK) {
        llmi_free(img);
        return st;
    }
    *n_kv = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        llmi_str k = g->kv[i].key;
        if ((k.len > 6 && !memcmp(k.ptr, "llama.", 6)) || llmi_str_eq(k, "general.name") ||
            llmi_str_eq(k, "general.file_type"))
            continue;
        kv_copy(b, &g->kv[i]);
        ++*n_kv;
    }
    llmi_gguf_close(g);
    llmi_free(img);
    const shape *s = &o->s;
    char name[64];
    snprintf(name, sizeof name, "llminfer-synth-%s-%s", s->name, llmi_ttype_get(o->type)->name);
    kv_str(b, "general.name", name);
    kv_u32(b, "general.file_type", file_type(o->type));
    kv_u32(b, "llama.block_count", s->n_layer);
    kv_u32(b, "llama.context_length", 8192);
    kv_u32(b, "llama.embedding_length", s->n_embd);
    kv_u32(b, "llama.feed_forward_length", s->n_ff);
    kv_u32(b, "llama.attention.head_count", s->n_head);
    kv_u32(b, "llama.attention.head_count_kv", s->n_head_kv);
    kv_f32(b, "llama.rope.freq_base", s->rope_base);
    kv_f32(b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_u32(b, "llama.vocab_size", s->n_vocab);
    kv_u32(b, "llama.rope.dimension_count", s->n_embd / s->n_head);
    *n_kv += 12;
    return b->oom ? llmi_oom("metadata") : LLM_OK;
}

/* ---- weights ---- */

/* splitmix64 of a counter: any word of any tensor in O(1), so threads fill
 * disjoint ranges and the bytes do not depend on how work is split. */
static inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline uint64_t word(uint64_t key, uint64_t i) {
    return mix(key + (i + 1) * 0x9e3779b97f4a7c15ull);
}

typedef struct fill_job {
    const tensor *t;
    uint64_t key;
    uint8_t *dst;
    uint64_t first, count; /* units: elements (F32, BF16) or blocks */
    uint16_t d_q8, d_q4k;
} fill_job;

/* Norm scales near 1, keeping activations sized through the layers. */
static void fill_f32(const fill_job *j) {
    float *d = (float *)j->dst;
    for (uint64_t i = 0; i < j->count; i++)
        d[i] = 1.0f + ((float)(word(j->key, j->first + i) >> 48) - 32768.0f) / 327680.0f;
}

/* Sign, the two low exponent bits and the mantissa random over exponent
 * 116: |w| in [2^-11, 2^-7), four weights per generated word. */
static void fill_bf16(const fill_job *j) {
    uint16_t *d = (uint16_t *)j->dst;
    uint64_t i = 0, n = j->count;
    for (; i < n && (j->first + i) % 4; i++)
        d[i] = (uint16_t)((word(j->key, (j->first + i) / 4) >> 16 * ((j->first + i) % 4) & 0x81ff) |
                          0x3a00);
    for (; i + 4 <= n; i += 4) {
        uint64_t w =
            (word(j->key, (j->first + i) / 4) & 0x81ff81ff81ff81ffull) | 0x3a003a003a003a00ull;
        memcpy(d + i, &w, 8);
    }
    for (; i < n; i++)
        d[i] = (uint16_t)((word(j->key, (j->first + i) / 4) >> 16 * ((j->first + i) % 4) & 0x81ff) |
                          0x3a00);
}

/* Random quants under one fixed scale per block type. */
static void fill_blocks(const fill_job *j, size_t bytes, size_t head) {
    size_t words = (bytes - head + 7) / 8;
    uint8_t tmp[160];
    for (uint64_t b = 0; b < j->count; b++) {
        uint8_t *blk = j->dst + b * bytes;
        uint64_t base = (j->first + b) * words;
        for (size_t w = 0; w < words; w++) {
            uint64_t x = word(j->key, base + w);
            memcpy(tmp + 8 * w, &x, 8);
        }
        memcpy(blk + head, tmp, bytes - head);
        if (head == 2) {
            memcpy(blk, &j->d_q8, 2);
        } else {
            memcpy(blk, &j->d_q4k, 2);
            memcpy(blk + 2, &j->d_q4k, 2);
        }
    }
}

static void *fill(void *arg) {
    const fill_job *j = arg;
    switch (j->t->type) {
    case LLMI_T_F32:
        fill_f32(j);
        break;
    case LLMI_T_BF16:
        fill_bf16(j);
        break;
    case LLMI_T_Q8_0:
        fill_blocks(j, sizeof(llmi_block_q8_0), 2);
        break;
    default:
        fill_blocks(j, sizeof(llmi_block_q4_k), 4);
        break;
    }
    return NULL;
}

typedef struct writer {
    int fd;
    uint8_t *buf;
    size_t len;
    const char *path;
    uint64_t written;
} writer;

static llm_status flush_buf(writer *w) {
    size_t off = 0;
    while (off < w->len) {
        ssize_t n = write(w->fd, w->buf + off, w->len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return llmi_error(LLM_ERR_IO, "cannot write '%s': %s", w->path,
                              n < 0 ? strerror(errno) : "short write");
        off += (size_t)n;
    }
    w->written += w->len;
    w->len = 0;
    return LLM_OK;
}

static llm_status emit(writer *w, const void *d, size_t n) {
    while (n) {
        if (w->len == BUF_BYTES)
            LLMI_TRY(flush_buf(w));
        size_t k = BUF_BYTES - w->len < n ? BUF_BYTES - w->len : n;
        memcpy(w->buf + w->len, d, k);
        w->len += k;
        d = (const uint8_t *)d + k;
        n -= k;
    }
    return LLM_OK;
}

static llm_status pad(writer *w) {
    static const uint8_t zeros[ALIGN];
    size_t at = (size_t)((w->written + w->len) % ALIGN);
    return at ? emit(w, zeros, ALIGN - at) : LLM_OK;
}

/* Generates tensor t straight into the buffer, in pieces of whole units. */
static llm_status emit_tensor(writer *w, const options *o, const tensor *t, uint64_t key) {
    const llmi_ttype_info *ti = llmi_ttype_get(t->type);
    size_t unit = ti->block_bytes;
    uint64_t units = t->nbytes / unit, done = 0;
    while (done < units) {
        if (BUF_BYTES - w->len < unit)
            LLMI_TRY(flush_buf(w));
        uint64_t n = (BUF_BYTES - w->len) / unit;
        if (n > units - done)
            n = units - done;
        long nt = n < 4096 ? 1 : o->threads;
        pthread_t th[MAX_THREADS];
        fill_job jobs[MAX_THREADS];
        uint64_t started = 0;
        for (long k = 0; k < nt; k++) {
            uint64_t a = n * (uint64_t)k / (uint64_t)nt, b = n * (uint64_t)(k + 1) / (uint64_t)nt;
            jobs[k] = (fill_job){t,
                                 key,
                                 w->buf + w->len + a * unit,
                                 done + a,
                                 b - a,
                                 llmi_f32_to_f16(8e-5f),
                                 llmi_f32_to_f16(6.5e-5f)};
            if (k == nt - 1 || pthread_create(&th[k], NULL, fill, &jobs[k]) != 0)
                fill(&jobs[k]); /* the last share, or one no thread took */
            else
                started |= 1ull << k;
        }
        for (long k = 0; k < nt; k++)
            if (started & (1ull << k))
                pthread_join(th[k], NULL);
        w->len += n * unit;
        done += n;
    }
    return pad(w);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what, llm_status st) {
    fprintf(stderr, "llm-synth: %s: %s: %s\n", what, llm_status_name(st), llm_last_error());
    return 2;
}

static int write_model(const options *o) {
    size_t cap = 2 + (size_t)o->s.n_layer * 9 + 2, n = 0;
    tensor *t = calloc(cap, sizeof *t);
    obuf meta = {0};
    writer w = {.fd = -1, .path = o->out};
    bool created = false;
    llm_status st = LLM_OK;
    uint64_t n_kv = 0, data = 0;
    double t0 = now_s();
    const char *what = "planning the tensors";
    if (!t || !(w.buf = malloc(BUF_BYTES))) {
        st = llmi_oom("llm-synth buffers");
        goto done;
    }
    if ((st = plan(&o->s, o->type, t, &n, &data)) != LLM_OK)
        goto done;
    what = "writing the metadata";
    if ((st = metadata(o, &meta, &n_kv)) != LLM_OK)
        goto done;
    obuf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, n);
    put_u64(&h, n_kv);
    put(&h, meta.p, meta.len);
    for (size_t i = 0; i < n; i++) {
        put_str(&h, t[i].name, strlen(t[i].name));
        put_u32(&h, t[i].n_dims);
        for (uint32_t d = 0; d < t[i].n_dims; d++)
            put_u64(&h, t[i].ne[d]);
        put_u32(&h, (uint32_t)t[i].type);
        put_u64(&h, t[i].offset);
    }
    if (h.oom) {
        st = llmi_oom("GGUF header");
        free(h.p);
        goto done;
    }
    if (o->dry_run) {
        printf("{\"path\": \"%s\", \"shape\": \"%s\", \"type\": \"%s\", \"layers\": %u, "
               "\"bytes\": %llu, \"dry_run\": true}\n",
               o->out, o->s.name, llmi_ttype_get(o->type)->name, o->s.n_layer,
               (unsigned long long)(align_up(h.len) + data));
        free(h.p);
        goto done;
    }
    what = o->out;
    w.fd = open(o->out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        st = llmi_error(LLM_ERR_IO, "cannot create it: %s", strerror(errno));
        free(h.p);
        goto done;
    }
    created = true;
    if (st == LLM_OK)
        st = emit(&w, h.p, h.len);
    free(h.p);
    if (st == LLM_OK)
        st = pad(&w);
    for (size_t i = 0; st == LLM_OK && i < n; i++)
        st = emit_tensor(&w, o, &t[i], mix(o->seed * 0x9e3779b97f4a7c15ull + i + 1));
    if (st == LLM_OK)
        st = flush_buf(&w);
    if (w.fd >= 0 && close(w.fd) != 0 && st == LLM_OK)
        st = llmi_error(LLM_ERR_IO, "cannot write it: %s", strerror(errno));
    w.fd = -1;
done:
    if (w.fd >= 0)
        close(w.fd);
    if (st != LLM_OK && created)
        unlink(o->out); /* no half-written model left for a benchmark to load */
    free(t);
    free(meta.p);
    free(w.buf);
    if (st != LLM_OK)
        return fail(what, st);
    if (o->dry_run)
        return 0;
    double s = now_s() - t0;
    printf("{\"path\": \"%s\", \"shape\": \"%s\", \"type\": \"%s\", \"layers\": %u, "
           "\"bytes\": %llu, \"seconds\": %.3f, \"gb_s\": %.3f, \"threads\": %ld}\n",
           o->out, o->s.name, llmi_ttype_get(o->type)->name, o->s.n_layer,
           (unsigned long long)w.written, s, (double)w.written / s * 1e-9, o->threads);
    return 0;
}

/* Bytes a generated token reads: every tensor but token_embd when an
 * output matrix of its own exists (then one embedding row is read; with
 * tied embeddings token_embd is the LM head). Multiply-accumulates: the
 * elements of every 2-D tensor a token multiplies by, the LM head apart
 * (a prefill computes logits for its last row only). */
static int info(const char *path) {
    llmi_gguf *g;
    llm_status st = llmi_gguf_open(path, true, &g);
    if (st != LLM_OK)
        return fail(path, st);
    const llmi_gguf_tensor *out = llmi_gguf_find_tensor(g, "output.weight");
    const llmi_gguf_tensor *head = out ? out : llmi_gguf_find_tensor(g, "token_embd.weight");
    uint64_t total = 0, per_token = 0, params = 0, layer_macs = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const llmi_gguf_tensor *t = &g->tensors[i];
        uint64_t elems = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        bool embd = llmi_str_eq(t->name, "token_embd.weight");
        total += t->nbytes;
        params += elems;
        if (!(out && embd))
            per_token += t->nbytes;
        if (t->n_dims >= 2 && !embd && t != head)
            layer_macs += elems;
    }
    uint64_t head_macs = head ? head->ne[0] * head->ne[1] : 0;
    printf("{\"path\": \"%s\", \"weight_bytes\": %llu, \"bytes_per_token\": %llu, "
           "\"params\": %llu, \"layer_macs_per_token\": %llu, \"lm_head_macs\": %llu}\n",
           path, (unsigned long long)total, (unsigned long long)per_token,
           (unsigned long long)params, (unsigned long long)layer_macs,
           (unsigned long long)head_macs);
    llmi_gguf_close(g);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) {
        usage(rc < 0 ? stdout : stderr);
        return rc < 0 ? 0 : 1;
    }
    return o.info ? info(o.info) : write_model(&o);
}
