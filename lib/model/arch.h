/* Architectures as data: one row per GGUF `general.architecture`, naming the
 * tensors the architecture has and the choices its forward pass makes.
 *
 * Why a table: the loader and the forward pass used to branch on the
 * architecture's name, so a new model meant edits in four files and every
 * branch had to be found again. Now the loader reads what a row names and
 * checks every shape from the role table below, and the forward pass tests
 * features (a weight present, a flag, a value), never names. A new
 * architecture is a row; a row that needs a feature the forward pass does
 * not do yet is refused at load with LLM_ERR_UNSUPPORTED naming the feature
 * (llmi_arch_check), so no model ever runs with a silently skipped step.
 * docs/architectures.md lists the steps to add one.
 *
 * Weights are addressed by ROLE (what the weight does), not by file name:
 * GGUF names follow llama.cpp's converter and are the same for a role in
 * every architecture, so the name pattern lives with the role. A role whose
 * layout differs between architectures (Phi-3 stores gate and up fused in
 * "ffn_up") becomes a new role with its own shape, not a per-row name. */
#ifndef LLMI_ARCH_H
#define LLMI_ARCH_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

/* Per-layer weights. Append only before LLMI_LAYER_ROLES; rows index by it. */
typedef enum llmi_layer_role {
    LLMI_ROLE_ATTN_NORM,      /* norm before attention, [n_embd] */
    LLMI_ROLE_Q,              /* [n_embd -> n_head * head_dim] */
    LLMI_ROLE_K,              /* [n_embd -> n_head_kv * head_dim] */
    LLMI_ROLE_V,              /* [n_embd -> n_head_kv * head_dim] */
    LLMI_ROLE_Q_BIAS,         /* added after Q, [n_head * head_dim] */
    LLMI_ROLE_K_BIAS,         /* [n_head_kv * head_dim] */
    LLMI_ROLE_V_BIAS,         /* [n_head_kv * head_dim] */
    LLMI_ROLE_Q_NORM,         /* RMSNorm of each q head before RoPE, [head_dim] */
    LLMI_ROLE_K_NORM,         /* the same for k heads, [head_dim] */
    LLMI_ROLE_O,              /* [n_head * head_dim -> n_embd] */
    LLMI_ROLE_POST_ATTN_NORM, /* norm of the attention output before the residual add */
    LLMI_ROLE_FFN_NORM,       /* norm before the FFN, [n_embd] */
    LLMI_ROLE_GATE,           /* [n_embd -> n_ff] */
    LLMI_ROLE_UP,             /* [n_embd -> n_ff] */
    LLMI_ROLE_DOWN,           /* [n_ff -> n_embd] */
    LLMI_ROLE_POST_FFN_NORM,  /* norm of the FFN output before the residual add */
    /* Fused weights (Phi-3), split at load into row views of the roles
     * above, so the forward pass never sees them: */
    LLMI_ROLE_QKV,     /* [n_embd -> q | k | v rows]: views Q, K, V */
    LLMI_ROLE_GATE_UP, /* [n_embd -> 2 * n_ff], gate rows first: views GATE, UP */
    /* Mixture of experts (docs/architectures.md): the router and the
     * experts' SwiGLU weights, one matrix per expert stacked in a 3-D tensor
     * (GGUF ne[2] = expert). They replace GATE, UP and DOWN in a model whose
     * file has <arch>.expert_count. */
    LLMI_ROLE_FFN_ROUTER,     /* [n_embd -> n_expert]: one logit per expert */
    LLMI_ROLE_GATE_EXPS,      /* n_expert x [n_embd -> n_ff_exp] */
    LLMI_ROLE_UP_EXPS,        /* n_expert x [n_embd -> n_ff_exp] */
    LLMI_ROLE_DOWN_EXPS,      /* n_expert x [n_ff_exp -> n_embd] */
    /* A shared expert every row goes through besides its routed ones
     * (Qwen2-MoE), its output scaled by sigmoid(shexp_gate_inp . x). */
    LLMI_ROLE_SHEXP_GATE_INP, /* [n_embd]: a vector, one scalar per row */
    LLMI_ROLE_GATE_SHEXP,     /* [n_embd -> n_ff_shexp] */
    LLMI_ROLE_UP_SHEXP,       /* [n_embd -> n_ff_shexp] */
    LLMI_ROLE_DOWN_SHEXP,     /* [n_ff_shexp -> n_embd] */
    /* BERT-style encoders (post-LayerNorm blocks, biases everywhere): */
    LLMI_ROLE_O_BIAS,              /* added after O, [n_embd] */
    LLMI_ROLE_ATTN_OUT_NORM,       /* LayerNorm of x + attention, [n_embd] */
    LLMI_ROLE_ATTN_OUT_NORM_BIAS,  /* its bias */
    LLMI_ROLE_UP_BIAS,             /* added after UP, [n_ff] */
    LLMI_ROLE_DOWN_BIAS,           /* added after DOWN, [n_embd] */
    LLMI_ROLE_LAYER_OUT_NORM,      /* LayerNorm of x + FFN, [n_embd] */
    LLMI_ROLE_LAYER_OUT_NORM_BIAS, /* its bias */
    LLMI_LAYER_ROLES
} llmi_layer_role;

/* Weights outside the layers. */
typedef enum llmi_model_role {
    LLMI_ROLE_TOKEN_EMBD,  /* [n_embd -> n_vocab]: row t is token t's embedding */
    LLMI_ROLE_OUTPUT_NORM, /* final norm, [n_embd] */
    LLMI_ROLE_OUTPUT,      /* [n_embd -> n_vocab]; OPTIONAL = tied to token_embd when absent */
    /* [rope_dim / 2]: rotation pair i turns by theta_i / f_i (Llama 3.1's
     * long-context frequency scaling, precomputed by the converter) */
    LLMI_ROLE_ROPE_FREQS,
    /* [rope_dim / 2] each: Phi-3 LongRoPE factors, picked by context
     * length together with an attention scale. Refused when present. */
    LLMI_ROLE_ROPE_FACTORS_LONG,
    LLMI_ROLE_ROPE_FACTORS_SHORT,
    /* Encoders: learned absolute positions [n_embd -> n_ctx_train] and
     * token types [n_embd -> n_token_types] added to the token embedding
     * (type 0 for every token), then a LayerNorm of the sum. */
    LLMI_ROLE_POS_EMBD,
    LLMI_ROLE_TOKEN_TYPES,
    LLMI_ROLE_TOKEN_EMBD_NORM,      /* [n_embd] */
    LLMI_ROLE_TOKEN_EMBD_NORM_BIAS, /* [n_embd] */
    LLMI_MODEL_ROLES
} llmi_model_role;

/* How a row needs a role. ABSENT roles are not looked up, so a tensor the
 * row does not name is ignored, as llama.cpp's loader does with its tables. */
typedef enum llmi_need {
    LLMI_ABSENT = 0,
    LLMI_OPTIONAL = 1, /* loaded when in the file; the weight's data stays NULL otherwise */
    LLMI_REQUIRED = 2, /* missing: LLM_ERR_BAD_FORMAT naming the tensor */
} llmi_need;

/* The sizes a role's shape is made of, resolved from the hyper-parameters. */
typedef enum llmi_dim {
    LLMI_DIM_ONE = 0, /* a vector's second dimension */
    LLMI_DIM_EMBD,    /* n_embd */
    LLMI_DIM_Q,       /* n_head * head_dim */
    LLMI_DIM_KV,      /* n_head_kv * head_dim */
    LLMI_DIM_FF,      /* n_ff */
    LLMI_DIM_HEAD,    /* head_dim */
    LLMI_DIM_VOCAB,   /* n_vocab (from token_embd's rows) */
    LLMI_DIM_QKV,     /* (n_head + 2 * n_head_kv) * head_dim */
    LLMI_DIM_FF2,     /* 2 * n_ff */
    LLMI_DIM_ROPE_HALF, /* rope_dim / 2 */
    LLMI_DIM_EXPERT,  /* n_expert */
    LLMI_DIM_FF_EXP,  /* n_ff_exp: one expert's hidden width */
    LLMI_DIM_FF_SHEXP, /* n_ff_shexp: the shared expert's hidden width */
    LLMI_DIM_CTX,      /* n_ctx_train: learned position embeddings */
    LLMI_DIM_TOKEN_TYPES, /* n_token_types (from token_types' rows) */
} llmi_dim;

/* Which FFN a layer role belongs to: the file's <arch>.expert_count picks
 * one, and the roles of the other are not looked up. */
typedef enum llmi_role_ffn {
    LLMI_FFN_ANY = 0, /* not an FFN weight: always looked up */
    LLMI_FFN_DENSE,   /* only in a model without experts */
    LLMI_FFN_MOE,     /* only in a model with experts */
} llmi_role_ffn;

typedef struct llmi_role_info {
    const char *name;   /* GGUF tensor name; layer roles have one %u, the layer index */
    const char *label;  /* short name for messages: "q_norm" */
    llmi_dim in, out;   /* matrix: in = columns (GGUF ne[0]), out = rows;
                           vector (out == LLMI_DIM_ONE): in elements, always F32 */
    llmi_dim stack;     /* LLMI_DIM_ONE (0): a 2-D matrix or a vector; else a stack of that
                           many matrices, GGUF ne[2], each [in -> out] (llmi_stack_slice) */
    llmi_role_ffn ffn;
} llmi_role_info;

extern const llmi_role_info llmi_layer_roles[LLMI_LAYER_ROLES];
extern const llmi_role_info llmi_model_roles[LLMI_MODEL_ROLES];

typedef enum llmi_norm_kind {
    LLMI_NORM_RMS = 0,   /* x / sqrt(mean(x^2) + eps) * w */
    LLMI_NORM_LAYER = 1, /* (x - mean) / sqrt(var + eps) * w + b (encoders, post-norm only) */
} llmi_norm_kind;

typedef enum llmi_ffn_act {
    LLMI_FFN_SWIGLU = 0, /* down(silu(gate x) * up x) */
    LLMI_FFN_GEGLU = 1,  /* down(gelu_tanh(gate x) * up x) */
    LLMI_FFN_GELU = 2,   /* down(gelu_erf(up x + b) ) + b: no gate (BERT) */
} llmi_ffn_act;

typedef enum llmi_rope_layout {
    LLMI_ROPE_ADJACENT = 0, /* pairs (2i, 2i+1): llama.cpp's "norm" rope, Llama GGUFs */
    LLMI_ROPE_HALVES = 1,   /* pairs (i, i + d/2): "neox" rope, Qwen2 and others */
} llmi_rope_layout;

/* How wide one expert's FFN is. */
typedef enum llmi_expert_ff {
    LLMI_EXPERT_FF_IS_FF = 0, /* n_ff, <arch>.feed_forward_length (llama.cpp's Mixtral) */
    LLMI_EXPERT_FF_KEY = 1,   /* <arch>.expert_feed_forward_length, by default
                                 n_ff / expert_used_count (Qwen MoE) */
} llmi_expert_ff;

typedef enum llmi_embd_scale {
    LLMI_EMBD_SCALE_NONE = 0,
    LLMI_EMBD_SCALE_SQRT_EMBD = 1, /* embeddings times sqrt(n_embd) (Gemma) */
} llmi_embd_scale;

/* Which layers attend to a window of recent positions only. */
typedef enum llmi_swa_kind {
    LLMI_SWA_NONE = 0,
    LLMI_SWA_ALL = 1,      /* every layer windowed (Mistral v0.1) */
    LLMI_SWA_PERIODIC = 2, /* layer i global when i % swa_period == swa_period - 1, others
                              windowed (Gemma 2: 2, Gemma 3: 6) */
} llmi_swa_kind;

/* One architecture. Everything the loader and the forward pass need to know
 * about it that the GGUF file does not say; the sizes (layers, heads, dims,
 * eps, rope base) come from the generic "<name>.*" keys for every row. */
typedef struct llmi_arch {
    const char *name;                      /* general.architecture; prefix of its keys */
    uint8_t layer[LLMI_LAYER_ROLES];       /* llmi_need of each layer role */
    uint8_t model[LLMI_MODEL_ROLES];       /* llmi_need of each model role */
    llmi_norm_kind norm;
    llmi_ffn_act ffn_act;
    llmi_rope_layout rope;
    llmi_embd_scale embd_scale;
    /* Soft-caps c * tanh(x / c): the value is the default, the key (after
     * "<name>.") overrides it when the file has it; 0 with no key = none. */
    float attn_softcap;        /* attention scores (Gemma 2) */
    const char *attn_softcap_key;
    float logit_softcap;       /* final logits (Gemma 2) */
    const char *logit_softcap_key;
    /* Sliding-window attention; the window size is the key
     * "<name>.attention.sliding_window", required unless swa_optional. */
    llmi_swa_kind swa;
    uint32_t swa_period; /* LLMI_SWA_PERIODIC only */
    /* The file may lack the window key (or set it to 0): then no layer is
     * windowed. For rows whose checkpoints differ (Llama: Mistral v0.1
     * has a window, Llama itself none). */
    bool swa_optional;
    /* RoPE base of the windowed layers; 0 = the file's rope.freq_base, as
     * for the global layers. Gemma 3 trains its local layers with 10000
     * while rope.freq_base (1e6) is the global layers'. */
    float swa_rope_base;
    /* Linear RoPE position scale of the windowed layers; 0 = the file's
     * (1 / rope.scaling.factor), as for the global layers. Gemma 3 scales
     * only its global layers (llama.cpp: rope_freq_scale_train_swa = 1). */
    float swa_rope_freq_scale;
    /* Mixture of experts: whether the file has <name>.expert_count (and
     * <name>.expert_used_count): LLMI_ABSENT = never (the keys are ignored),
     * OPTIONAL = a dense or a MoE model (Llama files hold Mixtral),
     * REQUIRED = always. The FFN roles follow (llmi_role_ffn). */
    llmi_need experts;
    llmi_expert_ff expert_ff;
    bool expert_weights_norm; /* the top-k weights divided by their sum */
    /* An encoder (BERT): every position of a sequence attends to every
     * other (no causal mask), positions are learned embeddings (no RoPE),
     * and each block is x = LayerNorm(x + block(x)). The backend needs all
     * of a sequence's tokens in one step (embeddings run each input so). */
    bool encoder;
} llmi_arch;

/* What one loaded model's forward pass does beyond the weights' presence:
 * the row's choices with the file's values filled in. The forward pass
 * reads only this and which weights are present. */
typedef struct llmi_features {
    llmi_norm_kind norm;
    llmi_ffn_act ffn_act;
    float embd_scale;    /* 1, or sqrt(n_embd) */
    float attn_softcap;  /* 0 = none */
    float logit_softcap; /* 0 = none */
    llmi_swa_kind swa;   /* LLMI_SWA_NONE when an optional window key is absent */
    uint32_t swa_period, swa_window; /* swa_window: positions a windowed layer sees */
    float swa_rope_base; /* RoPE base of windowed layers (the file's base if the row has none) */
    float swa_rope_freq_scale; /* their linear position scale (hparams.rope_freq_scale if the row has none) */
    /* Mixture of experts; n_expert 0 = a dense FFN. Each row's FFN output is
     * sum over its n_expert_used best experts of weight * expert(x), the
     * weights being the router's softmax at those experts (divided by their
     * sum when expert_weights_norm). */
    uint32_t n_expert, n_expert_used, n_ff_exp;
    bool expert_weights_norm;
    /* <arch>.expert_shared_feed_forward_length, by default n_ff; used only
     * by a model with the shared-expert weights. */
    uint32_t n_ff_shexp;
    /* llmi_arch.encoder: bidirectional attention over the step's rows of a
     * sequence, learned positions, post-LayerNorm blocks. */
    bool encoder;
} llmi_features;

/* Whether layer `layer` attends to a window of recent positions only: a
 * query at position p sees the keys at positions q with p - q < swa_window
 * (llama.cpp's LLAMA_SWA_TYPE_STANDARD mask). */
static inline bool llmi_layer_windowed(const llmi_features *f, uint32_t layer) {
    switch (f->swa) {
    case LLMI_SWA_ALL:
        return true;
    case LLMI_SWA_PERIODIC:
        return layer % f->swa_period != f->swa_period - 1;
    default:
        return false;
    }
}

/* The row for `name` (general.architecture), or NULL. */
const llmi_arch *llmi_arch_find(const char *name);
/* Writes "llama, qwen2, ..." (every row's name, in table order) to buf for
 * messages; truncated to fit cap (> 0). */
void llmi_arch_supported_list(char *buf, size_t cap);
/* LLM_OK, or LLM_ERR_UNSUPPORTED naming the first feature in `f` that the
 * CPU forward pass (backend/cpu/step.c) does not implement, e.g. "LayerNorm
 * is not implemented yet". Keep it in step with step.c: a feature listed as
 * implemented here must be done there. */
llm_status llmi_arch_check(const llmi_features *f);

#endif
