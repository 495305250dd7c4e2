/* jinja2's builtin filters and tests, as transformers' environment has
 * them (tojson is json.dumps without HTML escaping, keys in their order). */
#include "jinja/jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fargs {
    const jv *a;
    size_t n;
    const char *const *kwn;
    const jv *kwv;
    size_t nkw;
} fargs;

/* the argument at `pos` (after the operand) or keyword `name` */
static bool arg(const fargs *A, size_t pos, const char *name, jv *out) {
    for (size_t k = 0; k < A->nkw; k++)
        if (strcmp(A->kwn[k], name) == 0) {
            *out = A->kwv[k];
            return true;
        }
    if (pos < A->n) {
        *out = A->a[pos];
        return true;
    }
    return false;
}

static bool arg_bool(const fargs *A, size_t pos, const char *name, bool dflt) {
    jv v;
    return arg(A, pos, name, &v) ? jv_truthy(v) : dflt;
}

static llm_status need_str(jctx *c, const node *at, const char *what, jv v, jv *out) {
    if (v.k == JV_UNDEF)
        return jx_undefined_error(c, at, v);
    (void)what;
    return jv_to_str(c, v, out);
}

static llm_status need_list(jctx *c, const node *at, jv v, jlist **out) {
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
        for (size_t i = 0; i < v.u.s->n;) {
            size_t e = jx_utf8_offset(v.u.s->s + i, v.u.s->n - i, 1);
            jv ch;
            LLMI_TRY(jv_cstr(c, v.u.s->s + i, e, &ch));
            LLMI_TRY(jx_list_push(c, l, ch));
            i += e;
        }
        return LLM_OK;
    }
    return jx_fail(c, at, "TypeError: '%s' object is not iterable", jv_type_name(v));
}

static jv list_v(jlist *l) { return (jv){.k = JV_LIST, .u.l = l}; }

/* attribute "a.b.0" of an item, as jinja2's make_attrgetter */
static llm_status attr_path(jctx *c, const node *at, jv item, const jstr *path, jv *out) {
    const char *s = path->s;
    jv v = item;
    while (*s) {
        const char *dot = strchr(s, '.');
        size_t n = dot ? (size_t)(dot - s) : strlen(s);
        char part[128];
        if (n >= sizeof part)
            return jx_fail(c, at, "attribute name too long");
        memcpy(part, s, n);
        part[n] = '\0';
        char *end;
        long idx = strtol(part, &end, 10);
        if (n && *end == '\0' && v.k == JV_LIST)
            LLMI_TRY(jx_get_item(c, at, v, jv_int(idx), &v));
        else if (v.k == JV_UNDEF)
            return jx_undefined_error(c, at, v);
        else {
            jv key;
            LLMI_TRY(jv_cstr(c, part, n, &key));
            LLMI_TRY(jx_get_item(c, at, v, key, &v));
        }
        s += n + (dot != NULL);
    }
    *out = v;
    return LLM_OK;
}

static llm_status lower_if(jctx *c, jv v, bool fold, jv *out) {
    if (fold && v.k == JV_STR)
        return jx_case(c, v.u.s, 0, out);
    *out = v;
    return LLM_OK;
}

/* stable merge sort of values (by `attr` when given) */
static llm_status sort_values(jctx *c, const node *at, jv *v, size_t n, const jstr *attr, bool fold,
                              bool reverse, int by_value) {
    if (n < 2)
        return LLM_OK;
    jv *keys = jx_alloc(c, n * sizeof *keys), *tmp = jx_alloc(c, n * sizeof *tmp),
       *tk = jx_alloc(c, n * sizeof *tk);
    if (!keys || !tmp || !tk)
        return jx_oom(c);
    for (size_t i = 0; i < n; i++) {
        jv k = v[i];
        if (attr)
            LLMI_TRY(attr_path(c, at, k, attr, &k));
        if (by_value >= 0)
            k = k.u.l->v[by_value];
        LLMI_TRY(lower_if(c, k, fold, &keys[i]));
    }
    for (size_t w = 1; w < n; w *= 2)
        for (size_t lo = 0; lo < n - w; lo += 2 * w) {
            size_t mid = lo + w, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, o = lo;
            while (i < mid || j < hi) {
                bool take_right = false;
                if (i < mid && j < hi) {
                    bool r;
                    LLMI_TRY(jx_compare(c, at, reverse ? OP_GT : OP_LT, keys[j], keys[i], &r));
                    take_right = r;
                } else {
                    take_right = i >= mid;
                }
                size_t s = take_right ? j++ : i++;
                tmp[o] = v[s];
                tk[o++] = keys[s];
            }
            memcpy(v + lo, tmp + lo, (hi - lo) * sizeof *v);
            memcpy(keys + lo, tk + lo, (hi - lo) * sizeof *v);
        }
    return LLM_OK;
}

static llm_status select_items(jctx *c, const node *at, jv v, const fargs *A, bool by_attr,
                               bool keep, jv *out) {
    jlist *in, *l;
    LLMI_TRY(need_list(c, at, v, &in));
    LLMI_TRY(jx_list_new(c, 0, &l));
    size_t first = by_attr ? 1 : 0;
    jv attr = jv_none(), test = jv_none();
    if (by_attr && (!arg(A, 0, "attribute", &attr) || attr.k != JV_STR))
        return jx_fail(c, at, "selectattr/rejectattr need an attribute name");
    bool has_test = A->n > first;
    if (has_test && A->a[first].k != JV_STR)
        return jx_fail(c, at, "the test name must be a string");
    if (has_test)
        test = A->a[first];
    if (has_test && !jx_test_known(test.u.s->s))
        return jx_fail(c, at, "TemplateRuntimeError: No test named '%s'", test.u.s->s);
    for (size_t i = 0; i < in->n; i++) {
        jv x = in->v[i];
        if (by_attr)
            LLMI_TRY(attr_path(c, at, x, attr.u.s, &x));
        bool ok;
        if (has_test)
            LLMI_TRY(jx_test(c, at, test.u.s->s, x, A->a + first + 1, A->n - first - 1, &ok));
        else
            ok = jv_truthy(x);
        if (ok == keep)
            LLMI_TRY(jx_list_push(c, l, in->v[i]));
    }
    *out = list_v(l);
    return LLM_OK;
}

static llm_status f_map(jctx *c, const node *at, jv v, const fargs *A, jv *out) {
    jlist *in, *l;
    LLMI_TRY(need_list(c, at, v, &in));
    LLMI_TRY(jx_list_new(c, in->n, &l));
    jv attr, dflt, name = jv_none();
    bool by_attr = arg(A, 99, "attribute", &attr), has_default = arg(A, 99, "default", &dflt);
    if (!by_attr && (!A->n || A->a[0].k != JV_STR))
        return jx_fail(c, at, "map needs a filter name or attribute=");
    if (by_attr && attr.k != JV_STR)
        return jx_fail(c, at, "map: attribute must be a string");
    if (!by_attr) {
        name = A->a[0];
        if (!jx_filter_known(name.u.s->s))
            return jx_fail(c, at, "TemplateRuntimeError: No filter named '%s'", name.u.s->s);
    }
    for (size_t i = 0; i < in->n; i++) {
        jv x = in->v[i];
        if (by_attr) {
            LLMI_TRY(attr_path(c, at, x, attr.u.s, &x));
            if (x.k == JV_UNDEF && has_default)
                x = dflt;
        } else {
            LLMI_TRY(jx_filter(c, at, name.u.s->s, x, A->a + 1, A->n - 1, NULL, NULL, 0, &x));
        }
        LLMI_TRY(jx_list_push(c, l, x));
    }
    *out = list_v(l);
    return LLM_OK;
}

static llm_status f_join(jctx *c, const node *at, jv v, const fargs *A, jv *out) {
    jlist *in;
    jv sep, attr;
    LLMI_TRY(need_list(c, at, v, &in));
    bool has_sep = arg(A, 0, "d", &sep), by_attr = arg(A, 1, "attribute", &attr);
    if (has_sep)
        LLMI_TRY(jv_to_str(c, sep, &sep));
    jbuf b = {0};
    for (size_t i = 0; i < in->n; i++) {
        jv x = in->v[i];
        if (by_attr && attr.k == JV_STR)
            LLMI_TRY(attr_path(c, at, x, attr.u.s, &x));
        if (i && has_sep)
            LLMI_TRY(jb_put(c, &b, sep.u.s->s, sep.u.s->n));
        LLMI_TRY(jv_write(c, &b, x, false));
    }
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

static llm_status f_indent(jctx *c, const node *at, jv v, const fargs *A, jv *out) {
    jv s, w;
    LLMI_TRY(need_str(c, at, "indent", v, &s));
    bool first = arg_bool(A, 1, "first", false), blank = arg_bool(A, 2, "blank", false);
    jbuf pad = {0};
    if (arg(A, 0, "width", &w) && w.k == JV_STR)
        LLMI_TRY(jb_put(c, &pad, w.u.s->s, w.u.s->n));
    else
        for (int64_t i = 0; i < (arg(A, 0, "width", &w) && w.k == JV_INT ? w.u.i : 4); i++)
            LLMI_TRY(jb_put(c, &pad, " ", 1));
    jbuf b = {0};
    const jstr *t = s.u.s;
    size_t i = 0;
    bool line_start = true;
    for (size_t ln = 0; i <= t->n; ln++) {
        const char *nl = memchr(t->s + i, '\n', t->n - i);
        size_t e = nl ? (size_t)(nl - t->s) : t->n;
        bool empty = e == i;
        if (line_start && (ln > 0 || first) && (blank || !empty) && pad.n)
            LLMI_TRY(jb_put(c, &b, pad.s, pad.n));
        LLMI_TRY(jb_put(c, &b, t->s + i, e - i));
        if (!nl)
            break;
        LLMI_TRY(jb_put(c, &b, "\n", 1));
        i = e + 1;
    }
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

static llm_status to_int(jctx *c, jv v, jv dflt, jv *out) {
    if (v.k == JV_INT || v.k == JV_BOOL) {
        *out = jv_int(v.k == JV_INT ? v.u.i : v.u.b);
    } else if (v.k == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) {
        *out = jv_int((int64_t)v.u.f);
    } else if (v.k == JV_STR) {
        jv t;
        LLMI_TRY(jx_strip(c, v.u.s, NULL, 3, &t));
        char *end;
        long long i = strtoll(t.u.s->s, &end, 10);
        if (t.u.s->n && *end == '\0') {
            *out = jv_int(i);
        } else {
            double d = strtod(t.u.s->s, &end);
            *out = t.u.s->n && *end == '\0' && isfinite(d) ? jv_int((int64_t)d) : dflt;
        }
    } else {
        *out = dflt;
    }
    return LLM_OK;
}

static llm_status to_float(jctx *c, jv v, jv dflt, jv *out) {
    if (v.k == JV_INT || v.k == JV_BOOL || v.k == JV_FLOAT) {
        *out = jv_float(v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : v.u.b);
    } else if (v.k == JV_STR) {
        jv t;
        LLMI_TRY(jx_strip(c, v.u.s, NULL, 3, &t));
        char *end;
        double d = strtod(t.u.s->s, &end);
        *out = t.u.s->n && *end == '\0' ? jv_float(d) : dflt;
    } else {
        *out = dflt;
    }
    return LLM_OK;
}

static llm_status f_tojson(jctx *c, const node *at, jv v, const fargs *A, jv *out) {
    jv ind;
    int indent = -1;
    if (arg(A, 0, "indent", &ind) && ind.k != JV_NONE) {
        if (ind.k != JV_INT || ind.u.i < 0 || ind.u.i > 64)
            return jx_fail(c, at, "tojson: indent must be a small integer");
        indent = (int)ind.u.i;
    }
    jx_json_fmt fmt = {.indent = indent, .sort_keys = arg_bool(A, 2, "sort_keys", false)};
    jv sep;
    if (arg(A, 1, "separators", &sep) && sep.k != JV_NONE) {
        if (sep.k != JV_LIST || sep.u.l->n != 2 || sep.u.l->v[0].k != JV_STR ||
            sep.u.l->v[1].k != JV_STR)
            return jx_fail(c, at, "tojson: separators must be two strings");
        fmt.item_sep = sep.u.l->v[0].u.s;
        fmt.key_sep = sep.u.l->v[1].u.s;
    }
    jbuf b = {0};
    LLMI_TRY(jv_tojson(c, &b, v, &fmt, 0));
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

static llm_status f_items(jctx *c, const node *at, jv v, jv *out) {
    jlist *l;
    LLMI_TRY(jx_list_new(c, 0, &l));
    *out = list_v(l);
    if (v.k == JV_UNDEF)
        return LLM_OK;
    if (v.k != JV_DICT)
        return jx_fail(c, at, "TypeError: can only get item pairs from a mapping.");
    for (size_t i = 0; i < v.u.d->n; i++) {
        jlist *pair;
        LLMI_TRY(jx_list_new(c, 2, &pair));
        pair->tuple = true;
        LLMI_TRY(jx_list_push(c, pair, v.u.d->k[i]));
        LLMI_TRY(jx_list_push(c, pair, v.u.d->v[i]));
        LLMI_TRY(jx_list_push(c, l, list_v(pair)));
    }
    return LLM_OK;
}

static llm_status f_length(jctx *c, const node *at, jv v, jv *out) {
    switch (v.k) {
    case JV_UNDEF:
        *out = jv_int(0);
        return LLM_OK;
    case JV_STR:
        *out = jv_int((int64_t)jx_utf8_count(v.u.s->s, v.u.s->n));
        return LLM_OK;
    case JV_LIST:
        *out = jv_int((int64_t)v.u.l->n);
        return LLM_OK;
    case JV_DICT:
        *out = jv_int((int64_t)v.u.d->n);
        return LLM_OK;
    default:
        return jx_fail(c, at, "TypeError: object of type '%s' has no len()", jv_type_name(v));
    }
}

static llm_status f_unique(jctx *c, const node *at, jv v, const fargs *A, jv *out) {
    jlist *in, *l;
    jv attr;
    bool by_attr = arg(A, 1, "attribute", &attr) && attr.k == JV_STR;
    bool fold = !arg_bool(A, 0, "case_sensitive", false);
    LLMI_TRY(need_list(c, at, v, &in));
    LLMI_TRY(jx_list_new(c, 0, &l));
    jlist *seen;
    LLMI_TRY(jx_list_new(c, 0, &seen));
    for (size_t i = 0; i < in->n; i++) {
        jv k = in->v[i];
        if (by_attr)
            LLMI_TRY(attr_path(c, at, k, attr.u.s, &k));
        LLMI_TRY(lower_if(c, k, fold, &k));
        bool dup = false;
        for (size_t j = 0; j < seen->n && !dup; j++)
            dup = jv_equal(seen->v[j], k);
        if (!dup) {
            LLMI_TRY(jx_list_push(c, seen, k));
            LLMI_TRY(jx_list_push(c, l, in->v[i]));
        }
    }
    *out = list_v(l);
    return LLM_OK;
}

static llm_status copy_list(jctx *c, const node *at, jv v, jlist **out) {
    jlist *in, *l;
    LLMI_TRY(need_list(c, at, v, &in));
    LLMI_TRY(jx_list_new(c, in->n, &l));
    for (size_t i = 0; i < in->n; i++)
        LLMI_TRY(jx_list_push(c, l, in->v[i]));
    *out = l;
    return LLM_OK;
}

static llm_status f_round(jctx *c, const node *at, jv v, const fargs *A, jv *out) {
    jv p, m;
    int64_t prec = arg(A, 0, "precision", &p) && p.k == JV_INT ? p.u.i : 0;
    const char *method = arg(A, 1, "method", &m) && m.k == JV_STR ? m.u.s->s : "common";
    if (v.k != JV_INT && v.k != JV_FLOAT && v.k != JV_BOOL)
        return jx_fail(c, at, "TypeError: round needs a number, not %s", jv_type_name(v));
    if (v.k != JV_FLOAT && strcmp(method, "common") == 0) {
        *out = jv_int(v.k == JV_INT ? v.u.i : v.u.b); /* Python's round() keeps an int */
        return LLM_OK;
    }
    double x = v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : v.u.b;
    double scale = pow(10.0, (double)prec);
    double y = x * scale;
    if (strcmp(method, "common") == 0)
        y = round(y);
    else if (strcmp(method, "ceil") == 0)
        y = ceil(y);
    else if (strcmp(method, "floor") == 0)
        y = floor(y);
    else
        return jx_fail(c, at, "FilterArgumentError: method must be common, ceil or floor");
    *out = jv_float(y / scale);
    return LLM_OK;
}

static llm_status f_batch(jctx *c, const node *at, jv v, const fargs *A, jv *out) {
    jlist *in, *l, *cur = NULL;
    jv n, fill;
    if (!arg(A, 0, "linecount", &n) || n.k != JV_INT || n.u.i <= 0)
        return jx_fail(c, at, "batch needs a positive count");
    bool has_fill = arg(A, 1, "fill_with", &fill) && fill.k != JV_NONE;
    LLMI_TRY(need_list(c, at, v, &in));
    LLMI_TRY(jx_list_new(c, 0, &l));
    for (size_t i = 0; i < in->n; i++) {
        if (!cur || cur->n == (size_t)n.u.i) {
            LLMI_TRY(jx_list_new(c, 0, &cur));
            LLMI_TRY(jx_list_push(c, l, list_v(cur)));
        }
        LLMI_TRY(jx_list_push(c, cur, in->v[i]));
    }
    while (has_fill && cur && cur->n < (size_t)n.u.i)
        LLMI_TRY(jx_list_push(c, cur, fill));
    *out = list_v(l);
    return LLM_OK;
}

static const char *const FILTERS[] = {
    "abs",      "attr",   "batch",  "capitalize", "count",      "d",        "default",
    "dictsort", "e",      "escape", "first",      "float",      "format",   "indent",
    "int",      "items",  "join",   "last",       "length",     "list",     "lower",
    "map",      "max",    "min",    "reject",     "rejectattr", "replace",  "reverse",
    "round",    "safe",   "select", "selectattr", "sort",       "string",   "sum",
    "title",    "tojson", "trim",   "unique",     "upper",      "wordcount"};

bool jx_filter_known(const char *name) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof *FILTERS; i++)
        if (strcmp(FILTERS[i], name) == 0)
            return true;
    return false;
}

static llm_status f_escape(jctx *c, jv v, jv *out) {
    LLMI_TRY(jv_to_str(c, v, &v));
    jbuf b = {0};
    for (size_t i = 0; i < v.u.s->n; i++) {
        char ch = v.u.s->s[i];
        const char *r = ch == '&'    ? "&amp;"
                        : ch == '<'  ? "&lt;"
                        : ch == '>'  ? "&gt;"
                        : ch == '"'  ? "&#34;"
                        : ch == '\'' ? "&#39;"
                                     : NULL;
        LLMI_TRY(r ? jb_put(c, &b, r, strlen(r)) : jb_put(c, &b, &ch, 1));
    }
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

static llm_status f_minmax(jctx *c, const node *at, jv v, const fargs *A, bool max, jv *out) {
    jlist *l;
    LLMI_TRY(copy_list(c, at, v, &l));
    jv attr;
    bool by_attr = arg(A, 1, "attribute", &attr) && attr.k == JV_STR;
    LLMI_TRY(sort_values(c, at, l->v, l->n, by_attr ? attr.u.s : NULL,
                         !arg_bool(A, 0, "case_sensitive", false), false, -1));
    *out = l->n ? l->v[max ? l->n - 1 : 0] : jx_undef(c, "No aggregated item, sequence was empty.");
    return LLM_OK;
}

llm_status jx_filter(jctx *c, const node *at, const char *name, jv v, const jv *args, size_t n,
                     const char *const *kwn, const jv *kwv, size_t nkw, jv *out) {
    fargs A = {args, n, kwn, kwv, nkw};
    jv x, y;
    jlist *l;
#define IS(s) (strcmp(name, s) == 0)
    if (IS("default") || IS("d")) {
        bool boolean = arg_bool(&A, 1, "boolean", false);
        if (v.k == JV_UNDEF || (boolean && !jv_truthy(v))) {
            if (!arg(&A, 0, "default_value", out))
                return jv_cstr(c, "", 0, out);
            return LLM_OK;
        }
        *out = v;
        return LLM_OK;
    }
    if (IS("length") || IS("count"))
        return f_length(c, at, v, out);
    if (IS("safe")) {
        *out = v;
        return LLM_OK;
    }
    if (IS("string"))
        return v.k == JV_UNDEF ? jv_cstr(c, "", 0, out) : jv_to_str(c, v, out);
    if (IS("tojson"))
        return f_tojson(c, at, v, &A, out);
    if (IS("items"))
        return f_items(c, at, v, out);
    if (IS("list")) {
        LLMI_TRY(copy_list(c, at, v, &l));
        *out = list_v(l);
        return LLM_OK;
    }
    if (IS("selectattr") || IS("rejectattr"))
        return select_items(c, at, v, &A, true, name[0] == 's', out);
    if (IS("select") || IS("reject"))
        return select_items(c, at, v, &A, false, name[0] == 's', out);
    if (IS("map"))
        return f_map(c, at, v, &A, out);
    if (IS("join"))
        return f_join(c, at, v, &A, out);
    if (IS("unique"))
        return f_unique(c, at, v, &A, out);
    if (IS("round"))
        return f_round(c, at, v, &A, out);
    if (IS("batch"))
        return f_batch(c, at, v, &A, out);
    if (IS("indent"))
        return f_indent(c, at, v, &A, out);
    if (IS("escape") || IS("e"))
        return f_escape(c, v, out);
    if (IS("int")) {
        if (!arg(&A, 0, "default", &y))
            y = jv_int(0);
        return to_int(c, v, y, out);
    }
    if (IS("float")) {
        if (!arg(&A, 0, "default", &y))
            y = jv_float(0.0);
        return to_float(c, v, y, out);
    }
    if (IS("abs")) {
        if (v.k == JV_INT && v.u.i != INT64_MIN)
            *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        else if (v.k == JV_FLOAT)
            *out = jv_float(fabs(v.u.f));
        else if (v.k == JV_BOOL)
            *out = jv_int(v.u.b);
        else
            return jx_fail(c, at, "TypeError: bad operand type for abs(): '%s'", jv_type_name(v));
        return LLM_OK;
    }
    if (IS("first") || IS("last")) {
        LLMI_TRY(need_list(c, at, v, &l));
        *out = l->n ? l->v[IS("first") ? 0 : l->n - 1]
                    : jx_undef(c, "No %s item, sequence was empty.", name);
        return LLM_OK;
    }
    if (IS("reverse")) {
        if (v.k == JV_STR) {
            LLMI_TRY(need_list(c, at, v, &l));
            jbuf b = {0};
            for (size_t i = l->n; i-- > 0;)
                LLMI_TRY(jb_put(c, &b, l->v[i].u.s->s, l->v[i].u.s->n));
            return jv_cstr(c, b.s ? b.s : "", b.n, out);
        }
        LLMI_TRY(copy_list(c, at, v, &l));
        for (size_t i = 0, j = l->n ? l->n - 1 : 0; i < j; i++, j--) {
            x = l->v[i];
            l->v[i] = l->v[j];
            l->v[j] = x;
        }
        *out = list_v(l);
        return LLM_OK;
    }
    if (IS("sort")) {
        LLMI_TRY(copy_list(c, at, v, &l));
        bool by_attr = arg(&A, 2, "attribute", &y) && y.k == JV_STR;
        LLMI_TRY(sort_values(c, at, l->v, l->n, by_attr ? y.u.s : NULL,
                             !arg_bool(&A, 1, "case_sensitive", false),
                             arg_bool(&A, 0, "reverse", false), -1));
        *out = list_v(l);
        return LLM_OK;
    }
    if (IS("dictsort")) {
        if (v.k != JV_DICT)
            return jx_fail(c, at, "TypeError: dictsort needs a mapping");
        LLMI_TRY(f_items(c, at, v, &x));
        bool by_value = arg(&A, 1, "by", &y) && y.k == JV_STR && strcmp(y.u.s->s, "value") == 0;
        LLMI_TRY(sort_values(c, at, x.u.l->v, x.u.l->n, NULL,
                             !arg_bool(&A, 0, "case_sensitive", false),
                             arg_bool(&A, 2, "reverse", false), by_value ? 1 : 0));
        *out = x;
        return LLM_OK;
    }
    if (IS("max") || IS("min"))
        return f_minmax(c, at, v, &A, IS("max"), out);
    if (IS("sum")) {
        LLMI_TRY(need_list(c, at, v, &l));
        jv acc = arg(&A, 1, "start", &y) ? y : jv_int(0);
        bool by_attr = arg(&A, 0, "attribute", &y) && y.k == JV_STR;
        for (size_t i = 0; i < l->n; i++) {
            x = l->v[i];
            if (by_attr)
                LLMI_TRY(attr_path(c, at, x, y.u.s, &x));
            LLMI_TRY(jx_binop(c, at, OP_ADD, acc, x, &acc));
        }
        *out = acc;
        return LLM_OK;
    }
    if (IS("attr")) {
        if (!arg(&A, 0, "name", &y) || y.k != JV_STR)
            return jx_fail(c, at, "attr needs a name");
        return jx_getattr(c, at, v, y.u.s->s, out);
    }
    if (IS("format")) {
        jlist *t;
        LLMI_TRY(need_str(c, at, name, v, &x));
        LLMI_TRY(jx_list_new(c, n, &t));
        t->tuple = true;
        for (size_t i = 0; i < n; i++)
            LLMI_TRY(jx_list_push(c, t, args[i]));
        return jx_format_percent(c, at, x, list_v(t), out);
    }
    /* string filters */
    LLMI_TRY(need_str(c, at, name, v, &x));
    if (IS("trim")) {
        bool has = arg(&A, 0, "chars", &y) && y.k == JV_STR;
        return jx_strip(c, x.u.s, has ? y.u.s : NULL, 3, out);
    }
    if (IS("upper") || IS("lower") || IS("title") || IS("capitalize"))
        return jx_case(c, x.u.s, IS("lower") ? 0 : IS("upper") ? 1 : IS("title") ? 2 : 3, out);
    if (IS("replace")) {
        jv o, r, k;
        if (!arg(&A, 0, "old", &o) || !arg(&A, 1, "new", &r))
            return jx_fail(c, at, "replace needs old and new");
        LLMI_TRY(jv_to_str(c, o, &o));
        LLMI_TRY(jv_to_str(c, r, &r));
        int64_t count = arg(&A, 2, "count", &k) && k.k == JV_INT ? k.u.i : -1;
        return jx_replace(c, x.u.s, o.u.s, r.u.s, count, out);
    }
    if (IS("wordcount")) {
        LLMI_TRY(jx_split(c, x.u.s, NULL, -1, false, &y));
        *out = jv_int((int64_t)y.u.l->n);
        return LLM_OK;
    }
#undef IS
    return jx_fail(c, at, "TemplateAssertionError: No filter named '%s'.", name);
}
