/* The request-level API on the session's scheduler. */
#include "session/session.h"

llm_status llmi_session_submit(llm_session *s, const llm_token *prompt, size_t n,
                               const llm_request_params *params, llm_request_id *out) {
    return llmi_sched_submit(&s->sched, prompt, n, params, out);
}

llm_status llmi_session_cancel(llm_session *s, llm_request_id id) {
    return llmi_sched_cancel(&s->sched, id);
}

llm_status llmi_session_step(llm_session *s, llm_event *events, size_t capacity,
                             size_t event_size, size_t *n_events) {
    return llmi_sched_step(&s->sched, events, capacity, event_size, n_events);
}

llm_status llmi_session_generate(llm_session *s, const llm_token *prompt, size_t n,
                                 const llm_generate_params *params, llm_generate_result *result) {
    return llmi_sched_generate(&s->sched, prompt, n, params, result);
}

/* The scheduler reads s->seqs under its lock, which guards it. */
void llmi_session_stats(llm_session *s, llm_session_stats *st) {
    llmi_sched_stats(&s->sched, &s->seqs, &s->n_seqs, st);
}

llm_status llmi_session_check(llm_session *s) {
    return llmi_sched_check(&s->sched, &s->seqs, &s->n_seqs);
}
