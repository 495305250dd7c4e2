/* FlashInfer's paged attention for a layer's attention rows
 * (cuda/attention_flashinfer.cu, compiled by `make cuda FLASHINFER=1` from
 * the headers scripts/fetch-flashinfer.sh fetches; otherwise
 * cuda/attention_flashinfer_off.c, which takes nothing). Plain C: the C
 * side includes it. docs/cuda.md, "FlashInfer attention". */
#ifndef LLMI_CUDA_ATTENTION_FLASHINFER_H
#define LLMI_CUDA_ATTENTION_FLASHINFER_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Why FlashInfer does not take a layer's attention; LLMI_FI_TAKES: it does. */
typedef enum llmi_fi_refusal {
    LLMI_FI_TAKES = 0,
    LLMI_FI_NOT_BUILT,  /* the plug-in was built without FLASHINFER=1 */
    LLMI_FI_CACHE_TYPE, /* an F32 cache: FlashInfer's kernels read 16-bit K/V */
    LLMI_FI_HEAD_DIM,   /* a head size not instantiated (64 and 128 are) */
    LLMI_FI_GROUP,      /* a GQA group over 8 query heads a KV head */
    LLMI_FI_LAYOUT,     /* caches not 16-byte aligned or kv_dim not a multiple of 8 */
    LLMI_FI_CAPTURING,  /* the stream is capturing a CUDA graph */
    LLMI_FI_N_REFUSALS
} llmi_fi_refusal;

static inline const char *llmi_fi_refusal_name(llmi_fi_refusal r) {
    switch (r) {
    case LLMI_FI_TAKES:
        return "taken";
    case LLMI_FI_NOT_BUILT:
        return "the plug-in was built without FLASHINFER=1";
    case LLMI_FI_CACHE_TYPE:
        return "an F32 KV cache";
    case LLMI_FI_HEAD_DIM:
        return "a head size other than 64 or 128";
    case LLMI_FI_GROUP:
        return "more than 8 query heads a KV head";
    case LLMI_FI_LAYOUT:
        return "a KV cache not 16-byte aligned or kv_dim not a multiple of 8";
    case LLMI_FI_CAPTURING:
        return "a CUDA graph capture";
    default:
        return "unknown";
    }
}

/* Whether the plug-in was built with FlashInfer. */
bool llmi_cu_flashinfer_built(void);

/* Whether llmi_cu_attention_flashinfer takes this layer on this stream. */
llmi_fi_refusal llmi_cu_flashinfer_takes(cudaStream_t stream, const llmi_cu_attention_args *a);

/* The attention of every row of `a` (its tiles and decode rows, or every
 * row without tiles) by FlashInfer's batch prefill over our paged cache
 * (flashinfer_map.h): Q converted to the cache's 16-bit type, f32
 * softmax, the output rounded to the cache's type and written as f32 rows.
 * Enqueued on `stream` with a stream-ordered workspace of its own
 * (cudaMallocFromPoolAsync / cudaFreeAsync, from a pool per device that
 * keeps its memory for the process); the scratch of `a` is not used.
 * cudaErrorInvalidValue for a layer llmi_cu_flashinfer_takes refuses,
 * cudaErrorNotSupported without FlashInfer. */
cudaError_t llmi_cu_attention_flashinfer(cudaStream_t stream, const llmi_cu_attention_args *a);

#ifdef __cplusplus
}
#endif

#endif
