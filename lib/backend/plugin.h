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
    /* The core's release, LLM_VERSION_NUMBER: a plug-in reads the core's
     * structs, so it refuses a core of another release (the table version
     * alone would not catch a changed struct). */
    uint32_t release;
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

/* ---- the core's loader (backend/plugin.c) ----
 * A plug-in does not call these: they are how the core finds and loads
 * plug-ins. Every message names the file and what failed. */

/* Loads the plug-in file `path` (dlopen), calls its entry with the host
 * services and registers the table it returns (llmi_backend_register).
 * Errors, each leaving nothing loaded or registered:
 *   LLM_ERR_INVALID_ARGUMENT  path NULL or "", or the registry refused a
 *                             table lacking a required entry
 *   LLM_ERR_NOT_FOUND         no file at `path` (a path with a '/')
 *   LLM_ERR_UNSUPPORTED       dlopen failed (not a shared object, a library
 *                             it needs is missing: the dlerror text), the
 *                             entry returned NULL (with the plug-in's
 *                             message), the registry refused the table's
 *                             version, or the table is named "cpu"
 *   LLM_ERR_BAD_FORMAT        the file has no LLMI_PLUGIN_INIT_SYMBOL
 * A path without '/' is searched by the dynamic loader. A loaded plug-in
 * stays loaded for the life of the process (its table is registered).
 * Thread-safe. */
llm_status llmi_backend_plugin_load(const char *path);

/* The plug-ins the core looks for by itself: backend "cuda", file
 * libllminfer-cuda.so. */
#define LLMI_PLUGIN_KNOWN 1
/* The backend name of known plug-in k (< LLMI_PLUGIN_KNOWN). */
const char *llmi_backend_plugin_known(size_t k);

/* Looks for the known plug-ins and loads them, once per process (later
 * calls return at once; thread-safe), in this order: LLM_PLUGIN_PATH (a
 * ':'-separated list of files and folders; "none" disables loading), the
 * folder of the core library (of the program, when it links the static
 * library), then the dynamic loader's search path. The first file found is
 * the one loaded. Leaves the thread's last error as it was. The registry
 * calls it (backend.c) when a backend other than the CPU is asked for. */
void llmi_backend_plugin_autoload(void);

/* Why the known plug-in `name` is not registered: not installed (and where
 * the loader looked), loading disabled, or the load error. NULL for a name
 * that is no known plug-in. Valid after llmi_backend_plugin_autoload();
 * static storage. */
const char *llmi_backend_plugin_reason(const char *name);

#endif
