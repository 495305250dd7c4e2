/* Request scheduler: continuous batching over a shared block-paged KV pool.
 *
 * Each step runs every running request's next token (decode) or next prompt
 * chunk (prefill), then admits waiting requests, highest priority first and
 * FCFS within a priority, while the token budget (max_batch_tokens) and free
 * KV blocks allow. A request is admitted only when the blocks for its whole
 * remaining prompt are available, so admission never forces a preemption.
 * When a running request needs a block and none is left, the most recently
 * admitted request is preempted: its blocks are freed and it waits again
 * with its tokens so far, to be recomputed (largely from the prefix cache).
 *
 * A speculating request (spec/spec.h) whose rows reach the end of its
 * tokens adds its drafts' rows after its own, with logits on all of them.
 * Drafts are planned last, from the budget and the free KV blocks that
 * running requests and admissions left, so they never delay or preempt
 * anything; the verifier's tokens are emitted one by one, with every stop
 * condition, and the KV past the accepted tokens is truncated.
 *
 * All state is guarded by the scheduler's lock; the forward pass (and the
 * draft model's passes) run outside it, with the requests they compute
 * marked in flight so that a concurrent cancel only flags them. */
#ifndef LLMI_SCHED_H
#define LLMI_SCHED_H

#include "core/core.h"
#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sample/sample.h"
#include "spec/spec.h"
#include "tokenizer/tokenizer.h"

#include <pthread.h>

typedef struct llmi_request {
    llm_request_id id;
    int32_t priority;
    uint64_t arrival;     /* submission order: FCFS tie-break */
    llm_sampling_params sampling;
    uint32_t max_new;
    bool ignore_eos, logprobs;
    uint32_t top_logprobs; /* top-N log-probabilities with each token (0 = off) */
    llm_token *stop_tokens;
    size_t n_stop_tokens;
    char **stop_strings;
    size_t n_stop_strings;
    llm_token *tokens;    /* prompt, then generated tokens; a speculating
                             request's drafts sit past n_tokens during a step */
    uint32_t n_prompt, n_tokens, cap_tokens;
    uint32_t n_generated;
    llmi_kv_seq seq;      /* seq.n_tokens = tokens whose K/V are computed */
    llmi_detok detok;
    char *held;           /* text withheld while it may start a stop string */
    size_t n_held, cap_held;
    bool running, in_flight, cancelled;
    llm_status error;     /* with cancelled: ends with LLM_FINISH_ERROR and this status */
    bool wants_logits;    /* in the in-flight batch: last row of this request */
    uint32_t plan_rows;   /* rows planned this step from seq.n_tokens (drafts not counted) */
    uint32_t first_row;   /* its first row in the step's batch */
    uint32_t logits_row;  /* its first logits row: 1 + spec.k rows when wants_logits */
    llmi_spec_req spec;   /* speculative decoding; spec.mode LLM_SPEC_NONE = off */
    uint32_t sample_index; /* which of the request's samples this sequence is */
    /* With sampling.grammar: where this sequence is in the grammar (each
     * sample has its own, all starting at the grammar's start). */
    llmi_gstate *grammar;
    /* Samples 1..n-1 of a request with several, until its prompt's logits
     * exist: built at submit (so starting them allocates no more than a KV
     * fork), then started by forking this request's sequence. Reported
     * with this request if it ends before that. */
    struct llmi_request **forks;
    uint32_t n_forks;
    /* llm_generate's request: its speculative-decoding counters (owned by
     * the llm_generate call, which outlives the request). NULL otherwise. */
    llm_generate_result *report;
    /* The request's LoRA adapter (borrowed) and scale; NULL for none. */
    const llm_adapter *adapter;
    float adapter_scale;
} llmi_request;

/* A finished or progressed request's event, text kept as an arena offset. */
typedef struct llmi_event_rec {
    llm_event ev;
    size_t text_off;
    size_t top_off; /* arena offset of ev.n_top tokens, then their floats */
    bool taken;     /* consumed by llm_generate: never delivered by a step */
} llmi_event_rec;

/* What a scheduler drives (borrowed; set once by llmi_sched_init). */
typedef struct llmi_sched_config {
    const llm_model *model;
    llmi_engine *eng;     /* the target model's engine: its KV pool, its rows */
    llmi_spec *spec;      /* speculative decoding (draft model, cost model) */
    llmi_sampler *sampler;
    uint32_t n_ctx, max_batch_tokens;
    bool prefix_cache;
} llmi_sched_config;

typedef struct llmi_sched {
    pthread_mutex_t lock;
    /* From the config. */
    const llm_model *model;
    llmi_engine *eng;
    llmi_kv *kv;          /* eng->kv */
    llmi_spec *spec;
    llmi_sampler *sampler;
    uint32_t n_ctx, max_batch_tokens;
    bool prefix_cache;
    /* Give back the blocks before the window of a model whose every layer
     * is windowed (true; tests turn it off to compare). */
    bool swa_release;
    /* Its own buffers. */
    float *logits;        /* [cap_logit_rows][n_vocab]: a step's logits */
    uint32_t cap_logit_rows;
    llmi_spec_job *spec_jobs; /* a step's draft-model jobs */
    size_t cap_spec_jobs;
    char *piece;          /* streaming text buffer */
    size_t piece_cap;
    uint32_t *stats_fill; /* [kv blocks]: scratch for llmi_sched_stats */
    /* While a forward pass runs without the lock, the engine moves the
     * running sequences' lengths: stats taken then report the KV tokens
     * counted before it started. */
    bool in_forward;
    uint64_t kv_tokens_used;
    llmi_request **waiting; /* unordered; the best is searched each step */
    size_t n_waiting, cap_waiting;
    llmi_request **running; /* admission order */
    size_t n_running, cap_running;
    uint64_t next_id, next_arrival;
    llmi_event_rec *events;
    size_t n_events, cap_events, events_delivered;
    char *arena;
    size_t n_arena, cap_arena;
    /* counters */
    uint64_t prompt_tokens, generated_tokens, preemptions, steps;
    uint64_t spec_steps, spec_drafted, spec_accepted;
} llmi_sched;

llm_status llmi_sched_init(llmi_sched *s, const llmi_sched_config *cfg);
/* Frees every request (their KV blocks too) and the scheduler's buffers. */
void llmi_sched_destroy(llmi_sched *s);

llm_status llmi_sched_submit(llmi_sched *s, const llm_token *prompt, size_t n,
                             const llm_request_params *params, llm_request_id *out);
/* llmi_sched_submit for llm_generate: the request reports its speculative
 * counters into *report (which must outlive it). */
llm_status llmi_sched_submit_report(llmi_sched *s, const llm_token *prompt,
                                    size_t n, const llm_request_params *params,
                                    llm_generate_result *report, llm_request_id *out);
llm_status llmi_sched_cancel(llmi_sched *s, llm_request_id id);
llm_status llmi_sched_step(llmi_sched *s, llm_event *events, size_t capacity,
                           size_t event_size, size_t *n_events);
/* *extra: the token-level sequences (*n_extra, NULL entries skipped), read
 * under the lock and counted in kv_tokens_used with the requests'. */
void llmi_sched_stats(llmi_sched *s, llmi_kv_seq **const *extra,
                      const size_t *n_extra,
                      llm_session_stats *st);

/* For llm_generate (generate.c), under the lock. Whether events are queued
 * that are neither delivered nor taken (a new iteration then appends after
 * them instead of starting a fresh queue). */
bool llmi_sched_events_pending(llmi_sched *s);
/* One scheduler iteration, appending its events to the queue. */
llm_status llmi_sched_iterate(llmi_sched *s);
/* Removes request `id` (every sample, none in flight) without a finish
 * event, freeing its blocks, and takes its queued events. */
void llmi_sched_drop(llmi_sched *s, llm_request_id id);
/* generate.c: llm_generate as one request through the scheduler. */
llm_status llmi_sched_generate(llmi_sched *s, const llm_token *prompt, size_t n,
                               const llm_generate_params *params, llm_generate_result *result);
/* Invariant check over every request's sequences and *extra (the
 * token-level ones, as for llmi_sched_stats) (tests). */
llm_status llmi_sched_check(llmi_sched *s, llmi_kv_seq **const *extra,
                      const size_t *n_extra);

/* Appends r to a pointer array, growing it; false when out of memory. */
bool llmi_sched_push(llmi_request ***arr, size_t *n, size_t *cap, llmi_request *r);

/* output.c: turns a sampled token into text and events; returns the finish
 * reason (NONE to keep going). */
llm_status llmi_sched_emit_token(llmi_sched *s, llmi_request *r, llm_token tok,
                                 float logprob, llm_finish_reason *finish);
/* Attaches top-N tokens and log-probabilities to the event queued last. */
llm_status llmi_sched_attach_top(llmi_sched *s, const llm_token *tokens, const float *logprobs,
                                 uint32_t n);
/* Queues the final event of a request that ends without a new token, and
 * one for each of its samples not yet started (all or none). */
llm_status llmi_sched_emit_finish(llmi_sched *s, llmi_request *r,
                                  llm_finish_reason reason, llm_status status);
void llmi_request_free(llmi_sched *s, llmi_request *r);
/* Whether a finish event of request `id` is queued but not delivered yet
 * (the request itself is gone). Under the lock. */
bool llmi_sched_finish_pending(const llmi_sched *s, llm_request_id id);

#endif
