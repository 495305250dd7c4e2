/* The accepting side of llm-serve: its own listening socket and thread.
 * Each accepted connection is handed to libmicrohttpd (MHD_add_connection),
 * which parses and answers it on its event-loop threads; a connection that
 * would take the server past its global cap is answered at once with a
 * fixed 503 and closed, so a flood of idle connections costs the clients
 * who come later a refusal, not a hang. */
#ifndef LLM_SERVE_LISTENER_H
#define LLM_SERVE_LISTENER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "metrics.h"

struct MHD_Daemon;
typedef struct listener listener;

/* Binds host:port (port 0 picks one) and listens; the bound port goes to
 * `*bound_port`. Accepting starts with listener_run. NULL with a message
 * on stderr on failure. */
listener *listener_open(const char *host, uint16_t port, uint16_t *bound_port);
/* Starts the accepting thread: connections go to `daemon` while
 * `*open_connections` is below `max_connections`. false when the thread
 * cannot start. */
bool listener_run(listener *l, struct MHD_Daemon *daemon, atomic_int *open_connections,
                  int max_connections, metrics *counters);
/* Stops accepting and closes the socket; NULL is a no-op. */
void listener_close(listener *l);

#endif
