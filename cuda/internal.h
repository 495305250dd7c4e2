/* Shared by the CUDA plug-in's files: the host's services (services.c,
 * handed over at load by plugin.c) and how a CUDA or cuBLASLt failure becomes a status. C and
 * CUDA C++ both include this header; it must not include the core's
 * headers that use C11 atomics (backend.h, model.h) when compiled as C++. */
#ifndef LLMI_CUDA_INTERNAL_H
#define LLMI_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "llm.h"

struct llmi_plugin_host;
/* Keeps the host's services for the calls below; plugin.c, once at load. */
void llmi_cuda_services_set(const struct llmi_plugin_host *host);

/* Records a formatted message as the caller's last error through the host
 * and returns `status`. */
llm_status llmi_cuda_error(llm_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* LLM_OK for cudaSuccess; otherwise LLM_ERR_OUT_OF_MEMORY for
 * cudaErrorMemoryAllocation and LLM_ERR_BACKEND for anything else, with a
 * message naming `what` and CUDA's own words. */
llm_status llmi_cuda_check(cudaError_t err, const char *what);
/* The message the calling thread's last llmi_cuda_error recorded. */
const char *llmi_cuda_last_message(void);
void llmi_cuda_log(llm_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));


/* services.c: whether a driver and a device are there, and how many. */
llm_status llmi_cuda_probe(void);
llm_status llmi_cuda_device_count(uint32_t *out);

#ifdef __cplusplus
}
#endif

#endif
