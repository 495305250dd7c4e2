#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"

#define EVENTS_PER_STEP 256

/* An embedding call waiting for the engine thread (engine_embed). */
typedef struct embed_call {
    struct embed_call *next;
    const llm_token *const *inputs;
    const size_t *n_tokens;
    size_t n_inputs;
    const llm_embed_params *params;
    float *out;
    size_t capacity;
    llm_status status;
    char *msg;
    size_t msg_cap;
    bool done;
} embed_call;

struct engine {
    llm_session *session;
    pthread_t thread;
    /* Guards `active` and `work_pending`. Held across llm_session_submit and
     * the job's registration so that the engine never sees an event of an
     * id it does not know yet. */
    pthread_mutex_t lock;
    pthread_cond_t work;
    job *active;
    unsigned long work_pending;
    bool stopping;
    llm_event *events; /* EVENTS_PER_STEP, the step's output */
    /* Embedding calls in arrival order (guarded by `lock`); `embedded` is
     * signalled as each one is done. */
    embed_call *embeds, **embeds_tail;
    pthread_cond_t embedded;
};

job *job_create(uint32_t n_samples)
{
    job *j = serve_calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->ready, NULL);
    j->n_samples = n_samples ? n_samples : 1;
    j->refs = 1;
    return j;
}

void job_release(job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->lock);
    int left = --j->refs;
    pthread_mutex_unlock(&j->lock);
    if (left) return;
    if (j->on_free)
        j->on_free(j->on_free_arg);
    for (job_event *ev = j->head, *next; ev; ev = next) {
        next = ev->next;
        free(ev);
    }
    pthread_mutex_destroy(&j->lock);
    pthread_cond_destroy(&j->ready);
    free(j);
}

job_event *job_next(job *j, int timeout_ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&j->lock);
    while (!j->head && !j->out_of_memory) {
        if (pthread_cond_timedwait(&j->ready, &j->lock, &deadline) == ETIMEDOUT) break;
    }
    job_event *ev = j->out_of_memory ? NULL : j->head;
    if (ev) {
        j->head = ev->next;
        if (!j->head) j->tail = NULL;
    }
    pthread_mutex_unlock(&j->lock);
    return ev;
}

static void fill_event(job_event *ev, const llm_event *src)
{
    ev->token = src->token;
    ev->logprob = src->logprob;
    ev->finish_reason = src->finish_reason;
    ev->status = src->status;
    ev->sample_index = src->sample_index;
    ev->n_top = src->n_top > 20 ? 20 : src->n_top;
    for (uint32_t i = 0; i < ev->n_top; i++) {
        ev->top_tokens[i] = src->top_tokens[i];
        ev->top_logprobs[i] = src->top_logprobs[i];
    }
    ev->text_len = src->text_len;
    if (src->text_len) memcpy(ev->text, src->text, src->text_len);
}

bool job_out_of_memory(job *j)
{
    pthread_mutex_lock(&j->lock);
    bool failed = j->out_of_memory;
    pthread_mutex_unlock(&j->lock);
    return failed;
}

/* Queues a copy of `src` for the job's waiter. When the copy cannot be
 * allocated the job fails as a whole rather than lose a token: the request
 * is cancelled (its finish events are still counted, so that the job leaves
 * the active list) and its waiter reports the error. The engine thread is
 * the only writer of `out_of_memory`. */
static void job_push(engine *e, job *j, const llm_event *src)
{
    job_event *ev = j->out_of_memory ? NULL : serve_calloc(1, sizeof *ev + src->text_len + 1);
    bool newly_failed = !ev && !j->out_of_memory;
    if (ev) fill_event(ev, src);
    pthread_mutex_lock(&j->lock);
    if (ev) {
        if (j->tail) j->tail->next = ev;
        else j->head = ev;
        j->tail = ev;
    }
    if (newly_failed) j->out_of_memory = true;
    if (src->finish_reason != LLM_FINISH_NONE) j->n_finished++;
    pthread_cond_signal(&j->ready);
    pthread_mutex_unlock(&j->lock);
    if (newly_failed) {
        fprintf(stderr, "llm-serve: out of memory queueing an event; request cancelled\n");
        if (j->n_finished < j->n_samples) llm_session_cancel(e->session, j->id);
    }
}

/* Caller holds e->lock. */
static job *find_active(engine *e, llm_request_id id, job ***link_out)
{
    job **link = &e->active;
    for (; *link; link = &(*link)->next_active) {
        if ((*link)->id == id) {
            if (link_out) *link_out = link;
            return *link;
        }
    }
    return NULL;
}

static void dispatch(engine *e, const llm_event *events, size_t n)
{
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < n; i++) {
        job **link;
        job *j = find_active(e, events[i].request, &link);
        if (!j) continue;
        job_push(e, j, &events[i]);
        if (events[i].finish_reason != LLM_FINISH_NONE) {
            pthread_mutex_lock(&j->lock);
            bool done = j->n_finished >= j->n_samples;
            pthread_mutex_unlock(&j->lock);
            if (done) {
                *link = j->next_active;
                job_release(j);
            }
        }
    }
    pthread_mutex_unlock(&e->lock);
}

/* Runs the embedding calls queued now, each between two steps. */
static void run_embeds(engine *e)
{
    pthread_mutex_lock(&e->lock);
    embed_call *calls = e->embeds;
    e->embeds = NULL;
    e->embeds_tail = &e->embeds;
    pthread_mutex_unlock(&e->lock);
    for (embed_call *c = calls, *next; c; c = next) {
        next = c->next;
        size_t n_floats = 0;
        llm_status st = llm_session_embed(e->session, c->inputs, c->n_tokens, c->n_inputs,
                                          c->params, c->out, c->capacity, &n_floats);
        pthread_mutex_lock(&e->lock);
        if (st != LLM_OK) snprintf(c->msg, c->msg_cap, "%s", llm_last_error());
        c->status = st;
        c->done = true;
        pthread_cond_broadcast(&e->embedded);
        pthread_mutex_unlock(&e->lock);
    }
}

static void *engine_main(void *arg)
{
    engine *e = arg;
    llm_event *events = e->events;
    for (;;) {
        pthread_mutex_lock(&e->lock);
        bool stopping = e->stopping;
        unsigned long seen = e->work_pending;
        bool embeds = e->embeds != NULL;
        pthread_mutex_unlock(&e->lock);
        if (stopping) break;
        if (embeds) run_embeds(e);
        size_t n = 0;
        llm_status st = llm_session_step(e->session, events, EVENTS_PER_STEP, sizeof *events, &n);
        if (st != LLM_OK && st != LLM_ERR_CANCELLED) {
            char msg[256];
            llm_session_last_error(e->session, &st, msg, sizeof msg, NULL);
            fprintf(stderr, "llm-serve: step failed (%s): %s\n", llm_status_name(st), msg);
            /* A failed step changes no request; retry after a pause rather
             * than spin. */
            nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
            continue;
        }
        if (n) {
            dispatch(e, events, n);
            continue;
        }
        llm_session_stats stats;
        memset(&stats, 0, sizeof stats);
        stats.struct_size = sizeof stats;
        llm_session_get_stats(e->session, &stats);
        if (stats.n_running || stats.n_waiting) continue;
        pthread_mutex_lock(&e->lock);
        while (!e->stopping && e->work_pending == seen && !e->active && !e->embeds)
            pthread_cond_wait(&e->work, &e->lock);
        pthread_mutex_unlock(&e->lock);
    }
    return NULL;
}

engine *engine_start(llm_session *session)
{
    engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->events = calloc(EVENTS_PER_STEP, sizeof *e->events);
    if (!e->events) {
        free(e);
        return NULL;
    }
    e->session = session;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->embedded, NULL);
    e->embeds_tail = &e->embeds;
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        free(e->events);
        free(e);
        return NULL;
    }
    return e;
}

llm_status engine_submit(engine *e, job *j, const llm_token *prompt, size_t n_prompt,
                         const llm_request_params *params, char *msg, size_t msg_cap)
{
    pthread_mutex_lock(&e->lock);
    if (e->stopping) {
        pthread_mutex_unlock(&e->lock);
        snprintf(msg, msg_cap, "the server is shutting down");
        return LLM_ERR_CANCELLED;
    }
    llm_request_id id = 0;
    llm_status st = llm_session_submit(e->session, prompt, n_prompt, params, &id);
    if (st != LLM_OK) {
        snprintf(msg, msg_cap, "%s", llm_last_error());
        pthread_mutex_unlock(&e->lock);
        return st;
    }
    j->id = id;
    pthread_mutex_lock(&j->lock);
    j->refs++;
    pthread_mutex_unlock(&j->lock);
    j->next_active = e->active;
    e->active = j;
    e->work_pending++;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->lock);
    return LLM_OK;
}

llm_status engine_embed(engine *e, const llm_token *const *inputs, const size_t *n_tokens,
                        size_t n_inputs, const llm_embed_params *params, float *out,
                        size_t capacity, char *msg, size_t msg_cap)
{
    embed_call c = {.inputs = inputs, .n_tokens = n_tokens, .n_inputs = n_inputs,
                    .params = params, .out = out, .capacity = capacity, .msg = msg,
                    .msg_cap = msg_cap};
    pthread_mutex_lock(&e->lock);
    if (e->stopping) {
        pthread_mutex_unlock(&e->lock);
        snprintf(msg, msg_cap, "the server is shutting down");
        return LLM_ERR_CANCELLED;
    }
    *e->embeds_tail = &c;
    e->embeds_tail = &c.next;
    e->work_pending++;
    pthread_cond_signal(&e->work);
    while (!c.done) pthread_cond_wait(&e->embedded, &e->lock);
    pthread_mutex_unlock(&e->lock);
    return c.status;
}

void engine_cancel(engine *e, job *j)
{
    pthread_mutex_lock(&e->lock);
    if (find_active(e, j->id, NULL)) llm_session_cancel(e->session, j->id);
    pthread_mutex_unlock(&e->lock);
}

void engine_cancel_all(engine *e)
{
    pthread_mutex_lock(&e->lock);
    for (job *j = e->active; j; j = j->next_active) llm_session_cancel(e->session, j->id);
    pthread_mutex_unlock(&e->lock);
}

void engine_stop(engine *e)
{
    if (!e) return;
    engine_cancel_all(e);
    /* Let the cancel finishes reach their waiters before the thread ends. */
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&e->lock);
        bool empty = !e->active;
        pthread_mutex_unlock(&e->lock);
        if (empty) break;
        nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
    }
    pthread_mutex_lock(&e->lock);
    e->stopping = true;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->lock);
    llm_session_interrupt(e->session);
    pthread_join(e->thread, NULL);
    pthread_mutex_lock(&e->lock);
    /* Calls that arrived after the thread's last look. */
    for (embed_call *c = e->embeds; c; c = c->next) {
        snprintf(c->msg, c->msg_cap, "the server is shutting down");
        c->status = LLM_ERR_CANCELLED;
        c->done = true;
    }
    e->embeds = NULL;
    pthread_cond_broadcast(&e->embedded);
    while (e->active) {
        job *j = e->active;
        e->active = j->next_active;
        job_release(j);
    }
    pthread_mutex_unlock(&e->lock);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->embedded);
    free(e->events);
    free(e);
}
