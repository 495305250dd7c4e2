/* A tensor-parallel group of GPUs as one backend table (tp.h): what the
 * core gets from the CUDA table's `group` entry. One host thread drives
 * every rank: it issues a phase of the step (step.c) on each rank's stream
 * in turn, then the all-reduce of every rank's partial hout inside one
 * NCCL group call, and so on, so no rank thread can be left waiting on
 * another. Waiting (sync, logits, K/V reads) goes through llmi_nccl_wait
 * with a time-out (LLM_NCCL_TIMEOUT_MS, default 60 s): an NCCL error or a
 * collective that does not finish aborts the group's communicators and
 * fails with LLM_ERR_BACKEND naming the rank; every later call on the
 * group fails at once with the same message (a new session makes a new
 * group). CUDA graphs are off in a group. */
#include "tp.h"
#include "cuda_backend.h"
#include "nccl_comm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS LLMI_CUDA_TP_MAX
#define DEFAULT_TIMEOUT_MS 60000u

const llmi_backend_ops *llmi_cuda_table(void); /* backend.c */

/* An instance: the ranks' instances and communicators. */
typedef struct tp_inst {
    uint32_t n;
    int32_t devices[MAX_RANKS];
    llmi_cuda_instance *rank[MAX_RANKS];
    llmi_nccl_comm *comm[MAX_RANKS];
    uint32_t timeout_ms;
    bool failed;
    char failure[512]; /* the first failure's message */
} tp_inst;

typedef struct tp_weights {
    uint32_t n;
    llmi_cuda_tp_rank rank[MAX_RANKS]; /* the rank models (hp, shapes) */
    llmi_cuda_weights *w[MAX_RANKS];
    uint32_t n_vocab;
} tp_weights;

typedef struct tp_kv {
    tp_inst *g;
    uint32_t n_head_kv;
    size_t head_bytes;
    uint32_t kv0[MAX_RANKS], n_kv[MAX_RANKS];
    llmi_cuda_kv *rank[MAX_RANKS];
    void *rows; /* a rank's rows, on the host */
    size_t rows_cap;
} tp_kv;

typedef struct tp_step {
    tp_inst *g;
    const tp_weights *w;
    llmi_cuda_step *rank[MAX_RANKS];
    uint32_t logit_rows; /* rows of logits per pass, on every rank */
    float *slice;        /* a rank's logits of one pass, on the host */
} tp_step;

/* ---- failures ---- */

/* Records the group's first failure (the message llmi_cuda_error left)
 * and aborts every communicator whose stream has not finished, so no rank
 * is left waiting on a peer that is gone. Returns it as LLM_ERR_BACKEND. */
static llm_status group_fail(tp_inst *g, llm_status st, uint32_t failed_rank) {
    if (!g->failed) {
        g->failed = true;
        snprintf(g->failure, sizeof g->failure, "%s", llmi_cuda_last_message());
        for (uint32_t r = 0; r < g->n; r++)
            if (r != failed_rank && g->comm[r] && g->rank[r]) {
                cudaSetDevice(g->devices[r]);
                llmi_nccl_wait(g->comm[r], g->rank[r]->stream, 0);
            }
    }
    return llmi_cuda_error(st == LLM_OK ? LLM_ERR_BACKEND : st, "%s", g->failure);
}

static llm_status check_healthy(const tp_inst *g) {
    if (!g->failed)
        return LLM_OK;
    return llmi_cuda_error(LLM_ERR_BACKEND,
                           "this tensor-parallel group failed earlier and was aborted (%s); "
                           "create a new session",
                           g->failure);
}

/* Waits for every rank's stream, each within the time-out. */
static llm_status wait_all(tp_inst *g) {
    LLMI_TRY(check_healthy(g));
    for (uint32_t r = 0; r < g->n; r++) {
        llm_status st = llmi_cuda_use_device(g->devices[r]);
        if (st == LLM_OK)
            st = llmi_nccl_wait(g->comm[r], g->rank[r]->stream, g->timeout_ms);
        if (st != LLM_OK)
            return group_fail(g, st, r);
    }
    return LLM_OK;
}

/* ---- instance ---- */

static uint32_t timeout_from_env(void) {
    const char *s = getenv("LLM_NCCL_TIMEOUT_MS");
    if (!s || !*s)
        return DEFAULT_TIMEOUT_MS;
    char *end = NULL;
    unsigned long v = strtoul(s, &end, 10);
    if (!end || *end || v == 0 || v > UINT32_MAX) {
        llmi_cuda_log(LLM_LOG_WARN, "LLM_NCCL_TIMEOUT_MS='%s' is not a number of ms; using %u", s,
                      DEFAULT_TIMEOUT_MS);
        return DEFAULT_TIMEOUT_MS;
    }
    return (uint32_t)v;
}

static void tp_close(void *backend) {
    tp_inst *g = backend;
    if (!g)
        return;
    /* A collective still in flight would block the instances' stream
     * synchronisation: let it finish within the time-out, else abort. */
    if (!g->failed && g->comm[0]) /* the communicators come all at once, after the ranks */
        wait_all(g);
    for (uint32_t r = 0; r < g->n; r++)
        llmi_nccl_comm_free(g->comm[r]);
    const llmi_backend_ops *cu = llmi_cuda_table();
    for (uint32_t r = 0; r < g->n; r++)
        cu->close(g->rank[r]);
    free(g);
}

typedef struct tp_group {
    uint32_t n;
    int32_t devices[MAX_RANKS];
    llmi_backend_ops ops;
} tp_group;

static llm_status tp_open(const tp_group *grp, const llmi_backend_config *cfg, void **out) {
    *out = NULL;
    if (cfg->device != 0)
        return llmi_cuda_error(LLM_ERR_INVALID_ARGUMENT,
                               "a CUDA tensor-parallel group is opened as device 0, not %d",
                               (int)cfg->device);
    tp_inst *g = calloc(1, sizeof *g);
    if (!g)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: tensor-parallel group");
    g->n = grp->n;
    memcpy(g->devices, grp->devices, sizeof g->devices);
    g->timeout_ms = timeout_from_env();
    const llmi_backend_ops *cu = llmi_cuda_table();
    llm_status st = LLM_OK;
    for (uint32_t r = 0; r < g->n && st == LLM_OK; r++) {
        llmi_backend_config c = *cfg;
        c.device = g->devices[r];
        st = cu->open(&c, (void **)&g->rank[r]);
    }
    if (st == LLM_OK)
        st = llmi_nccl_comm_init_all(g->n, g->devices, g->comm);
    if (st != LLM_OK) {
        tp_close(g);
        return st;
    }
    int version = 0;
    llmi_nccl_load(&version);
    llmi_cuda_log(LLM_LOG_INFO, "CUDA tensor-parallel group: %u GPUs (devices %d..%d), NCCL %d",
                  g->n, (int)g->devices[0], (int)g->devices[g->n - 1], version);
    *out = g;
    return LLM_OK;
}

static llm_status tp_sync(void *backend) { return wait_all(backend); }

/* ---- weights ---- */

static void tp_weights_free(void *weights) {
    tp_weights *w = weights;
    if (!w)
        return;
    for (uint32_t r = 0; r < w->n; r++) {
        llmi_cuda_weights_free(w->w[r]);
        llmi_cuda_tp_rank_free(&w->rank[r]);
    }
    free(w);
}

/* Each rank's shard: its rank model (views, and O and down repacked on the
 * host), uploaded by the single-GPU loader, the host copy freed at once. */
static llm_status tp_weights_load(const tp_group *grp, const llm_model *m, int32_t device,
                                  void **out) {
    *out = NULL;
    (void)device;
    char why[512];
    llm_status st = llmi_cuda_tp_check(m, grp->n, why, sizeof why);
    if (st != LLM_OK)
        return llmi_cuda_error(st, "%s", why);
    tp_weights *w = calloc(1, sizeof *w);
    if (!w)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: tensor-parallel weights");
    w->n = grp->n;
    w->n_vocab = m->hp.n_vocab;
    for (uint32_t r = 0; r < grp->n && st == LLM_OK; r++) {
        st = llmi_cuda_tp_rank_make(m, grp->n, r, &w->rank[r]);
        if (st != LLM_OK) {
            st = llmi_cuda_error(st,
                                 st == LLM_ERR_OUT_OF_MEMORY
                                     ? "rank %u: out of host memory to repack its O and down "
                                       "slices"
                                     : "rank %u: its O and down slices cannot be repacked",
                                 r);
            break;
        }
        st = llmi_cuda_weights_load(&w->rank[r].m, grp->devices[r], (void **)&w->w[r]);
        if (st != LLM_OK)
            llmi_cuda_log(LLM_LOG_ERROR, "rank %u (CUDA device %d): loading its weights failed", r,
                          (int)grp->devices[r]);
        llmi_cuda_tp_rank_release_host(&w->rank[r], m);
    }
    if (st != LLM_OK) {
        tp_weights_free(w);
        return st;
    }
    *out = w;
    return LLM_OK;
}

/* ---- KV store: rank r holds KV heads [kv0, kv0 + n_kv) of every slot ---- */

static void tp_kv_free(void *ctx) {
    tp_kv *kv = ctx;
    if (!kv)
        return;
    const llmi_backend_ops *cu = llmi_cuda_table();
    for (uint32_t r = 0; r < kv->g->n; r++)
        cu->kv_free(kv->rank[r]);
    free(kv->rows);
    free(kv);
}

static llm_status tp_kv_create(void *backend, const llmi_kv_layout *layout, void **out) {
    *out = NULL;
    tp_inst *g = backend;
    const uint32_t n = g->n, hd = layout->head_dim;
    const size_t elem = layout->type == LLM_KV_F32 ? 4 : 2;
    if (layout->type != LLM_KV_F32 && layout->type != LLM_KV_F16 && layout->type != LLM_KV_BF16)
        return llmi_cuda_error(LLM_ERR_UNSUPPORTED,
                               "tensor parallelism on CUDA implements KV caches of F32, F16 "
                               "and BF16, not kv_type %d (Q8_0 and FP8_E4M3 run on one GPU, "
                               "Q4_0 on the CPU backend)",
                               (int)layout->type);
    if (hd == 0 || layout->kv_dim % hd)
        return llmi_cuda_error(LLM_ERR_INVALID_ARGUMENT,
                               "tensor-parallel KV store: kv_dim %u is not a whole number of "
                               "heads of %u",
                               layout->kv_dim, hd);
    const uint32_t n_head_kv = layout->kv_dim / hd;
    if (n_head_kv % n && n % n_head_kv)
        return llmi_cuda_error(LLM_ERR_INVALID_ARGUMENT,
                               "tensor-parallel KV store: %u KV heads neither split in %u nor "
                               "replicate to %u",
                               n_head_kv, n, n);
    tp_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: tensor-parallel KV store");
    kv->g = g;
    kv->n_head_kv = n_head_kv;
    kv->head_bytes = (size_t)hd * elem;
    const llmi_backend_ops *cu = llmi_cuda_table();
    llm_status st = LLM_OK;
    for (uint32_t r = 0; r < n && st == LLM_OK; r++) {
        llmi_cuda_tp_kv_heads(n_head_kv, n, r, &kv->kv0[r], &kv->n_kv[r]);
        llmi_kv_layout rl = *layout;
        rl.kv_dim = kv->n_kv[r] * hd;
        st = cu->kv_create(g->rank[r], &rl, (void **)&kv->rank[r]);
    }
    if (st != LLM_OK) {
        tp_kv_free(kv);
        return st;
    }
    *out = kv;
    return LLM_OK;
}

static llm_status tp_kv_copy(void *ctx, uint32_t dst, uint32_t src, uint32_t n_slots) {
    tp_kv *kv = ctx;
    LLMI_TRY(check_healthy(kv->g));
    const llmi_backend_ops *cu = llmi_cuda_table();
    for (uint32_t r = 0; r < kv->g->n; r++)
        LLMI_TRY(cu->kv_copy(kv->rank[r], dst, src, n_slots));
    return LLM_OK;
}

static llm_status rows_reserve(tp_kv *kv, size_t bytes) {
    if (bytes <= kv->rows_cap)
        return LLM_OK;
    void *p = realloc(kv->rows, bytes);
    if (!p)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: K/V rows of %zu bytes",
                               bytes);
    kv->rows = p;
    kv->rows_cap = bytes;
    return LLM_OK;
}

/* Full rows assemble each head from the first rank holding it; the ranks'
 * streams are waited for (time-out) before a read blocks on one. */
static llm_status tp_kv_read(void *ctx, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                             void *dst) {
    tp_kv *kv = ctx;
    LLMI_TRY(wait_all(kv->g));
    const llmi_backend_ops *cu = llmi_cuda_table();
    for (uint32_t r = 0; r < kv->g->n; r++) {
        if (llmi_cuda_tp_kv_owner(kv->n_head_kv, kv->g->n, kv->kv0[r]) != r)
            continue;
        LLMI_TRY(rows_reserve(kv, (size_t)n * kv->n_kv[r] * kv->head_bytes));
        LLMI_TRY(cu->kv_read(kv->rank[r], layer, v, slot, n, kv->rows));
        llmi_cuda_tp_kv_scatter(kv->rows, n, kv->n_head_kv, kv->head_bytes, kv->kv0[r], kv->n_kv[r],
                                dst);
    }
    return LLM_OK;
}

/* Every rank takes its heads of the rows (copies on replicated heads). */
static llm_status tp_kv_write(void *ctx, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                              const void *src) {
    tp_kv *kv = ctx;
    LLMI_TRY(check_healthy(kv->g));
    const llmi_backend_ops *cu = llmi_cuda_table();
    for (uint32_t r = 0; r < kv->g->n; r++) {
        LLMI_TRY(rows_reserve(kv, (size_t)n * kv->n_kv[r] * kv->head_bytes));
        llmi_cuda_tp_kv_gather(src, n, kv->n_head_kv, kv->head_bytes, kv->kv0[r], kv->n_kv[r],
                               kv->rows);
        /* Returns once the rows are staged: kv->rows may be reused. */
        LLMI_TRY(cu->kv_write(kv->rank[r], layer, v, slot, n, kv->rows));
    }
    return LLM_OK;
}

/* ---- steps ---- */

static void tp_step_free(void *ctx) {
    tp_step *s = ctx;
    if (!s)
        return;
    /* Freeing a step synchronises its stream: no collective may be left
     * waiting (wait_all aborts the group on a time-out). */
    wait_all(s->g);
    for (uint32_t r = 0; r < s->g->n; r++)
        llmi_cuda_step_free(s->rank[r]);
    free(s->slice);
    free(s);
}

static llm_status tp_step_create(void *backend, const llm_model *m, void *weights,
                                 uint32_t max_rows, uint32_t max_ctx, void **out) {
    *out = NULL;
    (void)m; /* each rank runs its rank model, with the rank's hp */
    tp_inst *g = backend;
    const tp_weights *w = weights;
    if (w->n != g->n)
        return llmi_cuda_error(LLM_ERR_INVALID_ARGUMENT,
                               "weights split in %u used by a group of %u GPUs", w->n, g->n);
    tp_step *s = calloc(1, sizeof *s);
    if (!s)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: tensor-parallel step");
    s->g = g;
    s->w = w;
    s->logit_rows = max_rows;
    uint32_t widest = 0;
    llm_status st = LLM_OK;
    for (uint32_t r = 0; r < g->n && st == LLM_OK; r++) {
        st = llmi_cuda_step_create(g->rank[r], &w->rank[r].m, w->w[r], max_rows, max_ctx,
                                   (void **)&s->rank[r]);
        if (st != LLM_OK)
            break;
        s->rank[r]->graphs_off = true;
        if (s->rank[r]->plan.logit_rows < s->logit_rows)
            s->logit_rows = s->rank[r]->plan.logit_rows;
        if (w->rank[r].shard.n_vocab > widest)
            widest = w->rank[r].shard.n_vocab;
    }
    if (st == LLM_OK && !(s->slice = malloc((size_t)s->logit_rows * widest * sizeof(float))))
        st = llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: logits of a rank");
    if (st != LLM_OK) {
        tp_step_free(s);
        return st;
    }
    *out = s;
    return LLM_OK;
}

/* hout (n rows of n_embd floats) becomes the sum of every rank's, in
 * place, in one NCCL group call. */
static llm_status all_reduce_hout(tp_step *s, uint32_t n) {
    tp_inst *g = s->g;
    const size_t count = (size_t)n * s->w->rank[0].m.hp.n_embd;
    llm_status st = llmi_nccl_group_begin();
    if (st != LLM_OK)
        return group_fail(g, st, UINT32_MAX);
    for (uint32_t r = 0; r < g->n && st == LLM_OK; r++)
        st = llmi_nccl_all_reduce(g->comm[r], s->rank[r]->hout, s->rank[r]->hout, count,
                                  g->rank[r]->stream);
    llm_status end = llmi_nccl_group_end();
    if (st == LLM_OK)
        st = end;
    return st == LLM_OK ? LLM_OK : group_fail(g, st, UINT32_MAX);
}

/* Issues one phase on every rank, each with its device current. */
#define EACH_RANK(call)                                                                            \
    for (uint32_t r = 0; r < g->n; r++) {                                                          \
        LLMI_TRY(llmi_cuda_use_device(g->devices[r]));                                             \
        LLMI_TRY(call);                                                                            \
    }

static llm_status run_layers(tp_step *s, tp_kv *kv, const llmi_step *st, llmi_cuda_dev_step *d) {
    tp_inst *g = s->g;
    const uint32_t n = st->n_rows, max_pos = llmi_cuda_max_pos(st->pos, st->n_rows);
    EACH_RANK(llmi_cuda_step_upload(s->rank[r], st, &d[r]));
    EACH_RANK(llmi_cuda_step_embed(s->rank[r], &d[r], n));
    const uint32_t n_layer = s->w->rank[0].m.hp.n_layer;
    for (uint32_t l = 0; l < n_layer; l++) {
        /* One thread issues every rank's work: stopping here stops all of
         * them before the same layer. */
        if (st->interrupt && atomic_load_explicit(st->interrupt, memory_order_relaxed))
            return llmi_cuda_error(LLM_ERR_CANCELLED,
                                   "interrupted (llm_session_interrupt) at layer %u", l);
        EACH_RANK(llmi_cuda_step_layer_attention(s->rank[r], kv->rank[r], l, &d[r], n,
                                                 st->block_size, max_pos));
        LLMI_TRY(all_reduce_hout(s, n));
        EACH_RANK(llmi_cuda_step_layer_ffn(s->rank[r], l, n));
        LLMI_TRY(all_reduce_hout(s, n));
    }
    EACH_RANK(llmi_cuda_step_finish(s->rank[r], n));
    return LLM_OK;
}

static llm_status tp_step_run(void *ctx, void *kv_store, const llmi_step *st, float *logits) {
    tp_step *s = ctx;
    tp_inst *g = s->g;
    LLMI_TRY(check_healthy(g));
    llmi_cuda_dev_step d[MAX_RANKS];
    memset(d, 0, sizeof d);
    LLMI_TRY(run_layers(s, kv_store, st, d));
    const uint32_t n_vocab = s->w->n_vocab;
    for (uint32_t c0 = 0; c0 < st->n_logits; c0 += s->logit_rows) {
        const uint32_t cn = st->n_logits - c0 < s->logit_rows ? st->n_logits - c0 : s->logit_rows;
        EACH_RANK(llmi_cuda_step_logits(s->rank[r], d[r].logit_rows + c0, cn));
        /* The copies below block on each stream: wait with the time-out. */
        LLMI_TRY(wait_all(g));
        for (uint32_t r = 0; r < g->n; r++) {
            const llmi_cuda_tp_shard *sh = &s->w->rank[r].shard;
            LLMI_TRY(llmi_cuda_use_device(g->devices[r]));
            LLMI_TRY(llmi_cuda_step_copy_logits(s->rank[r], cn, s->slice));
            llmi_cuda_tp_place_logits(logits + (size_t)c0 * n_vocab, cn, n_vocab, sh->vocab0,
                                      sh->n_vocab, s->slice);
        }
    }
    return LLM_OK;
}
#undef EACH_RANK

static void tp_set_f32(void *ctx, bool on) {
    tp_step *s = ctx;
    for (uint32_t r = 0; r < s->g->n; r++)
        llmi_cuda_step_set_f32_activations(s->rank[r], on);
}

/* ---- the groups' tables ----
 * A table's entries carry no context, and open and weights_load must know
 * the group's devices: each group slot has its own pair of them. */

static tp_group groups[LLMI_CUDA_TP_GROUPS];
static uint32_t n_groups;
static pthread_mutex_t groups_lock = PTHREAD_MUTEX_INITIALIZER;

#define SLOT(i)                                                                                    \
    static llm_status open_##i(const llmi_backend_config *cfg, void **out) {                       \
        return tp_open(&groups[i], cfg, out);                                                      \
    }                                                                                              \
    static llm_status weights_load_##i(const llm_model *m, int32_t device, void **out) {           \
        return tp_weights_load(&groups[i], m, device, out);                                        \
    }
SLOT(0)
SLOT(1)
SLOT(2)
SLOT(3)
SLOT(4)
SLOT(5)
SLOT(6)
SLOT(7)
#undef SLOT

static const struct {
    llm_status (*open)(const llmi_backend_config *, void **);
    llm_status (*weights_load)(const llm_model *, int32_t, void **);
} slot_entries[LLMI_CUDA_TP_GROUPS] = {
    {open_0, weights_load_0}, {open_1, weights_load_1}, {open_2, weights_load_2},
    {open_3, weights_load_3}, {open_4, weights_load_4}, {open_5, weights_load_5},
    {open_6, weights_load_6}, {open_7, weights_load_7},
};

static const llmi_backend_ops group_template = {
    .version = LLMI_BACKEND_VERSION,
    .name = "cuda-tp",
    .close = tp_close,
    .weights_free = tp_weights_free,
    .kv_create = tp_kv_create,
    .kv_free = tp_kv_free,
    .kv_copy = tp_kv_copy,
    .kv_read = tp_kv_read,
    .kv_write = tp_kv_write,
    .step_create = tp_step_create,
    .step_free = tp_step_free,
    .step_run = tp_step_run,
    .sync = tp_sync,
    .step_set_f32_activations = tp_set_f32,
    /* The ranks' steps do not apply adapters yet: each would add the update
     * to its own output columns from the whole input row, as the CPU's
     * tensor-parallel ranks do (lib/backend/cpu/lora.c), with B read at
     * the rank's columns. The engine refuses adapters here with its
     * message. */
    .lora = false,
};

llm_status llmi_cuda_tp_group(uint32_t n, const int32_t *devices, const llmi_backend_ops **out) {
    *out = NULL;
    if (n < 2 || n > MAX_RANKS)
        return llmi_cuda_error(LLM_ERR_UNSUPPORTED,
                               "tensor_parallel %u: CUDA groups of 2 to %u GPUs are supported", n,
                               MAX_RANKS);
    /* NCCL is loaded here, only when a group is asked for. */
    LLMI_TRY(llmi_nccl_load(NULL));
    pthread_mutex_lock(&groups_lock);
    llm_status st = LLM_OK;
    uint32_t i = 0;
    for (; i < n_groups; i++)
        if (groups[i].n == n && memcmp(groups[i].devices, devices, n * sizeof *devices) == 0)
            break;
    if (i == n_groups && n_groups == LLMI_CUDA_TP_GROUPS)
        st = llmi_cuda_error(LLM_ERR_LIMIT,
                             "at most %d distinct device lists of CUDA tensor-parallel groups "
                             "per process",
                             LLMI_CUDA_TP_GROUPS);
    else if (i == n_groups) {
        tp_group *grp = &groups[i];
        memset(grp, 0, sizeof *grp);
        grp->n = n;
        memcpy(grp->devices, devices, n * sizeof *devices);
        grp->ops = group_template;
        grp->ops.open = slot_entries[i].open;
        grp->ops.weights_load = slot_entries[i].weights_load;
        n_groups++;
    }
    if (st == LLM_OK)
        *out = &groups[i].ops;
    pthread_mutex_unlock(&groups_lock);
    return st;
}
