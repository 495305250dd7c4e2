/* The 8-bit activation path for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights (kernels.h,
 * "8-bit activations"): Q8_0/Q8_1 activation quantization and the portable
 * integer kernels. kernels_dispatch.c picks them by weight type and level.
 *
 * The portable kernels are the reference for the SIMD ones
 * (kernels_q8_x86.c) and the only implementation off x86-64. They compute
 * each block's integer sum in full and then, block after block, fold it into
 * one float accumulator with a fused multiply-add,
 *   acc = fma((float)isum_b, d_w * d_x, acc)   [Q4_1, Q5_1: acc = fma(m_w, s_x, acc)]
 * which is llama.cpp's generic formula with the sums in block order. The
 * AVX-512 VNNI kernels (a GEMM with one row per lane) do exactly this, so
 * they give the same bits; the AVX2 ones split the sums over lanes. */
#include "backend/cpu/kernels_impl.h"

#include <math.h>

#define QK 32
#define C_QTILE 4

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

void llmi_aquant_q8_c(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes) {
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

/* The 32 five-bit values of a Q5 block: nibbles as in Q4, bit j of the
 * little-endian qh for element j; minus `bias` (16 for Q5_0, 0 for Q5_1). */
static void c_q5_values(const uint8_t *qh, const uint8_t *qs, int bias, int8_t *w) {
    const uint32_t h =
        (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        w[j] = (int8_t)(((qs[j] & 15) | ((h >> j) & 1) << 4) - bias);
        w[j + 16] = (int8_t)(((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4) - bias);
    }
}

/* Block b of a weight row as 32 integers; *dw the scale, *mw the m of
 * Q4_1 and Q5_1. */
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
    case LLMI_QT_Q5_0: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q5_0);
        c_q5_values(blk + offsetof(llmi_block_q5_0, qh), blk + offsetof(llmi_block_q5_0, qs), 16,
                    w);
        *dw = llmi_f16_to_f32(ld16(blk));
        *mw = 0.0f;
        break;
    }
    case LLMI_QT_Q5_1: {
        const uint8_t *blk = row + b * (int64_t)sizeof(llmi_block_q5_1);
        c_q5_values(blk + offsetof(llmi_block_q5_1, qh), blk + offsetof(llmi_block_q5_1, qs), 0, w);
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
                if (llmi_qt_has_min(qt))
                    acc[t] = fmaf(mw, dx[nb + b], acc[t]);
            }
        }
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = acc[t];
    }
}

#define C_QROWS(name, QT)                                                                          \
    static void c_##name(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq,          \
                         size_t xs, int nt, float *y, int64_t ldy) {                               \
        c_qrows(QT, w, r0, r1, xq, xs, nt, y, ldy);                                                \
    }                                                                                              \
    const llmi_qrows_impl llmi_##name##_c = {C_QTILE, c_##name};
C_QROWS(qrows_q4_0, LLMI_QT_Q4_0)
C_QROWS(qrows_q4_1, LLMI_QT_Q4_1)
C_QROWS(qrows_q8_0, LLMI_QT_Q8_0)
C_QROWS(qrows_q5_0, LLMI_QT_Q5_0)
C_QROWS(qrows_q5_1, LLMI_QT_Q5_1)
