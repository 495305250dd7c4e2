/* The CPU backend's steps (backend/backend.h): the forward pass for
 * Llama-family decoders:
 *   x = embed(token)
 *   per layer: x += Wo * attn(rope(Wq*norm(x)), rope(Wk*norm(x)), Wv*norm(x))
 *              x += Wdown * (silu(Wgate*norm(x)) * Wup*norm(x))
 *   logits = Woutput * norm(x)
 * with the steps the model's architecture row switches on (model/arch.h:
 * Q/K/V biases, QK-norm, post-norms, GeGLU, embedding scale, logit soft-cap,
 * rope frequency divisors, sliding windows with their own RoPE base, a routed
 * mixture-of-experts FFN in moe.c), tested by feature, never by architecture
 * name. Encoders (features.encoder, BERT) take another shape of the same
 * steps:
 *   x = LayerNorm(embed(token) + pos_embd(pos) + token_types(0))
 *   per layer: x = LayerNorm(x + Wo * attn(Wq*x + b, Wk*x + b, Wv*x + b) + b)
 *              x = LayerNorm(x + Wdown * gelu(Wup*x + b) + b)
 * with no RoPE and every row of a sequence attending to all of that
 * sequence's positions held after the step (no causal mask).
 * Matmuls take all rows of the batch at once so each weight is read once.
 * Quantized weights multiply 8-bit activations (llmi_matmul_act, as llama.cpp
 * does); a matmul input is quantized once and shared by the matmuls that
 * read it (Q, K, V; gate, up). */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/lora.h"
#include "backend/cpu/moe.h"
#include "core/quant.h"
#include "kv/kv.h"

#include <math.h>

typedef struct cpu_forward cpu_forward;

struct cpu_forward {
    const llm_model *m;
    /* The weights the step reads: the backend's (with packed copies) or the
     * model's own views. */
    const llmi_weight *w;
    const llmi_layer *layers;
    llmi_pool *pool;
    uint32_t max_rows, max_ctx;
    uint32_t q_dim, kv_dim;
    float *x, *xb, *q, *k, *v, *att, *gate, *up, *hout; /* [max_rows][dim] */
    float *scores;                                      /* [threads][max_ctx] */
    float *rope_cs;     /* [max_rows][rope_dim]: cos, sin interleaved */
    float *rope_cs_swa; /* the same for windowed layers with their own base, else NULL */
    float *out_rows;    /* [max_rows][n_embd]: normed rows that want logits */
    uint32_t *seq_end;  /* [max_rows]: encoders: positions each sequence holds after the step */
    void *act_scratch;  /* 8-bit activations for max_rows rows of any matmul input */
    /* The current matmul input (act_begin) and its quantization, if any. */
    const float *act_x;
    uint32_t act_rows;
    int64_t act_cols;
    bool act_ready;
    llmi_ttype act_type;
    llmi_act act;
    bool f32_activations; /* skip 8-bit activations (tests against llama.cpp) */
    llmi_cpu_moe *moe;    /* the routed FFN's scratch; NULL without experts */
    /* Tensor parallelism (backend/tp; tp.gather NULL alone): the rows
     * gathered from every rank, and this rank's slice of an O or down
     * output before its gather. */
    llmi_cpu_tp_hooks tp;
    float *tp_att;  /* [max_rows][tp.q_dim] */
    float *tp_ff;   /* [max_rows][tp.n_ff] */
    float *tp_part; /* [max_rows][n_embd] */
    /* LoRA scratch, grown on first use (lora.c). */
    llmi_cpu_lora lora;
};

static void free_buffers(cpu_forward *f) {
    float **bufs[] = {&f->x,        &f->xb,     &f->q,     &f->k,      &f->v,       &f->att,
                      &f->gate,     &f->up,     &f->hout,  &f->scores, &f->rope_cs, &f->rope_cs_swa,
                      &f->out_rows, &f->tp_att, &f->tp_ff, &f->tp_part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        llmi_free_aligned(*bufs[i]);
        *bufs[i] = NULL;
    }
    llmi_free_aligned(f->act_scratch);
    f->act_scratch = NULL;
    llmi_free(f->seq_end);
    f->seq_end = NULL;
    llmi_cpu_moe_free(f->moe);
    f->moe = NULL;
    llmi_cpu_lora_free(&f->lora);
}

/* Scratch for the activations of every matmul of the model at max_rows rows:
 * the largest need over the weights (0 if all are float); false if a size
 * overflows. */
static bool act_scratch_size(const llm_model *m, uint32_t max_rows, size_t *out) {
    size_t need = 0;
    bool ok = max_rows <= INT32_MAX;
#define ACT_NEED(w)                                                                                \
    do {                                                                                           \
        size_t b_ = llmi_act_scratch_bytes((w).type, (w).cols, (int)max_rows);                     \
        if (b_ == 0 && llmi_act_type((w).type) != LLMI_T_F32)                                      \
            ok = false;                                                                            \
        need = b_ > need ? b_ : need;                                                              \
    } while (0)
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        for (int r = 0; r < LLMI_LAYER_ROLES; r++)
            if (m->layers[l].w[r].data && llmi_layer_roles[r].out != LLMI_DIM_ONE)
                ACT_NEED(m->layers[l].w[r]);
    ACT_NEED(m->w[LLMI_ROLE_OUTPUT]);
#undef ACT_NEED
    *out = need;
    return ok;
}

static float *alloc_rows(uint32_t rows, uint32_t dim) {
    size_t n;
    if (!llmi_mul_ok((size_t)rows * dim, sizeof(float), &n))
        return NULL;
    return llmi_malloc_aligned(n);
}

/* max_rows and max_ctx are > 0 (checked by the engine). */
llm_status llmi_cpu_step_create(void *backend, const llm_model *m, void *weights, uint32_t max_rows,
                                uint32_t max_ctx, void **out) {
    const llmi_cpu_weights *cw = weights;
    llmi_pool *pool = backend;
    *out = NULL;
    cpu_forward *f = llmi_calloc(1, sizeof *f);
    if (!f)
        return llmi_oom("forward pass");
    const llmi_hparams *hp = &m->hp;
    f->m = m;
    f->w = cw ? cw->w : m->w;
    f->layers = cw ? cw->layers : m->layers;
    f->pool = pool;
    f->max_rows = max_rows;
    f->max_ctx = max_ctx;
    f->q_dim = hp->n_head * hp->head_dim;
    f->kv_dim = hp->n_head_kv * hp->head_dim;
    uint32_t embd = hp->n_embd;
    f->x = alloc_rows(max_rows, embd);
    f->xb = alloc_rows(max_rows, embd);
    f->q = alloc_rows(max_rows, f->q_dim);
    f->k = alloc_rows(max_rows, f->kv_dim);
    f->v = alloc_rows(max_rows, f->kv_dim);
    f->att = alloc_rows(max_rows, f->q_dim);
    f->gate = alloc_rows(max_rows, hp->n_ff);
    f->up = alloc_rows(max_rows, hp->n_ff);
    f->hout = alloc_rows(max_rows, embd > f->q_dim ? embd : f->q_dim);
    f->scores = alloc_rows((uint32_t)llmi_pool_size(pool), max_ctx);
    f->rope_cs = alloc_rows(max_rows, hp->rope_dim);
    bool swa_base = hp->features.swa != LLMI_SWA_NONE &&
                    (hp->features.swa_rope_base != hp->rope_base ||
                     hp->features.swa_rope_freq_scale != hp->rope_freq_scale);
    if (swa_base)
        f->rope_cs_swa = alloc_rows(max_rows, hp->rope_dim);
    f->out_rows = alloc_rows(max_rows, embd);
    const bool encoder = hp->features.encoder;
    if (encoder)
        f->seq_end = llmi_malloc((size_t)max_rows * sizeof *f->seq_end);
    size_t act_bytes = 0;
    if (!act_scratch_size(m, max_rows, &act_bytes)) {
        llmi_cpu_step_free(f);
        return llmi_error(LLM_ERR_LIMIT, "forward pass: %u rows per batch is too many", max_rows);
    }
    if (act_bytes)
        f->act_scratch = llmi_malloc_aligned(act_bytes);
    if (!f->x || !f->xb || !f->q || !f->k || !f->v || !f->att || !f->gate || !f->up || !f->hout ||
        !f->scores || !f->rope_cs || (swa_base && !f->rope_cs_swa) || !f->out_rows ||
        (act_bytes && !f->act_scratch) || (encoder && !f->seq_end)) {
        llmi_cpu_step_free(f);
        return llmi_oom("forward pass buffers");
    }
    llm_status st = hp->features.n_expert ? llmi_cpu_moe_create(m, max_rows, &f->moe) : LLM_OK;
    if (st != LLM_OK) {
        llmi_cpu_step_free(f);
        return st;
    }
    *out = f;
    return LLM_OK;
}

void llmi_cpu_step_set_f32_activations(void *ctx, bool on) {
    ((cpu_forward *)ctx)->f32_activations = on;
}

llm_status llmi_cpu_step_set_tp(void *ctx, const llmi_cpu_tp_hooks *hooks) {
    cpu_forward *f = ctx;
    float **bufs[] = {&f->tp_att, &f->tp_ff, &f->tp_part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        llmi_free_aligned(*bufs[i]);
        *bufs[i] = NULL;
    }
    f->tp = (llmi_cpu_tp_hooks){0};
    if (!hooks)
        return LLM_OK;
    const uint32_t n_ff = hooks->n_ff ? hooks->n_ff : 1;
    f->tp_att = alloc_rows(f->max_rows, hooks->q_dim);
    f->tp_ff = alloc_rows(f->max_rows, n_ff);
    f->tp_part = alloc_rows(f->max_rows, f->m->hp.n_embd);
    if (!f->tp_att || !f->tp_ff || !f->tp_part)
        return llmi_oom("tensor-parallel rows");
    f->tp = *hooks;
    return LLM_OK;
}

void llmi_cpu_step_free(void *ctx) {
    cpu_forward *f = ctx;
    if (!f)
        return;
    free_buffers(f);
    llmi_free(f);
}

/* ---- matmuls ---- */

/* Makes x (n rows of cols floats) the input of the matmuls that follow. */
static void act_begin(cpu_forward *f, const float *x, uint32_t n, int64_t cols) {
    f->act_x = x;
    f->act_rows = n;
    f->act_cols = cols;
    f->act_ready = false;
}

/* y = w * (the current input). The input is quantized for w's activation
 * type on first use and reused by the next matmuls of the same type. */
static void act_matmul(cpu_forward *f, const llmi_weight *w, float *y) {
    if (f->f32_activations) {
        llmi_matmul(f->pool, w, f->act_x, (int)f->act_rows, y);
        return;
    }
    const llmi_ttype at = llmi_act_type(w->type);
    if (!f->act_ready || f->act_type != at) {
        llmi_act_prepare(f->pool, w->type, f->act_x, (int)f->act_rows, f->act_cols, f->act_scratch,
                         &f->act);
        f->act_ready = true;
        f->act_type = at;
    }
    llmi_matmul_act(f->pool, w, &f->act, y);
}

/* The first of this step's output columns of target t among the whole
 * projection's, and the whole projection's width: 0 and y_cols on one CPU,
 * the rank's slice under tensor parallelism (the hooks say where). */
static void lora_columns(const cpu_forward *f, llmi_lora_target t, uint32_t y_cols, uint32_t *begin,
                         uint32_t *full) {
    const llmi_cpu_tp_hooks *tp = &f->tp;
    *begin = 0;
    *full = y_cols;
    if (!tp->gather)
        return;
    switch (t) {
    case LLMI_LORA_Q:
        *begin = tp->q_begin, *full = tp->q_dim;
        break;
    case LLMI_LORA_K:
    case LLMI_LORA_V:
        *begin = tp->kv_begin, *full = tp->kv_dim;
        break;
    case LLMI_LORA_GATE:
    case LLMI_LORA_UP:
        *begin = tp->ff_begin, *full = tp->n_ff;
        break;
    default: /* O, down */
        *begin = tp->embd_begin, *full = f->m->hp.n_embd;
        break;
    }
}

/* The LoRA update of one projection (lora.c) from its whole input rows x;
 * y holds this step's output columns. Nothing without adapters. */
static llm_status lora(cpu_forward *f, const llmi_step *st, uint32_t layer, llmi_lora_target t,
                       const float *x, uint32_t x_cols, float *y, uint32_t y_cols) {
    if (!st->n_adapters)
        return LLM_OK;
    uint32_t begin, full;
    lora_columns(f, t, y_cols, &begin, &full);
    return llmi_cpu_lora_apply(&f->lora, f->pool, st, layer, t, x, x_cols, y, y_cols, begin, full);
}

llm_status llmi_cpu_step_lora_reserve(void *ctx, const llmi_step *st) {
    cpu_forward *f = ctx;
    uint32_t max_rank = 0;
    for (uint32_t a = 0; a < st->n_adapters; a++)
        max_rank = st->adapters[a]->max_rank > max_rank ? st->adapters[a]->max_rank : max_rank;
    if (!max_rank)
        return LLM_OK;
    uint32_t widest = 0; /* of this step's output slices, for the windows */
    if (f->tp.gather) {
        const uint32_t cols[] = {f->q_dim, f->kv_dim, f->m->hp.n_ff, f->m->hp.n_embd};
        for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
            widest = cols[i] > widest ? cols[i] : widest;
    }
    return llmi_cpu_lora_reserve(&f->lora, st->n_rows, max_rank, widest);
}

/* ---- rotary position embedding ---- */

/* Angles follow llama.cpp's recurrence (theta_i = pos * scale^i in float,
 * scale = base^(-2/rope_dim)) rather than a fresh pow() per pair, so our
 * rotations round the way the reference implementation's do. A model's
 * rope_freqs (Llama 3.1) divides pair i's angle by its factor (freq_div,
 * or NULL); linear scaling then multiplies it by freq_scale, in that order
 * as ggml does. */
static void rope_table(const llmi_hparams *hp, float base, float freq_scale, const float *freq_div,
                       const llmi_step *st, float *table) {
    uint32_t half = hp->rope_dim / 2;
    float scale = powf(base, -2.0f / (float)hp->rope_dim);
    for (uint32_t r = 0; r < st->n_rows; r++) {
        float *cs = table + (size_t)r * hp->rope_dim;
        float theta = (float)st->pos[r];
        for (uint32_t i = 0; i < half; i++) {
            float angle = (freq_div ? theta / freq_div[i] : theta) * freq_scale;
            cs[2 * i] = cosf(angle);
            cs[2 * i + 1] = sinf(angle);
            theta *= scale;
        }
    }
}

static void rope_tables(cpu_forward *f, const llmi_step *st) {
    const llmi_hparams *hp = &f->m->hp;
    const float *freq_div = f->w[LLMI_ROLE_ROPE_FREQS].data;
    rope_table(hp, hp->rope_base, hp->rope_freq_scale, freq_div, st, f->rope_cs);
    if (f->rope_cs_swa)
        rope_table(hp, hp->features.swa_rope_base, hp->features.swa_rope_freq_scale, freq_div, st,
                   f->rope_cs_swa);
}

static void rope_apply(const llmi_hparams *hp, const float *cs, float *vec, uint32_t n_heads) {
    uint32_t half = hp->rope_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * hp->head_dim;
        for (uint32_t i = 0; i < half; i++) {
            uint32_t a = hp->rope_layout == LLMI_ROPE_ADJACENT ? 2 * i : i;
            uint32_t b = hp->rope_layout == LLMI_ROPE_ADJACENT ? 2 * i + 1 : i + half;
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* ---- attention: one task per (row, head), split across threads ---- */

typedef struct attn_job {
    cpu_forward *f;
    const llmi_cpu_kv *kv;
    const llmi_row_ops *ops; /* the KV element type's dot and axpy */
    const llmi_step *st;
    uint32_t layer;
    uint32_t window; /* positions a query sees (itself included); 0 = all before it */
    /* Encoders: per sequence slot, the positions held after the step, all
     * of which every row of the sequence sees; NULL = causal. */
    const uint32_t *seq_end;
} attn_job;

/* The kernels of the KV cache's element type, looked up once per layer. */
static const llmi_row_ops *kv_ops(const llmi_cpu_kv *kv) {
    llmi_ttype t = LLMI_T_F32; /* kv_create accepted the type */
    llmi_kv_ttype(kv->layout.type, &t);
    return llmi_row_ops_get(t);
}

static void attn_task(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    const cpu_forward *f = j->f;
    const llmi_hparams *hp = &f->m->hp;
    uint32_t hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    float scale = 1.0f / sqrtf((float)hd);
    /* Bytes of one KV head's part of a row (whole blocks for Q8_0, Q4_0). */
    const size_t head_bytes = llmi_kv_row_bytes(j->kv->layout.type, hd);
    float *scores = f->scores + (size_t)ith * f->max_ctx;
    float (*const dot)(const float *, const void *, int) = j->ops->dot;
    void (*const axpy)(float *, float, const void *, int) = j->ops->axpy;
    const llmi_step *st = j->st;
    uint64_t total = (uint64_t)st->n_rows * hp->n_head;
    uint64_t begin = total * (uint64_t)ith / (uint64_t)nth;
    uint64_t end = total * (uint64_t)(ith + 1) / (uint64_t)nth;
    for (uint64_t t = begin; t < end; t++) {
        uint32_t r = (uint32_t)(t / hp->n_head), h = (uint32_t)(t % hp->n_head);
        const uint32_t s = st->seq[r];
        const float *q = f->q + (size_t)r * f->q_dim + (size_t)h * hd;
        size_t kv_off = (size_t)(h / group) * head_bytes;
        /* Keys at first..pos; a window drops those with pos - q >= window. */
        const uint32_t pos = st->pos[r];
        const uint32_t first = j->window && pos >= j->window ? pos - j->window + 1 : 0;
        const uint32_t n_pos = j->seq_end ? j->seq_end[s] : pos + 1 - first;
        for (uint32_t i = 0; i < n_pos; i++)
            scores[i] =
                dot(q,
                    llmi_cpu_kv_row(j->kv, j->layer, false, llmi_step_slot(st, s, first + i)) +
                        kv_off,
                    (int)hd) *
                scale;
        llmi_softmax_inplace(scores, (int)n_pos);
        float *out = f->att + (size_t)r * f->q_dim + (size_t)h * hd;
        memset(out, 0, hd * sizeof *out);
        for (uint32_t i = 0; i < n_pos; i++)
            axpy(out, scores[i],
                 llmi_cpu_kv_row(j->kv, j->layer, true, llmi_step_slot(st, s, first + i)) + kv_off,
                 (int)hd);
    }
}

/* ---- the layer stack ---- */

static void add_bias(float *y, const llmi_weight *b, uint32_t n_rows, uint32_t dim) {
    if (!b->data)
        return;
    for (uint32_t r = 0; r < n_rows; r++)
        llmi_add_inplace(y + (size_t)r * dim, (const float *)b->data, (int)dim);
}

/* x = LayerNorm(x + y) * w + b over n rows of dim (the post-norm residual
 * of encoder blocks); mean and variance summed in double. */
static void add_layer_norm(float *x, const float *y, const llmi_weight *w, const llmi_weight *b,
                           uint32_t n, uint32_t dim, float eps) {
    const float *wv = w->data, *bv = b->data;
    for (uint32_t r = 0; r < n; r++) {
        float *xr = x + (size_t)r * dim;
        const float *yr = y ? y + (size_t)r * dim : NULL;
        double sum = 0.0, sq = 0.0;
        for (uint32_t i = 0; i < dim; i++) {
            if (yr)
                xr[i] += yr[i];
            sum += xr[i];
        }
        const double mean = sum / dim;
        for (uint32_t i = 0; i < dim; i++)
            sq += (xr[i] - mean) * (xr[i] - mean);
        const float inv = (float)(1.0 / sqrt(sq / dim + (double)eps));
        for (uint32_t i = 0; i < dim; i++)
            xr[i] = (float)(xr[i] - mean) * inv * wv[i] + bv[i];
    }
}

/* Encoders: the positions each sequence slot of the step holds after it
 * (one past the largest row position; the step holds a whole input). */
static llm_status seq_ends(cpu_forward *f, const llmi_step *st) {
    if (st->n_seqs > f->max_rows)
        return llmi_error(LLM_ERR_INTERNAL, "step has %u sequences for %u rows", st->n_seqs,
                          f->max_rows);
    memset(f->seq_end, 0, (size_t)st->n_seqs * sizeof *f->seq_end);
    for (uint32_t r = 0; r < st->n_rows; r++)
        if (st->pos[r] + 1 > f->seq_end[st->seq[r]])
            f->seq_end[st->seq[r]] = st->pos[r] + 1;
    return LLM_OK;
}

/* n rows of dim, each normed with the vector w; out may alias x. Also per
 * head (QK-norm): n_rows * n_heads rows of head_dim. */
static void norm_rows(float *out, const float *x, const llmi_weight *w, uint32_t n, uint32_t dim,
                      float eps) {
    for (uint32_t r = 0; r < n; r++)
        llmi_rmsnorm(out + (size_t)r * dim, x + (size_t)r * dim, (const float *)w->data, (int)dim,
                     eps);
}

/* Makes x (n rows of this rank's `cols`) the matmul input; under TP, the
 * whole rows (`full` wide) gathered from every rank into `buf`. */
static llm_status gathered_input(cpu_forward *f, const float *x, uint32_t n, uint32_t cols,
                                 uint32_t full, float *buf) {
    if (!f->tp.gather) {
        act_begin(f, x, n, cols);
        return LLM_OK;
    }
    LLMI_TRY(f->tp.gather(f->tp.ctx, x, n, full, buf));
    act_begin(f, buf, n, full);
    return LLM_OK;
}

/* y (n rows of n_embd) = w * the current input, plus the LoRA update of
 * target t; under TP w holds this rank's output features, the update goes
 * to them alone (from the whole gathered input rows), and the ranks'
 * slices are gathered into y. */
static llm_status output_matmul(cpu_forward *f, const llmi_weight *w, const llmi_step *st,
                                uint32_t layer, llmi_lora_target t, float *y) {
    float *part = f->tp.gather ? f->tp_part : y;
    act_matmul(f, w, part);
    LLMI_TRY(lora(f, st, layer, t, f->act_x, (uint32_t)f->act_cols, part, (uint32_t)w->rows));
    if (!f->tp.gather)
        return LLM_OK;
    return f->tp.gather(f->tp.ctx, f->tp_part, st->n_rows, f->m->hp.n_embd, y);
}

static llm_status attention_block(cpu_forward *f, llmi_cpu_kv *kv, const llmi_layer *L,
                                  uint32_t layer, const llmi_step *st) {
    const llmi_hparams *hp = &f->m->hp;
    const uint32_t n = st->n_rows;
    const llmi_weight *W = L->w;
    const bool encoder = hp->features.encoder; /* post-norm: the block reads x itself */
    if (!encoder)
        norm_rows(f->xb, f->x, &W[LLMI_ROLE_ATTN_NORM], n, hp->n_embd, hp->rms_eps);
    act_begin(f, encoder ? f->x : f->xb, n, hp->n_embd);
    act_matmul(f, &W[LLMI_ROLE_Q], f->q);
    act_matmul(f, &W[LLMI_ROLE_K], f->k);
    act_matmul(f, &W[LLMI_ROLE_V], f->v);
    if (st->n_adapters) {
        const float *in = f->act_x;
        LLMI_TRY(lora(f, st, layer, LLMI_LORA_Q, in, hp->n_embd, f->q, f->q_dim));
        LLMI_TRY(lora(f, st, layer, LLMI_LORA_K, in, hp->n_embd, f->k, f->kv_dim));
        LLMI_TRY(lora(f, st, layer, LLMI_LORA_V, in, hp->n_embd, f->v, f->kv_dim));
    }
    add_bias(f->q, &W[LLMI_ROLE_Q_BIAS], n, f->q_dim);
    add_bias(f->k, &W[LLMI_ROLE_K_BIAS], n, f->kv_dim);
    add_bias(f->v, &W[LLMI_ROLE_V_BIAS], n, f->kv_dim);
    /* QK-norm: each head of q and k normed on its own, before RoPE. */
    if (W[LLMI_ROLE_Q_NORM].data)
        norm_rows(f->q, f->q, &W[LLMI_ROLE_Q_NORM], n * hp->n_head, hp->head_dim, hp->rms_eps);
    if (W[LLMI_ROLE_K_NORM].data)
        norm_rows(f->k, f->k, &W[LLMI_ROLE_K_NORM], n * hp->n_head_kv, hp->head_dim, hp->rms_eps);
    /* K and V rows go into the cache in its element type (a copy for f32,
     * rounding to nearest even for f16 and bf16, GGUF's reference
     * quantization per block of 32 for Q8_0 and Q4_0: blocks never straddle
     * heads, head_dim being a multiple of 32). A row is written once, here,
     * so it is never quantized twice. */
    const llmi_row_ops *ops = kv_ops(kv);
    const bool windowed = llmi_layer_windowed(&hp->features, layer);
    const float *rope_cs = windowed && f->rope_cs_swa ? f->rope_cs_swa : f->rope_cs;
    for (uint32_t r = 0; r < n; r++) {
        const float *cs = rope_cs + (size_t)r * hp->rope_dim;
        if (!encoder) { /* encoders add learned positions to the embedding instead */
            rope_apply(hp, cs, f->q + (size_t)r * f->q_dim, hp->n_head);
            rope_apply(hp, cs, f->k + (size_t)r * f->kv_dim, hp->n_head_kv);
        }
        uint32_t slot = llmi_step_slot(st, st->seq[r], st->pos[r]);
        ops->store(llmi_cpu_kv_row(kv, layer, false, slot), f->k + (size_t)r * f->kv_dim,
                   (int)f->kv_dim);
        ops->store(llmi_cpu_kv_row(kv, layer, true, slot), f->v + (size_t)r * f->kv_dim,
                   (int)f->kv_dim);
    }
    attn_job job = {
        f, kv, ops, st, layer, windowed ? hp->features.swa_window : 0, encoder ? f->seq_end : NULL};
    llmi_pool_run(f->pool, attn_task, &job);
    LLMI_TRY(gathered_input(f, f->att, n, f->q_dim, f->tp.q_dim, f->tp_att));
    LLMI_TRY(output_matmul(f, &W[LLMI_ROLE_O], st, layer, LLMI_LORA_O, f->hout));
    if (encoder) {
        add_bias(f->hout, &W[LLMI_ROLE_O_BIAS], n, hp->n_embd);
        add_layer_norm(f->x, f->hout, &W[LLMI_ROLE_ATTN_OUT_NORM], &W[LLMI_ROLE_ATTN_OUT_NORM_BIAS],
                       n, hp->n_embd, hp->rms_eps);
        return LLM_OK;
    }
    if (W[LLMI_ROLE_POST_ATTN_NORM].data)
        norm_rows(f->hout, f->hout, &W[LLMI_ROLE_POST_ATTN_NORM], n, hp->n_embd, hp->rms_eps);
    for (uint32_t r = 0; r < n; r++)
        llmi_add_inplace(f->x + (size_t)r * hp->n_embd, f->hout + (size_t)r * hp->n_embd,
                         (int)hp->n_embd);
    return LLM_OK;
}

/* f->hout = the dense FFN of the normed rows f->xb. */
/* gate = act(gate) * up over n rows of n_ff, rows split across the pool:
 * on a prompt the tanh / exp calls are a fifth of the work (GeGLU), too much
 * to leave to one thread. */
typedef struct glu_job {
    const cpu_forward *f;
    uint32_t n_rows;
} glu_job;

/* In place over n values: GELU in its erf form, x/2 * (1 + erf(x/sqrt(2))),
 * as BERT defines it (not the tanh approximation). */
static void gelu_erf(float *x, const float *unused, int n) {
    (void)unused;
    for (int i = 0; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

static void glu_task(void *ctx, int ith, int nth) {
    const glu_job *j = ctx;
    const cpu_forward *f = j->f;
    const uint32_t n_ff = f->m->hp.n_ff;
    const llmi_ffn_act act = f->m->hp.features.ffn_act;
    void (*const glu)(float *, const float *, int) = act == LLMI_FFN_GEGLU  ? llmi_gelu_tanh_mul
                                                     : act == LLMI_FFN_GELU ? gelu_erf
                                                                            : llmi_silu_mul;
    uint32_t begin = (uint32_t)((uint64_t)j->n_rows * (uint64_t)ith / (uint64_t)nth);
    uint32_t end = (uint32_t)((uint64_t)j->n_rows * (uint64_t)(ith + 1) / (uint64_t)nth);
    for (uint32_t r = begin; r < end; r++)
        glu(f->gate + (size_t)r * n_ff, f->up + (size_t)r * n_ff, (int)n_ff);
}

static llm_status dense_ffn(cpu_forward *f, const llmi_weight *W, const llmi_step *st,
                            uint32_t layer) {
    const llmi_hparams *hp = &f->m->hp;
    const uint32_t n = st->n_rows;
    if (hp->features.ffn_act == LLMI_FFN_GELU) { /* encoders: no gate, biases, input x */
        act_begin(f, f->x, n, hp->n_embd);
        act_matmul(f, &W[LLMI_ROLE_UP], f->gate);
        LLMI_TRY(lora(f, st, layer, LLMI_LORA_UP, f->x, hp->n_embd, f->gate, hp->n_ff));
        add_bias(f->gate, &W[LLMI_ROLE_UP_BIAS], n, hp->n_ff);
    } else {
        act_begin(f, f->xb, n, hp->n_embd);
        act_matmul(f, &W[LLMI_ROLE_GATE], f->gate);
        act_matmul(f, &W[LLMI_ROLE_UP], f->up);
        LLMI_TRY(lora(f, st, layer, LLMI_LORA_GATE, f->xb, hp->n_embd, f->gate, hp->n_ff));
        LLMI_TRY(lora(f, st, layer, LLMI_LORA_UP, f->xb, hp->n_embd, f->up, hp->n_ff));
    }
    glu_job job = {f, n};
    if (n > 1)
        llmi_pool_run(f->pool, glu_task, &job);
    else
        glu_task(&job, 0, 1);
    LLMI_TRY(gathered_input(f, f->gate, n, hp->n_ff, f->tp.n_ff, f->tp_ff));
    return output_matmul(f, &W[LLMI_ROLE_DOWN], st, layer, LLMI_LORA_DOWN, f->hout);
}

/* A routed FFN runs whole on every rank (its weights are not split): the
 * same result on each, so nothing to gather. */
static llm_status mlp_block(cpu_forward *f, const llmi_layer *L, const llmi_step *st,
                            uint32_t layer) {
    const llmi_hparams *hp = &f->m->hp;
    const uint32_t n = st->n_rows;
    const llmi_weight *W = L->w;
    if (hp->features.encoder) {
        LLMI_TRY(dense_ffn(f, W, st, layer));
        add_bias(f->hout, &W[LLMI_ROLE_DOWN_BIAS], n, hp->n_embd);
        add_layer_norm(f->x, f->hout, &W[LLMI_ROLE_LAYER_OUT_NORM],
                       &W[LLMI_ROLE_LAYER_OUT_NORM_BIAS], n, hp->n_embd, hp->rms_eps);
        return LLM_OK;
    }
    norm_rows(f->xb, f->x, &W[LLMI_ROLE_FFN_NORM], n, hp->n_embd, hp->rms_eps);
    if (W[LLMI_ROLE_FFN_ROUTER].data)
        llmi_cpu_moe_run(f->moe, f->pool, L, f->xb, n, f->f32_activations, f->hout);
    else
        LLMI_TRY(dense_ffn(f, W, st, layer));
    if (W[LLMI_ROLE_POST_FFN_NORM].data)
        norm_rows(f->hout, f->hout, &W[LLMI_ROLE_POST_FFN_NORM], n, hp->n_embd, hp->rms_eps);
    for (uint32_t r = 0; r < n; r++)
        llmi_add_inplace(f->x + (size_t)r * hp->n_embd, f->hout + (size_t)r * hp->n_embd,
                         (int)hp->n_embd);
    return LLM_OK;
}

/* Encoders: each row's learned position and token type 0 added to its
 * token embedding in f->x, then the embedding LayerNorm. Positions past the
 * table are refused (the engine's checks do not know of it). */
static llm_status encoder_embeddings(cpu_forward *f, const llmi_step *st) {
    const llm_model *m = f->m;
    const llmi_hparams *hp = &m->hp;
    const llmi_weight *pe = &m->w[LLMI_ROLE_POS_EMBD], *tt = &m->w[LLMI_ROLE_TOKEN_TYPES];
    float *row = f->hout; /* scratch: n_embd floats */
    for (uint32_t r = 0; r < st->n_rows; r++) {
        if (st->pos[r] >= pe->rows)
            return llmi_error(LLM_ERR_LIMIT,
                              "position %u is past the %u learned positions of this encoder",
                              st->pos[r], (unsigned)pe->rows);
        float *x = f->x + (size_t)r * hp->n_embd;
        llmi_dequantize_row(pe->type,
                            (const uint8_t *)pe->data + (size_t)st->pos[r] * pe->row_bytes, row,
                            hp->n_embd);
        llmi_add_inplace(x, row, (int)hp->n_embd);
        llmi_dequantize_row(tt->type, tt->data, row, hp->n_embd);
        llmi_add_inplace(x, row, (int)hp->n_embd);
    }
    add_layer_norm(f->x, NULL, &m->w[LLMI_ROLE_TOKEN_EMBD_NORM],
                   &m->w[LLMI_ROLE_TOKEN_EMBD_NORM_BIAS], st->n_rows, hp->n_embd, hp->rms_eps);
    return LLM_OK;
}

/* The embedding and every layer: leaves the residual stream of each row in
 * f->x. The step is checked by the engine; sequence lengths are its to
 * update. */
static llm_status run_layers(cpu_forward *f, llmi_cpu_kv *kv, const llmi_step *st) {
    const uint32_t n = st->n_rows;
    const llm_model *m = f->m;
    const llmi_hparams *hp = &m->hp;
    const llmi_weight *emb = &m->w[LLMI_ROLE_TOKEN_EMBD];
    for (uint32_t r = 0; r < n; r++) {
        float *x = f->x + (size_t)r * hp->n_embd;
        llmi_dequantize_row(emb->type,
                            (const uint8_t *)emb->data + (size_t)st->token[r] * emb->row_bytes, x,
                            hp->n_embd);
        if (hp->features.embd_scale != 1.0f)
            for (uint32_t i = 0; i < hp->n_embd; i++)
                x[i] *= hp->features.embd_scale;
    }
    if (hp->features.encoder) {
        LLMI_TRY(encoder_embeddings(f, st));
        LLMI_TRY(seq_ends(f, st));
    }
    rope_tables(f, st);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        if (f->tp.layer_begin)
            LLMI_TRY(f->tp.layer_begin(f->tp.ctx, l));
        else if (st->interrupt && atomic_load_explicit(st->interrupt, memory_order_relaxed))
            return llmi_error(LLM_ERR_CANCELLED, "interrupted (llm_session_interrupt) at layer %u",
                              l);
        LLMI_TRY(attention_block(f, kv, &f->layers[l], l, st));
        LLMI_TRY(mlp_block(f, &f->layers[l], st, l));
    }
    return LLM_OK;
}

/* The wanted rows of f->x normed with the output norm, into out (n_logits
 * rows of n_embd). */
static void output_norm_rows(const cpu_forward *f, const llmi_step *st, float *out) {
    const llmi_hparams *hp = &f->m->hp;
    if (!f->w[LLMI_ROLE_OUTPUT_NORM].data) { /* encoders: the last block ends in a norm */
        for (uint32_t i = 0; i < st->n_logits; i++)
            memcpy(out + (size_t)i * hp->n_embd, f->x + (size_t)st->logit_rows[i] * hp->n_embd,
                   hp->n_embd * sizeof *out);
        return;
    }
    for (uint32_t i = 0; i < st->n_logits; i++)
        llmi_rmsnorm(out + (size_t)i * hp->n_embd, f->x + (size_t)st->logit_rows[i] * hp->n_embd,
                     (const float *)f->w[LLMI_ROLE_OUTPUT_NORM].data, (int)hp->n_embd, hp->rms_eps);
}

llm_status llmi_cpu_step_run(void *ctx, void *kv_store, const llmi_step *st, float *logits) {
    cpu_forward *f = ctx;
    const llmi_hparams *hp = &f->m->hp;
    LLMI_TRY(run_layers(f, kv_store, st));
    const uint32_t n_out = st->n_logits;
    output_norm_rows(f, st, f->out_rows);
    if (n_out) {
        act_begin(f, f->out_rows, n_out, hp->n_embd);
        act_matmul(f, &f->w[LLMI_ROLE_OUTPUT], logits);
        float cap = hp->features.logit_softcap;
        if (cap > 0.0f)
            for (size_t i = 0; i < (size_t)n_out * hp->n_vocab; i++)
                logits[i] = tanhf(logits[i] * (1.0f / cap)) * cap;
    }
    return LLM_OK;
}

llm_status llmi_cpu_step_run_hidden(void *ctx, void *kv_store, const llmi_step *st, float *hidden) {
    cpu_forward *f = ctx;
    LLMI_TRY(run_layers(f, kv_store, st));
    /* NULL: a tensor-parallel rank whose rows another rank writes out. */
    if (hidden)
        output_norm_rows(f, st, hidden);
    return LLM_OK;
}
