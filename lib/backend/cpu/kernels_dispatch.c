/* The weight-type traits table and the matmul and activation entry points
 * of kernels.h: the one place that chooses kernels by type and level.
 *
 * Every weight type runs through the same row split (below), so adding a
 * type is a row of the table plus its rows kernels, not a branch here. */
#include "backend/cpu/kernels_impl.h"

#include <assert.h>
#include <math.h>

/* Rows per cache block when n_tok spans several tiles: the first tile reads
 * the block from memory, the others find it in L2. */
#define ROW_BLOCK_BYTES (128 * 1024)
/* Below this many tokens, quantizing on the calling thread is cheaper than
 * a pool run. */
#define PREP_THREADED_MIN 4

/* ---- the table ------------------------------------------------------------ */

/* Per level: the portable kernel, then AVX2's and AVX-512's where built. */
#if defined(LLMI_KERNELS_X86)
#define LEVELS(c, avx2, avx512)                                                                    \
    { c, avx2, avx512 }
#else
#define LEVELS(c, avx2, avx512)                                                                    \
    { c }
#endif

#define FLOAT_WEIGHT(t)                                                                            \
    {                                                                                              \
        .act_type = LLMI_T_F32,                                                                    \
        .f32 = LEVELS(&llmi_rows_##t##_c, &llmi_rows_##t##_avx2, &llmi_rows_##t##_avx512),         \
    }

#if defined(LLMI_KERNELS_X86)
#define PACKED(t) &llmi_qrows_##t##_vnni_packed
#else
#define PACKED(t) NULL
#endif

/* A Q4_0/Q4_1/Q8_0 weight: integer kernels on 8-bit activations (and on a
 * packed copy), and the float kernels for llmi_matmul. */
#define Q8_WEIGHT(t, act, qtype)                                                                   \
    .act_type = act,                                                                               \
    .f32 = LEVELS(&llmi_rows_##t##_c, &llmi_rows_##t##_avx2, &llmi_rows_##t##_avx512),             \
    .q = LEVELS(&llmi_qrows_##t##_c, &llmi_qrows_##t##_avx2, &llmi_qrows_##t##_vnni), .qt = qtype, \
    .q_packed = PACKED(t)

/* A Q5_0/Q5_1 weight: integer kernels like Q4_0/Q4_1's, and the
 * dequantizing f32 path. */
#define Q5_WEIGHT(t, act, qtype)                                                                   \
    {                                                                                              \
        .act_type = act,                                                                           \
        .f32 = LEVELS(&llmi_rows_dequant_f32, &llmi_rows_dequant_f32, &llmi_rows_dequant_f32),     \
        .q = LEVELS(&llmi_qrows_##t##_c, &llmi_qrows_##t##_avx2, &llmi_qrows_##t##_vnni),          \
        .qt = qtype, .q_packed = PACKED(t),                                                        \
    }

#define K_WEIGHT(t)                                                                                \
    {                                                                                              \
        .act_type = LLMI_T_Q8_K,                                                                   \
        .f32 = LEVELS(&llmi_rows_dequant_f32, &llmi_rows_dequant_f32, &llmi_rows_dequant_f32),     \
        .q = LEVELS(&llmi_qrows_##t##_c, &llmi_qrows_##t##_avx2, &llmi_qrows_##t##_vnni),          \
    }

/* Bytes per block of an activation row (kernels.h gives the layouts). */
#define Q8_ACT_BLOCK_BYTES (LLMI_QK + 4 + 4)
#define Q8K_ACT_BLOCK_BYTES (LLMI_QK_K + 4 + 2 * (LLMI_QK_K / 16))
#define Q8_QUANT LEVELS(llmi_aquant_q8_c, llmi_aquant_q8_avx2, llmi_aquant_q8_avx2)

static const llmi_ktraits g_traits[] = {
    [LLMI_T_F32] = FLOAT_WEIGHT(f32),
    [LLMI_T_F16] = FLOAT_WEIGHT(f16),
    [LLMI_T_BF16] = FLOAT_WEIGHT(bf16),
    [LLMI_T_Q4_0] = {Q8_WEIGHT(q4_0, LLMI_T_Q8_0, LLMI_QT_Q4_0)},
    [LLMI_T_Q4_1] = {Q8_WEIGHT(q4_1, LLMI_T_Q8_1, LLMI_QT_Q4_1)},
    [LLMI_T_Q5_0] = Q5_WEIGHT(q5_0, LLMI_T_Q8_0, LLMI_QT_Q5_0),
    [LLMI_T_Q5_1] = Q5_WEIGHT(q5_1, LLMI_T_Q8_1, LLMI_QT_Q5_1),
    /* Q8_0 is a weight type and the activations of Q4_0 and Q8_0. */
    [LLMI_T_Q8_0] = {Q8_WEIGHT(q8_0, LLMI_T_Q8_0, LLMI_QT_Q8_0),
                     .act_block_bytes = Q8_ACT_BLOCK_BYTES, .quant = Q8_QUANT},
    [LLMI_T_Q8_1] = {.act_type = LLMI_T_F32,
                     .act_block_bytes = Q8_ACT_BLOCK_BYTES,
                     .quant = Q8_QUANT},
    [LLMI_T_Q4_K] = K_WEIGHT(q4_k),
    [LLMI_T_Q6_K] = K_WEIGHT(q6_k),
    [LLMI_T_Q8_K] = {.act_type = LLMI_T_F32,
                     .act_block_bytes = Q8K_ACT_BLOCK_BYTES,
                     .quant = LEVELS(llmi_aquant_q8_k, llmi_aquant_q8_k, llmi_aquant_q8_k)},
};

const llmi_ktraits *llmi_ktraits_get(uint32_t type) {
    return type < sizeof g_traits / sizeof g_traits[0] ? &g_traits[type] : NULL;
}

/* The entry of a weight type the kernels multiply, else NULL. */
static const llmi_ktraits *weight_traits(uint32_t type) {
    const llmi_ktraits *tr = llmi_ktraits_get(type);
    return tr && tr->f32[LLMI_KLEVEL_C] ? tr : NULL;
}

int llmi_kernels_type_supported(uint32_t type) { return weight_traits(type) != NULL; }

llmi_ttype llmi_act_type(llmi_ttype weight_type) {
    const llmi_ktraits *tr = weight_traits(weight_type);
    return tr ? tr->act_type : LLMI_T_F32;
}

/* ---- the row split ---------------------------------------------------------
 *
 * Thread ith of nth owns a contiguous chunk of LLMI_MATMUL_ROW_CHUNK-row
 * pieces, so each thread streams its own part of the weight and no two
 * threads write the same cache line of y (16 floats). With several token
 * tiles, rows go in blocks that stay in cache while every tile passes over
 * them, so the weights come from memory once. */

/* Thread ith's rows [*r0, *r1); 0 when it has none (or the call is bad). */
static int thread_rows(const llmi_weight *w, int n_tok, int ith, int nth, int64_t *r0,
                       int64_t *r1) {
    if (n_tok <= 0 || w->rows <= 0 || nth <= 0 || ith < 0 || ith >= nth)
        return 0;
    const int64_t rows = w->rows;
    const int64_t nchunks = (rows + LLMI_MATMUL_ROW_CHUNK - 1) / LLMI_MATMUL_ROW_CHUNK;
    const int64_t c0 = nchunks * ith / nth, c1 = nchunks * (ith + 1) / nth;
    *r0 = c0 * LLMI_MATMUL_ROW_CHUNK;
    *r1 = c1 * LLMI_MATMUL_ROW_CHUNK;
    if (*r1 > rows)
        *r1 = rows;
    return *r0 < *r1;
}

/* A broken contract: poison the thread's share rather than read past rows. */
static void nan_share(float *y, int64_t rows, int n_tok, int64_t r0, int64_t r1) {
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = r0; r < r1; r++)
            y[t * rows + r] = NAN;
}

static int64_t row_block(const llmi_weight *w) {
    int64_t rb = w->row_bytes ? (int64_t)(ROW_BLOCK_BYTES / w->row_bytes) : 0;
    rb -= rb % LLMI_MATMUL_ROW_CHUNK;
    return rb < LLMI_MATMUL_ROW_CHUNK ? LLMI_MATMUL_ROW_CHUNK : rb;
}

static int bad_cols(const llmi_weight *w) { return w->cols % llmi_ttype_get(w->type)->block != 0; }

void llmi_matmul_part(const llmi_weight *w, const float *x, int n_tok, float *y, int ith, int nth) {
    const llmi_ktraits *tr = weight_traits(w->type);
    int64_t r0, r1;
    if (!tr || !thread_rows(w, n_tok, ith, nth, &r0, &r1))
        return;
    const int64_t rows = w->rows, cols = w->cols;
    if (bad_cols(w)) {
        nan_share(y, rows, n_tok, r0, r1);
        return;
    }
    const llmi_rows_impl *k = tr->f32[llmi_kernels_level()];
    if (n_tok <= k->tile) {
        k->fn(w, r0, r1, x, n_tok, y, rows);
        return;
    }
    const int64_t rb = row_block(w);
    for (int64_t rs = r0; rs < r1; rs += rb) {
        const int64_t re = rs + rb < r1 ? rs + rb : r1;
        for (int t0 = 0; t0 < n_tok; t0 += k->tile) {
            const int nt = n_tok - t0 < k->tile ? n_tok - t0 : k->tile;
            k->fn(w, rs, re, x + (int64_t)t0 * cols, nt, y + (int64_t)t0 * rows, rows);
        }
    }
}

struct matmul_ctx {
    const llmi_weight *w;
    const float *x;
    float *y;
    int n_tok;
};

static void matmul_task(void *p, int ith, int nth) {
    const struct matmul_ctx *c = p;
    llmi_matmul_part(c->w, c->x, c->n_tok, c->y, ith, nth);
}

void llmi_matmul(llmi_pool *pool, const llmi_weight *w, const float *x, int n_tok, float *y) {
    struct matmul_ctx c = {w, x, y, n_tok};
    llmi_pool_run(pool, matmul_task, &c);
}

/* ---- 8-bit activations ----------------------------------------------------- */

/* Bytes of one quantized activation row of nb blocks (64-byte multiple), 0
 * on overflow. */
static size_t act_row_bytes(const llmi_ktraits *at, int64_t nb) {
    const uint64_t per_block = at->act_block_bytes;
    if (nb <= 0 || (uint64_t)nb > (SIZE_MAX - 63) / per_block)
        return 0;
    return ((size_t)nb * per_block + 63) & ~(size_t)63;
}

size_t llmi_act_scratch_bytes(llmi_ttype weight_type, int64_t cols, int n_tok) {
    const llmi_ttype act = llmi_act_type(weight_type);
    if (act == LLMI_T_F32)
        return 0;
    const int64_t block = llmi_ttype_get(act)->block;
    if (cols <= 0 || cols % block != 0 || n_tok <= 0)
        return 0;
    const size_t rb = act_row_bytes(llmi_ktraits_get(act), cols / block);
    size_t total;
    if (!rb || !llmi_mul_ok(rb, (size_t)n_tok, &total) || total > SIZE_MAX - 64)
        return 0;
    return total + 64; /* room to align the start */
}

struct prep_ctx {
    llmi_aquant_fn quant;
    const float *x;
    uint8_t *q;
    int64_t cols, block;
    size_t row_bytes;
    int n_tok, q81;
};

static void prep_task(void *p, int ith, int nth) {
    const struct prep_ctx *c = p;
    const int t0 = (int)((int64_t)c->n_tok * ith / nth);
    const int t1 = (int)((int64_t)c->n_tok * (ith + 1) / nth);
    for (int t = t0; t < t1; t++)
        c->quant(c->x + (int64_t)t * c->cols, c->cols / c->block, c->q81,
                 c->q + (size_t)t * c->row_bytes, c->row_bytes);
}

void llmi_act_prepare(llmi_pool *pool, llmi_ttype weight_type, const float *x, int n_tok,
                      int64_t cols, void *scratch, llmi_act *out) {
    *out = (llmi_act){.f32 = x, .q = NULL, .q_type = LLMI_T_F32, .n_tok = n_tok, .cols = cols};
    if (!scratch || llmi_act_scratch_bytes(weight_type, cols, n_tok) == 0)
        return;
    const llmi_ttype act = llmi_act_type(weight_type);
    const llmi_ktraits *at = llmi_ktraits_get(act);
    const int64_t block = llmi_ttype_get(act)->block;
    uint8_t *q = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    struct prep_ctx c = {at->quant[llmi_kernels_int_level()],
                         x,
                         q,
                         cols,
                         block,
                         act_row_bytes(at, cols / block),
                         n_tok,
                         act == LLMI_T_Q8_1};
    if (n_tok >= PREP_THREADED_MIN && llmi_pool_size(pool) > 1)
        llmi_pool_run(pool, prep_task, &c);
    else
        prep_task(&c, 0, 1);
    out->q = q;
    out->q_type = act;
    out->q_row_bytes = c.row_bytes;
}

void llmi_matmul_act_part(const llmi_weight *w, const llmi_act *x, float *y, int ith, int nth) {
    const llmi_ktraits *tr = weight_traits(w->type);
    if (!tr || tr->act_type == LLMI_T_F32) { /* float weights (unsupported: a no-op) */
        llmi_matmul_part(w, x->f32, x->n_tok, y, ith, nth);
        return;
    }
    const int n_tok = x->n_tok;
    int64_t r0, r1;
    if (!thread_rows(w, n_tok, ith, nth, &r0, &r1))
        return;
    const int64_t rows = w->rows;
    if (bad_cols(w)) {
        nan_share(y, rows, n_tok, r0, r1);
        return;
    }
    const int prepared = x->q && x->q_type == tr->act_type && x->cols == w->cols;
    assert(prepared && "llmi_matmul_act: activations not prepared for this weight type");
    if (!prepared) {
        nan_share(y, rows, n_tok, r0, r1);
        return;
    }
    const int level = llmi_kernels_int_level();
    const llmi_qrows_impl *k = tr->q[level];
    if (w->packed && tr->q_packed && level == LLMI_KLEVEL_AVX512)
        k = tr->q_packed;
    const uint8_t *xq = x->q;
    const size_t xs = x->q_row_bytes;
    if (n_tok <= k->tile) {
        k->fn(w, r0, r1, xq, xs, n_tok, y, rows);
        return;
    }
    const int64_t rb = row_block(w);
    for (int64_t rs = r0; rs < r1; rs += rb) {
        const int64_t re = rs + rb < r1 ? rs + rb : r1;
        for (int t0 = 0; t0 < n_tok; t0 += k->tile) {
            const int nt = n_tok - t0 < k->tile ? n_tok - t0 : k->tile;
            k->fn(w, rs, re, xq + (size_t)t0 * xs, xs, nt, y + (int64_t)t0 * rows, rows);
        }
    }
}

struct matmul_act_ctx {
    const llmi_weight *w;
    const llmi_act *x;
    float *y;
};

static void matmul_act_task(void *p, int ith, int nth) {
    const struct matmul_act_ctx *c = p;
    llmi_matmul_act_part(c->w, c->x, c->y, ith, nth);
}

void llmi_matmul_act(llmi_pool *pool, const llmi_weight *w, const llmi_act *x, float *y) {
    if (x->n_tok <= 0)
        return;
    struct matmul_act_ctx c = {w, x, y};
    llmi_pool_run(pool, matmul_act_task, &c);
}

/* ---- packed weights ------------------------------------------------------- */

size_t llmi_weight_packed_size(const llmi_weight *w, size_t *group_bytes) {
    *group_bytes = 0;
    const llmi_ktraits *tr = weight_traits(w->type);
    if (!tr || !tr->q_packed || llmi_kernels_int_level() != LLMI_KLEVEL_AVX512 || w->cols <= 0 ||
        w->cols % LLMI_QK != 0 || w->rows <= 0)
        return 0;
#if defined(LLMI_KERNELS_X86)
    const size_t gb = llmi_v5p_group_bytes(tr->qt, w->cols / LLMI_QK);
    const uint64_t groups = ((uint64_t)w->rows + LLMI_WEIGHT_PACK_ROWS - 1) / LLMI_WEIGHT_PACK_ROWS;
    size_t total;
    if (!llmi_mul_ok(groups, gb, &total))
        return 0;
    *group_bytes = gb;
    return total;
#else
    return 0;
#endif
}

void llmi_weight_pack(const llmi_weight *w, void *dst, int64_t g0, int64_t g1) {
#if defined(LLMI_KERNELS_X86)
    const llmi_ktraits *tr = weight_traits(w->type);
    if (tr && tr->q_packed)
        llmi_v5p_pack(tr->qt, w, dst, g0, g1);
#else
    (void)w, (void)dst, (void)g0, (void)g1;
#endif
}
