/* The engine thread: the only caller of llm_session_step(). HTTP threads
 * submit jobs and wait on each job's own event queue. */
#ifndef LLM_SERVE_ENGINE_H
#define LLM_SERVE_ENGINE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "llm.h"

/* One event of a job, copied out of the step's borrowed memory. */
typedef struct job_event {
    struct job_event *next;
    llm_token token; /* LLM_TOKEN_NONE on a finish-only event */
    float logprob;
    llm_finish_reason finish_reason;
    llm_status status;
    uint32_t sample_index;
    uint32_t n_top;
    llm_token top_tokens[20];
    float top_logprobs[20];
    size_t text_len;
    char text[]; /* NUL-terminated */
} job_event;

typedef struct job {
    pthread_mutex_t lock;
    pthread_cond_t ready;
    job_event *head, *tail;
    uint32_t n_samples;
    uint32_t n_finished; /* finish events queued so far */
    int refs;            /* the waiting HTTP thread and, while submitted, the engine */
    /* An event could not be queued: the request was cancelled, and what is
     * queued no longer tells the whole answer. */
    bool out_of_memory;
    llm_request_id id;
    struct job *next_active;
    /* Called once the last reference is dropped, when the library is done
     * with the request: frees what its params borrowed (a grammar). */
    void (*on_free)(void *arg);
    void *on_free_arg;
} job;

typedef struct engine engine;

engine *engine_start(llm_session *session);
/* Stops the thread after cancelling what is left; frees the engine. */
void engine_stop(engine *e);

/* Submits `prompt` for `j` (created by job_create). On failure returns the
 * status and the library's message in `msg`. */
llm_status engine_submit(engine *e, job *j, const llm_token *prompt, size_t n_prompt,
                         const llm_request_params *params, char *msg, size_t msg_cap);
/* Asks the library to end the job; its finish events still arrive. */
void engine_cancel(engine *e, job *j);
/* Cancels every submitted job (shutdown). */
void engine_cancel_all(engine *e);

/* Runs llm_session_embed on the engine thread, which is the session's
 * stepping thread (the token-level API must not run beside a step), between
 * two steps; blocks until it is done. On failure returns the status and the
 * library's message in `msg`; LLM_ERR_CANCELLED once the engine stops. */
llm_status engine_embed(engine *e, const llm_token *const *inputs, const size_t *n_tokens,
                        size_t n_inputs, const llm_embed_params *params, float *out,
                        size_t capacity, char *msg, size_t msg_cap);

job *job_create(uint32_t n_samples);
/* Drops the caller's reference. */
void job_release(job *j);
/* Waits up to `timeout_ms` for an event; NULL on timeout or once the job
 * failed for lack of memory (job_out_of_memory). The caller frees the event
 * with free(). */
job_event *job_next(job *j, int timeout_ms);
bool job_out_of_memory(job *j);

#endif
