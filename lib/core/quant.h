/* Reference row conversion between f32 and every tensor type. Portable C that
 * reproduces GGUF's (ggml's reference) rounding bit for bit; the SIMD kernels
 * are tested against these. In core because it is a property of the types,
 * not of a backend: the GGUF writer quantizes with it, the CPU kernels
 * check against it. Pure functions: thread-safe. */
#ifndef LLMI_QUANT_H
#define LLMI_QUANT_H

#include "core/ttype.h"

#include <stdint.h>

/* Converts n floats to `type`'s layout. For block types n must be a multiple
 * of LLMI_QK; dst holds llmi_ttype_row_bytes(type, n) bytes. */
void llmi_quantize_row(llmi_ttype type, const float *src, void *dst, int64_t n);
/* The inverse: n elements of `type` at src to floats. */
void llmi_dequantize_row(llmi_ttype type, const void *src, float *dst, int64_t n);

/* The K-quant rows behind the two above (quant_k.c), for Q4_K, Q6_K and Q8_K
 * with n a multiple of LLMI_QK_K. */
void llmi_quant_k_quantize(llmi_ttype type, const float *src, void *dst, int64_t n);
void llmi_quant_k_dequantize(llmi_ttype type, const void *src, float *dst, int64_t n);

/* Sub-block j's 6-bit scale and min from a Q4_K block's scales[12]
 * (ttype.h gives the packing). */
static inline void llmi_q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

#endif
