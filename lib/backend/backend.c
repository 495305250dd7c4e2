/* The forward-pass dispatchers (forward.h) over the backend interface
 * (backend.h): argument and row checks shared by every backend, sequence
 * lengths advanced only after a successful pass, and the test hook that
 * injects backend failures. */
#include "backend/backend.h"

#include <stdatomic.h>

struct llmi_forward {
    const llmi_backend_ops *ops;
    void *ctx; /* the backend's scratch */
    const llm_model *m;
    uint32_t max_rows, max_ctx;
};

/* ---- fault injection (tests) ---- */

static _Atomic uint64_t fault_calls; /* backend calls since the last inject */
static _Atomic uint64_t fault_at;    /* the call that fails; 0 = none */
static _Atomic int fault_status = LLM_ERR_BACKEND;
static atomic_bool fault_late;       /* a failing run fails after the backend ran */

static void fault_arm(uint64_t fail_at, llm_status status, bool late) {
    atomic_store(&fault_at, 0);
    atomic_store(&fault_status, (int)status);
    atomic_store(&fault_late, late);
    atomic_store(&fault_calls, 0);
    atomic_store(&fault_at, status == LLM_OK ? 0 : fail_at);
}

void llmi_backend_fault_inject(uint64_t fail_at, llm_status status) {
    fault_arm(fail_at, status, false);
}

void llmi_backend_fault_inject_late(uint64_t fail_at, llm_status status) {
    fault_arm(fail_at, status, true);
}

uint64_t llmi_backend_fault_calls(void) { return atomic_load(&fault_calls); }

static llm_status fault_error(void) {
    return llmi_error((llm_status)atomic_load(&fault_status), "injected backend fault");
}

/* Counts one backend call; the armed one fails (once): now, or, for a run
 * armed late, once the backend ran (*late set). */
static llm_status fault_check(bool *late) {
    uint64_t n = atomic_fetch_add(&fault_calls, 1) + 1;
    uint64_t at = atomic_load(&fault_at);
    if (at == 0 || n != at) return LLM_OK;
    /* Only the caller that disarms it fails, should two calls race. */
    if (!atomic_compare_exchange_strong(&fault_at, &at, 0)) return LLM_OK;
    if (late && atomic_load(&fault_late)) {
        *late = true;
        return LLM_OK;
    }
    return fault_error();
}

/* ---- dispatchers ---- */

llm_status llmi_forward_create_ops(const llmi_backend_ops *ops, const llm_model *m,
                                   llmi_pool *pool, uint32_t max_rows, uint32_t max_ctx,
                                   llmi_forward **out) {
    *out = NULL;
    LLMI_TRY(fault_check(NULL));
    if (!ops || !ops->create || !ops->free || !ops->run)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "backend %s lacks a required operation",
                          ops && ops->name ? ops->name : "(null)");
    if (max_rows == 0 || max_ctx == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "forward pass needs rows and context > 0");
    llmi_forward *f = llmi_calloc(1, sizeof *f);
    if (!f) return llmi_oom("forward pass");
    llm_status st = ops->create(m, pool, max_rows, max_ctx, &f->ctx);
    if (st != LLM_OK) {
        llmi_free(f);
        return st;
    }
    f->ops = ops;
    f->m = m;
    f->max_rows = max_rows;
    f->max_ctx = max_ctx;
    *out = f;
    return LLM_OK;
}

llm_status llmi_forward_create(const llm_model *m, llmi_pool *pool, uint32_t max_rows,
                               uint32_t max_ctx, llmi_forward **out) {
    return llmi_forward_create_ops(&llmi_backend_cpu, m, pool, max_rows, max_ctx, out);
}

void llmi_forward_free(llmi_forward *f) {
    if (!f) return;
    f->ops->free(f->ctx);
    llmi_free(f);
}

const llmi_backend_ops *llmi_forward_ops(const llmi_forward *f) { return f->ops; }

void llmi_forward_set_f32_activations(llmi_forward *f, bool on) {
    if (f->ops->set_f32_activations) f->ops->set_f32_activations(f->ctx, on);
}

static llm_status check_rows(const llmi_forward *f, const llmi_kv *kv,
                             const llmi_batch_row *rows, uint32_t n) {
    if (n > f->max_rows)
        return llmi_error(LLM_ERR_LIMIT, "batch of %u rows exceeds the limit of %u", n,
                          f->max_rows);
    for (uint32_t r = 0; r < n; r++) {
        const llmi_batch_row *row = &rows[r];
        if (row->token < 0 || (uint32_t)row->token >= f->m->hp.n_vocab)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "row %u: token %d outside vocabulary of %u",
                              r, row->token, f->m->hp.n_vocab);
        if (row->pos >= f->max_ctx)
            return llmi_error(LLM_ERR_LIMIT, "row %u: position %u exceeds the context of %u", r,
                              row->pos, f->max_ctx);
        if (!row->seq || (uint64_t)row->seq->n_blocks * kv->block_size <= row->pos)
            return llmi_error(LLM_ERR_INTERNAL, "row %u: no KV block reserved for position %u", r,
                              row->pos);
    }
    return LLM_OK;
}

llm_status llmi_forward_run(llmi_forward *f, llmi_kv *kv, const llmi_batch_row *rows,
                            uint32_t n, float *logits) {
    bool late = false;
    LLMI_TRY(fault_check(&late));
    llm_status st = n ? check_rows(f, kv, rows, n) : LLM_OK;
    if (st == LLM_OK && n) st = f->ops->run(f->ctx, kv, rows, n, logits);
    if (st == LLM_OK && late) st = fault_error();
    if (st != LLM_OK) return st;
    /* Lengths move only now: a pass that fails anywhere leaves them. */
    for (uint32_t r = 0; r < n; r++)
        if (rows[r].pos + 1 > rows[r].seq->n_tokens) rows[r].seq->n_tokens = rows[r].pos + 1;
    return LLM_OK;
}
