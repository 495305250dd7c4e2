/* POST /v1/embeddings: OpenAI's request and response shapes over
 * llm_session_embed, run on the engine thread. */
#ifndef LLM_SERVE_EMBEDDINGS_H
#define LLM_SERVE_EMBEDDINGS_H

#include <stddef.h>

#include "request.h"
#include "server.h"

/* Answers the request `body` (`len` bytes): the response JSON (free() it),
 * or NULL with `err` filled (400 for a bad request, 503 when busy or out of
 * memory). */
char *embeddings_handle(server *srv, const char *body, size_t len, serve_error *err);

#endif
