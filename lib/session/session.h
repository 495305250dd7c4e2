/* A session: threads, KV block pool, forward-pass scratch and sampler for one
 * model. The request-level scheduler and token-level API build on this. */
#ifndef LLMI_SESSION_H
#define LLMI_SESSION_H

#include "backend/forward.h"
#include "backend/threadpool.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sample/sample.h"

struct llm_session {
    const llm_model *model;
    llm_session_params params; /* resolved: no zeros left */
    llmi_pool *pool;
    llmi_kv *kv;
    llmi_forward *fwd;
    llmi_sampler sampler;
    llmi_kv_seq seq;      /* the sequence llm_generate uses */
    llmi_batch_row *rows; /* [max_batch_tokens] */
    float *logits;        /* [n_vocab] */
    char *piece;          /* streaming text buffer */
    size_t piece_cap;
    uint64_t n_generate_calls;
};

llm_status llmi_session_create(const llm_model *m, const llm_session_params *p,
                               llm_session **out);
void llmi_session_free(llm_session *s);

/* Computes `n` tokens of `seq` starting at seq->n_tokens, in chunks of at most
 * max_batch_tokens; writes the last token's logits to s->logits when
 * want_last_logits. */
llm_status llmi_session_feed(llm_session *s, llmi_kv_seq *seq, const llm_token *tokens,
                             size_t n, bool want_last_logits);

llm_status llmi_generate(llm_session *s, const llm_token *prompt, size_t n_prompt,
                         const llm_generate_params *params, llm_generate_result *result);

#endif
