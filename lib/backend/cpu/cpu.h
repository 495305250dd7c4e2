/* The CPU backend's pieces shared by its files: the instance (a thread
 * pool), the KV store (host arrays, one per layer for K and one for V) and
 * the step entries (step.c). */
#ifndef LLMI_BACKEND_CPU_H
#define LLMI_BACKEND_CPU_H

#include "backend/backend.h"
#include "backend/cpu/threadpool.h"

typedef struct llmi_cpu_kv {
    llmi_kv_layout layout;
    uint32_t elem_size; /* bytes per element: 4 (f32), 2 (f16, bf16); 0 for blocks */
    size_t row_bytes;   /* one slot of one layer (llmi_kv_row_bytes of kv_dim) */
    size_t head_bytes;  /* one KV head's part of a row (llmi_kv_row_bytes of head_dim) */
    /* Per layer: n_blocks * block_size * row_bytes bytes, slot-major. */
    uint8_t **k, **v;
} llmi_cpu_kv;

static inline uint8_t *llmi_cpu_kv_row(const llmi_cpu_kv *kv, uint32_t layer, bool v,
                                       uint32_t slot) {
    return (v ? kv->v : kv->k)[layer] + (size_t)slot * kv->row_bytes;
}

/* The weights of a model on the CPU (weights.c): views of the model's
 * tensors, with packed copies (kernels.h, "Packed weights") of the matmul
 * weights where the kernels have a packed layout at the current level;
 * LLM_CPU_PACK=0 in the environment turns the copies off. */
typedef struct llmi_cpu_weights {
    llmi_weight w[LLMI_MODEL_ROLES]; /* the model's, with copies */
    llmi_layer *layers;              /* [n_layer], likewise */
    void *packed;                    /* every copy, in one allocation (NULL: none) */
    size_t packed_bytes;
} llmi_cpu_weights;

llm_status llmi_cpu_weights_load(const llm_model *m, llmi_cpu_weights **out);
void llmi_cpu_weights_free(llmi_cpu_weights *cw);

/* step.c */
/* weights: an llmi_cpu_weights of m, or NULL for the model's own views. */
llm_status llmi_cpu_step_create(void *backend, const llm_model *m, void *weights, uint32_t max_rows,
                                uint32_t max_ctx, void **out);
void llmi_cpu_step_free(void *step);
llm_status llmi_cpu_step_run(void *step, void *kv, const llmi_step *st, float *logits);
/* The final hidden states of the wanted rows (llmi_backend_ops.step_run_hidden);
 * `hidden` NULL runs the layers and writes nothing (tensor-parallel ranks). */
llm_status llmi_cpu_step_run_hidden(void *step, void *kv, const llmi_step *st, float *hidden);
void llmi_cpu_step_set_f32_activations(void *step, bool on);
/* Tensor parallelism (backend/tp): the step computes one rank's slice of a
 * layer from a shard of the model (its heads, its FFN columns, its rows of
 * O and down, that is its slice of the output features) and the hooks
 * assemble whole rows from every rank's slice, so every output element is
 * computed as on one CPU. */
typedef struct llmi_cpu_tp_hooks {
    void *ctx;
    /* out (n_rows rows of `full` floats) = every rank's x side by side in
     * rank order; x holds this rank's slice of each row (llmi_tp_slice's
     * columns of `full`), rows packed. */
    llm_status (*gather)(void *ctx, const float *x, uint32_t n_rows, uint32_t full, float *out);
    /* Before each layer: LLM_OK goes on; any other status ends the step.
     * Every rank must get the same answer at the same layer. */
    llm_status (*layer_begin)(void *ctx, uint32_t layer);
    uint32_t q_dim, n_ff; /* the whole model's: the gathered widths */
    /* LoRA updates (lora.h): the whole model's K/V width, and the first of
     * this rank's output columns of Q, of K and V, of gate and up, and of
     * O and down, among the whole projection's. */
    uint32_t kv_dim;
    uint32_t q_begin, kv_begin, ff_begin, embd_begin;
} llmi_cpu_tp_hooks;
/* Copies the hooks and allocates the gathered rows; NULL: a lone rank. */
llm_status llmi_cpu_step_set_tp(void *step, const llmi_cpu_tp_hooks *hooks);
/* Grows the step's LoRA scratch to what `st` needs, so that the step
 * allocates nothing while it runs: a tensor-parallel rank failing alone
 * would leave the others waiting at a gather. LLM_ERR_OUT_OF_MEMORY. */
llm_status llmi_cpu_step_lora_reserve(void *step, const llmi_step *st);

#endif
