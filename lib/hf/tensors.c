/* Checkpoint tensor names -> GGUF names, with the converter's transforms.
 *
 * Hugging Face names are the same across the Llama-like classes, so one
 * table of name rules serves all; the few differences (Gemma's norms, which
 * classes permute q/k) are flags of the config. Each rule states the
 * tensor's expected shape in config sizes, so a checkpoint that disagrees
 * with its config.json is refused naming both. */
#include "hf/hf_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum dim {
    D_1,
    D_EMBD,
    D_Q,
    D_KV,
    D_FF,
    D_HEAD,
    D_VOCAB,
    D_QKV,
    D_FF2,
    D_FFEXP,
    D_NEXP,
    D_CTX,  /* max_position_embeddings (BERT) */
    D_TYPES /* type_vocab_size (BERT) */
} dim;

typedef enum op {
    OP_KEEP,      /* matrix: as stored; vector: widened to F32 */
    OP_PERMUTE_Q, /* rows reordered per q head for adjacent-pair rope */
    OP_PERMUTE_K, /* the same per k head */
    OP_NORM,      /* vector to F32, + 1 where the config says (Gemma) */
    OP_SKIP,      /* not part of the GGUF (rotary inv_freq buffers) */
} op;

typedef struct rule {
    const char *hf;     /* after "model.layers.N." for layer rules */
    const char *gguf;   /* after "blk.N." for layer rules */
    uint8_t rows, cols; /* cols D_1: a vector of `rows` elements */
    uint8_t op;
} rule;

static const rule model_rules[] = {
    {"model.embed_tokens.weight", "token_embd.weight", D_VOCAB, D_EMBD, OP_KEEP},
    {"model.norm.weight", "output_norm.weight", D_EMBD, D_1, OP_NORM},
    {"lm_head.weight", "output.weight", D_VOCAB, D_EMBD, OP_KEEP},
};

static const rule layer_rules[] = {
    {"input_layernorm.weight", "attn_norm.weight", D_EMBD, D_1, OP_NORM},
    {"self_attn.q_proj.weight", "attn_q.weight", D_Q, D_EMBD, OP_PERMUTE_Q},
    {"self_attn.k_proj.weight", "attn_k.weight", D_KV, D_EMBD, OP_PERMUTE_K},
    {"self_attn.v_proj.weight", "attn_v.weight", D_KV, D_EMBD, OP_KEEP},
    {"self_attn.q_proj.bias", "attn_q.bias", D_Q, D_1, OP_PERMUTE_Q},
    {"self_attn.k_proj.bias", "attn_k.bias", D_KV, D_1, OP_PERMUTE_K},
    {"self_attn.v_proj.bias", "attn_v.bias", D_KV, D_1, OP_KEEP},
    {"self_attn.o_proj.weight", "attn_output.weight", D_EMBD, D_Q, OP_KEEP},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight", D_QKV, D_EMBD, OP_KEEP},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", D_HEAD, D_1, OP_NORM},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", D_HEAD, D_1, OP_NORM},
    /* gguf NULL: ffn_norm, or post_attention_norm where a pre-FFN norm
     * follows (Gemma) */
    {"post_attention_layernorm.weight", NULL, D_EMBD, D_1, OP_NORM},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight", D_EMBD, D_1, OP_NORM},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", D_EMBD, D_1, OP_NORM},
    {"mlp.gate_proj.weight", "ffn_gate.weight", D_FF, D_EMBD, OP_KEEP},
    {"mlp.up_proj.weight", "ffn_up.weight", D_FF, D_EMBD, OP_KEEP},
    {"mlp.down_proj.weight", "ffn_down.weight", D_EMBD, D_FF, OP_KEEP},
    {"mlp.gate_up_proj.weight", "ffn_up.weight", D_FF2, D_EMBD, OP_KEEP},
    {"mlp.gate.weight", "ffn_gate_inp.weight", D_NEXP, D_EMBD, OP_KEEP},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight", D_NEXP, D_EMBD, OP_KEEP},
    {"self_attn.rotary_emb.inv_freq", NULL, D_1, D_1, OP_SKIP},
};

/* BertModel (BERT encoders), names as llama.cpp's converter maps them; a
 * "bert." prefix (checkpoints of the task classes) is dropped first. */
static const rule bert_model_rules[] = {
    {"embeddings.word_embeddings.weight", "token_embd.weight", D_VOCAB, D_EMBD, OP_KEEP},
    {"embeddings.position_embeddings.weight", "position_embd.weight", D_CTX, D_EMBD, OP_KEEP},
    {"embeddings.token_type_embeddings.weight", "token_types.weight", D_TYPES, D_EMBD, OP_KEEP},
    {"embeddings.LayerNorm.weight", "token_embd_norm.weight", D_EMBD, D_1, OP_NORM},
    {"embeddings.LayerNorm.bias", "token_embd_norm.bias", D_EMBD, D_1, OP_KEEP},
    {"embeddings.position_ids", NULL, D_1, D_1, OP_SKIP},
    {"pooler.dense.weight", NULL, D_1, D_1, OP_SKIP}, /* the CLS pooler head: unused */
    {"pooler.dense.bias", NULL, D_1, D_1, OP_SKIP},
};

static const rule bert_layer_rules[] = {
    {"attention.self.query.weight", "attn_q.weight", D_Q, D_EMBD, OP_KEEP},
    {"attention.self.query.bias", "attn_q.bias", D_Q, D_1, OP_KEEP},
    {"attention.self.key.weight", "attn_k.weight", D_KV, D_EMBD, OP_KEEP},
    {"attention.self.key.bias", "attn_k.bias", D_KV, D_1, OP_KEEP},
    {"attention.self.value.weight", "attn_v.weight", D_KV, D_EMBD, OP_KEEP},
    {"attention.self.value.bias", "attn_v.bias", D_KV, D_1, OP_KEEP},
    {"attention.output.dense.weight", "attn_output.weight", D_EMBD, D_Q, OP_KEEP},
    {"attention.output.dense.bias", "attn_output.bias", D_EMBD, D_1, OP_KEEP},
    {"attention.output.LayerNorm.weight", "attn_output_norm.weight", D_EMBD, D_1, OP_NORM},
    {"attention.output.LayerNorm.bias", "attn_output_norm.bias", D_EMBD, D_1, OP_KEEP},
    {"intermediate.dense.weight", "ffn_up.weight", D_FF, D_EMBD, OP_KEEP},
    {"intermediate.dense.bias", "ffn_up.bias", D_FF, D_1, OP_KEEP},
    {"output.dense.weight", "ffn_down.weight", D_EMBD, D_FF, OP_KEEP},
    {"output.dense.bias", "ffn_down.bias", D_EMBD, D_1, OP_KEEP},
    {"output.LayerNorm.weight", "layer_output_norm.weight", D_EMBD, D_1, OP_NORM},
    {"output.LayerNorm.bias", "layer_output_norm.bias", D_EMBD, D_1, OP_KEEP},
};

/* Experts: "<prefix>.E.<hf>" stacked over E into one 3-D GGUF tensor. */
enum { EXP_GATE, EXP_UP, EXP_DOWN, EXP_KINDS };
static const char *const exp_gguf[EXP_KINDS] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                                "ffn_down_exps.weight"};
static const struct {
    const char *prefix, *hf;
    int kind;
} exp_rules[] = {
    {"mlp.experts.", "gate_proj.weight", EXP_GATE},
    {"mlp.experts.", "up_proj.weight", EXP_UP},
    {"mlp.experts.", "down_proj.weight", EXP_DOWN},
    {"block_sparse_moe.experts.", "w1.weight", EXP_GATE},
    {"block_sparse_moe.experts.", "w3.weight", EXP_UP},
    {"block_sparse_moe.experts.", "w2.weight", EXP_DOWN},
};

static uint64_t dim_size(const llmi_hf_config *c, dim d) {
    uint64_t q = (uint64_t)c->n_head * c->head_dim, kv = (uint64_t)c->n_head_kv * c->head_dim;
    switch (d) {
    case D_EMBD:
        return c->n_embd;
    case D_Q:
        return q;
    case D_KV:
        return kv;
    case D_FF:
        return c->n_ff;
    case D_HEAD:
        return c->head_dim;
    case D_VOCAB:
        return c->n_vocab;
    case D_QKV:
        return q + 2 * kv;
    case D_FF2:
        return 2 * (uint64_t)c->n_ff;
    case D_FFEXP:
        return c->n_ff_exp;
    case D_NEXP:
        return c->n_expert;
    case D_CTX:
        return c->n_ctx;
    case D_TYPES:
        return c->n_token_types;
    default:
        return 1;
    }
}

static const char *dim_fields(dim d) {
    switch (d) {
    case D_EMBD:
        return "hidden_size";
    case D_Q:
        return "num_attention_heads * head_dim";
    case D_KV:
        return "num_key_value_heads * head_dim";
    case D_FF:
        return "intermediate_size";
    case D_HEAD:
        return "head_dim";
    case D_VOCAB:
        return "vocab_size";
    case D_QKV:
        return "(num_attention_heads + 2 * num_key_value_heads) * head_dim";
    case D_FF2:
        return "2 * intermediate_size";
    case D_FFEXP:
        return "the experts' intermediate size";
    case D_NEXP:
        return "the expert count";
    case D_CTX:
        return "max_position_embeddings";
    case D_TYPES:
        return "type_vocab_size";
    default:
        return "1";
    }
}

static llm_status check_shape(const llmi_hf_config *c, const llmi_hf_source *s, dim rows,
                              dim cols) {
    const llmi_st_tensor *t = s->t;
    uint64_t r = dim_size(c, rows), k = dim_size(c, cols);
    bool ok = cols == D_1 ? (t->n_dims == 1 && t->shape[0] == r)
                          : (t->n_dims == 2 && t->shape[0] == r && t->shape[1] == k);
    if (ok)
        return LLM_OK;
    if (cols == D_1)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: tensor '%s' has %u dims [%" PRIu64 ", ...] but config.json "
                          "(%s) gives [%" PRIu64 "]",
                          s->file, s->name, t->n_dims, t->shape[0], dim_fields(rows), r);
    return llmi_error(LLM_ERR_BAD_FORMAT,
                      "%s: tensor '%s' has %u dims [%" PRIu64 ", %" PRIu64 ", ...] but "
                      "config.json (%s, %s) gives [%" PRIu64 ", %" PRIu64 "]",
                      s->file, s->name, t->n_dims, t->shape[0], t->n_dims > 1 ? t->shape[1] : 0,
                      dim_fields(rows), dim_fields(cols), r, k);
}

static float load_elem(const llmi_st_tensor *t, size_t i) {
    const uint8_t *p = t->data;
    if (t->type == LLMI_T_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->type == LLMI_T_F16 ? llmi_f16_to_f32(h) : llmi_bf16_to_f32(h);
}

/* x rounded to the source's precision: the converter adds Gemma's 1 before
 * widening, in the checkpoint's dtype. */
static float round_to(llmi_ttype t, float x) {
    if (t == LLMI_T_F16)
        return llmi_f16_to_f32(llmi_f32_to_f16(x));
    if (t == LLMI_T_BF16)
        return llmi_bf16_to_f32(llmi_f32_to_bf16(x));
    return x;
}

static void *new_buffer(size_t n, llmi_gguf_parts *parts, llm_status *st) {
    void *b = llmi_malloc_aligned(n ? n : 1);
    if (!b) {
        *st = llmi_oom("converted tensor");
        return NULL;
    }
    *st = llmi_gguf_parts_keep_buffer(parts, b);
    return *st == LLM_OK ? b : NULL;
}

/* Output row of input row `r` when rows are grouped in `n_head` heads:
 * row j * d/2 + i of a head moves to 2i + j, pairing each dimension with
 * its rope partner (llama.cpp's converter, "permute"). */
static size_t permuted_row(size_t r, size_t rows, uint32_t n_head) {
    size_t hd = rows / n_head, half = hd / 2;
    size_t h = r / hd, k = r % hd, j = k / half, i = k % half;
    return h * hd + 2 * i + j;
}

static llm_status add_one(const llmi_hf_config *c, const llmi_hf_source *s, const rule *ru,
                          const char *gguf_name, llmi_gguf_parts *parts) {
    LLMI_TRY(check_shape(c, s, (dim)ru->rows, (dim)ru->cols));
    const llmi_st_tensor *t = s->t;
    bool vector = ru->cols == D_1;
    op o = (op)ru->op;
    uint32_t n_head = o == OP_PERMUTE_Q ? c->n_head : c->n_head_kv;
    bool permute = c->permute_qk && (o == OP_PERMUTE_Q || o == OP_PERMUTE_K);
    size_t rows = (size_t)t->shape[0], cols = vector ? 1 : (size_t)t->shape[1];
    uint64_t ne[2] = {vector ? rows : cols, rows};
    llm_status st;
    if (vector) {
        float *v = new_buffer(rows * sizeof(float), parts, &st);
        if (!v)
            return st;
        size_t nlen = strlen(gguf_name);
        bool plus_one = o == OP_NORM && c->norm_plus_one && nlen >= 11 &&
                        strcmp(gguf_name + nlen - 11, "norm.weight") == 0;
        for (size_t r = 0; r < rows; r++) {
            float x = load_elem(t, r);
            if (plus_one)
                x = round_to(t->type, x + 1.0f);
            v[permute ? permuted_row(r, rows, n_head) : r] = x;
        }
        return llmi_gguf_parts_tensor(parts, gguf_name, LLMI_T_F32, 1, ne, v, rows * sizeof(float));
    }
    size_t esize = t->type == LLMI_T_F32 ? 4 : 2, row_bytes = cols * esize;
    const void *data = t->data;
    if (permute || (uintptr_t)data % esize != 0) {
        uint8_t *b = new_buffer(t->nbytes, parts, &st);
        if (!b)
            return st;
        for (size_t r = 0; r < rows; r++)
            memcpy(b + (permute ? permuted_row(r, rows, n_head) : r) * row_bytes,
                   t->data + r * row_bytes, row_bytes);
        data = b;
    }
    return llmi_gguf_parts_tensor(parts, gguf_name, t->type, 2, ne, data, t->nbytes);
}

static llm_status add_rope_freqs(const llmi_hf_config *c, llmi_gguf_parts *parts) {
    size_t n = c->head_dim / 2;
    llm_status st;
    float *f = new_buffer(n * sizeof(float), parts, &st);
    if (!f)
        return st;
    llmi_hf_llama3_rope_factors(c, f);
    uint64_t ne[1] = {n};
    return llmi_gguf_parts_tensor(parts, "rope_freqs.weight", LLMI_T_F32, 1, ne, f,
                                  n * sizeof(float));
}

/* "<prefix>N.<rest>" ("model.layers.", BERT's "encoder.layer."): N and
 * rest; false for other names. */
static bool split_layer(const char *name, const char *prefix, uint32_t *layer, const char **rest) {
    const size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0)
        return false;
    const char *p = name + pl;
    if (*p < '0' || *p > '9')
        return false;
    char *end;
    unsigned long v = strtoul(p, &end, 10);
    if (*end != '.' || v > 1u << 20 || (p[0] == '0' && end - p > 1))
        return false;
    *layer = (uint32_t)v;
    *rest = end + 1;
    return true;
}

typedef struct experts {
    const llmi_hf_source **slot; /* [layer][kind][expert] */
    uint32_t n_layer, n_expert;
} experts;

static const llmi_hf_source **exp_slot(experts *e, uint32_t layer, int kind, uint32_t expert) {
    return &e->slot[((size_t)layer * EXP_KINDS + (size_t)kind) * e->n_expert + expert];
}

/* An expert tensor: its slot filled; false when the name is not one. */
static llm_status match_expert(const llmi_hf_config *c, experts *e, const llmi_hf_source *s,
                               uint32_t layer, const char *rest, bool *matched) {
    *matched = false;
    for (size_t i = 0; i < sizeof exp_rules / sizeof exp_rules[0]; i++) {
        size_t pl = strlen(exp_rules[i].prefix);
        if (strncmp(rest, exp_rules[i].prefix, pl) != 0)
            continue;
        char *end;
        unsigned long x = strtoul(rest + pl, &end, 10);
        if (end == rest + pl || *end != '.' || strcmp(end + 1, exp_rules[i].hf) != 0)
            continue;
        *matched = true;
        if (!c->n_expert || x >= c->n_expert)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "%s: tensor '%s' names expert %lu but config.json has %u experts",
                              s->file, s->name, x, c->n_expert);
        int kind = exp_rules[i].kind;
        dim rows = kind == EXP_DOWN ? D_EMBD : D_FFEXP, cols = kind == EXP_DOWN ? D_FFEXP : D_EMBD;
        LLMI_TRY(check_shape(c, s, rows, cols));
        *exp_slot(e, layer, kind, (uint32_t)x) = s;
        return LLM_OK;
    }
    return LLM_OK;
}

static llm_status stack_experts(experts *e, llmi_gguf_parts *parts) {
    for (uint32_t l = 0; l < e->n_layer; l++)
        for (int k = 0; k < EXP_KINDS; k++) {
            const llmi_hf_source *first = *exp_slot(e, l, k, 0);
            uint32_t have = 0;
            for (uint32_t x = 0; x < e->n_expert; x++)
                have += *exp_slot(e, l, k, x) != NULL;
            if (have == 0)
                continue;
            if (have != e->n_expert || !first)
                return llmi_error(LLM_ERR_BAD_FORMAT, "layer %u has %u of %u experts' %s tensors",
                                  l, have, e->n_expert, exp_gguf[k]);
            size_t each = first->t->nbytes, total;
            if (!llmi_mul_ok(each, e->n_expert, &total))
                return llmi_error(LLM_ERR_LIMIT, "layer %u experts are too large", l);
            llm_status st;
            uint8_t *b = new_buffer(total, parts, &st);
            if (!b)
                return st;
            for (uint32_t x = 0; x < e->n_expert; x++) {
                const llmi_hf_source *s = *exp_slot(e, l, k, x);
                if (s->t->type != first->t->type)
                    return llmi_error(LLM_ERR_BAD_FORMAT,
                                      "%s: tensor '%s' has another dtype than expert 0's", s->file,
                                      s->name);
                memcpy(b + (size_t)x * each, s->t->data, each);
            }
            char name[96];
            snprintf(name, sizeof name, "blk.%u.%s", l, exp_gguf[k]);
            uint64_t ne[3] = {first->t->shape[1], first->t->shape[0], e->n_expert};
            LLMI_TRY(llmi_gguf_parts_tensor(parts, name, first->t->type, 3, ne, b, total));
        }
    return LLM_OK;
}

/* A name of the BERT tables; a tensor it does not name is refused. */
static llm_status map_bert(const llmi_hf_config *c, const llmi_hf_source *s,
                           llmi_gguf_parts *parts) {
    const char *name = strncmp(s->name, "bert.", 5) == 0 ? s->name + 5 : s->name;
    for (size_t i = 0; i < sizeof bert_model_rules / sizeof bert_model_rules[0]; i++)
        if (strcmp(name, bert_model_rules[i].hf) == 0)
            return bert_model_rules[i].op == OP_SKIP
                       ? LLM_OK
                       : add_one(c, s, &bert_model_rules[i], bert_model_rules[i].gguf, parts);
    uint32_t layer;
    const char *rest;
    if (split_layer(name, "encoder.layer.", &layer, &rest)) {
        if (layer >= c->n_layer)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "%s: tensor '%s' is in layer %u but config.json "
                              "num_hidden_layers is %u",
                              s->file, s->name, layer, c->n_layer);
        for (size_t i = 0; i < sizeof bert_layer_rules / sizeof bert_layer_rules[0]; i++) {
            if (strcmp(rest, bert_layer_rules[i].hf) != 0)
                continue;
            char gguf[160];
            snprintf(gguf, sizeof gguf, "blk.%u.%s", layer, bert_layer_rules[i].gguf);
            return add_one(c, s, &bert_layer_rules[i], gguf, parts);
        }
    }
    return llmi_error(LLM_ERR_UNSUPPORTED, "%s: tensor '%s' has no GGUF name for %s", s->file,
                      s->name, c->arch);
}

static llm_status map_one(const llmi_hf_config *c, experts *e, const llmi_hf_source *s,
                          llmi_gguf_parts *parts) {
    if (c->family == LLMI_HF_BERT)
        return map_bert(c, s, parts);
    char gguf[160];
    for (size_t i = 0; i < sizeof model_rules / sizeof model_rules[0]; i++)
        if (strcmp(s->name, model_rules[i].hf) == 0)
            return add_one(c, s, &model_rules[i], model_rules[i].gguf, parts);
    uint32_t layer;
    const char *rest;
    if (split_layer(s->name, "model.layers.", &layer, &rest)) {
        if (layer >= c->n_layer)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "%s: tensor '%s' is in layer %u but config.json "
                              "num_hidden_layers is %u",
                              s->file, s->name, layer, c->n_layer);
        for (size_t i = 0; i < sizeof layer_rules / sizeof layer_rules[0]; i++) {
            const rule *ru = &layer_rules[i];
            if (strcmp(rest, ru->hf) != 0)
                continue;
            if (ru->op == OP_SKIP)
                return LLM_OK;
            const char *g = ru->gguf                   ? ru->gguf
                            : c->post_attn_is_ffn_norm ? "ffn_norm.weight"
                                                       : "post_attention_norm.weight";
            snprintf(gguf, sizeof gguf, "blk.%u.%s", layer, g);
            return add_one(c, s, ru, gguf, parts);
        }
        bool matched;
        LLMI_TRY(match_expert(c, e, s, layer, rest, &matched));
        if (matched)
            return LLM_OK;
    }
    return llmi_error(LLM_ERR_UNSUPPORTED, "%s: tensor '%s' has no GGUF name for %s", s->file,
                      s->name, c->arch);
}

llm_status llmi_hf_map_tensors(const llmi_hf_config *c, const llmi_hf_source *src, size_t n,
                               llmi_gguf_parts *parts, uint32_t *file_type) {
    experts e = {.n_layer = c->n_layer, .n_expert = c->n_expert};
    if (c->n_expert) {
        e.slot = llmi_calloc((size_t)c->n_layer * EXP_KINDS * c->n_expert, sizeof *e.slot);
        if (!e.slot)
            return llmi_oom("expert table");
    }
    llm_status st = LLM_OK;
    bool have_embd = false, have_output = false;
    *file_type = 0;
    /* the converter emits the tensors it computes before the checkpoint's */
    if (c->rope_llama3)
        st = add_rope_freqs(c, parts);
    for (size_t i = 0; i < n && st == LLM_OK; i++) {
        st = map_one(c, &e, &src[i], parts);
        const char *embd_name =
            c->family == LLMI_HF_BERT
                ? (strncmp(src[i].name, "bert.", 5) == 0 ? "bert.embeddings.word_embeddings.weight"
                                                         : "embeddings.word_embeddings.weight")
                : "model.embed_tokens.weight";
        if (strcmp(src[i].name, embd_name) == 0) {
            have_embd = true;
            /* llama.cpp's file types: ALL_F32 0, MOSTLY_F16 1, MOSTLY_BF16 32 */
            *file_type = src[i].t->type == LLMI_T_F16 ? 1 : src[i].t->type == LLMI_T_BF16 ? 32 : 0;
        }
        have_output |= strcmp(src[i].name, "lm_head.weight") == 0;
    }
    if (st == LLM_OK && c->n_expert)
        st = stack_experts(&e, parts);
    llmi_free(e.slot);
    if (st != LLM_OK)
        return st;
    if (!have_embd)
        return llmi_error(LLM_ERR_BAD_FORMAT, "the checkpoint has no '%s'",
                          c->family == LLMI_HF_BERT ? "embeddings.word_embeddings.weight"
                                                    : "model.embed_tokens.weight");
    if (!have_output && !c->tie_embeddings)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "the checkpoint has no 'lm_head.weight' and config.json "
                          "tie_word_embeddings is false");
    return LLM_OK;
}
