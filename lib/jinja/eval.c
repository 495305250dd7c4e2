/* The evaluator: statements write to the current output buffer,
 * expressions produce values. Variables live in frames: a for-loop
 * iteration and a macro call each get a new one, so {% set %} inside them
 * does not leak out (jinja2's scoping; namespace() is the way out). Every
 * evaluation counts a step against the limit. */
#include "jinja/jinja_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

jv jx_undef(jctx *c, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jstr *s = jx_str(c, msg, strlen(msg));
    return jv_undef(s ? s->s : "a value is undefined");
}

llm_status jx_undefined_error(jctx *c, const node *at, jv v) {
    return jx_fail(c, at, "UndefinedError: %s", v.u.undef ? v.u.undef : "undefined");
}

llm_status jx_step(jctx *c, const node *at) {
    if (++c->steps > c->lim.max_steps)
        return llmi_error(
            LLM_ERR_LIMIT, "chat template line %u:%u: stopped after %llu evaluation steps",
            at ? at->line : 0, at ? at->col : 0, (unsigned long long)c->lim.max_steps);
    return LLM_OK;
}

llm_status jx_frame_new(jctx *c, frame *parent, frame **out) {
    frame *f = jx_alloc(c, sizeof *f);
    if (!f)
        return jx_oom(c);
    f->parent = parent;
    LLMI_TRY(jx_dict_new(c, 0, &f->vars));
    *out = f;
    return LLM_OK;
}

llm_status jx_frame_set(jctx *c, frame *f, const char *name, jv v) {
    jv k;
    LLMI_TRY(jv_cstr(c, name, strlen(name), &k));
    return jx_dict_set(c, f->vars, k, v);
}

llm_status jx_lookup(jctx *c, frame *f, const char *name, jv *out) {
    for (; f; f = f->parent)
        if (jx_dict_get_str(f->vars, name, out))
            return LLM_OK;
    LLMI_TRY(jx_global(c, name, out));
    if (out->k == JV_UNDEF)
        *out = jx_undef(c, "'%s' is undefined", name);
    return LLM_OK;
}

/* --- operators ------------------------------------------------------------- */

static bool is_num(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static double dbl(jv v) {
    return v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : (double)v.u.b;
}
static int64_t integer(jv v) { return v.k == JV_INT ? v.u.i : (int64_t)v.u.b; }

static llm_status type_error(jctx *c, const node *at, const char *op, jv a, jv b) {
    if (a.k == JV_UNDEF)
        return jx_undefined_error(c, at, a);
    if (b.k == JV_UNDEF)
        return jx_undefined_error(c, at, b);
    return jx_fail(c, at, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", op,
                   jv_type_name(a), jv_type_name(b));
}

static llm_status overflow(jctx *c, const node *at) {
    return jx_fail(c, at, "integer overflow (values beyond 64 bits are not supported)");
}

static llm_status repeat(jctx *c, const node *at, jv seq, int64_t times, jv *out) {
    if (times < 0)
        times = 0;
    if (seq.k == JV_STR) {
        if (seq.u.s->n && (uint64_t)times > c->lim.max_output / seq.u.s->n)
            return llmi_error(LLM_ERR_LIMIT, "chat template line %u:%u: a string too long",
                              at->line, at->col);
        jbuf b = {0};
        for (int64_t i = 0; i < times; i++)
            LLMI_TRY(jb_put(c, &b, seq.u.s->s, seq.u.s->n));
        return jv_cstr(c, b.s ? b.s : "", b.n, out);
    }
    jlist *l;
    if (seq.u.l->n && (uint64_t)times > c->lim.max_loop / seq.u.l->n)
        return llmi_error(LLM_ERR_LIMIT, "chat template line %u:%u: a list too long", at->line,
                          at->col);
    LLMI_TRY(jx_list_new(c, seq.u.l->n * (size_t)times, &l));
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->n; k++)
            LLMI_TRY(jx_list_push(c, l, seq.u.l->v[k]));
    *out = (jv){.k = JV_LIST, .u.l = l};
    return LLM_OK;
}

llm_status jx_format_percent(jctx *c, const node *at, jv fmt, jv args, jv *out);

llm_status jx_binop(jctx *c, const node *at, int op, jv a, jv b, jv *out) {
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (is_num(a) && is_num(b)) {
        bool ints = a.k != JV_FLOAT && b.k != JV_FLOAT;
        int64_t x = ints ? integer(a) : 0, y = ints ? integer(b) : 0, r;
        double fx = dbl(a), fy = dbl(b);
        switch (op) {
        case OP_ADD:
            if (!ints)
                break;
            if (__builtin_add_overflow(x, y, &r))
                return overflow(c, at);
            *out = jv_int(r);
            return LLM_OK;
        case OP_SUB:
            if (!ints)
                break;
            if (__builtin_sub_overflow(x, y, &r))
                return overflow(c, at);
            *out = jv_int(r);
            return LLM_OK;
        case OP_MUL:
            if (!ints)
                break;
            if (__builtin_mul_overflow(x, y, &r))
                return overflow(c, at);
            *out = jv_int(r);
            return LLM_OK;
        case OP_DIV:
            if (fy == 0)
                return jx_fail(c, at, "ZeroDivisionError: division by zero");
            *out = jv_float(fx / fy);
            return LLM_OK;
        case OP_FLOORDIV:
        case OP_MOD:
            if (ints ? y == 0 : fy == 0)
                return jx_fail(c, at, "ZeroDivisionError: %s by zero",
                               op == OP_MOD ? "modulo" : "integer division");
            if (ints) {
                if (x == INT64_MIN && y == -1)
                    return overflow(c, at);
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = jv_int(op == OP_MOD ? m : q);
            } else {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0)))
                    m += fy;
                *out = jv_float(op == OP_MOD ? m : floor(fx / fy));
            }
            return LLM_OK;
        case OP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1;
                for (int64_t i = 0; i < y; i++)
                    if (__builtin_mul_overflow(acc, x, &acc))
                        return overflow(c, at);
                *out = jv_int(acc);
                return LLM_OK;
            }
            *out = jv_float(pow(fx, fy));
            return LLM_OK;
        }
        if (op == OP_ADD || op == OP_SUB || op == OP_MUL) {
            *out = jv_float(op == OP_ADD ? fx + fy : op == OP_SUB ? fx - fy : fx * fy);
            return LLM_OK;
        }
    }
    if (op == OP_ADD && a.k == JV_STR && b.k == JV_STR) {
        jstr *s = jx_alloc(c, sizeof *s + a.u.s->n + b.u.s->n + 1);
        if (!s)
            return jx_oom(c);
        s->n = a.u.s->n + b.u.s->n;
        memcpy(s->s, a.u.s->s, a.u.s->n);
        memcpy(s->s + a.u.s->n, b.u.s->s, b.u.s->n);
        s->s[s->n] = '\0';
        *out = jv_str(s);
        return LLM_OK;
    }
    if (op == OP_ADD && a.k == JV_LIST && b.k == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        jlist *l;
        LLMI_TRY(jx_list_new(c, a.u.l->n + b.u.l->n, &l));
        for (size_t i = 0; i < a.u.l->n; i++)
            LLMI_TRY(jx_list_push(c, l, a.u.l->v[i]));
        for (size_t i = 0; i < b.u.l->n; i++)
            LLMI_TRY(jx_list_push(c, l, b.u.l->v[i]));
        l->tuple = a.u.l->tuple;
        *out = (jv){.k = JV_LIST, .u.l = l};
        return LLM_OK;
    }
    if (op == OP_MUL && (a.k == JV_STR || a.k == JV_LIST) && (b.k == JV_INT || b.k == JV_BOOL))
        return repeat(c, at, a, integer(b), out);
    if (op == OP_MUL && (b.k == JV_STR || b.k == JV_LIST) && (a.k == JV_INT || a.k == JV_BOOL))
        return repeat(c, at, b, integer(a), out);
    if (op == OP_MOD && a.k == JV_STR)
        return jx_format_percent(c, at, a, b, out);
    return type_error(c, at, names[op], a, b);
}

static int cmp_bytes(const jstr *a, const jstr *b) {
    size_t n = a->n < b->n ? a->n : b->n;
    int r = memcmp(a->s, b->s, n);
    return r ? r : (a->n > b->n) - (a->n < b->n);
}

/* a < b in Python's order: numbers, strings, lists element by element */
static llm_status less(jctx *c, const node *at, const char *op, jv a, jv b, int depth, int *out) {
    if (depth > 1000)
        return llmi_error(LLM_ERR_LIMIT, "chat template: compared values nest deeper than 1000");
    if (is_num(a) && is_num(b)) {
        double x = dbl(a), y = dbl(b);
        if (a.k != JV_FLOAT && b.k != JV_FLOAT)
            *out = (integer(a) > integer(b)) - (integer(a) < integer(b));
        else
            *out = (x > y) - (x < y);
        return LLM_OK;
    }
    if (a.k == JV_STR && b.k == JV_STR) {
        *out = cmp_bytes(a.u.s, b.u.s);
        return LLM_OK;
    }
    if (a.k == JV_LIST && b.k == JV_LIST) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i]))
                continue;
            return less(c, at, op, a.u.l->v[i], b.u.l->v[i], depth + 1, out);
        }
        *out = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return LLM_OK;
    }
    if (a.k == JV_UNDEF)
        return jx_undefined_error(c, at, a);
    if (b.k == JV_UNDEF)
        return jx_undefined_error(c, at, b);
    return jx_fail(c, at, "TypeError: '%s' not supported between instances of '%s' and '%s'", op,
                   jv_type_name(a), jv_type_name(b));
}

static llm_status contains(jctx *c, const node *at, jv hay, jv needle, bool *out) {
    *out = false;
    if (hay.k == JV_STR) {
        if (needle.k != JV_STR)
            return jx_fail(c, at,
                           "TypeError: 'in <string>' requires string as left operand, not %s",
                           jv_type_name(needle));
        const jstr *h = hay.u.s, *n = needle.u.s;
        for (size_t i = 0; n->n <= h->n && i + n->n <= h->n; i++)
            if (memcmp(h->s + i, n->s, n->n) == 0) {
                *out = true;
                break;
            }
        return LLM_OK;
    }
    if (hay.k == JV_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jv_equal(hay.u.l->v[i], needle)) {
                *out = true;
                break;
            }
        return LLM_OK;
    }
    if (hay.k == JV_DICT) {
        jv v;
        *out = jx_dict_get(hay.u.d, needle, &v);
        return LLM_OK;
    }
    if (hay.k == JV_UNDEF)
        return LLM_OK;
    return jx_fail(c, at, "TypeError: argument of type '%s' is not iterable", jv_type_name(hay));
}

llm_status jx_compare(jctx *c, const node *at, int op, jv a, jv b, bool *out) {
    static const char *const names[] = {
        [OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
    int r;
    switch (op) {
    case OP_EQ:
        *out = jv_equal(a, b);
        return LLM_OK;
    case OP_NE:
        *out = !jv_equal(a, b);
        return LLM_OK;
    case OP_IN:
        return contains(c, at, b, a, out);
    case OP_NOTIN:
        LLMI_TRY(contains(c, at, b, a, out));
        *out = !*out;
        return LLM_OK;
    default:
        LLMI_TRY(less(c, at, names[op], a, b, 0, &r));
        *out = op == OP_LT ? r < 0 : op == OP_LE ? r <= 0 : op == OP_GT ? r > 0 : r >= 0;
        return LLM_OK;
    }
}

/* --- subscripts ---------------------------------------------------------------- */

llm_status jx_get_item(jctx *c, const node *at, jv obj, jv key, jv *out) {
    if (obj.k == JV_UNDEF)
        return jx_undefined_error(c, at, obj);
    if (obj.k == JV_DICT) {
        if (jx_dict_get(obj.u.d, key, out))
            return LLM_OK;
    } else if ((obj.k == JV_LIST || obj.k == JV_STR) && (key.k == JV_INT || key.k == JV_BOOL)) {
        int64_t i = integer(key);
        size_t n = obj.k == JV_LIST ? obj.u.l->n : jx_utf8_count(obj.u.s->s, obj.u.s->n);
        if (i < 0)
            i += (int64_t)n;
        if (i >= 0 && (uint64_t)i < n) {
            if (obj.k == JV_LIST) {
                *out = obj.u.l->v[i];
                return LLM_OK;
            }
            size_t b = jx_utf8_offset(obj.u.s->s, obj.u.s->n, (size_t)i);
            size_t e = jx_utf8_offset(obj.u.s->s, obj.u.s->n, (size_t)i + 1);
            return jv_cstr(c, obj.u.s->s + b, e - b, out);
        }
        *out = jx_undef(c, "%s object has no element %lld", jv_type_name(obj), (long long)i);
        return LLM_OK;
    }
    if (key.k == JV_STR && obj.k != JV_NONE)
        return jx_getattr(c, at, obj, key.u.s->s, out);
    if (obj.k == JV_NONE)
        return jx_fail(c, at, "UndefinedError: 'None' has no attribute");
    jbuf b = {0};
    LLMI_TRY(jv_write(c, &b, key, true));
    *out = jx_undef(c, "'%s object' has no attribute %s", jv_type_name(obj), b.s ? b.s : "");
    return LLM_OK;
}

static llm_status slice_bound(jctx *c, frame *f, const node *e, int64_t dflt, int64_t *out) {
    if (!e) {
        *out = dflt;
        return LLM_OK;
    }
    jv v;
    LLMI_TRY(jx_eval(c, f, e, &v));
    if (v.k == JV_NONE) {
        *out = dflt;
        return LLM_OK;
    }
    if (v.k != JV_INT && v.k != JV_BOOL)
        return jx_fail(c, e, "TypeError: slice indices must be integers or None");
    *out = integer(v);
    return LLM_OK;
}

llm_status jx_eval_slice(jctx *c, frame *f, const node *e, jv *out) {
    jv obj;
    LLMI_TRY(jx_eval(c, f, e->a, &obj));
    if (obj.k == JV_UNDEF)
        return jx_undefined_error(c, e, obj);
    if (obj.k != JV_LIST && obj.k != JV_STR)
        return jx_fail(c, e, "TypeError: '%s' object is not subscriptable", jv_type_name(obj));
    int64_t stp;
    LLMI_TRY(slice_bound(c, f, e->kids[2], 1, &stp));
    if (stp == 0)
        return jx_fail(c, e, "ValueError: slice step cannot be zero");
    int64_t n = (int64_t)(obj.k == JV_LIST ? obj.u.l->n : jx_utf8_count(obj.u.s->s, obj.u.s->n));
    int64_t lo, hi;
    LLMI_TRY(slice_bound(c, f, e->kids[0], stp > 0 ? 0 : n - 1, &lo));
    LLMI_TRY(slice_bound(c, f, e->kids[1], stp > 0 ? n : -n - 1, &hi));
    /* Python's PySlice_AdjustIndices */
    if (e->kids[0] && lo < 0)
        lo = lo + n < 0 ? (stp < 0 ? -1 : 0) : lo + n;
    else if (lo >= n)
        lo = stp < 0 ? n - 1 : n;
    if (e->kids[1] && hi < 0)
        hi = hi + n < 0 ? (stp < 0 ? -1 : 0) : hi + n;
    else if (hi >= n)
        hi = stp < 0 ? n - 1 : n;
    if (!e->kids[1] && stp < 0)
        hi = -1;
    jlist *l = NULL;
    jbuf b = {0};
    size_t *offs = NULL;
    if (obj.k == JV_LIST) {
        LLMI_TRY(jx_list_new(c, 0, &l));
        l->tuple = obj.u.l->tuple;
    } else {
        offs = jx_alloc(c, ((size_t)n + 1) * sizeof *offs);
        if (!offs)
            return jx_oom(c);
        for (int64_t i = 0; i <= n; i++)
            offs[i] = jx_utf8_offset(obj.u.s->s, obj.u.s->n, (size_t)i);
    }
    for (int64_t i = lo; stp > 0 ? i < hi : i > hi; i += stp) {
        if (l)
            LLMI_TRY(jx_list_push(c, l, obj.u.l->v[i]));
        else
            LLMI_TRY(jb_put(c, &b, obj.u.s->s + offs[i], offs[i + 1] - offs[i]));
    }
    if (l) {
        *out = (jv){.k = JV_LIST, .u.l = l};
        return LLM_OK;
    }
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}
