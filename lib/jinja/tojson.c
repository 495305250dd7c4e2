/* json.dumps for the tojson filter: Python's separators, indent and
 * sort_keys (keys compared as Python compares them, with the evaluator's
 * jx_compare), NaN and Infinity as Python writes them, and its errors for
 * what JSON cannot hold. */
#include "jinja/jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static llm_status json_str(jctx *c, jbuf *b, const char *s, size_t n) {
    LLMI_TRY(jb_puts(c, b, "\""));
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        LLMI_TRY(jb_put(c, b, s + run, i - run));
        run = i + 1;
        char esc[8];
        switch (ch) {
        case '"':
            LLMI_TRY(jb_puts(c, b, "\\\""));
            break;
        case '\\':
            LLMI_TRY(jb_puts(c, b, "\\\\"));
            break;
        case '\n':
            LLMI_TRY(jb_puts(c, b, "\\n"));
            break;
        case '\r':
            LLMI_TRY(jb_puts(c, b, "\\r"));
            break;
        case '\t':
            LLMI_TRY(jb_puts(c, b, "\\t"));
            break;
        case '\b':
            LLMI_TRY(jb_puts(c, b, "\\b"));
            break;
        case '\f':
            LLMI_TRY(jb_puts(c, b, "\\f"));
            break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", ch);
            LLMI_TRY(jb_puts(c, b, esc));
        }
    }
    LLMI_TRY(jb_put(c, b, s + run, n - run));
    return jb_puts(c, b, "\"");
}

static llm_status json_nl(jctx *c, jbuf *b, int indent, int level) {
    LLMI_TRY(jb_puts(c, b, "\n"));
    for (int i = 0; i < indent * level; i++)
        LLMI_TRY(jb_puts(c, b, " "));
    return LLM_OK;
}

static llm_status item_sep(jctx *c, jbuf *b, const jx_json_fmt *fmt) {
    if (fmt->item_sep)
        return jb_put(c, b, fmt->item_sep->s, fmt->item_sep->n);
    return jb_puts(c, b, fmt->indent >= 0 ? "," : ", ");
}
static llm_status key_sep(jctx *c, jbuf *b, const jx_json_fmt *fmt) {
    if (fmt->key_sep)
        return jb_put(c, b, fmt->key_sep->s, fmt->key_sep->n);
    return jb_puts(c, b, ": ");
}

/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) */
llm_status jv_tojson(jctx *c, jbuf *b, jv v, const jx_json_fmt *fmt, int level) {
    const int indent = fmt->indent;
    char num[48];
    if (level > (int)c->lim.max_depth)
        return llmi_error(LLM_ERR_LIMIT, "chat template: tojson nests deeper than %u",
                          c->lim.max_depth);
    switch (v.k) {
    case JV_UNDEF:
        return jx_fail(c, NULL, "Object of type Undefined is not JSON serializable");
    case JV_NONE:
        return jb_puts(c, b, "null");
    case JV_BOOL:
        return jb_puts(c, b, v.u.b ? "true" : "false");
    case JV_INT:
    case JV_FLOAT:
        if (v.k == JV_FLOAT && (isnan(v.u.f) || isinf(v.u.f)))
            return jb_puts(c, b, isnan(v.u.f) ? "NaN" : v.u.f < 0 ? "-Infinity" : "Infinity");
        return jv_write(c, b, v, false);
    case JV_STR:
        return json_str(c, b, v.u.s->s, v.u.s->n);
    case JV_LIST: {
        const jlist *l = v.u.l;
        if (!l->n)
            return jb_puts(c, b, "[]");
        LLMI_TRY(jb_puts(c, b, "["));
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                LLMI_TRY(item_sep(c, b, fmt));
            if (indent >= 0)
                LLMI_TRY(json_nl(c, b, indent, level + 1));
            LLMI_TRY(jv_tojson(c, b, l->v[i], fmt, level + 1));
        }
        if (indent >= 0)
            LLMI_TRY(json_nl(c, b, indent, level));
        return jb_puts(c, b, "]");
    }
    case JV_DICT: {
        const jdict *d = v.u.d;
        if (!d->n)
            return jb_puts(c, b, "{}");
        size_t *order = jx_alloc(c, d->n * sizeof *order);
        if (!order)
            return jx_oom(c);
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (fmt->sort_keys) /* insertion sort: dicts in templates are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0; j--) {
                    bool gt = false;
                    LLMI_TRY(jx_compare(c, NULL, OP_GT, d->k[order[j - 1]], d->k[order[j]], &gt));
                    if (!gt)
                        break;
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        LLMI_TRY(jb_puts(c, b, "{"));
        for (size_t i = 0; i < d->n; i++) {
            jv k = d->k[order[i]];
            if (i)
                LLMI_TRY(item_sep(c, b, fmt));
            if (indent >= 0)
                LLMI_TRY(json_nl(c, b, indent, level + 1));
            if (k.k == JV_STR) {
                LLMI_TRY(json_str(c, b, k.u.s->s, k.u.s->n));
            } else if (k.k == JV_INT || k.k == JV_FLOAT || k.k == JV_BOOL || k.k == JV_NONE) {
                jbuf kb = {0};
                const jx_json_fmt plain = {.indent = -1};
                LLMI_TRY(jv_tojson(c, &kb, k, &plain, 0));
                LLMI_TRY(json_str(c, b, kb.s, kb.n));
            } else {
                return jx_fail(c, NULL, "keys must be str, int, float, bool or None, not %s",
                               jv_type_name(k));
            }
            LLMI_TRY(key_sep(c, b, fmt));
            LLMI_TRY(jv_tojson(c, b, d->v[order[i]], fmt, level + 1));
        }
        if (indent >= 0)
            LLMI_TRY(json_nl(c, b, indent, level));
        return jb_puts(c, b, "}");
    }
    case JV_FUNC:
        return jx_fail(c, NULL, "Object of type function is not JSON serializable");
    }
    (void)num;
    return LLM_OK;
}
