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

/* tensor_parallel > 1 on the CPU runs the "tp" backend: ranks of the CPU
 * backend as threads of this process (backend/tp). Whether the model
 * splits is checked when its weights load (llmi_tp_check). */
static llm_status cpu_ranks(const llm_device_params *p, llmi_session_device *out) {
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

static bool offers_groups(const llmi_backend_ops *ops) {
    return ops->version >= 3 && ops->group;
}

/* A group of the backend's devices (its `group` entry): the devices the
 * caller lists, else 0 .. N-1, distinct and each one the backend has. */
static llm_status device_group(const llm_device_params *p, const llmi_backend_ops *ops,
                               uint32_t n_devices, llmi_session_device *out) {
    const uint32_t n = p->tensor_parallel;
    if (n > n_devices)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "tensor_parallel %u on backend '%s' needs %u devices; it has %u", n,
                          ops->name, n, n_devices);
    int32_t *ids = llmi_malloc((size_t)n * sizeof *ids);
    if (!ids)
        return llmi_oom("device list");
    llm_status st = LLM_OK;
    for (uint32_t r = 0; r < n && st == LLM_OK; r++) {
        ids[r] = p->n_devices ? p->devices[r] : (int32_t)r;
        if (ids[r] < 0 || (uint32_t)ids[r] >= n_devices)
            st = llmi_error(LLM_ERR_INVALID_ARGUMENT,
                            "backend '%s' has no device %d (it has %u, ids 0 to %u; "
                            "llm_device_params.devices[%u])",
                            ops->name, (int)ids[r], n_devices, n_devices - 1, r);
        for (uint32_t k = 0; k < r && st == LLM_OK; k++)
            if (ids[k] == ids[r])
                st = llmi_error(LLM_ERR_INVALID_ARGUMENT,
                                "device %d is listed twice (llm_device_params.devices[%u] and "
                                "[%u]): each rank needs a device of its own",
                                (int)ids[r], k, r);
    }
    const llmi_backend_ops *group = NULL;
    if (st == LLM_OK)
        st = ops->group(n, ids, &group);
    llmi_free(ids);
    if (st != LLM_OK)
        return st;
    if (!group)
        return llmi_error(LLM_ERR_INTERNAL, "backend '%s' offered an empty group", ops->name);
    *out = (llmi_session_device){group, 0};
    return LLM_OK;
}

/* tensor_parallel > 1: CPU ranks for "cpu" (and for "auto" when what it
 * picks offers no groups, or too few devices), else a group of the chosen
 * backend's devices. */
static llm_status resolve_tensor_parallel(const llm_device_params *p, llmi_session_device *out) {
    const char *name = p->backend && p->backend[0] ? p->backend : "cpu";
    if (strcmp(name, "cpu") == 0)
        return cpu_ranks(p, out);
    const llmi_backend_ops *ops;
    uint32_t n_devices;
    LLMI_TRY(llmi_backend_select(name, &ops, &n_devices));
    const bool is_auto = strcmp(name, "auto") == 0;
    if (offers_groups(ops) && (!is_auto || n_devices >= p->tensor_parallel))
        return device_group(p, ops, n_devices, out);
    if (is_auto) {
        llmi_log(LLM_LOG_INFO,
                 "tensor_parallel %u: backend 'auto' runs CPU ranks ('%s' %s)",
                 p->tensor_parallel, ops->name,
                 offers_groups(ops) ? "has too few devices" : "offers no device groups");
        return cpu_ranks(p, out);
    }
    return llmi_error(LLM_ERR_UNSUPPORTED,
                      "tensor_parallel %u: backend '%s' does not split a model across devices "
                      "(use backend \"cpu\" for CPU ranks, or tensor_parallel 1)",
                      p->tensor_parallel, ops->name);
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
