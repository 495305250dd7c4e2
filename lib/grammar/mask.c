/* The allowed-token mask: a walk of the vocabulary trie with the state's
 * stack sets (match.c), memoized per stack set (walk.c) and cached per
 * grammar under the stacks' top positions (cache.c). Kept apart from the
 * matcher so that the matcher, the walk and the mask use each other in one
 * direction: mask.c -> walk.c -> match.c. */
#include "grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

typedef llmi_gset gset;

static inline void set_bit(uint32_t *mask, llm_token t) { mask[t >> 5] |= 1u << (t & 31); }

/* Depth-first over the trie below `node`, with `in` the set after its bytes. */
static llm_status walk(llmi_gstate *s, uint32_t node, gset in, uint32_t *mask) {
    const llmi_grammar *g = s->g;
    const llmi_gtrie_node *nd = &g->trie[node];
    for (uint32_t c = 0; c < nd->n_children; c++) {
        uint32_t child = nd->first_child + c;
        const llmi_gtrie_node *ch = &g->trie[child];
        uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops;
        gset out;
        LLMI_TRY(llmi_gstate_step_byte(s, in, ch->byte, &out));
        if (out.n) {
            for (uint32_t k = 0; k < ch->n_tokens; k++)
                set_bit(mask, g->trie_tokens[ch->first_token + k]);
            if (ch->n_children)
                LLMI_TRY(walk(s, child, out, mask));
        }
        s->n_nodes = mark_nodes;
        s->n_tops = mark_tops;
    }
    return LLM_OK;
}

/* ---- the cached mask (see grammar.h) ---- */

enum { SIG = 1 + LLMI_GCACHE_DEPTH }; /* words per stack in a key */

static int cmp_sig(const void *a, const void *b) { return memcmp(a, b, SIG * sizeof(uint32_t)); }

/* The key of the live set: per stack, its depth (with bit 31 set when the
 * chain ends within it) and its top positions; sorted, duplicates dropped. */
static llm_status make_key(const llmi_gstate *s, uint32_t **out, uint32_t *n_out, uint64_t *hash) {
    uint32_t *k = llmi_malloc((size_t)(s->n_tops ? s->n_tops : 1) * SIG * sizeof *k);
    if (!k)
        return llmi_oom("grammar mask key");
    for (uint32_t i = 0; i < s->n_tops; i++) {
        uint32_t *r = k + (size_t)i * SIG, t = s->tops[i], d = 0;
        for (uint32_t j = 1; j < SIG; j++)
            r[j] = UINT32_MAX;
        while (t < LLMI_GCUT && d < LLMI_GCACHE_DEPTH) {
            r[1 + d++] = s->nodes[t].pos;
            t = s->nodes[t].parent;
        }
        r[0] = d | (t == LLMI_GNONE || s->tops[i] == LLMI_GDONE ? 0x80000000u : 0);
    }
    qsort(k, s->n_tops, SIG * sizeof *k, cmp_sig);
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_tops; i++)
        if (n == 0 || memcmp(k + (size_t)(n - 1) * SIG, k + (size_t)i * SIG, SIG * sizeof *k)) {
            memmove(k + (size_t)n * SIG, k + (size_t)i * SIG, SIG * sizeof *k);
            n++;
        }
    uint64_t h = 0x84222325cbf29ce4ull;
    for (uint32_t i = 0; i < n * SIG; i++)
        h = llmi_gmix(h, k[i]);
    *out = k;
    *n_out = n * SIG;
    *hash = h;
    return LLM_OK;
}

static llm_status push_uncertain(llmi_gcache_entry *e, uint32_t *cap, uint32_t node) {
    if (!llmi_ggrow32(&e->uncertain, cap, e->n_uncertain + 1))
        return llmi_oom("grammar mask cache");
    e->uncertain[e->n_uncertain++] = node;
    return LLM_OK;
}

/* The walk over stacks cut below their top frames: subtrees where a path
 * reaches the cut are recorded as uncertain and not entered. */
static llm_status walk_cut(llmi_gstate *s, uint32_t node, gset in, llmi_gcache_entry *e,
                           uint32_t *cap) {
    const llmi_grammar *g = s->g;
    const llmi_gtrie_node *nd = &g->trie[node];
    for (uint32_t c = 0; c < nd->n_children; c++) {
        uint32_t child = nd->first_child + c;
        const llmi_gtrie_node *ch = &g->trie[child];
        uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops;
        gset out;
        llm_status st = llmi_gstate_step_byte(s, in, ch->byte, &out);
        bool cut = false;
        for (uint32_t i = 0; st == LLM_OK && i < out.n; i++)
            cut |= s->tops[out.first + i] == LLMI_GCUT;
        if (st == LLM_OK && cut)
            st = push_uncertain(e, cap, child);
        else if (st == LLM_OK && out.n) {
            for (uint32_t k = 0; k < ch->n_tokens; k++)
                set_bit(e->accepted, g->trie_tokens[ch->first_token + k]);
            if (ch->n_children)
                st = walk_cut(s, child, out, e, cap);
        }
        s->n_nodes = mark_nodes;
        s->n_tops = mark_tops;
        if (st != LLM_OK)
            return st;
    }
    return LLM_OK;
}

/* Computes the entry of a key (made by make_key from the live set). */
static llm_status compute_entry(llmi_gstate *s, llmi_gcache_entry *e) {
    const llmi_grammar *g = s->g;
    e->accepted = llmi_calloc((g->n_vocab + 31) / 32 + 1, sizeof *e->accepted);
    if (!e->accepted)
        return llmi_oom("grammar mask cache");
    uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops, cap = 0;
    gset cs = {s->n_tops, 0, {0, 0, 0}};
    llm_status st = LLM_OK;
    for (uint32_t i = 0; i < e->n_key && st == LLM_OK; i += SIG) {
        const uint32_t *r = e->key + i;
        uint32_t d = r[0] & 0x7FFFFFFFu, t = r[0] & 0x80000000u ? LLMI_GNONE : LLMI_GCUT;
        if (d == 0) { /* an emptied stack: nothing to advance */
            st = llmi_gstate_add_top(s, cs.first, LLMI_GDONE);
            continue;
        }
        for (uint32_t j = d; j-- > 0 && st == LLM_OK;)
            st = llmi_gstate_new_node(s, r[1 + j], t, &t);
        if (st == LLM_OK)
            st = llmi_gstate_add_top(s, cs.first, t);
    }
    cs.n = s->n_tops - cs.first;
    llmi_gwalk *w = NULL;
    if (st == LLM_OK)
        st = llmi_gwalk_create(&w);
    uint32_t walk_nodes = s->n_nodes, walk_tops = s->n_tops;
    bool gave_up = false;
    if (st == LLM_OK)
        st = llmi_gwalk_run(w, s, 0, cs, NULL, e, &cap, &gave_up);
    llmi_gwalk_free(w);
    if (st == LLM_OK && gave_up) { /* too many distinct sets: the plain cut walk */
        s->n_nodes = walk_nodes;
        s->n_tops = walk_tops;
        memset(e->accepted, 0, ((g->n_vocab + 31) / 32 + 1) * sizeof *e->accepted);
        e->n_uncertain = 0;
        st = walk_cut(s, 0, cs, e, &cap);
    }
    s->n_nodes = mark_nodes;
    s->n_tops = mark_tops;
    return st;
}

/* The mask from a cache entry: its accepted tokens, then the uncertain
 * subtrees walked with the real stacks. */
static llm_status mask_from_entry(llmi_gstate *s, const llmi_gcache_entry *e, uint32_t *mask) {
    const llmi_grammar *g = s->g;
    memcpy(mask, e->accepted, (size_t)((g->n_vocab + 31) / 32) * sizeof *mask);
    if (e->n_uncertain == 0)
        return LLM_OK;
    /* One memoized walk for all the subtrees: they mostly meet the same
     * sets. Its arena stays until the caller truncates it. */
    llmi_gwalk *w = NULL;
    LLMI_TRY(llmi_gwalk_create(&w));
    const gset lv = llmi_gstate_live(s); /* s->n_tops grows below */
    llm_status st = LLM_OK;
    for (uint32_t i = 0; i < e->n_uncertain && st == LLM_OK; i++) {
        const llmi_gtrie_node *nd = &g->trie[e->uncertain[i]];
        llm_token rep = g->trie_tokens[nd->first_token]; /* its bytes start with the prefix */
        gset set;
        st = llmi_gstate_run_bytes(s, lv, g->tok_bytes + g->tok_off[rep], nd->depth, &set);
        if (st != LLM_OK || !set.n)
            continue;
        for (uint32_t k = 0; k < nd->n_tokens; k++)
            set_bit(mask, g->trie_tokens[nd->first_token + k]);
        bool gave_up = false;
        if (nd->n_children)
            st = llmi_gwalk_run(w, s, e->uncertain[i], set, mask, NULL, NULL, &gave_up);
        if (st == LLM_OK && gave_up) /* the bits set so far are right; the rest plainly */
            st = walk(s, e->uncertain[i], set, mask);
    }
    llmi_gwalk_free(w);
    return st;
}

/* The mask from the live set by the memoized walk (the plain one when it
 * gives up). */
static llm_status fill_walked(llmi_gstate *s, uint32_t *mask) {
    llmi_gwalk *w = NULL;
    LLMI_TRY(llmi_gwalk_create(&w));
    bool gave_up = false;
    llm_status st = llmi_gwalk_run(w, s, 0, llmi_gstate_live(s), mask, NULL, NULL, &gave_up);
    llmi_gwalk_free(w);
    if (st == LLM_OK && gave_up)
        st = walk(s, 0, llmi_gstate_live(s), mask);
    return st;
}

static llm_status fill_cached(llmi_gstate *s, uint32_t *mask) {
    llmi_gcache *c = s->g->cache;
    llmi_gcache_entry e = {0};
    LLMI_TRY(make_key(s, &e.key, &e.n_key, &e.hash));
    const llmi_gcache_entry *hit = llmi_gcache_find(c, e.key, e.n_key, e.hash);
    llm_status st = LLM_OK;
    bool owned = true;
    if (!hit) {
        st = compute_entry(s, &e);
        if (st == LLM_OK)
            st = llmi_gcache_insert(c, &e, &hit, &owned);
    }
    if (st == LLM_OK)
        st = mask_from_entry(s, hit, mask);
    (void)owned; /* a stored entry left e empty; an unstored one is freed here */
    llmi_gcache_entry_free(&e);
    return st;
}

llm_status llmi_gstate_fill_mask(llmi_gstate *s, uint32_t *mask) {
    const llmi_grammar *g = s->g;
    if (!g->trie)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: no vocabulary bound");
    memset(mask, 0, (size_t)((g->n_vocab + 31) / 32) * sizeof *mask);
    if (s->finished)
        return LLM_OK;
    uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops;
    llm_status st;
    if (s->no_cache) /* the reference the tests compare with */
        st = walk(s, 0, llmi_gstate_live(s), mask);
    else if (g->cache && s->utf8.need == 0)
        st = fill_cached(s, mask);
    else
        st = fill_walked(s, mask);
    s->n_nodes = mark_nodes;
    s->n_tops = mark_tops;
    if (st == LLM_OK && llmi_gstate_can_end(s))
        for (uint32_t i = 0; i < g->n_eog; i++)
            set_bit(mask, g->eog[i]);
    return st;
}
