/* The tokenize entry point shared by every model: input checks, the
 * special-token partition (llama.cpp's tokenizer_st_partition), BOS/EOS,
 * SentencePiece space escaping. */
#define LLMI_TOKENIZER_INTERNAL
#include "tokenizer/tokenizer.h"

#include <string.h>

/* ---- tokenize ---- */

/* A piece of the input: raw text [off, off+len) or a special token. */
typedef struct frag {
    size_t off, len;
    llm_token id;
} frag;
typedef struct fragvec {
    frag *v;
    size_t n, cap;
} fragvec;

static llm_status frag_push(fragvec *f, size_t off, size_t len, llm_token id) {
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 16, bytes;
        if (!llmi_mul_ok(nc, sizeof(frag), &bytes))
            return llmi_oom("text fragments");
        frag *v = llmi_realloc(f->v, bytes);
        if (!v)
            return llmi_oom("text fragments");
        f->v = v;
        f->cap = nc;
    }
    f->v[f->n++] = (frag){off, len, id};
    return LLM_OK;
}

/* llama.cpp's tokenizer_st_partition: for each special token, longest text
 * first, split every remaining raw fragment at each of its occurrences.
 * Control and unknown tokens take part only when parsing specials;
 * user-defined tokens always do. */
static llm_status partition(const llmi_tokenizer *t, const char *text, size_t len,
                            bool parse_special, fragvec *a, fragvec *b) {
    if (len == 0)
        return LLM_OK;
    LLMI_TRY(frag_push(a, 0, len, LLM_TOKEN_NONE));
    for (uint32_t k = 0; k < t->n_special; k++) {
        llm_token sid = t->special[k];
        if (!parse_special && (t->attr[sid] & (LLMI_ATTR_CONTROL | LLMI_ATTR_UNKNOWN)))
            continue;
        const char *s = llmi_tok_str(t, sid);
        size_t sl = llmi_tok_len(t, sid);
        bool any = false;
        for (size_t i = 0; i < a->n && !any; i++)
            any = a->v[i].id == LLM_TOKEN_NONE && a->v[i].len >= sl &&
                  memmem(text + a->v[i].off, a->v[i].len, s, sl) != NULL;
        if (!any)
            continue;
        b->n = 0;
        for (size_t i = 0; i < a->n; i++) {
            frag f = a->v[i];
            if (f.id != LLM_TOKEN_NONE) {
                LLMI_TRY(frag_push(b, f.off, f.len, f.id));
                continue;
            }
            size_t pos = f.off, end = f.off + f.len;
            while (pos < end) {
                const char *m = end - pos >= sl ? memmem(text + pos, end - pos, s, sl) : NULL;
                if (!m)
                    break;
                size_t at = (size_t)(m - text);
                if (at > pos)
                    LLMI_TRY(frag_push(b, pos, at - pos, LLM_TOKEN_NONE));
                LLMI_TRY(frag_push(b, at, sl, sid));
                pos = at + sl;
            }
            if (pos < end)
                LLMI_TRY(frag_push(b, pos, end - pos, LLM_TOKEN_NONE));
        }
        fragvec tmp = *a;
        *a = *b;
        *b = tmp;
    }
    return LLM_OK;
}

/* SentencePiece fragment: optional leading space, spaces -> U+2581.
 * *dropped = offset in s of the first byte without a token, or SIZE_MAX. */
static llm_status spm_fragment(const llmi_tokenizer *t, const char *s, size_t n, bool prefix,
                               char **buf, size_t *cap, llmi_tokvec *out, size_t *dropped) {
    size_t need = 3 * (n + 1), o = 0;
    if (need < n)
        return llmi_oom("escaped text");
    if (need > *cap) {
        char *nb = llmi_realloc(*buf, need);
        if (!nb)
            return llmi_oom("escaped text");
        *buf = nb;
        *cap = need;
    }
    char *d = *buf;
    if (prefix) {
        memcpy(d, "\xe2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(d + o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            d[o++] = s[i];
        }
    }
    size_t e;
    LLMI_TRY(llmi_spm_tokenize(t, d, o, out, &e));
    /* Back from the escaped text: the byte the escaped byte e stands for
     * (the prefix's U+2581 for the fragment's first byte). */
    *dropped = SIZE_MAX;
    o = prefix ? 3 : 0;
    for (size_t i = 0; e != SIZE_MAX && i < n && *dropped == SIZE_MAX; i++) {
        o += s[i] == ' ' ? 3 : 1;
        if (e < o)
            *dropped = i;
    }
    return LLM_OK;
}

/* LLM_TOKENIZE_STRICT: the first byte of the text that got no token. */
static llm_status refuse_dropped(const char *text, size_t at) {
    return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                      "tokenize: byte 0x%02x at byte offset %zu has no token in this vocabulary "
                      "(LLM_TOKENIZE_STRICT)",
                      (unsigned char)text[at], at);
}

static llm_status tokenize_all(const llmi_tokenizer *t, const char *text, size_t len,
                               uint32_t flags, fragvec *fa, fragvec *fb, llmi_tokvec *tv,
                               char **esc, size_t *esc_cap) {
    bool add_special = (flags & LLM_TOKENIZE_ADD_SPECIAL) != 0;
    LLMI_TRY(partition(t, text, len, (flags & LLM_TOKENIZE_PARSE_SPECIAL) != 0, fa, fb));
    if (add_special && t->add_bos) {
        if (t->bos == LLM_TOKEN_NONE)
            return llmi_error(LLM_ERR_BAD_FORMAT, "the model asks for a BOS token but has none");
        LLMI_TRY(llmi_tokvec_push(tv, t->bos));
    }
    bool prev_special = true; /* SentencePiece: prefix a space at the start */
    for (size_t i = 0; i < fa->n; i++) {
        frag f = fa->v[i];
        if (f.id != LLM_TOKEN_NONE) {
            LLMI_TRY(llmi_tokvec_push(tv, f.id));
            prev_special = true;
            continue;
        }
        size_t dropped;
        if (t->model == LLMI_TOKMODEL_SPM) {
            LLMI_TRY(spm_fragment(t, text + f.off, f.len, t->add_space_prefix && prev_special, esc,
                                  esc_cap, tv, &dropped));
        } else if (t->model == LLMI_TOKMODEL_WPM) {
            LLMI_TRY(llmi_wpm_tokenize(t, text + f.off, f.len, tv, &dropped));
        } else {
            LLMI_TRY(llmi_bpe_tokenize(t, text + f.off, f.len, tv, &dropped));
        }
        if ((flags & LLM_TOKENIZE_STRICT) && dropped != SIZE_MAX)
            return refuse_dropped(text, f.off + dropped);
        prev_special = false;
    }
    if (add_special && t->add_eos) {
        if (t->eos == LLM_TOKEN_NONE)
            return llmi_error(LLM_ERR_BAD_FORMAT, "the model asks for an EOS token but has none");
        LLMI_TRY(llmi_tokvec_push(tv, t->eos));
    }
    return LLM_OK;
}

llm_status llmi_tokenize(const llmi_tokenizer *t, const char *text, size_t len, uint32_t flags,
                         llm_token *out, size_t capacity, size_t *n_out) {
    if (!t || !n_out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "tokenize: NULL tokenizer or n_tokens");
    *n_out = 0;
    if (!text && len > 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "tokenize: text is NULL");
    if (!out && capacity > 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "tokenize: tokens is NULL");
    if (flags &
        ~(uint32_t)(LLM_TOKENIZE_ADD_SPECIAL | LLM_TOKENIZE_PARSE_SPECIAL | LLM_TOKENIZE_STRICT))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "tokenize: unknown flags 0x%x", flags);
    size_t good = len ? llmi_utf8_valid_prefix(text, len) : 0;
    if (good != len)
        return llmi_error(LLM_ERR_INVALID_UTF8, "invalid UTF-8 in text at byte offset %zu", good);

    fragvec fa = {0}, fb = {0};
    llmi_tokvec tv = {0};
    char *esc = NULL;
    size_t esc_cap = 0;
    llm_status st = tokenize_all(t, text, len, flags, &fa, &fb, &tv, &esc, &esc_cap);
    llmi_free(fa.v);
    llmi_free(fb.v);
    llmi_free(esc);
    if (st == LLM_OK) {
        *n_out = tv.n;
        if (tv.n > capacity)
            st = llmi_error(LLM_ERR_BUFFER_TOO_SMALL, "tokenize: %zu tokens do not fit in %zu",
                            tv.n, capacity);
        else if (tv.n)
            memcpy(out, tv.v, tv.n * sizeof(llm_token));
    }
    llmi_free(tv.v);
    return st;
}
