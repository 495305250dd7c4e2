/* Private interface between kernels.c (dispatch, portable C) and the SIMD
 * kernel sets of kernels_x86.c. */
#ifndef LLMI_KERNELS_IMPL_H
#define LLMI_KERNELS_IMPL_H

#include "backend/kernels.h"

/* Dense index of the supported weight types. */
enum {
    LLMI_KT_F32,
    LLMI_KT_F16,
    LLMI_KT_BF16,
    LLMI_KT_Q4_0,
    LLMI_KT_Q4_1,
    LLMI_KT_Q8_0,
    LLMI_KT_COUNT
};

/* y[t*ldy + r] for r in [r0, r1) and t < nt, where 1 <= nt <= the set's tile
 * and token t's activations are x + t*w->cols. */
typedef void (*llmi_rows_fn)(const llmi_weight *w, int64_t r0, int64_t r1, const float *x, int nt,
                             float *y, int64_t ldy);

/* Element types of llmi_row_ops (kernels.h), dense. */
enum { LLMI_RT_F32, LLMI_RT_F16, LLMI_RT_BF16, LLMI_RT_COUNT };

typedef struct llmi_kernel_set {
    /* Most tokens per rows call: the caller walks more in row blocks and
     * token tiles. INT_MAX for GEMM kernels, which block for the caches
     * themselves. */
    int tile;
    llmi_rows_fn rows[LLMI_KT_COUNT];
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n);
    double (*sumsq)(const float *x, int n);
    llmi_row_ops row_ops[LLMI_RT_COUNT];
} llmi_kernel_set;

/* The set of the current level (kernels.c). */
const llmi_kernel_set *llmi_kernels_current(void);

/* ---- integer kernels (kernels_q8.c, kernels_q8_x86.c) ---- */

/* Quantized weight types, dense. */
enum { LLMI_QT_Q4_0, LLMI_QT_Q4_1, LLMI_QT_Q8_0, LLMI_QT_COUNT };

/* Quantizes one row of 32*nb floats into the activation row layout of
 * kernels.h (s when q81, else c), writing all row_bytes bytes (zero
 * padding). */
typedef void (*llmi_aquant_fn)(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes);

/* y[t*ldy + r] for r in [r0, r1) and t < nt (1 <= nt <= the set's tile);
 * token t's quantized row at xq + t*xstride. */
typedef void (*llmi_qrows_fn)(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq,
                              size_t xstride, int nt, float *y, int64_t ldy);

typedef struct llmi_qkernel_set {
    int tile; /* as in llmi_kernel_set */
    llmi_qrows_fn rows[LLMI_QT_COUNT];
    llmi_aquant_fn quant;
} llmi_qkernel_set;

/* Whether the integer kernels of level 2 use AVX-512 VNNI on this CPU. */
int llmi_kernels_have_vnni(void);

#if defined(__x86_64__) && defined(__GNUC__)
#define LLMI_KERNELS_X86 1
extern const llmi_kernel_set llmi_kernels_avx2;
extern const llmi_kernel_set llmi_kernels_avx512;
extern const llmi_qkernel_set llmi_qkernels_avx2;
extern const llmi_qkernel_set llmi_qkernels_avx512vnni;
#endif

#endif
