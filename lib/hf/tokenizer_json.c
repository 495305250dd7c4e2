/* Placeholder until the tokenizer.json reader lands (it replaces this file
 * whole): folders load their tokenizer through it, so without it a folder
 * is refused with a clear message. */
#include "hf/hf.h"

llm_status llmi_hf_tokenizer_keys(const char *folder, llmi_gguf_writer *w) {
    (void)w;
    return llmi_error(LLM_ERR_UNSUPPORTED,
                      "%s/tokenizer.json: reading tokenizer.json is not "
                      "implemented in this build",
                      folder ? folder : "?");
}

llm_status llmi_hf_tokenizer_keys_from_json(const char *tokenizer_json, size_t tokenizer_len,
                                            const char *config_json, size_t config_len,
                                            llmi_gguf_writer *w) {
    (void)tokenizer_json, (void)tokenizer_len, (void)config_json, (void)config_len, (void)w;
    return llmi_error(LLM_ERR_UNSUPPORTED,
                      "tokenizer.json: reading tokenizer.json is not implemented in this build");
}
