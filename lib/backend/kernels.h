/* CPU compute kernels: weight x activation products and the row-wise helpers
 * of the forward pass.
 *
 * Activations are f32. A quantized weight row is dequantized in registers and
 * multiplied with f32 activations; there is no 8-bit quantization of x.
 * Every kernel has a portable C version (the reference, and the only one off
 * x86-64) and, on x86-64, AVX2+FMA+F16C and AVX-512F versions chosen at run
 * time from CPUID.
 *
 * Determinism: at a given level, y[t][r] depends only on weight row r and
 * token t's activations: not on the thread count, nor on n_tok, nor on the
 * token's position in the batch. */
#ifndef LLMI_KERNELS_H
#define LLMI_KERNELS_H

#include "backend/threadpool.h"
#include "core/ttype.h"

#include <stddef.h>
#include <stdint.h>

/* A 2-D weight: `rows` rows of `cols` elements; row r starts at
 * data + r * row_bytes. cols is a multiple of the type's block size. */
typedef struct llmi_weight {
    const void *data;
    llmi_ttype type;
    int64_t rows, cols;
    size_t row_bytes;
} llmi_weight;

/* Whether llmi_matmul supports weights of `type` (F32, F16, BF16, Q4_0,
 * Q4_1, Q8_0). */
int llmi_kernels_type_supported(uint32_t type);

/* y[t*rows + r] = sum_c W[r][c] * x[t*cols + c] for t < n_tok, for the rows
 * owned by thread ith of nth: rows are split in contiguous chunks of
 * LLMI_MATMUL_ROW_CHUNK. Each weight row is read once per call (tokens are
 * processed in tiles while the row is in cache). The type must be supported
 * and n_tok >= 0; x and y must not overlap. A block type whose cols is not a
 * multiple of its block gives NaN rows rather than reading past a row. */
#define LLMI_MATMUL_ROW_CHUNK 16
void llmi_matmul_part(const llmi_weight *w, const float *x, int n_tok, float *y, int ith, int nth);

/* llmi_matmul_part over every thread of `pool` (NULL: the calling thread). */
void llmi_matmul(llmi_pool *pool, const llmi_weight *w, const float *x, int n_tok, float *y);

/* Kernel levels: 0 portable C, 1 AVX2+FMA+F16C, 2 AVX-512F. set_level clamps
 * to what the CPU supports; a negative level selects the best. The level is
 * process-wide (tests use it to compare paths): change it only while no
 * kernel runs. */
#define LLMI_KLEVEL_C 0
#define LLMI_KLEVEL_AVX2 1
#define LLMI_KLEVEL_AVX512 2
void llmi_kernels_set_level(int level);
int llmi_kernels_level(void);
/* The best level this CPU supports. */
int llmi_kernels_best_level(void);

/* out = x / sqrt(mean(x^2) + eps) * weight; out may alias x. The mean is
 * accumulated in double. */
void llmi_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);
float llmi_dot_f32(const float *a, const float *b, int n);
/* y += a * x */
void llmi_axpy_f32(float *y, float a, const float *x, int n);
/* x = exp(x - max) / sum. Entries of -inf give 0; if all are -inf the result
 * is uniform. */
void llmi_softmax_inplace(float *x, int n);
/* gate = silu(gate) * up, silu(g) = g / (1 + exp(-g)). */
void llmi_silu_mul(float *gate_out, const float *up, int n);
/* y += x */
void llmi_add_inplace(float *y, const float *x, int n);

#endif
