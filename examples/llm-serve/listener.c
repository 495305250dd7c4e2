#include "listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"

struct listener {
    int fd;
    int wake[2]; /* a byte on wake[1] stops the thread */
    pthread_t thread;
    bool running;
    struct MHD_Daemon *daemon;
    atomic_int *open_connections;
    int max_connections;
    metrics *metrics;
};

#define FULL_BODY                                                                                  \
    "{\"error\":{\"message\":\"the server has too many open connections; retry later\","           \
    "\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_connections\"}}"
/* Sent whole, without reading the request: the answer does not depend on it. */
static const char FULL_RESPONSE[] = "HTTP/1.1 503 Service Unavailable\r\n"
                                    "Content-Type: application/json\r\n"
                                    "Retry-After: 1\r\n"
                                    "Connection: close\r\n"
                                    "Content-Length: %zu\r\n\r\n%s";

static void refuse(int fd) {
    char text[512];
    int n = snprintf(text, sizeof text, FULL_RESPONSE, sizeof FULL_BODY - 1, FULL_BODY);
    /* Never blocks: a client that does not read gets what fits. */
    if (n > 0)
        (void)send(fd, text, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    close(fd);
}

static void pause_ms(long ms) { nanosleep(&(struct timespec){0, ms * 1000000L}, NULL); }

static void *accept_loop(void *arg) {
    listener *l = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = l->fd, .events = POLLIN},
                              {.fd = l->wake[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        struct sockaddr_storage addr;
        socklen_t len = sizeof addr;
        int fd = accept4(l->fd, (struct sockaddr *)&addr, &len, SOCK_CLOEXEC);
        if (fd < 0) {
            /* Out of descriptors: wait for some to close rather than spin. */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                pause_ms(10);
            continue;
        }
        /* The count is kept by libmicrohttpd's threads as they take
         * connections in, so a burst can pass the cap by the few not yet
         * counted. */
        if (atomic_load(l->open_connections) >= l->max_connections) {
            refuse(fd);
            metrics_count_refused_connection(l->metrics);
            continue;
        }
        /* Closes the socket itself when it refuses it (per-IP limit). */
        MHD_add_connection(l->daemon, fd, (struct sockaddr *)&addr, len);
    }
    return NULL;
}

listener *listener_open(const char *host, uint16_t port, uint16_t *bound_port) {
    struct addrinfo hints = {0}, *addr = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
    char port_text[8];
    snprintf(port_text, sizeof port_text, "%u", port);
    int rc = getaddrinfo(host, port_text, &hints, &addr);
    if (rc) {
        fprintf(stderr, "llm-serve: cannot resolve host '%s': %s\n", host, gai_strerror(rc));
        return NULL;
    }
    listener *l = serve_calloc(1, sizeof *l);
    if (!l) {
        freeaddrinfo(addr);
        fprintf(stderr, "llm-serve: out of memory at startup\n");
        return NULL;
    }
    l->wake[0] = l->wake[1] = -1;
    l->fd = socket(addr->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    bool ok = l->fd >= 0 && !setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) &&
              !bind(l->fd, addr->ai_addr, addr->ai_addrlen) && !listen(l->fd, 1024) &&
              !pipe2(l->wake, O_CLOEXEC);
    freeaddrinfo(addr);
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    if (ok && !getsockname(l->fd, (struct sockaddr *)&bound, &blen)) {
        *bound_port = bound.ss_family == AF_INET6
                          ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                          : ntohs(((struct sockaddr_in *)&bound)->sin_port);
    } else {
        fprintf(stderr, "llm-serve: cannot listen on %s:%u: %s\n", host, port, strerror(errno));
        listener_close(l);
        return NULL;
    }
    return l;
}

bool listener_run(listener *l, struct MHD_Daemon *daemon, atomic_int *open_connections,
                  int max_connections, metrics *counters) {
    l->daemon = daemon;
    l->open_connections = open_connections;
    l->max_connections = max_connections;
    l->metrics = counters;
    l->running = pthread_create(&l->thread, NULL, accept_loop, l) == 0;
    if (!l->running)
        fprintf(stderr, "llm-serve: cannot start the accepting thread\n");
    return l->running;
}

void listener_close(listener *l) {
    if (!l)
        return;
    if (l->running) {
        (void)!write(l->wake[1], "x", 1);
        pthread_join(l->thread, NULL);
    }
    if (l->fd >= 0)
        close(l->fd);
    if (l->wake[0] >= 0)
        close(l->wake[0]);
    if (l->wake[1] >= 0)
        close(l->wake[1]);
    free(l);
}
