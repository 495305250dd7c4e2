/* K-quant kernels: Q8_K activations, the portable integer kernels (the
 * reference for kernels_k_x86.c and the only ones off x86-64) and the
 * f32-activation path. kernels_dispatch.c picks them by type and level.
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
 * Their f32 path (llmi_matmul) is kernels.c's llmi_rows_dequant_f32. */
#include "backend/cpu/kernels_impl.h"
#include "core/quant.h"

#define QK_K LLMI_QK_K
#define C_TILE 4

/* ---- activations ---------------------------------------------------------- */

/* quant.c's reference Q8_K values. */
void llmi_aquant_q8_k(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes) {
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

const llmi_qrows_impl llmi_qrows_q4_k_c = {C_TILE, c_rows_q4_k};
const llmi_qrows_impl llmi_qrows_q6_k_c = {C_TILE, c_rows_q6_k};
