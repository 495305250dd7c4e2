/* Attribute access (jinja2's getattr-then-item order), the Python methods
 * of str and dict that templates call, the sandbox's refusal of methods
 * that modify a value (transformers renders in jinja2's immutable
 * sandbox), the global functions, and jinja2's tests. */
#include "jinja/jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define METHOD(name)                                                                               \
    static llm_status name(jctx *c, jv self, const jv *args, size_t n, const char *const *kwn,     \
                           const jv *kwv, size_t nkw, jv *out)
#define UNUSED_KW                                                                                  \
    (void)kwn;                                                                                     \
    (void)kwv;                                                                                     \
    (void)nkw

static llm_status want_str(jctx *c, const char *fn, const jv *args, size_t n, size_t i,
                           const jstr **out) {
    if (i >= n || args[i].k == JV_NONE) {
        *out = NULL;
        return LLM_OK;
    }
    if (args[i].k != JV_STR)
        return jx_fail(c, NULL, "TypeError: %s() argument %zu must be str, not %s", fn, i + 1,
                       jv_type_name(args[i]));
    *out = args[i].u.s;
    return LLM_OK;
}

static int64_t int_arg(const jv *args, size_t n, size_t i, int64_t dflt) {
    return i < n && args[i].k == JV_INT ? args[i].u.i : dflt;
}

METHOD(m_strip) {
    UNUSED_KW;
    const jstr *chars = NULL;
    LLMI_TRY(want_str(c, "strip", args, n, 0, &chars));
    return jx_strip(c, self.u.s, chars, 3, out);
}
METHOD(m_lstrip) {
    UNUSED_KW;
    const jstr *chars = NULL;
    LLMI_TRY(want_str(c, "lstrip", args, n, 0, &chars));
    return jx_strip(c, self.u.s, chars, 1, out);
}
METHOD(m_rstrip) {
    UNUSED_KW;
    const jstr *chars = NULL;
    LLMI_TRY(want_str(c, "rstrip", args, n, 0, &chars));
    return jx_strip(c, self.u.s, chars, 2, out);
}
METHOD(m_split) {
    const jstr *sep = NULL;
    jv ms = jv_int(int_arg(args, n, 1, -1));
    for (size_t k = 0; k < nkw; k++)
        if (strcmp(kwn[k], "maxsplit") == 0)
            ms = kwv[k];
    LLMI_TRY(want_str(c, "split", args, n, 0, &sep));
    return jx_split(c, self.u.s, sep, ms.k == JV_INT ? ms.u.i : -1, false, out);
}
METHOD(m_rsplit) {
    UNUSED_KW;
    const jstr *sep = NULL;
    LLMI_TRY(want_str(c, "rsplit", args, n, 0, &sep));
    return jx_split(c, self.u.s, sep, int_arg(args, n, 1, -1), true, out);
}

static llm_status affix(jctx *c, jv self, const jv *args, size_t n, bool start, jv *out) {
    if (n < 1)
        return jx_fail(c, NULL, "TypeError: %s() takes at least 1 argument",
                       start ? "startswith" : "endswith");
    const jv *cands = args;
    size_t nc = 1;
    if (args[0].k == JV_LIST && args[0].u.l->tuple) {
        cands = args[0].u.l->v;
        nc = args[0].u.l->n;
    }
    for (size_t i = 0; i < nc; i++) {
        if (cands[i].k != JV_STR)
            return jx_fail(c, NULL, "TypeError: %s first arg must be str or a tuple of str",
                           start ? "startswith" : "endswith");
        if (start ? jx_starts(self.u.s, cands[i].u.s) : jx_ends(self.u.s, cands[i].u.s)) {
            *out = jv_bool(true);
            return LLM_OK;
        }
    }
    *out = jv_bool(false);
    return LLM_OK;
}
METHOD(m_startswith) {
    UNUSED_KW;
    return affix(c, self, args, n, true, out);
}
METHOD(m_endswith) {
    UNUSED_KW;
    return affix(c, self, args, n, false, out);
}
METHOD(m_upper) {
    UNUSED_KW;
    (void)args, (void)n;
    return jx_case(c, self.u.s, 1, out);
}
METHOD(m_lower) {
    UNUSED_KW;
    (void)args, (void)n;
    return jx_case(c, self.u.s, 0, out);
}
METHOD(m_title) {
    UNUSED_KW;
    (void)args, (void)n;
    return jx_case(c, self.u.s, 2, out);
}
METHOD(m_capitalize) {
    UNUSED_KW;
    (void)args, (void)n;
    return jx_case(c, self.u.s, 3, out);
}
METHOD(m_replace) {
    UNUSED_KW;
    const jstr *old = NULL, *rep = NULL;
    LLMI_TRY(want_str(c, "replace", args, n, 0, &old));
    LLMI_TRY(want_str(c, "replace", args, n, 1, &rep));
    if (!old || !rep)
        return jx_fail(c, NULL, "TypeError: replace() needs two strings");
    return jx_replace(c, self.u.s, old, rep, int_arg(args, n, 2, -1), out);
}

static llm_status find_sub(jctx *c, jv self, const jv *args, size_t n, bool count, jv *out) {
    const jstr *sub = NULL;
    LLMI_TRY(want_str(c, count ? "count" : "find", args, n, 0, &sub));
    if (!sub)
        return jx_fail(c, NULL, "TypeError: a string argument is needed");
    const jstr *s = self.u.s;
    int64_t hits = 0;
    for (size_t i = 0; i + sub->n <= s->n;) {
        if (memcmp(s->s + i, sub->s, sub->n) == 0) {
            if (!count) {
                *out = jv_int((int64_t)jx_utf8_count(s->s, i));
                return LLM_OK;
            }
            hits++;
            i += sub->n ? sub->n : 1;
        } else {
            i++;
        }
    }
    *out = jv_int(count ? hits : -1);
    return LLM_OK;
}
METHOD(m_find) {
    UNUSED_KW;
    return find_sub(c, self, args, n, false, out);
}
METHOD(m_count) {
    UNUSED_KW;
    return find_sub(c, self, args, n, true, out);
}
METHOD(m_join) {
    UNUSED_KW;
    if (n < 1 || args[0].k != JV_LIST)
        return jx_fail(c, NULL, "TypeError: join() needs a list of strings");
    jbuf b = {0};
    for (size_t i = 0; i < args[0].u.l->n; i++) {
        jv x = args[0].u.l->v[i];
        if (x.k != JV_STR)
            return jx_fail(c, NULL, "TypeError: sequence item %zu: expected str instance, %s found",
                           i, jv_type_name(x));
        if (i)
            LLMI_TRY(jb_put(c, &b, self.u.s->s, self.u.s->n));
        LLMI_TRY(jb_put(c, &b, x.u.s->s, x.u.s->n));
    }
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

/* str.format: {} {0} {name} and {{ }}; no format specs */
METHOD(m_format) {
    const jstr *s = self.u.s;
    jbuf b = {0};
    size_t auto_i = 0;
    for (size_t i = 0; i < s->n; i++) {
        char ch = s->s[i];
        if ((ch == '{' || ch == '}') && i + 1 < s->n && s->s[i + 1] == ch) {
            LLMI_TRY(jb_put(c, &b, &ch, 1));
            i++;
            continue;
        }
        if (ch != '{') {
            LLMI_TRY(jb_put(c, &b, &ch, 1));
            continue;
        }
        const char *close = memchr(s->s + i, '}', s->n - i);
        if (!close)
            return jx_fail(c, NULL, "ValueError: Single '{' encountered in format string");
        size_t fl = (size_t)(close - s->s) - i - 1;
        const char *field = s->s + i + 1;
        jv v = jv_undef(NULL);
        bool found = false;
        if (fl == 0) {
            found = auto_i < n;
            if (found)
                v = args[auto_i++];
        } else if (field[0] >= '0' && field[0] <= '9') {
            size_t k = 0;
            for (size_t j = 0; j < fl && field[j] >= '0' && field[j] <= '9'; j++)
                k = k * 10 + (size_t)(field[j] - '0');
            found = k < n;
            if (found)
                v = args[k];
        } else {
            for (size_t k = 0; k < nkw; k++)
                if (strlen(kwn[k]) == fl && memcmp(kwn[k], field, fl) == 0) {
                    v = kwv[k];
                    found = true;
                }
        }
        if (!found)
            return jx_fail(c, NULL, "IndexError: a format field has no argument");
        LLMI_TRY(jv_write(c, &b, v, false));
        i = (size_t)(close - s->s);
    }
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

static llm_status str_class(jctx *c, jv self, int kind, jv *out) {
    (void)c;
    const jstr *s = self.u.s;
    bool ok = s->n > 0, cased = false;
    for (size_t i = 0; i < s->n; i++) {
        unsigned char ch = (unsigned char)s->s[i];
        bool up = ch >= 'A' && ch <= 'Z', lo = ch >= 'a' && ch <= 'z';
        cased |= up || lo;
        if (kind == 0 && !(ch >= '0' && ch <= '9'))
            ok = false;
        if (kind == 1 && !(up || lo || ch >= 0x80))
            ok = false;
        if (kind == 2 && !(ch == ' ' || (ch >= 9 && ch <= 13)))
            ok = false;
        if (kind == 3 && lo)
            ok = false;
        if (kind == 4 && up)
            ok = false;
    }
    *out = jv_bool(ok && (kind < 3 || cased));
    return LLM_OK;
}
METHOD(m_isdigit) {
    UNUSED_KW;
    (void)args, (void)n;
    return str_class(c, self, 0, out);
}
METHOD(m_isalpha) {
    UNUSED_KW;
    (void)args, (void)n;
    return str_class(c, self, 1, out);
}
METHOD(m_isspace) {
    UNUSED_KW;
    (void)args, (void)n;
    return str_class(c, self, 2, out);
}
METHOD(m_isupper) {
    UNUSED_KW;
    (void)args, (void)n;
    return str_class(c, self, 3, out);
}
METHOD(m_islower) {
    UNUSED_KW;
    (void)args, (void)n;
    return str_class(c, self, 4, out);
}
METHOD(m_splitlines) {
    UNUSED_KW;
    (void)args, (void)n;
    jlist *l;
    LLMI_TRY(jx_list_new(c, 0, &l));
    const jstr *s = self.u.s;
    size_t st = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->s[i] == '\n' || s->s[i] == '\r') {
            jv piece;
            LLMI_TRY(jv_cstr(c, s->s + st, i - st, &piece));
            LLMI_TRY(jx_list_push(c, l, piece));
            if (s->s[i] == '\r' && i + 1 < s->n && s->s[i + 1] == '\n')
                i++;
            st = i + 1;
        }
    if (st < s->n) {
        jv piece;
        LLMI_TRY(jv_cstr(c, s->s + st, s->n - st, &piece));
        LLMI_TRY(jx_list_push(c, l, piece));
    }
    *out = (jv){.k = JV_LIST, .u.l = l};
    return LLM_OK;
}

METHOD(m_get) {
    UNUSED_KW;
    if (n < 1)
        return jx_fail(c, NULL, "TypeError: get expected at least 1 argument, got 0");
    if (!jx_dict_get(self.u.d, args[0], out))
        *out = n > 1 ? args[1] : jv_none();
    return LLM_OK;
}
static llm_status dict_view(jctx *c, jv self, int which, jv *out) {
    jlist *l;
    LLMI_TRY(jx_list_new(c, self.u.d->n, &l));
    for (size_t i = 0; i < self.u.d->n; i++) {
        jv x = which == 0 ? self.u.d->k[i] : self.u.d->v[i];
        if (which == 2) {
            jlist *pair;
            LLMI_TRY(jx_list_new(c, 2, &pair));
            pair->tuple = true;
            LLMI_TRY(jx_list_push(c, pair, self.u.d->k[i]));
            LLMI_TRY(jx_list_push(c, pair, self.u.d->v[i]));
            x = (jv){.k = JV_LIST, .u.l = pair};
        }
        LLMI_TRY(jx_list_push(c, l, x));
    }
    *out = (jv){.k = JV_LIST, .u.l = l};
    return LLM_OK;
}
METHOD(m_keys) {
    UNUSED_KW;
    (void)args, (void)n;
    return dict_view(c, self, 0, out);
}
METHOD(m_values) {
    UNUSED_KW;
    (void)args, (void)n;
    return dict_view(c, self, 1, out);
}
METHOD(m_items) {
    UNUSED_KW;
    (void)args, (void)n;
    return dict_view(c, self, 2, out);
}
METHOD(m_unsafe) {
    UNUSED_KW;
    (void)args, (void)n, (void)out;
    return jx_fail(c, NULL, "SecurityError: access to attribute '%s' of '%s' object is unsafe.",
                   self.u.l->v[0].u.s->s, self.u.l->v[1].u.s->s);
}

typedef struct method {
    const char *name;
    jx_builtin fn;
} method;

static const method STR_METHODS[] = {{"strip", m_strip},
                                     {"lstrip", m_lstrip},
                                     {"rstrip", m_rstrip},
                                     {"split", m_split},
                                     {"rsplit", m_rsplit},
                                     {"startswith", m_startswith},
                                     {"endswith", m_endswith},
                                     {"upper", m_upper},
                                     {"lower", m_lower},
                                     {"title", m_title},
                                     {"capitalize", m_capitalize},
                                     {"replace", m_replace},
                                     {"find", m_find},
                                     {"count", m_count},
                                     {"join", m_join},
                                     {"format", m_format},
                                     {"isdigit", m_isdigit},
                                     {"isalpha", m_isalpha},
                                     {"isspace", m_isspace},
                                     {"isupper", m_isupper},
                                     {"islower", m_islower},
                                     {"splitlines", m_splitlines}};
static const method DICT_METHODS[] = {
    {"get", m_get}, {"keys", m_keys}, {"values", m_values}, {"items", m_items}};
static const char *const LIST_UNSAFE[] = {"append", "extend", "insert",  "pop",
                                          "remove", "sort",   "reverse", "clear"};
static const char *const DICT_UNSAFE[] = {"update", "pop", "popitem", "setdefault", "clear"};

static llm_status bind(jctx *c, const char *name, jx_builtin fn, jv self, jv *out) {
    jfunc *f = jx_alloc(c, sizeof *f);
    if (!f)
        return jx_oom(c);
    *f = (jfunc){.name = name, .fn = fn, .self = self};
    *out = (jv){.k = JV_FUNC, .u.fn = f};
    return LLM_OK;
}

static llm_status unsafe(jctx *c, const char *name, jv obj, jv *out) {
    jlist *l;
    jv a, b;
    LLMI_TRY(jx_list_new(c, 2, &l));
    LLMI_TRY(jv_cstr(c, name, strlen(name), &a));
    LLMI_TRY(jv_cstr(c, jv_type_name(obj), strlen(jv_type_name(obj)), &b));
    LLMI_TRY(jx_list_push(c, l, a));
    LLMI_TRY(jx_list_push(c, l, b));
    return bind(c, name, m_unsafe, (jv){.k = JV_LIST, .u.l = l}, out);
}

#define FIND(table, name)                                                                          \
    for (size_t i_ = 0; i_ < sizeof table / sizeof *table; i_++)                                   \
        if (strcmp(table[i_].name, name) == 0)

llm_status jx_getattr(jctx *c, const node *at, jv obj, const char *name, jv *out) {
    switch (obj.k) {
    case JV_UNDEF:
        return jx_undefined_error(c, at, obj);
    case JV_NONE:
        return jx_fail(c, at, "UndefinedError: 'None' has no attribute '%s'", name);
    case JV_STR:
        FIND(STR_METHODS, name) return bind(c, STR_METHODS[i_].name, STR_METHODS[i_].fn, obj, out);
        break;
    case JV_DICT:
        if (!obj.u.d->ns) {
            FIND(DICT_METHODS, name)
            return bind(c, DICT_METHODS[i_].name, DICT_METHODS[i_].fn, obj, out);
            for (size_t i = 0; i < sizeof DICT_UNSAFE / sizeof *DICT_UNSAFE; i++)
                if (strcmp(DICT_UNSAFE[i], name) == 0)
                    return unsafe(c, name, obj, out);
        }
        if (jx_dict_get_str(obj.u.d, name, out))
            return LLM_OK;
        break;
    case JV_LIST:
        for (size_t i = 0; i < sizeof LIST_UNSAFE / sizeof *LIST_UNSAFE; i++)
            if (strcmp(LIST_UNSAFE[i], name) == 0 && !obj.u.l->tuple)
                return unsafe(c, name, obj, out);
        break;
    default:
        break;
    }
    *out = jx_undef(c, "'%s object' has no attribute '%s'", jv_type_name(obj), name);
    return LLM_OK;
}
