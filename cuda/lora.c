/* LoRA adapters on the CUDA backend (cuda_backend.h, "lora.c"): after each
 * projection an adapter targets, the rows of each adapter of the step get
 * y += s * B^T (A x) from two kernels (kernels_lora.cu) over that adapter's
 * rows only, grouped on the host (lora_plan.h) and uploaded with the step
 * descriptor. Rows without an adapter are never listed, so they come out
 * exactly as in a step without adapters.
 *
 * Adapters go to the device on first use and stay there, keyed by their
 * process-unique id, until the session's instance closes. They stay F32:
 * the CPU backend's numbers (model/adapter.h converts every file to F32),
 * and at rank <= 64 an adapter's bytes per token are a few percent of a
 * quantized base model's, so halving them would buy little. */
#include "cuda_backend.h"
#include "lora_plan.h"

#include <stdlib.h>
#include <string.h>

static void adapter_free(llmi_cuda_adapter *e) {
    if (!e)
        return;
    if (e->dev)
        cudaFree(e->dev);
    free(e->off);
    free(e);
}

void llmi_cuda_lora_free(llmi_cuda_instance *inst) {
    for (uint32_t i = 0; i < inst->n_adapters; i++)
        adapter_free(inst->adapters[i]);
    free(inst->adapters);
    inst->adapters = NULL;
    inst->n_adapters = inst->cap_adapters = 0;
    if (inst->lora_t)
        cudaFree(inst->lora_t);
    inst->lora_t = NULL;
    inst->lora_t_cap = 0;
}

/* Copies a's pairs to a new device allocation (ordered on the stream, so
 * the kernels that follow see them; cudaMemcpyAsync from pageable memory
 * returns once the host bytes are taken). */
static llm_status adapter_upload(llmi_cuda_instance *inst, const llm_adapter *a, uint32_t n_layer,
                                 llmi_cuda_adapter **out) {
    *out = NULL;
    llmi_cuda_adapter *e = calloc(1, sizeof *e);
    const size_t n_off = 2 * (size_t)n_layer * LLMI_LORA_TARGETS;
    if (e)
        e->off = malloc((n_off ? n_off : 1) * sizeof *e->off);
    if (!e || !e->off) {
        adapter_free(e);
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: LoRA adapter table");
    }
    e->id = a->id;
    size_t total = 0;
    if (!llmi_cuda_lora_layout(a, n_layer, e->off, &total) || total > SIZE_MAX / sizeof(float)) {
        adapter_free(e);
        return llmi_cuda_error(LLM_ERR_LIMIT, "LoRA adapter too large for the device layout");
    }
    llm_status st = LLM_OK;
    if (total)
        st = llmi_cuda_alloc((void **)&e->dev, total * sizeof(float), "a LoRA adapter");
    for (uint32_t l = 0; l < n_layer && st == LLM_OK; l++)
        for (uint32_t t = 0; t < LLMI_LORA_TARGETS && st == LLM_OK; t++) {
            const llmi_lora_pair *p = llmi_adapter_pair(a, l, (llmi_lora_target)t);
            if (!p->a)
                continue;
            const size_t *o = &e->off[2 * ((size_t)l * LLMI_LORA_TARGETS + t)];
            st = llmi_cuda_call(cudaMemcpyAsync(e->dev + o[0], p->a,
                                                (size_t)p->rank * p->in * sizeof(float),
                                                cudaMemcpyHostToDevice, inst->stream),
                                "uploading a LoRA adapter");
            if (st == LLM_OK)
                st = llmi_cuda_call(cudaMemcpyAsync(e->dev + o[1], p->b,
                                                    (size_t)p->rank * p->out * sizeof(float),
                                                    cudaMemcpyHostToDevice, inst->stream),
                                    "uploading a LoRA adapter");
        }
    if (st != LLM_OK) {
        /* A copy may be in flight into the allocation. */
        cudaStreamSynchronize(inst->stream);
        adapter_free(e);
        return st;
    }
    llmi_cuda_log(LLM_LOG_DEBUG, "CUDA: LoRA adapter %llu uploaded (%.1f MiB)",
                  (unsigned long long)a->id, (double)total * sizeof(float) / 1048576.0);
    *out = e;
    return LLM_OK;
}

/* The device copy of a, uploaded now when the instance has none. */
static llm_status adapter_get(llmi_cuda_instance *inst, const llm_adapter *a, uint32_t n_layer,
                              const llmi_cuda_adapter **out) {
    for (uint32_t i = 0; i < inst->n_adapters; i++)
        if (inst->adapters[i]->id == a->id) {
            *out = inst->adapters[i];
            return LLM_OK;
        }
    if (inst->n_adapters == inst->cap_adapters) {
        const uint32_t cap = inst->cap_adapters ? 2 * inst->cap_adapters : 4;
        llmi_cuda_adapter **grown = realloc(inst->adapters, cap * sizeof *grown);
        if (!grown)
            return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: LoRA adapter cache");
        inst->adapters = grown;
        inst->cap_adapters = cap;
    }
    llmi_cuda_adapter *e = NULL;
    LLMI_TRY(adapter_upload(inst, a, n_layer, &e));
    inst->adapters[inst->n_adapters++] = e;
    *out = e;
    return LLM_OK;
}

/* Room for n floats of intermediate; the old buffer may still be read by
 * the step in flight: wait for it first. */
static llm_status t_reserve(llmi_cuda_instance *inst, size_t n) {
    if (n <= inst->lora_t_cap)
        return LLM_OK;
    LLMI_TRY(llmi_cuda_call(cudaStreamSynchronize(inst->stream), "running the stream"));
    if (inst->lora_t)
        cudaFree(inst->lora_t);
    inst->lora_t = NULL;
    inst->lora_t_cap = 0;
    LLMI_TRY(llmi_cuda_alloc((void **)&inst->lora_t, n * sizeof(float), "the LoRA intermediate"));
    inst->lora_t_cap = n;
    return LLM_OK;
}

llm_status llmi_cuda_lora_begin(llmi_cuda_step *s, const llmi_step *st,
                                const llmi_cuda_dev_step *d) {
    s->lora.n = 0;
    if (st->n_adapters == 0)
        return LLM_OK;
    if (!d->lora_rows || !d->lora_seg)
        return llmi_cuda_error(LLM_ERR_INTERNAL, "a step with adapters was not grouped");
    if (st->n_adapters > s->lora.cap) {
        const llmi_cuda_adapter **grown = realloc(s->lora.dev, st->n_adapters * sizeof *grown);
        if (!grown)
            return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: the step's adapters");
        s->lora.dev = grown;
        s->lora.cap = st->n_adapters;
    }
    uint32_t max_rank = 0;
    for (uint32_t a = 0; a < st->n_adapters; a++) {
        LLMI_TRY(adapter_get(s->inst, st->adapters[a], s->m->hp.n_layer, &s->lora.dev[a]));
        if (st->adapters[a]->max_rank > max_rank)
            max_rank = st->adapters[a]->max_rank;
    }
    LLMI_TRY(t_reserve(s->inst, (size_t)st->n_rows * (max_rank ? max_rank : 1)));
    s->lora.adapters = st->adapters;
    s->lora.scale = st->adapter_scale;
    s->lora.seg = d->lora_seg;
    s->lora.rows = d->lora_rows;
    s->lora.n = st->n_adapters;
    return LLM_OK;
}

void llmi_cuda_lora_end(llmi_cuda_step *s) { s->lora.n = 0; }

llm_status llmi_cuda_lora_apply(llmi_cuda_step *s, uint32_t layer, llmi_lora_target t,
                                const float *x, float *y, uint32_t y_stride) {
    cudaStream_t stream = s->inst->stream;
    for (uint32_t a = 0; a < s->lora.n; a++) {
        const llmi_lora_pair *p = llmi_adapter_pair(s->lora.adapters[a], layer, t);
        const uint32_t first = s->lora.seg[a], n = s->lora.seg[a + 1] - first;
        if (!p->a || n == 0)
            continue;
        const size_t *o = &s->lora.dev[a]->off[2 * ((size_t)layer * LLMI_LORA_TARGETS + t)];
        const float *dev = s->lora.dev[a]->dev;
        /* The scale as the CPU backend forms it (backend/cpu/lora.c). */
        const float scale = s->lora.scale[a] * p->alpha_scale;
        const uint32_t *rows = s->lora.rows + first;
        LLMI_TRY(llmi_cuda_call(llmi_cu_lora_shrink(stream, dev + o[0], p->rank, p->in, x, p->in,
                                                    rows, n, s->inst->lora_t),
                                "the LoRA shrink"));
        LLMI_TRY(llmi_cuda_call(llmi_cu_lora_expand(stream, dev + o[1], p->rank, p->out,
                                                    s->inst->lora_t, scale, rows, n, y, y_stride),
                                "the LoRA expand"));
    }
    return LLM_OK;
}
