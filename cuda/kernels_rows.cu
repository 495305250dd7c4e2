/* Row-wise and element-wise kernels (cuda/kernels.h): RMS norm (alone and
 * fused with the residual add), RoPE, the GLU activations, the logit
 * soft-cap and the gather of logit rows.
 *
 * RMS norm follows backend/cpu/kernels.c: the sum of squares of the f32
 * values in double (each product exact), scale = (float)(1 / sqrt(ss / n +
 * eps)) in double, out = x * scale * w in that order. Only the order of the
 * double sum differs from the CPU's, so the scale almost always rounds to
 * the same float. One CTA per row; the reduction order is fixed per row
 * width, whatever the row count.
 *
 * Rows of a width divisible by 4 and at most 8192, with 16-byte aligned
 * pointers (every row the models have), take the *_vec kernels: each thread
 * holds its float4 groups in registers, so all the loads of a pass are in
 * flight at once. The loop kernels wait for each load in turn: on an H200
 * add_rmsnorm_kernel took 14.8 us for one 4096-wide row, twice a layer. */
#include "device_math.h"
#include "kernels.h"

namespace {

constexpr int NORM_THREADS = 256;
constexpr int THREADS = 256;

/* The sum of v over the CTA, in a fixed order; every thread gets it. */
__device__ double block_sum(double v) {
    __shared__ double part[NORM_THREADS / 32];
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    const int warp = threadIdx.x / 32;
    __syncthreads(); /* part[] may still be read by a previous call */
    if (threadIdx.x % 32 == 0)
        part[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int k = 0; k < NORM_THREADS / 32; k++)
        s += part[k];
    return s;
}

__device__ __forceinline__ float norm_scale(double ss, uint32_t dim, float eps) {
    return (float)(1.0 / sqrt(ss / dim + (double)eps));
}

__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(const float *x, const float *__restrict__ w, float eps, uint32_t dim,
                   float *out) {
    const size_t base = (size_t)blockIdx.x * dim;
    double ss = 0.0;
    for (uint32_t i = threadIdx.x; i < dim; i += NORM_THREADS) {
        const double v = x[base + i];
        ss += v * v;
    }
    const float scale = norm_scale(block_sum(ss), dim, eps);
    for (uint32_t i = threadIdx.x; i < dim; i += NORM_THREADS)
        out[base + i] = llmi_cu_mul(llmi_cu_mul(x[base + i], scale), w[i]);
}

/* x += delta (normed with dw first when dw is not NULL), then out =
 * rmsnorm(x) * w when w is not NULL. A thread reads and writes only its own
 * elements, so delta or out may alias each other. */
__global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm_kernel(float *x, const float *delta, const float *__restrict__ dw,
                       const float *__restrict__ w, float eps, uint32_t dim, float *out) {
    const size_t base = (size_t)blockIdx.x * dim;
    float dscale = 1.0f;
    if (dw) {
        double ss = 0.0;
        for (uint32_t i = threadIdx.x; i < dim; i += NORM_THREADS) {
            const double v = delta[base + i];
            ss += v * v;
        }
        dscale = norm_scale(block_sum(ss), dim, eps);
    }
    double ss = 0.0;
    for (uint32_t i = threadIdx.x; i < dim; i += NORM_THREADS) {
        const float d =
            dw ? llmi_cu_mul(llmi_cu_mul(delta[base + i], dscale), dw[i]) : delta[base + i];
        const float v = llmi_cu_add(x[base + i], d);
        x[base + i] = v;
        ss += (double)v * v;
    }
    if (!w)
        return;
    const float scale = norm_scale(block_sum(ss), dim, eps);
    for (uint32_t i = threadIdx.x; i < dim; i += NORM_THREADS)
        out[base + i] = llmi_cu_mul(llmi_cu_mul(x[base + i], scale), w[i]);
}

/* ---- the register-resident norms ---- */

__device__ __forceinline__ double sum_sq4(double ss, float4 v) {
    ss += (double)v.x * v.x;
    ss += (double)v.y * v.y;
    ss += (double)v.z * v.z;
    return ss + (double)v.w * v.w;
}

/* (v * s) * w, per lane, as the loop kernels round it. */
__device__ __forceinline__ float4 scale_mul4(float4 v, float s, float4 w) {
    return make_float4(llmi_cu_mul(llmi_cu_mul(v.x, s), w.x), llmi_cu_mul(llmi_cu_mul(v.y, s), w.y),
                       llmi_cu_mul(llmi_cu_mul(v.z, s), w.z),
                       llmi_cu_mul(llmi_cu_mul(v.w, s), w.w));
}

/* out = x * (the norm's scale of the row whose sum of squares, this
 * thread's share, is ss) * w, for this thread's groups of the row. */
template <int VPT>
__device__ __forceinline__ void store_normed(const float4 (&xv)[VPT], double ss, uint32_t dim,
                                             float eps, const float *__restrict__ w, float *out) {
    const float scale = norm_scale(block_sum(ss), dim, eps);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    float4 *o4 = reinterpret_cast<float4 *>(out);
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const uint32_t j = threadIdx.x + k * NORM_THREADS;
        if (j < dim / 4)
            o4[j] = scale_mul4(xv[k], scale, w4[j]);
    }
}

/* VPT float4 groups per thread: group j = threadIdx.x + k * NORM_THREADS,
 * elements 4j .. 4j + 3 of the row. */
template <int VPT>
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_vec_kernel(const float *x, const float *__restrict__ w, float eps, uint32_t dim,
                       float *out) {
    const size_t base = (size_t)blockIdx.x * dim;
    const uint32_t n4 = dim / 4;
    const float4 *x4 = reinterpret_cast<const float4 *>(x + base);
    float4 xv[VPT];
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const uint32_t j = threadIdx.x + k * NORM_THREADS;
        xv[k] = j < n4 ? x4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < VPT; k++)
        ss = sum_sq4(ss, xv[k]);
    store_normed<VPT>(xv, ss, dim, eps, w, out + base);
}

/* add_rmsnorm_kernel with x and delta held in registers; the zero padding
 * of groups past the row adds nothing to a sum. */
template <int VPT>
__global__ void __launch_bounds__(NORM_THREADS)
    add_rmsnorm_vec_kernel(float *x, const float *delta, const float *__restrict__ dw,
                           const float *__restrict__ w, float eps, uint32_t dim, float *out) {
    const size_t base = (size_t)blockIdx.x * dim;
    const uint32_t n4 = dim / 4;
    float4 *x4 = reinterpret_cast<float4 *>(x + base);
    const float4 *d4 = reinterpret_cast<const float4 *>(delta + base);
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 xv[VPT], dv[VPT];
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const uint32_t j = threadIdx.x + k * NORM_THREADS;
        xv[k] = j < n4 ? x4[j] : zero;
        dv[k] = j < n4 ? d4[j] : zero;
    }
    if (dw) {
        double ss = 0.0;
#pragma unroll
        for (int k = 0; k < VPT; k++)
            ss = sum_sq4(ss, dv[k]);
        const float dscale = norm_scale(block_sum(ss), dim, eps);
        const float4 *dw4 = reinterpret_cast<const float4 *>(dw);
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            const uint32_t j = threadIdx.x + k * NORM_THREADS;
            if (j < n4)
                dv[k] = scale_mul4(dv[k], dscale, dw4[j]);
        }
    }
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const uint32_t j = threadIdx.x + k * NORM_THREADS;
        const float4 v = make_float4(llmi_cu_add(xv[k].x, dv[k].x), llmi_cu_add(xv[k].y, dv[k].y),
                                     llmi_cu_add(xv[k].z, dv[k].z), llmi_cu_add(xv[k].w, dv[k].w));
        if (j < n4)
            x4[j] = v;
        xv[k] = v;
        ss = sum_sq4(ss, v);
    }
    if (!w)
        return;
    store_normed<VPT>(xv, ss, dim, eps, w, out + base);
}

/* Float4 groups per thread for a row of `dim` through the *_vec kernels
 * (1, 2, 4 or 8), or 0 when the loop kernels must take it. */
int norm_groups(uint32_t dim, const void *a, const void *b, const void *c, const void *d,
                const void *e) {
    const void *ptrs[] = {a, b, c, d, e};
    if (dim % 4 || dim > 8 * 4 * NORM_THREADS)
        return 0;
    for (const void *p : ptrs)
        if ((uintptr_t)p % 16)
            return 0;
    const uint32_t per = (dim / 4 + NORM_THREADS - 1) / NORM_THREADS;
    return per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : 8;
}

/* One CTA per row: the row's cos/sin table in shared memory (pair i's angle
 * by the CPU's recurrence), then every head's pairs rotated. */
__global__ void __launch_bounds__(THREADS)
    rope_kernel(float *x, uint32_t stride, const uint32_t *__restrict__ pos, uint32_t n_heads,
                uint32_t head_dim, uint32_t rope_dim, int layout, float scale, float freq_scale,
                const float *__restrict__ freq_div) {
    extern __shared__ float cs[]; /* [rope_dim]: cos, sin of each pair */
    const uint32_t half = rope_dim / 2, p = pos[blockIdx.x];
    for (uint32_t i = threadIdx.x; i < half; i += THREADS) {
        const float angle =
            llmi_cu_rope_angle(llmi_cu_rope_theta(p, scale, i), freq_div, i, freq_scale);
        cs[2 * i] = cosf(angle);
        cs[2 * i + 1] = sinf(angle);
    }
    __syncthreads();
    float *row = x + (size_t)blockIdx.x * stride;
    for (uint32_t t = threadIdx.x; t < n_heads * half; t += THREADS) {
        const uint32_t h = t / half, i = t % half;
        uint32_t a, b;
        llmi_cu_rope_pair(layout, rope_dim, i, &a, &b);
        float *v = row + (size_t)h * head_dim;
        float x0 = v[a], x1 = v[b];
        llmi_cu_rope_rotate(cs[2 * i], cs[2 * i + 1], &x0, &x1);
        v[a] = x0;
        v[b] = x1;
    }
}

template <bool GELU>
__global__ void __launch_bounds__(THREADS)
    glu_kernel(float *__restrict__ gate, const float *__restrict__ up, uint64_t n) {
    const uint64_t i = (uint64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i < n)
        gate[i] = GELU ? llmi_cu_gelu_tanh_mul(gate[i], up[i]) : llmi_cu_silu_mul(gate[i], up[i]);
}

__global__ void __launch_bounds__(THREADS)
    softcap_kernel(float *x, uint64_t n, float inv_cap, float cap) {
    const uint64_t i = (uint64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i < n)
        x[i] = llmi_cu_softcap(x[i], inv_cap, cap);
}

__global__ void __launch_bounds__(THREADS)
    gather_kernel(const float *__restrict__ src, const uint32_t *__restrict__ rows, uint32_t n,
                  uint32_t dim, float *__restrict__ dst) {
    const uint64_t t = (uint64_t)blockIdx.x * THREADS + threadIdx.x;
    if (t >= (uint64_t)n * dim)
        return;
    const uint32_t r = (uint32_t)(t / dim), j = (uint32_t)(t % dim);
    dst[t] = src[(size_t)rows[r] * dim + j];
}

/* rope_kernel with every pair a thread rotates loaded first, into
 * registers, before the cos/sin table is computed: the loop version waits
 * for each pair's load in turn (5 us for the 8B's 32 query heads of one
 * row on an H200). K pairs a thread, pair t = threadIdx.x + k * THREADS. */
template <int K>
__global__ void __launch_bounds__(THREADS)
    rope_regs_kernel(float *x, uint32_t stride, const uint32_t *__restrict__ pos, uint32_t n_heads,
                     uint32_t head_dim, uint32_t rope_dim, int layout, float scale,
                     float freq_scale, const float *__restrict__ freq_div) {
    extern __shared__ float cs[]; /* [rope_dim]: cos, sin of each pair */
    const uint32_t half = rope_dim / 2, n_pairs = n_heads * half;
    float *row = x + (size_t)blockIdx.x * stride;
    float x0[K], x1[K];
    uint32_t at[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const uint32_t t = threadIdx.x + k * THREADS;
        if (t < n_pairs) {
            const uint32_t h = t / half, i = t % half;
            uint32_t a, b;
            llmi_cu_rope_pair(layout, rope_dim, i, &a, &b);
            at[k] = h * head_dim;
            x0[k] = row[at[k] + a];
            x1[k] = row[at[k] + b];
        }
    }
    const uint32_t p = pos[blockIdx.x];
    for (uint32_t i = threadIdx.x; i < half; i += THREADS) {
        const float angle =
            llmi_cu_rope_angle(llmi_cu_rope_theta(p, scale, i), freq_div, i, freq_scale);
        cs[2 * i] = cosf(angle);
        cs[2 * i + 1] = sinf(angle);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; k++) {
        const uint32_t t = threadIdx.x + k * THREADS;
        if (t < n_pairs) {
            const uint32_t i = t % half;
            uint32_t a, b;
            llmi_cu_rope_pair(layout, rope_dim, i, &a, &b);
            llmi_cu_rope_rotate(cs[2 * i], cs[2 * i + 1], &x0[k], &x1[k]);
            row[at[k] + a] = x0[k];
            row[at[k] + b] = x1[k];
        }
    }
}

/* CTAs for n items, or 0 when that exceeds the grid's limit. */
unsigned blocks_for(uint64_t n) {
    const uint64_t b = (n + THREADS - 1) / THREADS;
    return b <= 0x7fffffffu ? (unsigned)b : 0;
}

} // namespace

extern "C" {

cudaError_t llmi_cu_rmsnorm(cudaStream_t stream, const float *x, const float *w, float eps,
                            uint32_t n_rows, uint32_t dim, float *out) {
    if (n_rows > 0x7fffffffu || (n_rows && (!x || !w || !out || dim == 0)))
        return cudaErrorInvalidValue;
    if (n_rows == 0)
        return cudaSuccess;
    switch (norm_groups(dim, x, w, out, nullptr, nullptr)) {
    case 1:
        rmsnorm_vec_kernel<1><<<n_rows, NORM_THREADS, 0, stream>>>(x, w, eps, dim, out);
        break;
    case 2:
        rmsnorm_vec_kernel<2><<<n_rows, NORM_THREADS, 0, stream>>>(x, w, eps, dim, out);
        break;
    case 4:
        rmsnorm_vec_kernel<4><<<n_rows, NORM_THREADS, 0, stream>>>(x, w, eps, dim, out);
        break;
    case 8:
        rmsnorm_vec_kernel<8><<<n_rows, NORM_THREADS, 0, stream>>>(x, w, eps, dim, out);
        break;
    default:
        rmsnorm_kernel<<<n_rows, NORM_THREADS, 0, stream>>>(x, w, eps, dim, out);
    }
    return cudaGetLastError();
}

cudaError_t llmi_cu_add_rmsnorm(cudaStream_t stream, float *x, const float *delta,
                                const float *delta_norm_w, const float *w, float eps,
                                uint32_t n_rows, uint32_t dim, float *out) {
    if (n_rows > 0x7fffffffu || (n_rows && (!x || !delta || dim == 0 || (w && !out))))
        return cudaErrorInvalidValue;
    if (n_rows == 0)
        return cudaSuccess;
    const float *dw = delta_norm_w;
    switch (norm_groups(dim, x, delta, dw, w, out)) {
    case 1:
        add_rmsnorm_vec_kernel<1>
            <<<n_rows, NORM_THREADS, 0, stream>>>(x, delta, dw, w, eps, dim, out);
        break;
    case 2:
        add_rmsnorm_vec_kernel<2>
            <<<n_rows, NORM_THREADS, 0, stream>>>(x, delta, dw, w, eps, dim, out);
        break;
    case 4:
        add_rmsnorm_vec_kernel<4>
            <<<n_rows, NORM_THREADS, 0, stream>>>(x, delta, dw, w, eps, dim, out);
        break;
    case 8:
        add_rmsnorm_vec_kernel<8>
            <<<n_rows, NORM_THREADS, 0, stream>>>(x, delta, dw, w, eps, dim, out);
        break;
    default:
        add_rmsnorm_kernel<<<n_rows, NORM_THREADS, 0, stream>>>(x, delta, dw, w, eps, dim, out);
    }
    return cudaGetLastError();
}

cudaError_t llmi_cu_rope(cudaStream_t stream, float *x, uint32_t stride, const uint32_t *pos,
                         uint32_t n_rows, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim,
                         int layout, float base, float freq_scale, const float *freq_div) {
    if (rope_dim % 2 || rope_dim > head_dim || (layout != 0 && layout != 1) ||
        n_rows > 0x7fffffffu || (n_rows > 1 && stride < (uint64_t)n_heads * head_dim) ||
        (uint64_t)n_heads * (rope_dim / 2) > 0xffffffffu)
        return cudaErrorInvalidValue;
    if (n_rows == 0 || n_heads == 0 || rope_dim == 0)
        return cudaSuccess;
    /* The host's powf, as the CPU's rope_table computes it: the device's
     * may differ in the last bit, and every angle inherits the scale. */
    const float scale = powf(base, -2.0f / (float)rope_dim);
    const uint32_t per = (n_heads * (rope_dim / 2) + THREADS - 1) / THREADS;
    const size_t smem = rope_dim * sizeof(float);
#define LLMI_ROPE_REGS(K)                                                                          \
    rope_regs_kernel<K><<<n_rows, THREADS, smem, stream>>>(                                        \
        x, stride, pos, n_heads, head_dim, rope_dim, layout, scale, freq_scale, freq_div)
    if (per <= 1)
        LLMI_ROPE_REGS(1);
    else if (per <= 2)
        LLMI_ROPE_REGS(2);
    else if (per <= 4)
        LLMI_ROPE_REGS(4);
    else if (per <= 8)
        LLMI_ROPE_REGS(8);
    else if (per <= 16)
        LLMI_ROPE_REGS(16);
    else
        rope_kernel<<<n_rows, THREADS, smem, stream>>>(x, stride, pos, n_heads, head_dim, rope_dim,
                                                       layout, scale, freq_scale, freq_div);
#undef LLMI_ROPE_REGS
    return cudaGetLastError();
}

cudaError_t llmi_cu_glu(cudaStream_t stream, float *gate, const float *up, uint32_t n_rows,
                        uint32_t n, bool gelu) {
    const uint64_t total = (uint64_t)n_rows * n;
    if (total == 0)
        return cudaSuccess;
    const unsigned blocks = blocks_for(total);
    if (!blocks)
        return cudaErrorInvalidValue;
    if (gelu)
        glu_kernel<true><<<blocks, THREADS, 0, stream>>>(gate, up, total);
    else
        glu_kernel<false><<<blocks, THREADS, 0, stream>>>(gate, up, total);
    return cudaGetLastError();
}

cudaError_t llmi_cu_softcap(cudaStream_t stream, float *x, size_t n, float cap) {
    if (!(cap > 0.0f))
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    const unsigned blocks = blocks_for(n);
    if (!blocks)
        return cudaErrorInvalidValue;
    softcap_kernel<<<blocks, THREADS, 0, stream>>>(x, n, 1.0f / cap, cap);
    return cudaGetLastError();
}

cudaError_t llmi_cu_gather_rows(cudaStream_t stream, const float *src, const uint32_t *rows,
                                uint32_t n, uint32_t dim, float *dst) {
    const uint64_t total = (uint64_t)n * dim;
    if (total == 0)
        return cudaSuccess;
    const unsigned blocks = blocks_for(total);
    if (!blocks)
        return cudaErrorInvalidValue;
    gather_kernel<<<blocks, THREADS, 0, stream>>>(src, rows, n, dim, dst);
    return cudaGetLastError();
}

} // extern "C"
