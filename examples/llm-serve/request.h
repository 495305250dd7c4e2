/* OpenAI request JSON -> generation settings, with no HTTP or model
 * dependency so that the fuzzer can drive it directly. */
#ifndef LLM_SERVE_REQUEST_H
#define LLM_SERVE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llm.h"

#define SERVE_MAX_STOP 16
#define SERVE_MAX_TOP_LOGPROBS 20

typedef struct serve_limits {
    uint32_t max_tokens_limit; /* largest max_tokens a request may ask for */
    uint32_t max_n;            /* largest n */
    uint32_t n_vocab;          /* logit_bias keys must be below it */
} serve_limits;

/* An error to send back: HTTP status and OpenAI error fields. */
typedef struct serve_error {
    int http_status;
    const char *type;  /* "invalid_request_error", ... (static) */
    const char *code;  /* static or NULL */
    char param[64];    /* offending field, "" when none */
    char message[256];
} serve_error;

typedef struct serve_message {
    char *role;
    char *content;
} serve_message;

/* What the output must match (structured.c). */
typedef enum serve_constraint {
    SERVE_CONSTRAINT_NONE,
    SERVE_CONSTRAINT_JSON_SCHEMA, /* text: a JSON Schema ({"type":"object"} for json_object) */
    SERVE_CONSTRAINT_GBNF,        /* text: a GBNF grammar */
    SERVE_CONSTRAINT_REGEX,       /* text: a regular expression */
} serve_constraint;

/* tool_choice (tools.c). */
typedef enum serve_tool_choice {
    SERVE_TOOL_CHOICE_AUTO,
    SERVE_TOOL_CHOICE_NONE,
    SERVE_TOOL_CHOICE_REQUIRED,
    SERVE_TOOL_CHOICE_NAMED,
} serve_tool_choice;

typedef struct serve_request {
    bool chat;
    /* The messages as the chat template gets them (a JSON array): roles
     * normalised, content as one string, tool calls and tool results kept. */
    char *messages_json;
    serve_message *messages; /* chat */
    size_t n_messages;
    char *prompt;            /* completions, as text */
    llm_token *prompt_tokens; /* completions, as token ids (then prompt is "") */
    size_t n_prompt_tokens;
    bool stream;
    bool include_usage;
    bool has_max_tokens;
    uint32_t max_tokens;
    uint32_t n;
    bool logprobs;
    uint32_t top_logprobs;
    bool echo;
    char *stop[SERVE_MAX_STOP];
    size_t n_stop;
    bool has_seed;
    llm_sampling_params sampling;
    llm_logit_bias *logit_bias;
    size_t n_logit_bias;
    bool ignore_eos;
    uint32_t spec_mode; /* llm_spec_mode */
    uint32_t spec_k;
    char *model;
    serve_constraint constraint;
    char *constraint_text;
    char constraint_param[32]; /* the field that set it, for errors */
    /* Tools: the request's `tools` array as JSON (NULL: none given). */
    char *tools_json;
    size_t n_tools;
    serve_tool_choice tool_choice;
    char *tool_choice_name; /* SERVE_TOOL_CHOICE_NAMED */
    bool parallel_tool_calls;
} serve_request;

/* Whether tools are offered to the model and its reply is read for calls. */
static inline bool serve_request_uses_tools(const serve_request *req) {
    return req->chat && req->tools_json && req->tool_choice != SERVE_TOOL_CHOICE_NONE;
}

void serve_error_set(serve_error *err, int http_status, const char *type, const char *param,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* 503 "out_of_memory": the server could not allocate `what` needed ("while
 * building the response"); the client may retry. */
void serve_error_out_of_memory(serve_error *err, const char *what);

/* Parses `body` (`len` bytes) as a chat (`chat` true) or completions request.
 * Returns false with `err` filled when the request is invalid; `out` is then
 * already released. On success release it with serve_request_free(). */
bool serve_request_parse(const char *body, size_t len, bool chat, const serve_limits *limits,
                         serve_request *out, serve_error *err);

void serve_request_free(serve_request *req);

/* Request params pointing into `req` (sampling, stops, logit bias): valid
 * while `req` lives. */
void serve_request_params(const serve_request *req, uint32_t max_new_tokens,
                          const char **stop_ptrs, llm_sampling_params *sampling,
                          llm_request_params *params);

#endif
