/* Structured output: the request fields that constrain what a reply may be
 * (OpenAI's response_format, llama.cpp's grammar and json_schema, vLLM's
 * guided_json / guided_regex / guided_grammar), and the compiled grammars'
 * cache shared by all requests. */
#ifndef LLM_SERVE_STRUCTURED_H
#define LLM_SERVE_STRUCTURED_H

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llm.h"
#include "request.h"

/* Reads the constraint fields of `root` into req->constraint and
 * req->constraint_text. More than one of them, or a malformed one, is a 400
 * in `err`. */
bool serve_parse_constraint(const cJSON *root, serve_request *req, serve_error *err);

/* Compiled grammars keyed by their kind and exact text, shared by
 * requests. A grammar handed out stays valid until its reference is
 * dropped, even if the cache forgets it meanwhile. Thread-safe. */
typedef struct grammar_cache grammar_cache;
typedef struct grammar_ref grammar_ref;

/* NULL when out of memory. `capacity` grammars are kept at most. */
grammar_cache *grammar_cache_create(const llm_model *model, size_t capacity);
void grammar_cache_free(grammar_cache *c);

/* The grammar for `kind` and `text` (for SERVE_CONSTRAINT_GBNF, `root`
 * names the start rule, NULL for "root"), compiled on first use. On failure
 * returns NULL with a 400 (the compiler's message, naming `param`) or a 503
 * in `err`. Drop the reference with grammar_ref_release(). */
grammar_ref *grammar_cache_get(grammar_cache *c, serve_constraint kind, const char *text,
                               const char *root, const char *param, serve_error *err);
const llm_grammar *grammar_ref_grammar(const grammar_ref *ref);

/* What the cache did, for /metrics. */
typedef struct grammar_cache_stats {
    uint64_t compiles;      /* grammars compiled (failures included) */
    uint64_t hits;          /* requests served a cached grammar */
    double compile_seconds; /* time spent compiling */
    size_t entries;         /* grammars kept now */
} grammar_cache_stats;
void grammar_cache_get_stats(grammar_cache *c, grammar_cache_stats *out);
/* NULL is a no-op. */
void grammar_ref_release(grammar_ref *ref);

#endif
