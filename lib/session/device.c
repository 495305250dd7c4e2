/* Where a session runs: the experimental llm_device_params resolved to a
 * backend and a device. */
#include "backend/tp/tp.h"
#include "session/session.h"

LLM_API void llm_device_params_init_sized(llm_device_params *p, size_t size) {
    llm_device_params d = {.struct_size = sizeof d, .tensor_parallel = 1};
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API void llm_device_params_init(llm_device_params *p) {
    llm_device_params_init_sized(p, LLMI_LEGACY_DEVICE_PARAMS_SIZE);
}

static llm_status read_device_params(const llm_device_params *in, llm_device_params *p) {
    llm_device_params_init_sized(p, sizeof *p);
    return llmi_params_copy("llm_device_params", in, p, sizeof *p);
}

/* tensor_parallel > 1 runs the "tp" backend: ranks of the CPU backend as
 * threads of this process (backend/tp). Whether the model splits is checked
 * when its weights load (llmi_tp_check). */
static llm_status resolve_tensor_parallel(const llm_device_params *p, llmi_session_device *out) {
    /* "auto" has no other backend to pick until GPU ranks exist. */
    const char *base = p->backend && p->backend[0] ? p->backend : "cpu";
    if (strcmp(base, "cpu") != 0 && strcmp(base, "auto") != 0)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "tensor_parallel %u runs on CPU ranks only, not on backend '%s' "
                          "(use backend \"cpu\" or tensor_parallel 1)",
                          p->tensor_parallel, base);
    if (p->tensor_parallel > LLMI_TP_MAX)
        return llmi_error(LLM_ERR_UNSUPPORTED, "tensor_parallel %u: at most %u CPU ranks",
                          p->tensor_parallel, LLMI_TP_MAX);
    for (uint32_t i = 0; i < p->n_devices; i++)
        if (p->devices[i] != 0)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "CPU ranks run on device 0, not %d (llm_device_params.devices[%u])",
                              (int)p->devices[i], i);
    *out = (llmi_session_device){llmi_backend_tp(p->tensor_parallel), 0};
    return LLM_OK;
}

llm_status llmi_session_device_resolve(const llm_device_params *in, llmi_session_device *out) {
    *out = (llmi_session_device){NULL, 0};
    llm_device_params p;
    LLMI_TRY(read_device_params(in, &p));
    if (p.tensor_parallel == 0)
        p.tensor_parallel = 1;
    if (p.n_devices > 0 && !p.devices)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_device_params.devices is NULL with n_devices %u", p.n_devices);
    if (p.n_devices > 0 && p.n_devices != p.tensor_parallel)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_device_params lists %u devices for tensor_parallel %u (give "
                          "one device per part)",
                          p.n_devices, p.tensor_parallel);
    int32_t device = p.n_devices > 0 ? p.devices[0] : 0;
    if (p.tensor_parallel > 1)
        return resolve_tensor_parallel(&p, out);
    const llmi_backend_ops *ops;
    uint32_t n_devices;
    LLMI_TRY(llmi_backend_select(p.backend, &ops, &n_devices));
    if (device < 0 || (uint32_t)device >= n_devices) {
        if (n_devices == 1)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "backend '%s' has no device %d (it has one, id 0)", ops->name,
                              (int)device);
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "backend '%s' has no device %d (it has %u, ids 0 to %u)", ops->name,
                          (int)device, n_devices, n_devices - 1);
    }
    *out = (llmi_session_device){ops, device};
    return LLM_OK;
}
