/* LoRA updates of a step's rows (backend/cpu/lora.h): each thread takes
 * whole rows, and a row's update is computed the same way whichever thread
 * takes it and whatever rows share the step. */
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
    void (*axpy)(float *, float, const void *, int);
} lora_job;

/* The rows [begin, end) of adapter a (row_adapter a + 1), grouped as
 * S-LoRA and Punica group them: each row of A and of B is read once for
 * all of them (it stays in cache) instead of once per row. Per row,
 * t[k] = A[k] . x, then y += (s * t[k]) * bt[k] for k = 0 .. rank-1 in
 * order, with the kernels' f32 dot and axpy over whole rows: a row's result
 * depends on nothing but the row. */
static void adapter_rows(const lora_job *j, uint32_t a, uint32_t begin, uint32_t end) {
    const llmi_step *st = j->st;
    const llmi_lora_pair *p = llmi_adapter_pair(st->adapters[a], j->layer, j->target);
    if (!p->a)
        return;
    const float s = st->adapter_scale[a] * p->alpha_scale;
    for (uint32_t k = 0; k < p->rank; k++) {
        const float *ak = p->a + (size_t)k * p->in;
        for (uint32_t r = begin; r < end; r++)
            if (st->row_adapter[r] == a + 1)
                j->t[(size_t)r * j->max_rank + k] =
                    j->dot(j->x + (size_t)r * j->x_cols, ak, (int)p->in);
    }
    for (uint32_t k = 0; k < p->rank; k++) {
        const float *bk = p->b + (size_t)k * j->y_cols;
        for (uint32_t r = begin; r < end; r++) {
            if (st->row_adapter[r] != a + 1)
                continue;
            const float c = s * j->t[(size_t)r * j->max_rank + k];
            j->axpy(j->y + (size_t)r * j->y_cols, c, bk, (int)j->y_cols);
        }
    }
}

/* Whole rows per thread, adapter by adapter: one pool run per projection
 * and nothing shared between threads. */
static void rows_task(void *ctx, int ith, int nth) {
    const lora_job *j = ctx;
    const uint32_t n = j->st->n_rows;
    const uint32_t begin = (uint32_t)((uint64_t)n * (uint64_t)ith / (uint64_t)nth);
    const uint32_t end = (uint32_t)((uint64_t)n * (uint64_t)(ith + 1) / (uint64_t)nth);
    for (uint32_t a = 0; a < j->st->n_adapters; a++)
        adapter_rows(j, a, begin, end);
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
                    .dot = llmi_row_ops_get(LLMI_T_F32)->dot,
                    .axpy = llmi_row_ops_get(LLMI_T_F32)->axpy};
    /* One row (rows are not split), or an update of a few thousand
     * multiply-adds, less than waking the pool costs: the caller does it
     * alone (every row is computed the same way either way). */
    const uint64_t work = (uint64_t)st->n_rows * max_rank * ((uint64_t)x_cols + y_cols);
    if (work < inline_work || st->n_rows == 1)
        rows_task(&job, 0, 1);
    else
        llmi_pool_run(pool, rows_task, &job);
    return LLM_OK;
}
