/* Row operations of the quantized KV cache (LLM_KV_Q8_0, LLM_KV_Q4_0,
 * LLM_KV_FP8_E4M3), portable C: the reference for kernels_kvq_x86.c and the
 * only version off x86-64.
 *
 * A cached K or V row is GGUF's blocks of 32 (core/ttype.h), quantized by
 * core's reference quantizer when its token is computed (the same bits at
 * every kernel level, and the bits state loading produces). Attention reads
 * the blocks directly:
 *   dot:  sum over blocks b of d_b * (sum_j a[32b + j] * q_bj), the inner
 *         sum in float from j = 0 up, the outer one a float accumulator;
 *   axpy: y[32b + j] += (a * d_b) * q_bj,
 * with q the block's integers (Q4_0: nibble - 8; FP8: the code's exact
 * float value, read from a table, and d the block's f32 scale). That is the f32 dot and
 * axpy of the dequantized row (x = d * q) up to rounding: d is taken out
 * of each block's sum. The SIMD levels keep the per-block factoring and
 * differ only in how a block's 32 products are summed. */
#include "backend/cpu/kernels_impl.h"
#include "core/fp8.h"
#include "core/quant.h"

#include <math.h>

/* Element j of a Q4_0 block as a signed integer in [-8, 7]: nibbles hold
 * elements j (low) and j + 16 (high) of byte j % 16. */
static inline int q4_0_value(const llmi_block_q4_0 *b, int j) {
    const int byte = b->qs[j % (LLMI_QK / 2)];
    return (j < LLMI_QK / 2 ? byte & 15 : byte >> 4) - 8;
}

/* Blocks are 2-aligned in the cache (34 and 18 bytes); every access below
 * is by byte or through the block struct, whose alignment is 2. */
void llmi_kvq_store_q8_0(void *dst, const float *src, int n) {
    llmi_quantize_row(LLMI_T_Q8_0, src, dst, n);
}

void llmi_kvq_store_q4_0(void *dst, const float *src, int n) {
    llmi_quantize_row(LLMI_T_Q4_0, src, dst, n);
}

float llmi_kvq_dot_q8_0_c(const float *a, const void *bv, int n) {
    const llmi_block_q8_0 *b = bv;
    float acc = 0.0f;
    for (int i = 0; i < n / LLMI_QK; i++, a += LLMI_QK) {
        float s = 0.0f;
        for (int j = 0; j < LLMI_QK; j++)
            s += a[j] * (float)b[i].qs[j];
        acc += llmi_f16_to_f32(b[i].d) * s;
    }
    return acc;
}

float llmi_kvq_dot_q4_0_c(const float *a, const void *bv, int n) {
    const llmi_block_q4_0 *b = bv;
    float acc = 0.0f;
    for (int i = 0; i < n / LLMI_QK; i++, a += LLMI_QK) {
        float s = 0.0f;
        for (int j = 0; j < LLMI_QK; j++)
            s += a[j] * (float)q4_0_value(&b[i], j);
        acc += llmi_f16_to_f32(b[i].d) * s;
    }
    return acc;
}

void llmi_kvq_axpy_q8_0_c(float *y, float a, const void *xv, int n) {
    const llmi_block_q8_0 *x = xv;
    for (int i = 0; i < n / LLMI_QK; i++, y += LLMI_QK) {
        const float ad = a * llmi_f16_to_f32(x[i].d);
        for (int j = 0; j < LLMI_QK; j++)
            y[j] += ad * (float)x[i].qs[j];
    }
}

void llmi_kvq_axpy_q4_0_c(float *y, float a, const void *xv, int n) {
    const llmi_block_q4_0 *x = xv;
    for (int i = 0; i < n / LLMI_QK; i++, y += LLMI_QK) {
        const float ad = a * llmi_f16_to_f32(x[i].d);
        for (int j = 0; j < LLMI_QK; j++)
            y[j] += ad * (float)q4_0_value(&x[i], j);
    }
}

/* Every E4M3 code's value, as core/fp8.h's llmi_fp8_e4m3_to_f32 gives it
 * (test_kvquant checks all 256): exponent field e > 0 gives
 * (8 + m) * 2^e / 2^10, e = 0 the subnormal m / 2^9, S.1111.111 NaN. */
#define FP8_MAG(c)                                                                                 \
    (((c)&0x7f) == 0x7f ? NAN                                                                      \
     : ((c)&0x78)       ? (float)(8 + ((c)&7)) * (float)(1u << (((c) >> 3) & 15)) / 1024.0f        \
                        : (float)((c)&7) / 512.0f)
#define FP8_VAL(c) (((c)&0x80) ? -FP8_MAG(c) : FP8_MAG(c))
#define FP8_4(c) FP8_VAL(c), FP8_VAL((c) + 1), FP8_VAL((c) + 2), FP8_VAL((c) + 3)
#define FP8_16(c) FP8_4(c), FP8_4((c) + 4), FP8_4((c) + 8), FP8_4((c) + 12)
#define FP8_64(c) FP8_16(c), FP8_16((c) + 16), FP8_16((c) + 32), FP8_16((c) + 48)
const float llmi_kvq_fp8_e4m3_values[256] = {FP8_64(0), FP8_64(64), FP8_64(128), FP8_64(192)};

/* Blocks are 4-aligned in the cache (36 bytes). */
void llmi_kvq_store_fp8_e4m3(void *dst, const float *src, int n) {
    llmi_quantize_row(LLMI_T_FP8_E4M3, src, dst, n);
}

float llmi_kvq_dot_fp8_e4m3_c(const float *a, const void *bv, int n) {
    const llmi_block_fp8_e4m3 *b = bv;
    const float *v = llmi_kvq_fp8_e4m3_values;
    float acc = 0.0f;
    for (int i = 0; i < n / LLMI_QK; i++, a += LLMI_QK) {
        float s = 0.0f;
        for (int j = 0; j < LLMI_QK; j++)
            s += a[j] * v[b[i].qs[j]];
        acc += b[i].d * s;
    }
    return acc;
}

void llmi_kvq_axpy_fp8_e4m3_c(float *y, float a, const void *xv, int n) {
    const llmi_block_fp8_e4m3 *x = xv;
    const float *v = llmi_kvq_fp8_e4m3_values;
    for (int i = 0; i < n / LLMI_QK; i++, y += LLMI_QK) {
        const float ad = a * x[i].d;
        for (int j = 0; j < LLMI_QK; j++)
            y[j] += ad * v[x[i].qs[j]];
    }
}
