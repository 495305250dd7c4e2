/* K-quant matmuls: Q8_K activations, the portable integer kernels (the
 * reference for kernels_k_x86.c and the only ones off x86-64), dispatch, the
 * row split, and the f32-activation path.
 *
 * The dot product of a weight row with a token follows llama.cpp's
 * ggml_vec_dot_q4_K_q8_K / _q6_K_q8_K. Per super-block i of 256, with the
 * token's Q8_K values xq, scale d_x and sums of 16 bsums:
 *   Q4_K: isum_i = sum_j sc_j * sum_{l in sub-block j} q_l * xq_l   (exact)
 *         msum_i = sum_j m_j * (bsums_2j + bsums_2j+1)              (exact)
 *         y = sum_i (d_w*d_x) * isum_i - sum_i (dmin_w*d_x) * msum_i
 *   Q6_K: isum_i = sum_j sc_j * sum_{l in sub-block j} (q_l - 32) * xq_l
 *         y = sum_i (d_w*d_x) * isum_i
 * with the scale products rounded to float and the sums over i in float.
 * The portable kernels sum i in order into one accumulator (Q4_K's min
 * terms into a second one, subtracted at the end); the SIMD ones split
 * isum_i over lanes (still exact) and differ only in the order of the
 * float sums.
 *
 * The f32 path (llmi_matmul with f32_activations) dequantizes each
 * super-block with quant.c's reference (ggml's values, bit for bit) and
 * takes the level's f32 dot product with each token. */
#include "backend/kernels_k.h"

#include "backend/quant.h"

#include <assert.h>
#include <math.h>

#define QK_K LLMI_QK_K
#define C_TILE 4
#define F32_TILE 8
#define ROW_BLOCK_BYTES (128 * 1024)
#define PREP_THREADED_MIN 4

int llmi_kq_is_k(uint32_t type) { return type == LLMI_T_Q4_K || type == LLMI_T_Q6_K; }

/* ---- activations ---------------------------------------------------------- */

/* Bytes of one Q8_K activation row of nb super-blocks, 0 on overflow. */
static size_t act_row_bytes(int64_t nb) {
    const uint64_t per = QK_K + 4 + 2 * (QK_K / 16);
    if (nb <= 0 || (uint64_t)nb > (SIZE_MAX - 63) / per)
        return 0;
    return ((size_t)nb * per + 63) & ~(size_t)63;
}

void llmi_kq_act_quant_row(const float *x, int64_t nb, uint8_t *row, size_t row_bytes) {
    int8_t *qs = (int8_t *)row;
    float *d = (float *)(void *)(row + QK_K * nb);
    int16_t *bs = (int16_t *)(void *)(d + nb);
    for (int64_t i = 0; i < nb; i++) {
        llmi_block_q8_k b;
        llmi_quantize_row(LLMI_T_Q8_K, x + QK_K * i, &b, QK_K);
        memcpy(qs + QK_K * i, b.qs, QK_K);
        d[i] = b.d;
        memcpy(bs + (QK_K / 16) * i, b.bsums, sizeof b.bsums);
    }
    const size_t used = (size_t)nb * (QK_K + 4 + 2 * (QK_K / 16));
    memset(row + used, 0, row_bytes - used);
}

size_t llmi_kq_act_scratch_bytes(int64_t cols, int n_tok) {
    if (cols <= 0 || cols % QK_K != 0 || n_tok <= 0)
        return 0;
    const size_t rb = act_row_bytes(cols / QK_K);
    size_t total;
    if (!rb || !llmi_mul_ok(rb, (size_t)n_tok, &total) || total > SIZE_MAX - 64)
        return 0;
    return total + 64;
}

struct prep_ctx {
    const float *x;
    uint8_t *q;
    int64_t cols;
    size_t row_bytes;
    int n_tok;
};

static void prep_task(void *p, int ith, int nth) {
    const struct prep_ctx *c = p;
    const int t0 = (int)((int64_t)c->n_tok * ith / nth);
    const int t1 = (int)((int64_t)c->n_tok * (ith + 1) / nth);
    for (int t = t0; t < t1; t++)
        llmi_kq_act_quant_row(c->x + (int64_t)t * c->cols, c->cols / QK_K,
                              c->q + (size_t)t * c->row_bytes, c->row_bytes);
}

void llmi_kq_act_prepare(llmi_pool *pool, const float *x, int n_tok, int64_t cols, void *scratch,
                         llmi_act *out) {
    *out = (llmi_act){.f32 = x, .q = NULL, .q_type = LLMI_T_F32, .n_tok = n_tok, .cols = cols};
    if (!scratch || llmi_kq_act_scratch_bytes(cols, n_tok) == 0)
        return;
    uint8_t *q = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    struct prep_ctx c = {x, q, cols, act_row_bytes(cols / QK_K), n_tok};
    if (n_tok >= PREP_THREADED_MIN && llmi_pool_size(pool) > 1)
        llmi_pool_run(pool, prep_task, &c);
    else
        prep_task(&c, 0, 1);
    out->q = q;
    out->q_type = LLMI_T_Q8_K;
    out->q_row_bytes = c.row_bytes;
}

/* ---- portable C ------------------------------------------------------------ */

static uint16_t ld16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* Token t's Q8_K row of nb super-blocks: values, scales, sums of 16. */
static const int8_t *x_qs(const uint8_t *xq, size_t xs, int t) {
    return (const int8_t *)(xq + (size_t)t * xs);
}
static const float *x_d(const uint8_t *xq, size_t xs, int t, int64_t nb) {
    return (const float *)(const void *)(xq + (size_t)t * xs + QK_K * nb);
}
static const int16_t *x_bs(const uint8_t *xq, size_t xs, int t, int64_t nb) {
    return (const int16_t *)(const void *)(x_d(xq, xs, t, nb) + nb);
}

static void c_rows_q4_k(const llmi_weight *W, int64_t r0, int64_t r1, const uint8_t *xq, size_t xs,
                        int nt, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK_K;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        float acc[C_TILE] = {0}, accm[C_TILE] = {0};
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *blk = row + (size_t)i * sizeof(llmi_block_q4_k);
            const float dw = llmi_f16_to_f32(ld16(blk + offsetof(llmi_block_q4_k, d)));
            const float mw = llmi_f16_to_f32(ld16(blk + offsetof(llmi_block_q4_k, dmin)));
            const uint8_t *qs = blk + offsetof(llmi_block_q4_k, qs);
            int sc[8], m[8];
            for (int j = 0; j < 8; j++)
                llmi_q4k_scale_min(blk + offsetof(llmi_block_q4_k, scales), j, &sc[j], &m[j]);
            int8_t w[QK_K];
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++) {
                    w[64 * g + l] = (int8_t)(qs[32 * g + l] & 15);
                    w[64 * g + 32 + l] = (int8_t)(qs[32 * g + l] >> 4);
                }
            for (int t = 0; t < nt; t++) {
                const int8_t *xt = x_qs(xq, xs, t) + QK_K * i;
                const float dx = x_d(xq, xs, t, nb)[i];
                const int16_t *bs = x_bs(xq, xs, t, nb) + (QK_K / 16) * i;
                int32_t isum = 0, msum = 0;
                for (int j = 0; j < 8; j++) {
                    int32_t s = 0;
                    for (int l = 0; l < 32; l++)
                        s += w[32 * j + l] * xt[32 * j + l];
                    isum += sc[j] * s;
                    msum += m[j] * (bs[2 * j] + bs[2 * j + 1]);
                }
                acc[t] += (dw * dx) * (float)isum;
                accm[t] += (mw * dx) * (float)msum;
            }
        }
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = acc[t] - accm[t];
    }
}

static void c_rows_q6_k(const llmi_weight *W, int64_t r0, int64_t r1, const uint8_t *xq, size_t xs,
                        int nt, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK_K;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        float acc[C_TILE] = {0};
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *blk = row + (size_t)i * sizeof(llmi_block_q6_k);
            const float dw = llmi_f16_to_f32(ld16(blk + offsetof(llmi_block_q6_k, d)));
            const uint8_t *ql = blk + offsetof(llmi_block_q6_k, ql);
            const uint8_t *qh = blk + offsetof(llmi_block_q6_k, qh);
            const int8_t *sc = (const int8_t *)(blk + offsetof(llmi_block_q6_k, scales));
            int8_t w[QK_K];
            for (int h = 0; h < 2; h++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t lo = ql[64 * h + l], hi = ql[64 * h + l + 32];
                    const uint8_t b = qh[32 * h + l];
                    int8_t *wh = w + 128 * h;
                    wh[l] = (int8_t)(((lo & 15) | (b & 3) << 4) - 32);
                    wh[l + 32] = (int8_t)(((hi & 15) | ((b >> 2) & 3) << 4) - 32);
                    wh[l + 64] = (int8_t)(((lo >> 4) | ((b >> 4) & 3) << 4) - 32);
                    wh[l + 96] = (int8_t)(((hi >> 4) | ((b >> 6) & 3) << 4) - 32);
                }
            for (int t = 0; t < nt; t++) {
                const int8_t *xt = x_qs(xq, xs, t) + QK_K * i;
                const float dx = x_d(xq, xs, t, nb)[i];
                int32_t isum = 0;
                for (int j = 0; j < 16; j++) {
                    int32_t s = 0;
                    for (int l = 0; l < 16; l++)
                        s += w[16 * j + l] * xt[16 * j + l];
                    isum += sc[j] * s;
                }
                acc[t] += (dw * dx) * (float)isum;
            }
        }
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = acc[t];
    }
}

static const llmi_kqkernel_set c_kqkernels = {
    .tile = C_TILE,
    .rows = {[LLMI_KQ_Q4_K] = c_rows_q4_k, [LLMI_KQ_Q6_K] = c_rows_q6_k},
};

/* The set of the current level, chosen as kernels_q8.c chooses its own. */
static const llmi_kqkernel_set *kq_set(void) {
    switch (llmi_kernels_level()) {
#if defined(LLMI_KERNELS_X86)
    case LLMI_KLEVEL_AVX2:
        return &llmi_kqkernels_avx2;
    case LLMI_KLEVEL_AVX512:
        return llmi_kernels_have_vnni() ? &llmi_kqkernels_avx512vnni : &llmi_kqkernels_avx2;
#endif
    default:
        return &c_kqkernels;
    }
}

/* ---- the f32-activation path ---------------------------------------------- */

/* y[t*ldy + r] for r in [r0, r1), t < nt <= F32_TILE, token t at x + t*cols. */
static void f32_rows(const llmi_weight *W, int64_t r0, int64_t r1, const float *x, int nt, float *y,
                     int64_t ldy) {
    const int64_t cols = W->cols, nb = cols / QK_K;
    const size_t bb = llmi_ttype_get(W->type)->block_bytes;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        float acc[F32_TILE] = {0};
        for (int64_t i = 0; i < nb; i++) {
            float w[QK_K];
            /* memcpy: the reference reads blocks through their struct, and
             * rows need not be aligned. */
            union {
                llmi_block_q4_k q4;
                llmi_block_q6_k q6;
            } blk;
            memcpy(&blk, row + (size_t)i * bb, bb);
            llmi_dequantize_row(W->type, &blk, w, QK_K);
            for (int t = 0; t < nt; t++)
                acc[t] += llmi_dot_f32(w, x + t * cols + QK_K * i, QK_K);
        }
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = acc[t];
    }
}

/* ---- the row split ----------------------------------------------------------
 *
 * As llmi_matmul_part: contiguous chunks of LLMI_MATMUL_ROW_CHUNK rows per
 * thread; with several token tiles, rows in blocks that stay in cache while
 * every tile passes over them. */

typedef void (*tile_fn)(const void *ctx, int64_t r0, int64_t r1, int t0, int nt);

static void split_rows(const llmi_weight *w, int n_tok, int tile, int ith, int nth, float *y,
                       int poison, tile_fn fn, const void *ctx) {
    if (n_tok <= 0 || w->rows <= 0 || nth <= 0 || ith < 0 || ith >= nth)
        return;
    const int64_t rows = w->rows;
    const int64_t nchunks = (rows + LLMI_MATMUL_ROW_CHUNK - 1) / LLMI_MATMUL_ROW_CHUNK;
    const int64_t c0 = nchunks * ith / nth, c1 = nchunks * (ith + 1) / nth;
    const int64_t r0 = c0 * LLMI_MATMUL_ROW_CHUNK;
    int64_t r1 = c1 * LLMI_MATMUL_ROW_CHUNK;
    if (r1 > rows)
        r1 = rows;
    if (r0 >= r1)
        return;
    if (poison) { /* a broken contract: NaN rows rather than a wild read */
        for (int t = 0; t < n_tok; t++)
            for (int64_t r = r0; r < r1; r++)
                y[t * rows + r] = NAN;
        return;
    }
    if (n_tok <= tile) {
        fn(ctx, r0, r1, 0, n_tok);
        return;
    }
    int64_t rb = w->row_bytes ? (int64_t)(ROW_BLOCK_BYTES / w->row_bytes) : 0;
    rb -= rb % LLMI_MATMUL_ROW_CHUNK;
    if (rb < LLMI_MATMUL_ROW_CHUNK)
        rb = LLMI_MATMUL_ROW_CHUNK;
    for (int64_t rs = r0; rs < r1; rs += rb) {
        const int64_t re = rs + rb < r1 ? rs + rb : r1;
        for (int t0 = 0; t0 < n_tok; t0 += tile)
            fn(ctx, rs, re, t0, n_tok - t0 < tile ? n_tok - t0 : tile);
    }
}

struct act_tile_ctx {
    const llmi_weight *w;
    const llmi_act *x;
    float *y;
    llmi_qrows_fn rows_fn;
};

static void act_tile(const void *p, int64_t r0, int64_t r1, int t0, int nt) {
    const struct act_tile_ctx *c = p;
    const size_t xs = c->x->q_row_bytes;
    c->rows_fn(c->w, r0, r1, (const uint8_t *)c->x->q + (size_t)t0 * xs, xs, nt,
               c->y + (int64_t)t0 * c->w->rows, c->w->rows);
}

void llmi_kq_matmul_act_part(const llmi_weight *w, const llmi_act *x, float *y, int ith, int nth) {
    const int bad_cols = w->cols % QK_K != 0;
    const int prepared = x->q && x->q_type == LLMI_T_Q8_K && x->cols == w->cols;
    assert((bad_cols || prepared) &&
           "llmi_matmul_act: activations not prepared for this weight type");
    const llmi_kqkernel_set *ks = kq_set();
    struct act_tile_ctx c = {w, x, y,
                             ks->rows[w->type == LLMI_T_Q4_K ? LLMI_KQ_Q4_K : LLMI_KQ_Q6_K]};
    split_rows(w, x->n_tok, ks->tile, ith, nth, y, bad_cols || !prepared, act_tile, &c);
}

struct f32_tile_ctx {
    const llmi_weight *w;
    const float *x;
    float *y;
};

static void f32_tile(const void *p, int64_t r0, int64_t r1, int t0, int nt) {
    const struct f32_tile_ctx *c = p;
    f32_rows(c->w, r0, r1, c->x + (int64_t)t0 * c->w->cols, nt, c->y + (int64_t)t0 * c->w->rows,
             c->w->rows);
}

void llmi_kq_matmul_f32_part(const llmi_weight *w, const float *x, int n_tok, float *y, int ith,
                             int nth) {
    struct f32_tile_ctx c = {w, x, y};
    split_rows(w, n_tok, F32_TILE, ith, nth, y, w->cols % QK_K != 0, f32_tile, &c);
}
