/* State shared by the HTTP threads. */
#ifndef LLM_SERVE_SERVER_H
#define LLM_SERVE_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "engine.h"
#include "llm.h"
#include "metrics.h"
#include "request.h"

typedef struct server {
    llm_model *model;
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
    serve_limits limits;
    int max_concurrent;
    size_t max_body_bytes;
    int verbose;
    atomic_int generating; /* generation requests admitted now */
    atomic_bool draining;  /* shutting down: refuse new work */
} server;

#endif
