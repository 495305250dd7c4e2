/* Reference row conversion between f32 and every tensor type. Portable C that
 * reproduces GGUF's (ggml's reference) rounding bit for bit; the SIMD kernels
 * are tested against these. */
#ifndef LLMI_QUANT_H
#define LLMI_QUANT_H

#include "core/ttype.h"

#include <stdint.h>

/* Converts n floats to `type`'s layout. For block types n must be a multiple
 * of LLMI_QK; dst holds llmi_ttype_row_bytes(type, n) bytes. */
void llmi_quantize_row(llmi_ttype type, const float *src, void *dst, int64_t n);
/* The inverse: n elements of `type` at src to floats. */
void llmi_dequantize_row(llmi_ttype type, const void *src, float *dst, int64_t n);

#endif
