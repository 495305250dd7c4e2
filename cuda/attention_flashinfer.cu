/* FlashInfer's batch prefill (the FA2-style mma.sync kernels for sm80 and
 * later, flashinfer-python 0.5.3's headers, Apache-2.0, fetched into
 * build/flashinfer by scripts/fetch-flashinfer.sh; nothing of it is in the
 * repository) over our paged KV cache, for the rows llmi_cu_attention
 * routes here with LLM_CUDA_ATTN=flashinfer. Compiled only by
 * `make cuda FLASHINFER=1`. docs/cuda.md, "FlashInfer attention".
 *
 * FlashInfer's planner (PrefillPlan) schedules on the host from host
 * copies of the requests' lengths; our launchers never read device memory
 * from the host (a step is enqueued without waiting, and may be captured),
 * and the positions live on the device. So the schedule is built on the
 * device instead (a block-wide scan for the index arrays); the page table
 * comes from our block tables (flashinfer_map.h). Two launches a layer:
 * the prefill tiles with 128-row query tiles and no KV splits (one CTA per
 * tile, query tile and KV head reads all of the tile's keys), and single
 * rows (decode) with 16-row query tiles and KV splits of
 * LLMI_CU_ATTN_SPLIT keys, merged by FlashInfer's merge kernel, so that a
 * long context is spread over the SMs as the split kernel spreads it. */
#include "attention_flashinfer.h"
#include "flashinfer_map.h"
#include "internal.h"

#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <exception>
#include <mutex>

#include <string.h>

namespace {

/* Found in the plug-in's binary by scripts/device-check.sh: the bundle was
 * built with FlashInfer. */
__attribute__((used)) const char built_marker[] = "llmi-flashinfer-attention 0.5.3";

constexpr uint32_t TILE_ROWS_CTA = 128; /* query tile of the prefill tiles' launch */
constexpr uint32_t DECODE_CTA = 16;     /* query tile of the single rows' launch */
constexpr uint32_t MAX_GROUP = 8;
constexpr uint32_t THREADS = 256;
constexpr int PLAN_THREADS = 256;

template <llmi_ttype T> struct fi_type;
template <> struct fi_type<LLMI_T_F16> {
    using type = half;
    static __device__ __forceinline__ type from(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ float to(type x) { return __half2float(x); }
};
template <> struct fi_type<LLMI_T_BF16> {
    using type = __nv_bfloat16;
    static __device__ __forceinline__ type from(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ float to(type x) { return __bfloat162float(x); }
};

/* The device's share of one launch: FlashInfer's index arrays and the
 * packed 16-bit Q and O, carved from one stream-ordered allocation. */
template <typename E> struct fi_work {
    E *q, *o;
    int32_t *q_indptr, *kv_indptr, *last_page_len, *indices;
    int32_t *request_indices, *qo_tile_indices, *kv_tile_indices, *kv_chunk_size;
    bool *valid;
    /* KV splits only: the partial rows' offsets, values and log-sum-exps. */
    int32_t *o_indptr;
    E *tmp_v;
    float *tmp_s;
};

/* A launch's shape: query tile, KV chunk (0: no splits), FlashInfer's
 * window_left. */
struct fi_shape {
    uint32_t cta_tile_q, kv_chunk;
    int32_t window_left;
};

/* One CTA: the requests' q/kv indptr, last page lengths and (KV splits)
 * partial-row offsets, llmi_fi_plan's prefix sums as block-wide scans over
 * PLAN_THREADS requests at a time. */
__global__ void __launch_bounds__(PLAN_THREADS)
    plan_kernel(llmi_fi_requests reqs, const uint32_t *pos, uint32_t block_size, fi_shape shape,
                int32_t *q_indptr, int32_t *kv_indptr, int32_t *last_page_len,
                int32_t *kv_chunk_size, uint32_t max_kv, int32_t *o_indptr) {
    using scan = cub::BlockScan<int32_t, PLAN_THREADS>;
    __shared__ typename scan::TempStorage scratch;
    __shared__ int32_t carry[3];
    if (threadIdx.x == 0) {
        carry[0] = carry[1] = carry[2] = 0;
        q_indptr[0] = kv_indptr[0] = 0;
        if (shape.kv_chunk)
            o_indptr[0] = 0;
        /* Read by the kernel always, used only with KV splits. */
        *kv_chunk_size = (int32_t)(shape.kv_chunk ? shape.kv_chunk : max_kv);
    }
    __syncthreads();
    for (uint32_t base = 0; base < reqs.n; base += PLAN_THREADS) {
        const uint32_t b = base + threadIdx.x;
        llmi_fi_counts c = {0, 0, 0, 0};
        if (b < reqs.n) {
            c = llmi_fi_request_counts(&reqs, b, pos, block_size, shape.window_left,
                                       shape.cta_tile_q, shape.kv_chunk);
            last_page_len[b] = (int32_t)c.last_page_len;
        }
        int32_t rows, pages, partials, total_rows, total_pages, total_partials;
        scan(scratch).InclusiveSum((int32_t)c.rows, rows, total_rows);
        __syncthreads();
        scan(scratch).InclusiveSum((int32_t)c.pages, pages, total_pages);
        __syncthreads();
        scan(scratch).InclusiveSum((int32_t)c.partials, partials, total_partials);
        if (b < reqs.n) {
            q_indptr[b + 1] = carry[0] + rows;
            kv_indptr[b + 1] = carry[1] + pages;
            if (shape.kv_chunk)
                o_indptr[b + 1] = carry[2] + partials;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            carry[0] += total_rows;
            carry[1] += total_pages;
            carry[2] += total_partials;
        }
        __syncthreads();
    }
}

/* One CTA a request: its page indices, its rows of Q in the cache's type,
 * and the CTAs of its query tiles (those past its rows marked invalid). */
template <llmi_ttype T>
__global__ void __launch_bounds__(THREADS)
    gather_kernel(llmi_fi_requests reqs, const float *q, uint32_t q_stride, uint32_t q_width,
                  const uint32_t *seq, const uint32_t *block_start, const uint32_t *blocks,
                  const uint32_t *pos, uint32_t block_size, uint32_t group, fi_shape shape,
                  uint32_t q_tiles_per_request, uint32_t kv_tiles_per_request,
                  fi_work<typename fi_type<T>::type> w) {
    const uint32_t b = blockIdx.x;
    const llmi_fi_run run = llmi_fi_request(&reqs, b);
    const uint32_t kv_len = llmi_fi_kv_len(pos, run), n_pages = llmi_fi_pages(kv_len, block_size);
    const int32_t page0 = w.kv_indptr[b], row0 = w.q_indptr[b];
    for (uint32_t i = threadIdx.x; i < n_pages; i += blockDim.x)
        w.indices[page0 + i] = llmi_fi_page(seq, block_start, blocks, run, i);
    for (uint32_t r = 0; r < run.n_rows; r++) {
        const float *src = q + (size_t)(run.first_row + r) * q_stride;
        typename fi_type<T>::type *dst = w.q + (size_t)(row0 + r) * q_width;
        for (uint32_t i = threadIdx.x; i < q_width; i += blockDim.x)
            dst[i] = fi_type<T>::from(src[i]);
    }
    const uint32_t per_request = q_tiles_per_request * kv_tiles_per_request;
    const uint32_t q_tiles = llmi_fi_qo_tiles(run.n_rows, group, shape.cta_tile_q);
    const uint32_t kv_tiles = shape.kv_chunk ? llmi_fi_kv_chunks(kv_len, shape.window_left,
                                                                 shape.cta_tile_q, shape.kv_chunk)
                                             : 1;
    for (uint32_t t = threadIdx.x; t < per_request; t += blockDim.x) {
        const uint32_t cta = b * per_request + t, qt = t / kv_tiles_per_request,
                       kt = t % kv_tiles_per_request;
        w.request_indices[cta] = (int32_t)b;
        w.qo_tile_indices[cta] = (int32_t)qt;
        w.kv_tile_indices[cta] = (int32_t)kt;
        w.valid[cta] = qt < q_tiles && kt < kv_tiles;
    }
}

/* The packed output back to the step's f32 rows. */
template <llmi_ttype T>
__global__ void __launch_bounds__(THREADS)
    scatter_kernel(llmi_fi_requests reqs, const typename fi_type<T>::type *o, uint32_t width,
                   const int32_t *q_indptr, float *out, uint32_t out_stride) {
    const uint32_t b = blockIdx.x;
    const llmi_fi_run run = llmi_fi_request(&reqs, b);
    const int32_t row0 = q_indptr[b];
    for (uint32_t r = 0; r < run.n_rows; r++)
        for (uint32_t i = threadIdx.x; i < width; i += blockDim.x)
            out[(size_t)(run.first_row + r) * out_stride + i] =
                fi_type<T>::to(o[(size_t)(row0 + r) * width + i]);
}

size_t align_up(size_t n) { return (n + 255) & ~(size_t)255; }

/* The workspace is a stream-ordered allocation per launch from a memory
 * pool of this file's own per device (never the default pool: its release
 * threshold is the embedding program's business). The pool keeps what it
 * was given (release threshold: everything), so it holds the largest
 * workspace a step has needed, as a workspace allocated once would, and
 * lives as long as the process. nullptr: no pool (cudaMallocAsync then). */
cudaMemPool_t workspace_pool() {
    static std::mutex lock;
    static cudaMemPool_t pools[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return nullptr;
    std::lock_guard<std::mutex> hold(lock);
    if (!pools[dev]) {
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        cudaMemPool_t pool;
        if (cudaMemPoolCreate(&pool, &props) != cudaSuccess)
            return nullptr;
        uint64_t keep = UINT64_MAX;
        (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
        pools[dev] = pool;
    }
    return pools[dev];
}

/* Causal, with the window a runtime parameter (window_left -1: none), no
 * custom mask, soft-cap or ALiBi. */
using variant = flashinfer::DefaultAttention<false, true, false, false>;

/* tmp_v, tmp_s: the partial rows of KV splits, or NULL (no splits). */
template <typename E, uint32_t CTA, uint32_t HD>
cudaError_t run_flashinfer(cudaStream_t stream,
                           flashinfer::BatchPrefillPagedParams<E, E, E, int32_t> &p, E *tmp_v,
                           float *tmp_s) {
    using params = flashinfer::BatchPrefillPagedParams<E, E, E, int32_t>;
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        CTA, HD, HD, flashinfer::PosEncodingMode::kNone, false, flashinfer::MaskMode::kCausal,
        variant, params>(p, tmp_v, tmp_s, false, stream);
}

/* One launch of FlashInfer over `reqs` (holding at most n_q_rows rows,
 * at most max_rows_a_request each; KV splits only for single rows), with
 * its plan, gather and scatter. */
template <llmi_ttype T>
cudaError_t launch(cudaStream_t stream, const llmi_cu_attention_args *a,
                   const llmi_fi_requests &reqs, uint32_t n_q_rows, uint32_t max_rows_a_request,
                   uint32_t cta_tile_q, uint32_t kv_chunk) {
    using E = typename fi_type<T>::type;
    if (reqs.n == 0)
        return cudaSuccess;
    const uint32_t group = a->n_head / a->n_head_kv, width = a->n_head * a->head_dim;
    const uint32_t max_kv = a->max_pos + 1;
    const uint64_t max_pages = llmi_fi_pages(max_kv, a->block_size);
    if (kv_chunk && max_rows_a_request != 1)
        return cudaErrorInvalidValue; /* merge_indptr below is per request */
    const fi_shape shape = {cta_tile_q, kv_chunk, llmi_fi_window_left(a->window)};
    const uint32_t q_tiles = llmi_fi_qo_tiles(max_rows_a_request, group, cta_tile_q);
    /* llmi_fi_kv_chunks grows with kv_len: max_kv's is every request's bound. */
    const uint32_t kv_tiles =
        kv_chunk ? llmi_fi_kv_chunks(max_kv, shape.window_left, cta_tile_q, kv_chunk) : 1;
    const uint64_t ctas = (uint64_t)reqs.n * q_tiles * kv_tiles;
    const uint64_t partials = kv_chunk ? (uint64_t)n_q_rows * kv_tiles : 0;
    if (ctas > 0x7fffffffu || (uint64_t)reqs.n * max_pages > 0x7fffffffu || partials > 0x7fffffffu)
        return cudaErrorInvalidValue;
    const size_t q_bytes = align_up((size_t)n_q_rows * width * sizeof(E));
    const size_t idx = sizeof(int32_t);
    const size_t sizes[] = {q_bytes,
                            q_bytes,
                            align_up(idx * (reqs.n + 1)),
                            align_up(idx * (reqs.n + 1)),
                            align_up(idx * reqs.n),
                            align_up(idx * reqs.n * max_pages),
                            align_up(idx * ctas),
                            align_up(idx * ctas),
                            align_up(idx * ctas),
                            align_up(idx),
                            align_up(ctas),
                            align_up(idx * (reqs.n + 1)),
                            align_up((size_t)partials * width * sizeof(E)),
                            align_up((size_t)partials * a->n_head * sizeof(float))};
    size_t total = 0;
    for (size_t s : sizes)
        total += s;
    char *base = nullptr;
    cudaMemPool_t pool = workspace_pool();
    cudaError_t err = pool ? cudaMallocFromPoolAsync((void **)&base, total, pool, stream)
                           : cudaMallocAsync((void **)&base, total, stream);
    if (err != cudaSuccess)
        return err;
    char *at = base;
    size_t k = 0;
    auto carve = [&]() {
        char *p = at;
        at += sizes[k++];
        return p;
    };
    fi_work<E> w;
    w.q = (E *)carve();
    w.o = (E *)carve();
    w.q_indptr = (int32_t *)carve();
    w.kv_indptr = (int32_t *)carve();
    w.last_page_len = (int32_t *)carve();
    w.indices = (int32_t *)carve();
    w.request_indices = (int32_t *)carve();
    w.qo_tile_indices = (int32_t *)carve();
    w.kv_tile_indices = (int32_t *)carve();
    w.kv_chunk_size = (int32_t *)carve();
    w.valid = (bool *)carve();
    w.o_indptr = (int32_t *)carve();
    w.tmp_v = (E *)carve();
    w.tmp_s = (float *)carve();
    if (!kv_chunk) { /* no splits: FlashInfer writes the output directly */
        w.tmp_v = nullptr;
        w.tmp_s = nullptr;
    }

    plan_kernel<<<1, PLAN_THREADS, 0, stream>>>(reqs, a->pos, a->block_size, shape, w.q_indptr,
                                                w.kv_indptr, w.last_page_len, w.kv_chunk_size,
                                                max_kv, w.o_indptr);
    gather_kernel<T><<<reqs.n, THREADS, 0, stream>>>(
        reqs, a->q, a->q_stride, width, a->seq, a->block_start, a->blocks, a->pos, a->block_size,
        group, shape, q_tiles, kv_tiles, w);
    err = cudaGetLastError();
    if (err == cudaSuccess) {
        /* NHD: page, slot, head, element; our slot is kv_dim wide. */
        const int64_t strides[3] = {(int64_t)a->block_size * a->kv_dim, (int64_t)a->kv_dim,
                                    (int64_t)a->head_dim};
        flashinfer::paged_kv_t<E, int32_t> kv(
            a->n_head_kv, a->block_size, a->head_dim, reqs.n, flashinfer::QKVLayout::kNHD,
            (E *)a->k_cache, (E *)a->v_cache, strides, w.indices, w.kv_indptr, w.last_page_len);
        flashinfer::BatchPrefillPagedParams<E, E, E, int32_t> p;
        p.q = w.q;
        p.paged_kv = kv;
        p.q_indptr = w.q_indptr;
        p.o = w.o;
        p.lse = nullptr;
        p.num_qo_heads = a->n_head;
        p.group_size = flashinfer::uint_fastdiv(group);
        p.q_stride_n = (int32_t)width;
        p.q_stride_h = (int32_t)a->head_dim;
        p.window_left = shape.window_left;
        p.sm_scale = a->scale;
        p.request_indices = w.request_indices;
        p.qo_tile_indices = w.qo_tile_indices;
        p.kv_tile_indices = w.kv_tile_indices;
        /* With splits: partial row offsets, and (one row a request) the
         * merge's rows are the requests. */
        p.o_indptr = kv_chunk ? w.o_indptr : w.q_indptr;
        p.merge_indptr = kv_chunk ? w.o_indptr : nullptr;
        p.kv_chunk_size_ptr = w.kv_chunk_size;
        p.block_valid_mask = w.valid;
        p.max_total_num_rows = n_q_rows;
        p.total_num_rows = nullptr;
        p.padded_batch_size = (uint32_t)ctas;
        p.partition_kv = false;
        try {
            E *tv = w.tmp_v;
            float *ts = w.tmp_s;
            if (a->head_dim == 64)
                err = cta_tile_q == TILE_ROWS_CTA
                          ? run_flashinfer<E, TILE_ROWS_CTA, 64>(stream, p, tv, ts)
                          : run_flashinfer<E, DECODE_CTA, 64>(stream, p, tv, ts);
            else
                err = cta_tile_q == TILE_ROWS_CTA
                          ? run_flashinfer<E, TILE_ROWS_CTA, 128>(stream, p, tv, ts)
                          : run_flashinfer<E, DECODE_CTA, 128>(stream, p, tv, ts);
        } catch (const std::exception &e) {
            llmi_cuda_log(LLM_LOG_ERROR, "FlashInfer attention: %s", e.what());
            err = cudaErrorLaunchFailure;
        }
    }
    if (err == cudaSuccess) {
        scatter_kernel<T>
            <<<reqs.n, THREADS, 0, stream>>>(reqs, w.o, width, w.q_indptr, a->out, a->out_stride);
        err = cudaGetLastError();
    }
    const cudaError_t freed = cudaFreeAsync(base, stream);
    return err != cudaSuccess ? err : freed;
}

template <llmi_ttype T>
cudaError_t attention(cudaStream_t stream, const llmi_cu_attention_args *a) {
    const bool tiled = a->n_tiles > 0;
    if (tiled) {
        const llmi_fi_requests tiles = {a->tiles, nullptr, a->n_tiles};
        const cudaError_t err =
            launch<T>(stream, a, tiles, a->n_rows, LLMI_CU_PREFILL_TILE, TILE_ROWS_CTA, 0);
        if (err != cudaSuccess)
            return err;
        const llmi_fi_requests singles = {nullptr, a->decode_rows, a->n_decode_rows};
        return launch<T>(stream, a, singles, a->n_decode_rows, 1, DECODE_CTA, LLMI_CU_ATTN_SPLIT);
    }
    const llmi_fi_requests every_row = {nullptr, nullptr, a->n_rows};
    return launch<T>(stream, a, every_row, a->n_rows, 1, DECODE_CTA, LLMI_CU_ATTN_SPLIT);
}

} // namespace

extern "C" {

bool llmi_cu_flashinfer_built(void) { return built_marker[0] != '\0'; }

llmi_fi_refusal llmi_cu_flashinfer_takes(cudaStream_t stream, const llmi_cu_attention_args *a) {
    if (a->cache_type != LLMI_T_F16 && a->cache_type != LLMI_T_BF16)
        return LLMI_FI_CACHE_TYPE;
    if (a->head_dim != 64 && a->head_dim != 128)
        return LLMI_FI_HEAD_DIM;
    if (a->n_head_kv == 0 || a->n_head % a->n_head_kv || a->n_head / a->n_head_kv > MAX_GROUP)
        return LLMI_FI_GROUP;
    if (a->kv_dim % 8 || (uintptr_t)a->k_cache % 16 || (uintptr_t)a->v_cache % 16)
        return LLMI_FI_LAYOUT;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone)
        return LLMI_FI_CAPTURING;
    return LLMI_FI_TAKES;
}

cudaError_t llmi_cu_attention_flashinfer(cudaStream_t stream, const llmi_cu_attention_args *a) {
    if (!a || llmi_cu_flashinfer_takes(stream, a) != LLMI_FI_TAKES || !a->q || !a->out || !a->pos ||
        !a->seq || !a->block_start || !a->blocks || a->block_size == 0 ||
        (uint64_t)a->n_head_kv * a->head_dim > a->kv_dim ||
        (a->n_tiles && (!a->tiles || (a->n_decode_rows && !a->decode_rows))))
        return cudaErrorInvalidValue;
    if (a->n_rows == 0)
        return cudaSuccess;
    return a->cache_type == LLMI_T_F16 ? attention<LLMI_T_F16>(stream, a)
                                       : attention<LLMI_T_BF16>(stream, a);
}

} // extern "C"
