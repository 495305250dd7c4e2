/* The global functions a chat template can call (range, namespace, dict,
 * and transformers' raise_exception and strftime_now), jinja2's tests
 * ("x is defined") and printf-style formatting ("%s" % x). */
#include "jinja/jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define GLOBAL(name)                                                                               \
    static llm_status name(jctx *c, jv self, const jv *args, size_t n, const char *const *kwn,     \
                           const jv *kwv, size_t nkw, jv *out)

GLOBAL(g_range) {
    (void)self, (void)kwn, (void)kwv, (void)nkw;
    int64_t a[3] = {0, 0, 1};
    if (n < 1 || n > 3)
        return jx_fail(c, NULL, "TypeError: range expected 1 to 3 arguments, got %zu", n);
    for (size_t i = 0; i < n; i++) {
        if (args[i].k != JV_INT && args[i].k != JV_BOOL)
            return jx_fail(c, NULL, "TypeError: '%s' object cannot be interpreted as an integer",
                           jv_type_name(args[i]));
        a[n == 1 ? 1 : i] = args[i].k == JV_INT ? args[i].u.i : args[i].u.b;
    }
    if (a[2] == 0)
        return jx_fail(c, NULL, "ValueError: range() arg 3 must not be zero");
    jlist *l;
    LLMI_TRY(jx_list_new(c, 0, &l));
    for (int64_t x = a[0]; a[2] > 0 ? x < a[1] : x > a[1]; x += a[2]) {
        if (l->n >= c->lim.max_loop)
            return llmi_error(LLM_ERR_LIMIT, "chat template: range() longer than %llu",
                              (unsigned long long)c->lim.max_loop);
        LLMI_TRY(jx_list_push(c, l, jv_int(x)));
        if ((a[2] > 0 && x > INT64_MAX - a[2]) || (a[2] < 0 && x < INT64_MIN - a[2]))
            break;
    }
    *out = (jv){.k = JV_LIST, .u.l = l};
    return LLM_OK;
}

static llm_status make_dict(jctx *c, const jv *args, size_t n, const char *const *kwn,
                            const jv *kwv, size_t nkw, bool ns, jv *out) {
    jdict *d;
    LLMI_TRY(jx_dict_new(c, 0, &d));
    d->ns = ns;
    for (size_t i = 0; i < n; i++) {
        if (args[i].k != JV_DICT)
            return jx_fail(c, NULL, "TypeError: %s() takes keyword arguments or a mapping",
                           ns ? "namespace" : "dict");
        for (size_t k = 0; k < args[i].u.d->n; k++)
            LLMI_TRY(jx_dict_set(c, d, args[i].u.d->k[k], args[i].u.d->v[k]));
    }
    for (size_t k = 0; k < nkw; k++) {
        jv key;
        LLMI_TRY(jv_cstr(c, kwn[k], strlen(kwn[k]), &key));
        LLMI_TRY(jx_dict_set(c, d, key, kwv[k]));
    }
    *out = (jv){.k = JV_DICT, .u.d = d};
    return LLM_OK;
}
GLOBAL(g_namespace) {
    (void)self;
    return make_dict(c, args, n, kwn, kwv, nkw, true, out);
}
GLOBAL(g_dict) {
    (void)self;
    return make_dict(c, args, n, kwn, kwv, nkw, false, out);
}

GLOBAL(g_raise_exception) {
    (void)self, (void)kwn, (void)kwv, (void)nkw, (void)out;
    jv msg = jv_none();
    if (n > 0)
        LLMI_TRY(jv_to_str(c, args[0], &msg));
    return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat template raised an exception: %s",
                      msg.k == JV_STR ? msg.u.s->s : "");
}

GLOBAL(g_strftime_now) {
    (void)self, (void)kwn, (void)kwv, (void)nkw;
    if (n < 1 || args[0].k != JV_STR)
        return jx_fail(c, NULL, "TypeError: strftime_now needs a format string");
    time_t t = c->now >= 0 ? (time_t)c->now : time(NULL);
    struct tm tm;
    if (!localtime_r(&t, &tm))
        return jx_fail(c, NULL, "strftime_now: the time is out of range");
    char buf[512];
    size_t len = args[0].u.s->n ? strftime(buf, sizeof buf, args[0].u.s->s, &tm) : 0;
    if (args[0].u.s->n && len == 0 && args[0].u.s->n > 0 && args[0].u.s->s[0])
        buf[0] = '\0';
    return jv_cstr(c, buf, len, out);
}

static const struct {
    const char *name;
    jx_builtin fn;
} GLOBALS[] = {{"range", g_range},
               {"namespace", g_namespace},
               {"dict", g_dict},
               {"raise_exception", g_raise_exception},
               {"strftime_now", g_strftime_now}};

llm_status jx_global(jctx *c, const char *name, jv *out) {
    *out = jv_undef(NULL);
    for (size_t i = 0; i < sizeof GLOBALS / sizeof *GLOBALS; i++)
        if (strcmp(GLOBALS[i].name, name) == 0) {
            jfunc *f = jx_alloc(c, sizeof *f);
            if (!f)
                return jx_oom(c);
            *f = (jfunc){.name = GLOBALS[i].name, .fn = GLOBALS[i].fn};
            *out = (jv){.k = JV_FUNC, .u.fn = f};
            return LLM_OK;
        }
    return LLM_OK;
}

/* --- "%s" % value ------------------------------------------------------------ */

llm_status jx_format_percent(jctx *c, const node *at, jv fmt, jv args, jv *out) {
    const jv *a = &args;
    size_t n = 1, k = 0;
    if (args.k == JV_LIST && args.u.l->tuple) {
        a = args.u.l->v;
        n = args.u.l->n;
    }
    const jstr *s = fmt.u.s;
    jbuf b = {0};
    for (size_t i = 0; i < s->n; i++) {
        if (s->s[i] != '%') {
            LLMI_TRY(jb_put(c, &b, s->s + i, 1));
            continue;
        }
        if (++i >= s->n)
            return jx_fail(c, at, "ValueError: incomplete format");
        int prec = -1;
        if (s->s[i] == '.') {
            prec = 0;
            /* capped while read: a long digit run must not overflow */
            while (++i < s->n && s->s[i] >= '0' && s->s[i] <= '9')
                if (prec <= 50)
                    prec = prec * 10 + (s->s[i] - '0');
            if (i >= s->n || prec > 50)
                return jx_fail(c, at, "ValueError: incomplete format");
        }
        char conv = s->s[i];
        if (conv == '%') {
            LLMI_TRY(jb_put(c, &b, "%", 1));
            continue;
        }
        if (k >= n)
            return jx_fail(c, at, "TypeError: not enough arguments for format string");
        jv v = a[k++];
        char num[64];
        if (conv == 's' || conv == 'r') {
            LLMI_TRY(jv_write(c, &b, v, conv == 'r'));
        } else if (conv == 'd' || conv == 'i' || conv == 'f') {
            if (v.k != JV_INT && v.k != JV_FLOAT && v.k != JV_BOOL)
                return jx_fail(c, at, "TypeError: %%%c format: a real number is required, not %s",
                               conv, jv_type_name(v));
            double d = v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : v.u.b;
            if (conv == 'f')
                snprintf(num, sizeof num, "%.*f", prec < 0 ? 6 : prec, d);
            else if (v.k == JV_FLOAT)
                snprintf(num, sizeof num, "%.0f", trunc(d));
            else
                snprintf(num, sizeof num, "%lld", (long long)(v.k == JV_INT ? v.u.i : v.u.b));
            LLMI_TRY(jb_put(c, &b, num, strlen(num)));
        } else {
            return jx_fail(c, at, "ValueError: unsupported format character '%c'", conv);
        }
    }
    if (k < n && !(n == 1 && args.k == JV_DICT))
        return jx_fail(c, at, "TypeError: not all arguments converted during string formatting");
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

/* --- tests --------------------------------------------------------------------- */

static const char *const TESTS[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",      "equalto",   "escaped", "even",
    "false",   "float",    "ge",       "greaterthan", "gt",      "in",        "integer", "iterable",
    "le",      "lessthan", "lower",    "lt",          "mapping", "ne",        "none",    "number",
    "odd",     "sameas",   "sequence", "string",      "true",    "undefined", "upper"};

bool jx_test_known(const char *name) {
    for (size_t i = 0; i < sizeof TESTS / sizeof *TESTS; i++)
        if (strcmp(TESTS[i], name) == 0)
            return true;
    return false;
}

llm_status jx_test(jctx *c, const node *at, const char *name, jv v, const jv *args, size_t n,
                   bool *out) {
#define IS(s) (strcmp(name, s) == 0)
    static const struct {
        const char *name;
        int op;
    } cmp[] = {{"eq", OP_EQ},       {"equalto", OP_EQ}, {"ne", OP_NE}, {"lt", OP_LT},
               {"lessthan", OP_LT}, {"le", OP_LE},      {"gt", OP_GT}, {"greaterthan", OP_GT},
               {"ge", OP_GE},       {"in", OP_IN}};
    for (size_t i = 0; i < sizeof cmp / sizeof *cmp; i++)
        if (IS(cmp[i].name)) {
            if (n < 1)
                return jx_fail(c, at, "TypeError: test '%s' needs an argument", name);
            return jx_compare(c, at, cmp[i].op, v, args[0], out);
        }
    bool is_int = v.k == JV_INT, num = v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL;
    if (IS("defined"))
        *out = v.k != JV_UNDEF;
    else if (IS("undefined"))
        *out = v.k == JV_UNDEF;
    else if (IS("none"))
        *out = v.k == JV_NONE;
    else if (IS("boolean"))
        *out = v.k == JV_BOOL;
    else if (IS("true") || IS("false"))
        *out = v.k == JV_BOOL && v.u.b == IS("true");
    else if (IS("integer"))
        *out = is_int;
    else if (IS("float"))
        *out = v.k == JV_FLOAT;
    else if (IS("number"))
        *out = num;
    else if (IS("string"))
        *out = v.k == JV_STR;
    else if (IS("mapping"))
        *out = v.k == JV_DICT && !v.u.d->ns;
    else if (IS("sequence"))
        *out = v.k == JV_STR || v.k == JV_LIST || (v.k == JV_DICT && !v.u.d->ns);
    else if (IS("iterable"))
        *out = v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_UNDEF;
    else if (IS("callable"))
        *out = v.k == JV_FUNC;
    else if (IS("escaped"))
        *out = false;
    else if (IS("sameas"))
        *out = n > 0 && v.k == args[0].k &&
               (v.k == JV_NONE || v.k == JV_UNDEF || (v.k == JV_BOOL && v.u.b == args[0].u.b) ||
                (v.k == JV_INT && v.u.i == args[0].u.i) ||
                ((v.k == JV_LIST || v.k == JV_DICT || v.k == JV_STR || v.k == JV_FUNC) &&
                 v.u.l == args[0].u.l));
    else if (IS("lower") || IS("upper")) {
        if (v.k != JV_STR)
            return jx_fail(c, at, "AttributeError: '%s' object has no attribute '%s'",
                           jv_type_name(v), name);
        bool cased = false, ok = true;
        for (size_t i = 0; i < v.u.s->n; i++) {
            char ch = v.u.s->s[i];
            bool up = ch >= 'A' && ch <= 'Z', lo = ch >= 'a' && ch <= 'z';
            cased |= up || lo;
            if (IS("lower") ? up : lo)
                ok = false;
        }
        *out = ok && cased;
    } else if (IS("odd") || IS("even") || IS("divisibleby")) {
        if (v.k == JV_UNDEF)
            return jx_undefined_error(c, at, v);
        if (!num)
            return jx_fail(c, at, "TypeError: unsupported operand type(s) for %%: '%s' and 'int'",
                           jv_type_name(v));
        jv m;
        jv d = IS("divisibleby") ? (n ? args[0] : jv_none()) : jv_int(2);
        if (IS("divisibleby") && n < 1)
            return jx_fail(c, at, "TypeError: divisibleby needs a number");
        LLMI_TRY(jx_binop(c, at, OP_MOD, v, d, &m));
        bool zero = (m.k == JV_INT && m.u.i == 0) || (m.k == JV_FLOAT && m.u.f == 0.0);
        *out = IS("odd") ? !zero : zero;
    } else {
        return jx_fail(c, at, "TemplateAssertionError: No test named '%s'.", name);
    }
#undef IS
    return LLM_OK;
}
