/* libmicrohttpd front end: routing, authentication, limits, responses. */
#ifndef LLM_SERVE_HTTP_H
#define LLM_SERVE_HTTP_H

#include <stdint.h>

#include "server.h"

typedef struct http_server http_server;

/* Listens on host:port (port 0 picks one) and serves on libmicrohttpd's
 * event loops: srv->http_threads threads, connections idle for
 * srv->idle_timeout seconds closed (unfinished headers or body, or
 * between keep-alive requests), at most srv->max_connections open (more
 * get a fast 503) and srv->max_connections_per_ip from one address (0:
 * no limit; more are closed at once). Returns the bound port in
 * `*bound_port`, or NULL with a message on stderr. */
http_server *http_start(server *srv, const char *host, uint16_t port, uint16_t *bound_port);
/* Stops accepting connections; those open go on. */
void http_quiesce(http_server *h);
/* Closes every connection; no generation may still be running. */
void http_stop(http_server *h);

#endif
