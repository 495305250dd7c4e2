/* Every launcher of cuda/kernels.h on the GPU against the CPU backend's
 * code or a double-precision reference: GEMV for every weight type and
 * 1..8 rows (both the vector path and the unaligned fallback, and a row's
 * result independent of the batch), dequantization and the embedding bit
 * for bit, RMS norms, RoPE, GLU, soft-cap, gather, the K/V store bit for
 * bit (the Q8_0 and FP8 blocks as core's quantizer writes them), split-KV
 * attention over shuffled block tables (GQA, windows, every cache type,
 * several splits) and the block copy. Outputs are poisoned
 * (NaN) before each launch. Without a CUDA device every test skips. */
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

#include "backend/cpu/kernels.h"
#include "core/core.h"
#include "core/quant.h"
#include "core/ttype.h"
}

#include "device_math.h"
#include "kernels.h"

#include <cuda_runtime.h>

#include "kernel_test.h"

/* ---- weights ---- */

static const llmi_ttype all_types[] = {LLMI_T_F32,  LLMI_T_F16,  LLMI_T_BF16, LLMI_T_Q4_0,
                                       LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1, LLMI_T_Q8_0,
                                       LLMI_T_Q4_K, LLMI_T_Q6_K};

typedef struct host_matrix {
    uint8_t *data;
    float *deq; /* the CPU's dequantization, [rows][cols] */
    llmi_cu_matrix m;
} host_matrix;

static host_matrix make_matrix(llmi_ttype type, uint32_t rows, uint32_t cols) {
    host_matrix h;
    const size_t rb = llmi_ttype_row_bytes(type, cols);
    h.data = (uint8_t *)malloc(rb * rows);
    h.deq = (float *)malloc(sizeof(float) * rows * cols);
    float *x = (float *)malloc(sizeof(float) * cols);
    for (uint32_t r = 0; r < rows; r++) {
        fill(x, cols, -1.0f, 1.0f);
        llmi_quantize_row(type, x, h.data + r * rb, cols);
        llmi_dequantize_row(type, h.data + r * rb, h.deq + (size_t)r * cols, cols);
    }
    free(x);
    h.m.data = dev_copy(h.data, rb * rows);
    h.m.type = type;
    h.m.rows = rows;
    h.m.cols = cols;
    h.m.row_bytes = rb;
    return h;
}

static void free_matrix(host_matrix *h) {
    free(h->data);
    free(h->deq);
    cudaFree((void *)h->m.data);
}

/* ---- GEMV ---- */

static void check_gemv(const host_matrix *h, uint32_t n, const float *x, uint32_t xs,
                       const float *bias, const float *y, uint32_t ys) {
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t o = 0; o < h->m.rows; o++) {
            double want = bias ? bias[o] : 0.0, mag = bias ? fabs(bias[o]) : 0.0;
            for (uint32_t i = 0; i < h->m.cols; i++) {
                const double p = (double)h->deq[(size_t)o * h->m.cols + i] * x[r * xs + i];
                want += p;
                mag += fabs(p);
            }
            near(y[r * ys + o], want, 1e-5, mag + 1e-30, "gemv", (size_t)r * h->m.rows + o);
        }
}

/* Every row count 1..8 of one matrix shape, aligned activations and one
 * float off (the element-wise fallback, with a bias). */
static void gemv_case(llmi_ttype type, uint32_t rows, uint32_t cols, const float *x,
                      const float *dx, uint32_t xs, const float *bias, const float *dbias) {
    const uint32_t ys = rows + 3;
    float *y = (float *)malloc(sizeof(float) * 8 * ys), *y1 = (float *)malloc(4 * rows);
    host_matrix h = make_matrix(type, rows, cols);
    assert_true(llmi_cu_type_supported(type));
    for (uint32_t n = 1; n <= LLMI_CU_GEMV_MAX_ROWS; n++) {
        for (int variant = 0; variant < 2; variant++) {
            const float *xh = x + variant;
            float *dy = (float *)dev_alloc(sizeof(float) * 8 * ys);
            CU(llmi_cu_gemv(0, &h.m, dx + variant, xs, n, variant ? dbias : NULL, dy, ys));
            to_host(y, dy, sizeof(float) * n * ys);
            check_gemv(&h, n, xh, xs, variant ? bias : NULL, y, ys);
            /* A row's result does not depend on the batch: row n-1 alone
             * gives the same bits. */
            CU(llmi_cu_gemv(0, &h.m, dx + variant + (size_t)(n - 1) * xs, xs, 1,
                            variant ? dbias : NULL, dy, ys));
            to_host(y1, dy, sizeof(float) * rows);
            for (uint32_t o = 0; o < rows; o++)
                assert_int_equal(bits_of(y1[o]), bits_of(y[(size_t)(n - 1) * ys + o]));
            cudaFree(dy);
        }
    }
    free_matrix(&h);
    free(y);
    free(y1);
}

static void test_gemv(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0001, "gemv");
    const uint32_t rows = 67, max_cols = 1376, xs = max_cols + 4;
    float *x = (float *)malloc(sizeof(float) * 8 * xs + 16), *bias = (float *)malloc(4 * rows);
    fill(x, 8 * xs + 4, -2.0f, 2.0f);
    fill(bias, rows, -1.0f, 1.0f);
    float *dx = (float *)dev_copy(x, sizeof(float) * (8 * xs + 4));
    float *dbias = (float *)dev_copy(bias, 4 * rows);
    for (size_t t = 0; t < sizeof all_types / sizeof all_types[0]; t++)
        gemv_case(all_types[t], rows, 1024, x, dx, xs, bias, dbias);
    /* The 32-element block types are staged through shared memory a span
     * of 32 blocks at a time: a last span of 11 (1376) and of 18 (576)
     * blocks, rows starting 2, 4 and 16 bytes aligned. */
    static const llmi_ttype small[] = {LLMI_T_Q4_0, LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1,
                                       LLMI_T_Q8_0};
    for (size_t t = 0; t < sizeof small / sizeof small[0]; t++) {
        printf("# gemv: type %d, 576 and 1376 columns\n", (int)small[t]);
        gemv_case(small[t], rows, 576, x, dx, xs, bias, dbias);
        gemv_case(small[t], rows, 1376, x, dx, xs, bias, dbias);
    }
    /* Float rows that are not whole 16-byte chunks (the fallback). */
    float *y = (float *)malloc(sizeof(float) * 3 * 9);
    const llmi_ttype float_types[3] = {LLMI_T_F32, LLMI_T_F16, LLMI_T_BF16};
    for (int t = 0; t < 3; t++) {
        host_matrix h = make_matrix(float_types[t], 9, 1001);
        float *dy = (float *)dev_alloc(sizeof(float) * 3 * 9);
        CU(llmi_cu_gemv(0, &h.m, dx, xs, 3, NULL, dy, 9));
        to_host(y, dy, sizeof(float) * 3 * 9);
        check_gemv(&h, 3, x, xs, NULL, y, 9);
        cudaFree(dy);
        free_matrix(&h);
    }
    /* Refusals: no rows, too many rows, cols not whole blocks. */
    host_matrix h = make_matrix(LLMI_T_Q4_0, 4, 64);
    float *dy = (float *)dev_alloc(64);
    assert_int_equal(llmi_cu_gemv(0, &h.m, dx, 64, 0, NULL, dy, 4), cudaErrorInvalidValue);
    assert_int_equal(llmi_cu_gemv(0, &h.m, dx, 64, 9, NULL, dy, 4), cudaErrorInvalidValue);
    h.m.cols = 48;
    assert_int_equal(llmi_cu_gemv(0, &h.m, dx, 64, 1, NULL, dy, 4), cudaErrorInvalidValue);
    assert_false(llmi_cu_type_supported(LLMI_T_Q8_K));
    free_matrix(&h);
    cudaFree(dy);
    cudaFree(dx);
    cudaFree(dbias);
    free(x);
    free(bias);
    free(y);
}

/* ---- dequantization, bf16 activations, embedding ---- */

static void test_dequantize_embed(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0002, "dequantize");
    const uint32_t rows = 21, cols = 512, row0 = 3, n = 15;
    for (size_t t = 0; t < sizeof all_types / sizeof all_types[0]; t++) {
        host_matrix h = make_matrix(all_types[t], rows, cols);
        float *out = (float *)malloc(sizeof(float) * rows * cols);
        uint16_t *out16 = (uint16_t *)malloc(2 * rows * cols);
        void *d = dev_alloc(sizeof(float) * rows * cols);
        CU(llmi_cu_dequantize(0, &h.m, row0, n, false, d));
        to_host(out, d, sizeof(float) * n * cols);
        for (size_t i = 0; i < (size_t)n * cols; i++)
            assert_int_equal(bits_of(out[i]), bits_of(h.deq[(size_t)row0 * cols + i]));
        CU(llmi_cu_dequantize(0, &h.m, row0, n, true, d));
        to_host(out16, d, 2 * (size_t)n * cols);
        for (size_t i = 0; i < (size_t)n * cols; i++)
            assert_int_equal(out16[i], llmi_f32_to_bf16(h.deq[(size_t)row0 * cols + i]));
        assert_int_equal(llmi_cu_dequantize(0, &h.m, 10, 12, false, d), cudaErrorInvalidValue);
        /* Embedding: rows picked by token, times the scale. */
        const int32_t tokens[5] = {7, 0, 20, 7, 13};
        int32_t *dt = (int32_t *)dev_copy(tokens, sizeof tokens);
        const float scale = 1.75f;
        CU(llmi_cu_embed(0, &h.m, dt, 5, scale, (float *)d));
        to_host(out, d, sizeof(float) * 5 * cols);
        for (int r = 0; r < 5; r++)
            for (uint32_t i = 0; i < cols; i++)
                assert_int_equal(bits_of(out[r * cols + i]),
                                 bits_of(h.deq[(size_t)tokens[r] * cols + i] * scale));
        cudaFree(dt);
        cudaFree(d);
        free(out);
        free(out16);
        free_matrix(&h);
    }
    /* f32 -> bf16 activations at a stride. */
    const uint32_t dim = 300, xs = 310;
    float *x = (float *)malloc(sizeof(float) * 4 * xs);
    fill(x, 4 * xs, -1e3f, 1e3f);
    float *dx = (float *)dev_copy(x, sizeof(float) * 4 * xs);
    uint16_t *db = (uint16_t *)dev_alloc(2 * 4 * dim), hb[4 * 300];
    CU(llmi_cu_f32_to_bf16(0, dx, xs, 4, dim, db));
    to_host(hb, db, sizeof hb);
    for (uint32_t r = 0; r < 4; r++)
        for (uint32_t i = 0; i < dim; i++)
            assert_int_equal(hb[r * dim + i], llmi_f32_to_bf16(x[r * xs + i]));
    cudaFree(dx);
    cudaFree(db);
    free(x);
}

/* ---- rows ---- */

/* One width: the register kernels take widths divisible by 4 up to 8192
 * (1, 2, 4 and 8 float4 groups a thread), the loop kernels the rest. */
static void check_norms(uint32_t dim) {
    printf("# norms: width %u\n", dim);
    const uint32_t n = 5;
    const size_t N = (size_t)n * dim;
    float *x = (float *)malloc(4 * N), *delta = (float *)malloc(4 * N),
          *w = (float *)malloc(4 * dim);
    float *dw = (float *)malloc(4 * dim), *ref = (float *)malloc(4 * N),
          *got = (float *)malloc(4 * N);
    fill(x, N, -3.0f, 3.0f);
    fill(delta, N, -1.0f, 1.0f);
    fill(w, dim, 0.5f, 1.5f);
    fill(dw, dim, 0.5f, 1.5f);
    float *dx = (float *)dev_copy(x, 4 * N), *dd = (float *)dev_copy(delta, 4 * N);
    float *dwv = (float *)dev_copy(w, 4 * dim), *ddw = (float *)dev_copy(dw, 4 * dim);
    float *dout = (float *)dev_alloc(4 * N);
    const float eps = 1e-6f;
    CU(llmi_cu_rmsnorm(0, dx, dwv, eps, n, dim, dout));
    to_host(got, dout, 4 * N);
    for (uint32_t r = 0; r < n; r++)
        llmi_rmsnorm(ref + r * dim, x + r * dim, w, (int)dim, eps);
    for (size_t i = 0; i < N; i++)
        near(got[i], ref[i], 5e-7, fabs(ref[i]), "rmsnorm", i);
    /* In place. */
    CU(llmi_cu_rmsnorm(0, dx, dwv, eps, n, dim, dx));
    to_host(got, dx, 4 * N);
    for (size_t i = 0; i < N; i++)
        near(got[i], ref[i], 5e-7, fabs(ref[i]), "rmsnorm in place", i);
    /* x += rmsnorm(delta) * dw, out = rmsnorm(x) * w. */
    CU(cudaMemcpy(dx, x, 4 * N, cudaMemcpyHostToDevice));
    CU(llmi_cu_add_rmsnorm(0, dx, dd, ddw, dwv, eps, n, dim, dout));
    float *xr = (float *)malloc(4 * N), *xg = (float *)malloc(4 * N);
    for (uint32_t r = 0; r < n; r++) {
        llmi_rmsnorm(xr + r * dim, delta + r * dim, dw, (int)dim, eps);
        llmi_add_inplace(xr + r * dim, x + r * dim, (int)dim);
        llmi_rmsnorm(ref + r * dim, xr + r * dim, w, (int)dim, eps);
    }
    to_host(xg, dx, 4 * N);
    to_host(got, dout, 4 * N);
    for (size_t i = 0; i < N; i++) {
        /* The normed delta's scale may round differently (its sum of
         * squares is added in another order): error relative to the
         * summands, and to O(1) for the normed output. */
        near(xg[i], xr[i], 5e-7, fabs(x[i]) + fabs(xr[i] - x[i]), "add_rmsnorm x", i);
        near(got[i], ref[i], 1e-6, fabs(ref[i]) + 1.0, "add_rmsnorm out", i);
    }
    /* Plain add, no norm after it: x += delta exactly. */
    CU(cudaMemcpy(dx, x, 4 * N, cudaMemcpyHostToDevice));
    CU(llmi_cu_add_rmsnorm(0, dx, dd, NULL, NULL, eps, n, dim, NULL));
    to_host(xg, dx, 4 * N);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(bits_of(xg[i]), bits_of(x[i] + delta[i]));
    /* A row alone gives the bits it gives among n rows. */
    CU(cudaMemcpy(dx, x, 4 * N, cudaMemcpyHostToDevice));
    CU(llmi_cu_add_rmsnorm(0, dx, dd, ddw, dwv, eps, n, dim, dout));
    to_host(got, dout, 4 * N);
    CU(cudaMemcpy(dx, x, 4 * N, cudaMemcpyHostToDevice));
    const size_t r3 = (size_t)3 * dim;
    CU(llmi_cu_add_rmsnorm(0, dx + r3, dd + r3, ddw, dwv, eps, 1, dim, dout + r3));
    to_host(ref, dout, 4 * N);
    for (size_t i = r3; i < r3 + dim; i++)
        assert_int_equal(bits_of(ref[i]), bits_of(got[i]));
    cudaFree(dx);
    cudaFree(dd);
    cudaFree(dwv);
    cudaFree(ddw);
    cudaFree(dout);
    free(x);
    free(delta);
    free(w);
    free(dw);
    free(ref);
    free(got);
    free(xr);
    free(xg);
}

static void test_norms(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0003, "norms");
    static const uint32_t widths[] = {1000, 64, 576, 2048, 4096, 8192, 1002, 8196};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        check_norms(widths[i]);
}

/* One head count and width: the register kernel takes up to 16 pairs a
 * thread (4096 in a row), the loop kernel more. */
static void check_rope(uint32_t heads, uint32_t hd) {
    printf("# rope: %u heads of %u\n", heads, hd);
    const uint32_t n = 4, stride = heads * hd + 8;
    const uint32_t pos[4] = {0, 1, 777, 131000};
    float freq_div[64];
    fill(freq_div, 64, 1.0f, 8.0f);
    uint32_t *dpos = (uint32_t *)dev_copy(pos, sizeof pos);
    float *ddiv = (float *)dev_copy(freq_div, sizeof freq_div);
    float *x = (float *)malloc(4 * n * stride), *got = (float *)malloc(4 * n * stride);
    for (int layout = 0; layout < 2; layout++)
        for (uint32_t rope_dim = 32; rope_dim <= hd; rope_dim *= 2)
            for (int div = 0; div < 2; div++) {
                fill(x, (size_t)n * stride, -2.0f, 2.0f);
                float *dx = (float *)dev_copy(x, 4 * n * stride);
                const float base = 10000.0f, fs = 0.5f;
                CU(llmi_cu_rope(0, dx, stride, dpos, n, heads, hd, rope_dim, layout, base, fs,
                                div ? ddiv : NULL));
                to_host(got, dx, 4 * n * stride);
                const float scale = powf(base, -2.0f / (float)rope_dim);
                for (uint32_t r = 0; r < n; r++) {
                    float theta = (float)pos[r];
                    for (uint32_t i = 0; i < rope_dim / 2; i++) {
                        const float ang = (div ? theta / freq_div[i] : theta) * fs;
                        theta *= scale;
                        const float c = cosf(ang), s = sinf(ang);
                        for (uint32_t h = 0; h < heads; h++) {
                            const float *v = x + r * stride + h * hd;
                            const float *g = got + r * stride + h * hd;
                            uint32_t a, b;
                            llmi_cu_rope_pair(layout, rope_dim, i, &a, &b);
                            near(g[a], v[a] * c - v[b] * s, 1e-6, 4.0, "rope x0", a);
                            near(g[b], v[a] * s + v[b] * c, 1e-6, 4.0, "rope x1", b);
                        }
                    }
                    /* Untouched: the dimensions past rope_dim. */
                    for (uint32_t h = 0; h < heads; h++)
                        for (uint32_t d = rope_dim; d < hd; d++)
                            assert_int_equal(bits_of(got[r * stride + h * hd + d]),
                                             bits_of(x[r * stride + h * hd + d]));
                }
                cudaFree(dx);
            }
    cudaFree(dpos);
    cudaFree(ddiv);
    free(x);
    free(got);
}

static void test_rope(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0004, "rope");
    check_rope(3, 64);
    check_rope(8, 128);
    check_rope(32, 128);
    check_rope(72, 128);
}

static void test_elementwise(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0005, "elementwise");
    const uint32_t n = 3, F = 2000;
    const size_t N = (size_t)n * F;
    float *g = (float *)malloc(4 * N), *u = (float *)malloc(4 * N), *ref = (float *)malloc(4 * N);
    float *got = (float *)malloc(4 * N);
    for (int gelu = 0; gelu < 2; gelu++) {
        fill(g, N, -10.0f, 10.0f);
        fill(u, N, -2.0f, 2.0f);
        float *dg = (float *)dev_copy(g, 4 * N), *du = (float *)dev_copy(u, 4 * N);
        CU(llmi_cu_glu(0, dg, du, n, F, gelu));
        to_host(got, dg, 4 * N);
        memcpy(ref, g, 4 * N);
        for (uint32_t r = 0; r < n; r++)
            (gelu ? llmi_gelu_tanh_mul : llmi_silu_mul)(ref + r * F, u + r * F, (int)F);
        /* Both sides compute the same formula in the same order; only
         * tanhf and expf differ (CUDA documents 2 ulps for each; glibc's
         * are within that). SiLU's 1 + exp(-g) >= 1 keeps that relative.
         * GELU's 1 + tanh(...) cancels where g is very negative, so a
         * difference of up to 4 ulps of 1 in tanh (4 * 2^-24, |t| < 1)
         * reaches the result multiplied by |0.5 g u|. */
        for (size_t i = 0; i < N; i++) {
            double allowed = 1e-6 * (fabs(ref[i]) + 1e-6);
            if (gelu)
                allowed += 4.0 * ldexp(1.0, -24) * fabs(0.5 * g[i] * u[i]);
            near(got[i], ref[i], 1.0, allowed, gelu ? "geglu" : "swiglu", i);
        }
        cudaFree(dg);
        cudaFree(du);
    }
    fill(g, N, -100.0f, 100.0f);
    float *dg = (float *)dev_copy(g, 4 * N);
    CU(llmi_cu_softcap(0, dg, N, 30.0f));
    to_host(got, dg, 4 * N);
    for (size_t i = 0; i < N; i++)
        near(got[i], tanhf(g[i] * (1.0f / 30.0f)) * 30.0f, 1e-6, 30.0, "softcap", i);
    const uint32_t rows[3] = {2, 0, 2};
    uint32_t *drows = (uint32_t *)dev_copy(rows, sizeof rows);
    float *dst = (float *)dev_alloc(4 * N);
    CU(cudaMemcpy(dg, g, 4 * N, cudaMemcpyHostToDevice));
    CU(llmi_cu_gather_rows(0, dg, drows, 3, F, dst));
    to_host(got, dst, 4 * N);
    for (uint32_t r = 0; r < 3; r++)
        assert_memory_equal(got + r * F, g + rows[r] * F, 4 * F);
    cudaFree(dg);
    cudaFree(drows);
    cudaFree(dst);
    free(g);
    free(u);
    free(ref);
    free(got);
}

/* ---- paged KV cache ---- */

static void test_kv_store(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0006, "kv store");
    const uint32_t kv_dim = 96, bs = 8, n_blocks = 10, n_rows = 5, ks = 100, vs = 128;
    const uint32_t per_seq[2] = {4, 3};
    uint32_t block_start[3], blocks[10];
    shuffled_table(2, per_seq, n_blocks, block_start, blocks);
    const uint32_t seq[5] = {0, 0, 1, 0, 1}, pos[5] = {0, 1, 5, 31, 23};
    float *k = (float *)malloc(4 * n_rows * ks), *v = (float *)malloc(4 * n_rows * vs);
    fill(k, (size_t)n_rows * ks, -70000.0f, 70000.0f); /* f16 overflows too */
    fill(v, (size_t)n_rows * vs, -1e-5f, 1e-5f);       /* f16 subnormals */
    float *dk = (float *)dev_copy(k, 4 * n_rows * ks), *dv = (float *)dev_copy(v, 4 * n_rows * vs);
    uint32_t *dpos = (uint32_t *)dev_copy(pos, sizeof pos),
             *dseq = (uint32_t *)dev_copy(seq, sizeof seq);
    uint32_t *dbs = (uint32_t *)dev_copy(block_start, sizeof block_start);
    uint32_t *dbl = (uint32_t *)dev_copy(blocks, sizeof blocks);
    const size_t n_slots = (size_t)n_blocks * bs;
    for (size_t t = 0; t < N_KV_CACHE_TYPES; t++) {
        const llmi_ttype ct = kv_cache_types[t];
        const size_t row_bytes = cache_bytes(ct, kv_dim), bytes = n_slots * row_bytes;
        void *dkc = dev_alloc(bytes), *dvc = dev_alloc(bytes);
        uint8_t *hk = (uint8_t *)malloc(bytes), *hv = (uint8_t *)malloc(bytes);
        uint8_t *wk = (uint8_t *)malloc(bytes), *wv = (uint8_t *)malloc(bytes);
        memset(wk, 0xff, bytes);
        memset(wv, 0xff, bytes);
        for (uint32_t r = 0; r < n_rows; r++) {
            const uint32_t slot = blocks[block_start[seq[r]] + pos[r] / bs] * bs + pos[r] % bs;
            if (cache_blocked(ct)) {
                llmi_quantize_row(ct, k + (size_t)r * ks, wk + slot * row_bytes, kv_dim);
                llmi_quantize_row(ct, v + (size_t)r * vs, wv + slot * row_bytes, kv_dim);
                continue;
            }
            for (uint32_t i = 0; i < kv_dim; i++) {
                cache_put(ct, wk, (size_t)slot * kv_dim + i, k[r * ks + i]);
                cache_put(ct, wv, (size_t)slot * kv_dim + i, v[r * vs + i]);
            }
        }
        CU(llmi_cu_kv_store(0, dkc, dvc, ct, kv_dim, dk, ks, dv, vs, dpos, dseq, dbs, dbl, bs,
                            n_rows));
        to_host(hk, dkc, bytes);
        to_host(hv, dvc, bytes);
        assert_memory_equal(hk, wk, bytes); /* untouched slots keep the poison */
        assert_memory_equal(hv, wv, bytes);
        cudaFree(dkc);
        cudaFree(dvc);
        free(hk);
        free(hv);
        free(wk);
        free(wv);
    }
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dpos);
    cudaFree(dseq);
    cudaFree(dbs);
    cudaFree(dbl);
    free(k);
    free(v);
}

typedef struct attn_case {
    uint32_t n_head, n_head_kv, head_dim, window;
} attn_case;

static void run_attention(const attn_case *c, llmi_ttype ct) {
    const uint32_t bs = 16, n_seqs = 3, hd = c->head_dim, kv_dim = c->n_head_kv * hd;
    const uint32_t len[3] = {700, 257, 9}; /* 3, 2 and 1 splits */
    const uint32_t per_seq[3] = {(700 + 15) / 16, (257 + 15) / 16, 1};
    const uint32_t n_blocks = per_seq[0] + per_seq[1] + per_seq[2] + 5;
    uint32_t block_start[4], *blocks = (uint32_t *)malloc(4 * n_blocks);
    shuffled_table(n_seqs, per_seq, n_blocks, block_start, blocks);
    /* Rows: the last three of sequence 0, a middle and the last of 1, the
     * first and the last of 2. */
    const uint32_t n_rows = 7;
    const uint32_t seq[7] = {0, 0, 0, 1, 1, 2, 2}, pos[7] = {697, 698, 699, 100, 256, 0, 8};
    const size_t n_slots = (size_t)n_blocks * bs, cbytes = cache_bytes(ct, n_slots * kv_dim);
    uint8_t *kc = (uint8_t *)malloc(cbytes), *vc = (uint8_t *)malloc(cbytes);
    cache_fill(ct, kc, n_slots * kv_dim, -1.0f, 1.0f, 0.0f, 1);
    cache_fill(ct, vc, n_slots * kv_dim, -1.0f, 1.0f, 0.25f, 7);
    const uint32_t qd = c->n_head * hd, qs = qd + 4, os = qd + 12;
    float *q = (float *)malloc(4 * n_rows * qs), *out = (float *)malloc(4 * n_rows * os);
    fill(q, (size_t)n_rows * qs, -0.5f, 0.5f);
    uint32_t max_pos = 0;
    for (uint32_t r = 0; r < n_rows; r++)
        max_pos = pos[r] > max_pos ? pos[r] : max_pos;
    const size_t scratch = llmi_cu_attention_scratch_floats(n_rows, c->n_head, hd, max_pos + 1);
    llmi_cu_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = (const float *)dev_copy(q, 4 * n_rows * qs);
    a.q_stride = qs;
    a.out = (float *)dev_alloc(4 * n_rows * os);
    a.out_stride = os;
    a.k_cache = dev_copy(kc, cbytes);
    a.v_cache = dev_copy(vc, cbytes);
    a.cache_type = ct;
    a.n_rows = n_rows;
    a.n_head = c->n_head;
    a.n_head_kv = c->n_head_kv;
    a.head_dim = hd;
    a.kv_dim = kv_dim;
    a.block_size = bs;
    a.pos = (const uint32_t *)dev_copy(pos, sizeof pos);
    a.seq = (const uint32_t *)dev_copy(seq, sizeof seq);
    a.block_start = (const uint32_t *)dev_copy(block_start, sizeof block_start);
    a.blocks = (const uint32_t *)dev_copy(blocks, 4 * n_blocks);
    a.max_pos = max_pos;
    a.scale = 1.0f / sqrtf((float)hd);
    a.window = c->window;
    a.scratch = (float *)dev_alloc(4 * scratch);
    CU(llmi_cu_attention(0, &a));
    to_host(out, a.out, 4 * n_rows * os);
    double *sc = (double *)malloc(sizeof(double) * len[0]);
    const attn_host in = {q, kc, vc, pos, seq, block_start, blocks};
    for (uint32_t r = 0; r < n_rows; r++)
        for (uint32_t h = 0; h < c->n_head; h++)
            check_attention_head(&a, &in, r, h, out + (size_t)r * os + (size_t)h * hd, "attention",
                                 (size_t)r * qd + (size_t)h * hd, sc);
    free(sc);
    cudaFree((void *)a.q);
    cudaFree(a.out);
    cudaFree((void *)a.k_cache);
    cudaFree((void *)a.v_cache);
    cudaFree((void *)a.pos);
    cudaFree((void *)a.seq);
    cudaFree((void *)a.block_start);
    cudaFree((void *)a.blocks);
    cudaFree(a.scratch);
    free(blocks);
    free(kc);
    free(vc);
    free(q);
    free(out);
}

static void test_attention(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0007, "attention");
    const attn_case cases[] = {
        {4, 2, 64, 0}, {8, 8, 128, 0}, {2, 1, 256, 0}, {4, 1, 64, 300}, {4, 2, 80, 5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t t = 0; t < N_KV_CACHE_TYPES; t++)
            if (!cache_blocked(kv_cache_types[t]) || cases[c].head_dim % 32 == 0)
                run_attention(&cases[c], kv_cache_types[t]);
    /* Refusals: heads not a multiple of KV heads, no scratch layout for 0. */
    llmi_cu_attention_args a;
    memset(&a, 0, sizeof a);
    a.cache_type = LLMI_T_F16;
    a.n_rows = 1;
    a.n_head = 3;
    a.n_head_kv = 2;
    a.head_dim = 64;
    a.kv_dim = 128;
    a.block_size = 16;
    assert_int_equal(llmi_cu_attention(0, &a), cudaErrorInvalidValue);
    a.n_head = 4;
    a.cache_type = LLMI_T_Q4_0; /* no KV type of the plug-in */
    assert_int_equal(llmi_cu_attention(0, &a), cudaErrorInvalidValue);
    a.cache_type = LLMI_T_FP8_E4M3; /* heads of whole blocks only */
    a.head_dim = 48;
    a.kv_dim = 96;
    assert_int_equal(llmi_cu_attention(0, &a), cudaErrorInvalidValue);
}

static void test_kv_copy_block(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0008, "kv copy");
    const uint32_t n_layers = 3, bs = 8, n_blocks = 9, src = 2, dst = 7, n = 5;
    const size_t row_bytes_cases[2] = {192, 6}; /* 16-byte copies, then bytes */
    for (int c = 0; c < 2; c++) {
        const size_t rb = row_bytes_cases[c], bytes = rb * bs * n_blocks;
        void *arrays[6];
        uint8_t *want[6], *got = (uint8_t *)malloc(bytes);
        for (uint32_t a = 0; a < 2 * n_layers; a++) {
            want[a] = (uint8_t *)malloc(bytes);
            for (size_t i = 0; i < bytes; i++)
                want[a][i] = (uint8_t)rng_u64();
            arrays[a] = dev_copy(want[a], bytes);
            memcpy(want[a] + dst * bs * rb, want[a] + src * bs * rb, n * rb);
        }
        void **darrays = (void **)dev_copy(arrays, sizeof arrays);
        CU(llmi_cu_kv_copy_block(0, darrays, n_layers, rb, bs, dst, src, n));
        for (uint32_t a = 0; a < 2 * n_layers; a++) {
            to_host(got, arrays[a], bytes);
            assert_memory_equal(got, want[a], bytes);
            cudaFree(arrays[a]);
            free(want[a]);
        }
        cudaFree(darrays);
        free(got);
    }
    assert_int_equal(llmi_cu_kv_copy_block(0, NULL, 1, 16, 8, 1, 0, 9), cudaErrorInvalidValue);
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
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemv),        cmocka_unit_test(test_dequantize_embed),
        cmocka_unit_test(test_norms),       cmocka_unit_test(test_rope),
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_attention),   cmocka_unit_test(test_kv_copy_block),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
