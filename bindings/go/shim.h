/* C side of the Go binding. Every wrapper that can fail copies the
 * library's message in the same C call as the failing one, because a
 * goroutine may run on another OS thread by its next cgo call and the
 * library's llm_last_error() is per thread. Messages come back as
 * malloc'd strings (*err_out) that Go frees. */
#ifndef LLMINFER_GO_SHIM_H
#define LLMINFER_GO_SHIM_H

#include <llm.h>
#include <stdlib.h>

/* One (struct, field, offset) the binding was compiled with; a table
 * ending with a NULL struct_name. Fields named "" give the struct size. */
typedef struct shim_layout_entry {
    const char *struct_name;
    const char *field;
    size_t value;
} shim_layout_entry;

const shim_layout_entry *shim_layout_table(void);

llm_status shim_model_load(const char *path, int use_mmap, llm_model **out, char **err_out);
llm_status shim_model_get_info(const llm_model *model, llm_model_info *info, char **err_out);
llm_status shim_tokenize(const llm_model *model, const char *text, size_t text_len,
                         uint32_t flags, llm_token *tokens, size_t capacity,
                         size_t *n_tokens, char **err_out);
llm_status shim_detokenize(const llm_model *model, const llm_token *tokens, size_t n_tokens,
                           uint32_t flags, char *buf, size_t capacity, size_t *n_bytes,
                           char **err_out);
/* Roles and contents are parallel arrays of n NUL-terminated strings. */
llm_status shim_chat_template_apply(const llm_model *model, const char *const *roles,
                                    const char *const *contents, size_t n, int add_generation_prompt,
                                    char *buf, size_t capacity, size_t *n_bytes, char **err_out);

/* llm_session_create_ex on `backend` (NULL or "": the CPU) with
 * `tensor_parallel` ranks and `n_devices` device ids (may be 0). */
llm_status shim_session_create(const llm_model *model, llm_session_params *params,
                               const char *backend, uint32_t tensor_parallel,
                               const int32_t *devices, uint32_t n_devices, llm_session **out,
                               char **err_out);
llm_status shim_session_get_stats(llm_session *session, llm_session_stats *stats,
                                  char **err_out);
llm_status shim_session_submit(llm_session *session, const llm_token *prompt, size_t n_prompt,
                               const llm_request_params *params, llm_request_id *out_id,
                               char **err_out);
llm_status shim_session_cancel(llm_session *session, llm_request_id id, char **err_out);
llm_status shim_session_step(llm_session *session, llm_event *events, size_t capacity,
                             size_t *n_events, char **err_out);
/* The session's last failure (llm_session_last_error) as a malloc'd string. */
llm_status shim_session_last_error(llm_session *session, llm_status *status, char **msg_out);

/* What llm_generate produced, gathered in C so that no Go code runs inside
 * the library's callback. */
typedef struct shim_generation {
    llm_token *tokens;
    size_t n_tokens, tokens_cap;
    char *text;
    size_t text_len, text_cap;
    int out_of_memory;
} shim_generation;

llm_status shim_generate(llm_session *session, const llm_token *prompt, size_t n_prompt,
                         const llm_generate_params *params, shim_generation *out,
                         llm_generate_result *result, char **err_out);
void shim_generation_free(shim_generation *g);

/* Token level, states and the standalone sampler: each copies the
 * library's message on failure (a too-small state buffer is the size query,
 * not a failure). */
llm_status shim_seq_open(llm_session *s, llm_seq_id *out, char **err_out);
llm_status shim_seq_fork(llm_session *s, llm_seq_id src, llm_seq_id *out, char **err_out);
llm_status shim_seq_close(llm_session *s, llm_seq_id seq, char **err_out);
llm_status shim_seq_truncate(llm_session *s, llm_seq_id seq, uint32_t n, char **err_out);
llm_status shim_seq_length(llm_session *s, llm_seq_id seq, uint32_t *n, char **err_out);
llm_status shim_seq_tokens(llm_session *s, llm_seq_id seq, llm_token *tokens, size_t capacity,
                           size_t *n, char **err_out);
llm_status shim_batch_create(uint32_t capacity, llm_batch **out, char **err_out);
llm_status shim_batch_add(llm_batch *b, llm_seq_id seq, uint32_t pos, llm_token token,
                          bool want_logits, char **err_out);
llm_status shim_session_decode(llm_session *s, const llm_batch *b, char **err_out);
llm_status shim_session_logits(llm_session *s, uint32_t row, const float **out, char **err_out);
llm_status shim_seq_state_save(llm_session *s, llm_seq_id seq, void *buf, size_t capacity,
                               size_t *size, char **err_out);
llm_status shim_seq_state_load(llm_session *s, const void *data, size_t size, llm_seq_id *out,
                               char **err_out);
llm_status shim_session_state_save(llm_session *s, void *buf, size_t capacity, size_t *size,
                                   char **err_out);
llm_status shim_session_state_load(llm_session *s, const void *data, size_t size, char **err_out);
llm_status shim_sampler_create(const llm_model *m, const llm_sampling_params *p, uint64_t stream,
                               llm_sampler **out, char **err_out);
llm_status shim_sampler_sample(llm_sampler *sampler, const float *logits, const llm_token *history,
                               size_t n_history, uint32_t n_generated, uint64_t position,
                               llm_token *out, char **err_out);

/* LoRA adapters (API 1.4), found at run time: LLM_ERR_UNSUPPORTED with a
 * message from an older library. */
llm_status shim_adapter_load(const llm_model *model, const char *path, int use_mmap,
                             llm_adapter **out, char **err_out);
void shim_adapter_free(llm_adapter *adapter);
llm_status shim_seq_set_adapter(llm_session *s, llm_seq_id seq, const llm_adapter *adapter,
                                float scale, char **err_out);

/* Grammars (API 1.3), found at run time: kind 0 a JSON Schema, 1 GBNF,
 * 2 a regular expression; `root` may be NULL. */
llm_status shim_grammar_compile(int kind, const llm_model *model, const char *text, size_t len,
                                uint32_t whitespace, const char *root, llm_grammar **out,
                                char **err_out);
void shim_grammar_free(llm_grammar *grammar);

#endif
