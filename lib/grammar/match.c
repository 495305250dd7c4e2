/* The matcher: stack sets advanced by code points assembled from UTF-8
 * bytes and snapshots for rollback; the allowed-token mask is mask.c's.
 *
 * Sets live in s->tops: the state's own set is tops[0, n_live); a trial
 * advance appends its result set after it, and the mask walk stacks one
 * set per trie depth there. Nodes are appended to s->nodes and dropped
 * again by truncation when a trial is undone. */
#include "grammar/grammar.h"

#include <stdlib.h>

typedef llmi_gset gset;

uint64_t llmi_gmix(uint64_t h, uint32_t pos) {
    h ^= pos + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

bool llmi_ggrow32(uint32_t **p, uint32_t *cap, uint32_t need) {
    if (need <= *cap)
        return true;
    uint32_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    uint32_t *q = llmi_realloc(*p, (size_t)c * sizeof *q);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

llm_status llmi_gstate_new_node(llmi_gstate *s, uint32_t pos, uint32_t parent, uint32_t *out) {
    if (s->n_nodes == s->cap_nodes) {
        if (s->cap_nodes >= UINT32_MAX / 4)
            return llmi_error(LLM_ERR_LIMIT, "grammar: stacks too deep");
        uint32_t c = s->cap_nodes ? 2 * s->cap_nodes : 256;
        llmi_gnode *q = llmi_realloc(s->nodes, (size_t)c * sizeof *q);
        if (!q)
            return llmi_oom("grammar stacks");
        s->nodes = q;
        s->cap_nodes = c;
    }
    uint64_t h = parent == LLMI_GNONE ? 0 : parent == LLMI_GCUT ? 1 : s->nodes[parent].hash;
    s->nodes[s->n_nodes] = (llmi_gnode){pos, parent, llmi_gmix(h, pos)};
    *out = s->n_nodes++;
    return LLM_OK;
}

bool llmi_gstate_same_stack(const llmi_gstate *s, uint32_t a, uint32_t b) {
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

/* Adds top t to the set that starts at `first` and ends at s->n_tops. */
llm_status llmi_gstate_add_top(llmi_gstate *s, uint32_t first, uint32_t t) {
    for (uint32_t i = first; i < s->n_tops; i++)
        if (llmi_gstate_same_stack(s, s->tops[i], t))
            return LLM_OK;
    if (s->n_tops - first >= LLMI_GRAMMAR_MAX_STACKS)
        return llmi_error(LLM_ERR_LIMIT,
                          "grammar: more than %d parses alive at once (the grammar is too "
                          "ambiguous)",
                          LLMI_GRAMMAR_MAX_STACKS);
    if (!llmi_ggrow32(&s->tops, &s->cap_tops, s->n_tops + 1))
        return llmi_oom("grammar stacks");
    s->tops[s->n_tops++] = t;
    return LLM_OK;
}

/* Adds every stack that node `node` leads to with a character element on
 * top (or LLMI_GDONE when the stack empties). */
static llm_status expand(llmi_gstate *s, uint32_t first, uint32_t node) {
    const llmi_grammar *g = s->g;
    for (;;) {
        if (node == LLMI_GNONE)
            return llmi_gstate_add_top(s, first, LLMI_GDONE);
        if (node == LLMI_GCUT)
            return llmi_gstate_add_top(s, first, LLMI_GCUT);
        uint32_t pos = s->nodes[node].pos;
        llmi_gel e = g->el[pos];
        if (e.kind == LLMI_GEL_CHAR)
            return llmi_gstate_add_top(s, first, node);
        if (e.kind == LLMI_GEL_END) {
            node = s->nodes[node].parent;
            continue;
        }
        uint32_t parent = s->nodes[node].parent, cont = parent;
        if (g->el[pos + 1].kind != LLMI_GEL_END) /* a reference in tail position reuses the frame */
            LLMI_TRY(llmi_gstate_new_node(s, pos + 1, parent, &cont));
        const llmi_grule *r = &g->rules[e.arg];
        for (uint32_t a = 0; a < r->n_alts; a++) {
            uint32_t start;
            LLMI_TRY(llmi_gstate_new_node(s, g->alts[r->first_alt + a], cont, &start));
            LLMI_TRY(expand(s, first, start));
        }
        return LLM_OK;
    }
}

/* The set after code point cp, appended at s->n_tops. */
static llm_status advance_cp(llmi_gstate *s, gset in, uint32_t cp, gset *out) {
    out->first = s->n_tops;
    out->u = (llmi_gutf8){0, 0, 0};
    for (uint32_t i = 0; i < in.n; i++) {
        uint32_t t = s->tops[in.first + i];
        if (t >= LLMI_GCUT)
            continue;
        const llmi_gnode nd = s->nodes[t];
        if (!llmi_gclass_has(s->g, s->g->el[nd.pos].arg, cp))
            continue;
        uint32_t next;
        LLMI_TRY(llmi_gstate_new_node(s, nd.pos + 1, nd.parent, &next));
        LLMI_TRY(expand(s, out->first, next));
    }
    out->n = s->n_tops - out->first;
    return LLM_OK;
}

static bool class_meets(const llmi_grammar *g, uint32_t cls, uint32_t lo, uint32_t hi) {
    const llmi_gclass *c = &g->cls[cls];
    const uint32_t *r = g->ranges + 2 * c->first;
    for (uint32_t i = 0; i < c->n; i++)
        if (r[2 * i] <= hi && r[2 * i + 1] >= lo)
            return true;
    return false;
}

/* The stacks of `in` that some completion of a pending character fits. */
static llm_status filter_pending(llmi_gstate *s, gset in, llmi_gutf8 u, gset *out) {
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t shift = 6u * u.need, lo = u.acc << shift, hi = lo | ((1u << shift) - 1);
    if (lo < min_cp[u.total])
        lo = min_cp[u.total];
    if (hi > 0x10FFFF)
        hi = 0x10FFFF;
    if (lo >= 0xD800 && hi <= 0xDFFF) /* only surrogates can follow: never valid */
        lo = hi + 1;
    out->first = s->n_tops;
    out->u = u;
    out->n = 0;
    if (lo > hi)
        return LLM_OK;
    for (uint32_t i = 0; i < in.n; i++) {
        uint32_t t = s->tops[in.first + i];
        if (t >= LLMI_GCUT || !class_meets(s->g, s->g->el[s->nodes[t].pos].arg, lo, hi))
            continue;
        if (!llmi_ggrow32(&s->tops, &s->cap_tops, s->n_tops + 1))
            return llmi_oom("grammar stacks");
        s->tops[s->n_tops++] = t;
    }
    out->n = s->n_tops - out->first;
    return LLM_OK;
}

static llm_status step_byte(llmi_gstate *s, gset in, uint8_t byte, gset *out) {
    llmi_gutf8 u = in.u;
    *out = (gset){s->n_tops, 0, {0, 0, 0}};
    if (u.need == 0) {
        if (byte < 0x80)
            return advance_cp(s, in, byte, out);
        int len = llmi_utf8_seq_len(byte);
        if (len < 2)
            return LLM_OK;
        u = (llmi_gutf8){(uint32_t)byte & (0x7Fu >> len), (uint8_t)(len - 1), (uint8_t)len};
        return filter_pending(s, in, u, out);
    }
    if ((byte & 0xC0) != 0x80)
        return LLM_OK;
    u.acc = (u.acc << 6) | (byte & 0x3Fu);
    if (--u.need > 0)
        return filter_pending(s, in, u, out);
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (u.acc < min_cp[u.total] || u.acc > 0x10FFFF || (u.acc >= 0xD800 && u.acc <= 0xDFFF))
        return LLM_OK;
    return advance_cp(s, in, u.acc, out);
}

llm_status llmi_gstate_step_byte(llmi_gstate *s, gset in, uint8_t byte, gset *out) {
    return step_byte(s, in, byte, out);
}

/* Runs bytes from `in`; *out is the final set (n == 0: rejected). */
llm_status llmi_gstate_run_bytes(llmi_gstate *s, gset in, const char *bytes, size_t n, gset *out) {
    gset cur = in;
    for (size_t i = 0; i < n; i++) {
        LLMI_TRY(step_byte(s, cur, (uint8_t)bytes[i], out));
        if (out->n == 0)
            return LLM_OK;
        cur = *out;
    }
    *out = cur;
    return LLM_OK;
}

/* ---- lifetime ---- */

llm_status llmi_gstate_create(const llmi_grammar *g, llmi_gstate **out) {
    *out = NULL;
    llmi_gstate *s = llmi_calloc(1, sizeof *s);
    if (!s)
        return llmi_oom("grammar state");
    s->g = g;
    s->max_snaps = LLMI_GRAMMAR_MAX_ROLLBACK;
    const llmi_grule *r = &g->rules[g->root];
    llm_status st = LLM_OK;
    for (uint32_t a = 0; a < r->n_alts && st == LLM_OK; a++) {
        uint32_t start;
        st = llmi_gstate_new_node(s, g->alts[r->first_alt + a], LLMI_GNONE, &start);
        if (st == LLM_OK)
            st = expand(s, 0, start);
    }
    if (st != LLM_OK) {
        llmi_gstate_free(s);
        return st;
    }
    *out = s;
    return LLM_OK;
}

void llmi_gstate_free(llmi_gstate *s) {
    if (!s)
        return;
    llmi_free(s->nodes);
    llmi_free(s->tops);
    llmi_free(s->snaps);
    llmi_free(s->snap_tops);
    llmi_free(s);
}

static void *dup_array(const void *p, size_t n, size_t elem) {
    void *q = llmi_malloc(n ? n * elem : 1);
    if (q && n)
        memcpy(q, p, n * elem);
    return q;
}

llm_status llmi_gstate_fork(const llmi_gstate *s, llmi_gstate **out) {
    *out = NULL;
    llmi_gstate *c = llmi_calloc(1, sizeof *c);
    if (!c)
        return llmi_oom("grammar state fork");
    *c = *s;
    c->nodes = dup_array(s->nodes, s->n_nodes, sizeof *s->nodes);
    c->tops = dup_array(s->tops, s->n_tops, sizeof *s->tops);
    c->snaps = dup_array(s->snaps, s->n_snaps, sizeof *s->snaps);
    c->snap_tops = dup_array(s->snap_tops, s->n_snap_tops, sizeof *s->snap_tops);
    c->cap_nodes = s->n_nodes;
    c->cap_tops = s->n_tops;
    c->cap_snaps = s->n_snaps;
    c->cap_snap_tops = s->n_snap_tops;
    if (!c->nodes || !c->tops || !c->snaps || !c->snap_tops) {
        llmi_gstate_free(c);
        return llmi_oom("grammar state fork");
    }
    *out = c;
    return LLM_OK;
}

/* ---- garbage collection of the node arena ---- */

static uint32_t copy_chain(const llmi_gnode *old, uint32_t *map, llmi_gnode *dst, uint32_t *n,
                           uint32_t t) {
    if (t >= LLMI_GDONE)
        return t;
    /* find the first already-copied node (or the bottom), then copy upwards */
    uint32_t path_len = 0;
    for (uint32_t k = t; k != LLMI_GNONE && map[k] == LLMI_GNONE; k = old[k].parent)
        path_len++;
    while (path_len > 0) {
        uint32_t k = t;
        for (uint32_t d = 1; d < path_len; d++)
            k = old[k].parent;
        uint32_t parent = old[k].parent;
        dst[*n] = old[k];
        dst[*n].parent = parent == LLMI_GNONE ? LLMI_GNONE : map[parent];
        map[k] = (*n)++;
        path_len--;
    }
    return map[t];
}

/* Keeps only the nodes the live set and the snapshots reach. */
static llm_status collect(llmi_gstate *s) {
    uint32_t *map = llmi_malloc((size_t)(s->n_nodes ? s->n_nodes : 1) * sizeof *map);
    llmi_gnode *dst = llmi_malloc((size_t)(s->n_nodes ? s->n_nodes : 1) * sizeof *dst);
    if (!map || !dst) {
        llmi_free(map);
        llmi_free(dst);
        return llmi_oom("grammar stacks");
    }
    memset(map, 0xFF, (size_t)s->n_nodes * sizeof *map);
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_tops; i++)
        s->tops[i] = copy_chain(s->nodes, map, dst, &n, s->tops[i]);
    for (uint32_t i = 0; i < s->n_snap_tops; i++)
        s->snap_tops[i] = copy_chain(s->nodes, map, dst, &n, s->snap_tops[i]);
    llmi_free(map);
    llmi_free(s->nodes);
    s->nodes = dst;
    s->cap_nodes = s->n_nodes ? s->n_nodes : 1;
    s->n_nodes = n;
    return LLM_OK;
}

/* ---- advancing ---- */

/* Makes `res` (appended after the live set) the live set. */
static llm_status adopt(llmi_gstate *s, gset res) {
    memmove(s->tops, s->tops + res.first, (size_t)res.n * sizeof *s->tops);
    s->n_tops = res.n;
    s->utf8 = res.u;
    if (s->n_nodes > 4096 && s->n_nodes > 8 * (s->n_tops + s->n_snap_tops + 64))
        return collect(s);
    return LLM_OK;
}

static llm_status accept_bytes(llmi_gstate *s, const char *bytes, size_t n, const char *what,
                               llm_token t) {
    uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops;
    gset res;
    llm_status st = llmi_gstate_run_bytes(s, llmi_gstate_live(s), bytes, n, &res);
    if (st == LLM_OK && res.n == 0) {
        st =
            t == LLM_TOKEN_NONE
                ? llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: the %s are not allowed here", what)
                : llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: token %d is not allowed here", t);
    }
    if (st != LLM_OK) {
        s->n_nodes = mark_nodes;
        s->n_tops = mark_tops;
        return st;
    }
    return adopt(s, res);
}

llm_status llmi_gstate_accept_bytes(llmi_gstate *s, const char *bytes, size_t n) {
    if (s->finished)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: already finished");
    return accept_bytes(s, bytes, n, "bytes", LLM_TOKEN_NONE);
}

static bool is_eog(const llmi_grammar *g, llm_token t) {
    for (uint32_t i = 0; i < g->n_eog; i++)
        if (g->eog[i] == t)
            return true;
    return false;
}

/* Snapshots the live set, tops[0, n_live). */
static llm_status push_snapshot(llmi_gstate *s, uint32_t n_live) {
    if (s->max_snaps == 0)
        return LLM_OK;
    if (s->n_snaps == s->max_snaps) { /* drop the oldest */
        uint32_t drop = s->snaps[0].n_tops;
        memmove(s->snaps, s->snaps + 1, (size_t)(s->n_snaps - 1) * sizeof *s->snaps);
        s->n_snaps--;
        memmove(s->snap_tops, s->snap_tops + drop,
                (size_t)(s->n_snap_tops - drop) * sizeof *s->snap_tops);
        s->n_snap_tops -= drop;
        for (uint32_t i = 0; i < s->n_snaps; i++)
            s->snaps[i].first_top -= drop;
    }
    if (s->n_snaps == s->cap_snaps) {
        uint32_t c = s->cap_snaps ? 2 * s->cap_snaps : 8;
        llmi_gsnap *q = llmi_realloc(s->snaps, (size_t)c * sizeof *q);
        if (!q)
            return llmi_oom("grammar snapshot");
        s->snaps = q;
        s->cap_snaps = c;
    }
    if (!llmi_ggrow32(&s->snap_tops, &s->cap_snap_tops, s->n_snap_tops + n_live))
        return llmi_oom("grammar snapshot");
    if (n_live)
        memcpy(s->snap_tops + s->n_snap_tops, s->tops, (size_t)n_live * sizeof *s->tops);
    s->snaps[s->n_snaps++] = (llmi_gsnap){s->n_snap_tops, n_live, s->utf8, s->finished};
    s->n_snap_tops += n_live;
    return LLM_OK;
}

llm_status llmi_gstate_accept_token(llmi_gstate *s, llm_token t) {
    const llmi_grammar *g = s->g;
    if (!g->tok_off)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: no vocabulary bound");
    if (t < 0 || (uint32_t)t >= g->n_vocab)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "grammar: token %d is outside the vocabulary of %u", t, g->n_vocab);
    if (s->finished)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: token %d after the end of generation",
                          t);
    if (is_eog(g, t)) {
        if (!llmi_gstate_can_end(s))
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "grammar: end-of-generation token %d before the grammar is "
                              "complete",
                              t);
        LLMI_TRY(push_snapshot(s, s->n_tops));
        s->finished = true;
        return LLM_OK;
    }
    uint32_t off = g->tok_off[t], len = g->tok_off[t + 1] - off;
    if (len == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "grammar: token %d has no text and is not allowed here", t);
    /* Trial first: the snapshot is taken only once the token fits. */
    uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops;
    gset res;
    llm_status st = llmi_gstate_run_bytes(s, llmi_gstate_live(s), g->tok_bytes + off, len, &res);
    if (st == LLM_OK && res.n == 0)
        st = llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: token %d is not allowed here", t);
    if (st == LLM_OK)
        st = push_snapshot(s, mark_tops);
    if (st != LLM_OK) {
        s->n_nodes = mark_nodes;
        s->n_tops = mark_tops;
        return st;
    }
    return adopt(s, res);
}

bool llmi_gstate_can_end(const llmi_gstate *s) {
    if (s->finished)
        return true;
    if (s->utf8.need)
        return false;
    for (uint32_t i = 0; i < s->n_tops; i++)
        if (s->tops[i] == LLMI_GDONE)
            return true;
    return false;
}

bool llmi_gstate_is_complete(const llmi_gstate *s) {
    if (s->finished)
        return true;
    return s->utf8.need == 0 && s->n_tops > 0 && s->n_tops == 1 && s->tops[0] == LLMI_GDONE;
}

uint32_t llmi_gstate_rollback_depth(const llmi_gstate *s) { return s->n_snaps; }

llm_status llmi_gstate_rollback(llmi_gstate *s, uint32_t n) {
    if (n == 0)
        return LLM_OK;
    if (n > s->n_snaps)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "grammar: cannot roll back %u tokens, only %u are kept", n, s->n_snaps);
    llmi_gsnap snap = s->snaps[s->n_snaps - n];
    if (!llmi_ggrow32(&s->tops, &s->cap_tops, snap.n_tops))
        return llmi_oom("grammar rollback");
    if (snap.n_tops)
        memcpy(s->tops, s->snap_tops + snap.first_top, (size_t)snap.n_tops * sizeof *s->tops);
    s->n_tops = snap.n_tops;
    s->utf8 = snap.utf8;
    s->finished = snap.finished;
    s->n_snaps -= n;
    s->n_snap_tops = snap.first_top;
    return LLM_OK;
}

bool llmi_gstate_allows(llmi_gstate *s, llm_token t) {
    const llmi_grammar *g = s->g;
    if (!g->tok_off || t < 0 || (uint32_t)t >= g->n_vocab || s->finished)
        return false;
    if (is_eog(g, t))
        return llmi_gstate_can_end(s);
    uint32_t off = g->tok_off[t], len = g->tok_off[t + 1] - off;
    if (len == 0)
        return false;
    uint32_t mark_nodes = s->n_nodes, mark_tops = s->n_tops;
    gset res;
    llm_status st = llmi_gstate_run_bytes(s, llmi_gstate_live(s), g->tok_bytes + off, len, &res);
    s->n_nodes = mark_nodes;
    s->n_tops = mark_tops;
    return st == LLM_OK && res.n > 0;
}
