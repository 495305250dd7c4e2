/* Reference conversion of K-quant rows (Q4_K, Q6_K, Q8_K; layouts in
 * core/ttype.h).
 *
 * Dequantization reproduces ggml's dequantize_row_q4_K / _q6_K bit for bit:
 * the same float operations in the same order, and no contraction into FMA
 * (the pragma below for clang; GCC does not contract in ISO C mode).
 *
 * Q8_K quantization is ggml's quantize_row_q8_K_ref, which is also what
 * llama.cpp's x86 CPU backend runs on activations: iscale = -127 / max with
 * the signed value of largest magnitude, q = round-half-even(iscale * x)
 * capped at 127, d = 1 / iscale, and the sums of 16 q's.
 *
 * The Q4_K and Q6_K quantizers are our own and need not match llama.cpp's
 * search. Both fit each sub-block by least squares over a few candidate
 * grids and keep the fit with the smallest squared error (unweighted):
 *   Q4_K, per 32 values: x ~ a*L + b with L in 0..15 and b <= 0 (the format
 *     stores -b as a non-negative min); candidate grids L = round((x - lo) *
 *     (15 + k/10) / (hi - lo)), k = -10..10, lo = min(x, 0), hi = max(x).
 *   Q6_K, per 16 values: x ~ a*L with L in -32..31; candidate grids L =
 *     round(x * -(32 + k/4) / max), k = -8..8, max the value of largest
 *     magnitude (k = 0 maps it to -32 exactly).
 * The sub-block scales (and Q4_K's mins) are then rounded to the format's
 * integers relative to the super-block's largest (Q4_K: 6 bits against
 * d = max/63; Q6_K: int8 against d = max/-128, as ggml does), and the values
 * are rounded again against the stored scales. */
#include "core/quant.h"

#include "core/core.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#if defined(__clang__) /* GCC does not contract in ISO C mode (-std=c11) */
#pragma STDC FP_CONTRACT OFF
#endif

#define QK_K LLMI_QK_K

static float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return llmi_f16_to_f32(h);
}

/* Round half to even, as ggml's nearest_int does for |v| < 2^22; beyond
 * that (and for NaN) a saturated value instead of undefined behaviour. */
static int nearest(float v) {
    if (!(fabsf(v) < 4194304.0f))
        return v > 0.0f ? 4194303 : v < 0.0f ? -4194303 : 0;
    return (int)rintf(v);
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- dequantization ------------------------------------------------------ */

static void dequant_q4_k(const uint8_t *blk, float *y) {
    const float d = h2f(blk + offsetof(llmi_block_q4_k, d));
    const float min = h2f(blk + offsetof(llmi_block_q4_k, dmin));
    const uint8_t *sc = blk + offsetof(llmi_block_q4_k, scales);
    const uint8_t *q = blk + offsetof(llmi_block_q4_k, qs);
    for (int g = 0; g < 4; g++, q += 32, y += 64) {
        int s0, m0, s1, m1;
        llmi_q4k_scale_min(sc, 2 * g, &s0, &m0);
        llmi_q4k_scale_min(sc, 2 * g + 1, &s1, &m1);
        const float d0 = d * (float)s0, n0 = min * (float)m0;
        const float d1 = d * (float)s1, n1 = min * (float)m1;
        for (int l = 0; l < 32; l++) {
            y[l] = d0 * (float)(q[l] & 15) - n0;
            y[l + 32] = d1 * (float)(q[l] >> 4) - n1;
        }
    }
}

static void dequant_q6_k(const uint8_t *blk, float *y) {
    const float d = h2f(blk + offsetof(llmi_block_q6_k, d));
    const uint8_t *ql = blk + offsetof(llmi_block_q6_k, ql);
    const uint8_t *qh = blk + offsetof(llmi_block_q6_k, qh);
    const int8_t *sc = (const int8_t *)(blk + offsetof(llmi_block_q6_k, scales));
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
        for (int l = 0; l < 32; l++) {
            const int s = l / 16;
            const int q0 = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
            const int q1 = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
            const int q2 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            const int q3 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
            y[l] = d * (float)sc[s] * (float)q0;
            y[l + 32] = d * (float)sc[s + 2] * (float)q1;
            y[l + 64] = d * (float)sc[s + 4] * (float)q2;
            y[l + 96] = d * (float)sc[s + 6] * (float)q3;
        }
    }
}

static void dequant_q8_k(const uint8_t *blk, float *y) {
    float d;
    memcpy(&d, blk + offsetof(llmi_block_q8_k, d), 4);
    const int8_t *q = (const int8_t *)(blk + offsetof(llmi_block_q8_k, qs));
    for (int j = 0; j < QK_K; j++)
        y[j] = d * (float)q[j];
}

void llmi_quant_k_dequantize(llmi_ttype type, const void *src, float *dst, int64_t n) {
    const llmi_ttype_info *ti = llmi_ttype_get(type);
    assert(ti && ti->block == QK_K && n % QK_K == 0);
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / QK_K; b++, p += ti->block_bytes, dst += QK_K) {
        if (type == LLMI_T_Q4_K)
            dequant_q4_k(p, dst);
        else if (type == LLMI_T_Q6_K)
            dequant_q6_k(p, dst);
        else
            dequant_q8_k(p, dst);
    }
}

/* ---- Q8_K ---------------------------------------------------------------- */

static void quant_q8_k(const float *x, uint8_t *blk) {
    llmi_block_q8_k y;
    memset(&y, 0, sizeof y);
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK_K; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    if (amax != 0.0f) {
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++)
            y.qs[j] = (int8_t)clampi(nearest(iscale * x[j]), -128, 127);
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += y.qs[16 * j + l];
            y.bsums[j] = (int16_t)sum;
        }
        y.d = 1.0f / iscale;
    }
    memcpy(blk, &y, sizeof y);
}

/* ---- Q4_K ---------------------------------------------------------------- */

/* x ~ a*L + b over one grid L (n values): the least-squares a and b with
 * b <= 0; returns the squared error, or INFINITY for a useless fit. */
static float fit_affine(const float *x, const int *L, int n, float *a, float *b) {
    double sl = 0, sll = 0, sx = 0, sxl = 0;
    for (int i = 0; i < n; i++) {
        sl += L[i];
        sll += (double)L[i] * L[i];
        sx += x[i];
        sxl += (double)x[i] * L[i];
    }
    const double den = n * sll - sl * sl;
    double fa = 0, fb = sx / n;
    if (den > 0) {
        fa = (n * sxl - sl * sx) / den;
        fb = (sx - fa * sl) / n;
    }
    if (fb > 0) {
        fb = 0;
        fa = sll > 0 ? sxl / sll : 0;
    }
    if (!(fa >= 0))
        return INFINITY;
    *a = (float)fa;
    *b = (float)fb;
    double err = 0;
    for (int i = 0; i < n; i++) {
        const double e = fa * L[i] + fb - x[i];
        err += e * e;
    }
    return (float)err;
}

/* One sub-block of 32: *scale >= 0 and *mn >= 0 with x ~ scale*L - mn. */
static void fit_q4_k_sub(const float *x, float *scale, float *mn) {
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < 32; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *scale = 0.0f;
    *mn = -lo;
    if (!(hi > lo))
        return;
    float best = INFINITY;
    for (int k = -10; k <= 10; k++) {
        const float is = (15.0f + 0.1f * (float)k) / (hi - lo);
        int L[32];
        for (int i = 0; i < 32; i++)
            L[i] = clampi(nearest(is * (x[i] - lo)), 0, 15);
        float a = 0.0f, b = 0.0f;
        const float err = fit_affine(x, L, 32, &a, &b);
        if (err < best) {
            best = err;
            *scale = a;
            *mn = -b;
        }
    }
}

static void quant_q4_k(const float *x, uint8_t *blk) {
    llmi_block_q4_k y;
    memset(&y, 0, sizeof y);
    float scale[8], mn[8], max_scale = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 8; j++) {
        fit_q4_k_sub(x + 32 * j, &scale[j], &mn[j]);
        max_scale = scale[j] > max_scale ? scale[j] : max_scale;
        max_mn = mn[j] > max_mn ? mn[j] : max_mn;
    }
    const float inv_s = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_m = max_mn > 0.0f ? 63.0f / max_mn : 0.0f;
    for (int j = 0; j < 8; j++) {
        const int ls = clampi(nearest(inv_s * scale[j]), 0, 63);
        const int lm = clampi(nearest(inv_m * mn[j]), 0, 63);
        if (j < 4) {
            y.scales[j] = (uint8_t)ls;
            y.scales[j + 4] = (uint8_t)lm;
        } else {
            y.scales[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
            y.scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            y.scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    y.d = llmi_f32_to_f16(max_scale / 63.0f);
    y.dmin = llmi_f32_to_f16(max_mn / 63.0f);
    const float d = llmi_f16_to_f32(y.d), dmin = llmi_f16_to_f32(y.dmin);
    uint8_t L[QK_K];
    for (int j = 0; j < 8; j++) {
        int sc, m;
        llmi_q4k_scale_min(y.scales, j, &sc, &m);
        const float ds = d * (float)sc, dm = dmin * (float)m;
        for (int i = 0; i < 32; i++)
            L[32 * j + i] =
                ds != 0.0f ? (uint8_t)clampi(nearest((x[32 * j + i] + dm) / ds), 0, 15) : 0;
    }
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            y.qs[32 * g + l] = (uint8_t)(L[64 * g + l] | L[64 * g + 32 + l] << 4);
    memcpy(blk, &y, sizeof y);
}

/* ---- Q6_K ---------------------------------------------------------------- */

/* One sub-block of 16: the signed scale s with x ~ s*L, L in -32..31. */
static float fit_q6_k_sub(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 16; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax == 0.0f)
        return 0.0f;
    float best = INFINITY, s = max / -32.0f;
    for (int k = -8; k <= 8; k++) {
        const float is = -(32.0f + 0.25f * (float)k) / max;
        double sxl = 0, sll = 0;
        int L[16];
        for (int i = 0; i < 16; i++) {
            L[i] = clampi(nearest(is * x[i]), -32, 31);
            sxl += (double)x[i] * L[i];
            sll += (double)L[i] * L[i];
        }
        if (!(sll > 0))
            continue;
        const double a = sxl / sll;
        double err = 0;
        for (int i = 0; i < 16; i++) {
            const double e = a * L[i] - x[i];
            err += e * e;
        }
        if (err < best) {
            best = (float)err;
            s = (float)a;
        }
    }
    return s;
}

static void quant_q6_k(const float *x, uint8_t *blk) {
    llmi_block_q6_k y;
    memset(&y, 0, sizeof y);
    float scale[16], max_scale = 0.0f, max_abs = 0.0f;
    for (int j = 0; j < 16; j++) {
        scale[j] = fit_q6_k_sub(x + 16 * j);
        if (fabsf(scale[j]) > max_abs) {
            max_abs = fabsf(scale[j]);
            max_scale = scale[j];
        }
    }
    if (max_abs < 1e-15f) { /* all zero: d = 0 and zero bytes, as ggml writes */
        memcpy(blk, &y, sizeof y);
        return;
    }
    const float iscale = -128.0f / max_scale;
    y.d = llmi_f32_to_f16(1.0f / iscale);
    for (int j = 0; j < 16; j++)
        y.scales[j] = (int8_t)clampi(nearest(iscale * scale[j]), -128, 127);
    const float d = llmi_f16_to_f32(y.d);
    uint8_t L[QK_K];
    for (int j = 0; j < 16; j++) {
        const float ds = d * (float)y.scales[j];
        for (int i = 0; i < 16; i++)
            L[16 * j + i] =
                (uint8_t)(ds != 0.0f ? clampi(nearest(x[16 * j + i] / ds), -32, 31) + 32 : 32);
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *Lh = L + 128 * h;
        for (int l = 0; l < 32; l++) {
            y.ql[64 * h + l] = (uint8_t)((Lh[l] & 15) | (Lh[l + 64] & 15) << 4);
            y.ql[64 * h + l + 32] = (uint8_t)((Lh[l + 32] & 15) | (Lh[l + 96] & 15) << 4);
            y.qh[32 * h + l] = (uint8_t)(Lh[l] >> 4 | (Lh[l + 32] >> 4) << 2 |
                                         (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
        }
    }
    memcpy(blk, &y, sizeof y);
}

void llmi_quant_k_quantize(llmi_ttype type, const float *src, void *dst, int64_t n) {
    const llmi_ttype_info *ti = llmi_ttype_get(type);
    assert(ti && ti->block == QK_K && n % QK_K == 0);
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / QK_K; b++, p += ti->block_bytes, src += QK_K) {
        if (type == LLMI_T_Q4_K)
            quant_q4_k(src, p);
        else if (type == LLMI_T_Q6_K)
            quant_q6_k(src, p);
        else
            quant_q8_k(src, p);
    }
}
