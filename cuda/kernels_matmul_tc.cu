/* The batch-invariant matmul (llmi_cu_mm_tc, cuda/kernels.h):
 * y[j][o] = sum_k W[o][k] x[j][k] (+ bias[o]) on mma.sync m16n8k16 with
 * bf16 activations and f32 accumulation, for any row count n, with the
 * same bits in row j whatever n and whatever the other rows are.
 *
 * Order (cuda/matmul_tc_math.h, modelled by tests/cuda/test_matmul_order):
 * weights are always the A operand (16 weight rows a tile), activations
 * the B operand (8 activation rows a tile); one warp accumulates each
 * output element over all of K, k-steps of 16 in ascending order, into one
 * f32 register. No tile shape splits K and nothing is combined across
 * warps or CTAs, so the tile shape (chosen by n for speed) decides only
 * which warp computes an element, not how. The bias is added after the
 * sum.
 *
 * Weights are read as stored, a stage of 64 elements of BM rows at a time
 * with cp.async (16-byte copies for BF16, F16 and Q4_K, 4-byte ones for
 * the 32-element block types), and turned into A fragments in registers:
 *   BF16  ldmatrix as stored;
 *   F16   ldmatrix, then each element w = hi + lo with hi = bf16(w) and
 *         lo = bf16(w - hi), both exact: two mma per k-step, the weight's
 *         bits all kept;
 *   Q8_0, Q4_0  the block's integers (exact in bf16) into a zeroed partial
 *         over the block's two k-steps, then acc = fma(d, partial, acc);
 *   Q4_1, Q5_0, Q5_1, Q4_K  each element dequantized (device_math.h's
 *         arithmetic) and rounded to bf16, as the dequantize-then-cuBLASLt
 *         path did; a Q4_K stage holds the super-block's 16-byte header and
 *         the 32 bytes of quants of its 64 elements.
 * Activations are staged the same way (16-byte cp.async, rows past n
 * zero-filled) and read with ldmatrix. */
#include "device_math.h"
#include "kernels.h"
#include "matmul_tc_math.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>

namespace {

constexpr uint32_t KC = LLMI_MMTC_KC;
constexpr uint32_t B_ROW = LLMI_MMTC_B_ROW_BYTES;

template <uint32_t BM_, uint32_t BN_, uint32_t WARPS_M_, uint32_t WARPS_N_, uint32_t STAGES_>
struct Shape {
    static constexpr uint32_t BM = BM_, BN = BN_, WARPS_M = WARPS_M_, STAGES = STAGES_;
    static constexpr uint32_t WM = BM_ / WARPS_M_, WN = BN_ / WARPS_N_;
    static constexpr uint32_t MI = WM / 16, NI = WN / 8;
    static constexpr uint32_t THREADS = 32 * WARPS_M_ * WARPS_N_;
    static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tiles of whole 16 x 16 pairs");
};
using DecodeShape = Shape<LLMI_MMTC_DECODE_SHAPE>;
using MidShape = Shape<LLMI_MMTC_MID_SHAPE>;
using PrefillShape = Shape<LLMI_MMTC_PREFILL_SHAPE>;

/* acc += a * b, one m16n8k16 tile. */
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldsm_x4(const void *p, uint32_t r[4]) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* BYTES (4 or 16) from global src to shared dst, in flight until waited
 * for; valid false: zeros, nothing read. */
template <uint32_t BYTES>
__device__ __forceinline__ void cp_async(void *dst, const void *src, bool valid) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src),
                     "r"(valid ? 16 : 0)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src),
                     "r"(valid ? 4 : 0)
                     : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <uint32_t N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&v;
}

struct Args {
    const uint8_t *w;
    size_t w_row_bytes;
    uint32_t m, k;
    const uint16_t *x; /* bf16 */
    uint32_t x_stride, n;
    const float *bias;
    float *y;
    uint32_t y_stride;
};

/* Copies stage `kc` (elements 64 kc .. 64 kc + 63) of the CTA's BM weight
 * rows from m0 and BN activation rows from n0. */
template <class S, llmi_ttype T>
__device__ __forceinline__ void load_stage(const Args &a, uint8_t *sa, uint8_t *sb, uint32_t m0,
                                           uint32_t n0, uint32_t kc) {
    constexpr uint32_t COPY = llmi_mmtc_copy_bytes(T), CHUNK = llmi_mmtc_chunk_bytes(T);
    constexpr uint32_t PER_ROW = CHUNK / COPY;
#pragma unroll
    for (uint32_t it = 0; it < (S::BM * PER_ROW + S::THREADS - 1) / S::THREADS; it++) {
        const uint32_t i = it * S::THREADS + threadIdx.x;
        if ((S::BM * PER_ROW) % S::THREADS != 0 && i >= S::BM * PER_ROW)
            break;
        const uint32_t r = i / PER_ROW, c = i % PER_ROW, row = m0 + r;
        const bool valid = row < a.m;
        cp_async<COPY>(sa + llmi_mmtc_a_dst(T, r, c),
                       a.w + llmi_mmtc_a_src(T, a.w_row_bytes, valid ? row : 0, kc, c), valid);
    }
    constexpr uint32_t X_PER_ROW = KC / 8;
#pragma unroll
    for (uint32_t it = 0; it < (S::BN * X_PER_ROW + S::THREADS - 1) / S::THREADS; it++) {
        const uint32_t i = it * S::THREADS + threadIdx.x;
        if ((S::BN * X_PER_ROW) % S::THREADS != 0 && i >= S::BN * X_PER_ROW)
            break;
        const uint32_t r = i / X_PER_ROW, c = i % X_PER_ROW, row = n0 + r;
        const bool valid = row < a.n;
        cp_async<16>(sb + llmi_mmtc_b_dst(r, c),
                     a.x + llmi_mmtc_b_src(a.x_stride, valid ? row : 0, kc, c), valid);
    }
}

/* The A fragments of k-steps 2h and 2h + 1 of a stage (elements 32 h ..
 * 32 h + 31: one block of the block types) for the 16 weight rows at
 * local row r0, and for SCALED the scales of this lane's two rows. F16
 * fills lo too (a = hi there). */
template <llmi_ttype T>
__device__ __forceinline__ void a_frags(const uint8_t *sa, uint32_t r0, uint32_t h, uint32_t kc,
                                        uint32_t lane, uint32_t a[2][4], uint32_t lo[2][4],
                                        float d[2]) {
    constexpr llmi_mmtc_kind KIND = llmi_mmtc_kind_of(T);
    if constexpr (KIND == LLMI_MMTC_BF16 || KIND == LLMI_MMTC_F16) {
        uint32_t row, col;
        llmi_cu_ldsm_q_src(lane, &row, &col);
#pragma unroll
        for (uint32_t s = 0; s < 2; s++) {
            ldsm_x4(sa + llmi_mmtc_a_elem(T, r0 + row, h, s, col), a[s]);
            if constexpr (KIND == LLMI_MMTC_F16) {
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const float2 f = __half22float2(*(const __half2 *)&a[s][r]);
                    a[s][r] = pack_bf16(f.x, f.y);
                    const float2 hi = __bfloat1622float2(*(const __nv_bfloat162 *)&a[s][r]);
                    lo[s][r] = pack_bf16(f.x - hi.x, f.y - hi.y);
                }
            }
        }
    } else if constexpr (T == LLMI_T_Q4_K) {
        /* The sub-block's factors once for each of the lane's two rows. */
        float d0[2], n0[2];
#pragma unroll
        for (uint32_t e = 0; e < 2; e++)
            llmi_cu_q4k_factors(sa + llmi_mmtc_a_block(T, r0 + llmi_mmtc_a_row(lane, e), h),
                                (int)llmi_mmtc_q4k_sub(kc, h), &d0[e], &n0[e]);
#pragma unroll
        for (uint32_t s = 0; s < 2; s++)
#pragma unroll
            for (uint32_t r = 0; r < 4; r++) {
                const uint8_t *row = sa + llmi_mmtc_a_block(T, r0 + llmi_mmtc_a_row(lane, r), h);
                const uint32_t j = 16 * s + llmi_mmtc_a_col(lane, r);
                float v[2];
#pragma unroll
                for (uint32_t i = 0; i < 2; i++)
                    v[i] = llmi_cu_sub(
                        llmi_cu_mul(d0[r % 2], (float)llmi_mmtc_q4k_quant(row, h, j + i)),
                        n0[r % 2]);
                a[s][r] = pack_bf16(v[0], v[1]);
            }
    } else {
#pragma unroll
        for (uint32_t s = 0; s < 2; s++)
#pragma unroll
            for (uint32_t r = 0; r < 4; r++) {
                const uint8_t *blk = sa + llmi_mmtc_a_block(T, r0 + llmi_mmtc_a_row(lane, r), h);
                const uint32_t j = 16 * s + llmi_mmtc_a_col(lane, r);
                if constexpr (KIND == LLMI_MMTC_SCALED) {
                    a[s][r] = pack_bf16((float)llmi_mmtc_int_at(T, blk, j),
                                        (float)llmi_mmtc_int_at(T, blk, j + 1));
                } else {
                    a[s][r] = pack_bf16(llmi_cu_deq_elem(T, blk, (int)j),
                                        llmi_cu_deq_elem(T, blk, (int)j + 1));
                }
            }
        if constexpr (KIND == LLMI_MMTC_SCALED) {
#pragma unroll
            for (uint32_t e = 0; e < 2; e++)
                d[e] = llmi_cu_f16_to_f32(llmi_mmtc_scale_bits(
                    sa + llmi_mmtc_a_block(T, r0 + llmi_mmtc_a_row(lane, e), h)));
        }
    }
}

/* One CTA an SM is all the register allocation must allow: asked for two
 * (or left to its default), ptxas capped some shapes at 128 registers and
 * spilled (Q8_0's 64 x 32, BF16's 128 x 128). */
constexpr int MIN_CTAS = 1;

template <class S, llmi_ttype T>
__global__ void __launch_bounds__(S::THREADS, MIN_CTAS) mm_tc_kernel(const Args a) {
    constexpr llmi_mmtc_kind KIND = llmi_mmtc_kind_of(T);
    constexpr uint32_t A_STAGE = S::BM * llmi_mmtc_a_row_bytes(T), B_STAGE = S::BN * B_ROW;
    static_assert((S::STAGES * A_STAGE) % 16 == 0, "activation stages 16-byte aligned");
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t *sa = smem, *sb = smem + S::STAGES * A_STAGE;
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t m0 = blockIdx.x * S::BM, n0 = blockIdx.y * S::BN;
    const uint32_t wm0 = (warp % S::WARPS_M) * S::WM, wn0 = (warp / S::WARPS_M) * S::WN;
    const uint32_t n_stages = a.k / KC;

    float acc[S::MI][S::NI][4];
#pragma unroll
    for (uint32_t mi = 0; mi < S::MI; mi++)
#pragma unroll
        for (uint32_t ni = 0; ni < S::NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][ni][e] = 0.0f;

#pragma unroll
    for (uint32_t s = 0; s + 1 < S::STAGES; s++) {
        if (s < n_stages)
            load_stage<S, T>(a, sa + s * A_STAGE, sb + s * B_STAGE, m0, n0, s);
        cp_async_commit();
    }
    uint32_t brow, bcol;
    llmi_cu_ldsm_k_src(lane, &brow, &bcol);
    for (uint32_t kc = 0; kc < n_stages; kc++) {
        cp_async_wait<S::STAGES - 2>();
        __syncthreads(); /* stage kc landed for all; stage kc - 1 read by all */
        const uint32_t next = kc + S::STAGES - 1;
        if (next < n_stages)
            load_stage<S, T>(a, sa + (next % S::STAGES) * A_STAGE,
                             sb + (next % S::STAGES) * B_STAGE, m0, n0, next);
        cp_async_commit(); /* possibly empty: the wait above counts groups */
        const uint8_t *ta = sa + (kc % S::STAGES) * A_STAGE;
        const uint8_t *tb = sb + (kc % S::STAGES) * B_STAGE;
#pragma unroll
        for (uint32_t h = 0; h < 2; h++) {
            /* B fragments of k-steps 2h, 2h + 1 for the warp's NI tiles. */
            uint32_t b[S::NI][2][2];
#pragma unroll
            for (uint32_t nj = 0; nj < S::NI / 2; nj++)
#pragma unroll
                for (uint32_t s = 0; s < 2; s++) {
                    uint32_t r[4];
                    ldsm_x4(tb + llmi_mmtc_b_elem(wn0 + 16 * nj + brow, h, s, bcol), r);
                    b[2 * nj][s][0] = r[0];
                    b[2 * nj][s][1] = r[1];
                    b[2 * nj + 1][s][0] = r[2];
                    b[2 * nj + 1][s][1] = r[3];
                }
#pragma unroll
            for (uint32_t mi = 0; mi < S::MI; mi++) {
                uint32_t fa[2][4], flo[2][4];
                float d[2];
                a_frags<T>(ta, wm0 + 16 * mi, h, kc, lane, fa, flo, d);
#pragma unroll
                for (uint32_t ni = 0; ni < S::NI; ni++) {
                    if constexpr (KIND == LLMI_MMTC_SCALED) {
                        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma_bf16(p, fa[0], b[ni][0]);
                        mma_bf16(p, fa[1], b[ni][1]);
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[mi][ni][e] = __fmaf_rn(d[e / 2], p[e], acc[mi][ni][e]);
                    } else {
#pragma unroll
                        for (uint32_t s = 0; s < 2; s++) {
                            mma_bf16(acc[mi][ni], fa[s], b[ni][s]);
                            if constexpr (KIND == LLMI_MMTC_F16)
                                mma_bf16(acc[mi][ni], flo[s], b[ni][s]);
                        }
                    }
                }
            }
        }
    }

#pragma unroll
    for (uint32_t mi = 0; mi < S::MI; mi++)
#pragma unroll
        for (uint32_t ni = 0; ni < S::NI; ni++)
#pragma unroll
            for (uint32_t e = 0; e < 4; e++) {
                const uint32_t o = m0 + wm0 + 16 * mi + llmi_mmtc_c_row(lane, e);
                const uint32_t j = n0 + wn0 + 8 * ni + llmi_mmtc_c_col(lane, e);
                if (o < a.m && j < a.n)
                    a.y[(size_t)j * a.y_stride + o] =
                        a.bias ? __fadd_rn(acc[mi][ni][e], a.bias[o]) : acc[mi][ni][e];
            }
}

/* Opts the kernel into `smem` bytes of dynamic shared memory on the
 * current device, once per device: the first launch is eager (a step's
 * first run), so graph captures later make no such call. */
template <class S, llmi_ttype T> cudaError_t opt_in(uint32_t smem) {
    static std::atomic<uint64_t> done{0}; /* a bit per device */
    int dev = 0, optin = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess)
        return err;
    const uint64_t bit = dev < 64 ? (uint64_t)1 << dev : 0;
    if (bit && (done.load(std::memory_order_acquire) & bit))
        return cudaSuccess;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err != cudaSuccess)
        return err;
    if (smem > (uint32_t)optin)
        return cudaErrorInvalidValue;
    err = cudaFuncSetAttribute(mm_tc_kernel<S, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)smem);
    if (err == cudaSuccess)
        done.fetch_or(bit, std::memory_order_release);
    return err;
}

template <class S, llmi_ttype T> cudaError_t launch(cudaStream_t stream, const Args &a) {
    const llmi_mmtc_tile t = {S::BM, S::BN, S::WARPS_M, S::THREADS / 32 / S::WARPS_M, S::STAGES};
    const uint32_t smem = llmi_mmtc_smem_bytes(t, T);
    const cudaError_t err = opt_in<S, T>(smem);
    if (err != cudaSuccess)
        return err;
    const dim3 grid((a.m + S::BM - 1) / S::BM, (a.n + S::BN - 1) / S::BN);
    mm_tc_kernel<S, T><<<grid, S::THREADS, smem, stream>>>(a);
    return cudaGetLastError();
}

template <llmi_ttype T> cudaError_t launch_type(cudaStream_t stream, const Args &a) {
    switch (llmi_mmtc_tile_for(a.n)) {
    case LLMI_MMTC_TILE_DECODE:
        return launch<DecodeShape, T>(stream, a);
    case LLMI_MMTC_TILE_MID:
        return launch<MidShape, T>(stream, a);
    default:
        return launch<PrefillShape, T>(stream, a);
    }
}

} // namespace

bool llmi_cu_mm_tc_takes(const llmi_cu_matrix *w) {
    return llmi_mmtc_takes(w->type, w->cols, w->row_bytes, (uint64_t)(uintptr_t)w->data);
}

cudaError_t llmi_cu_mm_tc(cudaStream_t stream, const llmi_cu_matrix *w, const void *x,
                          uint32_t x_stride, uint32_t n_rows, const float *bias, float *y,
                          uint32_t y_stride) {
    if (!llmi_cu_mm_tc_takes(w) || x_stride % 8 != 0 || (uintptr_t)x % 16 != 0 ||
        x_stride < w->cols)
        return cudaErrorInvalidValue;
    if (n_rows == 0 || w->rows == 0)
        return cudaSuccess;
    const Args a = {(const uint8_t *)w->data,
                    w->row_bytes,
                    w->rows,
                    w->cols,
                    (const uint16_t *)x,
                    x_stride,
                    n_rows,
                    bias,
                    y,
                    y_stride};
    switch (w->type) {
    case LLMI_T_BF16:
        return launch_type<LLMI_T_BF16>(stream, a);
    case LLMI_T_F16:
        return launch_type<LLMI_T_F16>(stream, a);
    case LLMI_T_Q8_0:
        return launch_type<LLMI_T_Q8_0>(stream, a);
    case LLMI_T_Q4_0:
        return launch_type<LLMI_T_Q4_0>(stream, a);
    case LLMI_T_Q4_1:
        return launch_type<LLMI_T_Q4_1>(stream, a);
    case LLMI_T_Q5_0:
        return launch_type<LLMI_T_Q5_0>(stream, a);
    case LLMI_T_Q5_1:
        return launch_type<LLMI_T_Q5_1>(stream, a);
    case LLMI_T_Q4_K:
        return launch_type<LLMI_T_Q4_K>(stream, a);
    default:
        return cudaErrorInvalidValue;
    }
}
