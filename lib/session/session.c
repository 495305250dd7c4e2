/* Session lifetime and the blocking generation loop. */
#include "session/session.h"

#include <stddef.h>
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
    if (llmi_kv_type_size(p->kv_type) == 0)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "kv_type %d: LLM_KV_F32, LLM_KV_F16 and LLM_KV_BF16 are implemented",
                          (int)p->kv_type);
    return LLM_OK;
}

/* Blocks of the KV pool the params ask for, resolving kv_cache_bytes. */
static llm_status kv_blocks(llm_session *s, uint32_t *out) {
    const llmi_hparams *hp = &s->model->hp;
    uint32_t kv_dim = hp->n_head_kv * hp->head_dim;
    size_t block_bytes = llmi_kv_block_bytes_ex(hp->n_layer, kv_dim, s->params.kv_block_size,
                                                llmi_kv_type_size(s->params.kv_type));
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
    LLMI_TRY(llmi_mem_check(n_blocks * block_bytes, "the KV cache (kv_cache_bytes)"));
    *out = (uint32_t)n_blocks;
    return LLM_OK;
}

static llm_status create_engine(llm_session *s) {
    uint32_t n_blocks = 0;
    LLMI_TRY(kv_blocks(s, &n_blocks));
    llmi_engine_config cfg = {.model = s->model,
                              .ops = s->device.ops,
                              .backend_cfg = {s->params.n_threads, s->device.device},
                              .kv_block_size = s->params.kv_block_size,
                              .kv_blocks = n_blocks,
                              .kv_type = s->params.kv_type,
                              .max_rows = s->params.max_batch_tokens,
                              .max_ctx = s->params.n_ctx};
    LLMI_TRY(llmi_engine_create(&cfg, &s->eng));
    s->kv = s->eng->kv;
    return LLM_OK;
}

llm_status llmi_session_create(const llm_model *m, const llm_session_params *p,
                               llm_session **out) {
    llmi_session_device cpu = {&llmi_backend_cpu, 0};
    return llmi_session_create_on(m, p, &cpu, out);
}

llm_status llmi_session_create_on(const llm_model *m, const llm_session_params *p,
                                  const llmi_session_device *dev, llm_session **out) {
    *out = NULL;
    llm_session *s = llmi_calloc(1, sizeof *s);
    if (!s) return llmi_oom("session");
    s->model = m;
    s->device = *dev;
    llm_status st = resolve_params(m, p, &s->params);
    if (st != LLM_OK) goto fail;
    if ((st = create_engine(s)) != LLM_OK) goto fail;
    if ((st = llmi_sampler_init(&s->sampler, m->hp.n_vocab)) != LLM_OK) goto fail;
    /* The draft model's KV holds as many tokens as the session's. */
    st = llmi_spec_init(&s->spec, m, s->params.draft_model, s->eng, s->kv->n_blocks,
                        s->params.kv_block_size, s->params.kv_type, s->params.max_batch_tokens,
                        s->params.n_ctx, s->params.prefix_cache);
    if (st != LLM_OK) goto fail;
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
    llmi_spec_destroy(&s->spec); /* after the requests, which hold draft KV */
    llmi_free(s->spec_jobs);
    for (size_t i = 0; i < s->n_seqs; i++) llmi_tseq_free(s, s->seqs[i], false);
    llmi_free(s->seqs);
    llmi_free(s->decode_rows);
    llmi_free(s->stats_fill);
    llmi_free_aligned(s->batch_logits);
    llmi_free_aligned(s->decode_logits);
    if (s->kv) llmi_kv_seq_destroy(s->kv, &s->seq);
    llmi_sampler_destroy(&s->sampler);
    llmi_engine_free(s->eng);
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
        st = llmi_engine_run(s->eng, s->rows, chunk, s->logits);
        if (st != LLM_OK) { /* all or nothing: drop the chunks that did run */
            pthread_mutex_lock(&s->sched.lock);
            llmi_kv_seq_truncate(s->kv, seq, start);
            pthread_mutex_unlock(&s->sched.lock);
            return st;
        }
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
    /* spec_mode sits in what was padding of the 1.0 struct: read it only
     * from callers whose struct has both spec fields. */
    if (in->struct_size < offsetof(llm_generate_params, spec_k) + sizeof p->spec_k) {
        p->spec_mode = LLM_SPEC_NONE;
        p->spec_k = 0;
    }
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

/* ---- speculative generation ---- */

/* The loop's state, shared with the verifier's sink. */
typedef struct gen_state {
    llm_session *s;
    const llm_generate_params *p;
    llmi_detok *d;
    llm_generate_result *r;
    uint32_t n_hist;   /* tokens in the history */
    double t_first;
    bool have_first;
    llm_status st;
} gen_state;

/* One decided token, the same rules as the plain loop: it joins the
 * history; EOS ends without being counted; the callback may stop; then the
 * length limits. */
static bool gen_push(void *ctx, llm_token tok, const float *logits) {
    (void)logits;
    gen_state *g = ctx;
    llm_session *s = g->s;
    g->n_hist++;
    if (!g->have_first) {
        g->t_first = llmi_now();
        g->have_first = true;
    }
    if (!g->p->ignore_eos && llmi_tokenizer_is_eog(s->model->tok, tok)) {
        g->r->finish_reason = LLM_FINISH_EOS;
        return false;
    }
    g->r->n_generated_tokens++;
    bool keep_going = true;
    if ((g->st = emit(s, g->d, tok, g->p, &keep_going)) != LLM_OK) return false;
    if (!keep_going) {
        g->r->finish_reason = LLM_FINISH_CANCELLED;
        return false;
    }
    if (g->r->n_generated_tokens >= g->p->max_new_tokens || g->n_hist - 1 >= s->params.n_ctx) {
        g->r->finish_reason = LLM_FINISH_LENGTH;
        return false;
    }
    return true;
}

/* Blocks the drafts of a step may take: only free ones, never evicting the
 * prefix cache. Largest k <= max_k whose rows fit. Under the lock. */
static uint32_t kv_cap_k(const llmi_kv *kv, const llmi_kv_seq *seq, uint32_t L, uint32_t max_k) {
    while (max_k > 0 && llmi_kv_seq_blocks_needed(kv, seq, L + max_k) > kv->n_free) max_k--;
    return max_k;
}

/* The speculative loop: the prompt but its last token is computed first;
 * then each step feeds the last token plus the drafts and keeps what the
 * verifier accepts. `hist` holds the prompt and has room for the drafts. */
static llm_status generate_spec(llm_session *s, const llm_generate_params *p,
                                const llm_sampling_params *sp, llm_token *hist, gen_state *g) {
    llmi_spec_req sr;
    llmi_spec_req_init(&sr, p->spec_mode, p->spec_k);
    const llmi_tokenizer *tok = s->model->tok;
    uint64_t steps = 0, drafted = 0, accepted = 0;
    llm_status st = LLM_OK;
    if (g->n_hist > 1) st = llmi_session_feed(s, &s->seq, hist, g->n_hist - 1, false);
    while (st == LLM_OK && g->r->finish_reason == LLM_FINISH_NONE) {
        uint32_t L = g->n_hist, n_gen = g->r->n_generated_tokens;
        /* Up to max_new_tokens, inside the context and one forward pass. */
        uint32_t max_k = p->max_new_tokens - n_gen - 1;
        if (max_k > s->params.n_ctx - L) max_k = s->params.n_ctx - L;
        if (max_k > s->params.max_batch_tokens - 1) max_k = s->params.max_batch_tokens - 1;
        pthread_mutex_lock(&s->sched.lock);
        st = llmi_kv_seq_reserve(s->kv, &s->seq, L);
        if (st == LLM_OK) max_k = kv_cap_k(s->kv, &s->seq, L, max_k);
        pthread_mutex_unlock(&s->sched.lock);
        if (st != LLM_OK) break;
        if ((st = llmi_spec_plan(&s->spec, &sr, sp, hist, L, max_k, (llmi_spec_batch){1, 1})) !=
            LLM_OK)
            break;
        if (sr.run_draft) {
            llmi_spec_job job = {&sr, hist, L, n_gen, sp, tok};
            if ((st = llmi_spec_draft_run(&s->spec, &job, 1)) != LLM_OK) break;
        }
        uint32_t n_rows = sr.k + 1;
        pthread_mutex_lock(&s->sched.lock);
        st = llmi_kv_seq_reserve(s->kv, &s->seq, L + sr.k); /* free blocks: cannot fail */
        pthread_mutex_unlock(&s->sched.lock);
        if (st == LLM_OK) st = llmi_session_reserve_logits(s, n_rows);
        if (st != LLM_OK) break;
        for (uint32_t j = 0; j < n_rows; j++)
            s->rows[j] = (llmi_batch_row){hist[L - 1 + j], L - 1 + j, &s->seq, true};
        double t0 = llmi_now();
        if ((st = llmi_engine_run(s->eng, s->rows, n_rows, s->batch_logits)) != LLM_OK)
            break;
        llmi_spec_cost_observe(&s->spec.target_cost, n_rows, llmi_now() - t0);
        bool stopped = false;
        uint32_t n = llmi_spec_verify(&s->spec, &sr, &s->sampler, s->batch_logits, sp, hist, L,
                                      n_gen, tok, (llmi_spec_sink){gen_push, g}, &stopped);
        /* Roll back what the verifier did not keep. */
        pthread_mutex_lock(&s->sched.lock);
        if (s->seq.n_tokens > g->n_hist - 1) llmi_kv_seq_truncate(s->kv, &s->seq, g->n_hist - 1);
        pthread_mutex_unlock(&s->sched.lock);
        llmi_spec_finish(&s->spec, &sr, hist, g->n_hist, n, stopped, &steps, &drafted, &accepted);
        if (g->st != LLM_OK) st = g->st;
    }
    llmi_spec_req_release(&s->spec, &sr);
    g->r->n_spec_steps = (uint32_t)steps;
    g->r->n_draft_tokens = (uint32_t)drafted;
    g->r->n_accepted_tokens = (uint32_t)accepted;
    return st;
}

llm_status llmi_generate(llm_session *s, const llm_token *prompt, size_t n_prompt,
                         const llm_generate_params *params, llm_generate_result *result) {
    llm_generate_params p;
    llm_sampling_params sp;
    LLMI_TRY(read_generate_params(params, &p));
    LLMI_TRY(llmi_sampling_params_read(p.sampling, s->model->hp.n_vocab, &sp));
    LLMI_TRY(check_prompt(s, prompt, n_prompt));
    LLMI_TRY(llmi_spec_check_params("llm_generate_params", p.spec_mode, p.spec_k, s->spec.draft));
    if (result && (result->struct_size < sizeof(uint32_t) || result->struct_size > (1u << 16)))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_generate_result.struct_size %u is invalid", result->struct_size);
    const llmi_tokenizer *tok = s->model->tok;
    /* Prompt then generated tokens, for the sampler's penalties: the sequence
     * never outgrows the context, plus the last token sampled. */
    size_t cap_hist = n_prompt + (size_t)p.max_new_tokens;
    if (cap_hist > (size_t)s->params.n_ctx + 1) cap_hist = (size_t)s->params.n_ctx + 1;
    bool spec = p.spec_mode != LLM_SPEC_NONE && p.max_new_tokens > 0;
    /* Speculation writes drafts past the history. */
    llm_token *hist = llmi_malloc((cap_hist + (spec ? LLMI_SPEC_MAX_K + 2 : 0)) * sizeof *hist);
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
    llmi_detok d;
    llmi_detok_init(&d, tok, 0);
    llm_status st = LLM_OK;
    if (spec) {
        gen_state g = {.s = s, .p = &p, .d = &d, .r = &r, .n_hist = (uint32_t)n_prompt,
                       .t_first = t0};
        st = generate_spec(s, &p, &sp, hist, &g);
        t_first = g.t_first;
    } else {
        st = llmi_session_feed(s, &s->seq, prompt, n_prompt, true);
    }
    if (p.max_new_tokens == 0) r.finish_reason = LLM_FINISH_LENGTH;
    while (!spec && st == LLM_OK && r.finish_reason == LLM_FINISH_NONE) {
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
