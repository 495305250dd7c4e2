/* The in-process communicator: ranks publish a pointer to their buffer,
 * meet at a barrier, then each reads what it needs from the others. A
 * barrier is a mutex, a condition and a generation count (pthread_barrier_t
 * is optional in POSIX). */
#include "backend/tp/tp.h"

#include <pthread.h>

typedef struct local_comm {
    uint32_t n_ranks;
    pthread_mutex_t lock;
    pthread_cond_t turn;
    uint32_t waiting;
    uint64_t generation;
    const void **bufs; /* [n_ranks]: each rank's buffer of the current collective */
    float *sum;        /* [max_floats]: the all-reduce's result */
    size_t max_floats;
} local_comm;

static void local_free(void *ctx) {
    local_comm *c = ctx;
    if (!c)
        return;
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->turn);
    llmi_free(c->bufs);
    llmi_free_aligned(c->sum);
    llmi_free(c);
}

static llm_status local_barrier(void *ctx, uint32_t rank) {
    local_comm *c = ctx;
    (void)rank;
    if (c->n_ranks == 1)
        return LLM_OK;
    pthread_mutex_lock(&c->lock);
    uint64_t gen = c->generation;
    if (++c->waiting == c->n_ranks) {
        c->waiting = 0;
        c->generation++;
        pthread_cond_broadcast(&c->turn);
    } else {
        while (gen == c->generation)
            pthread_cond_wait(&c->turn, &c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return LLM_OK;
}

/* Sizes are the same on every rank (the contract), so a refused size is
 * refused by all of them before anyone waits: no rank is left at a
 * barrier. */
static llm_status check_rank(const local_comm *c, uint32_t rank, const char *what) {
    if (rank >= c->n_ranks)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "tp communicator: %s from rank %u of %u", what,
                          rank, c->n_ranks);
    return LLM_OK;
}

/* Rank r sums its share of the elements over every rank's buffer into
 * c->sum; after a barrier every rank copies the whole sum back. No third
 * barrier: c->sum is written again only after the next collective's first
 * barrier, which every rank reaches after its copy. */
static llm_status local_all_reduce(void *ctx, uint32_t rank, float *x, size_t n) {
    local_comm *c = ctx;
    LLMI_TRY(check_rank(c, rank, "all-reduce"));
    if (n > c->max_floats)
        return llmi_error(LLM_ERR_LIMIT, "tp communicator, rank %u: all-reduce of %zu floats "
                          "(at most %zu)", rank, n, c->max_floats);
    if (c->n_ranks == 1)
        return LLM_OK;
    c->bufs[rank] = x;
    local_barrier(c, rank);
    size_t begin = n * rank / c->n_ranks, end = n * (rank + 1) / c->n_ranks;
    for (size_t i = begin; i < end; i++) {
        float s = ((const float *)c->bufs[0])[i];
        for (uint32_t r = 1; r < c->n_ranks; r++)
            s += ((const float *)c->bufs[r])[i];
        c->sum[i] = s;
    }
    local_barrier(c, rank);
    memcpy(x, c->sum, n * sizeof *x);
    return LLM_OK;
}

/* The second barrier keeps every source alive until all ranks copied it. */
static llm_status local_all_gather(void *ctx, uint32_t rank, const void *x, size_t bytes,
                                   void *out) {
    local_comm *c = ctx;
    LLMI_TRY(check_rank(c, rank, "all-gather"));
    c->bufs[rank] = x;
    local_barrier(c, rank);
    for (uint32_t r = 0; r < c->n_ranks; r++)
        if ((uint8_t *)out + (size_t)r * bytes != c->bufs[r])
            memcpy((uint8_t *)out + (size_t)r * bytes, c->bufs[r], bytes);
    local_barrier(c, rank);
    return LLM_OK;
}

static llm_status local_broadcast(void *ctx, uint32_t rank, uint32_t root, void *x, size_t bytes) {
    local_comm *c = ctx;
    LLMI_TRY(check_rank(c, rank, "broadcast"));
    if (root >= c->n_ranks)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "tp communicator, rank %u: broadcast from rank %u of %u", rank, root,
                          c->n_ranks);
    c->bufs[rank] = x;
    local_barrier(c, rank);
    if (rank != root)
        memcpy(x, c->bufs[root], bytes);
    local_barrier(c, rank);
    return LLM_OK;
}

static const llmi_tp_comm_ops local_ops = {
    .barrier = local_barrier,
    .all_reduce = local_all_reduce,
    .all_gather = local_all_gather,
    .broadcast = local_broadcast,
    .free = local_free,
};

llm_status llmi_tp_comm_local(uint32_t n_ranks, size_t max_floats, llmi_tp_comm *out) {
    *out = (llmi_tp_comm){0};
    if (n_ranks == 0 || n_ranks > LLMI_TP_MAX)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "tp communicator of %u ranks (1 to %u)",
                          n_ranks, LLMI_TP_MAX);
    local_comm *c = llmi_calloc(1, sizeof *c);
    if (!c)
        return llmi_oom("tensor-parallel communicator");
    c->n_ranks = n_ranks;
    c->max_floats = max_floats;
    c->bufs = llmi_calloc(n_ranks, sizeof *c->bufs);
    c->sum = llmi_malloc_aligned((max_floats ? max_floats : 1) * sizeof *c->sum);
    if (!c->bufs || !c->sum) {
        llmi_free(c->bufs);
        llmi_free_aligned(c->sum);
        llmi_free(c);
        return llmi_oom("tensor-parallel communicator buffers");
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->turn, NULL);
    *out = (llmi_tp_comm){&local_ops, c, n_ranks};
    return LLM_OK;
}
