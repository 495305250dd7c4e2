/* Device selection uses the experimental part of llm.h. */
#define LLM_EXPERIMENTAL
/* RTLD_DEFAULT, for the functions of newer APIs (below). */
#define _GNU_SOURCE
#include "shim.h"

#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

static char *copy_text(const char *s) {
    if (!s) s = "";
    size_t n = strlen(s);
    char *c = malloc(n + 1);
    if (c) memcpy(c, s, n + 1);
    return c;
}

/* Called right after a failed library call, on the same thread. */
static llm_status failed(llm_status st, char **err_out) {
    if (st != LLM_OK && err_out) *err_out = copy_text(llm_last_error());
    return st;
}

#define FIELD(s, f) {#s, #f, offsetof(s, f)}
#define SIZE(s) {#s, "", sizeof(s)}

static const shim_layout_entry layout_table[] = {
    SIZE(llm_model_params),
    FIELD(llm_model_params, struct_size),
    FIELD(llm_model_params, use_mmap),
    FIELD(llm_model_params, error_message),
    FIELD(llm_model_params, error_capacity),
    SIZE(llm_model_info),
    FIELD(llm_model_info, struct_size),
    FIELD(llm_model_info, architecture),
    FIELD(llm_model_info, name),
    FIELD(llm_model_info, n_params),
    FIELD(llm_model_info, weight_bytes),
    FIELD(llm_model_info, n_layers),
    FIELD(llm_model_info, n_embd),
    FIELD(llm_model_info, n_heads),
    FIELD(llm_model_info, n_kv_heads),
    FIELD(llm_model_info, n_ff),
    FIELD(llm_model_info, n_vocab),
    FIELD(llm_model_info, n_ctx_train),
    FIELD(llm_model_info, bos),
    FIELD(llm_model_info, eos),
    FIELD(llm_model_info, eot),
    FIELD(llm_model_info, pad),
    FIELD(llm_model_info, has_chat_template),
    SIZE(llm_chat_message),
    FIELD(llm_chat_message, role),
    FIELD(llm_chat_message, content),
    SIZE(llm_session_params),
    FIELD(llm_session_params, struct_size),
    FIELD(llm_session_params, n_threads),
    FIELD(llm_session_params, n_ctx),
    FIELD(llm_session_params, max_batch_tokens),
    FIELD(llm_session_params, kv_cache_bytes),
    FIELD(llm_session_params, kv_type),
    FIELD(llm_session_params, kv_block_size),
    FIELD(llm_session_params, prefix_cache),
    FIELD(llm_session_params, draft_model),
    FIELD(llm_session_params, error_message),
    FIELD(llm_session_params, error_capacity),
    SIZE(llm_logit_bias),
    FIELD(llm_logit_bias, token),
    FIELD(llm_logit_bias, bias),
    SIZE(llm_sampling_params),
    FIELD(llm_sampling_params, struct_size),
    FIELD(llm_sampling_params, temperature),
    FIELD(llm_sampling_params, top_k),
    FIELD(llm_sampling_params, top_p),
    FIELD(llm_sampling_params, min_p),
    FIELD(llm_sampling_params, seed),
    FIELD(llm_sampling_params, repeat_penalty),
    FIELD(llm_sampling_params, repeat_last_n),
    FIELD(llm_sampling_params, presence_penalty),
    FIELD(llm_sampling_params, frequency_penalty),
    FIELD(llm_sampling_params, logit_bias),
    FIELD(llm_sampling_params, n_logit_bias),
    FIELD(llm_sampling_params, min_tokens),
    FIELD(llm_sampling_params, grammar),
    SIZE(llm_generate_params),
    FIELD(llm_generate_params, struct_size),
    FIELD(llm_generate_params, max_new_tokens),
    FIELD(llm_generate_params, sampling),
    FIELD(llm_generate_params, on_token),
    FIELD(llm_generate_params, user),
    FIELD(llm_generate_params, ignore_eos),
    FIELD(llm_generate_params, spec_mode),
    FIELD(llm_generate_params, spec_k),
    FIELD(llm_generate_params, adapter),
    FIELD(llm_generate_params, adapter_scale),
    SIZE(llm_generate_result),
    FIELD(llm_generate_result, struct_size),
    FIELD(llm_generate_result, finish_reason),
    FIELD(llm_generate_result, n_prompt_tokens),
    FIELD(llm_generate_result, n_generated_tokens),
    FIELD(llm_generate_result, prompt_seconds),
    FIELD(llm_generate_result, generate_seconds),
    FIELD(llm_generate_result, n_spec_steps),
    FIELD(llm_generate_result, n_draft_tokens),
    FIELD(llm_generate_result, n_accepted_tokens),
    SIZE(llm_request_params),
    FIELD(llm_request_params, struct_size),
    FIELD(llm_request_params, sampling),
    FIELD(llm_request_params, max_new_tokens),
    FIELD(llm_request_params, priority),
    FIELD(llm_request_params, ignore_eos),
    FIELD(llm_request_params, logprobs),
    FIELD(llm_request_params, stop_tokens),
    FIELD(llm_request_params, n_stop_tokens),
    FIELD(llm_request_params, stop_strings),
    FIELD(llm_request_params, n_stop_strings),
    FIELD(llm_request_params, top_logprobs),
    FIELD(llm_request_params, spec_mode),
    FIELD(llm_request_params, spec_k),
    FIELD(llm_request_params, n_samples),
    FIELD(llm_request_params, adapter),
    FIELD(llm_request_params, adapter_scale),
    SIZE(llm_event),
    FIELD(llm_event, request),
    FIELD(llm_event, token),
    FIELD(llm_event, text),
    FIELD(llm_event, text_len),
    FIELD(llm_event, logprob),
    FIELD(llm_event, finish_reason),
    FIELD(llm_event, status),
    FIELD(llm_event, top_tokens),
    FIELD(llm_event, top_logprobs),
    FIELD(llm_event, n_top),
    FIELD(llm_event, sample_index),
    SIZE(llm_session_stats),
    FIELD(llm_session_stats, struct_size),
    FIELD(llm_session_stats, n_running),
    FIELD(llm_session_stats, n_waiting),
    FIELD(llm_session_stats, block_size),
    FIELD(llm_session_stats, blocks_total),
    FIELD(llm_session_stats, blocks_used),
    FIELD(llm_session_stats, blocks_cached),
    FIELD(llm_session_stats, blocks_free),
    FIELD(llm_session_stats, kv_tokens_used),
    FIELD(llm_session_stats, prefix_hit_tokens),
    FIELD(llm_session_stats, prompt_tokens),
    FIELD(llm_session_stats, generated_tokens),
    FIELD(llm_session_stats, preemptions),
    FIELD(llm_session_stats, steps),
    FIELD(llm_session_stats, spec_steps),
    FIELD(llm_session_stats, spec_draft_tokens),
    FIELD(llm_session_stats, spec_accepted_tokens),
    {NULL, NULL, 0},
};

const shim_layout_entry *shim_layout_table(void) { return layout_table; }

enum { ERROR_CAPACITY = 4096 };

llm_status shim_model_load(const char *path, int use_mmap, llm_model **out, char **err_out) {
    char message[ERROR_CAPACITY];
    message[0] = '\0';
    llm_model_params params;
    llm_model_params_init_sized(&params, sizeof params);
    params.use_mmap = use_mmap != 0;
    params.error_message = message;
    params.error_capacity = sizeof message;
    llm_status st = llm_model_load(path, &params, out);
    if (st != LLM_OK) *err_out = copy_text(message);
    return st;
}

llm_status shim_model_get_info(const llm_model *model, llm_model_info *info, char **err_out) {
    return failed(llm_model_get_info(model, info), err_out);
}

llm_status shim_tokenize(const llm_model *model, const char *text, size_t text_len,
                         uint32_t flags, llm_token *tokens, size_t capacity,
                         size_t *n_tokens, char **err_out) {
    llm_status st = llm_tokenize(model, text, text_len, flags, tokens, capacity, n_tokens);
    return st == LLM_ERR_BUFFER_TOO_SMALL ? st : failed(st, err_out);
}

llm_status shim_detokenize(const llm_model *model, const llm_token *tokens, size_t n_tokens,
                           uint32_t flags, char *buf, size_t capacity, size_t *n_bytes,
                           char **err_out) {
    llm_status st = llm_detokenize(model, tokens, n_tokens, flags, buf, capacity, n_bytes);
    return st == LLM_ERR_BUFFER_TOO_SMALL ? st : failed(st, err_out);
}

llm_status shim_chat_template_apply(const llm_model *model, const char *const *roles,
                                    const char *const *contents, size_t n, int add_generation_prompt,
                                    char *buf, size_t capacity, size_t *n_bytes, char **err_out) {
    llm_chat_message *messages = calloc(n ? n : 1, sizeof *messages);
    if (!messages) {
        *err_out = copy_text("no memory for the chat messages");
        return LLM_ERR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        messages[i].role = roles[i];
        messages[i].content = contents[i];
    }
    llm_status st = llm_chat_template_apply(model, messages, n, add_generation_prompt != 0, buf,
                                            capacity, n_bytes);
    if (st != LLM_ERR_BUFFER_TOO_SMALL) failed(st, err_out);
    free(messages);
    return st;
}

llm_status shim_session_create(const llm_model *model, llm_session_params *params,
                               const char *backend, uint32_t tensor_parallel,
                               const int32_t *devices, uint32_t n_devices, llm_session **out,
                               char **err_out) {
    char message[ERROR_CAPACITY];
    message[0] = '\0';
    params->error_message = message;
    params->error_capacity = sizeof message;
    llm_device_params device;
    llm_device_params_init(&device);
    device.backend = backend;
    device.tensor_parallel = tensor_parallel;
    device.devices = n_devices ? devices : NULL;
    device.n_devices = n_devices;
    llm_status st = llm_session_create_ex(model, params, &device, out);
    params->error_message = NULL;
    params->error_capacity = 0;
    if (st != LLM_OK) *err_out = copy_text(message);
    return st;
}

llm_status shim_session_get_stats(llm_session *session, llm_session_stats *stats,
                                  char **err_out) {
    return failed(llm_session_get_stats(session, stats), err_out);
}

llm_status shim_session_submit(llm_session *session, const llm_token *prompt, size_t n_prompt,
                               const llm_request_params *params, llm_request_id *out_id,
                               char **err_out) {
    return failed(llm_session_submit(session, prompt, n_prompt, params, out_id), err_out);
}

llm_status shim_session_cancel(llm_session *session, llm_request_id id, char **err_out) {
    return failed(llm_session_cancel(session, id), err_out);
}

llm_status shim_session_step(llm_session *session, llm_event *events, size_t capacity,
                             size_t *n_events, char **err_out) {
    return failed(llm_session_step(session, events, capacity, sizeof *events, n_events),
                  err_out);
}

llm_status shim_session_last_error(llm_session *session, llm_status *status, char **msg_out) {
    size_t need = 0;
    llm_status st = llm_session_last_error(session, status, NULL, 0, &need);
    if (st != LLM_OK && st != LLM_ERR_BUFFER_TOO_SMALL) return st;
    char *buf = malloc(need ? need : 1);
    if (!buf) return LLM_ERR_OUT_OF_MEMORY;
    buf[0] = '\0';
    st = llm_session_last_error(session, status, buf, need ? need : 1, NULL);
    if (st != LLM_OK) {
        free(buf);
        return st;
    }
    *msg_out = buf;
    return LLM_OK;
}

static int grow(void **data, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void *p = realloc(*data, cap2 * elem);
    if (!p) return 0;
    *data = p;
    *cap = cap2;
    return 1;
}

static bool collect_token(llm_token token, const char *piece, size_t piece_len, void *user) {
    shim_generation *g = user;
    if (token != LLM_TOKEN_NONE) {
        if (!grow((void **)&g->tokens, &g->tokens_cap, g->n_tokens + 1, sizeof *g->tokens)) {
            g->out_of_memory = 1;
            return false;
        }
        g->tokens[g->n_tokens++] = token;
    }
    if (!grow((void **)&g->text, &g->text_cap, g->text_len + piece_len + 1, 1)) {
        g->out_of_memory = 1;
        return false;
    }
    memcpy(g->text + g->text_len, piece, piece_len);
    g->text_len += piece_len;
    g->text[g->text_len] = '\0';
    return true;
}

llm_status shim_generate(llm_session *session, const llm_token *prompt, size_t n_prompt,
                         const llm_generate_params *params, shim_generation *out,
                         llm_generate_result *result, char **err_out) {
    llm_generate_params p = *params;
    p.on_token = collect_token;
    p.user = out;
    llm_status st = llm_generate(session, prompt, n_prompt, &p, result);
    if (st == LLM_OK && out->out_of_memory) {
        *err_out = copy_text("no memory for the generated text");
        return LLM_ERR_OUT_OF_MEMORY;
    }
    return failed(st, err_out);
}

void shim_generation_free(shim_generation *g) {
    free(g->tokens);
    free(g->text);
    g->tokens = NULL;
    g->text = NULL;
}

/* ---- token level, states, standalone sampler ---- */

llm_status shim_seq_open(llm_session *s, llm_seq_id *out, char **err_out) {
    return failed(llm_seq_open(s, out), err_out);
}

llm_status shim_seq_fork(llm_session *s, llm_seq_id src, llm_seq_id *out, char **err_out) {
    return failed(llm_seq_fork(s, src, out), err_out);
}

llm_status shim_seq_close(llm_session *s, llm_seq_id seq, char **err_out) {
    return failed(llm_seq_close(s, seq), err_out);
}

llm_status shim_seq_truncate(llm_session *s, llm_seq_id seq, uint32_t n, char **err_out) {
    return failed(llm_seq_truncate(s, seq, n), err_out);
}

llm_status shim_seq_length(llm_session *s, llm_seq_id seq, uint32_t *n, char **err_out) {
    return failed(llm_seq_length(s, seq, n), err_out);
}

llm_status shim_seq_tokens(llm_session *s, llm_seq_id seq, llm_token *tokens, size_t capacity,
                           size_t *n, char **err_out) {
    return failed(llm_seq_tokens(s, seq, tokens, capacity, n), err_out);
}

llm_status shim_batch_create(uint32_t capacity, llm_batch **out, char **err_out) {
    return failed(llm_batch_create(capacity, out), err_out);
}

llm_status shim_batch_add(llm_batch *b, llm_seq_id seq, uint32_t pos, llm_token token,
                          bool want_logits, char **err_out) {
    return failed(llm_batch_add(b, seq, pos, token, want_logits), err_out);
}

llm_status shim_session_decode(llm_session *s, const llm_batch *b, char **err_out) {
    return failed(llm_session_decode(s, b), err_out);
}

llm_status shim_session_logits(llm_session *s, uint32_t row, const float **out, char **err_out) {
    return failed(llm_session_logits(s, row, out), err_out);
}

/* A too-small buffer is how the size is asked for: not an error to copy. */
static llm_status sized(llm_status st, char **err_out) {
    return st == LLM_ERR_BUFFER_TOO_SMALL ? st : failed(st, err_out);
}

llm_status shim_seq_state_save(llm_session *s, llm_seq_id seq, void *buf, size_t capacity,
                               size_t *size, char **err_out) {
    return sized(llm_seq_state_save(s, seq, buf, capacity, size), err_out);
}

llm_status shim_seq_state_load(llm_session *s, const void *data, size_t size, llm_seq_id *out,
                               char **err_out) {
    return failed(llm_seq_state_load(s, data, size, out), err_out);
}

llm_status shim_session_state_save(llm_session *s, void *buf, size_t capacity, size_t *size,
                                   char **err_out) {
    return sized(llm_session_state_save(s, buf, capacity, size), err_out);
}

llm_status shim_session_state_load(llm_session *s, const void *data, size_t size, char **err_out) {
    return failed(llm_session_state_load(s, data, size), err_out);
}

llm_status shim_sampler_create(const llm_model *m, const llm_sampling_params *p, uint64_t stream,
                               llm_sampler **out, char **err_out) {
    return failed(llm_sampler_create(m, p, stream, out), err_out);
}

llm_status shim_sampler_sample(llm_sampler *sampler, const float *logits, const llm_token *history,
                               size_t n_history, uint32_t n_generated, uint64_t position,
                               llm_token *out, char **err_out) {
    return failed(
        llm_sampler_sample(sampler, logits, history, n_history, n_generated, position, out),
        err_out);
}

/* LoRA adapters came with API 1.4. They are looked up when first used,
 * so that the binding still loads, and refuses only adapters, with an
 * older library. */
typedef void (*adapter_params_init_fn)(llm_adapter_params *, size_t);
typedef llm_status (*adapter_load_fn)(const llm_model *, const char *, const llm_adapter_params *,
                                      llm_adapter **);
typedef void (*adapter_free_fn)(llm_adapter *);
typedef llm_status (*seq_set_adapter_fn)(llm_session *, llm_seq_id, const llm_adapter *, float);

static llm_status no_adapters(char **err_out) {
    if (err_out)
        *err_out = copy_text("the loaded libllminfer has no LoRA adapters (API 1.4 adds them)");
    return LLM_ERR_UNSUPPORTED;
}

llm_status shim_adapter_load(const llm_model *model, const char *path, int use_mmap,
                             llm_adapter **out, char **err_out) {
    adapter_params_init_fn init =
        (adapter_params_init_fn)dlsym(RTLD_DEFAULT, "llm_adapter_params_init_sized");
    adapter_load_fn load = (adapter_load_fn)dlsym(RTLD_DEFAULT, "llm_adapter_load");
    *out = NULL;
    if (!init || !load)
        return no_adapters(err_out);
    llm_adapter_params params;
    init(&params, sizeof params);
    params.use_mmap = use_mmap != 0;
    return failed(load(model, path, &params, out), err_out);
}

void shim_adapter_free(llm_adapter *adapter) {
    adapter_free_fn release = (adapter_free_fn)dlsym(RTLD_DEFAULT, "llm_adapter_free");
    /* An adapter exists only where llm_adapter_load was found. */
    if (release)
        release(adapter);
}

llm_status shim_seq_set_adapter(llm_session *s, llm_seq_id seq, const llm_adapter *adapter,
                                float scale, char **err_out) {
    seq_set_adapter_fn set = (seq_set_adapter_fn)dlsym(RTLD_DEFAULT, "llm_seq_set_adapter");
    if (!set)
        return no_adapters(err_out);
    return failed(set(s, seq, adapter, scale), err_out);
}

/* Grammars came with API 1.3; found at run time, as adapters are. */
typedef void (*grammar_params_init_fn)(llm_grammar_params *, size_t);
typedef llm_status (*grammar_compile_fn)(const llm_model *, const char *, size_t,
                                         const llm_grammar_params *, llm_grammar **);
typedef void (*grammar_free_fn)(llm_grammar *);

llm_status shim_grammar_compile(int kind, const llm_model *model, const char *text, size_t len,
                                uint32_t whitespace, const char *root, llm_grammar **out,
                                char **err_out) {
    static const char *const compilers[] = {"llm_grammar_compile_json_schema",
                                            "llm_grammar_compile_ebnf",
                                            "llm_grammar_compile_regex"};
    *out = NULL;
    if (kind < 0 || kind > 2) {
        if (err_out) *err_out = copy_text("unknown grammar kind");
        return LLM_ERR_INVALID_ARGUMENT;
    }
    grammar_params_init_fn init =
        (grammar_params_init_fn)dlsym(RTLD_DEFAULT, "llm_grammar_params_init_sized");
    grammar_compile_fn compile = (grammar_compile_fn)dlsym(RTLD_DEFAULT, compilers[kind]);
    if (!init || !compile) {
        if (err_out)
            *err_out = copy_text("the loaded libllminfer has no grammars (API 1.3 adds them)");
        return LLM_ERR_UNSUPPORTED;
    }
    llm_grammar_params params;
    init(&params, sizeof params);
    params.whitespace = whitespace;
    params.root = root;
    return failed(compile(model, text, len, &params, out), err_out);
}

void shim_grammar_free(llm_grammar *grammar) {
    grammar_free_fn release = (grammar_free_fn)dlsym(RTLD_DEFAULT, "llm_grammar_free");
    if (release)
        release(grammar);
}
