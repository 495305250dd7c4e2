/* LoRA updates of a step's rows (backend/cpu/lora.h): each thread takes
 * whole rows, and a row's update is computed the same way whichever thread
 * takes it and whatever rows share the step.
 *
 * Windows. The f32 axpy kernels treat an element by its index from the
 * start of the call: whole vectors (8 floats with AVX2, 16 with AVX-512)
 * with fused multiply-adds, then a tail (AVX2: a multiply and an add, each
 * rounded; AVX-512: a masked fused one; the portable level rounds every
 * element the same way). An axpy over a tensor-parallel rank's columns
 * alone would put other elements in the tail than one CPU's axpy over the
 * whole row does, and round them differently. So when the rank's columns
 * [c0, c1) do not start on a multiple of 16, or end neither on one nor at
 * the row's end, each row's columns are copied into a window [w0, w1): c0
 * rounded down to a multiple of 16, c1 rounded up to one or the row's end
 * if that is nearer. The axpys run over the window, with B's columns
 * [w0, w1), and the rank's columns are copied back; the window's other
 * columns are scratch. Every element then takes the path it takes in the
 * whole row: when w1 is a multiple of 16 every element of the window is in
 * a whole vector, as it is in the whole row, which reaches at least to w1;
 * when w1 is the row's end, the window's tail is the row's tail, w0 being a
 * multiple of the vector width. */
#include "backend/cpu/lora.h"

#include "backend/cpu/kernels.h"

enum { WINDOW_ALIGN = 16 }; /* floats: a multiple of every level's vector width */

/* Multiply-adds below which one thread does a projection's update. */
static uint64_t inline_work = 1u << 17;

#ifdef LLMI_TEST_HOOKS
void llmi_cpu_lora_test_inline_work(uint64_t work) { inline_work = work; }
#endif

void llmi_cpu_lora_free(llmi_cpu_lora *l) {
    llmi_free_aligned(l->t);
    llmi_free_aligned(l->win);
    *l = (llmi_cpu_lora){0};
}

/* *buf holds at least a * b floats afterwards. */
static llm_status grow(float **buf, size_t *cap, size_t a, size_t b) {
    size_t need, bytes;
    if (!llmi_mul_ok(a, b, &need) || !llmi_mul_ok(need, sizeof(float), &bytes))
        return llmi_oom("LoRA scratch");
    if (need <= *cap)
        return LLM_OK;
    float *p = llmi_malloc_aligned(bytes);
    if (!p)
        return llmi_oom("LoRA scratch");
    llmi_free_aligned(*buf);
    *buf = p;
    *cap = need;
    return LLM_OK;
}

/* The widest window of an output slice of `cols` columns. */
static size_t window_width(uint32_t cols) { return (size_t)cols + 2 * (WINDOW_ALIGN - 1); }

llm_status llmi_cpu_lora_reserve(llmi_cpu_lora *l, uint32_t n_rows, uint32_t max_rank,
                                 uint32_t max_cols) {
    LLMI_TRY(grow(&l->t, &l->cap, n_rows, max_rank));
    if (max_cols)
        LLMI_TRY(grow(&l->win, &l->win_cap, n_rows, window_width(max_cols)));
    return LLM_OK;
}

typedef struct lora_job {
    const llmi_step *st;
    uint32_t layer;
    llmi_lora_target target;
    const float *x;
    uint32_t x_cols;
    float *y;
    uint32_t y_cols;
    uint32_t y_begin; /* y's first column among the projection's outputs */
    uint32_t w0, ww;  /* the window's first column and width; ww 0: no window */
    float *win;       /* [n_rows][ww] */
    float *t;         /* [n_rows][max_rank] */
    uint32_t max_rank;
    float (*dot)(const float *, const void *, int);
    void (*axpy)(float *, float, const void *, int);
} lora_job;

/* Where row r's update goes: its window, or its row of y. */
static float *out_row(const lora_job *j, uint32_t r) {
    return j->ww ? j->win + (size_t)r * j->ww : j->y + (size_t)r * j->y_cols;
}

/* Row r of y to its window (lead: y's first column in it), or back. */
static void window_load(const lora_job *j, uint32_t r, size_t lead) {
    float *w = out_row(j, r);
    memset(w, 0, (size_t)j->ww * sizeof *w);
    memcpy(w + lead, j->y + (size_t)r * j->y_cols, (size_t)j->y_cols * sizeof *w);
}

static void window_store(const lora_job *j, uint32_t r, size_t lead) {
    memcpy(j->y + (size_t)r * j->y_cols, out_row(j, r) + lead, (size_t)j->y_cols * sizeof(float));
}

/* The rows [begin, end) of adapter a (row_adapter a + 1), grouped as
 * S-LoRA and Punica group them: each row of A and of B is read once for
 * all of them (it stays in cache) instead of once per row. Per row,
 * t[k] = A[k] . x, then y += (s * t[k]) * bt[k] for k = 0 .. rank-1 in
 * order, with the kernels' f32 dot and axpy over whole rows (or the
 * window that gives each element the whole row's bits): a row's result
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
    /* Each row's update covers `width` columns from B's column b0. */
    const uint32_t b0 = j->ww ? j->w0 : j->y_begin, width = j->ww ? j->ww : j->y_cols;
    const size_t lead = j->y_begin - j->w0;
    if (j->ww)
        for (uint32_t r = begin; r < end; r++)
            if (st->row_adapter[r] == a + 1)
                window_load(j, r, lead);
    for (uint32_t k = 0; k < p->rank; k++) {
        const float *bk = p->b + (size_t)k * p->out + b0;
        for (uint32_t r = begin; r < end; r++) {
            if (st->row_adapter[r] != a + 1)
                continue;
            const float c = s * j->t[(size_t)r * j->max_rank + k];
            j->axpy(out_row(j, r), c, bk, (int)width);
        }
    }
    if (j->ww)
        for (uint32_t r = begin; r < end; r++)
            if (st->row_adapter[r] == a + 1)
                window_store(j, r, lead);
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

/* A pair that does not fit the projection: the same answer on every rank,
 * whatever its slice (lora.h). */
static llm_status check_pair(const llm_adapter *ad, const llmi_lora_pair *p, uint32_t layer,
                             llmi_lora_target target, uint32_t x_cols, uint32_t y_full) {
    if (p->in == x_cols && p->out == y_full)
        return LLM_OK;
    return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                      "LoRA adapter %016llx, layer %u, %s: A is %u x %u and B %u x %u, but the "
                      "projection maps %u inputs to %u outputs",
                      (unsigned long long)ad->fingerprint, layer,
                      llmi_layer_roles[llmi_lora_target_role(target)].label, p->rank, p->in, p->out,
                      p->rank, x_cols, y_full);
}

llm_status llmi_cpu_lora_apply(llmi_cpu_lora *l, llmi_pool *pool, const llmi_step *st,
                               uint32_t layer, llmi_lora_target target, const float *x,
                               uint32_t x_cols, float *y, uint32_t y_cols, uint32_t y_begin,
                               uint32_t y_full) {
    if (st->n_adapters == 0)
        return LLM_OK;
    if (y_begin > y_full || y_cols > y_full - y_begin)
        return llmi_error(LLM_ERR_INTERNAL, "LoRA update of columns %u..%u of %u", y_begin,
                          y_begin + y_cols, y_full);
    uint32_t max_rank = 0;
    for (uint32_t a = 0; a < st->n_adapters; a++) {
        const llmi_lora_pair *p = llmi_adapter_pair(st->adapters[a], layer, target);
        if (!p->a)
            continue;
        LLMI_TRY(check_pair(st->adapters[a], p, layer, target, x_cols, y_full));
        max_rank = p->rank > max_rank ? p->rank : max_rank;
    }
    if (max_rank == 0) /* no adapter of the step targets this projection */
        return LLM_OK;
    const uint32_t end = y_begin + y_cols;
    const uint32_t w0 = y_begin / WINDOW_ALIGN * WINDOW_ALIGN;
    const uint64_t up = ((uint64_t)end + WINDOW_ALIGN - 1) / WINDOW_ALIGN * WINDOW_ALIGN;
    const uint32_t w1 = up < y_full ? (uint32_t)up : y_full;
    const uint32_t ww = w0 == y_begin && w1 == end ? 0 : w1 - w0;
    LLMI_TRY(grow(&l->t, &l->cap, st->n_rows, max_rank));
    if (ww)
        LLMI_TRY(grow(&l->win, &l->win_cap, st->n_rows, ww));
    lora_job job = {.st = st,
                    .layer = layer,
                    .target = target,
                    .x = x,
                    .x_cols = x_cols,
                    .y = y,
                    .y_cols = y_cols,
                    .y_begin = y_begin,
                    .w0 = w0,
                    .ww = ww,
                    .win = l->win,
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
