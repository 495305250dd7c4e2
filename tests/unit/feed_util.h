/* White-box helper: computes tokens of a sequence on a session's engine
 * directly, outside the scheduler, for tests that read raw logits. */
#ifndef TEST_FEED_UTIL_H
#define TEST_FEED_UTIL_H

#include "session/session.h"

/* Computes tokens[0, n) of `seq` from seq->n_tokens on, in chunks of
 * max_batch_tokens; the last token's logits (n_vocab floats) go to
 * `logits` when it is not NULL. On failure seq keeps its old length. */
static inline llm_status test_feed(llm_session *s, llmi_kv_seq *seq, const llm_token *tokens,
                                   size_t n, float *logits) {
    uint32_t start = seq->n_tokens;
    llm_status st = llmi_kv_seq_reserve(s->kv, seq, start + (uint32_t)n);
    for (size_t done = 0; st == LLM_OK && done < n;) {
        uint32_t chunk = (uint32_t)(n - done);
        if (chunk > s->params.max_batch_tokens) chunk = s->params.max_batch_tokens;
        for (uint32_t i = 0; i < chunk; i++)
            s->eng->rows[i] = (llmi_batch_row){tokens[done + i], start + (uint32_t)(done + i), seq,
                                          false};
        s->eng->rows[chunk - 1].want_logits = done + chunk == n && logits;
        st = llmi_engine_run(s->eng, s->eng->rows, chunk, logits);
        done += chunk;
    }
    if (st != LLM_OK) llmi_kv_seq_truncate(s->kv, seq, start);
    return st;
}

#endif
