/* Values of the Jinja interpreter: the arena they live in, Python's str()
 * and repr() of them (what a template prints) and the conversion of JSON
 * inputs into values. json.dumps (the tojson filter) is in tojson.c: it
 * compares keys with the evaluator's jx_compare, which must not pull this
 * file, and with it the lexer and parsers, into the evaluator's circle. */
#include "jinja/jinja_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jx_chunk {
    jx_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

enum { CHUNK = 64 * 1024 };

llm_status jx_oom(jctx *c) {
    if (c->arena.used > c->arena.limit)
        return llmi_error(LLM_ERR_LIMIT, "chat template: the render needs more than %zu bytes",
                          c->arena.limit);
    return llmi_oom("chat template values");
}

void *jx_alloc(jctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    jx_chunk *h = c->arena.head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > CHUNK ? n : CHUNK;
        if (c->arena.used + cap > c->arena.limit) {
            c->arena.used += cap;
            return NULL;
        }
        jx_chunk *k = llmi_malloc(sizeof *k + cap);
        if (!k)
            return NULL;
        k->cap = cap;
        k->used = 0;
        c->arena.used += cap;
        if (h && h->cap - h->used > 1024 && n > CHUNK) {
            /* a big one-off: keep filling the current chunk afterwards */
            k->next = h->next;
            h->next = k;
            k->used = n;
            return k->data;
        }
        k->next = h;
        c->arena.head = h = k;
    }
    void *p = h->data + h->used;
    h->used += n;
    return p;
}

void jx_arena_free(jx_arena *a) {
    for (jx_chunk *k = a->head, *next; k; k = next) {
        next = k->next;
        llmi_free(k);
    }
    a->head = NULL;
}

llm_status jx_fail(jctx *c, const node *at, const char *fmt, ...) {
    (void)c;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat template line %u:%u: %s", at->line,
                          at->col, msg);
    return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat template: %s", msg);
}

jstr *jx_str(jctx *c, const char *s, size_t n) {
    jstr *r = jx_alloc(c, sizeof *r + n + 1);
    if (!r)
        return NULL;
    r->n = n;
    if (n)
        memcpy(r->s, s, n);
    r->s[n] = '\0';
    return r;
}

jv jv_str(jstr *s) { return (jv){.k = JV_STR, .u.s = s}; }
jv jv_int(int64_t i) { return (jv){.k = JV_INT, .u.i = i}; }
jv jv_float(double f) { return (jv){.k = JV_FLOAT, .u.f = f}; }
jv jv_bool(bool b) { return (jv){.k = JV_BOOL, .u.b = b}; }
jv jv_none(void) { return (jv){.k = JV_NONE}; }
jv jv_undef(const char *name) { return (jv){.k = JV_UNDEF, .u.undef = name}; }

llm_status jv_cstr(jctx *c, const char *s, size_t n, jv *out) {
    jstr *r = jx_str(c, s, n);
    if (!r)
        return jx_oom(c);
    *out = jv_str(r);
    return LLM_OK;
}

llm_status jx_list_new(jctx *c, size_t cap, jlist **out) {
    jlist *l = jx_alloc(c, sizeof *l);
    if (!l)
        return jx_oom(c);
    *l = (jlist){0};
    if (cap) {
        l->v = jx_alloc(c, cap * sizeof *l->v);
        if (!l->v)
            return jx_oom(c);
        l->cap = cap;
    }
    *out = l;
    return LLM_OK;
}

llm_status jx_list_push(jctx *c, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        jv *nv = jx_alloc(c, cap * sizeof *nv);
        if (!nv)
            return jx_oom(c);
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return LLM_OK;
}

llm_status jx_dict_new(jctx *c, size_t cap, jdict **out) {
    jdict *d = jx_alloc(c, sizeof *d);
    if (!d)
        return jx_oom(c);
    *d = (jdict){0};
    if (cap) {
        d->k = jx_alloc(c, cap * sizeof *d->k);
        d->v = jx_alloc(c, cap * sizeof *d->v);
        if (!d->k || !d->v)
            return jx_oom(c);
        d->cap = cap;
    }
    *out = d;
    return LLM_OK;
}

static bool key_eq(jv a, jv b) {
    if (a.k == JV_STR && b.k == JV_STR)
        return a.u.s->n == b.u.s->n && memcmp(a.u.s->s, b.u.s->s, a.u.s->n) == 0;
    return jv_equal(a, b);
}

llm_status jx_dict_set(jctx *c, jdict *d, jv k, jv v) {
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->k[i], k)) {
            d->v[i] = v;
            return LLM_OK;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4;
        jv *nk = jx_alloc(c, cap * sizeof *nk), *nv = jx_alloc(c, cap * sizeof *nv);
        if (!nk || !nv)
            return jx_oom(c);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return LLM_OK;
}

bool jx_dict_get(const jdict *d, jv k, jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->k[i], k)) {
            *out = d->v[i];
            return true;
        }
    return false;
}

bool jx_dict_get_str(const jdict *d, const char *key, jv *out) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].k == JV_STR && d->k[i].u.s->n == n && memcmp(d->k[i].u.s->s, key, n) == 0) {
            *out = d->v[i];
            return true;
        }
    return false;
}

bool jv_truthy(jv v) {
    switch (v.k) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v.u.b;
    case JV_INT:
        return v.u.i != 0;
    case JV_FLOAT:
        return v.u.f != 0.0;
    case JV_STR:
        return v.u.s->n > 0;
    case JV_LIST:
        return v.u.l->n > 0;
    case JV_DICT:
        return v.u.d->ns || v.u.d->n > 0;
    case JV_FUNC:
        return true;
    }
    return false;
}

static bool numeric(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static double as_double(jv v) {
    return v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : (double)v.u.b;
}

/* Values a template builds may nest without bound ({% set x = [x] %} in a
 * loop); printing and comparing them recurse, so both stop at this depth
 * (printing with LLM_ERR_LIMIT, comparing as unequal). */
enum { MAX_VALUE_DEPTH = 1000 };

static bool equal_at(jv a, jv b, int depth);
bool jv_equal(jv a, jv b) { return equal_at(a, b, 0); }

static bool equal_at(jv a, jv b, int depth) {
    if (depth > MAX_VALUE_DEPTH)
        return false;
    if (numeric(a) && numeric(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT)
            return (a.k == JV_INT ? a.u.i : a.u.b) == (b.k == JV_INT ? b.u.i : b.u.b);
        return as_double(a) == as_double(b);
    }
    if (a.k != b.k)
        return false;
    switch (a.k) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return key_eq(a, b);
    case JV_LIST: /* a list never equals a tuple in Python */
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal_at(a.u.l->v[i], b.u.l->v[i], depth + 1))
                return false;
        return true;
    case JV_DICT:
        if (a.u.d == b.u.d)
            return true;
        if (a.u.d->n != b.u.d->n || a.u.d->ns || b.u.d->ns)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv o;
            if (!jx_dict_get(b.u.d, a.u.d->k[i], &o) || !equal_at(a.u.d->v[i], o, depth + 1))
                return false;
        }
        return true;
    case JV_FUNC:
        return a.u.fn == b.u.fn;
    default:
        return false;
    }
}

const char *jv_type_name(jv v) {
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int",     "float",
                                        "str",       "list",     "dict", "function"};
    if (v.k == JV_LIST && v.u.l->tuple)
        return "tuple";
    if (v.k == JV_DICT && v.u.d->ns)
        return "Namespace";
    return names[v.k];
}

/* --- text ------------------------------------------------------------------ */

llm_status jb_put(jctx *c, jbuf *b, const char *s, size_t n) {
    if (!n)
        return LLM_OK;
    if (b->n + n > c->lim.max_output)
        return llmi_error(LLM_ERR_LIMIT, "chat template: the output exceeds %zu bytes",
                          c->lim.max_output);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = jx_alloc(c, cap);
        if (!ns)
            return jx_oom(c);
        if (b->n)
            memcpy(ns, b->s, b->n);
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return LLM_OK;
}

static size_t utf8_decode(const char *s, size_t n, uint32_t *cp) {
    unsigned char c0 = (unsigned char)s[0];
    int len = llmi_utf8_seq_len(c0);
    if (len <= 1 || (size_t)len > n) {
        *cp = c0;
        return 1;
    }
    uint32_t v = c0 & (0x7f >> len);
    for (int i = 1; i < len; i++)
        v = (v << 6) | ((unsigned char)s[i] & 0x3f);
    *cp = v;
    return (size_t)len;
}

size_t jx_utf8_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}

size_t jx_utf8_offset(const char *s, size_t n, size_t chars) {
    size_t i = 0;
    while (i < n && chars > 0) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xc0) == 0x80)
            i++;
        chars--;
    }
    return i;
}

/* Code points Python's str.isprintable() rejects (the common ones). */
static bool py_unprintable(uint32_t cp) {
    return cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
           (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff ||
           (cp >= 0xd800 && cp <= 0xf8ff) || (cp >= 0xfff9 && cp <= 0xfffb);
}

static llm_status write_repr_str(jctx *c, jbuf *b, const jstr *s) {
    bool has_sq = memchr(s->s, '\'', s->n) != NULL, has_dq = memchr(s->s, '"', s->n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    LLMI_TRY(jb_put(c, b, &q, 1));
    for (size_t i = 0; i < s->n;) {
        uint32_t cp;
        size_t l = utf8_decode(s->s + i, s->n - i, &cp);
        char esc[16];
        if (cp == '\\' || cp == (uint32_t)q) {
            esc[0] = '\\';
            esc[1] = (char)cp;
            LLMI_TRY(jb_put(c, b, esc, 2));
        } else if (cp == '\n' || cp == '\r' || cp == '\t') {
            LLMI_TRY(jb_puts(c, b, cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : "\\t"));
        } else if (py_unprintable(cp)) {
            snprintf(esc, sizeof esc, cp <= 0xff ? "\\x%02x" : "\\u%04x", (unsigned)cp);
            LLMI_TRY(jb_puts(c, b, esc));
        } else {
            LLMI_TRY(jb_put(c, b, s->s + i, l));
        }
        i += l;
    }
    return jb_put(c, b, &q, 1);
}

/* Python's repr(float): the shortest digits that read back the same, in
 * fixed notation for exponents -4..15, else scientific. */
void jx_float_repr(double f, char *buf, size_t cap) {
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e = [-]d[.ddd]e[+-]xx */
    char digits[32];
    size_t nd = 0;
    const char *p = e;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    char *o = buf;
    size_t left = cap;
#define OUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(o, left, __VA_ARGS__);                                                   \
        if (w_ > 0 && (size_t)w_ < left) {                                                         \
            o += w_;                                                                               \
            left -= (size_t)w_;                                                                    \
        }                                                                                          \
    } while (0)
    if (neg)
        OUT("-");
    if (exp < -4 || exp >= 16) {
        OUT("%c", digits[0]);
        if (nd > 1)
            OUT(".%s", digits + 1);
        OUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        OUT("0.");
        for (int i = 0; i < -exp - 1; i++)
            OUT("0");
        OUT("%s", digits);
    } else {
        for (int i = 0; i <= exp; i++)
            OUT("%c", (size_t)i < nd ? digits[i] : '0');
        OUT(".");
        if ((size_t)exp + 1 < nd)
            OUT("%s", digits + exp + 1);
        else
            OUT("0");
    }
#undef OUT
}

static llm_status write_at(jctx *c, jbuf *b, jv v, bool repr, int depth);
llm_status jv_write(jctx *c, jbuf *b, jv v, bool repr) { return write_at(c, b, v, repr, 0); }

static llm_status write_at(jctx *c, jbuf *b, jv v, bool repr, int depth) {
    char num[48];
    if (depth > MAX_VALUE_DEPTH)
        return llmi_error(LLM_ERR_LIMIT, "chat template: a value nests deeper than %d",
                          MAX_VALUE_DEPTH);
    switch (v.k) {
    case JV_UNDEF:
        return repr ? jb_puts(c, b, "Undefined") : LLM_OK;
    case JV_NONE:
        return jb_puts(c, b, "None");
    case JV_BOOL:
        return jb_puts(c, b, v.u.b ? "True" : "False");
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        return jb_puts(c, b, num);
    case JV_FLOAT:
        jx_float_repr(v.u.f, num, sizeof num);
        return jb_puts(c, b, num);
    case JV_STR:
        return repr ? write_repr_str(c, b, v.u.s) : jb_put(c, b, v.u.s->s, v.u.s->n);
    case JV_LIST: {
        const jlist *l = v.u.l;
        LLMI_TRY(jb_puts(c, b, l->tuple ? "(" : "["));
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                LLMI_TRY(jb_puts(c, b, ", "));
            LLMI_TRY(write_at(c, b, l->v[i], true, depth + 1));
        }
        if (l->tuple && l->n == 1)
            LLMI_TRY(jb_puts(c, b, ","));
        return jb_puts(c, b, l->tuple ? ")" : "]");
    }
    case JV_DICT: {
        const jdict *d = v.u.d;
        LLMI_TRY(jb_puts(c, b, d->ns ? "<Namespace {" : "{"));
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                LLMI_TRY(jb_puts(c, b, ", "));
            LLMI_TRY(write_at(c, b, d->k[i], true, depth + 1));
            LLMI_TRY(jb_puts(c, b, ": "));
            LLMI_TRY(write_at(c, b, d->v[i], true, depth + 1));
        }
        return jb_puts(c, b, d->ns ? "}>" : "}");
    }
    case JV_FUNC:
        LLMI_TRY(jb_puts(c, b, "<function "));
        LLMI_TRY(jb_puts(c, b, v.u.fn->name ? v.u.fn->name : "?"));
        return jb_puts(c, b, ">");
    }
    return LLM_OK;
}

llm_status jv_to_str(jctx *c, jv v, jv *out) {
    if (v.k == JV_STR) {
        *out = v;
        return LLM_OK;
    }
    jbuf b = {0};
    LLMI_TRY(jv_write(c, &b, v, false));
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

/* --- JSON inputs ------------------------------------------------------------ */

llm_status jv_from_json(jctx *c, const cJSON *j, int depth, jv *out) {
    if (depth > (int)c->lim.max_depth)
        return llmi_error(LLM_ERR_LIMIT, "chat template: a JSON input nests deeper than %u",
                          c->lim.max_depth);
    if (cJSON_IsNull(j)) {
        *out = jv_none();
    } else if (cJSON_IsBool(j)) {
        *out = jv_bool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* JSON has one number type; integral values are ints, as json.loads
         * reads them when written without a fraction */
        if (d == floor(d) && fabs(d) < 9.007199254740992e15)
            *out = jv_int((int64_t)d);
        else
            *out = jv_float(d);
    } else if (cJSON_IsString(j)) {
        return jv_cstr(c, j->valuestring, strlen(j->valuestring), out);
    } else if (cJSON_IsArray(j)) {
        jlist *l;
        LLMI_TRY(jx_list_new(c, (size_t)cJSON_GetArraySize(j), &l));
        for (const cJSON *e = j->child; e; e = e->next) {
            jv v;
            LLMI_TRY(jv_from_json(c, e, depth + 1, &v));
            LLMI_TRY(jx_list_push(c, l, v));
        }
        *out = (jv){.k = JV_LIST, .u.l = l};
    } else if (cJSON_IsObject(j)) {
        jdict *d;
        LLMI_TRY(jx_dict_new(c, (size_t)cJSON_GetArraySize(j), &d));
        for (const cJSON *e = j->child; e; e = e->next) {
            jv k, v;
            LLMI_TRY(jv_cstr(c, e->string ? e->string : "", e->string ? strlen(e->string) : 0, &k));
            LLMI_TRY(jv_from_json(c, e, depth + 1, &v));
            LLMI_TRY(jx_dict_set(c, d, k, v));
        }
        *out = (jv){.k = JV_DICT, .u.d = d};
    } else {
        *out = jv_none();
    }
    return LLM_OK;
}
