/* WordPiece ("bert" vocabularies): BERT's normalizer, its pre-tokenizer and
 * greedy longest-match-first WordPiece, as Hugging Face tokenizers'
 * BertNormalizer, BertPreTokenizer and WordPiece model define them.
 *
 * Vocabulary spelling (llama.cpp's, so its "bert" GGUF files load too): a
 * piece that starts a word is stored with a leading U+2581, a continuation
 * piece ("##ing" in vocab.txt) without its "##", and bracketed names such as
 * [CLS] or [unused0] as they are.
 *
 * Normalization works on one code point at a time and keeps, for every
 * normalized code point, the byte offset of the input character it came
 * from, so that LLM_TOKENIZE_STRICT can name the input position of a word
 * that became the unknown token. */
#define LLMI_TOKENIZER_INTERNAL
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

#include <string.h>

#define WORD_START "\xe2\x96\x81" /* U+2581 */
#define WORD_START_LEN 3

/* ---- character classes ---- */

static bool in_ranges(const llmi_uc_range *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].first)
            hi = mid;
        else if (cp > r[mid].last)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* Rust's char::is_whitespace (the White_Space property). */
static bool is_white_space(uint32_t cp) {
    return (cp >= 0x9 && cp <= 0xd) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

/* BertNormalizer's control characters: categories C* but tab, newline and
 * carriage return (which count as whitespace). */
static bool is_control(uint32_t cp) {
    if (cp == '\t' || cp == '\n' || cp == '\r')
        return false;
    return in_ranges(llmi_uc_other, llmi_uc_other_n, cp);
}

/* The CJK blocks BERT puts spaces around (CJK Unified Ideographs and their
 * extensions, compatibility ideographs); not Hangul, kana or CJK
 * punctuation. */
static bool is_chinese(uint32_t cp) {
    return (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0x3400 && cp <= 0x4dbf) ||
           (cp >= 0x20000 && cp <= 0x2a6df) || (cp >= 0x2a700 && cp <= 0x2b73f) ||
           (cp >= 0x2b740 && cp <= 0x2b81f) || (cp >= 0x2b920 && cp <= 0x2ceaf) ||
           (cp >= 0xf900 && cp <= 0xfaff) || (cp >= 0x2f800 && cp <= 0x2fa1f);
}

/* BertPreTokenizer splits off every ASCII punctuation character (which
 * includes symbols such as $ + < = > ^ ` | ~) and every Unicode P*. */
static bool is_punct(uint32_t cp) {
    if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
        (cp >= 123 && cp <= 126))
        return true;
    return cp > 127 && in_ranges(llmi_uc_punct, llmi_uc_punct_n, cp);
}

static uint32_t lower_of(uint32_t cp) {
    if (cp < 128)
        return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    size_t lo = 0, hi = llmi_uc_lower_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (llmi_uc_lower[mid].cp == cp)
            return llmi_uc_lower[mid].to;
        if (llmi_uc_lower[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return cp;
}

static const llmi_uc_strip_row *strip_row(uint32_t cp) {
    size_t lo = 0, hi = llmi_uc_strip_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (llmi_uc_strip[mid].cp == cp)
            return &llmi_uc_strip[mid];
        if (llmi_uc_strip[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- normalization ---- */

/* Normalized code points, each with the input byte offset it came from. */
typedef struct cpvec {
    uint32_t *cp;
    size_t *src;
    size_t n, cap;
} cpvec;

static llm_status cp_push(cpvec *v, uint32_t cp, size_t src) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 256, bc, bs;
        if (!llmi_mul_ok(nc, sizeof(uint32_t), &bc) || !llmi_mul_ok(nc, sizeof(size_t), &bs))
            return llmi_oom("normalized text");
        uint32_t *c = llmi_realloc(v->cp, bc);
        if (!c)
            return llmi_oom("normalized text");
        v->cp = c;
        size_t *s = llmi_realloc(v->src, bs);
        if (!s)
            return llmi_oom("normalized text");
        v->src = s;
        v->cap = nc;
    }
    v->cp[v->n] = cp;
    v->src[v->n++] = src;
    return LLM_OK;
}

/* Lowercasing is the last step: U+0130 becomes "i" + U+0307. */
static llm_status push_cased(const llmi_tokenizer *t, cpvec *v, uint32_t cp, size_t src) {
    if (!t->wpm_lowercase)
        return cp_push(v, cp, src);
    if (cp == 0x130) {
        LLMI_TRY(cp_push(v, 'i', src));
        return cp_push(v, 0x307, src);
    }
    return cp_push(v, lower_of(cp), src);
}

/* Accent stripping: canonical decomposition, then nonspacing marks (Mn)
 * dropped. Hangul syllables decompose arithmetically into jamo. */
static llm_status push_stripped(const llmi_tokenizer *t, cpvec *v, uint32_t cp, size_t src) {
    if (!t->wpm_strip_accents)
        return push_cased(t, v, cp, src);
    if (cp >= 0xac00 && cp <= 0xd7a3) {
        uint32_t s = cp - 0xac00;
        LLMI_TRY(push_cased(t, v, 0x1100 + s / 588, src));
        LLMI_TRY(push_cased(t, v, 0x1161 + (s % 588) / 28, src));
        return s % 28 ? push_cased(t, v, 0x11a7 + s % 28, src) : LLM_OK;
    }
    const llmi_uc_strip_row *r = strip_row(cp);
    if (!r)
        return in_ranges(llmi_uc_mn, llmi_uc_mn_n, cp) ? LLM_OK : push_cased(t, v, cp, src);
    for (int i = 0; i < 3 && r->to[i]; i++)
        LLMI_TRY(push_cased(t, v, r->to[i], src));
    return LLM_OK;
}

static llm_status normalize(const llmi_tokenizer *t, const char *text, size_t len, cpvec *v) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t at = i;
        i += llmi_tok_utf8_decode(text + i, len - i, &cp);
        if (t->wpm_clean_text) {
            if (cp == 0 || cp == 0xfffd || is_control(cp))
                continue;
            if (is_white_space(cp))
                cp = ' ';
        }
        if (t->wpm_chinese && is_chinese(cp)) {
            LLMI_TRY(cp_push(v, ' ', at));
            LLMI_TRY(push_stripped(t, v, cp, at));
            LLMI_TRY(cp_push(v, ' ', at));
            continue;
        }
        LLMI_TRY(push_stripped(t, v, cp, at));
    }
    return LLM_OK;
}

/* ---- WordPiece ---- */

/* One word's UTF-8 text behind the word-start mark, with the byte offset
 * of each of its characters (n + 1 entries). */
typedef struct wordbuf {
    char *text;
    size_t *off;
    size_t cap;
} wordbuf;

static llm_status word_fill(wordbuf *w, const uint32_t *cp, size_t n) {
    if (n + 1 > w->cap) {
        size_t nc = n + 1 > 64 ? n + 1 : 64, bytes;
        if (!llmi_mul_ok(nc, sizeof(size_t), &bytes))
            return llmi_oom("word buffer");
        char *s = llmi_realloc(w->text, WORD_START_LEN + 4 * nc);
        if (!s)
            return llmi_oom("word buffer");
        w->text = s;
        size_t *o = llmi_realloc(w->off, bytes);
        if (!o)
            return llmi_oom("word buffer");
        w->off = o;
        w->cap = nc;
    }
    memcpy(w->text, WORD_START, WORD_START_LEN);
    size_t o = WORD_START_LEN;
    for (size_t i = 0; i < n; i++) {
        w->off[i] = o;
        o += llmi_tok_utf8_encode(cp[i], w->text + o);
    }
    w->off[n] = o;
    return LLM_OK;
}

/* Greedy longest match from the left; a word that cannot be covered, or
 * is longer than max_input_chars_per_word characters, is one unknown
 * token. *unknown is set when that happened. */
static llm_status wordpiece(const llmi_tokenizer *t, wordbuf *w, const uint32_t *cp, size_t n,
                            llmi_tokvec *out, bool *unknown) {
    *unknown = false;
    size_t mark = out->n;
    if (n <= t->wpm_max_chars) {
        LLMI_TRY(word_fill(w, cp, n));
        size_t start = 0;
        while (start < n) {
            llm_token found = -1;
            size_t end = n;
            /* A continuation spelt with a leading U+2581 would be read as a
             * word-start piece: such continuations are not in the file. */
            if (start > 0 && cp[start] == 0x2581)
                end = start;
            /* No piece is longer than the vocabulary's longest token: start
             * from the longest candidate that fits (a binary search), so a
             * word costs O(length * longest token), not O(length^2). */
            const size_t from0 = start ? w->off[start] : 0;
            if (end > start && w->off[end] - from0 > t->wpm_max_bytes) {
                size_t lo = start, hi = end; /* off[lo] - from0 fits, off[hi] - from0 does not */
                while (hi - lo > 1) {
                    size_t mid = lo + (hi - lo) / 2;
                    if (w->off[mid] - from0 <= t->wpm_max_bytes)
                        lo = mid;
                    else
                        hi = mid;
                }
                end = lo;
            }
            for (; end > start && found < 0; end--) {
                size_t from = start ? w->off[start] : 0;
                found = llmi_tok_find(t, w->text + from, w->off[end] - from);
            }
            if (found < 0)
                break;
            LLMI_TRY(llmi_tokvec_push(out, found));
            start = end + 1;
        }
        if (start >= n)
            return LLM_OK;
    }
    out->n = mark;
    *unknown = true;
    return t->unk != LLM_TOKEN_NONE ? llmi_tokvec_push(out, t->unk) : LLM_OK;
}

static llm_status split_words(const llmi_tokenizer *t, const cpvec *v, llmi_tokvec *out,
                              size_t *dropped) {
    wordbuf w = {0};
    llm_status st = LLM_OK;
    size_t start = 0;
    for (size_t i = 0; i <= v->n && st == LLM_OK; i++) {
        bool end = i == v->n, space = !end && is_white_space(v->cp[i]);
        bool punct = !end && !space && is_punct(v->cp[i]);
        if (!end && !space && !punct)
            continue;
        bool unknown = false;
        if (i > start) {
            st = wordpiece(t, &w, v->cp + start, i - start, out, &unknown);
            if (unknown && *dropped == SIZE_MAX)
                *dropped = v->src[start];
        }
        if (st == LLM_OK && punct) {
            st = wordpiece(t, &w, v->cp + i, 1, out, &unknown);
            if (unknown && *dropped == SIZE_MAX)
                *dropped = v->src[i];
        }
        start = i + 1;
    }
    llmi_free(w.text);
    llmi_free(w.off);
    return st;
}

llm_status llmi_wpm_tokenize(const llmi_tokenizer *t, const char *text, size_t len,
                             llmi_tokvec *out, size_t *dropped) {
    *dropped = SIZE_MAX;
    cpvec v = {0};
    llm_status st = normalize(t, text, len, &v);
    if (st == LLM_OK)
        st = split_words(t, &v, out, dropped);
    llmi_free(v.cp);
    llmi_free(v.src);
    return st;
}

static void read_flag(const llmi_gguf *g, const char *key, bool *out) {
    bool v;
    if (llmi_gguf_find(g, key) && llmi_gguf_get_bool(g, key, true, &v) == LLM_OK)
        *out = v;
}

llm_status llmi_wpm_init(llmi_tokenizer *t, const llmi_gguf *g) {
    /* Defaults: uncased BERT, as llama.cpp tokenizes every "bert" file. */
    t->wpm_clean_text = t->wpm_chinese = t->wpm_strip_accents = t->wpm_lowercase = true;
    t->wpm_max_chars = 100;
    t->wpm_max_bytes = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if (llmi_tok_len(t, (llm_token)id) > t->wpm_max_bytes)
            t->wpm_max_bytes = llmi_tok_len(t, (llm_token)id);
    read_flag(g, "tokenizer.wordpiece.clean_text", &t->wpm_clean_text);
    read_flag(g, "tokenizer.wordpiece.chinese_chars", &t->wpm_chinese);
    read_flag(g, "tokenizer.wordpiece.strip_accents", &t->wpm_strip_accents);
    read_flag(g, "tokenizer.wordpiece.lowercase", &t->wpm_lowercase);
    if (llmi_gguf_find(g, "tokenizer.wordpiece.max_input_chars_per_word")) {
        uint32_t m;
        LLMI_TRY(llmi_gguf_get_u32(g, "tokenizer.wordpiece.max_input_chars_per_word", true, &m));
        t->wpm_max_chars = m;
    }
    return LLM_OK;
}
