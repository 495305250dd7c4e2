/* The statement half of the parser: template text, {{ }} and the block
 * tags (if, for, set, macro, call, filter, raw, break, continue and
 * transformers' generation tag), each into a node whose body is a list of
 * statements. */
#include "jinja/jinja_impl.h"

#include <stdio.h>
#include <string.h>

static llm_status parse_body(parser *p, const char *const *ends, nvec *body);

static bool is_end(const token *t, const char *const *ends) {
    if (t->k != T_NAME || !ends)
        return false;
    for (; *ends; ends++)
        if (strcmp(t->s, *ends) == 0)
            return true;
    return false;
}

static llm_status end_block(parser *p) {
    if (jp_cur(p)->k != T_BLOCK_END)
        return jp_fail_at(p, jp_cur(p), "%s", "expected the end of the statement block");
    p->i++;
    return LLM_OK;
}

/* The body up to one of `ends`, then that tag's name is consumed; *which is
 * the name it ended with. */
static llm_status body_until(parser *p, const char *const *ends, node *x, bool second,
                             const char **which) {
    nvec body = {0};
    LLMI_TRY(parse_body(p, ends, &body));
    if (second) {
        x->kids2 = body.v;
        x->n2 = body.n;
    } else {
        x->kids = body.v;
        x->n = body.n;
    }
    *which = jp_cur(p)->s;
    p->i++;
    return LLM_OK;
}

static llm_status parse_if(parser *p, node *x) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    LLMI_TRY(jp_tuple(p, true, &x->a));
    LLMI_TRY(end_block(p));
    const char *which;
    LLMI_TRY(body_until(p, ends, x, false, &which));
    if (strcmp(which, "elif") == 0) {
        node *e = NULL;
        LLMI_TRY(jp_new_node(p, N_IF, &p->t[p->i - 1], &e));
        LLMI_TRY(jp_enter(p));
        LLMI_TRY(parse_if(p, e));
        p->depth--;
        x->kids2 = jx_alloc(p->c, sizeof *x->kids2);
        if (!x->kids2)
            return jx_oom(p->c);
        x->kids2[0] = e;
        x->n2 = 1;
        return LLM_OK;
    }
    if (strcmp(which, "else") == 0) {
        static const char *const end[] = {"endif", NULL};
        LLMI_TRY(end_block(p));
        LLMI_TRY(body_until(p, end, x, true, &which));
    }
    return end_block(p);
}

/* loop or assignment targets: a name or names separated by commas,
 * optionally in parentheses */
static llm_status parse_targets(parser *p, node *x) {
    svec names = {0};
    bool paren = jp_skip_op(p, "(");
    do {
        if (jp_cur(p)->k != T_NAME)
            return jp_fail_at(p, jp_cur(p), "%s", "expected a variable name");
        LLMI_TRY(jp_sv_push(p, &names, jp_cur(p)->s));
        p->i++;
    } while (jp_skip_op(p, ","));
    if (paren)
        LLMI_TRY(jp_expect_op(p, ")"));
    x->names = names.v;
    x->n_names = names.n;
    return LLM_OK;
}

static llm_status parse_for(parser *p, node *x) {
    static const char *const ends[] = {"else", "endfor", NULL};
    LLMI_TRY(parse_targets(p, x));
    if (!jp_skip_name(p, "in"))
        return jp_fail_at(p, jp_cur(p), "%s", "expected 'in'");
    LLMI_TRY(jp_tuple(p, false, &x->a));
    if (jp_skip_name(p, "if"))
        LLMI_TRY(jp_expr(p, true, &x->b));
    if (jp_skip_name(p, "recursive"))
        return jp_fail_at(p, jp_cur(p), "%s", "recursive loops are not supported");
    LLMI_TRY(end_block(p));
    const char *which;
    LLMI_TRY(body_until(p, ends, x, false, &which));
    if (strcmp(which, "else") == 0) {
        static const char *const end[] = {"endfor", NULL};
        LLMI_TRY(end_block(p));
        LLMI_TRY(body_until(p, end, x, true, &which));
    }
    return end_block(p);
}

/* filters of a {% filter %} or block {% set %}: a chain with a NULL operand */
static llm_status parse_filter_chain(parser *p, node **out) {
    node *chain = NULL;
    do {
        if (jp_cur(p)->k != T_NAME)
            return jp_fail_at(p, jp_cur(p), "%s", "expected a filter name");
        node *f = NULL;
        LLMI_TRY(jp_new_node(p, N_FILTER, jp_cur(p), &f));
        f->name = jp_cur(p)->s;
        p->i++;
        if (jp_is_op(jp_cur(p), "("))
            LLMI_TRY(jp_call_args(p, f));
        f->a = chain;
        chain = f;
    } while (jp_skip_op(p, "|"));
    *out = chain;
    return LLM_OK;
}

static llm_status parse_set(parser *p, node *x) {
    if (jp_cur(p)->k == T_NAME && jp_is_op(&p->t[p->i + 1], ".")) {
        /* namespace attribute: {% set ns.attr = value %} */
        x->names = jx_alloc(p->c, sizeof *x->names);
        if (!x->names)
            return jx_oom(p->c);
        x->names[0] = jp_cur(p)->s;
        x->n_names = 1;
        p->i += 2;
        if (jp_cur(p)->k != T_NAME)
            return jp_fail_at(p, jp_cur(p), "%s", "expected an attribute name");
        x->name = jp_cur(p)->s;
        p->i++;
    } else {
        LLMI_TRY(parse_targets(p, x));
    }
    if (jp_skip_op(p, "=")) {
        LLMI_TRY(jp_tuple(p, true, &x->b));
        return end_block(p);
    }
    if (x->name || x->n_names != 1)
        return jp_fail_at(p, jp_cur(p), "%s", "expected '='");
    x->k = N_SET_BLOCK;
    if (jp_skip_op(p, "|"))
        LLMI_TRY(parse_filter_chain(p, &x->c));
    LLMI_TRY(end_block(p));
    static const char *const end[] = {"endset", NULL};
    const char *which;
    LLMI_TRY(body_until(p, end, x, false, &which));
    return end_block(p);
}

/* (a, b=default, ...) of a macro or a call block's caller */
static llm_status parse_params(parser *p, node *x) {
    svec names = {0};
    nvec defaults = {0};
    LLMI_TRY(jp_expect_op(p, "("));
    while (!jp_skip_op(p, ")")) {
        if (names.n)
            LLMI_TRY(jp_expect_op(p, ","));
        if (jp_cur(p)->k != T_NAME)
            return jp_fail_at(p, jp_cur(p), "%s", "expected a parameter name");
        LLMI_TRY(jp_sv_push(p, &names, jp_cur(p)->s));
        p->i++;
        node *d = NULL;
        if (jp_skip_op(p, "="))
            LLMI_TRY(jp_expr(p, true, &d));
        LLMI_TRY(jp_nv_push(p, &defaults, d));
    }
    x->names = names.v;
    x->n_names = names.n;
    x->kids2 = defaults.v;
    x->n2 = defaults.n;
    return LLM_OK;
}

static llm_status parse_macro(parser *p, node *x) {
    if (jp_cur(p)->k != T_NAME)
        return jp_fail_at(p, jp_cur(p), "%s", "expected a macro name");
    x->name = jp_cur(p)->s;
    p->i++;
    LLMI_TRY(parse_params(p, x));
    LLMI_TRY(end_block(p));
    static const char *const end[] = {"endmacro", NULL};
    nvec body = {0};
    LLMI_TRY(parse_body(p, end, &body));
    p->i++;
    x->kids = body.v;
    x->n = body.n;
    if (jp_cur(p)->k == T_NAME) /* {% endmacro name %} */
        p->i++;
    return end_block(p);
}

static llm_status parse_call_block(parser *p, node *x) {
    if (jp_is_op(jp_cur(p), "("))
        LLMI_TRY(parse_params(p, x));
    LLMI_TRY(jp_expr(p, true, &x->a));
    if (x->a->k != N_CALL)
        return jp_fail_at(p, jp_cur(p), "%s", "{% call %} needs a macro call");
    LLMI_TRY(end_block(p));
    static const char *const end[] = {"endcall", NULL};
    const char *which;
    LLMI_TRY(body_until(p, end, x, false, &which));
    return end_block(p);
}

static llm_status parse_statement(parser *p, nvec *body) {
    const token *t = jp_cur(p);
    if (t->k != T_NAME)
        return jp_fail_at(p, t, "%s", "expected a statement name");
    node *x = NULL;
    LLMI_TRY(jp_enter(p));
    p->i++;
    if (strcmp(t->s, "if") == 0) {
        LLMI_TRY(jp_new_node(p, N_IF, t, &x));
        LLMI_TRY(parse_if(p, x));
    } else if (strcmp(t->s, "for") == 0) {
        LLMI_TRY(jp_new_node(p, N_FOR, t, &x));
        LLMI_TRY(parse_for(p, x));
    } else if (strcmp(t->s, "set") == 0) {
        LLMI_TRY(jp_new_node(p, N_SET, t, &x));
        LLMI_TRY(parse_set(p, x));
    } else if (strcmp(t->s, "macro") == 0) {
        LLMI_TRY(jp_new_node(p, N_MACRO, t, &x));
        LLMI_TRY(parse_macro(p, x));
    } else if (strcmp(t->s, "call") == 0) {
        LLMI_TRY(jp_new_node(p, N_CALL_BLOCK, t, &x));
        LLMI_TRY(parse_call_block(p, x));
    } else if (strcmp(t->s, "filter") == 0) {
        LLMI_TRY(jp_new_node(p, N_FILTER_BLOCK, t, &x));
        LLMI_TRY(parse_filter_chain(p, &x->c));
        LLMI_TRY(end_block(p));
        static const char *const end[] = {"endfilter", NULL};
        const char *which;
        LLMI_TRY(body_until(p, end, x, false, &which));
        LLMI_TRY(end_block(p));
    } else if (strcmp(t->s, "break") == 0 || strcmp(t->s, "continue") == 0) {
        LLMI_TRY(jp_new_node(p, t->s[0] == 'b' ? N_BREAK : N_CONTINUE, t, &x));
        LLMI_TRY(end_block(p));
    } else if (strcmp(t->s, "generation") == 0) {
        /* transformers marks the assistant's tokens with it; renders its body */
        LLMI_TRY(jp_new_node(p, N_BODY, t, &x));
        LLMI_TRY(end_block(p));
        static const char *const end[] = {"endgeneration", NULL};
        const char *which;
        LLMI_TRY(body_until(p, end, x, false, &which));
        LLMI_TRY(end_block(p));
    } else if (strcmp(t->s, "raw") == 0) {
        LLMI_TRY(end_block(p));
        LLMI_TRY(jp_new_node(p, N_BODY, t, &x));
        if (jp_cur(p)->k == T_TEXT) {
            node *text = NULL;
            LLMI_TRY(jp_new_node(p, N_TEXT, jp_cur(p), &text));
            LLMI_TRY(jv_cstr(p->c, jp_cur(p)->s, jp_cur(p)->n, &text->lit));
            x->kids = jx_alloc(p->c, sizeof *x->kids);
            if (!x->kids)
                return jx_oom(p->c);
            x->kids[0] = text;
            x->n = 1;
            p->i++;
        }
        LLMI_TRY(jp_expect_kind(p, T_BLOCK_BEGIN, "{% endraw %}"));
        if (!jp_skip_name(p, "endraw"))
            return jp_fail_at(p, jp_cur(p), "%s", "expected 'endraw'");
        LLMI_TRY(end_block(p));
    } else {
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "chat template line %u:%u: unknown or unsupported tag '%s'", t->line,
                          t->col, t->s);
    }
    p->depth--;
    return jp_nv_push(p, body, x);
}

static llm_status parse_body(parser *p, const char *const *ends, nvec *body) {
    for (;;) {
        const token *t = jp_cur(p);
        switch (t->k) {
        case T_EOF:
            if (ends) {
                char want[128] = "";
                for (const char *const *e = ends; *e; e++)
                    snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'",
                             e == ends ? "" : " or ", *e);
                return jp_fail_at(p, t, "unexpected end of template, expected %s", want);
            }
            return LLM_OK;
        case T_TEXT: {
            node *x = NULL;
            LLMI_TRY(jp_new_node(p, N_TEXT, t, &x));
            LLMI_TRY(jv_cstr(p->c, t->s, t->n, &x->lit));
            LLMI_TRY(jp_nv_push(p, body, x));
            p->i++;
            break;
        }
        case T_VAR_BEGIN: {
            node *x = NULL;
            LLMI_TRY(jp_new_node(p, N_OUT, t, &x));
            p->i++;
            LLMI_TRY(jp_tuple(p, true, &x->a));
            LLMI_TRY(jp_expect_kind(p, T_VAR_END, "the end of the print statement '}}'"));
            LLMI_TRY(jp_nv_push(p, body, x));
            break;
        }
        case T_BLOCK_BEGIN:
            p->i++;
            if (is_end(jp_cur(p), ends))
                return LLM_OK;
            if (jp_cur(p)->k == T_NAME &&
                (strncmp(jp_cur(p)->s, "end", 3) == 0 || strcmp(jp_cur(p)->s, "else") == 0 ||
                 strcmp(jp_cur(p)->s, "elif") == 0))
                return jp_fail_at(p, jp_cur(p), "unexpected '%s'", jp_cur(p)->s);
            LLMI_TRY(parse_statement(p, body));
            break;
        default:
            return jp_unexpected(p);
        }
    }
}

llm_status jx_parse(jctx *c, const token *toks, size_t n, node **root) {
    parser p = {.c = c, .t = toks, .n = n};
    nvec body = {0};
    LLMI_TRY(parse_body(&p, NULL, &body));
    node *r = NULL;
    LLMI_TRY(jp_new_node(&p, N_BODY, &toks[0], &r));
    r->kids = body.v;
    r->n = body.n;
    *root = r;
    return LLM_OK;
}
