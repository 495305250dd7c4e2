/* The tp backend's table: instances hold one CPU thread pool per rank, KV
 * stores one CPU KV store per rank (its heads' slice of every row), steps
 * one CPU step per rank, run concurrently by one thread per rank, meeting
 * at the gathers of the step's hooks (backend/cpu/cpu.h). */
#include "backend/tp/tp.h"
#include "backend/cpu/cpu.h"
#include "backend/tp/shard.h"
#include "kv/kv.h"

#include <pthread.h>

typedef struct tp_instance {
    uint32_t n_ranks;
    void *pool[LLMI_TP_MAX];
} tp_instance;

static void tp_close(void *backend) {
    tp_instance *inst = backend;
    if (!inst)
        return;
    for (uint32_t r = 0; r < inst->n_ranks; r++)
        llmi_backend_cpu.close(inst->pool[r]);
    llmi_free(inst);
}

/* Each rank's pool gets an equal share of the threads, at least one. */
static llm_status tp_open(const llmi_backend_config *cfg, uint32_t n_ranks, void **out) {
    *out = NULL;
    if (cfg->device != 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "the tp backend runs CPU ranks: device 0 only, not %d", (int)cfg->device);
    tp_instance *inst = llmi_calloc(1, sizeof *inst);
    if (!inst)
        return llmi_oom("tensor-parallel instance");
    llmi_backend_config rank_cfg = *cfg;
    rank_cfg.n_threads = cfg->n_threads / n_ranks ? cfg->n_threads / n_ranks : 1;
    for (uint32_t r = 0; r < n_ranks; r++) {
        llm_status st = llmi_backend_cpu.open(&rank_cfg, &inst->pool[r]);
        if (st != LLM_OK) {
            tp_close(inst);
            return st;
        }
        inst->n_ranks = r + 1;
    }
    *out = inst;
    return LLM_OK;
}

static llm_status tp_weights_load(const llm_model *m, int32_t device, uint32_t n_ranks,
                                  void **out) {
    *out = NULL;
    if (device != 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "the tp backend runs CPU ranks: device 0 only, not %d", (int)device);
    return llmi_tp_weights_create(m, n_ranks, (llmi_tp_weights **)out);
}

static void tp_weights_free(void *weights) { llmi_tp_weights_free(weights); }

/* ---- KV: rank r holds KV heads [kv0, kv0 + n_kv) of every slot ---- */

typedef struct tp_kv {
    uint32_t n_ranks, n_head_kv, head_dim;
    size_t head_bytes; /* one head's part of a slot's row (llmi_kv_row_bytes) */
    llmi_cpu_kv *rank[LLMI_TP_MAX];
    uint32_t kv0[LLMI_TP_MAX], n_kv[LLMI_TP_MAX];
} tp_kv;

static void tp_kv_free(void *ctx) {
    tp_kv *kv = ctx;
    if (!kv)
        return;
    for (uint32_t r = 0; r < kv->n_ranks; r++)
        llmi_backend_cpu.kv_free(kv->rank[r]);
    llmi_free(kv);
}

static llm_status tp_kv_create(void *backend, const llmi_kv_layout *layout, void **out) {
    const tp_instance *inst = backend;
    *out = NULL;
    const uint32_t n = inst->n_ranks, hd = layout->head_dim;
    if (hd == 0 || layout->kv_dim % hd)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "tp KV store: kv_dim %u is not a whole number of heads of %u",
                          layout->kv_dim, hd);
    const uint32_t n_head_kv = layout->kv_dim / hd;
    if (n_head_kv % n && n % n_head_kv)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "tp KV store: %u KV heads neither split in %u nor replicate to %u",
                          n_head_kv, n, n);
    tp_kv *kv = llmi_calloc(1, sizeof *kv);
    if (!kv)
        return llmi_oom("tensor-parallel KV store");
    kv->n_head_kv = n_head_kv;
    kv->head_dim = hd;
    kv->head_bytes = llmi_kv_row_bytes(layout->type, hd);
    for (uint32_t r = 0; r < n; r++) {
        llmi_tp_split_heads(n_head_kv, n, r, &kv->kv0[r], &kv->n_kv[r]);
        llmi_kv_layout rank_layout = *layout;
        rank_layout.kv_dim = kv->n_kv[r] * hd;
        void *store;
        llm_status st = llmi_backend_cpu.kv_create(inst->pool[r], &rank_layout, &store);
        if (st != LLM_OK) {
            tp_kv_free(kv);
            return st;
        }
        kv->rank[r] = store;
        kv->n_ranks = r + 1;
    }
    *out = kv;
    return LLM_OK;
}

static llm_status tp_kv_copy(void *ctx, uint32_t dst, uint32_t src, uint32_t n_slots) {
    tp_kv *kv = ctx;
    for (uint32_t r = 0; r < kv->n_ranks; r++)
        LLMI_TRY(llmi_backend_cpu.kv_copy(kv->rank[r], dst, src, n_slots));
    return LLM_OK;
}

/* Rows of the full kv_dim assemble each head from the first rank holding
 * it; writes go to every rank holding it. */
static llm_status tp_kv_read(void *ctx, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                             void *dst) {
    const tp_kv *kv = ctx;
    const size_t head_bytes = kv->head_bytes;
    uint8_t *out = dst;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t h = 0; h < kv->n_head_kv; h++) {
            const uint32_t r = llmi_tp_kv_owner(kv->n_head_kv, kv->n_ranks, h);
            memcpy(out + ((size_t)i * kv->n_head_kv + h) * head_bytes,
                   llmi_cpu_kv_row(kv->rank[r], layer, v, slot + i) +
                       (size_t)(h - kv->kv0[r]) * head_bytes,
                   head_bytes);
        }
    return LLM_OK;
}

static llm_status tp_kv_write(void *ctx, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                              const void *src) {
    const tp_kv *kv = ctx;
    const size_t head_bytes = kv->head_bytes;
    const uint8_t *in = src;
    for (uint32_t r = 0; r < kv->n_ranks; r++)
        for (uint32_t i = 0; i < n; i++)
            memcpy(llmi_cpu_kv_row(kv->rank[r], layer, v, slot + i),
                   in + ((size_t)i * kv->n_head_kv + kv->kv0[r]) * head_bytes,
                   kv->n_kv[r] * head_bytes);
    return LLM_OK;
}

/* ---- steps ---- */

typedef struct tp_step tp_step;

typedef struct tp_rank {
    tp_step *owner;
    uint32_t rank;
    void *step;    /* the rank's CPU step */
    float *logits; /* [max_rows][its vocabulary rows] */
    /* The gather's packed slices: what this rank sends and what it gets. */
    float *send; /* [max_rows][chunk] */
    float *recv; /* [n_ranks][max_rows][chunk] */
    llm_status status;
    char error[256]; /* the rank thread's message when status is not LLM_OK */
} tp_rank;

struct tp_step {
    uint32_t n_ranks, n_vocab;
    uint32_t chunk; /* the widest slice of any gathered dimension */
    const llmi_tp_weights *w;
    llmi_tp_comm comm;
    tp_rank rank[LLMI_TP_MAX];
    /* The step being run, for the rank threads. */
    tp_kv *kv;
    llmi_step st;
    const atomic_int *interrupt; /* read by rank 0 only */
    /* step_run_hidden: where rank 0 writes the hidden states (every rank
     * holds the whole rows after the last layer); NULL for logits. */
    float *hidden;
    /* Rank threads 1 .. n_ranks - 1 wait for a new generation. */
    pthread_t thread[LLMI_TP_MAX];
    uint32_t n_threads;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    uint64_t generation;
    uint32_t n_done;
    bool quit;
};

/* The collectives have one size per call on every rank: slices are padded
 * to s->chunk, the widest, and unpacked into whole rows. */
static llm_status rank_gather(void *ctx, const float *x, uint32_t n_rows, uint32_t full,
                              float *out) {
    tp_rank *rk = ctx;
    tp_step *s = rk->owner;
    const uint32_t n = s->n_ranks;
    const uint32_t chunk = (uint32_t)(((uint64_t)full + n - 1) / n);
    if (chunk > s->chunk)
        return llmi_error(LLM_ERR_LIMIT, "tp step, rank %u: a gather of %u-wide rows (at most %u)",
                          rk->rank, full, s->chunk * n);
    uint32_t c0, c1;
    llmi_tp_slice(full, n, rk->rank, &c0, &c1);
    const uint32_t w = c1 - c0;
    for (uint32_t i = 0; i < n_rows; i++)
        memcpy(rk->send + (size_t)i * chunk, x + (size_t)i * w, w * sizeof *x);
    const size_t per_rank = (size_t)n_rows * chunk;
    LLMI_TRY(s->comm.ops->all_gather(s->comm.ctx, rk->rank, rk->send, per_rank * sizeof(float),
                                     rk->recv));
    for (uint32_t r = 0; r < n; r++) {
        llmi_tp_slice(full, n, r, &c0, &c1);
        for (uint32_t i = 0; i < n_rows; i++)
            memcpy(out + (size_t)i * full + c0, rk->recv + r * per_rank + (size_t)i * chunk,
                   (c1 - c0) * sizeof *out);
    }
    return LLM_OK;
}

/* Rank 0 reads the interrupt flag and shares what it saw, so every rank
 * stops at the same layer (a rank stopping alone would leave the others
 * waiting at the next gather). */
static llm_status rank_layer_begin(void *ctx, uint32_t layer) {
    tp_rank *rk = ctx;
    tp_step *s = rk->owner;
    int32_t stop = 0;
    if (rk->rank == 0 && s->interrupt)
        stop = atomic_load_explicit(s->interrupt, memory_order_relaxed) != 0;
    LLMI_TRY(s->comm.ops->broadcast(s->comm.ctx, rk->rank, 0, &stop, sizeof stop));
    if (stop)
        return llmi_error(LLM_ERR_CANCELLED, "interrupted (llm_session_interrupt) at layer %u",
                          layer);
    return LLM_OK;
}

static void rank_run(tp_rank *rk) {
    tp_step *s = rk->owner;
    void *kv = s->kv->rank[rk->rank];
    rk->status =
        s->hidden ? llmi_cpu_step_run_hidden(rk->step, kv, &s->st, rk->rank == 0 ? s->hidden : NULL)
                  : llmi_cpu_step_run(rk->step, kv, &s->st, rk->logits);
    if (rk->status != LLM_OK)
        snprintf(rk->error, sizeof rk->error, "%s", llmi_error_message());
}

static void *rank_thread(void *arg) {
    tp_rank *rk = arg;
    tp_step *s = rk->owner;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->quit && s->generation == seen)
            pthread_cond_wait(&s->wake, &s->lock);
        if (s->quit) {
            pthread_mutex_unlock(&s->lock);
            return NULL;
        }
        seen = s->generation;
        pthread_mutex_unlock(&s->lock);
        rank_run(rk);
        pthread_mutex_lock(&s->lock);
        s->n_done++;
        pthread_cond_signal(&s->done);
        pthread_mutex_unlock(&s->lock);
    }
}

static void tp_step_free(void *ctx) {
    tp_step *s = ctx;
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->quit = true;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    for (uint32_t t = 0; t < s->n_threads; t++)
        pthread_join(s->thread[t], NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->wake);
    pthread_cond_destroy(&s->done);
    for (uint32_t r = 0; r < s->n_ranks; r++) {
        llmi_cpu_step_free(s->rank[r].step);
        llmi_free_aligned(s->rank[r].logits);
        llmi_free_aligned(s->rank[r].send);
        llmi_free_aligned(s->rank[r].recv);
    }
    if (s->comm.ops)
        s->comm.ops->free(s->comm.ctx);
    llmi_free(s);
}

static float *alloc_floats(size_t a, size_t b) {
    size_t ab, n;
    if (!llmi_mul_ok(a, b, &ab) || !llmi_mul_ok(ab, sizeof(float), &n))
        return NULL;
    return llmi_malloc_aligned(n ? n : 1);
}

/* Rank r's CPU step, its hooks, and its logits and gather buffers. */
static llm_status rank_create(tp_step *s, tp_instance *inst, const llm_model *m, uint32_t r,
                              uint32_t max_rows, uint32_t max_ctx) {
    const llmi_tp_weights *w = s->w;
    tp_rank *rk = &s->rank[r];
    *rk = (tp_rank){.owner = s, .rank = r};
    s->n_ranks = r + 1;
    LLMI_TRY(
        llmi_cpu_step_create(inst->pool[r], &w->shard[r], w->cpu[r], max_rows, max_ctx, &rk->step));
    if (w->n_ranks > 1) {
        const llmi_hparams *hp = &m->hp;
        const llmi_cpu_tp_hooks hooks = {.ctx = rk,
                                         .gather = rank_gather,
                                         .layer_begin = rank_layer_begin,
                                         .q_dim = hp->n_head * hp->head_dim,
                                         .n_ff = hp->n_ff,
                                         .kv_dim = hp->n_head_kv * hp->head_dim,
                                         .q_begin = r * w->shard[r].hp.n_head * hp->head_dim,
                                         .kv_begin = w->kv0[r] * hp->head_dim,
                                         .ff_begin = w->ff0[r],
                                         .embd_begin = w->embd0[r]};
        LLMI_TRY(llmi_cpu_step_set_tp(rk->step, &hooks));
        rk->send = alloc_floats(max_rows, s->chunk);
        rk->recv = alloc_floats((size_t)max_rows * w->n_ranks, s->chunk);
        if (!rk->send || !rk->recv)
            return llmi_oom("tensor-parallel gather buffers");
    }
    if (!(rk->logits = alloc_floats(max_rows, w->shard[r].hp.n_vocab)))
        return llmi_oom("tensor-parallel logits");
    return LLM_OK;
}

static llm_status tp_step_create(void *backend, const llm_model *m, void *weights,
                                 uint32_t max_rows, uint32_t max_ctx, void **out) {
    tp_instance *inst = backend;
    const llmi_tp_weights *w = weights;
    *out = NULL;
    if (w->n_ranks != inst->n_ranks)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "tp step: weights of %u ranks on an instance of %u", w->n_ranks,
                          inst->n_ranks);
    tp_step *s = llmi_calloc(1, sizeof *s);
    if (!s)
        return llmi_oom("tensor-parallel step");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->done, NULL);
    s->w = w;
    s->n_vocab = m->hp.n_vocab;
    uint32_t widest = m->hp.n_head * m->hp.head_dim;
    widest = m->hp.n_ff > widest ? m->hp.n_ff : widest;
    widest = m->hp.n_embd > widest ? m->hp.n_embd : widest;
    s->chunk = (widest + w->n_ranks - 1) / w->n_ranks;
    size_t gather_bytes = 0;
    llm_status st =
        llmi_mul_ok((size_t)max_rows * s->chunk, sizeof(float), &gather_bytes)
            ? llmi_tp_comm_local(w->n_ranks, 0, gather_bytes, &s->comm)
            : llmi_error(LLM_ERR_LIMIT, "tp step: %u rows per step is too many", max_rows);
    for (uint32_t r = 0; st == LLM_OK && r < w->n_ranks; r++)
        st = rank_create(s, inst, m, r, max_rows, max_ctx);
    for (uint32_t r = 1; st == LLM_OK && r < w->n_ranks; r++) {
        if (pthread_create(&s->thread[r - 1], NULL, rank_thread, &s->rank[r]) != 0)
            st = llmi_error(LLM_ERR_BACKEND, "tp step: cannot start the thread of rank %u", r);
        else
            s->n_threads = r;
    }
    if (st != LLM_OK) {
        tp_step_free(s);
        return st;
    }
    *out = s;
    return LLM_OK;
}

static void tp_step_set_f32_activations(void *ctx, bool on) {
    tp_step *s = ctx;
    for (uint32_t r = 0; r < s->n_ranks; r++)
        llmi_cpu_step_set_f32_activations(s->rank[r].step, on);
}

/* Every rank runs the step; an interrupt stops all of them at the same
 * layer (rank_layer_begin). With `hidden`, rank 0 writes the hidden states
 * there and no logits are made. */
static llm_status tp_run(void *ctx, void *kv_store, const llmi_step *st, float *logits,
                         float *hidden) {
    tp_step *s = ctx;
    s->kv = kv_store;
    s->hidden = hidden;
    s->st = *st;
    s->interrupt = st->interrupt;
    s->st.interrupt = s->n_ranks == 1 ? st->interrupt : NULL;
    /* LoRA scratch now, on this thread: a rank failing to allocate in the
     * step would leave the others waiting at its next gather. */
    for (uint32_t r = 0; r < s->n_ranks; r++)
        LLMI_TRY(llmi_cpu_step_lora_reserve(s->rank[r].step, st));
    pthread_mutex_lock(&s->lock);
    s->n_done = 0;
    s->generation++;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    rank_run(&s->rank[0]);
    pthread_mutex_lock(&s->lock);
    while (s->n_done < s->n_ranks - 1)
        pthread_cond_wait(&s->done, &s->lock);
    pthread_mutex_unlock(&s->lock);
    if (s->rank[0].status != LLM_OK)
        return s->rank[0].status; /* its message is this thread's */
    for (uint32_t r = 1; r < s->n_ranks; r++)
        if (s->rank[r].status != LLM_OK)
            return llmi_error(s->rank[r].status, "rank %u: %s", r, s->rank[r].error);
    if (hidden)
        return LLM_OK;
    /* Vocab-parallel output: each wanted row gathers its ranks' slices. */
    for (uint32_t i = 0; i < st->n_logits; i++)
        for (uint32_t r = 0; r < s->n_ranks; r++) {
            const uint32_t nv = s->w->shard[r].hp.n_vocab;
            memcpy(logits + (size_t)i * s->n_vocab + s->w->vocab0[r],
                   s->rank[r].logits + (size_t)i * nv, nv * sizeof *logits);
        }
    return LLM_OK;
}

static llm_status tp_step_run(void *ctx, void *kv_store, const llmi_step *st, float *logits) {
    return tp_run(ctx, kv_store, st, logits, NULL);
}

static llm_status tp_step_run_hidden(void *ctx, void *kv_store, const llmi_step *st,
                                     float *hidden) {
    return tp_run(ctx, kv_store, st, NULL, hidden);
}

#ifdef LLMI_TEST_HOOKS
llmi_tp_comm *llmi_tp_step_comm(void *step) { return &((tp_step *)step)->comm; }
#endif

static llm_status tp_sync(void *backend) {
    (void)backend;
    return LLM_OK;
}

/* One table per size: weights_load and open learn the size from it. */
#define TP_TABLE(N)                                                                                \
    static llm_status tp_open_##N(const llmi_backend_config *cfg, void **out) {                    \
        return tp_open(cfg, N, out);                                                               \
    }                                                                                              \
    static llm_status tp_weights_load_##N(const llm_model *m, int32_t device, void **out) {        \
        return tp_weights_load(m, device, N, out);                                                 \
    }
TP_TABLE(1)
TP_TABLE(2)
TP_TABLE(3)
TP_TABLE(4)
TP_TABLE(5)
TP_TABLE(6)
TP_TABLE(7)
TP_TABLE(8)
#undef TP_TABLE

#define TP_OPS(N)                                                                                  \
    {                                                                                              \
        .version = LLMI_BACKEND_VERSION, .name = "tp", .open = tp_open_##N, .close = tp_close,     \
        .weights_load = tp_weights_load_##N, .weights_free = tp_weights_free,                      \
        .kv_create = tp_kv_create, .kv_free = tp_kv_free, .kv_copy = tp_kv_copy,                   \
        .kv_read = tp_kv_read, .kv_write = tp_kv_write, .step_create = tp_step_create,             \
        .step_free = tp_step_free, .step_run = tp_step_run, .sync = tp_sync,                       \
        .step_set_f32_activations = tp_step_set_f32_activations,                                   \
        .step_run_hidden = tp_step_run_hidden, .lora = true,                                       \
    }
static const llmi_backend_ops tp_tables[LLMI_TP_MAX] = {TP_OPS(1), TP_OPS(2), TP_OPS(3), TP_OPS(4),
                                                        TP_OPS(5), TP_OPS(6), TP_OPS(7), TP_OPS(8)};
#undef TP_OPS

const llmi_backend_ops *llmi_backend_tp(uint32_t n_ranks) {
    return n_ranks >= 1 && n_ranks <= LLMI_TP_MAX ? &tp_tables[n_ranks - 1] : NULL;
}
