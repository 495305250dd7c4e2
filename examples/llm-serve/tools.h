/* Tool calling: the request's tools and tool_choice, the reply formats of
 * the model families (one table), the grammar that forces a call, and the
 * system-message preamble for templates that do not render tools. */
#ifndef LLM_SERVE_TOOLS_H
#define LLM_SERVE_TOOLS_H

#include <cJSON.h>
#include <stdbool.h>

#include "request.h"
#include "structured.h"

/* How a model family writes tool calls in its reply. */
typedef struct tool_format {
    const char *name;
    /* Text of a chat template that marks the family (any one of them). */
    const char *markers[3];
    const char *open;          /* before each call's JSON ("" when none) */
    const char *close;         /* after it */
    const char *separator;     /* between two calls, after `close` */
    const char *arguments_key; /* "arguments" or "parameters" */
} tool_format;

/* The format a template's text implies: the first family whose marker it
 * contains, else the Hermes style (the fallback preamble's format too). */
const tool_format *tool_format_detect(const char *template_text);
/* The format named `name`, NULL if none ("hermes", "llama3"). */
const tool_format *tool_format_find(const char *name);

/* Reads tools, tool_choice and parallel_tool_calls of a chat request. */
bool serve_parse_tools(const cJSON *root, serve_request *req, serve_error *err);

/* GBNF for a reply made only of calls in `fmt` to the tools tool_choice
 * allows (one or more, or exactly one without parallel_tool_calls); its
 * start rule is TOOL_GRAMMAR_ROOT. NULL with a 400 (a tool's schema the
 * compiler refuses) or a 503 in `err`. Caller frees. */
#define TOOL_GRAMMAR_ROOT "tool-call-list"
char *tool_grammar_text(const serve_request *req, const tool_format *fmt, serve_error *err);

/* The grammar the request's output must follow, into `*out` (NULL when
 * none): its response_format (or another server's field), or the tool
 * calls tool_choice forces, in `fmt`. False with `err` filled. */
bool serve_request_grammar(grammar_cache *cache, const serve_request *req, const tool_format *fmt,
                           grammar_ref **out, serve_error *err);

/* The system text that lists the tools and the reply format, for a template
 * with no tools section. NULL when out of memory. Caller frees. */
char *tool_preamble(const serve_request *req, const tool_format *fmt);

#endif
