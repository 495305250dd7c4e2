/* The CUDA backend's table (backend/backend.h): instances (a device, one
 * non-blocking stream, a cuBLASLt handle and its workspace, pinned staging)
 * and KV stores (every layer's K and V in one device allocation). Weights
 * are in weights.c, steps in step.c. Every operation on a KV store goes on
 * its instance's stream, so copies, reads, writes and steps take effect in
 * the order they are issued, as the table's contract asks. */
#include "cuda_backend.h"
#include "tp.h"

#include <pthread.h>

#include <stdlib.h>
#include <string.h>

/* cuBLASLt's recommended workspace on Hopper (smaller chips need less). */
#define WORKSPACE_BYTES ((size_t)32 << 20)
/* Pinned bytes for kv_read / kv_write; larger transfers go in pieces. */
#define KV_STAGING_BYTES ((size_t)4 << 20)

llm_status llmi_cuda_use_device(int device) {
    return llmi_cuda_call(cudaSetDevice(device), "selecting the device");
}

llm_status llmi_cuda_alloc(void **out, size_t bytes, const char *what) {
    *out = NULL;
    cudaError_t err = cudaMalloc(out, bytes);
    if (err != cudaErrorMemoryAllocation)
        return llmi_cuda_call(err, what);
    cudaGetLastError(); /* not sticky: clear it for the launchers */
    *out = NULL;
    int device = -1;
    size_t free_b = 0, total_b = 0;
    cudaGetDevice(&device);
    cudaMemGetInfo(&free_b, &total_b);
    return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY,
                           "CUDA device %d is out of memory: %s needs %.1f MiB, %.1f MiB are free",
                           device, what, (double)bytes / 1048576.0, (double)free_b / 1048576.0);
}

llm_status llmi_cuda_staging_init(llmi_cuda_staging *s, size_t cap) {
    memset(s, 0, sizeof *s);
    llm_status st = llmi_cuda_call(cudaMallocHost(&s->host, cap), "allocating pinned memory");
    if (st == LLM_OK)
        st = llmi_cuda_call(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming),
                            "creating an event");
    if (st != LLM_OK) {
        llmi_cuda_staging_free(s);
        return st;
    }
    s->cap = cap;
    return LLM_OK;
}

void llmi_cuda_staging_free(llmi_cuda_staging *s) {
    if (s->done)
        cudaEventDestroy(s->done);
    if (s->host)
        cudaFreeHost(s->host);
    memset(s, 0, sizeof *s);
}

llm_status llmi_cuda_staging_wait(llmi_cuda_staging *s) {
    if (!s->pending)
        return LLM_OK;
    s->pending = false;
    return llmi_cuda_call(cudaEventSynchronize(s->done), "waiting for a copy");
}

/* ---- instance ---- */

static void cuda_close(void *backend) {
    llmi_cuda_instance *in = backend;
    if (!in)
        return;
    cudaSetDevice(in->device);
    if (in->stream)
        cudaStreamSynchronize(in->stream);
    llmi_cuda_gemm_plans_free(in);
    llmi_cuda_lora_free(in);
    llmi_cuda_staging_free(&in->staging);
    if (in->workspace)
        cudaFree(in->workspace);
    if (in->lt)
        cublasLtDestroy(in->lt);
    if (in->stream)
        cudaStreamDestroy(in->stream);
    free(in);
}

static llm_status cuda_open(const llmi_backend_config *cfg, void **out) {
    *out = NULL;
    uint32_t n = 0;
    llmi_cuda_device_count(&n);
    if (cfg->device < 0 || (uint32_t)cfg->device >= n)
        return llmi_cuda_error(LLM_ERR_INVALID_ARGUMENT,
                               "CUDA device %d does not exist (%u device%s)", (int)cfg->device, n,
                               n == 1 ? "" : "s");
    llmi_cuda_instance *in = calloc(1, sizeof *in);
    if (!in)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: CUDA backend instance");
    in->device = cfg->device;
    llm_status st = llmi_cuda_use_device(in->device);
    if (st == LLM_OK)
        st = llmi_cuda_call(cudaStreamCreateWithFlags(&in->stream, cudaStreamNonBlocking),
                            "creating a stream");
    if (st == LLM_OK)
        st = llmi_cuda_lt_check(cublasLtCreate(&in->lt), "creating the cuBLASLt handle");
    if (st == LLM_OK)
        st = llmi_cuda_alloc(&in->workspace, WORKSPACE_BYTES, "the cuBLASLt workspace");
    if (st == LLM_OK) {
        in->workspace_bytes = WORKSPACE_BYTES;
        st = llmi_cuda_staging_init(&in->staging, KV_STAGING_BYTES);
    }
    if (st != LLM_OK) {
        cuda_close(in);
        return st;
    }
    *out = in;
    return LLM_OK;
}

/* Waits for everything issued on the instance and reports an asynchronous
 * device failure (an earlier step's kernel fault surfaces here). */
static llm_status cuda_sync(void *backend) {
    llmi_cuda_instance *in = backend;
    llm_status st = llmi_cuda_use_device(in->device);
    if (st != LLM_OK)
        return st;
    return llmi_cuda_call(cudaStreamSynchronize(in->stream), "running the stream");
}

/* ---- KV store ---- */

static void cuda_kv_free(void *ctx) {
    llmi_cuda_kv *kv = ctx;
    if (!kv)
        return;
    cudaSetDevice(kv->inst->device);
    /* A step or copy still in flight may read these. */
    cudaStreamSynchronize(kv->inst->stream);
    if (kv->caches_dev)
        cudaFree(kv->caches_dev);
    if (kv->arena)
        cudaFree(kv->arena);
    free(kv->caches);
    free(kv);
}

/* The kernels' element type of a KV type they read and write; false for
 * one they do not (Q4_0, a newer core's types). */
static bool kv_ttype(llm_kv_type t, llmi_ttype *out) {
    switch (t) {
    case LLM_KV_F32:
        *out = LLMI_T_F32;
        return true;
    case LLM_KV_F16:
        *out = LLMI_T_F16;
        return true;
    case LLM_KV_BF16:
        *out = LLMI_T_BF16;
        return true;
    case LLM_KV_Q8_0:
        *out = LLMI_T_Q8_0;
        return true;
    case LLM_KV_FP8_E4M3:
        *out = LLMI_T_FP8_E4M3;
        return true;
    default:
        return false;
    }
}

/* Bytes of a slot's row of kv_dim elements of `t` (the plug-in does not
 * link core's type table); 0 when the block types' rows are not whole
 * blocks of 32. */
static size_t kv_row_bytes(llmi_ttype t, uint32_t kv_dim) {
    switch (t) {
    case LLMI_T_F32:
        return (size_t)kv_dim * 4;
    case LLMI_T_F16:
    case LLMI_T_BF16:
        return (size_t)kv_dim * 2;
    case LLMI_T_Q8_0:
        return kv_dim % LLMI_QK ? 0 : (size_t)kv_dim / LLMI_QK * sizeof(llmi_block_q8_0);
    default:
        return kv_dim % LLMI_QK ? 0 : (size_t)kv_dim / LLMI_QK * sizeof(llmi_block_fp8_e4m3);
    }
}

static llm_status cuda_kv_create(void *backend, const llmi_kv_layout *layout, void **out) {
    *out = NULL;
    llmi_cuda_instance *in = backend;
    /* The kernels read F32, F16, BF16, Q8_0 and FP8_E4M3 caches: any other
     * type (Q4_0, a newer core's types) is refused here, at session
     * creation, rather than misread. */
    llmi_ttype ttype;
    if (!kv_ttype(layout->type, &ttype))
        return llmi_cuda_error(LLM_ERR_UNSUPPORTED,
                               "the CUDA backend implements KV caches of F32, F16, BF16, Q8_0 and "
                               "FP8_E4M3, not %s (kv_type %d; it runs on the CPU backend)",
                               layout->type == LLM_KV_Q4_0 ? "Q4_0" : "this type",
                               (int)layout->type);
    /* A slot's row: kv_dim elements, or kv_dim / 32 blocks (the engine
     * checked that head_dim, hence kv_dim, is a multiple of 32). */
    const size_t row_bytes = kv_row_bytes(ttype, layout->kv_dim);
    char tbuf[32];
    if (row_bytes == 0 && layout->kv_dim != 0)
        return llmi_cuda_error(LLM_ERR_UNSUPPORTED,
                               "a %s KV cache needs rows of whole blocks of 32, not %u elements",
                               llmi_cuda_type_name(ttype, tbuf, sizeof tbuf), layout->kv_dim);
    /* One spare block past the pool's, which no sequence owns: the padding
     * rows of graph-replayed steps write their K/V there (graph.c). */
    size_t slots, layer_bytes, arena = 0, offset;
    if (layout->n_blocks == UINT32_MAX ||
        !llmi_mul_ok((size_t)layout->n_blocks + 1, layout->block_size, &slots) ||
        !llmi_mul_ok(slots, row_bytes, &layer_bytes))
        return llmi_cuda_error(LLM_ERR_LIMIT, "KV store of %u blocks overflows", layout->n_blocks);
    for (uint32_t i = 0; i < 2 * layout->n_layer; i++)
        if (!llmi_cuda_arena_add(&arena, layer_bytes, &offset))
            return llmi_cuda_error(LLM_ERR_LIMIT, "KV store of %u blocks overflows",
                                   layout->n_blocks);
    llm_status st = llmi_cuda_use_device(in->device);
    if (st != LLM_OK)
        return st;
    llmi_cuda_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: KV store");
    kv->inst = in;
    kv->layout = *layout;
    kv->type = ttype;
    kv->spare = layout->n_blocks;
    kv->row_bytes = row_bytes;
    kv->layer_bytes = layer_bytes;
    kv->caches = calloc(2 * (size_t)layout->n_layer + 1, sizeof *kv->caches);
    if (!kv->caches) {
        cuda_kv_free(kv);
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "out of memory: KV store");
    }
    if (arena)
        st = llmi_cuda_alloc(&kv->arena, arena, "the KV store");
    const size_t table_bytes = 2 * (size_t)layout->n_layer * sizeof(void *);
    if (st == LLM_OK)
        st = llmi_cuda_call(
            cudaMalloc((void **)&kv->caches_dev, table_bytes ? table_bytes : sizeof(void *)),
            "allocating the KV store");
    if (st == LLM_OK) {
        size_t end = 0;
        for (uint32_t i = 0; i < 2 * layout->n_layer; i++) {
            llmi_cuda_arena_add(&end, layer_bytes, &offset);
            kv->caches[i] = (char *)kv->arena + offset;
        }
        /* Synchronous: the host array is not pinned and is read once. */
        st = llmi_cuda_call(
            cudaMemcpy(kv->caches_dev, kv->caches, table_bytes, cudaMemcpyHostToDevice),
            "uploading the KV store's layer table");
    }
    if (st != LLM_OK) {
        cuda_kv_free(kv);
        return st;
    }
    *out = kv;
    return LLM_OK;
}

static llm_status cuda_kv_copy(void *ctx, uint32_t dst, uint32_t src, uint32_t n_slots) {
    llmi_cuda_kv *kv = ctx;
    if (n_slots == 0 || kv->layout.n_layer == 0)
        return LLM_OK;
    llm_status st = llmi_cuda_use_device(kv->inst->device);
    if (st != LLM_OK)
        return st;
    return llmi_cuda_call(llmi_cu_kv_copy_block(kv->inst->stream, kv->caches_dev,
                                                kv->layout.n_layer, kv->row_bytes,
                                                kv->layout.block_size, dst, src, n_slots),
                          "copying a KV block");
}

static char *kv_rows(const llmi_cuda_kv *kv, uint32_t layer, bool v, uint32_t slot) {
    return (char *)kv->caches[2 * (size_t)layer + (v ? 1 : 0)] + (size_t)slot * kv->row_bytes;
}

/* Device to pinned to `dst`, a staging buffer at a time, each piece waited
 * for: the read returns with its rows in `dst`. */
static llm_status cuda_kv_read(void *ctx, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                               void *dst) {
    llmi_cuda_kv *kv = ctx;
    llmi_cuda_instance *in = kv->inst;
    llmi_cuda_staging *s = &in->staging;
    LLMI_TRY(llmi_cuda_use_device(in->device));
    const char *from = kv_rows(kv, layer, v, slot);
    size_t left = (size_t)n * kv->row_bytes, done = 0;
    while (left) {
        size_t piece = left < s->cap ? left : s->cap;
        LLMI_TRY(llmi_cuda_staging_wait(s));
        LLMI_TRY(llmi_cuda_call(
            cudaMemcpyAsync(s->host, from + done, piece, cudaMemcpyDeviceToHost, in->stream),
            "reading KV rows"));
        LLMI_TRY(llmi_cuda_call(cudaStreamSynchronize(in->stream), "reading KV rows"));
        memcpy((char *)dst + done, s->host, piece);
        done += piece;
        left -= piece;
    }
    return LLM_OK;
}

/* `src` to pinned to the device; returns once `src` is no longer needed
 * (the copy itself may still be in flight, ordered on the stream). */
static llm_status cuda_kv_write(void *ctx, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                                const void *src) {
    llmi_cuda_kv *kv = ctx;
    llmi_cuda_instance *in = kv->inst;
    llmi_cuda_staging *s = &in->staging;
    LLMI_TRY(llmi_cuda_use_device(in->device));
    char *to = kv_rows(kv, layer, v, slot);
    size_t left = (size_t)n * kv->row_bytes, done = 0;
    while (left) {
        size_t piece = left < s->cap ? left : s->cap;
        LLMI_TRY(llmi_cuda_staging_wait(s));
        memcpy(s->host, (const char *)src + done, piece);
        LLMI_TRY(llmi_cuda_call(
            cudaMemcpyAsync(to + done, s->host, piece, cudaMemcpyHostToDevice, in->stream),
            "writing KV rows"));
        LLMI_TRY(llmi_cuda_call(cudaEventRecord(s->done, in->stream), "writing KV rows"));
        s->pending = true;
        done += piece;
        left -= piece;
    }
    return LLM_OK;
}

/* `lora` is set from the environment once, by llmi_cuda_table. */
static llmi_backend_ops table = {
    .version = LLMI_BACKEND_VERSION,
    .name = "cuda",
    .probe = llmi_cuda_probe,
    .open = cuda_open,
    .close = cuda_close,
    .weights_load = llmi_cuda_weights_load,
    .weights_free = llmi_cuda_weights_free,
    .kv_create = cuda_kv_create,
    .kv_free = cuda_kv_free,
    .kv_copy = cuda_kv_copy,
    .kv_read = cuda_kv_read,
    .kv_write = cuda_kv_write,
    .step_create = llmi_cuda_step_create,
    .step_free = llmi_cuda_step_free,
    .step_run = llmi_cuda_step_run,
    .sync = cuda_sync,
    .step_set_f32_activations = llmi_cuda_step_set_f32_activations,
    .device_count = llmi_cuda_device_count,
    .group = llmi_cuda_tp_group,
    .step_run_hidden = llmi_cuda_step_run_hidden,
};

/* LoRA adapters on the GPU are opt-in until they have been measured on one
 * (docs/cuda.md, "LoRA adapters"): LLM_CUDA_LORA=1 turns them on. */
static void read_lora_opt_in(void) {
    const char *v = getenv("LLM_CUDA_LORA");
    table.lora = v && strcmp(v, "1") == 0;
}

const llmi_backend_ops *llmi_cuda_table(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_lora_opt_in);
    return &table;
}
