/* llm-bench: synthetic workload and the run loop (continuous or static
 * batching) with its measurements. */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- helpers ---- */

const char *bench_mode_name(bench_mode m) { return m == MODE_STATIC ? "static" : "continuous"; }

int bench_fail(const char *what, llm_status st) {
    fprintf(stderr, "llm-bench: %s: %s: %s\n", what, llm_status_name(st), llm_last_error());
    return 2;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    if (s <= 0)
        return;
    struct timespec t;
    t.tv_sec = (time_t)s;
    t.tv_nsec = (long)((s - (double)t.tv_sec) * 1e9);
    nanosleep(&t, NULL);
}

/* splitmix64: small, seedable, the same on every platform. */
static uint64_t rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_unit(uint64_t *state) { return (double)(rng_next(state) >> 11) * 0x1.0p-53; }

/* Uniform in [lo, hi]. */
static long rng_range(uint64_t *state, long lo, long hi) {
    if (hi <= lo)
        return lo;
    return lo + (long)(rng_next(state) % (uint64_t)(hi - lo + 1));
}

/* ---- workload ---- */

int bench_workload_make(const llm_model *model, const bench_opts *o, bench_workload *w) {
    memset(w, 0, sizeof *w);
    llm_model_info info = {sizeof info};
    llm_status st = llm_model_get_info(model, &info);
    if (st != LLM_OK)
        return bench_fail("reading the model info", st);
    /* Random ids away from both ends of the vocabulary, where control
     * tokens (BOS, EOS, chat markers) and byte tokens usually live. */
    long tok_lo = 0, tok_hi = (long)info.n_vocab - 1;
    if (info.n_vocab > 700) {
        tok_lo = 300;
        tok_hi = (long)info.n_vocab - 301;
    }
    uint64_t rng = o->seed ^ 0x6c6c6d2d62656e63ull; /* "llm-benc" */
    size_t n = (size_t)o->requests;
    w->req = calloc(n ? n : 1, sizeof *w->req);
    llm_token *prefix = calloc(o->prefix_len > 0 ? (size_t)o->prefix_len : 1, sizeof *prefix);
    bool *shared = calloc(n ? n : 1, sizeof *shared);
    if (!w->req || !prefix || !shared) {
        free(prefix);
        free(shared);
        fprintf(stderr, "llm-bench: out of memory\n");
        return 2;
    }
    w->n = n;
    for (long i = 0; i < o->prefix_len; i++)
        prefix[i] = (llm_token)rng_range(&rng, tok_lo, tok_hi);
    /* Exactly round(F * N) requests share the prefix, chosen at random. */
    size_t n_shared = 0;
    if (o->prefix_len > 0 && o->prefix_frac > 0) {
        n_shared = (size_t)floor(o->prefix_frac * (double)n + 0.5);
        if (n_shared > n)
            n_shared = n;
        size_t *idx = malloc((n ? n : 1) * sizeof *idx);
        if (!idx) {
            free(prefix);
            free(shared);
            fprintf(stderr, "llm-bench: out of memory\n");
            return 2;
        }
        for (size_t i = 0; i < n; i++)
            idx[i] = i;
        for (size_t i = 0; i < n_shared; i++) {
            size_t j = i + (size_t)(rng_next(&rng) % (uint64_t)(n - i));
            size_t t = idx[i];
            idx[i] = idx[j];
            idx[j] = t;
            shared[idx[i]] = true;
        }
        free(idx);
    }
    double t = 0;
    for (size_t i = 0; i < n; i++) {
        bench_request *q = &w->req[i];
        uint32_t own = (uint32_t)rng_range(&rng, o->prompt_len.lo, o->prompt_len.hi);
        q->shared = shared[i];
        q->n_prompt = own + (q->shared ? (uint32_t)o->prefix_len : 0);
        q->n_output = (uint32_t)rng_range(&rng, o->output_len.lo, o->output_len.hi);
        q->prompt = malloc((q->n_prompt ? q->n_prompt : 1) * sizeof *q->prompt);
        if (!q->prompt) {
            free(prefix);
            free(shared);
            fprintf(stderr, "llm-bench: out of memory\n");
            return 2;
        }
        uint32_t k = 0;
        if (q->shared)
            for (; k < (uint32_t)o->prefix_len; k++)
                q->prompt[k] = prefix[k];
        for (; k < q->n_prompt; k++)
            q->prompt[k] = (llm_token)rng_range(&rng, tok_lo, tok_hi);
        /* Poisson process: exponential gaps with mean 1/rate. */
        if (o->arrival_rate > 0)
            t += -log(1.0 - rng_unit(&rng)) / o->arrival_rate;
        q->arrival = t;
        w->prompt_tokens += q->n_prompt;
        w->output_tokens += q->n_output;
        w->shared_requests += q->shared;
    }
    free(prefix);
    free(shared);
    return 0;
}

void bench_workload_free(bench_workload *w) {
    for (size_t i = 0; w->req && i < w->n; i++)
        free(w->req[i].prompt);
    free(w->req);
    memset(w, 0, sizeof *w);
}

/* ---- statistics ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentiles with linear interpolation between closest ranks (as numpy's
 * default). Sorts `v`. */
static bench_pct percentiles(double *v, size_t n) {
    bench_pct p = {NAN, NAN, NAN, NAN, n};
    if (n == 0)
        return p;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    p.mean = sum / (double)n;
    double q[3] = {0.50, 0.95, 0.99}, *out[3] = {&p.p50, &p.p95, &p.p99};
    for (int k = 0; k < 3; k++) {
        double pos = q[k] * (double)(n - 1);
        size_t i = (size_t)pos;
        double frac = pos - (double)i;
        *out[k] = i + 1 < n ? v[i] + (v[i + 1] - v[i]) * frac : v[n - 1];
    }
    return p;
}

/* ---- run ---- */

typedef struct req_state {
    llm_request_id id;
    double first_t, last_t, end_t; /* seconds after start */
    uint32_t n_tokens;
    bool submitted, finished;
} req_state;

/* Open-addressing map from request id to workload index. */
typedef struct id_map {
    llm_request_id *keys;
    size_t *vals;
    size_t mask;
} id_map;

static bool id_map_init(id_map *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    m->mask = cap - 1;
    return m->keys && m->vals;
}

static void id_map_put(id_map *m, llm_request_id id, size_t v) {
    size_t h = (size_t)(id * 0x9e3779b97f4a7c15ull) & m->mask;
    while (m->keys[h])
        h = (h + 1) & m->mask;
    m->keys[h] = id;
    m->vals[h] = v;
}

static bool id_map_get(const id_map *m, llm_request_id id, size_t *v) {
    if (id == 0)
        return false;
    size_t h = (size_t)(id * 0x9e3779b97f4a7c15ull) & m->mask;
    while (m->keys[h]) {
        if (m->keys[h] == id) {
            *v = m->vals[h];
            return true;
        }
        h = (h + 1) & m->mask;
    }
    return false;
}

/* A short request in a throwaway session, so that the first measured run
 * does not pay for page faults in the weights. */
int bench_warmup(const llm_model *model, const bench_opts *o) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = (uint32_t)o->threads;
    sp.kv_cache_bytes = 64ull << 20;
    llm_session *s = NULL;
    llm_status st = bench_session_create(model, &sp, o, &s);
    if (st != LLM_OK)
        return bench_fail("creating the warm-up session", st);
    llm_token prompt[32];
    for (int i = 0; i < 32; i++)
        prompt[i] = 1000 + i;
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 4;
    rp.ignore_eos = true;
    llm_request_id id;
    st = llm_session_submit(s, prompt, 32, &rp, &id);
    llm_event ev[8];
    size_t n_ev = 0;
    for (int i = 0; st == LLM_OK && i < 100; i++) {
        st = llm_session_step(s, ev, 8, sizeof ev[0], &n_ev);
        if (st == LLM_OK && n_ev && ev[n_ev - 1].finish_reason != LLM_FINISH_NONE)
            break;
    }
    llm_session_free(s);
    return st == LLM_OK ? 0 : bench_fail("warm-up", st);
}

/* Samples the KV gauges after a step that ran a scheduler iteration. */
typedef struct kv_acc {
    double waste_sum, waste_max, util_sum, util_max;
    uint64_t n, overcount;
    uint32_t blocks_used_max;
} kv_acc;

static void kv_sample(kv_acc *a, const llm_session_stats *s) {
    if (s->blocks_used > a->blocks_used_max)
        a->blocks_used_max = s->blocks_used;
    if (s->blocks_used == 0 || s->block_size == 0)
        return;
    double slots = (double)s->blocks_used * (double)s->block_size;
    double waste = 1.0 - (double)s->kv_tokens_used / slots;
    /* llm.h documents kv_tokens_used as slots in used blocks, so it can
     * never exceed blocks_used * block_size; count the steps where it does
     * (the waste then comes out negative). */
    if ((double)s->kv_tokens_used > slots && a->overcount++ == 0)
        fprintf(stderr,
                "llm-bench: engine problem: kv_tokens_used %llu > blocks_used %u x "
                "block_size %u (shared prefix blocks counted once per sequence?)\n",
                (unsigned long long)s->kv_tokens_used, s->blocks_used, s->block_size);
    double util = s->blocks_total ? (double)s->blocks_used / (double)s->blocks_total : 0.0;
    if (a->n == 0 || waste > a->waste_max)
        a->waste_max = waste;
    if (a->n == 0 || util > a->util_max)
        a->util_max = util;
    a->waste_sum += waste;
    a->util_sum += util;
    a->n++;
}

int bench_run(const llm_model *model, const bench_opts *o, const bench_workload *w, bench_mode mode,
              bool prefix_cache, bench_result *r) {
    memset(r, 0, sizeof *r);
    r->mode = mode;
    r->prefix_cache = prefix_cache;
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = (uint32_t)o->threads;
    sp.kv_cache_bytes = (uint64_t)o->kv_cache_mb << 20;
    sp.kv_block_size = (uint32_t)o->block_size;
    if (o->max_batch_tokens > 0)
        sp.max_batch_tokens = (uint32_t)o->max_batch_tokens;
    sp.prefix_cache = prefix_cache;
    llm_session *s = NULL;
    llm_status st = bench_session_create(model, &sp, o, &s);
    if (st != LLM_OK)
        return bench_fail("creating the session", st);

    size_t n = w->n, cap_ev = 2 * n + 64;
    req_state *rs = calloc(n ? n : 1, sizeof *rs);
    llm_event *ev = calloc(cap_ev, sizeof *ev);
    double *ttft = calloc(n ? n : 1, sizeof *ttft), *tpot = calloc(n ? n : 1, sizeof *tpot);
    double *e2e = calloc(n ? n : 1, sizeof *e2e);
    id_map ids = {0};
    int rc = 0;
    if (!rs || !ev || !ttft || !tpot || !e2e || !id_map_init(&ids, n)) {
        fprintf(stderr, "llm-bench: out of memory\n");
        rc = 2;
        goto out;
    }
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.sampling = NULL; /* greedy */
    rp.ignore_eos = true;
    rp.adapter = o->adapter;
    rp.adapter_scale = (float)o->lora_scale;

    kv_acc kv = {0};
    llm_session_stats stats = {sizeof stats};
    uint64_t last_steps = 0, idle_calls = 0;
    /* Generous bound on scheduler iterations: every token computed in its
     * own step, twice over (preemption recomputes). */
    uint64_t max_steps = 2 * (w->prompt_tokens + w->output_tokens) + 1000;
    size_t next = 0, outstanding = 0, done = 0;
    const double t0 = now_s();
    while (done < n) {
        double t = now_s() - t0;
        /* Admission: continuous hands every arrived request to the engine;
         * static waits until the whole group is done, then takes up to G
         * arrived requests as the next group. */
        size_t take = mode == MODE_STATIC ? (outstanding == 0 ? (size_t)o->static_batch : 0) : n;
        for (size_t g = 0; g < take && next < n && w->req[next].arrival <= t; g++, next++) {
            const bench_request *q = &w->req[next];
            rp.max_new_tokens = q->n_output;
            st = llm_session_submit(s, q->prompt, q->n_prompt, &rp, &rs[next].id);
            if (st != LLM_OK) {
                char what[96];
                snprintf(what, sizeof what, "submitting request %zu (%u prompt + %u new tokens)",
                         next, q->n_prompt, q->n_output);
                rc = bench_fail(what, st);
                goto out;
            }
            rs[next].submitted = true;
            id_map_put(&ids, rs[next].id, next);
            outstanding++;
        }
        if (outstanding == 0) {
            /* Nothing in flight: wait for the next arrival. */
            if (next < n)
                sleep_s(w->req[next].arrival - (now_s() - t0));
            continue;
        }
        size_t n_ev = 0;
        st = llm_session_step(s, ev, cap_ev, sizeof *ev, &n_ev);
        if (st != LLM_OK) {
            rc = bench_fail("stepping the session", st);
            goto out;
        }
        t = now_s() - t0;
        if ((st = llm_session_get_stats(s, &stats)) != LLM_OK) {
            rc = bench_fail("reading the session stats", st);
            goto out;
        }
        if (stats.steps != last_steps) {
            kv_sample(&kv, &stats);
            last_steps = stats.steps;
            idle_calls = 0;
        } else if (n_ev == 0 && ++idle_calls > 1000) {
            fprintf(stderr,
                    "llm-bench: engine problem: %zu requests outstanding but "
                    "llm_session_step runs no iteration and delivers no events "
                    "(running %u, waiting %u)\n",
                    outstanding, stats.n_running, stats.n_waiting);
            rc = 2;
            goto out;
        }
        if (stats.steps > max_steps) {
            fprintf(stderr,
                    "llm-bench: engine problem: %llu steps and %zu requests still "
                    "unfinished (running %u, waiting %u)\n",
                    (unsigned long long)stats.steps, n - done, stats.n_running, stats.n_waiting);
            rc = 2;
            goto out;
        }
        for (size_t e = 0; e < n_ev; e++) {
            size_t i;
            if (!id_map_get(&ids, ev[e].request, &i) || rs[i].finished) {
                if (r->stray_events++ == 0)
                    fprintf(stderr, "llm-bench: engine problem: event for %s request %llu\n",
                            id_map_get(&ids, ev[e].request, &i) ? "finished" : "unknown",
                            (unsigned long long)ev[e].request);
                continue;
            }
            req_state *q = &rs[i];
            if (ev[e].token != LLM_TOKEN_NONE) {
                if (q->n_tokens++ == 0)
                    q->first_t = t;
                q->last_t = t;
                r->generated_tokens++;
            }
            if (ev[e].finish_reason == LLM_FINISH_NONE)
                continue;
            q->finished = true;
            q->end_t = t;
            done++;
            outstanding--;
            if (ev[e].finish_reason == LLM_FINISH_ERROR) {
                if (r->failed++ == 0)
                    fprintf(stderr, "llm-bench: request %zu failed: %s\n", i,
                            llm_status_name(ev[e].status));
            } else if (q->n_tokens != w->req[i].n_output ||
                       ev[e].finish_reason != LLM_FINISH_LENGTH) {
                if (r->wrong_length++ == 0)
                    fprintf(stderr,
                            "llm-bench: engine problem: request %zu (prompt %u) finished "
                            "(reason %d) after %u tokens, asked for exactly %u\n",
                            i, w->req[i].n_prompt, (int)ev[e].finish_reason, q->n_tokens,
                            w->req[i].n_output);
            }
        }
    }
    r->wall_s = now_s() - t0;

    if ((st = llm_session_get_stats(s, &stats)) != LLM_OK) {
        rc = bench_fail("reading the session stats", st);
        goto out;
    }
    size_t n_ttft = 0, n_tpot = 0, n_e2e = 0;
    for (size_t i = 0; i < n; i++) {
        const req_state *q = &rs[i];
        double arrival = w->req[i].arrival;
        if (q->n_tokens > 0)
            ttft[n_ttft++] = (q->first_t - arrival) * 1e3;
        if (q->n_tokens > 1)
            tpot[n_tpot++] = (q->last_t - q->first_t) * 1e3 / (double)(q->n_tokens - 1);
        if (q->finished)
            e2e[n_e2e++] = (q->end_t - arrival) * 1e3;
    }
    r->ttft_ms = percentiles(ttft, n_ttft);
    r->tpot_ms = percentiles(tpot, n_tpot);
    r->e2e_ms = percentiles(e2e, n_e2e);
    r->prompt_tokens = w->prompt_tokens;
    r->throughput_tok_s = r->wall_s > 0 ? (double)r->generated_tokens / r->wall_s : 0;
    r->prompt_tok_s = r->wall_s > 0 ? (double)r->prompt_tokens / r->wall_s : 0;
    r->kv_waste_mean = kv.n ? kv.waste_sum / (double)kv.n : NAN;
    r->kv_waste_max = kv.n ? kv.waste_max : NAN;
    r->kv_util_mean = kv.n ? kv.util_sum / (double)kv.n : NAN;
    r->kv_util_max = kv.n ? kv.util_max : NAN;
    r->kv_samples = kv.n;
    r->kv_overcount_steps = kv.overcount;
    r->blocks_used_max = kv.blocks_used_max;
    r->block_size = stats.block_size;
    r->blocks_total = stats.blocks_total;
    r->prefix_hit_tokens = stats.prefix_hit_tokens;
    r->prompt_tokens_computed = stats.prompt_tokens;
    r->prefix_hit_rate =
        w->prompt_tokens ? (double)stats.prefix_hit_tokens / (double)w->prompt_tokens : 0;
    /* After a preemption the engine admits a request again with its tokens
     * so far, which mostly hit the cache: that can push hits past the
     * submitted prompt tokens. Hits over everything admitted stays <= 1. */
    uint64_t admitted = stats.prefix_hit_tokens + stats.prompt_tokens;
    r->prefix_hit_rate_admitted = admitted ? (double)stats.prefix_hit_tokens / (double)admitted : 0;
    r->preemptions = stats.preemptions;
    r->steps = stats.steps;
    if (stats.generated_tokens != r->generated_tokens && r->failed == 0)
        fprintf(stderr,
                "llm-bench: engine problem: stats report %llu generated tokens, events "
                "delivered %llu\n",
                (unsigned long long)stats.generated_tokens,
                (unsigned long long)r->generated_tokens);
    if (r->failed || r->wrong_length || r->stray_events)
        fprintf(stderr,
                "llm-bench: %s run: %llu failed requests, %llu with a wrong length, %llu "
                "stray events\n",
                bench_mode_name(mode), (unsigned long long)r->failed,
                (unsigned long long)r->wrong_length, (unsigned long long)r->stray_events);
out:
    free(ids.keys);
    free(ids.vals);
    free(rs);
    free(ev);
    free(ttft);
    free(tpot);
    free(e2e);
    llm_session_free(s);
    return rc;
}
