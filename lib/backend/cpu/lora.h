/* LoRA updates on the CPU (model/adapter.h): after a projection y = W x of
 * a step's rows, each row with an adapter that targets the projection gets
 * y += s * B (A x). Rows without one are not touched, and each row's update
 * is computed from that row alone in one fixed order, so a row's result
 * never depends on which other rows share the step. */
#ifndef LLMI_BACKEND_CPU_LORA_H
#define LLMI_BACKEND_CPU_LORA_H

#include "backend/backend.h"
#include "backend/cpu/threadpool.h"

/* Scratch for the rank-sized intermediate A x of every row. */
typedef struct llmi_cpu_lora {
    float *t;
    size_t cap; /* floats */
} llmi_cpu_lora;

void llmi_cpu_lora_free(llmi_cpu_lora *l);

/* Adds the updates of target `target` of `layer` to y (st->n_rows rows of
 * y_cols) from the projection's input x (rows of x_cols), for the rows of
 * st whose adapter targets it. A no-op for a step without adapters.
 * LLM_ERR_OUT_OF_MEMORY when the scratch cannot grow. */
llm_status llmi_cpu_lora_apply(llmi_cpu_lora *l, llmi_pool *pool, const llmi_step *st,
                               uint32_t layer, llmi_lora_target target, const float *x,
                               uint32_t x_cols, float *y, uint32_t y_cols);

#ifdef LLMI_TEST_HOOKS
/* Test hook: updates of fewer multiply-adds than `work` run on the calling
 * thread alone (default 1 << 17; 0: always on the pool). */
void llmi_cpu_lora_test_inline_work(uint64_t work);
#endif

#endif
