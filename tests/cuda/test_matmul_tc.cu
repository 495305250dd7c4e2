/* The batch-invariant matmul (llmi_cu_mm_tc) on the GPU: for every weight
 * type it takes, each row of a batch of n rows (n from 1 to 2,048, so
 * every tile shape) must have the same bits as that row multiplied alone
 * and as the row at another place of a reversed batch, and be within a
 * reasoned bound of a double-precision product of the same operands.
 * Refusals (widths that are not a multiple of 64, types it does not take,
 * unaligned activations) come back as cudaErrorInvalidValue without a
 * launch. Speed lines (decode of one row and prefill of 2,048 rows of an
 * 8B-sized 14336 x 4096 matrix) are printed, not asserted.
 * Without a CUDA device every test skips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

extern "C" {
#include <cmocka.h>

#include "core/core.h"
#include "core/quant.h"
#include "core/ttype.h"
}

#include "device_math.h"
#include "kernels.h"
#include "matmul_tc_math.h"

#include <cuda_runtime.h>

#include "kernel_test.h"

static const llmi_ttype taken[] = {LLMI_T_BF16, LLMI_T_F16,  LLMI_T_Q8_0, LLMI_T_Q4_0,
                                   LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1, LLMI_T_Q4_K};

/* A [rows][cols] weight of type t from random values on the host (its
 * bytes) and on the device. */
typedef struct weight {
    llmi_ttype type;
    uint32_t rows, cols;
    size_t row_bytes;
    uint8_t *host;
    void *dev;
} weight;

static weight make_weight(llmi_ttype t, uint32_t rows, uint32_t cols) {
    weight w = {t, rows, cols, llmi_ttype_row_bytes(t, cols), NULL, NULL};
    w.host = (uint8_t *)malloc(w.row_bytes * rows);
    float *row = (float *)malloc(cols * sizeof(float));
    assert_non_null(w.host);
    assert_non_null(row);
    for (uint32_t o = 0; o < rows; o++) {
        /* Rows of very different magnitudes, as real weights have. */
        const float scale = ldexpf(1.0f, (int)(o % 7) - 4);
        fill(row, cols, -scale, scale);
        llmi_quantize_row(t, row, w.host + (size_t)o * w.row_bytes, cols);
    }
    free(row);
    w.dev = dev_copy(w.host, w.row_bytes * rows);
    return w;
}

static llmi_cu_matrix view(const weight *w) {
    llmi_cu_matrix m = {w->dev, w->type, w->rows, w->cols, w->row_bytes};
    return m;
}

static void free_weight(weight *w) {
    free(w->host);
    cudaFree(w->dev);
}

static void check_type(llmi_ttype t) {
    /* M: ragged tiles of every shape; K: 12 stages, 3 Q4_K super-blocks. */
    const uint32_t M = 200, K = 768, NMAX = 2048;
    weight w = make_weight(t, M, K);
    const llmi_cu_matrix mw = view(&w);
    assert_true(llmi_cu_mm_tc_takes(&mw));
    uint16_t *x = (uint16_t *)malloc((size_t)NMAX * K * 2),
             *xr = (uint16_t *)malloc((size_t)NMAX * K * 2);
    float *bias = (float *)malloc(M * sizeof(float));
    float *alone = (float *)malloc((size_t)NMAX * M * sizeof(float));
    float *y = (float *)malloc((size_t)NMAX * M * sizeof(float));
    float *wd = (float *)malloc((size_t)M * K * sizeof(float));
    assert_true(x && xr && bias && alone && y && wd);
    for (size_t i = 0; i < (size_t)NMAX * K; i++)
        x[i] = llmi_f32_to_bf16(rng_uniform(-3.0f, 3.0f));
    for (uint32_t j = 0; j < NMAX; j++) /* the batch reversed */
        memcpy(xr + (size_t)j * K, x + (size_t)(NMAX - 1 - j) * K, (size_t)K * 2);
    fill(bias, M, -1.0f, 1.0f);
    for (uint32_t o = 0; o < M; o++)
        llmi_dequantize_row(t, w.host + (size_t)o * w.row_bytes, wd + (size_t)o * K, K);
    void *dx = dev_copy(x, (size_t)NMAX * K * 2), *dxr = dev_copy(xr, (size_t)NMAX * K * 2);
    float *db = (float *)dev_copy(bias, M * sizeof(float));
    float *dy = (float *)dev_alloc((size_t)NMAX * M * sizeof(float));

    /* Every row alone. */
    for (uint32_t j = 0; j < NMAX; j++)
        CU(llmi_cu_mm_tc(0, &mw, (const uint16_t *)dx + (size_t)j * K, K, 1, db, dy + (size_t)j * M,
                         M));
    to_host(alone, dy, (size_t)NMAX * M * sizeof(float));

    /* Against the double product: products of bf16 activations and the
     * weight as the kernel sees it (exact for BF16, F16, Q8_0, Q4_0;
     * rounded to bf16, 2^-9 relative, for the others), summed by K / 16
     * mma (two a k-step for F16) whose f32 additions may each be off by a
     * few units of the last place of the magnitudes summed so far: 2^-21
     * of the sum of |products| per mma, the bias added with one rounding. */
    const bool rounded = llmi_mmtc_kind_of(t) == LLMI_MMTC_DEQ;
    const double n_mma = (t == LLMI_T_F16 ? 2.0 : 1.0) * K / 16 + 2;
    for (uint32_t j = 0; j < NMAX; j += 7)
        for (uint32_t o = 0; o < M; o++) {
            double exact = bias[o], mag = 0.0;
            for (uint32_t k = 0; k < K; k++) {
                const double p =
                    (double)wd[(size_t)o * K + k] * llmi_bf16_to_f32(x[(size_t)j * K + k]);
                exact += p;
                mag += fabs(p);
            }
            const double tol = (rounded ? ldexp(1.0, -9) : 0.0) * mag +
                               n_mma * ldexp(1.0, -21) * mag +
                               ldexp(1.0, -23) * (fabs(bias[o]) + fabs(exact));
            near(alone[(size_t)j * M + o], exact, 1.0, tol, "matmul vs double", (size_t)j * M + o);
        }

    const uint32_t ns[] = {1, 2, 3, 7, 8, 16, 17, 64, 300, 2048};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        const uint32_t n = ns[i];
        CU(cudaMemset(dy, 0xff, (size_t)NMAX * M * sizeof(float)));
        CU(llmi_cu_mm_tc(0, &mw, dx, K, n, db, dy, M));
        to_host(y, dy, (size_t)n * M * sizeof(float));
        for (uint32_t j = 0; j < n; j++)
            for (uint32_t o = 0; o < M; o++)
                if (bits_of(y[(size_t)j * M + o]) != bits_of(alone[(size_t)j * M + o]))
                    fail_msg("%s n=%u row %u out %u: %.9g in the batch, %.9g alone",
                             llmi_ttype_get(t)->name, n, j, o, y[(size_t)j * M + o],
                             alone[(size_t)j * M + o]);
        /* The last n rows reversed: each row at another place, beside
         * other rows. */
        CU(llmi_cu_mm_tc(0, &mw, (const uint16_t *)dxr + (size_t)(NMAX - n) * K, K, n, db, dy, M));
        to_host(y, dy, (size_t)n * M * sizeof(float));
        for (uint32_t j = 0; j < n; j++) {
            const uint32_t src = n - 1 - j; /* row NMAX - n + j of xr is row n - 1 - j of x */
            if (memcmp(y + (size_t)j * M, alone + (size_t)src * M, M * sizeof(float)) != 0)
                fail_msg("%s n=%u reversed: row %u differs from alone", llmi_ttype_get(t)->name, n,
                         src);
        }
    }
    printf("# %s: %u rows alone and in batches of 1 .. 2048, same bits\n", llmi_ttype_get(t)->name,
           NMAX);
    free(x);
    free(xr);
    free(bias);
    free(alone);
    free(y);
    free(wd);
    cudaFree(dx);
    cudaFree(dxr);
    cudaFree(db);
    cudaFree(dy);
    free_weight(&w);
}

static void test_matmul_tc_invariant(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6d6d7463, "batch-invariant matmul");
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++)
        check_type(taken[i]);
}

static void test_matmul_tc_refusals(void **state) {
    (void)state;
    /* The host checks come before any device call: no GPU needed. */
    uint16_t x[8 * 128] __attribute__((aligned(16)));
    float y[8];
    llmi_cu_matrix m = {(const void *)(uintptr_t)256, LLMI_T_BF16, 8, 96, 192};
    assert_false(llmi_cu_mm_tc_takes(&m)); /* 96 is not a multiple of 64 */
    assert_int_equal(llmi_cu_mm_tc(0, &m, x, 96, 1, NULL, y, 8), cudaErrorInvalidValue);
    m.type = LLMI_T_Q6_K;
    m.cols = 256;
    m.row_bytes = llmi_ttype_row_bytes(LLMI_T_Q6_K, 256);
    assert_false(llmi_cu_mm_tc_takes(&m));
    m.type = LLMI_T_Q4_K;
    m.cols = 192; /* not whole super-blocks */
    m.row_bytes = 1024;
    assert_false(llmi_cu_mm_tc_takes(&m));
    m.type = LLMI_T_BF16;
    m.cols = 128;
    m.row_bytes = 256;
    assert_true(llmi_cu_mm_tc_takes(&m));
    assert_int_equal(llmi_cu_mm_tc(0, &m, x + 1, 128, 1, NULL, y, 8), cudaErrorInvalidValue);
    assert_int_equal(llmi_cu_mm_tc(0, &m, x, 100, 1, NULL, y, 8), cudaErrorInvalidValue);
    m.data = (const void *)(uintptr_t)258;
    assert_false(llmi_cu_mm_tc_takes(&m));
}

/* Milliseconds a launch, the median-free mean of reps after a warm-up. */
static float time_mm(const llmi_cu_matrix *w, const void *x, uint32_t n, float *y, int reps) {
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(llmi_cu_mm_tc(0, w, x, w->cols, n, NULL, y, w->rows));
    CU(cudaEventRecord(e0, 0));
    for (int r = 0; r < reps; r++)
        CU(llmi_cu_mm_tc(0, w, x, w->cols, n, NULL, y, w->rows));
    CU(cudaEventRecord(e1, 0));
    CU(cudaEventSynchronize(e1));
    float ms;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms / reps;
}

static void test_matmul_tc_speed(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x5eed, "batch-invariant matmul speed");
    const uint32_t M = 14336, K = 4096, NMAX = 2048;
    void *dx = dev_alloc((size_t)NMAX * K * 2);
    CU(cudaMemset(dx, 0x3c, (size_t)NMAX * K * 2)); /* bf16 ~0.0115 */
    float *dy = (float *)dev_alloc((size_t)NMAX * M * sizeof(float));
    const llmi_ttype types[] = {LLMI_T_BF16, LLMI_T_Q8_0, LLMI_T_Q4_0, LLMI_T_Q4_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        weight w = make_weight(types[i], M, K);
        const llmi_cu_matrix mw = view(&w);
        const double bytes = (double)w.row_bytes * M;
        const uint32_t decode_ns[] = {1, 8, 16, 64, 256};
        for (size_t k = 0; k < 5; k++) {
            const float ms = time_mm(&mw, dx, decode_ns[k], dy, 20);
            printf("# %s %u x %u, %u rows: %.3f ms, %.0f GB/s of weights, %.1f TFLOP/s\n",
                   llmi_ttype_get(types[i])->name, M, K, decode_ns[k], ms, bytes / ms / 1e6,
                   2.0 * M * K * decode_ns[k] / ms / 1e9);
        }
        const float ms = time_mm(&mw, dx, NMAX, dy, 10);
        printf("# %s %u x %u, %u rows: %.3f ms, %.1f TFLOP/s\n", llmi_ttype_get(types[i])->name, M,
               K, NMAX, ms, 2.0 * M * K * NMAX / ms / 1e9);
        free_weight(&w);
    }
    cudaFree(dx);
    cudaFree(dy);
}

static int setup(void **state) {
    (void)state;
    int n = 0;
    have_device = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    if (!have_device)
        printf("# no CUDA device: the kernel tests skip\n");
    return 0;
}

int main(void) {
    if (getenv("LLM_TEST_FILTER")) /* e.g. only the invariance under compute-sanitizer */
        cmocka_set_test_filter(getenv("LLM_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_tc_invariant),
        cmocka_unit_test(test_matmul_tc_refusals),
        cmocka_unit_test(test_matmul_tc_speed),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
