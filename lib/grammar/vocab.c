/* Binding a grammar to a vocabulary: a copy of every token's bytes and a
 * trie over them, so the mask walk shares the work of common prefixes and
 * drops whole subtrees the grammar rejects at their first byte. */
#include "grammar/grammar.h"

#include <stdlib.h>

static int by_bytes(const void *a, const void *b, void *ctx) {
    const llmi_grammar *g = ctx;
    llm_token x = *(const llm_token *)a, y = *(const llm_token *)b;
    uint32_t lx = g->tok_off[x + 1] - g->tok_off[x], ly = g->tok_off[y + 1] - g->tok_off[y];
    int c = memcmp(g->tok_bytes + g->tok_off[x], g->tok_bytes + g->tok_off[y], lx < ly ? lx : ly);
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static inline uint32_t tlen(const llmi_grammar *g, llm_token t) {
    return g->tok_off[t + 1] - g->tok_off[t];
}
static inline uint8_t tbyte(const llmi_grammar *g, llm_token t, uint32_t i) {
    return (uint8_t)g->tok_bytes[g->tok_off[t] + i];
}

/* Fills node `node` from the sorted tokens [lo, hi), which share their
 * first `depth` bytes; children get consecutive slots. */
static void build(llmi_grammar *g, uint32_t node, uint32_t lo, uint32_t hi, uint32_t depth) {
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

llm_status llmi_grammar_bind_vocab(llmi_grammar *g, const llmi_tokenizer *tok) {
    uint32_t V = llmi_tokenizer_n_vocab(tok);
    if (g->tok_off) {
        if (g->n_vocab == V)
            return LLM_OK;
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "grammar: already bound to a vocabulary of %u tokens, not %u", g->n_vocab,
                          V);
    }
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
    if (!g->cache)
        LLMI_TRY(llmi_gcache_create(&g->cache));
    if (total >= UINT32_MAX - 1)
        return llmi_error(LLM_ERR_LIMIT, "grammar: vocabulary text too large");
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
        g->tok_off = NULL;
        g->tok_bytes = NULL;
        g->eog = NULL;
        g->trie_tokens = NULL;
        g->trie = NULL;
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
    llmi_error_clear();
    return LLM_OK;
}
