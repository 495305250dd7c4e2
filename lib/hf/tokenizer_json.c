/* tokenizer.json + tokenizer_config.json -> tokenizer.ggml.* keys, the way
 * llama.cpp's convert_hf_to_gguf.py derives them, so that a checkpoint
 * folder and its converted GGUF give the same tokenizer.
 *
 * Where the converter needs Python (it hashes the tokenization of a test
 * string to name the pre-tokenizer), we recognise the pre-tokenizer's
 * configuration instead and map it to a name lib/tokenizer/bpe.c knows;
 * anything else is refused with LLM_ERR_UNSUPPORTED naming it, because a
 * guessed pre-tokenizer tokenizes wrongly without any visible error.
 *
 * SentencePiece-style BPE (byte_fallback, spaces as U+2581) becomes a
 * "llama" model that keeps its merges: lib/tokenizer merges such a model by
 * rank, only listed pairs, as tokenizers' BPE does. Merging by score could
 * not agree in general (a token with two splits in the vocabulary is
 * reachable through either), but the scores are still written for other
 * readers of the keys: the negated rank of the first merge that produces a
 * token, and for a token no merge produces a score below every rank. */
#include "hf/hf.h"
#include "hf/hf_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TJ "tokenizer.json"
#define TC "tokenizer_config.json"

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER_DEFINED = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6
};

/* Ranks stay exact in a float score below 2^24. */
#define MAX_MERGES (1u << 24)
#define MAX_VOCAB (1u << 24)
#define UNMERGED_SCORE (-1e9f)

/* The pre-tokenizer regexes (as written in tokenizer.json) that match
 * a family of lib/tokenizer/bpe.c. */
#define RE_LLAMA3                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT2_SHORT                                                                              \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* What tokenizers' ByteLevel uses. The trailing \s+ changes no split: text
 * that no alternative matches becomes a piece of its own either way. */
#define RE_GPT2 RE_GPT2_SHORT "|\\s+"

typedef struct conv {
    const cJSON *model;
    uint32_t n_vocab;
    char **text;             /* n_vocab token texts (GGUF spelling), owned */
    const char **vocab_text; /* model.vocab's spelling (in the cJSON tree), NULL if none */
    int32_t *type;           /* n_vocab GGUF token types */
    /* open addressing: id + 1, 0 = empty; keyed by text and vocab_text */
    uint32_t *map, *vmap;
    uint32_t map_mask;
    bool spm, byte_fallback, ignore_merges, add_space_prefix;
    bool wpm; /* WordPiece: wp holds its options */
    llmi_hf_wordpiece wp;
    const char *pre;
    const char **merges; /* "left right" strings as GGUF writes them, owned */
    size_t n_merges;
    float *scores;                   /* SentencePiece-style only */
    llm_token post_first, post_last; /* special tokens the post-processor adds, or -1 */
    llmi_hf_vocab_rules rules;
} conv;

static llm_status bad(const char *file, const char *fmt, ...) LLMI_PRINTF(2, 3);
static llm_status bad(const char *file, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return llmi_error(LLM_ERR_BAD_FORMAT, "%s: %s", file, msg);
}

static const char *type_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static bool flag(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static bool str_eq(const cJSON *o, const char *key, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && strcmp(v->valuestring, want) == 0;
}

/* An integral JSON number in [0, limit). */
static bool as_id(const cJSON *v, uint32_t limit, uint32_t *out) {
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= 0) || d >= (double)limit || d != floor(d))
        return false;
    *out = (uint32_t)d;
    return true;
}

/* ---- text -> id map ---- */

static uint64_t hash_text(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static llm_status map_build(const conv *c, const char *const *texts, uint32_t **out) {
    uint32_t *map = llmi_calloc((size_t)c->map_mask + 1, sizeof(uint32_t));
    if (!map)
        return llmi_oom("token map");
    /* The first id of a text wins, as in a Python dict inverted in id order. */
    for (uint32_t id = 0; id < c->n_vocab; id++) {
        if (!texts[id])
            continue;
        uint32_t i = (uint32_t)hash_text(texts[id]) & c->map_mask;
        while (map[i] && strcmp(texts[map[i] - 1], texts[id]) != 0)
            i = (i + 1) & c->map_mask;
        if (!map[i])
            map[i] = id + 1;
    }
    *out = map;
    return LLM_OK;
}

static int32_t find_in(const conv *c, const uint32_t *map, const char *const *texts,
                       const char *s) {
    uint32_t i = (uint32_t)hash_text(s) & c->map_mask;
    for (; map[i]; i = (i + 1) & c->map_mask)
        if (strcmp(texts[map[i] - 1], s) == 0)
            return (int32_t)(map[i] - 1);
    return -1;
}

/* By GGUF spelling (special tokens named in the configuration). */
static int32_t map_find(const conv *c, const char *s) {
    return find_in(c, c->map, (const char *const *)c->text, s);
}

/* By model.vocab spelling (merges). */
static int32_t vocab_find(const conv *c, const char *s) {
    return find_in(c, c->vmap, c->vocab_text, s);
}

/* ---- vocabulary ---- */

/* convert_hf_to_gguf.py's does_token_look_special: added tokens some models
 * forget to mark special. */
static bool looks_special(const char *s) {
    static const char *const names[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]", NULL};
    for (const char *const *n = names; *n; n++)
        if (strcmp(s, *n) == 0)
            return true;
    size_t n = strlen(s);
    if (n >= 4 && memcmp(s, "<|", 2) == 0 && memcmp(s + n - 2, "|>", 2) == 0)
        return true;
    /* fullwidth vertical bars, U+FF5C (deepseek) */
    if (n >= 8 && memcmp(s, "<\xef\xbd\x9c", 4) == 0 && memcmp(s + n - 4, "\xef\xbd\x9c>", 4) == 0)
        return true;
    return n >= 8 && memcmp(s, "<unused", 7) == 0 && s[n - 1] == '>';
}

static bool is_byte_token(const char *s) {
    static const char hex[] = "0123456789abcdefABCDEF";
    return strlen(s) == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && s[3] && strchr(hex, s[3]) &&
           s[4] && strchr(hex, s[4]);
}

/* Replaces every U+2581 with a space, in place: llama.cpp stores
 * user-defined SentencePiece tokens pre-normalised. */
static void unspace(char *s) {
    char *o = s;
    for (const char *i = s; *i;) {
        if (strncmp(i, "\xe2\x96\x81", 3) == 0) { /* stops at the terminator */
            *o++ = ' ';
            i += 3;
        } else {
            *o++ = *i++;
        }
    }
    *o = 0;
}

static llm_status set_text(conv *c, uint32_t id, const char *s) {
    char *d = llmi_strdup(s);
    if (!d)
        return llmi_oom("token text");
    llmi_free(c->text[id]);
    c->text[id] = d;
    return LLM_OK;
}

/* tokenizer_config.json's added_tokens_decoder ({"<id>": {"content",
 * "special"}}), which transformers lays over tokenizer.json: it can mark a
 * token of the vocabulary special. Entries for other ids or other texts
 * are left alone. */
static void config_added_tokens(conv *c, const cJSON *cfg) {
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder");
    if (!cJSON_IsObject(dec))
        return;
    const cJSON *e;
    cJSON_ArrayForEach(e, dec) {
        char *end = NULL;
        errno = 0;
        unsigned long id = strtoul(e->string, &end, 10);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!end || *end || errno || id >= c->n_vocab || !cJSON_IsString(content) ||
            strcmp(content->valuestring, c->text[id]) != 0 || c->type[id] == TT_UNUSED)
            continue;
        if (flag(e, "special", false) || looks_special(content->valuestring))
            c->type[id] = TT_CONTROL;
        else if (c->type[id] == TT_NORMAL)
            c->type[id] = TT_USER_DEFINED;
    }
}

static llm_status load_vocab(conv *c, const cJSON *root, const cJSON *cfg) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(c->model, "vocab");
    if (!cJSON_IsObject(vocab))
        return bad(TJ, "model.vocab is missing or not an object");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return bad(TJ, "added_tokens is not an array");
    size_t n_entries = (size_t)cJSON_GetArraySize(vocab);
    size_t n_added = cJSON_IsArray(added) ? (size_t)cJSON_GetArraySize(added) : 0;
    if (n_entries == 0)
        return bad(TJ, "model.vocab is empty");
    if (n_entries + n_added > MAX_VOCAB)
        return llmi_error(LLM_ERR_LIMIT, "%s: model.vocab has too many tokens (%zu)", TJ,
                          n_entries + n_added);
    /* Ids are dense: holes are allowed (they become unused tokens, as the
     * converter writes them), ids past every entry are not. */
    uint32_t limit = (uint32_t)(n_entries + n_added), n = 0, id = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!as_id(e, limit, &id))
            return bad(TJ, "model.vocab['%s'] is not a token id below %u", e->string, limit);
        if (id + 1 > n)
            n = id + 1;
    }
    cJSON_ArrayForEach(e, added) {
        if (!as_id(cJSON_GetObjectItemCaseSensitive(e, "id"), limit, &id) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "content")))
            return bad(TJ, "added_tokens: an entry lacks a token id below %u or its content",
                       limit);
        if (id + 1 > n)
            n = id + 1;
    }
    c->n_vocab = n;
    c->text = llmi_calloc(n, sizeof(char *));
    c->vocab_text = llmi_calloc(n, sizeof(char *));
    c->type = llmi_calloc(n, sizeof(int32_t));
    if (!c->text || !c->vocab_text || !c->type)
        return llmi_oom("vocabulary");
    cJSON_ArrayForEach(e, vocab) {
        as_id(e, limit, &id);
        if (c->text[id])
            return bad(TJ, "model.vocab: id %u is given to both '%s' and '%s'", id, c->text[id],
                       e->string);
        if (c->wpm) {
            char *d = llmi_hf_wordpiece_spelling(e->string);
            if (!d)
                return llmi_oom("token text");
            c->text[id] = d;
        } else {
            LLMI_TRY(set_text(c, id, e->string));
        }
        c->vocab_text[id] = e->string;
        c->type[id] = c->spm && c->byte_fallback && is_byte_token(e->string) ? TT_BYTE : TT_NORMAL;
    }
    /* An added token's content replaces the model's text for its id, as in
     * tokenizer.get_vocab() that the converter reads. */
    uint8_t *seen = llmi_calloc(n, 1);
    if (!seen)
        return llmi_oom("vocabulary");
    llm_status st = LLM_OK;
    cJSON_ArrayForEach(e, added) {
        as_id(cJSON_GetObjectItemCaseSensitive(e, "id"), limit, &id);
        const char *content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        if (seen[id]) {
            st = bad(TJ, "added_tokens: id %u is given twice", id);
            break;
        }
        seen[id] = 1;
        if ((st = set_text(c, id, content)) != LLM_OK)
            break;
        if (flag(e, "special", false) || looks_special(content)) {
            c->type[id] = TT_CONTROL;
        } else {
            c->type[id] = TT_USER_DEFINED;
            if (c->spm)
                unspace(c->text[id]);
        }
    }
    llmi_free(seen);
    LLMI_TRY(st);
    for (uint32_t i = 0; i < n; i++) {
        if (c->text[i])
            continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%u]", i);
        LLMI_TRY(set_text(c, i, pad));
        c->type[i] = TT_UNUSED;
    }
    config_added_tokens(c, cfg);
    uint32_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    c->map_mask = cap - 1;
    LLMI_TRY(map_build(c, (const char *const *)c->text, &c->map));
    return map_build(c, c->vocab_text, &c->vmap);
}

/* ---- merges ---- */

/* One merge as its two halves: "left right" (split at the one space) or
 * ["left", "right"]. Writes "left\0right\0leftright\0" into buf.
 * Returns 0, 1 for a malformed entry or 2 when out of memory. */
static int merge_halves(const cJSON *m, char **buf, size_t *cap, const char **l, const char **r) {
    const char *a, *b;
    size_t la, lb;
    if (cJSON_IsString(m)) {
        const char *sp = strchr(m->valuestring, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return 1;
        a = m->valuestring;
        la = (size_t)(sp - a);
        b = sp + 1;
        lb = strlen(b);
    } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
               cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        a = cJSON_GetArrayItem(m, 0)->valuestring;
        b = cJSON_GetArrayItem(m, 1)->valuestring;
        la = strlen(a);
        lb = strlen(b);
    } else {
        return 1;
    }
    size_t need = 2 * (la + lb) + 3;
    if (need > *cap) {
        char *nb = llmi_realloc(*buf, need);
        if (!nb)
            return 2;
        *buf = nb;
        *cap = need;
    }
    /* left \0 right \0 left+right \0 */
    char *p = *buf;
    memcpy(p, a, la);
    p[la] = 0;
    memcpy(p + la + 1, b, lb);
    p[la + 1 + lb] = 0;
    memcpy(p + la + lb + 2, a, la);
    memcpy(p + 2 * la + lb + 2, b, lb);
    p[need - 1] = 0;
    *l = p;
    *r = p + la + 1;
    return 0;
}

static llm_status load_merges(conv *c) {
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(c->model, "merges");
    if (merges && !cJSON_IsArray(merges) && !cJSON_IsNull(merges))
        return bad(TJ, "model.merges is not an array");
    size_t n = cJSON_IsArray(merges) ? (size_t)cJSON_GetArraySize(merges) : 0;
    if (n >= MAX_MERGES)
        return llmi_error(LLM_ERR_LIMIT, "%s: model.merges has too many entries (%zu)", TJ, n);
    if (c->spm) {
        c->scores = llmi_malloc((size_t)c->n_vocab * sizeof(float));
        if (!c->scores)
            return llmi_oom("token scores");
        for (uint32_t i = 0; i < c->n_vocab; i++)
            c->scores[i] = UNMERGED_SCORE;
    }
    if (n) {
        c->merges = llmi_calloc(n, sizeof(char *));
        if (!c->merges)
            return llmi_oom("merges");
    }
    char *buf = NULL;
    size_t cap = 0, rank = 0;
    llm_status st = LLM_OK;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *l, *r;
        int bad_merge = merge_halves(m, &buf, &cap, &l, &r);
        if (bad_merge) {
            st = bad_merge == 2 ? llmi_oom("merge")
                                : bad(TJ, "model.merges[%zu] is not a pair of tokens", rank);
            break;
        }
        const char *joined = r + strlen(r) + 1;
        int32_t li = vocab_find(c, l), ri = vocab_find(c, r), ji = vocab_find(c, joined);
        if (li < 0 || ri < 0 || ji < 0) {
            st = bad(TJ, "model.merges[%zu] names '%s', which is not in model.vocab", rank,
                     li < 0   ? l
                     : ri < 0 ? r
                              : joined);
            break;
        }
        if (c->spm && c->scores[ji] == UNMERGED_SCORE)
            c->scores[ji] = -(float)rank;
        /* A GGUF merge line splits at its space, so a token spelt with a
         * space cannot be written (only user-defined tokens are), and
         * lib/tokenizer finds tokens by their GGUF spelling. */
        if (!strchr(l, ' ') && !strchr(r, ' ') && strcmp(l, c->text[li]) == 0 &&
            strcmp(r, c->text[ri]) == 0) {
            size_t ll = strlen(l), rl = strlen(r);
            char *s = llmi_malloc(ll + rl + 2);
            if (!s) {
                st = llmi_oom("merge");
                break;
            }
            memcpy(s, l, ll);
            s[ll] = ' ';
            memcpy(s + ll + 1, r, rl + 1);
            c->merges[c->n_merges++] = s;
        }
        rank++;
    }
    llmi_free(buf);
    return st;
}

/* ---- model kind and pre-tokenizer ---- */

/* The steps of a pre_tokenizer or normalizer: a Sequence's list, or the
 * object itself. */
static const cJSON *steps(const cJSON *o, const char *list_key, const cJSON **single) {
    *single = NULL;
    if (!o || cJSON_IsNull(o))
        return NULL;
    const char *t = type_of(o);
    if (t && strcmp(t, "Sequence") == 0)
        return cJSON_GetObjectItemCaseSensitive(o, list_key);
    *single = o;
    return NULL;
}

#define FOR_STEPS(it, list, single)                                                                \
    for (const cJSON *it = (list) ? (list)->child : (single); it; it = (list) ? it->next : NULL)

static bool has_step(const cJSON *o, const char *list_key, const char *type) {
    const cJSON *single, *list = steps(o, list_key, &single);
    FOR_STEPS(s, list, single) {
        const char *t = type_of(s);
        if (t && strcmp(t, type) == 0)
            return true;
    }
    return false;
}

static llm_status byte_level_pre(conv *c, const cJSON *root) {
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *single, *list = steps(norm, "normalizers", &single);
    FOR_STEPS(s, list, single) {
        const char *t = type_of(s);
        /* llama.cpp does not normalise either; NFC text is unchanged by it. */
        if (!t || strcmp(t, "NFC") != 0)
            return llmi_error(LLM_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported", TJ,
                              t ? t : "?");
    }
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    list = steps(pre, "pretokenizers", &single);
    bool digits = false, byte_level = false, byte_regex = false;
    const char *regex = NULL;
    FOR_STEPS(s, list, single) {
        const char *t = type_of(s);
        if (t && strcmp(t, "ByteLevel") == 0) {
            if (flag(s, "add_prefix_space", false))
                return llmi_error(LLM_ERR_UNSUPPORTED,
                                  "%s: pre_tokenizer ByteLevel with add_prefix_space is not "
                                  "supported",
                                  TJ);
            byte_level = true;
            byte_regex = flag(s, "use_regex", true);
        } else if (t && strcmp(t, "Digits") == 0 && flag(s, "individual_digits", false) && !regex &&
                   !byte_level) {
            digits = true;
        } else if (t && strcmp(t, "Split") == 0 && !regex && !byte_level && !digits) {
            const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
            const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
            if (!cJSON_IsString(re) || !str_eq(s, "behavior", "Isolated") ||
                flag(s, "invert", false))
                return llmi_error(LLM_ERR_UNSUPPORTED,
                                  "%s: pre_tokenizer Split other than an isolating regex is not "
                                  "supported",
                                  TJ);
            regex = re->valuestring;
        } else {
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "%s: pre_tokenizer step '%s' is not supported here", TJ, t ? t : "?");
        }
    }
    if (!byte_level)
        byte_regex = false;
    if (regex && !byte_regex) {
        if (strcmp(regex, RE_LLAMA3) == 0)
            c->pre = c->ignore_merges ? "llama-bpe" : "smaug-bpe";
        else if (strcmp(regex, RE_QWEN2) == 0)
            c->pre = "qwen2";
        else if (strcmp(regex, RE_GPT2) == 0 || strcmp(regex, RE_GPT2_SHORT) == 0)
            c->pre = "gpt-2";
        else
            return llmi_error(LLM_ERR_UNSUPPORTED, "%s: pre_tokenizer regex '%.300s' is not known",
                              TJ, regex);
    } else if (!regex && byte_regex) {
        c->pre = digits ? "smollm" : "gpt-2";
    } else {
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer is not one of the known byte-level BPE "
                          "configurations",
                          TJ);
    }
    /* lib/tokenizer takes ignore_merges from the pre-tokenizer's name. */
    if (c->ignore_merges && strcmp(c->pre, "llama-bpe") != 0)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: model.ignore_merges is not supported with pre-tokenizer '%s'", TJ,
                          c->pre);
    return LLM_OK;
}

static bool is_space_to_metaspace(const cJSON *s) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    return str_eq(pat, "String", " ") && str_eq(s, "content", "\xe2\x96\x81");
}

static llm_status sentencepiece_pre(conv *c, const cJSON *root) {
    bool replaced = false;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *single, *list = steps(norm, "normalizers", &single);
    FOR_STEPS(s, list, single) {
        const char *t = type_of(s);
        if (t && strcmp(t, "Replace") == 0 && is_space_to_metaspace(s))
            replaced = true;
        else if (t && strcmp(t, "Prepend") == 0 && str_eq(s, "prepend", "\xe2\x96\x81"))
            c->add_space_prefix = true;
        else
            return llmi_error(LLM_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported", TJ,
                              t ? t : "?");
    }
    bool spaces_gone = replaced;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    list = steps(pre, "pretokenizers", &single);
    FOR_STEPS(s, list, single) {
        const char *t = type_of(s);
        /* Gemma's Split on " " after the normalizer has replaced every space
         * never splits. */
        if (t && strcmp(t, "Split") == 0 && spaces_gone && !flag(s, "invert", false) &&
            str_eq(cJSON_GetObjectItemCaseSensitive(s, "pattern"), "String", " "))
            continue;
        if (!t || strcmp(t, "Metaspace") != 0 || !str_eq(s, "replacement", "\xe2\x96\x81") ||
            flag(s, "split", false))
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "%s: pre_tokenizer '%s' is not supported for a SentencePiece-style "
                              "BPE model",
                              TJ, t ? t : "?");
        replaced = true;
        const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(s, "prepend_scheme");
        if (cJSON_IsString(scheme))
            c->add_space_prefix = strcmp(scheme->valuestring, "never") != 0;
        else
            c->add_space_prefix = flag(s, "add_prefix_space", true);
    }
    if (c->ignore_merges)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: model.ignore_merges is not supported for a SentencePiece-style "
                          "BPE model",
                          TJ);
    if (!replaced)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: a byte_fallback BPE model that does not turn spaces into U+2581 is "
                          "not supported",
                          TJ);
    return LLM_OK;
}

static llm_status model_kind(conv *c, const cJSON *root) {
    c->model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(c->model))
        return bad(TJ, "model is missing or not an object");
    const char *t = type_of(c->model);
    if (t && strcmp(t, "WordPiece") == 0) {
        c->wpm = true;
        return llmi_hf_wordpiece_options(root, c->model, &c->wp);
    }
    if (t && strcmp(t, "BPE") != 0)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: model.type '%s' is not supported (BPE and WordPiece only)", TJ, t);
    if (!t && !cJSON_GetObjectItemCaseSensitive(c->model, "merges"))
        return bad(TJ, "model.type is missing");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(c->model, "continuing_subword_prefix");
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(c->model, "end_of_word_suffix");
    if ((cJSON_IsString(prefix) && prefix->valuestring[0]) ||
        (cJSON_IsString(suffix) && suffix->valuestring[0]))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: model.continuing_subword_prefix/end_of_word_suffix are not "
                          "supported",
                          TJ);
    c->byte_fallback = flag(c->model, "byte_fallback", false);
    c->ignore_merges = flag(c->model, "ignore_merges", false);
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (has_step(pre, "pretokenizers", "ByteLevel") || has_step(dec, "decoders", "ByteLevel"))
        return byte_level_pre(c, root);
    if (c->byte_fallback || has_step(pre, "pretokenizers", "Metaspace") ||
        has_step(norm, "normalizers", "Replace")) {
        c->spm = true;
        return sentencepiece_pre(c, root);
    }
    return llmi_error(LLM_ERR_UNSUPPORTED,
                      "%s: a BPE model that is neither byte-level nor SentencePiece-style is not "
                      "supported",
                      TJ);
}

/* ---- special tokens and template ---- */

/* The special tokens a TemplateProcessing post-processor puts around a
 * single sequence; the converter reads add_bos/add_eos from it when
 * tokenizer_config.json does not say. */
static void post_processor(conv *c, const cJSON *root) {
    c->post_first = c->post_last = -1;
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const cJSON *single, *list = steps(pp, "processors", &single);
    FOR_STEPS(s, list, single) {
        const char *t = type_of(s);
        if (t && strcmp(t, "BertProcessing") == 0) { /* "cls": [text, id], "sep": [text, id] */
            for (int end = 0; end < 2; end++) {
                const cJSON *pair = cJSON_GetObjectItemCaseSensitive(s, end ? "sep" : "cls");
                const cJSON *name = cJSON_GetArrayItem(pair, 0);
                int32_t id = cJSON_IsString(name) ? map_find(c, name->valuestring) : -1;
                *(end ? &c->post_last : &c->post_first) = id;
            }
            continue;
        }
        if (!t || strcmp(t, "TemplateProcessing") != 0)
            continue;
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(s, "single");
        int n = cJSON_GetArraySize(seq);
        if (!cJSON_IsArray(seq) || n < 1)
            continue;
        for (int end = 0; end < 2; end++) {
            const cJSON *it = cJSON_GetArrayItem(seq, end ? n - 1 : 0);
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
            int32_t id = cJSON_IsString(name) ? map_find(c, name->valuestring) : -1;
            if (end)
                c->post_last = id;
            else
                c->post_first = id;
        }
    }
}

/* A special token named by tokenizer_config.json: a string or an AddedToken
 * dict with "content". Absent: -1. */
static llm_status config_token(const conv *c, const cJSON *cfg, const char *field, int32_t *id) {
    *id = -1;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, field);
    if (!v || cJSON_IsNull(v))
        return LLM_OK;
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v))
        return bad(TC, "%s is neither a string nor an object with a string \"content\"", field);
    *id = map_find(c, v->valuestring);
    if (*id < 0)
        llmi_log(LLM_LOG_WARN, "%s: %s '%s' is not in the vocabulary; ignored", TC, field,
                 v->valuestring);
    return LLM_OK;
}

static llm_status write_chat_templates(llmi_gguf_writer *w, const cJSON *ct) {
    if (!ct || cJSON_IsNull(ct))
        return LLM_OK;
    if (cJSON_IsString(ct))
        return llmi_gguf_w_str(w, "tokenizer.chat_template", ct->valuestring);
    if (!cJSON_IsArray(ct))
        return bad(TC, "chat_template is neither a string nor a list of named templates");
    const cJSON *e;
    cJSON_ArrayForEach(e, ct) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(name) || !cJSON_IsString(tmpl))
            return bad(TC, "chat_template: an entry lacks a string \"name\" or \"template\"");
        if (strcmp(name->valuestring, "default") == 0) {
            LLMI_TRY(llmi_gguf_w_str(w, "tokenizer.chat_template", tmpl->valuestring));
        } else {
            char key[160];
            if (snprintf(key, sizeof key, "tokenizer.chat_template.%s", name->valuestring) >=
                (int)sizeof key)
                return bad(TC, "chat_template: a template name is too long");
            LLMI_TRY(llmi_gguf_w_str(w, key, tmpl->valuestring));
        }
    }
    return LLM_OK;
}

static llm_status write_keys(const conv *c, const cJSON *cfg, llmi_gguf_writer *w) {
    LLMI_TRY(llmi_gguf_w_str(w, "tokenizer.ggml.model",
                             c->wpm   ? "bert"
                             : c->spm ? "llama"
                                      : "gpt2"));
    if (c->wpm)
        LLMI_TRY(llmi_hf_wordpiece_write(&c->wp, w));
    else if (!c->spm)
        LLMI_TRY(llmi_gguf_w_str(w, "tokenizer.ggml.pre", c->pre));
    LLMI_TRY(
        llmi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)c->text, c->n_vocab));
    if (c->spm)
        LLMI_TRY(llmi_gguf_w_arr_f32(w, "tokenizer.ggml.scores", c->scores, c->n_vocab));
    LLMI_TRY(llmi_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", c->type, c->n_vocab));
    /* SentencePiece-style vocabularies keep their merges too: the tokenizer
     * merges by rank when a "llama" vocabulary carries them (tokenizer.h). */
    if (!c->wpm)
        LLMI_TRY(llmi_gguf_w_arr_str(w, "tokenizer.ggml.merges", c->merges, c->n_merges));
    bool have_prefix = c->spm, prefix = c->add_space_prefix;
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(cfg, "add_prefix_space");
    if (c->rules.prefix_from_config && cJSON_IsBool(ap)) {
        have_prefix = true;
        prefix = cJSON_IsTrue(ap);
    }
    if (have_prefix)
        LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", prefix));

    static const struct {
        const char *field, *key;
    } ids[] = {
        {"bos_token", "tokenizer.ggml.bos_token_id"},
        {"eos_token", "tokenizer.ggml.eos_token_id"},
        {"unk_token", "tokenizer.ggml.unknown_token_id"},
        {"pad_token", "tokenizer.ggml.padding_token_id"},
    };
    int32_t found[4];
    for (size_t i = 0; i < 4; i++)
        LLMI_TRY(config_token(c, cfg, ids[i].field, &found[i]));
    if (found[0] < 0)
        found[0] = c->post_first; /* the converter's fallback: the post-processor's token */
    if (found[1] < 0 && c->wpm)
        found[1] = c->post_last; /* [SEP] ends every WordPiece sequence */
    if (found[2] < 0) {
        const cJSON *unk = cJSON_GetObjectItemCaseSensitive(c->model, "unk_token");
        if (cJSON_IsString(unk))
            found[2] = map_find(c, unk->valuestring);
    }
    for (size_t i = 0; i < 4; i++)
        if (found[i] >= 0)
            LLMI_TRY(llmi_gguf_w_u32(w, ids[i].key, (uint32_t)found[i]));

    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    if (c->rules.no_bos)
        LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false));
    else if (cJSON_IsBool(ab))
        LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", cJSON_IsTrue(ab)));
    else if (c->post_first >= 0 || c->post_last >= 0)
        LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.ggml.add_bos_token",
                                  c->post_first >= 0 && c->post_first == found[0]));
    if (cJSON_IsBool(ae))
        LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", cJSON_IsTrue(ae)));
    else if (c->post_first >= 0 || c->post_last >= 0)
        LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.ggml.add_eos_token",
                                  c->post_last >= 0 && c->post_last == found[1]));
    return write_chat_templates(w, cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"));
}

/* ---- entry points ---- */

static void conv_free(conv *c) {
    for (uint32_t i = 0; c->text && i < c->n_vocab; i++)
        llmi_free(c->text[i]);
    for (size_t i = 0; i < c->n_merges; i++)
        llmi_free((void *)c->merges[i]);
    llmi_free(c->text);
    llmi_free((void *)c->vocab_text);
    llmi_free(c->type);
    llmi_free(c->map);
    llmi_free(c->vmap);
    llmi_free(c->merges);
    llmi_free(c->scores);
}

static llm_status parse(const char *file, const char *json, size_t len, cJSON **out) {
    *out = NULL;
    if (!json)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "%s: no text", file);
    /* A raw NUL is never valid JSON. The escape \u0000 is left to the
     * vocabulary's own checks: a token's text may in principle hold it. */
    const char *nul = memchr(json, 0, len);
    if (nul)
        return bad(file, "a NUL byte at byte %zu", (size_t)(nul - json));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return bad(file, "malformed JSON near byte %zu", at);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return bad(file, "the top level is not an object");
    }
    *out = root;
    return LLM_OK;
}

llm_status llmi_hf_tokenizer_keys_from_json(const char *tokenizer_json, size_t tokenizer_len,
                                            const char *config_json, size_t config_len,
                                            llmi_gguf_writer *w) {
    return llmi_hf_tokenizer_keys_from_json_rules(tokenizer_json, tokenizer_len, config_json,
                                                  config_len, NULL, w);
}

llm_status llmi_hf_tokenizer_keys_from_json_rules(const char *tokenizer_json, size_t tokenizer_len,
                                                  const char *config_json, size_t config_len,
                                                  const llmi_hf_vocab_rules *rules,
                                                  llmi_gguf_writer *w) {
    if (!w)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "no GGUF writer");
    cJSON *root = NULL, *cfg = NULL;
    conv c;
    memset(&c, 0, sizeof c);
    if (rules)
        c.rules = *rules;
    llm_status st = parse(TJ, tokenizer_json, tokenizer_len, &root);
    if (st == LLM_OK && config_json)
        st = parse(TC, config_json, config_len, &cfg);
    if (st == LLM_OK)
        st = model_kind(&c, root);
    if (st == LLM_OK)
        st = load_vocab(&c, root, cfg);
    if (st == LLM_OK)
        st = load_merges(&c);
    if (st == LLM_OK) {
        post_processor(&c, root);
        st = write_keys(&c, cfg, w);
    }
    conv_free(&c);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return st;
}

/* Reads a whole file; a missing optional file gives LLM_OK and NULL. */
static llm_status read_file(const char *folder, const char *name, bool required, char **out,
                            size_t *len) {
    *out = NULL;
    *len = 0;
    size_t n = strlen(folder) + strlen(name) + 2;
    char *path = llmi_malloc(n);
    if (!path)
        return llmi_oom("path");
    snprintf(path, n, "%s/%s", folder, name);
    int fd = -1;
    uint64_t file_size = 0;
    bool absent = false;
    llm_status st = llmi_open_regular(path, name, required ? NULL : &absent, &fd, &file_size);
    if (st != LLM_OK || fd < 0) {
        llmi_free(path);
        return st;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        st = llmi_error(LLM_ERR_IO, "%s: cannot read: %s", name, strerror(errno));
        close(fd);
        llmi_free(path);
        return st;
    }
    char *buf = NULL;
    size_t cap = 0, used = 0;
    for (;;) {
        if (used == cap) {
            size_t nc = cap ? cap * 2 : 1 << 16;
            char *nb = llmi_realloc(buf, nc);
            if (!nb) {
                st = llmi_oom(name);
                break;
            }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + used, 1, cap - used, f);
        used += got;
        if (got == 0) {
            if (ferror(f))
                st = llmi_error(LLM_ERR_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    llmi_free(path);
    if (st != LLM_OK) {
        llmi_free(buf);
        return st;
    }
    *out = buf;
    *len = used;
    return LLM_OK;
}

/* Newer checkpoints keep the chat template in chat_template.jinja instead
 * of tokenizer_config.json; it is read when the config has none. */
static llm_status template_file(const char *folder, const char *cfg, size_t cfg_len,
                                llmi_gguf_writer *w) {
    if (cfg) {
        cJSON *root = cJSON_ParseWithLength(cfg, cfg_len);
        bool has = root && cJSON_GetObjectItemCaseSensitive(root, "chat_template") &&
                   !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, "chat_template"));
        cJSON_Delete(root);
        if (has)
            return LLM_OK;
    }
    char *text = NULL;
    size_t len = 0;
    LLMI_TRY(read_file(folder, "chat_template.jinja", false, &text, &len));
    if (!text)
        return LLM_OK;
    llm_status st = LLM_OK;
    if (memchr(text, 0, len))
        st = llmi_error(LLM_ERR_BAD_FORMAT, "chat_template.jinja: holds a NUL byte");
    char *z = st == LLM_OK ? llmi_realloc(text, len + 1) : NULL;
    if (st == LLM_OK && !z)
        st = llmi_oom("chat template");
    if (z) {
        text = z;
        text[len] = 0;
        st = llmi_gguf_w_str(w, "tokenizer.chat_template", text);
    }
    llmi_free(text);
    return st;
}

llm_status llmi_hf_tokenizer_keys(const char *folder, llmi_gguf_writer *w) {
    return llmi_hf_tokenizer_keys_rules(folder, NULL, w);
}

llm_status llmi_hf_tokenizer_keys_rules(const char *folder, const llmi_hf_vocab_rules *rules,
                                        llmi_gguf_writer *w) {
    if (!folder || !w)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "no folder or GGUF writer");
    char *tok = NULL, *cfg = NULL;
    size_t tok_len, cfg_len;
    llm_status st = read_file(folder, TJ, true, &tok, &tok_len);
    if (st == LLM_OK)
        st = read_file(folder, TC, false, &cfg, &cfg_len);
    if (st == LLM_OK)
        st = llmi_hf_tokenizer_keys_from_json_rules(tok, tok_len, cfg, cfg_len, rules, w);
    if (st == LLM_OK)
        st = template_file(folder, cfg, cfg_len, w);
    llmi_free(tok);
    llmi_free(cfg);
    return st;
}
