/* llm-devbench: a model's speed on one backend through the token-level
 * API, for `make device-check` (docs/device-check.md). Uses llm.h only, so
 * it loads backends as any program does.
 *
 *   llm-devbench -m MODEL [--device NAME] [--tg N] [--pp N]
 *                [--batch LIST] [--batch-steps N] [--identity N]
 *                [--long-pp N] [--long-decode SxP]
 *                [--profile tg|pp|long_pp|long_decode|batched]
 *
 * In order, in one process:
 *   load-to-first-token: llm_model_load, llm_session_create_ex (a GPU
 *     uploads the weights there) and the decode of a 16-token prompt up to
 *     its logits, each timed, from a cold start of this process;
 *   tg:      N decodes of one token (logits every time) after a 16-token
 *            prompt, batch 1;
 *   pp:      one llm_session_decode of N prompt tokens (logits for the last
 *            row), from an empty sequence;
 *   batched: S sequences with a 16-token prompt each (untimed), then
 *            steps of S rows, one token per sequence, logits on every row
 *            (what a caller needs to pick each sequence's next token);
 *   long_pp: one prompt of N tokens (--long-pp) up to its logits, in one
 *            decode: the time to first token of a long prompt, with the
 *            causal attention's multiply-adds counted (attn_flop);
 *   long_decode: S sequences each holding a P-token prompt (--long-decode
 *            SxP; the prompts untimed), then steps of S rows: the KV each
 *            step reads (kv_bytes_per_step) against the step's time;
 *   identity: greedy decoding of one prompt alone, then of the same prompt
 *            as one of N sequences decoded together: the tokens must
 *            match (whether the first logits match bit for bit is
 *            reported too); it runs before the batched decodes, which
 *            take longest.
 * Prints
 * a JSON object per measurement, one a line, as each ends ("phase": load,
 * tg, pp, identity, batched). Exit status: 0 ok, 1 usage, 2 runtime error,
 * 3 the identity check failed.
 *
 * --profile PHASE brackets that phase's timed part (the decodes, not the
 * prompts before them) with the CUDA driver's cuProfilerStart/Stop, found
 * with dlopen, so that Nsight Compute run with --profile-from-start off
 * sees only those kernels (scripts/device-profile.sh). */
#define LLM_EXPERIMENTAL
#include <llm.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PROMPT = 16, MAX_BATCHES = 8, IDENTITY_TOKENS = 24 };

typedef struct options {
    const char *model, *device;
    long tg, pp, batch[MAX_BATCHES], batch_steps, identity;
    long long_pp, long_seqs, long_ctx; /* --long-pp N, --long-decode SxP */
    int n_batch;
    llm_kv_type kv_type;
    unsigned long long seed;
    const char *profile; /* phase bracketed for a profiler, or NULL */
} options;

/* ---- profiler bracketing (--profile) ---- */

typedef int (*cu_profiler_fn)(void);
static cu_profiler_fn g_prof_start, g_prof_stop;
static const char *g_prof_phase; /* the phase to bracket */
static const char *g_phase = ""; /* the phase running now */

/* Finds cuProfilerStart/Stop in the driver; false with a message if not. */
static bool profiler_open(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cuda) {
        g_prof_start = (cu_profiler_fn)(uintptr_t)dlsym(cuda, "cuProfilerStart");
        g_prof_stop = (cu_profiler_fn)(uintptr_t)dlsym(cuda, "cuProfilerStop");
    }
    if (!g_prof_start || !g_prof_stop) {
        fprintf(stderr, "llm-devbench: --profile needs the CUDA driver (libcuda.so.1): %s\n",
                cuda ? "no cuProfilerStart in it" : dlerror());
        return false;
    }
    return true;
}
static void profile_mark(bool start) {
    if (g_prof_phase && !strcmp(g_prof_phase, g_phase)) {
        int r = (start ? g_prof_start : g_prof_stop)();
        if (r != 0)
            fprintf(stderr, "llm-devbench: cuProfiler%s returned %d\n", start ? "Start" : "Stop",
                    r);
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: llm-devbench -m MODEL [options]\n"
               "  --device NAME     backend (default cpu)\n"
               "  --tg N            batch-1 decodes after a 16-token prompt, 0 = skip (64)\n"
               "  --pp N            prompt tokens in one decode, 0 = skip (2048)\n"
               "  --batch LIST      sequence counts of batched decode, comma-separated,\n"
               "                    0 = skip (8,64,256)\n"
               "  --batch-steps N   decodes per batched run (16)\n"
               "  --identity N      alone vs in a batch of N sequences, 0 = skip (64)\n"
               "  --long-pp N       time to first token of one N-token prompt, 0 = skip (0)\n"
               "  --long-decode SxP S sequences holding P-token prompts, then\n"
               "                    --batch-steps steps of S rows, 0 = skip (0)\n"
               "  --kv f32|f16|bf16 KV cache type (bf16)\n"
               "  --seed S          token ids (1)\n"
               "  --profile PHASE   bracket tg, pp, long_pp, long_decode or batched with\n"
               "                    cuProfilerStart/Stop\n");
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

static bool parse_list(const char *s, options *o) {
    o->n_batch = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > 4096 || o->n_batch == MAX_BATCHES)
            return false;
        if (v)
            o->batch[o->n_batch++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return false;
    }
    return true;
}

/* "SxP" (or "0"): S sequences of P prompt tokens each. */
static bool parse_shape(const char *s, options *o) {
    if (!strcmp(s, "0")) {
        o->long_seqs = o->long_ctx = 0;
        return true;
    }
    const char *x = strchr(s, 'x');
    char seqs[16];
    if (!x || x == s || (size_t)(x - s) >= sizeof seqs)
        return false;
    memcpy(seqs, s, (size_t)(x - s));
    seqs[x - s] = '\0';
    return parse_long(seqs, 1, 4096, &o->long_seqs) && parse_long(x + 1, 1, 1 << 20, &o->long_ctx);
}

static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->tg = 64;
    o->pp = 2048;
    o->batch_steps = 16;
    o->identity = 64;
    o->kv_type = LLM_KV_BF16;
    o->seed = 1;
    parse_list("8,64,256", o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return -1;
        if (!v) {
            fprintf(stderr, "llm-devbench: unknown option or missing value: %s\n", a);
            return 1;
        }
        bool ok = true;
        if (!strcmp(a, "-m"))
            o->model = v;
        else if (!strcmp(a, "--device"))
            o->device = v;
        else if (!strcmp(a, "--tg"))
            ok = parse_long(v, 0, 1 << 16, &o->tg);
        else if (!strcmp(a, "--pp"))
            ok = parse_long(v, 0, 1 << 16, &o->pp);
        else if (!strcmp(a, "--batch"))
            ok = parse_list(v, o);
        else if (!strcmp(a, "--batch-steps"))
            ok = parse_long(v, 1, 1 << 16, &o->batch_steps);
        else if (!strcmp(a, "--long-pp"))
            ok = parse_long(v, 0, 1 << 20, &o->long_pp);
        else if (!strcmp(a, "--long-decode"))
            ok = parse_shape(v, o);
        else if (!strcmp(a, "--identity"))
            ok = parse_long(v, 0, 4096, &o->identity);
        else if (!strcmp(a, "--kv")) {
            o->kv_type = !strcmp(v, "f32")    ? LLM_KV_F32
                         : !strcmp(v, "f16")  ? LLM_KV_F16
                         : !strcmp(v, "bf16") ? LLM_KV_BF16
                                              : (llm_kv_type)-1;
            ok = (int)o->kv_type >= 0;
        } else if (!strcmp(a, "--profile")) {
            o->profile = v;
            ok = !strcmp(v, "tg") || !strcmp(v, "pp") || !strcmp(v, "long_pp") ||
                 !strcmp(v, "long_decode") || !strcmp(v, "batched");
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            ok = !errno && *v && !*end;
        } else {
            fprintf(stderr, "llm-devbench: unknown option '%s'\n", a);
            return 1;
        }
        if (!ok) {
            fprintf(stderr, "llm-devbench: bad value '%s' for %s\n", v, a);
            return 1;
        }
        i++;
    }
    if (!o->model) {
        fprintf(stderr, "llm-devbench: -m MODEL is required\n");
        return 1;
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct bench {
    llm_session *session;
    llm_batch *batch;
    uint32_t n_vocab;
    uint64_t rng;
} bench;

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random ids below the control tokens that end most vocabularies. */
static llm_token rand_token(bench *b) {
    uint32_t hi = b->n_vocab > 512 ? b->n_vocab - 256 : b->n_vocab;
    return (llm_token)(rng_next(&b->rng) % hi);
}

static llm_token argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (llm_token)best;
}

/* Opens `n` sequences and decodes a random PROMPT-token prompt into each
 * (logits on each one's last row). */
static llm_status open_prompts(bench *b, llm_seq_id *seqs, long n, long *opened) {
    llm_status st = LLM_OK;
    *opened = 0;
    while (st == LLM_OK && *opened < n)
        if ((st = llm_seq_open(b->session, &seqs[*opened])) == LLM_OK)
            ++*opened;
    llm_batch_clear(b->batch);
    for (long s = 0; st == LLM_OK && s < n; s++)
        for (uint32_t p = 0; st == LLM_OK && p < PROMPT; p++)
            st = llm_batch_add(b->batch, seqs[s], p, rand_token(b), p == PROMPT - 1);
    return st == LLM_OK ? llm_session_decode(b->session, b->batch) : st;
}

static void close_all(bench *b, const llm_seq_id *seqs, long n) {
    for (long s = 0; s < n; s++)
        llm_seq_close(b->session, seqs[s]);
}

/* `n_seq` sequences, then `steps` decodes of one token each; seconds of those. */
static llm_status run_decode(bench *b, long n_seq, long steps, double *secs) {
    llm_seq_id *seqs = calloc((size_t)n_seq, sizeof *seqs);
    if (!seqs)
        return LLM_ERR_OUT_OF_MEMORY;
    long opened;
    llm_status st = open_prompts(b, seqs, n_seq, &opened);
    const float *lg;
    if (st == LLM_OK && steps) /* the prompts' work ends before the mark */
        st = llm_session_logits(b->session, (uint32_t)(n_seq * PROMPT - 1), &lg);
    profile_mark(true);
    double t0 = now_s();
    for (long i = 0; st == LLM_OK && i < steps; i++) {
        llm_batch_clear(b->batch);
        for (long s = 0; st == LLM_OK && s < n_seq; s++)
            st = llm_batch_add(b->batch, seqs[s], (uint32_t)(PROMPT + i), rand_token(b), true);
        if (st == LLM_OK)
            st = llm_session_decode(b->session, b->batch);
    }
    /* Reading the last logits waits for a backend that returns early. */
    uint32_t last = steps ? (uint32_t)(n_seq - 1) : (uint32_t)(n_seq * PROMPT - 1);
    if (st == LLM_OK)
        st = llm_session_logits(b->session, last, &lg);
    *secs = now_s() - t0;
    profile_mark(false);
    close_all(b, seqs, opened);
    free(seqs);
    return st;
}

static llm_status run_pp(bench *b, long n, double *secs) {
    llm_seq_id seq;
    llm_status st = llm_seq_open(b->session, &seq);
    if (st != LLM_OK)
        return st;
    llm_batch_clear(b->batch);
    for (long i = 0; st == LLM_OK && i < n; i++)
        st = llm_batch_add(b->batch, seq, (uint32_t)i, rand_token(b), i == n - 1);
    profile_mark(true);
    double t0 = now_s();
    const float *lg;
    if (st == LLM_OK)
        st = llm_session_decode(b->session, b->batch);
    if (st == LLM_OK)
        st = llm_session_logits(b->session, (uint32_t)(n - 1), &lg);
    *secs = now_s() - t0;
    profile_mark(false);
    llm_seq_close(b->session, seq);
    return st;
}

/* `n_seq` sequences each given a `ctx`-token prompt (one decode per
 * sequence, untimed), then `steps` decodes of one token per sequence;
 * seconds of those. */
static llm_status run_long_decode(bench *b, long n_seq, long ctx, long steps, double *secs) {
    llm_seq_id *seqs = calloc((size_t)n_seq, sizeof *seqs);
    if (!seqs)
        return LLM_ERR_OUT_OF_MEMORY;
    llm_status st = LLM_OK;
    long opened = 0;
    const float *lg;
    for (long s = 0; st == LLM_OK && s < n_seq; s++) {
        if ((st = llm_seq_open(b->session, &seqs[s])) != LLM_OK)
            break;
        opened++;
        llm_batch_clear(b->batch);
        for (long p = 0; st == LLM_OK && p < ctx; p++)
            st = llm_batch_add(b->batch, seqs[s], (uint32_t)p, rand_token(b), p == ctx - 1);
        if (st == LLM_OK)
            st = llm_session_decode(b->session, b->batch);
    }
    if (st == LLM_OK) /* the prompts' work ends before the clock starts */
        st = llm_session_logits(b->session, (uint32_t)(ctx - 1), &lg);
    profile_mark(true);
    double t0 = now_s();
    for (long i = 0; st == LLM_OK && i < steps; i++) {
        llm_batch_clear(b->batch);
        for (long s = 0; st == LLM_OK && s < n_seq; s++)
            st = llm_batch_add(b->batch, seqs[s], (uint32_t)(ctx + i), rand_token(b), true);
        if (st == LLM_OK)
            st = llm_session_decode(b->session, b->batch);
    }
    if (st == LLM_OK)
        st = llm_session_logits(b->session, (uint32_t)(n_seq - 1), &lg);
    *secs = now_s() - t0;
    profile_mark(false);
    close_all(b, seqs, opened);
    free(seqs);
    return st;
}

/* Greedy tokens of sequence `target` among `n` sequences decoded together;
 * the others get random prompts. first_logits gets the target's first
 * logits row. */
static llm_status greedy(bench *b, const llm_token *prompt, long n, long target, llm_token *out,
                         float *first_logits) {
    llm_seq_id *seqs = calloc((size_t)n, sizeof *seqs);
    llm_token *next = calloc((size_t)n, sizeof *next);
    llm_status st = seqs && next ? LLM_OK : LLM_ERR_OUT_OF_MEMORY;
    long opened = 0;
    while (st == LLM_OK && opened < n)
        if ((st = llm_seq_open(b->session, &seqs[opened])) == LLM_OK)
            opened++;
    llm_batch_clear(b->batch);
    for (long s = 0; st == LLM_OK && s < n; s++)
        for (uint32_t p = 0; st == LLM_OK && p < PROMPT; p++)
            st = llm_batch_add(b->batch, seqs[s], p, s == target ? prompt[p] : rand_token(b),
                               p == PROMPT - 1);
    if (st == LLM_OK)
        st = llm_session_decode(b->session, b->batch);
    for (int t = 0; st == LLM_OK && t < IDENTITY_TOKENS; t++) {
        for (long s = 0; st == LLM_OK && s < n; s++) {
            const float *lg;
            uint32_t row = t == 0 ? (uint32_t)(s * PROMPT + PROMPT - 1) : (uint32_t)s;
            if ((st = llm_session_logits(b->session, row, &lg)) != LLM_OK)
                break;
            next[s] = argmax(lg, b->n_vocab);
            if (s == target && t == 0)
                memcpy(first_logits, lg, b->n_vocab * sizeof *lg);
        }
        if (st != LLM_OK)
            break;
        out[t] = next[target];
        llm_batch_clear(b->batch);
        for (long s = 0; st == LLM_OK && s < n; s++)
            st = llm_batch_add(b->batch, seqs[s], (uint32_t)(PROMPT + t), next[s], true);
        if (st == LLM_OK)
            st = llm_session_decode(b->session, b->batch);
    }
    if (seqs)
        close_all(b, seqs, opened);
    free(seqs);
    free(next);
    return st;
}

/* 1 when identical, 0 when not, -1 on error (st set). */
static int run_identity(bench *b, long n, llm_status *st, int *first_diff, bool *logits_equal) {
    llm_token prompt[PROMPT], alone[IDENTITY_TOKENS], batched[IDENTITY_TOKENS];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = rand_token(b);
    float *la = malloc(b->n_vocab * sizeof *la), *lb = malloc(b->n_vocab * sizeof *lb);
    *st = la && lb ? LLM_OK : LLM_ERR_OUT_OF_MEMORY;
    if (*st == LLM_OK)
        *st = greedy(b, prompt, 1, 0, alone, la);
    if (*st == LLM_OK)
        *st = greedy(b, prompt, n, n / 2 + 1 < n ? n / 2 + 1 : 0, batched, lb);
    int r = -1;
    if (*st == LLM_OK) {
        *first_diff = -1;
        for (int i = IDENTITY_TOKENS - 1; i >= 0; i--)
            if (alone[i] != batched[i])
                *first_diff = i;
        *logits_equal = memcmp(la, lb, b->n_vocab * sizeof *la) == 0;
        r = *first_diff < 0;
    }
    free(la);
    free(lb);
    return r;
}

/* One measurement as a line of its own, written at once: a run stopped by a
 * timeout keeps what it measured before. */
static void phase(const char *name, long n_seq, long tokens, double secs, double tok_s) {
    printf("{\"phase\": \"%s\", \"n_seq\": %ld, \"tokens\": %ld, \"s\": %.6f, "
           "\"tok_s\": %.3f}\n",
           name, n_seq, tokens, secs, tok_s);
    fflush(stdout);
}

static int fail(const char *what, llm_status st) {
    fprintf(stderr, "llm-devbench: %s: %s: %s\n", what, llm_status_name(st), llm_last_error());
    return 2;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) {
        usage(rc < 0 ? stdout : stderr);
        return rc < 0 ? 0 : 1;
    }
    if (o.profile && !profiler_open())
        return 2;
    g_prof_phase = o.profile;
    long max_batch = o.identity > 1 ? o.identity : 1;
    for (int i = 0; i < o.n_batch; i++)
        if (o.batch[i] > max_batch)
            max_batch = o.batch[i];
    long ctx = PROMPT + 1 + (o.tg > o.batch_steps ? o.tg : o.batch_steps);
    if (ctx < PROMPT + IDENTITY_TOKENS + 1)
        ctx = PROMPT + IDENTITY_TOKENS + 1;
    if (o.pp + 1 > ctx)
        ctx = o.pp + 1;
    if (o.long_pp + 1 > ctx)
        ctx = o.long_pp + 1;
    if (o.long_seqs && o.long_ctx + o.batch_steps + 1 > ctx)
        ctx = o.long_ctx + o.batch_steps + 1;
    long rows = max_batch * PROMPT > o.pp ? max_batch * PROMPT : o.pp;
    if (o.long_pp > rows)
        rows = o.long_pp;
    if (o.long_ctx > rows)
        rows = o.long_ctx;
    if (o.long_seqs > rows)
        rows = o.long_seqs;

    double t0 = now_s();
    llm_model_params mp;
    llm_model_params_init(&mp);
    llm_model *model = NULL;
    llm_status st = llm_model_load(o.model, &mp, &model);
    if (st != LLM_OK)
        return fail(o.model, st);
    double load_s = now_s() - t0;
    llm_model_info info = {sizeof info};
    llm_model_get_info(model, &info);

    uint64_t head_dim = info.n_heads ? info.n_embd / info.n_heads : 0;
    uint64_t kv_elem = o.kv_type == LLM_KV_F32 ? 4 : 2;
    uint64_t kv_per_pos = (uint64_t)info.n_layers * 2 * info.n_kv_heads * head_dim * kv_elem;
    /* Room for the largest run at once: the batched sequences, each to its
     * last step plus a partly filled block (16 slots), or the batch-1 runs. */
    long steps = o.batch_steps > IDENTITY_TOKENS ? o.batch_steps : IDENTITY_TOKENS;
    long single = o.pp > o.tg + PROMPT ? o.pp : o.tg + PROMPT;
    uint64_t positions = (uint64_t)max_batch * (uint64_t)(PROMPT + steps + 17);
    if ((uint64_t)single + 64 > positions)
        positions = (uint64_t)single + 64;
    if ((uint64_t)o.long_pp + 64 > positions)
        positions = (uint64_t)o.long_pp + 64;
    /* Each long sequence to its last step, plus a partly filled block. */
    uint64_t long_positions = (uint64_t)o.long_seqs * (uint64_t)(o.long_ctx + o.batch_steps + 17);
    if (long_positions > positions)
        positions = long_positions;
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_ctx = (uint32_t)ctx;
    sp.max_batch_tokens = (uint32_t)rows;
    sp.prefix_cache = false; /* every run computes all of its tokens */
    sp.kv_type = o.kv_type;
    sp.kv_cache_bytes = positions * kv_per_pos;
    llm_device_params dp;
    llm_device_params_init(&dp);
    dp.backend = o.device;
    bench b = {.n_vocab = info.n_vocab, .rng = o.seed};
    double t1 = now_s();
    if ((st = llm_session_create_ex(model, &sp, &dp, &b.session)) != LLM_OK) {
        llm_model_free(model);
        return fail("creating the session", st);
    }
    double session_s = now_s() - t1;
    if ((st = llm_batch_create((uint32_t)rows, &b.batch)) != LLM_OK) {
        llm_session_free(b.session);
        llm_model_free(model);
        return fail("batch", st);
    }
    double first_s = 0, secs = 0;
    t1 = now_s();
    st = run_decode(&b, 1, 0, &first_s);
    first_s = now_s() - t1;
    int same = 1;
    if (st == LLM_OK) {
        printf("{\"phase\": \"load\", \"model\": \"%s\", \"device\": \"%s\", "
               "\"kv_type\": \"%s\", \"n_params\": %llu, \"load_s\": %.4f, "
               "\"session_s\": %.4f, \"first_decode_s\": %.4f, "
               "\"load_to_first_token_s\": %.4f}\n",
               o.model, o.device ? o.device : "cpu",
               o.kv_type == LLM_KV_F32   ? "f32"
               : o.kv_type == LLM_KV_F16 ? "f16"
                                         : "bf16",
               (unsigned long long)info.n_params, load_s, session_s, first_s, now_s() - t0);
        fflush(stdout);
        st = run_decode(&b, 1, 4, &secs); /* grows every buffer once */
    }
    g_phase = "tg";
    if (st == LLM_OK && o.tg && (st = run_decode(&b, 1, o.tg, &secs)) == LLM_OK)
        phase("tg", 1, o.tg, secs, o.tg / secs);
    g_phase = "pp";
    if (st == LLM_OK && o.pp && (st = run_pp(&b, o.pp, &secs)) == LLM_OK)
        phase("pp", 1, o.pp, secs, o.pp / secs);
    g_phase = "long_pp";
    if (st == LLM_OK && o.long_pp && (st = run_pp(&b, o.long_pp, &secs)) == LLM_OK) {
        /* Causal attention: query i meets i + 1 keys, once for Q.K and once
         * for P.V, in every head of every layer; 2 flops a multiply-add.
         * (No sliding window: the synthetic shapes have none.) */
        double n = (double)o.long_pp;
        double attn_flop =
            2.0 * 2.0 * info.n_layers * info.n_heads * (double)head_dim * (n * (n + 1) / 2);
        printf("{\"phase\": \"long_pp\", \"n_seq\": 1, \"tokens\": %ld, \"s\": %.6f, "
               "\"tok_s\": %.3f, \"attn_flop\": %.0f}\n",
               o.long_pp, secs, n / secs, attn_flop);
        fflush(stdout);
    }
    g_phase = "long_decode";
    if (st == LLM_OK && o.long_seqs &&
        (st = run_long_decode(&b, o.long_seqs, o.long_ctx, o.batch_steps, &secs)) == LLM_OK) {
        /* Step i reads positions 0 .. ctx + i of every sequence. */
        double kv_step = (double)o.long_seqs * ((double)o.long_ctx + (o.batch_steps + 1) / 2.0) *
                         (double)kv_per_pos;
        long tokens = o.long_seqs * o.batch_steps;
        printf("{\"phase\": \"long_decode\", \"n_seq\": %ld, \"ctx\": %ld, \"tokens\": %ld, "
               "\"s\": %.6f, \"tok_s\": %.3f, \"kv_bytes_per_step\": %.0f, "
               "\"kv_gbs\": %.3f}\n",
               o.long_seqs, o.long_ctx, tokens, secs, tokens / secs, kv_step,
               kv_step * o.batch_steps / secs / 1e9);
        fflush(stdout);
    }
    g_phase = "identity";
    if (st == LLM_OK && o.identity) {
        int first_diff = -1;
        bool logits_equal = false;
        same = run_identity(&b, o.identity, &st, &first_diff, &logits_equal);
        if (st == LLM_OK) {
            printf("{\"phase\": \"identity\", \"n_seq\": %ld, \"tokens\": %d, "
                   "\"same\": %s, \"first_diff\": %d, \"first_logits_bitwise\": %s}\n",
                   o.identity, IDENTITY_TOKENS, same ? "true" : "false", first_diff,
                   logits_equal ? "true" : "false");
            fflush(stdout);
        }
        if (same == 0)
            fprintf(stderr,
                    "llm-devbench: a sequence decoded in a batch of %ld differs from it "
                    "decoded alone (first at token %d)\n",
                    o.identity, first_diff);
    }
    g_phase = "batched";
    for (int i = 0; st == LLM_OK && i < o.n_batch; i++)
        if ((st = run_decode(&b, o.batch[i], o.batch_steps, &secs)) == LLM_OK)
            phase("batched", o.batch[i], o.batch[i] * o.batch_steps, secs,
                  o.batch[i] * o.batch_steps / secs);
    llm_batch_free(b.batch);
    llm_session_free(b.session);
    llm_model_free(model);
    if (st != LLM_OK)
        return fail("decoding", st);
    return same ? 0 : 3;
}
