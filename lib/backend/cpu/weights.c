/* The CPU backend's weights (cpu.h): the model's tensors where they lie,
 * plus packed copies of the matmul weights the kernels read faster that way
 * (kernels.h, "Packed weights"), made once per model and shared by every
 * session on the CPU. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
#include "model/arch.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Threads that pack (memory-bound: a few are enough). */
#define PACK_THREADS_MAX 8

/* The weights that get a copy: 2-D matrices (not vectors, not expert
 * stacks, which moe.c reads from the model). */
static bool is_matrix(const llmi_role_info *role, const llmi_weight *w) {
    return w->data && role->out != LLMI_DIM_ONE && role->stack == LLMI_DIM_ONE;
}

typedef struct pack_job {
    const llm_model *m;
    llmi_weight **targets; /* the views that get a copy */
    size_t n;
} pack_job;

/* Thread ith packs its share of every weight's groups. The kernels will
 * read the copies, so a mapped file's pages of the rows just packed go
 * back to the page cache at once rather than count twice. */
static void pack_task(void *ctx, int ith, int nth) {
    const pack_job *job = ctx;
    for (size_t i = 0; i < job->n; i++) {
        const llmi_weight *w = job->targets[i];
        const int64_t groups = (w->rows + LLMI_WEIGHT_PACK_ROWS - 1) / LLMI_WEIGHT_PACK_ROWS;
        const int64_t g0 = groups * ith / nth, g1 = groups * (ith + 1) / nth;
        if (g0 >= g1)
            continue;
        llmi_weight_pack(w, (void *)(uintptr_t)w->packed, g0, g1);
        const int64_t r0 = g0 * LLMI_WEIGHT_PACK_ROWS;
        const int64_t r1 =
            g1 * LLMI_WEIGHT_PACK_ROWS < w->rows ? g1 * LLMI_WEIGHT_PACK_ROWS : w->rows;
        llmi_model_release_pages(job->m, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes,
                                 (size_t)(r1 - r0) * w->row_bytes);
    }
}

static int pack_threads(void) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > PACK_THREADS_MAX ? PACK_THREADS_MAX : (int)n;
}

/* Whether packing is on: LLM_CPU_PACK=0 turns it off (half the memory
 * when the model is read rather than mapped, at the speed of the model's
 * own layout). */
static bool packing_enabled(void) {
    const char *e = getenv("LLM_CPU_PACK");
    return !(e && strcmp(e, "0") == 0);
}

/* Gives every matrix of cw that has a packed layout its copy, in one
 * allocation. */
static llm_status pack_all(llmi_cpu_weights *cw, const llm_model *m) {
    const uint32_t n_layer = m->hp.n_layer;
    size_t cap = (size_t)n_layer * LLMI_LAYER_ROLES + 1, n = 0, total = 0, gb;
    llmi_weight **targets = llmi_calloc(cap, sizeof *targets);
    if (!targets)
        return llmi_oom("packed weights");
    for (uint32_t l = 0; l < n_layer; l++)
        for (int r = 0; r < LLMI_LAYER_ROLES; r++)
            if (is_matrix(&llmi_layer_roles[r], &cw->layers[l].w[r]))
                targets[n++] = &cw->layers[l].w[r];
    if (is_matrix(&llmi_model_roles[LLMI_ROLE_OUTPUT], &cw->w[LLMI_ROLE_OUTPUT]))
        targets[n++] = &cw->w[LLMI_ROLE_OUTPUT];
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t bytes = llmi_weight_packed_size(targets[i], &gb);
        if (bytes > 0 && total + bytes >= total) {
            total += bytes;
            targets[kept++] = targets[i];
        }
    }
    llmi_pool *pool = NULL;
    llm_status st = LLM_OK;
    if (kept > 0 && !(cw->packed = llmi_malloc_huge(total)))
        st = llmi_error(LLM_ERR_OUT_OF_MEMORY,
                        "out of memory for the CPU's packed copy of the weights (%zu MiB; "
                        "LLM_CPU_PACK=0 runs without it)",
                        total >> 20);
    if (st == LLM_OK && kept > 0)
        st = llmi_pool_create(pack_threads(), &pool);
    if (st != LLM_OK || kept == 0) {
        llmi_free(targets);
        return st;
    }
    cw->packed_bytes = total;
    for (size_t i = 0, off = 0; i < kept; i++) {
        const size_t bytes = llmi_weight_packed_size(targets[i], &gb);
        targets[i]->packed = (const uint8_t *)cw->packed + off;
        targets[i]->packed_group_bytes = gb;
        off += bytes;
    }
    pack_job job = {m, targets, kept};
    llmi_pool_run(pool, pack_task, &job);
    llmi_pool_free(pool);
    llmi_free(targets);
    return LLM_OK;
}

llm_status llmi_cpu_weights_load(const llm_model *m, llmi_cpu_weights **out) {
    *out = NULL;
    llmi_cpu_weights *cw = llmi_calloc(1, sizeof *cw);
    if (!cw)
        return llmi_oom("CPU weights");
    memcpy(cw->w, m->w, sizeof cw->w);
    cw->layers = llmi_calloc(m->hp.n_layer ? m->hp.n_layer : 1, sizeof *cw->layers);
    if (!cw->layers) {
        llmi_free(cw);
        return llmi_oom("CPU weights");
    }
    memcpy(cw->layers, m->layers, (size_t)m->hp.n_layer * sizeof *cw->layers);
    if (packing_enabled()) {
        llm_status st = pack_all(cw, m);
        if (st != LLM_OK) {
            llmi_cpu_weights_free(cw);
            return st;
        }
    }
    *out = cw;
    return LLM_OK;
}

void llmi_cpu_weights_free(llmi_cpu_weights *cw) {
    if (!cw)
        return;
    llmi_free_aligned(cw->packed);
    llmi_free(cw->layers);
    llmi_free(cw);
}
