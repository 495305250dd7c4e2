/* LoRA updates of a step's rows (backend/cpu/lora.h). Two passes over the
 * pool: t = A x for every (row, rank index), then y += s * (B t) for every
 * (row, output); the work of both splits evenly across the threads however
 * the rows are grouped by adapter, and every element is one dot product of
 * the same length in the same order whichever thread computes it. */
#include "backend/cpu/lora.h"

#include "backend/cpu/kernels.h"

/* Multiply-adds below which one thread does a projection's update. */
static uint64_t inline_work = 1u << 17;

#ifdef LLMI_TEST_HOOKS
void llmi_cpu_lora_test_inline_work(uint64_t work) { inline_work = work; }
#endif

void llmi_cpu_lora_free(llmi_cpu_lora *l) {
    llmi_free_aligned(l->t);
    l->t = NULL;
    l->cap = 0;
}

typedef struct lora_job {
    const llmi_step *st;
    uint32_t layer;
    llmi_lora_target target;
    const float *x;
    uint32_t x_cols;
    float *y;
    uint32_t y_cols;
    float *t; /* [n_rows][max_rank] */
    uint32_t max_rank;
    float (*dot)(const float *, const void *, int);
} lora_job;

/* Row r's pair and its effective scale; NULL when the row has none. */
static const llmi_lora_pair *row_pair(const lora_job *j, uint32_t r, float *scale) {
    const uint32_t a = j->st->row_adapter[r];
    if (a == 0)
        return NULL;
    const llmi_lora_pair *p = llmi_adapter_pair(j->st->adapters[a - 1], j->layer, j->target);
    if (!p->a)
        return NULL;
    *scale = j->st->adapter_scale[a - 1] * p->alpha_scale;
    return p;
}

static void down_task(void *ctx, int ith, int nth) {
    const lora_job *j = ctx;
    const uint64_t total = (uint64_t)j->st->n_rows * j->max_rank;
    const uint64_t begin = total * (uint64_t)ith / (uint64_t)nth;
    const uint64_t end = total * (uint64_t)(ith + 1) / (uint64_t)nth;
    for (uint64_t i = begin; i < end; i++) {
        const uint32_t r = (uint32_t)(i / j->max_rank), k = (uint32_t)(i % j->max_rank);
        float s;
        const llmi_lora_pair *p = row_pair(j, r, &s);
        if (!p || k >= p->rank)
            continue;
        j->t[i] = j->dot(j->x + (size_t)r * j->x_cols, p->a + (size_t)k * p->in, (int)p->in);
    }
}

static void up_task(void *ctx, int ith, int nth) {
    const lora_job *j = ctx;
    const uint64_t total = (uint64_t)j->st->n_rows * j->y_cols;
    const uint64_t begin = total * (uint64_t)ith / (uint64_t)nth;
    const uint64_t end = total * (uint64_t)(ith + 1) / (uint64_t)nth;
    for (uint64_t i = begin; i < end; i++) {
        const uint32_t r = (uint32_t)(i / j->y_cols), o = (uint32_t)(i % j->y_cols);
        float s;
        const llmi_lora_pair *p = row_pair(j, r, &s);
        if (!p)
            continue;
        const float *t = j->t + (size_t)r * j->max_rank;
        j->y[i] += s * j->dot(t, p->b + (size_t)o * p->rank, (int)p->rank);
    }
}

llm_status llmi_cpu_lora_apply(llmi_cpu_lora *l, llmi_pool *pool, const llmi_step *st,
                               uint32_t layer, llmi_lora_target target, const float *x,
                               uint32_t x_cols, float *y, uint32_t y_cols) {
    if (st->n_adapters == 0)
        return LLM_OK;
    uint32_t max_rank = 0;
    for (uint32_t a = 0; a < st->n_adapters; a++) {
        const llmi_lora_pair *p = llmi_adapter_pair(st->adapters[a], layer, target);
        if (p->a && p->rank > max_rank)
            max_rank = p->rank;
    }
    if (max_rank == 0) /* no adapter of the step targets this projection */
        return LLM_OK;
    size_t need;
    if (!llmi_mul_ok(st->n_rows, max_rank, &need))
        return llmi_oom("LoRA scratch");
    if (need > l->cap) {
        size_t bytes;
        if (!llmi_mul_ok(need, sizeof(float), &bytes))
            return llmi_oom("LoRA scratch");
        float *t = llmi_malloc_aligned(bytes);
        if (!t)
            return llmi_oom("LoRA scratch");
        llmi_free_aligned(l->t);
        l->t = t;
        l->cap = need;
    }
    lora_job job = {.st = st,
                    .layer = layer,
                    .target = target,
                    .x = x,
                    .x_cols = x_cols,
                    .y = y,
                    .y_cols = y_cols,
                    .t = l->t,
                    .max_rank = max_rank,
                    .dot = llmi_row_ops_get(LLMI_T_F32)->dot};
    /* A decode step's update is a few thousand multiply-adds, less than
     * waking the pool costs: then the caller does it alone (every element
     * is computed the same way either way). */
    const uint64_t work = (uint64_t)st->n_rows * max_rank * ((uint64_t)x_cols + y_cols);
    if (work < inline_work) {
        down_task(&job, 0, 1);
        up_task(&job, 0, 1);
        return LLM_OK;
    }
    llmi_pool_run(pool, down_task, &job);
    llmi_pool_run(pool, up_task, &job);
    return LLM_OK;
}
