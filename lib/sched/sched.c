/* Continuous-batching scheduler: submit, cancel, plan a step, run it. */
#include "sched/sched.h"

#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>

llm_status llmi_sched_init(llmi_sched *s, const llmi_sched_config *cfg) {
    memset(s, 0, sizeof *s);
    s->model = cfg->model;
    s->eng = cfg->eng;
    s->kv = cfg->eng->kv;
    s->spec = cfg->spec;
    s->sampler = cfg->sampler;
    s->n_ctx = cfg->n_ctx;
    s->max_batch_tokens = cfg->max_batch_tokens;
    s->prefix_cache = cfg->prefix_cache;
    s->swa_release = true;
    s->stats_fill = llmi_calloc(s->kv->n_blocks, sizeof *s->stats_fill);
    s->piece_cap = 256;
    s->piece = llmi_malloc(s->piece_cap);
    if (!s->stats_fill || !s->piece) {
        llmi_free(s->stats_fill);
        llmi_free(s->piece);
        return llmi_oom("scheduler buffers");
    }
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        llmi_free(s->stats_fill);
        llmi_free(s->piece);
        return llmi_error(LLM_ERR_INTERNAL, "cannot create the scheduler lock");
    }
    s->next_id = 1;
    return LLM_OK;
}

/* Makes s->logits hold at least n rows (grows rarely, never shrinks). */
static llm_status reserve_logits(llmi_sched *s, uint32_t n) {
    if (n <= s->cap_logit_rows) return LLM_OK;
    size_t bytes;
    if (!llmi_mul_ok((size_t)n * s->model->hp.n_vocab, sizeof(float), &bytes))
        return llmi_error(LLM_ERR_LIMIT, "logits for %u rows overflow", n);
    float *l = llmi_malloc_aligned(bytes);
    if (!l) return llmi_oom("logits");
    llmi_free_aligned(s->logits);
    s->logits = l;
    s->cap_logit_rows = n;
    return LLM_OK;
}

void llmi_request_free(llmi_sched *s, llmi_request *r) {
    if (!r) return;
    for (uint32_t i = 0; i < r->n_forks; i++) llmi_request_free(s, r->forks[i]);
    llmi_free(r->forks);
    llmi_kv_seq_destroy(s->kv, &r->seq);
    llmi_spec_req_release(s->spec, &r->spec);
    for (size_t i = 0; i < r->n_stop_strings; i++) llmi_free(r->stop_strings[i]);
    llmi_free(r->stop_strings);
    llmi_free(r->stop_tokens);
    llmi_sampling_params_free(&r->sampling);
    llmi_gstate_free(r->grammar);
    llmi_free(r->tokens);
    llmi_free(r->held);
    llmi_free(r);
}

void llmi_sched_destroy(llmi_sched *s) {
    for (size_t i = 0; i < s->n_waiting; i++) llmi_request_free(s, s->waiting[i]);
    for (size_t i = 0; i < s->n_running; i++) llmi_request_free(s, s->running[i]);
    llmi_free(s->waiting);
    llmi_free(s->running);
    llmi_free(s->events);
    llmi_free(s->arena);
    llmi_free(s->spec_jobs);
    llmi_free(s->stats_fill);
    llmi_free(s->piece);
    llmi_free_aligned(s->logits);
    pthread_mutex_destroy(&s->lock);
    memset(s, 0, sizeof *s);
}

/* Makes room for `n` entries in a pointer array; false on OOM. */
static bool reserve_ptrs(llmi_request ***arr, size_t n, size_t *cap) {
    if (n <= *cap) return true;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < n) c *= 2;
    llmi_request **a = llmi_realloc(*arr, c * sizeof *a);
    if (!a) return false;
    *arr = a;
    *cap = c;
    return true;
}

bool llmi_sched_push(llmi_request ***arr, size_t *n, size_t *cap, llmi_request *r) {
    if (!reserve_ptrs(arr, *n + 1, cap)) return false;
    (*arr)[(*n)++] = r;
    return true;
}

static void remove_at(llmi_request **arr, size_t *n, size_t i) {
    memmove(arr + i, arr + i + 1, (*n - i - 1) * sizeof *arr);
    (*n)--;
}

/* ---- planning ---- */

/* Best waiting request: highest priority, then earliest arrival. */
static size_t best_waiting(const llmi_sched *s) {
    size_t best = 0;
    for (size_t i = 1; i < s->n_waiting; i++) {
        const llmi_request *a = s->waiting[i], *b = s->waiting[best];
        if (a->priority > b->priority || (a->priority == b->priority && a->arrival < b->arrival))
            best = i;
    }
    return best;
}

/* Moves the most recently admitted running request (not yet planned in this
 * step, i.e. index >= first_unplanned) back to waiting; its blocks are freed
 * and its tokens so far are recomputed when it is admitted again. */
static bool preempt_newest(llmi_sched *s, size_t first_unplanned) {
    if (s->n_running == 0 || s->n_running - 1 < first_unplanned) return false;
    llmi_request *victim = s->running[s->n_running - 1];
    if (!llmi_sched_push(&s->waiting, &s->n_waiting, &s->cap_waiting, victim)) return false;
    s->n_running--;
    llmi_kv_seq_release(s->kv, &victim->seq);
    llmi_spec_req_drop_draft_kv(s->spec, &victim->spec);
    victim->running = false;
    s->preemptions++;
    return true;
}

typedef struct plan {
    uint32_t n_rows, budget;
    uint32_t n_prompt_rows; /* rows computing prompt tokens (not recomputation) */
} plan;

/* Plans rows computing `n` more tokens of r (from r->seq.n_tokens); the
 * rows themselves are written by build_rows once drafts are planned too. */
static void add_rows(llmi_sched *s, plan *pl, llmi_request *r, uint32_t n) {
    (void)s;
    uint32_t start = r->seq.n_tokens;
    pl->n_rows += n;
    pl->budget -= n;
    if (start < r->n_prompt) pl->n_prompt_rows += (start + n < r->n_prompt ? start + n : r->n_prompt) - start;
    r->in_flight = true;
    r->plan_rows = n;
    r->spec.k = r->spec.n_drafts = 0;
    r->spec.run_draft = false;
    r->wants_logits = start + n == r->n_tokens; /* the prompt (or recompute) is done */
}

/* Running requests, oldest first: one decode token or a prefill chunk each. */
static llm_status plan_running(llmi_sched *s, plan *pl) {
    for (size_t i = 0; i < s->n_running && pl->budget > 0; i++) {
        llmi_request *r = s->running[i];
        if (r->cancelled) continue;
        uint32_t n = r->n_tokens - r->seq.n_tokens;
        if (n > pl->budget) n = pl->budget;
        for (;;) {
            if (llmi_kv_seq_blocks_needed(s->kv, &r->seq, r->seq.n_tokens + n) <=
                llmi_kv_available(s->kv))
                break;
            if (!preempt_newest(s, i + 1)) break;
        }
        llm_status st = llmi_kv_seq_reserve(s->kv, &r->seq, r->seq.n_tokens + n);
        if (st == LLM_ERR_LIMIT) { /* nothing newer left to preempt: r waits itself */
            preempt_newest(s, i);
            break;
        }
        if (st != LLM_OK) return st;
        add_rows(s, pl, r, n);
    }
    return LLM_OK;
}

/* Admits waiting requests while the budget and the pool allow. */
static llm_status plan_admissions(llmi_sched *s, plan *pl) {
    llmi_kv *kv = s->kv;
    while (s->n_waiting > 0 && pl->budget > 0) {
        size_t wi = best_waiting(s);
        llmi_request *r = s->waiting[wi];
        if (r->cancelled) break; /* reported and removed in finish_cancelled */
        /* Reuse cached blocks of the prefix, always leaving the last token to
         * compute so that its logits exist. */
        if (r->seq.n_blocks == 0 && s->prefix_cache)
            llmi_kv_prefix_match(kv, &r->seq, r->tokens, r->n_tokens - 1);
        uint32_t all_blocks = llmi_kv_seq_blocks_needed(kv, &r->seq, r->n_tokens + 1);
        if (all_blocks > llmi_kv_available(kv)) {
            llmi_kv_seq_release(kv, &r->seq); /* give the matched blocks back */
            if (s->n_running > 0) break;      /* running requests free blocks */
            /* Nothing runs that will free blocks: token-level sequences
             * hold them, and the request would wait for as long as they
             * stay open. It ends now, with the reason, rather than never. */
            llmi_error(LLM_ERR_LIMIT,
                       "request %llu needs %u KV blocks; %u are free or cached, the rest held "
                       "by token-level sequences",
                       (unsigned long long)r->id, all_blocks, llmi_kv_available(kv));
            LLMI_TRY(llmi_sched_emit_finish(s, r, LLM_FINISH_ERROR, LLM_ERR_LIMIT));
            remove_at(s->waiting, &s->n_waiting, wi);
            llmi_request_free(s, r);
            continue;
        }
        uint32_t n = r->n_tokens - r->seq.n_tokens;
        if (n > pl->budget) n = pl->budget;
        llm_status st = llmi_kv_seq_reserve(kv, &r->seq, r->seq.n_tokens + n);
        if (st != LLM_OK) {
            llmi_kv_seq_release(kv, &r->seq);
            return st == LLM_ERR_LIMIT ? LLM_OK : st;
        }
        if (!llmi_sched_push(&s->running, &s->n_running, &s->cap_running, r)) {
            llmi_kv_seq_release(kv, &r->seq);
            return llmi_oom("running list");
        }
        remove_at(s->waiting, &s->n_waiting, wi);
        r->running = true;
        add_rows(s, pl, r, n);
    }
    return LLM_OK;
}

/* Drafts for speculating requests whose rows reach the end of their
 * tokens, from what the budget and the free KV blocks still allow. Fails
 * only when out of memory: then the step fails, and changes nothing. */
static llm_status plan_spec(llmi_sched *s, plan *pl) {
    llmi_kv *kv = s->kv;
    uint32_t producing = 0;
    for (size_t i = 0; i < s->n_running; i++)
        producing += s->running[i]->in_flight && s->running[i]->wants_logits;
    /* Also with no budget left: a sampling draft model still decides the
     * request's next token (see spec.h), so its tokens do not depend on
     * what else runs. */
    for (size_t i = 0; i < s->n_running; i++) {
        llmi_request *r = s->running[i];
        /* Not while samples wait to start from this row's logits: they
         * fork the prompt's KV, which must not hold drafts then. */
        if (!r->in_flight || !r->wants_logits || r->cancelled || r->spec.mode == LLM_SPEC_NONE ||
            r->n_forks)
            continue;
        uint32_t L = r->n_tokens, n_ctx = s->n_ctx;
        /* Rows L-1..L-1+k inside the context; no more tokens than the
         * request may still generate; only free blocks. */
        uint32_t max_k = pl->budget;
        if (max_k > (L < n_ctx ? n_ctx - L : 0)) max_k = L < n_ctx ? n_ctx - L : 0;
        uint32_t left = r->max_new > r->n_generated + 1 ? r->max_new - r->n_generated - 1 : 0;
        if (max_k > left) max_k = left;
        while (max_k > 0 && llmi_kv_seq_blocks_needed(kv, &r->seq, L + max_k) > kv->n_free)
            max_k--;
        llmi_spec_batch batch = {pl->n_rows, producing};
        LLMI_TRY(llmi_spec_plan(s->spec, &r->spec, &r->sampling, r->tokens, L, max_k,
                                batch));
        uint32_t k = r->spec.k;
        /* Free blocks suffice; only growing the block table can fail. */
        if (k) LLMI_TRY(llmi_kv_seq_reserve(kv, &r->seq, L + k));
        pl->n_rows += k;
        pl->budget -= k;
    }
    return LLM_OK;
}

/* Writes the planned rows, request by request in running order: its own
 * rows, then its drafts (the draft model's are filled in once it ran), all
 * with logits. Sets each request's first row and first logits row. */
static uint32_t build_rows(llmi_sched *s) {
    uint32_t n = 0, n_logits = 0;
    for (size_t i = 0; i < s->n_running; i++) {
        llmi_request *r = s->running[i];
        if (!r->in_flight) continue;
        uint32_t start = r->seq.n_tokens;
        r->first_row = n;
        for (uint32_t j = 0; j < r->plan_rows; j++)
            s->eng->rows[n++] = (llmi_batch_row){
                r->tokens[start + j], start + j, &r->seq, false, r->adapter, r->adapter_scale};
        if (!r->wants_logits) continue;
        s->eng->rows[n - 1].want_logits = true;
        for (uint32_t j = 0; j < r->spec.k; j++)
            s->eng->rows[n++] = (llmi_batch_row){r->tokens[r->n_tokens + j], r->n_tokens + j,
                                                 &r->seq, true, r->adapter, r->adapter_scale};
        r->logits_row = n_logits;
        n_logits += 1 + r->spec.k;
    }
    return n_logits;
}

/* Jobs for the draft model: in-flight requests it drafts for. */
static llm_status collect_draft_jobs(llmi_sched *s, uint32_t *n_jobs) {
    *n_jobs = 0;
    if (!s->spec->draft) return LLM_OK;
    for (size_t i = 0; i < s->n_running; i++) {
        llmi_request *r = s->running[i];
        if (!r->in_flight || !r->spec.run_draft) continue;
        if (*n_jobs == s->cap_spec_jobs) {
            size_t cap = s->cap_spec_jobs ? s->cap_spec_jobs * 2 : 16;
            llmi_spec_job *j = llmi_realloc(s->spec_jobs, cap * sizeof *j);
            if (!j) return llmi_oom("draft jobs");
            s->spec_jobs = j;
            s->cap_spec_jobs = cap;
        }
        s->spec_jobs[(*n_jobs)++] = (llmi_spec_job){
            &r->spec, r->tokens, r->n_tokens, r->n_generated, &r->sampling, s->model->tok};
    }
    return LLM_OK;
}

/* Runs the draft model (outside the lock: it only touches in-flight
 * requests and its own KV) and puts its drafts into their rows. */
static llm_status run_drafts(llmi_sched *s, uint32_t n_jobs) {
    LLMI_TRY(llmi_spec_draft_run(s->spec, s->spec_jobs, n_jobs));
    for (size_t i = 0; i < s->n_running; i++) {
        llmi_request *r = s->running[i];
        if (!r->in_flight || !r->spec.run_draft) continue;
        uint32_t row = r->first_row + r->plan_rows;
        for (uint32_t j = 0; j < r->spec.k; j++)
            s->eng->rows[row + j].token = r->tokens[r->n_tokens + j];
    }
    return LLM_OK;
}

/* Reports and removes cancelled requests that are not in flight. */
static llm_status finish_cancelled(llmi_sched *s) {
    llmi_request **lists[2] = {s->waiting, s->running};
    size_t *counts[2] = {&s->n_waiting, &s->n_running};
    for (int l = 0; l < 2; l++) {
        for (size_t i = 0; i < *counts[l];) {
            llmi_request *r = lists[l][i];
            if (!r->cancelled || r->in_flight) {
                i++;
                continue;
            }
            LLMI_TRY(llmi_sched_emit_finish(s, r,
                                            r->error ? LLM_FINISH_ERROR : LLM_FINISH_CANCELLED,
                                            r->error));
            remove_at(lists[l], counts[l], i);
            llmi_request_free(s, r);
        }
    }
    return LLM_OK;
}

/* ---- after the forward pass ---- */

/* The verifier's sink for a request: the token (already at
 * r->tokens[r->n_tokens]) joins the request and becomes an event. */
typedef struct push_ctx {
    llmi_sched *s;
    llmi_request *r;
    llm_finish_reason finish;
    llm_status err;
} push_ctx;

static bool push_token(void *ctx, llm_token tok, const float *lg) {
    push_ctx *c = ctx;
    llmi_sched *s = c->s;
    llmi_request *r = c->r;
    if (r->grammar) { /* the mask allowed it, so only memory can fail here */
        llm_status gst = llmi_gstate_accept_token(r->grammar, tok);
        if (gst != LLM_OK) {
            c->err = gst;
            return false;
        }
    }
    r->n_tokens++;
    r->n_generated++;
    s->generated_tokens++;
    /* One log-softmax for the token and its top list: equal bit for bit. */
    llm_token top[20];
    float top_lp[20], lp = 0.0f;
    uint32_t n_top = 0;
    if (r->logprobs || r->top_logprobs)
        lp = llmi_logprobs(s->sampler, lg, tok, r->top_logprobs, top, top_lp, &n_top);
    llm_status st = llmi_sched_emit_token(s, r, tok, r->logprobs ? lp : 0.0f, &c->finish);
    if (st == LLM_OK && r->top_logprobs)
        st = llmi_sched_attach_top(s, top, top_lp, n_top);
    if (st != LLM_OK) {
        c->err = st;
        return false;
    }
    return c->finish == LLM_FINISH_NONE;
}

/* For a model whose every layer is windowed: gives back r's blocks that no
 * later query reads. The next row is at position p = r->seq.n_tokens and
 * reads positions >= p - window + 1; no operation on a scheduled request
 * moves its KV below its current length (a rejected draft is rolled back
 * before this runs, to a length no shorter than the last one), so no
 * further margin is needed. Runs after the commit, so that the released
 * blocks stay in the prefix cache. */
static void release_window(llmi_sched *s, llmi_request *r) {
    const llmi_features *f = &s->model->hp.features;
    if (f->swa != LLMI_SWA_ALL || !s->swa_release) return;
    uint32_t next = r->seq.n_tokens;
    if (next + 1 > f->swa_window)
        llmi_kv_seq_release_before(s->kv, &r->seq, next + 1 - f->swa_window);
}

/* Decides r's tokens from its logits rows (`lg`: the first) and emits them;
 * true when r finished (the caller removes and frees it). A token that
 * could not be recorded (out of memory) fails r: it ends with
 * LLM_FINISH_ERROR, reported by finish_cancelled in the next iteration;
 * the others in the batch carry on. */
static bool settle(llmi_sched *s, llmi_request *r, const float *lg, llm_status *first_err) {
    /* Tokens from the request's rows: one (plain) or up to 1 + k (its
     * drafts). Random numbers are keyed by (seed, position), not by the
     * request id, so a seeded request gives the same tokens whenever it is
     * submitted and whatever runs beside it. */
    push_ctx pc = {s, r, LLM_FINISH_NONE, LLM_OK};
    bool stopped = false;
    s->sampler->grammar = r->grammar;
    s->sampler->grammar_status = LLM_OK;
    uint32_t n = llmi_spec_verify(s->spec, &r->spec, s->sampler, lg, &r->sampling,
                                  r->tokens, r->n_tokens, r->n_generated, s->model->tok,
                                  (llmi_spec_sink){push_token, &pc}, &stopped);
    s->sampler->grammar = NULL;
    if (pc.err == LLM_OK && s->sampler->grammar_status != LLM_OK)
        pc.err = s->sampler->grammar_status;
    uint64_t steps = s->spec_steps, drafted = s->spec_drafted, accepted = s->spec_accepted;
    llmi_spec_finish(s->spec, &r->spec, r->tokens, r->n_tokens, n, stopped, &s->spec_steps,
                     &s->spec_drafted, &s->spec_accepted);
    if (r->report) {
        r->report->n_spec_steps += (uint32_t)(s->spec_steps - steps);
        r->report->n_draft_tokens += (uint32_t)(s->spec_drafted - drafted);
        r->report->n_accepted_tokens += (uint32_t)(s->spec_accepted - accepted);
    }
    if (pc.err != LLM_OK) {
        if (*first_err == LLM_OK) *first_err = pc.err;
        r->error = pc.err;
        r->cancelled = true;
        llmi_kv_seq_release(s->kv, &r->seq);
        return false;
    }
    if (pc.finish != LLM_FINISH_NONE) return true;
    /* Roll back the rows of rejected drafts: the KV keeps every token but
     * the last, which the next step computes. */
    if (r->seq.n_tokens > r->n_tokens - 1)
        llmi_kv_seq_truncate(s->kv, &r->seq, r->n_tokens - 1);
    if (s->prefix_cache) llmi_kv_seq_commit(s->kv, &r->seq, r->tokens);
    release_window(s, r);
    return false;
}

/* Starts the samples waiting on r's prompt: each shares r's KV blocks
 * (copy-on-write) and joins the running list, to draw its first token from
 * r's logits row in settle_samples. Returns them (NULL, with r failed, when
 * the running list cannot grow); r no longer holds them. */
static llmi_request **start_samples(llmi_sched *s, llmi_request *r, uint32_t *n,
                                    llm_status *first_err) {
    *n = 0;
    if (!reserve_ptrs(&s->running, s->n_running + r->n_forks, &s->cap_running)) {
        llm_status st = llmi_oom("running list");
        if (*first_err == LLM_OK) *first_err = st;
        r->error = st;
        r->cancelled = true; /* its samples are reported with it */
        llmi_kv_seq_release(s->kv, &r->seq);
        return NULL;
    }
    llmi_request **kids = r->forks;
    *n = r->n_forks;
    r->forks = NULL;
    r->n_forks = 0;
    for (uint32_t i = 0; i < *n; i++) {
        llmi_request *c = kids[i];
        llm_status st = llmi_kv_seq_fork(s->kv, &r->seq, &c->seq);
        if (st != LLM_OK) { /* reported by finish_cancelled */
            if (*first_err == LLM_OK) *first_err = st;
            c->error = st;
            c->cancelled = true;
        }
        c->running = true;
        s->running[s->n_running++] = c;
    }
    return kids;
}

/* First tokens of started samples, from their parent's logits row `lg`. */
static void settle_samples(llmi_sched *s, llmi_request **kids, uint32_t n,
                           const float *lg, llm_status *first_err) {
    for (uint32_t i = 0; i < n; i++) {
        llmi_request *c = kids[i];
        if (c->cancelled || !settle(s, c, lg, first_err)) continue;
        for (size_t j = s->n_running; j-- > 0;)
            if (s->running[j] == c) {
                remove_at(s->running, &s->n_running, j);
                break;
            }
        llmi_request_free(s, c);
    }
    llmi_free(kids);
}

/* Returns the first failure of a request (see settle). */
static llm_status after_forward(llmi_sched *s, const float *logits) {
    uint32_t V = s->model->hp.n_vocab;
    llm_status first_err = LLM_OK;
    for (size_t i = 0; i < s->n_running;) {
        llmi_request *r = s->running[i];
        if (!r->in_flight) {
            i++;
            continue;
        }
        r->in_flight = false;
        if (r->cancelled) { /* finish_cancelled reports it */
            llmi_kv_seq_release(s->kv, &r->seq);
            i++;
            continue;
        }
        if (!r->wants_logits) { /* a prefill chunk */
            if (s->prefix_cache) llmi_kv_seq_commit(s->kv, &r->seq, r->tokens);
            release_window(s, r);
            i++;
            continue;
        }
        const float *lg = logits + (size_t)r->logits_row * V;
        uint32_t n_kids = 0;
        llmi_request **kids = NULL;
        if (r->n_forks) { /* the prompt is done: start the other samples */
            kids = start_samples(s, r, &n_kids, &first_err);
            if (!kids) {
                i++;
                continue;
            }
        }
        bool done = settle(s, r, lg, &first_err);
        /* After r's own token, so that events come in sample order. The
         * samples sit after i in the running list and are not in flight. */
        if (kids) settle_samples(s, kids, n_kids, lg, &first_err);
        if (done) {
            remove_at(s->running, &s->n_running, i);
            llmi_request_free(s, r);
            continue;
        }
        i++;
    }
    return first_err;
}

/* ---- step ---- */

static size_t deliver(llmi_sched *s, llm_event *events, size_t capacity, size_t event_size) {
    size_t n = 0;
    while (llmi_sched_events_pending(s) && n < capacity) {
        llmi_event_rec *rec = &s->events[s->events_delivered++];
        rec->ev.text = s->arena + rec->text_off;
        if (rec->ev.n_top) {
            rec->ev.top_tokens = (const llm_token *)(s->arena + rec->top_off);
            rec->ev.top_logprobs = (const float *)(rec->ev.top_tokens + rec->ev.n_top);
        }
        size_t sz = event_size < sizeof rec->ev ? event_size : sizeof rec->ev;
        memcpy((char *)events + n * event_size, &rec->ev, sz);
        n++;
    }
    return n;
}

bool llmi_sched_events_pending(llmi_sched *s) {
    while (s->events_delivered < s->n_events && s->events[s->events_delivered].taken)
        s->events_delivered++;
    return s->events_delivered < s->n_events;
}

static llm_status run_iteration(llmi_sched *s) {
    if (!llmi_sched_events_pending(s)) { /* a fresh queue */
        s->n_events = s->events_delivered = 0;
        s->n_arena = 0;
    }
    LLMI_TRY(finish_cancelled(s));
    plan pl = {0, s->max_batch_tokens, 0};
    llm_status ps = plan_running(s, &pl);
    if (ps == LLM_OK) ps = plan_admissions(s, &pl);
    if (ps == LLM_OK) ps = plan_spec(s, &pl);
    if (ps != LLM_OK) { /* nothing runs: no request may stay marked in flight */
        for (size_t i = 0; i < s->n_running; i++) s->running[i]->in_flight = false;
        return ps;
    }
    if (pl.n_rows == 0) return LLM_OK;
    uint32_t n_logits = build_rows(s), n_jobs = 0;
    llm_status rs = reserve_logits(s, n_logits ? n_logits : 1);
    if (rs == LLM_OK) rs = collect_draft_jobs(s, &n_jobs);
    if (rs != LLM_OK) {
        for (size_t i = 0; i < s->n_running; i++) s->running[i]->in_flight = false;
        return rs;
    }
    s->steps++;
    s->in_forward = true;
    pthread_mutex_unlock(&s->lock);
    llm_status st = n_jobs ? run_drafts(s, n_jobs) : LLM_OK;
    double t0 = llmi_now();
    if (st == LLM_OK)
        st = llmi_engine_run(s->eng, s->eng->rows, pl.n_rows,
                              s->logits);
    double seconds = llmi_now() - t0;
    pthread_mutex_lock(&s->lock);
    s->in_forward = false;
    if (st != LLM_OK) {
        for (size_t i = 0; i < s->n_running; i++) s->running[i]->in_flight = false;
        return st;
    }
    /* The cost model prices rows with logits (decode and draft rows; a
     * prefill row skips the output matrix): time the steps made of them. */
    if (n_logits == pl.n_rows && pl.n_rows <= LLMI_SPEC_COST_MAX_ROWS)
        llmi_spec_cost_observe(&s->spec->target_cost, pl.n_rows, seconds);
    s->prompt_tokens += pl.n_prompt_rows;
    return after_forward(s, s->logits);
}

llm_status llmi_sched_iterate(llmi_sched *s) { return run_iteration(s); }

void llmi_sched_drop(llmi_sched *s, llm_request_id id) {
    llmi_request **lists[2] = {s->waiting, s->running};
    size_t *counts[2] = {&s->n_waiting, &s->n_running};
    for (int l = 0; l < 2; l++)
        for (size_t i = *counts[l]; i-- > 0;)
            if (lists[l][i]->id == id) {
                llmi_request *r = lists[l][i];
                remove_at(lists[l], counts[l], i);
                llmi_request_free(s, r);
            }
    for (size_t i = s->events_delivered; i < s->n_events; i++)
        if (s->events[i].ev.request == id) s->events[i].taken = true;
}

llm_status llmi_sched_step(llmi_sched *s, llm_event *events, size_t capacity,
                           size_t event_size, size_t *n_events) {
    pthread_mutex_lock(&s->lock);
    llm_status st = LLM_OK;
    if (!llmi_sched_events_pending(s)) st = run_iteration(s);
    /* A failed iteration delivers nothing now: what it did produce (events of
     * other requests) is delivered by the next call, before a new iteration. */
    *n_events = st == LLM_OK ? deliver(s, events, capacity, event_size) : 0;
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* ---- stats and checks ---- */

static void count_fill(const llmi_kv *kv, const llmi_kv_seq *seq, uint32_t *fill) {
    for (uint32_t j = seq->n_holes; j < seq->n_blocks; j++) {
        uint64_t start = (uint64_t)j * kv->block_size;
        uint32_t n = seq->n_tokens <= start ? 0
                     : seq->n_tokens - start >= kv->block_size ? kv->block_size
                                                               : (uint32_t)(seq->n_tokens - start);
        if (n > fill[seq->blocks[j]]) fill[seq->blocks[j]] = n;
    }
}

void llmi_sched_stats(llmi_sched *s, llmi_kv_seq **const *extra,
                      const size_t *n_extra,
                      llm_session_stats *st) {
    const llmi_kv *kv = s->kv;
    pthread_mutex_lock(&s->lock);
    st->n_running = (uint32_t)s->n_running;
    st->n_waiting = (uint32_t)s->n_waiting;
    /* Samples not started yet wait with their request. */
    for (size_t i = 0; i < s->n_waiting; i++) st->n_waiting += s->waiting[i]->n_forks;
    for (size_t i = 0; i < s->n_running; i++) st->n_waiting += s->running[i]->n_forks;
    st->block_size = kv->block_size;
    st->blocks_total = kv->n_blocks;
    st->blocks_free = kv->n_free;
    st->blocks_cached = kv->n_cached;
    st->blocks_used = kv->n_blocks - kv->n_free - kv->n_cached;
    /* Token slots holding K/V, counting a block shared by several sequences
     * once: per block, the most slots any of its sequences fills. */
    if (!s->in_forward) {
        uint32_t *fill = s->stats_fill;
        memset(fill, 0, kv->n_blocks * sizeof *fill);
        for (size_t i = 0; i < s->n_running; i++) count_fill(kv, &s->running[i]->seq, fill);
        for (size_t i = 0; i < *n_extra; i++)
            if ((*extra)[i]) count_fill(kv, (*extra)[i], fill);
        uint64_t used_tokens = 0;
        for (uint32_t b = 0; b < kv->n_blocks; b++) used_tokens += fill[b];
        s->kv_tokens_used = used_tokens;
    }
    st->kv_tokens_used = s->kv_tokens_used;
    st->prefix_hit_tokens = kv->prefix_hit_tokens;
    st->prompt_tokens = s->prompt_tokens;
    st->generated_tokens = s->generated_tokens;
    st->preemptions = s->preemptions;
    st->steps = s->steps;
    st->spec_steps = s->spec_steps;
    st->spec_draft_tokens = s->spec_drafted;
    st->spec_accepted_tokens = s->spec_accepted;
    pthread_mutex_unlock(&s->lock);
}

llm_status llmi_sched_check(llmi_sched *s, llmi_kv_seq **const *extra,
                      const size_t *n_extra) {
    pthread_mutex_lock(&s->lock);
    size_t n = s->n_running + s->n_waiting + *n_extra + 1, k = 0; /* + 1: never 0 */
    const llmi_kv_seq **seqs = llmi_calloc(n, sizeof *seqs);
    llm_status st = LLM_OK;
    if (!seqs) {
        st = llmi_oom("check");
    } else {
        for (size_t i = 0; i < s->n_running; i++) seqs[k++] = &s->running[i]->seq;
        for (size_t i = 0; i < s->n_waiting; i++) seqs[k++] = &s->waiting[i]->seq;
        for (size_t i = 0; i < *n_extra; i++)
            if ((*extra)[i]) seqs[k++] = (*extra)[i];
        st = llmi_kv_check(s->kv, seqs, k);
        if (st == LLM_OK && s->spec->dkv) { /* the draft model's pool */
            k = 0;
            for (size_t i = 0; i < s->n_running; i++) seqs[k++] = &s->running[i]->spec.dseq;
            for (size_t i = 0; i < s->n_waiting; i++) seqs[k++] = &s->waiting[i]->spec.dseq;
            st = llmi_kv_check(s->spec->dkv, seqs, k);
            if (st != LLM_OK) llmi_error_prefix("draft model KV: ");
        }
        llmi_free(seqs);
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}
