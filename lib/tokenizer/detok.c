/* Detokenization: the bytes of one token, and an incremental decoder that
 * emits only whole UTF-8 characters. Bytes that can never form a valid
 * character become U+FFFD, one per maximal invalid subpart (the Unicode
 * "best practice" Python's errors="replace" also follows). */
#define LLMI_TOKENIZER_INTERNAL
#include "tokenizer/tokenizer.h"

#include <string.h>

static const char fffd[3] = {'\xef', '\xbf', '\xbd'};

llm_status llmi_token_bytes(const llmi_tokenizer *t, llm_token id, uint32_t flags,
                            const char **bytes, size_t *n) {
    if (!t || !bytes || !n)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "token_bytes: NULL argument");
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "token id %d out of range (vocabulary %u)",
                          (int)id, t->n_vocab);
    *bytes = t->piece + t->piece_off[id];
    *n = t->piece_off[id + 1] - t->piece_off[id];
    if (!(flags & LLM_DETOKENIZE_SPECIAL) &&
        (t->attr[id] & (LLMI_ATTR_CONTROL | LLMI_ATTR_UNKNOWN)))
        *n = 0;
    return LLM_OK;
}

/* Two byte ranges read as one: the held-back bytes, then the new piece. */
typedef struct seq {
    const unsigned char *a;
    size_t na;
    const unsigned char *b;
    size_t n;
} seq;

static inline unsigned char at(const seq *s, size_t i) {
    return i < s->na ? s->a[i] : s->b[i - s->na];
}

/* At position i: > 0 length of a whole valid character; 0 when the rest is
 * a valid but unfinished prefix; < 0 minus the length of an invalid part. */
static int check(const seq *s, size_t i) {
    unsigned c = at(s, i);
    if (c < 0x80)
        return 1;
    int len;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0;
        if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90;
        if (c == 0xf4)
            hi = 0x8f;
    } else {
        return -1;
    }
    for (int k = 1; k < len; k++) {
        if (i + (size_t)k >= s->n)
            return 0;
        unsigned b = at(s, i + (size_t)k);
        if (b < lo || b > hi)
            return -k;
        lo = 0x80;
        hi = 0xbf;
    }
    return len;
}

/* Decodes the sequence into out (NULL: count only). Returns the bytes
 * written; *used = bytes consumed (the rest is an unfinished character,
 * which `final` turns into U+FFFD instead). */
static size_t decode(const seq *s, bool final, char *out, size_t *used) {
    size_t i = 0, o = 0;
    while (i < s->n) {
        int r = check(s, i);
        if (r > 0) {
            if (out)
                for (int k = 0; k < r; k++)
                    out[o + (size_t)k] = (char)at(s, i + (size_t)k);
            o += (size_t)r;
            i += (size_t)r;
        } else {
            if (r == 0 && !final)
                break;
            if (out)
                memcpy(out + o, fffd, 3);
            o += 3;
            i += r == 0 ? s->n - i : (size_t)-r;
        }
    }
    *used = i;
    return o;
}

void llmi_detok_init(llmi_detok *d, const llmi_tokenizer *t, uint32_t flags) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->flags = flags;
    d->first = t && t->model == LLMI_TOKMODEL_SPM && t->add_space_prefix;
}

/* The text `id` completes, given the state; counts when out is NULL. */
static llm_status feed(const llmi_detok *d, llm_token id, char *out, size_t *n_out,
                       llmi_detok *next) {
    const char *p;
    size_t n;
    LLMI_TRY(llmi_token_bytes(d->tok, id, d->flags, &p, &n));
    bool first = d->first;
    if (first && n > 0) {
        /* SentencePiece: drop the space the tokenizer put in front */
        if (p[0] == ' ') {
            p++;
            n--;
        }
        first = false;
    }
    seq s = {(const unsigned char *)d->pending, d->n_pending, (const unsigned char *)p,
             d->n_pending + n};
    size_t used;
    *n_out = decode(&s, false, out, &used);
    if (next) {
        *next = *d;
        next->first = first;
        size_t rest = s.n - used; /* < 4: an unfinished character */
        unsigned char tmp[8];
        for (size_t k = 0; k < rest; k++)
            tmp[k] = at(&s, used + k);
        memcpy(next->pending, tmp, rest);
        next->n_pending = rest;
    }
    return LLM_OK;
}

static llm_status out_check(char *buf, size_t cap, size_t *n) {
    if (!n)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "detokenize: n_bytes is NULL");
    if (!buf && cap > 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "detokenize: buffer is NULL");
    return LLM_OK;
}

llm_status llmi_detok_push(llmi_detok *d, llm_token id, char *buf, size_t cap, size_t *n) {
    LLMI_TRY(out_check(buf, cap, n));
    if (!d || !d->tok)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "detokenizer is NULL");
    size_t need;
    LLMI_TRY(feed(d, id, NULL, &need, NULL));
    *n = need;
    if (need >= cap) {
        *n = need + 1; /* what the buffer must hold, NUL included */
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL,
                          "detokenizer: %zu bytes and the NUL do not fit in %zu", need, cap);
    }
    llmi_detok next;
    LLMI_TRY(feed(d, id, buf, &need, &next));
    buf[need] = '\0';
    *d = next;
    return LLM_OK;
}

llm_status llmi_detok_flush(llmi_detok *d, char *buf, size_t cap, size_t *n) {
    LLMI_TRY(out_check(buf, cap, n));
    if (!d || !d->tok)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "detokenizer is NULL");
    seq s = {(const unsigned char *)d->pending, d->n_pending, NULL, d->n_pending};
    size_t used, need = decode(&s, true, NULL, &used);
    *n = need;
    if (need >= cap) {
        *n = need + 1; /* what the buffer must hold, NUL included */
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL,
                          "detokenizer: %zu bytes and the NUL do not fit in %zu", need, cap);
    }
    decode(&s, true, buf, &used);
    buf[need] = '\0';
    llmi_detok_init(d, d->tok, d->flags);
    return LLM_OK;
}

/* Runs the whole sequence; writes when out is non-NULL. */
static llm_status run_all(const llmi_tokenizer *t, const llm_token *tokens, size_t n,
                          uint32_t flags, char *out, size_t *total) {
    llmi_detok d, next;
    llmi_detok_init(&d, t, flags);
    size_t o = 0, k;
    for (size_t i = 0; i < n; i++) {
        LLMI_TRY(feed(&d, tokens[i], out ? out + o : NULL, &k, &next));
        if (o + k < o)
            return llmi_error(LLM_ERR_LIMIT, "detokenized text too long");
        o += k;
        d = next;
    }
    seq s = {(const unsigned char *)d.pending, d.n_pending, NULL, d.n_pending};
    size_t used;
    o += decode(&s, true, out ? out + o : NULL, &used);
    *total = o;
    return LLM_OK;
}

llm_status llmi_detokenize(const llmi_tokenizer *t, const llm_token *tokens, size_t n,
                           uint32_t flags, char *buf, size_t cap, size_t *n_out) {
    LLMI_TRY(out_check(buf, cap, n_out));
    *n_out = 0;
    if (!t)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "detokenize: tokenizer is NULL");
    if (!tokens && n > 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "detokenize: tokens is NULL");
    size_t need;
    LLMI_TRY(run_all(t, tokens, n, flags, NULL, &need));
    *n_out = need;
    if (need >= cap) {
        *n_out = need + 1; /* what the buffer must hold, NUL included */
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL,
                          "detokenize: %zu bytes and the NUL do not fit in %zu", need, cap);
    }
    LLMI_TRY(run_all(t, tokens, n, flags, buf, &need));
    buf[need] = '\0';
    return LLM_OK;
}
