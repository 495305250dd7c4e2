#include "metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

#define MAX_SERIES 64

static const double ttft_buckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double tpot_buckets[] = {0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
#define N_TTFT (sizeof ttft_buckets / sizeof ttft_buckets[0])
#define N_TPOT (sizeof tpot_buckets / sizeof tpot_buckets[0])

typedef struct histogram {
    uint64_t counts[16]; /* per bucket, not cumulative; last is +Inf */
    uint64_t count;
    double sum;
} histogram;

typedef struct series {
    char endpoint[32];
    int status;
    uint64_t count;
} series;

struct metrics {
    pthread_mutex_t lock;
    series requests[MAX_SERIES];
    size_t n_requests;
    uint64_t prompt_tokens, generated_tokens;
    histogram ttft, tpot;
    int active;
    const atomic_int *open_connections;
    atomic_ullong refused_connections;
};

metrics *metrics_create(void)
{
    metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->lock, NULL);
    return m;
}

void metrics_free(metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void metrics_count_request(metrics *m, const char *endpoint, int status)
{
    pthread_mutex_lock(&m->lock);
    size_t i = 0;
    while (i < m->n_requests &&
           (m->requests[i].status != status || strcmp(m->requests[i].endpoint, endpoint)))
        i++;
    if (i == m->n_requests && i < MAX_SERIES) {
        snprintf(m->requests[i].endpoint, sizeof m->requests[i].endpoint, "%s", endpoint);
        m->requests[i].status = status;
        m->n_requests++;
    }
    if (i < m->n_requests) m->requests[i].count++;
    pthread_mutex_unlock(&m->lock);
}

static void observe(histogram *h, const double *bounds, size_t n_bounds, double v)
{
    size_t b = 0;
    while (b < n_bounds && v > bounds[b]) b++;
    h->counts[b]++;
    h->count++;
    h->sum += v;
}

void metrics_observe_generation(metrics *m, uint32_t prompt_tokens, uint32_t generated_tokens,
                                double ttft_seconds, double tpot_seconds)
{
    pthread_mutex_lock(&m->lock);
    m->prompt_tokens += prompt_tokens;
    m->generated_tokens += generated_tokens;
    if (ttft_seconds >= 0) observe(&m->ttft, ttft_buckets, N_TTFT, ttft_seconds);
    if (tpot_seconds >= 0) observe(&m->tpot, tpot_buckets, N_TPOT, tpot_seconds);
    pthread_mutex_unlock(&m->lock);
}

void metrics_adjust_active(metrics *m, int delta)
{
    pthread_mutex_lock(&m->lock);
    m->active += delta;
    pthread_mutex_unlock(&m->lock);
}

int metrics_active(metrics *m)
{
    pthread_mutex_lock(&m->lock);
    int a = m->active;
    pthread_mutex_unlock(&m->lock);
    return a;
}

typedef struct text {
    char *buf;
    size_t len, cap;
    bool out_of_memory; /* a put failed; the text is incomplete */
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    while (!t->out_of_memory) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap * 2 + (size_t)(n > 0 ? n : 0) + 256;
        char *b = serve_realloc(t->buf, cap);
        if (!b) {
            t->out_of_memory = true;
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
}

static void put_metric(text *t, const char *name, const char *type, const char *help)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A metric with one unlabelled sample: the header and the value, one name. */
static void put_single(text *t, const char *name, const char *type, const char *help,
                       double value)
{
    put_metric(t, name, type, help);
    put(t, "%s %.17g\n", name, value);
}

static void put_histogram(text *t, const char *name, const char *help, const histogram *h,
                          const double *bounds, size_t n_bounds)
{
    put_metric(t, name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t b = 0; b < n_bounds; b++) {
        cumulative += h->counts[b];
        put(t, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[b], (unsigned long long)cumulative);
    }
    put(t, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
    put(t, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

void metrics_watch_connections(metrics *m, const atomic_int *open_connections)
{
    m->open_connections = open_connections;
}

void metrics_count_refused_connection(metrics *m) { atomic_fetch_add(&m->refused_connections, 1); }

char *metrics_render(metrics *m, llm_session *session, const char *device, uint32_t tensor_parallel,
                     const grammar_cache_stats *grammars) {
    llm_session_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    llm_session_get_stats(session, &s);
    text t = {0};
    pthread_mutex_lock(&m->lock);
    put_metric(&t, "llm_serve_requests_total", "counter", "HTTP requests by endpoint and status.");
    for (size_t i = 0; i < m->n_requests; i++)
        put(&t, "llm_serve_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
            m->requests[i].endpoint, m->requests[i].status,
            (unsigned long long)m->requests[i].count);
    put_single(&t, "llm_serve_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
               m->prompt_tokens);
    put_single(&t, "llm_serve_generation_tokens_total", "counter", "Tokens generated for finished requests.",
               m->generated_tokens);
    put_histogram(&t, "llm_serve_time_to_first_token_seconds", "Time from submit to the first token.",
                  &m->ttft, ttft_buckets, N_TTFT);
    put_histogram(&t, "llm_serve_time_per_output_token_seconds",
                  "Mean time between tokens after the first, per request.", &m->tpot, tpot_buckets,
                  N_TPOT);
    put_single(&t, "llm_serve_http_requests_active", "gauge", "Generation requests being served.",
               m->active);
    pthread_mutex_unlock(&m->lock);
    put_single(&t, "llm_serve_connections_open", "gauge", "Open HTTP connections.",
               m->open_connections ? (uint64_t)atomic_load(m->open_connections) : 0);
    put_single(&t, "llm_serve_connections_refused_total", "counter",
               "Connections answered 503 at --max-connections.",
               atomic_load(&m->refused_connections));

    put_single(&t, "llm_serve_requests_running", "gauge", "Sequences holding KV blocks.",
               s.n_running);
    put_single(&t, "llm_serve_requests_waiting", "gauge", "Requests queued or preempted.",
               s.n_waiting);
    put_metric(&t, "llm_serve_kv_blocks", "gauge", "KV cache blocks by state.");
    put(&t, "llm_serve_kv_blocks{state=\"used\"} %u\n", s.blocks_used);
    put(&t, "llm_serve_kv_blocks{state=\"cached\"} %u\n", s.blocks_cached);
    put(&t, "llm_serve_kv_blocks{state=\"free\"} %u\n", s.blocks_free);
    put_single(&t, "llm_serve_kv_blocks_total", "gauge", "KV cache blocks in the pool.",
               s.blocks_total);
    put_single(&t, "llm_serve_kv_cache_tokens", "gauge", "Token slots of the KV cache pool.",
               (double)s.blocks_total * s.block_size);
    put_metric(&t, "llm_serve_device_info", "gauge",
               "Where the model runs: backend and tensor-parallel ranks (always 1).");
    put(&t, "llm_serve_device_info{device=\"%s\",tensor_parallel=\"%u\"} 1\n", device,
        tensor_parallel);
    put_single(&t, "llm_serve_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
               s.prefix_hit_tokens);
    put_single(&t, "llm_serve_engine_prompt_tokens_total", "counter", "Prompt tokens computed by the engine.",
               s.prompt_tokens);
    put_single(&t, "llm_serve_engine_generated_tokens_total", "counter", "Tokens generated by the engine.",
               s.generated_tokens);
    put_single(&t, "llm_serve_preemptions_total", "counter", "Requests preempted for KV memory.",
               s.preemptions);
    put_single(&t, "llm_serve_engine_steps_total", "counter", "Scheduler iterations.",
               s.steps);
    put_single(&t, "llm_serve_spec_draft_tokens_total", "counter", "Speculative drafts checked.",
               s.spec_draft_tokens);
    put_single(&t, "llm_serve_spec_accepted_tokens_total", "counter", "Speculative drafts accepted.",
               s.spec_accepted_tokens);
    if (grammars) {
        put_single(&t, "llm_serve_grammar_compiles_total", "counter",
                   "Grammars compiled for structured output and tool calls.", grammars->compiles);
        put_single(&t, "llm_serve_grammar_cache_hits_total", "counter",
                   "Requests served an already compiled grammar.", grammars->hits);
        put_single(&t, "llm_serve_grammar_compile_seconds_total", "counter",
                   "Time spent compiling grammars.", grammars->compile_seconds);
        put_single(&t, "llm_serve_grammar_cache_entries", "gauge", "Compiled grammars kept.",
                   (double)grammars->entries);
    }
    if (t.out_of_memory) {
        free(t.buf);
        return NULL;
    }
    return t.buf;
}
