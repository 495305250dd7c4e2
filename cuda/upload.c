/* The host side of the weight upload (upload.h): cutting the tensors into
 * staging buffers and filling each buffer with several threads. */
#include "upload.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum {
    /* Below this a buffer is filled by the calling thread alone: starting
     * threads would cost more than they save. */
    UPLOAD_PARALLEL_MIN = 4u << 20,
    UPLOAD_THREADS_MAX = 16,
};

typedef struct fill_job {
    char *buffer;
    const llmi_upload_item *items;
    const llmi_upload_seg *segs;
    const size_t *item_of; /* the item each segment comes from */
    size_t n_segs;
    size_t begin, end; /* this job's bytes of the buffer */
} fill_job;

/* Copies the job's byte range of the buffer from the segments' sources. */
static void *fill(void *arg) {
    const fill_job *j = arg;
    for (size_t i = 0; i < j->n_segs; i++) {
        const llmi_upload_seg *s = &j->segs[i];
        size_t lo = s->staged > j->begin ? s->staged : j->begin;
        size_t hi = s->staged + s->bytes < j->end ? s->staged + s->bytes : j->end;
        if (lo >= hi)
            continue;
        const llmi_upload_item *it = &j->items[j->item_of[i]];
        /* The segment starts at item byte s->dst - it->dst. */
        const char *src = (const char *)it->src + (s->dst - it->dst) + (lo - s->staged);
        memcpy(j->buffer + lo, src, hi - lo);
    }
    return NULL;
}

/* Fills `used` bytes of the buffer: the calling thread takes the first
 * share, started threads the others; a thread that cannot be started has
 * its share done here. */
static void fill_parallel(fill_job base, size_t used, unsigned n_threads) {
    if (n_threads > UPLOAD_THREADS_MAX)
        n_threads = UPLOAD_THREADS_MAX;
    if (n_threads < 2 || used < UPLOAD_PARALLEL_MIN) {
        base.begin = 0;
        base.end = used;
        fill(&base);
        return;
    }
    fill_job jobs[UPLOAD_THREADS_MAX];
    pthread_t tids[UPLOAD_THREADS_MAX];
    bool started[UPLOAD_THREADS_MAX] = {false};
    for (unsigned t = 0; t < n_threads; t++) {
        jobs[t] = base;
        /* Shares end on 4 KiB boundaries so no two threads touch a page. */
        size_t b = used / n_threads * t, e = t + 1 == n_threads ? used : used / n_threads * (t + 1);
        jobs[t].begin = t == 0 ? 0 : b - b % 4096;
        jobs[t].end = t + 1 == n_threads ? e : e - e % 4096;
    }
    for (unsigned t = 1; t < n_threads; t++)
        started[t] = pthread_create(&tids[t], NULL, fill, &jobs[t]) == 0;
    fill(&jobs[0]);
    for (unsigned t = 1; t < n_threads; t++) {
        if (started[t])
            pthread_join(tids[t], NULL);
        else
            fill(&jobs[t]);
    }
}

llm_status llmi_upload_run(const llmi_upload_item *items, size_t n_items, char *const *buffers,
                           unsigned n_buffers, size_t buffer_bytes, unsigned n_threads,
                           const llmi_upload_ops *ops) {
    if (n_items == 0)
        return LLM_OK;
    if (n_buffers == 0 || buffer_bytes == 0)
        return LLM_ERR_INVALID_ARGUMENT;
    /* A buffer holds at most one segment per item (plus none: an item split
     * over buffers has one piece in each). */
    llmi_upload_seg *segs = malloc(n_items * sizeof *segs);
    size_t *item_of = malloc(n_items * sizeof *item_of);
    if (!segs || !item_of) {
        free(segs);
        free(item_of);
        return LLM_ERR_OUT_OF_MEMORY;
    }
    llm_status st = LLM_OK;
    size_t item = 0, done = 0; /* the next byte: item `item`, its byte `done` */
    for (unsigned slot = 0; st == LLM_OK && item < n_items; slot = (slot + 1) % n_buffers) {
        size_t used = 0, n = 0;
        while (item < n_items && used < buffer_bytes) {
            size_t take = items[item].bytes - done;
            if (take > buffer_bytes - used)
                take = buffer_bytes - used;
            if (take) {
                segs[n] =
                    (llmi_upload_seg){.staged = used, .dst = items[item].dst + done, .bytes = take};
                item_of[n++] = item;
                used += take;
                done += take;
            }
            if (done == items[item].bytes) {
                item++;
                done = 0;
            }
        }
        if (n == 0)
            break;
        if ((st = ops->wait(ops->ctx, slot)) != LLM_OK)
            break;
        fill_parallel((fill_job){.buffer = buffers[slot],
                                 .items = items,
                                 .segs = segs,
                                 .item_of = item_of,
                                 .n_segs = n},
                      used, n_threads);
        st = ops->send(ops->ctx, slot, buffers[slot], segs, n);
    }
    free(segs);
    free(item_of);
    return st;
}
