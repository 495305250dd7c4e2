/* The CPU backend's pieces shared by its files: the instance (a thread
 * pool), the KV store (host arrays, one per layer for K and one for V) and
 * the step entries (step.c). */
#ifndef LLMI_BACKEND_CPU_H
#define LLMI_BACKEND_CPU_H

#include "backend/backend.h"
#include "backend/cpu/threadpool.h"

typedef struct llmi_cpu_kv {
    llmi_kv_layout layout;
    uint32_t elem_size; /* bytes per element: 4 (f32) or 2 (f16, bf16) */
    size_t row_bytes;   /* kv_dim * elem_size: one slot of one layer */
    /* Per layer: n_blocks * block_size * row_bytes bytes, slot-major. */
    uint8_t **k, **v;
} llmi_cpu_kv;

static inline uint8_t *llmi_cpu_kv_row(const llmi_cpu_kv *kv, uint32_t layer, bool v,
                                       uint32_t slot) {
    return (v ? kv->v : kv->k)[layer] + (size_t)slot * kv->row_bytes;
}

/* step.c */
llm_status llmi_cpu_step_create(void *backend, const llm_model *m, void *weights,
                                uint32_t max_rows, uint32_t max_ctx, void **out);
void llmi_cpu_step_free(void *step);
llm_status llmi_cpu_step_run(void *step, void *kv, const llmi_step *st, float *logits);
void llmi_cpu_step_set_f32_activations(void *step, bool on);
/* Tensor parallelism: `fn` replaces n floats of x (this rank's partial sums
 * of a row-parallel matmul) with their sum over every rank; it is called
 * after the O and the down matmul of each layer. NULL: a lone rank. */
typedef void (*llmi_cpu_reduce_fn)(void *ctx, float *x, size_t n);
void llmi_cpu_step_set_reduce(void *step, llmi_cpu_reduce_fn fn, void *ctx);

#endif
