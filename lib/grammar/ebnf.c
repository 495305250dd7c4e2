/* GBNF, the EBNF notation of llama.cpp's grammars:
 *
 *   name ::= alternative | alternative ...     (a rule; "root" starts)
 *   "literal" with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes
 *   [a-z_] [^"\\] character classes (ranges, negation), . any character
 *   ( ... ) groups; X* X+ X? X{m} X{m,} X{m,n} repetitions; # comments
 *
 * A rule runs until the next "name ::=". Groups and repetitions become
 * generated rules; a repetition is right-recursive so the matcher's stacks
 * stay flat (a rule reference in tail position reuses its caller's frame). */
#include "grammar/build.h"

#include <stdlib.h>

/* MAX_ELEMENTS bounds what repetitions expand to (nested {m,n} multiply). */
enum { MAX_REPEAT = 4096, MAX_DEPTH = 256, MAX_ELEMENTS = 1 << 22 };

typedef struct parser {
    const char *s;
    size_t n, i;
    llmi_gbuild *b;
    uint32_t rule;           /* the rule being defined, for generated names */
    uint32_t ascii_cls[128]; /* class of each single ASCII character, + 1 */
    uint32_t depth;
    uint64_t expanded; /* elements written by repetitions so far */
} parser;

static void line_col(const parser *p, size_t at, uint32_t *line, uint32_t *col) {
    *line = 1;
    *col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') {
            ++*line;
            *col = 1;
        } else if (((unsigned char)p->s[k] & 0xC0) != 0x80) {
            ++*col;
        }
    }
}

static llm_status fail_at(const parser *p, size_t at, llm_status st, const char *what) {
    uint32_t line, col;
    line_col(p, at, &line, &col);
    return llmi_error(st, "grammar %u:%u: %s", line, col, what);
}

static void skip_space(parser *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n')
                p->i++;
        } else {
            break;
        }
    }
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

static size_t name_len(const parser *p, size_t at) {
    size_t k = at;
    while (k < p->n && is_name_char(p->s[k]))
        k++;
    return k - at;
}

/* Whether a rule definition ("name ::=") starts at the current position. */
static bool at_definition(parser *p) {
    size_t len = name_len(p, p->i);
    if (len == 0)
        return false;
    size_t k = p->i + len;
    while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t'))
        k++;
    return k + 3 <= p->n && memcmp(p->s + k, "::=", 3) == 0;
}

static int hex_val(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class, escapes decoded. */
static llm_status read_char(parser *p, uint32_t *cp) {
    size_t at = p->i;
    if (p->i >= p->n)
        return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "unexpected end of grammar");
    unsigned char c = (unsigned char)p->s[p->i];
    if (c != '\\') {
        size_t used = llmi_grammar_utf8_decode(p->s + p->i, p->n - p->i, cp);
        if (used == 0)
            return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "invalid UTF-8");
        p->i += used;
        return LLM_OK;
    }
    if (p->i + 1 >= p->n)
        return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "unfinished escape");
    char e = p->s[p->i + 1];
    p->i += 2;
    int digits = 0;
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
    case '\\':
    case '"':
    case ']':
    case '[':
    case '-':
    case '^':
    case '/':
    case '.':
        *cp = (uint32_t)e;
        return LLM_OK;
    case 'x':
        digits = 2;
        break;
    case 'u':
        digits = 4;
        break;
    case 'U':
        digits = 8;
        break;
    default:
        return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "unknown escape");
    }
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        int h = p->i < p->n ? hex_val(p->s[p->i]) : -1;
        if (h < 0)
            return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "bad hexadecimal escape");
        v = v * 16 + (uint32_t)h;
        p->i++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "escape is not a Unicode scalar value");
    *cp = v;
    return LLM_OK;
}

static llm_status single_char_class(parser *p, uint32_t cp, uint32_t *cls) {
    if (cp < 128 && p->ascii_cls[cp]) {
        *cls = p->ascii_cls[cp] - 1;
        return LLM_OK;
    }
    uint32_t pair[2] = {cp, cp};
    LLMI_TRY(llmi_gbuild_class(p->b, pair, 1, false, cls));
    if (cp < 128)
        p->ascii_cls[cp] = *cls + 1;
    return LLM_OK;
}

static llm_status parse_literal(parser *p, llmi_gseq *item) {
    size_t at = p->i;
    p->i++; /* opening quote */
    for (;;) {
        if (p->i >= p->n)
            return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "unterminated string");
        if (p->s[p->i] == '"') {
            p->i++;
            return LLM_OK;
        }
        uint32_t cp, cls;
        LLMI_TRY(read_char(p, &cp));
        LLMI_TRY(single_char_class(p, cp, &cls));
        LLMI_TRY(llmi_gseq_push(item, LLMI_GEL_CHAR, cls));
    }
}

static llm_status parse_class(parser *p, llmi_gseq *item) {
    size_t at = p->i;
    p->i++; /* [ */
    bool negate = p->i < p->n && p->s[p->i] == '^';
    if (negate)
        p->i++;
    uint32_t *pairs = NULL, n = 0, cap = 0;
    llm_status st = LLM_OK;
    while (st == LLM_OK) {
        if (p->i >= p->n) {
            st = fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "unterminated character class");
            break;
        }
        if (p->s[p->i] == ']') {
            p->i++;
            break;
        }
        uint32_t lo, hi;
        st = read_char(p, &lo);
        if (st != LLM_OK)
            break;
        hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            st = read_char(p, &hi);
            if (st == LLM_OK && hi < lo)
                st = fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "character range is reversed");
            if (st != LLM_OK)
                break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            uint32_t *q = llmi_realloc(pairs, (size_t)cap * 2 * sizeof *pairs);
            if (!q) {
                st = llmi_oom("grammar class");
                break;
            }
            pairs = q;
        }
        pairs[2 * n] = lo;
        pairs[2 * n + 1] = hi;
        n++;
    }
    uint32_t cls = 0;
    if (st == LLM_OK)
        st = llmi_gbuild_class(p->b, pairs, n, negate, &cls);
    llmi_free(pairs);
    if (st == LLM_OK && p->b->cls[cls].n == 0)
        st = fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "character class matches nothing");
    if (st == LLM_OK)
        st = llmi_gseq_push(item, LLMI_GEL_CHAR, cls);
    return st;
}

static llm_status parse_alternatives(parser *p, uint32_t rule, bool nested);

/* X* as  R ::= X R | "" */
static llm_status star_rule(parser *p, const llmi_gseq *item, uint32_t *out) {
    uint32_t r = llmi_gbuild_synth(p->b, p->b->rules[p->rule].name);
    if (r == UINT32_MAX)
        return llmi_oom("grammar");
    llmi_gseq *alt = llmi_gbuild_alt(p->b, r);
    if (!alt)
        return llmi_oom("grammar");
    LLMI_TRY(llmi_gseq_append(alt, item));
    LLMI_TRY(llmi_gseq_push(alt, LLMI_GEL_RULE, r));
    if (!llmi_gbuild_alt(p->b, r))
        return llmi_oom("grammar");
    *out = r;
    return LLM_OK;
}

/* Applies {min, max} (max UINT32_MAX: unbounded) to item, in place. */
static llm_status repeat(parser *p, llmi_gseq *item, uint32_t min, uint32_t max) {
    llmi_gseq x = *item, out = {0};
    llm_status st = LLM_OK;
    p->expanded += (uint64_t)(x.n + 1) * (max == UINT32_MAX ? (uint64_t)min + 1 : (uint64_t)max);
    if (p->expanded > MAX_ELEMENTS) {
        llmi_free(x.v);
        memset(item, 0, sizeof *item);
        return llmi_error(LLM_ERR_LIMIT, "grammar: repetitions expand to more than %d elements",
                          MAX_ELEMENTS);
    }
    for (uint32_t k = 0; k < min && st == LLM_OK; k++)
        st = llmi_gseq_append(&out, &x);
    uint32_t r = UINT32_MAX;
    if (st == LLM_OK && max == UINT32_MAX) {
        st = star_rule(p, &x, &r);
    } else if (st == LLM_OK && max > min) {
        /* nested optionals, innermost first: R_k ::= X R_{k+1} | "" */
        for (uint32_t k = max - min; k > 0 && st == LLM_OK; k--) {
            uint32_t inner = r;
            r = llmi_gbuild_synth(p->b, p->b->rules[p->rule].name);
            llmi_gseq *alt = r == UINT32_MAX ? NULL : llmi_gbuild_alt(p->b, r);
            if (!alt) {
                st = llmi_oom("grammar");
                break;
            }
            st = llmi_gseq_append(alt, &x);
            if (st == LLM_OK && inner != UINT32_MAX)
                st = llmi_gseq_push(alt, LLMI_GEL_RULE, inner);
            if (st == LLM_OK && !llmi_gbuild_alt(p->b, r))
                st = llmi_oom("grammar");
        }
    }
    if (st == LLM_OK && r != UINT32_MAX)
        st = llmi_gseq_push(&out, LLMI_GEL_RULE, r);
    llmi_free(x.v);
    *item = out;
    if (st != LLM_OK) {
        llmi_free(out.v);
        memset(item, 0, sizeof *item);
    }
    return st;
}

static llm_status parse_count(parser *p, uint32_t *v) {
    size_t at = p->i;
    uint64_t x = 0;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
        return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "expected a number in {m,n}");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (x > MAX_REPEAT)
            return fail_at(p, at, LLM_ERR_UNSUPPORTED, "repetition count above 4096");
    }
    *v = (uint32_t)x;
    return LLM_OK;
}

static llm_status parse_quantifier(parser *p, llmi_gseq *item) {
    size_t at = p->i;
    char c = p->s[p->i];
    uint32_t min = 0, max = UINT32_MAX;
    p->i++;
    if (c == '+') {
        min = 1;
    } else if (c == '?') {
        max = 1;
    } else if (c == '{') {
        skip_space(p);
        LLMI_TRY(parse_count(p, &min));
        skip_space(p);
        max = min;
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            skip_space(p);
            max = UINT32_MAX;
            if (p->i < p->n && p->s[p->i] != '}')
                LLMI_TRY(parse_count(p, &max));
            skip_space(p);
        }
        if (p->i >= p->n || p->s[p->i] != '}')
            return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "expected '}'");
        p->i++;
        if (max < min)
            return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "{m,n} with n < m");
    }
    return repeat(p, item, min, max);
}

static llm_status parse_item(parser *p, llmi_gseq *item) {
    size_t at = p->i;
    char c = p->s[p->i];
    if (c == '"')
        return parse_literal(p, item);
    if (c == '[')
        return parse_class(p, item);
    if (c == '.') {
        p->i++;
        uint32_t cls, none[2] = {0, 0};
        LLMI_TRY(llmi_gbuild_class(p->b, none, 0, true, &cls));
        return llmi_gseq_push(item, LLMI_GEL_CHAR, cls);
    }
    if (c == '(') {
        if (++p->depth > MAX_DEPTH)
            return fail_at(p, at, LLM_ERR_UNSUPPORTED, "groups nested deeper than 256");
        p->i++;
        uint32_t r = llmi_gbuild_synth(p->b, p->b->rules[p->rule].name);
        if (r == UINT32_MAX)
            return llmi_oom("grammar");
        LLMI_TRY(parse_alternatives(p, r, true));
        skip_space(p);
        if (p->i >= p->n || p->s[p->i] != ')')
            return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "unclosed '('");
        p->i++;
        p->depth--;
        return llmi_gseq_push(item, LLMI_GEL_RULE, r);
    }
    size_t len = name_len(p, p->i);
    if (len == 0)
        return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "unexpected character");
    uint32_t r = llmi_gbuild_rule(p->b, p->s + p->i, len);
    if (r == UINT32_MAX)
        return llmi_oom("grammar");
    if (!p->b->rules[r].ref_line)
        line_col(p, at, &p->b->rules[r].ref_line, &p->b->rules[r].ref_col);
    p->i += len;
    return llmi_gseq_push(item, LLMI_GEL_RULE, r);
}

static llm_status parse_sequence(parser *p, llmi_gseq *alt) {
    for (;;) {
        skip_space(p);
        if (p->i >= p->n)
            return LLM_OK;
        char c = p->s[p->i];
        if (c == '|' || c == ')' || at_definition(p))
            return LLM_OK;
        llmi_gseq item = {0};
        llm_status st = parse_item(p, &item);
        if (st == LLM_OK && p->i < p->n &&
            (p->s[p->i] == '*' || p->s[p->i] == '+' || p->s[p->i] == '?' || p->s[p->i] == '{'))
            st = parse_quantifier(p, &item);
        if (st == LLM_OK)
            st = llmi_gseq_append(alt, &item);
        llmi_free(item.v);
        if (st != LLM_OK)
            return st;
    }
}

static llm_status parse_alternatives(parser *p, uint32_t rule, bool nested) {
    for (;;) {
        /* Alternatives of a generated rule are built in a local sequence:
         * parsing it may add rules and move the builder's arrays. */
        llmi_gseq seq = {0};
        llm_status st = parse_sequence(p, &seq);
        llmi_gseq *alt = st == LLM_OK ? llmi_gbuild_alt(p->b, rule) : NULL;
        if (st == LLM_OK && !alt)
            st = llmi_oom("grammar");
        if (st != LLM_OK) {
            llmi_free(seq.v);
            return st;
        }
        *alt = seq;
        skip_space(p);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        if (!nested && p->i < p->n && p->s[p->i] == ')')
            return fail_at(p, p->i, LLM_ERR_INVALID_ARGUMENT, "unmatched ')'");
        return LLM_OK;
    }
}

static llm_status parse_grammar(parser *p) {
    for (;;) {
        skip_space(p);
        if (p->i >= p->n)
            return LLM_OK;
        size_t at = p->i, len = name_len(p, p->i);
        if (!at_definition(p))
            return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "expected a rule: name ::= ...");
        uint32_t r = llmi_gbuild_rule(p->b, p->s + p->i, len);
        if (r == UINT32_MAX)
            return llmi_oom("grammar");
        if (p->b->rules[r].defined)
            return fail_at(p, at, LLM_ERR_INVALID_ARGUMENT, "rule defined twice");
        p->b->rules[r].defined = true;
        p->i += len;
        skip_space(p);
        p->i += 3; /* ::= */
        p->rule = r;
        LLMI_TRY(parse_alternatives(p, r, false));
    }
}

llm_status llmi_grammar_from_ebnf(const char *text, size_t len, const char *root,
                                  llmi_grammar **out) {
    *out = NULL;
    if (!text && len)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: text is NULL");
    llmi_gbuild b = {0};
    parser p = {.s = text ? text : "", .n = len, .b = &b};
    llm_status st = parse_grammar(&p);
    if (st == LLM_OK)
        st = llmi_gbuild_finish(&b, root ? root : "root", out);
    llmi_gbuild_free(&b);
    return st;
}
