/* Persistent thread pool for the CPU backend.
 *
 * A pool of n threads counts the caller: n - 1 workers are started once and
 * parked between runs. llmi_pool_run() is the fork/join primitive of the
 * forward pass (about ten per layer per token), so a run is one atomic
 * atomic store seen by spinning workers; workers that stay idle for a while
 * fall back to sleeping on a condition variable, so an idle pool costs no
 * CPU.
 *
 * A pool is driven by one thread at a time (a session), and tasks must not
 * call llmi_pool_run() on the pool that runs them. */
#ifndef LLMI_THREADPOOL_H
#define LLMI_THREADPOOL_H

#include "core/core.h"

typedef struct llmi_pool llmi_pool;

/* One share of a run: called with ith = 0..nth-1, ith 0 on the caller. */
typedef void (*llmi_task_fn)(void *ctx, int ith, int nth);

/* Starts n_threads - 1 workers (1 <= n_threads <= LLMI_POOL_MAX_THREADS).
 * n_threads == 1 starts no thread: runs execute inline. Workers block every
 * signal so that the host's handlers only ever run on the host's threads. */
#define LLMI_POOL_MAX_THREADS 1024
llm_status llmi_pool_create(int n_threads, llmi_pool **out);

/* Stops and joins the workers. NULL is a no-op. */
void llmi_pool_free(llmi_pool *pool);

/* Threads of a run, the caller included; 1 for a NULL pool. */
int llmi_pool_size(const llmi_pool *pool);

/* Runs fn(ctx, ith, n) exactly once for every ith in 0..n-1 and returns when
 * all have returned; everything the tasks wrote is visible to the caller
 * afterwards. The caller runs ith 0; the other shares go to whichever
 * threads claim them first (usually one each, but the caller or a fast
 * worker takes the share of a worker the OS has not scheduled), so tasks may
 * key scratch memory by ith but must not assume a thread identity.
 * A NULL pool runs fn(ctx, 0, 1) inline. */
void llmi_pool_run(llmi_pool *pool, llmi_task_fn fn, void *ctx);

#endif
