/* From sampled tokens to events: streaming text that never splits a UTF-8
 * character, stop tokens and stop strings (whose text is never emitted), and
 * the per-step event list with its text arena. */
#include "sched/sched.h"


/* Makes room for `bytes` more bytes of event text. */
static llm_status reserve_arena(llmi_sched *s, size_t bytes) {
    if (s->n_arena + bytes <= s->cap_arena) return LLM_OK;
    size_t cap = s->cap_arena ? s->cap_arena : 4096;
    while (cap < s->n_arena + bytes) cap *= 2;
    char *a = llmi_realloc(s->arena, cap);
    if (!a) return llmi_oom("event text");
    s->arena = a;
    s->cap_arena = cap;
    return LLM_OK;
}

static llm_status arena_put(llmi_sched *s, const char *text, size_t n, size_t *off) {
    LLMI_TRY(reserve_arena(s, n + 1));
    *off = s->n_arena;
    memcpy(s->arena + s->n_arena, text, n);
    s->arena[s->n_arena + n] = '\0';
    s->n_arena += n + 1;
    return LLM_OK;
}

/* Makes room for `n` more events. */
static llm_status reserve_events(llmi_sched *s, size_t n) {
    if (s->n_events + n <= s->cap_events) return LLM_OK;
    size_t cap = s->cap_events ? s->cap_events : 64;
    while (cap < s->n_events + n) cap *= 2;
    llmi_event_rec *e = llmi_realloc(s->events, cap * sizeof *e);
    if (!e) return llmi_oom("events");
    s->events = e;
    s->cap_events = cap;
    return LLM_OK;
}

static llm_status push_event(llmi_sched *s, const llmi_request *r, llm_token tok, const char *text,
                             size_t n, float logprob, llm_finish_reason finish, llm_status st) {
    LLMI_TRY(reserve_events(s, 1));
    llmi_event_rec *rec = &s->events[s->n_events];
    LLMI_TRY(arena_put(s, text, n, &rec->text_off));
    rec->taken = false;
    rec->top_off = 0;
    rec->ev = (llm_event){.request = r->id,
                          .token = tok,
                          .text = NULL,
                          .text_len = n,
                          .logprob = logprob,
                          .finish_reason = finish,
                          .status = st,
                          .sample_index = r->sample_index};
    s->n_events++;
    return LLM_OK;
}

static llm_status held_append(llmi_request *r, const char *text, size_t n) {
    if (r->n_held + n + 1 > r->cap_held) {
        size_t cap = r->cap_held ? r->cap_held : 64;
        while (cap < r->n_held + n + 1) cap *= 2;
        char *h = llmi_realloc(r->held, cap);
        if (!h) return llmi_oom("request text");
        r->held = h;
        r->cap_held = cap;
    }
    memcpy(r->held + r->n_held, text, n);
    r->n_held += n;
    return LLM_OK;
}

/* Appends the text token `tok` completes to r->held. */
static llm_status detok_into_held(llmi_sched *s, llmi_request *r, llm_token tok) {
    size_t n = 0;
    llm_status st = llmi_detok_push(&r->detok, tok, s->piece, s->piece_cap, &n);
    if (st == LLM_ERR_BUFFER_TOO_SMALL) {
        char *bigger = llmi_realloc(s->piece, n); /* n counts the NUL */
        if (!bigger) return llmi_oom("text piece");
        s->piece = bigger;
        s->piece_cap = n;
        st = llmi_detok_push(&r->detok, tok, s->piece, s->piece_cap, &n);
    }
    if (st != LLM_OK) return st;
    return held_append(r, s->piece, n);
}

/* Moves the rest of the detokenizer's bytes into held (end of the request). */
static llm_status flush_into_held(llmi_sched *s, llmi_request *r) {
    char tail[32];
    size_t n = 0;
    LLMI_TRY(llmi_detok_flush(&r->detok, tail, sizeof tail, &n));
    return held_append(r, tail, n);
}

/* Searches held for the earliest complete stop string; returns its offset
 * or SIZE_MAX. */
static size_t find_stop(const llmi_request *r) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < r->n_stop_strings; i++) {
        const char *ss = r->stop_strings[i];
        size_t len = strlen(ss);
        for (size_t at = 0; at + len <= r->n_held && at < best; at++)
            if (memcmp(r->held + at, ss, len) == 0) best = at;
    }
    return best;
}

/* Length of the longest suffix of held that is a proper prefix of a stop
 * string: that text must wait for the next token. */
static size_t stop_prefix_tail(const llmi_request *r) {
    size_t keep = 0;
    for (size_t i = 0; i < r->n_stop_strings; i++) {
        const char *ss = r->stop_strings[i];
        size_t len = strlen(ss);
        for (size_t k = len - 1; k > keep; k--)
            if (k <= r->n_held && memcmp(r->held + r->n_held - k, ss, k) == 0) {
                keep = k;
                break;
            }
    }
    return keep;
}

static bool is_stop_token(const llmi_request *r, llm_token tok) {
    for (size_t i = 0; i < r->n_stop_tokens; i++)
        if (r->stop_tokens[i] == tok) return true;
    return false;
}

llm_status llmi_sched_emit_token(llmi_sched *s, llmi_request *r, llm_token tok,
                                 float logprob, llm_finish_reason *finish) {
    bool at_limit = r->n_generated >= r->max_new || r->n_tokens >= s->n_ctx;
    *finish = LLM_FINISH_NONE;
    if (!r->ignore_eos && llmi_tokenizer_is_eog(s->model->tok, tok)) {
        *finish = LLM_FINISH_EOS;
    } else if (is_stop_token(r, tok)) {
        *finish = LLM_FINISH_STOP;
    } else {
        LLMI_TRY(detok_into_held(s, r, tok));
    }
    /* A grammar that can go no further ends the request (the token was
     * accepted into it before this call). */
    if (*finish == LLM_FINISH_NONE && r->grammar && llmi_gstate_is_complete(r->grammar))
        *finish = LLM_FINISH_STOP;
    if (*finish == LLM_FINISH_NONE && at_limit) *finish = LLM_FINISH_LENGTH;
    if (*finish != LLM_FINISH_NONE) LLMI_TRY(flush_into_held(s, r));
    size_t emit = r->n_held;
    size_t stop_at = r->n_stop_strings ? find_stop(r) : SIZE_MAX;
    if (stop_at != SIZE_MAX) {
        emit = stop_at;
        *finish = LLM_FINISH_STOP;
    } else if (*finish == LLM_FINISH_NONE && r->n_stop_strings) {
        emit = r->n_held - stop_prefix_tail(r);
    }
    LLMI_TRY(push_event(s, r, tok, r->held, emit, logprob, *finish, LLM_OK));
    memmove(r->held, r->held + emit, r->n_held - emit);
    r->n_held -= emit;
    return LLM_OK;
}

llm_status llmi_sched_attach_top(llmi_sched *s, const llm_token *tokens, const float *logprobs,
                                 uint32_t n) {
    if (s->n_events == 0 || n == 0) return LLM_OK;
    size_t off = (s->n_arena + 7) & ~(size_t)7; /* the floats and tokens stay aligned */
    size_t bytes = (size_t)n * (sizeof *tokens + sizeof *logprobs);
    if (off + bytes > s->cap_arena) {
        size_t cap = s->cap_arena ? s->cap_arena : 4096;
        while (cap < off + bytes) cap *= 2;
        char *a = llmi_realloc(s->arena, cap);
        if (!a) return llmi_oom("event top logprobs");
        s->arena = a;
        s->cap_arena = cap;
    }
    memcpy(s->arena + off, tokens, n * sizeof *tokens);
    memcpy(s->arena + off + n * sizeof *tokens, logprobs, n * sizeof *logprobs);
    s->n_arena = off + bytes;
    llmi_event_rec *rec = &s->events[s->n_events - 1];
    rec->top_off = off;
    rec->ev.n_top = n;
    return LLM_OK;
}

llm_status llmi_sched_emit_finish(llmi_sched *s, llmi_request *r,
                                  llm_finish_reason reason, llm_status status) {
    /* Room for every event first, so that each sample is reported once. */
    size_t n = 1 + r->n_forks;
    LLMI_TRY(reserve_events(s, n));
    LLMI_TRY(reserve_arena(s, n)); /* each empty text takes its terminator */
    LLMI_TRY(push_event(s, r, LLM_TOKEN_NONE, "", 0, 0.0f, reason, status));
    for (uint32_t i = 0; i < r->n_forks; i++)
        LLMI_TRY(push_event(s, r->forks[i], LLM_TOKEN_NONE, "", 0, 0.0f, reason, status));
    return LLM_OK;
}

bool llmi_sched_finish_pending(const llmi_sched *s, llm_request_id id) {
    for (size_t i = s->events_delivered; i < s->n_events; i++)
        if (s->events[i].ev.request == id && s->events[i].ev.finish_reason != LLM_FINISH_NONE)
            return true;
    return false;
}
