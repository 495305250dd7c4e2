/* Tiny random-weight Llama models in GGUF form, with the same metadata keys,
 * tensor names and GPT-2 byte-level tokenizer layout as llama.cpp's Llama
 * GGUFs (SmolLM2 in particular), so tests exercise the real loader. */
#ifndef LLMI_TESTMODEL_H
#define LLMI_TESTMODEL_H

#include "core/core.h"
#include "core/ttype.h"

#include <stdbool.h>

typedef struct llmi_testmodel_params {
    uint32_t n_layer;     /* 2 */
    uint32_t n_embd;      /* 64 */
    uint32_t n_head;      /* 4 */
    uint32_t n_head_kv;   /* 2 */
    uint32_t n_ff;        /* 128 */
    uint32_t n_ctx;       /* 256: llama.context_length */
    float rope_base;      /* 10000 */
    float rms_eps;        /* 1e-5 */
    llmi_ttype type;      /* matrices incl. token_embd (F32); norms are always F32 */
    bool tied_embeddings; /* false: an output.weight tensor is written */
    uint64_t seed;        /* 1 */
    float weight_scale;   /* 0.1: matrix entries uniform in [-scale, scale) */
    const char *name;     /* general.name, "llminfer-testmodel" */
    /* 0: extra tokens appended after the control tokens (ids from
     * llmi_testmodel_n_vocab() up), type "unused", text "<|pad_N|>". The
     * tokenizer never produces them; they give the embedding and output
     * matrices a real model's vocabulary size (benchmarks). At most 1 << 20. */
    uint32_t n_vocab_pad;
    /* Architecture features (model/arch.h); the defaults write a plain
     * Llama file, and a file with none of them set is byte-identical to
     * one written before they existed. */
    const char *arch;         /* general.architecture and key prefix: "llama" */
    uint32_t head_dim;        /* 0: n_embd / n_head; else also written as
                                 <arch>.attention.key_length/value_length */
    bool qkv_bias;            /* blk.N.attn_{q,k,v}.bias */
    bool qk_norm;             /* blk.N.attn_{q,k}_norm.weight, [head_dim] */
    bool post_norms;          /* blk.N.post_attention_norm / post_ffw_norm.weight */
    float attn_softcap;       /* > 0: <arch>.attn_logit_softcapping */
    float logit_softcap;      /* > 0: <arch>.final_logit_softcapping */
    uint32_t sliding_window;  /* > 0: <arch>.attention.sliding_window */
    float rope_scaling;       /* > 0: <arch>.rope.scaling.type and .factor */
    const char *rope_scaling_type; /* NULL = "linear" */
    /* > 0: a mixture-of-experts FFN in every layer instead of the dense
     * one: <arch>.expert_count / expert_used_count, blk.N.ffn_gate_inp
     * ([n_embd -> n_expert]) and blk.N.ffn_{gate,up,down}_exps (3-D, ne[2] =
     * expert). n_ff stays <arch>.feed_forward_length. */
    uint32_t n_expert;
    uint32_t n_expert_used;   /* 1..n_expert (not checked: tests write bad files) */
    uint32_t n_ff_exp;        /* 0: experts are n_ff wide and no key is written; else
                                 <arch>.expert_feed_forward_length */
    uint32_t n_ff_shexp;      /* > 0 (with n_expert): a shared expert of this width,
                                 blk.N.ffn_{gate,up,down}_shexp and the vector
                                 blk.N.ffn_gate_inp_shexp, and the key
                                 <arch>.expert_shared_feed_forward_length */
} llmi_testmodel_params;

void llmi_testmodel_params_init(llmi_testmodel_params *p);

/* Writes the model; the same params always give the same bytes. Invalid
 * shapes (n_embd not divisible by n_head when head_dim is 0, n_head by
 * n_head_kv, an odd head dimension, or a matrix row length not a multiple of
 * type's block): LLM_ERR_INVALID_ARGUMENT. */
llm_status llmi_testmodel_write(const llmi_testmodel_params *p, const char *path);
/* Same file as a buffer the caller frees with llmi_free. */
llm_status llmi_testmodel_to_memory(const llmi_testmodel_params *p, void **data, size_t *size);

/* Vocabulary layout (same for every params): 256 byte tokens in GPT-2 order,
 * then one token per merge in merge order, then the three control tokens
 * (then n_vocab_pad padding tokens, not counted by llmi_testmodel_n_vocab). */
uint32_t llmi_testmodel_n_vocab(void);
uint32_t llmi_testmodel_n_merges(void);
enum {
    LLMI_TESTMODEL_N_SPECIAL = 3, /* <|endoftext|>, <|im_start|>, <|im_end|> */
};

#endif
