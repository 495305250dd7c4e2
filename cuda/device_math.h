/* The arithmetic of the CUDA kernels as __host__ __device__ functions, so
 * that host tests (tests/cuda/test_device_math.cu) check on any machine
 * what the kernels compute on a GPU: dequantization of every block type,
 * f16/bf16 rounding, KV slot addressing, RoPE angles, the split-KV softmax
 * partials and their merge, the GLU activations, and where tensor-core
 * (mma.sync) fragments hold their elements.
 *
 * Bit-identity with the CPU: nvcc contracts a * b + c into one FMA in
 * device code unless told not to, and the CPU reference never does, so the
 * dequantization and conversion arithmetic goes through llmi_cu_mul / _add
 * / _sub, which use the non-contractible _rn intrinsics on the device and
 * plain operators on the host (ISO C++ mode: no contraction). Transcendental
 * functions (expf, tanhf, sinf, cosf) are CUDA's accurate ones on the
 * device (within 2 ulp of glibc's), glibc's on the host.
 *
 * Compiled by nvcc only (the kernel sources and the CUDA host tests). */
#ifndef LLMI_CUDA_DEVICE_MATH_H
#define LLMI_CUDA_DEVICE_MATH_H

#include "core/ttype.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#ifdef __CUDACC__
#define LLMI_HD __host__ __device__ __forceinline__
#else
#define LLMI_HD static inline
#endif

/* ---- arithmetic that never fuses ---- */

LLMI_HD float llmi_cu_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

LLMI_HD float llmi_cu_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

LLMI_HD float llmi_cu_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

LLMI_HD float llmi_cu_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

LLMI_HD uint32_t llmi_cu_f2u(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

LLMI_HD float llmi_cu_u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

LLMI_HD float llmi_cu_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return fmaf(a, b, c);
#endif
}

/* q - bias for a non-negative integer q < 2^23 and an integer bias (0 ..
 * 128), exactly: 2^23 + q has q in its mantissa. A logic op and an add
 * instead of an int-to-float conversion, which runs at a quarter of the
 * FP32 rate on the GPU. */
LLMI_HD float llmi_cu_small_int(uint32_t q, float bias = 0.0f) {
    return llmi_cu_sub(llmi_cu_u2f(0x4B000000u | q), 8388608.0f + bias);
}

/* 0x4B000000 | byte b of v: the float 2^23 + that byte. One byte permute
 * on the device. */
LLMI_HD uint32_t llmi_cu_magic_byte(uint32_t v, int b) {
#ifdef __CUDA_ARCH__
    return __byte_perm(v, 0x4B000000u, 0x7540u | (uint32_t)b);
#else
    return 0x4B000000u | ((v >> (8 * b)) & 0xffu);
#endif
}

/* ---- loads: vector loads on the device, memcpy on the host ---- */

LLMI_HD uint32_t llmi_cu_load_u16(const uint8_t *p) { /* p 2-byte aligned */
#ifdef __CUDA_ARCH__
    return *(const uint16_t *)p;
#else
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#endif
}

/* 16 bytes at p (16-byte aligned on the device) as four little-endian
 * words. */
LLMI_HD void llmi_cu_load16(const uint8_t *p, uint32_t w[4]) {
#ifdef __CUDA_ARCH__
    const uint4 v = __ldg((const uint4 *)p);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
#else
    memcpy(w, p, 16);
#endif
}

/* ---- f16 / bf16 ---- */

/* Exactly core's llmi_f16_to_f32 (a subnormal half is man * 2^-24). The
 * device converts in hardware: widening is exact, so only a NaN's payload
 * may differ. */
LLMI_HD float llmi_cu_f16_to_f32(uint32_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)h));
#else
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0)
            return llmi_cu_u2f(sign);
        return llmi_cu_u2f(llmi_cu_f2u(llmi_cu_mul((float)man, 5.9604644775390625e-8f)) | sign);
    }
    if (exp == 31)
        return llmi_cu_u2f(sign | 0x7f800000u | man << 13);
    return llmi_cu_u2f(sign | (exp + 112) << 23 | man << 13);
#endif
}

LLMI_HD float llmi_cu_bf16_to_f32(uint32_t h) { return llmi_cu_u2f(h << 16); }

/* Round to nearest even, as core's llmi_f32_to_f16: inf from 65520 on, a
 * NaN stays a quiet NaN, subnormal halves kept. */
LLMI_HD uint16_t llmi_cu_f32_to_f16(float f) {
    const uint32_t x = llmi_cu_f2u(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) /* below 2^-14: a * 2^24 is exact, rint gives the mantissa */
        return (uint16_t)(sign | (uint16_t)rintf(llmi_cu_mul(llmi_cu_u2f(ax), 16777216.0f)));
    const uint32_t mant_round = ax + 0xfffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | (uint16_t)((mant_round - 0x38000000u) >> 13));
}

/* Round to nearest even, as core's llmi_f32_to_bf16. */
LLMI_HD uint16_t llmi_cu_f32_to_bf16(float f) {
    uint32_t x = llmi_cu_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- block dequantization ----
 * llmi_cu_deq_elem: element j of the block at blk (one element for float
 * types, j < the type's block), with core's arithmetic (quant.c,
 * quant_k.c) operation for operation.
 * llmi_cu_deq_chunk32: the 32 elements of chunk c of a row (elements
 * 32c .. 32c+31) of a block type: the unit one GEMV lane takes at a time.
 * Q4_K reads its 32 quant bytes with two 16-byte loads (row and data
 * 16-byte aligned on the device); the other types are 2-byte aligned and
 * read 16-bit words. */

/* Q5 element j's 5-bit value: its nibble from qs, bit j of qh. */
LLMI_HD uint32_t llmi_cu_q5_value(const uint8_t *qs, uint32_t qh, int j) {
    const uint32_t nib = j < LLMI_QK / 2 ? qs[j] & 15u : (uint32_t)qs[j - LLMI_QK / 2] >> 4;
    return nib | ((qh >> j) & 1u) << 4;
}

/* Q4_K sub-block j's 6-bit scale and min (core/quant.h's packing). */
LLMI_HD void llmi_cu_q4k_scale_min(const uint8_t *s, int j, uint32_t *sc, uint32_t *m) {
    if (j < 4) {
        *sc = s[j] & 63u;
        *m = s[j + 4] & 63u;
    } else {
        *sc = (s[j + 4] & 15u) | (uint32_t)(s[j - 4] >> 6) << 4;
        *m = ((uint32_t)s[j + 4] >> 4) | (uint32_t)(s[j] >> 6) << 4;
    }
}

/* Q4_K sub-block j's factors: x = d0 * q - n0 (d0 = d * sc, n0 = dmin * m,
 * rounded as quant_k.c rounds them). */
LLMI_HD void llmi_cu_q4k_factors(const uint8_t *blk, int j, float *d0, float *n0) {
    uint32_t sc, m;
    llmi_cu_q4k_scale_min(blk + offsetof(llmi_block_q4_k, scales), j, &sc, &m);
    const uint32_t dd = llmi_cu_load_u16(blk) | llmi_cu_load_u16(blk + 2) << 16;
    *d0 = llmi_cu_mul(llmi_cu_f16_to_f32(dd & 0xffff), llmi_cu_small_int(sc));
    *n0 = llmi_cu_mul(llmi_cu_f16_to_f32(dd >> 16), llmi_cu_small_int(m));
}

/* Q6_K element e's signed 6-bit value (ttype.h's layout). */
LLMI_HD int llmi_cu_q6k_value(const uint8_t *blk, int e) {
    const int h = e / 128, q = (e % 128) / 32, l = e % 32;
    const uint8_t *ql = blk + offsetof(llmi_block_q6_k, ql) + 64 * h + 32 * (q & 1) + l;
    const uint8_t *qh = blk + offsetof(llmi_block_q6_k, qh) + 32 * h + l;
    const int lo = (q >> 1) ? *ql >> 4 : *ql & 15;
    return (lo | ((*qh >> (2 * q)) & 3) << 4) - 32;
}

LLMI_HD float llmi_cu_deq_elem(llmi_ttype type, const uint8_t *blk, int j) {
    switch (type) {
    case LLMI_T_F32: {
        float f;
        memcpy(&f, blk, 4);
        return f;
    }
    case LLMI_T_F16:
        return llmi_cu_f16_to_f32(llmi_cu_load_u16(blk));
    case LLMI_T_BF16:
        return llmi_cu_bf16_to_f32(llmi_cu_load_u16(blk));
    case LLMI_T_Q4_0: {
        const float d = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk));
        const uint8_t b = blk[2 + j % 16];
        return llmi_cu_mul((float)((j < 16 ? b & 15 : b >> 4) - 8), d);
    }
    case LLMI_T_Q4_1: {
        const float d = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk));
        const float m = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk + 2));
        const uint8_t b = blk[4 + j % 16];
        return llmi_cu_add(llmi_cu_mul((float)(j < 16 ? b & 15 : b >> 4), d), m);
    }
    case LLMI_T_Q5_0: {
        const float d = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk));
        const uint32_t qh = llmi_cu_load_u16(blk + 2) | llmi_cu_load_u16(blk + 4) << 16;
        return llmi_cu_mul((float)((int)llmi_cu_q5_value(blk + 6, qh, j) - 16), d);
    }
    case LLMI_T_Q5_1: {
        const float d = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk));
        const float m = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk + 2));
        const uint32_t qh = llmi_cu_load_u16(blk + 4) | llmi_cu_load_u16(blk + 6) << 16;
        return llmi_cu_add(llmi_cu_mul((float)llmi_cu_q5_value(blk + 8, qh, j), d), m);
    }
    case LLMI_T_Q8_0:
        return llmi_cu_mul((float)(int8_t)blk[2 + j], llmi_cu_f16_to_f32(llmi_cu_load_u16(blk)));
    case LLMI_T_Q4_K: {
        float d0, n0;
        llmi_cu_q4k_factors(blk, j / 32, &d0, &n0);
        const uint8_t b = blk[offsetof(llmi_block_q4_k, qs) + 32 * (j / 64) + j % 32];
        const uint32_t q = (j / 32) % 2 ? (uint32_t)b >> 4 : b & 15u;
        return llmi_cu_sub(llmi_cu_mul(d0, (float)q), n0);
    }
    case LLMI_T_Q6_K: {
        const float d = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk + offsetof(llmi_block_q6_k, d)));
        const int8_t sc = (int8_t)blk[offsetof(llmi_block_q6_k, scales) + j / 16];
        return llmi_cu_mul(llmi_cu_mul(d, (float)sc), (float)llmi_cu_q6k_value(blk, j));
    }
    default:
        return NAN;
    }
}

/* Elements per block and bytes per block of the types the kernels take;
 * 0 for others. Float types count as blocks of one. */
LLMI_HD uint32_t llmi_cu_block_elems(llmi_ttype type) {
    switch (type) {
    case LLMI_T_F32:
    case LLMI_T_F16:
    case LLMI_T_BF16:
        return 1;
    case LLMI_T_Q4_0:
    case LLMI_T_Q4_1:
    case LLMI_T_Q5_0:
    case LLMI_T_Q5_1:
    case LLMI_T_Q8_0:
        return LLMI_QK;
    case LLMI_T_Q4_K:
    case LLMI_T_Q6_K:
        return LLMI_QK_K;
    default:
        return 0;
    }
}

LLMI_HD uint32_t llmi_cu_block_bytes(llmi_ttype type) {
    switch (type) {
    case LLMI_T_F32:
        return 4;
    case LLMI_T_F16:
    case LLMI_T_BF16:
        return 2;
    case LLMI_T_Q4_0:
        return sizeof(llmi_block_q4_0);
    case LLMI_T_Q4_1:
        return sizeof(llmi_block_q4_1);
    case LLMI_T_Q5_0:
        return sizeof(llmi_block_q5_0);
    case LLMI_T_Q5_1:
        return sizeof(llmi_block_q5_1);
    case LLMI_T_Q8_0:
        return sizeof(llmi_block_q8_0);
    case LLMI_T_Q4_K:
        return sizeof(llmi_block_q4_k);
    case LLMI_T_Q6_K:
        return sizeof(llmi_block_q6_k);
    default:
        return 0;
    }
}

/* 16 nibble-bytes' low (hi false) or high nibbles minus bias, as floats,
 * from 4 words. */
LLMI_HD void llmi_cu_nibbles16(const uint32_t w[4], bool hi, float bias, float out[16]) {
    for (int k = 0; k < 4; k++) {
        const uint32_t v = hi ? (w[k] >> 4) & 0x0f0f0f0fu : w[k] & 0x0f0f0f0fu;
        for (int b = 0; b < 4; b++)
            out[4 * k + b] = llmi_cu_sub(llmi_cu_u2f(llmi_cu_magic_byte(v, b)), 8388608.0f + bias);
    }
}

/* 16 bytes at a 2-byte aligned p as four words. */
LLMI_HD void llmi_cu_load16_u16(const uint8_t *p, uint32_t w[4]) {
    for (int k = 0; k < 4; k++)
        w[k] = llmi_cu_load_u16(p + 4 * k) | llmi_cu_load_u16(p + 4 * k + 2) << 16;
}

/* d * q + m, rounded twice as core does, or once (fused). */
LLMI_HD float llmi_cu_scale_add(float q, float d, float m, bool fused) {
    return fused ? llmi_cu_fma(q, d, m) : llmi_cu_add(llmi_cu_mul(q, d), m);
}

/* Chunk c (32 elements) of a row of a block type, as core dequantizes it.
 * fused: the types with an offset (Q4_1, Q5_1, Q4_K) round d * q + m once
 * (an FMA) instead of twice: one instruction less per weight for the GEMV,
 * whose sums round differently from the CPU's anyway; the dequantization
 * kernels keep core's bits. */
LLMI_HD void llmi_cu_deq_chunk32(llmi_ttype type, const uint8_t *row, uint32_t c, float w[32],
                                 bool fused = false) {
    switch (type) {
    case LLMI_T_Q4_0:
    case LLMI_T_Q4_1: {
        const bool q41 = type == LLMI_T_Q4_1;
        const uint8_t *blk =
            row + (size_t)c * (q41 ? sizeof(llmi_block_q4_1) : sizeof(llmi_block_q4_0));
        const float d = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk));
        const float m = q41 ? llmi_cu_f16_to_f32(llmi_cu_load_u16(blk + 2)) : 0.0f;
        uint32_t q[4];
        llmi_cu_load16_u16(blk + (q41 ? 4 : 2), q);
        llmi_cu_nibbles16(q, false, q41 ? 0.0f : 8.0f, w);
        llmi_cu_nibbles16(q, true, q41 ? 0.0f : 8.0f, w + 16);
        for (int j = 0; j < 32; j++)
            w[j] = q41 ? llmi_cu_scale_add(w[j], d, m, fused) : llmi_cu_mul(w[j], d);
        return;
    }
    case LLMI_T_Q5_0:
    case LLMI_T_Q5_1: {
        const bool q51 = type == LLMI_T_Q5_1;
        const uint8_t *blk =
            row + (size_t)c * (q51 ? sizeof(llmi_block_q5_1) : sizeof(llmi_block_q5_0));
        const float d = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk));
        const float m = q51 ? llmi_cu_f16_to_f32(llmi_cu_load_u16(blk + 2)) : 0.0f;
        const float bias = q51 ? 0.0f : 16.0f;
        const uint8_t *h = blk + (q51 ? 4 : 2);
        const uint32_t qh = llmi_cu_load_u16(h) | llmi_cu_load_u16(h + 2) << 16;
        uint32_t q[4];
        llmi_cu_load16_u16(h + 4, q);
        for (int k = 0; k < 4; k++)
            for (int b = 0; b < 4; b++) {
                const int j = 4 * k + b;
                const uint32_t byte = (q[k] >> (8 * b)) & 0xffu;
                w[j] = llmi_cu_small_int((byte & 15u) | ((qh >> j) & 1u) << 4, bias);
                w[j + 16] = llmi_cu_small_int(byte >> 4 | ((qh >> (j + 16)) & 1u) << 4, bias);
            }
        for (int j = 0; j < 32; j++)
            w[j] = q51 ? llmi_cu_scale_add(w[j], d, m, fused) : llmi_cu_mul(w[j], d);
        return;
    }
    case LLMI_T_Q8_0: {
        const uint8_t *blk = row + (size_t)c * sizeof(llmi_block_q8_0);
        const float d = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk));
        uint32_t q[8];
        llmi_cu_load16_u16(blk + 2, q);
        llmi_cu_load16_u16(blk + 18, q + 4);
        /* int8 q as the byte q + 128 (flipping the sign bit), minus 128 */
        for (int k = 0; k < 8; k++)
            for (int b = 0; b < 4; b++)
                w[4 * k + b] =
                    llmi_cu_mul(llmi_cu_sub(llmi_cu_u2f(llmi_cu_magic_byte(q[k] ^ 0x80808080u, b)),
                                            8388608.0f + 128.0f),
                                d);
        return;
    }
    case LLMI_T_Q4_K: {
        const uint8_t *blk = row + (size_t)(c / 8) * sizeof(llmi_block_q4_k);
        const int j = (int)(c % 8);
        float d0, n0;
        llmi_cu_q4k_factors(blk, j, &d0, &n0);
        const uint8_t *qs = blk + offsetof(llmi_block_q4_k, qs) + 32 * (j / 2);
        uint32_t q[4];
        for (int half = 0; half < 2; half++) {
            llmi_cu_load16(qs + 16 * half, q);
            llmi_cu_nibbles16(q, j % 2, 0.0f, w + 16 * half);
        }
        for (int l = 0; l < 32; l++)
            w[l] = fused ? llmi_cu_fma(d0, w[l], -n0) : llmi_cu_sub(llmi_cu_mul(d0, w[l]), n0);
        return;
    }
    case LLMI_T_Q6_K: {
        const uint8_t *blk = row + (size_t)(c / 8) * sizeof(llmi_block_q6_k);
        const int h = (int)(c % 8) / 4, q = (int)(c % 4);
        const float d = llmi_cu_f16_to_f32(llmi_cu_load_u16(blk + offsetof(llmi_block_q6_k, d)));
        const uint8_t *sc = blk + offsetof(llmi_block_q6_k, scales) + 8 * h + 2 * q;
        const float ds[2] = {llmi_cu_mul(d, (float)(int8_t)sc[0]),
                             llmi_cu_mul(d, (float)(int8_t)sc[1])};
        const uint8_t *ql = blk + offsetof(llmi_block_q6_k, ql) + 64 * h + 32 * (q & 1);
        const uint8_t *qh = blk + offsetof(llmi_block_q6_k, qh) + 32 * h;
        for (int k = 0; k < 16; k++) {
            const uint32_t lo = llmi_cu_load_u16(ql + 2 * k), hi = llmi_cu_load_u16(qh + 2 * k);
            for (int b = 0; b < 2; b++) {
                const uint32_t nib = ((lo >> (8 * b)) >> (4 * (q >> 1))) & 15u;
                const uint32_t v = nib | ((hi >> (8 * b + 2 * q)) & 3u) << 4;
                const int l = 2 * k + b;
                w[l] = llmi_cu_mul(ds[l / 16], llmi_cu_small_int(v, 32.0f));
            }
        }
        return;
    }
    default:
        for (int j = 0; j < 32; j++)
            w[j] = NAN;
    }
}

/* ---- paged KV cache ---- */

/* The slot of (seq, pos) from a CSR block table (backend.h's
 * llmi_step_slot). */
LLMI_HD uint32_t llmi_cu_kv_slot(const uint32_t *block_start, const uint32_t *blocks,
                                 uint32_t block_size, uint32_t seq, uint32_t pos) {
    return blocks[block_start[seq] + pos / block_size] * block_size + pos % block_size;
}

/* The first key position a query at pos sees (window 0: all before it). */
LLMI_HD uint32_t llmi_cu_attn_first(uint32_t pos, uint32_t window) {
    return window && pos >= window ? pos - window + 1 : 0;
}

/* ---- prefill tiles ----
 * A tile of n rows of one sequence at positions p0 .. p0 + n - 1. */

/* The keys the tile reads, [first(p0), p0 + n - 1], as n_chunks chunks of
 * `chunk` positions from kb0, aligned to multiples of chunk so that a row's
 * chunks do not depend on the tile it is in. */
LLMI_HD void llmi_cu_prefill_chunks(uint32_t p0, uint32_t n, uint32_t window, uint32_t chunk,
                                    uint32_t *kb0, uint32_t *n_chunks) {
    const uint32_t kmin = llmi_cu_attn_first(p0, window), kmax = p0 + n - 1;
    *kb0 = kmin / chunk * chunk;
    *n_chunks = (kmax - *kb0) / chunk + 1;
}

/* Whether row i of the tile sees the key at kp: the keys the split kernel
 * gives a row at p0 + i, [first(p0 + i), p0 + i]; none for rows past n. */
LLMI_HD bool llmi_cu_prefill_sees(uint32_t p0, uint32_t n, uint32_t window, uint32_t i,
                                  uint32_t kp) {
    if (i >= n)
        return false;
    const uint32_t qp = p0 + i;
    return kp <= qp && kp >= llmi_cu_attn_first(qp, window);
}

/* Whether every row of the tile sees every key of the chunk [kb, kb +
 * chunk): the chunk starts at or after the last row's first key and ends
 * at or before the first row's position. Such a chunk needs no mask. */
LLMI_HD bool llmi_cu_prefill_chunk_full(uint32_t p0, uint32_t n, uint32_t window, uint32_t kb,
                                        uint32_t chunk) {
    return kb >= llmi_cu_attn_first(p0 + n - 1, window) && (uint64_t)kb + chunk - 1 <= p0;
}

/* The tile row whose scores warp `warp` of n_warps keeps in its register k:
 * groups of four rows (one float4 of the transposed queries), group g of
 * the warp at float4 n_warps * g + warp. */
LLMI_HD uint32_t llmi_cu_prefill_row(uint32_t warp, uint32_t n_warps, uint32_t k) {
    return 4 * (n_warps * (k / 4) + warp) + k % 4;
}

/* ---- tensor-core fragments (mma.sync m16n8k16, ldmatrix) ----
 * Where the 32 lanes of a warp hold the elements of the operands of
 * mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, as the
 * PTX ISA lays them out, and which shared-memory rows ldmatrix.x4 reads for
 * each lane, so that the tensor-core prefill kernel's index math is proven
 * on the host (tests/cuda/test_device_math.cu simulates one warp's
 * S = Q K^T and O = P V from these). gid = lane / 4 (the "groupID"),
 * tig = lane % 4 (the "thread in group"). */

/* A (16 x 16, row-major) element e (0 .. 7) of a lane: register e / 2, low
 * half for even e. Rows gid (e in 0,1,4,5) or gid + 8; columns 2 tig + e % 2,
 * plus 8 for e >= 4. */
LLMI_HD void llmi_cu_mma_a_rc(uint32_t lane, uint32_t e, uint32_t *row, uint32_t *col) {
    *row = lane / 4 + 8 * ((e / 2) % 2);
    *col = 2 * (lane % 4) + e % 2 + 8 * (e / 4);
}

/* B (16 x 8, "col": column n contiguous in k) element e (0 .. 3) of a lane:
 * register e / 2. k = 2 tig + e % 2, plus 8 for e >= 2; n = gid. */
LLMI_HD void llmi_cu_mma_b_kn(uint32_t lane, uint32_t e, uint32_t *k, uint32_t *n) {
    *k = 2 * (lane % 4) + e % 2 + 8 * (e / 2);
    *n = lane / 4;
}

/* The f32 accumulator C/D (16 x 8) element e (0 .. 3) of a lane: rows gid
 * (e < 2) or gid + 8, columns 2 tig + e % 2. */
LLMI_HD void llmi_cu_mma_c_rc(uint32_t lane, uint32_t e, uint32_t *row, uint32_t *col) {
    *row = lane / 4 + 8 * (e / 2);
    *col = 2 * (lane % 4) + e % 2;
}

/* ldmatrix.x4 reads four 8 x 8 matrices of 16-bit elements; lane l gives
 * the address of row l % 8 of matrix l / 8. These give, per lane, the
 * (row, column) offset in shared memory of the row it points at, for each
 * operand of the kernel:
 *   Q as A (q[row][dim], rows r0 .., dims k0 ..): matrices (rows 0-7, dims
 *   0-7), (rows 8-15, dims 0-7), (rows 0-7, dims 8-15), (rows 8-15, dims
 *   8-15): registers a0 .. a3 of one k-step.
 *   K as B (k[key][dim], keys n0 .., dims k0 ..): (keys 0-7, dims 0-7),
 *   (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15, dims 8-15):
 *   b0, b1 of the 8 keys from n0, then b0, b1 of the 8 from n0 + 8.
 *   V as B with .trans (v[key][dim], keys k0 .., dims n0 ..): (keys 0-7,
 *   dims 0-7), (keys 8-15, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15,
 *   dims 8-15): b0, b1 of dims n0 .. n0 + 7, then of dims n0 + 8 ... */
LLMI_HD void llmi_cu_ldsm_q_src(uint32_t lane, uint32_t *row, uint32_t *col) {
    *row = lane % 8 + 8 * ((lane / 8) % 2);
    *col = 8 * (lane / 16);
}

LLMI_HD void llmi_cu_ldsm_k_src(uint32_t lane, uint32_t *key, uint32_t *dim) {
    *key = lane % 8 + 8 * (lane / 16);
    *dim = 8 * ((lane / 8) % 2);
}

LLMI_HD void llmi_cu_ldsm_vt_src(uint32_t lane, uint32_t *key, uint32_t *dim) {
    *key = lane % 8 + 8 * ((lane / 8) % 2);
    *dim = 8 * (lane / 16);
}

/* P as an A operand straight from the score accumulators: the scores of
 * keys 16 kk .. 16 kk + 15 are the accumulators of 8-key tiles 2 kk and
 * 2 kk + 1; A register r (0 .. 3), half h (0 low, 1 high) of a lane is
 * accumulator element *elem of tile 2 kk + *tile_off of the same lane. */
LLMI_HD void llmi_cu_p_from_c(uint32_t r, uint32_t h, uint32_t *tile_off, uint32_t *elem) {
    *tile_off = r / 2;
    *elem = 2 * (r % 2) + h;
}

/* Two 16-bit values as one 32-bit register: lo in bits 0-15 (the element
 * of the lower index), hi in 16-31. */
LLMI_HD uint32_t llmi_cu_pack_b16(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* ---- RoPE ---- */

/* theta_i of pair i at position pos as the CPU's rope_table computes it:
 * (float)pos multiplied by scale = powf(base, -2 / rope_dim) i times, in
 * float (llama.cpp's recurrence). scale comes from the host's powf. */
LLMI_HD float llmi_cu_rope_theta(uint32_t pos, float scale, uint32_t i) {
    float theta = (float)pos;
    for (uint32_t k = 0; k < i; k++)
        theta = llmi_cu_mul(theta, scale);
    return theta;
}

/* The angle of pair i: theta / freq_div_i (when there are divisors) times
 * freq_scale, in that order. */
LLMI_HD float llmi_cu_rope_angle(float theta, const float *freq_div, uint32_t i, float freq_scale) {
    return llmi_cu_mul(freq_div ? llmi_cu_div(theta, freq_div[i]) : theta, freq_scale);
}

/* The two dimensions pair i rotates: adjacent (layout 0) or halves (1). */
LLMI_HD void llmi_cu_rope_pair(int layout, uint32_t rope_dim, uint32_t i, uint32_t *a,
                               uint32_t *b) {
    *a = layout == 0 ? 2 * i : i;
    *b = layout == 0 ? 2 * i + 1 : i + rope_dim / 2;
}

/* (x0, x1) rotated by the angle with cosine c and sine s. */
LLMI_HD void llmi_cu_rope_rotate(float c, float s, float *x0, float *x1) {
    const float a = *x0, b = *x1;
    *x0 = llmi_cu_sub(llmi_cu_mul(a, c), llmi_cu_mul(b, s));
    *x1 = llmi_cu_add(llmi_cu_mul(a, s), llmi_cu_mul(b, c));
}

/* ---- split-KV softmax ----
 * A split's partial over its scores s_i: m = max s_i, l = sum exp(s_i - m),
 * acc = sum exp(s_i - m) v_i. An empty split is (m = -inf, l = 0, acc = 0).
 * Two partials merge into (m, l, acc) with m = max(m_a, m_b), each side
 * rescaled by exp(m_side - m); the result is acc / l. */

/* exp(s - m): a score's weight within its partial. */
LLMI_HD float llmi_cu_softmax_weight(float s, float m) { return expf(s - m); }

/* The merged max and the factors that rescale each side's l and acc. */
LLMI_HD void llmi_cu_softmax_merge(float m_a, float m_b, float *m, float *scale_a, float *scale_b) {
    const float mm = m_a > m_b ? m_a : m_b;
    *m = mm;
    *scale_a = m_a == -INFINITY ? 0.0f : expf(m_a - mm);
    *scale_b = m_b == -INFINITY ? 0.0f : expf(m_b - mm);
}

/* ---- activations, as backend/cpu/kernels.c computes them ---- */

/* silu(g) * u = g / (1 + exp(-g)) * u (exp overflowing to inf gives -0). */
LLMI_HD float llmi_cu_silu_mul(float g, float u) {
    return llmi_cu_mul(llmi_cu_div(g, llmi_cu_add(1.0f, expf(-g))), u);
}

/* gelu(g) * u with the tanh approximation, in the CPU's operation order:
 * 0.5 g (1 + tanh(0.7978845608 g (1 + 0.044715 g g))) u. */
LLMI_HD float llmi_cu_gelu_tanh_mul(float g, float u) {
    const float inner = llmi_cu_add(1.0f, llmi_cu_mul(llmi_cu_mul(0.044715f, g), g));
    const float t = tanhf(llmi_cu_mul(llmi_cu_mul(0.7978845608f, g), inner));
    return llmi_cu_mul(llmi_cu_mul(llmi_cu_mul(0.5f, g), llmi_cu_add(1.0f, t)), u);
}

/* tanh(x * inv_cap) * cap: the logit soft-cap (inv_cap = 1 / cap, from the
 * host, as the CPU computes it). */
LLMI_HD float llmi_cu_softcap(float x, float inv_cap, float cap) {
    return llmi_cu_mul(tanhf(llmi_cu_mul(x, inv_cap)), cap);
}

#endif
