/* The routed (mixture-of-experts) FFN of the CPU forward pass: step.c's FFN
 * for a layer that has a router weight (model/arch.h, LLMI_ROLE_FFN_ROUTER).
 *
 * For each row x (already normed):
 *   p = softmax(router x) over the n_expert experts;
 *   S = the n_expert_used experts of largest p (ties: lower index first);
 *   w_e = p_e, divided by sum over S of p when expert_weights_norm;
 *   out = sum over e in S, in ascending e, of w_e * down_e(silu(gate_e x) * up_e x)
 *         [+ sigmoid(shexp_gate_inp . x) * shared(x), when the layer has a shared expert].
 * Work is batched by expert: the rows routed to an expert are gathered and
 * multiplied at once, so each expert's weights are read once per step and
 * experts no row picked are not read. A row's result depends only on the
 * row: not on the other rows of the batch nor on the thread count. */
#ifndef LLMI_BACKEND_CPU_MOE_H
#define LLMI_BACKEND_CPU_MOE_H

#include "backend/cpu/threadpool.h"
#include "model/model.h"

typedef struct llmi_cpu_moe llmi_cpu_moe;

/* Scratch for up to max_rows rows of m's routed FFN; m must have experts
 * (hp.features.n_expert > 0). LLM_ERR_OUT_OF_MEMORY, or LLM_ERR_LIMIT when
 * a size overflows. */
llm_status llmi_cpu_moe_create(const llm_model *m, uint32_t max_rows, llmi_cpu_moe **out);
void llmi_cpu_moe_free(llmi_cpu_moe *moe);

/* out[n][n_embd] = the routed FFN of layer L for the n rows of x
 * ([n][n_embd], n <= max_rows). Quantized weights multiply 8-bit
 * activations as the dense matmuls do, unless f32_activations. */
void llmi_cpu_moe_run(llmi_cpu_moe *moe, llmi_pool *pool, const llmi_layer *L, const float *x,
                      uint32_t n, bool f32_activations, float *out);

/* The expert choice of one row, exposed for tests: the n_used indices of
 * the largest probs (ties: lower index first), in descending prob, and
 * their weights (prob, divided by the sum of the chosen when `norm`). */
void llmi_moe_select(const float *probs, uint32_t n_expert, uint32_t n_used, bool norm,
                     uint32_t *experts, float *weights);

#endif
