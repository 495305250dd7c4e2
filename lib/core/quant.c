/* Reference quantization. The rounding below deliberately mirrors ggml's
 * reference quantizers (scales from the unrounded d, nibbles from truncating
 * x/d + 8.5 resp. + 0.5) so files we write quantize exactly like files made
 * by llama.cpp, and kernels can compare bit for bit. */
#include "core/quant.h"

#include "core/core.h"
#include "core/fp8.h"

#include <assert.h>
#include <math.h>
#include <string.h>

static void quantize_q4_0(const float *x, llmi_block_q4_0 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += LLMI_QK) {
        /* The signed extreme maps to -8 exactly, so the full 16 levels are
         * used on the side of the largest magnitude. */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < LLMI_QK; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = llmi_f32_to_f16(d);
        for (int j = 0; j < LLMI_QK / 2; j++) {
            int q0 = (int)(int8_t)(x[j] * id + 8.5f);
            int q1 = (int)(int8_t)(x[j + LLMI_QK / 2] * id + 8.5f);
            if (q0 > 15)
                q0 = 15;
            if (q1 > 15)
                q1 = 15;
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quantize_q4_1(const float *x, llmi_block_q4_1 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += LLMI_QK) {
        float min = x[0], max = x[0];
        for (int j = 1; j < LLMI_QK; j++) {
            if (x[j] < min)
                min = x[j];
            if (x[j] > max)
                max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = llmi_f32_to_f16(d);
        y[b].m = llmi_f32_to_f16(min);
        for (int j = 0; j < LLMI_QK / 2; j++) {
            int q0 = (int)(int8_t)((x[j] - min) * id + 0.5f);
            int q1 = (int)(int8_t)((x[j + LLMI_QK / 2] - min) * id + 0.5f);
            if (q0 > 15)
                q0 = 15;
            if (q1 > 15)
                q1 = 15;
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Q5_0 and Q5_1 round like Q4_0 and Q4_1 with 32 levels: the signed
 * extreme maps to -16, resp. the range spans 31 steps from the minimum. */
static void quantize_q5_0(const float *x, llmi_block_q5_0 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += LLMI_QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < LLMI_QK; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = llmi_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < LLMI_QK / 2; j++) {
            int q0 = (int)(int8_t)(x[j] * id + 16.5f);
            int q1 = (int)(int8_t)(x[j + LLMI_QK / 2] * id + 16.5f);
            if (q0 > 31)
                q0 = 31;
            if (q1 > 31)
                q1 = 31;
            y[b].qs[j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + LLMI_QK / 2);
        }
        for (int k = 0; k < 4; k++)
            y[b].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

static void quantize_q5_1(const float *x, llmi_block_q5_1 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += LLMI_QK) {
        float min = x[0], max = x[0];
        for (int j = 1; j < LLMI_QK; j++) {
            if (x[j] < min)
                min = x[j];
            if (x[j] > max)
                max = x[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = llmi_f32_to_f16(d);
        y[b].m = llmi_f32_to_f16(min);
        uint32_t qh = 0;
        for (int j = 0; j < LLMI_QK / 2; j++) {
            int q0 = (int)(uint8_t)((x[j] - min) * id + 0.5f);
            int q1 = (int)(uint8_t)((x[j + LLMI_QK / 2] - min) * id + 0.5f);
            if (q0 > 31)
                q0 = 31;
            if (q1 > 31)
                q1 = 31;
            y[b].qs[j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + LLMI_QK / 2);
        }
        for (int k = 0; k < 4; k++)
            y[b].qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

/* The FP8 KV cache's blocks: d = amax / 448 in f32, q = e4m3(x / d) with
 * core/fp8.h's rounding (all zero codes when d is 0). The CUDA KV store
 * computes the same expressions, so its rows are these bits. */
static void quantize_fp8_e4m3(const float *x, llmi_block_fp8_e4m3 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += LLMI_QK) {
        float amax = 0.0f;
        for (int j = 0; j < LLMI_QK; j++)
            if (fabsf(x[j]) > amax)
                amax = fabsf(x[j]);
        const float d = amax / LLMI_FP8_E4M3_MAX;
        y[b].d = d;
        for (int j = 0; j < LLMI_QK; j++)
            y[b].qs[j] = d != 0.0f ? llmi_f32_to_fp8_e4m3(x[j] / d) : 0;
    }
}

/* Element j's 5-bit value in a Q5 block: its nibble from qs, bit j of qh. */
static int q5_value(const uint8_t *qs, const uint8_t *qh, int j) {
    const int nib = j < LLMI_QK / 2 ? qs[j] & 15 : qs[j - LLMI_QK / 2] >> 4;
    return nib | ((qh[j / 8] >> (j % 8)) & 1) << 4;
}

static void quantize_q8_0(const float *x, llmi_block_q8_0 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += LLMI_QK) {
        float amax = 0.0f;
        for (int j = 0; j < LLMI_QK; j++) {
            if (fabsf(x[j]) > amax)
                amax = fabsf(x[j]);
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = llmi_f32_to_f16(d);
        for (int j = 0; j < LLMI_QK; j++)
            y[b].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* Like Q8_0, plus s = d * sum(q) from the unrounded d (ggml's reference). The
 * matmuls quantize their activations with llama.cpp's x86 rounding instead
 * (kernels.h); this is the file format's reference. */
static void quantize_q8_1(const float *x, llmi_block_q8_1 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += LLMI_QK) {
        float amax = 0.0f;
        for (int j = 0; j < LLMI_QK; j++) {
            if (fabsf(x[j]) > amax)
                amax = fabsf(x[j]);
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < LLMI_QK; j++) {
            y[b].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].d = llmi_f32_to_f16(d);
        y[b].s = llmi_f32_to_f16((float)sum * d);
    }
}

void llmi_quantize_row(llmi_ttype type, const float *src, void *dst, int64_t n) {
    assert(n >= 0);
    switch (type) {
    case LLMI_T_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case LLMI_T_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = llmi_f32_to_f16(src[i]);
        break;
    }
    case LLMI_T_BF16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = llmi_f32_to_bf16(src[i]);
        break;
    }
    case LLMI_T_Q4_0:
        assert(n % LLMI_QK == 0);
        quantize_q4_0(src, dst, n / LLMI_QK);
        break;
    case LLMI_T_Q4_1:
        assert(n % LLMI_QK == 0);
        quantize_q4_1(src, dst, n / LLMI_QK);
        break;
    case LLMI_T_Q5_0:
        assert(n % LLMI_QK == 0);
        quantize_q5_0(src, dst, n / LLMI_QK);
        break;
    case LLMI_T_Q5_1:
        assert(n % LLMI_QK == 0);
        quantize_q5_1(src, dst, n / LLMI_QK);
        break;
    case LLMI_T_Q8_0:
        assert(n % LLMI_QK == 0);
        quantize_q8_0(src, dst, n / LLMI_QK);
        break;
    case LLMI_T_Q8_1:
        assert(n % LLMI_QK == 0);
        quantize_q8_1(src, dst, n / LLMI_QK);
        break;
    case LLMI_T_FP8_E4M3:
        assert(n % LLMI_QK == 0);
        quantize_fp8_e4m3(src, dst, n / LLMI_QK);
        break;
    case LLMI_T_Q4_K:
    case LLMI_T_Q6_K:
    case LLMI_T_Q8_K:
        llmi_quant_k_quantize(type, src, dst, n);
        break;
    default:
        assert(!"llmi_quantize_row: unknown type");
    }
}

void llmi_dequantize_row(llmi_ttype type, const void *src, float *dst, int64_t n) {
    assert(n >= 0);
    switch (type) {
    case LLMI_T_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case LLMI_T_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = llmi_f16_to_f32(s[i]);
        break;
    }
    case LLMI_T_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = llmi_bf16_to_f32(s[i]);
        break;
    }
    case LLMI_T_Q4_0: {
        assert(n % LLMI_QK == 0);
        const llmi_block_q4_0 *x = src;
        for (int64_t b = 0; b < n / LLMI_QK; b++, dst += LLMI_QK) {
            const float d = llmi_f16_to_f32(x[b].d);
            for (int j = 0; j < LLMI_QK / 2; j++) {
                dst[j] = (float)((x[b].qs[j] & 0x0f) - 8) * d;
                dst[j + LLMI_QK / 2] = (float)((x[b].qs[j] >> 4) - 8) * d;
            }
        }
        break;
    }
    case LLMI_T_Q4_1: {
        assert(n % LLMI_QK == 0);
        const llmi_block_q4_1 *x = src;
        for (int64_t b = 0; b < n / LLMI_QK; b++, dst += LLMI_QK) {
            const float d = llmi_f16_to_f32(x[b].d);
            const float m = llmi_f16_to_f32(x[b].m);
            for (int j = 0; j < LLMI_QK / 2; j++) {
                dst[j] = (float)(x[b].qs[j] & 0x0f) * d + m;
                dst[j + LLMI_QK / 2] = (float)(x[b].qs[j] >> 4) * d + m;
            }
        }
        break;
    }
    case LLMI_T_Q5_0: {
        assert(n % LLMI_QK == 0);
        const llmi_block_q5_0 *x = src;
        for (int64_t b = 0; b < n / LLMI_QK; b++, dst += LLMI_QK) {
            const float d = llmi_f16_to_f32(x[b].d);
            for (int j = 0; j < LLMI_QK; j++)
                dst[j] = (float)(q5_value(x[b].qs, x[b].qh, j) - 16) * d;
        }
        break;
    }
    case LLMI_T_Q5_1: {
        assert(n % LLMI_QK == 0);
        const llmi_block_q5_1 *x = src;
        for (int64_t b = 0; b < n / LLMI_QK; b++, dst += LLMI_QK) {
            const float d = llmi_f16_to_f32(x[b].d);
            const float m = llmi_f16_to_f32(x[b].m);
            for (int j = 0; j < LLMI_QK; j++)
                dst[j] = (float)q5_value(x[b].qs, x[b].qh, j) * d + m;
        }
        break;
    }
    case LLMI_T_Q8_0: {
        assert(n % LLMI_QK == 0);
        const llmi_block_q8_0 *x = src;
        for (int64_t b = 0; b < n / LLMI_QK; b++, dst += LLMI_QK) {
            const float d = llmi_f16_to_f32(x[b].d);
            for (int j = 0; j < LLMI_QK; j++)
                dst[j] = (float)x[b].qs[j] * d;
        }
        break;
    }
    case LLMI_T_FP8_E4M3: {
        assert(n % LLMI_QK == 0);
        const llmi_block_fp8_e4m3 *x = src;
        for (int64_t b = 0; b < n / LLMI_QK; b++, dst += LLMI_QK)
            for (int j = 0; j < LLMI_QK; j++)
                dst[j] = x[b].d * llmi_fp8_e4m3_to_f32(x[b].qs[j]);
        break;
    }
    case LLMI_T_Q8_1: { /* s is redundant: x = d*q */
        assert(n % LLMI_QK == 0);
        const llmi_block_q8_1 *x = src;
        for (int64_t b = 0; b < n / LLMI_QK; b++, dst += LLMI_QK) {
            const float d = llmi_f16_to_f32(x[b].d);
            for (int j = 0; j < LLMI_QK; j++)
                dst[j] = (float)x[b].qs[j] * d;
        }
        break;
    }
    case LLMI_T_Q4_K:
    case LLMI_T_Q6_K:
    case LLMI_T_Q8_K:
        llmi_quant_k_dequantize(type, src, dst, n);
        break;
    default:
        assert(!"llmi_dequantize_row: unknown type");
    }
}
