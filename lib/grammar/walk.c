/* The memoized trie walk (see grammar.h): a lazily built automaton whose
 * states are the distinct stack sets the walk meets, each with a table of
 * its successors by byte. A step costs a table lookup once its set has
 * been seen, so a cold mask costs about one lookup per trie node visited
 * instead of a stack advance per node. Two sets holding the same stacks
 * (as contents, in any order) with the same pending UTF-8 bytes accept
 * exactly the same continuations, so merging them leaves the masks as the
 * plain walk computes them. */
#include "grammar/grammar.h"

/* Distinct sets kept per walk (each has a 1 KB successor table). */
enum { MAX_STATES = 4096, UNKNOWN = -1, REJECT = -2 };

typedef struct wstate {
    llmi_gset set;
    uint64_t hash;
    bool cut; /* a stack reached the cut (only in cut walks) */
    int32_t next[256];
} wstate;

struct llmi_gwalk {
    wstate *st;
    uint32_t n, cap;
    int32_t *slots; /* open addressing by hash: state index or -1 */
    uint32_t n_slots;
    bool full;
};

llm_status llmi_gwalk_create(llmi_gwalk **out) {
    *out = llmi_calloc(1, sizeof **out);
    return *out ? LLM_OK : llmi_oom("grammar mask walk");
}

void llmi_gwalk_free(llmi_gwalk *w) {
    if (!w)
        return;
    llmi_free(w->st);
    llmi_free(w->slots);
    llmi_free(w);
}

static uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

static uint64_t top_hash(const llmi_gstate *s, uint32_t t) {
    if (t == LLMI_GDONE)
        return 0x6a09e667f3bcc908ull;
    if (t == LLMI_GCUT)
        return 0xbb67ae8584caa73bull;
    return s->nodes[t].hash;
}

/* Independent of the order of the stacks within the set. */
static uint64_t set_hash(const llmi_gstate *s, llmi_gset x) {
    uint64_t h = mix64(((uint64_t)x.n << 40) ^ ((uint64_t)x.u.acc << 8) ^
                       ((uint64_t)x.u.need << 4) ^ x.u.total);
    for (uint32_t i = 0; i < x.n; i++)
        h += mix64(top_hash(s, s->tops[x.first + i]));
    return h;
}

static bool same_stack(const llmi_gstate *s, uint32_t a, uint32_t b) {
    while (a != b) {
        if (a >= LLMI_GCUT || b >= LLMI_GCUT)
            return false;
        const llmi_gnode *x = &s->nodes[a], *y = &s->nodes[b];
        if (x->pos != y->pos || x->hash != y->hash)
            return false;
        a = x->parent;
        b = y->parent;
    }
    return true;
}

/* Sets hold no duplicate stacks (add_top), so equal sizes and inclusion
 * make them equal. */
static bool same_set(const llmi_gstate *s, llmi_gset a, llmi_gset b) {
    if (a.n != b.n || a.u.acc != b.u.acc || a.u.need != b.u.need || a.u.total != b.u.total)
        return false;
    for (uint32_t i = 0; i < a.n; i++) {
        uint32_t t = s->tops[a.first + i];
        bool found = false;
        for (uint32_t j = 0; j < b.n && !found; j++)
            found = same_stack(s, t, s->tops[b.first + j]);
        if (!found)
            return false;
    }
    return true;
}

static llm_status grow_slots(llmi_gwalk *w) {
    uint32_t n = w->n_slots ? 2 * w->n_slots : 64;
    int32_t *slots = llmi_malloc((size_t)n * sizeof *slots);
    if (!slots)
        return llmi_oom("grammar mask walk");
    memset(slots, 0xFF, (size_t)n * sizeof *slots);
    for (uint32_t i = 0; i < w->n; i++) {
        uint32_t k = (uint32_t)w->st[i].hash & (n - 1);
        while (slots[k] >= 0)
            k = (k + 1) & (n - 1);
        slots[k] = (int32_t)i;
    }
    llmi_free(w->slots);
    w->slots = slots;
    w->n_slots = n;
    return LLM_OK;
}

/* The state of set x: an existing one or a new one keeping x. With
 * `appended`, x lies at the arena's end, after the marks, and the arena is
 * truncated back to the marks (a hit) or to the marks and x (new); else x
 * stays where it is (a walk's first set, e.g. the live one) and the arena
 * is left alone. *id is -1 when the walk holds MAX_STATES already. */
static llm_status intern(llmi_gwalk *w, llmi_gstate *s, llmi_gset x, bool appended,
                         uint32_t mark_nodes, uint32_t mark_tops, bool cut_walk, int32_t *id) {
    uint64_t h = set_hash(s, x);
    if (w->n_slots) {
        for (uint32_t k = (uint32_t)h & (w->n_slots - 1); w->slots[k] >= 0;
             k = (k + 1) & (w->n_slots - 1)) {
            const wstate *o = &w->st[w->slots[k]];
            if (o->hash == h && same_set(s, o->set, x)) {
                if (appended) {
                    s->n_nodes = mark_nodes;
                    s->n_tops = mark_tops;
                }
                *id = w->slots[k];
                return LLM_OK;
            }
        }
    }
    if (w->n == MAX_STATES) {
        w->full = true;
        *id = -1;
        return LLM_OK;
    }
    if (w->n == w->cap) {
        uint32_t c = w->cap ? 2 * w->cap : 16;
        wstate *q = llmi_realloc(w->st, (size_t)c * sizeof *q);
        if (!q)
            return llmi_oom("grammar mask walk");
        w->st = q;
        w->cap = c;
    }
    if (2 * (w->n + 1) > w->n_slots)
        LLMI_TRY(grow_slots(w));
    if (appended) { /* only x itself is kept of what came after mark_tops */
        memmove(s->tops + mark_tops, s->tops + x.first, (size_t)x.n * sizeof *s->tops);
        x.first = mark_tops;
        s->n_tops = mark_tops + x.n;
    }
    wstate *st = &w->st[w->n];
    st->set = x;
    st->hash = h;
    st->cut = false;
    for (uint32_t i = 0; cut_walk && i < x.n; i++)
        st->cut |= s->tops[x.first + i] == LLMI_GCUT;
    memset(st->next, 0xFF, sizeof st->next); /* UNKNOWN */
    uint32_t k = (uint32_t)h & (w->n_slots - 1);
    while (w->slots[k] >= 0)
        k = (k + 1) & (w->n_slots - 1);
    w->slots[k] = (int32_t)w->n;
    *id = (int32_t)w->n++;
    return LLM_OK;
}

static llm_status push_uncertain(llmi_gcache_entry *e, uint32_t *cap, uint32_t node) {
    if (e->n_uncertain == *cap) {
        uint32_t c = *cap ? 2 * *cap : 64;
        uint32_t *q = llmi_realloc(e->uncertain, (size_t)c * sizeof *q);
        if (!q)
            return llmi_oom("grammar mask cache");
        e->uncertain = q;
        *cap = c;
    }
    e->uncertain[e->n_uncertain++] = node;
    return LLM_OK;
}

/* The successor of state `from` by byte b: a state index or REJECT. */
static llm_status successor(llmi_gwalk *w, llmi_gstate *s, int32_t from, uint8_t b, bool cut_walk,
                            int32_t *out) {
    int32_t nx = w->st[from].next[b];
    if (nx != UNKNOWN) {
        *out = nx;
        return LLM_OK;
    }
    uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops;
    llmi_gset res;
    LLMI_TRY(llmi_gstate_step_byte(s, w->st[from].set, b, &res));
    if (res.n == 0) {
        s->n_nodes = mark_nodes;
        s->n_tops = mark_tops;
        nx = REJECT;
    } else {
        LLMI_TRY(intern(w, s, res, true, mark_nodes, mark_tops, cut_walk, &nx));
        if (nx < 0)
            return LLM_OK; /* w->full */
    }
    w->st[from].next[b] = nx;
    *out = nx;
    return LLM_OK;
}

static llm_status run(llmi_gwalk *w, llmi_gstate *s, uint32_t node, int32_t from, uint32_t *bits,
                      llmi_gcache_entry *e, uint32_t *cap) {
    const llmi_grammar *g = s->g;
    const llmi_gtrie_node *nd = &g->trie[node];
    for (uint32_t c = 0; c < nd->n_children; c++) {
        uint32_t child = nd->first_child + c;
        const llmi_gtrie_node *ch = &g->trie[child];
        int32_t nx = REJECT;
        LLMI_TRY(successor(w, s, from, ch->byte, e != NULL, &nx));
        if (w->full)
            return LLM_OK;
        if (nx == REJECT)
            continue;
        if (w->st[nx].cut) {
            LLMI_TRY(push_uncertain(e, cap, child));
            continue;
        }
        for (uint32_t k = 0; k < ch->n_tokens; k++) {
            llm_token t = g->trie_tokens[ch->first_token + k];
            bits[t >> 5] |= 1u << (t & 31);
        }
        if (ch->n_children) {
            LLMI_TRY(run(w, s, child, nx, bits, e, cap));
            if (w->full)
                return LLM_OK;
        }
    }
    return LLM_OK;
}

llm_status llmi_gwalk_run(llmi_gwalk *w, llmi_gstate *s, uint32_t node, llmi_gset in,
                          uint32_t *mask, llmi_gcache_entry *e, uint32_t *cap, bool *gave_up) {
    *gave_up = false;
    if (w->full) {
        *gave_up = true;
        return LLM_OK;
    }
    int32_t from;
    LLMI_TRY(intern(w, s, in, false, 0, 0, e != NULL, &from));
    if (from >= 0)
        LLMI_TRY(run(w, s, node, from, e ? e->accepted : mask, e, cap));
    *gave_up = w->full;
    return LLM_OK;
}
