/* Position masks, computed once when a grammar is bound to a vocabulary
 * (see grammar.h, "position masks").
 *
 * A stack's top frames decide most of its mask: inside a string, the
 * character rule, the string's loop and its closing quote accept or
 * reject nearly every token before the frames below matter. Which frames
 * can lie below a rule's frame is known from the grammar alone: the
 * element after each reference to the rule (or, for a reference that
 * ends its alternative, whatever lies below the referencing rule). So
 * every chain of the top LLMI_GPOS_DEPTH positions a stack can have is
 * enumerated here, and for each the walk starts from that chain with "the
 * rest unknown" (a cut) below it and sorts the vocabulary three ways:
 * accepted, rejected, and the trie subtrees whose paths reach the cut,
 * which the real stacks decide when the mask is made. A live set's mask
 * is then the union of its stacks' accepted tokens and a walk of their
 * uncertain subtrees only (tokens that close the enclosing value).
 *
 * One memoized walk serves every chain (chains meet the same sets: the
 * inside of a string, whitespace, digits), so the table costs about as
 * much as a few masks computed from scratch, not one per chain. */
#include "grammar/grammar.h"

#include <stdlib.h>

#ifdef LLMI_TEST_HOOKS
static uint32_t g_test_chains, g_test_callers;
void llmi_gpos_test_limits(uint32_t max_chains, uint32_t max_callers) {
    g_test_chains = max_chains;
    g_test_callers = max_callers;
}
static uint32_t max_chains(void) { return g_test_chains ? g_test_chains : LLMI_GPOS_MAX_CHAINS; }
static uint32_t max_callers(void) {
    return g_test_callers ? g_test_callers : LLMI_GPOS_MAX_CALLERS;
}
#else
static uint32_t max_chains(void) { return LLMI_GPOS_MAX_CHAINS; }
static uint32_t max_callers(void) { return LLMI_GPOS_MAX_CALLERS; }
#endif

/* The chain's accepted tokens and uncertain subtrees into e (cleared
 * first); the chain's nodes are already in the arena, its set is `in`.
 * *w is the shared walk, replaced by a fresh one when full. */
static llm_status classify(llmi_gstate *s, llmi_gwalk **w, llmi_gset in, llmi_gcut *e,
                           uint32_t *cap, size_t words) {
    for (int attempt = 0; attempt < 2; attempt++) {
        memset(e->accepted, 0, (words + 1) * sizeof *e->accepted);
        e->n_uncertain = 0;
        bool gave_up = false;
        LLMI_TRY(llmi_gwalk_run(*w, s, 0, in, NULL, e, cap, &gave_up));
        if (!gave_up)
            return LLM_OK;
        /* The shared walk is full: a fresh one, then the plain walk. */
        llmi_gwalk_free(*w);
        *w = NULL;
        LLMI_TRY(llmi_gwalk_create(w));
    }
    memset(e->accepted, 0, (words + 1) * sizeof *e->accepted);
    e->n_uncertain = 0;
    uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops;
    llm_status st = llmi_gwalk_plain(s, 0, in, NULL, e, cap);
    s->n_nodes = mark_nodes;
    s->n_tops = mark_tops;
    return st;
}

/* Stores e's result in m: the accepted tokens as a list when that is
 * smaller than the bitset. */
static llm_status store(llmi_gpostable *t, const llmi_gcut *e, size_t words, llmi_gposmask *m) {
    uint32_t n = 0;
    for (size_t i = 0; i < words; i++)
        n += (uint32_t)__builtin_popcount(e->accepted[i]);
    if (n < words) {
        if (n) {
            m->list = llmi_malloc((size_t)n * sizeof *m->list);
            if (!m->list)
                return llmi_oom("grammar position masks");
        }
        for (size_t i = 0; i < words; i++)
            for (uint32_t b = e->accepted[i]; b; b &= b - 1)
                m->list[m->n_list++] = (llm_token)(i * 32 + (uint32_t)__builtin_ctz(b));
    } else {
        LLMI_TRY(llmi_gpostable_bits(t, e->accepted, words, &m->bits));
    }
    if (e->n_uncertain) {
        m->uncertain = llmi_malloc((size_t)e->n_uncertain * sizeof *m->uncertain);
        if (!m->uncertain)
            return llmi_oom("grammar position masks");
        memcpy(m->uncertain, e->uncertain, (size_t)e->n_uncertain * sizeof *m->uncertain);
        m->n_uncertain = e->n_uncertain;
    }
    return LLM_OK;
}

/* ---- which frames can lie below which ---- */

typedef struct u32list {
    uint32_t *v;
    uint32_t n, cap;
} u32list;

static llm_status list_add(u32list *l, uint32_t x, bool *added) {
    for (uint32_t i = 0; i < l->n; i++)
        if (l->v[i] == x)
            return LLM_OK;
    if (l->n >= max_callers())
        return llmi_error(LLM_ERR_LIMIT, "grammar: a rule referenced from too many places");
    if (!llmi_ggrow32(&l->v, &l->cap, l->n + 1))
        return llmi_oom("grammar position masks");
    l->v[l->n++] = x;
    if (added)
        *added = true;
    return LLM_OK;
}

/* Per rule: the positions a frame of it returns to (`below`), whether it
 * can be the bottom frame (`ends`), and each element's rule. */
typedef struct frames {
    uint32_t n_rules;
    uint32_t *rule_of; /* [n_el] */
    u32list *below;    /* [n_rules] */
    u32list *tail;     /* [n_rules]: rules referencing it at an alternative's end */
    bool *ends;        /* [n_rules] */
    bool overflow;     /* the lists hit LLMI_GPOS_MAX_CALLERS: depth 1 only, every
                          position taken both ways (may end, cut) */
} frames;

static void frames_free(frames *f) {
    for (uint32_t r = 0; r < f->n_rules; r++) {
        if (f->below)
            llmi_free(f->below[r].v);
        if (f->tail)
            llmi_free(f->tail[r].v);
    }
    llmi_free(f->rule_of);
    llmi_free(f->below);
    llmi_free(f->tail);
    llmi_free(f->ends);
}

static llm_status frames_build(const llmi_grammar *g, frames *f) {
    memset(f, 0, sizeof *f);
    f->n_rules = g->n_rules;
    size_t nr = g->n_rules ? g->n_rules : 1;
    f->rule_of = llmi_malloc((g->n_el ? g->n_el : 1) * sizeof *f->rule_of);
    f->below = llmi_calloc(nr, sizeof *f->below);
    f->tail = llmi_calloc(nr, sizeof *f->tail);
    f->ends = llmi_calloc(nr, sizeof *f->ends);
    if (!f->rule_of || !f->below || !f->tail || !f->ends)
        return llmi_oom("grammar position masks");
    for (uint32_t r = 0; r < g->n_rules; r++)
        for (uint32_t a = 0; a < g->rules[r].n_alts; a++)
            for (uint32_t q = g->alts[g->rules[r].first_alt + a];; q++) {
                f->rule_of[q] = r;
                if (g->el[q].kind == LLMI_GEL_END)
                    break;
            }
    f->ends[g->root] = true;
    for (uint32_t q = 0; q < g->n_el; q++) {
        if (g->el[q].kind != LLMI_GEL_RULE)
            continue;
        uint32_t callee = g->el[q].arg;
        if (g->el[q + 1].kind != LLMI_GEL_END)
            LLMI_TRY(list_add(&f->below[callee], q + 1, NULL));
        else
            LLMI_TRY(list_add(&f->tail[callee], f->rule_of[q], NULL));
    }
    /* A reference at an alternative's end reuses the referencing frame's
     * parent: the callee inherits what lies below the caller. */
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < g->n_rules; r++)
            for (uint32_t i = 0; i < f->tail[r].n; i++) {
                uint32_t from = f->tail[r].v[i];
                if (f->ends[from] && !f->ends[r])
                    f->ends[r] = changed = true;
                for (uint32_t j = 0; j < f->below[from].n; j++)
                    LLMI_TRY(list_add(&f->below[r], f->below[from].v[j], &changed));
            }
    }
    return LLM_OK;
}

/* The building context. */
typedef struct builder {
    const llmi_grammar *g;
    llmi_gpostable *t;
    frames f;
    llmi_gstate *s;
    llmi_gwalk *w;
    llmi_gcut e;
    uint32_t cap;
    size_t words;
    uint32_t chain[LLMI_GPOS_DEPTH];
} builder;

/* Classifies the chain b->chain[0, d) with the bottom `ends` (nothing
 * below: the grammar may end there) or cut, and stores it. */
static llm_status add_chain(builder *b, uint32_t d, bool ends) {
    uint32_t key[LLMI_GPOS_KEY];
    key[0] = d | (ends ? 0x80000000u : 0);
    for (uint32_t i = 0; i < LLMI_GPOS_DEPTH; i++)
        key[1 + i] = i < d ? b->chain[i] : UINT32_MAX;
    llmi_gposmask *m = NULL;
    LLMI_TRY(llmi_gpostable_insert(b->t, key, max_chains(), &m));
    if (!m)
        return LLM_OK; /* two routes to one chain */
    uint32_t node = ends ? LLMI_GNONE : LLMI_GCUT;
    for (uint32_t j = d; j-- > 0;)
        LLMI_TRY(llmi_gstate_new_node(b->s, b->chain[j], node, &node));
    llmi_gset in = {b->s->n_tops, 0, {0, 0, 0}};
    LLMI_TRY(llmi_gstate_add_top(b->s, in.first, node));
    in.n = 1;
    LLMI_TRY(classify(b->s, &b->w, in, &b->e, &b->cap, b->words));
    return store(b->t, &b->e, b->words, m);
}

/* Every chain that extends b->chain[0, d) (the frame at chain[d - 1]
 * belongs to rule r) up to the table's depth. */
static llm_status chains(builder *b, uint32_t d, uint32_t r) {
    if (b->f.overflow) { /* no lists: each position both ways */
        if (llmi_gpostable_depth(b->t) > 1)
            return llmi_error(LLM_ERR_LIMIT, "grammar: a rule referenced from too many places");
        LLMI_TRY(add_chain(b, 1, true));
        return add_chain(b, 1, false);
    }
    if (b->f.ends[r])
        LLMI_TRY(add_chain(b, d, true));
    if (d == llmi_gpostable_depth(b->t)) {
        if (b->f.below[r].n)
            LLMI_TRY(add_chain(b, d, false));
        return LLM_OK;
    }
    for (uint32_t i = 0; i < b->f.below[r].n; i++) {
        uint32_t c = b->f.below[r].v[i];
        b->chain[d] = c;
        LLMI_TRY(chains(b, d + 1, b->f.rule_of[c]));
    }
    return LLM_OK;
}

static llm_status build_depth(builder *b, uint32_t depth) {
    const llmi_grammar *g = b->g;
    LLMI_TRY(llmi_gpostable_create(depth, &b->t));
    for (uint32_t p = 0; p < g->n_el; p++) {
        if (g->el[p].kind != LLMI_GEL_CHAR)
            continue;
        b->chain[0] = p;
        LLMI_TRY(chains(b, 1, b->f.rule_of[p]));
    }
    return LLM_OK;
}

llm_status llmi_grammar_build_posmasks(llmi_grammar *g) {
    if (g->posmasks || !g->trie)
        return LLM_OK;
    builder b = {.g = g, .words = (g->n_vocab + 31) / 32};
    b.e.accepted = llmi_calloc(b.words + 1, sizeof *b.e.accepted);
    llm_status st = b.e.accepted ? LLM_OK : llmi_oom("grammar position masks");
    if (st == LLM_OK)
        st = frames_build(g, &b.f);
    if (st == LLM_ERR_LIMIT) { /* only single positions: their bottoms need no lists */
        st = LLM_OK;
        b.f.overflow = true;
    }
    if (st == LLM_OK)
        st = llmi_gstate_create(g, &b.s);
    if (st == LLM_OK)
        st = llmi_gwalk_create(&b.w);
    /* Deeper chains leave fewer uncertain tokens; a grammar with too many
     * of them gets shallower ones. */
    for (uint32_t depth = LLMI_GPOS_DEPTH; st == LLM_OK; depth--) {
        st = build_depth(&b, depth);
        if (st != LLM_ERR_LIMIT)
            break;
        llmi_gpostable_free(b.t);
        b.t = NULL;
        st = depth > 1 ? LLM_OK : LLM_ERR_LIMIT;
        if (depth == 1)
            break;
    }
    /* Too large a grammar even for single positions: masks are walked
     * from scratch (slower, the same tokens). */
    if (st == LLM_ERR_LIMIT) {
        llmi_error_clear();
        st = LLM_OK;
    }
    frames_free(&b.f);
    llmi_gwalk_free(b.w);
    llmi_gstate_free(b.s);
    llmi_free(b.e.accepted);
    llmi_free(b.e.uncertain);
    if (st != LLM_OK) {
        llmi_gpostable_free(b.t);
        return st;
    }
    g->posmasks = b.t;
    return LLM_OK;
}

llm_status llmi_grammar_bind_vocab(llmi_grammar *g, const llmi_tokenizer *tok) {
    LLMI_TRY(llmi_grammar_attach_vocab(g, tok));
    return llmi_grammar_build_posmasks(g);
}

llm_status llmi_grammar_bind_model(llmi_grammar *g, const llm_model *m) {
    LLMI_TRY(llmi_grammar_attach_model(g, m));
    return llmi_grammar_build_posmasks(g);
}
