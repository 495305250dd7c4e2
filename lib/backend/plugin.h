/* Backends built as shared libraries (plug-ins), loaded with dlopen: the
 * CUDA backend in cuda/ is one. The core never links a GPU library; a
 * plug-in does, and the core reaches it only through its ops table
 * (backend/backend.h).
 *
 * A plug-in exports one symbol with C linkage, LLMI_PLUGIN_INIT_SYMBOL, of
 * type llmi_plugin_init_fn. The core calls it once, after dlopen, with the
 * services below, and registers the table it returns (the registry checks
 * its version and required entries). A plug-in is linked with
 * --no-undefined and calls nothing of the core but these services: the
 * core's own symbols are hidden in libllminfer.so and absent from a program
 * linked with libllminfer.a. It may read the core's structs (llm_model,
 * llmi_step, ...) and use the inline functions of the core's headers: it is
 * built from the same source release as the core that loads it. */
#ifndef LLMI_BACKEND_PLUGIN_H
#define LLMI_BACKEND_PLUGIN_H

#include "backend/backend.h"

#define LLMI_PLUGIN_HOST_VERSION 1
#define LLMI_PLUGIN_INIT_SYMBOL "llmi_backend_plugin_init"

/* What the core lends a plug-in. Fields are only appended; `version` says
 * which are valid. */
typedef struct llmi_plugin_host {
    uint32_t version; /* LLMI_PLUGIN_HOST_VERSION of the core */
    /* Records `message` as the calling thread's last error (what
     * llm_last_error() shows the user) and returns `status`. */
    llm_status (*set_error)(llm_status status, const char *message);
    /* Logs through the host's llm_log_set callback. */
    void (*log)(llm_log_level level, const char *message);
} llmi_plugin_host;

/* Returns the plug-in's table, or NULL after host->set_error when the
 * plug-in cannot serve this core (a host version it does not know). The
 * host outlives the plug-in. */
typedef const llmi_backend_ops *(*llmi_plugin_init_fn)(const llmi_plugin_host *host);

#endif
