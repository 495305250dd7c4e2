/* Engine lifetime, step checks and the step descriptor. */
#include "engine/engine.h"

#include <math.h>

static llm_status kv_copy_hook(void *ctx, uint32_t dst, uint32_t src, uint32_t n_slots) {
    llmi_engine *e = ctx;
    return e->ops->kv_copy(e->kv_store, dst, src, n_slots);
}

llm_status llmi_engine_kv_type_check(llm_kv_type type, const llmi_hparams *hp, const char *who) {
    llmi_ttype t;
    if (!llmi_kv_ttype(type, &t))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "KV cache of unknown element type %d",
                          (int)type);
    if (llmi_kv_type_blocked(type) && (hp->head_dim == 0 || hp->head_dim % LLMI_QK != 0))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "a %s KV cache needs a head_dim that is a multiple of %d; %s has %u",
                          llmi_ttype_get(t)->name, LLMI_QK, who, hp->head_dim);
    if (llmi_kv_row_bytes(type, (uint64_t)hp->n_head_kv * hp->head_dim) == 0)
        return llmi_error(LLM_ERR_LIMIT, "KV rows of %u heads of %u overflow", hp->n_head_kv,
                          hp->head_dim);
    return LLM_OK;
}

llm_status llmi_engine_create(const llmi_engine_config *cfg, llmi_engine **out) {
    *out = NULL;
    LLMI_TRY(llmi_backend_fault_check(NULL));
    if (cfg->max_rows == 0 || cfg->max_ctx == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "engine needs rows and context > 0");
    LLMI_TRY(llmi_engine_kv_type_check(cfg->kv_type, &cfg->model->hp, "the model"));
    llmi_engine *e = llmi_calloc(1, sizeof *e);
    if (!e)
        return llmi_oom("engine");
    const llmi_hparams *hp = &cfg->model->hp;
    e->model = cfg->model;
    e->ops = cfg->ops ? cfg->ops : &llmi_backend_cpu;
    e->device = cfg->backend_cfg.device;
    e->max_rows = cfg->max_rows;
    e->interrupt = cfg->interrupt;
    e->max_ctx = cfg->max_ctx;
    e->layout = (llmi_kv_layout){hp->n_layer,        hp->n_head_kv * hp->head_dim,
                                 cfg->kv_block_size, cfg->kv_blocks,
                                 cfg->kv_type,       hp->head_dim};
    e->kv_row_bytes = llmi_kv_row_bytes(cfg->kv_type, e->layout.kv_dim);
    llm_status st;
    if (cfg->backend) {
        e->backend = cfg->backend;
    } else {
        if ((st = e->ops->open(&cfg->backend_cfg, &e->backend)) != LLM_OK)
            goto fail;
        e->owns_backend = true;
    }
    const uint64_t weight_bytes = e->model->weight_bytes;
    if ((st = llmi_progress_report(cfg->progress, LLM_PROGRESS_UPLOAD, 0, weight_bytes)) != LLM_OK)
        goto fail;
    if ((st = llmi_backend_weights_acquire(e->ops, e->model, e->device, &e->weights)) != LLM_OK)
        goto fail;
    st = llmi_progress_report(cfg->progress, LLM_PROGRESS_UPLOAD, weight_bytes, weight_bytes);
    if (st != LLM_OK)
        goto fail;
    e->slot_seqs = llmi_malloc((size_t)e->max_rows * sizeof *e->slot_seqs);
    e->row_slot = llmi_malloc((size_t)e->max_rows * sizeof *e->row_slot);
    e->rows = llmi_calloc(e->max_rows, sizeof *e->rows);
    e->step_adapters = llmi_calloc(e->max_rows, sizeof *e->step_adapters);
    e->step_adapter_scale = llmi_calloc(e->max_rows, sizeof *e->step_adapter_scale);
    if (!e->slot_seqs || !e->row_slot || !e->rows || !e->step_adapters || !e->step_adapter_scale) {
        st = llmi_oom("step descriptor");
        goto fail;
    }
    /* Warm-up: 2 units, the KV store and the step's buffers. */
    if ((st = llmi_progress_report(cfg->progress, LLM_PROGRESS_WARMUP, 0, 2)) != LLM_OK)
        goto fail;
    if ((st = llmi_kv_create(cfg->kv_block_size, cfg->kv_blocks, &e->kv)) != LLM_OK)
        goto fail;
    if ((st = e->ops->kv_create(e->backend, &e->layout, &e->kv_store)) != LLM_OK)
        goto fail;
    llmi_kv_set_copier(e->kv, kv_copy_hook, e);
    if ((st = llmi_progress_report(cfg->progress, LLM_PROGRESS_WARMUP, 1, 2)) != LLM_OK)
        goto fail;
    st = e->ops->step_create(e->backend, e->model, e->weights, e->max_rows, e->max_ctx, &e->step);
    if (st != LLM_OK)
        goto fail;
    if ((st = llmi_progress_report(cfg->progress, LLM_PROGRESS_WARMUP, 2, 2)) != LLM_OK)
        goto fail;
    *out = e;
    return LLM_OK;
fail:
    llmi_engine_free(e);
    return st;
}

void llmi_engine_free(llmi_engine *e) {
    if (!e)
        return;
    if (e->step)
        e->ops->step_free(e->step);
    if (e->kv_store)
        e->ops->kv_free(e->kv_store);
    llmi_kv_free(e->kv);
    if (e->weights)
        llmi_backend_weights_release(e->ops, e->model, e->device);
    if (e->owns_backend)
        e->ops->close(e->backend);
    llmi_free(e->words);
    llmi_free(e->slot_seqs);
    llmi_free(e->row_slot);
    llmi_free(e->rows);
    llmi_free(e->step_adapters);
    llmi_free(e->step_adapter_scale);
    llmi_free(e);
}

void llmi_engine_set_f32_activations(llmi_engine *e, bool on) {
    if (e->ops->step_set_f32_activations)
        e->ops->step_set_f32_activations(e->step, on);
}

bool llmi_engine_has_lora(const llmi_engine *e) {
    /* An older table ends before the flag: read it only past version 5. */
    return e->ops->version >= 5 && e->ops->lora;
}

llm_status llmi_engine_lora_refused(const llmi_engine *e) {
    return llmi_error(LLM_ERR_UNSUPPORTED,
                      "backend '%s' does not apply LoRA adapters (the CPU backend does, also with "
                      "tensor parallelism; the CUDA backend does when the environment has "
                      "LLM_CUDA_LORA=1 as the session is created, not yet on tensor-parallel GPUs)",
                      e->ops->name);
}

/* A row's adapter: one loaded for this engine's model, a backend that
 * applies it, a finite scale. */
static llm_status check_adapter(const llmi_engine *e, const llmi_batch_row *row, uint32_t r) {
    if (row->adapter->model != e->model)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "row %u: the LoRA adapter was loaded for another model", r);
    if (!llmi_engine_has_lora(e))
        return llmi_engine_lora_refused(e);
    if (!isfinite(row->adapter_scale))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "row %u: adapter scale is not finite", r);
    return LLM_OK;
}

static llm_status check_rows(const llmi_engine *e, const llmi_batch_row *rows, uint32_t n) {
    if (n > e->max_rows)
        return llmi_error(LLM_ERR_LIMIT, "batch of %u rows exceeds the limit of %u", n,
                          e->max_rows);
    for (uint32_t r = 0; r < n; r++) {
        const llmi_batch_row *row = &rows[r];
        if (row->adapter)
            LLMI_TRY(check_adapter(e, row, r));
        if (row->token < 0 || (uint32_t)row->token >= e->model->hp.n_vocab)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "row %u: token %d outside vocabulary of %u",
                              r, row->token, e->model->hp.n_vocab);
        if (row->pos >= e->max_ctx)
            return llmi_error(LLM_ERR_LIMIT, "row %u: position %u exceeds the context of %u", r,
                              row->pos, e->max_ctx);
        if (!row->seq || (uint64_t)row->seq->n_blocks * e->kv->block_size <= row->pos)
            return llmi_error(LLM_ERR_INTERNAL, "row %u: no KV block reserved for position %u", r,
                              row->pos);
        /* Released blocks (holes) may lie only before what every layer of
         * the row reads: with all layers windowed, positions > pos - window. */
        uint32_t first = llmi_kv_seq_first_pos(e->kv, row->seq);
        if (first > 0) {
            const llmi_features *f = &e->model->hp.features;
            bool all_windowed = f->swa == LLMI_SWA_ALL;
            if (!all_windowed || row->pos + 1 < f->swa_window ||
                row->pos + 1 - f->swa_window < first)
                return llmi_error(LLM_ERR_INTERNAL,
                                  "row %u: position %u reads KV before %u, which was released", r,
                                  row->pos, first);
        }
    }
    return LLM_OK;
}

/* Makes the descriptor buffer hold `n` words. */
static llm_status reserve_words(llmi_engine *e, size_t n) {
    if (n <= e->cap_words)
        return LLM_OK;
    size_t cap = e->cap_words ? e->cap_words : 1024;
    while (cap < n)
        cap *= 2;
    uint32_t *w = llmi_malloc(cap * sizeof *w);
    if (!w)
        return llmi_oom("step descriptor");
    llmi_free(e->words);
    e->words = w;
    e->cap_words = cap;
    return LLM_OK;
}

/* Builds the step descriptor of the rows (checked) in e->words. */
static llm_status build_step(llmi_engine *e, const llmi_batch_row *rows, uint32_t n,
                             llmi_step *st) {
    /* Sequence slots first, to size the buffer. Rows of a sequence usually
     * come together, so the last slot is tried first. */
    uint32_t n_seqs = 0, n_logits = 0;
    size_t n_blocks = 0;
    for (uint32_t r = 0; r < n; r++) {
        uint32_t s = n_seqs;
        if (n_seqs && e->slot_seqs[n_seqs - 1] == rows[r].seq)
            s = n_seqs - 1;
        else
            for (s = 0; s < n_seqs && e->slot_seqs[s] != rows[r].seq; s++) {
            }
        if (s == n_seqs) {
            e->slot_seqs[n_seqs++] = rows[r].seq;
            n_blocks += rows[r].seq->n_blocks;
        }
        e->row_slot[r] = s;
        n_logits += rows[r].want_logits;
    }
    /* Adapters: the distinct (adapter, scale) pairs, few per step. */
    uint32_t n_adapters = 0;
    for (uint32_t r = 0; r < n; r++) {
        if (!rows[r].adapter)
            continue;
        uint32_t a = 0;
        while (a < n_adapters && (e->step_adapters[a] != rows[r].adapter ||
                                  e->step_adapter_scale[a] != rows[r].adapter_scale))
            a++;
        if (a == n_adapters) {
            e->step_adapters[n_adapters] = rows[r].adapter;
            e->step_adapter_scale[n_adapters++] = rows[r].adapter_scale;
        }
    }
    size_t total = (size_t)3 * n + (n_seqs + 1) + n_blocks + n_logits + (n_adapters ? n : 0);
    LLMI_TRY(reserve_words(e, total));
    uint32_t *w = e->words;
    uint32_t *token = w, *pos = w + n, *seq = w + 2 * (size_t)n;
    uint32_t *block_start = seq + n, *blocks = block_start + n_seqs + 1;
    uint32_t *logit_rows = blocks + n_blocks;
    uint32_t k = 0;
    for (uint32_t r = 0; r < n; r++) {
        token[r] = (uint32_t)rows[r].token;
        pos[r] = rows[r].pos;
        seq[r] = e->row_slot[r];
        if (rows[r].want_logits)
            logit_rows[k++] = r;
    }
    size_t b = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        block_start[s] = (uint32_t)b;
        const llmi_kv_seq *q = e->slot_seqs[s];
        memcpy(blocks + b, q->blocks, (size_t)q->n_blocks * sizeof *blocks);
        b += q->n_blocks;
    }
    block_start[n_seqs] = (uint32_t)b;
    uint32_t *row_adapter = n_adapters ? logit_rows + n_logits : NULL;
    for (uint32_t r = 0; row_adapter && r < n; r++) {
        uint32_t a = 0;
        if (rows[r].adapter)
            while (e->step_adapters[a] != rows[r].adapter ||
                   e->step_adapter_scale[a] != rows[r].adapter_scale)
                a++;
        row_adapter[r] = rows[r].adapter ? a + 1 : 0;
    }
    *st = (llmi_step){.n_rows = n,
                      .n_seqs = n_seqs,
                      .n_logits = n_logits,
                      .block_size = e->kv->block_size,
                      .token = (const int32_t *)token,
                      .pos = pos,
                      .seq = seq,
                      .block_start = block_start,
                      .blocks = blocks,
                      .logit_rows = logit_rows,
                      .words = w,
                      .n_words = total,
                      .interrupt = e->interrupt,
                      .n_adapters = n_adapters,
                      .row_adapter = row_adapter,
                      .adapters = n_adapters ? e->step_adapters : NULL,
                      .adapter_scale = n_adapters ? e->step_adapter_scale : NULL};
    return LLM_OK;
}

bool llmi_engine_has_hidden(const llmi_engine *e) {
    /* An older table ends before the entry: read it only past version 4. */
    return e->ops->version >= 4 && e->ops->step_run_hidden;
}

/* Runs the rows; the wanted rows get logits, or hidden states when
 * `hidden`. */
static llm_status engine_run(llmi_engine *e, const llmi_batch_row *rows, uint32_t n, float *out,
                             bool hidden) {
    if (hidden && !llmi_engine_has_hidden(e))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "backend '%s' cannot return hidden states (embeddings need backend "
                          "interface version 4 with step_run_hidden)",
                          e->ops->name);
    bool late = false;
    LLMI_TRY(llmi_backend_fault_check(&late));
    if (n == 0)
        return LLM_OK;
    LLMI_TRY(check_rows(e, rows, n));
    if (llmi_engine_interrupted(e))
        return llmi_error(LLM_ERR_CANCELLED, "interrupted (llm_session_interrupt)");
    llmi_step st;
    LLMI_TRY(build_step(e, rows, n, &st));
    LLMI_TRY(hidden ? e->ops->step_run_hidden(e->step, e->kv_store, &st, out)
                    : e->ops->step_run(e->step, e->kv_store, &st, out));
    LLMI_TRY(e->ops->sync(e->backend));
    if (late)
        return llmi_backend_fault_late();
    /* Lengths move only now: a step that fails anywhere leaves them. */
    for (uint32_t r = 0; r < n; r++)
        if (rows[r].pos + 1 > rows[r].seq->n_tokens)
            rows[r].seq->n_tokens = rows[r].pos + 1;
    return LLM_OK;
}

llm_status llmi_engine_run(llmi_engine *e, const llmi_batch_row *rows, uint32_t n, float *logits) {
    return engine_run(e, rows, n, logits, false);
}

llm_status llmi_engine_run_hidden(llmi_engine *e, const llmi_batch_row *rows, uint32_t n,
                                  float *hidden) {
    return engine_run(e, rows, n, hidden, true);
}

/* Runs f over the block-sized pieces of positions [pos, pos + n). */
static llm_status kv_rows(llmi_engine *e, const llmi_kv_seq *seq, uint32_t layer, bool v,
                          uint32_t pos, uint32_t n, uint8_t *buf, bool write) {
    const uint32_t bs = e->kv->block_size;
    if (layer >= e->layout.n_layer || (uint64_t)pos + n > (uint64_t)seq->n_blocks * bs ||
        (n > 0 && pos < llmi_kv_seq_first_pos(e->kv, seq)))
        return llmi_error(LLM_ERR_INTERNAL, "KV rows %u..%u of layer %u outside the sequence", pos,
                          pos + n, layer);
    while (n > 0) {
        uint32_t run = bs - pos % bs;
        if (run > n)
            run = n;
        uint32_t slot = llmi_kv_slot(e->kv, seq, pos);
        LLMI_TRY(write ? e->ops->kv_write(e->kv_store, layer, v, slot, run, buf)
                       : e->ops->kv_read(e->kv_store, layer, v, slot, run, buf));
        buf += (size_t)run * e->kv_row_bytes;
        pos += run;
        n -= run;
    }
    return LLM_OK;
}

llm_status llmi_engine_kv_read(llmi_engine *e, const llmi_kv_seq *seq, uint32_t layer, bool v,
                               uint32_t pos, uint32_t n, void *dst) {
    return kv_rows(e, seq, layer, v, pos, n, dst, false);
}

llm_status llmi_engine_kv_write(llmi_engine *e, const llmi_kv_seq *seq, uint32_t layer, bool v,
                                uint32_t pos, uint32_t n, const void *src) {
    return kv_rows(e, seq, layer, v, pos, n, (uint8_t *)src, true);
}
