/* Python's string operations on UTF-8 values, shared by the filters and
 * the str methods: whitespace (str.isspace), strip, split, case mapping
 * (ASCII letters; other characters are kept as they are). */
#include "jinja/jinja_impl.h"

#include <string.h>

static size_t decode(const char *s, size_t n, uint32_t *cp) {
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

bool jx_py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* the start of the character before byte `e` */
static size_t prev_char(const char *s, size_t b, size_t e) {
    size_t k = e - 1;
    while (k > b && ((unsigned char)s[k] & 0xc0) == 0x80)
        k--;
    return k;
}

static bool in_set(uint32_t cp, const jstr *chars) {
    if (!chars)
        return jx_py_space(cp);
    for (size_t i = 0; i < chars->n;) {
        uint32_t x;
        i += decode(chars->s + i, chars->n - i, &x);
        if (x == cp)
            return true;
    }
    return false;
}

/* str.strip(chars) / lstrip / rstrip: which = 3 / 1 / 2 */
llm_status jx_strip(jctx *c, const jstr *s, const jstr *chars, int which, jv *out) {
    size_t b = 0, e = s->n;
    while ((which & 1) && b < e) {
        uint32_t cp;
        size_t l = decode(s->s + b, e - b, &cp);
        if (!in_set(cp, chars))
            break;
        b += l;
    }
    while ((which & 2) && e > b) {
        size_t k = prev_char(s->s, b, e);
        uint32_t cp;
        decode(s->s + k, e - k, &cp);
        if (!in_set(cp, chars))
            break;
        e = k;
    }
    return jv_cstr(c, s->s + b, e - b, out);
}

/* str.split(sep, maxsplit) (sep NULL: runs of whitespace), or rsplit */
llm_status jx_split(jctx *c, const jstr *s, const jstr *sep, int64_t maxsplit, bool right,
                    jv *out) {
    jlist *l;
    LLMI_TRY(jx_list_new(c, 0, &l));
    *out = (jv){.k = JV_LIST, .u.l = l};
    if (sep && sep->n == 0)
        return jx_fail(c, NULL, "ValueError: empty separator");
    jv piece;
    if (!right) {
        size_t i = 0;
        int64_t splits = 0;
        if (!sep) {
            for (;;) {
                uint32_t cp;
                while (i < s->n && jx_py_space((decode(s->s + i, s->n - i, &cp), cp)))
                    i += decode(s->s + i, s->n - i, &cp);
                if (i >= s->n)
                    return LLM_OK;
                size_t st = i;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    size_t e = s->n;
                    while (e > st) {
                        size_t k = prev_char(s->s, st, e);
                        decode(s->s + k, e - k, &cp);
                        if (!jx_py_space(cp))
                            break;
                        e = k;
                    }
                    LLMI_TRY(jv_cstr(c, s->s + st, e - st, &piece));
                    return jx_list_push(c, l, piece);
                }
                while (i < s->n && !jx_py_space((decode(s->s + i, s->n - i, &cp), cp)))
                    i += decode(s->s + i, s->n - i, &cp);
                LLMI_TRY(jv_cstr(c, s->s + st, i - st, &piece));
                LLMI_TRY(jx_list_push(c, l, piece));
                splits++;
            }
        }
        size_t st = 0;
        while (i + sep->n <= s->n && (maxsplit < 0 || splits < maxsplit)) {
            if (memcmp(s->s + i, sep->s, sep->n) == 0) {
                LLMI_TRY(jv_cstr(c, s->s + st, i - st, &piece));
                LLMI_TRY(jx_list_push(c, l, piece));
                i += sep->n;
                st = i;
                splits++;
            } else {
                i++;
            }
        }
        LLMI_TRY(jv_cstr(c, s->s + st, s->n - st, &piece));
        return jx_list_push(c, l, piece);
    }
    /* rsplit: split from the right, then reverse */
    if (!sep)
        return jx_fail(c, NULL, "rsplit without a separator is not supported");
    size_t e = s->n;
    int64_t splits = 0;
    size_t i = s->n;
    while (i >= sep->n && (maxsplit < 0 || splits < maxsplit)) {
        if (memcmp(s->s + i - sep->n, sep->s, sep->n) == 0) {
            LLMI_TRY(jv_cstr(c, s->s + i, e - i, &piece));
            LLMI_TRY(jx_list_push(c, l, piece));
            i -= sep->n;
            e = i;
            splits++;
        } else {
            i--;
        }
    }
    LLMI_TRY(jv_cstr(c, s->s, e, &piece));
    LLMI_TRY(jx_list_push(c, l, piece));
    for (size_t a = 0, b = l->n - 1; a < b; a++, b--) {
        jv t = l->v[a];
        l->v[a] = l->v[b];
        l->v[b] = t;
    }
    return LLM_OK;
}

/* Simple case mapping of Latin-1, Latin Extended-A, Greek and Cyrillic
 * letters (what chat templates meet); other characters map to themselves. */
static uint32_t to_upper(uint32_t c) {
    if ((c >= 'a' && c <= 'z') || (c >= 0xe0 && c <= 0xfe && c != 0xf7) ||
        (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) || (c >= 0x430 && c <= 0x44f))
        return c - 32;
    if (c == 0xff)
        return 0x178;
    if (c == 0x3c2)
        return 0x3a3;
    if (c >= 0x450 && c <= 0x45f)
        return c - 80;
    if (((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) && (c & 1))
        return c - 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) && !(c & 1))
        return c - 1;
    return c;
}
static uint32_t to_lower(uint32_t c) {
    if ((c >= 'A' && c <= 'Z') || (c >= 0xc0 && c <= 0xde && c != 0xd7) ||
        (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) || (c >= 0x410 && c <= 0x42f))
        return c + 32;
    if (c == 0x178)
        return 0xff;
    if (c >= 0x400 && c <= 0x40f)
        return c + 80;
    if (((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) && !(c & 1))
        return c + 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) && (c & 1))
        return c + 1;
    return c;
}
static bool cased(uint32_t c) { return to_upper(c) != c || to_lower(c) != c; }

/* mode: 0 lower, 1 upper, 2 title (a cased letter after an uncased
 * character upper, the others lower), 3 capitalize (the first upper, the
 * rest lower) */
llm_status jx_case(jctx *c, const jstr *s, int mode, jv *out) {
    jbuf b = {0};
    bool prev_cased = false;
    for (size_t i = 0; i < s->n;) {
        uint32_t cp;
        size_t l = decode(s->s + i, s->n - i, &cp);
        bool up = mode == 1 || (mode == 2 && !prev_cased) || (mode == 3 && i == 0);
        uint32_t m = up ? to_upper(cp) : to_lower(cp);
        char enc[4];
        prev_cased = cased(cp);
        LLMI_TRY(m == cp ? jb_put(c, &b, s->s + i, l)
                         : jb_put(c, &b, enc, llmi_utf8_encode(m, enc)));
        i += l;
    }
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

/* str.replace(old, new, count) */
llm_status jx_replace(jctx *c, const jstr *s, const jstr *old, const jstr *rep, int64_t count,
                      jv *out) {
    jbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) {
        /* Python inserts `rep` between characters and at both ends */
        for (;;) {
            if (count >= 0 && done >= count)
                break;
            LLMI_TRY(jb_put(c, &b, rep->s, rep->n));
            done++;
            if (i >= s->n)
                break;
            size_t l = jx_utf8_offset(s->s + i, s->n - i, 1);
            LLMI_TRY(jb_put(c, &b, s->s + i, l));
            i += l;
        }
        LLMI_TRY(jb_put(c, &b, s->s + i, s->n - i));
        return jv_cstr(c, b.s ? b.s : "", b.n, out);
    }
    size_t st = 0;
    while (i + old->n <= s->n && (count < 0 || done < count)) {
        if (memcmp(s->s + i, old->s, old->n) == 0) {
            LLMI_TRY(jb_put(c, &b, s->s + st, i - st));
            LLMI_TRY(jb_put(c, &b, rep->s, rep->n));
            i += old->n;
            st = i;
            done++;
        } else {
            i++;
        }
    }
    LLMI_TRY(jb_put(c, &b, s->s + st, s->n - st));
    return jv_cstr(c, b.s ? b.s : "", b.n, out);
}

bool jx_starts(const jstr *s, const jstr *p) { return p->n <= s->n && !memcmp(s->s, p->s, p->n); }
bool jx_ends(const jstr *s, const jstr *p) {
    return p->n <= s->n && !memcmp(s->s + s->n - p->n, p->s, p->n);
}
