/* The paged KV cache's kernels (cuda/kernels.h): storing K/V rows, causal
 * split-KV attention, and copying blocks.
 *
 * Attention: a row's keys [first, pos] are cut into splits of
 * LLMI_CU_ATTN_SPLIT positions counted from `first`, so the cut depends
 * only on the row itself, never on the batch. One CTA per (split, head,
 * row) computes the split's partial (max, sum, weighted values) into the
 * scratch; a merge kernel then combines a row's partials in split order
 * (device_math.h's llmi_cu_softmax_merge) and divides. Scores are
 * dot(q, k) * scale in f32, as the CPU computes them.
 *
 * Prompts: runs of rows of one sequence (llmi_cuda_prefill_plan) go to
 * the prefill kernel below, which reads each key once per tile of queries
 * and head instead of once per row (or, with LLM_CUDA_ATTN_TC=1, to the
 * tensor-core kernel of kernels_attention_tc.cu); the rest take the split
 * kernel. With LLM_CUDA_ATTN=flashinfer, FlashInfer takes every row of the
 * layers it can (attention_flashinfer.cu, when built with it).
 *
 * Quantized caches (LLMI_T_Q8_0, LLMI_T_FP8_E4M3: blocks of 32 values of a
 * slot's row, kv_dim a multiple of 32): the store kernel gives each block
 * to one warp, which finds the block's amax with shuffles and quantizes as
 * core's quantizer does (kv_block_math.h), so the bytes are the CPU's for
 * the same K/V floats. Attention dequantizes each element in registers
 * (d * value, exactly the CPU's llmi_dequantize_row value) where the float
 * caches widen theirs; the tensor-core kernel and FlashInfer take 16-bit
 * caches only, so these layers always take the kernels here. */
#include "attention_flashinfer.h"
#include "device_math.h"
#include "internal.h"
#include "kernels.h"
#include "kv_block_math.h"

#include <atomic>

#include <stdlib.h>
#include <string.h>

namespace {

constexpr int ATTN_THREADS = 128;
constexpr int ATTN_WARPS = ATTN_THREADS / 32;
constexpr int THREADS = 256;
constexpr uint32_t SPLIT = LLMI_CU_ATTN_SPLIT;

/* Element i of a layer's cache (i = slot * kv_dim + e: for the block
 * types, element i % 32 of block i / 32, rows being whole blocks). */
template <llmi_ttype T> __device__ __forceinline__ float kv_load(const void *cache, size_t i) {
    if constexpr (T == LLMI_T_F32)
        return __ldg((const float *)cache + i);
    else if constexpr (T == LLMI_T_F16)
        return llmi_cu_f16_to_f32(__ldg((const unsigned short *)cache + i));
    else if constexpr (T == LLMI_T_BF16)
        return llmi_cu_bf16_to_f32(__ldg((const unsigned short *)cache + i));
    else if constexpr (T == LLMI_T_FP8_E4M3) {
        const llmi_block_fp8_e4m3 *b = (const llmi_block_fp8_e4m3 *)cache + i / LLMI_QK;
        return llmi_cu_fp8_value(__ldg(&b->d), __ldg(&b->qs[i % LLMI_QK]));
    } else {
        static_assert(T == LLMI_T_Q8_0, "a KV cache type");
        const llmi_block_q8_0 *b = (const llmi_block_q8_0 *)cache + i / LLMI_QK;
        const unsigned char q = __ldg((const unsigned char *)b->qs + i % LLMI_QK);
        return llmi_cu_q8_0_value(__ldg(&b->d), (int8_t)q);
    }
}

template <llmi_ttype T> __device__ __forceinline__ void kv_put(void *cache, size_t i, float v) {
    if constexpr (T == LLMI_T_F32)
        ((float *)cache)[i] = v;
    else if constexpr (T == LLMI_T_F16)
        ((uint16_t *)cache)[i] = llmi_cu_f32_to_f16(v);
    else
        ((uint16_t *)cache)[i] = llmi_cu_f32_to_bf16(v);
}

/* ---- K/V store ---- */

/* One warp per block of 32 elements of a quantized cache: lane j holds
 * element j (e = slot * kv_dim + i with kv_dim a multiple of 32, so
 * e % 32 is the lane). Every lane of the warp must call it. */
template <llmi_ttype T>
__device__ __forceinline__ void kv_put_block(void *cache, size_t e, float x) {
    float amax = fmaxf(0.0f, fabsf(x)); /* a NaN counts as 0, as on the CPU */
    for (int off = 16; off > 0; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const uint32_t lane = (uint32_t)(e % LLMI_QK);
    if constexpr (T == LLMI_T_FP8_E4M3) {
        llmi_block_fp8_e4m3 *b = (llmi_block_fp8_e4m3 *)cache + e / LLMI_QK;
        const float d = llmi_cu_fp8_scale(amax);
        b->qs[lane] = llmi_cu_fp8_code(x, d);
        if (lane == 0)
            b->d = d;
    } else {
        static_assert(T == LLMI_T_Q8_0, "a block KV cache type");
        llmi_block_q8_0 *b = (llmi_block_q8_0 *)cache + e / LLMI_QK;
        const float d = llmi_cu_q8_0_scale(amax);
        b->qs[lane] = llmi_cu_q8_0_code(x, d);
        if (lane == 0)
            b->d = llmi_cu_f32_to_f16(d);
    }
}

/* Threads cover n_rows * kv_dim elements, one each. For the block types
 * that is a multiple of 32 (kv_dim is), so whole warps return together and
 * a warp holds one block (kv_put_block). */
template <llmi_ttype T>
__global__ void __launch_bounds__(THREADS)
    kv_store_kernel(void *k_cache, void *v_cache, uint32_t kv_dim, const float *__restrict__ k,
                    uint32_t ks, const float *__restrict__ v, uint32_t vs,
                    const uint32_t *__restrict__ pos, const uint32_t *__restrict__ seq,
                    const uint32_t *__restrict__ block_start, const uint32_t *__restrict__ blocks,
                    uint32_t block_size, uint32_t n_rows) {
    const uint64_t t = (uint64_t)blockIdx.x * THREADS + threadIdx.x;
    if (t >= (uint64_t)n_rows * kv_dim)
        return;
    const uint32_t r = (uint32_t)(t / kv_dim), i = (uint32_t)(t % kv_dim);
    const uint32_t slot = llmi_cu_kv_slot(block_start, blocks, block_size, seq[r], pos[r]);
    const size_t dst = (size_t)slot * kv_dim + i;
    if constexpr (T == LLMI_T_Q8_0 || T == LLMI_T_FP8_E4M3) {
        kv_put_block<T>(k_cache, dst, k[(size_t)r * ks + i]);
        kv_put_block<T>(v_cache, dst, v[(size_t)r * vs + i]);
    } else {
        kv_put<T>(k_cache, dst, k[(size_t)r * ks + i]);
        kv_put<T>(v_cache, dst, v[(size_t)r * vs + i]);
    }
}

/* ---- attention ---- */

struct attn_params {
    const float *q;
    uint32_t q_stride;
    const void *k_cache, *v_cache;
    uint32_t n_head, group, head_dim, kv_dim, block_size, n_splits, window;
    const uint32_t *pos, *seq, *block_start, *blocks;
    float scale;
    float *scratch;       /* [n_rows][n_head][n_splits][2 + head_dim]: m, l, acc */
    const uint32_t *rows; /* grid row z is row rows[z]; NULL: row z */
};

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* Max (is_max) or sum of v over the CTA in a fixed order; every thread
 * gets it. */
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float part[ATTN_WARPS];
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    float s = part[0];
    for (int k = 1; k < ATTN_WARPS; k++)
        s = is_max ? fmaxf(s, part[k]) : s + part[k];
    return s;
}

/* The partial of split blockIdx.x of head blockIdx.y of grid row
 * blockIdx.z. */
template <llmi_ttype T>
__global__ void __launch_bounds__(ATTN_THREADS) attn_split_kernel(const attn_params a) {
    extern __shared__ float smem[]; /* q[head_dim], p[SPLIT], slots[SPLIT] */
    float *q = smem, *p = smem + a.head_dim;
    uint32_t *slots = (uint32_t *)(p + SPLIT);
    const uint32_t split = blockIdx.x, h = blockIdx.y, r = a.rows ? a.rows[blockIdx.z] : blockIdx.z;
    const uint32_t pos = a.pos[r], first = llmi_cu_attn_first(pos, a.window);
    const uint32_t start = first + split * SPLIT;
    if (start > pos)
        return; /* past the row's keys: the merge stops before this split */
    const uint32_t n = min(SPLIT, pos + 1 - start), hd = a.head_dim, s = a.seq[r];
    const size_t kv_off = (size_t)(h / a.group) * hd;
    const float *qr = a.q + (size_t)r * a.q_stride + (size_t)h * hd;
    for (uint32_t d = threadIdx.x; d < hd; d += ATTN_THREADS)
        q[d] = qr[d];
    for (uint32_t i = threadIdx.x; i < n; i += ATTN_THREADS)
        slots[i] = llmi_cu_kv_slot(a.block_start, a.blocks, a.block_size, s, start + i);
    __syncthreads();
    /* Scores: a warp per key, lanes across the head's dimensions. */
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (uint32_t i = warp; i < n; i += ATTN_WARPS) {
        const size_t row = (size_t)slots[i] * a.kv_dim + kv_off;
        float dot = 0.0f;
        for (uint32_t d = lane; d < hd; d += 32)
            dot = fmaf(q[d], kv_load<T>(a.k_cache, row + d), dot);
        dot = warp_sum(dot);
        if (lane == 0)
            p[i] = dot * a.scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (uint32_t i = threadIdx.x; i < n; i += ATTN_THREADS)
        mx = fmaxf(mx, p[i]);
    mx = block_reduce(mx, true);
    float sum = 0.0f;
    for (uint32_t i = threadIdx.x; i < n; i += ATTN_THREADS) {
        const float e = llmi_cu_softmax_weight(p[i], mx);
        p[i] = e;
        sum += e;
    }
    sum = block_reduce(sum, false); /* its syncs also publish p[] */
    float *out = a.scratch + (((size_t)r * a.n_head + h) * a.n_splits + split) * (2 + hd);
    if (threadIdx.x == 0) {
        out[0] = mx;
        out[1] = sum;
    }
    for (uint32_t d = threadIdx.x; d < hd; d += ATTN_THREADS) {
        float acc = 0.0f;
        for (uint32_t i = 0; i < n; i++)
            acc = fmaf(p[i], kv_load<T>(a.v_cache, (size_t)slots[i] * a.kv_dim + kv_off + d), acc);
        out[2 + d] = acc;
    }
}

/* Grid row blockIdx.y, head blockIdx.x: the row's partials merged in
 * split order, then divided by the total weight. */
__global__ void __launch_bounds__(ATTN_THREADS)
    attn_merge_kernel(const attn_params a, float *__restrict__ out, uint32_t out_stride) {
    const uint32_t h = blockIdx.x, r = a.rows ? a.rows[blockIdx.y] : blockIdx.y, hd = a.head_dim;
    const uint32_t pos = a.pos[r], first = llmi_cu_attn_first(pos, a.window);
    const uint32_t n_splits = (pos - first) / SPLIT + 1;
    const float *part = a.scratch + ((size_t)r * a.n_head + h) * a.n_splits * (2 + hd);
    float *o = out + (size_t)r * out_stride + (size_t)h * hd;
    for (uint32_t d = threadIdx.x; d < hd; d += ATTN_THREADS) {
        float m = -INFINITY, l = 0.0f, acc = 0.0f;
        for (uint32_t k = 0; k < n_splits; k++) {
            const float *pk = part + (size_t)k * (2 + hd);
            float mm, ca, cb;
            llmi_cu_softmax_merge(m, pk[0], &mm, &ca, &cb);
            m = mm;
            l = l * ca + pk[1] * cb;
            acc = acc * ca + pk[2 + d] * cb;
        }
        o[d] = acc / l;
    }
}

template <llmi_ttype T>
void launch_attention(cudaStream_t stream, const attn_params &p, uint32_t n_rows, float *out,
                      uint32_t out_stride) {
    const size_t smem = (size_t)p.head_dim * sizeof(float) + SPLIT * (sizeof(float) + 4);
    attn_split_kernel<T><<<dim3(p.n_splits, p.n_head, n_rows), ATTN_THREADS, smem, stream>>>(p);
    attn_merge_kernel<<<dim3(p.n_head, n_rows), ATTN_THREADS, 0, stream>>>(p, out, out_stride);
}

/* ---- prefill attention ----
 * One CTA per (tile, head): the tile's queries (up to PF_TILE consecutive
 * rows of one sequence at consecutive positions p0 ..) stay in shared
 * memory while the sequence's keys [first(p0), last row's pos] stream
 * through it PF_KEYS positions at a time, chunks aligned to multiples of
 * PF_KEYS (so a row's chunks, and its arithmetic, do not depend on the
 * tile it is in). K is loaded, scored, then V replaces it in the same
 * buffer. Each warp owns PF_ROWS rows' scores and online-softmax state
 * (max m, sum l, replicated over its lanes; lane j is key kb + j); each
 * thread owns the output columns d = tid + PF_THREADS * c of every row in
 * registers (acc). Keys outside [first(p0), last] are never read (a
 * windowed sequence may have dropped them) and count as zero. */

constexpr uint32_t PF_TILE = LLMI_CU_PREFILL_TILE;
constexpr uint32_t PF_KEYS = 32; /* one per lane */
constexpr int PF_THREADS = 128;
constexpr int PF_WARPS = PF_THREADS / 32;
constexpr int PF_ROWS = PF_TILE / PF_WARPS;
constexpr uint32_t PF_PSTRIDE = PF_TILE + 4; /* float4 rows of weights per key */
static_assert(PF_TILE % (4 * PF_WARPS) == 0 && PF_ROWS % 4 == 0, "tile layout");
static_assert(PF_THREADS * 2 >= LLMI_CU_PREFILL_MAX_HEAD_DIM, "two columns per thread at most");

struct prefill_params {
    const float *q;
    uint32_t q_stride;
    float *out;
    uint32_t out_stride;
    const void *k_cache, *v_cache;
    uint32_t group, head_dim, kv_dim, block_size, window;
    const uint32_t *pos, *seq, *block_start, *blocks, *tiles;
    float scale;
};

/* Shared memory: weights pt[PF_KEYS][PF_PSTRIDE], queries
 * qt[head_dim][PF_TILE] (transposed: a warp's rows are one float4 pair per
 * dimension), K or V kv[PF_KEYS][head_dim + 1] (an odd stride for the even
 * head sizes models use: lanes reading one key each hit distinct banks),
 * rescale factors and sums [PF_TILE] each, slots [PF_KEYS]. */
size_t prefill_smem(uint32_t hd) {
    return sizeof(float) * ((size_t)PF_KEYS * PF_PSTRIDE + (size_t)hd * PF_TILE +
                            (size_t)PF_KEYS * (hd + 1) + 2 * PF_TILE) +
           sizeof(uint32_t) * PF_KEYS;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* kv[j][d] = the cache's element d of key j's head (0 for a key whose slot
 * is UINT32_MAX); publishes it to the CTA. */
template <llmi_ttype T>
__device__ __forceinline__ void prefill_load(float *kv, const void *cache, const uint32_t *slots,
                                             size_t kv_dim, size_t kv_off, uint32_t hd) {
    for (uint32_t i = threadIdx.x; i < PF_KEYS * hd; i += PF_THREADS) {
        const uint32_t j = i / hd, d = i % hd, slot = slots[j];
        kv[j * (hd + 1) + d] =
            slot != UINT32_MAX ? kv_load<T>(cache, (size_t)slot * kv_dim + kv_off + d) : 0.0f;
    }
    __syncthreads();
}

/* Tile blockIdx.x, head blockIdx.y. DCH: output columns per thread
 * (head_dim <= DCH * PF_THREADS). */
template <llmi_ttype T, int DCH>
__global__ void __launch_bounds__(PF_THREADS) attn_prefill_kernel(const prefill_params a) {
    extern __shared__ float4 smem4[];
    const uint32_t hd = a.head_dim;
    float *pt = (float *)smem4, *qt = pt + PF_KEYS * PF_PSTRIDE, *kv = qt + (size_t)hd * PF_TILE;
    float *cs = kv + PF_KEYS * (hd + 1), *ls = cs + PF_TILE;
    uint32_t *slots = (uint32_t *)(ls + PF_TILE);
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32, h = blockIdx.y;
    const uint32_t row0 = a.tiles[2 * blockIdx.x], n = a.tiles[2 * blockIdx.x + 1];
    const uint32_t p0 = a.pos[row0], s = a.seq[row0];
    const uint32_t kmin = llmi_cu_attn_first(p0, a.window), kmax = p0 + n - 1;
    const size_t kv_off = (size_t)(h / a.group) * hd;
    for (uint32_t i = tid; i < hd * PF_TILE; i += PF_THREADS) {
        const uint32_t r = i % PF_TILE, d = i / PF_TILE;
        qt[i] = r < n ? a.q[(size_t)(row0 + r) * a.q_stride + (size_t)h * hd + d] : 0.0f;
    }
    float m[PF_ROWS], l[PF_ROWS], acc[DCH][PF_TILE];
#pragma unroll
    for (int k = 0; k < PF_ROWS; k++) {
        m[k] = -INFINITY;
        l[k] = 0.0f;
    }
#pragma unroll
    for (int c = 0; c < DCH; c++)
#pragma unroll
        for (int i = 0; i < (int)PF_TILE; i++)
            acc[c][i] = 0.0f;
    uint32_t kb0, n_chunks;
    llmi_cu_prefill_chunks(p0, n, a.window, PF_KEYS, &kb0, &n_chunks);
    for (uint32_t chunk = 0; chunk < n_chunks; chunk++) {
        const uint32_t kb = kb0 + chunk * PF_KEYS;
        if (tid < PF_KEYS) {
            const uint32_t kp = kb + tid;
            slots[tid] = kp >= kmin && kp <= kmax
                             ? llmi_cu_kv_slot(a.block_start, a.blocks, a.block_size, s, kp)
                             : UINT32_MAX;
        }
        __syncthreads(); /* slots; qt on the first chunk */
        prefill_load<T>(kv, a.k_cache, slots, a.kv_dim, kv_off, hd);
        /* Scores of this warp's rows 4 * PF_WARPS * g + 4 * warp + e (two
         * float4 groups g of rows) against key kb + lane. */
        float sc[PF_ROWS];
#pragma unroll
        for (int k = 0; k < PF_ROWS; k++)
            sc[k] = 0.0f;
        const float *kr = kv + lane * (hd + 1);
        for (uint32_t d = 0; d < hd; d++) {
            const float kd = kr[d];
            const float4 *qd = (const float4 *)(qt + (size_t)d * PF_TILE);
#pragma unroll
            for (int g = 0; g < PF_ROWS / 4; g++) {
                const float4 q4 = qd[PF_WARPS * g + warp];
                sc[4 * g + 0] = fmaf(q4.x, kd, sc[4 * g + 0]);
                sc[4 * g + 1] = fmaf(q4.y, kd, sc[4 * g + 1]);
                sc[4 * g + 2] = fmaf(q4.z, kd, sc[4 * g + 2]);
                sc[4 * g + 3] = fmaf(q4.w, kd, sc[4 * g + 3]);
            }
        }
        const uint32_t kp = kb + lane;
#pragma unroll
        for (int k = 0; k < PF_ROWS; k++) {
            const uint32_t i = llmi_cu_prefill_row(warp, PF_WARPS, k);
            const bool ok = llmi_cu_prefill_sees(p0, n, a.window, i, kp);
            const float sv = ok ? sc[k] * a.scale : -INFINITY;
            const float mx = fmaxf(m[k], warp_max(sv));
            float p = 0.0f, c = 1.0f; /* nothing seen yet: the state stays zero */
            if (mx != -INFINITY) {
                c = m[k] == -INFINITY ? 0.0f : llmi_cu_softmax_weight(m[k], mx);
                p = ok ? llmi_cu_softmax_weight(sv, mx) : 0.0f;
            }
            l[k] = l[k] * c + warp_sum(p);
            m[k] = mx;
            pt[lane * PF_PSTRIDE + i] = p;
            if (lane == 0)
                cs[i] = c;
        }
        __syncthreads(); /* every score read K: V may replace it */
        prefill_load<T>(kv, a.v_cache, slots, a.kv_dim, kv_off, hd);
#pragma unroll
        for (int c = 0; c < DCH; c++) {
            const uint32_t d = tid + c * PF_THREADS;
            if (d < hd) {
#pragma unroll
                for (int i = 0; i < (int)PF_TILE; i++)
                    acc[c][i] *= cs[i];
                for (uint32_t j = 0; j < PF_KEYS; j++) {
                    const float v = kv[j * (hd + 1) + d];
                    const float4 *pj = (const float4 *)(pt + j * PF_PSTRIDE);
#pragma unroll
                    for (int g = 0; g < (int)PF_TILE / 4; g++) {
                        const float4 p4 = pj[g];
                        acc[c][4 * g + 0] = fmaf(p4.x, v, acc[c][4 * g + 0]);
                        acc[c][4 * g + 1] = fmaf(p4.y, v, acc[c][4 * g + 1]);
                        acc[c][4 * g + 2] = fmaf(p4.z, v, acc[c][4 * g + 2]);
                        acc[c][4 * g + 3] = fmaf(p4.w, v, acc[c][4 * g + 3]);
                    }
                }
            }
        }
        __syncthreads(); /* V, pt, cs and slots are free for the next chunk */
    }
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < PF_ROWS; k++)
            ls[llmi_cu_prefill_row(warp, PF_WARPS, k)] = l[k];
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < DCH; c++) {
        const uint32_t d = tid + c * PF_THREADS;
        if (d < hd) {
#pragma unroll
            for (int i = 0; i < (int)PF_TILE; i++)
                if (i < (int)n)
                    a.out[(size_t)(row0 + i) * a.out_stride + (size_t)h * hd + d] =
                        acc[c][i] / ls[i];
        }
    }
}

template <llmi_ttype T, int DCH>
cudaError_t launch_prefill_dch(cudaStream_t stream, const prefill_params &p, uint32_t n_tiles,
                               uint32_t n_head) {
    const size_t smem = prefill_smem(p.head_dim);
    if (smem > 48 * 1024) {
        int dev = 0, optin = 0;
        cudaError_t err = cudaGetDevice(&dev);
        if (err == cudaSuccess)
            err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (err != cudaSuccess)
            return err;
        if (smem > (size_t)optin)
            return cudaErrorInvalidValue;
        err = cudaFuncSetAttribute(attn_prefill_kernel<T, DCH>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess)
            return err;
    }
    attn_prefill_kernel<T, DCH><<<dim3(n_tiles, n_head), PF_THREADS, smem, stream>>>(p);
    return cudaSuccess;
}

template <llmi_ttype T>
cudaError_t launch_prefill(cudaStream_t stream, const prefill_params &p, uint32_t n_tiles,
                           uint32_t n_head) {
    if (p.head_dim <= PF_THREADS)
        return launch_prefill_dch<T, 1>(stream, p, n_tiles, n_head);
    return launch_prefill_dch<T, 2>(stream, p, n_tiles, n_head);
}

bool cache_type_ok(llmi_ttype t) {
    return t == LLMI_T_F32 || t == LLMI_T_F16 || t == LLMI_T_BF16 || t == LLMI_T_Q8_0 ||
           t == LLMI_T_FP8_E4M3;
}

bool cache_type_blocked(llmi_ttype t) { return t == LLMI_T_Q8_0 || t == LLMI_T_FP8_E4M3; }

/* ---- block copy ---- */

/* Array blockIdx.y of `caches`: n bytes from byte src to byte dst, 16 at a
 * time when everything is 16-byte aligned. */
__global__ void __launch_bounds__(THREADS)
    kv_copy_kernel(void *const *caches, size_t dst, size_t src, size_t n) {
    uint8_t *base = (uint8_t *)caches[blockIdx.y];
    const size_t stride = (size_t)gridDim.x * THREADS;
    const size_t t = (size_t)blockIdx.x * THREADS + threadIdx.x;
    if ((((uintptr_t)base | dst | src | n) & 15) == 0) {
        uint4 *d = (uint4 *)(base + dst);
        const uint4 *s = (const uint4 *)(base + src);
        for (size_t i = t; i < n / 16; i += stride)
            d[i] = s[i];
    } else {
        for (size_t i = t; i < n; i += stride)
            base[dst + i] = base[src + i];
    }
}

} // namespace

extern "C" {

cudaError_t llmi_cu_kv_store(cudaStream_t stream, void *k_cache, void *v_cache,
                             llmi_ttype cache_type, uint32_t kv_dim, const float *k,
                             uint32_t k_stride, const float *v, uint32_t v_stride,
                             const uint32_t *pos, const uint32_t *seq, const uint32_t *block_start,
                             const uint32_t *blocks, uint32_t block_size, uint32_t n_rows) {
    const uint64_t total = (uint64_t)n_rows * kv_dim;
    if (!cache_type_ok(cache_type) || block_size == 0 ||
        (cache_type_blocked(cache_type) && kv_dim % LLMI_QK) ||
        (n_rows > 1 && (k_stride < kv_dim || v_stride < kv_dim)) ||
        (total + THREADS - 1) / THREADS > 0x7fffffffu)
        return cudaErrorInvalidValue;
    if (total == 0)
        return cudaSuccess;
    const unsigned grid = (unsigned)((total + THREADS - 1) / THREADS);
#define KV_STORE(T)                                                                                \
    kv_store_kernel<T><<<grid, THREADS, 0, stream>>>(k_cache, v_cache, kv_dim, k, k_stride, v,     \
                                                     v_stride, pos, seq, block_start, blocks,      \
                                                     block_size, n_rows)
    if (cache_type == LLMI_T_F32)
        KV_STORE(LLMI_T_F32);
    else if (cache_type == LLMI_T_F16)
        KV_STORE(LLMI_T_F16);
    else if (cache_type == LLMI_T_BF16)
        KV_STORE(LLMI_T_BF16);
    else if (cache_type == LLMI_T_Q8_0)
        KV_STORE(LLMI_T_Q8_0);
    else
        KV_STORE(LLMI_T_FP8_E4M3);
#undef KV_STORE
    return cudaGetLastError();
}

size_t llmi_cu_attention_scratch_floats(uint32_t n_rows, uint32_t n_head, uint32_t head_dim,
                                        uint32_t max_ctx) {
    const uint64_t splits = ((uint64_t)max_ctx + SPLIT - 1) / SPLIT;
    return (size_t)((uint64_t)n_rows * n_head * splits * (2 + (uint64_t)head_dim));
}

} // extern "C"

namespace {

/* LLM_CUDA_ATTN_TC=1: tiles of layers the tensor-core kernel takes go to
 * it. Read once (a function-local static: thread-safe initialization). */
bool tc_from_env() {
    static const bool on = [] {
        const char *s = getenv("LLM_CUDA_ATTN_TC");
        return s && s[0] == '1' && s[1] == '\0';
    }();
    return on;
}

/* LLM_CUDA_ATTN=flashinfer: every row of the layers FlashInfer takes goes
 * to it (attention_flashinfer.h; docs/cuda.md, "FlashInfer attention").
 * Read once, like tc_from_env. */
bool flashinfer_from_env() {
    static const bool on = [] {
        const char *s = getenv("LLM_CUDA_ATTN");
        return s && strcmp(s, "flashinfer") == 0;
    }();
    return on;
}

/* FlashInfer was asked for and refused a layer: said once per reason. */
void flashinfer_refused(llmi_fi_refusal why) {
    static std::atomic<bool> said[LLMI_FI_N_REFUSALS];
    if ((unsigned)why < LLMI_FI_N_REFUSALS && !said[why].exchange(true))
        llmi_cuda_log(LLM_LOG_DEBUG,
                      "LLM_CUDA_ATTN=flashinfer: %s; such layers take the plug-in's own kernels",
                      llmi_fi_refusal_name(why));
}

/* llmi_cu_attention; force_tc: the tensor-core kernel for the tiles or
 * cudaErrorInvalidValue. */
cudaError_t attention(cudaStream_t stream, const llmi_cu_attention_args *a, bool force_tc) {
    if (!a || !cache_type_ok(a->cache_type) ||
        (cache_type_blocked(a->cache_type) && (a->kv_dim % LLMI_QK || a->head_dim % LLMI_QK)) ||
        a->n_head == 0 || a->n_head_kv == 0 || a->n_head % a->n_head_kv || a->head_dim == 0 ||
        a->block_size == 0 || (uint64_t)a->n_head_kv * a->head_dim > a->kv_dim ||
        a->n_head > 65535 || a->n_rows > 65535 ||
        (a->n_rows > 1 && (a->q_stride < (uint64_t)a->n_head * a->head_dim ||
                           a->out_stride < (uint64_t)a->n_head * a->head_dim)))
        return cudaErrorInvalidValue;
    const bool tiled = a->n_tiles > 0;
    if (tiled &&
        (!a->tiles || a->n_tiles > a->n_rows || a->n_decode_rows > a->n_rows ||
         (a->n_decode_rows && !a->decode_rows) || a->head_dim > LLMI_CU_PREFILL_MAX_HEAD_DIM))
        return cudaErrorInvalidValue;
    if (force_tc && !llmi_cu_prefill_tc_takes(a))
        return cudaErrorInvalidValue;
    if (a->n_rows == 0)
        return cudaSuccess;
    if (!force_tc && flashinfer_from_env()) {
        const llmi_fi_refusal why = llmi_cu_flashinfer_takes(stream, a);
        if (why == LLMI_FI_TAKES)
            return llmi_cu_attention_flashinfer(stream, a);
        flashinfer_refused(why);
    }
    /* Keys a row sees: at most max_pos + 1, and at most the window. */
    uint64_t span = (uint64_t)a->max_pos + 1;
    if (a->window && a->window < span)
        span = a->window;
    attn_params p;
    p.q = a->q;
    p.q_stride = a->q_stride;
    p.k_cache = a->k_cache;
    p.v_cache = a->v_cache;
    p.n_head = a->n_head;
    p.group = a->n_head / a->n_head_kv;
    p.head_dim = a->head_dim;
    p.kv_dim = a->kv_dim;
    p.block_size = a->block_size;
    p.n_splits = (uint32_t)((span + SPLIT - 1) / SPLIT);
    p.window = a->window;
    p.pos = a->pos;
    p.seq = a->seq;
    p.block_start = a->block_start;
    p.blocks = a->blocks;
    p.scale = a->scale;
    p.scratch = a->scratch;
    p.rows = tiled ? a->decode_rows : NULL;
    const uint32_t n_split_rows = tiled ? a->n_decode_rows : a->n_rows;
    const size_t smem = (size_t)p.head_dim * sizeof(float) + SPLIT * (sizeof(float) + 4);
    if (smem > 48 * 1024)
        return cudaErrorInvalidValue;
    const bool tc = force_tc || (tiled && tc_from_env() && llmi_cu_prefill_tc_takes(a));
    if (tiled && tc) {
        const cudaError_t err = llmi_cu_prefill_tc(stream, a);
        if (err != cudaSuccess)
            return err;
    } else if (tiled) {
        const prefill_params f = {
            a->q,    a->q_stride,    a->out,    a->out_stride, a->k_cache, a->v_cache,
            p.group, a->head_dim,    a->kv_dim, a->block_size, a->window,  a->pos,
            a->seq,  a->block_start, a->blocks, a->tiles,      a->scale};
        cudaError_t err;
        if (a->cache_type == LLMI_T_F32)
            err = launch_prefill<LLMI_T_F32>(stream, f, a->n_tiles, a->n_head);
        else if (a->cache_type == LLMI_T_F16)
            err = launch_prefill<LLMI_T_F16>(stream, f, a->n_tiles, a->n_head);
        else if (a->cache_type == LLMI_T_BF16)
            err = launch_prefill<LLMI_T_BF16>(stream, f, a->n_tiles, a->n_head);
        else if (a->cache_type == LLMI_T_Q8_0)
            err = launch_prefill<LLMI_T_Q8_0>(stream, f, a->n_tiles, a->n_head);
        else
            err = launch_prefill<LLMI_T_FP8_E4M3>(stream, f, a->n_tiles, a->n_head);
        if (err != cudaSuccess)
            return err;
    }
    if (n_split_rows == 0)
        return cudaGetLastError();
    if (a->cache_type == LLMI_T_F32)
        launch_attention<LLMI_T_F32>(stream, p, n_split_rows, a->out, a->out_stride);
    else if (a->cache_type == LLMI_T_F16)
        launch_attention<LLMI_T_F16>(stream, p, n_split_rows, a->out, a->out_stride);
    else if (a->cache_type == LLMI_T_BF16)
        launch_attention<LLMI_T_BF16>(stream, p, n_split_rows, a->out, a->out_stride);
    else if (a->cache_type == LLMI_T_Q8_0)
        launch_attention<LLMI_T_Q8_0>(stream, p, n_split_rows, a->out, a->out_stride);
    else
        launch_attention<LLMI_T_FP8_E4M3>(stream, p, n_split_rows, a->out, a->out_stride);
    return cudaGetLastError();
}

} // namespace

extern "C" {

cudaError_t llmi_cu_attention(cudaStream_t stream, const llmi_cu_attention_args *a) {
    return attention(stream, a, false);
}

cudaError_t llmi_cu_attention_tc(cudaStream_t stream, const llmi_cu_attention_args *a) {
    return attention(stream, a, true);
}

cudaError_t llmi_cu_kv_copy_block(cudaStream_t stream, void *const *caches, uint32_t n_layers,
                                  size_t row_bytes, uint32_t block_size, uint32_t dst, uint32_t src,
                                  uint32_t n_slots) {
    if (n_slots > block_size || n_layers > 32767)
        return cudaErrorInvalidValue;
    const size_t n = (size_t)n_slots * row_bytes;
    if (n == 0 || n_layers == 0 || dst == src)
        return cudaSuccess;
    const size_t units = n % 16 ? n : n / 16;
    const uint64_t want = (units + THREADS - 1) / THREADS;
    const unsigned grid_x = (unsigned)(want < 1024 ? want : 1024);
    const size_t block_bytes = (size_t)block_size * row_bytes;
    kv_copy_kernel<<<dim3(grid_x, 2 * n_layers), THREADS, 0, stream>>>(
        caches, (size_t)dst * block_bytes, (size_t)src * block_bytes, n);
    return cudaGetLastError();
}

} // extern "C"
