/* OpenAI's /v1/embeddings request JSON -> token inputs. No HTTP or engine
 * dependency, so that the fuzzer can drive it directly. */
#ifndef LLM_SERVE_EMBED_REQUEST_H
#define LLM_SERVE_EMBED_REQUEST_H

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llm.h"
#include "request.h"

/* What a request is checked against. */
typedef struct embed_limits {
    const llm_model *model; /* tokenizes text inputs (NULL: they fail with 400) */
    uint32_t n_vocab, n_embd, n_ctx;
    bool matryoshka; /* 'dimensions' below n_embd allowed (llm-serve --matryoshka) */
} embed_limits;

typedef struct embed_request {
    llm_token **inputs; /* [n_inputs], input i n_tokens[i] ids (>= 1, <= n_ctx) */
    size_t *n_tokens;
    size_t n_inputs;     /* >= 1 */
    size_t total_tokens; /* usage */
    bool base64;         /* encoding_format "base64" */
    uint32_t dimensions; /* of the vectors sent: n_embd unless asked (1 .. n_embd) */
} embed_request;

/* Parses `body` (`len` bytes). Returns false with `err` filled (400, or 503
 * out of memory) when it is invalid; `out` must then still be released.
 * On success release it with embed_request_free(). */
bool embed_request_parse(const char *body, size_t len, const embed_limits *lim,
                         embed_request *out, serve_error *err);
void embed_request_free(embed_request *r);

#endif
