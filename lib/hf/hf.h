/* Hugging Face checkpoint folders (config.json, *.safetensors, tokenizer.json,
 * tokenizer_config.json, generation_config.json) read as if they were a GGUF
 * file: llmi_hf_open builds an llmi_gguf whose metadata carries the keys
 * llama.cpp's converter would write (general.architecture, "<arch>.*",
 * tokenizer.ggml.*) and whose tensors carry GGUF names and point into the
 * memory-mapped safetensors files (or into buffers the llmi_gguf owns, where
 * a tensor must be transformed as the converter transforms it). The model
 * loader and the tokenizer then read a folder exactly as they read a file,
 * and a folder and its converted GGUF give the same model.
 *
 * Its own module above gguf and below tokenizer and model: it knows the
 * Hugging Face formats and the GGUF names, nothing of the forward pass. JSON
 * is parsed with cJSON. Every error names the file and the field. */
#ifndef LLMI_HF_H
#define LLMI_HF_H

#include "core/core.h"
#include "gguf/gguf.h"

#include <stdbool.h>

/* Whether `path` is a directory holding a config.json. */
bool llmi_hf_is_folder(const char *path);

/* Opens a checkpoint folder as an llmi_gguf (freed with llmi_gguf_close).
 * Errors: LLM_ERR_IO for a file that cannot be read; LLM_ERR_BAD_FORMAT for
 * malformed JSON, a missing or inconsistent config field, a safetensors
 * header whose offsets, shapes or dtypes do not check out, a shard the index
 * names that is missing; LLM_ERR_UNSUPPORTED for an architecture
 * (config.json "architectures"/"model_type") or dtype that has no mapping;
 * each message names the file and the field. */
llm_status llmi_hf_open(const char *folder, bool use_mmap, llmi_gguf **out);

/* Adds the tokenizer.ggml.* keys that llama.cpp's converter derives from
 * <folder>/tokenizer.json and <folder>/tokenizer_config.json (model, pre,
 * tokens, scores, token_type, merges, special token ids, add_bos/add_eos,
 * chat_template) to `w`. Used by llmi_hf_open; exposed for tests and the
 * fuzz target. */
llm_status llmi_hf_tokenizer_keys(const char *folder, llmi_gguf_writer *w);

/* The same from tokenizer.json and tokenizer_config.json contents already in
 * memory (config_json may be NULL). `what` names the source in messages. */
llm_status llmi_hf_tokenizer_keys_from_json(const char *tokenizer_json, size_t tokenizer_len,
                                            const char *config_json, size_t config_len,
                                            llmi_gguf_writer *w);

/* What the converter's model class adds to the tokenizer keys. Its Llama
 * class (Llama, Mistral, Mixtral, SmolLM) writes add_space_prefix from
 * tokenizer_config.json's add_prefix_space when that is given, and for a
 * 49152-token vocabulary (SmolLM, Granite small) add_bos_token false. */
typedef struct llmi_hf_vocab_rules {
    bool prefix_from_config;
    bool no_bos;
} llmi_hf_vocab_rules;

/* llmi_hf_tokenizer_keys and llmi_hf_tokenizer_keys_from_json with a
 * class's rules (NULL: none). */
llm_status llmi_hf_tokenizer_keys_rules(const char *folder, const llmi_hf_vocab_rules *rules,
                                        llmi_gguf_writer *w);
llm_status llmi_hf_tokenizer_keys_from_json_rules(const char *tokenizer_json, size_t tokenizer_len,
                                                  const char *config_json, size_t config_len,
                                                  const llmi_hf_vocab_rules *rules,
                                                  llmi_gguf_writer *w);

/* ---- PEFT LoRA adapters (adapter.c) ---- */

/* Whether `path` is a directory holding an adapter_config.json. */
bool llmi_hf_is_adapter_folder(const char *path);

/* What the base model says about the GGUF names an adapter's matrices get:
 * its architecture, and whether (and by how many heads) the rows of q and
 * k were permuted for adjacent-pair rope when it was converted. */
typedef struct llmi_hf_adapter_shape {
    const char *arch;
    bool permute_qk;
    uint32_t n_head, n_head_kv;
} llmi_hf_adapter_shape;

/* Opens a PEFT LoRA folder (adapter_config.json, adapter_model.safetensors)
 * as the GGUF llama.cpp's convert_lora_to_gguf.py makes of it: general.type
 * "adapter", adapter.type "lora", adapter.lora.alpha (alpha * sqrt(r) for
 * rsLoRA, so that alpha / rank stays the scale), and F32 tensors
 * "blk.N.<weight>.lora_a" / ".lora_b". LLM_ERR_UNSUPPORTED for options
 * beyond a plain LoRA (DoRA, rank or alpha patterns, modules_to_save, a
 * bias) or a tensor of another module; LLM_ERR_BAD_FORMAT for a malformed
 * config or weights file, or a rank that differs from the config's r. */
llm_status llmi_hf_adapter_open(const char *folder, const llmi_hf_adapter_shape *shape,
                                llmi_gguf **out);
/* The same from the two files' contents (fuzzing); nothing of them is
 * referenced afterwards. */
llm_status llmi_hf_adapter_from_memory(const char *config_json, size_t config_len,
                                       const void *weights, size_t weights_size,
                                       const llmi_hf_adapter_shape *shape, llmi_gguf **out);

#ifdef LLMI_TEST_HOOKS
/* Takes the tokenizer.* keys from this GGUF file instead of the folder's
 * tokenizer.json (NULL: from the folder again), so weight and config tests
 * do not depend on the tokenizer.json reader. */
void llmi_hf_test_tokenizer_source(const char *gguf_path);
#endif

#endif
