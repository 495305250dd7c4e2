/* Model loading: hyper-parameters from GGUF metadata, the weight table with
 * every shape checked against them, and the tokenizer. */
#include "model/model.h"

#include "hf/hf.h"

#include <math.h>
#include <stdio.h>

static llm_status arch_key(const llm_model *m, const char *suffix, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s.%s", m->hp.arch, suffix);
    if (n < 0 || (size_t)n >= cap)
        return llmi_error(LLM_ERR_INTERNAL, "key too long");
    return LLM_OK;
}

static llm_status get_arch_u32(const llm_model *m, const char *suffix, bool required,
                               uint32_t *out) {
    char key[96];
    LLMI_TRY(arch_key(m, suffix, key, sizeof key));
    return llmi_gguf_get_u32(m->file, key, required, out);
}

static llm_status get_arch_f32(const llm_model *m, const char *suffix, bool required, float *out) {
    char key[96];
    LLMI_TRY(arch_key(m, suffix, key, sizeof key));
    LLMI_TRY(llmi_gguf_get_f32(m->file, key, required, out));
    /* No hyper-parameter is meaningful as infinity or NaN; either one
     * would turn every activation into NaN with no error. */
    if (!isfinite(*out))
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s = %g is not a finite number", key, (double)*out);
    return LLM_OK;
}

static llm_status check_dim(const char *what, uint32_t v, uint32_t max) {
    if (v == 0 || v > max)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s = %u is out of range (1..%u)", what, v, max);
    return LLM_OK;
}

/* The expert keys, as llama.cpp reads them: a file without expert_count is
 * dense, one with it needs expert_used_count in 1..expert_count. */
static llm_status load_experts(llm_model *m) {
    const llmi_arch *a = m->arch;
    llmi_features *f = &m->hp.features;
    f->n_expert = f->n_expert_used = f->n_ff_exp = f->n_ff_shexp = 0;
    f->expert_weights_norm = false;
    if (a->experts == LLMI_ABSENT)
        return LLM_OK;
    LLMI_TRY(get_arch_u32(m, "expert_count", a->experts == LLMI_REQUIRED, &f->n_expert));
    if (f->n_expert == 0) {
        if (a->experts == LLMI_REQUIRED)
            return llmi_error(LLM_ERR_BAD_FORMAT, "%s.expert_count is 0", m->hp.arch);
        return LLM_OK;
    }
    /* llama.cpp's limit (LLAMA_MAX_EXPERTS). */
    LLMI_TRY(check_dim("expert_count", f->n_expert, 512));
    LLMI_TRY(get_arch_u32(m, "expert_used_count", true, &f->n_expert_used));
    if (f->n_expert_used == 0 || f->n_expert_used > f->n_expert)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s.expert_used_count = %u is out of range (1..expert_count %u)",
                          m->hp.arch, f->n_expert_used, f->n_expert);
    f->n_ff_exp = m->hp.n_ff;
    if (a->expert_ff == LLMI_EXPERT_FF_KEY) {
        f->n_ff_exp = m->hp.n_ff / f->n_expert_used;
        LLMI_TRY(get_arch_u32(m, "expert_feed_forward_length", false, &f->n_ff_exp));
    }
    LLMI_TRY(check_dim("expert_feed_forward_length", f->n_ff_exp, 1u << 18));
    f->n_ff_shexp = m->hp.n_ff;
    LLMI_TRY(get_arch_u32(m, "expert_shared_feed_forward_length", false, &f->n_ff_shexp));
    LLMI_TRY(check_dim("expert_shared_feed_forward_length", f->n_ff_shexp, 1u << 18));
    f->expert_weights_norm = a->expert_weights_norm;
    return LLM_OK;
}

/* The row's choices with the values of the keys it names. */
static llm_status load_features(llm_model *m) {
    const llmi_arch *a = m->arch;
    llmi_features *f = &m->hp.features;
    f->norm = a->norm;
    f->ffn_act = a->ffn_act;
    f->encoder = a->encoder;
    f->embd_scale = a->embd_scale == LLMI_EMBD_SCALE_SQRT_EMBD ? sqrtf((float)m->hp.n_embd) : 1.0f;
    f->attn_softcap = a->attn_softcap;
    if (a->attn_softcap_key)
        LLMI_TRY(get_arch_f32(m, a->attn_softcap_key, false, &f->attn_softcap));
    f->logit_softcap = a->logit_softcap;
    if (a->logit_softcap_key)
        LLMI_TRY(get_arch_f32(m, a->logit_softcap_key, false, &f->logit_softcap));
    if (!(f->attn_softcap >= 0.0f && f->attn_softcap < 1e6f) ||
        !(f->logit_softcap >= 0.0f && f->logit_softcap < 1e6f))
        return llmi_error(LLM_ERR_BAD_FORMAT, "soft-cap %g / %g is out of range",
                          (double)f->attn_softcap, (double)f->logit_softcap);
    LLMI_TRY(load_experts(m));
    f->swa = a->swa;
    f->swa_period = a->swa_period;
    f->swa_rope_base = a->swa_rope_base > 0.0f ? a->swa_rope_base : m->hp.rope_base;
    f->swa_rope_freq_scale =
        a->swa_rope_freq_scale > 0.0f ? a->swa_rope_freq_scale : m->hp.rope_freq_scale;
    if (a->swa != LLMI_SWA_NONE) {
        LLMI_TRY(get_arch_u32(m, "attention.sliding_window", !a->swa_optional, &f->swa_window));
        if (a->swa_optional && f->swa_window == 0) {
            f->swa = LLMI_SWA_NONE;
            f->swa_period = 0;
            f->swa_rope_base = m->hp.rope_base;
            f->swa_rope_freq_scale = m->hp.rope_freq_scale;
        } else {
            LLMI_TRY(check_dim("attention.sliding_window", f->swa_window, 1u << 24));
        }
    }
    /* llama.cpp scales Gemma 3 27B's attention (its 62 layers identify it)
     * by 1/sqrt(n_embd / n_head), not 1/sqrt(head_dim) as the forward pass
     * does; refused rather than run with the wrong scale. */
    if (strcmp(a->name, "gemma3") == 0 && m->hp.n_layer == 62 &&
        m->hp.n_embd / m->hp.n_head != m->hp.head_dim)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "Gemma 3 27B's attention scale 1/sqrt(n_embd / n_head) = 1/sqrt(%u) "
                          "is not implemented yet",
                          m->hp.n_embd / m->hp.n_head);
    return llmi_arch_check(f);
}

/* Finds the row (unless given) for the file's general.architecture. */
static llm_status load_arch(llm_model *m, const llmi_arch *given) {
    llmi_hparams *hp = &m->hp;
    llmi_str arch;
    LLMI_TRY(llmi_gguf_get_str(m->file, "general.architecture", true, &arch));
    if (arch.len == 0 || arch.len >= sizeof hp->arch)
        return llmi_error(LLM_ERR_BAD_FORMAT, "general.architecture has length %llu",
                          (unsigned long long)arch.len);
    memcpy(hp->arch, arch.ptr, arch.len);
    hp->arch[arch.len] = '\0';
    m->arch = given ? given : llmi_arch_find(hp->arch);
    if (!m->arch) {
        char list[256];
        llmi_arch_supported_list(list, sizeof list);
        return llmi_error(LLM_ERR_UNSUPPORTED, "architecture '%s' is not supported (supported: %s)",
                          hp->arch, list);
    }
    if (strcmp(m->arch->name, hp->arch) != 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "architecture '%s' loaded with row '%s'",
                          hp->arch, m->arch->name);
    hp->rope_layout = m->arch->rope;
    return LLM_OK;
}

/* RoPE scaling as llama.cpp reads it: <arch>.rope.scaling.factor (or the
 * legacy <arch>.rope.scale_linear) divides every position in the rotation
 * angle. Only the linear kind is implemented; YaRN, LongRoPE and the like
 * also change the angles per frequency, so a file asking for them is
 * refused rather than run with wrong angles. */
static llm_status load_rope_scaling(llm_model *m) {
    char key[96];
    llmi_str type = {0};
    LLMI_TRY(arch_key(m, "rope.scaling.type", key, sizeof key));
    LLMI_TRY(llmi_gguf_get_str(m->file, key, false, &type));
    float factor = 0.0f;
    LLMI_TRY(get_arch_f32(m, "rope.scaling.factor", false, &factor));
    if (factor == 0.0f)
        LLMI_TRY(get_arch_f32(m, "rope.scale_linear", false, &factor));
    if (factor == 0.0f)
        factor = 1.0f;
    if (!(factor > 0.0f && factor < 1e6f))
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s.rope.scaling.factor %g is out of range",
                          m->hp.arch, (double)factor);
    bool linear = type.len == 0 || (type.len == 6 && memcmp(type.ptr, "linear", 6) == 0) ||
                  (type.len == 4 && memcmp(type.ptr, "none", 4) == 0);
    if (!linear && factor != 1.0f)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "RoPE scaling (%s.rope.scaling.type '%.*s', factor %g) is not "
                          "implemented (only 'linear')",
                          m->hp.arch, (int)(type.len > 32 ? 32 : type.len), type.ptr,
                          (double)factor);
    m->hp.rope_freq_scale = 1.0f / factor;
    return LLM_OK;
}

static llm_status load_hparams(llm_model *m) {
    llmi_hparams *hp = &m->hp;
    llmi_str name = {0};
    LLMI_TRY(llmi_gguf_get_str(m->file, "general.name", false, &name));
    size_t nl = name.len < sizeof m->name - 1 ? (size_t)name.len : sizeof m->name - 1;
    if (nl)
        memcpy(m->name, name.ptr, nl);
    m->name[nl] = '\0';

    LLMI_TRY(get_arch_u32(m, "block_count", true, &hp->n_layer));
    LLMI_TRY(get_arch_u32(m, "embedding_length", true, &hp->n_embd));
    LLMI_TRY(get_arch_u32(m, "feed_forward_length", true, &hp->n_ff));
    LLMI_TRY(get_arch_u32(m, "attention.head_count", true, &hp->n_head));
    hp->n_head_kv = hp->n_head;
    LLMI_TRY(get_arch_u32(m, "attention.head_count_kv", false, &hp->n_head_kv));
    hp->n_ctx_train = 2048;
    LLMI_TRY(get_arch_u32(m, "context_length", false, &hp->n_ctx_train));
    hp->rope_base = 10000.0f;
    LLMI_TRY(get_arch_f32(m, "rope.freq_base", false, &hp->rope_base));
    hp->rms_eps = 1e-5f;
    LLMI_TRY(get_arch_f32(m, "attention.layer_norm_rms_epsilon", false, &hp->rms_eps));
    /* a LayerNorm model's epsilon (llama.cpp writes this key for BERT) */
    LLMI_TRY(get_arch_f32(m, "attention.layer_norm_epsilon", false, &hp->rms_eps));

    hp->pooling_type = LLMI_POOLING_UNSET;
    LLMI_TRY(get_arch_u32(m, "pooling_type", false, &hp->pooling_type));

    LLMI_TRY(check_dim("block_count", hp->n_layer, 1024));
    LLMI_TRY(check_dim("embedding_length", hp->n_embd, 1u << 16));
    LLMI_TRY(check_dim("feed_forward_length", hp->n_ff, 1u << 18));
    LLMI_TRY(check_dim("attention.head_count", hp->n_head, 1024));
    LLMI_TRY(check_dim("attention.head_count_kv", hp->n_head_kv, hp->n_head));
    LLMI_TRY(check_dim("context_length", hp->n_ctx_train, 1u << 24));
    if (hp->n_head % hp->n_head_kv != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "head_count %u is not a multiple of head_count_kv %u",
                          hp->n_head, hp->n_head_kv);
    hp->head_dim = hp->n_embd / hp->n_head;
    LLMI_TRY(get_arch_u32(m, "attention.key_length", false, &hp->head_dim));
    if (hp->head_dim == 0 || hp->head_dim % 2 != 0 || hp->head_dim > 1024)
        return llmi_error(LLM_ERR_BAD_FORMAT, "head dimension %u is invalid", hp->head_dim);
    hp->rope_dim = hp->head_dim;
    LLMI_TRY(get_arch_u32(m, "rope.dimension_count", false, &hp->rope_dim));
    if (hp->rope_dim == 0 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2 != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "rope.dimension_count %u invalid for head dim %u",
                          hp->rope_dim, hp->head_dim);
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f))
        return llmi_error(LLM_ERR_BAD_FORMAT, "layer_norm_rms_epsilon %g is out of range",
                          (double)hp->rms_eps);
    if (!(hp->rope_base > 0.0f))
        return llmi_error(LLM_ERR_BAD_FORMAT, "rope.freq_base %g is out of range",
                          (double)hp->rope_base);
    LLMI_TRY(load_rope_scaling(m));
    return load_features(m);
}

/* Weight types every backend multiplies (core's list, which the kernels
 * table agrees with: test_ktraits). */
static bool has_kernel(llmi_ttype t) {
    const llmi_ttype_info *ti = llmi_ttype_get(t);
    return ti && ti->weight;
}

static llm_status find_tensor(const llm_model *m, const char *name, bool required,
                              const llmi_gguf_tensor **out) {
    *out = llmi_gguf_find_tensor(m->file, name);
    if (!*out && required)
        return llmi_error(LLM_ERR_BAD_FORMAT, "tensor '%s' is missing", name);
    return LLM_OK;
}

/* The kernels read weights as floats (F32) or 16-bit fields (F16, BF16 and
 * the quantized blocks), so the data must be aligned to them; a file whose
 * general.alignment is 1 or 2 can place it otherwise. */
static llm_status check_aligned(const char *name, const llmi_gguf_tensor *t) {
    size_t align = t->type == LLMI_T_F32 ? 4 : 2;
    if ((uintptr_t)t->data % align != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "tensor '%s' data (offset %llu) is not aligned to %zu bytes", name,
                          (unsigned long long)t->offset, align);
    return LLM_OK;
}

static uint64_t role_dim(const llmi_hparams *hp, llmi_dim d) {
    switch (d) {
    case LLMI_DIM_EMBD:
        return hp->n_embd;
    case LLMI_DIM_Q:
        return (uint64_t)hp->n_head * hp->head_dim;
    case LLMI_DIM_KV:
        return (uint64_t)hp->n_head_kv * hp->head_dim;
    case LLMI_DIM_FF:
        return hp->n_ff;
    case LLMI_DIM_HEAD:
        return hp->head_dim;
    case LLMI_DIM_VOCAB:
        return hp->n_vocab;
    case LLMI_DIM_EXPERT:
        return hp->features.n_expert;
    case LLMI_DIM_FF_EXP:
        return hp->features.n_ff_exp;
    case LLMI_DIM_FF_SHEXP:
        return hp->features.n_ff_shexp;
    case LLMI_DIM_QKV:
        return (uint64_t)(hp->n_head + 2 * (uint64_t)hp->n_head_kv) * hp->head_dim;
    case LLMI_DIM_FF2:
        return 2 * (uint64_t)hp->n_ff;
    case LLMI_DIM_ROPE_HALF:
        return hp->rope_dim / 2;
    case LLMI_DIM_CTX:
        return hp->n_ctx_train;
    case LLMI_DIM_TOKEN_TYPES:
        return hp->n_token_types;
    default:
        return 1;
    }
}

/* A matrix (stack 0), or `stack` matrices of one shape one after the
 * other (GGUF ne[2]); then w describes one of them and holds the whole
 * stack's data (llmi_stack_slice). */
static llm_status map_matrix(llm_model *m, const char *name, const llmi_gguf_tensor *t,
                             uint64_t cols, uint64_t rows, uint64_t stack, llmi_weight *w) {
    bool shape_ok = t->n_dims == (stack ? 3u : 2u) && t->ne[0] == cols && t->ne[1] == rows &&
                    (!stack || t->ne[2] == stack);
    if (!shape_ok) {
        if (stack)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "tensor '%s' has shape [%llu, %llu, %llu] (%u dims), expected "
                              "[%llu, %llu, %llu] (columns, rows, experts)",
                              name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                              (unsigned long long)t->ne[2], t->n_dims, (unsigned long long)cols,
                              (unsigned long long)rows, (unsigned long long)stack);
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "tensor '%s' has shape [%llu, %llu] (%u dims), expected [%llu, %llu]",
                          name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                          t->n_dims, (unsigned long long)cols, (unsigned long long)rows);
    }
    if (!has_kernel(t->type))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "tensor '%s' has type %u, which has no kernel (F32, F16, BF16, Q4_0, "
                          "Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K have)",
                          name, (unsigned)t->type);
    LLMI_TRY(check_aligned(name, t));
    w->data = t->data;
    w->type = t->type;
    w->rows = (int64_t)rows;
    w->cols = (int64_t)cols;
    w->row_bytes = llmi_ttype_row_bytes(t->type, cols);
    m->n_params += rows * cols * (stack ? stack : 1);
    m->weight_bytes += t->nbytes;
    return LLM_OK;
}

/* A vector is one F32 row. */
static llm_status map_vector(llm_model *m, const char *name, const llmi_gguf_tensor *t, uint64_t n,
                             llmi_weight *w) {
    if (t->n_dims != 1 || t->ne[0] != n)
        return llmi_error(LLM_ERR_BAD_FORMAT, "tensor '%s' has %llu elements, expected %llu", name,
                          (unsigned long long)t->ne[0], (unsigned long long)n);
    if (t->type != LLMI_T_F32)
        return llmi_error(LLM_ERR_UNSUPPORTED, "tensor '%s' must be F32 (type %u)", name,
                          (unsigned)t->type);
    LLMI_TRY(check_aligned(name, t));
    w->data = t->data;
    w->type = LLMI_T_F32;
    w->rows = 1;
    w->cols = (int64_t)n;
    w->row_bytes = n * sizeof(float);
    m->n_params += n;
    m->weight_bytes += t->nbytes;
    return LLM_OK;
}

/* Maps one role's tensor (layer `layer` for layer roles) with its shape
 * checked; an absent role, or an optional one the file lacks, leaves w
 * zeroed. */
static llm_status map_role(llm_model *m, const llmi_role_info *role, llmi_need need, uint32_t layer,
                           llmi_weight *w) {
    memset(w, 0, sizeof *w);
    if (need == LLMI_ABSENT)
        return LLM_OK;
    char name[96];
    int n = snprintf(name, sizeof name, role->name, layer);
    if (n < 0 || (size_t)n >= sizeof name)
        return llmi_error(LLM_ERR_INTERNAL, "tensor name too long");
    const llmi_gguf_tensor *t;
    LLMI_TRY(find_tensor(m, name, need == LLMI_REQUIRED, &t));
    if (!t)
        return LLM_OK;
    uint64_t in = role_dim(&m->hp, role->in);
    if (role->out == LLMI_DIM_ONE)
        return map_vector(m, name, t, in, w);
    uint64_t stack = role->stack == LLMI_DIM_ONE ? 0 : role_dim(&m->hp, role->stack);
    return map_matrix(m, name, t, in, role_dim(&m->hp, role->out), stack, w);
}

/* Rows [row0, row0 + rows) of a mapped matrix as a weight of their own:
 * rows are contiguous, so a view is a pointer offset, never a copy. Views
 * add nothing to n_params or weight_bytes (the fused tensor counted). */
static llmi_weight row_view(const llmi_weight *w, int64_t row0, int64_t rows) {
    llmi_weight v = *w;
    v.data = (const uint8_t *)w->data + (size_t)row0 * w->row_bytes;
    v.rows = rows;
    return v;
}

/* A fused weight the row names becomes views of the roles the forward
 * pass reads; its shape was checked against the sum of theirs. */
static void split_fused(const llmi_hparams *hp, llmi_layer *L) {
    llmi_weight *W = L->w;
    if (W[LLMI_ROLE_QKV].data) {
        int64_t q = (int64_t)hp->n_head * hp->head_dim, kv = (int64_t)hp->n_head_kv * hp->head_dim;
        W[LLMI_ROLE_Q] = row_view(&W[LLMI_ROLE_QKV], 0, q);
        W[LLMI_ROLE_K] = row_view(&W[LLMI_ROLE_QKV], q, kv);
        W[LLMI_ROLE_V] = row_view(&W[LLMI_ROLE_QKV], q + kv, kv);
    }
    if (W[LLMI_ROLE_GATE_UP].data) {
        W[LLMI_ROLE_GATE] = row_view(&W[LLMI_ROLE_GATE_UP], 0, hp->n_ff);
        W[LLMI_ROLE_UP] = row_view(&W[LLMI_ROLE_GATE_UP], hp->n_ff, hp->n_ff);
    }
}

/* Frequency divisors must be finite and positive: the forward pass
 * divides by them. */
static llm_status check_rope_freqs(const llmi_weight *w) {
    const float *f = w->data;
    for (int64_t i = 0; f && i < w->cols; i++)
        if (!(f[i] > 0.0f && f[i] < INFINITY))
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "tensor 'rope_freqs.weight' has factor %g at %lld (must be > 0)",
                              (double)f[i], (long long)i);
    return LLM_OK;
}

static llm_status map_weights(llm_model *m) {
    llmi_hparams *hp = &m->hp;
    const llmi_gguf_tensor *emb;
    LLMI_TRY(find_tensor(m, llmi_model_roles[LLMI_ROLE_TOKEN_EMBD].name, true, &emb));
    if (emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > (1u << 22))
        return llmi_error(LLM_ERR_BAD_FORMAT, "tensor 'token_embd.weight' has a bad shape");
    hp->n_vocab = (uint32_t)emb->ne[1];
    if (m->arch->model[LLMI_ROLE_TOKEN_TYPES] != LLMI_ABSENT) {
        const llmi_gguf_tensor *tt;
        const char *tt_name = llmi_model_roles[LLMI_ROLE_TOKEN_TYPES].name;
        LLMI_TRY(find_tensor(m, tt_name, true, &tt));
        if (tt->n_dims != 2 || tt->ne[1] == 0 || tt->ne[1] > 1024)
            return llmi_error(LLM_ERR_BAD_FORMAT, "tensor '%s' has a bad shape", tt_name);
        hp->n_token_types = (uint32_t)tt->ne[1];
    }
    for (int r = 0; r < LLMI_MODEL_ROLES; r++)
        LLMI_TRY(map_role(m, &llmi_model_roles[r], (llmi_need)m->arch->model[r], 0, &m->w[r]));
    LLMI_TRY(check_rope_freqs(&m->w[LLMI_ROLE_ROPE_FREQS]));
    for (int r = LLMI_ROLE_ROPE_FACTORS_LONG; r <= LLMI_ROLE_ROPE_FACTORS_SHORT; r++)
        if (m->w[r].data)
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "tensor '%s' (LongRoPE scaling of 128k-context models) is not "
                              "supported yet",
                              llmi_model_roles[r].name);
    hp->tied_embeddings = m->w[LLMI_ROLE_OUTPUT].data == NULL;
    if (hp->tied_embeddings)
        m->w[LLMI_ROLE_OUTPUT] = m->w[LLMI_ROLE_TOKEN_EMBD];
    m->layers = llmi_calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return llmi_oom("layer table");
    /* A model has one kind of FFN: the other kind's roles are not looked up. */
    llmi_role_ffn skip = hp->features.n_expert ? LLMI_FFN_DENSE : LLMI_FFN_MOE;
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        for (int r = 0; r < LLMI_LAYER_ROLES; r++) {
            llmi_need need = (llmi_need)m->arch->layer[r];
            if (llmi_layer_roles[r].ffn == skip)
                need = LLMI_ABSENT;
            LLMI_TRY(map_role(m, &llmi_layer_roles[r], need, i, &m->layers[i].w[r]));
        }
        split_fused(hp, &m->layers[i]);
    }
    return LLM_OK;
}

/* ---- fingerprint ---- */

typedef struct fp_hash {
    uint64_t h;
} fp_hash;

static inline uint64_t fp_mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static void fp_u64(fp_hash *f, uint64_t v) { f->h = fp_mix(f->h ^ v) + 0x9e3779b97f4a7c15ull; }

/* Bytes in 8-byte little-endian words, then the length, so inputs of
 * different lengths never meet. */
static void fp_bytes(fp_hash *f, const void *data, size_t n) {
    const uint8_t *p = data;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        fp_u64(f, w);
    }
    uint64_t tail = 0;
    for (size_t k = 0; i + k < n; k++)
        tail |= (uint64_t)p[i + k] << (8 * k);
    fp_u64(f, tail);
    fp_u64(f, n);
}

static uint64_t fp_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

uint64_t llmi_model_fingerprint(const llm_model *m) {
    enum { END = 4096 };
    const llmi_hparams *hp = &m->hp;
    fp_hash f = {0x6c6c6d696e666572ull}; /* "llminfer" */
    fp_bytes(&f, hp->arch, strlen(hp->arch));
    const uint64_t dims[] = {hp->n_layer,
                             hp->n_embd,
                             hp->n_head,
                             hp->n_head_kv,
                             hp->n_ff,
                             hp->n_vocab,
                             hp->n_ctx_train,
                             hp->head_dim,
                             hp->rope_dim,
                             fp_f32(hp->rope_base),
                             fp_f32(hp->rms_eps),
                             hp->rope_layout,
                             hp->tied_embeddings};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        fp_u64(&f, dims[i]);
    /* Only what differs from the plain decoder, so fingerprints of models
     * from before the features existed stay the same. */
    const llmi_features *ft = &hp->features;
    if (ft->norm || ft->ffn_act || ft->embd_scale != 1.0f || ft->attn_softcap ||
        ft->logit_softcap || ft->swa) {
        const uint64_t feat[] = {ft->norm,
                                 ft->ffn_act,
                                 fp_f32(ft->embd_scale),
                                 fp_f32(ft->attn_softcap),
                                 fp_f32(ft->logit_softcap),
                                 ft->swa,
                                 ft->swa_period,
                                 ft->swa_window,
                                 fp_f32(ft->swa ? ft->swa_rope_base : 0.0f)};
        for (size_t i = 0; i < sizeof feat / sizeof feat[0]; i++)
            fp_u64(&f, feat[i]);
    }
    if (hp->rope_freq_scale != 1.0f || (ft->swa && ft->swa_rope_freq_scale != 1.0f)) {
        fp_u64(&f, fp_f32(hp->rope_freq_scale));
        fp_u64(&f, fp_f32(ft->swa ? ft->swa_rope_freq_scale : 0.0f));
    }
    if (ft->n_expert) {
        const uint64_t moe[] = {ft->n_expert, ft->n_expert_used, ft->n_ff_exp,
                                ft->expert_weights_norm, ft->n_ff_shexp};
        for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++)
            fp_u64(&f, moe[i]);
    }
    const llmi_gguf *g = m->file;
    fp_u64(&f, g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const llmi_gguf_tensor *t = &g->tensors[i];
        fp_bytes(&f, t->name.ptr, (size_t)t->name.len);
        fp_u64(&f, t->type);
        fp_u64(&f, t->n_dims);
        for (int d = 0; d < 4; d++)
            fp_u64(&f, t->ne[d]);
        if (t->nbytes <= 2 * END) {
            fp_bytes(&f, t->data, t->nbytes);
        } else {
            fp_bytes(&f, t->data, END);
            fp_bytes(&f, (const uint8_t *)t->data + t->nbytes - END, END);
        }
    }
    return fp_mix(f.h);
}

static llm_status load_model(const char *path, bool use_mmap, const llmi_arch *arch,
                             const llmi_progress *progress, llm_model **out);

llm_status llmi_model_load(const char *path, bool use_mmap, llm_model **out) {
    return load_model(path, use_mmap, NULL, NULL, out);
}

llm_status llmi_model_load_progress(const char *path, bool use_mmap, const llmi_progress *progress,
                                    llm_model **out) {
    return load_model(path, use_mmap, NULL, progress, out);
}

/* <arch>.vocab_size is not needed (the token list and token_embd decide),
 * but a file where it disagrees with them was put together wrongly. */
static llm_status check_vocab_size_key(const llm_model *m) {
    uint32_t n = 0;
    char key[96];
    LLMI_TRY(arch_key(m, "vocab_size", key, sizeof key));
    if (!llmi_gguf_find(m->file, key))
        return LLM_OK;
    LLMI_TRY(llmi_gguf_get_u32(m->file, key, true, &n));
    if (n != llmi_tokenizer_n_vocab(m->tok))
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s = %u disagrees with the %u tokens of the file",
                          key, n, llmi_tokenizer_n_vocab(m->tok));
    return LLM_OK;
}

llm_status llmi_model_load_arch(const char *path, bool use_mmap, const llmi_arch *arch,
                                llm_model **out) {
    return load_model(path, use_mmap, arch, NULL, out);
}

static llm_status open_file(const char *path, bool use_mmap, const llmi_progress *progress,
                            llmi_gguf **out) {
    if (!llmi_hf_is_folder(path))
        return llmi_gguf_open_progress(path, use_mmap, progress, out);
    LLMI_TRY(llmi_hf_open(path, use_mmap, out));
    llm_status st = llmi_progress_report(progress, LLM_PROGRESS_READ, 0, (*out)->size);
    if (st == LLM_OK)
        st = llmi_progress_report(progress, LLM_PROGRESS_READ, (*out)->size, (*out)->size);
    if (st != LLM_OK) {
        llmi_gguf_close(*out);
        *out = NULL;
    }
    return st;
}

static llm_status load_model(const char *path, bool use_mmap, const llmi_arch *arch,
                             const llmi_progress *progress, llm_model **out) {
    *out = NULL;
    llm_model *m = llmi_calloc(1, sizeof *m);
    if (!m)
        return llmi_oom("model");
    if (pthread_mutex_init(&m->grammar_vocab.lock, NULL) != 0) {
        llmi_free(m);
        return llmi_error(LLM_ERR_INTERNAL, "model: mutex");
    }
    llm_status st = open_file(path, use_mmap, progress, &m->file);
    if (st != LLM_OK)
        goto fail;
    if ((st = load_arch(m, arch)) != LLM_OK)
        goto fail;
    if ((st = load_hparams(m)) != LLM_OK)
        goto fail;
    if ((st = map_weights(m)) != LLM_OK)
        goto fail;
    if ((st = llmi_tokenizer_load(m->file, &m->tok)) != LLM_OK)
        goto fail;
    /* Equal, as llama.cpp requires: a row without a token could be sampled
     * and then not be detokenized. */
    if (llmi_tokenizer_n_vocab(m->tok) != m->hp.n_vocab) {
        st = llmi_error(LLM_ERR_BAD_FORMAT, "tokenizer has %u tokens but token_embd has %u rows",
                        llmi_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    if ((st = check_vocab_size_key(m)) != LLM_OK)
        goto fail;
    m->fingerprint = llmi_model_fingerprint(m);
    llmi_log(LLM_LOG_INFO, "loaded %s: %s, %u layers, %u embd, %u vocab, %.1f MB weights", path,
             m->hp.arch, m->hp.n_layer, m->hp.n_embd, m->hp.n_vocab, m->weight_bytes / 1e6);
    *out = m;
    return LLM_OK;
fail:
    /* A required key that is absent makes the file malformed, not "not found". */
    if (st == LLM_ERR_NOT_FOUND)
        st = LLM_ERR_BAD_FORMAT;
    llmi_error_prefix("loading '%s'", path);
    llmi_model_free(m);
    return st;
}

void llmi_model_free(llm_model *m) {
    if (!m)
        return;
    if (m->grammar_vocab.data)
        m->grammar_vocab.release(m->grammar_vocab.data);
    pthread_mutex_destroy(&m->grammar_vocab.lock);
    llmi_tokenizer_free(m->tok);
    llmi_free(m->layers);
    llmi_gguf_close(m->file);
    llmi_free(m);
}

void llmi_model_release_pages(const llm_model *m, const void *data, size_t bytes) {
    if (m->file)
        llmi_gguf_release_pages(m->file, data, bytes);
}
