/* The tensor-core prefill attention kernel (cuda/kernels.h,
 * llmi_cu_prefill_tc): FlashAttention-2 on mma.sync for F16 and BF16 KV
 * caches and heads of 64 or 128, over the same tiles as the f32 prefill
 * kernel in kernels_attention.cu (llmi_cuda_prefill_plan: up to 32 rows of
 * one sequence at consecutive positions). Off unless LLM_CUDA_ATTN_TC=1
 * (llmi_cu_attention decides; docs/cuda.md says why).
 *
 * One CTA per (tile, KV head, slice of its query heads). The M dimension
 * of the products is the tile's 32 rows for each of the CTA's query heads
 * (up to TC_MAX_HEADS of the `group` heads that share the KV head; a larger
 * group is cut into group / heads_per_cta slices along blockIdx.y, each
 * loading the KV head's chunks itself), so a K/V chunk staged in shared
 * memory serves every head of the slice. Each warp owns 16 of those rows:
 * rows warp * 16 .. + 15, i.e. query head h0 + warp / 2, tile rows
 * (warp % 2) * 16 ...
 *
 * Keys stream through in chunks of TC_KEYS positions aligned to multiples
 * of TC_KEYS (llmi_cu_prefill_chunks), their slots from the block table;
 * keys outside [first(p0), last row's position] are never read and are
 * zero in shared memory (and masked). Per chunk a warp computes its
 * 16 x 64 scores S = Q K^T with m16n8k16 mma (Q held in registers as A
 * fragments for the whole kernel, K as B fragments through ldmatrix),
 * scales them into the log2 domain, masks them per element with
 * llmi_cu_prefill_sees, and updates its rows' running max m and sum l in
 * f32 (a row's 64 scores lie in the four lanes of one quad: the row max and
 * sum reduce with __shfl_xor 1 and 2). The weights P are rounded to the
 * cache's 16-bit type in registers, where the score accumulators already
 * have the A fragment layout (llmi_cu_p_from_c), and O += P V runs with V
 * as B fragments through ldmatrix.trans. O / l is written in f32.
 *
 * Rounding: Q is rounded to the cache's type when staged, P before the
 * P V product (l sums the unrounded f32 weights); products are exact and
 * summed in f32 by the tensor cores. A row's arithmetic depends only on its
 * own query, its position and the chunks (absolute positions), never on the
 * tile it is in or its place there: chunks it sees nothing of leave its
 * state unchanged (rescale by exp2(0) = 1, weights 0).
 *
 * Loads: K and V chunks are double-buffered with cp.async (16-byte copies,
 * zero-filled for keys outside the range without reading them; each
 * thread looks its keys' slots up in the block table itself), so chunk
 * c + 1 is in flight while chunk c is multiplied. Shared memory: two
 * buffers of K and V (64 keys each), the staged queries (up to 128 rows)
 * aliasing the first, since Q moves into registers before the first chunk;
 * rows padded by 8 elements (16 bytes) so that the eight rows one
 * ldmatrix phase reads fall in distinct banks. 36 KiB for heads of 64, 68
 * KiB for heads of 128 (opted into with cudaFuncSetAttribute). */
#include "device_math.h"
#include "kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

constexpr uint32_t TC_TILE = LLMI_CU_PREFILL_TILE;
constexpr uint32_t TC_KEYS = 64;
constexpr uint32_t TC_MAX_HEADS = 4; /* query heads per CTA: 8 warps of 16 rows */
constexpr uint32_t TC_ROWS_PER_WARP = 16;
constexpr uint32_t TC_MAX_THREADS = TC_MAX_HEADS * TC_TILE / TC_ROWS_PER_WARP * 32;
constexpr uint32_t TC_PAD = 8; /* 16-bit elements of padding per shared row */
constexpr float LOG2E = 1.4426950408889634f;
static_assert(TC_TILE % TC_ROWS_PER_WARP == 0, "a warp's rows lie in one head's tile");

struct tc_params {
    const float *q;
    uint32_t q_stride;
    float *out;
    uint32_t out_stride;
    const uint16_t *k_cache, *v_cache;
    uint32_t group, heads_per_cta, kv_dim, block_size, window;
    const uint32_t *pos, *seq, *block_start, *blocks, *tiles;
    float scale_log2; /* scale * log2(e): scores in the log2 domain */
};

template <llmi_ttype T> __device__ __forceinline__ uint16_t to_b16(float x) {
    if constexpr (T == LLMI_T_F16)
        return llmi_cu_f32_to_f16(x);
    else
        return llmi_cu_f32_to_bf16(x);
}

/* lo and hi rounded to nearest even and packed (cvt.rn.{bf16,f16}x2.f32). */
template <llmi_ttype T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    if constexpr (T == LLMI_T_F16) {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *(const uint32_t *)&v;
    } else {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(const uint32_t *)&v;
    }
}

/* d += a * b for one m16n8k16 tile (f32 accumulators). */
template <llmi_ttype T>
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
    if constexpr (T == LLMI_T_F16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8 x 8 matrices of 16-bit elements; this lane's row address is p. */
__device__ __forceinline__ void ldsm_x4(const uint16_t *p, uint32_t r[4]) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(const uint16_t *p, uint32_t r[4]) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* 16 bytes from global src to shared dst, in flight until waited for;
 * valid false: 16 zero bytes, nothing read (src-size 0). */
__device__ __forceinline__ void cp_async16(uint16_t *dst, const uint16_t *src, bool valid) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* Waits until at most one group of this thread's copies is in flight. */
__device__ __forceinline__ void cp_async_wait_all_but_one() {
    asm volatile("cp.async.wait_group 1;" ::: "memory");
}

/* Shared memory of the kernel for heads of HD: two buffers of a chunk's K
 * and V (64 keys each), the staged queries (up to 128 rows) aliasing them;
 * rows padded by TC_PAD elements. */
__host__ __device__ constexpr uint32_t tc_stride(uint32_t hd) { return hd + TC_PAD; }
__host__ __device__ constexpr uint32_t tc_kv_elems(uint32_t hd) { return TC_KEYS * tc_stride(hd); }
__host__ __device__ constexpr size_t tc_smem_bytes(uint32_t hd) {
    return 2 * (TC_MAX_HEADS * TC_TILE * tc_stride(hd) > 4 * tc_kv_elems(hd)
                    ? TC_MAX_HEADS * TC_TILE * tc_stride(hd)
                    : 4 * tc_kv_elems(hd));
}

/* Starts copying chunk `chunk` (keys kb0 + 64 chunk ..) of K and V into
 * buffer buf; keys outside [kmin, kmax] become zeros without a read. */
template <uint32_t HD>
__device__ __forceinline__ void tc_issue_chunk(const tc_params &a, uint16_t *sm, uint32_t buf,
                                               uint32_t kb, uint32_t kmin, uint32_t kmax,
                                               uint32_t s, size_t kv_off) {
    constexpr uint32_t STRIDE = tc_stride(HD), VEC = HD / 8;
    uint16_t *kd = sm + 2 * buf * tc_kv_elems(HD), *vd = kd + tc_kv_elems(HD);
    for (uint32_t idx = threadIdx.x; idx < TC_KEYS * VEC; idx += blockDim.x) {
        const uint32_t j = idx / VEC, c = idx % VEC, kp = kb + j;
        const bool valid = kp >= kmin && kp <= kmax;
        const size_t e =
            valid
                ? (size_t)llmi_cu_kv_slot(a.block_start, a.blocks, a.block_size, s, kp) * a.kv_dim +
                      kv_off + 8 * c
                : 0;
        cp_async16(kd + j * STRIDE + 8 * c, a.k_cache + e, valid);
        cp_async16(vd + j * STRIDE + 8 * c, a.v_cache + e, valid);
    }
}

/* Tile blockIdx.x; KV head blockIdx.y / slices, query heads h0 .. h0 +
 * heads_per_cta - 1 of it. blockDim.x = 64 * heads_per_cta. */
template <llmi_ttype T, uint32_t HD>
__global__ void __launch_bounds__(TC_MAX_THREADS, HD <= 64 ? 2 : 1)
    attn_prefill_tc_kernel(const tc_params a) {
    constexpr uint32_t STRIDE = tc_stride(HD), KV_ELEMS = tc_kv_elems(HD);
    constexpr uint32_t KSTEPS = HD / 16; /* k-steps of Q K^T; dim-tile pairs of P V */
    constexpr uint32_t KTILES = TC_KEYS / 8, DTILES = HD / 8;
    extern __shared__ uint4 sm4[]; /* tc_smem_bytes(HD) */
    uint16_t *sm = (uint16_t *)sm4, *qs = sm;

    const uint32_t tid = threadIdx.x, nthreads = blockDim.x, warp = tid / 32, lane = tid % 32;
    const uint32_t hpc = a.heads_per_cta, slices = a.group / hpc;
    const uint32_t kvh = blockIdx.y / slices, h0 = kvh * a.group + blockIdx.y % slices * hpc;
    const uint32_t row0 = a.tiles[2 * blockIdx.x], n = a.tiles[2 * blockIdx.x + 1];
    const uint32_t p0 = a.pos[row0], s = a.seq[row0];
    const uint32_t kmin = llmi_cu_attn_first(p0, a.window), kmax = p0 + n - 1;
    const size_t kv_off = (size_t)kvh * HD;

    /* Q: CTA row m is head h0 + m / TC_TILE, tile row m % TC_TILE; rows past
     * n are zero (and see no key). */
    for (uint32_t idx = tid; idx < hpc * TC_TILE * HD; idx += nthreads) {
        const uint32_t m = idx / HD, d = idx % HD, i = m % TC_TILE;
        const float x =
            i < n ? a.q[(size_t)(row0 + i) * a.q_stride + (size_t)(h0 + m / TC_TILE) * HD + d]
                  : 0.0f;
        qs[m * STRIDE + d] = to_b16<T>(x);
    }
    __syncthreads();
    uint32_t qa[KSTEPS][4];
    {
        uint32_t r, c;
        llmi_cu_ldsm_q_src(lane, &r, &c);
        const uint16_t *src = qs + (warp * TC_ROWS_PER_WARP + r) * STRIDE + c;
#pragma unroll
        for (uint32_t k = 0; k < KSTEPS; k++)
            ldsm_x4(src + 16 * k, qa[k]);
    }
    uint32_t kb0, n_chunks;
    llmi_cu_prefill_chunks(p0, n, a.window, TC_KEYS, &kb0, &n_chunks);
    __syncthreads(); /* every warp has its Q fragments: chunk 0 may overwrite qs */
    tc_issue_chunk<HD>(a, sm, 0, kb0, kmin, kmax, s, kv_off);
    cp_async_commit();

    /* This lane's two rows (accumulator elements 0-1 and 2-3) and the key
     * columns of its accumulator elements 0 and 1 within an 8-key tile. */
    uint32_t row_i[2], col_e[2];
#pragma unroll
    for (uint32_t half = 0; half < 2; half++) {
        uint32_t r, c;
        llmi_cu_mma_c_rc(lane, 2 * half, &r, &c);
        row_i[half] = (warp * TC_ROWS_PER_WARP + r) % TC_TILE;
        llmi_cu_mma_c_rc(lane, half, &r, &c);
        col_e[half] = c;
    }
    uint32_t k_key, k_dim, v_key, v_dim;
    llmi_cu_ldsm_k_src(lane, &k_key, &k_dim);
    llmi_cu_ldsm_vt_src(lane, &v_key, &v_dim);

    float o[DTILES][4], m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
    for (uint32_t t = 0; t < DTILES; t++)
        o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;

    for (uint32_t chunk = 0; chunk < n_chunks; chunk++) {
        const uint32_t kb = kb0 + chunk * TC_KEYS;
        /* The next chunk goes to the other buffer, which every warp left at
         * the end of the previous iteration; then this chunk's copies (all
         * but the newest group) are waited for and published. */
        if (chunk + 1 < n_chunks)
            tc_issue_chunk<HD>(a, sm, (chunk + 1) % 2, kb + TC_KEYS, kmin, kmax, s, kv_off);
        cp_async_commit(); /* possibly empty: the wait below counts groups */
        cp_async_wait_all_but_one();
        __syncthreads();
        const uint16_t *ks = sm + 2 * (chunk % 2) * KV_ELEMS, *vs = ks + KV_ELEMS;
        /* Every row of the tile sees every key of the chunk: no mask to
         * evaluate. Rows past n then hold finite scores of their zero
         * queries, which are never written. */
        const bool full = llmi_cu_prefill_chunk_full(p0, n, a.window, kb, TC_KEYS);

        /* S = Q K^T: 8-key tiles t, two per ldmatrix.x4. */
        float sc[KTILES][4];
#pragma unroll
        for (uint32_t t = 0; t < KTILES; t++)
            sc[t][0] = sc[t][1] = sc[t][2] = sc[t][3] = 0.0f;
#pragma unroll
        for (uint32_t k = 0; k < KSTEPS; k++)
#pragma unroll
            for (uint32_t t = 0; t < KTILES; t += 2) {
                uint32_t b[4];
                ldsm_x4(ks + (8 * t + k_key) * STRIDE + 16 * k + k_dim, b);
                mma16816<T>(sc[t], qa[k], b[0], b[1]);
                mma16816<T>(sc[t + 1], qa[k], b[2], b[3]);
            }

        /* Masked log2-domain scores, the rows' new max, the weights. */
        float rescale[2];
#pragma unroll
        for (uint32_t half = 0; half < 2; half++) {
            float mx = m_run[half];
#pragma unroll
            for (uint32_t t = 0; t < KTILES; t++)
#pragma unroll
                for (uint32_t e = 0; e < 2; e++) {
                    const uint32_t kp = kb + 8 * t + col_e[e];
                    const bool ok = full || llmi_cu_prefill_sees(p0, n, a.window, row_i[half], kp);
                    float &x = sc[t][2 * half + e];
                    x = ok ? x * a.scale_log2 : -INFINITY;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float c = 1.0f, sum = 0.0f; /* nothing seen yet: the state stays zero */
            if (mx != -INFINITY) {
                c = m_run[half] == -INFINITY ? 0.0f : exp2f(m_run[half] - mx);
#pragma unroll
                for (uint32_t t = 0; t < KTILES; t++)
#pragma unroll
                    for (uint32_t e = 0; e < 2; e++) {
                        float &x = sc[t][2 * half + e];
                        x = exp2f(x - mx); /* a masked -inf gives 0 */
                        sum += x;
                    }
            } else {
#pragma unroll
                for (uint32_t t = 0; t < KTILES; t++)
                    sc[t][2 * half] = sc[t][2 * half + 1] = 0.0f;
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l_run[half] = l_run[half] * c + sum;
            m_run[half] = mx;
            rescale[half] = c;
        }
#pragma unroll
        for (uint32_t t = 0; t < DTILES; t++) {
            o[t][0] *= rescale[0];
            o[t][1] *= rescale[0];
            o[t][2] *= rescale[1];
            o[t][3] *= rescale[1];
        }

        /* O += P V, 16 keys (two score tiles) per k-step. */
#pragma unroll
        for (uint32_t kk = 0; kk < TC_KEYS / 16; kk++) {
            uint32_t pa[4];
#pragma unroll
            for (uint32_t r = 0; r < 4; r++) {
                uint32_t t_lo, e_lo, t_hi, e_hi;
                llmi_cu_p_from_c(r, 0, &t_lo, &e_lo);
                llmi_cu_p_from_c(r, 1, &t_hi, &e_hi);
                pa[r] = pack2<T>(sc[2 * kk + t_lo][e_lo], sc[2 * kk + t_hi][e_hi]);
            }
#pragma unroll
            for (uint32_t t = 0; t < DTILES; t += 2) {
                uint32_t b[4];
                ldsm_x4_trans(vs + (16 * kk + v_key) * STRIDE + 8 * t + v_dim, b);
                mma16816<T>(o[t], pa, b[0], b[1]);
                mma16816<T>(o[t + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads(); /* buffer chunk % 2 is free for chunk + 2 */
    }

    /* O / l for the rows this tile has (every such row saw its own key). */
#pragma unroll
    for (uint32_t half = 0; half < 2; half++) {
        uint32_t r, c;
        llmi_cu_mma_c_rc(lane, 2 * half, &r, &c);
        const uint32_t m = warp * TC_ROWS_PER_WARP + r, i = m % TC_TILE;
        if (i >= n)
            continue;
        float *dst = a.out + (size_t)(row0 + i) * a.out_stride + (size_t)(h0 + m / TC_TILE) * HD;
#pragma unroll
        for (uint32_t t = 0; t < DTILES; t++)
#pragma unroll
            for (uint32_t e = 0; e < 2; e++) {
                llmi_cu_mma_c_rc(lane, 2 * half + e, &r, &c);
                dst[8 * t + c] = o[t][2 * half + e] / l_run[half];
            }
    }
}

/* The largest divisor of group that is at most TC_MAX_HEADS: query heads
 * per CTA. */
uint32_t heads_per_cta(uint32_t group) {
    for (uint32_t h = TC_MAX_HEADS; h > 1; h--)
        if (group % h == 0)
            return h;
    return 1;
}

/* Heads of 128 take 68 KiB of shared memory: above the 48 KiB a launch
 * gets by default, so the kernel opts in (every H100/H200/A100 offers at
 * least 163 KiB a block). */
template <llmi_ttype T, uint32_t HD>
cudaError_t launch_tc(cudaStream_t stream, const tc_params &p, uint32_t n_tiles, uint32_t n_head) {
    constexpr size_t smem = tc_smem_bytes(HD);
    if (smem > 48 * 1024) {
        int dev = 0, optin = 0;
        cudaError_t err = cudaGetDevice(&dev);
        if (err == cudaSuccess)
            err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (err != cudaSuccess)
            return err;
        if (smem > (size_t)optin)
            return cudaErrorInvalidValue;
        err = cudaFuncSetAttribute(attn_prefill_tc_kernel<T, HD>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess)
            return err;
    }
    const dim3 grid(n_tiles, n_head / p.heads_per_cta);
    attn_prefill_tc_kernel<T, HD>
        <<<grid, p.heads_per_cta * TC_TILE / TC_ROWS_PER_WARP * 32, smem, stream>>>(p);
    return cudaGetLastError();
}

} // namespace

extern "C" {

bool llmi_cu_prefill_tc_takes(const llmi_cu_attention_args *a) {
    return (a->cache_type == LLMI_T_F16 || a->cache_type == LLMI_T_BF16) &&
           (a->head_dim == 64 || a->head_dim == 128) && a->kv_dim % 8 == 0 &&
           (uintptr_t)a->k_cache % 16 == 0 && (uintptr_t)a->v_cache % 16 == 0;
}

cudaError_t llmi_cu_prefill_tc(cudaStream_t stream, const llmi_cu_attention_args *a) {
    if (!llmi_cu_prefill_tc_takes(a) || a->n_head_kv == 0 || a->n_head % a->n_head_kv)
        return cudaErrorInvalidValue;
    if (a->n_tiles == 0)
        return cudaSuccess;
    tc_params p;
    p.q = a->q;
    p.q_stride = a->q_stride;
    p.out = a->out;
    p.out_stride = a->out_stride;
    p.k_cache = (const uint16_t *)a->k_cache;
    p.v_cache = (const uint16_t *)a->v_cache;
    p.group = a->n_head / a->n_head_kv;
    p.heads_per_cta = heads_per_cta(p.group);
    p.kv_dim = a->kv_dim;
    p.block_size = a->block_size;
    p.window = a->window;
    p.pos = a->pos;
    p.seq = a->seq;
    p.block_start = a->block_start;
    p.blocks = a->blocks;
    p.tiles = a->tiles;
    p.scale_log2 = a->scale * LOG2E;
    const bool f16 = a->cache_type == LLMI_T_F16;
    if (a->head_dim == 64)
        return f16 ? launch_tc<LLMI_T_F16, 64>(stream, p, a->n_tiles, a->n_head)
                   : launch_tc<LLMI_T_BF16, 64>(stream, p, a->n_tiles, a->n_head);
    return f16 ? launch_tc<LLMI_T_F16, 128>(stream, p, a->n_tiles, a->n_head)
               : launch_tc<LLMI_T_BF16, 128>(stream, p, a->n_tiles, a->n_head);
}

} // extern "C"
