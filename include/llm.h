/**
 * @file llm.h
 * @brief libllminfer: run large language models on CPUs and GPUs.
 *
 * This is the only public header. Everything declared here is ABI: symbols
 * are versioned (LLMINFER_1), enum values are pinned, params structs only grow
 * at the end, and handles are opaque. The exception is the experimental
 * section at the end, declared only with LLM_EXPERIMENTAL, which may change
 * in a minor release (its symbols are in the node LLMINFER_1.1).
 *
 * Conventions used by every function below:
 *  - Fallible calls return ::llm_status; results go through out-params. On
 *    failure a constructor leaves `*out == NULL` and there is nothing to free.
 *  - After a failure, llm_last_error() gives the calling thread's message;
 *    llm_session_last_error() gives a session's, from any thread, and
 *    llm_model_params / llm_session_params can name a buffer that receives
 *    a failed load's or create's message.
 *  - Variable-size results are written into caller buffers. Text results are
 *    NUL-terminated; on success the reported length excludes the NUL. A
 *    buffer that is too small gives ::LLM_ERR_BUFFER_TOO_SMALL with the
 *    size the buffer must have reported: for text, the length plus one for
 *    the NUL (since 1.2; 1.0 and 1.1 reported the length without it), so
 *    allocating the reported size and calling again succeeds.
 *  - "borrows" means the library keeps no reference after the call returns;
 *    "owns" means the caller hands ownership over.
 *  - Params structs start with `struct_size`; fill them with the matching
 *    `*_params_init()` before changing fields. The library reads only the
 *    bytes that `struct_size` covers, so programs built against an older
 *    header keep working. `*_params_init(p)` is an inline function that
 *    calls `*_params_init_sized(p, sizeof *p)`: the library writes only the
 *    caller's `sizeof`. Bindings call the `_sized` functions with the size
 *    of their own struct.
 *
 * Thread safety: an ::llm_model is immutable after load and may be shared by
 * any number of threads and sessions. An ::llm_session is used by one thread
 * at a time unless a function says otherwise.
 */
#ifndef LLM_H
#define LLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/** @name Versions and symbol visibility */
/* ------------------------------------------------------------------------ */

#define LLM_VERSION_MAJOR 1
#define LLM_VERSION_MINOR 4
#define LLM_VERSION_PATCH 0
/** MAJOR * 10000 + MINOR * 100 + PATCH, e.g. 10200 for 1.2.0. The minor
 *  version grows with every release that adds to the API (a function, a
 *  field, a flag), so a program can tell what the loaded library honours. */
#define LLM_VERSION_NUMBER \
    (LLM_VERSION_MAJOR * 10000 + LLM_VERSION_MINOR * 100 + LLM_VERSION_PATCH)

/* LLM_API marks the exported functions. Only the library's own build
 * defines LLM_BUILDING_LIBRARY (the Makefile does); it exports them. A
 * program never exports them: on Windows it defines LLM_SHARED to import
 * them from the DLL (__declspec(dllimport)), and defines nothing to link
 * the static library. On ELF platforms a program needs no attribute. */
#if defined(_WIN32) || defined(__CYGWIN__)
#if defined(LLM_BUILDING_LIBRARY)
#define LLM_API __declspec(dllexport)
#elif defined(LLM_SHARED)
#define LLM_API __declspec(dllimport)
#else
#define LLM_API
#endif
#elif defined(LLM_BUILDING_LIBRARY) && defined(__GNUC__)
#define LLM_API __attribute__((visibility("default")))
#else
#define LLM_API
#endif

#if defined(__GNUC__)
#define LLM_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define LLM_DEPRECATED(msg)
#endif

/* Every params struct T has `void T_init_sized(T *p, size_t struct_size)`
 * and, for programs, `T_init(p)`: an inline function passing `sizeof *p`,
 * so the library never writes past the caller's struct whatever its
 * version. The library also exports a function T_init for programs built
 * against 1.0 and 1.1 headers; it fills only the fields every 1.x header
 * has had (docs/abi.md). */
#if defined(LLM_BUILDING_LIBRARY)
#define LLM_LEGACY_INIT(T) LLM_API void T##_init(T *params);
#else
#define LLM_LEGACY_INIT(T) \
    static inline void T##_init(T *params) { T##_init_sized(params, sizeof *params); }
#endif

/** Run-time library version, LLM_VERSION_NUMBER of the loaded library. */
LLM_API unsigned llm_version_number(void);
/** Run-time version as "MAJOR.MINOR.PATCH"; static storage. */
LLM_API const char *llm_version_string(void);

/**
 * The loaded library's `sizeof` of the public struct named `name` (its C
 * name, e.g. "llm_session_params" or "llm_event"; the experimental ones
 * too), or 0 for a name it does not know. With llm_struct_offset() a
 * binding checks at load time that the layouts it declares are the
 * library's (since 1.2). Thread-safe.
 */
LLM_API size_t llm_struct_size(const char *name);

/**
 * The loaded library's `offsetof(struct_name, field)`, or `SIZE_MAX` when it
 * knows no such struct or field (a field newer than the library, say).
 * Thread-safe (since 1.2).
 */
LLM_API size_t llm_struct_offset(const char *struct_name, const char *field);

/* ------------------------------------------------------------------------ */
/** @name Status codes and errors */
/* ------------------------------------------------------------------------ */

/** X(name, value, description): one list makes both the enum and the names. */
#define LLM_STATUS_LIST(X)                                                   \
    X(LLM_OK, 0, "success")                                                  \
    X(LLM_ERR_INVALID_ARGUMENT, 1, "invalid argument")                       \
    X(LLM_ERR_OUT_OF_MEMORY, 2, "out of memory")                             \
    X(LLM_ERR_IO, 3, "input/output error")                                   \
    X(LLM_ERR_BAD_FORMAT, 4, "malformed or corrupt file")                    \
    X(LLM_ERR_UNSUPPORTED, 5, "unsupported feature or format")               \
    X(LLM_ERR_BUFFER_TOO_SMALL, 6, "caller buffer too small")                \
    X(LLM_ERR_LIMIT, 7, "limit exceeded")                                    \
    X(LLM_ERR_INVALID_UTF8, 8, "invalid UTF-8 text")                         \
    X(LLM_ERR_NOT_FOUND, 9, "not found")                                     \
    X(LLM_ERR_CANCELLED, 10, "cancelled")                                    \
    X(LLM_ERR_BACKEND, 11, "backend failure")                                \
    X(LLM_ERR_INTERNAL, 12, "internal error")

#define LLM_STATUS_ENUM_(name, value, text) name = value,
/** Result of every fallible call. Values never change. */
typedef enum llm_status { LLM_STATUS_LIST(LLM_STATUS_ENUM_) } llm_status;
#undef LLM_STATUS_ENUM_

/** Static description of a status ("out of memory"); never NULL. */
LLM_API const char *llm_status_str(llm_status status);
/** Enumerator name of a status ("LLM_ERR_OUT_OF_MEMORY"); never NULL. */
LLM_API const char *llm_status_name(llm_status status);
/**
 * The calling thread's last detailed error message, or "" if none.
 * Lives until the next failing call on this thread. A host whose code
 * moves between threads between two calls (Go's goroutines) reads it in
 * the same native call as the failing one, or uses
 * llm_session_last_error() and the `error_message` fields of
 * ::llm_model_params and ::llm_session_params.
 */
LLM_API const char *llm_last_error(void);

/* ------------------------------------------------------------------------ */
/** @name Logging */
/* ------------------------------------------------------------------------ */

typedef enum llm_log_level {
    LLM_LOG_DEBUG = 0,
    LLM_LOG_INFO = 1,
    LLM_LOG_WARN = 2,
    LLM_LOG_ERROR = 3,
} llm_log_level;

/** Receives one message (no trailing newline); may be called from any thread. */
typedef void (*llm_log_fn)(llm_log_level level, const char *message, void *user);

/**
 * Sets the process-wide log sink and the lowest level passed to it.
 * `fn == NULL` silences the library (the default). The library never writes
 * to stdout or stderr by itself. Thread-safe: the function, `user` and the
 * level change together, so a message goes either to the old sink with the
 * old `user` or to the new one with the new `user`, never a mix; calls of
 * the sink are serialized (one at a time, from any thread). When
 * llm_log_set() returns, no call of the old sink is running or will start:
 * the old `user` may be freed then. A sink must not call llm_log_set() (the
 * call is ignored); messages the library logs while a sink runs on the same
 * thread are dropped.
 */
LLM_API void llm_log_set(llm_log_fn fn, llm_log_level min_level, void *user);

/* ------------------------------------------------------------------------ */
/** @name Models */
/* ------------------------------------------------------------------------ */

/** Token id in a model's vocabulary. */
typedef int32_t llm_token;
/** Token constants. */
typedef enum llm_token_constant {
    /** "No such token", e.g. a model without a BOS token. (An enumerator
     *  since 1.2; before, a macro with the same value.) */
    LLM_TOKEN_NONE = -1,
} llm_token_constant;

/** Weights, hyper-parameters and tokenizer; immutable, thread-safe. */
typedef struct llm_model llm_model;

/** What a progress callback is told about (since 1.3). Values are pinned. */
typedef enum llm_progress_phase {
    /** llm_model_load(): bytes of the model file read, or mapped (a
     *  mapping is reported at once, pages are read when first used). */
    LLM_PROGRESS_READ = 0,
    /** llm_session_create(): bytes of weights placed on the backend. */
    LLM_PROGRESS_UPLOAD = 1,
    /** llm_session_create(): the KV store and the step's buffers set up,
     *  in steps of 1 (the total is their count). */
    LLM_PROGRESS_WARMUP = 2
} llm_progress_phase;

/**
 * Progress of a model load or a session creation (since 1.3): `done` of
 * `total` units of `phase` (bytes, unless the phase says otherwise). Within
 * one phase `done` never decreases and the last call of a phase that
 * completes has `done == total`. Called on the thread of the call that
 * loads; it must not call into the library on the object being built.
 * Returning false cancels the load: the call then frees what it built and
 * returns ::LLM_ERR_CANCELLED.
 */
typedef bool (*llm_progress_fn)(llm_progress_phase phase, uint64_t done, uint64_t total,
                                void *user);

/** "read", "upload" or "warm-up"; "unknown" for other values. Static text.
 *  Since 1.3. */
LLM_API const char *llm_progress_phase_name(llm_progress_phase phase);

typedef struct llm_model_params {
    uint32_t struct_size; /**< sizeof(llm_model_params), set by init */
    /** Map the file instead of reading it into memory (default true).
     *  On x86-64 CPUs with AVX-512 VNNI, the CPU backend keeps its own
     *  interleaved copy of the model's Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0
     *  matrices, made when the model's first CPU session starts
     *  (docs/bench.md, "Packed weights"): a mapped file's pages of those matrices are then given
     *  back to the page cache, while a model read into memory keeps both
     *  (about twice the memory). LLM_CPU_PACK=0 in the environment turns
     *  the copy off. */
    bool use_mmap;
    /** Since 1.2: when not NULL, a failed llm_model_load() also copies its
     *  message here (NUL-terminated, cut to `error_capacity` bytes), so the
     *  caller gets it whatever thread it reads on. Borrowed for the call
     *  (default NULL, 0). */
    char *error_message;
    size_t error_capacity;
    /** Since 1.3: called with ::LLM_PROGRESS_READ while the file is read
     *  (default NULL: none); `progress_user` is passed to it. */
    llm_progress_fn progress;
    void *progress_user;
} llm_model_params;

/**
 * Fills the defaults into the first `struct_size` bytes of `params` (at
 * most the library's own size) and sets `params->struct_size` to what it
 * filled; writes nothing past them. NULL is a no-op. Since 1.2.
 */
LLM_API void llm_model_params_init_sized(llm_model_params *params, size_t struct_size);
LLM_LEGACY_INIT(llm_model_params)

/**
 * Loads a GGUF model, or a Hugging Face checkpoint folder (a directory
 * holding config.json, model.safetensors or shards listed by
 * model.safetensors.index.json, and tokenizer.json), read as the GGUF file
 * llama.cpp's converter would make of it (docs/models.md). `params` may be
 * NULL for defaults.
 * Every offset, size and count of the file is checked before use; a malformed
 * file gives ::LLM_ERR_BAD_FORMAT, an unsupported one ::LLM_ERR_UNSUPPORTED,
 * a file that cannot be read ::LLM_ERR_IO, and one that cannot be mapped or
 * read into memory for lack of memory or address space
 * ::LLM_ERR_OUT_OF_MEMORY.
 * On success the caller owns `*out` and frees it with llm_model_free().
 */
LLM_API llm_status llm_model_load(const char *path, const llm_model_params *params,
                                  llm_model **out);

/** Frees a model; NULL is a no-op. Every session using it must be freed first. */
LLM_API void llm_model_free(llm_model *model);

/** Facts about a loaded model. Strings are borrowed from the model. */
typedef struct llm_model_info {
    uint32_t struct_size;     /**< set by the caller to sizeof(llm_model_info) */
    const char *architecture; /**< "llama", ... */
    const char *name;         /**< general.name, or "" */
    uint64_t n_params;        /**< number of weights */
    uint64_t weight_bytes;    /**< bytes of weight data */
    uint32_t n_layers;
    uint32_t n_embd;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t n_ff;
    uint32_t n_vocab;
    uint32_t n_ctx_train; /**< context length the model was trained for */
    llm_token bos;        /**< LLM_TOKEN_NONE when absent */
    llm_token eos;
    llm_token eot; /**< end of turn (chat), or LLM_TOKEN_NONE */
    llm_token pad;
    bool has_chat_template;
} llm_model_info;

/**
 * Fills `info` up to `info->struct_size` bytes, which the caller sets first:
 * `llm_model_info info = {sizeof info};`.
 */
LLM_API llm_status llm_model_get_info(const llm_model *model, llm_model_info *info);

/* ------------------------------------------------------------------------ */
/** @name Tokenizer (thread-safe: reads the immutable model only) */
/* ------------------------------------------------------------------------ */

/** Flags of llm_tokenize(), OR-ed into its `flags`. */
typedef enum llm_tokenize_flag {
    /** Add the BOS and EOS tokens where the model asks for them (its
     *  add_bos_token / add_eos_token metadata; SmolLM2 asks for neither,
     *  Llama 3 for BOS only). */
    LLM_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /** Turn special-token text such as "<|im_start|>" into its token. */
    LLM_TOKENIZE_PARSE_SPECIAL = 1u << 1,
    /** Refuse text with a byte the vocabulary has no token for, instead of
     *  dropping it (since 1.1; a 1.0 library refuses the flag itself as
     *  unknown, with ::LLM_ERR_INVALID_ARGUMENT). */
    LLM_TOKENIZE_STRICT = 1u << 2,
} llm_tokenize_flag;

/**
 * Turns UTF-8 text (`text_len` bytes, need not be NUL-terminated) into tokens.
 * Invalid UTF-8 gives ::LLM_ERR_INVALID_UTF8 naming the byte offset. When
 * `capacity` is too small: ::LLM_ERR_BUFFER_TOO_SMALL, `*n_tokens` = needed.
 *
 * A byte for which the vocabulary has no token (for a byte-level BPE
 * vocabulary: no token for the byte's character, e.g. 0x04 or the lead
 * byte 0xf1 in SmolLM2's) is dropped by default, as llama.cpp does; a
 * SentencePiece vocabulary without byte tokens turns it into its unknown
 * token where it has one. With ::LLM_TOKENIZE_STRICT such text gives
 * ::LLM_ERR_INVALID_ARGUMENT naming the byte and its offset, and
 * `*n_tokens` = 0. Other flag bits give ::LLM_ERR_INVALID_ARGUMENT.
 */
LLM_API llm_status llm_tokenize(const llm_model *model, const char *text, size_t text_len,
                                uint32_t flags, llm_token *tokens, size_t capacity,
                                size_t *n_tokens);

/** Flags of llm_detokenize() and llm_detokenizer_create(). */
typedef enum llm_detokenize_flag {
    /** Render control tokens ("<|im_end|>") as text instead of skipping them. */
    LLM_DETOKENIZE_SPECIAL = 1u << 0,
} llm_detokenize_flag;

/**
 * Turns tokens back into UTF-8 text in `buf` (NUL-terminated). Byte sequences
 * that are not valid UTF-8 become U+FFFD. `*n_bytes` = the text's length;
 * when `capacity` is too small, ::LLM_ERR_BUFFER_TOO_SMALL and `*n_bytes` =
 * the capacity needed, NUL included (`buf` may be NULL with capacity 0).
 */
LLM_API llm_status llm_detokenize(const llm_model *model, const llm_token *tokens,
                                  size_t n_tokens, uint32_t flags, char *buf,
                                  size_t capacity, size_t *n_bytes);

/**
 * Streaming detokenizer: push tokens one at a time and get back only whole
 * UTF-8 characters; bytes of a character split across tokens are held back
 * until it is complete. One per stream; not thread-safe.
 */
typedef struct llm_detokenizer llm_detokenizer;

/** Borrows `model`, which must outlive the detokenizer. */
LLM_API llm_status llm_detokenizer_create(const llm_model *model, uint32_t flags,
                                          llm_detokenizer **out);
/**
 * Adds one token; writes the newly completed text to `buf` (NUL-terminated,
 * possibly empty). On ::LLM_ERR_BUFFER_TOO_SMALL the token is not consumed
 * and `*n_bytes` = the capacity needed, NUL included.
 */
LLM_API llm_status llm_detokenizer_push(llm_detokenizer *detok, llm_token token, char *buf,
                                        size_t capacity, size_t *n_bytes);
/** Writes what is held back (incomplete characters become U+FFFD) and resets;
 *  a too small buffer as for llm_detokenizer_push() (nothing is reset). */
LLM_API llm_status llm_detokenizer_flush(llm_detokenizer *detok, char *buf, size_t capacity,
                                         size_t *n_bytes);
/** NULL is a no-op. */
LLM_API void llm_detokenizer_free(llm_detokenizer *detok);

/** One chat message; both strings are borrowed UTF-8. */
typedef struct llm_chat_message {
    const char *role; /**< "system", "user", "assistant" */
    const char *content;
} llm_chat_message;

/**
 * Renders messages with the model's chat template (tokenizer.chat_template):
 * the template runs in the library's Jinja interpreter exactly as
 * transformers renders it (the subset is listed in docs/chat-templates.md),
 * with `messages` ({role, content} each), `add_generation_prompt`,
 * `bos_token` and `eos_token` (the tokens' text) and `tools` and
 * `documents` as None. With `add_generation_prompt` the text ends where the
 * assistant's reply starts. A template that is a built-in family's name
 * ("chatml", "llama3") uses that family. A model without a template gives
 * ::LLM_ERR_UNSUPPORTED; a template with a syntax error, or one that
 * refuses the conversation (raise_exception: roles that do not alternate,
 * say), gives ::LLM_ERR_INVALID_ARGUMENT with the reason (line:column where
 * it applies); one that runs past the interpreter's limits (loops, nesting,
 * output size) gives ::LLM_ERR_LIMIT. A too small buffer gives
 * ::LLM_ERR_BUFFER_TOO_SMALL and `*n_bytes` = the capacity needed, NUL
 * included. For tools, multi-part content, tool calls and extra variables
 * use llm_chat_apply(). Thread-safe for a shared model.
 */
LLM_API llm_status llm_chat_template_apply(const llm_model *model,
                                           const llm_chat_message *messages,
                                           size_t n_messages, bool add_generation_prompt,
                                           char *buf, size_t capacity, size_t *n_bytes);

/**
 * What llm_chat_apply() renders: OpenAI-shaped JSON, as servers receive it.
 * Every string is borrowed UTF-8 for the duration of the call; NULL means
 * "not given". Since 1.3.
 */
typedef struct llm_chat_params {
    uint32_t struct_size; /**< set by llm_chat_params_init() */
    /** Required: a JSON array of messages, each an object with a string
     *  "role" and whatever else the template reads: "content" (a string, or
     *  a list of parts such as {"type": "text", "text": ...}), "tool_calls",
     *  "tool_call_id", "name", "reasoning_content", ... */
    const char *messages_json;
    /** A JSON array of tool definitions ({"type": "function", "function":
     *  {"name", "description", "parameters"}}) for `tools`; NULL: None. */
    const char *tools_json;
    /** A JSON array of documents for retrieval templates; NULL: None. */
    const char *documents_json;
    /** A JSON object of further variables (e.g. {"enable_thinking": false});
     *  they may override bos_token/eos_token but not messages, tools,
     *  documents or add_generation_prompt. */
    const char *variables_json;
    /** Jinja template text to run instead of the model's own; NULL: the
     *  model's template (see template_name). */
    const char *template_text;
    /** Which of the model's templates to run when template_text is NULL: a
     *  named one (tokenizer.chat_template.NAME, e.g. "tool_use"; an
     *  unknown name gives ::LLM_ERR_NOT_FOUND), or NULL: as transformers
     *  chooses, "tool_use" when tools are given and the model has it, else
     *  the default template. */
    const char *template_name;
    /** End the text where the assistant's reply starts. Default true. */
    bool add_generation_prompt;
    /** End the text right after the last message's content (its last text
     *  part, stripped), so the model continues that message (a prefilled
     *  assistant reply), as transformers' continue_final_message; needs
     *  add_generation_prompt false. Default false. */
    bool continue_final_message;
} llm_chat_params;

/** Fills defaults (everything NULL, add_generation_prompt true,
 *  continue_final_message false) into the
 *  first `struct_size` bytes of `params`; NULL is a no-op. Since 1.3. */
LLM_API void llm_chat_params_init_sized(llm_chat_params *params, size_t struct_size);
/** llm_chat_params_init_sized(params, sizeof *params). */
static inline void llm_chat_params_init(llm_chat_params *params) {
    llm_chat_params_init_sized(params, sizeof *params);
}

/**
 * Renders a conversation with the model's chat template (or
 * `params->template_text`) in the library's Jinja interpreter, with the
 * variables transformers' apply_chat_template passes: `messages`, `tools`,
 * `documents`, `add_generation_prompt`, `bos_token`, `eos_token` (the
 * vocabulary's text for them), then the members of `variables_json`. JSON
 * numbers with no fraction become integers. Errors: malformed JSON, a
 * message without a string role, a template syntax error (line:column) or
 * a template that raises (raise_exception's message) give
 * ::LLM_ERR_INVALID_ARGUMENT; invalid UTF-8 ::LLM_ERR_INVALID_UTF8; no
 * template at all ::LLM_ERR_UNSUPPORTED; a template past the interpreter's
 * limits ::LLM_ERR_LIMIT; a too small buffer ::LLM_ERR_BUFFER_TOO_SMALL with
 * `*n_bytes` = the capacity needed, NUL included (NULL/0 asks for the
 * size). strftime_now() reads the local time. A template that is only a
 * built-in family's name ("chatml", "llama3") renders plain string
 * messages with that family. Thread-safe for a shared model. Since 1.3.
 */
LLM_API llm_status llm_chat_apply(const llm_model *model, const llm_chat_params *params, char *buf,
                                  size_t capacity, size_t *n_bytes);

/**
 * The text of the model's chat template named `name` (NULL or "default":
 * tokenizer.chat_template, or a Hugging Face folder's chat_template; else
 * tokenizer.chat_template.NAME, such as "tool_use"), or NULL when it has
 * none of that name. `*text` is borrowed: it lives as long as the model.
 * Thread-safe. Since 1.3.
 */
LLM_API llm_status llm_model_chat_template(const llm_model *model, const char *name,
                                           const char **text);

/* ------------------------------------------------------------------------ */
/** @name LoRA adapters (since 1.4)
 *
 * A low-rank adapter changes a model's projections without a copy of its
 * weights: each projection W it targets gets y = W x + s * B (A x), with
 * the effective scale s = scale * alpha / rank (scale chosen per request,
 * alpha and rank from the adapter). Many adapters load for one model; each
 * request names its own (llm_request_params::adapter), and one step serves
 * requests of different adapters and of none together (docs/lora.md). */
/* ------------------------------------------------------------------------ */

/** A loaded adapter: immutable, thread-safe to share across sessions and
 *  requests. Borrows its model, which must outlive it. Since 1.4. */
typedef struct llm_adapter llm_adapter;

/** Adapter load options. Initialise with llm_adapter_params_init(). Since 1.4. */
typedef struct llm_adapter_params {
    uint32_t struct_size; /**< sizeof(llm_adapter_params), set by init */
    /** Map a GGUF file instead of reading it (default true); the weights
     *  are converted to F32 copies either way and the file is closed
     *  before llm_adapter_load() returns. */
    bool use_mmap;
} llm_adapter_params;

/** Fills the defaults, as llm_model_params_init_sized() does. Since 1.4. */
LLM_API void llm_adapter_params_init_sized(llm_adapter_params *params, size_t struct_size);
/** llm_adapter_params_init_sized() with the caller's sizeof. Since 1.4. */
static inline void llm_adapter_params_init(llm_adapter_params *params) {
    llm_adapter_params_init_sized(params, sizeof *params);
}

/**
 * Loads a LoRA adapter for `model` from `path`: a GGUF file in llama.cpp's
 * adapter layout (general.type "adapter", adapter.type "lora",
 * adapter.lora.alpha, tensors "<weight>.lora_a" / ".lora_b"), or a Hugging
 * Face PEFT folder (adapter_config.json and adapter_model.safetensors).
 * Targets: the attention (q, k, v, output) and dense FFN (gate, up, down)
 * projections of any layer. Weights in F32, F16 or BF16, kept as F32.
 * `params` may be NULL for defaults. Errors: ::LLM_ERR_IO (unreadable),
 * ::LLM_ERR_BAD_FORMAT (not an adapter, a matrix without its other half,
 * a shape that disagrees with the base weight or its partner, rank 0, a
 * value that is not finite), ::LLM_ERR_UNSUPPORTED (an adapter for another
 * architecture, a tensor targeting another weight, a PEFT option beyond a
 * plain LoRA such as DoRA or rank patterns); the message names the tensor
 * or field. On failure `*out` is NULL. Thread-safe. Since 1.4.
 */
LLM_API llm_status llm_adapter_load(const llm_model *model, const char *path,
                                    const llm_adapter_params *params, llm_adapter **out);

/** Frees an adapter; NULL is a no-op. No request or session may still use
 *  it (cancel or finish its requests first). Since 1.4. */
LLM_API void llm_adapter_free(llm_adapter *adapter);

/* ------------------------------------------------------------------------ */
/** @name Sessions */
/* ------------------------------------------------------------------------ */

/** A runtime for one model on one device set: KV memory, threads, requests. */
typedef struct llm_session llm_session;

/** Element type of the cached keys and values (llm_session_params.kv_type).
 *  Values are pinned; later releases only append. */
typedef enum llm_kv_type {
    LLM_KV_F32 = 0,
    LLM_KV_F16 = 1,
    LLM_KV_BF16 = 2,
    /** Since 1.4: per head and token, blocks of 32 values as GGUF's Q8_0
     *  (an f16 scale and 32 int8): 34 bytes per 32 values. */
    LLM_KV_Q8_0 = 3,
    /** Since 1.4: per head and token, blocks of 32 values as GGUF's Q4_0
     *  (an f16 scale and 32 4-bit values): 18 bytes per 32 values. */
    LLM_KV_Q4_0 = 4,
    /** Since 1.5: per head and token, blocks of 32 values as OCP FP8 E4M3
     *  (the "fn" variant: no infinities, largest 448) with one f32 scale,
     *  amax / 448 of the block: 36 bytes per 32 values. Rounded to nearest
     *  even, saturating at +-448. */
    LLM_KV_FP8_E4M3 = 5,
} llm_kv_type;

typedef struct llm_session_params {
    uint32_t struct_size;
    uint32_t n_threads;      /**< 0 = one per online CPU */
    uint32_t n_ctx;          /**< max tokens per sequence; 0 = model's n_ctx_train */
    uint32_t max_batch_tokens; /**< tokens computed per forward pass (default 512) */
    /** KV memory; 0 = a quarter of available memory, at most 2 GiB, at
     *  least one full context. Pages are reserved, and only touched as
     *  blocks fill. A pool larger than the memory this process can ever
     *  have, the machine's physical memory or its container's lower cgroup
     *  limit (memory.max), could never be backed: llm_session_create()
     *  refuses it with ::LLM_ERR_OUT_OF_MEMORY. A pool of more than
     *  2^32 token slots (blocks times kv_block_size) is refused with
     *  ::LLM_ERR_LIMIT first. A pool within those limits still competes
     *  with everything else for memory. */
    uint64_t kv_cache_bytes;
    /** Element type of the cached K and V (default ::LLM_KV_F32).
     *  ::LLM_KV_F16 and ::LLM_KV_BF16 take half the bytes per token, so
     *  the same kv_cache_bytes holds twice the tokens. Both work on every
     *  CPU: F16C/AVX2 or AVX-512 kernels where the CPU has them, portable C
     *  elsewhere. K/V rows are rounded to nearest even when written
     *  (relative error 2^-11 for F16, 2^-8 for BF16; F16 overflows past
     *  65504, BF16 has F32's range), so logits differ slightly from F32 KV
     *  and greedy output may diverge after a while; within one type outputs
     *  stay independent of batching and threads.
     *  Since 1.4, ::LLM_KV_Q8_0 and ::LLM_KV_Q4_0 store each head's row in
     *  blocks of 32 with one f16 scale (3.8x and 7.1x fewer bytes than
     *  F32): a row is quantized once, when its token is computed, and
     *  attention reads the blocks directly. Q8_0 costs little quality
     *  (docs/bench.md gives measured perplexities), Q4_0 noticeably more.
     *  They need a head_dim that is a multiple of 32; other models give
     *  ::LLM_ERR_UNSUPPORTED with a message. The CPU backend (also with
     *  tensor parallelism) implements them; a backend that does not refuses
     *  them at session creation with ::LLM_ERR_UNSUPPORTED (the CUDA
     *  plug-in: Q4_0 always, Q8_0 before 1.5 and with tensor parallelism).
     *  Since 1.5, ::LLM_KV_FP8_E4M3 stores 8-bit floats with one f32 scale
     *  per block of 32 (3.6x fewer bytes than F32; slightly more than
     *  Q8_0's, for a float code's wider range); the same head_dim rule
     *  applies; it costs more quality than Q8_0 (docs/bench.md). The CPU
     *  backend (with tensor parallelism) and the CUDA plug-in (one GPU)
     *  implement it, and write the same bits for the same row. A value
     *  outside the enum gives ::LLM_ERR_INVALID_ARGUMENT. */
    llm_kv_type kv_type;
    uint32_t kv_block_size;  /**< tokens per KV block; 0 = 16 */
    bool prefix_cache;       /**< share KV of common prompt prefixes (default true) */
    /** Draft model for ::LLM_SPEC_DRAFT (default NULL). Borrowed: it must
     *  outlive the session. Its vocabulary must be the target's (same
     *  n_vocab, special tokens and token texts at both ends), else
     *  llm_session_create() gives ::LLM_ERR_INVALID_ARGUMENT. It runs in
     *  its own KV memory, as many tokens as the session's, of kv_type. */
    const llm_model *draft_model;
    /** Since 1.2: when not NULL, a failed llm_session_create() (or
     *  llm_session_create_ex()) also copies its message here
     *  (NUL-terminated, cut to `error_capacity` bytes). Borrowed for the
     *  call (default NULL, 0). */
    char *error_message;
    size_t error_capacity;
    /** Since 1.3: called with ::LLM_PROGRESS_UPLOAD and then
     *  ::LLM_PROGRESS_WARMUP while the session is created (default NULL:
     *  none); `progress_user` is passed to it. A draft model's setup is
     *  not reported. */
    llm_progress_fn progress;
    void *progress_user;
} llm_session_params;

/** As llm_model_params_init_sized(), for ::llm_session_params. Since 1.2. */
LLM_API void llm_session_params_init_sized(llm_session_params *params, size_t struct_size);
LLM_LEGACY_INIT(llm_session_params)

/**
 * Creates a session. Borrows `model`, which must outlive the session.
 * `params` may be NULL for defaults. Caller frees `*out` with llm_session_free().
 */
LLM_API llm_status llm_session_create(const llm_model *model, const llm_session_params *params,
                                      llm_session **out);
/** NULL is a no-op. */
LLM_API void llm_session_free(llm_session *session);

/**
 * The last failure of any call on `session` (from any thread), and its
 * message copied into `buf` (NUL-terminated; `capacity` bytes; may be NULL
 * with capacity 0): `*status` = its status, ::LLM_OK with "" when no call
 * has failed yet. The message is cut to fit, and `*n_bytes` (may be NULL)
 * = the capacity the whole message needs, NUL included. Failures stay
 * until the next failure; a success does not clear them. Calls on the
 * session from several threads at once overwrite each other's; a host
 * that needs each call's own message reads llm_last_error() on the
 * failing thread. Thread-safe; since 1.2.
 */
LLM_API llm_status llm_session_last_error(llm_session *session, llm_status *status, char *buf,
                                          size_t capacity, size_t *n_bytes);

/**
 * Asks the llm_generate(), llm_session_step() or llm_session_decode() now
 * running on `session` to stop: it returns ::LLM_ERR_CANCELLED soon, at the
 * latest after the forward-pass layer it is computing. Nothing is lost:
 * the interrupted step changes no request and may be repeated (the
 * requests go on with their exact tokens), an interrupted decode applies
 * no row, and an interrupted llm_generate() removes its request and
 * reports ::LLM_FINISH_CANCELLED in its result. When none of them runs it
 * has no effect (each of them starts by clearing the request). Callable
 * from any thread, and from a signal handler (it only stores to an
 * atomic flag). NULL is a no-op. Since 1.2.
 */
LLM_API void llm_session_interrupt(llm_session *session);

/* ------------------------------------------------------------------------ */
/** @name Sampling parameters */
/* ------------------------------------------------------------------------ */

/** Adds `bias` to one token's logit; -INFINITY bans the token. */
typedef struct llm_logit_bias {
    llm_token token;
    float bias;
} llm_logit_bias;

/* ------------------------------------------------------------------------ */
/** @name Grammars (structured output)
 *
 * A grammar constrains generation to the strings it accepts: a JSON Schema,
 * an EBNF grammar in llama.cpp's GBNF notation, or a regular expression
 * (docs/structured-output.md). It is compiled once for a model's
 * vocabulary (compiling precomputes, for every place the grammar can be
 * in, which tokens that place alone decides: milliseconds to a few hundred
 * for large grammars on large vocabularies, so that masks then take
 * microseconds) and then shared, read-only, by any number of requests,
 * samplers and grammar states, on any threads. A request or sampler whose
 * ::llm_sampling_params name a grammar sees only the tokens the grammar
 * allows next; end-of-generation tokens only where it may end; a request
 * ends with ::LLM_FINISH_STOP when the grammar can go no further.
 *
 * Token-level use: a ::llm_grammar_state follows one sequence. It accepts
 * tokens, fills a bitset of the allowed ones, forks, and rolls back the
 * last tokens (up to 64), for hosts that drive decoding themselves.
 * A state is used by one thread at a time; different states may be used
 * concurrently. Since 1.3. */
/* ------------------------------------------------------------------------ */

typedef struct llm_grammar llm_grammar;
typedef struct llm_grammar_state llm_grammar_state;

/** Whitespace between the tokens of JSON generated from a schema. Values
 *  never change. */
typedef enum llm_grammar_whitespace {
    LLM_GRAMMAR_WS_COMPACT = 0,  /**< none: `{"a":1,"b":[true]}` */
    LLM_GRAMMAR_WS_FLEXIBLE = 1, /**< optional: one space, or a newline and up to 20
                                      spaces or tabs, between tokens */
} llm_grammar_whitespace;

/** Compile options. Initialise with llm_grammar_params_init(). Since 1.3. */
typedef struct llm_grammar_params {
    uint32_t struct_size;
    /** ::llm_grammar_whitespace, for JSON Schemas (default compact). */
    uint32_t whitespace;
    /** EBNF: the start rule (borrowed for the call; NULL = "root"). */
    const char *root;
} llm_grammar_params;

/** As llm_model_params_init_sized(), for ::llm_grammar_params. Since 1.3. */
LLM_API void llm_grammar_params_init_sized(llm_grammar_params *params, size_t struct_size);
#if defined(LLM_BUILDING_LIBRARY)
LLM_API void llm_grammar_params_init(llm_grammar_params *params);
#else
/** Fills `params` with the defaults. */
static inline void llm_grammar_params_init(llm_grammar_params *params) {
    llm_grammar_params_init_sized(params, sizeof *params);
}
#endif

/**
 * Compiles a JSON Schema (`schema`, `len` bytes of JSON text, borrowed for
 * the call) for `model`'s vocabulary. Supported: type (also a list),
 * properties, required, additionalProperties (false/true, or a schema
 * without properties: a map), items, minItems, maxItems, enum, const,
 * anyOf, allOf of one schema, local $ref (recursion included, "#" and
 * "#/$defs/..."), minLength, maxLength, pattern, format (date, date-time,
 * time, uuid, email); annotations (title, description, default, ...) are
 * ignored. `{}` or `{"type":"object"}` accept any JSON value / object.
 * Anything else gives ::LLM_ERR_UNSUPPORTED naming the keyword and its
 * JSON pointer; malformed JSON or schemas ::LLM_ERR_INVALID_ARGUMENT.
 * Borrows `model` for the call only. `params` may be NULL. Caller frees
 * `*out` with llm_grammar_free(). Thread-safe.
 */
LLM_API llm_status llm_grammar_compile_json_schema(const llm_model *model, const char *schema,
                                                   size_t len, const llm_grammar_params *params,
                                                   llm_grammar **out);
/**
 * Compiles an EBNF grammar in GBNF notation (`name ::= ...` rules;
 * alternation, sequences, groups, the repetitions star, plus, question
 * mark and braces {m,n}, string literals with escapes, character classes
 * with ranges and negation, the dot for any character). Errors give
 * the line:column. Left-recursive rules are refused
 * (::LLM_ERR_UNSUPPORTED). As llm_grammar_compile_json_schema() otherwise.
 */
LLM_API llm_status llm_grammar_compile_ebnf(const llm_model *model, const char *text,
                                            size_t len, const llm_grammar_params *params,
                                            llm_grammar **out);
/**
 * Compiles a regular expression that the whole output must match:
 * literals, escapes, classes, the digit, word and space classes written
 * with a backslash and d, w, s (and their negations), the dot (not a
 * newline), groups, alternation, quantifiers; anchors at the two ends are
 * accepted. Backreferences and lookaround give ::LLM_ERR_UNSUPPORTED with
 * the offset. As llm_grammar_compile_json_schema() otherwise.
 */
LLM_API llm_status llm_grammar_compile_regex(const llm_model *model, const char *regex,
                                             size_t len, const llm_grammar_params *params,
                                             llm_grammar **out);
/**
 * Writes the GBNF text that llm_grammar_compile_json_schema() compiles for
 * `schema` (`len` bytes of JSON, borrowed for the call; `params` may be
 * NULL: its whitespace applies): rules named `root` (the start) and others
 * named by the compiler, none containing the characters "call". A host
 * appends its own rules around the schema's (say, a wrapper that starts
 * with fixed text and refers to `root`) and compiles the whole with
 * llm_grammar_compile_ebnf() and ::llm_grammar_params.root set to its rule.
 * Needs no model. Errors as llm_grammar_compile_json_schema(); a too small
 * buffer gives ::LLM_ERR_BUFFER_TOO_SMALL with `*n_bytes` = the capacity
 * needed, NUL included (NULL/0 asks for the size). Thread-safe. Since 1.4.
 */
LLM_API llm_status llm_grammar_schema_to_ebnf(const char *schema, size_t len,
                                              const llm_grammar_params *params, char *buf,
                                              size_t capacity, size_t *n_bytes);
/** Frees a grammar; it must outlive every state, sampler and request that
 *  uses it. NULL is a no-op. */
LLM_API void llm_grammar_free(llm_grammar *grammar);

/** A state at the start of `grammar` (borrowed; must outlive the state).
 *  Caller frees `*out` with llm_grammar_state_free(). */
LLM_API llm_status llm_grammar_state_create(const llm_grammar *grammar,
                                            llm_grammar_state **out);
/** An independent copy of `state` (its rollback history included), e.g.
 *  for a forked sequence. Caller frees `*out`. */
LLM_API llm_status llm_grammar_state_fork(const llm_grammar_state *state,
                                          llm_grammar_state **out);
/** NULL is a no-op. */
LLM_API void llm_grammar_state_free(llm_grammar_state *state);
/**
 * Advances by one token (its bytes; a token may end inside a UTF-8
 * character and the next complete it). An end-of-generation token is
 * accepted where the grammar may end, and finishes it. A token the grammar
 * does not allow gives ::LLM_ERR_INVALID_ARGUMENT and leaves the state
 * unchanged.
 */
LLM_API llm_status llm_grammar_state_accept_token(llm_grammar_state *state, llm_token token);
/**
 * Writes the allowed next tokens as a bitset: bit (t % 32) of
 * `mask[t / 32]` for token t; `n_words` must be at least ceil(n_vocab /
 * 32) (else ::LLM_ERR_BUFFER_TOO_SMALL); every word up to that is written.
 */
LLM_API llm_status llm_grammar_state_fill_mask(llm_grammar_state *state, uint32_t *mask,
                                               size_t n_words);
/** Whether the grammar may end here (`*out`). */
LLM_API llm_status llm_grammar_state_can_end(const llm_grammar_state *state, bool *out);
/** Whether the grammar can go no further (`*out`): it may end and no
 *  token continues it, or an end-of-generation token was accepted. */
LLM_API llm_status llm_grammar_state_is_complete(const llm_grammar_state *state, bool *out);
/** Undoes the last `n_tokens` accepted tokens (speculative decoding); at
 *  most the 64 most recent, else ::LLM_ERR_INVALID_ARGUMENT. */
LLM_API llm_status llm_grammar_state_rollback(llm_grammar_state *state, uint32_t n_tokens);

/**
 * How the next token is chosen from a row of logits. The steps, in order:
 *
 *  0. grammar: with `grammar` set, tokens it does not allow next are
 *     banned before anything else, so the distribution drawn from is the
 *     model's renormalised over the allowed tokens;
 *  1. logit bias: `logit[t] += bias` for every entry of `logit_bias`
 *     (entries naming the same token add up; -INFINITY bans it);
 *  2. penalties over the window = the last `repeat_last_n` tokens of the
 *     history (prompt, then generated tokens; -1 = all of it, 0 = no
 *     penalties at all). For each token t seen c > 0 times in the window:
 *     repetition (llama.cpp): `logit /= repeat_penalty` if logit > 0, else
 *     `logit *= repeat_penalty`; then presence and frequency (OpenAI):
 *     `logit -= presence_penalty + frequency_penalty * c`;
 *  3. min_tokens: while fewer than `min_tokens` tokens were generated, every
 *     end-of-generation token (EOS, end of turn) is banned;
 *  4. greedy (`temperature == 0` or `top_k == 1`): the largest logit wins
 *     (lowest id on ties) and the remaining steps are skipped;
 *  5. top-k: keep the `top_k` largest logits;
 *  6. temperature: divide the logits by `temperature`;
 *  7. softmax over the tokens left;
 *  8. top-p: keep the smallest set of most likely tokens whose probability
 *     reaches `top_p`;
 *  9. min-p: drop tokens less likely than `min_p` times the most likely;
 *  10. renormalise and draw with a uniform number u in [0, 1) derived from
 *     (seed, stream, position) only: a seeded sequence gets the same tokens
 *     whatever else is batched with it and however many threads run.
 *
 * Banned tokens (logit -INFINITY after steps 1-3) are never chosen. The
 * min_tokens ban is lifted where it would leave no token at all; if every
 * token still ends up banned (a model that produced no finite logit) the
 * largest raw logit wins. Validation (LLM_ERR_INVALID_ARGUMENT, naming the
 * field): temperature finite and >= 0, top_k >= 0, top_p in (0, 1],
 * min_p in [0, 1], repeat_penalty finite and > 0, repeat_last_n >= -1,
 * presence/frequency penalties finite, every bias finite or -INFINITY and
 * its token inside the vocabulary, and not every token banned.
 */
typedef struct llm_sampling_params {
    uint32_t struct_size;
    float temperature; /**< 0 = greedy (default 0.8) */
    int32_t top_k;     /**< 0 = off (default 40) */
    float top_p;       /**< 1 = off (default 0.95) */
    float min_p;       /**< 0 = off (default 0.05) */
    uint64_t seed;     /**< same seed, same tokens (default 0) */
    float repeat_penalty;    /**< > 0; 1 = off (default 1) */
    int32_t repeat_last_n;   /**< penalty window; -1 = whole history, 0 = off (default 64) */
    float presence_penalty;  /**< 0 = off (default 0) */
    float frequency_penalty; /**< 0 = off (default 0) */
    /** Borrowed for the call that takes these params (copied by
     *  llm_session_submit() and llm_sampler_create()); NULL when
     *  `n_logit_bias` is 0 (default NULL, 0). */
    const llm_logit_bias *logit_bias;
    size_t n_logit_bias;
    /** End-of-generation tokens are banned until this many tokens were
     *  generated (default 0). */
    uint32_t min_tokens;
    /** Constrains the tokens to a compiled grammar (borrowed: it must
     *  outlive every request and sampler given these params; compiled for
     *  the same model). Each request (each sample of it) and sampler keeps
     *  its own state. NULL = unconstrained (default). Since 1.3. */
    const llm_grammar *grammar;
} llm_sampling_params;

/** As llm_model_params_init_sized(), for ::llm_sampling_params. Since 1.2. */
LLM_API void llm_sampling_params_init_sized(llm_sampling_params *params, size_t struct_size);
LLM_LEGACY_INIT(llm_sampling_params)

/* ------------------------------------------------------------------------ */
/** @name Speculative decoding
 *
 * A cheap proposer drafts up to k tokens; the model checks them all in one
 * forward pass (the last accepted token plus the k drafts, with logits on
 * every row) and keeps the longest acceptable prefix plus one token of its
 * own. Rejection sampling keeps the output distribution exactly the model's:
 *
 *  - greedy: a draft is accepted while it equals the model's choice; the
 *    output is token for token what plain greedy decoding gives;
 *  - ::LLM_SPEC_NGRAM with sampling: the draft is a point mass, accepted
 *    with probability p(x); a rejection draws from p without x. The draw
 *    uses the same random number as plain sampling, so the tokens are
 *    exactly those of a run without speculation;
 *  - ::LLM_SPEC_DRAFT with sampling: the draft model samples x from its
 *    distribution q (after the same sampling pipeline), accepted with
 *    probability min(1, p(x) / q(x)); a rejection draws from
 *    normalize(max(0, p - q)). Every position is decided this way, with
 *    random numbers keyed by (seed, position), so a seeded request gives
 *    the same tokens whatever k is and whatever runs beside it (while
 *    speculation stays on: a fixed spec_k never switches it off). The
 *    tokens differ from plain sampling's; their distribution does not.
 *
 * With `spec_k == 0` k adapts: the session times its forward passes and
 * each sequence measures how many drafts get accepted, and k is the number
 * that gives the most tokens per second (0 when drafting does not pay).
 * A draft model that does not pay for itself is switched off for the rest
 * of the request. Stop conditions are applied to the accepted tokens one
 * by one, and every token gets its own event. */
/* ------------------------------------------------------------------------ */

/** How drafts are proposed. Values never change. */
typedef enum llm_spec_mode {
    LLM_SPEC_NONE = 0,  /**< no speculation */
    /** Prompt lookup: the tokens that followed the most recent earlier
     *  occurrence of the last 3 (else 2, else 1) tokens of the sequence
     *  (prompt and generated). Costs nothing when nothing matches. */
    LLM_SPEC_NGRAM = 1,
    /** The session's llm_session_params::draft_model drafts, autoregressively,
     *  with the request's sampling parameters. */
    LLM_SPEC_DRAFT = 2,
} llm_spec_mode;

/** Largest llm_request_params::spec_k / llm_generate_params::spec_k. */
#define LLM_SPEC_MAX_K 32

/* ------------------------------------------------------------------------ */
/** @name Blocking generation */
/* ------------------------------------------------------------------------ */

/** Why generation ended. */
typedef enum llm_finish_reason {
    LLM_FINISH_NONE = 0,      /**< not finished */
    LLM_FINISH_EOS = 1,       /**< end-of-sequence or end-of-turn token */
    LLM_FINISH_LENGTH = 2,    /**< max_new_tokens or context length reached */
    LLM_FINISH_STOP = 3,      /**< a stop condition matched */
    LLM_FINISH_CANCELLED = 4, /**< the callback asked to stop */
    LLM_FINISH_ERROR = 5,
} llm_finish_reason;

/**
 * Called once per generated token with the text it completes (whole UTF-8
 * characters only; may be empty). `piece` is borrowed for the call. Return
 * false to stop generation. If bytes of an unfinished character are still
 * held back when generation ends, one last call delivers them (as U+FFFD)
 * with `token == LLM_TOKEN_NONE`; its return value is ignored.
 */
typedef bool (*llm_token_fn)(llm_token token, const char *piece, size_t piece_len, void *user);

typedef struct llm_generate_params {
    uint32_t struct_size;
    uint32_t max_new_tokens;              /**< default 128 */
    const llm_sampling_params *sampling; /**< borrowed; NULL = greedy */
    llm_token_fn on_token;                /**< may be NULL */
    void *user;                           /**< passed to on_token */
    bool ignore_eos;                      /**< keep going past EOS (default false) */
    /** Speculative decoding, an ::llm_spec_mode (default LLM_SPEC_NONE).
     *  ::LLM_SPEC_DRAFT needs a session with a draft_model. */
    uint32_t spec_mode;
    /** Drafts per step, at most ::LLM_SPEC_MAX_K; 0 = adaptive (default 0). */
    uint32_t spec_k;
    /** A LoRA adapter (borrowed for the call) and its scale, as
     *  llm_request_params::adapter and llm_request_params::adapter_scale
     *  (defaults NULL and 1.0). Since 1.4. */
    const llm_adapter *adapter;
    float adapter_scale;
} llm_generate_params;

/** As llm_model_params_init_sized(), for ::llm_generate_params. Since 1.2. */
LLM_API void llm_generate_params_init_sized(llm_generate_params *params, size_t struct_size);
LLM_LEGACY_INIT(llm_generate_params)

/** What one llm_generate() call did. */
typedef struct llm_generate_result {
    uint32_t struct_size; /**< set by the caller to sizeof(llm_generate_result) */
    llm_finish_reason finish_reason;
    uint32_t n_prompt_tokens;
    uint32_t n_generated_tokens;
    double prompt_seconds;     /**< prompt processing, up to the first token */
    double generate_seconds;   /**< the remaining tokens */
    /** Speculative decoding: forward passes that checked drafts, drafts
     *  checked (those after the token that ended generation are not), drafts
     *  accepted (acceptance rate = accepted / drafted). */
    uint32_t n_spec_steps;
    uint32_t n_draft_tokens;
    uint32_t n_accepted_tokens;
} llm_generate_result;

/**
 * Generates a continuation of `prompt` (tokens, e.g. from llm_tokenize) and
 * streams it through `params->on_token`, one call per token (also when
 * speculative decoding accepts several in one step). It is one request
 * through the session's scheduler (as llm_session_submit, with the same
 * limits), stepped until it finishes: a prompt that leaves no room in the
 * context (`n_prompt >= n_ctx`) gives ::LLM_ERR_LIMIT, and prompt plus
 * generated tokens never exceed n_ctx. Each call starts from an empty
 * context, and its KV blocks are released when it returns (the prefix cache
 * may keep them for reuse). Random numbers are keyed by (seed, stream 0,
 * position), as for requests: two calls with the same prompt and sampling
 * params give the same tokens, and so does a request. Requests submitted to
 * the session advance in the same steps; their events stay queued for
 * llm_session_step(). Call it from the thread that steps the session (not
 * concurrently with llm_session_step()); on_token runs on the calling
 * thread with no lock held. `result` may be NULL.
 */
LLM_API llm_status llm_generate(llm_session *session, const llm_token *prompt, size_t n_prompt,
                                const llm_generate_params *params, llm_generate_result *result);

/* ------------------------------------------------------------------------ */
/** @name Request level: continuous batching
 *
 * Submit any number of requests; each llm_session_step() runs one scheduler
 * iteration over all of them: every running request advances one token,
 * waiting requests are admitted while KV blocks and the per-step token budget
 * (max_batch_tokens) allow, and long prompts are prefilled in chunks mixed
 * with decode tokens. Requests sharing a prompt prefix share its KV blocks.
 * When KV memory runs out the most recently admitted request is preempted
 * (its blocks freed, recomputed later); a request that fits the limits is
 * never dropped, and never waits forever (see llm_session_step()).
 *
 * Threads: llm_session_submit() and llm_session_cancel() may be called from
 * any thread at any time, also while another thread is inside
 * llm_session_step(). llm_session_step() is called by one thread at a time. */
/* ------------------------------------------------------------------------ */

/** Identifies a request within its session; never 0, never reused. */
typedef uint64_t llm_request_id;

typedef struct llm_request_params {
    uint32_t struct_size;
    const llm_sampling_params *sampling; /**< copied at submit; NULL = greedy */
    uint32_t max_new_tokens;             /**< default 256 */
    int32_t priority;      /**< higher is admitted first; FCFS within a priority (0) */
    bool ignore_eos;       /**< do not stop at end-of-generation tokens */
    bool logprobs;         /**< report each token's log-probability */
    const llm_token *stop_tokens;    /**< copied; generation stops after one */
    size_t n_stop_tokens;
    const char *const *stop_strings; /**< copied; their text is never emitted */
    size_t n_stop_strings;
    /** Report this many most likely tokens with each token, at most 20
     *  (default 0): llm_event::top_tokens and llm_event::top_logprobs. */
    uint32_t top_logprobs;
    /** Speculative decoding, an ::llm_spec_mode (default LLM_SPEC_NONE).
     *  Speculating and plain requests share steps: a speculating request
     *  adds its drafts' rows to the step, within max_batch_tokens and only
     *  from free KV blocks (drafts never preempt anything). ::LLM_SPEC_DRAFT
     *  needs a session with a draft_model. */
    uint32_t spec_mode;
    /** Drafts per step, at most ::LLM_SPEC_MAX_K; 0 = adaptive (default 0). */
    uint32_t spec_k;
    /** Independent samples (completions) of the prompt, at most
     *  ::LLM_MAX_SAMPLES (default 1; 0 also means 1). The prompt is computed
     *  once; when its last position's logits exist each sample draws its
     *  first token from them and continues in its own sequence, sharing the
     *  prompt's KV blocks (copy-on-write). Every event names its
     *  llm_event::sample_index; each sample ends with its own finish event, so
     *  the request is over after `n_samples` of them. Sample 0 gives exactly
     *  the tokens of the same request with one sample; sample i > 0 draws with
     *  a seed derived from (seed, i). (With ::LLM_SPEC_DRAFT and sampling,
     *  tokens also depend on which positions the draft model decided, see
     *  above; their distribution does not.) A cancel ends every sample.
     *  Samples are scheduled, preempted and finished independently. */
    uint32_t n_samples;
    /** A LoRA adapter loaded for the session's model (borrowed: it must
     *  outlive the request), or NULL for the base model (default). Its
     *  rows take the adapter's update at `adapter_scale`; the prefix cache
     *  shares K/V only between requests of the same adapter and scale.
     *  The draft model of ::LLM_SPEC_DRAFT runs without it. "cpu"
     *  applies it, also with tensor_parallel > 1; a backend that does not
     *  (docs/lora.md, "Backends") refuses it with ::LLM_ERR_UNSUPPORTED.
     *  Since 1.4. */
    const llm_adapter *adapter;
    /** Multiplies the adapter's alpha / rank (default 1.0). Since 1.4. */
    float adapter_scale;
} llm_request_params;

/** Largest llm_request_params::n_samples. */
#define LLM_MAX_SAMPLES 256

/** As llm_model_params_init_sized(), for ::llm_request_params. Since 1.2. */
LLM_API void llm_request_params_init_sized(llm_request_params *params, size_t struct_size);
LLM_LEGACY_INIT(llm_request_params)

/**
 * Queues a request for `prompt` (copied). `params` may be NULL for defaults.
 * A prompt that leaves no room in the session's context (`n_prompt >=
 * n_ctx`) gives ::LLM_ERR_LIMIT with the numbers, and so does a request
 * whose longest sequence, min(n_prompt + max_new_tokens, n_ctx) tokens,
 * needs more KV blocks than the whole pool holds. Prompt + max_new_tokens
 * beyond the context is accepted: the request ends with
 * ::LLM_FINISH_LENGTH when its sequence fills the context. Invalid params
 * give ::LLM_ERR_INVALID_ARGUMENT naming the field (a NULL or empty stop
 * string by its index). Thread-safe.
 */
LLM_API llm_status llm_session_submit(llm_session *session, const llm_token *prompt,
                                      size_t n_prompt, const llm_request_params *params,
                                      llm_request_id *out_id);

/**
 * Cancels a request: its KV blocks are freed at once (or, if a step is
 * computing it on another thread, as soon as that step's forward pass ends),
 * and the next llm_session_step() reports it finished with
 * ::LLM_FINISH_CANCELLED. Cancelling again before that is harmless. A
 * request that already finished but whose finish event is still to be
 * delivered (the events array of a step was too small) gives ::LLM_OK and
 * changes nothing: its finish event comes as it was. An unknown id, or one
 * whose finish was already delivered, gives ::LLM_ERR_NOT_FOUND.
 * Thread-safe.
 */
LLM_API llm_status llm_session_cancel(llm_session *session, llm_request_id id);

/** One thing that happened to a request during a step. */
typedef struct llm_event {
    llm_request_id request;
    llm_token token;   /**< the new token, or LLM_TOKEN_NONE on a finish-only event */
    const char *text;  /**< UTF-8 text this event completes (whole characters);
                            borrowed until the next llm_session_step() */
    size_t text_len;
    float logprob;     /**< log p(token) if requested, else 0 */
    /** LLM_FINISH_NONE unless this is the request's (or sample's) last
     *  event. A request that ends on an end-of-generation token gets a
     *  finish event carrying that token with empty text; the token is not
     *  part of the output (llm_generate() reports it neither to on_token
     *  nor in n_generated_tokens). */
    llm_finish_reason finish_reason;
    llm_status status; /**< why, when finish_reason is LLM_FINISH_ERROR */
    /** With llm_request_params::top_logprobs: the `n_top` most likely tokens
     *  of the model's distribution for this position, most likely first, and
     *  their log-probabilities (log-softmax of the raw logits, like
     *  `logprob`, and computed with it: where the event's token is among
     *  them, its entry equals `logprob` bit for bit). Borrowed until the
     *  next llm_session_step(); NULL and 0 otherwise. */
    const llm_token *top_tokens;
    const float *top_logprobs;
    uint32_t n_top;
    /** Which of the request's llm_request_params::n_samples this event
     *  belongs to (0 for a request with one sample). */
    uint32_t sample_index;
} llm_event;

/**
 * Delivers events into `events` (capacity entries of `event_size` bytes each;
 * pass sizeof(llm_event) so later versions can grow the struct). Events left
 * over from an earlier call are delivered first; only when none are pending
 * does it run one scheduler iteration. `*n_events` = 0 with no requests left
 * means the session is idle.
 *
 * A failed step delivers no events (`*n_events` = 0) and may simply be
 * repeated. A failed forward pass (::LLM_ERR_BACKEND, or
 * ::LLM_ERR_OUT_OF_MEMORY from the backend) changes no request: each still
 * gives exactly the tokens of a run without the failure. Events the failed
 * iteration did produce (finishes of cancelled requests) come with the next
 * call. A request that cannot go on ends with ::LLM_FINISH_ERROR and its
 * status in llm_event::status (docs/reliability.md). In particular, a
 * waiting request that needs more KV blocks than are free or cached while
 * no request runs (the rest are held by open token-level sequences, which
 * only the host can release) ends at once with ::LLM_FINISH_ERROR and
 * ::LLM_ERR_LIMIT rather than waiting for as long as they stay open.
 * Event text and top log-probabilities are borrowed until the next
 * llm_session_step() or llm_generate() on the session.
 */
LLM_API llm_status llm_session_step(llm_session *session, llm_event *events, size_t capacity,
                                    size_t event_size, size_t *n_events);

/** Counters and gauges of a session. */
typedef struct llm_session_stats {
    uint32_t struct_size; /**< set by the caller to sizeof(llm_session_stats) */
    /** Requests holding KV blocks; a request with several samples counts
     *  once per started sample (each is its own sequence). */
    uint32_t n_running;
    /** Queued or preempted requests, plus samples not started yet. */
    uint32_t n_waiting;
    uint32_t block_size;  /**< tokens per KV block */
    uint32_t blocks_total;
    uint32_t blocks_used;   /**< referenced by a sequence */
    uint32_t blocks_cached; /**< unreferenced, kept for prefix reuse */
    uint32_t blocks_free;
    uint64_t kv_tokens_used;    /**< token slots holding K/V in used blocks */
    uint64_t prefix_hit_tokens; /**< prompt tokens served from the prefix cache */
    uint64_t prompt_tokens;     /**< prompt tokens computed */
    uint64_t generated_tokens;
    uint64_t preemptions;
    uint64_t steps;
    /** Speculative decoding of requests: per-request steps that checked
     *  drafts, drafts checked, drafts accepted (as in llm_generate_result). */
    uint64_t spec_steps;
    uint64_t spec_draft_tokens;
    uint64_t spec_accepted_tokens;
} llm_session_stats;

/**
 * Fills `stats` up to `stats->struct_size` bytes, which the caller sets
 * first. May be called from any thread, also while another thread is inside
 * llm_session_step() or llm_generate() on the session (a server's metrics
 * endpoint, say); not concurrently with the token-level calls
 * (llm_seq_*, llm_session_decode()), which the stepping thread makes.
 */
LLM_API llm_status llm_session_get_stats(llm_session *session, llm_session_stats *stats);

/* ------------------------------------------------------------------------ */
/** @name Token level: host-driven decoding
 *
 * For hosts that schedule and sample themselves. Sequences live in the same
 * KV pool as requests; the scheduler never preempts them. Not thread-safe:
 * call from the thread that steps the session.
 */
/* ------------------------------------------------------------------------ */

/** A sequence handle within a session. */
typedef int32_t llm_seq_id;

/** Opens an empty sequence. */
LLM_API llm_status llm_seq_open(llm_session *session, llm_seq_id *out);
/** Opens a sequence sharing every KV block of `src` (copy-on-write). */
LLM_API llm_status llm_seq_fork(llm_session *session, llm_seq_id src, llm_seq_id *out);
/** Closes a sequence and frees its blocks. */
LLM_API llm_status llm_seq_close(llm_session *session, llm_seq_id seq);
/** Forgets positions >= n_tokens (to roll back or branch). */
LLM_API llm_status llm_seq_truncate(llm_session *session, llm_seq_id seq, uint32_t n_tokens);
/** Number of positions the sequence holds. */
LLM_API llm_status llm_seq_length(llm_session *session, llm_seq_id seq, uint32_t *n_tokens);

/** One step's rows: (sequence, position, token, want logits). */
typedef struct llm_batch llm_batch;

/**
 * Runs the token-level sequence `seq` with a LoRA adapter of the session's
 * model (borrowed: it must outlive the sequence) at `scale` (effective
 * scale `scale * alpha / rank`), or with none (`adapter` NULL). Only while
 * the sequence holds no tokens (its K/V depend on the adapter):
 * ::LLM_ERR_INVALID_ARGUMENT otherwise, and for an adapter of another model
 * or a scale that is not finite; ::LLM_ERR_NOT_FOUND for a sequence that
 * is not open; ::LLM_ERR_UNSUPPORTED on a backend that does not apply
 * adapters. Forks keep their source's adapter. A sequence restored from
 * a state saved under an adapter (llm_seq_state_load()) holds that
 * adapter's K/V and refuses to decode (::LLM_ERR_INVALID_ARGUMENT naming
 * the adapter's fingerprint and scale) until this call gives it an adapter
 * of the same content (another load of the same file will do) at the same
 * scale; any other adapter or scale is ::LLM_ERR_INVALID_ARGUMENT. Since 1.4;
 * restored sequences wait for their adapter since 1.5.
 */
LLM_API llm_status llm_seq_set_adapter(llm_session *session, llm_seq_id seq,
                                       const llm_adapter *adapter, float scale);

LLM_API llm_status llm_batch_create(uint32_t capacity, llm_batch **out);
/** NULL is a no-op. */
LLM_API void llm_batch_free(llm_batch *batch);
LLM_API void llm_batch_clear(llm_batch *batch);
/**
 * Appends a row. Positions of one sequence must continue where it ends:
 * the first row of a sequence in a batch has pos == its current length, and
 * each further row pos + 1. ::LLM_ERR_LIMIT when the batch is full.
 */
LLM_API llm_status llm_batch_add(llm_batch *batch, llm_seq_id seq, uint32_t pos,
                                 llm_token token, bool want_logits);

/**
 * Computes every row of `batch` in one forward pass. Either all rows are
 * applied or none (KV exhausted: ::LLM_ERR_LIMIT). A batch larger than
 * max_batch_tokens is split internally.
 */
LLM_API llm_status llm_session_decode(llm_session *session, const llm_batch *batch);

/**
 * Logits (n_vocab floats) of row `row` of the last decoded batch, which must
 * have asked for them. They belong to that decode alone: llm_session_step()
 * and llm_generate() compute into other memory and leave them as they are.
 * Borrowed until the next llm_session_decode() (also a failed one) or
 * llm_session_free(). After a failed decode, or for a row that did not ask
 * for logits, ::LLM_ERR_INVALID_ARGUMENT and `*logits` = NULL.
 */
LLM_API llm_status llm_session_logits(llm_session *session, uint32_t row, const float **logits);

/* ------------------------------------------------------------------------ */
/** @name Embeddings (since 1.3)
 *
 * The final hidden states of a sequence (the residual stream after the
 * last layer, normed with the model's output norm: the vector the LM head
 * would multiply), one per token or pooled into one vector per input, for
 * retrieval and similarity. Inputs run as temporary sequences in the
 * session's KV pool, several in one forward pass, and leave nothing behind:
 * no open sequence, no cached prefix. Not thread-safe, like the token-level
 * API: call from the thread that steps the session.
 */
/* ------------------------------------------------------------------------ */

/** How the per-token states of an input become its embedding. */
typedef enum llm_pooling {
    /** The model's own choice: GGUF `<arch>.pooling_type` where the file
     *  has it, else ::LLM_POOLING_MEAN (llm_model_pooling() says which). */
    LLM_POOLING_MODEL = 0,
    /** No pooling: one vector per token of every input. */
    LLM_POOLING_NONE = 1,
    /** The mean over the input's tokens. */
    LLM_POOLING_MEAN = 2,
    /** The first token's vector (BERT's CLS token). */
    LLM_POOLING_FIRST = 3,
    /** The last token's vector (what a causal model has read everything by). */
    LLM_POOLING_LAST = 4,
} llm_pooling;

typedef struct llm_embed_params {
    uint32_t struct_size; /**< sizeof(llm_embed_params), set by init */
    /** Default ::LLM_POOLING_MODEL. */
    llm_pooling pooling;
    /** Scale every output vector to unit L2 norm, so that a dot product is
     *  the cosine similarity (default true). A zero vector stays zero. */
    bool normalize;
} llm_embed_params;

/** Fills the defaults, as llm_model_params_init_sized() does. Since 1.3. */
LLM_API void llm_embed_params_init_sized(llm_embed_params *params, size_t struct_size);
#if !defined(LLM_BUILDING_LIBRARY)
static inline void llm_embed_params_init(llm_embed_params *params) {
    llm_embed_params_init_sized(params, sizeof *params);
}
#endif

/**
 * The pooling ::LLM_POOLING_MODEL stands for on `model` (never
 * ::LLM_POOLING_MODEL itself). A file whose pooling llm_session_embed()
 * cannot do (llama.cpp's "rank" pooling of rerankers, unknown values) gives
 * ::LLM_ERR_UNSUPPORTED naming it. Thread-safe. Since 1.3.
 */
LLM_API llm_status llm_model_pooling(const llm_model *model, llm_pooling *out);

/**
 * Embeds `n_inputs` token sequences: input i is `inputs[i]`, `n_tokens[i]`
 * tokens (all borrowed for the call). Each input is computed on its own
 * from an empty context (causal models attend to earlier tokens of the
 * same input only); inputs share forward passes of up to the session's
 * max_batch_tokens rows, and a longer input is split across passes.
 *
 * Writes to `out` (`capacity` floats, n_embd = llm_model_info::n_embd):
 * pooled, n_inputs vectors of n_embd floats in input order; with
 * ::LLM_POOLING_NONE, one vector per token, the inputs' tokens one after
 * the other. `*n_floats` = the floats written, or needed: a `capacity`
 * too small gives ::LLM_ERR_BUFFER_TOO_SMALL before anything runs (`out`
 * may be NULL with capacity 0 to ask). `params` may be NULL for defaults;
 * only what its struct_size covers is read.
 *
 * Errors: no inputs, an empty input, or a token outside the vocabulary:
 * ::LLM_ERR_INVALID_ARGUMENT naming the input; an input longer than the
 * session's n_ctx, or one that the free KV blocks cannot hold:
 * ::LLM_ERR_LIMIT; a backend that cannot return hidden states, or a
 * pooling the model's file asks for that is not supported:
 * ::LLM_ERR_UNSUPPORTED naming what is missing; llm_session_interrupt():
 * ::LLM_ERR_CANCELLED. On any failure the contents of `out` are
 * unspecified and the session is as before. Since 1.3.
 */
LLM_API llm_status llm_session_embed(llm_session *session, const llm_token *const *inputs,
                                     const size_t *n_tokens, size_t n_inputs,
                                     const llm_embed_params *params, float *out, size_t capacity,
                                     size_t *n_floats);

/* ------------------------------------------------------------------------ */
/** @name Session state: saving and restoring sequences
 *
 * A token-level sequence (its tokens and their K/V) saved to memory or a
 * file and loaded back, into this session or another one on the same model
 * (in this process or a later one), continues exactly where it was: with
 * the same kv_type on the same CPU, the next logits are bitwise the ones
 * the original sequence gives. The session loading it may have another
 * kv_block_size, n_ctx or kv_type (rows are converted; from F32 to F16 or
 * BF16 that rounds, so logits then differ slightly; Q8_0 and Q4_0 rows,
 * since 1.4, are saved as they are cached, dequantized exactly into a
 * float session and quantized into a Q8_0/Q4_0 one as computed rows are;
 * libraries before 1.4 refuse such a state as an unknown KV type).
 *
 * A state names its model by a 64-bit fingerprint of the hyper-parameters,
 * tensor shapes and the ends of every tensor's data: another model (also a
 * fine-tune of the same shape) gives ::LLM_ERR_INVALID_ARGUMENT naming both.
 * Everything is checked before use: truncated or corrupt data (CRC-32 of
 * header and payload) gives ::LLM_ERR_BAD_FORMAT, a newer format version
 * ::LLM_ERR_UNSUPPORTED, a state that does not fit the session's n_ctx or
 * free KV blocks ::LLM_ERR_LIMIT, file errors ::LLM_ERR_IO. A load applies
 * fully or not at all: on failure no sequence is opened and no KV block is
 * kept. Files are written to "PATH.tmp", synced and renamed, so PATH holds
 * either the old or the complete new state, never a partial one.
 *
 * Only token-level sequences are state: requests of the scheduler
 * (llm_session_submit) and llm_generate's context are not saved. Forks
 * sharing KV blocks are saved and loaded as independent copies. The format
 * is described in docs/reliability.md. Not thread-safe, like the rest of
 * the token-level API. */
/* ------------------------------------------------------------------------ */

/**
 * Copies the tokens sequence `seq` holds (every position decoded into it,
 * after truncation; a fork starts with its source's) into `tokens`.
 * `*n_tokens` = their number; when `capacity` is smaller:
 * ::LLM_ERR_BUFFER_TOO_SMALL (`tokens` may be NULL when `capacity` is 0).
 * An unknown sequence: ::LLM_ERR_NOT_FOUND.
 */
LLM_API llm_status llm_seq_tokens(llm_session *session, llm_seq_id seq, llm_token *tokens,
                                  size_t capacity, size_t *n_tokens);

/**
 * Saves sequence `seq` into `buf` (`capacity` bytes, borrowed for the
 * call; the state does not point into the session). When `buf` is NULL or
 * `capacity` is below what the state may take: ::LLM_ERR_BUFFER_TOO_SMALL
 * and `*size` = an upper bound (allocate that much and call again); on
 * success `*size` = the bytes written, usually a little less. The sequence
 * is not changed. An unknown sequence: ::LLM_ERR_NOT_FOUND.
 */
LLM_API llm_status llm_seq_state_save(llm_session *session, llm_seq_id seq, void *buf,
                                      size_t capacity, size_t *size);

/**
 * Opens a new sequence holding the state in `data` (`size` bytes, borrowed)
 * saved by llm_seq_state_save() or llm_seq_state_save_file(): its tokens
 * and K/V, ready to decode at position = its length. `*out` = its id (-1 on
 * failure). A session state gives ::LLM_ERR_INVALID_ARGUMENT (use
 * llm_session_state_load()). A sequence saved under a LoRA adapter is
 * restored without it and decodes only after llm_seq_set_adapter() gives it
 * the same adapter and scale (the state names them, it does not hold them).
 */
LLM_API llm_status llm_seq_state_load(llm_session *session, const void *data, size_t size,
                                      llm_seq_id *out);

/** llm_seq_state_save() into the file `path` (borrowed; replaced atomically). */
LLM_API llm_status llm_seq_state_save_file(llm_session *session, llm_seq_id seq,
                                           const char *path);

/** llm_seq_state_load() from the file `path` (borrowed), read in bounded chunks. */
LLM_API llm_status llm_seq_state_load_file(llm_session *session, const char *path,
                                           llm_seq_id *out);

/**
 * Saves every open token-level sequence with its id, as llm_seq_state_save()
 * does for one (same buffer rules). A session without sequences gives a
 * valid, empty state.
 */
LLM_API llm_status llm_session_state_save(llm_session *session, void *buf, size_t capacity,
                                          size_t *size);

/**
 * Re-creates the sequences of a session state under their saved ids. The
 * session must have no open token-level sequence (else
 * ::LLM_ERR_INVALID_ARGUMENT); its requests are not affected. A sequence
 * state gives ::LLM_ERR_INVALID_ARGUMENT (use llm_seq_state_load()).
 */
LLM_API llm_status llm_session_state_load(llm_session *session, const void *data, size_t size);

/** llm_session_state_save() into the file `path` (borrowed; replaced atomically). */
LLM_API llm_status llm_session_state_save_file(llm_session *session, const char *path);

/** llm_session_state_load() from the file `path` (borrowed). */
LLM_API llm_status llm_session_state_load_file(llm_session *session, const char *path);

/* ------------------------------------------------------------------------ */
/** @name Standalone sampler
 *
 * The sampling pipeline of ::llm_sampling_params for hosts that drive
 * decoding themselves (token-level API). One sampler per stream of tokens;
 * it is not thread-safe (use one per thread), but different samplers may be
 * used concurrently, also on the same model. */
/* ------------------------------------------------------------------------ */

typedef struct llm_sampler llm_sampler;

/**
 * Creates a sampler for `model`'s vocabulary. `params` may be NULL for
 * greedy; it is validated and copied, logit_bias included. `stream` joins
 * the seed in keying the random numbers (use different streams to draw
 * independent sequences with one seed). Borrows `model`, which must
 * outlive the sampler. Caller frees `*out` with llm_sampler_free().
 */
LLM_API llm_status llm_sampler_create(const llm_model *model, const llm_sampling_params *params,
                                      uint64_t stream, llm_sampler **out);
/** NULL is a no-op. */
LLM_API void llm_sampler_free(llm_sampler *sampler);

/**
 * Picks the next token from `logits` (n_vocab floats, borrowed, not
 * modified). `history` holds the tokens so far (prompt, then generated;
 * borrowed; may be NULL when `n_history` is 0) for the penalties;
 * `n_generated` counts the generated ones, for min_tokens. The random number
 * is keyed by (seed, stream, position): the same arguments give the same
 * token. Use the index the token will take in the sequence as `position`.
 * With a grammar in the sampler's params, the sampler keeps a grammar state
 * from its creation on: only allowed tokens are drawn and the drawn token
 * is accepted into that state. A grammar that allows nothing more
 * (finished) gives ::LLM_ERR_INVALID_ARGUMENT.
 */
LLM_API llm_status llm_sampler_sample(llm_sampler *sampler, const float *logits,
                                      const llm_token *history, size_t n_history,
                                      uint32_t n_generated, uint64_t position, llm_token *out);

/**
 * The `top_n` most likely tokens of the model's distribution, log-softmax of
 * the raw `logits` (no sampling parameters applied), most likely first
 * (lowest id on ties). Writes min(top_n, n_vocab) entries to `tokens` and
 * `logprobs` (caller arrays of at least top_n entries) and their number to
 * `*n_out`.
 */
LLM_API llm_status llm_sampler_logprobs(llm_sampler *sampler, const float *logits,
                                        uint32_t top_n, llm_token *tokens, float *logprobs,
                                        uint32_t *n_out);

/* ======================================================================== */
/** @name Experimental: devices
 *
 * Declared only for a program that opts in before including this header:
 *
 *     #define LLM_EXPERIMENTAL
 *     #include <llm.h>
 *
 * Unlike everything above, this section may change, or go, in a minor
 * release (1.x), as zstd's ZSTD_STATIC_LINKING_ONLY section may: use it
 * from programs built together with the library they run with. Its
 * functions sit in their own linker version node, LLMINFER_1.1, so a
 * binary shows whether it depends on them (docs/abi.md).
 *
 * The stable structs above gain no experimental fields: where a session
 * runs is a struct of its own, ::llm_device_params, passed to
 * llm_session_create_ex(). */
/* ======================================================================== */
#ifdef LLM_EXPERIMENTAL

/** A backend: the code that runs a session's model on some hardware. */
typedef struct llm_backend_info {
    uint32_t struct_size; /**< set by the caller to sizeof(llm_backend_info) */
    /** "cpu", "cuda", ...: the name llm_device_params::backend takes.
     *  Static storage. */
    const char *name;
    /** Whether a session can run on it in this process now. */
    bool available;
    /** Its devices, ids 0 .. n_devices - 1; 0 when unavailable. */
    uint32_t n_devices;
    /** Why it is unavailable ("the CUDA plug-in is not installed"); ""
     *  when available. NUL-terminated, cut at 255 bytes. */
    char reason[256];
} llm_backend_info;

/**
 * The number of backends llm_backend_get_info() describes: first those
 * this process has ("cpu", always available, is index 0), then known
 * plug-ins that are not installed ("cuda"), listed as unavailable so that
 * users see them. The number grows when a plug-in is loaded. Thread-safe.
 */
LLM_API size_t llm_backend_count(void);

/**
 * Describes backend `index`, checking (probing) whether it can run here:
 * fills `info` up to `info->struct_size` bytes, which the caller sets
 * first: `llm_backend_info info = {sizeof info};`. An unavailable backend
 * is not an error: ::LLM_OK with `available` false and the reason. An
 * index at or past llm_backend_count() gives ::LLM_ERR_NOT_FOUND, so a
 * loop may also run until then. Thread-safe.
 */
LLM_API llm_status llm_backend_get_info(size_t index, llm_backend_info *info);

/** Where a session runs. Fill with llm_device_params_init() first. */
typedef struct llm_device_params {
    uint32_t struct_size; /**< sizeof(llm_device_params), set by init */
    /** Backend name (borrowed for the call): "cpu", "cuda", or "auto" for
     *  the first available backend other than "cpu", else "cpu" (the
     *  choice and the reasons others were skipped are logged at
     *  ::LLM_LOG_INFO). NULL or "" is "cpu" (the default). */
    const char *backend;
    /** Ids of the devices to run on, `n_devices` of them (borrowed for the
     *  call). NULL and 0 (the default): device 0, or devices 0 ..
     *  tensor_parallel - 1. Otherwise n_devices must equal
     *  tensor_parallel. */
    const int32_t *devices;
    uint32_t n_devices;
    /** Devices one model is split across (default 1; 0 means 1). More
     *  than 1 (at most 8): on backend "cpu" (or NULL), that many CPU ranks
     *  as threads, which give the CPU's logits bit for bit; on "cuda",
     *  that many GPUs of one process joined by NCCL; "auto" picks "cuda"
     *  when it has enough devices, else CPU ranks
     *  (docs/tensor-parallel.md). A model that does not split that way
     *  gives ::LLM_ERR_UNSUPPORTED naming the sizes that work. */
    uint32_t tensor_parallel;
} llm_device_params;

/** Fills defaults, the CPU, as llm_model_params_init_sized() does. */
LLM_API void llm_device_params_init_sized(llm_device_params *params, size_t struct_size);
LLM_LEGACY_INIT(llm_device_params)

/**
 * llm_session_create() on the backend and devices `device` names; NULL
 * `device` gives defaults, the CPU, as llm_session_create() does. Reads
 * only what `device->struct_size` covers. Errors besides those of
 * llm_session_create(): a backend that is not registered, or not available
 * here, gives ::LLM_ERR_UNSUPPORTED with a message saying why ("backend
 * 'cuda' is not available: the CUDA plug-in is not installed") or, for an
 * unknown name, which backends there are; tensor_parallel > 1 on a
 * backend that cannot split a model across its devices, or for a model
 * that does not split, gives ::LLM_ERR_UNSUPPORTED; a device id the backend does not have (anything
 * but 0 on "cpu"), or `devices` that do not match tensor_parallel, give
 * ::LLM_ERR_INVALID_ARGUMENT. Caller frees `*out` with llm_session_free().
 */
LLM_API llm_status llm_session_create_ex(const llm_model *model,
                                         const llm_session_params *params,
                                         const llm_device_params *device, llm_session **out);

#endif /* LLM_EXPERIMENTAL */

#ifdef __cplusplus
}
#endif

#endif /* LLM_H */
