/* The CUDA backend's steps: the CPU's forward pass (backend/cpu/step.c),
 * feature by feature from the architecture row, as kernel launches on the
 * instance's stream:
 *   x = embd_scale * embed(token)
 *   per layer: xb = norm(x)                (fused with the previous residual add)
 *              q, k, v = Wq xb + bq, ...   (QK-norm per head, RoPE with the
 *                                           layer's own base when windowed)
 *              K/V stored at the rows' slots; att = attention (window)
 *              x += post_norm(Wo att); xb = norm(x)   (one fused kernel)
 *              gate = act(Wgate xb) * Wup xb; hout = Wdown gate
 *              (with LoRA adapters, each of these projections followed by
 *              its rows' low-rank updates: lora.c)
 *   x += post_norm(hout); logits = soft-cap(Woutput norm(x[wanted rows]))
 * Activations stay on the device from the embedding to the logits; the
 * step descriptor goes up in one copy through pinned memory and the
 * logits come back the same way. Matmuls of up to LLMI_CU_GEMV_MAX_ROWS
 * rows use the GEMV kernel on the weights as stored, wider ones the
 * tensor-core path (gemm.c). Nothing but scratch and the rows' K/V slots
 * is written, so a failed step changes only what the contract allows. */
#include "cuda_backend.h"
#include "lora_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef llmi_cuda_step cuda_step;

/* Frees what this file allocated; llmi_cuda_step_free (graph.c) drops the
 * step's graphs first. */
void llmi_cuda_step_release(cuda_step *s) {
    if (!s)
        return;
    cudaSetDevice(s->inst->device);
    cudaStreamSynchronize(s->inst->stream);
    llmi_cuda_staging_free(&s->words_stage);
    llmi_cuda_staging_free(&s->logits_stage);
    if (s->words)
        cudaFree(s->words);
    if (s->scratch)
        cudaFree(s->scratch);
    free(s->lora.dev);
    free(s);
}

void llmi_cuda_step_set_f32_activations(void *ctx, bool on) { ((cuda_step *)ctx)->f32_act = on; }

/* Device and pinned room for a descriptor of n_words words. The old
 * buffers may still be read by the step in flight: wait for it first. */
static llm_status words_reserve(cuda_step *s, size_t n_words) {
    if (n_words <= s->words_cap)
        return LLM_OK;
    size_t cap = s->words_cap * 2 > n_words ? s->words_cap * 2 : n_words;
    LLMI_TRY(llmi_cuda_call(cudaStreamSynchronize(s->inst->stream), "running the stream"));
    if (s->words)
        cudaFree(s->words);
    s->words = NULL;
    s->words_cap = 0;
    llmi_cuda_staging_free(&s->words_stage);
    LLMI_TRY(llmi_cuda_call(cudaMalloc((void **)&s->words, cap * sizeof(uint32_t)),
                            "allocating the step descriptor"));
    LLMI_TRY(llmi_cuda_staging_init(&s->words_stage, cap * sizeof(uint32_t)));
    s->words_cap = cap;
    return LLM_OK;
}

static void cut_scratch(cuda_step *s) {
    const llmi_cuda_scratch *p = &s->plan;
    char *b = s->scratch;
    s->x = (float *)(b + p->x);
    s->xb = (float *)(b + p->xb);
    s->q = (float *)(b + p->q);
    s->k = (float *)(b + p->k);
    s->v = (float *)(b + p->v);
    s->att = (float *)(b + p->att);
    s->gate = (float *)(b + p->gate);
    s->up = (float *)(b + p->up);
    s->hout = (float *)(b + p->hout);
    s->out_rows = (float *)(b + p->out_rows);
    s->logits = (float *)(b + p->logits);
    s->attn = (float *)(b + p->attn);
    s->act = p->gemm ? b + p->act : NULL;
    s->deq = p->gemm ? b + p->deq : NULL;
}

llm_status llmi_cuda_step_create(void *backend, const llm_model *m, void *weights,
                                 uint32_t max_rows, uint32_t max_ctx, void **out) {
    *out = NULL;
    llmi_cuda_instance *inst = backend;
    const llmi_cuda_weights *w = weights;
    if (w->device != inst->device)
        return llmi_cuda_error(LLM_ERR_INVALID_ARGUMENT,
                               "weights on CUDA device %d used by an instance on device %d",
                               w->device, inst->device);
    const llmi_hparams *hp = &m->hp;
    size_t attn_floats =
        llmi_cu_attention_scratch_floats(max_rows, hp->n_head, hp->head_dim, max_ctx);
    const char *invariant = getenv("LLM_CUDA_BATCH_INVARIANT");
    const bool batch_invariant = invariant && strcmp(invariant, "1") == 0;
    llmi_cuda_scratch plan;
    if (!llmi_cuda_scratch_plan(m, max_rows, attn_floats, batch_invariant, &plan))
        return llmi_cuda_error(LLM_ERR_LIMIT, "step scratch for %u rows of %u positions overflows",
                               max_rows, max_ctx);
    LLMI_TRY(llmi_cuda_use_device(inst->device));
    cuda_step *s = calloc(1, sizeof *s);
    if (!s)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: CUDA step context");
    s->inst = inst;
    s->m = m;
    s->w = w;
    s->max_rows = max_rows;
    s->max_ctx = max_ctx;
    s->q_dim = hp->n_head * hp->head_dim;
    s->kv_dim = hp->n_head_kv * hp->head_dim;
    s->plan = plan;
    const char *graphs = getenv("LLM_CUDA_GRAPHS");
    s->graphs_off = graphs && strcmp(graphs, "0") == 0;
    s->batch_invariant = batch_invariant;
    llm_status st = llmi_cuda_alloc((void **)&s->scratch, plan.size, "the step scratch");
    if (st == LLM_OK)
        st = llmi_cuda_staging_init(&s->logits_stage,
                                    (size_t)plan.logit_rows * hp->n_vocab * sizeof(float));
    /* A decode step of max_rows rows in as many sequences with a short
     * table each; longer descriptors grow it (words_reserve). */
    if (st == LLM_OK)
        st = words_reserve(s, 1024 + 8 * (size_t)max_rows);
    if (st != LLM_OK) {
        llmi_cuda_step_release(s); /* no graph exists yet */
        return st;
    }
    cut_scratch(s);
    llmi_cuda_log(LLM_LOG_DEBUG, "CUDA step context: %u rows, %u positions, %.1f MiB scratch",
                  max_rows, max_ctx, (double)plan.size / 1048576.0);
    *out = s;
    return LLM_OK;
}

/* ---- matmuls ---- */

/* Makes x (n rows of cols floats, dense) the input of the matmuls that
 * follow; the tensor-core path converts it to bf16 once for all of them. */
static llm_status mm_input(cuda_step *s, const float *x, uint32_t n, uint32_t cols) {
    s->in_x = x;
    s->in_rows = n;
    s->in_cols = cols;
    if ((!s->batch_invariant && llmi_cuda_use_gemv(n)) || s->f32_act)
        return LLM_OK;
    return llmi_cuda_call(llmi_cu_f32_to_bf16(s->inst->stream, x, cols, n, cols, s->act),
                          "converting activations to bf16");
}

/* mm with LLM_CUDA_BATCH_INVARIANT=1: the same computation for a row
 * whatever the row count. Weights the tensor-core kernel does not take
 * (Q6_K, F32, widths not a multiple of 64; or f32 activations) go
 * through the GEMV kernel at most LLMI_CU_GEMV_MAX_ROWS rows a launch,
 * whose rows do not depend on each other either. */
static llm_status mm_invariant(cuda_step *s, const llmi_cu_matrix *w, const float *b, float *y,
                               uint32_t y_stride) {
    if (!s->f32_act && llmi_cu_mm_tc_takes(w))
        return llmi_cuda_call(
            llmi_cu_mm_tc(s->inst->stream, w, s->act, s->in_cols, s->in_rows, b, y, y_stride),
            "multiplying a matrix");
    for (uint32_t r0 = 0; r0 < s->in_rows; r0 += LLMI_CU_GEMV_MAX_ROWS) {
        const uint32_t nr =
            s->in_rows - r0 < LLMI_CU_GEMV_MAX_ROWS ? s->in_rows - r0 : LLMI_CU_GEMV_MAX_ROWS;
        LLMI_TRY(
            llmi_cuda_call(llmi_cu_gemv(s->inst->stream, w, s->in_x + (size_t)r0 * s->in_cols,
                                        s->in_cols, nr, b, y + (size_t)r0 * y_stride, y_stride),
                           "multiplying a matrix"));
    }
    return LLM_OK;
}

/* y = W (the current input) + bias, y rows at y_stride floats. */
static llm_status mm(cuda_step *s, const llmi_cu_matrix *w, const llmi_cu_matrix *bias, float *y,
                     uint32_t y_stride) {
    const float *b = bias && bias->data ? (const float *)bias->data : NULL;
    if (s->batch_invariant)
        return mm_invariant(s, w, b, y, y_stride);
    if (llmi_cuda_use_gemv(s->in_rows))
        return llmi_cuda_call(
            llmi_cu_gemv(s->inst->stream, w, s->in_x, s->in_cols, s->in_rows, b, y, y_stride),
            "multiplying a matrix");
    return llmi_cuda_gemm(s->inst, w, s->f32_act ? (const void *)s->in_x : s->act, s->in_rows, b, y,
                          y_stride, s->f32_act, s->deq, s->plan.deq_bytes);
}

/* ---- one step ---- */

typedef llmi_cuda_dev_step dev_step;

static const uint32_t *dev_ptr(const cuda_step *s, const llmi_step *st, const void *host) {
    return s->words + ((const uint32_t *)host - st->words);
}

/* Whether `count` words at p lie inside the descriptor's buffer: the
 * device addresses are offsets into it. */
static bool in_words(const llmi_step *st, const void *p, size_t count) {
    const uint32_t *w = p;
    return w >= st->words && w <= st->words + st->n_words &&
           count <= (size_t)(st->words + st->n_words - w);
}

static llm_status upload_step(cuda_step *s, const llmi_step *st, dev_step *d) {
    if (!in_words(st, st->token, st->n_rows) || !in_words(st, st->pos, st->n_rows) ||
        !in_words(st, st->seq, st->n_rows) || !in_words(st, st->block_start, st->n_seqs + 1) ||
        !in_words(st, st->blocks, st->block_start[st->n_seqs]) ||
        !in_words(st, st->logit_rows, st->n_logits))
        return llmi_cuda_error(LLM_ERR_INTERNAL,
                               "step descriptor: an array lies outside its words buffer");
    /* The attention's tile table and decode rows follow the descriptor's
     * words in the same copy: at most n_rows pairs and n_rows rows; then,
     * with adapters, the rows grouped by adapter and the groups' bounds. */
    const size_t lora_words = st->n_adapters ? (size_t)st->n_rows + st->n_adapters + 1 : 0;
    const size_t room = 3 * (size_t)st->n_rows + lora_words;
    LLMI_TRY(words_reserve(s, st->n_words + room));
    llmi_cuda_staging *stage = &s->words_stage;
    LLMI_TRY(llmi_cuda_staging_wait(stage));
    uint32_t *host = stage->host, *tiles = host + st->n_words, *decode = tiles + 2 * st->n_rows;
    memcpy(host, st->words, st->n_words * sizeof(uint32_t));
    if (s->batch_invariant) /* every row on the split kernel (below) */
        d->n_tiles = d->n_decode_rows = 0;
    else
        llmi_cuda_prefill_plan(st->pos, st->seq, st->n_rows, s->m->hp.head_dim, tiles, &d->n_tiles,
                               decode, &d->n_decode_rows);
    uint32_t *lora_rows = decode + st->n_rows, *lora_seg = lora_rows + st->n_rows;
    if (st->n_adapters &&
        !llmi_cuda_lora_group(st->row_adapter, st->n_rows, st->n_adapters, lora_rows, lora_seg))
        return llmi_cuda_error(LLM_ERR_INTERNAL, "step descriptor: a row names adapter past %u",
                               st->n_adapters);
    const size_t bytes = (st->n_words + room) * sizeof(uint32_t);
    LLMI_TRY(llmi_cuda_call(
        cudaMemcpyAsync(s->words, stage->host, bytes, cudaMemcpyHostToDevice, s->inst->stream),
        "uploading the step"));
    LLMI_TRY(llmi_cuda_call(cudaEventRecord(stage->done, s->inst->stream), "uploading the step"));
    stage->pending = true;
    d->token = (const int32_t *)dev_ptr(s, st, st->token);
    d->pos = dev_ptr(s, st, st->pos);
    d->seq = dev_ptr(s, st, st->seq);
    d->block_start = dev_ptr(s, st, st->block_start);
    d->blocks = dev_ptr(s, st, st->blocks);
    d->logit_rows = dev_ptr(s, st, st->logit_rows);
    d->tiles = s->words + st->n_words;
    d->decode_rows = d->tiles + 2 * st->n_rows;
    d->lora_rows = st->n_adapters ? d->decode_rows + st->n_rows : NULL;
    d->lora_seg = st->n_adapters ? lora_seg : NULL;
    return LLM_OK;
}

llm_status llmi_cuda_step_upload(cuda_step *s, const llmi_step *st, dev_step *d) {
    return upload_step(s, st, d);
}

#define KCHECK(call, what) LLMI_TRY(llmi_cuda_call((call), (what)))

static const float *vec(const llmi_cu_matrix *w) { return (const float *)w->data; }

/* The rows' geometry, as launch parameters. */
typedef struct step_geom {
    uint32_t n, block_size, max_pos;
} step_geom;

#define LW(role) llmi_cuda_layer_w(w, l, role)

/* Where a layer's q, k and v rows are, at what stride in floats. */
typedef struct qkv_rows {
    float *q, *k, *v;
    uint32_t q_stride, kv_stride;
} qkv_rows;

/* q, k and v of the current input: one product over Q, K and V stacked
 * when they lie one after another in the arena (rows [q | k | v] in the
 * scratch's q region), else three. Each output row is the same product
 * either way. QK-norm reads q and k as dense rows of heads: unfused. */
static llm_status qkv_products(cuda_step *s, uint32_t l, qkv_rows *out) {
    const llmi_cuda_weights *w = s->w;
    const llmi_cu_matrix *mats[3] = {LW(LLMI_ROLE_Q), LW(LLMI_ROLE_K), LW(LLMI_ROLE_V)};
    const llmi_cu_matrix *biases[3] = {LW(LLMI_ROLE_Q_BIAS), LW(LLMI_ROLE_K_BIAS),
                                       LW(LLMI_ROLE_V_BIAS)};
    llmi_cu_matrix qkv, bias;
    if (!LW(LLMI_ROLE_Q_NORM)->data && !LW(LLMI_ROLE_K_NORM)->data &&
        llmi_cuda_stack_rows(mats, 3, &qkv) && llmi_cuda_join_vectors(biases, 3, &bias)) {
        const uint32_t stride = s->q_dim + 2 * s->kv_dim;
        *out = (qkv_rows){s->q, s->q + s->q_dim, s->q + s->q_dim + s->kv_dim, stride, stride};
        return mm(s, &qkv, &bias, s->q, stride);
    }
    *out = (qkv_rows){s->q, s->k, s->v, s->q_dim, s->kv_dim};
    LLMI_TRY(mm(s, mats[0], biases[0], s->q, s->q_dim));
    LLMI_TRY(mm(s, mats[1], biases[1], s->k, s->kv_dim));
    return mm(s, mats[2], biases[2], s->v, s->kv_dim);
}

static llm_status attention_block(cuda_step *s, llmi_cuda_kv *kv, uint32_t l, const step_geom *g,
                                  const dev_step *d) {
    const llmi_hparams *hp = &s->m->hp;
    const llmi_cuda_weights *w = s->w;
    cudaStream_t stream = s->inst->stream;
    const uint32_t n = g->n;
    LLMI_TRY(mm_input(s, s->xb, n, hp->n_embd));
    qkv_rows r;
    LLMI_TRY(qkv_products(s, l, &r));
    /* Before QK-norm and RoPE, as on the CPU; on the fused product each
     * update lands in its own columns of the [q | k | v] rows. */
    LLMI_TRY(llmi_cuda_lora_apply(s, l, LLMI_LORA_Q, s->xb, r.q, r.q_stride));
    LLMI_TRY(llmi_cuda_lora_apply(s, l, LLMI_LORA_K, s->xb, r.k, r.kv_stride));
    LLMI_TRY(llmi_cuda_lora_apply(s, l, LLMI_LORA_V, s->xb, r.v, r.kv_stride));
    /* QK-norm: each head normed on its own, before RoPE. */
    if (LW(LLMI_ROLE_Q_NORM)->data)
        KCHECK(llmi_cu_rmsnorm(stream, r.q, vec(LW(LLMI_ROLE_Q_NORM)), hp->rms_eps, n * hp->n_head,
                               hp->head_dim, r.q),
               "QK-norm");
    if (LW(LLMI_ROLE_K_NORM)->data)
        KCHECK(llmi_cu_rmsnorm(stream, r.k, vec(LW(LLMI_ROLE_K_NORM)), hp->rms_eps,
                               n * hp->n_head_kv, hp->head_dim, r.k),
               "QK-norm");
    /* Windowed layers rotate with their own base and scale (Gemma 3). */
    const bool windowed = llmi_layer_windowed(&hp->features, l);
    const float base = windowed ? hp->features.swa_rope_base : hp->rope_base;
    const float scale = windowed ? hp->features.swa_rope_freq_scale : hp->rope_freq_scale;
    const float *freq_div = vec(llmi_cuda_model_w(w, LLMI_ROLE_ROPE_FREQS));
    KCHECK(llmi_cu_rope(stream, r.q, r.q_stride, d->pos, n, hp->n_head, hp->head_dim, hp->rope_dim,
                        (int)hp->rope_layout, base, scale, freq_div),
           "RoPE");
    KCHECK(llmi_cu_rope(stream, r.k, r.kv_stride, d->pos, n, hp->n_head_kv, hp->head_dim,
                        hp->rope_dim, (int)hp->rope_layout, base, scale, freq_div),
           "RoPE");
    void *k_cache = kv->caches[2 * (size_t)l], *v_cache = kv->caches[2 * (size_t)l + 1];
    KCHECK(llmi_cu_kv_store(stream, k_cache, v_cache, kv->type, s->kv_dim, r.k, r.kv_stride, r.v,
                            r.kv_stride, d->pos, d->seq, d->block_start, d->blocks, g->block_size,
                            n),
           "storing K/V");
    const llmi_cu_attention_args a = {
        .q = r.q,
        .q_stride = r.q_stride,
        .out = s->att,
        .out_stride = s->q_dim,
        .k_cache = k_cache,
        .v_cache = v_cache,
        .cache_type = kv->type,
        .n_rows = n,
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .kv_dim = s->kv_dim,
        .block_size = g->block_size,
        .pos = d->pos,
        .seq = d->seq,
        .block_start = d->block_start,
        .blocks = d->blocks,
        .max_pos = g->max_pos,
        .scale = 1.0f / sqrtf((float)hp->head_dim),
        .window = windowed ? hp->features.swa_window : 0,
        .scratch = s->attn,
        .tiles = d->tiles,
        .n_tiles = d->n_tiles,
        .decode_rows = d->decode_rows,
        .n_decode_rows = d->n_decode_rows,
    };
    KCHECK(llmi_cu_attention(stream, &a), "attention");
    LLMI_TRY(mm_input(s, s->att, n, s->q_dim));
    LLMI_TRY(mm(s, LW(LLMI_ROLE_O), NULL, s->hout, hp->n_embd));
    return llmi_cuda_lora_apply(s, l, LLMI_LORA_O, s->att, s->hout, hp->n_embd);
}

/* x += post_attn_norm(hout); xb = ffn_norm(x); hout = down(act(gate xb) *
 * up xb); the residual add of hout is the next norm's. */
static llm_status ffn_block(cuda_step *s, uint32_t l, uint32_t n) {
    const llmi_hparams *hp = &s->m->hp;
    const llmi_cuda_weights *w = s->w;
    KCHECK(llmi_cu_add_rmsnorm(s->inst->stream, s->x, s->hout, vec(LW(LLMI_ROLE_POST_ATTN_NORM)),
                               vec(LW(LLMI_ROLE_FFN_NORM)), hp->rms_eps, n, hp->n_embd, s->xb),
           "residual add and norm");
    LLMI_TRY(mm_input(s, s->xb, n, hp->n_embd));
    LLMI_TRY(mm(s, LW(LLMI_ROLE_GATE), NULL, s->gate, hp->n_ff));
    LLMI_TRY(mm(s, LW(LLMI_ROLE_UP), NULL, s->up, hp->n_ff));
    LLMI_TRY(llmi_cuda_lora_apply(s, l, LLMI_LORA_GATE, s->xb, s->gate, hp->n_ff));
    LLMI_TRY(llmi_cuda_lora_apply(s, l, LLMI_LORA_UP, s->xb, s->up, hp->n_ff));
    KCHECK(llmi_cu_glu(s->inst->stream, s->gate, s->up, n, hp->n_ff,
                       hp->features.ffn_act == LLMI_FFN_GEGLU),
           "the FFN activation");
    LLMI_TRY(mm_input(s, s->gate, n, hp->n_ff));
    LLMI_TRY(mm(s, LW(LLMI_ROLE_DOWN), NULL, s->hout, hp->n_embd));
    return llmi_cuda_lora_apply(s, l, LLMI_LORA_DOWN, s->gate, s->hout, hp->n_embd);
#undef LW
}

/* ---- the phases of a step (cuda_backend.h): the single-GPU path runs
 * them back to back, a tensor-parallel group (tp.c) rank by rank with an
 * all-reduce of hout after each layer phase ---- */

llm_status llmi_cuda_step_embed(cuda_step *s, const dev_step *d, uint32_t n) {
    const llmi_hparams *hp = &s->m->hp;
    KCHECK(llmi_cu_embed(s->inst->stream, llmi_cuda_model_w(s->w, LLMI_ROLE_TOKEN_EMBD), d->token,
                         n, hp->features.embd_scale, s->x),
           "embedding");
    return LLM_OK;
}

llm_status llmi_cuda_step_layer_attention(cuda_step *s, llmi_cuda_kv *kv, uint32_t l,
                                          const dev_step *d, uint32_t n, uint32_t block_size,
                                          uint32_t max_pos) {
    const llmi_hparams *hp = &s->m->hp;
    const llmi_cuda_weights *w = s->w;
    cudaStream_t stream = s->inst->stream;
    const step_geom g = {n, block_size, max_pos};
    const float *attn_norm = vec(llmi_cuda_layer_w(w, l, LLMI_ROLE_ATTN_NORM));
    if (l == 0)
        KCHECK(llmi_cu_rmsnorm(stream, s->x, attn_norm, hp->rms_eps, n, hp->n_embd, s->xb),
               "the attention norm");
    else
        KCHECK(llmi_cu_add_rmsnorm(stream, s->x, s->hout,
                                   vec(llmi_cuda_layer_w(w, l - 1, LLMI_ROLE_POST_FFN_NORM)),
                                   attn_norm, hp->rms_eps, n, hp->n_embd, s->xb),
               "residual add and norm");
    return attention_block(s, kv, l, &g, d);
}

llm_status llmi_cuda_step_layer_ffn(cuda_step *s, uint32_t l, uint32_t n) {
    return ffn_block(s, l, n);
}

llm_status llmi_cuda_step_finish(cuda_step *s, uint32_t n) {
    const llmi_hparams *hp = &s->m->hp;
    if (hp->n_layer > 0)
        KCHECK(llmi_cu_add_rmsnorm(
                   s->inst->stream, s->x, s->hout,
                   vec(llmi_cuda_layer_w(s->w, hp->n_layer - 1, LLMI_ROLE_POST_FFN_NORM)), NULL,
                   hp->rms_eps, n, hp->n_embd, s->xb),
               "residual add");
    return LLM_OK;
}

llm_status llmi_cuda_step_layers(cuda_step *s, llmi_cuda_kv *kv, const dev_step *d, uint32_t n_rows,
                                 uint32_t block_size, uint32_t max_pos,
                                 const atomic_int *interrupt) {
    LLMI_TRY(llmi_cuda_step_embed(s, d, n_rows));
    for (uint32_t l = 0; l < s->m->hp.n_layer; l++) {
        /* Stops issuing work; what was issued finishes and writes only the
         * rows' K/V slots. */
        if (interrupt && atomic_load_explicit(interrupt, memory_order_relaxed))
            return llmi_cuda_error(LLM_ERR_CANCELLED,
                                   "interrupted (llm_session_interrupt) at layer %u", l);
        LLMI_TRY(llmi_cuda_step_layer_attention(s, kv, l, d, n_rows, block_size, max_pos));
        LLMI_TRY(llmi_cuda_step_layer_ffn(s, l, n_rows));
    }
    return llmi_cuda_step_finish(s, n_rows);
}

/* out_rows = the output norm of rows `rows` (n <= plan.logit_rows) of x. */
static llm_status step_output_rows(cuda_step *s, const uint32_t *rows, uint32_t n) {
    const llmi_hparams *hp = &s->m->hp;
    cudaStream_t stream = s->inst->stream;
    KCHECK(llmi_cu_gather_rows(stream, s->x, rows, n, hp->n_embd, s->out_rows), "gathering rows");
    KCHECK(llmi_cu_rmsnorm(stream, s->out_rows, vec(llmi_cuda_model_w(s->w, LLMI_ROLE_OUTPUT_NORM)),
                           hp->rms_eps, n, hp->n_embd, s->out_rows),
           "the output norm");
    return LLM_OK;
}

llm_status llmi_cuda_step_logits(cuda_step *s, const uint32_t *rows, uint32_t n) {
    const llmi_hparams *hp = &s->m->hp;
    const llmi_cuda_weights *w = s->w;
    cudaStream_t stream = s->inst->stream;
    LLMI_TRY(step_output_rows(s, rows, n));
    LLMI_TRY(mm_input(s, s->out_rows, n, hp->n_embd));
    LLMI_TRY(mm(s, llmi_cuda_model_w(w, LLMI_ROLE_OUTPUT), NULL, s->logits, hp->n_vocab));
    const float cap = hp->features.logit_softcap;
    if (cap > 0.0f)
        KCHECK(llmi_cu_softcap(stream, s->logits, (size_t)n * hp->n_vocab, cap),
               "the logit soft-cap");
    return LLM_OK;
}

/* The layers of a step uploaded to d, with its adapters' updates. */
static llm_status run_layers(cuda_step *s, llmi_cuda_kv *kv, const llmi_step *st,
                             const dev_step *d) {
    llm_status rc = llmi_cuda_lora_begin(s, st, d);
    if (rc == LLM_OK)
        rc = llmi_cuda_step_layers(s, kv, d, st->n_rows, st->block_size,
                                   llmi_cuda_max_pos(st->pos, st->n_rows), st->interrupt);
    llmi_cuda_lora_end(s);
    return rc;
}

llm_status llmi_cuda_step_copy_logits(cuda_step *s, uint32_t n, float *out) {
    const size_t bytes = (size_t)n * s->m->hp.n_vocab * sizeof(float);
    cudaStream_t stream = s->inst->stream;
    KCHECK(cudaMemcpyAsync(s->logits_stage.host, s->logits, bytes, cudaMemcpyDeviceToHost, stream),
           "copying logits");
    KCHECK(cudaStreamSynchronize(stream), "running the step");
    memcpy(out, s->logits_stage.host, bytes);
    return LLM_OK;
}

llm_status llmi_cuda_step_run_eager(cuda_step *s, llmi_cuda_kv *kv, const llmi_step *st,
                                    float *logits) {
    dev_step d = {0};
    LLMI_TRY(upload_step(s, st, &d));
    LLMI_TRY(run_layers(s, kv, st, &d));
    /* The wanted rows a pass of plan.logit_rows at a time. */
    const uint32_t n_vocab = s->m->hp.n_vocab;
    for (uint32_t c0 = 0; c0 < st->n_logits; c0 += s->plan.logit_rows) {
        const uint32_t cn =
            st->n_logits - c0 < s->plan.logit_rows ? st->n_logits - c0 : s->plan.logit_rows;
        LLMI_TRY(llmi_cuda_step_logits(s, d.logit_rows + c0, cn));
        LLMI_TRY(llmi_cuda_step_copy_logits(s, cn, logits + (size_t)c0 * n_vocab));
    }
    /* Without logits the step may still be running: sync reports a fault. */
    return LLM_OK;
}

/* step_run's layers, then the wanted rows' normed states instead of logits,
 * plan.logit_rows at a time through the logits' host staging (which holds
 * n_vocab >= n_embd floats a row). Always the plain way: the captured
 * graphs end in the LM head. */
llm_status llmi_cuda_step_run_hidden(void *ctx, void *kv_store, const llmi_step *st,
                                     float *hidden) {
    cuda_step *s = ctx;
    llmi_cuda_kv *kv = kv_store;
    const uint32_t n_embd = s->m->hp.n_embd;
    if (n_embd > s->m->hp.n_vocab)
        return llmi_cuda_error(LLM_ERR_UNSUPPORTED,
                               "hidden states wider (%u) than the vocabulary (%u)", n_embd,
                               s->m->hp.n_vocab);
    LLMI_TRY(llmi_cuda_use_device(s->inst->device));
    dev_step d = {0};
    LLMI_TRY(upload_step(s, st, &d));
    LLMI_TRY(run_layers(s, kv, st, &d));
    cudaStream_t stream = s->inst->stream;
    for (uint32_t c0 = 0; c0 < st->n_logits; c0 += s->plan.logit_rows) {
        const uint32_t cn =
            st->n_logits - c0 < s->plan.logit_rows ? st->n_logits - c0 : s->plan.logit_rows;
        const size_t bytes = (size_t)cn * n_embd * sizeof(float);
        LLMI_TRY(step_output_rows(s, d.logit_rows + c0, cn));
        KCHECK(cudaMemcpyAsync(s->logits_stage.host, s->out_rows, bytes, cudaMemcpyDeviceToHost,
                               stream),
               "copying hidden states");
        KCHECK(cudaStreamSynchronize(stream), "running the step");
        memcpy(hidden + (size_t)c0 * n_embd, s->logits_stage.host, bytes);
    }
    return LLM_OK;
}
