/* The in-process communicator: ranks meet at a barrier, then each reads
 * what it needs from the others. A barrier is a mutex, a condition and a
 * generation count (pthread_barrier_t is optional in POSIX).
 *
 * All-gathers and broadcasts take one barrier: each rank copies its part
 * into a staging slot of its own, meets the others, then copies what it
 * needs out. Slots alternate between two sets, one collective to the next:
 * a rank writes set k % 2 again only at collective k + 2, after the barrier
 * of k + 1, which every rank reaches only once it has read set k. */
#include "backend/tp/tp.h"

#include <pthread.h>

typedef struct local_comm {
    uint32_t n_ranks;
    pthread_mutex_t lock;
    pthread_cond_t turn;
    uint32_t waiting;
    uint64_t generation;
    const void **bufs; /* [n_ranks]: each rank's buffer of the current all-reduce */
    float *sum;        /* [max_floats]: the all-reduce's result */
    size_t max_floats;
    uint8_t *stage; /* [2][n_ranks][max_bytes]: the staging slots */
    size_t max_bytes;
    uint32_t turn_of[LLMI_TP_MAX]; /* each rank's next slot set (0 or 1) */
} local_comm;

static void local_free(void *ctx) {
    local_comm *c = ctx;
    if (!c)
        return;
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->turn);
    llmi_free(c->bufs);
    llmi_free_aligned(c->sum);
    llmi_free_aligned(c->stage);
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
        return llmi_error(LLM_ERR_LIMIT,
                          "tp communicator, rank %u: all-reduce of %zu floats "
                          "(at most %zu)",
                          rank, n, c->max_floats);
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

/* Rank `rank`'s staging slot in its current set, after a size check. */
static llm_status stage_slot(local_comm *c, uint32_t rank, size_t bytes, const char *what,
                             uint8_t **slot, uint32_t *set) {
    LLMI_TRY(check_rank(c, rank, what));
    if (bytes > c->max_bytes)
        return llmi_error(LLM_ERR_LIMIT, "tp communicator, rank %u: %s of %zu bytes (at most %zu)",
                          rank, what, bytes, c->max_bytes);
    *set = c->turn_of[rank];
    c->turn_of[rank] ^= 1;
    *slot = c->stage + ((size_t)*set * c->n_ranks + rank) * c->max_bytes;
    return LLM_OK;
}

static llm_status local_all_gather(void *ctx, uint32_t rank, const void *x, size_t bytes,
                                   void *out) {
    local_comm *c = ctx;
    uint8_t *slot = NULL;
    uint32_t set = 0;
    LLMI_TRY(stage_slot(c, rank, bytes, "all-gather", &slot, &set));
    memcpy(slot, x, bytes);
    local_barrier(c, rank);
    const uint8_t *base = c->stage + (size_t)set * c->n_ranks * c->max_bytes;
    for (uint32_t r = 0; r < c->n_ranks; r++)
        memcpy((uint8_t *)out + (size_t)r * bytes, base + (size_t)r * c->max_bytes, bytes);
    return LLM_OK;
}

static llm_status local_broadcast(void *ctx, uint32_t rank, uint32_t root, void *x, size_t bytes) {
    local_comm *c = ctx;
    if (root >= c->n_ranks)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "tp communicator, rank %u: broadcast from rank %u of %u", rank, root,
                          c->n_ranks);
    uint8_t *slot = NULL;
    uint32_t set = 0;
    LLMI_TRY(stage_slot(c, rank, bytes, "broadcast", &slot, &set));
    if (rank == root)
        memcpy(slot, x, bytes);
    local_barrier(c, rank);
    if (rank != root)
        memcpy(x, c->stage + ((size_t)set * c->n_ranks + root) * c->max_bytes, bytes);
    return LLM_OK;
}

static const llmi_tp_comm_ops local_ops = {
    .barrier = local_barrier,
    .all_reduce = local_all_reduce,
    .all_gather = local_all_gather,
    .broadcast = local_broadcast,
    .free = local_free,
};

llm_status llmi_tp_comm_local(uint32_t n_ranks, size_t max_floats, size_t max_bytes,
                              llmi_tp_comm *out) {
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
    c->max_bytes = (max_bytes + 63) & ~(size_t)63; /* slots on their own cache lines */
    size_t floats_bytes, stage_bytes;
    if (c->max_bytes < max_bytes ||
        !llmi_mul_ok(max_floats ? max_floats : 1, sizeof(float), &floats_bytes) ||
        !llmi_mul_ok((size_t)2 * n_ranks, c->max_bytes ? c->max_bytes : 64, &stage_bytes)) {
        llmi_free(c->bufs);
        llmi_free(c);
        return llmi_error(LLM_ERR_LIMIT, "tp communicator buffers of %zu floats, %zu bytes",
                          max_floats, max_bytes);
    }
    c->sum = llmi_malloc_aligned(floats_bytes);
    c->stage = llmi_malloc_aligned(stage_bytes);
    if (!c->bufs || !c->sum || !c->stage) {
        llmi_free(c->bufs);
        llmi_free_aligned(c->sum);
        llmi_free_aligned(c->stage);
        llmi_free(c);
        return llmi_oom("tensor-parallel communicator buffers");
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->turn, NULL);
    *out = (llmi_tp_comm){&local_ops, c, n_ranks};
    return LLM_OK;
}
