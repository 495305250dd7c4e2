/* Token-level API: host-driven sequences and batches over the session's KV
 * pool. Sequences are never preempted; the session lock is taken around
 * every KV change because requests on other threads share the pool. */
#include "session/session.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

struct llm_batch {
    uint32_t capacity, n;
    llm_seq_id *seq;
    uint32_t *pos;
    llm_token *token;
    bool *want_logits;
};

llm_status llmi_batch_create(uint32_t capacity, llm_batch **out) {
    *out = NULL;
    if (capacity == 0 || capacity > (1u << 20))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "batch capacity %u must be in 1..%u", capacity,
                          1u << 20);
    llm_batch *b = llmi_calloc(1, sizeof *b);
    if (!b)
        return llmi_oom("batch");
    b->capacity = capacity;
    b->seq = llmi_calloc(capacity, sizeof *b->seq);
    b->pos = llmi_calloc(capacity, sizeof *b->pos);
    b->token = llmi_calloc(capacity, sizeof *b->token);
    b->want_logits = llmi_calloc(capacity, sizeof *b->want_logits);
    if (!b->seq || !b->pos || !b->token || !b->want_logits) {
        llmi_batch_free(b);
        return llmi_oom("batch rows");
    }
    *out = b;
    return LLM_OK;
}

void llmi_batch_free(llm_batch *b) {
    if (!b)
        return;
    llmi_free(b->seq);
    llmi_free(b->pos);
    llmi_free(b->token);
    llmi_free(b->want_logits);
    llmi_free(b);
}

void llmi_batch_clear(llm_batch *b) { b->n = 0; }

llm_status llmi_batch_add(llm_batch *b, llm_seq_id seq, uint32_t pos, llm_token tok, bool want) {
    if (b->n == b->capacity)
        return llmi_error(LLM_ERR_LIMIT, "batch is full (%u rows)", b->capacity);
    b->seq[b->n] = seq;
    b->pos[b->n] = pos;
    b->token[b->n] = tok;
    b->want_logits[b->n] = want;
    b->n++;
    return LLM_OK;
}

/* ---- sequences ---- */

static llmi_kv_seq *find_seq(llm_session *s, llm_seq_id id) {
    if (id < 0 || (size_t)id >= s->n_seqs)
        return NULL;
    return s->seqs[id];
}

llmi_tseq *llmi_seq_find(llm_session *s, llm_seq_id id) {
    llmi_kv_seq *q = find_seq(s, id);
    return q ? llmi_tseq_of(q) : NULL;
}

llm_status llmi_tseq_reserve(llmi_tseq *t, uint32_t n) {
    if (n <= t->cap)
        return LLM_OK;
    /* Doubling: decoding one token at a time must not copy the history
     * every step. n <= n_ctx <= 2^20, so this cannot overflow. */
    uint64_t cap = t->cap ? t->cap : 16;
    while (cap < n)
        cap *= 2;
    llm_token *p = llmi_realloc(t->tokens, (size_t)cap * sizeof *p);
    if (!p)
        return llmi_oom("sequence tokens");
    t->tokens = p;
    t->cap = (uint32_t)cap;
    return LLM_OK;
}

void llmi_tseq_free(llm_session *s, llmi_kv_seq *q, bool lock) {
    if (!q)
        return;
    if (lock)
        pthread_mutex_lock(&s->sched.lock);
    llmi_kv_seq_destroy(s->kv, q);
    if (lock)
        pthread_mutex_unlock(&s->sched.lock);
    llmi_free(llmi_tseq_of(q)->tokens);
    llmi_free(llmi_tseq_of(q));
}

static llm_status bad_seq(llm_seq_id id) {
    return llmi_error(LLM_ERR_NOT_FOUND, "sequence %d is not open", id);
}

/* A free slot id (growing the table); under the lock. */
llm_status llmi_seq_new_slot(llm_session *s, llm_seq_id *out) {
    for (size_t i = 0; i < s->n_seqs; i++)
        if (!s->seqs[i]) {
            *out = (llm_seq_id)i;
            return LLM_OK;
        }
    if (s->n_seqs >= INT32_MAX)
        return llmi_error(LLM_ERR_LIMIT, "too many sequences");
    llmi_kv_seq **t = llmi_realloc(s->seqs, (s->n_seqs + 1) * sizeof *t);
    if (!t)
        return llmi_oom("sequence table");
    s->seqs = t;
    s->seqs[s->n_seqs] = NULL;
    *out = (llm_seq_id)s->n_seqs++;
    return LLM_OK;
}

llm_status llmi_seq_open(llm_session *s, const llm_seq_id *src_id, llm_seq_id *out) {
    pthread_mutex_lock(&s->sched.lock);
    llm_seq_id id = -1;
    llmi_tseq *seq = NULL;
    llmi_tseq *src = src_id ? llmi_seq_find(s, *src_id) : NULL;
    llm_status st = src_id && !src ? bad_seq(*src_id) : llmi_seq_new_slot(s, &id);
    if (st == LLM_OK && !(seq = llmi_calloc(1, sizeof *seq)))
        st = llmi_oom("sequence");
    /* The fork's tokens are copied before its blocks are shared, so a
     * failure leaves the pool untouched. */
    if (st == LLM_OK && src)
        st = llmi_tseq_reserve(seq, src->kv.n_tokens);
    if (st == LLM_OK && src) {
        if (src->kv.n_tokens)
            memcpy(seq->tokens, src->tokens, src->kv.n_tokens * sizeof *seq->tokens);
        st = llmi_kv_seq_fork(s->kv, &src->kv, &seq->kv);
        seq->adapter = src->adapter;
        seq->adapter_scale = src->adapter_scale;
        seq->wait_fingerprint = src->wait_fingerprint;
        seq->wait_scale = src->wait_scale;
    }
    if (st == LLM_OK) {
        s->seqs[id] = &seq->kv;
        *out = id;
    } else if (seq) {
        llmi_free(seq->tokens);
        llmi_free(seq);
    }
    pthread_mutex_unlock(&s->sched.lock);
    return st;
}

llm_status llmi_seq_close(llm_session *s, llm_seq_id id) {
    pthread_mutex_lock(&s->sched.lock);
    llmi_kv_seq *seq = find_seq(s, id);
    llm_status st = seq ? LLM_OK : bad_seq(id);
    if (seq) {
        llmi_tseq_free(s, seq, false);
        s->seqs[id] = NULL;
    }
    pthread_mutex_unlock(&s->sched.lock);
    return st;
}

llm_status llmi_seq_truncate(llm_session *s, llm_seq_id id, uint32_t n_tokens) {
    pthread_mutex_lock(&s->sched.lock);
    llmi_kv_seq *seq = find_seq(s, id);
    llm_status st = seq ? LLM_OK : bad_seq(id);
    if (seq && n_tokens > seq->n_tokens)
        st = llmi_error(LLM_ERR_INVALID_ARGUMENT, "cannot truncate sequence %d of %u tokens to %u",
                        id, seq->n_tokens, n_tokens);
    else if (seq)
        llmi_kv_seq_truncate(s->kv, seq, n_tokens);
    pthread_mutex_unlock(&s->sched.lock);
    return st;
}

/* Scales match when their bits do: the saved K/V were computed with
 * exactly this float. */
static bool same_scale(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

llm_status llmi_seq_check_adapter(const llmi_tseq *t, llm_seq_id id) {
    if (!t->wait_fingerprint)
        return LLM_OK;
    return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                      "sequence %d was restored from a state saved with LoRA adapter %016llx at "
                      "scale %.9g: call llm_seq_set_adapter with that adapter and scale before "
                      "decoding it",
                      id, (unsigned long long)t->wait_fingerprint, (double)t->wait_scale);
}

/* Under the lock. A sequence's K/V depend on its adapter: the adapter is
 * chosen before the first token, or, for a restored sequence holding K/V
 * computed under an adapter, is that adapter at that scale. */
static llm_status adapter_allowed(const llmi_tseq *t, llm_seq_id id, const llm_adapter *adapter,
                                  float scale) {
    bool empty = !t->kv.n_tokens && !t->kv.n_blocks;
    if (t->wait_fingerprint && !empty &&
        (!adapter || adapter->fingerprint != t->wait_fingerprint ||
         !same_scale(scale, t->wait_scale))) {
        char given[64] = "no adapter";
        if (adapter)
            snprintf(given, sizeof given, "adapter %016llx at scale %.9g",
                     (unsigned long long)adapter->fingerprint, (double)scale);
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_seq_set_adapter: sequence %d holds %u tokens saved with LoRA "
                          "adapter %016llx at scale %.9g; it was given %s",
                          id, t->kv.n_tokens, (unsigned long long)t->wait_fingerprint,
                          (double)t->wait_scale, given);
    }
    if (!t->wait_fingerprint && !empty)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "sequence %d holds %u tokens: set its adapter before decoding any", id,
                          t->kv.n_tokens);
    return LLM_OK;
}

llm_status llmi_seq_set_adapter(llm_session *s, llm_seq_id id, const llm_adapter *adapter,
                                float scale) {
    if (adapter && adapter->model != s->model)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_seq_set_adapter: the adapter was loaded for another model");
    if (adapter && !isfinite(scale))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llm_seq_set_adapter: scale is not finite");
    if (adapter && !llmi_engine_has_lora(s->eng))
        return llmi_engine_lora_refused(s->eng);
    pthread_mutex_lock(&s->sched.lock);
    llmi_tseq *t = llmi_seq_find(s, id);
    llm_status st = t ? adapter_allowed(t, id, adapter, scale) : bad_seq(id);
    if (st == LLM_OK) {
        t->adapter = adapter;
        t->adapter_scale = scale;
        t->wait_fingerprint = 0;
        t->wait_scale = 0.0f;
        /* Token-level sequences never register blocks in the prefix cache
         * (n_hashed is 0), so a restored one may take its seed here. */
        if (t->kv.n_hashed == 0)
            t->kv.chain_seed = t->kv.last_hash = llmi_adapter_chain_seed(adapter, scale);
    }
    pthread_mutex_unlock(&s->sched.lock);
    return st;
}

llm_status llmi_seq_length(llm_session *s, llm_seq_id id, uint32_t *n_tokens) {
    pthread_mutex_lock(&s->sched.lock);
    llmi_kv_seq *seq = find_seq(s, id);
    if (seq)
        *n_tokens = seq->n_tokens;
    pthread_mutex_unlock(&s->sched.lock);
    return seq ? LLM_OK : bad_seq(id);
}

llm_status llmi_seq_tokens(llm_session *s, llm_seq_id id, llm_token *tokens, size_t capacity,
                           size_t *n_tokens) {
    /* Only this thread changes token-level sequences: no lock needed. */
    const llmi_tseq *t = llmi_seq_find(s, id);
    if (!t)
        return bad_seq(id);
    *n_tokens = t->kv.n_tokens;
    if (capacity < t->kv.n_tokens)
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL, "sequence %d holds %u tokens, capacity %zu", id,
                          t->kv.n_tokens, capacity);
    if (t->kv.n_tokens)
        memcpy(tokens, t->tokens, t->kv.n_tokens * sizeof *tokens);
    return LLM_OK;
}

/* ---- decode ---- */

/* Checks rows and reserves KV for all of them, or for none. Under the lock. */
static llm_status prepare_decode(llm_session *s, const llm_batch *b) {
    uint32_t V = s->model->hp.n_vocab, n_ctx = s->params.n_ctx;
    /* Expected next position per sequence, tracked in a scratch table. */
    uint32_t *next = llmi_malloc((s->n_seqs ? s->n_seqs : 1) * sizeof *next);
    if (!next)
        return llmi_oom("decode check");
    for (size_t i = 0; i < s->n_seqs; i++)
        next[i] = s->seqs[i] ? s->seqs[i]->n_tokens : 0;
    llm_status st = LLM_OK;
    for (uint32_t r = 0; r < b->n && st == LLM_OK; r++) {
        llmi_kv_seq *seq = find_seq(s, b->seq[r]);
        if (!seq)
            st = bad_seq(b->seq[r]);
        else if (llmi_tseq_of(seq)->wait_fingerprint)
            st = llmi_seq_check_adapter(llmi_tseq_of(seq), b->seq[r]);
        else if (b->token[r] < 0 || (uint32_t)b->token[r] >= V)
            st = llmi_error(LLM_ERR_INVALID_ARGUMENT, "row %u: token %d outside vocabulary of %u",
                            r, b->token[r], V);
        else if (b->pos[r] != next[b->seq[r]])
            st = llmi_error(LLM_ERR_INVALID_ARGUMENT,
                            "row %u: sequence %d continues at position %u, not %u", r, b->seq[r],
                            next[b->seq[r]], b->pos[r]);
        else if (b->pos[r] >= n_ctx)
            st = llmi_error(LLM_ERR_LIMIT, "row %u: position %u exceeds the context of %u", r,
                            b->pos[r], n_ctx);
        else
            next[b->seq[r]]++;
    }
    uint64_t need = 0;
    for (size_t i = 0; i < s->n_seqs && st == LLM_OK; i++)
        if (s->seqs[i])
            need += llmi_kv_seq_blocks_needed(s->kv, s->seqs[i], next[i]);
    if (st == LLM_OK && need > llmi_kv_available(s->kv))
        st = llmi_error(LLM_ERR_LIMIT, "KV cache full: the batch needs %llu blocks, %u available",
                        (unsigned long long)need, llmi_kv_available(s->kv));
    /* Room for the rows' tokens first: once the forward pass runs, they
     * are recorded without allocating. */
    for (size_t i = 0; i < s->n_seqs && st == LLM_OK; i++)
        if (s->seqs[i] && next[i] > s->seqs[i]->n_tokens)
            st = llmi_tseq_reserve(llmi_tseq_of(s->seqs[i]), next[i]);
    for (size_t i = 0; i < s->n_seqs && st == LLM_OK; i++)
        if (s->seqs[i] && next[i] > s->seqs[i]->n_tokens)
            st = llmi_kv_seq_reserve(s->kv, s->seqs[i], next[i]);
    llmi_free(next);
    return st;
}

/* Makes decode_logits hold at least n rows (grows rarely, never shrinks).
 * Decodes have their own rows: the logits a caller reads stay those of its
 * last decode whatever steps and llm_generate compute in between. */
static llm_status reserve_decode_logits(llm_session *s, uint32_t n) {
    if (n <= s->cap_decode_logits)
        return LLM_OK;
    size_t bytes;
    if (!llmi_mul_ok((size_t)n * s->model->hp.n_vocab, sizeof(float), &bytes))
        return llmi_error(LLM_ERR_LIMIT, "logits for %u rows overflow", n);
    float *l = llmi_malloc_aligned(bytes);
    if (!l)
        return llmi_oom("decode logits");
    llmi_free_aligned(s->decode_logits);
    s->decode_logits = l;
    s->cap_decode_logits = n;
    return LLM_OK;
}

llm_status llmi_session_decode(llm_session *s, const llm_batch *b) {
    pthread_mutex_lock(&s->sched.lock);
    llm_status st = prepare_decode(s, b);
    uint32_t n_logits = 0;
    for (uint32_t r = 0; r < b->n; r++)
        n_logits += b->want_logits[r];
    if (st == LLM_OK)
        st = reserve_decode_logits(s, n_logits ? n_logits : 1);
    if (st == LLM_OK && b->n > s->cap_decode_rows) {
        uint32_t *m = llmi_realloc(s->decode_rows, b->n * sizeof *m);
        if (m) {
            s->decode_rows = m;
            s->cap_decode_rows = b->n;
        } else {
            st = llmi_oom("decode rows");
        }
    }
    pthread_mutex_unlock(&s->sched.lock);
    s->n_decode_rows = 0;
    if (st != LLM_OK)
        return st;
    uint32_t V = s->model->hp.n_vocab, out_row = 0;
    for (uint32_t done = 0; done < b->n;) {
        uint32_t chunk = b->n - done;
        if (chunk > s->params.max_batch_tokens)
            chunk = s->params.max_batch_tokens;
        uint32_t first_out = out_row;
        for (uint32_t i = 0; i < chunk; i++) {
            uint32_t r = done + i;
            const llmi_tseq *t = llmi_tseq_of(s->seqs[b->seq[r]]);
            s->eng->rows[i] = (llmi_batch_row){b->token[r],       b->pos[r],  s->seqs[b->seq[r]],
                                               b->want_logits[r], t->adapter, t->adapter_scale};
            /* Past the sequence's length until the pass below extends it. */
            llmi_tseq_of(s->seqs[b->seq[r]])->tokens[b->pos[r]] = b->token[r];
            s->decode_rows[r] = b->want_logits[r] ? out_row++ : UINT32_MAX;
        }
        st = llmi_engine_run(s->eng, s->eng->rows, chunk, s->decode_logits + (size_t)first_out * V);
        if (st != LLM_OK) {
            /* All or none: undo the chunks that ran. A sequence's first row
             * in the batch sits at its old length. */
            pthread_mutex_lock(&s->sched.lock);
            for (uint32_t r = 0; r < done; r++) {
                llmi_kv_seq *q = s->seqs[b->seq[r]];
                if (q->n_tokens > b->pos[r])
                    llmi_kv_seq_truncate(s->kv, q, b->pos[r]);
            }
            pthread_mutex_unlock(&s->sched.lock);
            return st;
        }
        done += chunk;
    }
    s->n_decode_rows = b->n;
    return LLM_OK;
}

llm_status llmi_session_logits(llm_session *s, uint32_t row, const float **out) {
    *out = NULL;
    if (row >= s->n_decode_rows)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "row %u is not in the last decoded batch (%u rows)", row,
                          s->n_decode_rows);
    if (s->decode_rows[row] == UINT32_MAX)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "row %u did not ask for logits", row);
    *out = s->decode_logits + (size_t)s->decode_rows[row] * s->model->hp.n_vocab;
    return LLM_OK;
}
