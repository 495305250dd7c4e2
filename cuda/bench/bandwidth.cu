/* cuda-bench-bandwidth: the floors the GPU figures of `make device-check`
 * are compared with (docs/device-check.md), measured on this device:
 *
 *   memcpy_gbs    cudaMemcpyAsync device to device; counts bytes read plus
 *                 bytes written (2 x size per copy)
 *   read_gbs      a kernel that reads every byte once (16-byte loads,
 *                 grid-stride) and writes one word per block: bytes read
 *   gemm_tflops   cuBLASLt bf16 GEMM, M = N = K = 8192 by default, f32
 *                 accumulation, A transposed ("TN", the layout of weights
 *                 stored row-major): 2 M N K flops per GEMM
 *
 * Each figure is the best of --reps timed rounds (CUDA events around
 * --iters launches each) after one untimed round. Prints one JSON object
 * to stdout. Standalone: it links the CUDA runtime and cuBLASLt, not the
 * library. Exit status: 0 ok, 1 usage, 2 no device or a CUDA failure. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

struct options {
    size_t size_mb = 2048;
    int gemm_n = 8192;
    int reps = 5;
    int iters = 10;
    int device = 0;
};

bool fail_cuda(cudaError_t err, const char *what) {
    if (err == cudaSuccess)
        return false;
    fprintf(stderr, "cuda-bench-bandwidth: %s: %s (%s)\n", what, cudaGetErrorString(err),
            cudaGetErrorName(err));
    return true;
}

bool fail_lt(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return false;
    fprintf(stderr, "cuda-bench-bandwidth: cuBLASLt %s: status %d\n", what, (int)st);
    return true;
}

#define CK(call, what)                                                                             \
    do {                                                                                           \
        if (fail_cuda((call), what))                                                               \
            return false;                                                                          \
    } while (0)
#define CKL(call, what)                                                                            \
    do {                                                                                           \
        if (fail_lt((call), what))                                                                 \
            return false;                                                                          \
    } while (0)

/* Device memory and cuBLASLt objects freed on every path out. */
struct dev_buf {
    void *p = nullptr;
    ~dev_buf() { cudaFree(p); }
};
struct lt_objects {
    cublasLtHandle_t lt = nullptr;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~lt_objects() {
        if (pref)
            cublasLtMatmulPreferenceDestroy(pref);
        if (a)
            cublasLtMatrixLayoutDestroy(a);
        if (b)
            cublasLtMatrixLayoutDestroy(b);
        if (c)
            cublasLtMatrixLayoutDestroy(c);
        if (desc)
            cublasLtMatmulDescDestroy(desc);
        if (lt)
            cublasLtDestroy(lt);
    }
};
struct events {
    cudaEvent_t a = nullptr, b = nullptr;
    ~events() {
        if (a)
            cudaEventDestroy(a);
        if (b)
            cudaEventDestroy(b);
    }
};

__global__ void read_kernel(const uint4 *__restrict__ src, size_t n, unsigned *__restrict__ out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    /* One store per block keeps the loads alive and costs nothing. */
    __shared__ unsigned red[1024];
    red[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned t = 1; t < blockDim.x; t++)
            acc ^= red[t];
        out[blockIdx.x] = acc;
    }
}

/* Values in [-1, 1) from the index: GEMM power, hence clocks, depends on
 * the data, so zeros would flatter the rate. */
__global__ void fill_bf16(__nv_bfloat16 *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = __float2bfloat16((float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f);
    }
}

/* Best seconds per launch of `launch` over reps rounds of iters. */
template <typename F> bool time_best(const options &o, cudaStream_t s, F launch, double *best) {
    events ev;
    CK(cudaEventCreate(&ev.a), "cudaEventCreate");
    CK(cudaEventCreate(&ev.b), "cudaEventCreate");
    *best = 1e30;
    bool ok = true;
    for (int r = -1; ok && r < o.reps; r++) {
        ok = !fail_cuda(cudaEventRecord(ev.a, s), "cudaEventRecord");
        for (int i = 0; ok && i < o.iters; i++)
            ok = launch();
        ok = ok && !fail_cuda(cudaEventRecord(ev.b, s), "cudaEventRecord") &&
             !fail_cuda(cudaEventSynchronize(ev.b), "the timed launches");
        float ms = 0;
        ok = ok && !fail_cuda(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime");
        if (ok && r >= 0 && ms * 1e-3 / o.iters < *best)
            *best = ms * 1e-3 / o.iters;
    }
    return ok;
}

bool bandwidth(const options &o, cudaStream_t s, double *memcpy_gbs, double *read_gbs) {
    size_t bytes = o.size_mb << 20;
    dev_buf src, dst, out;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, o.device), "SM count");
    int blocks = sms * 8, threads = 512;
    bool ok = !fail_cuda(cudaMalloc(&src.p, bytes), "cudaMalloc (source)") &&
              !fail_cuda(cudaMalloc(&dst.p, bytes), "cudaMalloc (destination)") &&
              !fail_cuda(cudaMalloc(&out.p, blocks * sizeof(unsigned)), "cudaMalloc") &&
              !fail_cuda(cudaMemsetAsync(src.p, 0x5a, bytes, s), "cudaMemset");
    double t = 0;
    ok = ok && time_best(
                   o, s,
                   [&] {
                       return !fail_cuda(
                           cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, s),
                           "cudaMemcpyAsync");
                   },
                   &t);
    if (ok)
        *memcpy_gbs = 2.0 * (double)bytes / t * 1e-9;
    ok = ok && time_best(
                   o, s,
                   [&] {
                       read_kernel<<<blocks, threads, 0, s>>>((const uint4 *)src.p, bytes / 16,
                                                              (unsigned *)out.p);
                       return !fail_cuda(cudaGetLastError(), "read kernel launch");
                   },
                   &t);
    if (ok)
        *read_gbs = (double)bytes / t * 1e-9;
    return ok;
}

bool gemm(const options &o, cudaStream_t s, double *tflops) {
    const int64_t n = o.gemm_n;
    const size_t elems = (size_t)n * n, ws_bytes = 64u << 20;
    dev_buf a, b, c, ws;
    CK(cudaMalloc(&a.p, elems * 2), "cudaMalloc (A)");
    CK(cudaMalloc(&b.p, elems * 2), "cudaMalloc (B)");
    CK(cudaMalloc(&c.p, elems * 2), "cudaMalloc (C)");
    CK(cudaMalloc(&ws.p, ws_bytes), "cudaMalloc (workspace)");
    fill_bf16<<<1024, 256, 0, s>>>((__nv_bfloat16 *)a.p, elems, 1);
    fill_bf16<<<1024, 256, 0, s>>>((__nv_bfloat16 *)b.p, elems, 2);
    CK(cudaGetLastError(), "fill kernel launch");

    lt_objects lo;
    CKL(cublasLtCreate(&lo.lt), "create");
    CKL(cublasLtMatmulDescCreate(&lo.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CKL(cublasLtMatmulDescSetAttribute(lo.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
        "transa");
    CKL(cublasLtMatmulDescSetAttribute(lo.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
        "transb");
    CKL(cublasLtMatrixLayoutCreate(&lo.a, CUDA_R_16BF, n, n, n), "layout A");
    CKL(cublasLtMatrixLayoutCreate(&lo.b, CUDA_R_16BF, n, n, n), "layout B");
    CKL(cublasLtMatrixLayoutCreate(&lo.c, CUDA_R_16BF, n, n, n), "layout C");
    CKL(cublasLtMatmulPreferenceCreate(&lo.pref), "preference");
    size_t wsb = ws_bytes;
    CKL(cublasLtMatmulPreferenceSetAttribute(lo.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &wsb, sizeof wsb),
        "workspace preference");
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CKL(cublasLtMatmulAlgoGetHeuristic(lo.lt, lo.desc, lo.a, lo.b, lo.c, lo.c, lo.pref, 1, &heur,
                                       &found),
        "heuristic");
    if (!found) {
        fprintf(stderr, "cuda-bench-bandwidth: cuBLASLt has no bf16 algorithm for %lldx%lld\n",
                (long long)n, (long long)n);
        return false;
    }
    const float alpha = 1.0f, beta = 0.0f;
    double t = 0;
    bool ok = time_best(
        o, s,
        [&] {
            return !fail_lt(cublasLtMatmul(lo.lt, lo.desc, &alpha, a.p, lo.a, b.p, lo.b, &beta, c.p,
                                           lo.c, c.p, lo.c, &heur.algo, ws.p, ws_bytes, s),
                            "matmul");
        },
        &t);
    if (ok)
        *tflops = 2.0 * (double)n * n * n / t * 1e-12;
    return ok;
}

bool parse(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v = i + 1 < argc ? strtol(argv[i + 1], nullptr, 10) : 0;
        if (v <= 0)
            return false;
        if (!strcmp(a, "--size-mb"))
            o->size_mb = (size_t)v;
        else if (!strcmp(a, "--gemm-n") && v % 16 == 0)
            o->gemm_n = (int)v;
        else if (!strcmp(a, "--reps"))
            o->reps = (int)v;
        else if (!strcmp(a, "--iters"))
            o->iters = (int)v;
        else
            return false;
        i++;
    }
    return true;
}

} // namespace

int main(int argc, char **argv) {
    options o;
    if (!parse(argc, argv, &o)) {
        fprintf(stderr, "usage: cuda-bench-bandwidth [--size-mb MB (2048)] [--gemm-n N (8192)]\n"
                        "                            [--reps R (5)] [--iters I (10)]\n");
        return 1;
    }
    int n_dev = 0;
    cudaError_t err = cudaGetDeviceCount(&n_dev);
    if (err != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "cuda-bench-bandwidth: no CUDA device: %s\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "the driver sees no GPU");
        return 2;
    }
    cudaDeviceProp prop;
    cudaStream_t s;
    if (fail_cuda(cudaSetDevice(o.device), "cudaSetDevice") ||
        fail_cuda(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties") ||
        fail_cuda(cudaStreamCreate(&s), "cudaStreamCreate"))
        return 2;
    double memcpy_gbs = 0, read_gbs = 0, tflops = 0;
    if (!bandwidth(o, s, &memcpy_gbs, &read_gbs) || !gemm(o, s, &tflops))
        return 2;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    printf("{\"device\": \"%s\", \"sm\": \"%d.%d\", \"memory_gib\": %.1f, \"driver_cuda\": %d, "
           "\"runtime_cuda\": %d, \"size_mb\": %zu, \"memcpy_gbs\": %.1f, "
           "\"memcpy_counts\": \"read+write\", \"read_gbs\": %.1f, \"read_counts\": \"read\", "
           "\"gemm\": \"bf16 TN %dx%dx%d f32 accumulate\", \"gemm_tflops\": %.1f}\n",
           prop.name, prop.major, prop.minor, (double)prop.totalGlobalMem / (1ull << 30), driver,
           runtime, o.size_mb, memcpy_gbs, read_gbs, o.gemm_n, o.gemm_n, o.gemm_n, tflops);
    cudaStreamDestroy(s);
    return 0;
}
