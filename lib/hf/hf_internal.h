/* What the files of lib/hf share: the safetensors reader and the
 * config.json mapping. Nothing outside lib/hf (and its tests and fuzz
 * target) includes it. */
#ifndef LLMI_HF_INTERNAL_H
#define LLMI_HF_INTERNAL_H

#include "hf/hf.h"

#include <stdbool.h>

/* Safetensors headers beyond this are refused (the reference implementation's
 * bound), so a hostile length cannot make us parse gigabytes of JSON. */
#define LLMI_ST_MAX_HEADER (100u * 1000u * 1000u)

typedef struct llmi_st_tensor {
    char *name;
    llmi_ttype type;     /* F32, F16 or BF16 */
    uint32_t n_dims;     /* 1..4 */
    uint64_t shape[4];   /* as the file lists it: shape[n_dims - 1] is contiguous */
    const uint8_t *data; /* inside the file's memory */
    size_t nbytes;
} llmi_st_tensor;

/* One .safetensors file: its memory (mapped or read) and its tensors,
 * sorted by name. */
typedef struct llmi_st_file {
    const uint8_t *base;
    size_t size;
    void *map; /* mmap'd (size bytes), or NULL */
    void *buf; /* llmi_malloc_aligned copy, or NULL */
    llmi_st_tensor *tensors;
    size_t n_tensors;
} llmi_st_file;

/* LLM_ERR_BAD_FORMAT naming `what` and the byte when JSON text holds a NUL,
 * raw or as the escape \u0000. cJSON's strings end at a NUL, so a name or
 * value holding one would be read cut short, as something the file does
 * not say; no field of these formats has a use for it. Byte numbers in
 * the message count from `base` (where the text starts in its file). */
llm_status llmi_hf_json_check_nul(const char *what, const char *json, size_t len, size_t base);

/* Reads folder/name (a JSON side file, at most 64 MiB) NUL-terminated,
 * refusing a NUL inside; *absent (when non-NULL) reports a missing file as
 * LLM_OK with *data NULL. *data is freed with llmi_free. */
llm_status llmi_hf_read_text(const char *folder, const char *name, bool *absent, char **data,
                             size_t *len);

/* Checks and indexes a safetensors image: the 8-byte header length, the
 * JSON header, every tensor's dtype, shape and data_offsets (inside the
 * data section, sizes agreeing, no overlaps, no duplicate names;
 * __metadata__ ignored). `what` names the file in messages. On success
 * *tensors (sorted by name) is freed with llmi_st_tensors_free. */
llm_status llmi_st_parse(const void *data, size_t size, const char *what, llmi_st_tensor **tensors,
                         size_t *n_tensors);
void llmi_st_tensors_free(llmi_st_tensor *t, size_t n);
/* Binary search in a sorted table; NULL when absent. */
const llmi_st_tensor *llmi_st_find(const llmi_st_tensor *t, size_t n, const char *name);

/* Opens and parses `path` (mapped when use_mmap, else read into aligned
 * memory); `what` names it in messages. */
llm_status llmi_st_open(const char *path, const char *what, bool use_mmap, llmi_st_file *f);
/* Frees the table and the memory still held (a mapping or buffer handed
 * to llmi_gguf_parts is set to NULL by the caller first). */
void llmi_st_close(llmi_st_file *f);

/* How a Hugging Face model class maps onto GGUF: the converter's choices. */
typedef enum llmi_hf_family {
    LLMI_HF_LLAMA,
    LLMI_HF_MISTRAL,
    LLMI_HF_QWEN2,
    LLMI_HF_QWEN3,
    LLMI_HF_GEMMA3,
    LLMI_HF_PHI3,
    LLMI_HF_QWEN3MOE,
    LLMI_HF_MIXTRAL,
    LLMI_HF_BERT, /* BertModel: an encoder (its own tensor names) */
} llmi_hf_family;

/* config.json, checked. Sizes are those the converter writes as
 * "<arch>.*" keys; head_dim is config's or hidden_size / heads. */
typedef struct llmi_hf_config {
    llmi_hf_family family;
    const char *arch;           /* GGUF general.architecture */
    bool permute_qk;            /* q/k rows reordered for adjacent-pair rope (Llama) */
    bool norm_plus_one;         /* norm weights stored as w - 1 (Gemma) */
    bool post_attn_is_ffn_norm; /* post_attention_layernorm is the pre-FFN norm */
    uint32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx;
    uint32_t n_token_types; /* BERT: type_vocab_size */
    bool explicit_head_dim, explicit_head_kv;
    float rms_eps, rope_theta;
    bool tie_embeddings;
    uint32_t sliding_window;                    /* 0: none */
    uint32_t n_expert, n_expert_used, n_ff_exp; /* MoE only */
    /* rope_scaling type "llama3" (Llama 3.1/3.2): becomes rope_freqs.weight */
    bool rope_llama3;
    /* rope_scaling type "linear": <arch>.rope.scaling.type/.factor (rope_factor) */
    bool rope_linear;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_orig_ctx;
} llmi_hf_config;

/* Parses config.json's text; messages name "config.json" and the field. */
llm_status llmi_hf_config_parse(const char *json, size_t len, llmi_hf_config *c);
/* Writes general.architecture and the "<arch>.*" keys. */
llm_status llmi_hf_config_write(const llmi_hf_config *c, llmi_gguf_writer *w);

/* The rope_freqs.weight factors (head_dim / 2 of them) llama.cpp's
 * converter computes for rope_scaling type "llama3": each pair's angle is
 * divided by 1 (high frequencies), by `factor` (low) or by a smooth blend
 * between; float32 arithmetic in the converter's order, so the values are
 * bitwise the converter's. */
void llmi_hf_llama3_rope_factors(const llmi_hf_config *c, float *out);

/* One checkpoint tensor and the file it is in (for messages). */
typedef struct llmi_hf_source {
    const char *name;
    const llmi_st_tensor *t;
    const char *file;
} llmi_hf_source;

/* Adds every source tensor to `parts` under its GGUF name, checked against
 * the config's sizes and transformed as the converter transforms it (q/k
 * rows permuted, vectors widened to F32, Gemma norms + 1, experts stacked);
 * untransformed matrices point into the files' memory. *file_type gets
 * general.file_type from token_embd's type. */
llm_status llmi_hf_map_tensors(const llmi_hf_config *c, const llmi_hf_source *src, size_t n,
                               llmi_gguf_parts *parts, uint32_t *file_type);

/* tokenizer_wordpiece.c: a WordPiece tokenizer.json (BertNormalizer or
 * none, BertPreTokenizer) -> tokenizer.wordpiece.* options. */
typedef struct llmi_hf_wordpiece {
    bool clean_text, chinese_chars, strip_accents, lowercase;
    uint32_t max_chars;
} llmi_hf_wordpiece;
struct cJSON;
llm_status llmi_hf_wordpiece_options(const struct cJSON *root, const struct cJSON *model,
                                     llmi_hf_wordpiece *out);
llm_status llmi_hf_wordpiece_write(const llmi_hf_wordpiece *wp, llmi_gguf_writer *w);
/* llama.cpp's "bert" spelling of a vocab.txt token: "[X]" kept, "##x" ->
 * "x", anything else behind U+2581. Allocated; NULL when out of memory. */
char *llmi_hf_wordpiece_spelling(const char *s);

#endif
