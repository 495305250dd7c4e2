/* Vocabulary: loading tokenizer.ggml.* from GGUF, the text -> id map (its
 * lookup, llmi_tok_find, is in base.c), special-token ids and attributes,
 * decoded token pieces, accessors.
 *
 * Behaviour follows llama.cpp's llama-vocab.cpp (defaults, end-of-generation
 * detection, token attributes) so ids and pieces match it exactly. */
#define LLMI_TOKENIZER_INTERNAL
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hashing and the text -> id map ---- */

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n && c < (1u << 31))
        c <<= 1;
    return c;
}

static llm_status map_build(llmi_tokenizer *t) {
    uint32_t cap = pow2_at_least((uint64_t)t->n_vocab * 2);
    t->map.slots = llmi_calloc(cap, sizeof(uint32_t));
    if (!t->map.slots)
        return llmi_oom("token map");
    t->map.mask = cap - 1;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        const char *s = llmi_tok_str(t, (llm_token)id);
        uint32_t n = llmi_tok_len(t, (llm_token)id);
        uint32_t i = (uint32_t)llmi_tok_hash(s, n) & t->map.mask;
        for (;;) {
            uint32_t v = t->map.slots[i];
            if (v == 0)
                break;
            llm_token o = (llm_token)(v - 1);
            if (llmi_tok_len(t, o) == n && memcmp(llmi_tok_str(t, o), s, n) == 0)
                break;
            i = (i + 1) & t->map.mask;
        }
        t->map.slots[i] = id + 1; /* a duplicate text maps to its last id */
    }
    return LLM_OK;
}

/* ---- loading ---- */

static llm_status missing(llm_status st, const char *key) {
    if (st == LLM_ERR_NOT_FOUND)
        return llmi_error(LLM_ERR_BAD_FORMAT, "missing key '%s'", key);
    return st;
}

static bool str_is(llmi_str s, const char *c) { return llmi_str_eq(s, c); }

/* Reads an integer token id key; absent, non-integer or out-of-range values
 * leave *id as it is (llama.cpp keeps its default then). */
static void get_id(const llmi_gguf *g, const char *key, uint32_t n_vocab, llm_token *id) {
    const llmi_gguf_kv *kv = llmi_gguf_find(g, key);
    if (!kv)
        return;
    int64_t v;
    switch (kv->type) {
    case LLMI_GGUF_U8:
    case LLMI_GGUF_U16:
    case LLMI_GGUF_U32:
    case LLMI_GGUF_U64:
        v = kv->scalar.u > (uint64_t)INT32_MAX ? -1 : (int64_t)kv->scalar.u;
        break;
    case LLMI_GGUF_I8:
    case LLMI_GGUF_I16:
    case LLMI_GGUF_I32:
    case LLMI_GGUF_I64:
        v = kv->scalar.i;
        break;
    default:
        llmi_log(LLM_LOG_WARN, "tokenizer: key '%s' is not an integer; ignored", key);
        return;
    }
    if (v < 0 || v >= (int64_t)n_vocab) {
        llmi_log(LLM_LOG_WARN, "tokenizer: '%s' = %lld out of range; using default %d", key,
                 (long long)v, (int)*id);
        return;
    }
    *id = (llm_token)v;
}

/* As get_id for the ids generation depends on (BOS starts prompts, EOS
 * ends answers): an integer outside the vocabulary is refused, naming the
 * key, instead of falling back to a default id that may be any token. */
static llm_status get_id_in_vocab(const llmi_gguf *g, const char *key, uint32_t n_vocab,
                                  llm_token *id) {
    const llmi_gguf_kv *kv = llmi_gguf_find(g, key);
    if (kv) {
        bool is_unsigned = kv->type == LLMI_GGUF_U8 || kv->type == LLMI_GGUF_U16 ||
                           kv->type == LLMI_GGUF_U32 || kv->type == LLMI_GGUF_U64;
        bool is_signed = kv->type == LLMI_GGUF_I8 || kv->type == LLMI_GGUF_I16 ||
                         kv->type == LLMI_GGUF_I32 || kv->type == LLMI_GGUF_I64;
        if (is_unsigned && kv->scalar.u >= n_vocab)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "'%s' = %llu is outside the vocabulary of %u tokens", key,
                              (unsigned long long)kv->scalar.u, n_vocab);
        if (is_signed && (kv->scalar.i < 0 || kv->scalar.i >= (int64_t)n_vocab))
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "'%s' = %lld is outside the vocabulary of %u tokens", key,
                              (long long)kv->scalar.i, n_vocab);
    }
    get_id(g, key, n_vocab, id);
    return LLM_OK;
}

static void get_flag(const llmi_gguf *g, const char *key, bool *out) {
    const llmi_gguf_kv *kv = llmi_gguf_find(g, key);
    if (kv && kv->type == LLMI_GGUF_BOOL)
        *out = kv->scalar.b;
}

static bool text_is(const llmi_tokenizer *t, llm_token id, const char *s) {
    size_t n = strlen(s);
    return llmi_tok_len(t, id) == n && memcmp(llmi_tok_str(t, id), s, n) == 0;
}

static const char *const eot_names[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "<|end_of_text|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "<\xef\xbd\x9c"
                                        "end\xe2\x96\x81"
                                        "of\xe2\x96\x81"
                                        "sentence\xef\xbd\x9c>",
                                        "<end_of_utterance>",
                                        NULL};
static const char *const eom_names[] = {"<|eom_id|>", NULL};
static const char *const fim_pad_names[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                            "<PAD>",       "[PAD]",     NULL};
static const char *const fim_rep_names[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>",       "<reponame>",    NULL};
static const char *const fim_sep_names[] = {"<|file_sep|>", NULL};
static const char *const eog_names[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<|return|>",
                                        "<|call|>",
                                        "<|flush|>",
                                        "<|calls|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "</s>",
                                        "<|eom_id|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "[EOS]",
                                        "<|end_of_text|>",
                                        "<end_of_utterance>",
                                        "<eos>",
                                        "<turn|>",
                                        "<|tool_response>",
                                        "<\xef\xbd\x9c"
                                        "end\xe2\x96\x81"
                                        "of\xe2\x96\x81"
                                        "sentence\xef\xbd\x9c>",
                                        "[e~[",
                                        NULL};

/* Finds the lowest id whose text is in `names` when *id is unset, and marks
 * it as a control token (llama.cpp overrides the type the same way). */
static void detect(llmi_tokenizer *t, const char *const *names, llm_token *id) {
    if (*id != LLM_TOKEN_NONE)
        return;
    for (const char *const *n = names; *n; n++) {
        llm_token f = llmi_tok_find(t, *n, strlen(*n));
        if (f >= 0 && (*id == LLM_TOKEN_NONE || f < *id))
            *id = f;
    }
    if (*id != LLM_TOKEN_NONE)
        t->attr[*id] |= LLMI_ATTR_CONTROL;
}

static llm_token find_cstr(const llmi_tokenizer *t, const char *s) {
    return llmi_tok_find(t, s, strlen(s));
}

static llm_status load_eog(llmi_tokenizer *t, const llmi_gguf *g) {
    llm_token fim_pad = LLM_TOKEN_NONE, fim_rep = LLM_TOKEN_NONE, fim_sep = LLM_TOKEN_NONE;
    get_id(g, "tokenizer.ggml.fim_pad_token_id", t->n_vocab, &fim_pad);
    get_id(g, "tokenizer.ggml.fim_rep_token_id", t->n_vocab, &fim_rep);
    get_id(g, "tokenizer.ggml.fim_sep_token_id", t->n_vocab, &fim_sep);
    detect(t, eot_names, &t->eot);
    detect(t, eom_names, &t->eom);
    detect(t, fim_pad_names, &fim_pad);
    detect(t, fim_rep_names, &fim_rep);
    detect(t, fim_sep_names, &fim_sep);

    t->eog = llmi_calloc(t->n_vocab, 1);
    if (!t->eog)
        return llmi_oom("end-of-generation set");
    llm_token fixed[] = {fim_pad, fim_rep, fim_sep, t->eos, t->eot, t->eom};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i] != LLM_TOKEN_NONE)
            t->eog[fixed[i]] = 1;
    for (const char *const *n = eog_names; *n; n++) {
        llm_token id = find_cstr(t, *n);
        if (id < 0)
            continue;
        t->eog[id] = 1;
        t->attr[id] |= LLMI_ATTR_CONTROL;
    }
    /* gpt-oss: these always render */
    static const char *const always[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>",
                                         NULL};
    for (const char *const *n = always; *n; n++) {
        llm_token id = find_cstr(t, *n);
        if (id >= 0)
            t->attr[id] = LLMI_ATTR_USER_DEFINED;
    }
    /* o200k_harmony / solar-open: <|end|> is not an end of generation there */
    bool has_return = false, has_call = false, has_flush = false;
    llm_token end_id = LLM_TOKEN_NONE, s_id = LLM_TOKEN_NONE;
    bool normal_s = false;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        if (!t->eog[id])
            continue;
        llm_token i = (llm_token)id;
        if (text_is(t, i, "<|return|>"))
            has_return = true;
        else if (text_is(t, i, "<|call|>") || text_is(t, i, "<|calls|>"))
            has_call = true;
        else if (text_is(t, i, "<|flush|>"))
            has_flush = true;
        else if (text_is(t, i, "<|end|>"))
            end_id = i;
        if (text_is(t, i, "<|tool_response>") || text_is(t, i, "<|plamo:eos|>"))
            normal_s = true;
        else if (text_is(t, i, "</s>"))
            s_id = i;
    }
    if (end_id != LLM_TOKEN_NONE && ((has_return && has_call) || (has_call && has_flush))) {
        t->eog[end_id] = 0;
        t->attr[end_id] = LLMI_ATTR_USER_DEFINED;
    }
    if (normal_s && s_id != LLM_TOKEN_NONE) {
        t->eog[s_id] = 0;
        t->attr[s_id] = LLMI_ATTR_NORMAL;
    }
    return LLM_OK;
}

static int special_cmp_len(const llmi_tokenizer *t, int32_t a, int32_t b) {
    uint32_t la = llmi_tok_len(t, a), lb = llmi_tok_len(t, b);
    if (la != lb)
        return la > lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

static llm_status build_special(llmi_tokenizer *t) {
    uint32_t n = 0;
    const uint16_t mask = LLMI_ATTR_CONTROL | LLMI_ATTR_USER_DEFINED | LLMI_ATTR_UNKNOWN;
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & mask)
            n++;
    t->special = llmi_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!t->special)
        return llmi_oom("special token list");
    n = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & mask)
            t->special[n++] = (int32_t)id;
    t->n_special = n;
    /* insertion sort is fine for the few hundred a vocabulary has; fall back
     * to a simple shell sort for the rare huge lists */
    for (uint32_t gap = n / 2; gap > 0; gap /= 2)
        for (uint32_t i = gap; i < n; i++) {
            int32_t v = t->special[i];
            uint32_t j = i;
            while (j >= gap && special_cmp_len(t, t->special[j - gap], v) > 0) {
                t->special[j] = t->special[j - gap];
                j -= gap;
            }
            t->special[j] = v;
        }
    return LLM_OK;
}

/* Decoded bytes of a token, the way llama.cpp's token_to_piece renders it
 * with special = true. */
static size_t piece_of(const llmi_tokenizer *t, llm_token id, char *out) {
    const char *s = llmi_tok_str(t, id);
    size_t n = llmi_tok_len(t, id), o = 0;
    uint16_t a = t->attr[id];
    if (a & (LLMI_ATTR_UNKNOWN | LLMI_ATTR_CONTROL | LLMI_ATTR_USER_DEFINED)) {
        if (out)
            memcpy(out, s, n);
        return n;
    }
    if (a & LLMI_ATTR_NORMAL) {
        if (t->model == LLMI_TOKMODEL_SPM || t->model == LLMI_TOKMODEL_WPM) {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    if (out)
                        out[o] = ' ';
                    o++;
                    i += 3;
                } else {
                    if (out)
                        out[o] = s[i];
                    o++;
                    i++;
                }
            }
            return o;
        }
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l = llmi_tok_utf8_decode(s + i, n - i, &cp);
            int b = llmi_bpe_cp_byte(cp);
            if (b >= 0) {
                if (out)
                    out[o] = (char)b;
                o++;
            } else { /* llama.cpp's marker for a character outside the byte map */
                char tmp[64];
                int k = snprintf(tmp, sizeof tmp, "[UNK_BYTE_0x");
                for (size_t j = 0; j < l; j++)
                    k += snprintf(tmp + k, sizeof tmp - (size_t)k, "%02x", (unsigned char)s[i + j]);
                if (out) {
                    memcpy(out + o, tmp, (size_t)k);
                    memcpy(out + o + k, s, n);
                    out[o + (size_t)k + n] = ']';
                }
                o += (size_t)k + n + 1;
            }
            i += l;
        }
        return o;
    }
    if (a & LLMI_ATTR_BYTE) {
        unsigned v;
        char hex[3] = {0};
        if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            hex[0] = s[3];
            hex[1] = s[4];
            v = (unsigned)strtoul(hex, NULL, 16);
        } else if (t->model == LLMI_TOKMODEL_BPE) {
            uint32_t cp;
            llmi_tok_utf8_decode(s, n, &cp);
            int b = llmi_bpe_cp_byte(cp);
            if (b < 0)
                return 0;
            v = (unsigned)b;
        } else {
            return 0;
        }
        if (out)
            out[0] = (char)v;
        return 1;
    }
    return 0; /* unused / undefined tokens render as nothing */
}

static llm_status build_pieces(llmi_tokenizer *t) {
    size_t total = 0;
    t->piece_off = llmi_malloc(((size_t)t->n_vocab + 1) * sizeof(uint32_t));
    if (!t->piece_off)
        return llmi_oom("token pieces");
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = (uint32_t)total;
        total += piece_of(t, (llm_token)id, NULL);
        if (total > UINT32_MAX)
            return llmi_error(LLM_ERR_LIMIT, "token texts too large");
    }
    t->piece_off[t->n_vocab] = (uint32_t)total;
    t->piece = llmi_malloc(total ? total : 1);
    if (!t->piece)
        return llmi_oom("token pieces");
    for (uint32_t id = 0; id < t->n_vocab; id++)
        piece_of(t, (llm_token)id, t->piece + t->piece_off[id]);
    return LLM_OK;
}

/* llama.cpp reads token texts as C strings: a text stops at its first NUL. */
static uint64_t cstr_len(llmi_str s) {
    const char *z = s.len ? memchr(s.ptr, '\0', (size_t)s.len) : NULL;
    return z ? (uint64_t)(z - s.ptr) : s.len;
}

static llm_status load_texts(llmi_tokenizer *t, const llmi_gguf_kv *toks) {
    size_t total = 0;
    char tmp[32];
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint64_t l = cstr_len(toks->arr_strs[i]);
        if (l == 0)
            l = (uint64_t)snprintf(tmp, sizeof tmp, "[EMPTY_%u]", i);
        if (l > UINT32_MAX - total)
            return llmi_error(LLM_ERR_LIMIT, "token texts too large");
        total += (size_t)l;
    }
    t->text = llmi_malloc(total ? total : 1);
    t->text_off = llmi_malloc(((size_t)t->n_vocab + 1) * sizeof(uint32_t));
    if (!t->text || !t->text_off)
        return llmi_oom("token texts");
    size_t o = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        t->text_off[i] = (uint32_t)o;
        llmi_str s = toks->arr_strs[i];
        s.len = cstr_len(s);
        if (s.len == 0) {
            int k = snprintf(tmp, sizeof tmp, "[EMPTY_%u]", i);
            memcpy(t->text + o, tmp, (size_t)k);
            o += (size_t)k;
            llmi_log(LLM_LOG_WARN, "tokenizer: empty token at index %u", i);
        } else {
            memcpy(t->text + o, s.ptr, (size_t)s.len);
            o += (size_t)s.len;
        }
    }
    t->text_off[t->n_vocab] = (uint32_t)o;
    return LLM_OK;
}

static llm_status load_scores_types(llmi_tokenizer *t, const llmi_gguf *g) {
    uint32_t n = t->n_vocab;
    t->score = llmi_calloc(n, sizeof(float));
    t->attr = llmi_calloc(n, sizeof(uint16_t));
    t->type = llmi_calloc(n, 1);
    if (!t->score || !t->attr || !t->type)
        return llmi_oom("token attributes");

    const llmi_gguf_kv *kv = llmi_gguf_find(g, "tokenizer.ggml.scores");
    if (kv) {
        if (kv->type != LLMI_GGUF_ARRAY ||
            (kv->arr_type != LLMI_GGUF_F32 && kv->arr_type != LLMI_GGUF_I32))
            return llmi_error(LLM_ERR_BAD_FORMAT, "key 'tokenizer.ggml.scores' has a bad type");
        if (kv->arr_len < n)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "key 'tokenizer.ggml.scores' has %llu entries for %u tokens",
                              (unsigned long long)kv->arr_len, n);
        for (uint32_t i = 0; i < n; i++) {
            if (kv->arr_type == LLMI_GGUF_F32) {
                memcpy(&t->score[i], kv->arr_data + 4 * (size_t)i, 4);
            } else {
                int32_t v;
                memcpy(&v, kv->arr_data + 4 * (size_t)i, 4);
                t->score[i] = (float)v;
            }
        }
    }
    kv = llmi_gguf_find(g, "tokenizer.ggml.token_type");
    if (kv) {
        if (kv->type != LLMI_GGUF_ARRAY ||
            (kv->arr_type != LLMI_GGUF_I32 && kv->arr_type != LLMI_GGUF_U32))
            return llmi_error(LLM_ERR_BAD_FORMAT, "key 'tokenizer.ggml.token_type' has a bad type");
        if (kv->arr_len < n)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "key 'tokenizer.ggml.token_type' has %llu entries for %u tokens",
                              (unsigned long long)kv->arr_len, n);
    }
    for (uint32_t i = 0; i < n; i++) {
        int32_t ty = LLMI_TOKTYPE_NORMAL;
        if (kv)
            memcpy(&ty, kv->arr_data + 4 * (size_t)i, 4);
        t->type[i] = (uint8_t)(ty < 0 || ty > 255 ? 0 : ty);
        switch (ty) {
        case LLMI_TOKTYPE_NORMAL:
            t->attr[i] = LLMI_ATTR_NORMAL;
            break;
        case LLMI_TOKTYPE_UNKNOWN:
            t->attr[i] = LLMI_ATTR_UNKNOWN;
            break;
        case LLMI_TOKTYPE_CONTROL:
            t->attr[i] = LLMI_ATTR_CONTROL;
            break;
        case LLMI_TOKTYPE_USER_DEFINED:
            t->attr[i] = LLMI_ATTR_USER_DEFINED;
            break;
        case LLMI_TOKTYPE_UNUSED:
            t->attr[i] = LLMI_ATTR_UNUSED;
            break;
        case LLMI_TOKTYPE_BYTE:
            t->attr[i] = LLMI_ATTR_BYTE;
            break;
        default:
            t->attr[i] = 0;
            break;
        }
    }
    return LLM_OK;
}

/* tokenizer.chat_template.<name>: a model's other templates (transformers'
 * named chat templates, e.g. "tool_use"). */
static llm_status load_named_templates(llmi_tokenizer *t, const llmi_gguf *g) {
    static const char prefix[] = "tokenizer.chat_template.";
    const size_t lp = sizeof prefix - 1;
    size_t n = 0;
    for (uint64_t i = 0; i < g->n_kv; i++)
        n += g->kv[i].type == LLMI_GGUF_STRING && g->kv[i].key.len > lp &&
             memcmp(g->kv[i].key.ptr, prefix, lp) == 0;
    if (!n)
        return LLM_OK;
    t->named_templates = llmi_calloc(2 * n, sizeof *t->named_templates);
    if (!t->named_templates)
        return llmi_oom("named chat templates");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const llmi_gguf_kv *kv = &g->kv[i];
        if (kv->type != LLMI_GGUF_STRING || kv->key.len <= lp || memcmp(kv->key.ptr, prefix, lp))
            continue;
        char **slot = &t->named_templates[2 * t->n_named_templates];
        slot[0] = llmi_strndup(kv->key.ptr + lp, (size_t)kv->key.len - lp);
        slot[1] = llmi_strndup(kv->str.ptr, (size_t)kv->str.len);
        t->n_named_templates++; /* freed with the tokenizer, even half made */
        if (!slot[0] || !slot[1])
            return llmi_oom("named chat templates");
    }
    return LLM_OK;
}

static llm_status load(llmi_tokenizer *t, const llmi_gguf *g) {
    llmi_str model, pre = {"", 0};
    LLMI_TRY(missing(llmi_gguf_get_str(g, "tokenizer.ggml.model", true, &model),
                     "tokenizer.ggml.model"));
    const llmi_gguf_kv *prekv = llmi_gguf_find(g, "tokenizer.ggml.pre");
    if (prekv)
        LLMI_TRY(llmi_gguf_get_str(g, "tokenizer.ggml.pre", false, &pre));

    if (str_is(model, "gpt2")) {
        t->model = LLMI_TOKMODEL_BPE;
        t->bos = 11; /* llama.cpp's defaults for a BPE vocabulary */
        t->eos = 11;
    } else if (str_is(model, "llama")) {
        t->model = LLMI_TOKMODEL_SPM;
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else if (str_is(model, "bert")) {
        t->model = LLMI_TOKMODEL_WPM;
        t->add_bos = t->add_eos = true; /* [CLS] ... [SEP] */
    } else {
        return llmi_error(LLM_ERR_UNSUPPORTED, "unsupported tokenizer model '%.*s'",
                          (int)(model.len > 64 ? 64 : model.len), model.ptr);
    }

    const llmi_gguf_kv *toks;
    LLMI_TRY(missing(llmi_gguf_get_arr(g, "tokenizer.ggml.tokens", true, LLMI_GGUF_STRING, &toks),
                     "tokenizer.ggml.tokens"));
    if (toks->arr_len == 0 || toks->arr_len >= (uint64_t)INT32_MAX)
        return llmi_error(LLM_ERR_BAD_FORMAT, "key 'tokenizer.ggml.tokens' has %llu entries",
                          (unsigned long long)toks->arr_len);
    t->n_vocab = (uint32_t)toks->arr_len;
    LLMI_TRY(load_texts(t, toks));
    LLMI_TRY(load_scores_types(t, g));
    LLMI_TRY(map_build(t));

    if (t->model == LLMI_TOKMODEL_BPE) {
        char name[64];
        size_t n = pre.len < sizeof name - 1 ? (size_t)pre.len : sizeof name - 1;
        memcpy(name, pre.ptr, n);
        name[n] = '\0';
        if (pre.len >= sizeof name)
            name[0] = '?'; /* too long to be a known name */
        LLMI_TRY(llmi_bpe_init(t, g, prekv ? name : NULL));
    } else if (t->model == LLMI_TOKMODEL_WPM) {
        t->pre = LLMI_PRE_NONE;
        LLMI_TRY(llmi_wpm_init(t, g));
    } else {
        t->pre = LLMI_PRE_NONE;
        const llmi_gguf_kv *merges = llmi_gguf_find(g, "tokenizer.ggml.merges");
        if (merges) {
            if (merges->type != LLMI_GGUF_ARRAY || merges->arr_type != LLMI_GGUF_STRING)
                return llmi_error(LLM_ERR_BAD_FORMAT,
                                  "key 'tokenizer.ggml.merges' is not an array of strings");
            LLMI_TRY(llmi_bpe_load_merges(t, merges));
        }
        static const char hex[] = "0123456789ABCDEF";
        for (int b = 0; b < 256; b++) {
            char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
            char one = (char)b;
            t->byte_tok[b] = llmi_tok_find(t, buf, 6);
            if (t->byte_tok[b] < 0)
                t->byte_tok[b] = llmi_tok_find(t, &one, 1);
        }
    }
    get_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);

    /* default ids that fall outside the vocabulary are disabled */
    llm_token *ids[] = {&t->bos, &t->eos, &t->unk};
    for (size_t i = 0; i < 3; i++)
        if (*ids[i] >= 0 && (uint32_t)*ids[i] >= t->n_vocab)
            *ids[i] = LLM_TOKEN_NONE;
    LLMI_TRY(get_id_in_vocab(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos));
    LLMI_TRY(get_id_in_vocab(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos));
    get_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot);
    get_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom);
    get_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk);
    get_id(g, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad);
    /* llama.cpp's "bert" files name the tokens around a sequence so */
    get_id(g, "tokenizer.ggml.cls_token_id", t->n_vocab, &t->bos);
    get_id(g, "tokenizer.ggml.seperator_token_id", t->n_vocab, &t->eos);
    get_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    get_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos);

    LLMI_TRY(load_eog(t, g));
    LLMI_TRY(build_special(t));
    LLMI_TRY(build_pieces(t));

    const llmi_gguf_kv *ct = llmi_gguf_find(g, "tokenizer.chat_template");
    if (ct && ct->type == LLMI_GGUF_STRING) {
        t->chat_template = llmi_strndup(ct->str.ptr, (size_t)ct->str.len);
        if (!t->chat_template)
            return llmi_oom("chat template");
    }
    return load_named_templates(t, g);
}

llm_status llmi_tokenizer_load(const llmi_gguf *g, llmi_tokenizer **out) {
    if (!out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "tokenizer_load: out is NULL");
    *out = NULL;
    if (!g)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "tokenizer_load: file is NULL");
    llmi_tokenizer *t = llmi_calloc(1, sizeof *t);
    if (!t)
        return llmi_oom("tokenizer");
    t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = LLM_TOKEN_NONE;
    llm_status st = load(t, g);
    if (st != LLM_OK) {
        llmi_error_prefix("loading tokenizer");
        llmi_tokenizer_free(t);
        return st;
    }
    *out = t;
    return LLM_OK;
}

void llmi_tokenizer_free(llmi_tokenizer *t) {
    if (!t)
        return;
    llmi_bpe_free(t);
    llmi_free(t->text);
    llmi_free(t->text_off);
    llmi_free(t->piece);
    llmi_free(t->piece_off);
    llmi_free(t->score);
    llmi_free(t->attr);
    llmi_free(t->type);
    llmi_free(t->eog);
    llmi_free(t->map.slots);
    llmi_free(t->special);
    llmi_free(t->chat_template);
    for (size_t i = 0; i < 2 * t->n_named_templates; i++)
        llmi_free(t->named_templates[i]);
    llmi_free(t->named_templates);
    llmi_free(t);
}

/* ---- accessors ---- */

uint32_t llmi_tokenizer_n_vocab(const llmi_tokenizer *t) { return t ? t->n_vocab : 0; }
llm_token llmi_tokenizer_bos(const llmi_tokenizer *t) { return t ? t->bos : LLM_TOKEN_NONE; }
llm_token llmi_tokenizer_eos(const llmi_tokenizer *t) { return t ? t->eos : LLM_TOKEN_NONE; }
llm_token llmi_tokenizer_eot(const llmi_tokenizer *t) { return t ? t->eot : LLM_TOKEN_NONE; }
llm_token llmi_tokenizer_pad(const llmi_tokenizer *t) { return t ? t->pad : LLM_TOKEN_NONE; }
bool llmi_tokenizer_add_bos(const llmi_tokenizer *t) { return t && t->add_bos; }
bool llmi_tokenizer_add_eos(const llmi_tokenizer *t) { return t && t->add_eos; }

static bool valid_id(const llmi_tokenizer *t, llm_token id) {
    return t && id >= 0 && (uint32_t)id < t->n_vocab;
}

bool llmi_tokenizer_is_eog(const llmi_tokenizer *t, llm_token id) {
    return valid_id(t, id) && t->eog[id];
}

bool llmi_tokenizer_is_control(const llmi_tokenizer *t, llm_token id) {
    return valid_id(t, id) && (t->attr[id] & LLMI_ATTR_CONTROL);
}

const char *llmi_tokenizer_chat_template(const llmi_tokenizer *t) {
    return t ? t->chat_template : NULL;
}

const char *llmi_tokenizer_chat_template_named(const llmi_tokenizer *t, const char *name) {
    if (!t)
        return NULL;
    if (!name || strcmp(name, "default") == 0)
        return t->chat_template;
    for (size_t i = 0; i < t->n_named_templates; i++)
        if (strcmp(t->named_templates[2 * i], name) == 0)
            return t->named_templates[2 * i + 1];
    return NULL;
}

const char *llmi_tokenizer_token_text(const llmi_tokenizer *t, llm_token id, size_t *len) {
    if (!valid_id(t, id))
        return NULL;
    if (len)
        *len = llmi_tok_len(t, id);
    return llmi_tok_str(t, id);
}

int llmi_tokenizer_token_type(const llmi_tokenizer *t, llm_token id) {
    return valid_id(t, id) ? t->type[id] : 0;
}
