/* Generation requests run on threads of their own, one per admitted request
 * (at most --max-concurrent), so that libmicrohttpd's few event-loop
 * threads never wait for the engine. A non-streaming request's connection
 * is suspended until its worker has collected the answer; a stream's
 * worker writes server-sent events into a buffer that the connection
 * drains, and the connection is suspended while the buffer is empty.
 * Disconnects are noticed by the worker on a duplicate of the client's
 * socket (generation.c polls it), so a client that leaves cancels its
 * generation within a tenth of a second either way. */
#ifndef LLM_SERVE_WORKER_H
#define LLM_SERVE_WORKER_H

#include <stdbool.h>
#include <sys/types.h>

#include "generation.h"
#include "request.h"
#include "server.h"

struct MHD_Connection;
typedef struct work work;

/* Hands the admitted generation `g` to a new worker thread for `conn`
 * (whose socket is `client_fd`). A non-streaming request's connection is
 * suspended here, inside the access handler; the worker resumes it when
 * the answer is ready. On success the work owns `g` and releases the
 * admission (srv->generating, the active-requests gauge) when it ends.
 * NULL when no thread could be started: `g` is still the caller's. */
work *work_start(server *srv, generation *g, struct MHD_Connection *conn, int client_fd);

/* A non-streaming request's outcome, once its connection is resumed: the
 * JSON body (the caller frees it), or NULL with `err` filled. */
char *work_take_answer(work *w, serve_error *err);

/* The content reader of a stream's response (libmicrohttpd's
 * MHD_ContentReaderCallback): copies buffered bytes, or suspends the
 * connection and returns 0 until the worker has more. */
ssize_t work_stream_reader(void *cls, uint64_t pos, char *buf, size_t max);

/* The connection is done with the work (its request completed, `ok`
 * false when the client left or the transfer failed). The last of the
 * connection and the worker to let go ends the generation. */
void work_release(work *w, bool ok);

#endif
