#include "embeddings.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "embed_request.h"
#include "json_out.h"

static char *base64_floats(const float *v, size_t n)
{
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t bytes = n * sizeof *v;
    unsigned char *in = serve_malloc(bytes ? bytes : 1);
    char *out = serve_malloc((bytes + 2) / 3 * 4 + 1);
    if (!in || !out) {
        free(in);
        free(out);
        return NULL;
    }
    /* Little-endian float32, as OpenAI's clients decode them. */
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof u);
        for (int b = 0; b < 4; b++) in[4 * i + (size_t)b] = (unsigned char)(u >> (8 * b));
    }
    size_t o = 0;
    for (size_t i = 0; i < bytes; i += 3) {
        uint32_t w = (uint32_t)in[i] << 16;
        if (i + 1 < bytes) w |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < bytes) w |= in[i + 2];
        out[o++] = digits[(w >> 18) & 63];
        out[o++] = digits[(w >> 12) & 63];
        out[o++] = i + 1 < bytes ? digits[(w >> 6) & 63] : '=';
        out[o++] = i + 2 < bytes ? digits[w & 63] : '=';
    }
    out[o] = '\0';
    free(in);
    return out;
}

/* Keeps the first `dims` of each vector and scales it back to unit length
 * (Matryoshka embeddings are trained so that a prefix works on its own). */
static void truncate_vectors(float *v, size_t n, uint32_t n_embd, uint32_t dims)
{
    for (size_t i = 0; i < n; i++) {
        const float *src = v + i * n_embd;
        float *dst = v + i * dims;
        double ss = 0;
        for (uint32_t k = 0; k < dims; k++) ss += (double)src[k] * src[k];
        const float scale = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (uint32_t k = 0; k < dims; k++) dst[k] = src[k] * scale;
    }
}

static char *build_response(const server *srv, const embed_request *r, const float *vectors)
{
    bool ok = true;
    cJSON *root = cJSON_CreateObject();
    put_string(root, "object", "list", &ok);
    cJSON *data = put_array(root, "data", &ok);
    for (size_t i = 0; i < r->n_inputs && ok; i++) {
        const float *v = vectors + i * r->dimensions;
        cJSON *item = cJSON_CreateObject();
        push_item(data, item, &ok);
        put_string(item, "object", "embedding", &ok);
        put_number(item, "index", (double)i, &ok);
        if (r->base64) {
            char *text = base64_floats(v, r->dimensions);
            if (!text) ok = false;
            put_string(item, "embedding", text ? text : "", &ok);
            free(text);
        } else {
            cJSON *arr = put_array(item, "embedding", &ok);
            for (uint32_t k = 0; k < r->dimensions && ok; k++)
                push_item(arr, cJSON_CreateNumber(v[k]), &ok);
        }
    }
    put_string(root, "model", srv->model_name, &ok);
    cJSON *usage = put_object(root, "usage", &ok);
    put_number(usage, "prompt_tokens", (double)r->total_tokens, &ok);
    put_number(usage, "total_tokens", (double)r->total_tokens, &ok);
    char *body = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return body;
}

/* The library's failure as an HTTP error. */
static void embed_error(llm_status st, const char *msg, serve_error *err)
{
    switch (st) {
    case LLM_ERR_INVALID_ARGUMENT:
    case LLM_ERR_UNSUPPORTED:
        serve_error_set(err, 400, "invalid_request_error", "input", "%s", msg);
        break;
    case LLM_ERR_OUT_OF_MEMORY:
        serve_error_out_of_memory(err, "while computing embeddings");
        break;
    case LLM_ERR_LIMIT:
        /* The inputs fit the context (checked): the KV pool is busy. */
        serve_error_set(err, 503, "server_error", NULL, "%s; retry later", msg);
        break;
    default:
        serve_error_set(err, st == LLM_ERR_CANCELLED ? 503 : 500, "server_error", NULL, "%s", msg);
        break;
    }
}

char *embeddings_handle(server *srv, const char *body, size_t len, serve_error *err)
{
    const embed_limits lim = {.model = srv->model, .n_vocab = srv->info.n_vocab,
                              .n_embd = srv->info.n_embd, .n_ctx = srv->n_ctx,
                              .matryoshka = srv->matryoshka};
    embed_request r;
    char *out = NULL;
    float *vectors = NULL;
    if (!embed_request_parse(body, len, &lim, &r, err)) goto done;
    llm_embed_params ep;
    llm_embed_params_init(&ep);
    llm_pooling pooling = LLM_POOLING_MEAN;
    llm_status st = llm_model_pooling(srv->model, &pooling);
    if (st != LLM_OK) {
        serve_error_set(err, 400, "invalid_request_error", "model", "%s", llm_last_error());
        goto done;
    }
    /* One vector per input: a model whose file asks for none is averaged. */
    ep.pooling = pooling == LLM_POOLING_NONE ? LLM_POOLING_MEAN : LLM_POOLING_MODEL;
    ep.normalize = true;
    const size_t n_floats = r.n_inputs * srv->info.n_embd;
    vectors = serve_malloc(n_floats * sizeof *vectors);
    if (!vectors) {
        serve_error_out_of_memory(err, "while computing embeddings");
        goto done;
    }
    char msg[256] = "";
    st = engine_embed(srv->engine, (const llm_token *const *)r.inputs, r.n_tokens, r.n_inputs,
                      &ep, vectors, n_floats, msg, sizeof msg);
    if (st != LLM_OK) {
        embed_error(st, msg, err);
        goto done;
    }
    if (r.dimensions < srv->info.n_embd)
        truncate_vectors(vectors, r.n_inputs, srv->info.n_embd, r.dimensions);
    out = build_response(srv, &r, vectors);
    if (!out) serve_error_out_of_memory(err, "while building the response");
done:
    free(vectors);
    embed_request_free(&r);
    return out;
}
