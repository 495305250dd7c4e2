/* libFuzzer target: /v1/embeddings request JSON -> token inputs
 * (embed_request.c). There is no model, so text inputs fail to tokenize
 * (400); token-id inputs, the input shapes and the other fields go all the
 * way through. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embed_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const embed_limits lim = {.model = NULL, .n_vocab = 49152, .n_embd = 576, .n_ctx = 64,
                              .matryoshka = data[0] & 1};
    embed_request req;
    serve_error err;
    if (!embed_request_parse((const char *)data + 1, size - 1, &lim, &req, &err)) {
        if ((err.http_status != 400 && err.http_status != 503) || !err.message[0] ||
            strlen(err.param) >= sizeof err.param)
            abort();
        embed_request_free(&req);
        return 0;
    }
    if (req.n_inputs < 1 || req.n_inputs > 2048 || req.dimensions < 1 ||
        req.dimensions > lim.n_embd || (!lim.matryoshka && req.dimensions != lim.n_embd))
        abort();
    size_t total = 0;
    for (size_t i = 0; i < req.n_inputs; i++) {
        if (req.n_tokens[i] < 1 || req.n_tokens[i] > lim.n_ctx) abort();
        for (size_t t = 0; t < req.n_tokens[i]; t++)
            if (req.inputs[i][t] < 0 || (uint32_t)req.inputs[i][t] >= lim.n_vocab) abort();
        total += req.n_tokens[i];
    }
    if (total != req.total_tokens) abort();
    embed_request_free(&req);
    return 0;
}
