/* config.json -> the GGUF "<arch>.*" keys llama.cpp's converter
 * (convert_hf_to_gguf.py) writes for the same model. One table row per
 * Hugging Face model class; the sizes are read and cross-checked once here,
 * so a folder with an inconsistent config is refused naming the field, not
 * later naming a GGUF key the user never wrote. */
#include "hf/hf_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>

#define CFG "config.json"

typedef struct family_row {
    const char *hf_class;   /* "architectures"[0] */
    const char *model_type; /* "model_type" */
    llmi_hf_family family;
    const char *arch;
    bool permute_qk, norm_plus_one, post_attn_is_ffn_norm, moe;
    float default_rope_theta;
} family_row;

static const family_row families[] = {
    {"LlamaForCausalLM", "llama", LLMI_HF_LLAMA, "llama", true, false, true, false, 10000.0f},
    {"MistralForCausalLM", "mistral", LLMI_HF_MISTRAL, "llama", true, false, true, false, 10000.0f},
    {"Qwen2ForCausalLM", "qwen2", LLMI_HF_QWEN2, "qwen2", false, false, true, false, 10000.0f},
    {"Qwen3ForCausalLM", "qwen3", LLMI_HF_QWEN3, "qwen3", false, false, true, false, 10000.0f},
    {"Gemma3ForCausalLM", "gemma3_text", LLMI_HF_GEMMA3, "gemma3", false, true, false, false,
     1000000.0f},
    {"Phi3ForCausalLM", "phi3", LLMI_HF_PHI3, "phi3", false, false, true, false, 10000.0f},
    {"Qwen3MoeForCausalLM", "qwen3_moe", LLMI_HF_QWEN3MOE, "qwen3moe", false, false, true, true,
     10000.0f},
    {"MixtralForCausalLM", "mixtral", LLMI_HF_MIXTRAL, "llama", true, false, true, true,
     1000000.0f},
    {"BertModel", "bert", LLMI_HF_BERT, "bert", false, false, false, false, 10000.0f},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

static const family_row *find_family(const cJSON *root) {
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (!cJSON_IsArray(archs))
        archs = NULL;
    const cJSON *a;
    cJSON_ArrayForEach(a, archs) {
        if (!cJSON_IsString(a))
            continue;
        for (size_t i = 0; i < N_FAMILIES; i++)
            if (strcmp(a->valuestring, families[i].hf_class) == 0)
                return &families[i];
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(mt))
        for (size_t i = 0; i < N_FAMILIES; i++)
            if (strcmp(mt->valuestring, families[i].model_type) == 0)
                return &families[i];
    return NULL;
}

static llm_status unknown_family(const cJSON *root) {
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *first = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    char list[512];
    size_t n = 0;
    list[0] = '\0';
    for (size_t i = 0; i < N_FAMILIES && n < sizeof list; i++) {
        int k = snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", families[i].hf_class);
        if (k < 0)
            break;
        n += (size_t)k;
    }
    if (!first && !cJSON_IsString(mt))
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          CFG ": neither 'architectures' nor 'model_type' is given");
    return llmi_error(LLM_ERR_UNSUPPORTED,
                      CFG ": architecture '%s' (model_type '%s') is not supported (supported: %s)",
                      cJSON_IsString(first) ? first->valuestring : "?",
                      cJSON_IsString(mt) ? mt->valuestring : "?", list);
}

/* A positive integer field below 2^31; `required` absent or null -> error. */
static llm_status get_u32(const cJSON *root, const char *key, bool required, uint32_t *out,
                          bool *present) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (present)
        *present = false;
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": required field '%s' is missing", key);
        return LLM_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1.0;
    if (!(d >= 1.0 && d <= 2147483647.0) || d != floor(d))
        return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": field '%s' is not a positive integer", key);
    *out = (uint32_t)d;
    if (present)
        *present = true;
    return LLM_OK;
}

static llm_status get_f32(const cJSON *root, const char *key, bool required, float lo, float hi,
                          float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": required field '%s' is missing", key);
        return LLM_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > lo && v->valuedouble < hi))
        return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": field '%s' is not a number in (%g, %g)", key,
                          (double)lo, (double)hi);
    *out = (float)v->valuedouble;
    return LLM_OK;
}

/* A positive number in rope_scaling, `fallback` when absent (the
 * converter's defaults). */
static llm_status rope_number(const cJSON *rs, const char *key, double fallback, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rs, key);
    *out = fallback;
    if (!v || cJSON_IsNull(v))
        return LLM_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0.0 && v->valuedouble < 1e9))
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          CFG ": field 'rope_scaling.%s' is not a positive number", key);
    *out = v->valuedouble;
    return LLM_OK;
}

/* Scaled rope changes the forward pass: "llama3" is what rope_freqs.weight
 * expresses (the model table's Llama row reads it), "linear" what
 * rope.scaling.factor does; other types are refused rather than run with
 * plain rope. */
static llm_status parse_rope_scaling(const cJSON *root, llmi_hf_config *c) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        return LLM_OK;
    if (!cJSON_IsObject(rs))
        return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": field 'rope_scaling' is not an object");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(t))
        t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "?";
    if (strcmp(type, "default") == 0)
        return LLM_OK;
    if (strcmp(type, "linear") == 0) {
        /* the converter writes the keys for its Llama and Gemma 3 classes */
        if (strcmp(c->arch, "llama") != 0 && strcmp(c->arch, "gemma3") != 0)
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              CFG ": rope_scaling type 'linear' is supported for Llama and "
                                  "Gemma 3 models only, not for %s",
                              c->arch);
        if (!cJSON_GetObjectItemCaseSensitive(rs, "factor"))
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              CFG ": rope_scaling type 'linear' has no field 'factor'");
        LLMI_TRY(rope_number(rs, "factor", 1.0, &c->rope_factor));
        c->rope_linear = true;
        return LLM_OK;
    }
    if (strcmp(type, "llama3") != 0)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          CFG ": rope_scaling type '%s' is not supported (only 'default', "
                              "'linear' and, for Llama, 'llama3')",
                          type);
    /* the converter writes rope_freqs for its Llama class only */
    if (strcmp(c->arch, "llama") != 0)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          CFG ": rope_scaling type 'llama3' is supported for Llama models only, "
                              "not for %s",
                          c->arch);
    c->rope_llama3 = true;
    LLMI_TRY(rope_number(rs, "factor", 8.0, &c->rope_factor));
    LLMI_TRY(rope_number(rs, "low_freq_factor", 1.0, &c->rope_low_freq_factor));
    LLMI_TRY(rope_number(rs, "high_freq_factor", 4.0, &c->rope_high_freq_factor));
    LLMI_TRY(rope_number(rs, "original_max_position_embeddings", 8192.0, &c->rope_orig_ctx));
    /* equal factors leave no band to blend over (a division by zero) */
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          CFG ": rope_scaling high_freq_factor %g is not above low_freq_factor %g",
                          c->rope_high_freq_factor, c->rope_low_freq_factor);
    return LLM_OK;
}

void llmi_hf_llama3_rope_factors(const llmi_hf_config *c, float *out) {
    /* Python's scalars meet float32 tensors in the converter: each is
     * rounded to float32 first, every operation is a float32 operation. */
    const float base = (float)c->rope_theta, dim = (float)c->head_dim;
    const float factor = (float)c->rope_factor, low = (float)c->rope_low_freq_factor;
    const float old_ctx = (float)c->rope_orig_ctx;
    const float low_wavelen = (float)(c->rope_orig_ctx / c->rope_low_freq_factor);
    const float high_wavelen = (float)(c->rope_orig_ctx / c->rope_high_freq_factor);
    const float band = (float)(c->rope_high_freq_factor - c->rope_low_freq_factor);
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    for (uint32_t i = 0; i < c->head_dim / 2; i++) {
        float freq = 1.0f / powf(base, (float)(2 * i) / dim);
        float wavelen = two_pi / freq;
        if (wavelen < high_wavelen) {
            out[i] = 1.0f;
        } else if (wavelen > low_wavelen) {
            out[i] = factor;
        } else {
            float smooth = (old_ctx / wavelen - low) / band;
            out[i] = 1.0f / ((1.0f - smooth) / factor + smooth);
        }
    }
}

static llm_status check_dtype(const cJSON *root) {
    static const char *const keys[] = {"torch_dtype", "dtype"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (!v || cJSON_IsNull(v))
            continue;
        if (!cJSON_IsString(v))
            return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": field '%s' is not a string", keys[i]);
        const char *s = v->valuestring;
        if (strcmp(s, "float32") && strcmp(s, "float16") && strcmp(s, "bfloat16"))
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              CFG ": field '%s' is '%s' (float32, float16 and bfloat16 are "
                                  "supported)",
                              keys[i], s);
    }
    return LLM_OK;
}

static llm_status parse_moe(const cJSON *root, const family_row *f, llmi_hf_config *c) {
    if (!f->moe)
        return LLM_OK;
    const char *n_key = f->family == LLMI_HF_MIXTRAL ? "num_local_experts" : "num_experts";
    LLMI_TRY(get_u32(root, n_key, true, &c->n_expert, NULL));
    LLMI_TRY(get_u32(root, "num_experts_per_tok", true, &c->n_expert_used, NULL));
    c->n_ff_exp = c->n_ff;
    if (f->family == LLMI_HF_QWEN3MOE)
        LLMI_TRY(get_u32(root, "moe_intermediate_size", true, &c->n_ff_exp, NULL));
    if (c->n_expert_used > c->n_expert || c->n_expert > 1024)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          CFG ": num_experts_per_tok %u with %s %u is inconsistent",
                          c->n_expert_used, n_key, c->n_expert);
    return LLM_OK;
}

/* A string field that must have one value when present (dflt: its
 * transformers default). */
static llm_status want_str(const cJSON *root, const char *key, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v))
        return LLM_OK;
    if (!cJSON_IsString(v) || strcmp(v->valuestring, want) != 0)
        return llmi_error(LLM_ERR_UNSUPPORTED, CFG ": %s '%s' is not supported (only '%s')", key,
                          cJSON_IsString(v) ? v->valuestring : "?", want);
    return LLM_OK;
}

/* BertModel: LayerNorm epsilon, learned absolute positions (a table of
 * max_position_embeddings, required), token types, GELU (erf). */
static llm_status parse_bert(const cJSON *root, llmi_hf_config *c) {
    LLMI_TRY(get_f32(root, "layer_norm_eps", true, 0.0f, 1.0f, &c->rms_eps));
    if (!c->n_ctx)
        return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": max_position_embeddings is missing");
    c->n_token_types = 2;
    LLMI_TRY(get_u32(root, "type_vocab_size", false, &c->n_token_types, NULL));
    LLMI_TRY(want_str(root, "hidden_act", "gelu"));
    LLMI_TRY(want_str(root, "position_embedding_type", "absolute"));
    if (c->n_embd % c->n_head != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          CFG ": hidden_size %u is not a multiple of num_attention_heads %u",
                          c->n_embd, c->n_head);
    c->head_dim = c->n_embd / c->n_head;
    c->n_head_kv = c->n_head;
    c->tie_embeddings = true; /* no LM head: logits, if asked for, use token_embd */
    return check_dtype(root);
}

static llm_status parse_root(const cJSON *root, llmi_hf_config *c) {
    if (!cJSON_IsObject(root))
        return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": not a JSON object");
    const family_row *f = find_family(root);
    if (!f)
        return unknown_family(root);
    memset(c, 0, sizeof *c);
    c->family = f->family;
    c->arch = f->arch;
    c->permute_qk = f->permute_qk;
    c->norm_plus_one = f->norm_plus_one;
    c->post_attn_is_ffn_norm = f->post_attn_is_ffn_norm;
    LLMI_TRY(get_u32(root, "num_hidden_layers", true, &c->n_layer, NULL));
    LLMI_TRY(get_u32(root, "hidden_size", true, &c->n_embd, NULL));
    LLMI_TRY(get_u32(root, "intermediate_size", true, &c->n_ff, NULL));
    LLMI_TRY(get_u32(root, "num_attention_heads", true, &c->n_head, NULL));
    LLMI_TRY(get_u32(root, "vocab_size", true, &c->n_vocab, NULL));
    c->n_head_kv = c->n_head;
    LLMI_TRY(get_u32(root, "num_key_value_heads", false, &c->n_head_kv, &c->explicit_head_kv));
    LLMI_TRY(get_u32(root, "head_dim", false, &c->head_dim, &c->explicit_head_dim));
    /* Gemma 3's config class defaults head_dim to 256, whatever the sizes */
    if (!c->explicit_head_dim && f->family == LLMI_HF_GEMMA3) {
        c->head_dim = 256;
        c->explicit_head_dim = true;
    }
    LLMI_TRY(get_u32(root, "max_position_embeddings", false, &c->n_ctx, NULL));
    if (f->family == LLMI_HF_BERT)
        return parse_bert(root, c);
    LLMI_TRY(get_f32(root, "rms_norm_eps", true, 0.0f, 1.0f, &c->rms_eps));
    c->rope_theta = f->default_rope_theta;
    LLMI_TRY(get_f32(root, "rope_theta", false, 0.0f, 1e12f, &c->rope_theta));
    if (!c->explicit_head_dim) {
        if (c->n_embd % c->n_head != 0)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              CFG ": hidden_size %u is not a multiple of num_attention_heads %u "
                                  "and head_dim is not given",
                              c->n_embd, c->n_head);
        c->head_dim = c->n_embd / c->n_head;
    }
    if (c->head_dim % 2 != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": head_dim %u is odd", c->head_dim);
    if (c->n_head_kv > c->n_head || c->n_head % c->n_head_kv != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          CFG ": num_attention_heads %u is not a multiple of "
                              "num_key_value_heads %u",
                          c->n_head, c->n_head_kv);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    /* transformers' default for these classes except Gemma is untied */
    c->tie_embeddings = f->family == LLMI_HF_GEMMA3;
    if (tie && !cJSON_IsNull(tie)) {
        if (!cJSON_IsBool(tie))
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              CFG ": field 'tie_word_embeddings' is not true or false");
        c->tie_embeddings = cJSON_IsTrue(tie);
    }
    if (f->family == LLMI_HF_MISTRAL || f->family == LLMI_HF_GEMMA3 || f->family == LLMI_HF_PHI3)
        LLMI_TRY(get_u32(root, "sliding_window", false, &c->sliding_window, NULL));
    LLMI_TRY(parse_rope_scaling(root, c));
    LLMI_TRY(check_dtype(root));
    return parse_moe(root, f, c);
}

llm_status llmi_hf_json_check_nul(const char *what, const char *json, size_t len, size_t base) {
    for (size_t i = 0; i < len; i++) {
        if (json[i] == '\0')
            return llmi_error(LLM_ERR_BAD_FORMAT, "%s: a NUL byte at byte %zu", what, base + i);
        if (json[i] != '\\' || i + 1 >= len)
            continue;
        /* An escape: a pair, skipped whole so "\\u0000" is no NUL. */
        if (json[i + 1] == 'u' && len - i >= 6 && memcmp(json + i + 2, "0000", 4) == 0)
            return llmi_error(LLM_ERR_BAD_FORMAT, "%s: a NUL character (\\u0000) at byte %zu", what,
                              base + i);
        i++;
    }
    return LLM_OK;
}

llm_status llmi_hf_config_parse(const char *json, size_t len, llmi_hf_config *c) {
    LLMI_TRY(llmi_hf_json_check_nul(CFG, json, len, 0));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root)
        return llmi_error(LLM_ERR_BAD_FORMAT, CFG ": not valid JSON (near byte %zu)",
                          end ? (size_t)(end - json) : (size_t)0);
    llm_status st = parse_root(root, c);
    cJSON_Delete(root);
    return st;
}

static llm_status w_arch_u32(llmi_gguf_writer *w, const char *arch, const char *key, uint32_t v) {
    char k[96];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return llmi_gguf_w_u32(w, k, v);
}

static llm_status w_arch_f32(llmi_gguf_writer *w, const char *arch, const char *key, float v) {
    char k[96];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return llmi_gguf_w_f32(w, k, v);
}

static llm_status w_rope_linear(llmi_gguf_writer *w, const char *arch, double factor) {
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    LLMI_TRY(llmi_gguf_w_str(w, key, "linear"));
    return w_arch_f32(w, arch, "rope.scaling.factor", (float)factor);
}

llm_status llmi_hf_config_write(const llmi_hf_config *c, llmi_gguf_writer *w) {
    const char *a = c->arch;
    LLMI_TRY(llmi_gguf_w_str(w, "general.architecture", a));
    LLMI_TRY(w_arch_u32(w, a, "block_count", c->n_layer));
    if (c->n_ctx)
        LLMI_TRY(w_arch_u32(w, a, "context_length", c->n_ctx));
    LLMI_TRY(w_arch_u32(w, a, "embedding_length", c->n_embd));
    LLMI_TRY(w_arch_u32(w, a, "feed_forward_length", c->n_ff));
    LLMI_TRY(w_arch_u32(w, a, "attention.head_count", c->n_head));
    if (c->explicit_head_kv)
        LLMI_TRY(w_arch_u32(w, a, "attention.head_count_kv", c->n_head_kv));
    if (c->family == LLMI_HF_BERT) { /* llama.cpp's keys for BERT */
        LLMI_TRY(w_arch_f32(w, a, "attention.layer_norm_epsilon", c->rms_eps));
        char key[96];
        snprintf(key, sizeof key, "%s.attention.causal", a);
        return llmi_gguf_w_bool(w, key, false);
    }
    LLMI_TRY(w_arch_f32(w, a, "rope.freq_base", c->rope_theta));
    LLMI_TRY(w_arch_f32(w, a, "attention.layer_norm_rms_epsilon", c->rms_eps));
    if (c->explicit_head_dim) {
        LLMI_TRY(w_arch_u32(w, a, "attention.key_length", c->head_dim));
        LLMI_TRY(w_arch_u32(w, a, "attention.value_length", c->head_dim));
    }
    if (strcmp(a, "llama") == 0) {
        LLMI_TRY(w_arch_u32(w, a, "vocab_size", c->n_vocab));
        LLMI_TRY(w_arch_u32(w, a, "rope.dimension_count", c->head_dim));
    }
    /* the Llama converter right after rope.dimension_count, Gemma 3's
     * after the window: key order does not matter to readers */
    if (c->rope_linear && strcmp(a, "llama") == 0)
        LLMI_TRY(w_rope_linear(w, a, c->rope_factor));
    if (c->family == LLMI_HF_PHI3)
        LLMI_TRY(w_arch_u32(w, a, "rope.dimension_count", c->n_embd / c->n_head));
    /* the converter writes Phi-3's window even when it is none (0) */
    if (c->sliding_window || c->family == LLMI_HF_PHI3)
        LLMI_TRY(w_arch_u32(w, a, "attention.sliding_window", c->sliding_window));
    if (c->rope_linear && strcmp(a, "gemma3") == 0)
        LLMI_TRY(w_rope_linear(w, a, c->rope_factor));
    if (c->n_expert) {
        LLMI_TRY(w_arch_u32(w, a, "expert_count", c->n_expert));
        LLMI_TRY(w_arch_u32(w, a, "expert_used_count", c->n_expert_used));
        if (c->family == LLMI_HF_QWEN3MOE)
            LLMI_TRY(w_arch_u32(w, a, "expert_feed_forward_length", c->n_ff_exp));
    }
    return LLM_OK;
}
