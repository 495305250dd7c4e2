/* One completion request from parsed JSON to response bytes: prompt
 * rendering, submission, and turning job events into OpenAI JSON. */
#ifndef LLM_SERVE_GENERATION_H
#define LLM_SERVE_GENERATION_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "request.h"
#include "server.h"

typedef struct generation generation;

/* Parses, renders and submits; NULL with `err` filled on failure. */
generation *generation_start(server *srv, const char *body, size_t len, bool chat,
                             serve_error *err);
bool generation_streams(const generation *g);
/* Socket of the client, polled to notice a hang-up while waiting. */
void generation_set_client_fd(generation *g, int fd);
/* Waits for the whole answer; returns the JSON body (caller frees), or NULL
 * with `err` when the request failed or the client left. */
char *generation_collect(generation *g, serve_error *err);
/* Server-sent events for a streaming request: copies up to `max` bytes to
 * `buf`; returns 0 at the end, -1 when the client left or the server stops. */
ssize_t generation_stream_read(generation *g, char *buf, size_t max);
/* Cancels the request if it still runs, records metrics, frees. */
void generation_end(generation *g, bool completed);

#endif
