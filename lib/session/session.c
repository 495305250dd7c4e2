/* Session lifetime and the blocking generation loop. */
#include "session/session.h"

#include <stdio.h>

enum { DEFAULT_BLOCK_SIZE = 16 };

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
    if (p->kv_type != LLM_KV_F32)
        return llmi_error(LLM_ERR_UNSUPPORTED, "kv_type %d: only LLM_KV_F32 is implemented",
                          (int)p->kv_type);
    return LLM_OK;
}

static llm_status create_kv(llm_session *s) {
    const llmi_hparams *hp = &s->model->hp;
    uint32_t kv_dim = hp->n_head_kv * hp->head_dim;
    size_t block_bytes = llmi_kv_block_bytes(hp->n_layer, kv_dim, DEFAULT_BLOCK_SIZE);
    uint64_t n_blocks;
    if (s->params.kv_cache_bytes == 0) {
        n_blocks = (s->params.n_ctx + DEFAULT_BLOCK_SIZE - 1) / DEFAULT_BLOCK_SIZE;
        s->params.kv_cache_bytes = n_blocks * block_bytes;
    } else {
        n_blocks = s->params.kv_cache_bytes / block_bytes;
        if (n_blocks == 0)
            return llmi_error(LLM_ERR_LIMIT,
                              "kv_cache_bytes %llu is less than one KV block (%zu bytes)",
                              (unsigned long long)s->params.kv_cache_bytes, block_bytes);
    }
    if (n_blocks > UINT32_MAX / DEFAULT_BLOCK_SIZE)
        return llmi_error(LLM_ERR_LIMIT, "KV cache of %llu blocks is too large",
                          (unsigned long long)n_blocks);
    return llmi_kv_create(hp->n_layer, kv_dim, DEFAULT_BLOCK_SIZE, (uint32_t)n_blocks, &s->kv);
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
    s->rows = llmi_calloc(s->params.max_batch_tokens, sizeof *s->rows);
    s->logits = llmi_malloc_aligned((size_t)m->hp.n_vocab * sizeof(float));
    s->piece_cap = 256;
    s->piece = llmi_malloc(s->piece_cap);
    if (!s->rows || !s->logits || !s->piece) {
        st = llmi_oom("session buffers");
        goto fail;
    }
    *out = s;
    return LLM_OK;
fail:
    llmi_session_free(s);
    return st;
}

void llmi_session_free(llm_session *s) {
    if (!s) return;
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
    LLMI_TRY(llmi_kv_seq_reserve(s->kv, seq, start + (uint32_t)n));
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
    LLMI_TRY(llmi_sampling_params_read(p.sampling, &sp));
    LLMI_TRY(check_prompt(s, prompt, n_prompt));
    if (result && (result->struct_size < sizeof(uint32_t) || result->struct_size > (1u << 16)))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_generate_result.struct_size %u is invalid", result->struct_size);
    const llmi_tokenizer *tok = s->model->tok;
    uint64_t stream = s->n_generate_calls++;
    llmi_kv_seq_release(s->kv, &s->seq);

    llm_generate_result r = {.struct_size = sizeof r, .n_prompt_tokens = (uint32_t)n_prompt};
    double t0 = llmi_now(), t_first = t0;
    llm_status st = llmi_session_feed(s, &s->seq, prompt, n_prompt, true);
    llmi_detok d;
    llmi_detok_init(&d, tok, 0);
    if (p.max_new_tokens == 0) r.finish_reason = LLM_FINISH_LENGTH;
    while (st == LLM_OK && r.finish_reason == LLM_FINISH_NONE) {
        llm_token next = llmi_sample(&s->sampler, s->logits, &sp, stream, s->seq.n_tokens);
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
