/* Reading tool calls out of a model's reply (tool_choice "auto", and the
 * constrained output of "required" or a named function). */
#ifndef LLM_SERVE_TOOL_PARSE_H
#define LLM_SERVE_TOOL_PARSE_H

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "tools.h"

typedef struct tool_call {
    char id[32]; /* "call_" and 24 random letters and digits */
    char *name;
    char *arguments; /* a JSON object's text */
} tool_call;

typedef struct tool_reply {
    char *content; /* the text before the calls, NULL when only calls */
    tool_call *calls;
    size_t n_calls;
} tool_reply;

/* Splits `text` into content and calls in `fmt`. Calls count only when all
 * of them parse: each a JSON object whose "name" is a function of
 * `tools_json` (the request's tools array) and whose arguments (the
 * format's key, or "arguments") are a JSON object or its text, with nothing
 * but whitespace and the format's delimiters between and after them. Else
 * the whole text is the content. False only when out of memory; release
 * `out` with tool_reply_free() either way. */
bool tool_reply_parse(const char *text, const tool_format *fmt, const char *tools_json,
                      tool_reply *out);
void tool_reply_free(tool_reply *r);

/* Writes a new call id, "call_" and 24 random letters and digits. */
void tool_call_new_id(char id[32]);

/* Puts a reply to `req` into `message` (a chat message, or a stream's last
 * delta when `delta`): "content" (null when there are only calls; in a
 * delta, only what follows the `content_sent` bytes streamed already, and
 * absent when that is nothing) and "tool_calls" when the reply holds calls
 * in `fmt` to req's tools (the first only without parallel_tool_calls).
 * Sets `*has_calls`. False when out of memory. */
bool tool_reply_put(cJSON *message, const char *text, const tool_format *fmt,
                    const serve_request *req, bool delta, size_t content_sent, bool *has_calls);

/* How many bytes of a reply still being generated (`text`, `len` bytes)
 * are content whatever follows, and can be streamed: up to where a call in
 * `fmt` starts or may start, less the whitespace before it (which the
 * parsed content drops). */
size_t tool_reply_sendable(const char *text, size_t len, const tool_format *fmt);

#endif
