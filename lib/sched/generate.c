/* llm_generate: one request through the scheduler, its events turned into
 * the callback's calls. Other requests of the session advance in the same
 * steps, and their events stay queued for llm_session_step. */
#include "sched/sched.h"


#include <stddef.h>

LLM_API void llm_generate_params_init_sized(llm_generate_params *p, size_t size) {
    llm_generate_params d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_new_tokens = 128;
    d.spec_mode = LLM_SPEC_NONE;
    d.spec_k = 0; /* adaptive */
    d.adapter_scale = 1.0f;
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API void llm_generate_params_init(llm_generate_params *p) {
    llm_generate_params_init_sized(p, LLMI_LEGACY_GENERATE_PARAMS_SIZE);
}

static llm_status read_generate_params(const llm_generate_params *in, llm_generate_params *p) {
    llm_generate_params_init_sized(p, sizeof *p);
    if (!in) return LLM_OK;
    LLMI_TRY(llmi_params_copy("llm_generate_params", in, p, sizeof *p));
    /* spec_mode sits in what was padding of the 1.0 struct: read it only
     * from callers whose struct has both spec fields. */
    if (in->struct_size < offsetof(llm_generate_params, spec_k) + sizeof p->spec_k) {
        p->spec_mode = LLM_SPEC_NONE;
        p->spec_k = 0;
    }
    return LLM_OK;
}

/* Streams the text `tok` completes to the callback; *keep_going false =
 * the caller said stop. */
static llm_status emit(llmi_sched *s, llmi_detok *d, llm_token tok, const llm_generate_params *p,
                       bool *keep_going) {
    size_t n = 0;
    llm_status st = llmi_detok_push(d, tok, s->piece, s->piece_cap, &n);
    if (st == LLM_ERR_BUFFER_TOO_SMALL) {
        char *bigger = llmi_realloc(s->piece, n); /* n counts the NUL */
        if (!bigger) return llmi_oom("text piece");
        s->piece = bigger;
        s->piece_cap = n;
        st = llmi_detok_push(d, tok, s->piece, s->piece_cap, &n);
    }
    if (st != LLM_OK) return st;
    *keep_going = p->on_token ? p->on_token(tok, s->piece, n, p->user) : true;
    return LLM_OK;
}

/* What the loop needs of one of its request's events. */
typedef struct gen_event {
    llm_token token;
    llm_finish_reason finish;
    llm_status status;
} gen_event;

typedef struct gen_events {
    gen_event *v;
    size_t n, cap;
} gen_events;

/* Takes the request's queued events (under the lock). */
static llm_status take_events(llmi_sched *s, llm_request_id id, gen_events *out) {
    out->n = 0;
    for (size_t i = s->events_delivered; i < s->n_events; i++) {
        llmi_event_rec *rec = &s->events[i];
        if (rec->taken || rec->ev.request != id) continue;
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 16;
            gen_event *v = llmi_realloc(out->v, cap * sizeof *v);
            if (!v) return llmi_oom("generation events");
            out->v = v;
            out->cap = cap;
        }
        out->v[out->n++] = (gen_event){rec->ev.token, rec->ev.finish_reason, rec->ev.status};
        rec->taken = true;
    }
    return LLM_OK;
}

/* The request's params from llm_generate's. */
static void request_params(const llm_generate_params *p, llm_request_params *rp) {
    llm_request_params_init_sized(rp, sizeof *rp);
    rp->max_new_tokens = p->max_new_tokens;
    rp->sampling = p->sampling;
    rp->ignore_eos = p->ignore_eos;
    rp->spec_mode = p->spec_mode;
    rp->spec_k = p->spec_k;
    rp->adapter = p->adapter;
    rp->adapter_scale = p->adapter_scale;
}

typedef struct gen_loop {
    llmi_sched *s;
    const llm_generate_params *p;
    llm_request_id id;
    llmi_detok d;
    llm_generate_result *r;
    double t_first;
    bool have_first;
    bool done;     /* the loop ends: finished, or the callback said stop */
    bool finished; /* the scheduler reported the request's finish (and freed it) */
} gen_loop;

/* Removes the request if the scheduler still holds it. */
static void drop_unfinished(gen_loop *g) {
    if (g->finished) return;
    pthread_mutex_lock(&g->s->lock);
    llmi_sched_drop(g->s, g->id);
    pthread_mutex_unlock(&g->s->lock);
}

/* Turns the request's events into callback calls; sets g->done at its
 * finish or when the callback said stop. */
static llm_status handle(gen_loop *g, const gen_events *evs) {
    for (size_t i = 0; i < evs->n && !g->done; i++) {
        const gen_event *e = &evs->v[i];
        if (e->token != LLM_TOKEN_NONE && !g->have_first) {
            g->t_first = llmi_now();
            g->have_first = true;
        }
        /* End-of-generation tokens end without being counted. llm_generate
         * has no stop tokens or strings: a STOP here is a grammar that the
         * token completed, and the token is part of the output. */
        bool counted = e->token != LLM_TOKEN_NONE && e->finish != LLM_FINISH_EOS;
        if (counted) {
            g->r->n_generated_tokens++;
            bool keep_going = true;
            LLMI_TRY(emit(g->s, &g->d, e->token, g->p, &keep_going));
            if (!keep_going) {
                g->r->finish_reason = LLM_FINISH_CANCELLED;
                g->done = true;
                return LLM_OK;
            }
        }
        if (e->finish != LLM_FINISH_NONE) {
            g->r->finish_reason = e->finish;
            g->done = g->finished = true;
            if (e->finish == LLM_FINISH_ERROR)
                return e->status; /* its message was recorded when it failed */
        }
    }
    return LLM_OK;
}

/* Steps the scheduler until the request finishes or the callback says
 * stop; on the way out the request leaves the scheduler either way (a
 * failed step changed nothing, so dropping it loses nothing of others). */
static llm_status run(gen_loop *g) {
    llmi_sched *sched = g->s;
    gen_events evs = {0};
    llm_status st = LLM_OK;
    while (st == LLM_OK && !g->done) {
        pthread_mutex_lock(&sched->lock);
        /* Other requests' undelivered events stay: the iteration appends. */
        st = llmi_sched_iterate(g->s);
        if (st == LLM_OK) st = take_events(sched, g->id, &evs);
        pthread_mutex_unlock(&sched->lock);
        if (st == LLM_OK) st = handle(g, &evs);
    }
    drop_unfinished(g);
    llmi_free(evs.v);
    return st;
}

llm_status llmi_sched_generate(llmi_sched *s, const llm_token *prompt, size_t n_prompt,
                               const llm_generate_params *params, llm_generate_result *result) {
    llm_generate_params p;
    LLMI_TRY(read_generate_params(params, &p));
    if (result && (result->struct_size < sizeof(uint32_t) || result->struct_size > (1u << 16)))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_generate_result.struct_size %u is invalid", result->struct_size);
    llm_generate_result r = {.struct_size = sizeof r, .n_prompt_tokens = (uint32_t)n_prompt};
    llm_request_params rp;
    request_params(&p, &rp);
    /* Zero new tokens: the request's checks, then nothing to compute. */
    if (p.max_new_tokens == 0) rp.max_new_tokens = 1;
    gen_loop g = {.s = s, .p = &p, .r = &r};
    double t0 = llmi_now();
    g.t_first = t0;
    LLMI_TRY(llmi_sched_submit_report(s, prompt, n_prompt, &rp, &r, &g.id));
    llm_status st = LLM_OK;
    if (p.max_new_tokens == 0) {
        drop_unfinished(&g);
        r.finish_reason = LLM_FINISH_LENGTH;
    } else {
        llmi_detok_init(&g.d, s->model->tok, 0);
        st = run(&g);
        if (st == LLM_OK && p.on_token) { /* held-back bytes of a split character */
            size_t n = 0;
            if (llmi_detok_flush(&g.d, s->piece, s->piece_cap, &n) == LLM_OK && n > 0)
                p.on_token(LLM_TOKEN_NONE, s->piece, n, p.user);
        }
    }
    double t_end = llmi_now();
    r.prompt_seconds = g.t_first - t0;
    r.generate_seconds = t_end - g.t_first;
    /* An interrupted step (llm_session_interrupt) ends the call as cancelled. */
    if (st != LLM_OK) r.finish_reason = st == LLM_ERR_CANCELLED ? LLM_FINISH_CANCELLED : LLM_FINISH_ERROR;
    if (result) {
        size_t n = result->struct_size < sizeof r ? result->struct_size : sizeof r;
        uint32_t caller_size = result->struct_size;
        memcpy(result, &r, n);
        result->struct_size = caller_size;
    }
    return st;
}
