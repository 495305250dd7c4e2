/* Loading LoRA adapters (model/adapter.h): every tensor of the file is
 * matched to a projection of the model, checked against the base weight's
 * shape and widened to F32. */
#include "model/adapter.h"

#include "core/quant.h"
#include "hf/hf.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static const llmi_layer_role target_roles[LLMI_LORA_TARGETS] = {
    LLMI_ROLE_Q,    LLMI_ROLE_K,  LLMI_ROLE_V,    LLMI_ROLE_O,
    LLMI_ROLE_GATE, LLMI_ROLE_UP, LLMI_ROLE_DOWN,
};

llmi_layer_role llmi_lora_target_role(llmi_lora_target t) { return target_roles[t]; }

void llmi_adapter_free(llm_adapter *a) {
    if (!a)
        return;
    if (a->pairs && a->model)
        for (size_t i = 0; i < (size_t)a->model->hp.n_layer * LLMI_LORA_TARGETS; i++) {
            llmi_free_aligned(a->pairs[i].a);
            llmi_free_aligned(a->pairs[i].b);
        }
    llmi_free(a->pairs);
    llmi_free(a);
}

/* The pair and half a tensor name ("blk.N.<weight>.lora_a") stands for. */
static llm_status find_target(const llm_model *m, const char *what, const llmi_str name,
                              uint32_t *layer, llmi_lora_target *target, bool *is_b) {
    static const char sa[] = ".lora_a", sb[] = ".lora_b";
    const size_t sl = sizeof sa - 1;
    char buf[256];
    if (name.len >= sizeof buf || name.len <= sl)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%.*s' is not named <weight>.lora_a/b",
                          what, (int)(name.len < 200 ? name.len : 200), name.ptr);
    if (memchr(name.ptr, '\0', name.len))
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: a tensor name holds a NUL byte", what);
    memcpy(buf, name.ptr, name.len);
    buf[name.len] = '\0';
    char *suffix = buf + name.len - sl;
    if (strcmp(suffix, sa) != 0 && strcmp(suffix, sb) != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%s' is not named <weight>.lora_a/b",
                          what, buf);
    *is_b = suffix[6] == 'b';
    *suffix = '\0';
    /* "blk.<layer>.": up to 9 digits, so the number cannot overflow. */
    unsigned l = 0, digits = 0;
    const char *p = buf + 4;
    if (strncmp(buf, "blk.", 4) == 0)
        for (; *p >= '0' && *p <= '9' && digits < 9; p++, digits++)
            l = l * 10 + (unsigned)(*p - '0');
    if (digits > 0 && *p == '.')
        for (int t = 0; t < LLMI_LORA_TARGETS; t++) {
            char want[256];
            snprintf(want, sizeof want, llmi_layer_roles[target_roles[t]].name, l);
            if (strcmp(want, buf) != 0)
                continue;
            if (l >= m->hp.n_layer)
                return llmi_error(LLM_ERR_BAD_FORMAT,
                                  "%s: tensor '%s%s' targets layer %u; the "
                                  "model has %u layers",
                                  what, buf, *is_b ? sb : sa, l, m->hp.n_layer);
            if (!m->layers[l].w[target_roles[t]].data)
                return llmi_error(LLM_ERR_UNSUPPORTED,
                                  "%s: tensor '%s%s' targets %s, which this model does not have",
                                  what, buf, *is_b ? sb : sa, buf);
            *layer = l;
            *target = (llmi_lora_target)t;
            return LLM_OK;
        }
    return llmi_error(LLM_ERR_UNSUPPORTED,
                      "%s: tensor '%s%s' targets '%s', which is not a projection LoRA adapters "
                      "can change here (attn_q/k/v/output, ffn_gate/up/down of a layer)",
                      what, buf, *is_b ? sb : sa, buf);
}

/* A tensor widened into a new F32 array of rows x cols. */
static llm_status widen(const char *what, const llmi_gguf_tensor *t, float **out) {
    *out = NULL;
    if (t->type != LLMI_T_F32 && t->type != LLMI_T_F16 && t->type != LLMI_T_BF16) {
        const llmi_ttype_info *info = llmi_ttype_get(t->type);
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: tensor '%.*s' is %s; adapters must be F32, "
                          "F16 or BF16",
                          what, (int)t->name.len, t->name.ptr,
                          info ? info->name : "of an unknown type");
    }
    size_t n, bytes;
    if (!llmi_mul_ok((size_t)t->ne[0], (size_t)t->ne[1], &n) ||
        !llmi_mul_ok(n, sizeof(float), &bytes))
        return llmi_error(LLM_ERR_LIMIT, "%s: tensor '%.*s' is too large", what, (int)t->name.len,
                          t->name.ptr);
    float *f = llmi_malloc_aligned(bytes ? bytes : 1);
    if (!f)
        return llmi_oom("adapter weights");
    llmi_dequantize_row(t->type, t->data, f, (int64_t)n);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(f[i])) {
            llmi_free_aligned(f);
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "%s: tensor '%.*s' holds a value that is not "
                              "finite (element %zu)",
                              what, (int)t->name.len, t->name.ptr, i);
        }
    *out = f;
    return LLM_OK;
}

/* The metadata: an adapter of the model's architecture, of type LoRA. */
static llm_status check_header(const llm_model *m, const llmi_gguf *g, const char *what,
                               float *alpha) {
    llmi_str s = {0};
    LLMI_TRY(llmi_gguf_get_str(g, "general.type", false, &s));
    if (!llmi_str_eq(s, "adapter"))
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: general.type is '%.*s', not 'adapter' (a "
                          "model file, not a LoRA adapter?)",
                          what, (int)(s.len > 64 ? 64 : s.len), s.ptr ? s.ptr : "");
    s = (llmi_str){0};
    LLMI_TRY(llmi_gguf_get_str(g, "adapter.type", true, &s));
    if (!llmi_str_eq(s, "lora"))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: adapter.type is '%.*s'; only 'lora' is "
                          "supported",
                          what, (int)(s.len > 64 ? 64 : s.len), s.ptr);
    s = (llmi_str){0};
    LLMI_TRY(llmi_gguf_get_str(g, "general.architecture", true, &s));
    if (!llmi_str_eq(s, m->hp.arch))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: the adapter is for architecture '%.*s', the "
                          "model is '%s'",
                          what, (int)(s.len > 64 ? 64 : s.len), s.ptr, m->hp.arch);
    *alpha = 0.0f;
    LLMI_TRY(llmi_gguf_get_f32(g, "adapter.lora.alpha", false, alpha));
    if (!isfinite(*alpha) || *alpha < 0.0f)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: adapter.lora.alpha is %g", what, *alpha);
    return LLM_OK;
}

/* One tensor into its half of its pair, shapes checked against the base
 * weight and against the other half when that is already in. */
static llm_status add_tensor(llm_adapter *a, const char *what, const llmi_gguf_tensor *t) {
    const llm_model *m = a->model;
    uint32_t layer = 0;
    llmi_lora_target target = LLMI_LORA_Q;
    bool is_b = false;
    LLMI_TRY(find_target(m, what, t->name, &layer, &target, &is_b));
    llmi_lora_pair *p = &a->pairs[(size_t)layer * LLMI_LORA_TARGETS + target];
    const llmi_weight *w = &m->layers[layer].w[target_roles[target]];
    const int nl = (int)t->name.len;
    if ((is_b ? p->b : p->a) != NULL)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%.*s' appears twice", what, nl,
                          t->name.ptr);
    if (t->n_dims != 2 || t->ne[2] != 1 || t->ne[3] != 1)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%.*s' is not a matrix", what, nl,
                          t->name.ptr);
    /* lora_a: ne {in, rank}; lora_b: ne {rank, out}. */
    const uint64_t rank = is_b ? t->ne[0] : t->ne[1];
    const uint64_t outer = is_b ? t->ne[1] : t->ne[0];
    const int64_t want = is_b ? w->rows : w->cols;
    if (rank == 0 || rank > 65536)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%.*s' has rank %llu", what, nl,
                          t->name.ptr, (unsigned long long)rank);
    if (outer != (uint64_t)want)
        return llmi_error(
            LLM_ERR_BAD_FORMAT, "%s: tensor '%.*s' has %llu %s; the base weight has %lld", what, nl,
            t->name.ptr, (unsigned long long)outer, is_b ? "rows" : "columns", (long long)want);
    if ((p->a || p->b) && p->rank != rank)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: tensor '%.*s' has rank %llu, its other half rank %u", what, nl,
                          t->name.ptr, (unsigned long long)rank, p->rank);
    float *f;
    LLMI_TRY(widen(what, t, &f));
    if (is_b) { /* [out][rank] -> [rank][out]: the update adds rank rows of out */
        float *bt = llmi_malloc_aligned((size_t)outer * rank * sizeof *bt);
        if (!bt) {
            llmi_free_aligned(f);
            return llmi_oom("adapter weights");
        }
        for (uint64_t o = 0; o < outer; o++)
            for (uint64_t k = 0; k < rank; k++)
                bt[k * outer + o] = f[o * rank + k];
        llmi_free_aligned(f);
        f = bt;
    }
    p->rank = (uint32_t)rank;
    p->in = (uint32_t)w->cols;
    p->out = (uint32_t)w->rows;
    if (is_b)
        p->b = f;
    else
        p->a = f;
    a->bytes += (uint64_t)t->ne[0] * t->ne[1] * sizeof(float);
    return LLM_OK;
}

static atomic_uint_fast64_t next_id = 1;

llm_status llmi_adapter_from_gguf(const llm_model *m, const llmi_gguf *g, const char *what,
                                  llm_adapter **out) {
    *out = NULL;
    float alpha;
    LLMI_TRY(check_header(m, g, what, &alpha));
    if (g->n_tensors == 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: the adapter has no tensors", what);
    llm_adapter *a = llmi_calloc(1, sizeof *a);
    if (!a)
        return llmi_oom("adapter");
    a->model = m;
    a->alpha = alpha;
    a->pairs = llmi_calloc((size_t)m->hp.n_layer * LLMI_LORA_TARGETS, sizeof *a->pairs);
    llm_status st = a->pairs ? LLM_OK : llmi_oom("adapter");
    for (uint64_t i = 0; i < g->n_tensors && st == LLM_OK; i++)
        st = add_tensor(a, what, &g->tensors[i]);
    for (size_t i = 0; st == LLM_OK && i < (size_t)m->hp.n_layer * LLMI_LORA_TARGETS; i++) {
        llmi_lora_pair *p = &a->pairs[i];
        if (!p->a && !p->b)
            continue;
        if (!p->a || !p->b) {
            char name[128];
            snprintf(name, sizeof name, llmi_layer_roles[target_roles[i % LLMI_LORA_TARGETS]].name,
                     (unsigned)(i / LLMI_LORA_TARGETS));
            st = llmi_error(LLM_ERR_BAD_FORMAT, "%s: '%s.lora_%c' has no '%s.lora_%c'", what, name,
                            p->a ? 'a' : 'b', name, p->a ? 'b' : 'a');
            break;
        }
        p->alpha_scale = alpha > 0.0f ? alpha / (float)p->rank : 1.0f;
        a->n_pairs++;
        if (p->rank > a->max_rank)
            a->max_rank = p->rank;
    }
    if (st != LLM_OK) {
        llmi_adapter_free(a);
        return st;
    }
    a->id = atomic_fetch_add(&next_id, 1);
    a->fingerprint = llmi_adapter_fingerprint(a);
    *out = a;
    return LLM_OK;
}

llm_status llmi_adapter_load(const llm_model *m, const char *path, bool use_mmap,
                             llm_adapter **out) {
    *out = NULL;
    llmi_gguf *g = NULL;
    if (llmi_hf_is_adapter_folder(path)) {
        const llmi_hparams *hp = &m->hp;
        llmi_hf_adapter_shape shape = {hp->arch, hp->rope_layout == LLMI_ROPE_ADJACENT, hp->n_head,
                                       hp->n_head_kv};
        LLMI_TRY(llmi_hf_adapter_open(path, &shape, &g));
    } else {
        LLMI_TRY(llmi_gguf_open(path, use_mmap, &g));
    }
    const char *base = strrchr(path, '/');
    llm_status st = llmi_adapter_from_gguf(m, g, base && base[1] ? base + 1 : path, out);
    llmi_gguf_close(g);
    return st;
}

/* splitmix64's finaliser: every input bit reaches every output bit. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Folds n bytes into h eight at a time: one multiply per word keeps the
 * fingerprint of a large adapter a small fraction of its load time. */
static uint64_t fold_bytes(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 32;
    }
    uint64_t tail = 0;
    memcpy(&tail, p, n);
    h = (h ^ tail ^ (uint64_t)n << 56) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
}

uint64_t llmi_adapter_fingerprint(const llm_adapter *a) {
    uint32_t alpha_bits;
    memcpy(&alpha_bits, &a->alpha, sizeof alpha_bits);
    uint64_t h = mix64(0x4C6F524146507231ull ^ alpha_bits);
    const size_t n = (size_t)a->model->hp.n_layer * LLMI_LORA_TARGETS;
    for (size_t i = 0; i < n; i++) {
        const llmi_lora_pair *p = &a->pairs[i];
        if (!p->a)
            continue;
        /* The pair's place and shape, so equal bytes in another place or
         * another split into rows hash differently. */
        uint64_t shape[4] = {i, p->rank, p->in, p->out};
        h = fold_bytes(h, shape, sizeof shape);
        h = fold_bytes(h, p->a, (size_t)p->rank * p->in * sizeof(float));
        h = fold_bytes(h, p->b, (size_t)p->rank * p->out * sizeof(float));
    }
    h = mix64(h);
    return h ? h : 1;
}

uint64_t llmi_adapter_chain_seed(const llm_adapter *a, float scale) {
    if (!a)
        return 0;
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    /* splitmix64 of the id and the scale's bits; never 0 (no adapter) */
    uint64_t z = a->id * 0x9E3779B97F4A7C15ull ^ ((uint64_t)bits << 17);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}
