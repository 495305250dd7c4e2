/* The grammar builder and its flattening into an llmi_grammar: undefined
 * rules and left recursion are refused here, since the matcher's expansion
 * would never finish on them. */
#include "grammar/build.h"

#include <stdio.h>
#include <stdlib.h>

enum { MAX_CP = 0x10FFFF };

static bool grow(void **p, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap)
        return true;
    uint32_t c = *cap ? *cap : 8;
    while (c < need) {
        if (c > UINT32_MAX / 2)
            return false;
        c *= 2;
    }
    size_t bytes;
    if (!llmi_mul_ok(c, elem, &bytes))
        return false;
    void *q = llmi_realloc(*p, bytes);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

void llmi_gbuild_free(llmi_gbuild *b) {
    for (uint32_t r = 0; r < b->n_rules; r++) {
        for (uint32_t a = 0; a < b->rules[r].n_alts; a++)
            llmi_free(b->rules[r].alts[a].v);
        llmi_free(b->rules[r].alts);
        llmi_free(b->rules[r].name);
    }
    llmi_free(b->rules);
    llmi_free(b->ranges);
    llmi_free(b->cls);
    memset(b, 0, sizeof *b);
}

uint32_t llmi_gbuild_rule(llmi_gbuild *b, const char *name, size_t len) {
    for (uint32_t r = 0; r < b->n_rules; r++)
        if (strlen(b->rules[r].name) == len && memcmp(b->rules[r].name, name, len) == 0)
            return r;
    if (!grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules))
        return UINT32_MAX;
    llmi_gbrule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->name = llmi_strndup(name, len);
    if (!r->name)
        return UINT32_MAX;
    return b->n_rules++;
}

uint32_t llmi_gbuild_synth(llmi_gbuild *b, const char *base) {
    char name[96];
    snprintf(name, sizeof name, "%.64s-%u", base, b->n_synth++);
    uint32_t r = llmi_gbuild_rule(b, name, strlen(name));
    if (r != UINT32_MAX)
        b->rules[r].defined = true;
    return r;
}

llmi_gseq *llmi_gbuild_alt(llmi_gbuild *b, uint32_t r) {
    llmi_gbrule *rule = &b->rules[r];
    if (!grow((void **)&rule->alts, &rule->cap_alts, rule->n_alts + 1, sizeof *rule->alts))
        return NULL;
    llmi_gseq *s = &rule->alts[rule->n_alts++];
    memset(s, 0, sizeof *s);
    return s;
}

llm_status llmi_gseq_push(llmi_gseq *s, uint32_t kind, uint32_t arg) {
    if (!grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v))
        return llmi_oom("grammar");
    s->v[s->n++] = (llmi_gel){kind, arg};
    return LLM_OK;
}

llm_status llmi_gseq_append(llmi_gseq *s, const llmi_gseq *from) {
    if (!grow((void **)&s->v, &s->cap, s->n + from->n, sizeof *s->v))
        return llmi_oom("grammar");
    if (from->n)
        memcpy(s->v + s->n, from->v, from->n * sizeof *s->v);
    s->n += from->n;
    return LLM_OK;
}

static int by_lo(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

llm_status llmi_gbuild_class(llmi_gbuild *b, const uint32_t *pairs, uint32_t n, bool negate,
                             uint32_t *out) {
    uint32_t *tmp = llmi_malloc((size_t)(n ? n : 1) * 2 * sizeof *tmp);
    if (!tmp)
        return llmi_oom("grammar class");
    if (n) /* an empty class "[]" has no pairs (NULL) */
        memcpy(tmp, pairs, (size_t)n * 2 * sizeof *tmp);
    qsort(tmp, n, 2 * sizeof *tmp, by_lo);
    uint32_t m = 0; /* merge overlapping and adjacent ranges */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t lo = tmp[2 * i], hi = tmp[2 * i + 1] > MAX_CP ? MAX_CP : tmp[2 * i + 1];
        if (lo > hi)
            continue;
        if (m && lo <= tmp[2 * (m - 1) + 1] + 1) {
            if (hi > tmp[2 * (m - 1) + 1])
                tmp[2 * (m - 1) + 1] = hi;
        } else {
            tmp[2 * m] = lo;
            tmp[2 * m + 1] = hi;
            m++;
        }
    }
    uint32_t need = b->n_ranges + m + 2;
    if (!grow((void **)&b->ranges, &b->cap_ranges, 2 * need, sizeof *b->ranges) ||
        !grow((void **)&b->cls, &b->cap_cls, b->n_cls + 1, sizeof *b->cls)) {
        llmi_free(tmp);
        return llmi_oom("grammar class");
    }
    llmi_gclass c = {b->n_ranges, 0, {0, 0}};
    uint32_t *dst = b->ranges + 2 * b->n_ranges;
    if (!negate) {
        memcpy(dst, tmp, (size_t)m * 2 * sizeof *tmp);
        c.n = m;
    } else {
        uint32_t next = 0; /* first code point not yet covered */
        for (uint32_t i = 0; i < m; i++) {
            if (tmp[2 * i] > next) {
                dst[2 * c.n] = next;
                dst[2 * c.n + 1] = tmp[2 * i] - 1;
                c.n++;
            }
            next = tmp[2 * i + 1] + 1;
        }
        if (next <= MAX_CP) {
            dst[2 * c.n] = next;
            dst[2 * c.n + 1] = MAX_CP;
            c.n++;
        }
    }
    llmi_free(tmp);
    /* Surrogates are not characters: no UTF-8 text holds them. At most one
     * range covers the whole block; it splits in two. */
    for (uint32_t i = 0; i < c.n; i++) {
        uint32_t lo = dst[2 * i], hi = dst[2 * i + 1];
        if (hi < 0xD800 || lo > 0xDFFF)
            continue;
        if (lo >= 0xD800 && hi <= 0xDFFF) { /* wholly surrogates: drop */
            memmove(dst + 2 * i, dst + 2 * i + 2, (size_t)(c.n - i - 1) * 2 * sizeof *dst);
            c.n--;
            i--;
        } else if (lo < 0xD800 && hi > 0xDFFF) {
            memmove(dst + 2 * i + 4, dst + 2 * i + 2, (size_t)(c.n - i - 1) * 2 * sizeof *dst);
            dst[2 * i + 1] = 0xD7FF;
            dst[2 * i + 2] = 0xE000;
            dst[2 * i + 3] = hi;
            c.n++;
            i++;
        } else if (lo < 0xD800) {
            dst[2 * i + 1] = 0xD7FF;
        } else {
            dst[2 * i] = 0xE000;
        }
    }
    for (uint32_t i = 0; i < c.n; i++)
        for (uint32_t cp = dst[2 * i]; cp <= dst[2 * i + 1] && cp < 128; cp++)
            c.ascii[cp >> 6] |= 1ull << (cp & 63);
    b->n_ranges += c.n;
    *out = b->n_cls;
    b->cls[b->n_cls++] = c;
    return LLM_OK;
}

bool llmi_gclass_has(const llmi_grammar *g, uint32_t cls, uint32_t cp) {
    const llmi_gclass *c = &g->cls[cls];
    if (cp < 128)
        return (c->ascii[cp >> 6] >> (cp & 63)) & 1;
    const uint32_t *r = g->ranges + 2 * c->first;
    uint32_t lo = 0, hi = c->n; /* binary search for the last range with lo <= cp */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (r[2 * mid] <= cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && cp <= r[2 * (lo - 1) + 1];
}

/* ---- checks ---- */

static bool seq_nullable(const llmi_gbuild *b, const llmi_gseq *s, const bool *nullable) {
    for (uint32_t i = 0; i < s->n; i++)
        if (s->v[i].kind == LLMI_GEL_CHAR || !nullable[s->v[i].arg])
            return false;
    return true;
}

/* DFS over "rule A may start with rule B" edges; colour 1 = on the path. */
static bool left_cycle(const llmi_gbuild *b, const bool *nullable, uint8_t *colour, uint32_t r,
                       uint32_t *culprit) {
    colour[r] = 1;
    const llmi_gbrule *rule = &b->rules[r];
    for (uint32_t a = 0; a < rule->n_alts; a++) {
        const llmi_gseq *s = &rule->alts[a];
        for (uint32_t i = 0; i < s->n; i++) {
            if (s->v[i].kind == LLMI_GEL_CHAR)
                break;
            uint32_t t = s->v[i].arg;
            if (colour[t] == 1) {
                *culprit = t;
                return true;
            }
            if (colour[t] == 0 && left_cycle(b, nullable, colour, t, culprit))
                return true;
            if (!nullable[t])
                break;
        }
    }
    colour[r] = 2;
    return false;
}

static llm_status check(const llmi_gbuild *b) {
    for (uint32_t r = 0; r < b->n_rules; r++)
        if (!b->rules[r].defined)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "grammar: rule '%s' is used at %u:%u but never defined",
                              b->rules[r].name, b->rules[r].ref_line, b->rules[r].ref_col);
    bool *nullable = llmi_calloc(b->n_rules ? b->n_rules : 1, sizeof *nullable);
    uint8_t *colour = llmi_calloc(b->n_rules ? b->n_rules : 1, 1);
    if (!nullable || !colour) {
        llmi_free(nullable);
        llmi_free(colour);
        return llmi_oom("grammar check");
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < b->n_rules; r++)
            for (uint32_t a = 0; !nullable[r] && a < b->rules[r].n_alts; a++)
                if (seq_nullable(b, &b->rules[r].alts[a], nullable))
                    nullable[r] = changed = true;
    }
    llm_status st = LLM_OK;
    uint32_t culprit = 0;
    for (uint32_t r = 0; r < b->n_rules && st == LLM_OK; r++)
        if (colour[r] == 0 && left_cycle(b, nullable, colour, r, &culprit))
            st = llmi_error(LLM_ERR_UNSUPPORTED,
                            "grammar: rule '%s' is left-recursive (it can reach itself without "
                            "consuming a character, e.g. a repetition of something that may be "
                            "empty)",
                            b->rules[culprit].name);
    llmi_free(nullable);
    llmi_free(colour);
    return st;
}

/* ---- flattening ---- */

llm_status llmi_gbuild_finish(llmi_gbuild *b, const char *root, llmi_grammar **out) {
    *out = NULL;
    uint32_t root_id = UINT32_MAX;
    for (uint32_t r = 0; r < b->n_rules; r++)
        if (strcmp(b->rules[r].name, root) == 0 && b->rules[r].defined)
            root_id = r;
    if (root_id == UINT32_MAX)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: no rule named '%s' (the root)", root);
    LLMI_TRY(check(b));
    size_t n_el = 0, n_alts = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        n_alts += b->rules[r].n_alts;
        for (uint32_t a = 0; a < b->rules[r].n_alts; a++)
            n_el += b->rules[r].alts[a].n + 1;
    }
    if (n_el >= UINT32_MAX / 2 || n_alts >= UINT32_MAX / 2)
        return llmi_error(LLM_ERR_LIMIT, "grammar: too large");
    llmi_grammar *g = llmi_calloc(1, sizeof *g);
    if (!g)
        return llmi_oom("grammar");
    g->el = llmi_malloc((n_el ? n_el : 1) * sizeof *g->el);
    g->alts = llmi_malloc((n_alts ? n_alts : 1) * sizeof *g->alts);
    g->rules = llmi_malloc((b->n_rules ? b->n_rules : 1) * sizeof *g->rules);
    g->rule_names = llmi_calloc(b->n_rules ? b->n_rules : 1, sizeof *g->rule_names);
    g->ranges = llmi_malloc((size_t)(b->n_ranges ? b->n_ranges : 1) * 2 * sizeof *g->ranges);
    g->cls = llmi_malloc((b->n_cls ? b->n_cls : 1) * sizeof *g->cls);
    if (!g->el || !g->alts || !g->rules || !g->rule_names || !g->ranges || !g->cls) {
        llmi_grammar_free(g);
        return llmi_oom("grammar");
    }
    for (uint32_t r = 0; r < b->n_rules; r++) {
        const llmi_gbrule *rule = &b->rules[r];
        g->rules[r] = (llmi_grule){g->n_alts, rule->n_alts};
        /* names are moved, not copied: the builder is freed next */
        g->rule_names[r] = rule->name;
        b->rules[r].name = NULL;
        g->n_rules++;
        for (uint32_t a = 0; a < rule->n_alts; a++) {
            g->alts[g->n_alts++] = g->n_el;
            for (uint32_t i = 0; i < rule->alts[a].n; i++)
                g->el[g->n_el++] = rule->alts[a].v[i];
            g->el[g->n_el++] = (llmi_gel){LLMI_GEL_END, 0};
        }
    }
    /* A grammar without character classes has no arrays to copy (NULL). */
    if (b->n_ranges)
        memcpy(g->ranges, b->ranges, (size_t)b->n_ranges * 2 * sizeof *g->ranges);
    g->n_ranges = b->n_ranges;
    if (b->n_cls)
        memcpy(g->cls, b->cls, b->n_cls * sizeof *g->cls);
    g->n_cls = b->n_cls;
    g->root = root_id;
    *out = g;
    return LLM_OK;
}

void llmi_grammar_free(llmi_grammar *g) {
    if (!g)
        return;
    for (uint32_t r = 0; r < g->n_rules; r++)
        llmi_free(g->rule_names[r]);
    llmi_free(g->rule_names);
    llmi_free(g->el);
    llmi_free(g->alts);
    llmi_free(g->rules);
    llmi_free(g->ranges);
    llmi_free(g->cls);
    llmi_gvocab_release(g->vocab); /* the trie and token bytes are its */
    llmi_gpostable_free(g->posmasks);
    llmi_free(g);
}

/* ---- text buffers ---- */

void llmi_gtext_put(llmi_gtext *t, const char *s, size_t n) {
    if (t->oom)
        return;
    if (t->n + n + 1 > t->cap) {
        size_t c = t->cap ? t->cap : 256;
        while (c < t->n + n + 1)
            c *= 2;
        char *q = llmi_realloc(t->s, c);
        if (!q) {
            t->oom = true;
            return;
        }
        t->s = q;
        t->cap = c;
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = 0;
}

void llmi_gtext_puts(llmi_gtext *t, const char *s) { llmi_gtext_put(t, s, strlen(s)); }

void llmi_gtext_printf(llmi_gtext *t, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof buf) {
        t->oom = true; /* never happens with the short pieces written here */
        return;
    }
    llmi_gtext_put(t, buf, (size_t)n);
}

void llmi_gtext_literal_char(llmi_gtext *t, uint32_t cp, bool in_class) {
    char buf[16];
    if (cp == '"' || cp == '\\' || (in_class && (cp == ']' || cp == '-' || cp == '^'))) {
        buf[0] = '\\';
        buf[1] = (char)cp;
        llmi_gtext_put(t, buf, 2);
    } else if (cp < 0x20 || cp == 0x7f) {
        snprintf(buf, sizeof buf, "\\x%02X", cp);
        llmi_gtext_puts(t, buf);
    } else {
        size_t n = llmi_utf8_encode(cp, buf);
        llmi_gtext_put(t, buf, n);
    }
}

/* ---- UTF-8 ---- */

size_t llmi_grammar_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    if (n == 0)
        return 0;
    int len = llmi_utf8_seq_len((unsigned char)s[0]);
    if (len == 0 || (size_t)len > n || llmi_utf8_valid_prefix(s, (size_t)len) != (size_t)len)
        return 0;
    const unsigned char *u = (const unsigned char *)s;
    uint32_t v = len == 1 ? u[0] : (uint32_t)u[0] & (0x7Fu >> len);
    for (int k = 1; k < len; k++)
        v = (v << 6) | (u[k] & 0x3Fu);
    *cp = v;
    return (size_t)len;
}
