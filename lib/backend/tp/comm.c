/* The in-process communicator: ranks publish a pointer to their buffer,
 * meet at a barrier, then each reads what it needs from the others. A
 * barrier is a mutex, a condition and a generation count (pthread_barrier_t
 * is optional in POSIX). */
#include "backend/tp/tp.h"

#include <pthread.h>

struct llmi_tp_comm {
    uint32_t n_ranks;
    pthread_mutex_t lock;
    pthread_cond_t turn;
    uint32_t waiting;
    uint64_t generation;
    const float **bufs; /* [n_ranks]: each rank's buffer of the current collective */
    float *sum;         /* [max_floats]: the all-reduce's result */
    size_t max_floats;
};

llm_status llmi_tp_comm_create(uint32_t n_ranks, size_t max_floats, llmi_tp_comm **out) {
    *out = NULL;
    llmi_tp_comm *c = llmi_calloc(1, sizeof *c);
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
    *out = c;
    return LLM_OK;
}

void llmi_tp_comm_free(llmi_tp_comm *c) {
    if (!c)
        return;
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->turn);
    llmi_free(c->bufs);
    llmi_free_aligned(c->sum);
    llmi_free(c);
}

void llmi_tp_barrier(llmi_tp_comm *c) {
    if (c->n_ranks == 1)
        return;
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
}

/* Rank r sums its share of the elements over every rank's buffer into
 * c->sum; after a barrier every rank copies the whole sum back. No third
 * barrier: c->sum is written again only after the next collective's first
 * barrier, which every rank reaches after its copy. */
void llmi_tp_all_reduce(llmi_tp_comm *c, uint32_t rank, float *x, size_t n) {
    if (c->n_ranks == 1)
        return;
    c->bufs[rank] = x;
    llmi_tp_barrier(c);
    size_t begin = n * rank / c->n_ranks, end = n * (rank + 1) / c->n_ranks;
    for (size_t i = begin; i < end; i++) {
        float s = c->bufs[0][i];
        for (uint32_t r = 1; r < c->n_ranks; r++)
            s += c->bufs[r][i];
        c->sum[i] = s;
    }
    llmi_tp_barrier(c);
    memcpy(x, c->sum, n * sizeof *x);
}

void llmi_tp_all_gather(llmi_tp_comm *c, uint32_t rank, const float *x, size_t n, float *out) {
    c->bufs[rank] = x;
    llmi_tp_barrier(c);
    for (uint32_t r = 0; r < c->n_ranks; r++)
        memcpy(out + r * n, c->bufs[r], n * sizeof *out);
    llmi_tp_barrier(c);
}

void llmi_tp_broadcast(llmi_tp_comm *c, uint32_t rank, uint32_t root, float *x, size_t n) {
    c->bufs[rank] = x;
    llmi_tp_barrier(c);
    if (rank != root)
        memcpy(x, c->bufs[root], n * sizeof *x);
    llmi_tp_barrier(c);
}
