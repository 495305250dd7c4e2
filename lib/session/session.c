/* Session lifetime: params, the engine, the scheduler and their buffers. */
#include "session/session.h"

#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

LLM_API void llm_session_params_init_sized(llm_session_params *p, size_t size) {
    llm_session_params d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_batch_tokens = 512;
    d.kv_type = LLM_KV_F32;
    d.kv_block_size = 16;
    d.prefix_cache = true;
    d.draft_model = NULL;
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API void llm_session_params_init(llm_session_params *p) {
    llm_session_params_init_sized(p, LLMI_LEGACY_SESSION_PARAMS_SIZE);
}

/* Copies the caller's params, reading only what its struct_size covers, and
 * resolves zeros to defaults. */
static llm_status resolve_params(const llm_model *m, const llm_session_params *in,
                                 llm_session_params *p) {
    llm_session_params_init_sized(p, sizeof *p);
    LLMI_TRY(llmi_params_copy("llm_session_params", in, p, sizeof *p));
    if (p->n_threads == 0)
        p->n_threads = (uint32_t)llmi_cpu_count();
    if (p->n_threads > 512)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "n_threads %u is more than 512", p->n_threads);
    if (p->n_ctx == 0)
        p->n_ctx = m->hp.n_ctx_train;
    if (p->n_ctx > (1u << 20))
        return llmi_error(LLM_ERR_LIMIT, "n_ctx %u exceeds the maximum of %u", p->n_ctx, 1u << 20);
    if (p->max_batch_tokens == 0)
        p->max_batch_tokens = 512;
    if (p->max_batch_tokens > 65536)
        return llmi_error(LLM_ERR_LIMIT, "max_batch_tokens %u exceeds 65536", p->max_batch_tokens);
    if (p->kv_block_size == 0)
        p->kv_block_size = 16;
    if (p->kv_block_size > 1024)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "kv_block_size %u exceeds 1024",
                          p->kv_block_size);
    llmi_ttype kv_ttype;
    if (!llmi_kv_ttype(p->kv_type, &kv_ttype))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "kv_type %d is no llm_kv_type (F32, F16, BF16, Q8_0, Q4_0 or FP8_E4M3)",
                          (int)p->kv_type);
    return LLM_OK;
}

/* Blocks of the KV pool the params ask for, resolving kv_cache_bytes. */
static llm_status kv_blocks(llm_session *s, uint32_t *out) {
    const llmi_hparams *hp = &s->model->hp;
    uint32_t kv_dim = hp->n_head_kv * hp->head_dim;
    LLMI_TRY(llmi_engine_kv_type_check(s->params.kv_type, hp, "the model"));
    size_t block_bytes =
        llmi_kv_block_bytes_type(hp->n_layer, kv_dim, s->params.kv_block_size, s->params.kv_type);
    uint64_t n_blocks;
    if (s->params.kv_cache_bytes == 0) {
        /* Default: a quarter of the memory available now, capped at 2 GiB,
         * and never less than one full context. Pages are touched only as
         * blocks are used. */
        uint64_t avail = (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t share = avail / 4 < (2ull << 30) ? avail / 4 : (2ull << 30);
        uint64_t one_ctx =
            (s->params.n_ctx + s->params.kv_block_size - 1) / s->params.kv_block_size;
        n_blocks = share / block_bytes;
        if (n_blocks < one_ctx)
            n_blocks = one_ctx;
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
    const llmi_progress progress = {s->params.progress, s->params.progress_user};
    llmi_engine_config cfg = {.model = s->model,
                              .ops = s->device.ops,
                              .backend_cfg = {s->params.n_threads, s->device.device},
                              .kv_block_size = s->params.kv_block_size,
                              .kv_blocks = n_blocks,
                              .kv_type = s->params.kv_type,
                              .max_rows = s->params.max_batch_tokens,
                              .max_ctx = s->params.n_ctx,
                              .interrupt = &s->interrupt,
                              .progress = &progress};
    LLMI_TRY(llmi_engine_create(&cfg, &s->eng));
    s->kv = s->eng->kv;
    return LLM_OK;
}

llm_status llmi_session_create(const llm_model *m, const llm_session_params *p, llm_session **out) {
    llmi_session_device cpu = {&llmi_backend_cpu, 0};
    return llmi_session_create_on(m, p, &cpu, out);
}

llm_status llmi_session_create_on(const llm_model *m, const llm_session_params *p,
                                  const llmi_session_device *dev, llm_session **out) {
    *out = NULL;
    llm_session *s = llmi_calloc(1, sizeof *s);
    if (!s)
        return llmi_oom("session");
    s->model = m;
    s->device = *dev;
    pthread_mutex_init(&s->error_lock, NULL);
    llm_status st = resolve_params(m, p, &s->params);
    if (st != LLM_OK)
        goto fail;
    if ((st = create_engine(s)) != LLM_OK)
        goto fail;
    if ((st = llmi_sampler_init(&s->sampler, m->hp.n_vocab)) != LLM_OK)
        goto fail;
    /* The draft model's KV holds as many tokens as the session's. */
    st = llmi_spec_init(&s->spec, m, s->params.draft_model, s->eng, s->kv->n_blocks,
                        s->params.kv_block_size, s->params.kv_type, s->params.max_batch_tokens,
                        s->params.n_ctx, s->params.prefix_cache);
    if (st != LLM_OK)
        goto fail;
    llmi_sched_config sc = {.model = m,
                            .eng = s->eng,
                            .spec = &s->spec,
                            .sampler = &s->sampler,
                            .n_ctx = s->params.n_ctx,
                            .max_batch_tokens = s->params.max_batch_tokens,
                            .prefix_cache = s->params.prefix_cache};
    if ((st = llmi_sched_init(&s->sched, &sc)) != LLM_OK)
        goto fail;
    s->sched_ready = true;
    *out = s;
    return LLM_OK;
fail:
    llmi_session_free(s);
    return st;
}

void llmi_session_free(llm_session *s) {
    if (!s)
        return;
    if (s->sched_ready)
        llmi_sched_destroy(&s->sched);
    llmi_spec_destroy(&s->spec); /* after the requests, which hold draft KV */
    for (size_t i = 0; i < s->n_seqs; i++)
        llmi_tseq_free(s, s->seqs[i], false);
    llmi_free(s->seqs);
    llmi_free(s->decode_rows);
    llmi_free_aligned(s->decode_logits);
    llmi_sampler_destroy(&s->sampler);
    llmi_engine_free(s->eng);
    pthread_mutex_destroy(&s->error_lock);
    llmi_free(s);
}

llm_status llmi_session_note(llm_session *s, llm_status st) {
    if (st == LLM_OK || !s)
        return st;
    pthread_mutex_lock(&s->error_lock);
    snprintf(s->error_message, sizeof s->error_message, "%s", llmi_error_message());
    s->error_status = st;
    pthread_mutex_unlock(&s->error_lock);
    return st;
}

LLM_API llm_status llm_session_last_error(llm_session *s, llm_status *status, char *buf,
                                          size_t capacity, size_t *n_bytes) {
    if (n_bytes)
        *n_bytes = 0;
    if (!s || !status)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_session_last_error: session and status must not be NULL");
    if (!buf && capacity > 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_session_last_error: buf is NULL with capacity %zu", capacity);
    pthread_mutex_lock(&s->error_lock);
    const char *msg = s->error_message;
    size_t n = strlen(msg);
    *status = s->error_status;
    if (capacity > 0)
        snprintf(buf, capacity, "%s", msg);
    pthread_mutex_unlock(&s->error_lock);
    if (n_bytes)
        *n_bytes = n + 1;
    return LLM_OK;
}

LLM_API void llm_session_interrupt(llm_session *s) {
    if (s)
        atomic_store_explicit(&s->interrupt, 1, memory_order_relaxed);
}
