/* Hugging Face PEFT LoRA folders (adapter_config.json and
 * adapter_model.safetensors) presented as the GGUF file llama.cpp's
 * convert_lora_to_gguf.py would make of them (hf/hf.h): general.type
 * "adapter", adapter.type "lora", adapter.lora.alpha, and per targeted
 * projection "blk.N.<weight>.lora_a" (ne {in, rank}) and ".lora_b" (ne
 * {rank, out}), B's rows of q_proj and k_proj permuted as the base model's
 * q/k rows are when the model's rope pairs adjacent dimensions. The matrices
 * are widened to F32 here: adapters are small, and the loader wants F32. */
#include "hf/hf_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>

static const char *const CONFIG = "adapter_config.json";
static const char *const WEIGHTS = "adapter_model.safetensors";

bool llmi_hf_is_adapter_folder(const char *path) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return false;
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s/%s", path, CONFIG) >= (int)sizeof buf)
        return false;
    return lstat(buf, &sb) == 0;
}

/* PEFT module names (after "model.layers.N.") -> GGUF weight names (after
 * "blk.N."), and which head count permutes B's rows (0: none). */
static const struct {
    const char *peft, *gguf;
    int permute; /* 1: q heads, 2: k heads */
} modules[] = {
    {"self_attn.q_proj", "attn_q.weight", 1}, {"self_attn.k_proj", "attn_k.weight", 2},
    {"self_attn.v_proj", "attn_v.weight", 0}, {"self_attn.o_proj", "attn_output.weight", 0},
    {"mlp.gate_proj", "ffn_gate.weight", 0},  {"mlp.up_proj", "ffn_up.weight", 0},
    {"mlp.down_proj", "ffn_down.weight", 0},
};

typedef struct peft_config {
    double r, alpha;
    bool rslora;
} peft_config;

/* A field that must be absent, null, false, empty or the given string:
 * PEFT options this library does not apply. */
static llm_status refuse_option(const cJSON *root, const char *field, const char *fine) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return LLM_OK;
    if ((cJSON_IsObject(v) || cJSON_IsArray(v)) && cJSON_GetArraySize(v) == 0)
        return LLM_OK;
    if (fine && cJSON_IsString(v) && strcmp(v->valuestring, fine) == 0)
        return LLM_OK;
    return llmi_error(LLM_ERR_UNSUPPORTED, "%s: field '%s' asks for something not supported (%s)",
                      CONFIG, field,
                      fine ? "only a plain LoRA is" : "only plain LoRA matrices are");
}

static llm_status parse_config(const char *json, size_t len, peft_config *c) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: not a JSON object", CONFIG);
    }
    llm_status st = LLM_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "LORA") == 0))
        st = llmi_error(LLM_ERR_UNSUPPORTED, "%s: peft_type is not \"LORA\"", CONFIG);
    else if (!cJSON_IsNumber(r) || !(r->valuedouble >= 1 && r->valuedouble <= 65536) ||
             r->valuedouble != floor(r->valuedouble))
        st = llmi_error(LLM_ERR_BAD_FORMAT, "%s: field 'r' is missing or not a rank in [1, 65536]",
                        CONFIG);
    else if (!cJSON_IsNumber(alpha) || !isfinite(alpha->valuedouble) || alpha->valuedouble <= 0 ||
             alpha->valuedouble > 1e6)
        st = llmi_error(LLM_ERR_BAD_FORMAT,
                        "%s: field 'lora_alpha' is missing or not a number in (0, 1e6]", CONFIG);
    static const char *const refused[] = {"rank_pattern",       "alpha_pattern",   "use_dora",
                                          "fan_in_fan_out",     "modules_to_save", "layers_pattern",
                                          "layers_to_transform"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0] && st == LLM_OK; i++)
        st = refuse_option(root, refused[i], NULL);
    if (st == LLM_OK)
        st = refuse_option(root, "bias", "none");
    if (st == LLM_OK) {
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "use_rslora");
        c->r = r->valuedouble;
        c->alpha = alpha->valuedouble;
        c->rslora = cJSON_IsTrue(rs);
    }
    cJSON_Delete(root);
    return st;
}

/* "base_model.model.model.layers.N.<module>.lora_{A,B}.weight" -> layer,
 * module index and which half; false for any other name. */
static bool parse_name(const char *name, unsigned *layer, size_t *module, bool *is_b) {
    static const char prefix[] = "base_model.model.model.layers.";
    if (strncmp(name, prefix, sizeof prefix - 1) != 0)
        return false;
    const char *p = name + sizeof prefix - 1;
    if (*p < '0' || *p > '9')
        return false;
    unsigned long n = 0;
    while (*p >= '0' && *p <= '9' && n < 100000)
        n = n * 10 + (unsigned long)(*p++ - '0');
    if (*p++ != '.' || n >= 100000)
        return false;
    for (size_t m = 0; m < sizeof modules / sizeof modules[0]; m++) {
        size_t ml = strlen(modules[m].peft);
        if (strncmp(p, modules[m].peft, ml) != 0)
            continue;
        const char *rest = p + ml;
        if (strcmp(rest, ".lora_A.weight") != 0 && strcmp(rest, ".lora_B.weight") != 0)
            return false;
        *layer = (unsigned)n;
        *module = m;
        *is_b = rest[6] == 'B';
        return true;
    }
    return false;
}

static float elem(const llmi_st_tensor *t, size_t i) {
    if (t->type == LLMI_T_F32) {
        float f;
        memcpy(&f, t->data + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, t->data + 2 * i, 2);
    return t->type == LLMI_T_F16 ? llmi_f16_to_f32(h) : llmi_bf16_to_f32(h);
}

/* One safetensors matrix as an F32 GGUF tensor (ne {cols, rows}), B's rows
 * of q/k permuted for adjacent-pair rope. */
static llm_status add_matrix(const llmi_st_tensor *t, const char *gguf_name, uint32_t n_head,
                             llmi_gguf_parts *parts) {
    if (t->n_dims != 2 || t->shape[0] == 0 || t->shape[1] == 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%s' is not a 2-D matrix", WEIGHTS,
                          t->name);
    size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1], bytes;
    if (!llmi_mul_ok(rows * cols, sizeof(float), &bytes))
        return llmi_error(LLM_ERR_LIMIT, "%s: tensor '%s' is too large", WEIGHTS, t->name);
    size_t hd = n_head ? rows / n_head : 0;
    if (n_head && (rows % n_head != 0 || hd % 2 != 0))
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: tensor '%s' has %zu rows, not %u heads of an even size", WEIGHTS,
                          t->name, rows, n_head);
    float *buf = llmi_malloc_aligned(bytes);
    if (!buf)
        return llmi_oom("adapter tensor");
    LLMI_TRY(llmi_gguf_parts_keep_buffer(parts, buf));
    for (size_t r = 0; r < rows; r++) {
        size_t dst = r;
        if (n_head) { /* row j * hd/2 + i of a head goes to 2i + j */
            size_t h = r / hd, k = r % hd, half = hd / 2;
            dst = h * hd + 2 * (k % half) + k / half;
        }
        for (size_t c = 0; c < cols; c++)
            buf[dst * cols + c] = elem(t, r * cols + c);
    }
    uint64_t ne[2] = {cols, rows};
    return llmi_gguf_parts_tensor(parts, gguf_name, LLMI_T_F32, 2, ne, buf, bytes);
}

static llm_status add_tensors(const llmi_st_tensor *ts, size_t n, const peft_config *c,
                              const llmi_hf_adapter_shape *shape, llmi_gguf_parts *parts) {
    for (size_t i = 0; i < n; i++) {
        const llmi_st_tensor *t = &ts[i];
        unsigned layer;
        size_t m;
        bool is_b;
        if (!parse_name(t->name, &layer, &m, &is_b))
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "%s: tensor '%s' is not a LoRA matrix of a projection this library "
                              "adapts (q/k/v/o_proj, gate/up/down_proj of model.layers.N)",
                              WEIGHTS, t->name);
        if (t->n_dims == 2 && (double)t->shape[is_b ? 1 : 0] != c->r)
            return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%s' has rank %llu, config r is %g",
                              WEIGHTS, t->name, (unsigned long long)t->shape[is_b ? 1 : 0], c->r);
        char name[96];
        snprintf(name, sizeof name, "blk.%u.%s.lora_%c", layer, modules[m].gguf, is_b ? 'b' : 'a');
        uint32_t n_head = 0;
        if (is_b && shape->permute_qk && modules[m].permute)
            n_head = modules[m].permute == 1 ? shape->n_head : shape->n_head_kv;
        LLMI_TRY(add_matrix(t, name, n_head, parts));
    }
    return LLM_OK;
}

/* The GGUF of a parsed config and tensor table. */
static llm_status assemble(const char *config_json, size_t config_len, const llmi_st_tensor *ts,
                           size_t n, const llmi_hf_adapter_shape *shape, llmi_gguf **out) {
    peft_config c = {0};
    LLMI_TRY(llmi_hf_json_check_nul(CONFIG, config_json, config_len, 0));
    LLMI_TRY(parse_config(config_json, config_len, &c));
    llmi_gguf_writer *w = NULL;
    llmi_gguf_parts *parts = NULL;
    llm_status st = llmi_gguf_writer_create(&w);
    if (st == LLM_OK)
        st = llmi_gguf_parts_create(&parts);
    /* llama.cpp's scale is alpha / rank; rsLoRA's alpha / sqrt(rank). */
    double alpha = c.rslora ? c.alpha * sqrt(c.r) : c.alpha;
    if (st == LLM_OK)
        st = llmi_gguf_w_str(w, "general.architecture", shape->arch);
    if (st == LLM_OK)
        st = llmi_gguf_w_str(w, "general.type", "adapter");
    if (st == LLM_OK)
        st = llmi_gguf_w_str(w, "adapter.type", "lora");
    if (st == LLM_OK)
        st = llmi_gguf_w_f32(w, "adapter.lora.alpha", (float)alpha);
    if (st == LLM_OK)
        st = add_tensors(ts, n, &c, shape, parts);
    if (st == LLM_OK) {
        st = llmi_gguf_parts_finish(parts, w, out);
        parts = NULL;
    }
    llmi_gguf_parts_release(parts);
    llmi_gguf_writer_free(w);
    return st;
}

llm_status llmi_hf_adapter_from_memory(const char *config_json, size_t config_len,
                                       const void *weights, size_t weights_size,
                                       const llmi_hf_adapter_shape *shape, llmi_gguf **out) {
    *out = NULL;
    llmi_st_tensor *ts = NULL;
    size_t n = 0;
    LLMI_TRY(llmi_st_parse(weights, weights_size, WEIGHTS, &ts, &n));
    llm_status st = assemble(config_json, config_len, ts, n, shape, out);
    llmi_st_tensors_free(ts, n);
    return st;
}

llm_status llmi_hf_adapter_open(const char *folder, const llmi_hf_adapter_shape *shape,
                                llmi_gguf **out) {
    *out = NULL;
    char *json = NULL;
    size_t len = 0;
    LLMI_TRY(llmi_hf_read_text(folder, CONFIG, NULL, &json, &len));
    char path[4096];
    llm_status st = LLM_OK;
    if (snprintf(path, sizeof path, "%s/%s", folder, WEIGHTS) >= (int)sizeof path)
        st = llmi_error(LLM_ERR_INVALID_ARGUMENT, "adapter folder path is too long");
    llmi_st_file f;
    memset(&f, 0, sizeof f);
    if (st == LLM_OK)
        st = llmi_st_open(path, WEIGHTS, false, &f);
    if (st == LLM_OK)
        st = assemble(json, len, f.tensors, f.n_tensors, shape, out);
    llmi_st_close(&f);
    llmi_free(json);
    return st;
}
