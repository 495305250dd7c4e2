/* /v1/embeddings request JSON -> token inputs, with no HTTP or engine
 * dependency so that the fuzzer can drive it directly. */
#include "embed_request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

/* OpenAI's limit on inputs per request. */
#define MAX_INPUTS 2048

#define INVALID(param, ...) \
    (serve_error_set(err, 400, "invalid_request_error", param, __VA_ARGS__), false)
#define OUT_OF_MEMORY() (serve_error_out_of_memory(err, "while parsing the request"), false)

void embed_request_free(embed_request *r)
{
    for (size_t i = 0; r->inputs && i < r->n_inputs; i++) free(r->inputs[i]);
    free(r->inputs);
    free(r->n_tokens);
}

/* Input i from a string: the ids a completions prompt would get, without
 * reading special-token text as special tokens. */
static bool input_from_text(const embed_limits *lim, const char *text, size_t i, embed_request *r,
                            serve_error *err)
{
    const size_t len = strlen(text);
    if (len == 0) return INVALID("input", "input[%zu] is an empty string", i);
    size_t need = 0;
    llm_status st = llm_tokenize(lim->model, text, len, LLM_TOKENIZE_ADD_SPECIAL, NULL, 0, &need);
    if (st != LLM_OK && st != LLM_ERR_BUFFER_TOO_SMALL)
        return INVALID("input", "input[%zu] cannot be tokenized: %s", i, llm_last_error());
    r->inputs[i] = serve_malloc((need ? need : 1) * sizeof **r->inputs);
    if (!r->inputs[i]) return OUT_OF_MEMORY();
    st = llm_tokenize(lim->model, text, len, LLM_TOKENIZE_ADD_SPECIAL, r->inputs[i], need,
                      &r->n_tokens[i]);
    if (st != LLM_OK)
        return INVALID("input", "input[%zu] cannot be tokenized: %s", i, llm_last_error());
    if (r->n_tokens[i] == 0) return INVALID("input", "input[%zu] has no tokens", i);
    return true;
}

/* Input i from an array of token ids. */
static bool input_from_ids(const embed_limits *lim, const cJSON *ids, size_t i, embed_request *r,
                           serve_error *err)
{
    const size_t n = (size_t)cJSON_GetArraySize(ids);
    if (n == 0) return INVALID("input", "input[%zu] is an empty array of tokens", i);
    r->inputs[i] = serve_malloc(n * sizeof **r->inputs);
    if (!r->inputs[i]) return OUT_OF_MEMORY();
    size_t k = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, ids) {
        if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble >= lim->n_vocab ||
            t->valuedouble != (double)(llm_token)t->valuedouble)
            return INVALID("input", "input[%zu][%zu] is not a token id of this model (0..%u)", i,
                           k, lim->n_vocab - 1);
        r->inputs[i][k++] = (llm_token)t->valuedouble;
    }
    r->n_tokens[i] = n;
    return true;
}

/* `input`: a string, an array of strings, an array of token ids, or an
 * array of arrays of token ids. */
static bool parse_input(const embed_limits *lim, const cJSON *input, embed_request *r, serve_error *err)
{
    if (!input) return INVALID("input", "'input' is required");
    const bool one_text = cJSON_IsString(input);
    const cJSON *first = cJSON_IsArray(input) ? cJSON_GetArrayItem(input, 0) : NULL;
    const bool one_ids = first && cJSON_IsNumber(first);
    if (!one_text && !cJSON_IsArray(input))
        return INVALID("input", "'input' must be a string, an array of strings, an array of "
                                "token ids or an array of such arrays");
    if (!one_text && !first) return INVALID("input", "'input' is an empty array");
    const size_t n = one_text || one_ids ? 1 : (size_t)cJSON_GetArraySize(input);
    if (n > MAX_INPUTS)
        return INVALID("input", "'input' has %zu entries; at most %d are allowed", n, MAX_INPUTS);
    r->inputs = serve_calloc(n, sizeof *r->inputs);
    r->n_tokens = serve_calloc(n, sizeof *r->n_tokens);
    if (!r->inputs || !r->n_tokens) return OUT_OF_MEMORY();
    r->n_inputs = n;
    if (one_text) return input_from_text(lim, input->valuestring, 0, r, err);
    if (one_ids) return input_from_ids(lim, input, 0, r, err);
    size_t i = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, input) {
        bool ok = cJSON_IsString(item)  ? input_from_text(lim, item->valuestring, i, r, err)
                  : cJSON_IsArray(item) ? input_from_ids(lim, item, i, r, err)
                                        : INVALID("input",
                                                  "input[%zu] must be a string or an array of "
                                                  "token ids",
                                                  i);
        if (!ok) return false;
        i++;
    }
    return true;
}

bool embed_request_parse(const char *body, size_t len, const embed_limits *lim,
                         embed_request *r, serve_error *err)
{
    memset(r, 0, sizeof *r);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return INVALID(NULL, "the request body must be a JSON object");
    }
    bool ok = true;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(root, "dimensions");
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    const uint32_t n_embd = lim->n_embd;
    r->dimensions = n_embd;
    if (model && !cJSON_IsString(model)) ok = INVALID("model", "'model' must be a string");
    else if (user && !cJSON_IsString(user)) ok = INVALID("user", "'user' must be a string");
    else if (format && !cJSON_IsNull(format) &&
             (!cJSON_IsString(format) ||
              (strcmp(format->valuestring, "float") && strcmp(format->valuestring, "base64"))))
        ok = INVALID("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    else if (dims && !cJSON_IsNull(dims) &&
             (!cJSON_IsNumber(dims) ||
              /* in range before the cast: a larger double to uint32_t is undefined */
              !(dims->valuedouble >= 1 && dims->valuedouble <= (double)UINT32_MAX) ||
              dims->valuedouble != (double)(uint32_t)dims->valuedouble))
        ok = INVALID("dimensions", "'dimensions' must be a positive integer");
    else if (dims && cJSON_IsNumber(dims) && (uint32_t)dims->valuedouble != n_embd &&
             !lim->matryoshka)
        ok = INVALID("dimensions",
                     "this model gives %u dimensions and was not declared to support shorter "
                     "ones (llm-serve --matryoshka)",
                     n_embd);
    else if (dims && cJSON_IsNumber(dims) && (uint32_t)dims->valuedouble > n_embd)
        ok = INVALID("dimensions", "'dimensions' may be at most %u for this model", n_embd);
    if (ok) {
        r->base64 = format && cJSON_IsString(format) && !strcmp(format->valuestring, "base64");
        if (dims && cJSON_IsNumber(dims)) r->dimensions = (uint32_t)dims->valuedouble;
        ok = parse_input(lim, cJSON_GetObjectItemCaseSensitive(root, "input"), r, err);
    }
    cJSON_Delete(root);
    for (size_t i = 0; ok && i < r->n_inputs; i++) {
        if (r->n_tokens[i] > lim->n_ctx) {
            ok = INVALID("input", "input[%zu] has %zu tokens, more than this model's context of %u",
                         i, r->n_tokens[i], lim->n_ctx);
            err->code = "context_length_exceeded";
        }
        r->total_tokens += r->n_tokens[i];
    }
    return ok;
}

