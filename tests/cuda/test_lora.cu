/* The LoRA kernels (llmi_cu_lora_shrink / llmi_cu_lora_expand,
 * cuda/kernels_lora.cu) on the GPU against a double-precision reference:
 * ranks 1, 8 and 64; input widths that take the 128-bit loads (64, 4096)
 * and one that does not (61); outputs written into a window of wider rows
 * (as the fused Q/K/V product lays them out), so columns outside it must
 * keep their bits; a subset of the rows listed out of order, so the rows
 * not listed (rows without an adapter) must keep their bits too.
 *
 * Tolerance, per output element, from f32 rounding (u = 2^-24) and the
 * standard bound gamma_n = n u / (1 - n u) on a sum of n terms in any order:
 *   shrink  |t~_k - t_k| <= gamma_in * sum_j |a_kj x_j|   (e_k)
 *   expand  y~ = y0 + sum_k (s t~_k) b_k in k order, fused multiply-adds:
 *           |y~ - y| <= gamma_(rank+1) (|y0| + sum_k |s t_k b_k|)
 *                       + sum_k |s b_k| e_k (1 + u) + ...
 * computed in double for each element with a factor 2 of margin; a wrong
 * row, column, rank index or scale is off by orders of magnitude more.
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
#include "core/ttype.h"
}

#include "kernels.h"

#include <cuda_runtime.h>

#include "kernel_test.h"

typedef struct lora_case {
    uint32_t rank, in, out;
} lora_case;

enum { N_ROWS = 20, Y_PAD = 40, Y_OFF = 24 };

static double gamma_n(double n) {
    const double u = 0x1.0p-24;
    return n * u / (1.0 - n * u);
}

static void run_case(const lora_case *c, float scale) {
    const uint32_t rank = c->rank, in = c->in, out = c->out;
    const uint32_t y_stride = out + Y_PAD;
    /* Rows 17, 3, 9, 0, 12 take the update (listed out of order); the
     * others must not change. */
    const uint32_t rows[] = {17, 3, 9, 0, 12};
    const uint32_t n_list = sizeof rows / sizeof rows[0];
    float *a = (float *)malloc(sizeof(float) * rank * in);
    float *b = (float *)malloc(sizeof(float) * rank * out);
    float *x = (float *)malloc(sizeof(float) * N_ROWS * in);
    float *y = (float *)malloc(sizeof(float) * N_ROWS * y_stride);
    float *got = (float *)malloc(sizeof(float) * N_ROWS * y_stride);
    fill(a, (size_t)rank * in, -1.0f / sqrtf((float)in), 1.0f / sqrtf((float)in));
    fill(b, (size_t)rank * out, -0.5f, 0.5f);
    fill(x, (size_t)N_ROWS * in, -2.0f, 2.0f);
    fill(y, (size_t)N_ROWS * y_stride, -1.0f, 1.0f);
    float *da = (float *)dev_copy(a, sizeof(float) * rank * in);
    float *db = (float *)dev_copy(b, sizeof(float) * rank * out);
    float *dx = (float *)dev_copy(x, sizeof(float) * N_ROWS * in);
    float *dy = (float *)dev_copy(y, sizeof(float) * N_ROWS * y_stride);
    uint32_t *drows = (uint32_t *)dev_copy(rows, sizeof rows);
    float *dt = (float *)dev_alloc(sizeof(float) * n_list * rank); /* NaN poison */
    CU(llmi_cu_lora_shrink(0, da, rank, in, dx, in, drows, n_list, dt));
    CU(llmi_cu_lora_expand(0, db, rank, out, dt, scale, drows, n_list, dy + Y_OFF, y_stride));
    to_host(got, dy, sizeof(float) * N_ROWS * y_stride);
    bool listed[N_ROWS] = {false};
    for (uint32_t i = 0; i < n_list; i++)
        listed[rows[i]] = true;
    const double u = 0x1.0p-24;
    for (uint32_t r = 0; r < N_ROWS; r++) {
        const float *yr = y + (size_t)r * y_stride, *gr = got + (size_t)r * y_stride;
        for (uint32_t o = 0; o < y_stride; o++) {
            const bool inside = o >= Y_OFF && o < Y_OFF + out;
            if (!listed[r] || !inside) {
                if (bits_of(gr[o]) != bits_of(yr[o]))
                    fail_msg("row %u column %u changed (listed %d, inside %d)", r, o, listed[r],
                             inside);
                continue;
            }
            const uint32_t j = o - Y_OFF;
            double want = yr[o], mag = fabs(yr[o]), shrink_err = 0.0;
            for (uint32_t k = 0; k < rank; k++) {
                double t = 0.0, t_abs = 0.0;
                for (uint32_t i = 0; i < in; i++) {
                    const double p = (double)a[(size_t)k * in + i] * x[(size_t)r * in + i];
                    t += p;
                    t_abs += fabs(p);
                }
                const double sb = fabs((double)scale * b[(size_t)k * out + j]);
                want += (double)scale * t * b[(size_t)k * out + j];
                mag += fabs(t) * sb;
                shrink_err += sb * gamma_n(in) * t_abs * (1.0 + u);
            }
            const double bound = 2.0 * (gamma_n(rank + 1.0) * mag + shrink_err);
            if (!(fabs(gr[o] - want) <= bound))
                fail_msg("rank %u in %u out %u: row %u column %u: %.9g, reference %.9g "
                         "(bound %.3g)",
                         rank, in, out, r, j, gr[o], want, bound);
        }
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(drows);
    cudaFree(dt);
    free(a);
    free(b);
    free(x);
    free(y);
    free(got);
}

static void test_shrink_expand(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(31, "LoRA kernels");
    static const lora_case cases[] = {
        {1, 64, 96},   {8, 64, 96},    {64, 64, 96},   {1, 61, 130},    {8, 61, 130},
        {64, 61, 130}, {8, 4096, 130}, {64, 4096, 96}, {64, 128, 4096},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        printf("# rank %u, in %u, out %u\n", cases[i].rank, cases[i].in, cases[i].out);
        run_case(&cases[i], i % 2 ? 0.75f : -1.5f);
    }
}

/* Nothing listed: nothing launched, nothing written. */
static void test_empty(void **state) {
    (void)state;
    NEED_DEVICE();
    CU(llmi_cu_lora_shrink(0, NULL, 8, 64, NULL, 64, NULL, 0, NULL));
    CU(llmi_cu_lora_expand(0, NULL, 8, 64, NULL, 1.0f, NULL, 0, NULL, 64));
    CU(cudaDeviceSynchronize());
}

static int setup(void **state) {
    (void)state;
    int n = 0;
    have_device = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    if (!have_device)
        printf("# no CUDA device: the LoRA kernel tests skip\n");
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shrink_expand),
        cmocka_unit_test(test_empty),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
