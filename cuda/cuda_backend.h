/* The CUDA backend's objects (backend/backend.h: instance, weights, KV
 * store, step context) as its host files share them: backend.c (table,
 * instance, KV store), weights.c, gemm.c (the tensor-core path), step.c
 * and lora.c (LoRA adapters). C only. */
#ifndef LLMI_CUDA_BACKEND_H
#define LLMI_CUDA_BACKEND_H

#include "backend/backend.h"
#include "internal.h"
#include "kernels.h"
#include "layout.h"

/* cublasLt.h declares one function without a prototype. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

/* Pinned host memory for copies between pageable host buffers and the
 * device, reused once the copy that last read it (an h2d copy) is done. */
typedef struct llmi_cuda_staging {
    void *host;
    size_t cap;
    cudaEvent_t done; /* recorded after the last copy that reads `host` */
    bool pending;     /* `done` was recorded and may not have fired */
} llmi_cuda_staging;

/* A cuBLASLt matmul of one shape, set up once: its descriptors and the
 * algorithm the heuristic chose. */
typedef struct llmi_cuda_gemm_plan {
    uint32_t m, n, k; /* output features, rows, inner dimension */
    uint32_t ldc;     /* output row stride (floats) */
    bool f32, bias;   /* f32 operands (else bf16); a bias epilogue */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} llmi_cuda_gemm_plan;

#define LLMI_CUDA_GEMM_PLANS 64

/* An adapter's matrices on the device (lora.c): one allocation, F32 as
 * the CPU backend holds them, pairs at the offsets (floats) of
 * llmi_cuda_lora_layout; dev NULL when it targets nothing. */
typedef struct llmi_cuda_adapter {
    uint64_t id; /* llm_adapter.id: unique in the process */
    float *dev;
    size_t *off; /* [2 * n_layer * LLMI_LORA_TARGETS] */
} llmi_cuda_adapter;

typedef struct llmi_cuda_instance {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt's */
    size_t workspace_bytes;
    llmi_cuda_staging staging; /* kv_read / kv_write */
    llmi_cuda_gemm_plan plans[LLMI_CUDA_GEMM_PLANS];
    uint32_t n_plans, next_plan; /* next_plan: the one replaced when full */
    /* Adapters uploaded on first use, kept until the instance closes, and
     * the rank-sized intermediate of the LoRA kernels (lora.c). */
    llmi_cuda_adapter **adapters;
    uint32_t n_adapters, cap_adapters;
    float *lora_t;
    size_t lora_t_cap; /* floats */
} llmi_cuda_instance;

typedef struct llmi_cuda_weights {
    int device;
    void *arena;
    size_t bytes;
    uint32_t n_layer;
    /* Per slot of llmi_cuda_weights_plan; data NULL when absent. */
    llmi_cu_matrix *mats;
} llmi_cuda_weights;

/* A model-role or layer-role weight on the device (data NULL if absent). */
static inline const llmi_cu_matrix *llmi_cuda_model_w(const llmi_cuda_weights *w, int role) {
    return &w->mats[role];
}
static inline const llmi_cu_matrix *llmi_cuda_layer_w(const llmi_cuda_weights *w, uint32_t layer,
                                                      int role) {
    return &w->mats[LLMI_MODEL_ROLES + (size_t)layer * LLMI_LAYER_ROLES + role];
}

typedef struct llmi_cuda_kv {
    llmi_cuda_instance *inst;
    llmi_kv_layout layout;
    llmi_ttype type;    /* the element type as a tensor type */
    uint32_t spare;     /* a block past layout.n_blocks that padding rows write (graph.c) */
    size_t row_bytes;   /* one slot of one layer's K (or V) */
    size_t layer_bytes; /* one layer's K (or V) array */
    void *arena;
    void **caches;     /* host copy: layer l's K at [2l], V at [2l + 1] */
    void **caches_dev; /* the same array on the device (llmi_cu_kv_copy_block) */
} llmi_cuda_kv;

/* A CUDA graph of the steps of one shape (layout.h, "CUDA graphs"): made
 * on the second run of its shape (the first runs eagerly, so that every
 * kernel is loaded and every matmul planned before a capture). */
typedef struct llmi_cuda_graph {
    uint32_t rows, max_pos, block_size;
    bool f32;
    /* The KV store, by its host and device addresses and layer size (the
     * graph bakes in its layers' addresses). */
    const void *kv, *kv_arena;
    size_t kv_layer_bytes;
    uint32_t runs;
    bool failed; /* capture failed: this shape runs eagerly */
    cudaGraphExec_t exec;
} llmi_cuda_graph;

#define LLMI_CUDA_GRAPHS 32

typedef struct llmi_cuda_step {
    llmi_cuda_instance *inst;
    const llm_model *m;
    const llmi_cuda_weights *w;
    uint32_t max_rows, max_ctx, q_dim, kv_dim;
    llmi_cuda_scratch plan;
    char *scratch;
    float *x, *xb, *q, *k, *v, *att, *gate, *up, *hout, *out_rows, *logits, *attn;
    void *act, *deq;
    /* The step descriptor's words on the device and their pinned staging. */
    uint32_t *words;
    size_t words_cap;
    llmi_cuda_staging words_stage;
    llmi_cuda_staging logits_stage; /* plan.logit_rows rows of n_vocab floats */
    bool f32_act;
    /* The input of the matmuls that follow (mm_input). */
    const float *in_x;
    uint32_t in_rows, in_cols;
    /* Graphs (graph.c): the repacked descriptor at fixed device addresses
     * (for one block size), and the graphs made so far. */
    llmi_cuda_graph_words glay;
    uint32_t g_block_size;
    uint32_t *gwords;
    llmi_cuda_staging gstage;
    llmi_cuda_graph graphs[LLMI_CUDA_GRAPHS];
    uint32_t n_graphs, next_graph;
    bool graphs_off; /* LLM_CUDA_GRAPHS=0 */
    /* LLM_CUDA_BATCH_INVARIANT=1: every matmul on llmi_cu_mm_tc (or, for a
     * weight it does not take, the GEMV kernel 8 rows at a time) and every
     * attention row on the split kernel, so that a row's results never
     * depend on the batch (docs/cuda.md). */
    bool batch_invariant;
    /* The LoRA adapters of the step being enqueued (lora.c): n is 0 outside
     * llmi_cuda_lora_begin .. _end, in steps without adapters and on a
     * tensor-parallel rank (whose table does not take them). */
    struct {
        uint32_t n;
        const llm_adapter *const *adapters; /* the step's [n] */
        const float *scale;                 /* the step's [n] */
        const llmi_cuda_adapter **dev;      /* [n]: their device copies */
        uint32_t cap;                       /* of dev */
        const uint32_t *seg;                /* host [n + 1] (lora_plan.h) */
        const uint32_t *rows;               /* device: rows grouped by adapter */
    } lora;
} llmi_cuda_step;

/* The descriptor's arrays as device pointers, and the attention's split
 * between the prefill and the split kernel (llmi_cuda_prefill_plan; zero
 * and NULL: every row takes the split kernel, as graphs do). */
typedef struct llmi_cuda_dev_step {
    const int32_t *token;
    const uint32_t *pos, *seq, *block_start, *blocks, *logit_rows;
    const uint32_t *tiles, *decode_rows;
    uint32_t n_tiles, n_decode_rows;
    /* A step with adapters: its rows grouped by adapter (device) and the
     * groups' bounds (host, in the descriptor's pinned staging), from
     * llmi_cuda_lora_group; NULL otherwise. */
    const uint32_t *lora_rows, *lora_seg;
} llmi_cuda_dev_step;

/* llmi_cuda_check that also clears CUDA's per-thread last error after a
 * failure that is not sticky (an allocation refused): the launchers report
 * cudaGetLastError(), which would otherwise repeat it at the next launch. */
static inline llm_status llmi_cuda_call(cudaError_t err, const char *what) {
    if (err != cudaSuccess)
        cudaGetLastError();
    return llmi_cuda_check(err, what);
}

/* ---- backend.c ---- */

/* Makes the instance's device current on the calling thread (CUDA keeps
 * the current device per thread, and sessions move between threads). */
llm_status llmi_cuda_use_device(int device);
/* cudaMalloc of `bytes` (> 0); when the device is out of memory,
 * LLM_ERR_OUT_OF_MEMORY saying what needed how much and how much is free. */
llm_status llmi_cuda_alloc(void **out, size_t bytes, const char *what);
/* Waits until `s` may be written again. */
llm_status llmi_cuda_staging_wait(llmi_cuda_staging *s);
llm_status llmi_cuda_staging_init(llmi_cuda_staging *s, size_t cap);
void llmi_cuda_staging_free(llmi_cuda_staging *s);

/* ---- weights.c ---- */

llm_status llmi_cuda_weights_load(const llm_model *m, int32_t device, void **out);
void llmi_cuda_weights_free(void *weights);

/* ---- gemm.c ---- */

/* LLM_OK, or LLM_ERR_BACKEND naming `what` and cuBLASLt's words (OOM for
 * CUBLAS_STATUS_ALLOC_FAILED). */
llm_status llmi_cuda_lt_check(cublasStatus_t st, const char *what);
/* y[r][o] = sum_i W[o][i] x[r][i] (+ bias[o]) for n rows through cuBLASLt:
 * W itself when it is stored in the operand type (llmi_cuda_gemm_in_place),
 * else its rows dequantized `chunk` at a time into deq (bf16, or f32 when
 * f32 is set); x is already in that type, dense [n][W.cols] (x_ld =
 * W.cols). The plan of each shape is made on first use and kept. */
llm_status llmi_cuda_gemm(llmi_cuda_instance *inst, const llmi_cu_matrix *w, const void *x,
                          uint32_t n, const float *bias, float *y, uint32_t y_stride, bool f32,
                          void *deq, size_t deq_bytes);
void llmi_cuda_gemm_plans_free(llmi_cuda_instance *inst);

/* ---- step.c ---- */

/* Uploads the step descriptor (one copy through pinned memory) and points
 * d at its arrays on the device. */
llm_status llmi_cuda_step_upload(llmi_cuda_step *s, const llmi_step *st, llmi_cuda_dev_step *d);
/* The phases of llmi_cuda_step_layers, each enqueued on the stream, so a
 * tensor-parallel group (tp.c) can run them rank by rank and all-reduce
 * s->hout between them:
 *   embed            x = embd_scale * embed(token)
 *   layer_attention  xb = attn_norm(x) (after x += post_ffn_norm(hout) of
 *                    layer l - 1), attention, hout = Wo att
 *   layer_ffn        x += post_attn_norm(hout); xb = ffn_norm(x);
 *                    hout = Wdown act(Wgate xb) * Wup xb
 *   finish           x += post_ffn_norm(hout) of the last layer */
llm_status llmi_cuda_step_embed(llmi_cuda_step *s, const llmi_cuda_dev_step *d, uint32_t n_rows);
llm_status llmi_cuda_step_layer_attention(llmi_cuda_step *s, llmi_cuda_kv *kv, uint32_t layer,
                                          const llmi_cuda_dev_step *d, uint32_t n_rows,
                                          uint32_t block_size, uint32_t max_pos);
llm_status llmi_cuda_step_layer_ffn(llmi_cuda_step *s, uint32_t layer, uint32_t n_rows);
llm_status llmi_cuda_step_finish(llmi_cuda_step *s, uint32_t n_rows);
/* Enqueues a step's layers for n_rows rows (embedding to the last residual
 * add) on the stream, reading the descriptor at d; checks `interrupt`
 * (may be NULL) between layers. */
llm_status llmi_cuda_step_layers(llmi_cuda_step *s, llmi_cuda_kv *kv, const llmi_cuda_dev_step *d,
                                 uint32_t n_rows, uint32_t block_size, uint32_t max_pos,
                                 const atomic_int *interrupt);
/* Enqueues the logits of n (<= plan.logit_rows) rows whose indices are at
 * rows (device) into s->logits, soft-capped. */
llm_status llmi_cuda_step_logits(llmi_cuda_step *s, const uint32_t *rows, uint32_t n);
/* Copies n rows of logits from s->logits to `out`, waiting for the stream. */
llm_status llmi_cuda_step_copy_logits(llmi_cuda_step *s, uint32_t n, float *out);
/* step_run without graphs: uploads the descriptor, runs the layers and
 * copies the logits back (the device is current). */
llm_status llmi_cuda_step_run_eager(llmi_cuda_step *s, llmi_cuda_kv *kv, const llmi_step *st,
                                    float *logits);
/* Frees a step's own memory, not its graphs (llmi_cuda_step_free does both). */
void llmi_cuda_step_release(llmi_cuda_step *s);

/* ---- lora.c ---- */

/* Makes the step's adapters (st->adapters) ready for the layers enqueued
 * next: each uploaded to the instance on first use (kept by id until the
 * instance closes), the intermediate grown for st's rows; d from
 * llmi_cuda_step_upload. A no-op for a step without adapters.
 * llmi_cuda_lora_end forgets them (always called after a begin, whatever
 * the layers returned). */
llm_status llmi_cuda_lora_begin(llmi_cuda_step *s, const llmi_step *st,
                                const llmi_cuda_dev_step *d);
void llmi_cuda_lora_end(llmi_cuda_step *s);
/* Adds the updates of target t of `layer` to the rows of y (at y_stride
 * floats) whose adapter targets it, from the projection's input x (dense
 * rows of the pair's `in` floats). Enqueued on the stream; nothing between
 * begin and end, or for rows without an adapter. */
llm_status llmi_cuda_lora_apply(llmi_cuda_step *s, uint32_t layer, llmi_lora_target t,
                                const float *x, float *y, uint32_t y_stride);
/* Frees the instance's adapters and intermediate (cuda_close). */
void llmi_cuda_lora_free(llmi_cuda_instance *inst);

/* ---- graph.c ---- */

/* Runs `st` from a graph when its shape takes one: LLM_OK with *ran set, or
 * an error; *ran false means the caller runs it the plain way. */
llm_status llmi_cuda_graph_run(llmi_cuda_step *s, llmi_cuda_kv *kv, const llmi_step *st,
                               float *logits, bool *ran);
void llmi_cuda_graphs_free(llmi_cuda_step *s);
/* The ops table's step_free and step_run (graph.c, above step.c): a graph
 * when the step's shape takes one, else the plain way. */
void llmi_cuda_step_free(void *step);
llm_status llmi_cuda_step_run(void *step, void *kv, const llmi_step *st, float *logits);

/* The ops table's other step entries (step.c). */
llm_status llmi_cuda_step_create(void *backend, const llm_model *m, void *weights,
                                 uint32_t max_rows, uint32_t max_ctx, void **out);
/* The final hidden states of the wanted rows (step_run_hidden, embeddings). */
llm_status llmi_cuda_step_run_hidden(void *step, void *kv, const llmi_step *st, float *hidden);
void llmi_cuda_step_set_f32_activations(void *step, bool on);

#endif
