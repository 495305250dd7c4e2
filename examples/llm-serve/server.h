/* State shared by the HTTP threads. */
#ifndef LLM_SERVE_SERVER_H
#define LLM_SERVE_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "engine.h"
#include "llm.h"
#include "metrics.h"
#include "request.h"
#include "structured.h"

/* A LoRA adapter served under its own model name (--lora NAME=PATH). */
typedef struct serve_lora {
    const char *name;
    llm_adapter *adapter;
} serve_lora;
#define SERVE_MAX_LORAS 32

typedef struct server {
    llm_model *model;
    /* --lora: a request whose "model" is one of these names runs with its
     * adapter; with any of them, a name that is neither these nor
     * model_name is refused (404 model_not_found). */
    serve_lora loras[SERVE_MAX_LORAS];
    size_t n_loras;
    llm_session *session;
    llm_model_info info;
    engine *engine;
    metrics *metrics;
    const char *model_name;
    char fingerprint[32]; /* "llminfer-VERSION", system_fingerprint of responses */
    const char *api_key; /* NULL: no authentication */
    const char *device_name; /* the backend the session runs on (device.h) */
    uint32_t tensor_parallel;
    uint32_t n_ctx;
    /* Tokens the KV pool holds (blocks x block size), and the most one
     * sequence (prompt + output) can hold: the smaller of the context and
     * the pool. The default max_tokens is what is left of it after the
     * prompt, capped by limits.max_tokens_limit. */
    uint64_t kv_pool_tokens;
    uint32_t max_sequence_tokens;
    serve_limits limits;
    int max_concurrent;
    size_t max_body_bytes;
    /* The connection layer (http.h) */
    int max_connections;
    int max_connections_per_ip; /* 0: no limit */
    int idle_timeout;           /* seconds */
    int http_threads;
    atomic_int open_connections;
    int verbose;
    /* --matryoshka: the model's embeddings keep their meaning when cut
     * short, so /v1/embeddings takes 'dimensions' below n_embd. */
    bool matryoshka;
    /* --chat-template: Jinja text used instead of the model's; NULL: the model's. */
    const char *chat_template;
    grammar_cache *grammars; /* response_format and tool-call grammars */
    atomic_int generating; /* generation requests admitted now */
    atomic_bool draining;  /* shutting down: refuse new work */
} server;

/* The adapter a request's "model" names: NULL for the base model (no
 * name, or model_name); *unknown when the server has adapters and the
 * name is none of them. */
static inline const serve_lora *serve_find_lora(const server *srv, const char *model,
                                                bool *unknown) {
    *unknown = false;
    if (!model || !srv->n_loras)
        return NULL;
    for (size_t i = 0; i < srv->n_loras; i++)
        if (!strcmp(srv->loras[i].name, model))
            return &srv->loras[i];
    *unknown = strcmp(model, srv->model_name) != 0;
    return NULL;
}

#endif
