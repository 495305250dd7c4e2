/* The parser: tokens into a syntax tree, with jinja2's grammar and
 * operator precedence (lowest first): inline if/else, or, and, not,
 * comparisons (==, !=, <, <=, >, >=, in, not in), + -, ~, * / // %, **,
 * unary - +, then postfix attribute, item, slice and call, then filters
 * (|) and tests (is). Nesting is bounded by the depth limit. */
#include "jinja/jinja_impl.h"

#include <stdio.h>
#include <string.h>

llm_status jp_nv_push(parser *p, nvec *a, node *x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 4;
        node **v = jx_alloc(p->c, cap * sizeof *v);
        if (!v)
            return jx_oom(p->c);
        if (a->n)
            memcpy(v, a->v, a->n * sizeof *v);
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return LLM_OK;
}

llm_status jp_sv_push(parser *p, svec *a, const char *s) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 4;
        const char **v = jx_alloc(p->c, cap * sizeof *v);
        if (!v)
            return jx_oom(p->c);
        if (a->n)
            memcpy(v, a->v, a->n * sizeof *v);
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = s;
    return LLM_OK;
}

const token *jp_cur(const parser *p) { return &p->t[p->i]; }
static const token *peek(const parser *p, size_t k) {
    return p->i + k < p->n ? &p->t[p->i + k] : &p->t[p->n - 1];
}

static const char *describe(const token *t) {
    switch (t->k) {
    case T_EOF:
        return "end of template";
    case T_TEXT:
        return "template text";
    case T_VAR_BEGIN:
        return "'{{'";
    case T_VAR_END:
        return "end of print statement";
    case T_BLOCK_BEGIN:
        return "'{%'";
    case T_BLOCK_END:
        return "end of statement block";
    case T_STRING:
        return "string";
    case T_INT:
        return "integer";
    case T_FLOAT:
        return "float";
    default:
        return t->s;
    }
}

llm_status jp_fail_at(const parser *p, const token *t, const char *fmt, const char *arg) {
    (void)p;
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat template line %u:%u: syntax error: %s",
                      t->line, t->col, msg);
}
llm_status jp_unexpected(const parser *p) {
    return jp_fail_at(p, jp_cur(p), "unexpected %s", describe(jp_cur(p)));
}

bool jp_is_op(const token *t, const char *op) { return t->k == T_OP && strcmp(t->s, op) == 0; }
bool jp_is_name(const token *t, const char *name) {
    return t->k == T_NAME && strcmp(t->s, name) == 0;
}
bool jp_skip_op(parser *p, const char *op) {
    if (!jp_is_op(jp_cur(p), op))
        return false;
    p->i++;
    return true;
}
bool jp_skip_name(parser *p, const char *name) {
    if (!jp_is_name(jp_cur(p), name))
        return false;
    p->i++;
    return true;
}
llm_status jp_expect_op(parser *p, const char *op) {
    if (!jp_skip_op(p, op))
        return jp_fail_at(p, jp_cur(p), "expected '%s'", op);
    return LLM_OK;
}
llm_status jp_expect_kind(parser *p, tok_kind k, const char *what) {
    if (jp_cur(p)->k != k)
        return jp_fail_at(p, jp_cur(p), "expected %s", what);
    p->i++;
    return LLM_OK;
}

llm_status jp_new_node(parser *p, node_kind k, const token *at, node **out) {
    node *x = jx_alloc(p->c, sizeof *x);
    if (!x)
        return jx_oom(p->c);
    *x = (node){.k = k, .line = at->line, .col = at->col};
    *out = x;
    return LLM_OK;
}

llm_status jp_enter(parser *p) {
    if (++p->depth > p->c->lim.max_depth)
        return llmi_error(LLM_ERR_LIMIT, "chat template line %u:%u: nesting deeper than %u",
                          jp_cur(p)->line, jp_cur(p)->col, p->c->lim.max_depth);
    return LLM_OK;
}

static llm_status parse_or(parser *p, node **out);
static llm_status parse_unary(parser *p, bool with_filter, node **out);
static llm_status parse_primary(parser *p, node **out);
static llm_status parse_postfix(parser *p, node **x);

/* Comma-separated expressions up to a closing `close`; a trailing comma is
 * allowed. */
static llm_status parse_items(parser *p, const char *close, nvec *items, nvec *values) {
    while (!jp_is_op(jp_cur(p), close)) {
        if (items->n)
            LLMI_TRY(jp_expect_op(p, ","));
        if (jp_is_op(jp_cur(p), close))
            break;
        node *x = NULL;
        LLMI_TRY(jp_expr(p, true, &x));
        LLMI_TRY(jp_nv_push(p, items, x));
        if (values) {
            LLMI_TRY(jp_expect_op(p, ":"));
            LLMI_TRY(jp_expr(p, true, &x));
            LLMI_TRY(jp_nv_push(p, values, x));
        }
    }
    p->i++;
    return LLM_OK;
}

/* ( args ): positional, then name=value keywords */
llm_status jp_call_args(parser *p, node *call) {
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    p->i++; /* ( */
    while (!jp_is_op(jp_cur(p), ")")) {
        if (args.n || kwn.n)
            LLMI_TRY(jp_expect_op(p, ","));
        if (jp_is_op(jp_cur(p), ")"))
            break;
        node *x = NULL;
        if (jp_cur(p)->k == T_NAME && jp_is_op(peek(p, 1), "=")) {
            LLMI_TRY(jp_sv_push(p, &kwn, jp_cur(p)->s));
            p->i += 2;
            LLMI_TRY(jp_expr(p, true, &x));
            LLMI_TRY(jp_nv_push(p, &kwv, x));
        } else {
            if (kwn.n)
                return jp_fail_at(p, jp_cur(p), "%s",
                                  "a positional argument follows a keyword one");
            LLMI_TRY(jp_expr(p, true, &x));
            LLMI_TRY(jp_nv_push(p, &args, x));
        }
    }
    p->i++;
    call->kids = args.v;
    call->n = args.n;
    call->kids2 = kwv.v;
    call->n2 = kwv.n;
    call->names = kwn.v;
    call->n_names = kwn.n;
    return LLM_OK;
}

static llm_status parse_subscript(parser *p, node **x) {
    const token *at = jp_cur(p);
    p->i++; /* [ */
    node *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (jp_is_op(jp_cur(p), "]"))
            break;
        if (jp_is_op(jp_cur(p), ":")) {
            if (++k > 2)
                return jp_unexpected(p);
            slice = true;
            p->i++;
            continue;
        }
        if (parts[k])
            return jp_unexpected(p);
        LLMI_TRY(jp_expr(p, true, &parts[k]));
    }
    p->i++;
    node *r = NULL;
    if (slice) {
        LLMI_TRY(jp_new_node(p, N_SLICE, at, &r));
        node **kids = jx_alloc(p->c, 3 * sizeof *kids);
        if (!kids)
            return jx_oom(p->c);
        memcpy(kids, parts, sizeof parts);
        r->kids = kids;
        r->n = 3;
    } else {
        if (!parts[0])
            return jp_fail_at(p, at, "%s", "empty subscript");
        LLMI_TRY(jp_new_node(p, N_ITEM, at, &r));
        r->b = parts[0];
    }
    r->a = *x;
    *x = r;
    return LLM_OK;
}

static llm_status parse_postfix(parser *p, node **x) {
    for (;;) {
        const token *t = jp_cur(p);
        node *r = NULL;
        if (jp_is_op(t, ".")) {
            p->i++;
            const token *nt = jp_cur(p);
            if (nt->k == T_NAME) {
                LLMI_TRY(jp_new_node(p, N_ATTR, t, &r));
                r->name = nt->s;
            } else if (nt->k == T_INT) {
                LLMI_TRY(jp_new_node(p, N_ITEM, t, &r));
                LLMI_TRY(jp_new_node(p, N_LIT, nt, &r->b));
                r->b->lit = jv_int(nt->i);
            } else {
                return jp_fail_at(p, nt, "%s", "expected a name after '.'");
            }
            p->i++;
            r->a = *x;
            *x = r;
        } else if (jp_is_op(t, "[")) {
            LLMI_TRY(parse_subscript(p, x));
        } else if (jp_is_op(t, "(")) {
            LLMI_TRY(jp_new_node(p, N_CALL, t, &r));
            r->a = *x;
            LLMI_TRY(jp_call_args(p, r));
            *x = r;
        } else {
            return LLM_OK;
        }
    }
}

static llm_status parse_filter_expr(parser *p, node **x) {
    for (;;) {
        const token *t = jp_cur(p);
        if (jp_is_op(t, "|")) {
            p->i++;
            if (jp_cur(p)->k != T_NAME)
                return jp_fail_at(p, jp_cur(p), "%s", "expected a filter name after '|'");
            node *f = NULL;
            LLMI_TRY(jp_new_node(p, N_FILTER, jp_cur(p), &f));
            f->name = jp_cur(p)->s;
            p->i++;
            if (jp_is_op(jp_cur(p), "("))
                LLMI_TRY(jp_call_args(p, f));
            f->a = *x;
            *x = f;
        } else if (jp_is_name(t, "is")) {
            p->i++;
            node *f = NULL;
            bool neg = jp_skip_name(p, "not");
            if (jp_cur(p)->k != T_NAME)
                return jp_fail_at(p, jp_cur(p), "%s", "expected a test name after 'is'");
            LLMI_TRY(jp_new_node(p, N_TEST, jp_cur(p), &f));
            f->name = jp_cur(p)->s;
            f->op = neg;
            p->i++;
            const token *n = jp_cur(p);
            if (jp_is_op(n, "(")) {
                LLMI_TRY(jp_call_args(p, f));
            } else if ((n->k == T_NAME || n->k == T_STRING || n->k == T_INT || n->k == T_FLOAT ||
                        jp_is_op(n, "[") || jp_is_op(n, "{")) &&
                       !jp_is_name(n, "else") && !jp_is_name(n, "or") && !jp_is_name(n, "and")) {
                node *arg = NULL;
                LLMI_TRY(parse_primary(p, &arg));
                LLMI_TRY(parse_postfix(p, &arg));
                f->kids = jx_alloc(p->c, sizeof *f->kids);
                if (!f->kids)
                    return jx_oom(p->c);
                f->kids[0] = arg;
                f->n = 1;
            }
            f->a = *x;
            *x = f;
        } else if (jp_is_op(t, "(")) {
            node *r = NULL;
            LLMI_TRY(jp_new_node(p, N_CALL, t, &r));
            r->a = *x;
            LLMI_TRY(jp_call_args(p, r));
            *x = r;
        } else {
            return LLM_OK;
        }
    }
}

static llm_status parse_primary(parser *p, node **out) {
    const token *t = jp_cur(p);
    node *x = NULL;
    LLMI_TRY(jp_enter(p));
    if (t->k == T_NAME) {
        static const char *const lits[] = {"true", "false", "none", "True", "False", "None"};
        size_t k = 0;
        while (k < 6 && strcmp(t->s, lits[k]) != 0)
            k++;
        if (k < 6) {
            LLMI_TRY(jp_new_node(p, N_LIT, t, &x));
            x->lit = k % 3 == 2 ? jv_none() : jv_bool(k % 3 == 0);
        } else {
            LLMI_TRY(jp_new_node(p, N_NAME, t, &x));
            x->name = t->s;
        }
        p->i++;
    } else if (t->k == T_STRING) {
        /* adjacent literals join, as in Python */
        size_t len = 0, k = p->i;
        for (; p->t[k].k == T_STRING; k++)
            len += p->t[k].n;
        jstr *s = jx_alloc(p->c, sizeof *s + len + 1);
        if (!s)
            return jx_oom(p->c);
        s->n = 0;
        for (; p->i < k; p->i++) {
            memcpy(s->s + s->n, p->t[p->i].s, p->t[p->i].n);
            s->n += p->t[p->i].n;
        }
        s->s[len] = '\0';
        LLMI_TRY(jp_new_node(p, N_LIT, t, &x));
        x->lit = jv_str(s);
    } else if (t->k == T_INT || t->k == T_FLOAT) {
        LLMI_TRY(jp_new_node(p, N_LIT, t, &x));
        x->lit = t->k == T_INT ? jv_int(t->i) : jv_float(t->f);
        p->i++;
    } else if (jp_is_op(t, "(")) {
        p->i++;
        nvec items = {0};
        bool comma = false;
        while (!jp_is_op(jp_cur(p), ")")) {
            if (items.n) {
                LLMI_TRY(jp_expect_op(p, ","));
                comma = true;
                if (jp_is_op(jp_cur(p), ")"))
                    break;
            }
            LLMI_TRY(jp_expr(p, true, &x));
            LLMI_TRY(jp_nv_push(p, &items, x));
        }
        p->i++;
        if (items.n == 1 && !comma) {
            x = items.v[0];
        } else {
            LLMI_TRY(jp_new_node(p, N_TUPLE, t, &x));
            x->kids = items.v;
            x->n = items.n;
        }
    } else if (jp_is_op(t, "[")) {
        p->i++;
        nvec items = {0};
        LLMI_TRY(parse_items(p, "]", &items, NULL));
        LLMI_TRY(jp_new_node(p, N_LIST, t, &x));
        x->kids = items.v;
        x->n = items.n;
    } else if (jp_is_op(t, "{")) {
        p->i++;
        nvec keys = {0}, values = {0};
        LLMI_TRY(parse_items(p, "}", &keys, &values));
        LLMI_TRY(jp_new_node(p, N_DICT, t, &x));
        x->kids = keys.v;
        x->n = keys.n;
        x->kids2 = values.v;
        x->n2 = values.n;
    } else {
        return jp_fail_at(p, t, "expected an expression, got %s", describe(t));
    }
    p->depth--;
    *out = x;
    return LLM_OK;
}

static llm_status parse_unary(parser *p, bool with_filter, node **out) {
    const token *t = jp_cur(p);
    LLMI_TRY(jp_enter(p));
    if (jp_is_op(t, "-") || jp_is_op(t, "+")) {
        p->i++;
        LLMI_TRY(jp_new_node(p, jp_is_op(t, "-") ? N_NEG : N_POS, t, out));
        LLMI_TRY(parse_unary(p, false, &(*out)->a));
    } else {
        LLMI_TRY(parse_primary(p, out));
    }
    LLMI_TRY(parse_postfix(p, out));
    if (with_filter)
        LLMI_TRY(parse_filter_expr(p, out));
    p->depth--;
    return LLM_OK;
}

typedef llm_status (*level_fn)(parser *p, node **out);

/* One left-associative level of binary operators. */
static llm_status binary(parser *p, node **out, level_fn next, const char *const *ops, size_t nops,
                         const int *codes, node_kind kind) {
    LLMI_TRY(next(p, out));
    for (;;) {
        size_t k = 0;
        while (k < nops && !jp_is_op(jp_cur(p), ops[k]))
            k++;
        if (k == nops)
            return LLM_OK;
        node *x = NULL;
        LLMI_TRY(jp_new_node(p, kind, jp_cur(p), &x));
        p->i++;
        x->op = codes[k];
        x->a = *out;
        LLMI_TRY(next(p, &x->b));
        *out = x;
    }
}

static llm_status parse_unary_f(parser *p, node **out) { return parse_unary(p, true, out); }
static llm_status parse_pow(parser *p, node **out) {
    static const char *const ops[] = {"**"};
    static const int codes[] = {OP_POW};
    return binary(p, out, parse_unary_f, ops, 1, codes, N_BINOP);
}
static llm_status parse_math2(parser *p, node **out) {
    static const char *const ops[] = {"*", "/", "//", "%"};
    static const int codes[] = {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD};
    return binary(p, out, parse_pow, ops, 4, codes, N_BINOP);
}
static llm_status parse_concat(parser *p, node **out) {
    static const char *const ops[] = {"~"};
    static const int codes[] = {0};
    return binary(p, out, parse_math2, ops, 1, codes, N_CONCAT);
}
static llm_status parse_math1(parser *p, node **out) {
    static const char *const ops[] = {"+", "-"};
    static const int codes[] = {OP_ADD, OP_SUB};
    return binary(p, out, parse_concat, ops, 2, codes, N_BINOP);
}

static llm_status parse_compare(parser *p, node **out) {
    LLMI_TRY(parse_math1(p, out));
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const int codes[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
    nvec kids = {0};
    int opv[64];
    size_t nop = 0;
    for (;;) {
        const token *t = jp_cur(p);
        int op = 0;
        for (size_t k = 0; k < 6; k++)
            if (jp_is_op(t, ops[k]))
                op = codes[k];
        if (op) {
            p->i++;
        } else if (jp_is_name(t, "in")) {
            op = OP_IN;
            p->i++;
        } else if (jp_is_name(t, "not") && jp_is_name(peek(p, 1), "in")) {
            op = OP_NOTIN;
            p->i += 2;
        } else {
            break;
        }
        if (nop == 64)
            return jp_fail_at(p, t, "%s", "too many chained comparisons");
        if (!kids.n)
            LLMI_TRY(jp_nv_push(p, &kids, *out));
        node *x = NULL;
        LLMI_TRY(parse_math1(p, &x));
        LLMI_TRY(jp_nv_push(p, &kids, x));
        opv[nop++] = op;
    }
    if (!nop)
        return LLM_OK;
    node *x = NULL;
    LLMI_TRY(jp_new_node(p, N_COMPARE, &p->t[p->i - 1], &x));
    x->kids = kids.v;
    x->n = kids.n;
    x->ops = jx_alloc(p->c, nop * sizeof *x->ops);
    if (!x->ops)
        return jx_oom(p->c);
    memcpy(x->ops, opv, nop * sizeof *x->ops);
    x->line = kids.v[0]->line;
    x->col = kids.v[0]->col;
    *out = x;
    return LLM_OK;
}

static llm_status parse_not(parser *p, node **out) {
    if (jp_is_name(jp_cur(p), "not")) {
        LLMI_TRY(jp_enter(p));
        LLMI_TRY(jp_new_node(p, N_NOT, jp_cur(p), out));
        p->i++;
        LLMI_TRY(parse_not(p, &(*out)->a));
        p->depth--;
        return LLM_OK;
    }
    return parse_compare(p, out);
}

static llm_status logical(parser *p, node **out, level_fn next, const char *word, node_kind k) {
    LLMI_TRY(next(p, out));
    while (jp_is_name(jp_cur(p), word)) {
        node *x = NULL;
        LLMI_TRY(jp_new_node(p, k, jp_cur(p), &x));
        p->i++;
        x->a = *out;
        LLMI_TRY(next(p, &x->b));
        *out = x;
    }
    return LLM_OK;
}
static llm_status parse_and(parser *p, node **out) {
    return logical(p, out, parse_not, "and", N_AND);
}
static llm_status parse_or(parser *p, node **out) { return logical(p, out, parse_and, "or", N_OR); }

llm_status jp_expr(parser *p, bool condexpr, node **out) {
    LLMI_TRY(jp_enter(p));
    LLMI_TRY(parse_or(p, out));
    while (condexpr && jp_is_name(jp_cur(p), "if")) {
        node *x = NULL;
        LLMI_TRY(jp_new_node(p, N_COND, jp_cur(p), &x));
        p->i++;
        x->b = *out;
        LLMI_TRY(parse_or(p, &x->a));
        if (jp_skip_name(p, "else"))
            LLMI_TRY(jp_expr(p, true, &x->c));
        *out = x;
    }
    p->depth--;
    return LLM_OK;
}

/* expr or a bare tuple "a, b" (for {% set x = a, b %} and for-loop sources) */
llm_status jp_tuple(parser *p, bool condexpr, node **out) {
    const token *at = jp_cur(p);
    LLMI_TRY(jp_expr(p, condexpr, out));
    if (!jp_is_op(jp_cur(p), ","))
        return LLM_OK;
    nvec items = {0};
    LLMI_TRY(jp_nv_push(p, &items, *out));
    while (jp_skip_op(p, ",")) {
        if (jp_cur(p)->k == T_BLOCK_END || jp_cur(p)->k == T_VAR_END || jp_is_name(jp_cur(p), "if"))
            break;
        node *x = NULL;
        LLMI_TRY(jp_expr(p, condexpr, &x));
        LLMI_TRY(jp_nv_push(p, &items, x));
    }
    LLMI_TRY(jp_new_node(p, N_TUPLE, at, out));
    (*out)->kids = items.v;
    (*out)->n = items.n;
    return LLM_OK;
}
