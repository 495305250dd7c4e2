/* The model forward pass: one call computes every row of a batch (any mix of
 * sequences and positions), reading each weight once per call. These are the
 * dispatchers of the backend interface (backend/backend.h): a forward object
 * runs on the backend it was created with, the CPU (forward.c) by default. */
#ifndef LLMI_FORWARD_H
#define LLMI_FORWARD_H

#include "backend/threadpool.h"
#include "kv/kv.h"
#include "model/model.h"

/* One token to compute: its sequence, position in it, and whether the caller
 * wants its logits. Rows of one sequence must come in increasing position
 * order, and the sequence's KV must hold every earlier position. */
typedef struct llmi_batch_row {
    llm_token token;
    uint32_t pos;
    llmi_kv_seq *seq;
    bool want_logits;
} llmi_batch_row;

typedef struct llmi_forward llmi_forward;

/* Scratch for up to max_rows rows per call, attention up to max_ctx positions,
 * on the CPU backend (llmi_forward_create_ops picks another). */
llm_status llmi_forward_create(const llm_model *m, llmi_pool *pool, uint32_t max_rows,
                               uint32_t max_ctx, llmi_forward **out);
void llmi_forward_free(llmi_forward *f);

/* Quantized weights normally multiply 8-bit quantized activations with
 * integer dot products (as llama.cpp does: faster, and rounding noise of the
 * same size as llama.cpp's). With `on`, activations stay f32: slower, and the
 * closest to exact arithmetic. Used by the tests against llama.cpp. */
void llmi_forward_set_f32_activations(llmi_forward *f, bool on);

/* Runs the rows. KV blocks for every (seq, pos) must already be reserved.
 * Logits of rows with want_logits are written in row order to `logits`
 * (n_vocab floats each). On success updates each seq's n_tokens to
 * max(pos + 1); on failure (a bad row, or the backend's status such as
 * LLM_ERR_BACKEND) no seq's n_tokens changes. */
llm_status llmi_forward_run(llmi_forward *f, llmi_kv *kv, const llmi_batch_row *rows,
                            uint32_t n_rows, float *logits);

#endif
