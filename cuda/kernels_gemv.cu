/* Weight kernels (cuda/kernels.h): the batch-1..8 GEMV, dequantization of
 * weight rows for the tensor-core path, the f32 -> bf16 activations, and
 * the embedding lookup.
 *
 * GEMV: a warp takes one output row (two for block types), lanes striding
 * over the row in chunks (32 elements of a block type, 16 bytes of a float
 * type), each chunk dequantized in registers by device_math.h's functions
 * and multiplied with every activation row, so the weight is read once for
 * all rows (a template instance per row count). Lane sums are reduced with
 * warp shuffles in a fixed order: a row's result depends only on its own
 * weights and activations. Weights that are not aligned for the vector loads, or
 * activations not 16-byte aligned, take a slower per-element kernel that
 * computes the same dot products.
 *
 * The 32-element block types (Q4_0, Q4_1, Q5_1, Q8_0: 18 to 34 bytes a
 * block, 2-byte aligned) are staged: the warp copies the 32 blocks its
 * lanes take next (a span of 32 x block bytes, contiguous in the row) into
 * shared memory with coalesced 16-, 4- or 2-byte loads, and each lane
 * dequantizes its block from there. Read straight from the row, a lane's
 * block took 9 to 17 two-byte loads, each spread over the warp's 32
 * blocks: the H200 streamed Q8_0 at 1.3-1.5 TB/s of its 4.6. A lane still
 * takes chunks lane, lane + 32, ... in order, so the sums are the same
 * bits either way. */
#include "device_math.h"
#include "kernels.h"

#include <cuda_bf16.h>

namespace {

constexpr int GEMV_WARPS = 4; /* warps (output rows) per CTA */
constexpr int THREADS = 256;  /* element-wise kernels */
constexpr int MAX_R_TWO_ROWS = 3;

/* Elements a lane dequantizes at once: 32 for block types, 16 bytes' worth
 * for float types. */
template <llmi_ttype T> __host__ __device__ constexpr uint32_t chunk_elems() {
    return T == LLMI_T_F32 ? 4 : T == LLMI_T_F16 || T == LLMI_T_BF16 ? 8 : 32;
}

template <llmi_ttype T>
__device__ __forceinline__ void load_chunk(const uint8_t *row, uint32_t c, float *w) {
    if constexpr (T == LLMI_T_F32) {
        const float4 v = __ldg((const float4 *)row + c);
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
    } else if constexpr (T == LLMI_T_F16 || T == LLMI_T_BF16) {
        uint32_t q[4];
        llmi_cu_load16(row + (size_t)c * 16, q);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if constexpr (T == LLMI_T_BF16) {
                w[2 * k] = llmi_cu_bf16_to_f32(q[k] & 0xffff);
                w[2 * k + 1] = llmi_cu_bf16_to_f32(q[k] >> 16);
            } else {
                w[2 * k] = llmi_cu_f16_to_f32(q[k] & 0xffff);
                w[2 * k + 1] = llmi_cu_f16_to_f32(q[k] >> 16);
            }
        }
    } else {
        llmi_cu_deq_chunk32(T, row, c, w, true);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* Output rows one warp takes: two for block types at up to
 * MAX_R_TWO_ROWS activation rows, so each activation value a lane loads
 * (from L1) serves two weight rows. A Q4_K weight is 0.56 bytes against 4
 * bytes of activation: with one row per warp the L1 traffic for the
 * activations alone would match the HBM rate at batch 1. Past 3 rows ptxas
 * spills the two rows' chunks (make cuda-ptxas). */
template <llmi_ttype T, int R> __host__ __device__ constexpr uint32_t rows_per_warp() {
    return chunk_elems<T>() == 32 && R <= MAX_R_TWO_ROWS ? 2 : 1;
}

/* Bytes of a staged type's block; 0 for the types read in place. Q5_0 is
 * read in place: staged, its R = 1 instance keeps 4 bytes on the stack
 * (ptxas), which make cuda-ptxas refuses for a hot kernel. */
template <llmi_ttype T> __host__ __device__ constexpr uint32_t staged_block_bytes() {
    return T == LLMI_T_Q4_0   ? (uint32_t)sizeof(llmi_block_q4_0)
           : T == LLMI_T_Q4_1 ? (uint32_t)sizeof(llmi_block_q4_1)
           : T == LLMI_T_Q5_1 ? (uint32_t)sizeof(llmi_block_q5_1)
           : T == LLMI_T_Q8_0 ? (uint32_t)sizeof(llmi_block_q8_0)
                              : 0;
}

/* Copies `bytes` (even) from src (2-byte aligned, global) to dst (16-byte
 * aligned, shared), the warp together: lane i takes units i, i + 32, ...
 * of the widest size src's alignment allows, so each load instruction
 * reads one contiguous stretch. */
__device__ __forceinline__ void warp_copy(const uint8_t *__restrict__ src, uint8_t *dst,
                                          uint32_t bytes, uint32_t lane) {
    uint32_t done = 0;
    if (((uintptr_t)src & 15) == 0) {
        const uint32_t n = bytes / 16;
        for (uint32_t i = lane; i < n; i += 32)
            ((uint4 *)dst)[i] = __ldg((const uint4 *)src + i);
        done = n * 16;
    } else if (((uintptr_t)src & 3) == 0) {
        const uint32_t n = bytes / 4;
        for (uint32_t i = lane; i < n; i += 32)
            ((uint32_t *)dst)[i] = __ldg((const uint32_t *)src + i);
        done = n * 4;
    }
    for (uint32_t i = done / 2 + lane; i < bytes / 2; i += 32)
        ((uint16_t *)dst)[i] = __ldg((const uint16_t *)src + i);
}

/* acc[k][r] += chunk c of weight row k (w[k]) . the same elements of
 * activation row r, in element order. */
template <uint32_t O, int R, uint32_t E>
__device__ __forceinline__ void fma_chunk(const float (&w)[O][E], const float *__restrict__ x,
                                          uint32_t xs, uint32_t c, float (&acc)[O][R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float4 *xv = (const float4 *)(x + (size_t)r * xs + (size_t)c * E);
#pragma unroll
        for (uint32_t e = 0; e < E / 4; e++) {
            const float4 v = __ldg(xv + e);
#pragma unroll
            for (uint32_t k = 0; k < O; k++) {
                acc[k][r] = fmaf(w[k][4 * e], v.x, acc[k][r]);
                acc[k][r] = fmaf(w[k][4 * e + 1], v.y, acc[k][r]);
                acc[k][r] = fmaf(w[k][4 * e + 2], v.z, acc[k][r]);
                acc[k][r] = fmaf(w[k][4 * e + 3], v.w, acc[k][r]);
            }
        }
    }
}

template <llmi_ttype T, int R>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const uint8_t *__restrict__ W, size_t row_bytes, uint32_t rows, uint32_t cols,
                const float *__restrict__ x, uint32_t xs, const float *__restrict__ bias,
                float *__restrict__ y, uint32_t ys) {
    constexpr uint32_t E = chunk_elems<T>(), O = rows_per_warp<T, R>();
    const uint32_t o0 = (blockIdx.x * GEMV_WARPS + threadIdx.x / 32) * O, lane = threadIdx.x % 32;
    if (o0 >= rows)
        return;
    /* A missing second row (odd row count) reads the first again and is
     * not written: the warp's control flow stays uniform. */
    const uint8_t *row[O];
#pragma unroll
    for (uint32_t k = 0; k < O; k++)
        row[k] = W + (size_t)(o0 + k < rows ? o0 + k : o0) * row_bytes;
    float acc[O][R];
#pragma unroll
    for (uint32_t k = 0; k < O; k++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[k][r] = 0.0f;
    const uint32_t n_chunks = cols / E;
    if constexpr (staged_block_bytes<T>() != 0) {
        constexpr uint32_t BB = staged_block_bytes<T>(), SPAN = 32 * BB;
        __shared__ __align__(16) uint8_t stage[GEMV_WARPS][O][SPAN];
        uint8_t(*mine)[SPAN] = stage[threadIdx.x / 32];
        for (uint32_t c0 = 0; c0 < n_chunks; c0 += 32) {
            const uint32_t blocks = n_chunks - c0 < 32 ? n_chunks - c0 : 32;
#pragma unroll
            for (uint32_t k = 0; k < O; k++)
                warp_copy(row[k] + (size_t)c0 * BB, mine[k], blocks * BB, lane);
            __syncwarp();
            const uint32_t c = c0 + lane;
            if (c < n_chunks) {
                float w[O][E];
#pragma unroll
                for (uint32_t k = 0; k < O; k++)
                    llmi_cu_deq_chunk32(T, mine[k], lane, w[k], true);
                fma_chunk<O, R, E>(w, x, xs, c, acc);
            }
            __syncwarp(); /* the span is read before the next overwrites it */
        }
    } else {
#pragma unroll(O == 1 ? 4 : 1)
        for (uint32_t c = lane; c < n_chunks; c += 32) {
            float w[O][E];
#pragma unroll
            for (uint32_t k = 0; k < O; k++)
                load_chunk<T>(row[k], c, w[k]);
            fma_chunk<O, R, E>(w, x, xs, c, acc);
        }
    }
#pragma unroll
    for (uint32_t k = 0; k < O; k++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float s = warp_sum(acc[k][r]);
            const uint32_t o = o0 + k;
            if (lane == 0 && o < rows)
                y[(size_t)r * ys + o] = bias ? s + bias[o] : s;
        }
}

/* The unaligned fallback: one warp per (output row, activation row), one
 * element at a time. */
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_elem_kernel(const uint8_t *__restrict__ W, llmi_ttype type, size_t row_bytes,
                     uint32_t rows, uint32_t cols, const float *__restrict__ x, uint32_t xs,
                     const float *__restrict__ bias, float *__restrict__ y, uint32_t ys) {
    const uint32_t o = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t r = blockIdx.y;
    if (o >= rows)
        return;
    const uint32_t be = llmi_cu_block_elems(type), bb = llmi_cu_block_bytes(type);
    const uint8_t *row = W + (size_t)o * row_bytes;
    const float *xr = x + (size_t)r * xs;
    float acc = 0.0f;
    for (uint32_t i = lane; i < cols; i += 32)
        acc = fmaf(llmi_cu_deq_elem(type, row + (size_t)(i / be) * bb, (int)(i % be)), xr[i], acc);
    acc = warp_sum(acc);
    if (lane == 0)
        y[(size_t)r * ys + o] = bias ? acc + bias[o] : acc;
}

template <llmi_ttype T, int R>
void launch_gemv_r(cudaStream_t s, const llmi_cu_matrix *w, const float *x, uint32_t xs,
                   const float *bias, float *y, uint32_t ys) {
    const uint32_t per_cta = GEMV_WARPS * rows_per_warp<T, R>();
    const dim3 grid((w->rows + per_cta - 1) / per_cta);
    gemv_kernel<T, R><<<grid, GEMV_WARPS * 32, 0, s>>>((const uint8_t *)w->data, w->row_bytes,
                                                       w->rows, w->cols, x, xs, bias, y, ys);
}

template <llmi_ttype T>
void launch_gemv(cudaStream_t s, const llmi_cu_matrix *w, const float *x, uint32_t xs, uint32_t n,
                 const float *bias, float *y, uint32_t ys) {
    switch (n) {
    case 1:
        return launch_gemv_r<T, 1>(s, w, x, xs, bias, y, ys);
    case 2:
        return launch_gemv_r<T, 2>(s, w, x, xs, bias, y, ys);
    case 3:
        return launch_gemv_r<T, 3>(s, w, x, xs, bias, y, ys);
    case 4:
        return launch_gemv_r<T, 4>(s, w, x, xs, bias, y, ys);
    case 5:
        return launch_gemv_r<T, 5>(s, w, x, xs, bias, y, ys);
    case 6:
        return launch_gemv_r<T, 6>(s, w, x, xs, bias, y, ys);
    case 7:
        return launch_gemv_r<T, 7>(s, w, x, xs, bias, y, ys);
    default:
        return launch_gemv_r<T, 8>(s, w, x, xs, bias, y, ys);
    }
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether the chunked kernels may read this matrix: 16-byte vector loads
 * (float types, Q4_K) need 16-byte aligned rows; the other block types
 * read 16-bit words. */
bool chunk_aligned(const llmi_cu_matrix *w) {
    const bool vec = w->type == LLMI_T_F32 || w->type == LLMI_T_F16 || w->type == LLMI_T_BF16 ||
                     w->type == LLMI_T_Q4_K;
    const uintptr_t a = (uintptr_t)w->data | (uintptr_t)w->row_bytes;
    return vec ? (a & 15) == 0 : (a & 1) == 0;
}

/* The matrix's shape is one the kernels can read: a supported type and
 * whole blocks per row that fit in row_bytes. */
bool matrix_ok(const llmi_cu_matrix *w) {
    if (!w || !llmi_cu_type_supported(w->type))
        return false;
    const uint32_t be = llmi_cu_block_elems(w->type);
    return w->cols % be == 0 &&
           (uint64_t)(w->cols / be) * llmi_cu_block_bytes(w->type) <= w->row_bytes &&
           (w->data || w->rows == 0);
}

/* ---- dequantization ---- */

template <bool BF16> __device__ __forceinline__ void store_out(void *out, size_t i, float v) {
    if constexpr (BF16)
        ((uint16_t *)out)[i] = llmi_cu_f32_to_bf16(v);
    else
        ((float *)out)[i] = v;
}

/* One thread per 32-element chunk of a block type's rows. */
template <llmi_ttype T, bool BF16>
__global__ void __launch_bounds__(THREADS)
    dequant_chunk_kernel(const uint8_t *__restrict__ W, size_t row_bytes, uint32_t row0,
                         uint32_t n_rows, uint32_t cols, void *__restrict__ out) {
    const uint32_t per_row = cols / 32;
    const uint64_t t = (uint64_t)blockIdx.x * THREADS + threadIdx.x;
    if (t >= (uint64_t)per_row * n_rows)
        return;
    const uint32_t r = (uint32_t)(t / per_row), c = (uint32_t)(t % per_row);
    float w[32];
    llmi_cu_deq_chunk32(T, W + (size_t)(row0 + r) * row_bytes, c, w);
    const size_t base = (size_t)r * cols + (size_t)c * 32;
#pragma unroll
    for (int j = 0; j < 32; j++)
        store_out<BF16>(out, base + j, w[j]);
}

/* One thread per element, any supported type (float types, and block types
 * whose rows are not aligned for the chunk kernel). scale multiplies (the
 * embedding's). rows[r] picks the source row when rows is not NULL. */
template <bool BF16>
__global__ void __launch_bounds__(THREADS)
    dequant_elem_kernel(const uint8_t *__restrict__ W, llmi_ttype type, size_t row_bytes,
                        uint32_t row0, const int32_t *__restrict__ rows, uint32_t n_rows,
                        uint32_t cols, float scale, void *__restrict__ out) {
    const uint64_t t = (uint64_t)blockIdx.x * THREADS + threadIdx.x;
    if (t >= (uint64_t)cols * n_rows)
        return;
    const uint32_t r = (uint32_t)(t / cols), i = (uint32_t)(t % cols);
    const uint32_t src = rows ? (uint32_t)rows[r] : row0 + r;
    const uint32_t be = llmi_cu_block_elems(type), bb = llmi_cu_block_bytes(type);
    const float v =
        llmi_cu_deq_elem(type, W + (size_t)src * row_bytes + (size_t)(i / be) * bb, (int)(i % be));
    store_out<BF16>(out, t, llmi_cu_mul(v, scale));
}

template <llmi_ttype T, bool BF16>
void launch_dequant_chunk(cudaStream_t s, const llmi_cu_matrix *w, uint32_t row0, uint32_t n,
                          void *out) {
    const uint64_t threads = (uint64_t)(w->cols / 32) * n;
    dequant_chunk_kernel<T, BF16><<<(unsigned)((threads + THREADS - 1) / THREADS), THREADS, 0, s>>>(
        (const uint8_t *)w->data, w->row_bytes, row0, n, w->cols, out);
}

template <bool BF16>
bool dequant_chunked(cudaStream_t s, const llmi_cu_matrix *w, uint32_t row0, uint32_t n,
                     void *out) {
    switch (w->type) {
    case LLMI_T_Q4_0:
        launch_dequant_chunk<LLMI_T_Q4_0, BF16>(s, w, row0, n, out);
        return true;
    case LLMI_T_Q4_1:
        launch_dequant_chunk<LLMI_T_Q4_1, BF16>(s, w, row0, n, out);
        return true;
    case LLMI_T_Q5_0:
        launch_dequant_chunk<LLMI_T_Q5_0, BF16>(s, w, row0, n, out);
        return true;
    case LLMI_T_Q5_1:
        launch_dequant_chunk<LLMI_T_Q5_1, BF16>(s, w, row0, n, out);
        return true;
    case LLMI_T_Q8_0:
        launch_dequant_chunk<LLMI_T_Q8_0, BF16>(s, w, row0, n, out);
        return true;
    case LLMI_T_Q4_K:
        launch_dequant_chunk<LLMI_T_Q4_K, BF16>(s, w, row0, n, out);
        return true;
    case LLMI_T_Q6_K:
        launch_dequant_chunk<LLMI_T_Q6_K, BF16>(s, w, row0, n, out);
        return true;
    default:
        return false;
    }
}

template <bool BF16>
void launch_dequant_elem(cudaStream_t s, const llmi_cu_matrix *w, uint32_t row0,
                         const int32_t *rows, uint32_t n, float scale, void *out) {
    const uint64_t threads = (uint64_t)w->cols * n;
    dequant_elem_kernel<BF16><<<(unsigned)((threads + THREADS - 1) / THREADS), THREADS, 0, s>>>(
        (const uint8_t *)w->data, w->type, w->row_bytes, row0, rows, n, w->cols, scale, out);
}

/* Grid size of an element-wise launch over n items; false past the grid's
 * limit. */
bool grid_fits(uint64_t items) { return (items + THREADS - 1) / THREADS <= 0x7fffffffu; }

__global__ void __launch_bounds__(THREADS)
    f32_to_bf16_kernel(const float *__restrict__ x, uint32_t xs, uint32_t n_rows, uint32_t dim,
                       uint16_t *__restrict__ out) {
    const uint64_t t = (uint64_t)blockIdx.x * THREADS + threadIdx.x;
    if (t >= (uint64_t)dim * n_rows)
        return;
    const uint32_t r = (uint32_t)(t / dim), i = (uint32_t)(t % dim);
    out[t] = llmi_cu_f32_to_bf16(x[(size_t)r * xs + i]);
}

} // namespace

extern "C" {

bool llmi_cu_type_supported(llmi_ttype type) { return llmi_cu_block_elems(type) != 0; }

cudaError_t llmi_cu_gemv(cudaStream_t stream, const llmi_cu_matrix *w, const float *x,
                         uint32_t x_stride, uint32_t n_rows, const float *bias, float *y,
                         uint32_t y_stride) {
    if (!matrix_ok(w) || n_rows < 1 || n_rows > LLMI_CU_GEMV_MAX_ROWS ||
        (n_rows > 1 && (x_stride < w->cols || y_stride < w->rows)))
        return cudaErrorInvalidValue;
    if (w->rows == 0)
        return cudaSuccess;
    /* Float types' chunks are 16 bytes: cols must be whole chunks. */
    const uint32_t chunk = w->type == LLMI_T_F32 ? 4 : 8;
    const bool fast = chunk_aligned(w) && aligned16(x) && (n_rows == 1 || x_stride % 4 == 0) &&
                      (llmi_cu_block_elems(w->type) > 1 || w->cols % chunk == 0);
    if (!fast) {
        const dim3 grid((w->rows + GEMV_WARPS - 1) / GEMV_WARPS, n_rows);
        gemv_elem_kernel<<<grid, GEMV_WARPS * 32, 0, stream>>>((const uint8_t *)w->data, w->type,
                                                               w->row_bytes, w->rows, w->cols, x,
                                                               x_stride, bias, y, y_stride);
        return cudaGetLastError();
    }
    switch (w->type) {
    case LLMI_T_F32:
        launch_gemv<LLMI_T_F32>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    case LLMI_T_F16:
        launch_gemv<LLMI_T_F16>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    case LLMI_T_BF16:
        launch_gemv<LLMI_T_BF16>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    case LLMI_T_Q4_0:
        launch_gemv<LLMI_T_Q4_0>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    case LLMI_T_Q4_1:
        launch_gemv<LLMI_T_Q4_1>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    case LLMI_T_Q5_0:
        launch_gemv<LLMI_T_Q5_0>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    case LLMI_T_Q5_1:
        launch_gemv<LLMI_T_Q5_1>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    case LLMI_T_Q8_0:
        launch_gemv<LLMI_T_Q8_0>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    case LLMI_T_Q4_K:
        launch_gemv<LLMI_T_Q4_K>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    case LLMI_T_Q6_K:
        launch_gemv<LLMI_T_Q6_K>(stream, w, x, x_stride, n_rows, bias, y, y_stride);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t llmi_cu_dequantize(cudaStream_t stream, const llmi_cu_matrix *w, uint32_t row0,
                               uint32_t n_rows, bool out_bf16, void *out) {
    if (!matrix_ok(w) || row0 > w->rows || n_rows > w->rows - row0 ||
        !grid_fits((uint64_t)w->cols * n_rows))
        return cudaErrorInvalidValue;
    if (n_rows == 0 || w->cols == 0)
        return cudaSuccess;
    const bool chunked = chunk_aligned(w) && llmi_cu_block_elems(w->type) > 1 &&
                         (out_bf16 ? dequant_chunked<true>(stream, w, row0, n_rows, out)
                                   : dequant_chunked<false>(stream, w, row0, n_rows, out));
    if (!chunked) {
        if (out_bf16)
            launch_dequant_elem<true>(stream, w, row0, NULL, n_rows, 1.0f, out);
        else
            launch_dequant_elem<false>(stream, w, row0, NULL, n_rows, 1.0f, out);
    }
    return cudaGetLastError();
}

cudaError_t llmi_cu_f32_to_bf16(cudaStream_t stream, const float *x, uint32_t x_stride,
                                uint32_t n_rows, uint32_t dim, void *out) {
    if ((n_rows > 1 && x_stride < dim) || !grid_fits((uint64_t)dim * n_rows))
        return cudaErrorInvalidValue;
    const uint64_t n = (uint64_t)dim * n_rows;
    if (n == 0)
        return cudaSuccess;
    f32_to_bf16_kernel<<<(unsigned)((n + THREADS - 1) / THREADS), THREADS, 0, stream>>>(
        x, x_stride, n_rows, dim, (uint16_t *)out);
    return cudaGetLastError();
}

cudaError_t llmi_cu_embed(cudaStream_t stream, const llmi_cu_matrix *emb, const int32_t *tokens,
                          uint32_t n_rows, float scale, float *x) {
    if (!matrix_ok(emb) || !grid_fits((uint64_t)emb->cols * n_rows))
        return cudaErrorInvalidValue;
    if (n_rows == 0 || emb->cols == 0)
        return cudaSuccess;
    launch_dequant_elem<false>(stream, emb, 0, tokens, n_rows, scale, x);
    return cudaGetLastError();
}

} // extern "C"
