/* The memoized trie walk (see grammar.h): a lazily built automaton whose
 * states are the distinct stack sets the walk meets, each with a table of
 * its successors by byte. A step costs a table lookup once its set has
 * been seen, so a cold mask costs about one lookup per trie node visited
 * instead of a stack advance per node. Two sets holding the same stacks
 * (as contents, in any order) with the same pending UTF-8 bytes accept
 * exactly the same continuations, so merging them leaves the masks as the
 * plain walk computes them.
 *
 * A set whose successor is the same set T for every byte of some groups
 * (llmi_gbyte_group; for non-ASCII, every code point) accepts one more
 * character of those groups whatever it is; following T, and T's own
 * such successor, as many times as the subtree's tokens have characters
 * below a trie node tells whether all of them are accepted, and then they are
 * taken as a range without descending (inside a string, bounded or not,
 * nearly the whole vocabulary). When T is the set itself (a loop: inside
 * an unbounded string) one check covers any length. When every text
 * character loops at the root, the mask starts as the vocabulary's text
 * bitset and the walk skips the subtrees holding only text tokens. */
#include "grammar/grammar.h"

#include <stdlib.h>

/* Distinct sets kept per walk (each has a 1 KB successor table); the
 * fewest tokens of a subtree worth checking its set for loops. */
enum { MAX_STATES = 4096, UNKNOWN = -1, REJECT = -2, MIN_RUN = 16 };

typedef struct wstate {
    llmi_gset set;
    uint64_t hash;
    bool cut; /* a stack reached the cut (only in cut walks) */
    bool uniform_known;
    int32_t uniform_next; /* the common successor of uniform_groups */
    uint64_t uniform_groups;
    int32_t next[256];
} wstate;

#ifdef LLMI_TEST_HOOKS
static uint32_t g_test_max_states;
void llmi_gwalk_test_max_states(uint32_t n) { g_test_max_states = n; }
static uint32_t max_states(void) { return g_test_max_states ? g_test_max_states : MAX_STATES; }
#else
static uint32_t max_states(void) { return MAX_STATES; }
#endif

struct llmi_gwalk {
    wstate *st;
    uint32_t n, cap;
    int32_t *slots; /* open addressing by hash: state index or -1 */
    uint32_t n_slots;
    bool full;
    bool cut_walk;
    uint32_t text_taken; /* this run's bits hold every text token of at most
                            this many characters (UINT32_MAX: all) */
    /* One code point per run of non-ASCII code points that every class of
     * the grammar treats alike (NULL until needed). */
    uint32_t *reps;
    uint32_t n_reps;
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
    llmi_free(w->reps);
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

/* Sets hold no duplicate stacks (add_top), so equal sizes and inclusion
 * make them equal. */
static bool same_set(const llmi_gstate *s, llmi_gset a, llmi_gset b) {
    if (a.n != b.n || a.u.acc != b.u.acc || a.u.need != b.u.need || a.u.total != b.u.total)
        return false;
    for (uint32_t i = 0; i < a.n; i++) {
        uint32_t t = s->tops[a.first + i];
        bool found = false;
        for (uint32_t j = 0; j < b.n && !found; j++)
            found = llmi_gstate_same_stack(s, t, s->tops[b.first + j]);
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
    if (w->n == max_states()) {
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
    st->uniform_known = false;
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

static llm_status push_uncertain(llmi_gcut *e, uint32_t *cap, uint32_t node) {
    if (e->n_uncertain == *cap) {
        uint32_t c = *cap ? 2 * *cap : 64;
        uint32_t *q = llmi_realloc(e->uncertain, (size_t)c * sizeof *q);
        if (!q)
            return llmi_oom("grammar mask walk");
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

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Splits the non-surrogate code points from U+0080 up at every end of a
 * class range: within a piece, each class holds all or none. */
static llm_status make_reps(llmi_gwalk *w, const llmi_grammar *g) {
    uint32_t *b = llmi_malloc(((size_t)2 * g->n_ranges + 4) * sizeof *b);
    if (!b)
        return llmi_oom("grammar mask walk");
    uint32_t n = 0;
    b[n++] = 0x80;
    b[n++] = 0xD800;
    b[n++] = 0xE000;
    b[n++] = 0x110000;
    for (uint32_t i = 0; i < g->n_ranges; i++) {
        uint32_t lo = g->ranges[2 * i], end = g->ranges[2 * i + 1] + 1;
        if (lo > 0x80 && lo < 0x110000)
            b[n++] = lo;
        if (end > 0x80 && end < 0x110000)
            b[n++] = end;
    }
    qsort(b, n, sizeof *b, cmp_u32);
    uint32_t k = 0;
    for (uint32_t i = 0; i + 1 < n; i++)
        if (b[i] != b[i + 1] && (b[i] < 0xD800 || b[i] >= 0xE000))
            b[k++] = b[i];
    w->reps = b;
    w->n_reps = k;
    return LLM_OK;
}

static uint32_t utf8_encode(uint32_t cp, uint8_t *u) {
    if (cp < 0x800) {
        u[0] = (uint8_t)(0xC0 | (cp >> 6));
        u[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (uint8_t)(0xE0 | (cp >> 12));
        u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    u[0] = (uint8_t)(0xF0 | (cp >> 18));
    u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* The groups whose every member leads state id to one same set *next
 * (for NONASCII: every code point, encoded; a path ending inside a
 * character then keeps the stacks whose class holds a completion): the
 * set after 'a', else '0', else the first printable byte accepted.
 * Control bytes are not tried. The successors it computes stay
 * memoized. */
static llm_status uniform(llmi_gwalk *w, llmi_gstate *s, int32_t id, uint64_t *groups,
                          int32_t *next) {
    *groups = 0;
    *next = REJECT;
    if (w->st[id].uniform_known) {
        *groups = w->st[id].uniform_groups;
        *next = w->st[id].uniform_next;
        return LLM_OK;
    }
    uint64_t m = 0;
    int32_t to = REJECT;
    if (!w->st[id].cut && w->st[id].set.u.need == 0) {
        static const uint8_t first[2] = {'a', '0'};
        for (uint32_t i = 0; i < 2 && to == REJECT; i++)
            LLMI_TRY(successor(w, s, id, first[i], w->cut_walk, &to));
        for (uint32_t c = 0x20; c < 0x7F && to == REJECT && !w->full; c++)
            LLMI_TRY(successor(w, s, id, (uint8_t)c, w->cut_walk, &to));
        if (w->full)
            return LLM_OK;
    }
    if (to >= 0) {
        m = ((1ull << 36) - 1) | 1ull << LLMI_GGROUP_NONASCII;
        for (uint32_t c = 0x20; c < 0x7F; c++) {
            uint64_t bit = 1ull << llmi_gbyte_group((uint8_t)c);
            if (!(m & bit))
                continue;
            int32_t nx;
            LLMI_TRY(successor(w, s, id, (uint8_t)c, w->cut_walk, &nx));
            if (w->full)
                return LLM_OK;
            if (nx != to)
                m &= ~bit;
        }
        if (!w->reps)
            LLMI_TRY(make_reps(w, s->g));
        for (uint32_t r = 0; m >> LLMI_GGROUP_NONASCII & 1 && r < w->n_reps; r++) {
            uint8_t u[4];
            uint32_t n = utf8_encode(w->reps[r], u);
            int32_t at = id;
            for (uint32_t k = 0; k < n && at >= 0; k++) {
                LLMI_TRY(successor(w, s, at, u[k], w->cut_walk, &at));
                if (w->full)
                    return LLM_OK;
            }
            if (at != to)
                m &= ~(1ull << LLMI_GGROUP_NONASCII);
        }
    }
    w->st[id].uniform_known = true;
    w->st[id].uniform_groups = m;
    w->st[id].uniform_next = to;
    *groups = m;
    *next = to;
    return LLM_OK;
}

/* Whether from state id every path of at most len characters of groups
 * `need` is accepted (len 255: of any length, see llmi_gbelow_len). */
static llm_status accepts_runs(llmi_gwalk *w, llmi_gstate *s, int32_t id, uint64_t need,
                               uint32_t len, bool *out) {
    *out = false;
    for (uint32_t i = 0; i < len; i++) {
        uint64_t groups;
        int32_t next;
        LLMI_TRY(uniform(w, s, id, &groups, &next));
        if (w->full || (need & ~groups) || next < 0)
            return LLM_OK;
        if (next == id)
            break; /* a loop: any length */
        if (i + 1 == len && len == 255)
            return LLM_OK; /* longer paths than counted */
        id = next;
    }
    *out = true;
    return LLM_OK;
}

/* The groups of text (llmi_gtoken_is_text). */
static uint64_t text_groups(void) {
    uint64_t m = 1ull << LLMI_GGROUP_NONASCII;
    for (uint32_t c = 0x20; c < 0x7F; c++)
        if (llmi_gbyte_is_text((uint8_t)c))
            m |= 1ull << llmi_gbyte_group((uint8_t)c);
    return m;
}

/* path_chars: the characters of the path to node (bytes other than
 * continuation bytes). */
/* At the root: how many text characters in a row state `from` surely
 * accepts (its chain of common successors over every text group), and
 * the bitset of the text tokens that short, or all of them on a loop. */
static llm_status take_text(llmi_gwalk *w, llmi_gstate *s, int32_t from, uint32_t *bits) {
    const llmi_grammar *g = s->g;
    uint64_t text = text_groups();
    uint32_t r = 0;
    for (int32_t at = from; r < g->max_text_chars;) {
        uint64_t groups;
        int32_t next;
        LLMI_TRY(uniform(w, s, at, &groups, &next));
        if (w->full || (text & ~groups) || next < 0)
            break;
        r++;
        if (next == at) {
            r = UINT32_MAX; /* a loop */
            break;
        }
        at = next;
    }
    if (w->full || r == 0)
        return LLM_OK;
    size_t words = (g->n_vocab + 31) / 32;
    const uint32_t *src = g->text_tokens;
    if (r < g->max_text_chars) {
        if (r > LLMI_GTEXT_RUNS)
            r = LLMI_GTEXT_RUNS;
        src = g->text_upto + (size_t)(r - 1) * (words + 1);
    } else {
        r = UINT32_MAX;
    }
    for (size_t i = 0; i < words; i++)
        bits[i] |= src[i];
    w->text_taken = r;
    return LLM_OK;
}

static llm_status run(llmi_gwalk *w, llmi_gstate *s, uint32_t node, uint32_t path_chars,
                      int32_t from, uint32_t *bits, llmi_gcut *e, uint32_t *cap) {
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
        uint64_t below = g->trie_below[child];
        uint32_t chars = path_chars + ((ch->byte & 0xC0) != 0x80);
        if (ch->all_text && w->text_taken &&
            (w->text_taken == UINT32_MAX || chars + llmi_gbelow_len(below) <= w->text_taken))
            continue; /* the root's bitset holds them all (255: unknown, only for UINT32_MAX) */
        if (ch->n_children && ch->end_token - ch->first_token >= MIN_RUN &&
            !(below >> LLMI_GGROUP_INVALID & 1)) {
            bool all;
            LLMI_TRY(
                accepts_runs(w, s, nx, below & LLMI_GBELOW_GROUPS, llmi_gbelow_len(below), &all));
            if (w->full)
                return LLM_OK;
            if (all) {
                for (uint32_t k = ch->first_token; k < ch->end_token; k++) {
                    llm_token t = g->trie_tokens[k];
                    bits[t >> 5] |= 1u << (t & 31);
                }
                continue;
            }
        }
        for (uint32_t k = 0; k < ch->n_tokens; k++) {
            llm_token t = g->trie_tokens[ch->first_token + k];
            bits[t >> 5] |= 1u << (t & 31);
        }
        if (ch->n_children) {
            LLMI_TRY(run(w, s, child, chars, nx, bits, e, cap));
            if (w->full)
                return LLM_OK;
        }
    }
    return LLM_OK;
}

llm_status llmi_gwalk_run(llmi_gwalk *w, llmi_gstate *s, uint32_t node, llmi_gset in,
                          uint32_t *mask, llmi_gcut *e, uint32_t *cap, bool *gave_up) {
    *gave_up = false;
    if (w->full) {
        *gave_up = true;
        return LLM_OK;
    }
    int32_t from;
    w->cut_walk = e != NULL;
    w->text_taken = 0;
    uint32_t *bits = e ? e->accepted : mask;
    LLMI_TRY(intern(w, s, in, false, 0, 0, w->cut_walk, &from));
    if (from >= 0 && node == 0 && s->g->text_tokens)
        LLMI_TRY(take_text(w, s, from, bits));
    if (from >= 0 && !w->full)
        LLMI_TRY(run(w, s, node, 0, from, bits, e, cap));
    *gave_up = w->full;
    return LLM_OK;
}

llm_status llmi_gwalk_subtrees(llmi_gwalk *w, llmi_gstate *s, llmi_gset in, const uint32_t *nodes,
                               uint32_t n, uint32_t *mask, bool *gave_up) {
    const llmi_grammar *g = s->g;
    *gave_up = w->full;
    int32_t from = -1;
    w->cut_walk = false;
    w->text_taken = 0;
    if (!w->full)
        LLMI_TRY(intern(w, s, in, false, 0, 0, false, &from));
    for (uint32_t i = 0; i < n && from >= 0 && !w->full; i++) {
        const llmi_gtrie_node *nd = &g->trie[nodes[i]];
        /* The subtree's first token starts with the node's bytes. */
        const uint8_t *path =
            (const uint8_t *)g->tok_bytes + g->tok_off[g->trie_tokens[nd->first_token]];
        int32_t at = from;
        uint32_t chars = 0;
        for (uint32_t k = 0; k < nd->depth && at >= 0; k++) {
            LLMI_TRY(successor(w, s, at, path[k], false, &at));
            chars += (path[k] & 0xC0) != 0x80;
            if (w->full)
                break;
        }
        if (w->full || at < 0)
            continue;
        for (uint32_t k = 0; k < nd->n_tokens; k++) {
            llm_token t = g->trie_tokens[nd->first_token + k];
            mask[t >> 5] |= 1u << (t & 31);
        }
        if (nd->n_children)
            LLMI_TRY(run(w, s, nodes[i], chars, at, mask, NULL, NULL));
    }
    *gave_up = w->full;
    return LLM_OK;
}

llm_status llmi_gwalk_plain(llmi_gstate *s, uint32_t node, llmi_gset in, uint32_t *mask,
                            llmi_gcut *e, uint32_t *cap) {
    const llmi_grammar *g = s->g;
    const llmi_gtrie_node *nd = &g->trie[node];
    uint32_t *bits = e ? e->accepted : mask;
    for (uint32_t c = 0; c < nd->n_children; c++) {
        uint32_t child = nd->first_child + c;
        const llmi_gtrie_node *ch = &g->trie[child];
        uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops;
        llmi_gset out;
        llm_status st = llmi_gstate_step_byte(s, in, ch->byte, &out);
        bool cut = false;
        for (uint32_t i = 0; st == LLM_OK && e && i < out.n; i++)
            cut |= s->tops[out.first + i] == LLMI_GCUT;
        if (st == LLM_OK && cut)
            st = push_uncertain(e, cap, child);
        else if (st == LLM_OK && out.n) {
            for (uint32_t k = 0; k < ch->n_tokens; k++) {
                llm_token t = g->trie_tokens[ch->first_token + k];
                bits[t >> 5] |= 1u << (t & 31);
            }
            if (ch->n_children)
                st = llmi_gwalk_plain(s, child, out, mask, e, cap);
        }
        s->n_nodes = mark_nodes;
        s->n_tops = mark_tops;
        if (st != LLM_OK)
            return st;
    }
    return LLM_OK;
}
