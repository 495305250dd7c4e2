/* The allowed-token mask: the position masks of the stacks' top frames
 * (posmask.c) and a walk of the vocabulary trie with the state's stack sets
 * (match.c), memoized per stack set (walk.c), over what those leave open.
 * Kept apart from the matcher so that the files use each other in one
 * direction: mask.c -> posmask.c -> walk.c -> match.c. */
#include "grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

typedef llmi_gset gset;

static inline void set_bit(uint32_t *mask, llm_token t) { mask[t >> 5] |= 1u << (t & 31); }

static llm_status walk(llmi_gstate *s, uint32_t node, gset in, uint32_t *mask) {
    return llmi_gwalk_plain(s, node, in, mask, NULL, NULL);
}

/* The mask from the live set by the memoized walk (the plain one when it
 * gives up). */
static llm_status fill_walked(llmi_gstate *s, uint32_t *mask) {
    const gset lv = llmi_gstate_live(s); /* s->n_tops grows below */
    llmi_gwalk *w = NULL;
    LLMI_TRY(llmi_gwalk_create(&w));
    bool gave_up = false;
    llm_status st = llmi_gwalk_run(w, s, 0, lv, mask, NULL, NULL, &gave_up);
    llmi_gwalk_free(w);
    if (st == LLM_OK && gave_up)
        st = walk(s, 0, lv, mask);
    return st;
}

#ifdef LLMI_TEST_HOOKS
static uint64_t g_misses;
uint64_t llmi_gpos_test_misses(void) { return __atomic_load_n(&g_misses, __ATOMIC_RELAXED); }
#endif

/* The mask from the position masks of the live set's stacks: their
 * accepted tokens, then their uncertain subtrees walked with the real
 * stacks. false in *found: a stack's chain is not in the table (never for
 * stacks the grammar makes; the caller walks from scratch). */
static llm_status fill_positions(llmi_gstate *s, uint32_t *mask, bool *found) {
    const llmi_grammar *g = s->g;
    const gset lv = llmi_gstate_live(s);
    size_t words = (g->n_vocab + 31) / 32;
    uint32_t depth = llmi_gpostable_depth(g->posmasks);
    const llmi_gposmask *seen[8];
    uint32_t n_seen = 0;
    llmi_gwalk *w = NULL; /* one memoized walk for every stack's subtrees */
    bool gave_up = false;
    llm_status st = LLM_OK;
    *found = true;
    for (uint32_t i = 0; i < lv.n && st == LLM_OK && !gave_up; i++) {
        uint32_t t = s->tops[lv.first + i], key[LLMI_GPOS_KEY], d = 0;
        if (t >= LLMI_GCUT)
            continue; /* an emptied stack: only end-of-generation */
        for (uint32_t j = 1; j < LLMI_GPOS_KEY; j++)
            key[j] = UINT32_MAX;
        while (t < LLMI_GCUT && d < depth) {
            key[1 + d++] = s->nodes[t].pos;
            t = s->nodes[t].parent;
        }
        key[0] = d | (t == LLMI_GNONE ? 0x80000000u : 0);
        const llmi_gposmask *m = llmi_gpostable_find(g->posmasks, key);
        if (!m) {
#ifdef LLMI_TEST_HOOKS
            __atomic_add_fetch(&g_misses, 1, __ATOMIC_RELAXED);
#endif
            *found = false;
            break;
        }
        bool dup = false; /* stacks alike in their top frames */
        for (uint32_t j = 0; j < n_seen && !dup; j++)
            dup = seen[j] == m;
        if (dup)
            continue;
        if (n_seen < 8)
            seen[n_seen++] = m;
        if (m->bits)
            for (size_t k = 0; k < words; k++)
                mask[k] |= m->bits[k];
        for (uint32_t k = 0; k < m->n_list; k++)
            set_bit(mask, m->list[k]);
        if (!m->n_uncertain)
            continue;
        if (!w)
            st = llmi_gwalk_create(&w);
        if (st == LLM_OK)
            st = llmi_gwalk_subtrees(w, s, lv, m->uncertain, m->n_uncertain, mask, &gave_up);
    }
    llmi_gwalk_free(w);
    if (st == LLM_OK && *found && gave_up) /* the bits set so far are right; the rest plainly */
        st = walk(s, 0, lv, mask);
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
    else {
        bool found = false;
        st = g->posmasks && s->utf8.need == 0 ? fill_positions(s, mask, &found) : LLM_OK;
        if (st == LLM_OK && !found) {
            s->n_nodes = mark_nodes;
            s->n_tops = mark_tops;
            memset(mask, 0, (size_t)((g->n_vocab + 31) / 32) * sizeof *mask);
            st = fill_walked(s, mask);
        }
    }
    s->n_nodes = mark_nodes;
    s->n_tops = mark_tops;
    if (st == LLM_OK && llmi_gstate_can_end(s))
        for (uint32_t i = 0; i < g->n_eog; i++)
            set_bit(mask, g->eog[i]);
    return st;
}
