/* Session lifetime and the blocking generation loop. */
#include "session/session.h"

#include <stdio.h>
#include <unistd.h>


/* Copies the caller's params, reading only what its struct_size covers, and
 * resolves zeros to defaults. */
static llm_status resolve_params(const llm_model *m, const llm_session_params *in,
                                 llm_session_params *p) {
    llm_session_params_init(p);
    if (in) {
        if (in->struct_size < sizeof(uint32_t) || in->struct_size > (1u << 16))
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "llm_session_params.struct_size %u is invalid (call "
                              "llm_session_params_init)",
                              in->struct_size);
        memcpy(p, in, in->struct_size < sizeof *p ? in->struct_size : sizeof *p);
        p->struct_size = sizeof *p;
    }
    if (p->n_threads == 0) p->n_threads = (uint32_t)llmi_cpu_count();
    if (p->n_threads > 512)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "n_threads %u is more than 512", p->n_threads);
    if (p->n_ctx == 0) p->n_ctx = m->hp.n_ctx_train;
    if (p->n_ctx > (1u << 20))
        return llmi_error(LLM_ERR_LIMIT, "n_ctx %u exceeds the maximum of %u", p->n_ctx,
                          1u << 20);
    if (p->max_batch_tokens == 0) p->max_batch_tokens = 512;
    if (p->max_batch_tokens > 65536)
        return llmi_error(LLM_ERR_LIMIT, "max_batch_tokens %u exceeds 65536",
                          p->max_batch_tokens);
    if (p->kv_block_size == 0) p->kv_block_size = 16;
    if (p->kv_block_size > 1024)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "kv_block_size %u exceeds 1024",
                          p->kv_block_size);
    if (p->kv_type != LLM_KV_F32)
        return llmi_error(LLM_ERR_UNSUPPORTED, "kv_type %d: only LLM_KV_F32 is implemented",
                          (int)p->kv_type);
    return LLM_OK;
}

static llm_status create_kv(llm_session *s) {
    const llmi_hparams *hp = &s->model->hp;
    uint32_t kv_dim = hp->n_head_kv * hp->head_dim;
    size_t block_bytes = llmi_kv_block_bytes(hp->n_layer, kv_dim, s->params.kv_block_size);
    uint64_t n_blocks;
    if (s->params.kv_cache_bytes == 0) {
        /* Default: a quarter of the memory available now, capped at 2 GiB,
         * and never less than one full context. Pages are touched only as
         * blocks are used. */
        uint64_t avail = (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t share = avail / 4 < (2ull << 30) ? avail / 4 : (2ull << 30);
        uint64_t one_ctx = (s->params.n_ctx + s->params.kv_block_size - 1) / s->params.kv_block_size;
        n_blocks = share / block_bytes;
        if (n_blocks < one_ctx) n_blocks = one_ctx;
        s->params.kv_cache_bytes = n_blocks * block_bytes;
    } else {
        n_blocks = s->params.kv_cache_bytes / block_bytes;
        if (n_blocks == 0)
            return llmi_error(LLM_ERR_LIMIT,
                              "kv_cache_bytes %llu is less than one KV block (%zu bytes)",
                              (unsigned long long)s->params.kv_cache_bytes, block_bytes);
    }
    if (n_blocks > UINT32_MAX / s->params.kv_block_size)
        return llmi_error(LLM_ERR_LIMIT, "KV cache of %llu blocks is too large",
                          (unsigned long long)n_blocks);
    return llmi_kv_create(hp->n_layer, kv_dim, s->params.kv_block_size, (uint32_t)n_blocks, &s->kv);
}

llm_status llmi_session_create(const llm_model *m, const llm_session_params *p,
                               llm_session **out) {
    *out = NULL;
    llm_session *s = llmi_calloc(1, sizeof *s);
    if (!s) return llmi_oom("session");
    s->model = m;
    llm_status st = resolve_params(m, p, &s->params);
    if (st != LLM_OK) goto fail;
    if ((st = llmi_pool_create((int)s->params.n_threads, &s->pool)) != LLM_OK) goto fail;
    if ((st = create_kv(s)) != LLM_OK) goto fail;
    st = llmi_forward_create(m, s->pool, s->params.max_batch_tokens, s->params.n_ctx, &s->fwd);
    if (st != LLM_OK) goto fail;
    if ((st = llmi_sampler_init(&s->sampler, m->hp.n_vocab)) != LLM_OK) goto fail;
    if ((st = llmi_sched_init(&s->sched)) != LLM_OK) goto fail;
    s->sched_ready = true;
    s->rows = llmi_calloc(s->params.max_batch_tokens, sizeof *s->rows);
    s->stats_fill = llmi_calloc(s->kv->n_blocks, sizeof *s->stats_fill);
    s->logits = llmi_malloc_aligned((size_t)m->hp.n_vocab * sizeof(float));
    s->piece_cap = 256;
    s->piece = llmi_malloc(s->piece_cap);
    if (!s->rows || !s->logits || !s->piece || !s->stats_fill) {
        st = llmi_oom("session buffers");
        goto fail;
    }
    *out = s;
    return LLM_OK;
fail:
    llmi_session_free(s);
    return st;
}

llm_status llmi_session_reserve_logits(llm_session *s, uint32_t n) {
    if (n <= s->cap_logit_rows) return LLM_OK;
    size_t bytes;
    if (!llmi_mul_ok((size_t)n * s->model->hp.n_vocab, sizeof(float), &bytes))
        return llmi_error(LLM_ERR_LIMIT, "logits for %u rows overflow", n);
    float *l = llmi_malloc_aligned(bytes);
    if (!l) return llmi_oom("logits");
    llmi_free_aligned(s->batch_logits);
    s->batch_logits = l;
    s->cap_logit_rows = n;
    return LLM_OK;
}

void llmi_session_free(llm_session *s) {
    if (!s) return;
    if (s->sched_ready) llmi_sched_destroy(s, &s->sched);
    for (size_t i = 0; i < s->n_seqs; i++) {
        if (s->seqs[i]) llmi_kv_seq_destroy(s->kv, s->seqs[i]);
        llmi_free(s->seqs[i]);
    }
    llmi_free(s->seqs);
    llmi_free(s->decode_rows);
    llmi_free(s->stats_fill);
    llmi_free_aligned(s->batch_logits);
    if (s->kv) llmi_kv_seq_destroy(s->kv, &s->seq);
    llmi_sampler_destroy(&s->sampler);
    llmi_forward_free(s->fwd);
    llmi_kv_free(s->kv);
    llmi_pool_free(s->pool);
    llmi_free(s->rows);
    llmi_free_aligned(s->logits);
    llmi_free(s->piece);
    llmi_free(s);
}

llm_status llmi_session_feed(llm_session *s, llmi_kv_seq *seq, const llm_token *tokens,
                             size_t n, bool want_last_logits) {
    uint32_t start = seq->n_tokens;
    if (n > s->params.n_ctx - start)
        return llmi_error(LLM_ERR_LIMIT, "%zu tokens after %u exceed the context of %u", n, start,
                          s->params.n_ctx);
    /* Requests on other threads share the pool: reserve under the lock. */
    pthread_mutex_lock(&s->sched.lock);
    llm_status st = llmi_kv_seq_reserve(s->kv, seq, start + (uint32_t)n);
    pthread_mutex_unlock(&s->sched.lock);
    LLMI_TRY(st);
    for (size_t done = 0; done < n;) {
        uint32_t chunk = (uint32_t)(n - done);
        if (chunk > s->params.max_batch_tokens) chunk = s->params.max_batch_tokens;
        for (uint32_t i = 0; i < chunk; i++) {
            s->rows[i] = (llmi_batch_row){tokens[done + i], start + (uint32_t)(done + i), seq,
                                          false};
        }
        bool last = done + chunk == n;
        s->rows[chunk - 1].want_logits = last && want_last_logits;
        LLMI_TRY(llmi_forward_run(s->fwd, s->kv, s->rows, chunk, s->logits));
        done += chunk;
    }
    return LLM_OK;
}

static llm_status read_generate_params(const llm_generate_params *in, llm_generate_params *p) {
    llm_generate_params_init(p);
    if (!in) return LLM_OK;
    if (in->struct_size < sizeof(uint32_t) || in->struct_size > (1u << 16))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_generate_params.struct_size %u is invalid (call "
                          "llm_generate_params_init)",
                          in->struct_size);
    memcpy(p, in, in->struct_size < sizeof *p ? in->struct_size : sizeof *p);
    p->struct_size = sizeof *p;
    return LLM_OK;
}

/* Streams the text `tok` completes to the callback; false = caller said stop. */
static llm_status emit(llm_session *s, llmi_detok *d, llm_token tok,
                       const llm_generate_params *p, bool *keep_going) {
    size_t n = 0;
    llm_status st = llmi_detok_push(d, tok, s->piece, s->piece_cap, &n);
    if (st == LLM_ERR_BUFFER_TOO_SMALL) {
        char *bigger = llmi_realloc(s->piece, n + 1);
        if (!bigger) return llmi_oom("text piece");
        s->piece = bigger;
        s->piece_cap = n + 1;
        st = llmi_detok_push(d, tok, s->piece, s->piece_cap, &n);
    }
    if (st != LLM_OK) return st;
    *keep_going = p->on_token ? p->on_token(tok, s->piece, n, p->user) : true;
    return LLM_OK;
}

static llm_status check_prompt(const llm_session *s, const llm_token *prompt, size_t n) {
    if (n == 0) return llmi_error(LLM_ERR_INVALID_ARGUMENT, "the prompt has no tokens");
    if (n > s->params.n_ctx)
        return llmi_error(LLM_ERR_LIMIT, "prompt of %zu tokens exceeds the context of %u tokens",
                          n, s->params.n_ctx);
    for (size_t i = 0; i < n; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= s->model->hp.n_vocab)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "prompt token %zu is %d, outside the vocabulary of %u", i, prompt[i],
                              s->model->hp.n_vocab);
    return LLM_OK;
}

llm_status llmi_generate(llm_session *s, const llm_token *prompt, size_t n_prompt,
                         const llm_generate_params *params, llm_generate_result *result) {
    llm_generate_params p;
    llm_sampling_params sp;
    LLMI_TRY(read_generate_params(params, &p));
    LLMI_TRY(llmi_sampling_params_read(p.sampling, s->model->hp.n_vocab, &sp));
    LLMI_TRY(check_prompt(s, prompt, n_prompt));
    if (result && (result->struct_size < sizeof(uint32_t) || result->struct_size > (1u << 16)))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_generate_result.struct_size %u is invalid", result->struct_size);
    const llmi_tokenizer *tok = s->model->tok;
    /* Prompt then generated tokens, for the sampler's penalties: the sequence
     * never outgrows the context, plus the last token sampled. */
    size_t cap_hist = n_prompt + (size_t)p.max_new_tokens;
    if (cap_hist > (size_t)s->params.n_ctx + 1) cap_hist = (size_t)s->params.n_ctx + 1;
    llm_token *hist = llmi_malloc(cap_hist * sizeof *hist);
    if (!hist) return llmi_oom("generation history");
    memcpy(hist, prompt, n_prompt * sizeof *hist);
    size_t n_hist = n_prompt;
    uint64_t stream = 0; /* same seed, same tokens: as for requests */
    s->n_generate_calls++;
    pthread_mutex_lock(&s->sched.lock);
    llmi_kv_seq_release(s->kv, &s->seq);
    pthread_mutex_unlock(&s->sched.lock);

    llm_generate_result r = {.struct_size = sizeof r, .n_prompt_tokens = (uint32_t)n_prompt};
    double t0 = llmi_now(), t_first = t0;
    llm_status st = llmi_session_feed(s, &s->seq, prompt, n_prompt, true);
    llmi_detok d;
    llmi_detok_init(&d, tok, 0);
    if (p.max_new_tokens == 0) r.finish_reason = LLM_FINISH_LENGTH;
    while (st == LLM_OK && r.finish_reason == LLM_FINISH_NONE) {
        llm_token next = llmi_sample(&s->sampler, s->logits, &sp, hist, n_hist,
                                     r.n_generated_tokens, tok, stream, s->seq.n_tokens);
        if (n_hist < cap_hist) hist[n_hist++] = next;
        if (r.n_generated_tokens == 0) t_first = llmi_now();
        if (!p.ignore_eos && llmi_tokenizer_is_eog(tok, next)) {
            r.finish_reason = LLM_FINISH_EOS;
            break;
        }
        r.n_generated_tokens++;
        bool keep_going = true;
        if ((st = emit(s, &d, next, &p, &keep_going)) != LLM_OK) break;
        if (!keep_going) {
            r.finish_reason = LLM_FINISH_CANCELLED;
            break;
        }
        if (r.n_generated_tokens >= p.max_new_tokens || s->seq.n_tokens >= s->params.n_ctx) {
            r.finish_reason = LLM_FINISH_LENGTH;
            break;
        }
        st = llmi_session_feed(s, &s->seq, &next, 1, true);
    }
    if (st == LLM_OK && p.on_token) { /* hand over held-back bytes of a split character */
        size_t n = 0;
        if (llmi_detok_flush(&d, s->piece, s->piece_cap, &n) == LLM_OK && n > 0)
            p.on_token(LLM_TOKEN_NONE, s->piece, n, p.user);
    }
    llmi_free(hist);
    double t_end = llmi_now();
    r.prompt_seconds = t_first - t0;
    r.generate_seconds = t_end - t_first;
    if (st != LLM_OK) r.finish_reason = LLM_FINISH_ERROR;
    if (result) {
        size_t n = result->struct_size < sizeof r ? result->struct_size : sizeof r;
        uint32_t caller_size = result->struct_size;
        memcpy(result, &r, n);
        result->struct_size = caller_size;
    }
    return st;
}
