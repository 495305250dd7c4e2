/* LoRA updates on the CPU (model/adapter.h): after a projection y = W x of
 * a step's rows, each row with an adapter that targets the projection gets
 * y += s * B (A x). Rows without one are not touched, and each row's update
 * is computed from that row alone in one fixed order, so a row's result
 * never depends on which other rows share the step.
 *
 * Under tensor parallelism (backend/tp) a rank's y holds only its columns
 * [y_begin, y_begin + y_cols) of the projection's output (its heads, its
 * FFN columns, its embedding features), and its x is always the whole input
 * row: the Q/K/V and gate/up inputs are whole on every rank, and the O and
 * down inputs are gathered whole before those matmuls (backend/tp/shard.c).
 * So every rank computes t = A x from the whole row, with the same bits on
 * every rank, and adds s * B t to its own columns only, reading its columns
 * of B in place. Each output element then gets the bits one CPU gives it:
 * no partial sums of A x are needed, and no rank sums another rank's
 * work. What differs from one CPU: every rank computes all of A x (its
 * rank x in multiply-adds are not split), and the axpy over B runs on a
 * window of whole 16-float groups around the rank's columns
 * (lora.c, "Windows"). */
#ifndef LLMI_BACKEND_CPU_LORA_H
#define LLMI_BACKEND_CPU_LORA_H

#include "backend/backend.h"
#include "backend/cpu/threadpool.h"

/* Scratch for the rank-sized intermediate A x of every row, and under
 * tensor parallelism each row's window of output columns. */
typedef struct llmi_cpu_lora {
    float *t;
    size_t cap; /* floats */
    float *win;
    size_t win_cap; /* floats */
} llmi_cpu_lora;

void llmi_cpu_lora_free(llmi_cpu_lora *l);

/* Grows the scratch to what a step of n_rows rows whose adapters have
 * ranks up to max_rank needs, with windows for outputs up to max_cols
 * columns wide (0: no windows, one CPU). Nothing is allocated once it is
 * large enough. LLM_ERR_OUT_OF_MEMORY when it cannot grow. */
llm_status llmi_cpu_lora_reserve(llmi_cpu_lora *l, uint32_t n_rows, uint32_t max_rank,
                                 uint32_t max_cols);

/* Adds the updates of target `target` of `layer` to y (st->n_rows rows of
 * y_cols: columns [y_begin, y_begin + y_cols) of the projection's y_full
 * outputs; 0 and y_full on one CPU) from the projection's whole input x
 * (rows of x_cols), for the rows of st whose adapter targets it. A no-op
 * for a step without adapters. LLM_ERR_INVALID_ARGUMENT naming the adapter,
 * layer and target when a pair's A is not x_cols wide or its B not y_full
 * long: the check depends on the projection's whole shape only, never on
 * the rank's slice, so all ranks of a tensor-parallel step refuse at the
 * same call and none is left waiting for the others.
 * LLM_ERR_OUT_OF_MEMORY when the scratch cannot grow (a tensor-parallel
 * rank reserves it before the step: llmi_cpu_lora_reserve). */
llm_status llmi_cpu_lora_apply(llmi_cpu_lora *l, llmi_pool *pool, const llmi_step *st,
                               uint32_t layer, llmi_lora_target target, const float *x,
                               uint32_t x_cols, float *y, uint32_t y_cols, uint32_t y_begin,
                               uint32_t y_full);

#ifdef LLMI_TEST_HOOKS
/* Test hook: updates of fewer multiply-adds than `work` run on the calling
 * thread alone (default 1 << 17; 0: always on the pool). */
void llmi_cpu_lora_test_inline_work(uint64_t work);
#endif

#endif
