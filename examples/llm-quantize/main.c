/* llm-quantize: rewrite a GGUF model's matrices in another tensor type, or
 * write a random-weight Llama of a given shape. Both are benchmark inputs
 * (docs/bench.md, "CPU speed versus llama.cpp").
 *
 *   llm-quantize IN.gguf OUT.gguf TYPE
 *   llm-quantize FOLDER OUT.gguf TYPE
 *       IN may be a Hugging Face checkpoint folder (config.json,
 *       safetensors, tokenizer.json), read as the GGUF llama.cpp's
 *       converter would make of it (lib/hf). Every tensor with two or more dimensions (the matrices, token_embd
 *       included) is dequantized row by row and written in TYPE; 1-D tensors
 *       (norm scales) and MoE routers (blk.N.ffn_gate_inp) keep their type.
 *       Every metadata key is copied in order; general.file_type is set to
 *       TYPE's.
 *   llm-quantize --random SHAPE OUT.gguf TYPE [--vocab N] [--seed S]
 *       A random-weight Llama (lib/model/testmodel.h) with SHAPE's layer
 *       sizes: llama-3.2-1b (16 layers, n_embd 2048, 32 heads, 8 KV heads,
 *       n_ff 8192, tied embeddings, vocabulary 128256), tiny, or the pair
 *       moe-bench / moe-bench-dense: 4 Llama layers of n_embd 1024 (16
 *       heads, 4 KV heads) with 64 experts of width 256, 8 used (Mixtral
 *       layout, Qwen3-30B-A3B's ratios), and the same with one dense FFN of
 *       width 2048 = 8 x 256, i.e. equal active parameters. The
 *       vocabulary is the test model's 307 tokens padded with unused tokens
 *       to N (default: SHAPE's), so the LM head costs what it costs in the
 *       real model.
 *
 * TYPE is F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K or
 * Q4_K_M. Q4_K_M is a mix in the spirit of llama.cpp's (simplified): output.weight and
 * token_embd.weight in Q6_K; attn_v and ffn_down in Q6_K in the layers
 * where llama.cpp's use_more_bits() holds (the first and last eighth of the
 * layers and every third one between), in Q4_K elsewhere; every other
 * matrix in Q4_K. K-quants need rows of a multiple of 256 elements: a
 * matrix whose rows are not (SmolLM2's n_embd of 576, for one) falls back
 * to Q5_0 for Q4_K and to Q8_0 for Q6_K, as llama.cpp's does. With
 * --random, Q4_K_M means Q4_K.
 *
 * This tool uses library internals and links the static archive. Exit
 * status: 0 ok, 1 usage error, 2 runtime error. */
#include "core/quant.h"
#include "core/core.h"
#include "gguf/gguf.h"
#include "hf/hf.h"
#include "model/testmodel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void usage(FILE *f) {
    fprintf(f, "NAME\n"
               "  llm-quantize - convert a model's weights to another type\n"
               "\n"
               "SYNOPSIS\n"
               "  llm-quantize IN.gguf|FOLDER OUT.gguf TYPE\n"
               "  llm-quantize --random SHAPE OUT.gguf TYPE [--vocab N] [--seed S]\n"
               "\n"
               "DESCRIPTION\n"
               "  Reads a GGUF file or a Hugging Face folder (safetensors, config.json,\n"
               "  tokenizer.json) and writes a GGUF file whose matrices are in TYPE;\n"
               "  Q4_K_M keeps the sensitive matrices in Q6_K as llama.cpp does. With\n"
               "  --random it writes a model of a named shape with random weights.\n"
               "\n"
               "OPTIONS\n"
               "  TYPE        F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q6_K Q4_K_M\n"
               "  SHAPE       llama-3.2-1b, tiny, moe-bench, moe-bench-dense\n"
               "  --vocab N   vocabulary size of a --random model\n"
               "  --seed S    seed of a --random model's weights\n"
               "  -h, --help  this text\n"
               "\n"
               "EXIT STATUS\n"
               "  0 ok, 1 usage error, 2 runtime error.\n"
               "\n"
               "SEE ALSO\n"
               "  llm-run(1); docs/models.md\n");
}

static int fail(const char *what, llm_status st) {
    fprintf(stderr, "llm-quantize: %s: %s (%s)\n", what, llm_status_name(st), llm_last_error());
    return 2;
}

/* *mixed: TYPE was Q4_K_M (then *out is Q4_K). */
static bool parse_type(const char *s, llmi_ttype *out, bool *mixed) {
    static const struct {
        const char *name;
        llmi_ttype type;
    } types[] = {{"F32", LLMI_T_F32},   {"F16", LLMI_T_F16},   {"BF16", LLMI_T_BF16},
                 {"Q4_0", LLMI_T_Q4_0}, {"Q4_1", LLMI_T_Q4_1}, {"Q5_0", LLMI_T_Q5_0},
                 {"Q5_1", LLMI_T_Q5_1}, {"Q8_0", LLMI_T_Q8_0}, {"Q4_K", LLMI_T_Q4_K},
                 {"Q6_K", LLMI_T_Q6_K}, {"Q4_K_M", LLMI_T_Q4_K}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcasecmp(s, types[i].name) == 0) {
            *out = types[i].type;
            *mixed = strcasecmp(s, "Q4_K_M") == 0;
            return true;
        }
    return false;
}

/* llama.cpp's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M
 * keeps in Q6_K. */
static bool use_more_bits(int layer, int n_layer) {
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

/* The type a matrix is written in: `to`, or for Q4_K_M (mixed) the rule in
 * the header; K-quants fall back when rows are not a multiple of 256. */
static llmi_ttype matrix_type(const char *name, uint64_t ne0, llmi_ttype to, bool mixed,
                              int n_layer) {
    llmi_ttype t = to;
    int layer = -1;
    if (mixed) {
        if (strcmp(name, "output.weight") == 0 || strcmp(name, "token_embd.weight") == 0)
            t = LLMI_T_Q6_K;
        else if ((strstr(name, ".attn_v.") || strstr(name, ".ffn_down.")) &&
                 sscanf(name, "blk.%d.", &layer) == 1 && use_more_bits(layer, n_layer))
            t = LLMI_T_Q6_K;
    }
    if (ne0 % LLMI_QK_K != 0 && t == LLMI_T_Q4_K)
        t = LLMI_T_Q5_0;
    else if (ne0 % LLMI_QK_K != 0 && t == LLMI_T_Q6_K)
        t = LLMI_T_Q8_0;
    return t;
}

/* general.file_type (llama_ftype) of a file whose matrices are all `t`
 * (Q4_K: MOSTLY_Q4_K_S); Q4_K_M is 15. */
static uint32_t file_type(llmi_ttype t, bool mixed) {
    if (mixed)
        return 15;
    switch (t) {
    case LLMI_T_Q4_K:
        return 14;
    case LLMI_T_Q6_K:
        return 18;
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

static char *dup_str(llmi_str s) { return llmi_strndup(s.ptr ? s.ptr : "", (size_t)s.len); }

/* Every key as it was, except the file type, which names the new one. */
static llm_status copy_kv(llmi_gguf_writer *w, const llmi_gguf_kv *kv, uint32_t ftype) {
    if (llmi_str_eq(kv->key, "general.file_type"))
        return llmi_gguf_w_u32(w, "general.file_type", ftype);
    return llmi_gguf_w_copy_kv(w, kv);
}

/* Tensors rewritten, by their type in the input and in the output;
 * tensors copied as they were. */
typedef struct counts {
    uint32_t converted[64], written[64];
    uint32_t kept;
} counts;

static llm_status copy_tensor(llmi_gguf_writer *w, const llmi_gguf_tensor *t, llmi_ttype to,
                              bool mixed, int n_layer, float **buf, size_t *cap, counts *c) {
    char *name = dup_str(t->name);
    if (!name)
        return llmi_oom("tensor name");
    llm_status st;
    /* MoE routers keep their type, as llama.cpp's quantizer keeps them:
     * they are small, and rounding them moves which experts rows pick. */
    bool router = strstr(name, "ffn_gate_inp.") != NULL;
    llmi_ttype type =
        t->n_dims >= 2 && !router ? matrix_type(name, t->ne[0], to, mixed, n_layer) : t->type;
    if (type == t->type) {
        c->kept++;
    } else {
        c->converted[(unsigned)t->type % 64]++;
        c->written[(unsigned)type % 64]++;
    }
    if (type == t->type) {
        st = llmi_gguf_w_tensor_raw(w, name, type, t->n_dims, t->ne, t->data, t->nbytes);
        llmi_free(name);
        return st;
    }
    uint64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (n > *cap) {
        llmi_free(*buf);
        *cap = 0;
        if (!(*buf = llmi_malloc((size_t)n * sizeof **buf))) {
            llmi_free(name);
            return llmi_oom("tensor data");
        }
        *cap = (size_t)n;
    }
    size_t row_bytes = llmi_ttype_row_bytes(t->type, t->ne[0]);
    for (uint64_t r = 0; r < n / t->ne[0]; r++)
        llmi_dequantize_row(t->type, (const uint8_t *)t->data + r * row_bytes, *buf + r * t->ne[0],
                            (int64_t)t->ne[0]);
    st = llmi_gguf_w_tensor(w, name, type, t->n_dims, t->ne, *buf);
    if (st != LLM_OK)
        llmi_error_prefix("tensor '%s' as %s: ", name, llmi_ttype_get(type)->name);
    llmi_free(name);
    return st;
}

/* Layers: one more than the largest N of the blk.N. tensor names. */
static int count_layers(const llmi_gguf *g) {
    int n = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const llmi_str s = g->tensors[i].name;
        int layer = -1, k = 0;
        if (s.len > 4 && memcmp(s.ptr, "blk.", 4) == 0)
            for (k = 4; k < (int)s.len && s.ptr[k] >= '0' && s.ptr[k] <= '9' && k < 12; k++)
                layer = (layer < 0 ? 0 : 10 * layer) + (s.ptr[k] - '0');
        if (layer + 1 > n)
            n = layer + 1;
    }
    return n;
}

static int requantize(const char *in, const char *out, llmi_ttype to, bool mixed) {
    llmi_gguf *g = NULL;
    /* A Hugging Face folder is read as the GGUF the converter would write. */
    llm_status st = llmi_hf_is_folder(in) ? llmi_hf_open(in, true, &g)
                                          : llmi_gguf_open(in, true, &g);
    if (st != LLM_OK)
        return fail(in, st);
    llmi_gguf_writer *w = NULL;
    float *buf = NULL;
    size_t cap = 0;
    counts c = {{0}, {0}, 0};
    if ((st = llmi_gguf_writer_create(&w)) != LLM_OK)
        goto done;
    for (uint64_t i = 0; st == LLM_OK && i < g->n_kv; i++)
        st = copy_kv(w, &g->kv[i], file_type(to, mixed));
    const int n_layer = count_layers(g);
    for (uint64_t i = 0; st == LLM_OK && i < g->n_tensors; i++)
        st = copy_tensor(w, &g->tensors[i], to, mixed, n_layer, &buf, &cap, &c);
    if (st == LLM_OK)
        st = llmi_gguf_writer_save(w, out);
done:
    llmi_free(buf);
    llmi_gguf_writer_free(w);
    llmi_gguf_close(g);
    if (st != LLM_OK)
        return fail(out, st);
    fprintf(stderr, "llm-quantize: %s -> %s:", in, out);
    for (unsigned ty = 0; ty < 64; ty++)
        if (c.converted[ty])
            fprintf(stderr, " %u %s", c.converted[ty], llmi_ttype_get(ty)->name);
    fprintf(stderr, " tensors written as");
    for (unsigned ty = 0; ty < 64; ty++)
        if (c.written[ty])
            fprintf(stderr, " %u %s", c.written[ty], llmi_ttype_get(ty)->name);
    fprintf(stderr, ", %u kept as they were\n", c.kept);
    return 0;
}

static int random_model(const char *shape, const char *out, llmi_ttype type, long vocab,
                        unsigned long long seed) {
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    long shape_vocab;
    if (strcmp(shape, "llama-3.2-1b") == 0) {
        p.n_layer = 16;
        p.n_embd = 2048;
        p.n_head = 32;
        p.n_head_kv = 8;
        p.n_ff = 8192;
        p.n_ctx = 8192;
        p.rope_base = 500000.0f;
        p.tied_embeddings = true;
        p.weight_scale = 0.02f;
        p.name = "random llama-3.2-1b shape";
        shape_vocab = 128256;
    } else if (strcmp(shape, "moe-bench") == 0 || strcmp(shape, "moe-bench-dense") == 0) {
        bool moe = strcmp(shape, "moe-bench") == 0;
        p.n_layer = 4;
        p.n_embd = 1024;
        p.n_head = 16;
        p.n_head_kv = 4;
        p.n_ff = moe ? 256 : 2048;
        p.n_expert = moe ? 64 : 0;
        p.n_expert_used = moe ? 8 : 0;
        p.n_ctx = 4096;
        p.weight_scale = 0.03f;
        p.name = moe ? "random MoE benchmark shape" : "random dense benchmark shape";
        shape_vocab = (long)llmi_testmodel_n_vocab();
    } else if (strcmp(shape, "tiny") == 0) {
        p.name = "random tiny llama";
        shape_vocab = (long)llmi_testmodel_n_vocab();
    } else {
        fprintf(stderr, "llm-quantize: unknown shape '%s'\n", shape);
        usage(stderr);
        return 1;
    }
    if (vocab < 0)
        vocab = shape_vocab;
    if (vocab < (long)llmi_testmodel_n_vocab()) {
        fprintf(stderr, "llm-quantize: --vocab must be at least %u\n", llmi_testmodel_n_vocab());
        return 1;
    }
    p.n_vocab_pad = (uint32_t)(vocab - (long)llmi_testmodel_n_vocab());
    p.type = type;
    p.seed = seed;
    llm_status st = llmi_testmodel_write(&p, out);
    if (st != LLM_OK)
        return fail(out, st);
    fprintf(stderr, "llm-quantize: %s shape, %s, vocabulary %ld -> %s\n", shape,
            llmi_ttype_get(type)->name, vocab, out);
    return 0;
}

static bool parse_num(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || !*s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int main(int argc, char **argv) {
    const char *pos[3];
    int n_pos = 0;
    bool random = false;
    long long vocab = -1, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--random")) {
            random = true;
        } else if (!strcmp(a, "--vocab") && i + 1 < argc) {
            if (!parse_num(argv[++i], 1, 1 << 21, &vocab)) {
                fprintf(stderr, "llm-quantize: bad --vocab '%s'\n", argv[i]);
                return 1;
            }
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            if (!parse_num(argv[++i], 0, INT64_MAX, &seed)) {
                fprintf(stderr, "llm-quantize: bad --seed '%s'\n", argv[i]);
                return 1;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "llm-quantize: unknown option '%s'\n", a);
            usage(stderr);
            return 1;
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            usage(stderr);
            return 1;
        }
    }
    llmi_ttype type;
    bool mixed = false;
    if (n_pos != 3) {
        usage(stderr);
        return 1;
    }
    if (!parse_type(pos[2], &type, &mixed)) {
        fprintf(stderr, "llm-quantize: unknown type '%s'\n", pos[2]);
        usage(stderr);
        return 1;
    }
    if (random)
        return random_model(pos[0], pos[1], type, (long)vocab, (unsigned long long)seed);
    return requantize(pos[0], pos[1], type, mixed);
}
