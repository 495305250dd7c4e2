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

typedef struct llmi_kernel_set {
    int tile; /* tokens per weight-row pass */
    llmi_rows_fn rows[LLMI_KT_COUNT];
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n);
    double (*sumsq)(const float *x, int n);
} llmi_kernel_set;

#if defined(__x86_64__) && defined(__GNUC__)
#define LLMI_KERNELS_X86 1
extern const llmi_kernel_set llmi_kernels_avx2;
extern const llmi_kernel_set llmi_kernels_avx512;
#endif

#endif
