/* llm-bench: a synthetic load generator for the request-level engine
 * (llm_session_submit / llm_session_step). Uses only the public API.
 *
 * main.c: options, output (table and JSON). run.c: workload and run loop. */
#ifndef LLM_BENCH_H
#define LLM_BENCH_H

/* --tp and --device set llm_device_params (tensor_parallel, backend). */
#define LLM_EXPERIMENTAL
#include <llm.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef enum bench_mode { MODE_CONTINUOUS = 0, MODE_STATIC = 1 } bench_mode;

/* Prompts: random token ids, or chat prompts asking to repeat or edit a
 * text given in the prompt, or asking for free text. */
typedef enum bench_workload_kind {
    WORKLOAD_RANDOM = 0,
    WORKLOAD_REPETITIVE = 1,
    WORKLOAD_FREE = 2,
} bench_workload_kind;

typedef struct bench_range {
    long lo, hi;
} bench_range;

typedef struct bench_opts {
    const char *model;
    long threads;       /* 0 = library default (all cores) */
    long tp;            /* tensor-parallel CPU ranks (1 = none) */
    const char *device; /* backend name: "cpu", "cuda", "auto"; NULL = cpu */
    long requests;
    bench_range prompt_len; /* tokens of each request's own part */
    bench_range output_len; /* new tokens per request (exact: ignore_eos) */
    double arrival_rate;    /* requests/s, Poisson; 0 = all at t = 0 */
    long prefix_len;        /* shared prefix length */
    double prefix_frac;     /* fraction of requests that start with it */
    bench_mode mode;
    bool prefix_cache;
    long kv_cache_mb;      /* 0 = library default */
    long block_size;       /* 0 = library default */
    long max_batch_tokens; /* 0 = library default */
    long static_batch;     /* G: group size of static batching */
    uint64_t seed;
    const char *json;
    bool compare, verbose, warmup;
    /* Speculative decoding (spec.c): with a spec mode, every request runs
     * at batch 1 without and with speculation. */
    uint32_t spec_mode; /* llm_spec_mode */
    long spec_k;        /* 0 = adaptive */
    const char *draft_model;
    bench_workload_kind workload;
    bool requests_set, output_len_set;
    float temperature; /* spec runs: 0 = greedy */
    bool embed;        /* --embed: embedding throughput (embed.c) */
    /* --lora: every request of the load runs with this adapter (loaded in
     * main) at lora_scale. */
    const char *lora;
    double lora_scale;
    const llm_adapter *adapter;
} bench_opts;

/* One synthetic request; times are seconds after the run starts. */
typedef struct bench_request {
    llm_token *prompt;
    uint32_t n_prompt, n_output;
    bool shared; /* starts with the shared prefix */
    double arrival;
} bench_request;

typedef struct bench_workload {
    bench_request *req;
    size_t n;
    uint64_t prompt_tokens, output_tokens, shared_requests;
} bench_workload;

typedef struct bench_pct {
    double mean, p50, p95, p99; /* NaN when there are no samples */
    size_t n;
} bench_pct;

/* What one run measured. */
typedef struct bench_result {
    bench_mode mode;
    bool prefix_cache;
    double wall_s;
    uint64_t prompt_tokens;    /* submitted (the workload's prompt tokens) */
    uint64_t generated_tokens; /* token events received */
    double throughput_tok_s;   /* generated tokens / wall */
    double prompt_tok_s;       /* submitted prompt tokens / wall */
    bench_pct ttft_ms, tpot_ms, e2e_ms;
    double kv_waste_mean, kv_waste_max; /* NaN when no step held blocks */
    double kv_util_mean, kv_util_max;
    uint32_t block_size, blocks_total, blocks_used_max;
    uint64_t prefix_hit_tokens, prompt_tokens_computed;
    double prefix_hit_rate;          /* hits / prompt tokens submitted */
    double prefix_hit_rate_admitted; /* hits / (hits + prompt tokens computed) */
    uint64_t preemptions, steps, kv_samples;
    uint64_t kv_overcount_steps; /* steps with kv_tokens_used > used slots */
    /* Engine misbehaviour seen (should all be 0). */
    uint64_t failed, wrong_length, stray_events;
} bench_result;

/* run.c */
int bench_workload_make(const llm_model *model, const bench_opts *o, bench_workload *w);
void bench_workload_free(bench_workload *w);
/* 0 on success; on failure prints the error and returns 2. */
int bench_warmup(const llm_model *model, const bench_opts *o);
int bench_run(const llm_model *model, const bench_opts *o, const bench_workload *w, bench_mode mode,
              bool prefix_cache, bench_result *r);
const char *bench_mode_name(bench_mode m);
int bench_fail(const char *what, llm_status st);
/* llm_session_create on the --device backend with the --tp ranks. */
static inline llm_status bench_session_create(const llm_model *m, const llm_session_params *sp,
                                              const bench_opts *o, llm_session **out) {
    llm_device_params dp;
    llm_device_params_init(&dp);
    dp.tensor_parallel = o->tp > 0 ? (uint32_t)o->tp : 1;
    dp.backend = o->device;
    return llm_session_create_ex(m, sp, &dp, out);
}
void bench_json_str(FILE *f, const char *s);
void bench_json_num(FILE *f, double v);

/* spec.c: the workload at batch 1 without and with speculation; prints a
 * table and writes JSON (speedup, acceptance_rate, mean_accepted_len). */
int bench_spec(const llm_model *model, const bench_opts *o);
const char *bench_workload_name(bench_workload_kind w);

/* embed.c: --requests sentences of --prompt-len random tokens embedded at
 * batch 1 and 64; prints sentences/s and writes JSON. */
int bench_embed(const llm_model *model, const bench_opts *o);

#endif
