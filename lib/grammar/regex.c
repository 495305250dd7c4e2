/* Regular expressions to GBNF: literals and escapes, classes with ranges
 * and negation, \d \w \s and their negations, ".", groups ("(...)" and
 * "(?:...)"), alternation, the quantifiers * + ? {m} {m,} {m,n} (a lazy
 * "?" after them changes nothing here). The whole string must match:
 * a leading "^" and trailing "$" are accepted and dropped. Backreferences,
 * lookaround and other anchors are refused, naming their offset.
 *
 * In JSON mode (a schema's "pattern") the output matches the characters of
 * the string as they appear inside a JSON string literal: '"' and '\' are
 * written escaped and classes leave out what JSON would have to escape. */
#include "grammar/grammar.h"

#include <stdlib.h>

enum { MAX_RE_DEPTH = 128, MAX_RE_RANGES = 512 };

typedef struct rx {
    const char *s;
    size_t n, i;
    llmi_gtext *out;
    bool json;
    const char *where; /* error prefix, e.g. "regex" or "schema /pattern" */
    uint32_t depth;
} rx;

typedef struct ranges {
    uint32_t v[2 * MAX_RE_RANGES];
    uint32_t n;
} ranges;

static llm_status rx_fail(const rx *r, size_t at, llm_status st, const char *what) {
    return llmi_error(st, "%s: offset %zu: %s", r->where, at, what);
}

static bool add_range(ranges *rg, uint32_t lo, uint32_t hi) {
    if (rg->n == MAX_RE_RANGES)
        return false;
    rg->v[2 * rg->n] = lo;
    rg->v[2 * rg->n + 1] = hi;
    rg->n++;
    return true;
}

static int cmp_lo(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sorts and merges; with negate, replaces by the complement. */
static void normalize(ranges *rg, bool negate) {
    qsort(rg->v, rg->n, 2 * sizeof *rg->v, cmp_lo);
    uint32_t m = 0;
    for (uint32_t i = 0; i < rg->n; i++) {
        uint32_t lo = rg->v[2 * i], hi = rg->v[2 * i + 1];
        if (m && lo <= rg->v[2 * m - 1] + 1) {
            if (hi > rg->v[2 * m - 1])
                rg->v[2 * m - 1] = hi;
        } else {
            rg->v[2 * m] = lo;
            rg->v[2 * m + 1] = hi;
            m++;
        }
    }
    rg->n = m;
    if (!negate)
        return;
    ranges c = {.n = 0};
    uint32_t next = 0;
    for (uint32_t i = 0; i < m; i++) {
        if (rg->v[2 * i] > next)
            add_range(&c, next, rg->v[2 * i] - 1);
        next = rg->v[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF)
        add_range(&c, next, 0x10FFFF);
    *rg = c;
}

/* Removes [lo, hi] from normalized ranges. */
static void subtract(ranges *rg, uint32_t lo, uint32_t hi) {
    ranges c = {.n = 0};
    for (uint32_t i = 0; i < rg->n; i++) {
        uint32_t a = rg->v[2 * i], b = rg->v[2 * i + 1];
        if (b < lo || a > hi) {
            add_range(&c, a, b);
            continue;
        }
        if (a < lo)
            add_range(&c, a, lo - 1);
        if (b > hi)
            add_range(&c, hi + 1, b);
    }
    *rg = c;
}

static void emit_class(rx *r, ranges *rg) {
    if (r->json) {
        subtract(rg, 0, 0x1F);
        subtract(rg, '"', '"');
        subtract(rg, '\\', '\\');
    }
    llmi_gtext_puts(r->out, "[");
    for (uint32_t i = 0; i < rg->n; i++) {
        llmi_gtext_literal_char(r->out, rg->v[2 * i], true);
        if (rg->v[2 * i + 1] != rg->v[2 * i]) {
            llmi_gtext_puts(r->out, "-");
            llmi_gtext_literal_char(r->out, rg->v[2 * i + 1], true);
        }
    }
    llmi_gtext_puts(r->out, "]");
}

static void emit_char(rx *r, uint32_t cp) {
    if (r->json && (cp == '"' || cp == '\\')) {
        llmi_gtext_puts(r->out, cp == '"' ? "\"\\\\\\\"\"" : "\"\\\\\\\\\"");
        return;
    }
    if (r->json && cp < 0x20) {
        llmi_gtext_printf(r->out, "\"\\\\u%04x\"", cp);
        return;
    }
    llmi_gtext_puts(r->out, "\"");
    llmi_gtext_literal_char(r->out, cp, false);
    llmi_gtext_puts(r->out, "\"");
}

/* A shorthand class (\d \w \s and upper-case negations) into rg. */
static bool shorthand(char c, ranges *rg, bool *negate) {
    *negate = c >= 'A' && c <= 'Z';
    switch (c | 0x20) {
    case 'd':
        add_range(rg, '0', '9');
        return true;
    case 'w':
        add_range(rg, 'a', 'z');
        add_range(rg, 'A', 'Z');
        add_range(rg, '0', '9');
        add_range(rg, '_', '_');
        return true;
    case 's':
        add_range(rg, ' ', ' ');
        add_range(rg, '\t', '\r');
        return true;
    default:
        return false;
    }
}

static int hexv(char c) {
    return c >= '0' && c <= '9'                     ? c - '0'
           : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
                                                    : -1;
}

/* An escaped literal after the backslash; r->i is past the escape. */
static llm_status escape_char(rx *r, size_t at, char e, uint32_t *cp) {
    switch (e) {
    case 'n':
        *cp = '\n';
        return LLM_OK;
    case 'r':
        *cp = '\r';
        return LLM_OK;
    case 't':
        *cp = '\t';
        return LLM_OK;
    case 'f':
        *cp = '\f';
        return LLM_OK;
    case 'v':
        *cp = '\v';
        return LLM_OK;
    case 'x':
    case 'u': {
        int digits = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            int h = r->i < r->n ? hexv(r->s[r->i]) : -1;
            if (h < 0)
                return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "bad hexadecimal escape");
            v = v * 16 + (uint32_t)h;
            r->i++;
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return rx_fail(r, at, LLM_ERR_UNSUPPORTED, "surrogate escape");
        *cp = v;
        return LLM_OK;
    }
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
            return rx_fail(r, at, LLM_ERR_UNSUPPORTED,
                           "escape not supported (backreferences, \\b and other anchors are not)");
        *cp = (uint32_t)(unsigned char)e;
        return LLM_OK;
    }
}

static llm_status next_cp(rx *r, uint32_t *cp) {
    size_t used = llmi_grammar_utf8_decode(r->s + r->i, r->n - r->i, cp);
    if (used == 0)
        return rx_fail(r, r->i, LLM_ERR_INVALID_ARGUMENT, "invalid UTF-8");
    r->i += used;
    return LLM_OK;
}

/* One member of a class: a character, an escape or a shorthand. Returns
 * the code point in *cp, or adds a shorthand to rg and sets *cp = UINT32_MAX. */
static llm_status class_atom(rx *r, ranges *rg, uint32_t *cp) {
    size_t at = r->i;
    if (r->s[r->i] != '\\')
        return next_cp(r, cp);
    if (r->i + 1 >= r->n)
        return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "unfinished escape");
    char e = r->s[r->i + 1];
    r->i += 2;
    bool neg;
    ranges sh = {.n = 0};
    if (shorthand(e, &sh, &neg)) {
        normalize(&sh, neg);
        for (uint32_t k = 0; k < sh.n; k++)
            if (!add_range(rg, sh.v[2 * k], sh.v[2 * k + 1]))
                return rx_fail(r, at, LLM_ERR_UNSUPPORTED, "character class too large");
        *cp = UINT32_MAX;
        return LLM_OK;
    }
    return escape_char(r, at, e, cp);
}

static llm_status parse_class(rx *r) {
    size_t at = r->i++;
    bool negate = r->i < r->n && r->s[r->i] == '^';
    if (negate)
        r->i++;
    ranges rg = {.n = 0};
    bool first = true;
    for (;;) {
        if (r->i >= r->n)
            return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "unterminated class");
        if (r->s[r->i] == ']' && !first) {
            r->i++;
            break;
        }
        first = false;
        uint32_t lo, hi;
        LLMI_TRY(class_atom(r, &rg, &lo));
        if (lo == UINT32_MAX)
            continue;
        hi = lo;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            LLMI_TRY(class_atom(r, &rg, &hi));
            if (hi == UINT32_MAX || hi < lo)
                return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "bad range in class");
        }
        if (!add_range(&rg, lo, hi))
            return rx_fail(r, at, LLM_ERR_UNSUPPORTED, "character class too large");
    }
    normalize(&rg, negate);
    emit_class(r, &rg);
    return LLM_OK;
}

static llm_status parse_alt(rx *r);

static llm_status parse_atom(rx *r) {
    size_t at = r->i;
    char c = r->s[r->i];
    if (c == '(') {
        if (++r->depth > MAX_RE_DEPTH)
            return rx_fail(r, at, LLM_ERR_UNSUPPORTED, "groups nested too deeply");
        r->i++;
        if (r->i < r->n && r->s[r->i] == '?') {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':')
                r->i += 2;
            else
                return rx_fail(r, at, LLM_ERR_UNSUPPORTED,
                               "lookaround and named groups are not supported");
        }
        llmi_gtext_puts(r->out, "(");
        LLMI_TRY(parse_alt(r));
        if (r->i >= r->n || r->s[r->i] != ')')
            return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "unclosed '('");
        r->i++;
        r->depth--;
        llmi_gtext_puts(r->out, ")");
        return LLM_OK;
    }
    if (c == '[')
        return parse_class(r);
    if (c == '.') {
        r->i++;
        ranges rg = {.n = 0};
        add_range(&rg, '\n', '\n');
        normalize(&rg, true);
        emit_class(r, &rg);
        return LLM_OK;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "quantifier without anything to repeat");
    if (c == '^' || c == '$')
        return rx_fail(r, at, LLM_ERR_UNSUPPORTED, "anchors are only supported at the ends");
    if (c == ')')
        return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "unmatched ')'");
    if (c == '\\') {
        if (r->i + 1 >= r->n)
            return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "unfinished escape");
        char e = r->s[r->i + 1];
        bool neg;
        ranges rg = {.n = 0};
        if (shorthand(e, &rg, &neg)) {
            r->i += 2;
            normalize(&rg, neg);
            emit_class(r, &rg);
            return LLM_OK;
        }
        r->i += 2;
        uint32_t cp;
        LLMI_TRY(escape_char(r, at, e, &cp));
        emit_char(r, cp);
        return LLM_OK;
    }
    uint32_t cp;
    LLMI_TRY(next_cp(r, &cp));
    emit_char(r, cp);
    return LLM_OK;
}

static llm_status parse_quant(rx *r) {
    size_t at = r->i;
    char c = r->s[r->i];
    if (c == '*' || c == '+' || c == '?') {
        r->i++;
        llmi_gtext_put(r->out, &c, 1);
    } else {
        size_t k = r->i + 1;
        unsigned long m = 0, n = 0;
        bool comma = false, has_n = false;
        size_t digits = 0;
        while (k < r->n && r->s[k] >= '0' && r->s[k] <= '9' && digits < 6)
            m = m * 10 + (unsigned long)(r->s[k++] - '0'), digits++;
        if (digits == 0)
            return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "bad {m,n}");
        if (k < r->n && r->s[k] == ',') {
            comma = true;
            k++;
            digits = 0;
            while (k < r->n && r->s[k] >= '0' && r->s[k] <= '9' && digits < 6)
                n = n * 10 + (unsigned long)(r->s[k++] - '0'), digits++;
            has_n = digits > 0;
        }
        if (k >= r->n || r->s[k] != '}')
            return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "bad {m,n}");
        if (has_n && n < m)
            return rx_fail(r, at, LLM_ERR_INVALID_ARGUMENT, "{m,n} with n < m");
        r->i = k + 1;
        if (!comma)
            llmi_gtext_printf(r->out, "{%lu}", m);
        else if (has_n)
            llmi_gtext_printf(r->out, "{%lu,%lu}", m, n);
        else
            llmi_gtext_printf(r->out, "{%lu,}", m);
    }
    if (r->i < r->n && (r->s[r->i] == '?' || r->s[r->i] == '+'))
        r->i++; /* lazy/possessive */
    return LLM_OK;
}

static bool at_end_anchor(const rx *r) { return r->i + 1 == r->n && r->s[r->i] == '$'; }

static llm_status parse_seq(rx *r) {
    bool any = false;
    while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')' && !at_end_anchor(r)) {
        /* each atom in a group so a quantifier applies to it alone */
        llmi_gtext_puts(r->out, "(");
        LLMI_TRY(parse_atom(r));
        llmi_gtext_puts(r->out, ")");
        char c = r->i < r->n ? r->s[r->i] : 0;
        if (c == '*' || c == '+' || c == '?' || c == '{')
            LLMI_TRY(parse_quant(r));
        llmi_gtext_puts(r->out, " ");
        any = true;
    }
    if (!any)
        llmi_gtext_puts(r->out, "\"\" ");
    return LLM_OK;
}

static llm_status parse_alt(rx *r) {
    LLMI_TRY(parse_seq(r));
    while (r->i < r->n && r->s[r->i] == '|') {
        r->i++;
        llmi_gtext_puts(r->out, "| ");
        LLMI_TRY(parse_seq(r));
    }
    return LLM_OK;
}

llm_status llmi_regex_emit(const char *re, size_t len, bool json, const char *where,
                           llmi_gtext *out) {
    rx r = {.s = re, .n = len, .out = out, .json = json, .where = where};
    if (r.n && r.s[0] == '^')
        r.i++;
    llmi_gtext_puts(out, "(");
    LLMI_TRY(parse_alt(&r));
    if (at_end_anchor(&r))
        r.i++;
    if (r.i < r.n)
        return rx_fail(&r, r.i, LLM_ERR_INVALID_ARGUMENT, "unmatched ')'");
    llmi_gtext_puts(out, ")");
    if (out->oom)
        return llmi_oom("regex");
    return LLM_OK;
}

llm_status llmi_regex_to_ebnf(const char *re, size_t len, char **text) {
    *text = NULL;
    if (!re && len)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "regex: NULL");
    llmi_gtext t = {0};
    llmi_gtext_puts(&t, "root ::= ");
    llm_status st = llmi_regex_emit(re ? re : "", len, false, "regex", &t);
    llmi_gtext_puts(&t, "\n");
    if (st == LLM_OK && t.oom)
        st = llmi_oom("regex");
    if (st != LLM_OK) {
        llmi_free(t.s);
        return st;
    }
    *text = t.s;
    return LLM_OK;
}

llm_status llmi_grammar_from_regex(const char *re, size_t len, llmi_grammar **out) {
    *out = NULL;
    char *text = NULL;
    LLMI_TRY(llmi_regex_to_ebnf(re, len, &text));
    llm_status st = llmi_grammar_from_ebnf(text, strlen(text), "root", out);
    llmi_free(text);
    return st;
}
