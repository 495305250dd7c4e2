/* Binding a grammar to a vocabulary: a copy of every token's bytes and a
 * trie over them, so the mask walk shares the work of common prefixes and
 * drops whole subtrees the grammar rejects at their first byte. Built once
 * per model (kept in the model's cache) and shared by its grammars. */
#include "grammar/grammar.h"
#include "model/model.h"

#include <stdlib.h>

/* A vocabulary's token bytes and trie, shared by grammars (reference
 * counted; the model's cache holds one reference). */
struct llmi_gvocab {
    uint32_t refs;
    uint32_t n_vocab;
    uint32_t *tok_off;
    char *tok_bytes;
    llmi_gtrie_node *trie;
    uint32_t n_trie;
    llm_token *trie_tokens;
    llm_token *eog;
    uint32_t n_eog;
    uint32_t max_token_len;
    uint32_t *text_tokens;
    uint32_t *text_upto;
    uint32_t max_text_chars;
    uint64_t *trie_below;
};

bool llmi_gtoken_is_text(const uint8_t *b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (b[i] < 0x80 && !llmi_gbyte_is_text(b[i]))
            return false;
    return llmi_gtoken_utf8_ok(b, n);
}

bool llmi_gtoken_utf8_ok(const uint8_t *b, uint32_t n) {
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    for (uint32_t i = 0; i < n;) {
        uint8_t c = b[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        /* the matcher's rules (step_byte, filter_pending) */
        int len = llmi_utf8_seq_len(c);
        if (len < 2)
            return false;
        uint32_t have = n - i < (uint32_t)len ? n - i : (uint32_t)len;
        uint32_t acc = (uint32_t)c & (0x7Fu >> len);
        for (uint32_t k = 1; k < have; k++) {
            if ((b[i + k] & 0xC0) != 0x80)
                return false;
            acc = (acc << 6) | (b[i + k] & 0x3Fu);
        }
        uint32_t shift = 6u * ((uint32_t)len - have), lo = acc << shift,
                 hi = lo | ((1u << shift) - 1);
        if (lo < min_cp[len])
            lo = min_cp[len];
        if (hi > 0x10FFFF)
            hi = 0x10FFFF;
        if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF))
            return false;
        i += have;
    }
    return true;
}

/* Marks the text tokens and the trie nodes whose subtrees hold only those. */
static llm_status mark_text(llmi_gvocab *g, uint32_t n_sorted) {
    g->text_tokens = llmi_calloc((g->n_vocab + 31) / 32 + 1, sizeof *g->text_tokens);
    g->trie_below = llmi_calloc(g->n_trie, sizeof *g->trie_below);
    size_t words = (g->n_vocab + 31) / 32 + 1;
    g->text_upto = llmi_calloc(LLMI_GTEXT_RUNS * words, sizeof *g->text_upto);
    /* counts among the first i sorted tokens */
    uint32_t *not_text = llmi_malloc(((size_t)n_sorted + 1) * sizeof *not_text);
    uint32_t *bad = llmi_malloc(((size_t)n_sorted + 1) * sizeof *bad);
    if (!g->text_tokens || !g->trie_below || !g->text_upto || !not_text || !bad) {
        llmi_free(not_text);
        llmi_free(bad);
        return llmi_oom("grammar vocabulary");
    }
    not_text[0] = bad[0] = 0;
    for (uint32_t i = 0; i < n_sorted; i++) {
        llm_token t = g->trie_tokens[i];
        const uint8_t *b = (const uint8_t *)g->tok_bytes + g->tok_off[t];
        uint32_t n = g->tok_off[t + 1] - g->tok_off[t];
        bool text = llmi_gtoken_is_text(b, n);
        if (text) {
            g->text_tokens[t >> 5] |= 1u << (t & 31);
            uint32_t chars = 0;
            for (uint32_t k = 0; k < n; k++)
                chars += (b[k] & 0xC0) != 0x80;
            if (chars > g->max_text_chars)
                g->max_text_chars = chars;
            for (uint32_t k = chars ? chars - 1 : 0; k < LLMI_GTEXT_RUNS; k++)
                g->text_upto[k * words + (t >> 5)] |= 1u << (t & 31);
        }
        not_text[i + 1] = not_text[i] + !text;
        bad[i + 1] = bad[i] + !llmi_gtoken_utf8_ok(b, n);
    }
    /* children come after their parent */
    for (uint32_t i = g->n_trie; i-- > 0;) {
        llmi_gtrie_node *nd = &g->trie[i];
        uint64_t below = 0;
        uint32_t len = 0;
        for (uint32_t c = 0; c < nd->n_children; c++) {
            uint32_t ch = nd->first_child + c;
            uint32_t ch_len =
                ((g->trie[ch].byte & 0xC0) != 0x80) + llmi_gbelow_len(g->trie_below[ch]);
            below |= (g->trie_below[ch] & LLMI_GBELOW_GROUPS) |
                     1ull << llmi_gbyte_group(g->trie[ch].byte);
            len = ch_len > len ? ch_len : len;
        }
        if (bad[nd->end_token] != bad[nd->first_token])
            below |= 1ull << LLMI_GGROUP_INVALID;
        g->trie_below[i] = below | (uint64_t)(len > 255 ? 255 : len) << LLMI_GBELOW_LEN_SHIFT;
        nd->all_text = i > 0 && not_text[nd->end_token] == not_text[nd->first_token];
    }
    llmi_free(not_text);
    llmi_free(bad);
    return LLM_OK;
}

static int by_bytes(const void *a, const void *b, void *ctx) {
    const llmi_gvocab *g = ctx;
    llm_token x = *(const llm_token *)a, y = *(const llm_token *)b;
    uint32_t lx = g->tok_off[x + 1] - g->tok_off[x], ly = g->tok_off[y + 1] - g->tok_off[y];
    int c = memcmp(g->tok_bytes + g->tok_off[x], g->tok_bytes + g->tok_off[y], lx < ly ? lx : ly);
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static inline uint32_t tlen(const llmi_gvocab *g, llm_token t) {
    return g->tok_off[t + 1] - g->tok_off[t];
}
static inline uint8_t tbyte(const llmi_gvocab *g, llm_token t, uint32_t i) {
    return (uint8_t)g->tok_bytes[g->tok_off[t] + i];
}

/* Fills node `node` from the sorted tokens [lo, hi), which share their
 * first `depth` bytes; children get consecutive slots. */
static void build(llmi_gvocab *g, uint32_t node, uint32_t lo, uint32_t hi, uint32_t depth) {
    const llm_token *tk = g->trie_tokens;
    uint32_t k = lo;
    while (k < hi && tlen(g, tk[k]) == depth)
        k++;
    g->trie[node].first_token = lo;
    g->trie[node].n_tokens = k - lo;
    g->trie[node].end_token = hi;
    g->trie[node].depth = depth;
    uint32_t groups = 0;
    for (uint32_t i = k; i < hi; i++)
        if (i == k || tbyte(g, tk[i], depth) != tbyte(g, tk[i - 1], depth))
            groups++;
    uint32_t first = g->n_trie;
    g->trie[node].first_child = first;
    g->trie[node].n_children = (uint16_t)groups;
    g->n_trie += groups;
    uint32_t child = first;
    for (uint32_t i = k; i < hi;) {
        uint8_t b = tbyte(g, tk[i], depth);
        uint32_t j = i;
        while (j < hi && tbyte(g, tk[j], depth) == b)
            j++;
        g->trie[child] = (llmi_gtrie_node){0, 0, b, 0, 0, 0, 0, 0};
        build(g, child, i, j, depth + 1);
        child++;
        i = j;
    }
}

/* Builds the token bytes and trie of `tok`; *out has one reference. */
static llm_status vocab_build(const llmi_tokenizer *tok, llmi_gvocab **out) {
    *out = NULL;
    uint32_t V = llmi_tokenizer_n_vocab(tok);
    llmi_gvocab *g = llmi_calloc(1, sizeof *g);
    if (!g)
        return llmi_oom("grammar vocabulary");
    g->refs = 1;
    size_t total = 0;
    uint32_t n_eog = 0, n_text = 0, max_len = 0;
    for (uint32_t t = 0; t < V; t++) {
        const char *b;
        size_t n = 0;
        if (llmi_tokenizer_is_eog(tok, (llm_token)t)) {
            n_eog++;
            continue;
        }
        if (llmi_token_bytes(tok, (llm_token)t, 0, &b, &n) != LLM_OK)
            n = 0;
        if (n > 65535)
            n = 0; /* no grammar token is that long; keeps the trie shallow */
        total += n;
        n_text += n > 0;
        if (n > max_len)
            max_len = (uint32_t)n;
    }
    if (total >= UINT32_MAX - 1) {
        llmi_free(g);
        return llmi_error(LLM_ERR_LIMIT, "grammar: vocabulary text too large");
    }
    g->tok_off = llmi_malloc(((size_t)V + 1) * sizeof *g->tok_off);
    g->tok_bytes = llmi_malloc(total ? total : 1);
    g->eog = llmi_malloc((n_eog ? n_eog : 1) * sizeof *g->eog);
    g->trie_tokens = llmi_malloc((n_text ? n_text : 1) * sizeof *g->trie_tokens);
    g->trie = llmi_malloc((total + 1) * sizeof *g->trie);
    if (!g->tok_off || !g->tok_bytes || !g->eog || !g->trie_tokens || !g->trie) {
        llmi_free(g->tok_off);
        llmi_free(g->tok_bytes);
        llmi_free(g->eog);
        llmi_free(g->trie_tokens);
        llmi_free(g->trie);
        llmi_free(g);
        return llmi_oom("grammar vocabulary");
    }
    uint32_t off = 0, k = 0;
    g->n_eog = 0;
    for (uint32_t t = 0; t < V; t++) {
        g->tok_off[t] = off;
        if (llmi_tokenizer_is_eog(tok, (llm_token)t)) {
            g->eog[g->n_eog++] = (llm_token)t;
            continue;
        }
        const char *b;
        size_t n = 0;
        if (llmi_token_bytes(tok, (llm_token)t, 0, &b, &n) != LLM_OK || n > 65535)
            n = 0;
        if (n) {
            memcpy(g->tok_bytes + off, b, n);
            off += (uint32_t)n;
            g->trie_tokens[k++] = (llm_token)t;
        }
    }
    g->tok_off[V] = off;
    g->n_vocab = V;
    g->max_token_len = max_len;
    qsort_r(g->trie_tokens, k, sizeof *g->trie_tokens, by_bytes, g);
    g->trie[0] = (llmi_gtrie_node){0, 0, 0, 0, 0, 0, 0, 0};
    g->n_trie = 1;
    build(g, 0, 0, k, 0);
    llm_status st = mark_text(g, k);
    if (st != LLM_OK) {
        llmi_gvocab_release(g);
        return st;
    }
    llmi_error_clear();
    *out = g;
    return LLM_OK;
}

void llmi_gvocab_release(llmi_gvocab *v) {
    if (!v || __atomic_sub_fetch(&v->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    llmi_free(v->tok_off);
    llmi_free(v->tok_bytes);
    llmi_free(v->eog);
    llmi_free(v->trie_tokens);
    llmi_free(v->trie);
    llmi_free(v->text_tokens);
    llmi_free(v->trie_below);
    llmi_free(v->text_upto);
    llmi_free(v);
}

static void release_cached(void *v) { llmi_gvocab_release(v); }

/* Points g's vocabulary fields at v, taking a reference. */
static llm_status attach(llmi_grammar *g, llmi_gvocab *v) {
    if (g->vocab) {
        if (g->n_vocab == v->n_vocab)
            return LLM_OK;
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "grammar: already bound to a vocabulary of %u tokens, not %u", g->n_vocab,
                          v->n_vocab);
    }
    __atomic_add_fetch(&v->refs, 1, __ATOMIC_ACQ_REL);
    g->vocab = v;
    g->n_vocab = v->n_vocab;
    g->trie = v->trie;
    g->n_trie = v->n_trie;
    g->trie_tokens = v->trie_tokens;
    g->eog = v->eog;
    g->n_eog = v->n_eog;
    g->max_token_len = v->max_token_len;
    g->tok_off = v->tok_off;
    g->tok_bytes = v->tok_bytes;
    g->text_tokens = v->text_tokens;
    g->trie_below = v->trie_below;
    g->text_upto = v->text_upto;
    g->max_text_chars = v->max_text_chars;
    return LLM_OK;
}

llm_status llmi_grammar_attach_vocab(llmi_grammar *g, const llmi_tokenizer *tok) {
    if (g->vocab)
        return g->n_vocab == llmi_tokenizer_n_vocab(tok)
                   ? LLM_OK
                   : llmi_error(LLM_ERR_INVALID_ARGUMENT,
                                "grammar: already bound to a vocabulary of %u tokens, not %u",
                                g->n_vocab, llmi_tokenizer_n_vocab(tok));
    llmi_gvocab *v = NULL;
    LLMI_TRY(vocab_build(tok, &v));
    llm_status st = attach(g, v);
    llmi_gvocab_release(v);
    return st;
}

llm_status llmi_grammar_attach_model(llmi_grammar *g, const llm_model *m) {
    /* The trie is the model's, built once: a model is shared read-only, and
     * this cache is the one part that fills in later, under its lock. */
    llmi_model_cache *c = (llmi_model_cache *)&m->grammar_vocab;
    pthread_mutex_lock(&c->lock);
    llm_status st = LLM_OK;
    if (!c->data) {
        llmi_gvocab *v = NULL;
        st = vocab_build(m->tok, &v);
        if (st == LLM_OK) {
            c->data = v;
            c->release = release_cached;
        }
    }
    if (st == LLM_OK)
        st = attach(g, c->data);
    pthread_mutex_unlock(&c->lock);
    return st;
}
