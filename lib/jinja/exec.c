/* Expressions, calls and statements, and the entry point that lexes,
 * parses and renders a template. */
#include "jinja/jinja_impl.h"

#include <cjson/cJSON.h>
#include <string.h>
#include <time.h>

static llm_status eval_args(jctx *c, frame *f, const node *e, jv **args, jv **kwv) {
    *args = *kwv = NULL;
    if (e->n) {
        *args = jx_alloc(c, e->n * sizeof **args);
        if (!*args)
            return jx_oom(c);
        for (size_t i = 0; i < e->n; i++)
            LLMI_TRY(jx_eval(c, f, e->kids[i], &(*args)[i]));
    }
    if (e->n2) {
        *kwv = jx_alloc(c, e->n2 * sizeof **kwv);
        if (!*kwv)
            return jx_oom(c);
        for (size_t i = 0; i < e->n2; i++)
            LLMI_TRY(jx_eval(c, f, e->kids2[i], &(*kwv)[i]));
    }
    return LLM_OK;
}

/* A filter node; in a chain of {% filter %} / block set the innermost
 * operand is `input`. */
static llm_status eval_filter(jctx *c, frame *f, const node *e, const jv *input, jv *out) {
    jv v, *args, *kwv;
    if (!e->a)
        v = *input;
    else if (input && e->a->k == N_FILTER)
        LLMI_TRY(eval_filter(c, f, e->a, input, &v));
    else
        LLMI_TRY(jx_eval(c, f, e->a, &v));
    LLMI_TRY(eval_args(c, f, e, &args, &kwv));
    return jx_filter(c, e, e->name, v, args, e->n, e->names, kwv, e->n2, out);
}

static llm_status make_seq(jctx *c, frame *f, const node *e, bool tuple, jv *out) {
    jlist *l;
    LLMI_TRY(jx_list_new(c, e->n, &l));
    l->tuple = tuple;
    for (size_t i = 0; i < e->n; i++) {
        jv v;
        LLMI_TRY(jx_eval(c, f, e->kids[i], &v));
        LLMI_TRY(jx_list_push(c, l, v));
    }
    *out = (jv){.k = JV_LIST, .u.l = l};
    return LLM_OK;
}

static llm_status eval(jctx *c, frame *f, const node *e, jv *out);

/* Every expression and statement goes through here: a step, and a bound on
 * how deep evaluations nest (macro calls inside deep expressions inside
 * macro calls ...), so the C stack stays small whatever the template. */
static llm_status enter(jctx *c, const node *at) {
    LLMI_TRY(jx_step(c, at));
    if (c->eval_depth >= 10 * c->lim.max_depth)
        return llmi_error(LLM_ERR_LIMIT,
                          "chat template line %u:%u: evaluation nests deeper than %u", at->line,
                          at->col, 10 * c->lim.max_depth);
    c->eval_depth++;
    return LLM_OK;
}

llm_status jx_eval(jctx *c, frame *f, const node *e, jv *out) {
    LLMI_TRY(enter(c, e));
    llm_status st = eval(c, f, e, out);
    c->eval_depth--;
    return st;
}

static llm_status eval(jctx *c, frame *f, const node *e, jv *out) {
    jv a, b;
    bool r;
    switch (e->k) {
    case N_LIT:
        *out = e->lit;
        return LLM_OK;
    case N_NAME:
        return jx_lookup(c, f, e->name, out);
    case N_LIST:
    case N_TUPLE:
        return make_seq(c, f, e, e->k == N_TUPLE, out);
    case N_DICT: {
        jdict *d;
        LLMI_TRY(jx_dict_new(c, e->n, &d));
        for (size_t i = 0; i < e->n; i++) {
            LLMI_TRY(jx_eval(c, f, e->kids[i], &a));
            LLMI_TRY(jx_eval(c, f, e->kids2[i], &b));
            if (a.k == JV_LIST && !a.u.l->tuple)
                return jx_fail(c, e, "TypeError: unhashable type: 'list'");
            if (a.k == JV_DICT)
                return jx_fail(c, e, "TypeError: unhashable type: 'dict'");
            LLMI_TRY(jx_dict_set(c, d, a, b));
        }
        *out = (jv){.k = JV_DICT, .u.d = d};
        return LLM_OK;
    }
    case N_ATTR:
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        return jx_getattr(c, e, a, e->name, out);
    case N_ITEM:
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        LLMI_TRY(jx_eval(c, f, e->b, &b));
        return jx_get_item(c, e, a, b, out);
    case N_SLICE:
        return jx_eval_slice(c, f, e, out);
    case N_CALL: {
        jv *args, *kwv;
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        LLMI_TRY(eval_args(c, f, e, &args, &kwv));
        return jx_call(c, e, a, args, e->n, e->names, kwv, e->n2, out);
    }
    case N_FILTER:
        return eval_filter(c, f, e, NULL, out);
    case N_TEST: {
        jv *args, *kwv;
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        LLMI_TRY(eval_args(c, f, e, &args, &kwv));
        LLMI_TRY(jx_test(c, e, e->name, a, args, e->n, &r));
        *out = jv_bool(e->op ? !r : r);
        return LLM_OK;
    }
    case N_BINOP:
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        LLMI_TRY(jx_eval(c, f, e->b, &b));
        return jx_binop(c, e, e->op, a, b, out);
    case N_CONCAT: {
        jbuf buf = {0};
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        LLMI_TRY(jx_eval(c, f, e->b, &b));
        LLMI_TRY(jv_write(c, &buf, a, false));
        LLMI_TRY(jv_write(c, &buf, b, false));
        return jv_cstr(c, buf.s ? buf.s : "", buf.n, out);
    }
    case N_NEG:
    case N_POS:
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        if (a.k == JV_INT || a.k == JV_BOOL) {
            int64_t i = a.k == JV_INT ? a.u.i : a.u.b;
            if (e->k == N_NEG && i == INT64_MIN)
                return jx_fail(c, e, "integer overflow");
            *out = jv_int(e->k == N_NEG ? -i : i);
        } else if (a.k == JV_FLOAT) {
            *out = jv_float(e->k == N_NEG ? -a.u.f : a.u.f);
        } else if (a.k == JV_UNDEF) {
            return jx_undefined_error(c, e, a);
        } else {
            return jx_fail(c, e, "TypeError: bad operand type for unary %c: '%s'",
                           e->k == N_NEG ? '-' : '+', jv_type_name(a));
        }
        return LLM_OK;
    case N_NOT:
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        *out = jv_bool(!jv_truthy(a));
        return LLM_OK;
    case N_AND:
    case N_OR:
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        if (jv_truthy(a) == (e->k == N_OR)) {
            *out = a;
            return LLM_OK;
        }
        return jx_eval(c, f, e->b, out);
    case N_COND:
        LLMI_TRY(jx_eval(c, f, e->a, &a));
        if (jv_truthy(a))
            return jx_eval(c, f, e->b, out);
        if (e->c)
            return jx_eval(c, f, e->c, out);
        *out = jx_undef(c, "the inline if expression evaluated to false and no else section "
                           "was defined");
        return LLM_OK;
    case N_COMPARE:
        LLMI_TRY(jx_eval(c, f, e->kids[0], &a));
        for (size_t i = 1; i < e->n; i++) {
            LLMI_TRY(jx_eval(c, f, e->kids[i], &b));
            LLMI_TRY(jx_compare(c, e, e->ops[i - 1], a, b, &r));
            if (!r)
                break;
            a = b;
        }
        *out = jv_bool(r);
        return LLM_OK;
    default:
        return jx_fail(c, e, "internal: node %d is not an expression", (int)e->k);
    }
}

/* --- macros and calls ---------------------------------------------------- */

static llm_status call_macro(jctx *c, const node *at, const jfunc *fn, const jv *args, size_t n,
                             const char *const *kwn, const jv *kwv, size_t nkw, jv *out) {
    const node *m = fn->macro;
    if (n > m->n_names)
        return jx_fail(c, at, "TypeError: macro '%s' takes not more than %zu argument(s)", fn->name,
                       m->n_names);
    if (c->depth >= c->lim.max_depth)
        return llmi_error(LLM_ERR_LIMIT,
                          "chat template line %u:%u: macro calls nest deeper than %u", at->line,
                          at->col, c->lim.max_depth);
    frame *f;
    LLMI_TRY(jx_frame_new(c, fn->closure, &f));
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < m->n_names && strcmp(m->names[i], kwn[k]) != 0)
            i++;
        if (i == m->n_names)
            return jx_fail(c, at, "TypeError: macro '%s' takes no keyword argument '%s'", fn->name,
                           kwn[k]);
    }
    for (size_t i = 0; i < m->n_names; i++) {
        jv v = jx_undef(c, "parameter '%s' was not provided", m->names[i]);
        bool given = i < n;
        if (given)
            v = args[i];
        for (size_t k = 0; k < nkw; k++)
            if (strcmp(m->names[i], kwn[k]) == 0) {
                v = kwv[k];
                given = true;
            }
        if (!given && m->kids2 && m->kids2[i])
            LLMI_TRY(jx_eval(c, f, m->kids2[i], &v));
        LLMI_TRY(jx_frame_set(c, f, m->names[i], v));
    }
    if (fn->caller.k == JV_FUNC)
        LLMI_TRY(jx_frame_set(c, f, "caller", fn->caller));
    jbuf buf = {0}, *saved = c->out;
    int saved_ctl = c->loop_ctl;
    c->out = &buf;
    c->depth++;
    llm_status st = jx_exec_body(c, f, m);
    c->depth--;
    c->out = saved;
    c->loop_ctl = saved_ctl;
    LLMI_TRY(st);
    return jv_cstr(c, buf.s ? buf.s : "", buf.n, out);
}

llm_status jx_call(jctx *c, const node *at, jv fn, const jv *args, size_t n, const char *const *kwn,
                   const jv *kwv, size_t nkw, jv *out) {
    if (fn.k == JV_UNDEF)
        return jx_undefined_error(c, at, fn);
    if (fn.k != JV_FUNC)
        return jx_fail(c, at, "TypeError: '%s' object is not callable", jv_type_name(fn));
    if (fn.u.fn->macro)
        return call_macro(c, at, fn.u.fn, args, n, kwn, kwv, nkw, out);
    llm_status st = fn.u.fn->fn(c, fn.u.fn->self, args, n, kwn, kwv, nkw, out);
    if (st != LLM_OK && st != LLM_ERR_LIMIT && st != LLM_ERR_OUT_OF_MEMORY &&
        !strstr(llmi_error_message(), "line "))
        llmi_error_prefix("chat template line %u:%u", at->line, at->col);
    return st;
}

static llm_status new_func(jctx *c, const char *name, const node *m, frame *closure, jv *out) {
    jfunc *fn = jx_alloc(c, sizeof *fn);
    if (!fn)
        return jx_oom(c);
    *fn = (jfunc){.name = name, .macro = m, .closure = closure};
    *out = (jv){.k = JV_FUNC, .u.fn = fn};
    return LLM_OK;
}

/* --- statements ------------------------------------------------------------ */

static llm_status exec(jctx *c, frame *f, const node *s);

llm_status jx_exec_body(jctx *c, frame *f, const node *body) {
    for (size_t i = 0; i < body->n && !c->loop_ctl; i++)
        LLMI_TRY(exec(c, f, body->kids[i]));
    return LLM_OK;
}

static llm_status exec_else(jctx *c, frame *f, const node *s) {
    for (size_t i = 0; i < s->n2 && !c->loop_ctl; i++)
        LLMI_TRY(exec(c, f, s->kids2[i]));
    return LLM_OK;
}

/* the items a for loop walks: a list's, a dict's keys, a string's characters */
static llm_status iterate(jctx *c, const node *at, jv v, jlist **out) {
    if (v.k == JV_LIST) {
        *out = v.u.l;
        return LLM_OK;
    }
    jlist *l;
    LLMI_TRY(jx_list_new(c, 0, &l));
    *out = l;
    if (v.k == JV_UNDEF)
        return LLM_OK;
    if (v.k == JV_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++)
            LLMI_TRY(jx_list_push(c, l, v.u.d->k[i]));
        return LLM_OK;
    }
    if (v.k == JV_STR) {
        const jstr *s = v.u.s;
        for (size_t i = 0; i < s->n;) {
            size_t e = jx_utf8_offset(s->s + i, s->n - i, 1);
            jv ch;
            LLMI_TRY(jv_cstr(c, s->s + i, e, &ch));
            LLMI_TRY(jx_list_push(c, l, ch));
            i += e;
        }
        return LLM_OK;
    }
    return jx_fail(c, at, "TypeError: '%s' object is not iterable", jv_type_name(v));
}

static llm_status bind_targets(jctx *c, const node *s, frame *f, jv item) {
    if (s->n_names == 1)
        return jx_frame_set(c, f, s->names[0], item);
    if (item.k != JV_LIST || item.u.l->n != s->n_names)
        return jx_fail(c, s, "ValueError: cannot unpack %s into %zu variables", jv_type_name(item),
                       s->n_names);
    for (size_t i = 0; i < s->n_names; i++)
        LLMI_TRY(jx_frame_set(c, f, s->names[i], item.u.l->v[i]));
    return LLM_OK;
}

static llm_status loop_cycle(jctx *c, jv self, const jv *args, size_t n, const char *const *kwn,
                             const jv *kwv, size_t nkw, jv *out) {
    (void)kwn;
    (void)kwv;
    (void)nkw;
    if (!n)
        return jx_fail(c, NULL, "TypeError: no items for cycling given");
    *out = args[self.u.i % (int64_t)n];
    return LLM_OK;
}

static llm_status set_key(jctx *c, jdict *d, const char *k, jv v) {
    jv key;
    LLMI_TRY(jv_cstr(c, k, strlen(k), &key));
    return jx_dict_set(c, d, key, v);
}

static llm_status exec_for(jctx *c, frame *f, const node *s) {
    jv src;
    jlist *all, *items;
    LLMI_TRY(jx_eval(c, f, s->a, &src));
    LLMI_TRY(iterate(c, s, src, &all));
    items = all;
    if (s->b) { /* for x in y if cond: the condition sees the loop variables */
        LLMI_TRY(jx_list_new(c, 0, &items));
        for (size_t i = 0; i < all->n; i++) {
            frame *tf;
            jv ok;
            LLMI_TRY(jx_frame_new(c, f, &tf));
            LLMI_TRY(bind_targets(c, s, tf, all->v[i]));
            LLMI_TRY(jx_eval(c, tf, s->b, &ok));
            if (jv_truthy(ok))
                LLMI_TRY(jx_list_push(c, items, all->v[i]));
        }
    }
    if (!items->n)
        return exec_else(c, f, s);
    /* a snapshot: the body may not change what it walks */
    size_t n = items->n;
    jv *v = jx_alloc(c, n * sizeof *v);
    if (!v)
        return jx_oom(c);
    memcpy(v, items->v, n * sizeof *v);
    /* One frame and one loop object serve every iteration: the frame is
     * emptied (each iteration starts from the enclosing scope, as in
     * jinja2) and the loop's values are overwritten, so a long loop costs
     * no memory of its own. */
    static const char *const keys[] = {"index",  "index0",   "revindex", "revindex0",
                                       "first",  "last",     "length",   "depth",
                                       "depth0", "previtem", "nextitem", "cycle"};
    enum { N_KEYS = sizeof keys / sizeof *keys };
    frame *it;
    jdict *loop;
    jv cyc;
    LLMI_TRY(jx_frame_new(c, f, &it));
    LLMI_TRY(jx_dict_new(c, N_KEYS, &loop));
    LLMI_TRY(new_func(c, "cycle", NULL, NULL, &cyc));
    cyc.u.fn->fn = loop_cycle;
    for (size_t k = 0; k < N_KEYS; k++)
        LLMI_TRY(set_key(c, loop, keys[k], jv_none()));
    for (size_t i = 0; i < n; i++) {
        if (++c->loops > c->lim.max_loop)
            return llmi_error(LLM_ERR_LIMIT,
                              "chat template line %u:%u: stopped after %llu loop iterations",
                              s->line, s->col, (unsigned long long)c->lim.max_loop);
        const jv vals[N_KEYS] = {jv_int((int64_t)i + 1),
                                 jv_int((int64_t)i),
                                 jv_int((int64_t)(n - i)),
                                 jv_int((int64_t)(n - i - 1)),
                                 jv_bool(i == 0),
                                 jv_bool(i + 1 == n),
                                 jv_int((int64_t)n),
                                 jv_int(1),
                                 jv_int(0),
                                 i > 0 ? v[i - 1] : jv_undef("there is no previous item"),
                                 i + 1 < n ? v[i + 1] : jv_undef("there is no next item"),
                                 cyc};
        memcpy(loop->v, vals, sizeof vals);
        cyc.u.fn->self = jv_int((int64_t)i);
        it->vars->n = 0;
        LLMI_TRY(jx_frame_set(c, it, "loop", (jv){.k = JV_DICT, .u.d = loop}));
        LLMI_TRY(bind_targets(c, s, it, v[i]));
        LLMI_TRY(jx_exec_body(c, it, s));
        int ctl = c->loop_ctl;
        c->loop_ctl = 0;
        if (ctl == 1)
            break;
    }
    return LLM_OK;
}

static llm_status exec_set(jctx *c, frame *f, const node *s) {
    jv v;
    LLMI_TRY(jx_eval(c, f, s->b, &v));
    if (s->name) {
        jv ns;
        LLMI_TRY(jx_lookup(c, f, s->names[0], &ns));
        if (ns.k != JV_DICT || !ns.u.d->ns)
            return jx_fail(c, s,
                           "TemplateRuntimeError: cannot assign attribute on "
                           "non-namespace object");
        return set_key(c, ns.u.d, s->name, v);
    }
    return bind_targets(c, s, f, v);
}

/* the text a body renders, as a string */
static llm_status capture(jctx *c, frame *f, const node *s, jv *out) {
    jbuf buf = {0}, *saved = c->out;
    c->out = &buf;
    llm_status st = jx_exec_body(c, f, s);
    c->out = saved;
    LLMI_TRY(st);
    return jv_cstr(c, buf.s ? buf.s : "", buf.n, out);
}

static llm_status exec_stmt(jctx *c, frame *f, const node *s);
static llm_status exec(jctx *c, frame *f, const node *s) {
    LLMI_TRY(enter(c, s));
    llm_status st = exec_stmt(c, f, s);
    c->eval_depth--;
    return st;
}

static llm_status exec_stmt(jctx *c, frame *f, const node *s) {
    jv v;
    switch (s->k) {
    case N_TEXT:
        return jb_put(c, c->out, s->lit.u.s->s, s->lit.u.s->n);
    case N_OUT:
        LLMI_TRY(jx_eval(c, f, s->a, &v));
        return jv_write(c, c->out, v, false);
    case N_IF:
        LLMI_TRY(jx_eval(c, f, s->a, &v));
        return jv_truthy(v) ? jx_exec_body(c, f, s) : exec_else(c, f, s);
    case N_FOR:
        return exec_for(c, f, s);
    case N_SET:
        return exec_set(c, f, s);
    case N_SET_BLOCK:
        LLMI_TRY(capture(c, f, s, &v));
        if (s->c)
            LLMI_TRY(eval_filter(c, f, s->c, &v, &v));
        return jx_frame_set(c, f, s->names[0], v);
    case N_FILTER_BLOCK:
        LLMI_TRY(capture(c, f, s, &v));
        LLMI_TRY(eval_filter(c, f, s->c, &v, &v));
        return jv_write(c, c->out, v, false);
    case N_MACRO:
        LLMI_TRY(new_func(c, s->name, s, f, &v));
        return jx_frame_set(c, f, s->name, v);
    case N_CALL_BLOCK: {
        const node *call = s->a;
        jv fn, caller, *args, *kwv;
        LLMI_TRY(jx_eval(c, f, call->a, &fn));
        LLMI_TRY(eval_args(c, f, call, &args, &kwv));
        if (fn.k != JV_FUNC || !fn.u.fn->macro)
            return jx_fail(c, s, "TypeError: {%% call %%} needs a macro");
        LLMI_TRY(new_func(c, "caller", s, f, &caller));
        jfunc *bound = jx_alloc(c, sizeof *bound);
        if (!bound)
            return jx_oom(c);
        *bound = *fn.u.fn;
        bound->caller = caller;
        LLMI_TRY(jx_call(c, s, (jv){.k = JV_FUNC, .u.fn = bound}, args, call->n, call->names, kwv,
                         call->n2, &v));
        return jv_write(c, c->out, v, false);
    }
    case N_BREAK:
    case N_CONTINUE:
        c->loop_ctl = s->k == N_BREAK ? 1 : 2;
        return LLM_OK;
    case N_BODY:
        return jx_exec_body(c, f, s);
    default:
        return jx_fail(c, s, "internal: node %d is not a statement", (int)s->k);
    }
}

llmi_jinja_limits llmi_jinja_default_limits(void) {
    return (llmi_jinja_limits){.max_depth = 100,
                               .max_steps = 10 * 1000 * 1000,
                               .max_loop = 1000 * 1000,
                               .max_output = 16u << 20,
                               .max_memory = 256u << 20};
}

llm_status llmi_jinja_render(const char *tmpl, size_t len, const cJSON *vars,
                             const llmi_jinja_limits *limits, double now, char **out,
                             size_t *out_len) {
    if (!out || !out_len || (!tmpl && len))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat template: NULL argument");
    *out = NULL;
    *out_len = 0;
    if (vars && !cJSON_IsObject(vars))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat template: variables must be an object");
    size_t bad = llmi_utf8_valid_prefix(tmpl ? tmpl : "", len);
    if (bad != len)
        return llmi_error(LLM_ERR_INVALID_UTF8, "chat template: byte %zu is not valid UTF-8", bad);
    jctx c = {.lim = limits ? *limits : llmi_jinja_default_limits(),
              .now = now,
              .src = tmpl ? tmpl : "",
              .src_len = len};
    c.arena.limit = c.lim.max_memory;
    token *toks;
    size_t n_toks;
    node *root;
    jbuf buf = {0};
    frame *globals;
    llm_status st = jx_lex(&c, &toks, &n_toks);
    if (st == LLM_OK)
        st = jx_parse(&c, toks, n_toks, &root);
    if (st == LLM_OK)
        st = jx_frame_new(&c, NULL, &globals);
    for (const cJSON *e = vars ? vars->child : NULL; st == LLM_OK && e; e = e->next) {
        jv v;
        st = jv_from_json(&c, e, 0, &v);
        if (st == LLM_OK && e->string)
            st = jx_frame_set(&c, globals, e->string, v);
    }
    if (st == LLM_OK) {
        frame *top;
        c.globals = globals;
        c.out = &buf;
        st = jx_frame_new(&c, globals, &top);
        if (st == LLM_OK)
            st = jx_exec_body(&c, top, root);
    }
    if (st == LLM_OK) {
        *out = llmi_malloc(buf.n + 1);
        if (!*out) {
            st = llmi_oom("chat template output");
        } else {
            if (buf.n)
                memcpy(*out, buf.s, buf.n);
            (*out)[buf.n] = '\0';
            *out_len = buf.n;
        }
    }
    jx_arena_free(&c.arena);
    return st;
}
