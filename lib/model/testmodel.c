/* Random tiny Llama GGUFs for tests and benchmarks. Keys and tensor names
 * follow llama.cpp's converter so the loader cannot tell these from real
 * files; values mirror SmolLM2-Instruct where a choice is needed (GPT-2
 * byte-level BPE, "smollm" pre-tokenizer, ChatML, BOS=<|im_start|>,
 * EOS=PAD=<|im_end|>, UNK=<|endoftext|>). */
#include "model/testmodel.h"

#include "gguf/gguf.h"

#include <math.h>
#include <stdio.h>

/* U+0120, GPT-2's stand-in for a space byte; U+010A for '\n'. */
#define G "\xc4\xa0"
#define NL "\xc4\x8a"

/* Merges over common English; every side is a byte token or the result of
 * an earlier merge, and every result is new, as a trained merge list is. */
static const char *const merges[][2] = {
    {G, "t"},      {G, "a"},      {"h", "e"},   {"i", "n"},      {"r", "e"},    {"o", "n"},
    {G "t", "he"}, {"e", "r"},    {G, "s"},     {"a", "t"},      {G, "w"},      {G, "o"},
    {"e", "n"},    {G, "c"},      {"i", "t"},   {"i", "s"},      {"a", "n"},    {"o", "r"},
    {"e", "s"},    {G, "b"},      {"e", "d"},   {G, "f"},        {"in", "g"},   {G, "p"},
    {"o", "u"},    {G "a", "n"},  {"a", "l"},   {"a", "r"},      {G "t", "o"},  {G, "m"},
    {G "o", "f"},  {G, "i"},      {"l", "l"},   {G, "d"},        {G "an", "d"}, {G "i", "n"},
    {G "i", "s"},  {G, "h"},      {G "h", "e"}, {"he", "ll"},    {"hell", "o"}, {G, "y"},
    {G "y", "ou"}, {G "w", "or"}, {"l", "d"},   {G "wor", "ld"}, {G, G},        {NL, NL},
};
#define N_MERGES (sizeof merges / sizeof merges[0])
#define N_BYTE_TOKENS 256u

static const char *const specials[LLMI_TESTMODEL_N_SPECIAL] = {"<|endoftext|>", "<|im_start|>",
                                                               "<|im_end|>"};

/* SmolLM2-135M-Instruct's template, byte for byte. */
static const char chat_template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

uint32_t llmi_testmodel_n_merges(void) { return (uint32_t)N_MERGES; }
uint32_t llmi_testmodel_n_vocab(void) {
    return N_BYTE_TOKENS + (uint32_t)N_MERGES + LLMI_TESTMODEL_N_SPECIAL;
}

void llmi_testmodel_params_init(llmi_testmodel_params *p) {
    memset(p, 0, sizeof *p);
    p->n_layer = 2;
    p->n_embd = 64;
    p->n_head = 4;
    p->n_head_kv = 2;
    p->n_ff = 128;
    p->n_ctx = 256;
    p->rope_base = 10000.0f;
    p->rms_eps = 1e-5f;
    p->type = LLMI_T_F32;
    p->tied_embeddings = false;
    p->seed = 1;
    p->weight_scale = 0.1f;
    p->name = "llminfer-testmodel";
    p->arch = "llama";
}

static uint32_t head_dim(const llmi_testmodel_params *p) {
    return p->head_dim ? p->head_dim : p->n_embd / p->n_head;
}

static uint32_t ff_exp(const llmi_testmodel_params *p) {
    return p->n_ff_exp ? p->n_ff_exp : p->n_ff;
}

/* splitmix64: tiny, seedable with any value, identical everywhere. */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), exactly representable. */
static float next_sym(uint64_t *s) {
    return (float)(next_u64(s) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

/* UTF-8 of GPT-2's printable stand-in for each byte: bytes that are visible
 * Latin-1 characters stand for themselves, the others take U+0100 upwards in
 * byte order. Tokens come out in GPT-2's vocabulary order. */
static void byte_tokens(char tok[N_BYTE_TOKENS][3]) {
    uint32_t n = 0, extra = 0;
    for (uint32_t pass = 0; pass < 2; pass++) {
        for (uint32_t b = 0; b < 256; b++) {
            bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
            if (printable != (pass == 0))
                continue;
            uint32_t cp = printable ? b : 256 + extra++;
            if (cp < 0x80) {
                tok[n][0] = (char)cp;
                tok[n][1] = 0;
            } else {
                tok[n][0] = (char)(0xc0 | (cp >> 6));
                tok[n][1] = (char)(0x80 | (cp & 0x3f));
                tok[n][2] = 0;
            }
            n++;
        }
    }
}

typedef struct vocab {
    char bytes[N_BYTE_TOKENS][3];
    char merged[N_MERGES][32];
    char merge_text[N_MERGES][40];
    const char *tokens[N_BYTE_TOKENS + N_MERGES + LLMI_TESTMODEL_N_SPECIAL];
    const char *merge_strs[N_MERGES];
    int32_t types[N_BYTE_TOKENS + N_MERGES + LLMI_TESTMODEL_N_SPECIAL];
} vocab;

static bool in_vocab(const vocab *v, uint32_t n, const char *s) {
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(v->tokens[i], s) == 0)
            return true;
    return false;
}

static llm_status build_vocab(vocab *v) {
    byte_tokens(v->bytes);
    uint32_t n = 0;
    for (uint32_t i = 0; i < N_BYTE_TOKENS; i++) {
        v->types[n] = 1; /* normal */
        v->tokens[n++] = v->bytes[i];
    }
    for (uint32_t i = 0; i < N_MERGES; i++) {
        const char *a = merges[i][0], *b = merges[i][1];
        snprintf(v->merged[i], sizeof v->merged[i], "%s%s", a, b);
        snprintf(v->merge_text[i], sizeof v->merge_text[i], "%s %s", a, b);
        /* A broken table would make a vocabulary no tokenizer can use. */
        if (!in_vocab(v, n, a) || !in_vocab(v, n, b) || in_vocab(v, n, v->merged[i]))
            return llmi_error(LLM_ERR_INTERNAL, "testmodel: merge %u '%s' is inconsistent", i,
                              v->merge_text[i]);
        v->merge_strs[i] = v->merge_text[i];
        v->types[n] = 1;
        v->tokens[n++] = v->merged[i];
    }
    for (uint32_t i = 0; i < LLMI_TESTMODEL_N_SPECIAL; i++) {
        v->types[n] = 3; /* control */
        v->tokens[n++] = specials[i];
    }
    return LLM_OK;
}

static uint32_t file_type(llmi_ttype t) {
    switch (t) {
    case LLMI_T_F16:
        return 1;
    case LLMI_T_Q4_0:
        return 2;
    case LLMI_T_Q4_1:
        return 3;
    case LLMI_T_Q8_0:
        return 7;
    case LLMI_T_Q5_0:
        return 8;
    case LLMI_T_Q5_1:
        return 9;
    case LLMI_T_BF16:
        return 32;
    default:
        return 0;
    }
}

static llm_status check_params(const llmi_testmodel_params *p) {
    if (!p)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "testmodel: params is NULL");
    const llmi_ttype_info *ti = llmi_ttype_get(p->type);
    if (!ti)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "testmodel: unknown weight type %d",
                          (int)p->type);
    if (!p->n_layer || !p->n_embd || !p->n_head || !p->n_head_kv || !p->n_ff || !p->n_ctx)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "testmodel: a size parameter is 0");
    if ((!p->head_dim && p->n_embd % p->n_head) || p->n_head % p->n_head_kv ||
        head_dim(p) % 2 || head_dim(p) > 1024)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "testmodel: n_embd %u, n_head %u, n_head_kv %u do not divide evenly"
                          " into even-sized heads",
                          p->n_embd, p->n_head, p->n_head_kv);
    if (p->n_embd % ti->block || p->n_ff % ti->block || (p->n_head * head_dim(p)) % ti->block ||
        ff_exp(p) % ti->block || p->n_ff_shexp % ti->block)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "testmodel: n_embd %u, n_ff %u and n_head * head_dim must be multiples"
                          " of %s's block %u",
                          p->n_embd, p->n_ff, ti->name, ti->block);
    if (!p->arch || !*p->arch || strlen(p->arch) > 24)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "testmodel: bad architecture name");
    if (p->n_embd > 65536 || p->n_ff > 1u << 20 || p->n_layer > 1024 || p->n_vocab_pad > 1u << 20 ||
        p->n_expert > 1024 || p->n_ff_exp > 1u << 20 || p->n_ff_shexp > 1u << 20)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "testmodel: sizes too large");
    if (!(p->rope_base > 0) || !(p->rms_eps > 0) || !isfinite(p->weight_scale))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "testmodel: bad rope_base/rms_eps/scale");
    return LLM_OK;
}

/* Writes the token texts and types, with the padding tokens after the
 * vocabulary proper. */
static llm_status w_tokens(llmi_gguf_writer *w, const llmi_testmodel_params *p, const vocab *v) {
    uint32_t base = llmi_testmodel_n_vocab(), n = base + p->n_vocab_pad;
    if (!p->n_vocab_pad) {
        LLMI_TRY(llmi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", v->tokens, n));
        return llmi_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v->types, n);
    }
    enum { PAD_TEXT = 24 }; /* "<|pad_1048575|>" and its NUL fit */
    const char **tokens = llmi_calloc(n, sizeof *tokens);
    int32_t *types = llmi_calloc(n, sizeof *types);
    char *text = llmi_calloc(p->n_vocab_pad, PAD_TEXT);
    llm_status st = LLM_OK;
    if (!tokens || !types || !text) {
        st = llmi_oom("testmodel padding tokens");
        goto done;
    }
    memcpy(tokens, v->tokens, base * sizeof *tokens);
    memcpy(types, v->types, base * sizeof *types);
    for (uint32_t i = 0; i < p->n_vocab_pad; i++) {
        char *t = text + (size_t)i * PAD_TEXT;
        snprintf(t, PAD_TEXT, "<|pad_%u|>", i);
        tokens[base + i] = t;
        types[base + i] = 5; /* unused */
    }
    if ((st = llmi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, n)) == LLM_OK)
        st = llmi_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, n);
done:
    llmi_free(tokens);
    llmi_free(types);
    llmi_free(text);
    return st;
}

static llm_status w_metadata(llmi_gguf_writer *w, const llmi_testmodel_params *p, const vocab *v) {
    uint32_t n_vocab = llmi_testmodel_n_vocab() + p->n_vocab_pad;
    uint32_t tok_eot = N_BYTE_TOKENS + (uint32_t)N_MERGES;
    char k[64];
#define AK(suffix) (snprintf(k, sizeof k, "%s." suffix, p->arch), k)
    LLMI_TRY(llmi_gguf_w_str(w, "general.architecture", p->arch));
    LLMI_TRY(llmi_gguf_w_str(w, "general.type", "model"));
    LLMI_TRY(llmi_gguf_w_str(w, "general.name", p->name ? p->name : ""));
    LLMI_TRY(llmi_gguf_w_u32(w, AK("block_count"), p->n_layer));
    LLMI_TRY(llmi_gguf_w_u32(w, AK("context_length"), p->n_ctx));
    LLMI_TRY(llmi_gguf_w_u32(w, AK("embedding_length"), p->n_embd));
    LLMI_TRY(llmi_gguf_w_u32(w, AK("feed_forward_length"), p->n_ff));
    LLMI_TRY(llmi_gguf_w_u32(w, AK("attention.head_count"), p->n_head));
    LLMI_TRY(llmi_gguf_w_u32(w, AK("attention.head_count_kv"), p->n_head_kv));
    LLMI_TRY(llmi_gguf_w_f32(w, AK("rope.freq_base"), p->rope_base));
    LLMI_TRY(llmi_gguf_w_f32(w, AK("attention.layer_norm_rms_epsilon"), p->rms_eps));
    LLMI_TRY(llmi_gguf_w_u32(w, "general.file_type", file_type(p->type)));
    LLMI_TRY(llmi_gguf_w_u32(w, AK("vocab_size"), n_vocab));
    LLMI_TRY(llmi_gguf_w_u32(w, AK("rope.dimension_count"), head_dim(p)));
    if (p->head_dim) {
        LLMI_TRY(llmi_gguf_w_u32(w, AK("attention.key_length"), p->head_dim));
        LLMI_TRY(llmi_gguf_w_u32(w, AK("attention.value_length"), p->head_dim));
    }
    if (p->attn_softcap > 0)
        LLMI_TRY(llmi_gguf_w_f32(w, AK("attn_logit_softcapping"), p->attn_softcap));
    if (p->logit_softcap > 0)
        LLMI_TRY(llmi_gguf_w_f32(w, AK("final_logit_softcapping"), p->logit_softcap));
    if (p->sliding_window)
        LLMI_TRY(llmi_gguf_w_u32(w, AK("attention.sliding_window"), p->sliding_window));
    if (p->rope_scaling > 0) {
        LLMI_TRY(llmi_gguf_w_str(w, AK("rope.scaling.type"),
                                 p->rope_scaling_type ? p->rope_scaling_type : "linear"));
        LLMI_TRY(llmi_gguf_w_f32(w, AK("rope.scaling.factor"), p->rope_scaling));
    }
    if (p->n_expert) {
        LLMI_TRY(llmi_gguf_w_u32(w, AK("expert_count"), p->n_expert));
        LLMI_TRY(llmi_gguf_w_u32(w, AK("expert_used_count"), p->n_expert_used));
        if (p->n_ff_exp)
            LLMI_TRY(llmi_gguf_w_u32(w, AK("expert_feed_forward_length"), p->n_ff_exp));
        if (p->n_ff_shexp)
            LLMI_TRY(llmi_gguf_w_u32(w, AK("expert_shared_feed_forward_length"), p->n_ff_shexp));
    }
#undef AK
    LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", false));
    LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false));
    LLMI_TRY(llmi_gguf_w_str(w, "tokenizer.ggml.model", "gpt2"));
    LLMI_TRY(llmi_gguf_w_str(w, "tokenizer.ggml.pre", "smollm"));
    LLMI_TRY(w_tokens(w, p, v));
    LLMI_TRY(llmi_gguf_w_arr_str(w, "tokenizer.ggml.merges", v->merge_strs, N_MERGES));
    LLMI_TRY(llmi_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", tok_eot + 1));
    LLMI_TRY(llmi_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", tok_eot + 2));
    LLMI_TRY(llmi_gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", tok_eot));
    LLMI_TRY(llmi_gguf_w_u32(w, "tokenizer.ggml.padding_token_id", tok_eot + 2));
    LLMI_TRY(llmi_gguf_w_str(w, "tokenizer.chat_template", chat_template));
    LLMI_TRY(llmi_gguf_w_u32(w, "general.quantization_version", 2));
    return LLM_OK;
}

/* Fills `buf` with n values and adds it as tensor `name`. Norm scales sit
 * around 1 so activations keep their size through the layers. */
static llm_status w_random_dims(llmi_gguf_writer *w, uint64_t *rng, float *buf, const char *name,
                                llmi_ttype type, uint32_t n_dims, const uint64_t ne[3], bool norm,
                                float scale) {
    size_t n = (size_t)(ne[0] * ne[1] * ne[2]);
    for (size_t i = 0; i < n; i++)
        buf[i] = norm ? 1.0f + 0.1f * next_sym(rng) : scale * next_sym(rng);
    return llmi_gguf_w_tensor(w, name, norm ? LLMI_T_F32 : type, n_dims, ne, buf);
}

static llm_status w_random(llmi_gguf_writer *w, uint64_t *rng, float *buf, const char *name,
                           llmi_ttype type, uint64_t ne0, uint64_t ne1, bool norm, float scale) {
    const uint64_t ne[3] = {ne0, ne1, 1};
    return w_random_dims(w, rng, buf, name, type, ne1 > 1 ? 2 : 1, ne, norm, scale);
}

/* The routed FFN of layer l in place of ffn_gate/up/down. The router is
 * F32, as llama.cpp's quantizer keeps it; its rows are scaled up so the
 * softmax is far from uniform and routing matters. */
static llm_status w_experts(llmi_gguf_writer *w, const llmi_testmodel_params *p, uint64_t *rng,
                            float *buf, uint32_t l) {
    uint32_t e = p->n_embd, ff = ff_exp(p), ne = p->n_expert;
    float s = p->weight_scale;
    char nm[64];
#define NM(suffix) (snprintf(nm, sizeof nm, "blk.%u." suffix, l), nm)
    const uint64_t router[3] = {e, ne, 1}, in[3] = {e, ff, ne}, out[3] = {ff, e, ne};
    LLMI_TRY(w_random_dims(w, rng, buf, NM("ffn_gate_inp.weight"), LLMI_T_F32, 2, router, false,
                           4 * s));
    LLMI_TRY(w_random_dims(w, rng, buf, NM("ffn_gate_exps.weight"), p->type, 3, in, false, s));
    LLMI_TRY(w_random_dims(w, rng, buf, NM("ffn_up_exps.weight"), p->type, 3, in, false, s));
    LLMI_TRY(w_random_dims(w, rng, buf, NM("ffn_down_exps.weight"), p->type, 3, out, false, s));
    if (p->n_ff_shexp) {
        uint32_t fs = p->n_ff_shexp;
        LLMI_TRY(w_random(w, rng, buf, NM("ffn_gate_inp_shexp.weight"), LLMI_T_F32, e, 1, false,
                          s));
        LLMI_TRY(w_random(w, rng, buf, NM("ffn_gate_shexp.weight"), p->type, e, fs, false, s));
        LLMI_TRY(w_random(w, rng, buf, NM("ffn_up_shexp.weight"), p->type, e, fs, false, s));
        LLMI_TRY(w_random(w, rng, buf, NM("ffn_down_shexp.weight"), p->type, fs, e, false, s));
    }
#undef NM
    return LLM_OK;
}

/* The optional per-layer tensors the params ask for (after the others, so
 * a file without them keeps its bytes). Biases are F32 like norms but
 * spread around 0. */
static llm_status w_features(llmi_gguf_writer *w, const llmi_testmodel_params *p, uint64_t *rng,
                             float *buf, uint32_t l) {
    uint32_t hd = head_dim(p), q = p->n_head * hd, kv = p->n_head_kv * hd;
    char nm[64];
#define NM(suffix) (snprintf(nm, sizeof nm, "blk.%u." suffix, l), nm)
    if (p->qkv_bias) {
        LLMI_TRY(w_random(w, rng, buf, NM("attn_q.bias"), LLMI_T_F32, q, 1, false, 0.5f));
        LLMI_TRY(w_random(w, rng, buf, NM("attn_k.bias"), LLMI_T_F32, kv, 1, false, 0.5f));
        LLMI_TRY(w_random(w, rng, buf, NM("attn_v.bias"), LLMI_T_F32, kv, 1, false, 0.5f));
    }
    if (p->qk_norm) {
        LLMI_TRY(w_random(w, rng, buf, NM("attn_q_norm.weight"), LLMI_T_F32, hd, 1, true, 0));
        LLMI_TRY(w_random(w, rng, buf, NM("attn_k_norm.weight"), LLMI_T_F32, hd, 1, true, 0));
    }
    if (p->post_norms) {
        LLMI_TRY(w_random(w, rng, buf, NM("post_attention_norm.weight"), LLMI_T_F32, p->n_embd, 1,
                          true, 0));
        LLMI_TRY(w_random(w, rng, buf, NM("post_ffw_norm.weight"), LLMI_T_F32, p->n_embd, 1, true,
                          0));
    }
#undef NM
    return LLM_OK;
}

static llm_status w_tensors(llmi_gguf_writer *w, const llmi_testmodel_params *p, float *buf) {
    uint64_t rng = p->seed;
    uint32_t e = p->n_embd, hd = head_dim(p), kv = p->n_head_kv * hd, q = p->n_head * hd,
             nv = llmi_testmodel_n_vocab() + p->n_vocab_pad;
    float s = p->weight_scale;
    llmi_ttype t = p->type;
    char nm[64];
    LLMI_TRY(w_random(w, &rng, buf, "token_embd.weight", t, e, nv, false, s));
    for (uint32_t l = 0; l < p->n_layer; l++) {
        static const struct {
            const char *suffix;
            int in, out;
            bool norm;
        } parts[] = {
            /* sizes: 0 = n_embd, 1 = n_kv * head_dim, 2 = n_ff, 3 = n_head * head_dim */
            {"attn_norm", 0, 0, true}, {"attn_q", 0, 3, false},      {"attn_k", 0, 1, false},
            {"attn_v", 0, 1, false},   {"attn_output", 3, 0, false}, {"ffn_norm", 0, 0, true},
            {"ffn_gate", 0, 2, false}, {"ffn_up", 0, 2, false},      {"ffn_down", 2, 0, false},
        };
        /* The first six parts are attention and ffn_norm; the dense FFN follows. */
        size_t n_parts = p->n_expert ? 6 : sizeof parts / sizeof parts[0];
        for (size_t i = 0; i < n_parts; i++) {
            uint32_t dims[4] = {e, kv, p->n_ff, q};
            snprintf(nm, sizeof nm, "blk.%u.%s.weight", l, parts[i].suffix);
            uint64_t ne1 = parts[i].norm ? 1 : dims[parts[i].out];
            LLMI_TRY(w_random(w, &rng, buf, nm, t, dims[parts[i].in], ne1, parts[i].norm, s));
        }
        if (p->n_expert)
            LLMI_TRY(w_experts(w, p, &rng, buf, l));
        LLMI_TRY(w_features(w, p, &rng, buf, l));
    }
    LLMI_TRY(w_random(w, &rng, buf, "output_norm.weight", t, e, 1, true, s));
    if (!p->tied_embeddings)
        LLMI_TRY(w_random(w, &rng, buf, "output.weight", t, e, nv, false, s));
    return LLM_OK;
}

/* Builds the whole file in a writer; on failure nothing is left allocated. */
static llm_status build(const llmi_testmodel_params *p, llmi_gguf_writer **out) {
    *out = NULL;
    LLMI_TRY(check_params(p));
    llm_status st;
    llmi_gguf_writer *w = NULL;
    float *buf = NULL;
    vocab *v = llmi_calloc(1, sizeof *v);
    if (!v)
        return llmi_oom("testmodel vocabulary");
    size_t kv = (size_t)p->n_head * head_dim(p); /* >= n_kv * head_dim */
    size_t big = (size_t)llmi_testmodel_n_vocab() + p->n_vocab_pad;
    if (p->n_ff > big)
        big = p->n_ff;
    if (kv > big)
        big = kv;
    if (p->n_embd > big)
        big = p->n_embd;
    if (p->n_expert && (size_t)p->n_expert * ff_exp(p) > big)
        big = (size_t)p->n_expert * ff_exp(p);
    if (p->n_ff_shexp > big)
        big = p->n_ff_shexp;
    buf = llmi_calloc(big * p->n_embd, sizeof *buf);
    if (!buf) {
        st = llmi_oom("testmodel scratch");
        goto done;
    }
    if ((st = build_vocab(v)) != LLM_OK)
        goto done;
    if ((st = llmi_gguf_writer_create(&w)) != LLM_OK)
        goto done;
    if ((st = w_metadata(w, p, v)) != LLM_OK)
        goto done;
    if ((st = w_tensors(w, p, buf)) != LLM_OK)
        goto done;
    *out = w;
    w = NULL;
done:
    llmi_gguf_writer_free(w);
    llmi_free(buf);
    llmi_free(v);
    return st;
}

llm_status llmi_testmodel_write(const llmi_testmodel_params *p, const char *path) {
    if (!path)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "testmodel: path is NULL");
    llmi_gguf_writer *w;
    LLMI_TRY(build(p, &w));
    llm_status st = llmi_gguf_writer_save(w, path);
    llmi_gguf_writer_free(w);
    return st;
}

llm_status llmi_testmodel_to_memory(const llmi_testmodel_params *p, void **data, size_t *size) {
    if (!data || !size)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "testmodel: NULL output");
    *data = NULL;
    *size = 0;
    llmi_gguf_writer *w;
    LLMI_TRY(build(p, &w));
    llm_status st = llmi_gguf_writer_to_memory(w, data, size);
    llmi_gguf_writer_free(w);
    return st;
}
