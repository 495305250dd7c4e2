/* The exported llm_seq_state_* / llm_session_state_* functions and
 * llm_seq_tokens: argument checks, then save.c and load.c. Kept with the
 * module rather than in lib/api/api.c. */
#include "state/state.h"

/* A failure is also the session's last error (llm_session_last_error). */
#define STATE_ARG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return llmi_session_note(s, llmi_error(LLM_ERR_INVALID_ARGUMENT, __VA_ARGS__));        \
    } while (0)

LLM_API llm_status llm_seq_tokens(llm_session *s, llm_seq_id seq, llm_token *tokens,
                                  size_t capacity, size_t *n_tokens) {
    STATE_ARG(s && n_tokens, "llm_seq_tokens: NULL argument");
    STATE_ARG(tokens || capacity == 0, "llm_seq_tokens: tokens is NULL with capacity %zu",
              capacity);
    *n_tokens = 0;
    return llmi_session_note(s, llmi_seq_tokens(s, seq, tokens, capacity, n_tokens));
}

LLM_API llm_status llm_seq_state_save(llm_session *s, llm_seq_id seq, void *buf, size_t capacity,
                                      size_t *size) {
    STATE_ARG(s && size, "llm_seq_state_save: NULL argument");
    return llmi_session_note(s, llmi_state_save(s, &seq, buf, capacity, size));
}

LLM_API llm_status llm_seq_state_load(llm_session *s, const void *data, size_t size,
                                      llm_seq_id *out) {
    STATE_ARG(out, "llm_seq_state_load: out is NULL");
    *out = -1;
    STATE_ARG(s && data, "llm_seq_state_load: NULL argument");
    return llmi_session_note(s, llmi_state_load(s, data, size, out));
}

LLM_API llm_status llm_seq_state_save_file(llm_session *s, llm_seq_id seq, const char *path) {
    STATE_ARG(s && path, "llm_seq_state_save_file: NULL argument");
    return llmi_session_note(s, llmi_state_save_file(s, &seq, path));
}

LLM_API llm_status llm_seq_state_load_file(llm_session *s, const char *path, llm_seq_id *out) {
    STATE_ARG(out, "llm_seq_state_load_file: out is NULL");
    *out = -1;
    STATE_ARG(s && path, "llm_seq_state_load_file: NULL argument");
    return llmi_session_note(s, llmi_state_load_file(s, path, out));
}

LLM_API llm_status llm_session_state_save(llm_session *s, void *buf, size_t capacity,
                                          size_t *size) {
    STATE_ARG(s && size, "llm_session_state_save: NULL argument");
    return llmi_session_note(s, llmi_state_save(s, NULL, buf, capacity, size));
}

LLM_API llm_status llm_session_state_load(llm_session *s, const void *data, size_t size) {
    STATE_ARG(s && data, "llm_session_state_load: NULL argument");
    return llmi_session_note(s, llmi_state_load(s, data, size, NULL));
}

LLM_API llm_status llm_session_state_save_file(llm_session *s, const char *path) {
    STATE_ARG(s && path, "llm_session_state_save_file: NULL argument");
    return llmi_session_note(s, llmi_state_save_file(s, NULL, path));
}

LLM_API llm_status llm_session_state_load_file(llm_session *s, const char *path) {
    STATE_ARG(s && path, "llm_session_state_load_file: NULL argument");
    return llmi_session_note(s, llmi_state_load_file(s, path, NULL));
}
