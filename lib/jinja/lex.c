/* The lexer: template text into tokens, with jinja2's whitespace control
 * as transformers configures it: "-" in a tag strips all whitespace on
 * that side; trim_blocks drops the first newline after a block or comment
 * tag; lstrip_blocks drops the spaces and tabs before a block or comment
 * tag that starts its line ("+" turns either off for one tag). */
#include "jinja/jinja_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    jctx *c;
    const char *s;
    size_t n, pos;
    uint32_t line;
    size_t line_start;
    token *toks;
    size_t n_toks, cap;
} lexer;

static void advance_to(lexer *L, size_t pos) {
    for (; L->pos < pos; L->pos++)
        if (L->s[L->pos] == '\n') {
            L->line++;
            L->line_start = L->pos + 1;
        }
}

static llm_status lex_fail(lexer *L, const char *what) {
    return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat template line %u:%zu: syntax error: %s",
                      L->line, L->pos - L->line_start + 1, what);
}

static llm_status push(lexer *L, tok_kind k, const char *s, size_t n, token **out) {
    if (L->n_toks == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 64;
        token *t = jx_alloc(L->c, cap * sizeof *t);
        if (!t)
            return jx_oom(L->c);
        if (L->n_toks)
            memcpy(t, L->toks, L->n_toks * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    token *t = &L->toks[L->n_toks++];
    *t = (token){.k = k, .line = L->line, .col = (uint32_t)(L->pos - L->line_start + 1)};
    if (s) {
        char *copy = jx_alloc(L->c, n + 1);
        if (!copy)
            return jx_oom(L->c);
        memcpy(copy, s, n);
        copy[n] = '\0';
        t->s = copy;
        t->n = n;
    }
    if (out)
        *out = t;
    return LLM_OK;
}

static bool is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}
static bool name_start(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* A quoted string at L->pos: its value with Python's escapes decoded. */
static llm_status lex_string(lexer *L) {
    char q = L->s[L->pos];
    size_t i = L->pos + 1;
    while (i < L->n && L->s[i] != q)
        i += (L->s[i] == '\\' && i + 1 < L->n) ? 2 : 1;
    if (i >= L->n)
        return lex_fail(L, "unterminated string");
    size_t raw = i - L->pos - 1;
    char *v = jx_alloc(L->c, raw * 2 + 1);
    if (!v)
        return jx_oom(L->c);
    size_t n = 0;
    for (size_t k = L->pos + 1; k < i; k++) {
        char ch = L->s[k];
        if (ch != '\\' || k + 1 >= i) {
            v[n++] = ch;
            continue;
        }
        char e = L->s[++k];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t cp = 0;
            int d = 0;
            for (; d < digits && k + 1 + (size_t)d < i && hexval(L->s[k + 1 + d]) >= 0; d++)
                cp = cp * 16 + (uint32_t)hexval(L->s[k + 1 + d]);
            if (d < digits || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                return lex_fail(L, "bad escape in a string");
            n += llmi_utf8_encode(cp, v + n);
            k += (size_t)digits;
            continue;
        }
        const char *from = "ntr\\'\"0abfv\n", *to = "\n\t\r\\'\"\0\a\b\f\v";
        const char *hit = strchr(from, e);
        if (hit && e != '\n') {
            v[n++] = to[hit - from];
        } else if (e == '\n') {
            /* a backslash-newline continues the line */
        } else {
            v[n++] = '\\';
            v[n++] = e;
        }
    }
    v[n] = '\0';
    token *t;
    LLMI_TRY(push(L, T_STRING, NULL, 0, &t));
    t->s = v;
    t->n = n;
    advance_to(L, i + 1);
    return LLM_OK;
}

static llm_status lex_number(lexer *L) {
    size_t i = L->pos;
    bool is_float = false;
    char buf[64];
    size_t nb = 0;
    while (i < L->n && (is_digit(L->s[i]) || L->s[i] == '_'))
        if (L->s[i++] != '_' && nb < sizeof buf - 1)
            buf[nb++] = L->s[i - 1];
    if (i + 1 < L->n && L->s[i] == '.' && is_digit(L->s[i + 1])) {
        is_float = true;
        buf[nb < sizeof buf - 1 ? nb++ : nb] = '.';
        i++;
        while (i < L->n && (is_digit(L->s[i]) || L->s[i] == '_'))
            if (L->s[i++] != '_' && nb < sizeof buf - 1)
                buf[nb++] = L->s[i - 1];
    }
    if (i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
        size_t k = i + 1;
        if (k < L->n && (L->s[k] == '+' || L->s[k] == '-'))
            k++;
        if (k < L->n && is_digit(L->s[k])) {
            is_float = true;
            while (i < k && nb < sizeof buf - 1)
                buf[nb++] = L->s[i++];
            while (i < L->n && is_digit(L->s[i]))
                if (nb < sizeof buf - 1)
                    buf[nb++] = L->s[i++];
                else
                    i++;
        }
    }
    buf[nb] = '\0';
    token *t;
    LLMI_TRY(push(L, is_float ? T_FLOAT : T_INT, NULL, 0, &t));
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (nb > 18 && (v > (unsigned long long)INT64_MAX || nb > 19))
            return lex_fail(L, "integer literal too large");
        t->i = (int64_t)v;
    }
    advance_to(L, i);
    return LLM_OK;
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                  "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                  "]",  "{",  "}",  ",",  ".",  ":",  "|"};

/* The expression tokens of one tag up to its end marker; *trim_after is
 * set by "-" before the end, *no_trim by "+". */
static llm_status lex_tag(lexer *L, bool block, bool *strip_after, bool *keep_newline) {
    const char *end = block ? "%}" : "}}";
    int depth = 0;
    for (;;) {
        while (L->pos < L->n && is_space(L->s[L->pos]))
            advance_to(L, L->pos + 1);
        if (L->pos >= L->n)
            return lex_fail(L, block ? "unclosed block tag" : "unclosed variable tag");
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        if (depth == 0 || left >= 2) {
            size_t m = (left >= 3 && (p[0] == '-' || p[0] == '+') && memcmp(p + 1, end, 2) == 0) ? 3
                       : (left >= 2 && memcmp(p, end, 2) == 0)                                   ? 2
                                                               : 0;
            if (m && !(m == 3 && p[0] == '+' && !block)) {
                *strip_after = m == 3 && p[0] == '-';
                *keep_newline = m == 3 && p[0] == '+';
                LLMI_TRY(push(L, block ? T_BLOCK_END : T_VAR_END, NULL, 0, NULL));
                advance_to(L, L->pos + m);
                return LLM_OK;
            }
        }
        char ch = *p;
        if (ch == '\'' || ch == '"') {
            LLMI_TRY(lex_string(L));
        } else if (is_digit(ch)) {
            LLMI_TRY(lex_number(L));
        } else if (name_start(ch)) {
            size_t i = L->pos;
            while (i < L->n && (name_start(L->s[i]) || is_digit(L->s[i])))
                i++;
            LLMI_TRY(push(L, T_NAME, p, i - L->pos, NULL));
            advance_to(L, i);
        } else {
            size_t k = 0;
            for (; k < sizeof OPS / sizeof *OPS; k++)
                if (strlen(OPS[k]) <= left && memcmp(p, OPS[k], strlen(OPS[k])) == 0)
                    break;
            if (k == sizeof OPS / sizeof *OPS)
                return lex_fail(L, "unexpected character");
            size_t len = strlen(OPS[k]);
            if (strchr("([{", OPS[k][0]) && len == 1)
                depth++;
            else if (strchr(")]}", OPS[k][0]) && len == 1 && depth > 0)
                depth--;
            LLMI_TRY(push(L, T_OP, OPS[k], len, NULL));
            advance_to(L, L->pos + len);
        }
    }
}

/* Start of the next tag at or after `from`, or n. */
static size_t next_tag(const lexer *L, size_t from) {
    for (size_t i = from; i + 1 < L->n; i++)
        if (L->s[i] == '{' && (L->s[i + 1] == '{' || L->s[i + 1] == '%' || L->s[i + 1] == '#'))
            return i;
    return L->n;
}

/* Emits the text [from, to), right-stripped for a "-" tag or left-stripped
 * (lstrip_blocks) when the tag starts its line. */
static llm_status emit_text(lexer *L, size_t from, size_t to, int strip) {
    size_t end = to;
    if (strip == 1) {
        while (end > from && is_space(L->s[end - 1]))
            end--;
    } else if (strip == 2) {
        size_t k = end;
        while (k > from && (L->s[k - 1] == ' ' || L->s[k - 1] == '\t'))
            k--;
        if (k == 0 || L->s[k - 1] == '\n')
            end = k;
        else if (k == from && from > 0 && L->s[from - 1] != '\n') {
            /* the line began before this text: only tags that ended it */
        }
    }
    if (end > from) {
        size_t save = L->pos;
        uint32_t sl = L->line;
        size_t sls = L->line_start;
        L->pos = from; /* positions the token at its text */
        LLMI_TRY(push(L, T_TEXT, L->s + from, end - from, NULL));
        L->pos = save;
        L->line = sl;
        L->line_start = sls;
    }
    return LLM_OK;
}

/* After {% raw %}: the text up to {% endraw %} as one text token. */
static llm_status lex_raw(lexer *L) {
    for (size_t i = next_tag(L, L->pos); i < L->n; i = next_tag(L, i + 1)) {
        if (L->s[i + 1] != '%')
            continue;
        size_t k = i + 2;
        bool strip_before = k < L->n && L->s[k] == '-';
        if (k < L->n && (L->s[k] == '-' || L->s[k] == '+'))
            k++;
        while (k < L->n && is_space(L->s[k]))
            k++;
        if (L->n - k < 6 || memcmp(L->s + k, "endraw", 6) != 0)
            continue;
        LLMI_TRY(emit_text(L, L->pos, i, strip_before ? 1 : 2));
        advance_to(L, i + 2);
        LLMI_TRY(push(L, T_BLOCK_BEGIN, NULL, 0, NULL));
        return LLM_OK; /* the lexer goes on with "endraw %}" */
    }
    return lex_fail(L, "{% raw %} without {% endraw %}");
}

llm_status jx_lex(jctx *c, token **toks, size_t *n) {
    lexer L = {.c = c, .s = c->src, .n = c->src_len, .line = 1};
    /* jinja2 drops one newline at the end of the template
     * (keep_trailing_newline=False) */
    if (L.n && L.s[L.n - 1] == '\n')
        L.n -= (L.n >= 2 && L.s[L.n - 2] == '\r') ? 2 : 1;
    bool strip_next = false, trim_newline = false;
    while (L.pos < L.n) {
        if (strip_next)
            while (L.pos < L.n && is_space(L.s[L.pos]))
                advance_to(&L, L.pos + 1);
        else if (trim_newline && L.pos < L.n) {
            if (L.s[L.pos] == '\n')
                advance_to(&L, L.pos + 1);
            else if (L.pos + 1 < L.n && L.s[L.pos] == '\r' && L.s[L.pos + 1] == '\n')
                advance_to(&L, L.pos + 2);
        }
        strip_next = trim_newline = false;
        size_t t = next_tag(&L, L.pos);
        char kind = t < L.n ? L.s[t + 1] : 0;
        char mod = t + 2 < L.n ? L.s[t + 2] : 0;
        bool blockish = kind == '%' || kind == '#';
        LLMI_TRY(emit_text(&L, L.pos, t, mod == '-' ? 1 : (blockish && mod != '+') ? 2 : 0));
        advance_to(&L, t);
        if (t >= L.n)
            break;
        size_t body = t + 2 + (mod == '-' || (mod == '+' && blockish));
        if (kind == '#') {
            const char *e = NULL;
            for (size_t i = body; i + 1 < L.n; i++)
                if (L.s[i] == '#' && L.s[i + 1] == '}') {
                    e = L.s + i;
                    break;
                }
            if (!e)
                return lex_fail(&L, "unclosed comment");
            size_t close = (size_t)(e - L.s);
            strip_next = close > body && L.s[close - 1] == '-';
            trim_newline = !(close > body && L.s[close - 1] == '+');
            advance_to(&L, close + 2);
            continue;
        }
        LLMI_TRY(push(&L, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, NULL, 0, NULL));
        advance_to(&L, body);
        size_t first = L.n_toks;
        bool keep = false;
        LLMI_TRY(lex_tag(&L, kind == '%', &strip_next, &keep));
        trim_newline = kind == '%' && !keep && !strip_next;
        if (kind == '%' && L.n_toks == first + 2 && L.toks[first].k == T_NAME &&
            strcmp(L.toks[first].s, "raw") == 0) {
            if (strip_next)
                while (L.pos < L.n && is_space(L.s[L.pos]))
                    advance_to(&L, L.pos + 1);
            else if (trim_newline && L.pos < L.n && L.s[L.pos] == '\n')
                advance_to(&L, L.pos + 1);
            strip_next = trim_newline = false;
            LLMI_TRY(lex_raw(&L));
            bool s2 = false, k2 = false;
            if (L.pos < L.n && (L.s[L.pos] == '-' || L.s[L.pos] == '+'))
                advance_to(&L, L.pos + 1);
            LLMI_TRY(lex_tag(&L, true, &s2, &k2));
            strip_next = s2;
            trim_newline = !k2 && !s2;
        }
    }
    LLMI_TRY(push(&L, T_EOF, NULL, 0, NULL));
    *toks = L.toks;
    *n = L.n_toks;
    return LLM_OK;
}
