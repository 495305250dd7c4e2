/* A Jinja2 subset interpreter for chat templates: the constructs and filters
 * Hugging Face chat templates use, rendered the way transformers renders
 * them (jinja2's ImmutableSandboxedEnvironment with trim_blocks,
 * lstrip_blocks and the loopcontrols extension; tojson as json.dumps without
 * HTML escaping; raise_exception and strftime_now as globals). The subset and
 * its differences from jinja2 are listed in docs/chat-templates.md.
 *
 * Errors: a syntax error or an unknown filter/test gives
 * LLM_ERR_INVALID_ARGUMENT naming line:column; an error while rendering
 * (undefined attribute, type error, raise_exception) gives
 * LLM_ERR_INVALID_ARGUMENT with jinja2's kind and message; a template that
 * exceeds a limit (parse nesting, call depth, steps, output, memory) gives
 * LLM_ERR_LIMIT. Reentrant: every call owns its state. */
#ifndef LLMI_JINJA_H
#define LLMI_JINJA_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>

struct cJSON;

typedef struct llmi_jinja_limits {
    uint32_t max_depth; /* nesting of the parser and of macro calls */
    uint64_t max_steps; /* expression and statement evaluations */
    uint64_t max_loop;  /* loop iterations in all */
    size_t max_output;  /* bytes of rendered text */
    size_t max_memory;  /* bytes of values and syntax tree */
} llmi_jinja_limits;

/* The defaults: depth 100, 10M steps, 1M iterations, 16 MiB of output,
 * 256 MiB of memory. */
llmi_jinja_limits llmi_jinja_default_limits(void);

/* Renders `tmpl` (`len` bytes of UTF-8) with the members of the JSON object
 * `vars` as its variables (NULL: none). `limits` NULL: the defaults.
 * `*out` = the text (NUL-terminated, llmi_free), `*out_len` its length;
 * on failure *out = NULL. `now` is the time strftime_now formats (seconds
 * since the epoch; < 0: the current time). */
llm_status llmi_jinja_render(const char *tmpl, size_t len, const struct cJSON *vars,
                             const llmi_jinja_limits *limits, double now, char **out,
                             size_t *out_len);

#endif
