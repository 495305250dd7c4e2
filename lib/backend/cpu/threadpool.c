/* Persistent fork/join thread pool; see threadpool.h.
 *
 * Protocol. A run publishes (fn, ctx) and then one 64-bit word `state`
 * holding the run's generation (high bits) and the next unclaimed share
 * (low SHARE_BITS). The caller runs share 0 itself. Workers that see a new
 * generation claim shares 1..n-1 with a CAS on `state`, run them and count
 * them in `done`; the caller, after its own share, claims what is left too
 * and then waits for `done` to reach n - 1. Claiming instead of a fixed
 * thread-to-share mapping means that a worker the OS has not scheduled yet
 * (a loaded machine, more threads than cores) delays nothing: whoever is
 * running takes its share. A claim compares the generation as well, so a
 * worker that wakes up late cannot take a share of a later run; and a
 * claimed share pins its run (the caller waits for it), so fn and ctx read
 * after a successful claim are that run's.
 *
 * Waiting. Workers spin on `state` (a run usually follows the previous one
 * within microseconds during a forward pass): first with pause only, then
 * yielding the CPU between checks, and after SPIN_NS they sleep on a
 * condition variable. Sleepers announce themselves in `sleepers` under the
 * mutex before re-checking `state`; the caller stores `state` before reading
 * `sleepers`. All four accesses are seq_cst, so either the worker sees the
 * new generation or the caller sees the sleeper and broadcasts (under the
 * mutex, so the wake-up cannot fall between the worker's check and its
 * wait). */
#include "backend/cpu/threadpool.h"

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

/* Share index bits of `state`; the generation gets the other 48, so it
 * cannot wrap around under a stalled worker. */
#define SHARE_BITS 16
#define SHARE_MASK ((UINT64_C(1) << SHARE_BITS) - 1)

/* How long an idle worker polls before sleeping: long enough to bridge the
 * single-threaded gaps between the parallel ops of a layer, short enough
 * that a pool waiting for the next token (or an idle session) stops burning
 * CPU. The first SPIN_PAUSE_NS only pause; after that each poll also yields,
 * which costs little latency but hands the core to threads that have work
 * when there are more threads than cores. */
#define SPIN_PAUSE_NS 30000
#define SPIN_NS 300000
/* Polls between clock reads. */
#define SPIN_CHECK 32

struct llmi_pool {
    /* Everything a run touches lives in one cache line: a worker that sees
     * `state` change finds fn/ctx in the same line, and the caller polling
     * `done` needs no other line. */
    alignas(64) _Atomic uint64_t state;
    atomic_int done;
    atomic_int stop;
    llmi_task_fn fn;
    void *ctx;
    int n;

    alignas(64) atomic_int sleepers;
    uint64_t gen; /* the caller's copy of the current generation */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t *threads;
    int started; /* workers actually running (for cleanup after failure) */
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Waits for a generation other than `seen` and returns it. */
static uint64_t wait_gen(llmi_pool *p, uint64_t seen) {
    uint64_t g, t0 = 0;
    for (unsigned i = 1;; i++) {
        g = atomic_load_explicit(&p->state, memory_order_acquire) >> SHARE_BITS;
        if (g != seen)
            return g;
        cpu_relax();
        if (i % SPIN_CHECK == 0) {
            uint64_t t = now_ns();
            if (t0 == 0)
                t0 = t;
            if (t - t0 >= SPIN_NS)
                break;
            if (t - t0 >= SPIN_PAUSE_NS)
                sched_yield();
        }
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while ((g = atomic_load(&p->state) >> SHARE_BITS) == seen)
        pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

/* Claims and runs the unclaimed shares of generation `gen`. */
static void run_shares(llmi_pool *p, uint64_t gen) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if (s >> SHARE_BITS != gen || (s & SHARE_MASK) >= (uint64_t)p->n)
            return;
        if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acquire,
                                                  memory_order_acquire)) {
            p->fn(p->ctx, (int)(s & SHARE_MASK), p->n);
            /* Release: the share's writes happen before the caller returns. */
            atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
            s = atomic_load_explicit(&p->state, memory_order_acquire);
        }
    }
}

static void *worker_main(void *arg) {
    llmi_pool *p = arg;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed))
            break;
        run_shares(p, seen);
    }
    return NULL;
}

/* Starts generation p->gen + 1 with shares from `first` on, and wakes
 * sleeping workers. */
static void publish(llmi_pool *p, uint64_t first) {
    p->gen++;
    atomic_store(&p->state, p->gen << SHARE_BITS | first);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void stop_workers(llmi_pool *p) {
    if (p->started > 0) {
        atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
        publish(p, (uint64_t)p->n); /* nothing to claim: workers see stop */
        for (int i = 0; i < p->started; i++)
            pthread_join(p->threads[i], NULL);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    llmi_free(p->threads);
    llmi_free_aligned(p);
}

llm_status llmi_pool_create(int n_threads, llmi_pool **out) {
    if (!out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "thread pool: out is NULL");
    *out = NULL;
    if (n_threads < 1 || n_threads > LLMI_POOL_MAX_THREADS)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "thread pool: %d threads (1..%d)", n_threads,
                          LLMI_POOL_MAX_THREADS);
    llmi_pool *p = llmi_malloc_aligned(sizeof *p);
    if (!p)
        return llmi_oom("thread pool");
    memset(p, 0, sizeof *p);
    atomic_init(&p->state, 0);
    atomic_init(&p->done, 0);
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
    if (!p->threads) {
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
        rc = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (rc != 0)
            break;
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
    if (pool)
        stop_workers(pool);
}

int llmi_pool_size(const llmi_pool *pool) { return pool ? pool->n : 1; }

void llmi_pool_run(llmi_pool *p, llmi_task_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    /* Plain stores: the seq_cst store of `state` releases them, and workers
     * read them only after a claim that acquired it. */
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    publish(p, 1); /* share 0 is the caller's */
    fn(ctx, 0, p->n);
    run_shares(p, p->gen);
    /* Only shares that other threads are running remain. */
    const int want = p->n - 1;
    uint64_t t0 = 0;
    for (unsigned i = 1; atomic_load_explicit(&p->done, memory_order_acquire) != want; i++) {
        cpu_relax();
        if (i % SPIN_CHECK == 0) {
            uint64_t t = now_ns();
            if (t0 == 0)
                t0 = t;
            if (t - t0 >= SPIN_PAUSE_NS)
                sched_yield();
        }
    }
}
