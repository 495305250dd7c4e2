/* What every file of the tokenizer uses, and nothing else: the growing
 * token vector, UTF-8 decoding, the token-text hash and the lookup of a
 * token by its text. It calls no other file of the module, so the
 * tokenizers (bpe.c, spm.c, wordpiece.c), the vocabulary loader (vocab.c)
 * and the entry point (tokenize.c) each depend on it one way only
 * (tests/deps/file_cycles.py). */
#define LLMI_TOKENIZER_INTERNAL
#include "tokenizer/tokenizer.h"

#include <string.h>

/* ---- token vector ---- */

llm_status llmi_tokvec_push(llmi_tokvec *tv, llm_token id) {
    if (tv->n == tv->cap) {
        size_t nc = tv->cap ? tv->cap * 2 : 64, bytes;
        if (!llmi_mul_ok(nc, sizeof(llm_token), &bytes))
            return llmi_oom("token buffer");
        llm_token *v = llmi_realloc(tv->v, bytes);
        if (!v)
            return llmi_oom("token buffer");
        tv->v = v;
        tv->cap = nc;
    }
    tv->v[tv->n++] = id;
    return LLM_OK;
}

/* ---- UTF-8 ---- */

size_t llmi_tok_utf8_encode(uint32_t c, char *o) { return llmi_utf8_encode(c, o); }

size_t llmi_tok_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    size_t len = (size_t)llmi_utf8_seq_len(u[0]);
    if (len == 0 || len > n) {
        *cp = u[0];
        return 1;
    } /* not reached on valid text */
    uint32_t c = len == 1   ? u[0]
                 : len == 2 ? (u[0] & 0x1fu)
                 : len == 3 ? (u[0] & 0x0fu)
                            : (u[0] & 0x07u);
    for (size_t i = 1; i < len; i++)
        c = (c << 6) | (u[i] & 0x3fu);
    *cp = c;
    return len;
}

/* ---- the text -> id map (built by vocab.c) ---- */

uint64_t llmi_tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

llm_token llmi_tok_find(const llmi_tokenizer *t, const char *s, size_t n) {
    const llmi_tok_strmap *m = &t->map;
    uint32_t i = (uint32_t)llmi_tok_hash(s, n) & m->mask;
    for (;;) {
        uint32_t v = m->slots[i];
        if (v == 0)
            return -1;
        llm_token id = (llm_token)(v - 1);
        if (llmi_tok_len(t, id) == n && memcmp(llmi_tok_str(t, id), s, n) == 0)
            return id;
        i = (i + 1) & m->mask;
    }
}
