/* The CUDA plug-in's entry point (backend/plugin.h): the top of the
 * plug-in. It hands the host's services to services.c, which every other
 * file uses, and returns the table of backend.c. */
#include "backend/plugin.h"
#include "internal.h"

/* backend.c */
const llmi_backend_ops *llmi_cuda_table(void);

__attribute__((visibility("default"))) const llmi_backend_ops *
llmi_backend_plugin_init(const llmi_plugin_host *h) {
    if (!h || h->version < 1)
        return NULL;
    llmi_cuda_services_set(h);
    if (h->release != LLM_VERSION_NUMBER) {
        llmi_cuda_error(LLM_ERR_UNSUPPORTED,
                        "the CUDA plug-in is from libllminfer %d.%d.%d and this library is "
                        "%u.%u.%u: install the plug-in of the library's own release",
                        LLM_VERSION_MAJOR, LLM_VERSION_MINOR, LLM_VERSION_PATCH, h->release / 10000,
                        h->release / 100 % 100, h->release % 100);
        return NULL;
    }
    return llmi_cuda_table();
}
