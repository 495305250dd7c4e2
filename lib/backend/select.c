/* Choosing a backend by name, as users do (llm_device_params.backend,
 * llm_backend_get_info): the registry (backend.c) plus the plug-in loader
 * (plugin.c), which this file asks to look for the known plug-ins first. */
#include "backend/backend.h"
#include "backend/plugin.h"

#include <stdio.h>

/* ---- looking up a name ---- */

/* A plug-in's name asks for it: the plug-ins are looked for first. */
static void autoload_for(const char *name) {
    for (size_t k = 0; name && k < LLMI_PLUGIN_KNOWN; k++)
        if (strcmp(name, llmi_backend_plugin_known(k)) == 0)
            llmi_backend_plugin_autoload();
}

const llmi_backend_ops *llmi_backend_find(const char *name) {
    if (!name)
        return NULL;
    autoload_for(name);
    /* Tables stay valid once registered (plug-ins are never closed). */
    const llmi_backend_ops *ops[LLMI_BACKEND_MAX];
    size_t n = llmi_backend_list(ops, LLMI_BACKEND_MAX);
    for (size_t i = 0; i < n && i < LLMI_BACKEND_MAX; i++)
        if (strcmp(ops[i]->name, name) == 0)
            return ops[i];
    return NULL;
}

/* Known plug-ins that are not registered are listed too, as unavailable
 * with the reason (backend/plugin.c: not installed, or why loading failed),
 * so users see what they could run on. */
enum { N_KNOWN = LLMI_PLUGIN_KNOWN };

/* The registered backends, and the known plug-ins not among them. */
static size_t snapshot(const llmi_backend_ops **ops, const char **missing, size_t *n_missing) {
    size_t n = llmi_backend_list(ops, LLMI_BACKEND_MAX);
    if (n > LLMI_BACKEND_MAX)
        n = LLMI_BACKEND_MAX;
    *n_missing = 0;
    for (size_t k = 0; k < N_KNOWN; k++) {
        const char *name = llmi_backend_plugin_known(k);
        bool registered = false;
        for (size_t i = 0; i < n; i++)
            registered |= strcmp(ops[i]->name, name) == 0;
        if (!registered)
            missing[(*n_missing)++] = name;
    }
    return n;
}

/* Probes a registered backend: available with its device count, or not,
 * with the reason in out->reason. Leaves the thread's last error alone. */
static void probe(const llmi_backend_ops *ops, llmi_backend_state *out) {
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", llmi_error_message());
    llmi_error_clear();
    *out = (llmi_backend_state){.name = ops->name, .ops = ops};
    uint32_t n = 1;
    llm_status st = ops->probe ? ops->probe() : LLM_OK;
    if (st == LLM_OK && ops->version >= 2 && ops->device_count)
        st = ops->device_count(&n);
    if (st != LLM_OK)
        snprintf(out->reason, sizeof out->reason, "%s",
                 *llmi_error_message() ? llmi_error_message() : "its probe failed");
    else if (n == 0)
        snprintf(out->reason, sizeof out->reason, "no device found");
    else {
        out->available = true;
        out->n_devices = n;
    }
    llmi_error_restore(saved);
}

size_t llmi_backend_state_count(void) {
    llmi_backend_plugin_autoload();
    const llmi_backend_ops *ops[LLMI_BACKEND_MAX];
    const char *missing[N_KNOWN];
    size_t n_missing;
    size_t n = snapshot(ops, missing, &n_missing);
    return n + n_missing;
}

llm_status llmi_backend_state_get(size_t index, llmi_backend_state *out) {
    llmi_backend_plugin_autoload();
    const llmi_backend_ops *ops[LLMI_BACKEND_MAX];
    const char *missing[N_KNOWN];
    size_t n_missing;
    size_t n = snapshot(ops, missing, &n_missing);
    if (index < n) {
        probe(ops[index], out);
        return LLM_OK;
    }
    if (index - n < n_missing) {
        const char *name = missing[index - n];
        *out = (llmi_backend_state){.name = name};
        snprintf(out->reason, sizeof out->reason, "%s", llmi_backend_plugin_reason(name));
        return LLM_OK;
    }
    return llmi_error(LLM_ERR_NOT_FOUND, "no backend at index %zu; there are %zu", index,
                      n + n_missing);
}

/* "cpu, cuda (not available), ..." for messages. */
static void list_names(char *buf, size_t cap) {
    const llmi_backend_ops *ops[LLMI_BACKEND_MAX];
    const char *missing[N_KNOWN];
    size_t n_missing, len = 0;
    size_t n = snapshot(ops, missing, &n_missing);
    buf[0] = '\0';
    for (size_t i = 0; i < n + n_missing && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s'%s'%s", i ? ", " : "",
                         i < n ? ops[i]->name : missing[i - n], i < n ? "" : " (not loaded)");
        if (w < 0)
            break;
        len += (size_t)w;
    }
}

/* "auto": the first available backend other than the CPU, else the CPU. */
static llm_status select_auto(const llmi_backend_ops **out, uint32_t *n_devices) {
    const llmi_backend_ops *ops[LLMI_BACKEND_MAX];
    const char *missing[N_KNOWN];
    size_t n_missing;
    size_t n = snapshot(ops, missing, &n_missing);
    llmi_backend_state st;
    for (size_t i = 0; i < n; i++) {
        if (ops[i] == &llmi_backend_cpu)
            continue;
        probe(ops[i], &st);
        if (st.available) {
            llmi_log(LLM_LOG_INFO, "backend 'auto' chose '%s' (%u device%s)", st.name, st.n_devices,
                     st.n_devices == 1 ? "" : "s");
            *out = ops[i];
            *n_devices = st.n_devices;
            return LLM_OK;
        }
        llmi_log(LLM_LOG_INFO, "backend 'auto' skipped '%s': %s", st.name, st.reason);
    }
    for (size_t k = 0; k < n_missing; k++)
        llmi_log(LLM_LOG_INFO, "backend 'auto' skipped '%s': %s", missing[k],
                 llmi_backend_plugin_reason(missing[k]));
    llmi_log(LLM_LOG_INFO, "backend 'auto' chose 'cpu'");
    *out = &llmi_backend_cpu;
    *n_devices = 1;
    return LLM_OK;
}

llm_status llmi_backend_select(const char *name, const llmi_backend_ops **out,
                               uint32_t *n_devices) {
    *out = NULL;
    *n_devices = 0;
    if (!name || !*name)
        name = llmi_backend_cpu.name;
    /* Sessions on the CPU never open a plug-in; any other name may be one,
     * and its message lists them. */
    if (strcmp(name, llmi_backend_cpu.name) != 0)
        llmi_backend_plugin_autoload();
    if (strcmp(name, "auto") == 0)
        return select_auto(out, n_devices);
    const llmi_backend_ops *ops = llmi_backend_find(name);
    if (!ops) {
        const char *why = llmi_backend_plugin_reason(name);
        if (why)
            return llmi_error(LLM_ERR_UNSUPPORTED, "backend '%s' is not available: %s", name, why);
        char names[512];
        list_names(names, sizeof names);
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "no backend named '%s'; the backends are %s, or 'auto'", name, names);
    }
    llmi_backend_state st;
    probe(ops, &st);
    if (!st.available)
        return llmi_error(LLM_ERR_UNSUPPORTED, "backend '%s' is not available: %s", name,
                          st.reason);
    *out = ops;
    *n_devices = st.n_devices;
    return LLM_OK;
}
