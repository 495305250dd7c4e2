/* libmicrohttpd front end: routing, authentication, limits, responses. */
#ifndef LLM_SERVE_HTTP_H
#define LLM_SERVE_HTTP_H

#include <stdint.h>

#include "server.h"

struct MHD_Daemon;

/* Listens on host:port (port 0 picks one); returns the bound port in
 * `*bound_port`, or NULL with a message on stderr. */
struct MHD_Daemon *http_start(server *srv, const char *host, uint16_t port,
                              uint16_t *bound_port);
/* Stops accepting connections; those open go on. */
void http_quiesce(struct MHD_Daemon *d);
void http_stop(struct MHD_Daemon *d);

#endif
