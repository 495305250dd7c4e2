/* Small steps (decode, speculative verification: up to
 * LLMI_CUDA_GRAPH_MAX_ROWS rows) replayed from CUDA graphs, one per shape:
 * (row bucket, attention splits, block size, f32 activations, KV store).
 * A graph bakes in every launch parameter and pointer, so the step is made
 * to look the same every time (layout.h, "CUDA graphs"): padded to its
 * bucket with rows that write the KV store's spare block, its descriptor
 * repacked at fixed offsets of a fixed device buffer, and the attention
 * grid rounded to a power of two of splits (max_pos may exceed every row's
 * position: the kernel sizes its grid by it and each row reads its own).
 * Positions, sequences and block tables are read from device memory by the
 * kernels, so they vary freely between replays.
 *
 * The first step of a shape runs eagerly through the same padded path
 * (kernels load, matmul plans are made); the second is captured and
 * replayed, and so is every later one. A capture that fails leaves that
 * shape eager. LLM_CUDA_GRAPHS=0 in the environment turns graphs off. */
#include "cuda_backend.h"

#include <string.h>

static void graph_drop(llmi_cuda_graph *g) {
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    memset(g, 0, sizeof *g);
}

void llmi_cuda_graphs_free(llmi_cuda_step *s) {
    for (uint32_t i = 0; i < s->n_graphs; i++)
        graph_drop(&s->graphs[i]);
    s->n_graphs = s->next_graph = 0;
    llmi_cuda_staging_free(&s->gstage);
    if (s->gwords)
        cudaFree(s->gwords);
    s->gwords = NULL;
    s->g_block_size = 0;
}

/* The fixed descriptor buffers for steps of this block size: tables of up
 * to ceil(max_ctx / block_size) blocks per sequence, plus the spare. A new
 * block size (another KV store) drops every graph. */
static llm_status words_for(llmi_cuda_step *s, uint32_t block_size) {
    if (s->gwords && s->g_block_size == block_size)
        return LLM_OK;
    LLMI_TRY(llmi_cuda_call(cudaStreamSynchronize(s->inst->stream), "running the stream"));
    llmi_cuda_graphs_free(s);
    const uint32_t rows =
        s->max_rows < LLMI_CUDA_GRAPH_MAX_ROWS ? s->max_rows : LLMI_CUDA_GRAPH_MAX_ROWS;
    const size_t per_seq = ((size_t)s->max_ctx + block_size - 1) / block_size;
    const size_t cap = (size_t)rows * per_seq + 1;
    if (cap > UINT32_MAX)
        return llmi_cuda_error(LLM_ERR_LIMIT, "graph block tables of %zu entries", cap);
    llmi_cuda_graph_layout(rows, (uint32_t)cap, &s->glay);
    const size_t bytes = s->glay.size * sizeof(uint32_t);
    LLMI_TRY(llmi_cuda_call(cudaMalloc((void **)&s->gwords, bytes),
                            "allocating the graph step descriptor"));
    llm_status st = llmi_cuda_staging_init(&s->gstage, bytes);
    if (st != LLM_OK) {
        cudaFree(s->gwords);
        s->gwords = NULL;
        return st;
    }
    s->g_block_size = block_size;
    return LLM_OK;
}

/* The graph entry of a shape, added (not yet captured) when new; the
 * oldest one is replaced when the table is full. */
static llmi_cuda_graph *graph_for(llmi_cuda_step *s, const llmi_cuda_graph *key) {
    for (uint32_t i = 0; i < s->n_graphs; i++) {
        llmi_cuda_graph *g = &s->graphs[i];
        if (g->rows == key->rows && g->max_pos == key->max_pos &&
            g->block_size == key->block_size && g->f32 == key->f32 && g->kv == key->kv &&
            g->kv_arena == key->kv_arena && g->kv_layer_bytes == key->kv_layer_bytes)
            return g;
    }
    llmi_cuda_graph *g;
    if (s->n_graphs < LLMI_CUDA_GRAPHS) {
        g = &s->graphs[s->n_graphs++];
    } else {
        g = &s->graphs[s->next_graph];
        s->next_graph = (s->next_graph + 1) % LLMI_CUDA_GRAPHS;
        graph_drop(g);
    }
    *g = *key;
    return g;
}

/* Everything a replay does, for the bucket's rows. */
static llm_status enqueue(llmi_cuda_step *s, llmi_cuda_kv *kv, const llmi_cuda_dev_step *d,
                          const llmi_cuda_graph *g, const atomic_int *interrupt) {
    LLMI_TRY(llmi_cuda_step_layers(s, kv, d, g->rows, g->block_size, g->max_pos, interrupt));
    return llmi_cuda_step_logits(s, d->logit_rows, g->rows);
}

/* Captures g's work into an executable graph; false (error cleared) when
 * the capture failed, and the caller runs the step eagerly. */
static bool capture(llmi_cuda_step *s, llmi_cuda_kv *kv, const llmi_cuda_dev_step *d,
                    llmi_cuda_graph *g) {
    cudaStream_t stream = s->inst->stream;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    llm_status st = enqueue(s, kv, d, g, NULL);
    cudaGraph_t graph = NULL;
    cudaError_t end = cudaStreamEndCapture(stream, &graph);
    bool ok = st == LLM_OK && end == cudaSuccess && graph &&
              cudaGraphInstantiate(&g->exec, graph, 0) == cudaSuccess;
    if (graph)
        cudaGraphDestroy(graph);
    if (!ok) {
        cudaGetLastError();
        g->exec = NULL;
        llmi_cuda_log(LLM_LOG_WARN,
                      "CUDA: steps of %u rows run without a graph (the capture failed)", g->rows);
    }
    return ok;
}

llm_status llmi_cuda_graph_run(llmi_cuda_step *s, llmi_cuda_kv *kv, const llmi_step *st,
                               float *logits, bool *ran) {
    *ran = false;
    const uint32_t rows = llmi_cuda_graph_rows(st->n_rows, s->max_rows, s->plan.logit_rows);
    if (s->graphs_off || rows == 0)
        return LLM_OK;
    LLMI_TRY(words_for(s, st->block_size));
    LLMI_TRY(llmi_cuda_staging_wait(&s->gstage));
    if (!llmi_cuda_graph_pack(st, rows, kv->spare, &s->glay, s->gstage.host))
        return LLM_OK; /* block tables longer than planned: the plain path */
    const size_t words = s->glay.blocks + st->block_start[st->n_seqs] + 1;
    cudaStream_t stream = s->inst->stream;
    LLMI_TRY(llmi_cuda_call(cudaMemcpyAsync(s->gwords, s->gstage.host, words * sizeof(uint32_t),
                                            cudaMemcpyHostToDevice, stream),
                            "uploading the step"));
    LLMI_TRY(llmi_cuda_call(cudaEventRecord(s->gstage.done, stream), "uploading the step"));
    s->gstage.pending = true;
    /* The grid never outgrows the attention scratch, sized for max_ctx. */
    uint32_t max_pos = llmi_cuda_graph_max_pos(llmi_cuda_max_pos(st->pos, st->n_rows));
    if (max_pos > s->max_ctx - 1)
        max_pos = s->max_ctx - 1;
    const llmi_cuda_graph key = {.rows = rows,
                                 .max_pos = max_pos,
                                 .block_size = st->block_size,
                                 .f32 = s->f32_act,
                                 .kv = kv,
                                 .kv_arena = kv->arena,
                                 .kv_layer_bytes = kv->layer_bytes};
    llmi_cuda_graph *g = graph_for(s, &key);
    const llmi_cuda_dev_step d = {
        .token = (const int32_t *)(s->gwords + s->glay.token),
        .pos = s->gwords + s->glay.pos,
        .seq = s->gwords + s->glay.seq,
        .block_start = s->gwords + s->glay.block_start,
        .blocks = s->gwords + s->glay.blocks,
        .logit_rows = s->gwords + s->glay.logit_rows,
    };
    if (!g->exec && !g->failed && g->runs > 0)
        g->failed = !capture(s, kv, &d, g);
    if (g->exec) {
        /* A replay cannot stop between layers: look once, before it. */
        if (st->interrupt && atomic_load_explicit(st->interrupt, memory_order_relaxed))
            return llmi_cuda_error(LLM_ERR_CANCELLED, "interrupted (llm_session_interrupt)");
        LLMI_TRY(llmi_cuda_call(cudaGraphLaunch(g->exec, stream), "replaying a step graph"));
    } else {
        LLMI_TRY(enqueue(s, kv, &d, g, st->interrupt));
    }
    g->runs++;
    *ran = true;
    return st->n_logits ? llmi_cuda_step_copy_logits(s, st->n_logits, logits) : LLM_OK;
}

/* ---- the ops table's step entries ---- */

void llmi_cuda_step_free(void *ctx) {
    llmi_cuda_step *s = ctx;
    if (!s)
        return;
    cudaSetDevice(s->inst->device);
    cudaStreamSynchronize(s->inst->stream);
    llmi_cuda_graphs_free(s);
    llmi_cuda_step_release(s);
}

llm_status llmi_cuda_step_run(void *ctx, void *kv_store, const llmi_step *st, float *logits) {
    llmi_cuda_step *s = ctx;
    llmi_cuda_kv *kv = kv_store;
    LLMI_TRY(llmi_cuda_use_device(s->inst->device));
    bool ran = false;
    /* Steps with LoRA adapters run eagerly: a graph would bake in the
     * adapters' launches. */
    if (st->n_adapters == 0)
        LLMI_TRY(llmi_cuda_graph_run(s, kv, st, logits, &ran));
    return ran ? LLM_OK : llmi_cuda_step_run_eager(s, kv, st, logits);
}
