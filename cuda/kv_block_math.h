/* The quantized KV cache's block arithmetic (LLMI_T_Q8_0 and
 * LLMI_T_FP8_E4M3 blocks of 32, core/ttype.h) as __host__ __device__
 * functions. The CUDA KV store quantizes with these, and
 * tests/cuda/test_device_math.cu checks on any machine that, compiled for
 * the host, they give core's quantizer's bytes (lib/core/quant.c): every
 * step is a correctly rounded f32 operation (device_math.h's non-fusing
 * ones) or integer code (core/fp8.h), so the device computes the same bits
 * and a row written on a GPU is the CPU's row.
 *
 * A block's amax is the largest |x| of its 32 values with NaNs ignored
 * (the CPU's `fabsf(x) > amax` from 0; fmaxf from 0 on the device).
 *
 * Compiled by nvcc only. */
#ifndef LLMI_CUDA_KV_BLOCK_MATH_H
#define LLMI_CUDA_KV_BLOCK_MATH_H

#include "core/fp8.h"
#include "device_math.h"

/* FP8: d = amax / 448 in f32; code = e4m3(x / d), 0 when d is 0. */
LLMI_HD float llmi_cu_fp8_scale(float amax) { return llmi_cu_div(amax, LLMI_FP8_E4M3_MAX); }

LLMI_HD uint8_t llmi_cu_fp8_code(float x, float d) {
    return d != 0.0f ? llmi_f32_to_fp8_e4m3(llmi_cu_div(x, d)) : (uint8_t)0;
}

/* x = d * e4m3(q), as llmi_dequantize_row gives it. */
LLMI_HD float llmi_cu_fp8_value(float d, uint8_t q) {
    return llmi_cu_mul(d, llmi_fp8_e4m3_to_f32(q));
}

/* Q8_0 (GGUF's reference quantizer): d = amax / 127, stored as f16;
 * q = round(x * (1 / d)) with the unrounded d, 0 when d is 0. */
LLMI_HD float llmi_cu_q8_0_scale(float amax) { return llmi_cu_div(amax, 127.0f); }

LLMI_HD int8_t llmi_cu_q8_0_code(float x, float d) {
    const float id = d != 0.0f ? llmi_cu_div(1.0f, d) : 0.0f;
    return (int8_t)roundf(llmi_cu_mul(x, id));
}

/* x = q * d16 widened, as llmi_dequantize_row gives it. */
LLMI_HD float llmi_cu_q8_0_value(uint32_t d16, int8_t q) {
    return llmi_cu_mul((float)q, llmi_cu_f16_to_f32(d16));
}

/* A whole block the way the KV store kernel quantizes it (one lane per
 * value there): for host tests. */
LLMI_HD void llmi_cu_fp8_block(const float *x, llmi_block_fp8_e4m3 *b) {
    float amax = 0.0f;
    for (int j = 0; j < LLMI_QK; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    b->d = llmi_cu_fp8_scale(amax);
    for (int j = 0; j < LLMI_QK; j++)
        b->qs[j] = llmi_cu_fp8_code(x[j], b->d);
}

LLMI_HD void llmi_cu_q8_0_block(const float *x, llmi_block_q8_0 *b) {
    float amax = 0.0f;
    for (int j = 0; j < LLMI_QK; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    const float d = llmi_cu_q8_0_scale(amax);
    b->d = llmi_cu_f32_to_f16(d);
    for (int j = 0; j < LLMI_QK; j++)
        b->qs[j] = llmi_cu_q8_0_code(x[j], d);
}

#endif
