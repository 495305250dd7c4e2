/* OCP FP8 E4M3 ("fn": no infinities, S.1111.111 is NaN, largest finite
 * 448, subnormals down to 2^-9) conversions, for the FP8 KV cache.
 *
 * Integer arithmetic only, with no dependence on the floating-point
 * environment (rounding mode, flush-to-zero), so the CPU and the CUDA
 * kernels (which include this header through nvcc) produce the same codes
 * for the same float: a row written on a GPU is bitwise the CPU's row.
 *
 * Encoding rounds to nearest, ties to even, and saturates: every finite
 * |x| >= 448 and every infinity becomes +-448 (0x7e / 0xfe); a NaN becomes
 * 0x7f with x's sign. A float below half the smallest subnormal becomes a
 * zero of x's sign. Decoding is exact (every code is a float). */
#ifndef LLMI_FP8_H
#define LLMI_FP8_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define LLMI_FP8_FN __host__ __device__ __forceinline__
#else
#define LLMI_FP8_FN static inline
#endif

#define LLMI_FP8_E4M3_MAX 448.0f

LLMI_FP8_FN uint8_t llmi_f32_to_fp8_e4m3(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint8_t)(sign | 0x7fu);
    if (a >= 0x43e00000u) /* |x| >= 448, infinity included: saturate */
        return (uint8_t)(sign | 0x7eu);
    if (a >= 0x3c800000u) {
        /* Normal in E4M3 (|x| >= 2^-6): drop 20 of f32's 23 mantissa bits,
         * ties to even; a carry moves into the exponent as it should, and
         * never past 448 (checked above). Rebias the exponent 127 -> 7. */
        const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
        return (uint8_t)(sign | ((r >> 20) - (120u << 3)));
    }
    /* Subnormal in E4M3: q = |x| / 2^-9 rounded, ties to even; q == 8 is
     * the smallest normal, whose code is 8 too. |x| = m * 2^(e - 150) with
     * the implicit bit in m, so q = m / 2^(141 - e). Below e = 117 the
     * shift passes 24 and q rounds to 0 (f32 subnormals included). */
    const uint32_t e = a >> 23;
    if (e < 117u)
        return sign;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u, s = 141u - e;
    const uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    uint32_t q = m >> s;
    q += rem > half || (rem == half && (q & 1u));
    return (uint8_t)(sign | q);
}

LLMI_FP8_FN float llmi_fp8_e4m3_to_f32(uint8_t c) {
    const uint32_t sign = (uint32_t)(c & 0x80u) << 24, em = c & 0x7fu;
    uint32_t u;
    if (em == 0x7fu)
        u = sign | 0x7fc00000u;
    else if (em >= 8u) /* normal: rebias the exponent 7 -> 127 */
        u = sign | ((em + (120u << 3)) << 20);
    else if (em == 0u)
        u = sign;
    else {
        /* Subnormal em * 2^-9: normalize the 3-bit mantissa into f32. */
        uint32_t m = em, e = 127u - 9u;
        while (!(m & 8u)) {
            m <<= 1;
            e--;
        }
        u = sign | ((e + 3u) << 23) | ((m & 7u) << 20);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
