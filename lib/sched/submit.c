/* Requests in and out: submit (params read and checked, the request and its
 * samples built) and cancel. */
#include "sched/sched.h"

#include "sample/sample.h"

#include <math.h>
#include <stddef.h>

/* ---- submit ---- */

LLM_API void llm_request_params_init_sized(llm_request_params *p, size_t size) {
    llm_request_params d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_new_tokens = 256;
    d.spec_mode = LLM_SPEC_NONE;
    d.spec_k = 0; /* adaptive */
    d.n_samples = 1;
    d.adapter = NULL;
    d.adapter_scale = 1.0f;
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API void llm_request_params_init(llm_request_params *p) {
    llm_request_params_init_sized(p, LLMI_LEGACY_REQUEST_PARAMS_SIZE);
}

static llm_status read_request_params(const llm_request_params *in, llm_request_params *p) {
    llm_request_params_init_sized(p, sizeof *p);
    if (!in)
        return LLM_OK;
    LLMI_TRY(llmi_params_copy("llm_request_params", in, p, sizeof *p));
    /* spec_mode sits in what was padding of the 1.0 struct: read it only
     * from callers whose struct has both spec fields. */
    if (in->struct_size < offsetof(llm_request_params, spec_k) + sizeof p->spec_k) {
        p->spec_mode = LLM_SPEC_NONE;
        p->spec_k = 0;
    }
    /* n_samples took what was padding after spec_k, which zeroing callers
     * (llm_request_params_init) leave 0: 0 means one sample. */
    if (in->struct_size < offsetof(llm_request_params, n_samples) + sizeof p->n_samples ||
        p->n_samples == 0)
        p->n_samples = 1;
    if (p->n_samples > LLM_MAX_SAMPLES)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "n_samples %u exceeds the maximum of %u",
                          p->n_samples, LLM_MAX_SAMPLES);
    if (p->n_stop_tokens && !p->stop_tokens)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "stop_tokens is NULL with n_stop_tokens %zu",
                          p->n_stop_tokens);
    if (p->n_stop_strings && !p->stop_strings)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "stop_strings is NULL with n_stop_strings %zu",
                          p->n_stop_strings);
    if (p->max_new_tokens == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "max_new_tokens must be at least 1");
    if (p->n_stop_tokens > 1024 || p->n_stop_strings > 64)
        return llmi_error(LLM_ERR_LIMIT, "at most 1024 stop tokens and 64 stop strings");
    if (p->adapter && !isfinite(p->adapter_scale))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "adapter_scale is not a finite number");
    if (p->top_logprobs > 20)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "top_logprobs %u exceeds the maximum of 20",
                          p->top_logprobs);
    return LLM_OK;
}

static llm_status check_limits(const llmi_sched *s, const llm_token *prompt, size_t n,
                               const llm_request_params *p) {
    uint32_t n_ctx = s->n_ctx;
    if (n == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "the prompt has no tokens");
    if (n >= n_ctx)
        return llmi_error(LLM_ERR_LIMIT,
                          "prompt of %zu tokens leaves no room in the context of %u tokens", n,
                          n_ctx);
    for (size_t i = 0; i < n; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= s->model->hp.n_vocab)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "prompt token %zu is %d, outside the vocabulary of %u", i, prompt[i],
                              s->model->hp.n_vocab);
    /* The longest this request can get must fit the pool on its own, or it
     * could never finish however many others are preempted. */
    uint64_t longest = n + (uint64_t)p->max_new_tokens;
    if (longest > n_ctx)
        longest = n_ctx;
    const llmi_kv *kv = s->kv;
    uint64_t blocks = (longest + kv->block_size - 1) / kv->block_size;
    if (blocks > kv->n_blocks)
        return llmi_error(LLM_ERR_LIMIT,
                          "prompt %zu + max_new_tokens %u needs %llu KV blocks; the pool has %u", n,
                          p->max_new_tokens, (unsigned long long)blocks, kv->n_blocks);
    for (size_t i = 0; i < p->n_stop_strings; i++) {
        const char *ss = p->stop_strings[i];
        if (!ss)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "stop string %zu is NULL", i);
        if (!*ss)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "stop string %zu is empty", i);
        size_t len = strlen(ss);
        if (llmi_utf8_valid_prefix(ss, len) != len)
            return llmi_error(LLM_ERR_INVALID_UTF8, "stop string %zu is not valid UTF-8", i);
    }
    return LLM_OK;
}

static llm_status build_request(llmi_sched *s, const llm_token *prompt, size_t n,
                                const llm_request_params *p, llmi_request **out) {
    llmi_request *r = llmi_calloc(1, sizeof *r);
    if (!r)
        return llmi_oom("request");
    llm_status st = llmi_sampling_params_copy(p->sampling, s->model->hp.n_vocab, &r->sampling);
    if (st != LLM_OK) {
        llmi_free(r);
        return st;
    }
    uint32_t n_ctx = s->n_ctx;
    r->cap_tokens = (uint32_t)(n + p->max_new_tokens > n_ctx ? n_ctx : n + p->max_new_tokens) + 1;
    /* Drafts are written past the tokens during a step. */
    uint32_t room = p->spec_mode != LLM_SPEC_NONE ? LLMI_SPEC_MAX_K + 2 : 0;
    llmi_spec_req_init(&r->spec, p->spec_mode, p->spec_k);
    r->tokens = llmi_malloc((size_t)(r->cap_tokens + room) * sizeof *r->tokens);
    r->stop_tokens = llmi_malloc((p->n_stop_tokens ? p->n_stop_tokens : 1) * sizeof(llm_token));
    r->stop_strings = llmi_calloc(p->n_stop_strings ? p->n_stop_strings : 1, sizeof(char *));
    if (!r->tokens || !r->stop_tokens || !r->stop_strings)
        goto oom;
    memcpy(r->tokens, prompt, n * sizeof *prompt);
    r->n_prompt = r->n_tokens = (uint32_t)n;
    if (p->n_stop_tokens)
        memcpy(r->stop_tokens, p->stop_tokens, p->n_stop_tokens * sizeof(llm_token));
    r->n_stop_tokens = p->n_stop_tokens;
    for (size_t i = 0; i < p->n_stop_strings; i++) {
        if (!(r->stop_strings[i] = llmi_strdup(p->stop_strings[i])))
            goto oom;
        r->n_stop_strings = i + 1;
    }
    r->max_new = p->max_new_tokens;
    r->priority = p->priority;
    r->ignore_eos = p->ignore_eos;
    r->logprobs = p->logprobs;
    r->top_logprobs = p->top_logprobs;
    r->adapter = p->adapter;
    r->adapter_scale = p->adapter_scale;
    /* K/V computed under an adapter are its own: the prefix cache chain
     * starts from the adapter's identity (kv/kv.h). */
    r->seq.chain_seed = r->seq.last_hash = llmi_adapter_chain_seed(p->adapter, p->adapter_scale);
    if (r->sampling.grammar) {
        st = llmi_gstate_create(r->sampling.grammar, &r->grammar);
        if (st != LLM_OK) {
            llmi_request_free(s, r);
            return st;
        }
    }
    llmi_detok_init(&r->detok, s->model->tok, 0);
    *out = r;
    return LLM_OK;
oom:
    llmi_request_free(s, r);
    return llmi_oom("request");
}

llm_status llmi_sched_submit(llmi_sched *s, const llm_token *prompt, size_t n,
                             const llm_request_params *params, llm_request_id *out) {
    return llmi_sched_submit_report(s, prompt, n, params, NULL, out);
}

llm_status llmi_sched_submit_report(llmi_sched *s, const llm_token *prompt, size_t n,
                                    const llm_request_params *params, llm_generate_result *report,
                                    llm_request_id *out) {
    llm_request_params p;
    LLMI_TRY(read_request_params(params, &p));
    LLMI_TRY(llmi_spec_check_params("llm_request_params", p.spec_mode, p.spec_k, s->spec->draft));
    LLMI_TRY(check_limits(s, prompt, n, &p));
    if (p.adapter && p.adapter->model != s->model)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "the request's LoRA adapter was loaded for another model");
    if (p.adapter && !llmi_engine_has_lora(s->eng))
        return llmi_engine_lora_refused(s->eng);
    llmi_request *r = NULL;
    LLMI_TRY(build_request(s, prompt, n, &p, &r));
    r->report = report;
    if (p.n_samples > 1) { /* the other samples, ready to start from the prompt */
        r->forks = llmi_calloc(p.n_samples - 1, sizeof *r->forks);
        if (!r->forks) {
            llmi_request_free(s, r);
            return llmi_oom("request samples");
        }
        for (uint32_t i = 1; i < p.n_samples; i++) {
            llmi_request *c = NULL;
            llm_status st = build_request(s, prompt, n, &p, &c);
            if (st != LLM_OK) {
                llmi_request_free(s, r);
                return st;
            }
            c->sample_index = i;
            c->sampling.seed = llmi_sample_seed(r->sampling.seed, i);
            r->forks[r->n_forks++] = c;
        }
    }
    pthread_mutex_lock(&s->lock);
    bool ok = llmi_sched_push(&s->waiting, &s->n_waiting, &s->cap_waiting, r);
    if (ok) {
        r->id = s->next_id++;
        r->arrival = s->next_arrival++;
        for (uint32_t i = 0; i < r->n_forks; i++) {
            r->forks[i]->id = r->id;
            r->forks[i]->arrival = r->arrival;
        }
        *out = r->id;
    }
    pthread_mutex_unlock(&s->lock);
    if (!ok) {
        llmi_request_free(s, r);
        return llmi_oom("request queue");
    }
    return LLM_OK;
}

/* ---- cancel ---- */

llm_status llmi_sched_cancel(llmi_sched *s, llm_request_id id) {
    llm_status st = LLM_OK;
    pthread_mutex_lock(&s->lock);
    /* Every sample of the request: each is its own entry once started. */
    bool found = false;
    llmi_request **lists[2] = {s->waiting, s->running};
    size_t counts[2] = {s->n_waiting, s->n_running};
    for (int l = 0; l < 2; l++) {
        for (size_t i = 0; i < counts[l]; i++) {
            llmi_request *r = lists[l][i];
            if (r->id != id)
                continue;
            found = true;
            /* Cancelling twice is harmless until the finish is reported. */
            r->cancelled = true;
            /* Free the blocks now unless a forward pass is writing them. */
            if (!r->in_flight)
                llmi_kv_seq_release(s->kv, &r->seq);
        }
    }
    /* Finished, but the finish is still to be delivered: nothing to do. */
    if (!found && !llmi_sched_finish_pending(s, id))
        st = llmi_error(LLM_ERR_NOT_FOUND, "request %llu is not queued or running",
                        (unsigned long long)id);
    pthread_mutex_unlock(&s->lock);
    return st;
}
