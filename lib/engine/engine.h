/* An engine: one model running on one backend, with its KV pool. It joins
 * the backend's objects (instance, the model's shared weights, KV store,
 * step scratch) to the core's KV bookkeeping (kv/kv.h), checks every step
 * before the backend sees it, turns the core's rows into the backend's step
 * descriptor (backend/backend.h) and advances sequence lengths only after a
 * step succeeded, so a failed step changes no sequence.
 *
 * A session runs its model on one engine; a draft model for speculative
 * decoding is a second engine sharing the session's backend instance.
 * Not thread-safe: the session serialises calls (KV bookkeeping under its
 * lock, steps on its stepping thread). */
#ifndef LLMI_ENGINE_H
#define LLMI_ENGINE_H

#include "backend/backend.h"
#include "kv/kv.h"
#include "model/adapter.h"
#include "model/model.h"

/* One token to compute: its sequence, position in it, and whether the caller
 * wants its logits. Rows of one sequence must come in increasing position
 * order, and the sequence's KV must hold every earlier position. */
typedef struct llmi_batch_row {
    llm_token token;
    uint32_t pos;
    llmi_kv_seq *seq;
    bool want_logits;
    /* A LoRA adapter of the engine's model for this row, and its scale
     * (model/adapter.h); NULL for the base model. Rows of one sequence
     * use one adapter (its K/V depend on it). */
    const llm_adapter *adapter;
    float adapter_scale;
} llmi_batch_row;

typedef struct llmi_engine_config {
    const llm_model *model;
    const llmi_backend_ops *ops;     /* NULL: the CPU backend */
    void *backend;                   /* an instance to share (borrowed), or NULL to open one */
    llmi_backend_config backend_cfg; /* for opening one */
    uint32_t kv_block_size, kv_blocks;
    llm_kv_type kv_type;
    uint32_t max_rows, max_ctx; /* per step; attention span */
    /* The session's interrupt flag (borrowed, may be NULL): a step started
     * while it is set fails with LLM_ERR_CANCELLED, and the backend may
     * stop a running one (llmi_step.interrupt). */
    const atomic_int *interrupt;
    /* The session's progress callback (borrowed, may be NULL): the weights'
     * upload, then the KV store and step buffers (LLM_PROGRESS_WARMUP). */
    const llmi_progress *progress;
} llmi_engine_config;

typedef struct llmi_engine {
    const llm_model *model;
    const llmi_backend_ops *ops;
    void *backend;
    bool owns_backend;
    int32_t device;
    void *weights; /* the model's, shared: llmi_backend_weights_acquire */
    llmi_kv *kv;   /* bookkeeping of kv_store's blocks */
    void *kv_store;
    llmi_kv_layout layout;
    size_t kv_row_bytes; /* one slot of one layer's K (or V) */
    void *step;
    uint32_t max_rows, max_ctx;
    /* The step descriptor's buffer; the sequence of each slot and the slot
     * of each row while it is built ([max_rows] each). */
    uint32_t *words;
    size_t cap_words;
    const llmi_kv_seq **slot_seqs;
    uint32_t *row_slot;
    /* [max_rows]: where its user (the scheduler's steps, the token-level
     * decode) builds a step's rows; the engine itself never reads it. */
    llmi_batch_row *rows;
    const atomic_int *interrupt; /* llmi_engine_config.interrupt */
    /* [max_rows]: the distinct (adapter, scale) pairs of the step being
     * built (llmi_step.adapters). */
    const llm_adapter **step_adapters;
    float *step_adapter_scale;
} llmi_engine;

/* Whether a KV cache of `type` can hold the rows of a model with these
 * hyper-parameters (`who` names it in the message): LLM_ERR_INVALID_ARGUMENT
 * for a value outside llm_kv_type, LLM_ERR_UNSUPPORTED for a block type
 * (Q8_0, Q4_0) and a head_dim that is not a multiple of LLMI_QK. */
llm_status llmi_engine_kv_type_check(llm_kv_type type, const llmi_hparams *hp, const char *who);

llm_status llmi_engine_create(const llmi_engine_config *cfg, llmi_engine **out);

/* Whether the host asked the running call to stop (llm_session_interrupt). */
static inline bool llmi_engine_interrupted(const llmi_engine *e) {
    return e->interrupt && atomic_load_explicit(e->interrupt, memory_order_relaxed);
}
/* NULL is a no-op. The KV bookkeeping must hold no sequence's blocks any
 * more (callers release them first). */
void llmi_engine_free(llmi_engine *e);

/* Computes the rows: K/V of every row into its sequence's blocks (reserved
 * beforehand), logits of the rows with want_logits in row order into
 * `logits` (n_vocab floats each). On success each row's sequence holds
 * max(n_tokens, pos + 1) tokens; on failure (a bad row: LLM_ERR_LIMIT,
 * LLM_ERR_INVALID_ARGUMENT, LLM_ERR_INTERNAL; or the backend's status)
 * no sequence changes. */
llm_status llmi_engine_run(llmi_engine *e, const llmi_batch_row *rows, uint32_t n_rows,
                           float *logits);

/* As llmi_engine_run, but the rows with want_logits get their final hidden
 * state (n_embd floats each, after the output norm) in `hidden` instead of
 * logits. LLM_ERR_UNSUPPORTED, before anything runs, on a backend without
 * step_run_hidden (llmi_engine_has_hidden). */
llm_status llmi_engine_run_hidden(llmi_engine *e, const llmi_batch_row *rows, uint32_t n_rows,
                                  float *hidden);
/* Whether the engine's backend applies LoRA adapters (rows with one are
 * refused with LLM_ERR_UNSUPPORTED otherwise). */
bool llmi_engine_has_lora(const llmi_engine *e);
/* LLM_ERR_UNSUPPORTED with the message for a LoRA adapter on a backend
 * that does not apply them: which backends do, and how the CUDA backend's
 * opt-in is turned on (LLM_CUDA_LORA=1). */
llm_status llmi_engine_lora_refused(const llmi_engine *e);
/* Whether the engine's backend returns hidden states. */
bool llmi_engine_has_hidden(const llmi_engine *e);

/* Keeps activations in f32 where the backend supports it (tests against
 * llama.cpp); ignored otherwise. */
void llmi_engine_set_f32_activations(llmi_engine *e, bool on);

/* K (v false) or V of `layer` for positions [pos, pos + n) of seq, raw
 * elements of the pool's type, kv_row_bytes per position: read into dst or
 * written from src. The positions must lie in blocks seq holds. */
llm_status llmi_engine_kv_read(llmi_engine *e, const llmi_kv_seq *seq, uint32_t layer, bool v,
                               uint32_t pos, uint32_t n, void *dst);
llm_status llmi_engine_kv_write(llmi_engine *e, const llmi_kv_seq *seq, uint32_t layer, bool v,
                                uint32_t pos, uint32_t n, const void *src);

#endif
