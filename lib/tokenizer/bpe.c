/* Byte-level BPE ("gpt2" tokenizer model): the pre-tokenizer that splits
 * text with the regex list the file's tokenizer.ggml.pre names, GPT-2's
 * bytes_to_unicode mapping, and rank-ordered merging.
 *
 * The regexes are llama.cpp's (llama-vocab.cpp) and are applied the way its
 * unicode_regex_split() does: each regex in turn splits every piece the
 * previous one produced; text between matches becomes a piece of its own.
 * llama.cpp runs the GPT-2/Llama 3/Qwen2 patterns through hand-written
 * matchers that behave like the regex followed by a final `|\s+`, so that
 * alternative is spelt out here. "Whitespace" is llama.cpp's set (PCRE2's
 * \s also matches U+180E); \p{L} and \p{N} come from PCRE2's Unicode data. */
#define LLMI_TOKENIZER_INTERNAL
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string.h>

/* ---- GPT-2 bytes_to_unicode ---- */

static bool byte_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

/* The 68 other bytes are 0x00-0x20, 0x7f-0xa0 and 0xad, numbered in order
 * from U+0100. */
uint32_t llmi_bpe_byte_cp(uint8_t b) {
    if (byte_printable(b))
        return b;
    if (b <= 0x20)
        return 256u + b;
    if (b <= 0xa0)
        return 256u + 33u + (b - 0x7fu);
    return 256u + 67u; /* 0xad */
}

int llmi_bpe_cp_byte(uint32_t cp) {
    if (cp < 256)
        return byte_printable(cp) ? (int)cp : -1;
    uint32_t n = cp - 256;
    if (n < 33)
        return (int)n;
    if (n < 67)
        return (int)(0x7f + n - 33);
    return n == 67 ? 0xad : -1;
}

/* ---- regexes ---- */

#define WS                                                                                         \
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{"   \
    "202F}\\x{205F}\\x{3000}"
#define S_ "[" WS "]"
#define NS_ "[^" WS "]"

#define RE_GPT2                                                                                    \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|" S_ "+(?!" NS_ ")|" S_  \
    "+"
#define RE_CONTRACTIONS_CI "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                  \
    RE_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS                        \
                       "\\p{L}\\p{N}]+[\\r\\n]*|" S_ "*[\\r\\n]+|" S_ "+(?!" NS_ ")|" S_ "+"
#define RE_QWEN2                                                                                   \
    RE_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS                             \
                       "\\p{L}\\p{N}]+[\\r\\n]*|" S_ "*[\\r\\n]+|" S_ "+(?!" NS_ ")|" S_ "+"

static const char *const re_default[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+",
                                         "[0-9][0-9][0-9]", NULL};
static const char *const re_gpt2[] = {RE_GPT2, NULL};
static const char *const re_llama3[] = {RE_LLAMA3, NULL};
static const char *const re_qwen2[] = {RE_QWEN2, NULL};
static const char *const re_starcoder[] = {"\\p{N}", RE_GPT2, NULL};

typedef struct pre_name {
    const char *name;
    llmi_tok_pre pre;
    bool ignore_merges, add_bos;
} pre_name;
static const pre_name pre_names[] = {
    {"default", LLMI_PRE_DEFAULT, false, false},
    {"llama3", LLMI_PRE_LLAMA3, true, true},
    {"llama-v3", LLMI_PRE_LLAMA3, true, true},
    {"llama-bpe", LLMI_PRE_LLAMA3, true, true},
    {"falcon3", LLMI_PRE_LLAMA3, true, true},
    {"falcon-h1", LLMI_PRE_LLAMA3, true, true},
    {"pixtral", LLMI_PRE_LLAMA3, true, true},
    {"dbrx", LLMI_PRE_LLAMA3, false, false},
    {"smaug-bpe", LLMI_PRE_LLAMA3, false, false},
    {"gpt-2", LLMI_PRE_GPT2, false, false},
    {"phi-2", LLMI_PRE_GPT2, false, false},
    {"mpt", LLMI_PRE_GPT2, false, false},
    {"olmo", LLMI_PRE_GPT2, false, false},
    {"jais", LLMI_PRE_GPT2, false, false},
    {"exaone4", LLMI_PRE_GPT2, false, false},
    {"qwen2", LLMI_PRE_QWEN2, false, false},
    {"deepseek-r1-qwen", LLMI_PRE_QWEN2, false, false},
    {"stablelm2", LLMI_PRE_QWEN2, false, false},
    {"smollm", LLMI_PRE_STARCODER, false, false},
    {"starcoder", LLMI_PRE_STARCODER, false, false},
    {"refact", LLMI_PRE_STARCODER, false, false},
    {"command-r", LLMI_PRE_STARCODER, false, false},
    {"codeshell", LLMI_PRE_STARCODER, false, false},
    {"exaone", LLMI_PRE_STARCODER, false, false},
};

static void *re_malloc(PCRE2_SIZE n, void *user) {
    (void)user;
    return llmi_malloc(n ? n : 1);
}
static void re_free(void *p, void *user) {
    (void)user;
    llmi_free(p);
}

static llm_status compile_all(llmi_tokenizer *t, const char *const *list) {
    pcre2_general_context *gc = pcre2_general_context_create(re_malloc, re_free, NULL);
    if (!gc)
        return llmi_oom("regex context");
    t->gctx = gc;
    pcre2_compile_context *cc = pcre2_compile_context_create(gc);
    if (!cc)
        return llmi_oom("regex context");
    llm_status st = LLM_OK;
    for (; *list && st == LLM_OK; list++) {
        int err;
        PCRE2_SIZE off;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)*list, PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP, &err, &off, cc);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            st = err == PCRE2_ERROR_HEAP_FAILED
                     ? llmi_oom("regex")
                     : llmi_error(LLM_ERR_INTERNAL, "pre-tokenizer regex at %zu: %s", (size_t)off,
                                  (const char *)msg);
            break;
        }
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up */
        t->re[t->n_re++] = re;
    }
    pcre2_compile_context_free(cc);
    return st;
}

/* ---- merges ---- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

bool llmi_bpe_merge_find(const llmi_tokenizer *t, llm_token l, llm_token r, uint32_t *rank,
                         int32_t *result) {
    const llmi_tok_pairmap *m = &t->merges;
    if (!m->keys)
        return false;
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    uint32_t i = (uint32_t)mix64(key) & m->mask;
    for (;;) {
        uint64_t k = m->keys[i];
        if (k == 0)
            return false;
        if (k == key) {
            *rank = m->rank[i];
            *result = m->result[i];
            return true;
        }
        i = (i + 1) & m->mask;
    }
}

llm_status llmi_bpe_load_merges(llmi_tokenizer *t, const llmi_gguf_kv *kv) {
    uint64_t n = kv->arr_len;
    if (n >= (1u << 30))
        return llmi_error(LLM_ERR_LIMIT, "too many merges (%llu)", (unsigned long long)n);
    uint32_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    llmi_tok_pairmap *m = &t->merges;
    m->keys = llmi_calloc(cap, sizeof(uint64_t));
    m->rank = llmi_malloc((size_t)cap * sizeof(uint32_t));
    m->result = llmi_malloc((size_t)cap * sizeof(int32_t));
    if (!m->keys || !m->rank || !m->result)
        return llmi_oom("merge table");
    m->mask = cap - 1;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    for (uint64_t r = 0; r < n; r++) {
        llmi_str s = kv->arr_strs[r];
        /* "left right", split at the first space after the first byte */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', (size_t)s.len - 1) : NULL;
        if (!sp)
            continue;
        size_t ll = (size_t)(sp - s.ptr), rl = (size_t)s.len - ll - 1;
        llm_token l = llmi_tok_find(t, s.ptr, ll), rt = llmi_tok_find(t, sp + 1, rl);
        if (l < 0 || rt < 0)
            continue;
        uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)rt) + 1;
        uint32_t i = (uint32_t)mix64(key) & m->mask;
        while (m->keys[i] != 0 && m->keys[i] != key)
            i = (i + 1) & m->mask;
        if (m->keys[i] == key)
            continue; /* the first rank of a duplicate wins */
        if (ll + rl > tmp_cap) {
            char *nt = llmi_realloc(tmp, ll + rl);
            if (!nt) {
                llmi_free(tmp);
                return llmi_oom("merge table");
            }
            tmp = nt;
            tmp_cap = ll + rl;
        }
        memcpy(tmp, s.ptr, ll);
        memcpy(tmp + ll, sp + 1, rl);
        m->keys[i] = key;
        m->rank[i] = (uint32_t)r;
        m->result[i] = llmi_tok_find(t, tmp, ll + rl);
    }
    llmi_free(tmp);
    return LLM_OK;
}

llm_status llmi_bpe_init(llmi_tokenizer *t, const llmi_gguf *g, const char *pre) {
    t->pre = LLMI_PRE_DEFAULT;
    if (pre) {
        size_t i, n = sizeof pre_names / sizeof pre_names[0];
        for (i = 0; i < n; i++)
            if (strcmp(pre, pre_names[i].name) == 0)
                break;
        if (i == n)
            return llmi_error(LLM_ERR_UNSUPPORTED, "unsupported pre-tokenizer '%s'", pre);
        t->pre = pre_names[i].pre;
        t->ignore_merges = pre_names[i].ignore_merges;
        if (pre_names[i].add_bos)
            t->add_bos = true;
    } else {
        llmi_log(LLM_LOG_WARN, "tokenizer: no tokenizer.ggml.pre; using the default pre-tokenizer");
    }
    const char *const *list;
    switch (t->pre) {
    case LLMI_PRE_GPT2:
        list = re_gpt2;
        break;
    case LLMI_PRE_LLAMA3:
        list = re_llama3;
        break;
    case LLMI_PRE_QWEN2:
        list = re_qwen2;
        break;
    case LLMI_PRE_STARCODER:
        list = re_starcoder;
        break;
    default:
        list = re_default;
        break;
    }
    const llmi_gguf_kv *kv;
    llm_status st = llmi_gguf_get_arr(g, "tokenizer.ggml.merges", true, LLMI_GGUF_STRING, &kv);
    if (st == LLM_ERR_NOT_FOUND)
        return llmi_error(LLM_ERR_BAD_FORMAT, "missing key 'tokenizer.ggml.merges'");
    LLMI_TRY(st);
    LLMI_TRY(llmi_bpe_load_merges(t, kv));
    for (int b = 0; b < 256; b++) {
        char buf[4];
        size_t n = llmi_tok_utf8_encode(llmi_bpe_byte_cp((uint8_t)b), buf);
        t->byte_tok[b] = llmi_tok_find(t, buf, n);
    }
    return compile_all(t, list);
}

void llmi_bpe_free(llmi_tokenizer *t) {
    for (uint32_t i = 0; i < t->n_re; i++)
        pcre2_code_free((pcre2_code *)t->re[i]);
    t->n_re = 0;
    pcre2_general_context_free((pcre2_general_context *)t->gctx);
    t->gctx = NULL;
    llmi_free(t->merges.keys);
    llmi_free(t->merges.rank);
    llmi_free(t->merges.result);
    memset(&t->merges, 0, sizeof t->merges);
}

/* ---- splitting ---- */

typedef struct span {
    size_t off, len;
} span;
typedef struct spanvec {
    span *v;
    size_t n, cap;
} spanvec;

static llm_status span_push(spanvec *s, size_t off, size_t len) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64, bytes;
        if (!llmi_mul_ok(nc, sizeof(span), &bytes))
            return llmi_oom("pre-tokenizer pieces");
        span *v = llmi_realloc(s->v, bytes);
        if (!v)
            return llmi_oom("pre-tokenizer pieces");
        s->v = v;
        s->cap = nc;
    }
    s->v[s->n++] = (span){off, len};
    return LLM_OK;
}

/* Splits every piece of `in` with one regex into `out`: matches and the
 * text between them each become a piece (llama.cpp's regex split). */
static llm_status split_one(const pcre2_code *re, pcre2_match_data *md, const char *text,
                            const spanvec *in, spanvec *out) {
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        const char *subj = text + in->v[k].off;
        size_t len = in->v[k].len, pos = 0, prev = 0;
        while (pos < len) {
            int rc = pcre2_match(re, (PCRE2_SPTR)subj, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0) {
                if (rc == PCRE2_ERROR_NOMEMORY || rc == PCRE2_ERROR_HEAPLIMIT)
                    return llmi_oom("regex match");
                return llmi_error(LLM_ERR_INTERNAL, "pre-tokenizer regex failed (%d)", rc);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (ms > prev)
                LLMI_TRY(span_push(out, in->v[k].off + prev, ms - prev));
            if (me > ms) {
                LLMI_TRY(span_push(out, in->v[k].off + ms, me - ms));
                pos = me;
            } else { /* empty match: step over one character */
                int l = llmi_utf8_seq_len((unsigned char)subj[ms]);
                pos = ms + (size_t)(l > 0 ? l : 1);
            }
            prev = ms > prev ? ms : prev;
            if (me > prev)
                prev = me;
        }
        if (len > prev)
            LLMI_TRY(span_push(out, in->v[k].off + prev, len - prev));
    }
    return LLM_OK;
}

/* ---- merging one word ---- */

typedef struct sym {
    int32_t prev, next;
    uint32_t off, n;
    llm_token id;
} sym;
typedef struct bigram {
    uint32_t rank;
    int32_t left, right;
    uint32_t size;
    llm_token result;
} bigram;

typedef struct scratch {
    spanvec a, b;
    char *enc;
    size_t enc_cap;
    sym *syms;
    size_t sym_cap;
    bigram *heap;
    size_t heap_n, heap_cap;
    size_t word_off; /* offset of the word being tokenized in the text */
    size_t dropped;  /* offset of the first byte left without a token, or SIZE_MAX */
} scratch;

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return true;
    size_t nc = *cap ? *cap : 64, bytes;
    while (nc < need)
        nc *= 2;
    if (!llmi_mul_ok(nc, elem, &bytes))
        return false;
    void *np = llmi_realloc(*p, bytes);
    if (!np)
        return false;
    *p = np;
    *cap = nc;
    return true;
}

static bool bg_before(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static llm_status heap_push(scratch *s, bigram b) {
    if (!grow((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof(bigram)))
        return llmi_oom("merge queue");
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_before(&b, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = b;
    return LLM_OK;
}

static bigram heap_pop(scratch *s) {
    bigram top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && bg_before(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!bg_before(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n)
        s->heap[i] = last;
    return top;
}

static llm_status add_bigram(const llmi_tokenizer *t, scratch *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0)
        return LLM_OK;
    llm_token il = s->syms[l].id, ir = s->syms[r].id;
    if (il < 0 || ir < 0)
        return LLM_OK;
    uint32_t rank;
    int32_t result;
    if (!llmi_bpe_merge_find(t, il, ir, &rank, &result))
        return LLM_OK;
    return heap_push(s, (bigram){rank, l, r, s->syms[l].n + s->syms[r].n, result});
}

/* Index in word w of the byte whose mapped character holds byte `e` of the
 * encoding of the symbol that starts at byte `first`. */
static size_t byte_of_enc(const char *w, size_t first, uint32_t e) {
    char tmp[4];
    size_t k = first;
    for (size_t end = 0;; k++) {
        end += llmi_tok_utf8_encode(llmi_bpe_byte_cp((uint8_t)w[k]), tmp);
        if (e < end)
            return k;
    }
}

static llm_status bpe_word(const llmi_tokenizer *t, scratch *s, const char *w, size_t n,
                           llmi_tokvec *out) {
    if (n == 0)
        return LLM_OK;
    if (!grow((void **)&s->enc, &s->enc_cap, 2 * n, 1) ||
        !grow((void **)&s->syms, &s->sym_cap, n, sizeof(sym)))
        return llmi_oom("BPE word");
    size_t el = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)w[i];
        size_t l = llmi_tok_utf8_encode(llmi_bpe_byte_cp(b), s->enc + el);
        s->syms[i] = (sym){(int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, (uint32_t)el,
                           (uint32_t)l, t->byte_tok[b]};
        el += l;
    }
    if (t->ignore_merges) {
        llm_token id = llmi_tok_find(t, s->enc, el);
        if (id >= 0)
            return llmi_tokvec_push(out, id);
    }
    s->heap_n = 0;
    for (size_t i = 1; i < n; i++)
        LLMI_TRY(add_bigram(t, s, (int32_t)i - 1, (int32_t)i));
    while (s->heap_n) {
        bigram bg = heap_pop(s);
        sym *l = &s->syms[bg.left], *r = &s->syms[bg.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size)
            continue; /* outdated */
        l->n += r->n;
        l->id = bg.result;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->syms[r->next].prev = bg.left;
        LLMI_TRY(add_bigram(t, s, l->prev, bg.left));
        LLMI_TRY(add_bigram(t, s, bg.left, s->syms[bg.left].next));
    }
    for (int32_t i = 0; i != -1; i = s->syms[i].next) {
        const sym *y = &s->syms[i];
        if (y->id >= 0) {
            LLMI_TRY(llmi_tokvec_push(out, y->id));
            continue;
        }
        /* not a token: llama.cpp emits the tokens of its single bytes, if any */
        for (uint32_t j = 0; j < y->n; j++) {
            llm_token id = llmi_tok_find(t, s->enc + y->off + j, 1);
            if (id >= 0)
                LLMI_TRY(llmi_tokvec_push(out, id));
            else if (s->dropped == SIZE_MAX)
                s->dropped = s->word_off + byte_of_enc(w, (size_t)i, j);
        }
    }
    return LLM_OK;
}

static llm_status tokenize(const llmi_tokenizer *t, scratch *s, pcre2_match_data *md,
                           const char *text, size_t len, llmi_tokvec *out) {
    LLMI_TRY(span_push(&s->a, 0, len));
    for (uint32_t i = 0; i < t->n_re; i++) {
        LLMI_TRY(split_one((const pcre2_code *)t->re[i], md, text, &s->a, &s->b));
        spanvec tmp = s->a;
        s->a = s->b;
        s->b = tmp;
    }
    for (size_t k = 0; k < s->a.n; k++) {
        s->word_off = s->a.v[k].off;
        LLMI_TRY(bpe_word(t, s, text + s->a.v[k].off, s->a.v[k].len, out));
    }
    return LLM_OK;
}

llm_status llmi_bpe_tokenize(const llmi_tokenizer *t, const char *text, size_t len,
                             llmi_tokvec *out, size_t *dropped) {
    *dropped = SIZE_MAX;
    if (len == 0)
        return LLM_OK;
    pcre2_match_data *md = pcre2_match_data_create(1, (pcre2_general_context *)t->gctx);
    if (!md)
        return llmi_oom("regex match data");
    scratch s;
    memset(&s, 0, sizeof s);
    s.dropped = SIZE_MAX;
    llm_status st = tokenize(t, &s, md, text, len, out);
    *dropped = s.dropped;
    pcre2_match_data_free(md);
    llmi_free(s.a.v);
    llmi_free(s.b.v);
    llmi_free(s.enc);
    llmi_free(s.syms);
    llmi_free(s.heap);
    return st;
}
