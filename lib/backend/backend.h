/* The backend interface: how the forward pass reaches the hardware.
 *
 * A backend is a struct of function pointers that implements the whole
 * forward pass of a model: create scratch for a model, run a batch of rows
 * (any mix of sequences and positions) writing K/V into the session's paged
 * KV pool and logits for the rows that want them, free.
 *
 * Why the seam is the whole forward pass, not per-op dispatch (matmul,
 * rmsnorm, rope, attention, ... as DESIGN.md first sketched): a GPU backend
 * wants whole decode steps. The CUDA plug-in (loaded with dlopen) captures a
 * step as a CUDA graph, fuses kernels, keeps activations on the device from
 * the embedding to the logits and overlaps its launches with the host; a
 * per-op interface would cost a host round trip per op and pin one kernel
 * boundary for every backend. A per-op seam also fixes activation layouts
 * and quantization (our 8-bit activations) across backends, which the whole
 * pass leaves to each backend. Everything around the pass (scheduling, KV
 * block tables, sampling, speculative decoding) stays in the core and is
 * shared by every backend.
 *
 * Contract of each op:
 *   create  scratch for up to max_rows rows per run and attention over up
 *           to max_ctx positions; on failure *out is NULL and nothing is
 *           left to free.
 *   free    accepts NULL.
 *   run     rows are already checked by the dispatcher (at most max_rows,
 *           tokens in the vocabulary, positions inside max_ctx, a KV block
 *           reserved for each (seq, pos)). Writes the K/V of every row at
 *           (seq, pos) and the logits of rows with want_logits, in row order,
 *           n_vocab floats each. It must not change seq->n_tokens: the
 *           dispatcher advances the lengths only when run returns LLM_OK, so
 *           a failure at any point of a pass leaves every sequence as it was
 *           (K/V it wrote lies past the sequences' ends and is overwritten
 *           by the next pass). Every failure returns a status (never aborts):
 *           LLM_ERR_BACKEND for a device failure, LLM_ERR_OUT_OF_MEMORY.
 *   set_f32_activations  optional (NULL = ignored): see forward.h.
 *
 * The dispatchers are llmi_forward_create/run/free/set_f32_activations in
 * forward.h; a forward object remembers the ops it was created with. */
#ifndef LLMI_BACKEND_H
#define LLMI_BACKEND_H

#include "backend/forward.h"

typedef struct llmi_backend_ops {
    const char *name; /* "cpu", "cuda", ... */
    llm_status (*create)(const llm_model *m, llmi_pool *pool, uint32_t max_rows,
                         uint32_t max_ctx, void **out);
    void (*free)(void *ctx);
    llm_status (*run)(void *ctx, llmi_kv *kv, const llmi_batch_row *rows, uint32_t n_rows,
                      float *logits);
    void (*set_f32_activations)(void *ctx, bool on);
} llmi_backend_ops;

/* The CPU forward pass (forward.c): threads of `pool`, SIMD kernels picked
 * at run time. */
extern const llmi_backend_ops llmi_backend_cpu;

/* llmi_forward_create with the given backend. */
llm_status llmi_forward_create_ops(const llmi_backend_ops *ops, const llm_model *m,
                                   llmi_pool *pool, uint32_t max_rows, uint32_t max_ctx,
                                   llmi_forward **out);
/* The backend a forward object runs on. */
const llmi_backend_ops *llmi_forward_ops(const llmi_forward *f);

/* Test hooks, in the style of llmi_alloc_fail_after. Every call of
 * llmi_forward_create* and llmi_forward_run, of every forward object (a
 * session's target model and its draft model alike), counts as one backend
 * call. llmi_backend_fault_inject(n, status) restarts the count at 0 and
 * makes the n-th call from now (n >= 1) fail with `status` (LLM_ERR_BACKEND
 * or LLM_ERR_OUT_OF_MEMORY) and the message "injected backend fault" before
 * it does anything; the calls after it succeed again. n = 0 (or status
 * LLM_OK) disables. Atomic: safe while other threads run forward passes. */
void llmi_backend_fault_inject(uint64_t fail_at, llm_status status);
/* The same, except that a run call that is to fail fails after the backend
 * ran: K/V and logits are written, as when a device reports an error at the
 * end of a pass (an asynchronous fault seen at the final synchronisation).
 * Creates still fail before anything. */
void llmi_backend_fault_inject_late(uint64_t fail_at, llm_status status);
/* Backend calls since the last llmi_backend_fault_inject (or the process
 * start): a sweep armed at n is past the operation's last call when this
 * stays below n. */
uint64_t llmi_backend_fault_calls(void);

#endif
