/* SentencePiece-style BPE ("llama" tokenizer model), as llama.cpp's SPM
 * tokenizer does it: start from single UTF-8 characters, repeatedly merge
 * the adjacent pair whose concatenation is the highest-scoring vocabulary
 * entry (leftmost first on ties), and spell characters that are not in the
 * vocabulary with <0xNN> byte tokens. The caller has already turned spaces
 * into U+2581 and added the leading one.
 *
 * A file converted from tokenizer.json carries its merges: then a pair
 * merges only if listed, in rank order, which is Hugging Face's BPE with
 * byte fallback. Scores alone cannot express that: a token with two splits
 * in the vocabulary would be reachable through either. */
#define LLMI_TOKENIZER_INTERNAL
#include "tokenizer/tokenizer.h"

#include <string.h>

typedef struct sym {
    int32_t prev, next;
    uint32_t off, n;
} sym;
typedef struct bigram {
    float score;
    int32_t left, right;
    uint32_t size;
} bigram;

typedef struct work {
    sym *syms;
    bigram *heap;
    size_t heap_n, heap_cap;
    size_t dropped; /* offset of the first byte without a token of its own, or SIZE_MAX */
} work;

static bool before(const bigram *a, const bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static llm_status push(work *w, bigram b) {
    if (w->heap_n == w->heap_cap) {
        size_t nc = w->heap_cap ? w->heap_cap * 2 : 64, bytes;
        if (!llmi_mul_ok(nc, sizeof(bigram), &bytes))
            return llmi_oom("merge queue");
        bigram *nh = llmi_realloc(w->heap, bytes);
        if (!nh)
            return llmi_oom("merge queue");
        w->heap = nh;
        w->heap_cap = nc;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&b, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return LLM_OK;
}

static bigram pop(work *w) {
    bigram top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static llm_status try_add(const llmi_tokenizer *t, work *w, const char *text, int32_t l,
                          int32_t r) {
    if (l < 0 || r < 0)
        return LLM_OK;
    uint32_t size = w->syms[l].n + w->syms[r].n;
    if (t->merges.keys) {
        /* Ranks below 2^24 order exactly as floats. */
        llm_token il = llmi_tok_find(t, text + w->syms[l].off, w->syms[l].n);
        llm_token ir = llmi_tok_find(t, text + w->syms[r].off, w->syms[r].n);
        uint32_t rank;
        int32_t result;
        if (il < 0 || ir < 0 || !llmi_bpe_merge_find(t, il, ir, &rank, &result) || result < 0)
            return LLM_OK;
        return push(w, (bigram){-(float)rank, l, r, size});
    }
    llm_token id = llmi_tok_find(t, text + w->syms[l].off, size);
    if (id < 0)
        return LLM_OK;
    return push(w, (bigram){t->score[id], l, r, size});
}

static llm_status emit(const llmi_tokenizer *t, work *w, const char *text, size_t off, size_t n,
                       llmi_tokvec *out) {
    const char *s = text + off;
    llm_token id = llmi_tok_find(t, s, n);
    if (id >= 0)
        return llmi_tokvec_push(out, id);
    for (size_t j = 0; j < n; j++) {
        id = t->byte_tok[(unsigned char)s[j]];
        if (id < 0 && w->dropped == SIZE_MAX)
            w->dropped = off + j;
        if (id < 0)
            id = t->unk; /* no byte fallback in this vocabulary */
        if (id >= 0)
            LLMI_TRY(llmi_tokvec_push(out, id));
    }
    return LLM_OK;
}

static llm_status run(const llmi_tokenizer *t, work *w, const char *text, size_t len,
                      llmi_tokvec *out) {
    int32_t n = 0;
    for (size_t off = 0; off < len; n++) {
        int l = llmi_utf8_seq_len((unsigned char)text[off]);
        size_t cl = l > 0 ? (size_t)l : 1;
        if (cl > len - off)
            cl = len - off;
        w->syms[n] = (sym){n - 1, -1, (uint32_t)off, (uint32_t)cl};
        off += cl;
        if (off < len)
            w->syms[n].next = n + 1;
    }
    for (int32_t i = 1; i < n; i++)
        LLMI_TRY(try_add(t, w, text, i - 1, i));
    while (w->heap_n) {
        bigram b = pop(w);
        sym *l = &w->syms[b.left], *r = &w->syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* outdated */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->syms[r->next].prev = b.left;
        LLMI_TRY(try_add(t, w, text, l->prev, b.left));
        LLMI_TRY(try_add(t, w, text, b.left, w->syms[b.left].next));
    }
    for (int32_t i = 0; i != -1 && n > 0; i = w->syms[i].next)
        LLMI_TRY(emit(t, w, text, w->syms[i].off, w->syms[i].n, out));
    return LLM_OK;
}

llm_status llmi_spm_tokenize(const llmi_tokenizer *t, const char *text, size_t len,
                             llmi_tokvec *out, size_t *dropped) {
    *dropped = SIZE_MAX;
    if (len == 0)
        return LLM_OK;
    if (len > INT32_MAX)
        return llmi_error(LLM_ERR_LIMIT, "text too long to tokenize");
    work w;
    memset(&w, 0, sizeof w);
    w.dropped = SIZE_MAX;
    size_t bytes;
    if (!llmi_mul_ok(len, sizeof(sym), &bytes))
        return llmi_oom("SentencePiece symbols");
    w.syms = llmi_malloc(bytes);
    if (!w.syms)
        return llmi_oom("SentencePiece symbols");
    llm_status st = run(t, &w, text, len, out);
    *dropped = w.dropped;
    llmi_free(w.syms);
    llmi_free(w.heap);
    return st;
}
