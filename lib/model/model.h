/* A loaded model: hyper-parameters, weight table and tokenizer. Immutable
 * after llmi_model_load, so sessions on many threads share it freely. */
#ifndef LLMI_MODEL_H
#define LLMI_MODEL_H

#include "core/core.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "tokenizer/tokenizer.h"

#include <pthread.h>

#define LLMI_POOLING_UNSET UINT32_MAX

/* Something a module above this one derives from the model once and
 * shares (the grammar module's token trie): built on first use under
 * `lock`, released with `release(data)` when the model is freed. The model
 * stays immutable to its users; only these caches fill in. */
typedef struct llmi_model_cache {
    pthread_mutex_t lock;
    void *data;
    void (*release)(void *data);
} llmi_model_cache;

typedef struct llmi_hparams {
    char arch[32];
    uint32_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx_train;
    uint32_t head_dim;  /* n_embd / n_head unless the file says otherwise */
    uint32_t rope_dim;  /* rotated dimensions per head (<= head_dim) */
    float rope_base, rms_eps;
    /* Linear RoPE scaling: positions are multiplied by this in the angle
     * (1 / <arch>.rope.scaling.factor; 1 = none). Windowed layers use
     * features.swa_rope_freq_scale. */
    float rope_freq_scale;
    llmi_rope_layout rope_layout;
    bool tied_embeddings; /* output projection shares token_embd */
    /* How embeddings pool, as the file says (<arch>.pooling_type, llama.cpp's
     * numbers: 0 none, 1 mean, 2 cls, 3 last, 4 rank); LLMI_POOLING_UNSET
     * when it says nothing. Only embeddings read it (session/embed.c). */
    uint32_t pooling_type;
    uint32_t n_token_types; /* encoders: rows of token_types.weight, else 0 */
    llmi_features features; /* the row's choices with the file's values */
} llmi_hparams;

/* Weights by role (model/arch.h). Matrices have rows = output features;
 * vectors (norm scales, biases) are F32 with rows = 1, cols = length. An
 * optional role the file lacks has data NULL. */
typedef struct llmi_layer {
    llmi_weight w[LLMI_LAYER_ROLES];
} llmi_layer;

/* Matrix e of a stacked role's weight (llmi_role_info.stack, e.g. expert e
 * of LLMI_ROLE_GATE_EXPS): the stack's view has one matrix's rows and cols,
 * and its data holds the matrices one after the other. */
static inline llmi_weight llmi_stack_slice(const llmi_weight *stack, uint32_t e) {
    llmi_weight w = *stack;
    w.data = (const uint8_t *)stack->data + (size_t)e * (size_t)stack->rows * stack->row_bytes;
    return w;
}

struct llm_model {
    llmi_gguf *file;
    const llmi_arch *arch; /* its row of the architecture table */
    llmi_hparams hp;
    llmi_weight w[LLMI_MODEL_ROLES]; /* w[LLMI_ROLE_OUTPUT] == token_embd's when tied */
    llmi_layer *layers;
    llmi_tokenizer *tok;
    char name[128];
    uint64_t n_params, weight_bytes;
    uint64_t fingerprint; /* llmi_model_fingerprint, computed at load */
    llmi_model_cache grammar_vocab; /* lib/grammar's token trie */
};

llm_status llmi_model_load(const char *path, bool use_mmap, llm_model **out);

/* A backend that made its own copy of [data, data + bytes) of m's tensor
 * data and will not read the model's for a while: pages of a mapped GGUF
 * file in that range are given back (llmi_gguf_release_pages; the data
 * stays valid). A no-op otherwise. */
void llmi_model_release_pages(const llm_model *m, const void *data, size_t bytes);
/* As llmi_model_load, reporting LLM_PROGRESS_READ to `progress` (may be
 * NULL); a Hugging Face folder is reported read once it is open. */
llm_status llmi_model_load_progress(const char *path, bool use_mmap, const llmi_progress *progress,
                                    llm_model **out);
/* As llmi_model_load with `arch` as the row instead of the table's row for
 * the file's general.architecture (which must still equal arch->name):
 * tests load rows that are not in the table. `arch` must outlive the model. */
llm_status llmi_model_load_arch(const char *path, bool use_mmap, const llmi_arch *arch,
                                llm_model **out);
/* A 64-bit hash of what makes K/V values of one model usable by another:
 * the hyper-parameters, the vocabulary size, every tensor's name, type and
 * dimensions, and the first and last 4 KiB of every tensor's data. Reading
 * only the ends keeps it cheap (a few pages per tensor) while still telling
 * fine-tunes of one shape apart. Not a security check: a crafted file can
 * collide on purpose. Session state files carry it (lib/state). */
uint64_t llmi_model_fingerprint(const llm_model *m);
void llmi_model_free(llm_model *m);

#endif
