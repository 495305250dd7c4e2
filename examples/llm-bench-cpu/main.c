/* llm-bench-cpu: raw CPU speed of the engine on one model, through the
 * token-level API, and the machine's memory bandwidth. Each invocation
 * prints one JSON object on one line to stdout; scripts/bench-cpu.sh runs it
 * interleaved with the same measurements of llama.cpp
 * (scripts/bench_llamacpp.py) and reports medians and ratios
 * (docs/bench.md, "CPU speed versus llama.cpp").
 *
 *   llm-bench-cpu -m MODEL [-t N] [--no-mmap] [--pp N] [--tg N] ...
 *       pp:      one llm_session_decode of N prompt tokens (logits for the
 *                last row only), from an empty sequence;
 *       tg:      N decodes of one token each (logits every time) after a
 *                short prompt;
 *       batched: S sequences with a short prompt each, then steps of S rows
 *                (one token per sequence, logits on every row) per decode.
 *   llm-bench-cpu --bandwidth [-t N] [--size-mb MB]
 *       STREAM-style read (sum) and copy over MB-sized arrays, N threads.
 *
 * The model is opened a second time with the GGUF reader (a library
 * internal, so this tool links the static archive) to count the weight
 * bytes a generated token reads. Exit status: 0 ok, 1 usage, 2 runtime. */
#include <llm.h>

#include "gguf/gguf.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct options {
    const char *model;
    long threads;
    bool mmap;
    int kv; /* index into kv_types */
    long pp, tg, tg_prompt;
    long batch[8];
    int n_batch;
    long batch_steps, batch_prompt;
    bool bandwidth;
    long size_mb;
    double min_seconds;
    unsigned long long seed;
} options;

/* KV cache types: name, type, bytes per 32 elements. */
static const struct {
    const char *name;
    llm_kv_type type;
    unsigned bytes_per_32;
} kv_types[] = {{"f32", LLM_KV_F32, 128},  {"f16", LLM_KV_F16, 64},   {"bf16", LLM_KV_BF16, 64},
                {"q8_0", LLM_KV_Q8_0, 34}, {"q4_0", LLM_KV_Q4_0, 18}, {"fp8", LLM_KV_FP8_E4M3, 36}};

static void usage(FILE *f) {
    fprintf(f, "usage: llm-bench-cpu -m MODEL [options]\n"
               "       llm-bench-cpu --bandwidth [-t N] [--size-mb MB]\n"
               "  -m PATH            model file\n"
               "  -t N               threads (default 1)\n"
               "  --no-mmap          read the model into memory (default: map it)\n"
               "  --kv TYPE          KV cache type: f32, f16, bf16, q8_0, q4_0, fp8 (default f32)\n"
               "  --pp N             prompt tokens in one decode, 0 = skip (default 512)\n"
               "  --tg N             single-token decodes, 0 = skip (default 128)\n"
               "  --tg-prompt N      prompt before them (default 16)\n"
               "  --batch LIST       sequence counts for batched decode, comma-separated,\n"
               "                     0 = skip (default 1,8,32)\n"
               "  --batch-steps N    decodes per batched run (default 32)\n"
               "  --batch-prompt N   prompt tokens per sequence (default 16)\n"
               "  --seed S           token ids (default 1)\n"
               "  --bandwidth        measure memory bandwidth instead\n"
               "  --size-mb MB       array size of --bandwidth (default 2048)\n"
               "  --seconds S        least time per --bandwidth kernel (default 1.5)\n");
}

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !*s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->threads = 1;
    o->mmap = true;
    o->pp = 512;
    o->tg = 128;
    o->tg_prompt = 16;
    o->batch[0] = 1;
    o->batch[1] = 8;
    o->batch[2] = 32;
    o->n_batch = 3;
    o->batch_steps = 32;
    o->batch_prompt = 16;
    o->size_mb = 2048;
    o->min_seconds = 1.5;
    o->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        bool ok = true, takes = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--no-mmap")) {
            o->mmap = false;
            takes = false;
        } else if (!strcmp(a, "--bandwidth")) {
            o->bandwidth = true;
            takes = false;
        } else if (!v) {
            ok = false;
        } else if (!strcmp(a, "-m")) {
            o->model = v;
        } else if (!strcmp(a, "--kv")) {
            ok = false;
            for (int k = 0; k < (int)(sizeof kv_types / sizeof kv_types[0]); k++)
                if (!strcmp(v, kv_types[k].name)) {
                    o->kv = k;
                    ok = true;
                }
        } else if (!strcmp(a, "-t")) {
            ok = parse_long(v, 1, 512, &o->threads);
        } else if (!strcmp(a, "--pp")) {
            ok = parse_long(v, 0, 65536, &o->pp);
        } else if (!strcmp(a, "--tg")) {
            ok = parse_long(v, 0, 65536, &o->tg);
        } else if (!strcmp(a, "--tg-prompt")) {
            ok = parse_long(v, 1, 65536, &o->tg_prompt);
        } else if (!strcmp(a, "--batch-steps")) {
            ok = parse_long(v, 1, 65536, &o->batch_steps);
        } else if (!strcmp(a, "--batch-prompt")) {
            ok = parse_long(v, 1, 65536, &o->batch_prompt);
        } else if (!strcmp(a, "--size-mb")) {
            ok = parse_long(v, 1, 1 << 20, &o->size_mb);
        } else if (!strcmp(a, "--seconds")) {
            char *end;
            o->min_seconds = strtod(v, &end);
            ok = *v && !*end && o->min_seconds > 0 && o->min_seconds < 3600;
        } else if (!strcmp(a, "--seed")) {
            ok = parse_long(v, 0, __LONG_MAX__, &n);
            o->seed = (unsigned long long)n;
        } else if (!strcmp(a, "--batch")) {
            o->n_batch = 0;
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); ok && tok;
                 tok = strtok_r(NULL, ",", &save)) {
                ok = o->n_batch < 8 && parse_long(tok, 0, 4096, &n);
                if (ok && n > 0)
                    o->batch[o->n_batch++] = n;
            }
        } else {
            fprintf(stderr, "llm-bench-cpu: unknown option '%s'\n", a);
            usage(stderr);
            return 1;
        }
        if (!ok) {
            fprintf(stderr, "llm-bench-cpu: bad or missing value for '%s'\n", a);
            return 1;
        }
        if (takes)
            i++;
    }
    if (!o->bandwidth && !o->model) {
        fprintf(stderr, "llm-bench-cpu: -m MODEL is required\n");
        usage(stderr);
        return 1;
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of every thread of the process: on a shared machine wall time
 * also counts the time other processes had the cores. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wall and CPU seconds of one timed region. */
typedef struct timing {
    double wall, cpu;
} timing;

static timing timing_start(void) {
    timing t = {now_s(), cpu_s()};
    return t;
}

static timing timing_end(timing t0) {
    timing t = {now_s() - t0.wall, cpu_s() - t0.cpu};
    return t;
}

static int fail(const char *what, llm_status st) {
    fprintf(stderr, "llm-bench-cpu: %s: %s (%s)\n", what, llm_status_name(st), llm_last_error());
    return 2;
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* ---------------------------------------------------------------------- */
/* Memory bandwidth                                                         */
/* ---------------------------------------------------------------------- */

/* Read kernels: vector loads summed into independent accumulators, so the
 * loads, not the adds, are the limit. On this kind of VM a core's read
 * rate depends on the load width (fewer, wider loads keep more of the line
 * fills in flight), so the widest the CPU has is used, as the engines'
 * kernels do: AVX-512, else AVX2, else 16-byte vectors. */
typedef long long v2i __attribute__((vector_size(16)));

static long long read16(const unsigned char *p, size_t len) {
    const v2i *v = (const v2i *)(const void *)p;
    size_t n = len / (8 * sizeof(v2i));
    v2i a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (size_t i = 0; i < n; i++, v += 8) {
        a0 += v[0];
        a1 += v[1];
        a2 += v[2];
        a3 += v[3];
        a4 += v[4];
        a5 += v[5];
        a6 += v[6];
        a7 += v[7];
    }
    a0 += a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return a0[0] + a0[1];
}

#if defined(__x86_64__) && defined(__GNUC__)
typedef long long v4i __attribute__((vector_size(32)));
typedef long long v8i __attribute__((vector_size(64)));

__attribute__((target("avx2"))) static long long read32(const unsigned char *p, size_t len) {
    const v4i *v = (const v4i *)(const void *)p;
    size_t n = len / (4 * sizeof(v4i));
    v4i a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (size_t i = 0; i < n; i++, v += 4) {
        a0 += v[0];
        a1 += v[1];
        a2 += v[2];
        a3 += v[3];
    }
    a0 += a1 + a2 + a3;
    return a0[0] + a0[1] + a0[2] + a0[3];
}

__attribute__((target("avx512f"))) static long long read64(const unsigned char *p, size_t len) {
    const v8i *v = (const v8i *)(const void *)p;
    size_t n = len / (4 * sizeof(v8i));
    v8i a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (size_t i = 0; i < n; i++, v += 4) {
        a0 += v[0];
        a1 += v[1];
        a2 += v[2];
        a3 += v[3];
    }
    a0 += a1 + a2 + a3;
    long long s = 0;
    for (int i = 0; i < 8; i++)
        s += a0[i];
    return s;
}
#endif

typedef long long (*read_fn)(const unsigned char *, size_t);

static read_fn pick_read(const char **name) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *name = "avx512";
        return read64;
    }
    if (__builtin_cpu_supports("avx2")) {
        *name = "avx2";
        return read32;
    }
#endif
    *name = "vec16";
    return read16;
}

typedef struct bw_shared {
    pthread_barrier_t barrier;
    unsigned char *src, *dst;
    size_t bytes;
    int n_threads;
    int kernel; /* 0 read, 1 copy, -1 stop */
    read_fn read;
    double t0;
    long long sink;
} bw_shared;

typedef struct bw_thread {
    bw_shared *sh;
    int id;
    pthread_t tid;
    long long sum;
} bw_thread;

static void slice(const bw_shared *sh, int id, size_t *off, size_t *len) {
    size_t per = sh->bytes / (size_t)sh->n_threads / 256 * 256;
    *off = per * (size_t)id;
    *len = id == sh->n_threads - 1 ? sh->bytes - *off : per;
}

static void bw_work(bw_thread *t) {
    size_t off, len;
    slice(t->sh, t->id, &off, &len);
    if (t->sh->kernel == 0)
        t->sum += t->sh->read(t->sh->src + off, len);
    else
        memcpy(t->sh->dst + off, t->sh->src + off, len);
}

static void *bw_main(void *arg) {
    bw_thread *t = arg;
    for (;;) {
        pthread_barrier_wait(&t->sh->barrier);
        if (t->sh->kernel < 0)
            return NULL;
        bw_work(t);
        pthread_barrier_wait(&t->sh->barrier);
    }
}

typedef struct bw_result {
    double best_gbs, median_gbs;
    int passes;
} bw_result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs `kernel` pass after pass (thread 0 is the caller) for at least
 * min_seconds and 3 passes; GB/s per pass counts bytes read, plus bytes
 * written for copy (STREAM's convention). */
static bw_result bw_measure(bw_shared *sh, bw_thread *th, int kernel, double min_seconds) {
    double rates[4096];
    int n = -1; /* the first pass is a warm-up */
    double start = now_s();
    sh->kernel = kernel;
    double moved = (double)sh->bytes * (kernel == 1 ? 2.0 : 1.0);
    while (n < (int)(sizeof rates / sizeof rates[0]) && (n < 3 || now_s() - start < min_seconds)) {
        pthread_barrier_wait(&sh->barrier);
        double t0 = now_s();
        bw_work(&th[0]);
        pthread_barrier_wait(&sh->barrier);
        double dt = now_s() - t0;
        if (n >= 0)
            rates[n] = moved / dt / 1e9;
        n++;
    }
    qsort(rates, (size_t)n, sizeof rates[0], cmp_double);
    bw_result r = {rates[n - 1], rates[n / 2], n};
    return r;
}

static int run_bandwidth(const options *o) {
    bw_shared sh;
    memset(&sh, 0, sizeof sh);
    sh.bytes = (size_t)o->size_mb << 20;
    sh.n_threads = (int)o->threads;
    const char *read_name;
    sh.read = pick_read(&read_name);
    sh.src = aligned_alloc(4096, sh.bytes);
    sh.dst = aligned_alloc(4096, sh.bytes);
    if (!sh.src || !sh.dst) {
        fprintf(stderr, "llm-bench-cpu: cannot allocate 2 x %ld MiB\n", o->size_mb);
        return 2;
    }
    /* Real pages (an untouched buffer reads the shared zero page). */
    memset(sh.src, 1, sh.bytes);
    memset(sh.dst, 2, sh.bytes);
    pthread_barrier_init(&sh.barrier, NULL, (unsigned)sh.n_threads);
    bw_thread th[512];
    for (int i = 0; i < sh.n_threads; i++) {
        th[i].sh = &sh;
        th[i].id = i;
        th[i].sum = 0;
        if (i > 0 && pthread_create(&th[i].tid, NULL, bw_main, &th[i]) != 0) {
            fprintf(stderr, "llm-bench-cpu: pthread_create failed\n");
            return 2;
        }
    }
    bw_result rd = bw_measure(&sh, th, 0, o->min_seconds);
    bw_result cp = bw_measure(&sh, th, 1, o->min_seconds);
    sh.kernel = -1;
    pthread_barrier_wait(&sh.barrier);
    for (int i = 1; i < sh.n_threads; i++)
        pthread_join(th[i].tid, NULL);
    for (int i = 0; i < sh.n_threads; i++)
        sh.sink += th[i].sum;
    printf("{\"kind\": \"bandwidth\", \"threads\": %d, \"size_mb\": %ld, \"read_kernel\": \"%s\", "
           "\"read_gbs\": %.3f, \"read_gbs_median\": %.3f, \"read_passes\": %d, "
           "\"copy_gbs\": %.3f, \"copy_gbs_median\": %.3f, \"copy_passes\": %d, "
           "\"checksum\": %lld}\n",
           sh.n_threads, o->size_mb, read_name, rd.best_gbs, rd.median_gbs, rd.passes, cp.best_gbs,
           cp.median_gbs, cp.passes, sh.sink & 0xffff);
    pthread_barrier_destroy(&sh.barrier);
    free(sh.src);
    free(sh.dst);
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Engine                                                                   */
/* ---------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random ids away from the control tokens at the end of the vocabulary
 * (their ids do not change the work; the same ids go to llama.cpp). */
static llm_token rand_token(uint64_t *s, uint32_t n_vocab) {
    uint32_t hi = n_vocab > 512 ? n_vocab - 256 : n_vocab;
    return (llm_token)(rng_next(s) % hi);
}

/* Weight bytes one generated token reads: every tensor except token_embd
 * when an output matrix of its own exists (then only one row of the
 * embedding is read); with tied embeddings token_embd is the LM head. */
static llm_status weight_bytes_per_token(const char *path, uint64_t *total, uint64_t *per_token) {
    llmi_gguf *g;
    LLMI_TRY(llmi_gguf_open(path, true, &g));
    bool has_output = llmi_gguf_find_tensor(g, "output.weight") != NULL;
    *total = *per_token = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        *total += g->tensors[i].nbytes;
        if (!(has_output && llmi_str_eq(g->tensors[i].name, "token_embd.weight")))
            *per_token += g->tensors[i].nbytes;
    }
    llmi_gguf_close(g);
    return LLM_OK;
}

typedef struct engine {
    llm_session *session;
    llm_batch *batch;
    uint32_t n_vocab;
    uint64_t rng;
} engine;

/* Fills the batch with `n` rows of a fresh sequence starting at `pos`. */
static llm_status add_rows(engine *e, llm_seq_id seq, uint32_t pos, long n, bool last_logits) {
    for (long i = 0; i < n; i++)
        LLMI_TRY(llm_batch_add(e->batch, seq, pos + (uint32_t)i, rand_token(&e->rng, e->n_vocab),
                               !last_logits || i == n - 1));
    return LLM_OK;
}

/* One decode of `n` tokens into an empty sequence; returns its time. */
static llm_status run_pp(engine *e, long n, timing *tm) {
    llm_seq_id seq;
    LLMI_TRY(llm_seq_open(e->session, &seq));
    llm_batch_clear(e->batch);
    llm_status st = add_rows(e, seq, 0, n, true);
    timing t0 = timing_start();
    if (st == LLM_OK)
        st = llm_session_decode(e->session, e->batch);
    *tm = timing_end(t0);
    llm_seq_close(e->session, seq);
    return st;
}

/* A prompt, then `n` decodes of one token; returns the time of those. */
static llm_status run_tg(engine *e, long prompt, long n, timing *tm) {
    llm_seq_id seq;
    LLMI_TRY(llm_seq_open(e->session, &seq));
    llm_batch_clear(e->batch);
    llm_status st = add_rows(e, seq, 0, prompt, true);
    if (st == LLM_OK)
        st = llm_session_decode(e->session, e->batch);
    timing t0 = timing_start();
    for (long i = 0; st == LLM_OK && i < n; i++) {
        llm_batch_clear(e->batch);
        st = add_rows(e, seq, (uint32_t)(prompt + i), 1, false);
        if (st == LLM_OK)
            st = llm_session_decode(e->session, e->batch);
    }
    *tm = timing_end(t0);
    llm_seq_close(e->session, seq);
    return st;
}

/* `n_seq` sequences get `prompt` tokens each (one decode, untimed), then
 * `steps` decodes of one token per sequence; returns the seconds of those. */
static llm_status run_batched(engine *e, long n_seq, long prompt, long steps, timing *tm) {
    llm_seq_id seqs[4096];
    long opened = 0;
    llm_status st = LLM_OK;
    memset(tm, 0, sizeof *tm);
    while (st == LLM_OK && opened < n_seq)
        if ((st = llm_seq_open(e->session, &seqs[opened])) == LLM_OK)
            opened++;
    llm_batch_clear(e->batch);
    for (long s = 0; st == LLM_OK && s < n_seq; s++)
        st = add_rows(e, seqs[s], 0, prompt, true);
    if (st == LLM_OK)
        st = llm_session_decode(e->session, e->batch);
    timing t0 = timing_start();
    for (long i = 0; st == LLM_OK && i < steps; i++) {
        llm_batch_clear(e->batch);
        for (long s = 0; st == LLM_OK && s < n_seq; s++)
            st = add_rows(e, seqs[s], (uint32_t)(prompt + i), 1, false);
        if (st == LLM_OK)
            st = llm_session_decode(e->session, e->batch);
    }
    *tm = timing_end(t0);
    for (long s = 0; s < opened; s++)
        llm_seq_close(e->session, seqs[s]);
    return st;
}

static int run_engine(const options *o) {
    uint64_t total_bytes, per_token_bytes;
    llm_status st = weight_bytes_per_token(o->model, &total_bytes, &per_token_bytes);
    if (st != LLM_OK)
        return fail(o->model, st);

    llm_model_params mp;
    llm_model_params_init(&mp);
    mp.use_mmap = o->mmap;
    llm_model *model = NULL;
    double t0 = now_s();
    if ((st = llm_model_load(o->model, &mp, &model)) != LLM_OK)
        return fail(o->model, st);
    double load_s = now_s() - t0;
    llm_model_info info = {sizeof info};
    llm_model_get_info(model, &info);

    long max_batch = 1;
    for (int i = 0; i < o->n_batch; i++)
        if (o->batch[i] > max_batch)
            max_batch = o->batch[i];
    long ctx = o->pp + 1;
    if (o->tg_prompt + o->tg + 1 > ctx)
        ctx = o->tg_prompt + o->tg + 1;
    if (o->batch_prompt + o->batch_steps + 1 > ctx)
        ctx = o->batch_prompt + o->batch_steps + 1;
    long cap = o->pp > 64 ? o->pp : 64;
    if (max_batch * o->batch_prompt > cap)
        cap = max_batch * o->batch_prompt;

    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = (uint32_t)o->threads;
    sp.n_ctx = (uint32_t)ctx;
    sp.prefix_cache = false; /* every run computes all its tokens */
    sp.kv_type = kv_types[o->kv].type;
    engine e = {0};
    e.n_vocab = info.n_vocab;
    e.rng = o->seed;
    if ((st = llm_session_create(model, &sp, &e.session)) != LLM_OK ||
        (st = llm_batch_create((uint32_t)cap, &e.batch)) != LLM_OK) {
        llm_session_free(e.session);
        llm_model_free(model);
        return fail("session", st);
    }

    /* Warm-up: pages the weights in and grows every buffer once. */
    timing pp = {0, 0}, tg = {0, 0}, warm, bs[8];
    t0 = now_s();
    st = run_pp(&e, o->pp > 32 ? 32 : (o->pp > 0 ? o->pp : 8), &warm);
    if (st == LLM_OK)
        st = run_tg(&e, 4, 4, &warm);
    double warm_s = now_s() - t0;
    if (st == LLM_OK && o->pp > 0)
        st = run_pp(&e, o->pp, &pp);
    if (st == LLM_OK && o->tg > 0)
        st = run_tg(&e, o->tg_prompt, o->tg, &tg);
    for (int i = 0; st == LLM_OK && i < o->n_batch; i++)
        st = run_batched(&e, o->batch[i], o->batch_prompt, o->batch_steps, &bs[i]);
    llm_batch_free(e.batch);
    llm_session_free(e.session);
    if (st != LLM_OK) {
        llm_model_free(model);
        return fail("decode", st);
    }

    uint32_t head_dim = info.n_heads ? info.n_embd / info.n_heads : 0;
    printf("{\"kind\": \"run\", \"engine\": \"llminfer\", \"version\": ");
    json_str(stdout, llm_version_string());
    printf(", \"model\": ");
    json_str(stdout, o->model);
    printf(", \"threads\": %ld, \"mmap\": %s, \"kv_type\": \"%s\", \"load_s\": %.4f, "
           "\"warmup_s\": %.4f, \"n_params\": %llu, \"weight_bytes\": %llu, "
           "\"weight_bytes_per_token\": %llu, \"kv_bytes_per_pos\": %llu, \"n_vocab\": %u",
           o->threads, o->mmap ? "true" : "false", kv_types[o->kv].name, load_s, warm_s,
           (unsigned long long)info.n_params, (unsigned long long)total_bytes,
           (unsigned long long)per_token_bytes,
           (unsigned long long)info.n_layers * 2ull * info.n_kv_heads * head_dim *
               kv_types[o->kv].bytes_per_32 / 32,
           info.n_vocab);
    /* cpu_s: CPU seconds of all threads in the timed region. */
    if (o->pp > 0)
        printf(", \"pp_tokens\": %ld, \"pp_s\": %.6f, \"pp_cpu_s\": %.6f, \"pp_tok_s\": %.4f",
               o->pp, pp.wall, pp.cpu, (double)o->pp / pp.wall);
    if (o->tg > 0)
        printf(", \"tg_prompt\": %ld, \"tg_tokens\": %ld, \"tg_s\": %.6f, \"tg_cpu_s\": %.6f, "
               "\"tg_tok_s\": %.4f",
               o->tg_prompt, o->tg, tg.wall, tg.cpu, (double)o->tg / tg.wall);
    printf(", \"batch_prompt\": %ld, \"batch_steps\": %ld, \"batched\": [", o->batch_prompt,
           o->batch_steps);
    for (int i = 0; i < o->n_batch; i++)
        printf("%s{\"n_seq\": %ld, \"s\": %.6f, \"cpu_s\": %.6f, \"tok_s\": %.4f}", i ? ", " : "",
               o->batch[i], bs[i].wall, bs[i].cpu,
               (double)(o->batch[i] * o->batch_steps) / bs[i].wall);
    printf("]}\n");
    llm_model_free(model);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    return o.bandwidth ? run_bandwidth(&o) : run_engine(&o);
}
