/* The 8-bit activation path (kernels.h, "8-bit activations"): activation
 * quantization, the portable integer kernels, dispatch and the llmi_act API.
 *
 * The portable kernels are the reference for the SIMD ones
 * (kernels_q8_x86.c) and the only implementation off x86-64. They compute
 * each block's integer sum in full and then, block after block, fold it into
 * one float accumulator with a fused multiply-add,
 *   acc = fma((float)isum_b, d_w * d_x, acc)   [Q4_1: acc = fma(m_w, s_x, acc)]
 * which is llama.cpp's generic formula with the sums in block order. The
 * AVX-512 VNNI kernels (a GEMM with one row per lane) do exactly this, so
 * they give the same bits; the AVX2 ones split the sums over lanes. */
#include "backend/kernels_impl.h"
#include "backend/kernels_k.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>

#define QK 32
#define C_QTILE 4
#define ROW_BLOCK_BYTES (128 * 1024)
/* Below this many tokens, quantizing on the calling thread is cheaper than
 * a pool run. */
#define PREP_THREADED_MIN 4

static int qt_index(uint32_t type) {
    switch (type) {
    case LLMI_T_Q4_0:
        return LLMI_QT_Q4_0;
    case LLMI_T_Q4_1:
        return LLMI_QT_Q4_1;
    case LLMI_T_Q8_0:
        return LLMI_QT_Q8_0;
    default:
        return -1;
    }
}

llmi_ttype llmi_act_type(llmi_ttype weight_type) {
    switch (weight_type) {
    case LLMI_T_Q4_0:
    case LLMI_T_Q8_0:
        return LLMI_T_Q8_0;
    case LLMI_T_Q4_1:
        return LLMI_T_Q8_1;
    case LLMI_T_Q4_K:
    case LLMI_T_Q6_K:
        return LLMI_T_Q8_K;
    default:
        return LLMI_T_F32;
    }
}

/* Bytes of one quantized activation row of nb blocks, 0 on overflow. */
static size_t act_row_bytes(int64_t nb, int q81) {
    (void)q81; /* Q8_1: d and s; Q8_0: d and the correction c */
    const uint64_t per_block = QK + 8;
    if (nb <= 0 || (uint64_t)nb > (SIZE_MAX - 63) / per_block)
        return 0;
    return ((size_t)nb * per_block + 63) & ~(size_t)63;
}

/* ---- portable C ------------------------------------------------------- */

static uint16_t ld16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

static float f16_round(float f) { return llmi_f16_to_f32(llmi_f32_to_f16(f)); }

/* What llama.cpp's x86 code does to x * id: _mm256_round_ps to nearest
 * (ties to even), _mm256_cvtps_epi32 (NaN and out-of-range give INT_MIN),
 * then saturating packs to int8. rintf rounds ties to even in the default
 * rounding mode, which is what the SIMD code uses as well. */
static int8_t c_round8(float v) {
    if (!(v >= -2147483648.0f && v < 2147483648.0f))
        return -128;
    const float r = rintf(v);
    return r > 127.0f ? 127 : r < -128.0f ? -128 : (int8_t)r;
}

static void c_quant(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes) {
    int8_t *qs = (int8_t *)row;
    float *d = (float *)(void *)(row + QK * nb);
    float *s = d + nb;
    for (int64_t b = 0; b < nb; b++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            const float a = fabsf(x[j]);
            if (a > amax)
                amax = a;
        }
        /* id is 127 / amax, not 1 / d: llama.cpp's x86 rounding, which
         * differs from its scalar reference (and from quant.c) in a few
         * last bits. */
        const float db = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            qs[b * QK + j] = c_round8(x[j] * id);
            sum += qs[b * QK + j];
        }
        d[b] = f16_round(db);
        if (q81)
            s[b] = f16_round(db * (float)sum);
        else
            ((int32_t *)(void *)s)[b] = -128 * sum;
    }
    const size_t used = (size_t)nb * (QK + 8);
    memset(row + used, 0, row_bytes - used);
}

/* Block b of a weight row as 32 integers; *dw the scale, *mw Q4_1's m. */
static void c_wblock(int qt, const uint8_t *row, int64_t b, int8_t *w, float *dw, float *mw) {
    switch (qt) {
    case LLMI_QT_Q4_0: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q4_0);
        const uint8_t *qs = blk + offsetof(llmi_block_q4_0, qs);
        for (int j = 0; j < 16; j++) {
            w[j] = (int8_t)((qs[j] & 15) - 8);
            w[j + 16] = (int8_t)((qs[j] >> 4) - 8);
        }
        *dw = llmi_f16_to_f32(ld16(blk));
        *mw = 0.0f;
        break;
    }
    case LLMI_QT_Q4_1: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q4_1);
        const uint8_t *qs = blk + offsetof(llmi_block_q4_1, qs);
        for (int j = 0; j < 16; j++) {
            w[j] = (int8_t)(qs[j] & 15);
            w[j + 16] = (int8_t)(qs[j] >> 4);
        }
        *dw = llmi_f16_to_f32(ld16(blk));
        *mw = llmi_f16_to_f32(ld16(blk + 2));
        break;
    }
    default: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q8_0);
        memcpy(w, blk + offsetof(llmi_block_q8_0, qs), QK);
        *dw = llmi_f16_to_f32(ld16(blk));
        *mw = 0.0f;
        break;
    }
    }
}

static void c_qrows(int qt, const llmi_weight *W, int64_t r0, int64_t r1, const uint8_t *xq,
                    size_t xs, int nt, float *y, int64_t ldy) {
    const int64_t nb = W->cols / QK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)r * W->row_bytes;
        float acc[C_QTILE] = {0};
        for (int64_t b = 0; b < nb; b++) {
            int8_t w[QK];
            float dw, mw;
            c_wblock(qt, row, b, w, &dw, &mw);
            for (int t = 0; t < nt; t++) {
                const int8_t *xt = (const int8_t *)(xq + (size_t)t * xs) + b * QK;
                const float *dx = (const float *)(const void *)(xq + (size_t)t * xs + QK * nb);
                int32_t isum = 0;
                for (int j = 0; j < QK; j++)
                    isum += w[j] * xt[j];
                /* |isum| < 2^24: exact in float. */
                acc[t] = fmaf((float)isum, dw * dx[b], acc[t]);
                if (qt == LLMI_QT_Q4_1)
                    acc[t] = fmaf(mw, dx[nb + b], acc[t]);
            }
        }
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = acc[t];
    }
}

#define C_QROWS(name, QT)                                                                          \
    static void name(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq, size_t xs,   \
                     int nt, float *y, int64_t ldy) {                                              \
        c_qrows(QT, w, r0, r1, xq, xs, nt, y, ldy);                                                \
    }
C_QROWS(c_qrows_q4_0, LLMI_QT_Q4_0)
C_QROWS(c_qrows_q4_1, LLMI_QT_Q4_1)
C_QROWS(c_qrows_q8_0, LLMI_QT_Q8_0)

static const llmi_qkernel_set c_qkernels = {
    .tile = C_QTILE,
    .rows = {[LLMI_QT_Q4_0] = c_qrows_q4_0,
             [LLMI_QT_Q4_1] = c_qrows_q4_1,
             [LLMI_QT_Q8_0] = c_qrows_q8_0},
    .quant = c_quant,
};

/* ---- dispatch ----------------------------------------------------------- */

static atomic_int g_vnni = -1;

int llmi_kernels_have_vnni(void) {
    int v = atomic_load_explicit(&g_vnni, memory_order_relaxed);
    if (v >= 0)
        return v;
    v = 0;
#if defined(LLMI_KERNELS_X86)
    __builtin_cpu_init();
    v = llmi_kernels_best_level() >= LLMI_KLEVEL_AVX512 && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#endif
    atomic_store_explicit(&g_vnni, v, memory_order_relaxed);
    return v;
}

static const llmi_qkernel_set *qkernel_set(void) {
    switch (llmi_kernels_level()) {
#if defined(LLMI_KERNELS_X86)
    case LLMI_KLEVEL_AVX2:
        return &llmi_qkernels_avx2;
    case LLMI_KLEVEL_AVX512:
        return llmi_kernels_have_vnni() ? &llmi_qkernels_avx512vnni : &llmi_qkernels_avx2;
#endif
    default:
        return &c_qkernels;
    }
}

/* ---- activations -------------------------------------------------------- */

size_t llmi_act_scratch_bytes(llmi_ttype weight_type, int64_t cols, int n_tok) {
    const llmi_ttype at = llmi_act_type(weight_type);
    if (at == LLMI_T_Q8_K) /* K-quants: kernels_k.c */
        return llmi_kq_act_scratch_bytes(cols, n_tok);
    if (at == LLMI_T_F32 || cols <= 0 || cols % QK != 0 || n_tok <= 0)
        return 0;
    const size_t rb = act_row_bytes(cols / QK, at == LLMI_T_Q8_1);
    size_t total;
    if (!rb || !llmi_mul_ok(rb, (size_t)n_tok, &total) || total > SIZE_MAX - 64)
        return 0;
    return total + 64; /* room to align the start */
}

struct prep_ctx {
    const llmi_qkernel_set *ks;
    const float *x;
    uint8_t *q;
    int64_t cols;
    size_t row_bytes;
    int n_tok, q81;
};

static void prep_task(void *p, int ith, int nth) {
    const struct prep_ctx *c = p;
    const int t0 = (int)((int64_t)c->n_tok * ith / nth);
    const int t1 = (int)((int64_t)c->n_tok * (ith + 1) / nth);
    for (int t = t0; t < t1; t++)
        c->ks->quant(c->x + (int64_t)t * c->cols, c->cols / QK, c->q81,
                     c->q + (size_t)t * c->row_bytes, c->row_bytes);
}

void llmi_act_prepare(llmi_pool *pool, llmi_ttype weight_type, const float *x, int n_tok,
                      int64_t cols, void *scratch, llmi_act *out) {
    if (llmi_act_type(weight_type) == LLMI_T_Q8_K) {
        llmi_kq_act_prepare(pool, x, n_tok, cols, scratch, out);
        return;
    }
    *out = (llmi_act){.f32 = x, .q = NULL, .q_type = LLMI_T_F32, .n_tok = n_tok, .cols = cols};
    if (!scratch || llmi_act_scratch_bytes(weight_type, cols, n_tok) == 0)
        return;
    const llmi_ttype at = llmi_act_type(weight_type);
    uint8_t *q = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    struct prep_ctx c = {
        qkernel_set(),    x, q, cols, act_row_bytes(cols / QK, at == LLMI_T_Q8_1), n_tok,
        at == LLMI_T_Q8_1};
    if (n_tok >= PREP_THREADED_MIN && llmi_pool_size(pool) > 1)
        llmi_pool_run(pool, prep_task, &c);
    else
        prep_task(&c, 0, 1);
    out->q = q;
    out->q_type = at;
    out->q_row_bytes = c.row_bytes;
}

/* ---- matmul ------------------------------------------------------------- */

static void nan_share(float *y, int64_t rows, int n_tok, int64_t r0, int64_t r1) {
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = r0; r < r1; r++)
            y[t * rows + r] = NAN;
}

void llmi_matmul_act_part(const llmi_weight *w, const llmi_act *x, float *y, int ith, int nth) {
    if (llmi_kq_is_k(w->type)) {
        llmi_kq_matmul_act_part(w, x, y, ith, nth);
        return;
    }
    const int qt = qt_index(w->type);
    if (qt < 0) { /* float weights (or unsupported: llmi_matmul ignores those) */
        llmi_matmul_part(w, x->f32, x->n_tok, y, ith, nth);
        return;
    }
    const int n_tok = x->n_tok;
    if (n_tok <= 0 || w->rows <= 0 || nth <= 0 || ith < 0 || ith >= nth)
        return;
    const int64_t rows = w->rows, cols = w->cols;
    const int64_t nchunks = (rows + LLMI_MATMUL_ROW_CHUNK - 1) / LLMI_MATMUL_ROW_CHUNK;
    const int64_t c0 = nchunks * ith / nth, c1 = nchunks * (ith + 1) / nth;
    const int64_t r0 = c0 * LLMI_MATMUL_ROW_CHUNK;
    int64_t r1 = c1 * LLMI_MATMUL_ROW_CHUNK;
    if (r1 > rows)
        r1 = rows;
    if (r0 >= r1)
        return;
    if (cols % QK != 0) { /* a broken contract: poison, don't read past rows */
        nan_share(y, rows, n_tok, r0, r1);
        return;
    }
    const int prepared = x->q && x->q_type == llmi_act_type(w->type) && x->cols == cols;
    assert(prepared && "llmi_matmul_act: activations not prepared for this weight type");
    if (!prepared) {
        nan_share(y, rows, n_tok, r0, r1);
        return;
    }
    const llmi_qkernel_set *ks = qkernel_set();
    const llmi_qrows_fn rows_fn = ks->rows[qt];
    const uint8_t *xq = x->q;
    const size_t xs = x->q_row_bytes;
    if (n_tok <= ks->tile) {
        rows_fn(w, r0, r1, xq, xs, n_tok, y, rows);
        return;
    }
    /* Several token tiles: rows in blocks that stay in cache while every
     * tile passes over them, so the weights come from memory once. */
    int64_t rb = w->row_bytes ? (int64_t)(ROW_BLOCK_BYTES / w->row_bytes) : 0;
    rb -= rb % LLMI_MATMUL_ROW_CHUNK;
    if (rb < LLMI_MATMUL_ROW_CHUNK)
        rb = LLMI_MATMUL_ROW_CHUNK;
    for (int64_t rs = r0; rs < r1; rs += rb) {
        const int64_t re = rs + rb < r1 ? rs + rb : r1;
        for (int t0 = 0; t0 < n_tok; t0 += ks->tile) {
            const int nt = n_tok - t0 < ks->tile ? n_tok - t0 : ks->tile;
            rows_fn(w, rs, re, xq + (size_t)t0 * xs, xs, nt, y + (int64_t)t0 * rows, rows);
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
