/* A session: the engine running its model (backend instance, KV pool), the
 * sampler and the scheduler. The request-level and token-level APIs build
 * on this. */
#ifndef LLMI_SESSION_H
#define LLMI_SESSION_H

#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sample/sample.h"
#include "sched/sched.h"
#include "spec/spec.h"

/* Where a session runs: a backend and one of its devices (device.c). */
typedef struct llmi_session_device {
    const llmi_backend_ops *ops;
    int32_t device;
} llmi_session_device;

struct llm_session {
    const llm_model *model;
    llm_session_params params; /* resolved: no zeros left */
    llmi_session_device device;
    llmi_engine *eng;
    llmi_kv *kv; /* eng->kv: the KV bookkeeping */
    llmi_sampler sampler;
    llmi_sched sched; /* requests; its lock guards everything KV */
    bool sched_ready;
    llmi_kv_seq **seqs; /* token-level sequences by id (llmi_tseq); NULL = closed */
    size_t n_seqs;
    uint32_t *decode_rows; /* last decode: batch row -> logits row, or UINT32_MAX */
    uint32_t n_decode_rows, cap_decode_rows;
    float *decode_logits; /* [cap_decode_logits][n_vocab]: llm_session_decode's own, so
                             steps and llm_generate leave them alone */
    uint32_t cap_decode_logits;
    llmi_spec spec;       /* speculative decoding: draft model, cost model */
    atomic_int interrupt; /* llm_session_interrupt; cleared as each call starts */
    /* llm_session_last_error: the last failure of a call on the session. */
    pthread_mutex_t error_lock;
    llm_status error_status;
    char error_message[1024]; /* as long as a thread's message (core.c) */
};

/* Records a failed call's status and the thread's message as the
 * session's last error (llm_session_last_error); returns `st`. OK, or a
 * NULL session, records nothing. */
llm_status llmi_session_note(llm_session *s, llm_status st);
/* Starts a call that llm_session_interrupt may stop: clears the flag. */
static inline void llmi_session_begin_interruptible(llm_session *s) {
    atomic_store_explicit(&s->interrupt, 0, memory_order_relaxed);
}

/* A token-level sequence: its KV and the tokens it holds. session->seqs[id]
 * points at `kv`, the first member, so code that only needs the KV (the
 * scheduler's invariant checks, stats) sees a plain llmi_kv_seq; the token
 * API gets the rest back with llmi_tseq_of. */
typedef struct llmi_tseq {
    llmi_kv_seq kv;
    llm_token *tokens; /* [cap]; tokens[0, kv.n_tokens) are the sequence's */
    uint32_t cap;
    /* llm_seq_set_adapter: its rows' LoRA adapter (borrowed) and scale;
     * NULL for the base model. Forks inherit it. */
    const llm_adapter *adapter;
    float adapter_scale;
    /* Restored from a state saved under an adapter (lib/state): the
     * fingerprint and scale of the adapter its K/V were computed with, until
     * llm_seq_set_adapter gives it that adapter; 0 when not waiting. A
     * waiting sequence refuses to decode (llmi_seq_check_adapter). Forks
     * inherit the wait. */
    uint64_t wait_fingerprint;
    float wait_scale;
} llmi_tseq;

/* LLM_ERR_INVALID_ARGUMENT naming the adapter and scale when sequence `id`
 * (t) still waits for the adapter its saved K/V were computed with. */
llm_status llmi_seq_check_adapter(const llmi_tseq *t, llm_seq_id id);

static inline llmi_tseq *llmi_tseq_of(llmi_kv_seq *q) { return (llmi_tseq *)q; }

/* Makes t->tokens hold at least n tokens; the tokens held are kept. On
 * failure (LLM_ERR_OUT_OF_MEMORY) t is unchanged. */
llm_status llmi_tseq_reserve(llmi_tseq *t, uint32_t n);
/* Releases the KV blocks and frees the sequence; NULL is a no-op. Takes the
 * session lock when `lock`, else the caller holds it. */
void llmi_tseq_free(llm_session *s, llmi_kv_seq *q, bool lock);

/* The request-level API on the session's scheduler (requests.c); stats and
 * the invariant check count the token-level sequences too. */
llm_status llmi_session_submit(llm_session *s, const llm_token *prompt, size_t n,
                               const llm_request_params *params, llm_request_id *out);
llm_status llmi_session_cancel(llm_session *s, llm_request_id id);
llm_status llmi_session_step(llm_session *s, llm_event *events, size_t capacity, size_t event_size,
                             size_t *n_events);
llm_status llmi_session_generate(llm_session *s, const llm_token *prompt, size_t n,
                                 const llm_generate_params *params, llm_generate_result *result);
void llmi_session_stats(llm_session *s, llm_session_stats *st);
/* Invariant check over every live sequence of the session (tests). */
llm_status llmi_session_check(llm_session *s);

/* A session on the CPU. */
llm_status llmi_session_create(const llm_model *m, const llm_session_params *p, llm_session **out);
/* A session on `dev` (from llmi_session_device_resolve). */
llm_status llmi_session_create_on(const llm_model *m, const llm_session_params *p,
                                  const llmi_session_device *dev, llm_session **out);
/* Resolves the experimental llm_device_params (NULL: defaults, the CPU),
 * reading only what its struct_size covers, to a backend that is available
 * here and a device it has. LLM_ERR_UNSUPPORTED for a backend that is not
 * available and for tensor parallelism; LLM_ERR_INVALID_ARGUMENT for bad
 * fields and device ids the backend does not have. */
llm_status llmi_session_device_resolve(const llm_device_params *in, llmi_session_device *out);
void llmi_session_free(llm_session *s);

/* Token-level API (decode.c). */
llm_status llmi_batch_create(uint32_t capacity, llm_batch **out);
void llmi_batch_free(llm_batch *b);
void llmi_batch_clear(llm_batch *b);
llm_status llmi_batch_add(llm_batch *b, llm_seq_id seq, uint32_t pos, llm_token tok, bool want);
/* Opens an empty sequence, or a fork of *src_id when src_id is not NULL. */
llm_status llmi_seq_open(llm_session *s, const llm_seq_id *src_id, llm_seq_id *out);
llm_status llmi_seq_close(llm_session *s, llm_seq_id id);
llm_status llmi_seq_truncate(llm_session *s, llm_seq_id id, uint32_t n_tokens);
/* llm_seq_set_adapter: the sequence must hold no tokens yet, or be a
 * restored sequence waiting for this adapter (fingerprint) and scale. */
llm_status llmi_seq_set_adapter(llm_session *s, llm_seq_id id, const llm_adapter *adapter,
                                float scale);
llm_status llmi_seq_length(llm_session *s, llm_seq_id id, uint32_t *n_tokens);
/* The tokens of a sequence; LLM_ERR_BUFFER_TOO_SMALL with *n_tokens = needed. */
llm_status llmi_seq_tokens(llm_session *s, llm_seq_id id, llm_token *tokens, size_t capacity,
                           size_t *n_tokens);
/* The open sequence `id`, or NULL. */
llmi_tseq *llmi_seq_find(llm_session *s, llm_seq_id id);
/* A free slot of the sequence table (growing it); under the lock. */
llm_status llmi_seq_new_slot(llm_session *s, llm_seq_id *out);
llm_status llmi_session_decode(llm_session *s, const llm_batch *b);
llm_status llmi_session_logits(llm_session *s, uint32_t row, const float **out);

/* Embeddings (embed.c). */
/* The pooling LLM_POOLING_MODEL stands for on m; LLM_ERR_UNSUPPORTED for a
 * file's pooling that embeddings cannot do. */
llm_status llmi_model_pooling(const llm_model *m, llm_pooling *out);
/* llm_session_embed with its arguments checked for NULL and `p` complete. */
llm_status llmi_session_embed(llm_session *s, const llm_token *const *inputs,
                              const size_t *n_tokens, size_t n_inputs, const llm_embed_params *p,
                              float *out, size_t capacity, size_t *n_floats);

#endif
