#include "worker.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"

#define STREAM_CHUNK 4096
/* A stream's bytes waiting for a slow client; the worker waits when it is
 * full. Allocated before the stream starts, so a stream never fails for
 * lack of memory here, and a client that stops reading costs no more. */
#define STREAM_BUFFER (64 * 1024)

struct work {
    pthread_mutex_t lock;
    pthread_cond_t room; /* the stream buffer has room, or the connection ended */
    int refs;            /* the connection's and the worker's */
    server *srv;
    generation *g; /* NULL once ended */
    struct MHD_Connection *conn;
    int client_fd; /* the worker's own duplicate of the client's socket */
    bool streaming;
    bool suspended;     /* the connection waits for the worker to resume it */
    bool done;          /* the worker has finished */
    bool connection_ok; /* how the connection's request completed */
    bool released;      /* the connection is done with the work */
    /* non-streaming: the outcome */
    char *answer;
    serve_error err;
    /* streaming: bytes [off, len) of buf are not yet taken by the connection */
    char *buf;
    size_t len, off;
    bool stream_failed; /* the stream ended with an error (the client left) */
};

/* Whether the connection waits to be resumed; the flag is cleared under
 * the lock and the caller resumes after unlocking, so this thread never
 * holds the work's lock inside libmicrohttpd (whose threads take it
 * inside theirs). The connection stays suspended until then, so its
 * reader cannot run and suspend it again in between. */
static bool take_suspended_locked(work *w) {
    bool was = w->suspended;
    w->suspended = false;
    return was;
}

/* Ends the generation and the admission; called once, by the last owner. */
static void finish(work *w) {
    server *srv = w->srv;
    if (w->g)
        generation_end(w->g, w->connection_ok && !w->stream_failed);
    metrics_adjust_active(srv->metrics, -1);
    atomic_fetch_sub(&srv->generating, 1);
    if (w->client_fd >= 0)
        close(w->client_fd);
    free(w->answer);
    free(w->buf);
    pthread_cond_destroy(&w->room);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

static void drop(work *w) {
    pthread_mutex_lock(&w->lock);
    bool last = --w->refs == 0;
    pthread_mutex_unlock(&w->lock);
    if (last)
        finish(w);
}

static void collect(work *w) {
    serve_error err;
    char *answer = generation_collect(w->g, &err);
    generation_end(w->g, answer != NULL);
    pthread_mutex_lock(&w->lock);
    w->g = NULL;
    w->answer = answer;
    if (!answer)
        w->err = err;
    w->done = true;
    bool resume = take_suspended_locked(w);
    pthread_mutex_unlock(&w->lock);
    if (resume)
        MHD_resume_connection(w->conn);
}

/* Appends `n` bytes (at most STREAM_CHUNK) for the connection, waiting
 * while the buffer is full; false when the connection ended meanwhile. */
static bool append_locked(work *w, const char *data, size_t n) {
    for (;;) {
        if (w->released)
            return false;
        if (w->off) {
            memmove(w->buf, w->buf + w->off, w->len - w->off);
            w->len -= w->off;
            w->off = 0;
        }
        if (STREAM_BUFFER - w->len >= n)
            break;
        pthread_cond_wait(&w->room, &w->lock);
    }
    memcpy(w->buf + w->len, data, n);
    w->len += n;
    return true;
}

static void stream(work *w) {
    char chunk[STREAM_CHUNK];
    for (;;) {
        ssize_t n = generation_stream_read(w->g, chunk, sizeof chunk);
        pthread_mutex_lock(&w->lock);
        bool stop = n <= 0 || !append_locked(w, chunk, (size_t)n);
        if (stop) {
            w->done = true;
            w->stream_failed = n != 0;
        }
        bool resume = take_suspended_locked(w);
        pthread_mutex_unlock(&w->lock);
        if (resume)
            MHD_resume_connection(w->conn);
        if (stop)
            return;
    }
}

static void *run(void *arg) {
    work *w = arg;
    if (w->streaming)
        stream(w);
    else
        collect(w);
    drop(w);
    return NULL;
}

work *work_start(server *srv, generation *g, struct MHD_Connection *conn, int client_fd) {
    work *w = serve_calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->streaming = generation_streams(g);
    if (w->streaming && !(w->buf = serve_malloc(STREAM_BUFFER))) {
        free(w);
        return NULL;
    }
    if (pthread_mutex_init(&w->lock, NULL)) {
        free(w->buf);
        free(w);
        return NULL;
    }
    if (pthread_cond_init(&w->room, NULL)) {
        pthread_mutex_destroy(&w->lock);
        free(w->buf);
        free(w);
        return NULL;
    }
    w->refs = 2;
    w->srv = srv;
    w->g = g;
    w->conn = conn;
    w->client_fd = client_fd >= 0 ? dup(client_fd) : -1;
    generation_set_client_fd(g, w->client_fd);
    pthread_attr_t attr;
    pthread_t thread;
    bool started = false;
    pthread_mutex_lock(&w->lock);
    if (!pthread_attr_init(&attr)) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&thread, &attr, run, w) == 0;
        pthread_attr_destroy(&attr);
    }
    if (started && !w->streaming) {
        /* Under the lock, so the worker cannot resume before this. */
        MHD_suspend_connection(conn);
        w->suspended = true;
    }
    pthread_mutex_unlock(&w->lock);
    if (!started) {
        generation_set_client_fd(g, client_fd);
        if (w->client_fd >= 0)
            close(w->client_fd);
        pthread_cond_destroy(&w->room);
        pthread_mutex_destroy(&w->lock);
        free(w->buf);
        free(w);
        return NULL;
    }
    return w;
}

char *work_take_answer(work *w, serve_error *err) {
    pthread_mutex_lock(&w->lock);
    char *answer = w->answer;
    w->answer = NULL;
    if (!answer)
        *err = w->err;
    pthread_mutex_unlock(&w->lock);
    return answer;
}

ssize_t work_stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    work *w = cls;
    ssize_t ret;
    pthread_mutex_lock(&w->lock);
    if (w->off < w->len) {
        size_t n = w->len - w->off;
        if (n > max)
            n = max;
        memcpy(buf, w->buf + w->off, n);
        w->off += n;
        ret = (ssize_t)n;
        pthread_cond_signal(&w->room);
    } else if (w->done) {
        ret =
            w->stream_failed ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        /* Nothing to send yet: the worker resumes the connection when it
         * has more, so no event-loop thread waits here. */
        MHD_suspend_connection(w->conn);
        w->suspended = true;
        ret = 0;
    }
    pthread_mutex_unlock(&w->lock);
    return ret;
}

void work_release(work *w, bool ok) {
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->connection_ok = ok;
    w->released = true;
    pthread_cond_signal(&w->room); /* a worker waiting for room stops */
    /* A stream whose connection ended early (the client left, or stopped
     * reading until the idle timeout): shutting the socket down makes the
     * worker's next check see the client gone, which cancels the
     * generation instead of computing tokens nobody reads. */
    if (!w->done && w->client_fd >= 0)
        shutdown(w->client_fd, SHUT_RDWR);
    pthread_mutex_unlock(&w->lock);
    drop(w);
}
