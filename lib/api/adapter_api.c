/* The exported LoRA adapter functions (llm.h, "LoRA adapters"). */
#include "core/core.h"
#include "model/adapter.h"

LLM_API void llm_adapter_params_init_sized(llm_adapter_params *p, size_t size) {
    llm_adapter_params d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.use_mmap = true;
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API llm_status llm_adapter_load(const llm_model *model, const char *path,
                                    const llm_adapter_params *params, llm_adapter **out) {
    if (!out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llm_adapter_load: out is NULL");
    *out = NULL;
    if (!model || !path)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llm_adapter_load: %s is NULL",
                          model ? "path" : "model");
    llm_adapter_params p;
    llm_adapter_params_init_sized(&p, sizeof p);
    LLMI_TRY(llmi_params_copy("llm_adapter_params", params, &p, sizeof p));
    return llmi_adapter_load(model, path, p.use_mmap, out);
}

LLM_API void llm_adapter_free(llm_adapter *adapter) { llmi_adapter_free(adapter); }
