/* LoRA kernels (cuda/kernels.h): the two halves of a row's low-rank update
 * y += s * B^T (A x), over the rows of one adapter, listed by index (the
 * host groups a step's rows by adapter, cuda/lora_plan.h):
 *   shrink  t[i][k] = A[k] . x[rows[i]]: one warp per (i, k), each lane
 *           summing a strided share of the row in f32 (float4 loads when
 *           the row allows), then a butterfly over the warp;
 *   expand  y[rows[i]][o] += (s * t[i][k]) * B[k][o] for k = 0 .. rank-1
 *           in order: a thread per output column, the CPU backend's axpy
 *           order (backend/cpu/lora.c), so only the shrink's dot order and
 *           the fused multiply-adds differ from the CPU's.
 * A row's result depends on that row alone, never on the batch. */
#include "kernels.h"

namespace {

constexpr int SHRINK_WARPS = 4;
constexpr int EXPAND_THREADS = 128;

__global__ void __launch_bounds__(SHRINK_WARPS * 32)
    lora_shrink_kernel(const float *__restrict__ a, uint32_t rank, uint32_t in,
                       const float *__restrict__ x, uint32_t x_stride,
                       const uint32_t *__restrict__ rows, uint32_t n_rows, bool vec4,
                       float *__restrict__ t) {
    const uint64_t pair = (uint64_t)blockIdx.x * SHRINK_WARPS + threadIdx.x / 32;
    if (pair >= (uint64_t)n_rows * rank)
        return; /* whole warps leave together */
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t i = (uint32_t)(pair / rank), k = (uint32_t)(pair % rank);
    const float *ak = a + (size_t)k * in;
    const float *xr = x + (size_t)rows[i] * x_stride;
    float sum = 0.0f;
    if (vec4) {
        const float4 *a4 = reinterpret_cast<const float4 *>(ak);
        const float4 *x4 = reinterpret_cast<const float4 *>(xr);
        for (uint32_t j = lane; j < in / 4; j += 32) {
            const float4 av = a4[j], xv = x4[j];
            sum = fmaf(av.x, xv.x, sum);
            sum = fmaf(av.y, xv.y, sum);
            sum = fmaf(av.z, xv.z, sum);
            sum = fmaf(av.w, xv.w, sum);
        }
    } else {
        for (uint32_t j = lane; j < in; j += 32)
            sum = fmaf(ak[j], xr[j], sum);
    }
    for (int off = 16; off > 0; off >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0)
        t[(size_t)i * rank + k] = sum;
}

__global__ void __launch_bounds__(EXPAND_THREADS)
    lora_expand_kernel(const float *__restrict__ b, uint32_t rank, uint32_t out,
                       const float *__restrict__ t, float scale, const uint32_t *__restrict__ rows,
                       uint32_t col_blocks, float *y, uint32_t y_stride) {
    const uint32_t i = blockIdx.x / col_blocks;
    const uint32_t o = (blockIdx.x % col_blocks) * EXPAND_THREADS + threadIdx.x;
    if (o >= out)
        return;
    const float *ti = t + (size_t)i * rank;
    float *yo = y + (size_t)rows[i] * y_stride + o;
    float acc = *yo;
    for (uint32_t k = 0; k < rank; k++)
        acc = fmaf(scale * ti[k], b[(size_t)k * out + o], acc);
    *yo = acc;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

} // namespace

extern "C" cudaError_t llmi_cu_lora_shrink(cudaStream_t stream, const float *a, uint32_t rank,
                                           uint32_t in, const float *x, uint32_t x_stride,
                                           const uint32_t *rows, uint32_t n_rows, float *t) {
    if (n_rows == 0 || rank == 0)
        return cudaSuccess;
    const uint64_t warps = (uint64_t)n_rows * rank;
    const uint64_t blocks = (warps + SHRINK_WARPS - 1) / SHRINK_WARPS;
    if (blocks > 0x7fffffffu)
        return cudaErrorInvalidValue;
    const bool vec4 = in % 4 == 0 && x_stride % 4 == 0 && aligned16(a) && aligned16(x);
    lora_shrink_kernel<<<(unsigned)blocks, SHRINK_WARPS * 32, 0, stream>>>(a, rank, in, x, x_stride,
                                                                           rows, n_rows, vec4, t);
    return cudaGetLastError();
}

extern "C" cudaError_t llmi_cu_lora_expand(cudaStream_t stream, const float *b, uint32_t rank,
                                           uint32_t out, const float *t, float scale,
                                           const uint32_t *rows, uint32_t n_rows, float *y,
                                           uint32_t y_stride) {
    if (n_rows == 0 || out == 0)
        return cudaSuccess;
    const uint32_t col_blocks = (out + EXPAND_THREADS - 1) / EXPAND_THREADS;
    const uint64_t blocks = (uint64_t)n_rows * col_blocks;
    if (blocks > 0x7fffffffu)
        return cudaErrorInvalidValue;
    lora_expand_kernel<<<(unsigned)blocks, EXPAND_THREADS, 0, stream>>>(
        b, rank, out, t, scale, rows, col_blocks, y, y_stride);
    return cudaGetLastError();
}
