/* Persistent fork/join thread pool; see threadpool.h.
 *
 * Protocol. The caller publishes (fn, ctx), sets `pending` to the number of
 * workers and bumps `gen`. A worker that sees `gen` change runs its share and
 * decrements `pending`; the caller runs share 0 and then waits for `pending`
 * to reach 0. The caller only bumps `gen` again after every worker finished
 * the previous run, so a worker can never miss a generation.
 *
 * Waiting. Workers spin on `gen` for SPIN_NS (a run usually follows the
 * previous one within microseconds during a forward pass), then sleep on a
 * condition variable. Sleepers announce themselves in `sleepers` under the
 * mutex before re-checking `gen`; the caller bumps `gen` before reading
 * `sleepers`. All four accesses are seq_cst, so either the worker sees the new
 * generation or the caller sees the sleeper and broadcasts (under the mutex,
 * so the wake-up cannot fall between the worker's check and its wait). */
#include "backend/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle worker spins before sleeping. Long enough to bridge the
 * single-threaded gaps between the parallel ops of a layer, short enough that
 * a pool waiting for the next token (or an idle session) stops burning CPU. */
#define SPIN_NS 200000
/* Pauses between clock reads while spinning. */
#define SPIN_CHECK 64
/* Pauses the caller spins on `pending` before it starts yielding its CPU,
 * which matters only when there are more threads than cores. */
#define JOIN_SPINS 20000

struct worker {
    llmi_pool *pool;
    int ith;
};

struct llmi_pool {
    /* Everything a run touches lives in one cache line: a worker that sees
     * `gen` change finds fn/ctx in the same line, and the caller polling
     * `pending` needs no other line. */
    alignas(64) atomic_uint gen;
    atomic_int pending;
    atomic_int stop;
    llmi_task_fn fn;
    void *ctx;
    int n;

    alignas(64) atomic_int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t *threads;
    struct worker *workers;
    int started; /* workers actually running (for cleanup after failure) */
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Returns the first generation different from `seen`. */
static unsigned wait_gen(llmi_pool *p, unsigned seen) {
    unsigned g;
    uint64_t deadline = 0;
    for (unsigned i = 1;; i++) {
        g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if (i % SPIN_CHECK == 0) {
            uint64_t t = now_ns();
            if (deadline == 0) {
                deadline = t + SPIN_NS;
            } else if (t >= deadline) {
                break;
            }
        }
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    llmi_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
        p->fn(p->ctx, w->ith, p->n);
        /* Release: the task's writes happen before the caller's return. */
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

/* Publishes a new generation and wakes sleeping workers. */
static void bump(llmi_pool *p) {
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void stop_workers(llmi_pool *p) {
    if (p->started > 0) {
        atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
        bump(p);
        for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    llmi_free(p->threads);
    llmi_free(p->workers);
    llmi_free_aligned(p);
}

llm_status llmi_pool_create(int n_threads, llmi_pool **out) {
    if (!out) return llmi_error(LLM_ERR_INVALID_ARGUMENT, "thread pool: out is NULL");
    *out = NULL;
    if (n_threads < 1 || n_threads > LLMI_POOL_MAX_THREADS)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "thread pool: %d threads (1..%d)",
                          n_threads, LLMI_POOL_MAX_THREADS);
    llmi_pool *p = llmi_malloc_aligned(sizeof *p);
    if (!p) return llmi_oom("thread pool");
    memset(p, 0, sizeof *p);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->sleepers, 0);
    p->n = n_threads;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        llmi_free_aligned(p);
        return llmi_error(LLM_ERR_BACKEND, "thread pool: cannot create a mutex");
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        llmi_free_aligned(p);
        return llmi_error(LLM_ERR_BACKEND, "thread pool: cannot create a condition variable");
    }
    if (n_threads == 1) {
        *out = p;
        return LLM_OK;
    }
    p->threads = llmi_calloc((size_t)n_threads - 1, sizeof *p->threads);
    p->workers = llmi_calloc((size_t)n_threads - 1, sizeof *p->workers);
    if (!p->threads || !p->workers) {
        stop_workers(p);
        return llmi_oom("thread pool");
    }
    /* Workers inherit the creator's signal mask: block everything while
     * creating them so that signals go to the host's threads only. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = 0;
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i + 1;
        rc = pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]);
        if (rc != 0) break;
        p->started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        int started = p->started;
        stop_workers(p);
        return llmi_error(rc == EAGAIN ? LLM_ERR_OUT_OF_MEMORY : LLM_ERR_BACKEND,
                          "thread pool: cannot start worker %d of %d (error %d)", started + 1,
                          n_threads - 1, rc);
    }
    *out = p;
    return LLM_OK;
}

void llmi_pool_free(llmi_pool *pool) {
    if (pool) stop_workers(pool);
}

int llmi_pool_size(const llmi_pool *pool) {
    return pool ? pool->n : 1;
}

void llmi_pool_run(llmi_pool *p, llmi_task_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    /* Plain stores: the seq_cst bump in bump() releases them, and workers
     * read them only after acquiring the new generation. */
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    bump(p);
    fn(ctx, 0, p->n);
    for (unsigned i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++) {
        if (i < JOIN_SPINS) {
            cpu_relax();
        } else {
            sched_yield();
        }
    }
}
