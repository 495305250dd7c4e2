/* The routed FFN (moe.h). A step runs in three passes: route every row
 * (router matmul, softmax, top-k), sort the (row, expert) pairs by expert
 * with a counting sort, then per expert gather its rows, run its SwiGLU on
 * them at once and add each result, weighted, into its row. Experts go in
 * ascending order, so every row sums its experts in a fixed order whatever
 * else is in the batch; the matmul kernels give each row a result that does
 * not depend on the rows beside it (kernels.h), which makes a row alone
 * and the same row in any batch bit-identical. */
#include "backend/cpu/moe.h"

#include "backend/cpu/kernels.h"

#include <math.h>

/* llama.cpp's floor for the sum of the chosen weights before it divides
 * by it (the smallest normal f16). */
#define MOE_WEIGHT_SUM_MIN 6.103515625e-5f

struct llmi_cpu_moe {
    uint32_t max_rows, n_embd, n_expert, n_used, n_ff;
    uint32_t n_ff_shexp; /* 0: no layer has a shared expert */
    bool norm;
    float *probs;       /* [max_rows][n_expert]: router logits, then softmax */
    uint32_t *chosen;   /* [max_rows][n_used]: experts of each row */
    float *chosen_w;    /* [max_rows][n_used]: their weights */
    uint32_t *first;    /* [n_expert + 1]: expert e's pairs are first[e] .. first[e+1]-1 */
    uint32_t *pair_row; /* [max_rows * n_used]: the pairs' rows, by expert, rows ascending */
    float *pair_w;      /* [max_rows * n_used] */
    float *xg, *y;      /* [max_rows][n_embd]: gathered inputs, one expert's outputs */
    float *gate, *up;   /* [max_rows][max(n_ff, n_ff_shexp)] */
    void *act_scratch;  /* 8-bit activations of any of the above as matmul input */
};

void llmi_cpu_moe_free(llmi_cpu_moe *moe) {
    if (!moe)
        return;
    float *bufs[] = {moe->probs, moe->chosen_w, moe->pair_w, moe->xg, moe->y, moe->gate, moe->up};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        llmi_free_aligned(bufs[i]);
    llmi_free_aligned(moe->chosen);
    llmi_free_aligned(moe->first);
    llmi_free_aligned(moe->pair_row);
    llmi_free_aligned(moe->act_scratch);
    llmi_free(moe);
}

/* rows * cols elements of `size` bytes, or NULL (overflow or out of memory). */
static void *alloc_array(size_t rows, size_t cols, size_t size) {
    size_t n, bytes;
    if (!llmi_mul_ok(rows, cols, &n) || !llmi_mul_ok(n, size, &bytes))
        return NULL;
    return llmi_malloc_aligned(bytes ? bytes : 1);
}

/* The largest 8-bit activation scratch any matmul of the routed FFN needs
 * at max_rows rows; false when a size overflows. */
static bool act_scratch_size(const llm_model *m, uint32_t max_rows, size_t *out) {
    static const int roles[] = {LLMI_ROLE_FFN_ROUTER, LLMI_ROLE_GATE_EXPS,  LLMI_ROLE_UP_EXPS,
                                LLMI_ROLE_DOWN_EXPS,  LLMI_ROLE_GATE_SHEXP, LLMI_ROLE_UP_SHEXP,
                                LLMI_ROLE_DOWN_SHEXP};
    size_t need = 0;
    if (max_rows > INT32_MAX)
        return false;
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
            const llmi_weight *w = &m->layers[l].w[roles[i]];
            if (!w->data)
                continue;
            size_t b = llmi_act_scratch_bytes(w->type, w->cols, (int)max_rows);
            if (b == 0 && llmi_act_type(w->type) != LLMI_T_F32)
                return false;
            if (b > need)
                need = b;
        }
    *out = need;
    return true;
}

llm_status llmi_cpu_moe_create(const llm_model *m, uint32_t max_rows, llmi_cpu_moe **out) {
    *out = NULL;
    const llmi_features *ft = &m->hp.features;
    if (ft->n_expert == 0 || ft->n_expert_used == 0 || ft->n_expert_used > ft->n_expert)
        return llmi_error(LLM_ERR_INTERNAL, "routed FFN for a model without experts");
    llmi_cpu_moe *moe = llmi_calloc(1, sizeof *moe);
    if (!moe)
        return llmi_oom("routed FFN");
    moe->max_rows = max_rows;
    moe->n_embd = m->hp.n_embd;
    moe->n_expert = ft->n_expert;
    moe->n_used = ft->n_expert_used;
    moe->n_ff = ft->n_ff_exp;
    moe->norm = ft->expert_weights_norm;
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        if (m->layers[l].w[LLMI_ROLE_GATE_SHEXP].data)
            moe->n_ff_shexp = ft->n_ff_shexp;
    uint32_t ff_buf = moe->n_ff > moe->n_ff_shexp ? moe->n_ff : moe->n_ff_shexp;
    size_t pairs = (size_t)max_rows * moe->n_used;
    moe->probs = alloc_array(max_rows, moe->n_expert, sizeof(float));
    moe->chosen = alloc_array(pairs, 1, sizeof(uint32_t));
    moe->chosen_w = alloc_array(pairs, 1, sizeof(float));
    moe->first = alloc_array((size_t)moe->n_expert + 1, 1, sizeof(uint32_t));
    moe->pair_row = alloc_array(pairs, 1, sizeof(uint32_t));
    moe->pair_w = alloc_array(pairs, 1, sizeof(float));
    moe->xg = alloc_array(max_rows, moe->n_embd, sizeof(float));
    moe->y = alloc_array(max_rows, moe->n_embd, sizeof(float));
    moe->gate = alloc_array(max_rows, ff_buf, sizeof(float));
    moe->up = alloc_array(max_rows, ff_buf, sizeof(float));
    size_t act_bytes = 0;
    if (!act_scratch_size(m, max_rows, &act_bytes)) {
        llmi_cpu_moe_free(moe);
        return llmi_error(LLM_ERR_LIMIT, "routed FFN: %u rows per batch is too many", max_rows);
    }
    if (act_bytes)
        moe->act_scratch = llmi_malloc_aligned(act_bytes);
    if (!moe->probs || !moe->chosen || !moe->chosen_w || !moe->first || !moe->pair_row ||
        !moe->pair_w || !moe->xg || !moe->y || !moe->gate || !moe->up ||
        (act_bytes && !moe->act_scratch)) {
        llmi_cpu_moe_free(moe);
        return llmi_oom("routed FFN buffers");
    }
    *out = moe;
    return LLM_OK;
}

/* NaN ranks below every number, so a broken row still picks n_used
 * distinct experts. */
static inline float rank_key(float p) { return isnan(p) ? -INFINITY : p; }

void llmi_moe_select(const float *probs, uint32_t n_expert, uint32_t n_used, bool norm,
                     uint32_t *experts, float *weights) {
    /* Pick j is the best expert ranked strictly below pick j-1 in the order
     * (prob descending, index ascending): no "taken" marks needed, and
     * n_used * n_expert comparisons are few next to one expert's matmul. */
    float prev_key = INFINITY;
    uint32_t prev = 0;
    for (uint32_t j = 0; j < n_used; j++) {
        uint32_t best = UINT32_MAX;
        float best_key = -INFINITY;
        for (uint32_t e = 0; e < n_expert; e++) {
            float k = rank_key(probs[e]);
            bool below_prev = j == 0 || k < prev_key || (k == prev_key && e > prev);
            if (below_prev && (best == UINT32_MAX || k > best_key)) {
                best = e;
                best_key = k;
            }
        }
        experts[j] = best;
        weights[j] = probs[best];
        prev = best;
        prev_key = best_key;
    }
    if (!norm)
        return;
    float sum = 0.0f;
    for (uint32_t j = 0; j < n_used; j++)
        sum += weights[j];
    if (sum < MOE_WEIGHT_SUM_MIN)
        sum = MOE_WEIGHT_SUM_MIN;
    for (uint32_t j = 0; j < n_used; j++)
        weights[j] /= sum;
}

/* Routes the n rows and lists the (row, weight) pairs of each expert. */
static void route(llmi_cpu_moe *moe, uint32_t n) {
    const uint32_t ne = moe->n_expert, k = moe->n_used;
    for (uint32_t r = 0; r < n; r++) {
        float *p = moe->probs + (size_t)r * ne;
        llmi_softmax_inplace(p, (int)ne);
        llmi_moe_select(p, ne, k, moe->norm, moe->chosen + (size_t)r * k,
                        moe->chosen_w + (size_t)r * k);
    }
    memset(moe->first, 0, ((size_t)ne + 1) * sizeof *moe->first);
    for (size_t i = 0; i < (size_t)n * k; i++)
        moe->first[moe->chosen[i] + 1]++;
    for (uint32_t e = 0; e < ne; e++)
        moe->first[e + 1] += moe->first[e];
    /* first[e] doubles as expert e's fill cursor and ends at first[e+1];
     * shifted back below. Rows go in ascending order within an expert. */
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t j = 0; j < k; j++) {
            uint32_t e = moe->chosen[(size_t)r * k + j], at = moe->first[e]++;
            moe->pair_row[at] = r;
            moe->pair_w[at] = moe->chosen_w[(size_t)r * k + j];
        }
    for (uint32_t e = ne; e > 0; e--)
        moe->first[e] = moe->first[e - 1];
    moe->first[0] = 0;
}

/* One matmul input: quantized for a weight type on first use, reused by
 * the next matmul of the same activation type (gate and up). */
typedef struct moe_input {
    const float *x;
    uint32_t n;
    int64_t cols;
    bool ready;
    llmi_ttype type;
    llmi_act act;
} moe_input;

static void input_begin(moe_input *in, const float *x, uint32_t n, int64_t cols) {
    in->x = x;
    in->n = n;
    in->cols = cols;
    in->ready = false;
}

static void input_matmul(llmi_cpu_moe *moe, llmi_pool *pool, bool f32, moe_input *in,
                         const llmi_weight *w, float *y) {
    if (f32) {
        llmi_matmul(pool, w, in->x, (int)in->n, y);
        return;
    }
    llmi_ttype at = llmi_act_type(w->type);
    if (!in->ready || in->type != at) {
        llmi_act_prepare(pool, w->type, in->x, (int)in->n, in->cols, moe->act_scratch, &in->act);
        in->ready = true;
        in->type = at;
    }
    llmi_matmul_act(pool, w, &in->act, y);
}

/* out += sigmoid(shexp_gate_inp . x) * down(silu(gate x) * up x) for each
 * of the n rows: Qwen2-MoE's shared expert, after the routed ones. */
static void shared_expert(llmi_cpu_moe *moe, llmi_pool *pool, const llmi_weight *W, const float *x,
                          uint32_t n, bool f32_activations, float *out) {
    const uint32_t E = moe->n_embd, F = moe->n_ff_shexp;
    moe_input in;
    input_begin(&in, x, n, E);
    input_matmul(moe, pool, f32_activations, &in, &W[LLMI_ROLE_GATE_SHEXP], moe->gate);
    input_matmul(moe, pool, f32_activations, &in, &W[LLMI_ROLE_UP_SHEXP], moe->up);
    for (uint32_t r = 0; r < n; r++)
        llmi_silu_mul(moe->gate + (size_t)r * F, moe->up + (size_t)r * F, (int)F);
    input_begin(&in, moe->gate, n, F);
    input_matmul(moe, pool, f32_activations, &in, &W[LLMI_ROLE_DOWN_SHEXP], moe->y);
    const float *gate_inp = W[LLMI_ROLE_SHEXP_GATE_INP].data;
    for (uint32_t r = 0; r < n; r++) {
        float g = llmi_dot_f32(x + (size_t)r * E, gate_inp, (int)E);
        llmi_axpy_f32(out + (size_t)r * E, 1.0f / (1.0f + expf(-g)), moe->y + (size_t)r * E,
                      (int)E);
    }
}

void llmi_cpu_moe_run(llmi_cpu_moe *moe, llmi_pool *pool, const llmi_layer *L, const float *x,
                      uint32_t n, bool f32_activations, float *out) {
    const uint32_t E = moe->n_embd, F = moe->n_ff;
    const llmi_weight *W = L->w;
    moe_input in;
    input_begin(&in, x, n, E);
    input_matmul(moe, pool, f32_activations, &in, &W[LLMI_ROLE_FFN_ROUTER], moe->probs);
    route(moe, n);
    memset(out, 0, (size_t)n * E * sizeof *out);
    for (uint32_t e = 0; e < moe->n_expert; e++) {
        const uint32_t begin = moe->first[e], cnt = moe->first[e + 1] - begin;
        if (cnt == 0)
            continue;
        for (uint32_t i = 0; i < cnt; i++)
            memcpy(moe->xg + (size_t)i * E, x + (size_t)moe->pair_row[begin + i] * E,
                   E * sizeof *x);
        llmi_weight gate = llmi_stack_slice(&W[LLMI_ROLE_GATE_EXPS], e);
        llmi_weight up = llmi_stack_slice(&W[LLMI_ROLE_UP_EXPS], e);
        llmi_weight down = llmi_stack_slice(&W[LLMI_ROLE_DOWN_EXPS], e);
        input_begin(&in, moe->xg, cnt, E);
        input_matmul(moe, pool, f32_activations, &in, &gate, moe->gate);
        input_matmul(moe, pool, f32_activations, &in, &up, moe->up);
        for (uint32_t i = 0; i < cnt; i++)
            llmi_silu_mul(moe->gate + (size_t)i * F, moe->up + (size_t)i * F, (int)F);
        input_begin(&in, moe->gate, cnt, F);
        input_matmul(moe, pool, f32_activations, &in, &down, moe->y);
        for (uint32_t i = 0; i < cnt; i++)
            llmi_axpy_f32(out + (size_t)moe->pair_row[begin + i] * E, moe->pair_w[begin + i],
                          moe->y + (size_t)i * E, (int)E);
    }
    if (W[LLMI_ROLE_GATE_SHEXP].data)
        shared_expert(moe, pool, W, x, n, f32_activations, out);
}
