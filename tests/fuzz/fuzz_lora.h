/* What fuzz_lora and the corpus generator share: the base model adapters
 * are loaded for, and the input layout. */
#ifndef FUZZ_LORA_H
#define FUZZ_LORA_H

#include "model/testmodel.h"

/* The default test model (llama, 2 layers, n_embd 64, 4 heads, 2 KV heads,
 * n_ff 128) in F32. */
static inline void fuzz_lora_model_params(llmi_testmodel_params *p) {
    llmi_testmodel_params_init(p);
    p->type = LLMI_T_F32;
}

/* Input: a first byte FUZZ_LORA_GGUF then a GGUF file, or FUZZ_LORA_PEFT,
 * a little-endian uint16 config length, that many bytes of
 * adapter_config.json, then adapter_model.safetensors. */
enum { FUZZ_LORA_GGUF = 0, FUZZ_LORA_PEFT = 1 };

#endif
