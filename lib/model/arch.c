/* The architecture table and the role table (model/arch.h). */
#include "model/arch.h"

#include <stdio.h>

const llmi_role_info llmi_layer_roles[LLMI_LAYER_ROLES] = {
    [LLMI_ROLE_ATTN_NORM] = {"blk.%u.attn_norm.weight", "attn_norm", LLMI_DIM_EMBD, LLMI_DIM_ONE},
    [LLMI_ROLE_Q] = {"blk.%u.attn_q.weight", "q", LLMI_DIM_EMBD, LLMI_DIM_Q},
    [LLMI_ROLE_K] = {"blk.%u.attn_k.weight", "k", LLMI_DIM_EMBD, LLMI_DIM_KV},
    [LLMI_ROLE_V] = {"blk.%u.attn_v.weight", "v", LLMI_DIM_EMBD, LLMI_DIM_KV},
    [LLMI_ROLE_Q_BIAS] = {"blk.%u.attn_q.bias", "q_bias", LLMI_DIM_Q, LLMI_DIM_ONE},
    [LLMI_ROLE_K_BIAS] = {"blk.%u.attn_k.bias", "k_bias", LLMI_DIM_KV, LLMI_DIM_ONE},
    [LLMI_ROLE_V_BIAS] = {"blk.%u.attn_v.bias", "v_bias", LLMI_DIM_KV, LLMI_DIM_ONE},
    [LLMI_ROLE_Q_NORM] = {"blk.%u.attn_q_norm.weight", "q_norm", LLMI_DIM_HEAD, LLMI_DIM_ONE},
    [LLMI_ROLE_K_NORM] = {"blk.%u.attn_k_norm.weight", "k_norm", LLMI_DIM_HEAD, LLMI_DIM_ONE},
    [LLMI_ROLE_O] = {"blk.%u.attn_output.weight", "o", LLMI_DIM_Q, LLMI_DIM_EMBD},
    [LLMI_ROLE_POST_ATTN_NORM] = {"blk.%u.post_attention_norm.weight", "post_attn_norm",
                                  LLMI_DIM_EMBD, LLMI_DIM_ONE},
    [LLMI_ROLE_FFN_NORM] = {"blk.%u.ffn_norm.weight", "ffn_norm", LLMI_DIM_EMBD, LLMI_DIM_ONE},
    [LLMI_ROLE_GATE] = {"blk.%u.ffn_gate.weight", "gate", LLMI_DIM_EMBD, LLMI_DIM_FF,
                        .ffn = LLMI_FFN_DENSE},
    [LLMI_ROLE_UP] = {"blk.%u.ffn_up.weight", "up", LLMI_DIM_EMBD, LLMI_DIM_FF,
                      .ffn = LLMI_FFN_DENSE},
    [LLMI_ROLE_DOWN] = {"blk.%u.ffn_down.weight", "down", LLMI_DIM_FF, LLMI_DIM_EMBD,
                        .ffn = LLMI_FFN_DENSE},
    [LLMI_ROLE_POST_FFN_NORM] = {"blk.%u.post_ffw_norm.weight", "post_ffn_norm", LLMI_DIM_EMBD,
                                 LLMI_DIM_ONE},
    [LLMI_ROLE_QKV] = {"blk.%u.attn_qkv.weight", "qkv", LLMI_DIM_EMBD, LLMI_DIM_QKV},
    [LLMI_ROLE_GATE_UP] = {"blk.%u.ffn_up.weight", "gate_up", LLMI_DIM_EMBD, LLMI_DIM_FF2,
                           .ffn = LLMI_FFN_DENSE},
    [LLMI_ROLE_FFN_ROUTER] = {"blk.%u.ffn_gate_inp.weight", "router", LLMI_DIM_EMBD,
                              LLMI_DIM_EXPERT, .ffn = LLMI_FFN_MOE},
    [LLMI_ROLE_GATE_EXPS] = {"blk.%u.ffn_gate_exps.weight", "gate_exps", LLMI_DIM_EMBD,
                             LLMI_DIM_FF_EXP, LLMI_DIM_EXPERT, LLMI_FFN_MOE},
    [LLMI_ROLE_UP_EXPS] = {"blk.%u.ffn_up_exps.weight", "up_exps", LLMI_DIM_EMBD, LLMI_DIM_FF_EXP,
                           LLMI_DIM_EXPERT, LLMI_FFN_MOE},
    [LLMI_ROLE_DOWN_EXPS] = {"blk.%u.ffn_down_exps.weight", "down_exps", LLMI_DIM_FF_EXP,
                             LLMI_DIM_EMBD, LLMI_DIM_EXPERT, LLMI_FFN_MOE},
    [LLMI_ROLE_SHEXP_GATE_INP] = {"blk.%u.ffn_gate_inp_shexp.weight", "shexp_gate_inp",
                                  LLMI_DIM_EMBD, LLMI_DIM_ONE, .ffn = LLMI_FFN_MOE},
    [LLMI_ROLE_GATE_SHEXP] = {"blk.%u.ffn_gate_shexp.weight", "gate_shexp", LLMI_DIM_EMBD,
                              LLMI_DIM_FF_SHEXP, .ffn = LLMI_FFN_MOE},
    [LLMI_ROLE_UP_SHEXP] = {"blk.%u.ffn_up_shexp.weight", "up_shexp", LLMI_DIM_EMBD,
                            LLMI_DIM_FF_SHEXP, .ffn = LLMI_FFN_MOE},
    [LLMI_ROLE_DOWN_SHEXP] = {"blk.%u.ffn_down_shexp.weight", "down_shexp", LLMI_DIM_FF_SHEXP,
                              LLMI_DIM_EMBD, .ffn = LLMI_FFN_MOE},
    [LLMI_ROLE_O_BIAS] = {"blk.%u.attn_output.bias", "o_bias", LLMI_DIM_EMBD, LLMI_DIM_ONE},
    [LLMI_ROLE_ATTN_OUT_NORM] = {"blk.%u.attn_output_norm.weight", "attn_output_norm",
                                 LLMI_DIM_EMBD, LLMI_DIM_ONE},
    [LLMI_ROLE_ATTN_OUT_NORM_BIAS] = {"blk.%u.attn_output_norm.bias", "attn_output_norm_bias",
                                      LLMI_DIM_EMBD, LLMI_DIM_ONE},
    [LLMI_ROLE_UP_BIAS] = {"blk.%u.ffn_up.bias", "up_bias", LLMI_DIM_FF, LLMI_DIM_ONE,
                           .ffn = LLMI_FFN_DENSE},
    [LLMI_ROLE_DOWN_BIAS] = {"blk.%u.ffn_down.bias", "down_bias", LLMI_DIM_EMBD, LLMI_DIM_ONE,
                             .ffn = LLMI_FFN_DENSE},
    [LLMI_ROLE_LAYER_OUT_NORM] = {"blk.%u.layer_output_norm.weight", "layer_output_norm",
                                  LLMI_DIM_EMBD, LLMI_DIM_ONE},
    [LLMI_ROLE_LAYER_OUT_NORM_BIAS] = {"blk.%u.layer_output_norm.bias", "layer_output_norm_bias",
                                       LLMI_DIM_EMBD, LLMI_DIM_ONE},
};

const llmi_role_info llmi_model_roles[LLMI_MODEL_ROLES] = {
    [LLMI_ROLE_TOKEN_EMBD] = {"token_embd.weight", "token_embd", LLMI_DIM_EMBD, LLMI_DIM_VOCAB},
    [LLMI_ROLE_OUTPUT_NORM] = {"output_norm.weight", "output_norm", LLMI_DIM_EMBD, LLMI_DIM_ONE},
    [LLMI_ROLE_OUTPUT] = {"output.weight", "output", LLMI_DIM_EMBD, LLMI_DIM_VOCAB},
    [LLMI_ROLE_ROPE_FREQS] = {"rope_freqs.weight", "rope_freqs", LLMI_DIM_ROPE_HALF, LLMI_DIM_ONE},
    [LLMI_ROLE_ROPE_FACTORS_LONG] = {"rope_factors_long.weight", "rope_factors_long",
                                     LLMI_DIM_ROPE_HALF, LLMI_DIM_ONE},
    [LLMI_ROLE_ROPE_FACTORS_SHORT] = {"rope_factors_short.weight", "rope_factors_short",
                                      LLMI_DIM_ROPE_HALF, LLMI_DIM_ONE},
    [LLMI_ROLE_POS_EMBD] = {"position_embd.weight", "position_embd", LLMI_DIM_EMBD, LLMI_DIM_CTX},
    [LLMI_ROLE_TOKEN_TYPES] = {"token_types.weight", "token_types", LLMI_DIM_EMBD,
                               LLMI_DIM_TOKEN_TYPES},
    [LLMI_ROLE_TOKEN_EMBD_NORM] = {"token_embd_norm.weight", "token_embd_norm", LLMI_DIM_EMBD,
                                   LLMI_DIM_ONE},
    [LLMI_ROLE_TOKEN_EMBD_NORM_BIAS] = {"token_embd_norm.bias", "token_embd_norm_bias",
                                        LLMI_DIM_EMBD, LLMI_DIM_ONE},
};

/* The pre-norm decoder every row starts from: attention and SwiGLU FFN,
 * output tied to token_embd when the file has no output.weight. */
#define DECODER_LAYER                                                                              \
    [LLMI_ROLE_ATTN_NORM] = LLMI_REQUIRED, [LLMI_ROLE_Q] = LLMI_REQUIRED,                          \
    [LLMI_ROLE_K] = LLMI_REQUIRED, [LLMI_ROLE_V] = LLMI_REQUIRED, [LLMI_ROLE_O] = LLMI_REQUIRED,   \
    [LLMI_ROLE_FFN_NORM] = LLMI_REQUIRED, [LLMI_ROLE_GATE] = LLMI_REQUIRED,                        \
    [LLMI_ROLE_UP] = LLMI_REQUIRED, [LLMI_ROLE_DOWN] = LLMI_REQUIRED
/* The routed FFN that replaces gate/up/down when the file has experts. */
#define MOE_LAYER                                                                                  \
    [LLMI_ROLE_FFN_ROUTER] = LLMI_REQUIRED, [LLMI_ROLE_GATE_EXPS] = LLMI_REQUIRED,                 \
    [LLMI_ROLE_UP_EXPS] = LLMI_REQUIRED, [LLMI_ROLE_DOWN_EXPS] = LLMI_REQUIRED
#define SHARED_EXPERT                                                                              \
    [LLMI_ROLE_SHEXP_GATE_INP] = LLMI_REQUIRED, [LLMI_ROLE_GATE_SHEXP] = LLMI_REQUIRED,            \
    [LLMI_ROLE_UP_SHEXP] = LLMI_REQUIRED, [LLMI_ROLE_DOWN_SHEXP] = LLMI_REQUIRED
#define DECODER_MODEL                                                                              \
    [LLMI_ROLE_TOKEN_EMBD] = LLMI_REQUIRED, [LLMI_ROLE_OUTPUT_NORM] = LLMI_REQUIRED,               \
    [LLMI_ROLE_OUTPUT] = LLMI_OPTIONAL

static const llmi_arch arch_table[] = {
    {
        /* Llama 1-3, SmolLM, Mistral 7B as converted by llama.cpp. Q/K/V
         * biases are optional, as in llama.cpp's loader; Llama 3.1 and 3.2
         * files carry rope_freqs. Every layer is windowed when the file
         * names a window: Mistral v0.1 read from a Hugging Face folder
         * carries one; llama.cpp's converter writes none for this
         * architecture. */
        .name = "llama",
        .layer = {DECODER_LAYER, MOE_LAYER, [LLMI_ROLE_Q_BIAS] = LLMI_OPTIONAL,
                  [LLMI_ROLE_K_BIAS] = LLMI_OPTIONAL, [LLMI_ROLE_V_BIAS] = LLMI_OPTIONAL},
        .model = {DECODER_MODEL, [LLMI_ROLE_ROPE_FREQS] = LLMI_OPTIONAL},
        .rope = LLMI_ROPE_ADJACENT,
        .swa = LLMI_SWA_ALL,
        .swa_optional = true,
        .experts = LLMI_OPTIONAL,
        .expert_ff = LLMI_EXPERT_FF_IS_FF,
        .expert_weights_norm = true,
    },
    {
        /* Qwen2 and Qwen2.5: Llama with Q/K/V biases and neox rope. */
        .name = "qwen2",
        .layer = {DECODER_LAYER, [LLMI_ROLE_Q_BIAS] = LLMI_REQUIRED,
                  [LLMI_ROLE_K_BIAS] = LLMI_REQUIRED, [LLMI_ROLE_V_BIAS] = LLMI_REQUIRED},
        .model = {DECODER_MODEL},
        .rope = LLMI_ROPE_HALVES,
    },
    {
        /* Qwen3 (dense): Llama with QK-norm and neox rope, no biases. */
        .name = "qwen3",
        .layer = {DECODER_LAYER, [LLMI_ROLE_Q_NORM] = LLMI_REQUIRED,
                  [LLMI_ROLE_K_NORM] = LLMI_REQUIRED},
        .model = {DECODER_MODEL},
        .rope = LLMI_ROPE_HALVES,
    },
    {
        /* Phi-3 and Phi-4: Q/K/V fused in attn_qkv, gate and up fused in
         * ffn_up, neox rope. Its <name>.attention.sliding_window key is
         * ignored, as llama.cpp does (it disables Phi-3's window). The
         * LongRoPE factors of the 128k models are refused when present. */
        .name = "phi3",
        .layer = {[LLMI_ROLE_ATTN_NORM] = LLMI_REQUIRED, [LLMI_ROLE_QKV] = LLMI_REQUIRED,
                  [LLMI_ROLE_O] = LLMI_REQUIRED, [LLMI_ROLE_FFN_NORM] = LLMI_REQUIRED,
                  [LLMI_ROLE_GATE_UP] = LLMI_REQUIRED, [LLMI_ROLE_DOWN] = LLMI_REQUIRED},
        .model = {DECODER_MODEL, [LLMI_ROLE_ROPE_FACTORS_LONG] = LLMI_OPTIONAL,
                  [LLMI_ROLE_ROPE_FACTORS_SHORT] = LLMI_OPTIONAL},
        .rope = LLMI_ROPE_HALVES,
    },
    {
        /* Qwen1.5-MoE and Qwen2-MoE: Qwen2's attention, routed experts whose
         * weights are not renormalized, and a gated shared expert. */
        .name = "qwen2moe",
        .layer = {DECODER_LAYER, MOE_LAYER, SHARED_EXPERT, [LLMI_ROLE_Q_BIAS] = LLMI_REQUIRED,
                  [LLMI_ROLE_K_BIAS] = LLMI_REQUIRED, [LLMI_ROLE_V_BIAS] = LLMI_REQUIRED},
        .model = {DECODER_MODEL},
        .rope = LLMI_ROPE_HALVES,
        .experts = LLMI_REQUIRED,
        .expert_ff = LLMI_EXPERT_FF_KEY,
        .expert_weights_norm = false,
    },
    {
        /* Qwen3-MoE (Qwen3-30B-A3B and kin): Qwen3's attention (QK-norm, no
         * biases, neox rope) and a routed FFN in every layer, no shared
         * expert. */
        .name = "qwen3moe",
        .layer = {DECODER_LAYER, MOE_LAYER, [LLMI_ROLE_Q_NORM] = LLMI_REQUIRED,
                  [LLMI_ROLE_K_NORM] = LLMI_REQUIRED},
        .model = {DECODER_MODEL},
        .rope = LLMI_ROPE_HALVES,
        .experts = LLMI_REQUIRED,
        .expert_ff = LLMI_EXPERT_FF_KEY,
        .expert_weights_norm = true,
    },
    {
        /* Gemma 3 (text): QK-norm, norms after attention and FFN as well as
         * before, GeGLU, embeddings times sqrt(n_embd), output tied to
         * token_embd, neox rope. Five windowed layers, then one global;
         * the windowed layers rotate with base 10000 whatever the file's
         * rope.freq_base says (llama.cpp: rope_freq_base_train_swa), and
         * without the linear RoPE scaling of the 4B and larger. The
         * norm weights already hold Gemma's "1 +" (the converter adds it).
         * Attention scale is 1/sqrt(head_dim), right for every size but
         * the 27B (which scales by 1/sqrt(n_embd / n_head)). */
        .name = "gemma3",
        .layer = {DECODER_LAYER, [LLMI_ROLE_Q_NORM] = LLMI_REQUIRED,
                  [LLMI_ROLE_K_NORM] = LLMI_REQUIRED, [LLMI_ROLE_POST_ATTN_NORM] = LLMI_REQUIRED,
                  [LLMI_ROLE_POST_FFN_NORM] = LLMI_REQUIRED},
        .model = {DECODER_MODEL},
        .ffn_act = LLMI_FFN_GEGLU,
        .rope = LLMI_ROPE_HALVES,
        .embd_scale = LLMI_EMBD_SCALE_SQRT_EMBD,
        .swa = LLMI_SWA_PERIODIC,
        .swa_period = 6,
        .swa_rope_base = 10000.0f,
        .swa_rope_freq_scale = 1.0f,
    },
    {
        /* BERT encoders (sentence-transformers' MiniLM, BGE, E5 and kin):
         * learned absolute positions and token type 0 added to the token
         * embedding, then LayerNorm; bidirectional attention; each block
         * x = LayerNorm(x + block(x)) with biases on every projection; an
         * FFN of GELU (erf form) without a gate; no output norm and no LM
         * head (embeddings only; logits come from the tied token_embd).
         * Tensor names as llama.cpp's converter writes them. */
        .name = "bert",
        .layer = {[LLMI_ROLE_Q] = LLMI_REQUIRED,
                  [LLMI_ROLE_K] = LLMI_REQUIRED,
                  [LLMI_ROLE_V] = LLMI_REQUIRED,
                  [LLMI_ROLE_Q_BIAS] = LLMI_REQUIRED,
                  [LLMI_ROLE_K_BIAS] = LLMI_REQUIRED,
                  [LLMI_ROLE_V_BIAS] = LLMI_REQUIRED,
                  [LLMI_ROLE_O] = LLMI_REQUIRED,
                  [LLMI_ROLE_O_BIAS] = LLMI_REQUIRED,
                  [LLMI_ROLE_ATTN_OUT_NORM] = LLMI_REQUIRED,
                  [LLMI_ROLE_ATTN_OUT_NORM_BIAS] = LLMI_REQUIRED,
                  [LLMI_ROLE_UP] = LLMI_REQUIRED,
                  [LLMI_ROLE_UP_BIAS] = LLMI_REQUIRED,
                  [LLMI_ROLE_DOWN] = LLMI_REQUIRED,
                  [LLMI_ROLE_DOWN_BIAS] = LLMI_REQUIRED,
                  [LLMI_ROLE_LAYER_OUT_NORM] = LLMI_REQUIRED,
                  [LLMI_ROLE_LAYER_OUT_NORM_BIAS] = LLMI_REQUIRED},
        .model = {[LLMI_ROLE_TOKEN_EMBD] = LLMI_REQUIRED,
                  [LLMI_ROLE_POS_EMBD] = LLMI_REQUIRED,
                  [LLMI_ROLE_TOKEN_TYPES] = LLMI_REQUIRED,
                  [LLMI_ROLE_TOKEN_EMBD_NORM] = LLMI_REQUIRED,
                  [LLMI_ROLE_TOKEN_EMBD_NORM_BIAS] = LLMI_REQUIRED},
        .norm = LLMI_NORM_LAYER,
        .ffn_act = LLMI_FFN_GELU,
        .encoder = true,
    },
};

#define N_ARCH (sizeof arch_table / sizeof arch_table[0])

const llmi_arch *llmi_arch_find(const char *name) {
    for (size_t i = 0; i < N_ARCH; i++)
        if (strcmp(arch_table[i].name, name) == 0) return &arch_table[i];
    return NULL;
}

void llmi_arch_supported_list(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_ARCH && n < cap; i++) {
        int k = snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", arch_table[i].name);
        if (k < 0) break;
        n += (size_t)k;
    }
}

llm_status llmi_arch_check(const llmi_features *f) {
    if (f->norm != LLMI_NORM_RMS && !f->encoder)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "LayerNorm is implemented for encoders (post-norm) only");
    if (f->encoder && (f->norm != LLMI_NORM_LAYER || f->ffn_act != LLMI_FFN_GELU || f->n_expert ||
                       f->swa != LLMI_SWA_NONE || f->attn_softcap != 0.0f))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "an encoder is implemented with LayerNorm, a GELU FFN and full "
                          "attention only");
    if (!f->encoder && f->ffn_act == LLMI_FFN_GELU)
        return llmi_error(LLM_ERR_UNSUPPORTED, "an ungated GELU FFN is implemented for encoders "
                                               "only");
    if (f->swa == LLMI_SWA_PERIODIC && f->swa_period < 2)
        return llmi_error(LLM_ERR_INTERNAL, "sliding-window period %u (want >= 2)",
                          f->swa_period);
    if (f->attn_softcap != 0.0f)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "attention logit soft-capping is not implemented yet (cap %g)",
                          (double)f->attn_softcap);
    if (f->n_expert && f->ffn_act != LLMI_FFN_SWIGLU)
        return llmi_error(LLM_ERR_UNSUPPORTED, "experts with a GeGLU FFN are not implemented yet");
    return LLM_OK;
}
