/* The exported llm_* functions: argument checks, then the modules. */
#include "core/core.h"
#include "model/model.h"
#include "sample/sample.h"
#include "session/session.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>

#define LLMI_STR_(x) #x
#define LLMI_STR(x) LLMI_STR_(x)

LLM_API unsigned llm_version_number(void) { return LLM_VERSION_NUMBER; }

LLM_API const char *llm_version_string(void) {
    return LLMI_STR(LLM_VERSION_MAJOR) "." LLMI_STR(LLM_VERSION_MINOR) "." LLMI_STR(
        LLM_VERSION_PATCH);
}

#define STATUS_TEXT_(name, value, text) \
    case name:                          \
        return text;
#define STATUS_NAME_(name, value, text) \
    case name:                          \
        return #name;

LLM_API const char *llm_status_str(llm_status status) {
    switch (status) { LLM_STATUS_LIST(STATUS_TEXT_) }
    return "unknown status";
}

LLM_API const char *llm_status_name(llm_status status) {
    switch (status) { LLM_STATUS_LIST(STATUS_NAME_) }
    return "LLM_STATUS_UNKNOWN";
}

LLM_API const char *llm_last_error(void) { return llmi_error_message(); }

LLM_API void llm_log_set(llm_log_fn fn, llm_log_level min_level, void *user) {
    llmi_log_set(fn, min_level, user);
}

#define CHECK_ARG(cond, ...) \
    do {                                                                         \
        if (!(cond)) return llmi_error(LLM_ERR_INVALID_ARGUMENT, __VA_ARGS__);    \
    } while (0)

/* Argument checks of calls on a session: a failure is also the session's
 * last error (llm_session_last_error). */
#define SESSION_ARG(s, cond, ...)                                                   \
    do {                                                                         \
        if (!(cond))                                                             \
            return llmi_session_note((s), llmi_error(LLM_ERR_INVALID_ARGUMENT, __VA_ARGS__)); \
    } while (0)

/* Params structs: size must at least hold struct_size and be plausible. */
static llm_status check_struct_size(const char *what, uint32_t size) {
    if (size < sizeof(uint32_t) || size > (1u << 16))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "%s.struct_size is %u; initialise it with its _init function", what,
                          size);
    return LLM_OK;
}

/* ---- models ---- */

LLM_API void llm_model_params_init_sized(llm_model_params *p, size_t size) {
    llm_model_params d = {.struct_size = sizeof d, .use_mmap = true};
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API void llm_model_params_init(llm_model_params *p) {
    llm_model_params_init_sized(p, LLMI_LEGACY_MODEL_PARAMS_SIZE);
}

static llm_status model_load(const char *path, const llm_model_params *p, llm_model **out) {
    CHECK_ARG(path, "llm_model_load: path is NULL");
    if (p->error_capacity > 0 && !p->error_message)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_model_params.error_message is NULL with error_capacity %zu",
                          p->error_capacity);
    llmi_progress progress = {p->progress, p->progress_user};
    return llmi_model_load_progress(path, p->use_mmap, &progress, out);
}

LLM_API llm_status llm_model_load(const char *path, const llm_model_params *params,
                                  llm_model **out) {
    CHECK_ARG(out, "llm_model_load: out is NULL");
    *out = NULL;
    llm_model_params p;
    llm_model_params_init_sized(&p, sizeof p);
    LLMI_TRY(llmi_params_copy("llm_model_params", params, &p, sizeof p));
    llm_status st = model_load(path, &p, out);
    if (st != LLM_OK) llmi_error_copy_to(p.error_message, p.error_capacity);
    return st;
}

LLM_API void llm_model_free(llm_model *model) { llmi_model_free(model); }

LLM_API llm_status llm_model_get_info(const llm_model *m, llm_model_info *info) {
    CHECK_ARG(m && info, "llm_model_get_info: NULL argument");
    LLMI_TRY(check_struct_size("llm_model_info", info->struct_size));
    const llmi_hparams *hp = &m->hp;
    llm_model_info full = {
        .struct_size = info->struct_size,
        .architecture = hp->arch,
        .name = m->name,
        .n_params = m->n_params,
        .weight_bytes = m->weight_bytes,
        .n_layers = hp->n_layer,
        .n_embd = hp->n_embd,
        .n_heads = hp->n_head,
        .n_kv_heads = hp->n_head_kv,
        .n_ff = hp->n_ff,
        .n_vocab = hp->n_vocab,
        .n_ctx_train = hp->n_ctx_train,
        .bos = llmi_tokenizer_bos(m->tok),
        .eos = llmi_tokenizer_eos(m->tok),
        .eot = llmi_tokenizer_eot(m->tok),
        .pad = llmi_tokenizer_pad(m->tok),
        .has_chat_template = llmi_tokenizer_chat_template(m->tok) != NULL,
    };
    memcpy(info, &full, info->struct_size < sizeof full ? info->struct_size : sizeof full);
    return LLM_OK;
}

/* ---- tokenizer ---- */

LLM_API llm_status llm_tokenize(const llm_model *m, const char *text, size_t text_len,
                                uint32_t flags, llm_token *tokens, size_t capacity,
                                size_t *n_tokens) {
    CHECK_ARG(m && n_tokens, "llm_tokenize: model and n_tokens must not be NULL");
    *n_tokens = 0;
    CHECK_ARG(text || text_len == 0, "llm_tokenize: text is NULL with length %zu", text_len);
    CHECK_ARG(tokens || capacity == 0, "llm_tokenize: tokens is NULL with capacity %zu",
              capacity);
    CHECK_ARG((flags & ~(uint32_t)(LLM_TOKENIZE_ADD_SPECIAL | LLM_TOKENIZE_PARSE_SPECIAL |
                                   LLM_TOKENIZE_STRICT)) == 0,
              "llm_tokenize: unknown flags 0x%x", flags);
    return llmi_tokenize(m->tok, text ? text : "", text_len, flags, tokens, capacity, n_tokens);
}

/* Writes `len` bytes plus a NUL into buf if they fit. */
static llm_status put_text(const char *src, size_t len, char *buf, size_t cap, size_t *n) {
    *n = len;
    if (len + 1 > cap) {
        *n = len + 1; /* what the buffer must hold, NUL included */
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL, "need %zu bytes (with NUL), have %zu",
                          len + 1, cap);
    }
    memcpy(buf, src, len);
    buf[len] = '\0';
    return LLM_OK;
}

LLM_API llm_status llm_detokenize(const llm_model *m, const llm_token *tokens, size_t n_tokens,
                                  uint32_t flags, char *buf, size_t capacity, size_t *n_bytes) {
    CHECK_ARG(m && n_bytes, "llm_detokenize: model and n_bytes must not be NULL");
    *n_bytes = 0;
    CHECK_ARG(tokens || n_tokens == 0, "llm_detokenize: tokens is NULL");
    CHECK_ARG(buf || capacity == 0, "llm_detokenize: buf is NULL with capacity %zu", capacity);
    CHECK_ARG((flags & ~1u) == 0, "llm_detokenize: unknown flags 0x%x", flags);
    /* Run the streaming detokenizer into a growing scratch buffer, so both
     * paths share one definition of the text a token sequence makes. */
    llmi_detok d;
    llmi_detok_init(&d, m->tok, flags);
    size_t len = 0, cap = 256;
    char *out = llmi_malloc(cap);
    if (!out) return llmi_oom("detokenize buffer");
    llm_status st = LLM_OK;
    for (size_t i = 0; i <= n_tokens && st == LLM_OK; i++) {
        for (;;) {
            size_t got = 0;
            st = i < n_tokens ? llmi_detok_push(&d, tokens[i], out + len, cap - len, &got)
                              : llmi_detok_flush(&d, out + len, cap - len, &got);
            if (st == LLM_OK) {
                len += got;
                break;
            }
            if (st != LLM_ERR_BUFFER_TOO_SMALL) break;
            size_t want = cap * 2 > len + got + 1 ? cap * 2 : len + got + 1;
            char *bigger = llmi_realloc(out, want);
            if (!bigger) {
                st = llmi_oom("detokenize buffer");
                break;
            }
            out = bigger;
            cap = want;
        }
    }
    if (st == LLM_OK) st = put_text(out, len, buf, capacity, n_bytes);
    llmi_free(out);
    return st;
}

struct llm_detokenizer {
    llmi_detok d;
};

LLM_API llm_status llm_detokenizer_create(const llm_model *m, uint32_t flags,
                                          llm_detokenizer **out) {
    CHECK_ARG(out, "llm_detokenizer_create: out is NULL");
    *out = NULL;
    CHECK_ARG(m, "llm_detokenizer_create: model is NULL");
    CHECK_ARG((flags & ~1u) == 0, "llm_detokenizer_create: unknown flags 0x%x", flags);
    llm_detokenizer *d = llmi_calloc(1, sizeof *d);
    if (!d) return llmi_oom("detokenizer");
    llmi_detok_init(&d->d, m->tok, flags);
    *out = d;
    return LLM_OK;
}

LLM_API llm_status llm_detokenizer_push(llm_detokenizer *d, llm_token token, char *buf,
                                        size_t capacity, size_t *n_bytes) {
    CHECK_ARG(d && n_bytes, "llm_detokenizer_push: NULL argument");
    *n_bytes = 0;
    CHECK_ARG(buf || capacity == 0, "llm_detokenizer_push: buf is NULL");
    return llmi_detok_push(&d->d, token, buf, capacity, n_bytes);
}

LLM_API llm_status llm_detokenizer_flush(llm_detokenizer *d, char *buf, size_t capacity,
                                         size_t *n_bytes) {
    CHECK_ARG(d && n_bytes, "llm_detokenizer_flush: NULL argument");
    *n_bytes = 0;
    CHECK_ARG(buf || capacity == 0, "llm_detokenizer_flush: buf is NULL");
    return llmi_detok_flush(&d->d, buf, capacity, n_bytes);
}

LLM_API void llm_detokenizer_free(llm_detokenizer *d) { llmi_free(d); }

LLM_API llm_status llm_chat_template_apply(const llm_model *m, const llm_chat_message *msgs,
                                           size_t n, bool add_generation_prompt, char *buf,
                                           size_t capacity, size_t *n_bytes) {
    CHECK_ARG(m && n_bytes, "llm_chat_template_apply: model and n_bytes must not be NULL");
    *n_bytes = 0;
    CHECK_ARG(msgs || n == 0, "llm_chat_template_apply: messages is NULL");
    CHECK_ARG(buf || capacity == 0, "llm_chat_template_apply: buf is NULL");
    return llmi_chat_apply(m->tok, msgs, n, add_generation_prompt, buf, capacity, n_bytes);
}

LLM_API void llm_chat_params_init_sized(llm_chat_params *p, size_t size) {
    llm_chat_params d = {.struct_size = sizeof d, .add_generation_prompt = true};
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API llm_status llm_chat_apply(const llm_model *m, const llm_chat_params *params, char *buf,
                                  size_t capacity, size_t *n_bytes) {
    CHECK_ARG(m && params && n_bytes, "llm_chat_apply: model, params and n_bytes must not be NULL");
    *n_bytes = 0;
    CHECK_ARG(buf || capacity == 0, "llm_chat_apply: buf is NULL");
    llm_chat_params p;
    llm_chat_params_init_sized(&p, sizeof p);
    LLMI_TRY(llmi_params_copy("llm_chat_params", params, &p, sizeof p));
    return llmi_chat_apply_json(m->tok, &p, buf, capacity, n_bytes);
}

LLM_API llm_status llm_model_chat_template(const llm_model *m, const char *name,
                                           const char **text) {
    CHECK_ARG(m && text, "llm_model_chat_template: model and text must not be NULL");
    *text = llmi_tokenizer_chat_template_named(m->tok, name);
    return LLM_OK;
}

/* ---- sessions and generation ---- */

/* A failed create's message into the caller's llm_session_params buffer,
 * where its struct has one. */
static llm_status session_create_failed(const llm_session_params *in, llm_status st) {
    if (in && in->struct_size <= (1u << 16) &&
        in->struct_size >= offsetof(llm_session_params, error_capacity) + sizeof(size_t))
        llmi_error_copy_to(in->error_message, in->error_capacity);
    return st;
}

LLM_API llm_status llm_session_create(const llm_model *m, const llm_session_params *params,
                                      llm_session **out) {
    CHECK_ARG(out, "llm_session_create: out is NULL");
    *out = NULL;
    llm_status st = m ? llmi_session_create(m, params, out)
                      : llmi_error(LLM_ERR_INVALID_ARGUMENT, "llm_session_create: model is NULL");
    return st == LLM_OK ? st : session_create_failed(params, st);
}

LLM_API void llm_session_free(llm_session *s) { llmi_session_free(s); }

/* ---- devices (experimental) ---- */

LLM_API size_t llm_backend_count(void) { return llmi_backend_state_count(); }

LLM_API llm_status llm_backend_get_info(size_t index, llm_backend_info *info) {
    CHECK_ARG(info, "llm_backend_get_info: info is NULL");
    LLMI_TRY(check_struct_size("llm_backend_info", info->struct_size));
    llmi_backend_state st;
    LLMI_TRY(llmi_backend_state_get(index, &st));
    llm_backend_info full = {.struct_size = info->struct_size,
                             .name = st.name,
                             .available = st.available,
                             .n_devices = st.n_devices};
    snprintf(full.reason, sizeof full.reason, "%s", st.reason);
    memcpy(info, &full, info->struct_size < sizeof full ? info->struct_size : sizeof full);
    return LLM_OK;
}

LLM_API llm_status llm_session_create_ex(const llm_model *m, const llm_session_params *params,
                                         const llm_device_params *device, llm_session **out) {
    CHECK_ARG(out, "llm_session_create_ex: out is NULL");
    *out = NULL;
    llmi_session_device dev;
    llm_status st = m ? llmi_session_device_resolve(device, &dev)
                      : llmi_error(LLM_ERR_INVALID_ARGUMENT, "llm_session_create_ex: model is NULL");
    if (st == LLM_OK) st = llmi_session_create_on(m, params, &dev, out);
    return st == LLM_OK ? st : session_create_failed(params, st);
}

LLM_API llm_status llm_generate(llm_session *s, const llm_token *prompt, size_t n_prompt,
                                const llm_generate_params *params, llm_generate_result *result) {
    SESSION_ARG(s, s, "llm_generate: session is NULL");
    SESSION_ARG(s, prompt || n_prompt == 0, "llm_generate: prompt is NULL");
    llmi_session_begin_interruptible(s);
    return llmi_session_note(s, llmi_session_generate(s, prompt, n_prompt, params, result));
}

/* ---- request level ---- */

LLM_API llm_status llm_session_submit(llm_session *s, const llm_token *prompt, size_t n_prompt,
                                      const llm_request_params *params, llm_request_id *out_id) {
    SESSION_ARG(s, s && out_id, "llm_session_submit: session and out_id must not be NULL");
    *out_id = 0;
    SESSION_ARG(s, prompt || n_prompt == 0, "llm_session_submit: prompt is NULL");
    return llmi_session_note(s, llmi_session_submit(s, prompt, n_prompt, params, out_id));
}

LLM_API llm_status llm_session_cancel(llm_session *s, llm_request_id id) {
    SESSION_ARG(s, s, "llm_session_cancel: session is NULL");
    return llmi_session_note(s, llmi_session_cancel(s, id));
}

LLM_API llm_status llm_session_step(llm_session *s, llm_event *events, size_t capacity,
                                    size_t event_size, size_t *n_events) {
    SESSION_ARG(s, s && n_events, "llm_session_step: session and n_events must not be NULL");
    *n_events = 0;
    SESSION_ARG(s, events && capacity > 0, "llm_session_step: need an event array (capacity %zu)",
              capacity);
    SESSION_ARG(s, event_size >= offsetof(llm_event, text_len) && event_size <= (1u << 16),
              "llm_session_step: event_size %zu is invalid (pass sizeof(llm_event))",
              event_size);
    llmi_session_begin_interruptible(s);
    return llmi_session_note(s, llmi_session_step(s, events, capacity, event_size, n_events));
}

LLM_API llm_status llm_session_get_stats(llm_session *s, llm_session_stats *stats) {
    SESSION_ARG(s, s && stats, "llm_session_get_stats: NULL argument");
    llm_status st = check_struct_size("llm_session_stats", stats->struct_size);
    if (st != LLM_OK) return llmi_session_note(s, st);
    llm_session_stats full;
    memset(&full, 0, sizeof full);
    llmi_session_stats(s, &full);
    full.struct_size = stats->struct_size;
    memcpy(stats, &full, stats->struct_size < sizeof full ? stats->struct_size : sizeof full);
    return LLM_OK;
}

/* ---- token level ---- */

LLM_API llm_status llm_seq_open(llm_session *s, llm_seq_id *out) {
    SESSION_ARG(s, s && out, "llm_seq_open: NULL argument");
    *out = -1;
    return llmi_session_note(s, llmi_seq_open(s, NULL, out));
}

LLM_API llm_status llm_seq_fork(llm_session *s, llm_seq_id src, llm_seq_id *out) {
    SESSION_ARG(s, s && out, "llm_seq_fork: NULL argument");
    *out = -1;
    return llmi_session_note(s, llmi_seq_open(s, &src, out));
}

LLM_API llm_status llm_seq_close(llm_session *s, llm_seq_id seq) {
    SESSION_ARG(s, s, "llm_seq_close: session is NULL");
    return llmi_session_note(s, llmi_seq_close(s, seq));
}

LLM_API llm_status llm_seq_truncate(llm_session *s, llm_seq_id seq, uint32_t n_tokens) {
    SESSION_ARG(s, s, "llm_seq_truncate: session is NULL");
    return llmi_session_note(s, llmi_seq_truncate(s, seq, n_tokens));
}

LLM_API llm_status llm_seq_set_adapter(llm_session *s, llm_seq_id seq, const llm_adapter *adapter,
                                       float scale) {
    SESSION_ARG(s, s, "llm_seq_set_adapter: session is NULL");
    return llmi_session_note(s, llmi_seq_set_adapter(s, seq, adapter, scale));
}

LLM_API llm_status llm_seq_length(llm_session *s, llm_seq_id seq, uint32_t *n_tokens) {
    SESSION_ARG(s, s && n_tokens, "llm_seq_length: NULL argument");
    return llmi_session_note(s, llmi_seq_length(s, seq, n_tokens));
}

LLM_API llm_status llm_batch_create(uint32_t capacity, llm_batch **out) {
    CHECK_ARG(out, "llm_batch_create: out is NULL");
    return llmi_batch_create(capacity, out);
}

LLM_API void llm_batch_free(llm_batch *b) { llmi_batch_free(b); }

LLM_API void llm_batch_clear(llm_batch *b) {
    if (b) llmi_batch_clear(b);
}

LLM_API llm_status llm_batch_add(llm_batch *b, llm_seq_id seq, uint32_t pos, llm_token token,
                                 bool want_logits) {
    CHECK_ARG(b, "llm_batch_add: batch is NULL");
    return llmi_batch_add(b, seq, pos, token, want_logits);
}

LLM_API llm_status llm_session_decode(llm_session *s, const llm_batch *b) {
    SESSION_ARG(s, s && b, "llm_session_decode: NULL argument");
    llmi_session_begin_interruptible(s);
    return llmi_session_note(s, llmi_session_decode(s, b));
}

LLM_API llm_status llm_session_logits(llm_session *s, uint32_t row, const float **logits) {
    SESSION_ARG(s, s && logits, "llm_session_logits: NULL argument");
    return llmi_session_note(s, llmi_session_logits(s, row, logits));
}

/* ---- embeddings ---- */

LLM_API void llm_embed_params_init_sized(llm_embed_params *p, size_t size) {
    llm_embed_params d = {.struct_size = sizeof d, .pooling = LLM_POOLING_MODEL, .normalize = true};
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API llm_status llm_model_pooling(const llm_model *m, llm_pooling *out) {
    CHECK_ARG(m && out, "llm_model_pooling: NULL argument");
    return llmi_model_pooling(m, out);
}

LLM_API llm_status llm_session_embed(llm_session *s, const llm_token *const *inputs,
                                     const size_t *n_tokens, size_t n_inputs,
                                     const llm_embed_params *params, float *out, size_t capacity,
                                     size_t *n_floats) {
    SESSION_ARG(s, s && n_floats, "llm_session_embed: session and n_floats must not be NULL");
    *n_floats = 0;
    SESSION_ARG(s, (inputs && n_tokens) || n_inputs == 0,
                "llm_session_embed: inputs and n_tokens must not be NULL with %zu inputs",
                n_inputs);
    SESSION_ARG(s, out || capacity == 0, "llm_session_embed: out is NULL with capacity %zu",
                capacity);
    llm_embed_params p;
    llm_embed_params_init_sized(&p, sizeof p);
    llm_status st = llmi_params_copy("llm_embed_params", params, &p, sizeof p);
    if (st != LLM_OK)
        return llmi_session_note(s, st);
    llmi_session_begin_interruptible(s);
    return llmi_session_note(
        s, llmi_session_embed(s, inputs, n_tokens, n_inputs, &p, out, capacity, n_floats));
}

/* ---- standalone sampler ---- */

struct llm_sampler {
    const llm_model *model;
    llm_sampling_params params; /* validated; owns its logit_bias copy */
    uint64_t stream;
    llmi_sampler s;
    llmi_gstate *grammar; /* with params.grammar: where the drawn tokens are */
};

LLM_API llm_status llm_sampler_create(const llm_model *m, const llm_sampling_params *params,
                                      uint64_t stream, llm_sampler **out) {
    CHECK_ARG(out, "llm_sampler_create: out is NULL");
    *out = NULL;
    CHECK_ARG(m, "llm_sampler_create: model is NULL");
    llm_sampler *sm = llmi_calloc(1, sizeof *sm);
    if (!sm) return llmi_oom("sampler");
    sm->model = m;
    sm->stream = stream;
    llm_status st = llmi_sampling_params_copy(params, m->hp.n_vocab, &sm->params);
    if (st == LLM_OK) st = llmi_sampler_init(&sm->s, m->hp.n_vocab);
    if (st == LLM_OK && sm->params.grammar)
        st = llmi_gstate_create(sm->params.grammar, &sm->grammar);
    if (st != LLM_OK) {
        llm_sampler_free(sm);
        return st;
    }
    *out = sm;
    return LLM_OK;
}

LLM_API void llm_sampler_free(llm_sampler *sm) {
    if (!sm) return;
    llmi_sampler_destroy(&sm->s);
    llmi_gstate_free(sm->grammar);
    llmi_sampling_params_free(&sm->params);
    llmi_free(sm);
}

LLM_API llm_status llm_sampler_sample(llm_sampler *sm, const float *logits,
                                      const llm_token *history, size_t n_history,
                                      uint32_t n_generated, uint64_t position, llm_token *out) {
    CHECK_ARG(sm && logits && out, "llm_sampler_sample: sampler, logits and out must not be NULL");
    *out = LLM_TOKEN_NONE;
    CHECK_ARG(history || n_history == 0, "llm_sampler_sample: history is NULL with n_history %zu",
              n_history);
    uint32_t V = sm->s.n_vocab;
    for (size_t i = 0; i < n_history; i++)
        CHECK_ARG(history[i] >= 0 && (uint32_t)history[i] < V,
                  "llm_sampler_sample: history[%zu] is %d, outside the vocabulary of %u", i,
                  history[i], V);
    if (sm->grammar && sm->grammar->finished)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampler_sample: the grammar has finished; nothing more is allowed");
    sm->s.grammar = sm->grammar;
    sm->s.grammar_status = LLM_OK;
    llm_token t = llmi_sample(&sm->s, logits, &sm->params, history, n_history, n_generated,
                              sm->model->tok, sm->stream, position);
    sm->s.grammar = NULL;
    if (sm->s.grammar_status != LLM_OK) return sm->s.grammar_status;
    if (sm->grammar) LLMI_TRY(llmi_gstate_accept_token(sm->grammar, t));
    *out = t;
    return LLM_OK;
}

LLM_API llm_status llm_sampler_logprobs(llm_sampler *sm, const float *logits, uint32_t top_n,
                                        llm_token *tokens, float *logprobs, uint32_t *n_out) {
    CHECK_ARG(sm && logits && n_out,
              "llm_sampler_logprobs: sampler, logits and n_out must not be NULL");
    *n_out = 0;
    CHECK_ARG((tokens && logprobs) || top_n == 0,
              "llm_sampler_logprobs: tokens and logprobs must not be NULL with top_n %u", top_n);
    *n_out = llmi_logprobs_top(&sm->s, logits, top_n, tokens, logprobs);
    return LLM_OK;
}
