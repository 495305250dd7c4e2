/* Embeddings: the final hidden states of token sequences, per token or
 * pooled into one vector per input (llm_session_embed).
 *
 * Each input runs as a temporary KV sequence of the session's pool that no
 * list knows and that is destroyed before the call returns, so nothing is
 * left behind and the prefix cache never sees these tokens. Inputs are fed
 * in order, as many rows per forward pass as the engine takes: a pass may
 * hold the tail of one input, several whole ones and the head of the next;
 * an input longer than a pass continues in the next one from its KV, as a
 * chunked prefill does. Only the input being fed when a pass ends carries
 * over, so at most one pass's inputs hold KV blocks at a time.
 *
 * An encoder (BERT: every position attends to every other) needs all of an
 * input in one pass, so there an input never splits: it waits for the next
 * pass; one longer than a pass is refused with LLM_ERR_LIMIT, one longer
 * than the model's learned positions with LLM_ERR_INVALID_ARGUMENT. */
#include "session/session.h"

#include <math.h>

llm_status llmi_model_pooling(const llm_model *m, llm_pooling *out) {
    /* llama.cpp's numbers for <arch>.pooling_type. */
    switch (m->hp.pooling_type) {
    case LLMI_POOLING_UNSET:
    case 1:
        *out = LLM_POOLING_MEAN;
        return LLM_OK;
    case 0:
        *out = LLM_POOLING_NONE;
        return LLM_OK;
    case 2:
        *out = LLM_POOLING_FIRST;
        return LLM_OK;
    case 3:
        *out = LLM_POOLING_LAST;
        return LLM_OK;
    case 4:
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s.pooling_type is 4 (rank: a reranker's classification head), "
                          "which embeddings do not support",
                          m->hp.arch);
    default:
        return llmi_error(LLM_ERR_UNSUPPORTED, "%s.pooling_type %u is not a known pooling",
                          m->hp.arch, m->hp.pooling_type);
    }
}

/* One call's work. */
typedef struct embed_job {
    llm_session *s;
    const llm_token *const *inputs;
    const size_t *n_tokens;
    size_t n_inputs;
    llm_pooling pooling;
    uint32_t n_embd;
    float *out;
    llmi_kv_seq *seqs; /* [n_inputs]: an input's KV while it is fed */
    float *hidden;     /* [max_rows][n_embd]: one pass's wanted rows */
    /* [max_rows]: the input and position of each wanted row of a pass. */
    size_t *want_input;
    uint32_t *want_pos;
    size_t *first_row; /* [n_inputs]: LLM_POOLING_NONE's first output row of each */
} embed_job;

static llm_status check_inputs(const embed_job *j, size_t *n_out_rows) {
    const uint32_t V = j->s->model->hp.n_vocab, n_ctx = j->s->params.n_ctx;
    size_t rows = 0;
    for (size_t i = 0; i < j->n_inputs; i++) {
        if (!j->inputs[i] && j->n_tokens[i] > 0)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "embedding input %zu is NULL", i);
        if (j->n_tokens[i] == 0)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "embedding input %zu is empty", i);
        if (j->n_tokens[i] > n_ctx)
            return llmi_error(LLM_ERR_LIMIT,
                              "embedding input %zu has %zu tokens, more than the context of %u", i,
                              j->n_tokens[i], n_ctx);
        if (j->s->model->hp.features.encoder) {
            const uint32_t pass = j->s->eng->max_rows, n_pos = j->s->model->hp.n_ctx_train;
            if (j->n_tokens[i] > n_pos) /* the input, not a resource, is at fault */
                return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                                  "embedding input %zu has %zu tokens, more than the %u "
                                  "positions this encoder has learned",
                                  i, j->n_tokens[i], n_pos);
            if (j->n_tokens[i] > pass)
                return llmi_error(
                    LLM_ERR_LIMIT,
                    "embedding input %zu has %zu tokens; an encoder runs an input "
                    "in one pass, of at most %u rows (llm_session_params.max_batch_tokens)",
                    i, j->n_tokens[i], pass);
        }
        for (size_t t = 0; t < j->n_tokens[i]; t++)
            if (j->inputs[i][t] < 0 || (uint32_t)j->inputs[i][t] >= V)
                return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                                  "embedding input %zu: token %zu is %d, outside the vocabulary "
                                  "of %u",
                                  i, t, j->inputs[i][t], V);
        rows += j->pooling == LLM_POOLING_NONE ? j->n_tokens[i] : 1;
    }
    *n_out_rows = rows;
    return LLM_OK;
}

static bool wants_row(llm_pooling pooling, uint32_t pos, size_t len) {
    switch (pooling) {
    case LLM_POOLING_FIRST:
        return pos == 0;
    case LLM_POOLING_LAST:
        return pos + 1 == len;
    default:
        return true;
    }
}

/* Reserves KV for the whole of input i. When the free blocks cannot take
 * it now, nothing is held and short_of holds the blocks it needs and those
 * that are free; else short_of[0] is 0. */
static llm_status reserve_input(embed_job *j, size_t i, uint32_t short_of[2]) {
    llm_session *s = j->s;
    const uint32_t len = (uint32_t)j->n_tokens[i];
    pthread_mutex_lock(&s->sched.lock);
    llm_status st = LLM_OK;
    const uint32_t need = llmi_kv_seq_blocks_needed(s->kv, &j->seqs[i], len);
    const uint32_t avail = llmi_kv_available(s->kv);
    short_of[0] = need <= avail ? 0 : need;
    short_of[1] = avail;
    if (need <= avail)
        st = llmi_kv_seq_reserve(s->kv, &j->seqs[i], len);
    pthread_mutex_unlock(&s->sched.lock);
    return st;
}

static void release_inputs(embed_job *j, size_t begin, size_t end) {
    pthread_mutex_lock(&j->s->sched.lock);
    for (size_t i = begin; i < end; i++)
        llmi_kv_seq_destroy(j->s->kv, &j->seqs[i]);
    pthread_mutex_unlock(&j->s->sched.lock);
}

/* Adds a pass's wanted rows to the outputs of their inputs. */
static void collect(embed_job *j, uint32_t n_want) {
    const uint32_t E = j->n_embd;
    for (uint32_t w = 0; w < n_want; w++) {
        const float *h = j->hidden + (size_t)w * E;
        const size_t i = j->want_input[w];
        if (j->pooling == LLM_POOLING_NONE) {
            memcpy(j->out + (j->first_row[i] + j->want_pos[w]) * E, h, E * sizeof *h);
        } else if (j->pooling == LLM_POOLING_MEAN) {
            float *o = j->out + i * E;
            for (uint32_t k = 0; k < E; k++)
                o[k] += h[k];
        } else {
            memcpy(j->out + i * E, h, E * sizeof *h);
        }
    }
}

/* Fills one pass from input *cur at position *pos on, runs it and collects
 * its rows. Inputs finished in it are released. */
static llm_status run_pass(embed_job *j, size_t *cur, uint32_t *pos) {
    llmi_engine *e = j->s->eng;
    const bool whole = j->s->model->hp.features.encoder;
    const size_t first = *cur;
    uint32_t n = 0, n_want = 0;
    while (n < e->max_rows && *cur < j->n_inputs) {
        const size_t i = *cur;
        const size_t len = j->n_tokens[i];
        if (whole && n > 0 && len > e->max_rows - n)
            break; /* an encoder's input waits for a pass it fits in */
        if (*pos == 0) {
            uint32_t short_of[2];
            LLMI_TRY(reserve_input(j, i, short_of));
            if (short_of[0] && n > 0)
                break; /* run what is here; it frees blocks */
            if (short_of[0])
                return llmi_error(LLM_ERR_LIMIT,
                                  "KV cache full: embedding input %zu needs %u blocks of %u "
                                  "tokens, %u are free",
                                  i, short_of[0], j->s->kv->block_size, short_of[1]);
        }
        uint32_t take = (uint32_t)(len - *pos);
        if (take > e->max_rows - n)
            take = e->max_rows - n;
        for (uint32_t t = 0; t < take; t++, n++) {
            const uint32_t p = *pos + t;
            const bool want = wants_row(j->pooling, p, len);
            e->rows[n] = (llmi_batch_row){j->inputs[i][p], p, &j->seqs[i], want};
            if (want) {
                j->want_input[n_want] = i;
                j->want_pos[n_want++] = p;
            }
        }
        *pos += take;
        if (*pos == len) {
            (*cur)++;
            *pos = 0;
        }
    }
    LLMI_TRY(llmi_engine_run_hidden(e, e->rows, n, j->hidden));
    collect(j, n_want);
    release_inputs(j, first, *cur);
    return LLM_OK;
}

static void finish_vectors(const embed_job *j, size_t n_rows, bool normalize) {
    const uint32_t E = j->n_embd;
    for (size_t r = 0; r < n_rows; r++) {
        float *o = j->out + r * E;
        if (j->pooling == LLM_POOLING_MEAN) {
            const float inv = 1.0f / (float)j->n_tokens[r];
            for (uint32_t k = 0; k < E; k++)
                o[k] *= inv;
        }
        if (!normalize)
            continue;
        double ss = 0.0;
        for (uint32_t k = 0; k < E; k++)
            ss += (double)o[k] * o[k];
        if (ss == 0.0)
            continue;
        const float inv = (float)(1.0 / sqrt(ss));
        for (uint32_t k = 0; k < E; k++)
            o[k] *= inv;
    }
}

static void job_free(embed_job *j) {
    if (j->seqs)
        release_inputs(j, 0, j->n_inputs);
    llmi_free(j->seqs);
    llmi_free_aligned(j->hidden);
    llmi_free(j->want_input);
    llmi_free(j->want_pos);
    llmi_free(j->first_row);
}

static llm_status job_alloc(embed_job *j) {
    const uint32_t max_rows = j->s->eng->max_rows;
    size_t hidden_bytes;
    if (!llmi_mul_ok((size_t)max_rows * j->n_embd, sizeof(float), &hidden_bytes))
        return llmi_error(LLM_ERR_LIMIT, "embedding rows overflow");
    j->seqs = llmi_calloc(j->n_inputs, sizeof *j->seqs);
    j->hidden = llmi_malloc_aligned(hidden_bytes);
    j->want_input = llmi_malloc((size_t)max_rows * sizeof *j->want_input);
    j->want_pos = llmi_malloc((size_t)max_rows * sizeof *j->want_pos);
    if (j->pooling == LLM_POOLING_NONE)
        j->first_row = llmi_malloc(j->n_inputs * sizeof *j->first_row);
    if (!j->seqs || !j->hidden || !j->want_input || !j->want_pos ||
        (j->pooling == LLM_POOLING_NONE && !j->first_row))
        return llmi_oom("embedding scratch");
    if (j->first_row) {
        size_t row = 0;
        for (size_t i = 0; i < j->n_inputs; i++) {
            j->first_row[i] = row;
            row += j->n_tokens[i];
        }
    }
    return LLM_OK;
}

llm_status llmi_session_embed(llm_session *s, const llm_token *const *inputs,
                              const size_t *n_tokens, size_t n_inputs, const llm_embed_params *p,
                              float *out, size_t capacity, size_t *n_floats) {
    *n_floats = 0;
    if (n_inputs == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llm_session_embed: no inputs");
    embed_job j = {.s = s,
                   .inputs = inputs,
                   .n_tokens = n_tokens,
                   .n_inputs = n_inputs,
                   .pooling = p->pooling,
                   .n_embd = s->model->hp.n_embd};
    if (j.pooling == LLM_POOLING_MODEL)
        LLMI_TRY(llmi_model_pooling(s->model, &j.pooling));
    if (j.pooling < LLM_POOLING_NONE || j.pooling > LLM_POOLING_LAST)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llm_embed_params.pooling %d is unknown",
                          (int)p->pooling);
    size_t n_rows = 0, need = 0;
    LLMI_TRY(check_inputs(&j, &n_rows));
    if (!llmi_mul_ok(n_rows, j.n_embd, &need))
        return llmi_error(LLM_ERR_LIMIT, "embeddings of %zu vectors overflow", n_rows);
    *n_floats = need;
    if (capacity < need)
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL,
                          "embeddings need %zu floats (%zu vectors of %u), capacity %zu", need,
                          n_rows, j.n_embd, capacity);
    if (!llmi_engine_has_hidden(s->eng))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "backend '%s' cannot return hidden states, which embeddings need",
                          s->eng->ops->name);
    j.out = out;
    llm_status st = job_alloc(&j);
    if (st == LLM_OK && j.pooling == LLM_POOLING_MEAN)
        memset(out, 0, need * sizeof *out);
    size_t cur = 0;
    uint32_t pos = 0;
    while (st == LLM_OK && cur < n_inputs)
        st = run_pass(&j, &cur, &pos);
    if (st == LLM_OK)
        finish_vectors(&j, n_rows, p->normalize);
    job_free(&j);
    if (st != LLM_OK)
        *n_floats = 0;
    return st;
}
