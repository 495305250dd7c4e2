/* A loaded model: hyper-parameters, weight table and tokenizer. Immutable
 * after llmi_model_load, so sessions on many threads share it freely. */
#ifndef LLMI_MODEL_H
#define LLMI_MODEL_H

#include "core/core.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

typedef enum llmi_rope_layout {
    LLMI_ROPE_ADJACENT = 0, /* pairs (2i, 2i+1): llama.cpp's "norm" rope, Llama GGUFs */
    LLMI_ROPE_HALVES = 1,   /* pairs (i, i + d/2): "neox" rope, Qwen2 and others */
} llmi_rope_layout;

typedef struct llmi_hparams {
    char arch[32];
    uint32_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx_train;
    uint32_t head_dim;  /* n_embd / n_head unless the file says otherwise */
    uint32_t rope_dim;  /* rotated dimensions per head (<= head_dim) */
    float rope_base, rms_eps;
    llmi_rope_layout rope_layout;
    bool tied_embeddings; /* output projection shares token_embd */
} llmi_hparams;

/* 1-D f32 vector weight (norm scales, biases). */
typedef struct llmi_vec { const float *data; uint32_t n; } llmi_vec;

typedef struct llmi_layer {
    llmi_vec attn_norm, ffn_norm;
    llmi_weight wq, wk, wv, wo;   /* rows = output features */
    llmi_vec bq, bk, bv;          /* optional (Qwen2); data NULL when absent */
    llmi_weight w_gate, w_up, w_down;
} llmi_layer;

struct llm_model {
    llmi_gguf *file;
    llmi_hparams hp;
    llmi_weight tok_embd; /* rows = vocabulary, cols = n_embd */
    llmi_vec out_norm;
    llmi_weight output;   /* == tok_embd when tied */
    llmi_layer *layers;
    llmi_tokenizer *tok;
    char name[128];
    uint64_t n_params, weight_bytes;
    uint64_t fingerprint; /* llmi_model_fingerprint, computed at load */
};

llm_status llmi_model_load(const char *path, bool use_mmap, llm_model **out);
/* A 64-bit hash of what makes K/V values of one model usable by another:
 * the hyper-parameters, the vocabulary size, every tensor's name, type and
 * dimensions, and the first and last 4 KiB of every tensor's data. Reading
 * only the ends keeps it cheap (a few pages per tensor) while still telling
 * fine-tunes of one shape apart. Not a security check: a crafted file can
 * collide on purpose. Session state files carry it (lib/state). */
uint64_t llmi_model_fingerprint(const llm_model *m);
void llmi_model_free(llm_model *m);

#endif
