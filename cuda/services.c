/* What every file of the CUDA plug-in shares, below its entry point
 * (plugin.c): the host's services (errors, logs) and how a CUDA failure
 * becomes a status, and the probe: whether this machine has a CUDA driver
 * and a device, in words a user can act on. */
#include "backend/plugin.h"
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static const llmi_plugin_host *host;

void llmi_cuda_services_set(const struct llmi_plugin_host *h) { host = h; }

/* The calling thread's last message, for code that must report a first
 * failure after later calls recorded others (tp.c). */
static _Thread_local char last_message[1024];

llm_status llmi_cuda_error(llm_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return host ? host->set_error(status, last_message) : status;
}

const char *llmi_cuda_last_message(void) { return last_message; }

void llmi_cuda_log(llm_log_level level, const char *fmt, ...) {
    if (!host)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    host->log(level, msg);
}

llm_status llmi_cuda_check(cudaError_t err, const char *what) {
    if (err == cudaSuccess)
        return LLM_OK;
    return llmi_cuda_error(
        err == cudaErrorMemoryAllocation ? LLM_ERR_OUT_OF_MEMORY : LLM_ERR_BACKEND,
        "CUDA: %s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

llm_status llmi_cuda_probe(void) {
    int driver = 0;
    cudaError_t err = cudaDriverGetVersion(&driver);
    if (err != cudaSuccess || driver == 0)
        return llmi_cuda_error(LLM_ERR_UNSUPPORTED,
                               "no CUDA driver: libcuda.so.1 was not found (install the NVIDIA "
                               "driver)");
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    if (driver < runtime)
        return llmi_cuda_error(LLM_ERR_UNSUPPORTED,
                               "the CUDA driver supports CUDA %d.%d; the plug-in was built with "
                               "CUDA %d.%d (update the NVIDIA driver)",
                               driver / 1000, driver % 1000 / 10, runtime / 1000,
                               runtime % 1000 / 10);
    int n = 0;
    err = cudaGetDeviceCount(&n);
    if (err == cudaErrorNoDevice || (err == cudaSuccess && n == 0))
        return llmi_cuda_error(LLM_ERR_UNSUPPORTED, "no CUDA device: the driver sees no GPU");
    if (err != cudaSuccess)
        return llmi_cuda_error(LLM_ERR_UNSUPPORTED, "CUDA could not list devices: %s (%s)",
                               cudaGetErrorString(err), cudaGetErrorName(err));
    return LLM_OK;
}

llm_status llmi_cuda_device_count(uint32_t *out) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    *out = err == cudaSuccess && n > 0 ? (uint32_t)n : 0;
    return LLM_OK;
}
