/* JSON Schema to GBNF. Every subschema becomes a rule; local "$ref"s
 * become one rule per target, emitted once, so recursive schemas give
 * recursive grammars. What a keyword would constrain but this compiler
 * cannot express is refused by name and JSON pointer, never ignored; pure
 * annotations (title, description, ...) are skipped.
 *
 * Objects list their properties in the schema's order: required ones
 * always, optional ones may be left out. Numbers have bounded lengths;
 * strings without maxLength do not, so that every character inside one
 * leaves the matcher in the same state and one position mask serves it. */
#include "grammar/grammar.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

enum { MAX_SCHEMA_DEPTH = 64, MAX_ITEMS = 4096, MAX_REFS = 1024 };

typedef struct sc {
    const cJSON *root;
    llmi_gtext done; /* finished rules */
    llmi_gtext out;  /* the rule being written */
    uint32_t n_rules;
    bool flexible;
    uint32_t depth;
    const cJSON *ref_node[MAX_REFS]; /* targets already given a rule */
    uint32_t ref_rule[MAX_REFS];
    uint32_t n_refs;
} sc;

static const char *const ANNOTATIONS[] = {
    "title",      "description", "$schema",   "$id",   "$comment",    "default", "examples",
    "deprecated", "readOnly",    "writeOnly", "$defs", "definitions", "strict",  NULL};
static const char *const KEYWORDS[] = {
    "type",      "properties", "required", "additionalProperties",
    "items",     "minItems",   "maxItems", "enum",
    "const",     "anyOf",      "allOf",    "$ref",
    "minLength", "maxLength",  "pattern",  "format",
    NULL};

static bool in_list(const char *const *list, const char *s) {
    for (; *list; list++)
        if (strcmp(*list, s) == 0)
            return true;
    return false;
}

static llm_status unsupported(const char *path, const char *key, const char *why) {
    return llmi_error(LLM_ERR_UNSUPPORTED, "schema: '%s' at %s/%s is not supported%s%s", key, path,
                      key, why ? ": " : "", why ? why : "");
}

static llm_status invalid(const char *path, const char *what) {
    return llmi_error(LLM_ERR_INVALID_ARGUMENT, "schema: at %s: %s", path[0] ? path : "(root)",
                      what);
}

/* path + "/" + key (JSON-pointer escaped) into buf. */
static void sub_path(char *buf, size_t cap, const char *path, const char *key) {
    size_t n = (size_t)snprintf(buf, cap, "%s/", path);
    for (const char *k = key; *k && n + 3 < cap; k++) {
        if (*k == '~' || *k == '/') {
            buf[n++] = '~';
            buf[n++] = *k == '~' ? '0' : '1';
        } else {
            buf[n++] = *k;
        }
    }
    buf[n < cap ? n : cap - 1] = 0;
}

/* Appends a GBNF literal of the bytes s[0, n). */
static llm_status put_literal(sc *c, const char *s, size_t n, const char *path) {
    llmi_gtext_puts(&c->out, "\"");
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t used = llmi_grammar_utf8_decode(s + i, n - i, &cp);
        if (used == 0)
            return invalid(path, "invalid UTF-8 in a string");
        llmi_gtext_literal_char(&c->out, cp, false);
        i += used;
    }
    llmi_gtext_puts(&c->out, "\"");
    return LLM_OK;
}

/* The compact JSON text of a value, as a GBNF literal. */
static llm_status put_value_literal(sc *c, const cJSON *v, const char *path) {
    char *text = cJSON_PrintUnformatted(v);
    if (!text)
        return llmi_oom("schema const");
    llm_status st = put_literal(c, text, strlen(text), path);
    cJSON_free(text);
    return st;
}

static llm_status gen(sc *c, const cJSON *node, const char *path, uint32_t *rule);

static void rule_head(sc *c, uint32_t r) { llmi_gtext_printf(&c->out, "s%u ::= ", r); }

/* The shared rules every grammar from a schema has. */
static void put_common(sc *c) {
    llmi_gtext *o = &c->done;
    llmi_gtext_puts(o,
                    c->flexible ? "ws ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n" : "ws ::= \"\"\n");
    llmi_gtext_puts(
        o, "hex ::= [0-9a-fA-F]\n"
           "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
           "( [0-9a-cA-CefEF] hex{3} | [dD] [0-7] hex{2} ) )\n"
           "string ::= \"\\\"\" char* \"\\\"\"\n"
           "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
           "number ::= integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
           "boolean ::= \"true\" | \"false\"\n"
           "null ::= \"null\"\n"
           "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws "
           "\":\" ws value ws )* )? \"}\"\n"
           "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
           "value ::= object | array | string | number | boolean | null\n"
           "d2 ::= [0-9] [0-9]\n"
           "date ::= [1-9] [0-9]{3} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] "
           "| \"1\" [0-9] | \"2\" [0-8] )\n"
           "time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
           "( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" "
           "[0-5] [0-9] )\n"
           "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n"
           "email ::= [a-zA-Z0-9] [a-zA-Z0-9._+-]{0,30} \"@\" [a-zA-Z0-9]{1,20} ( "
           "\".\" [a-zA-Z0-9]{1,20} ){1,3}\n");
}

static llm_status read_count(const cJSON *node, const char *key, const char *path, uint32_t *out,
                             bool *present) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, key);
    *present = v != NULL;
    if (!v)
        return LLM_OK;
    char p[512];
    sub_path(p, sizeof p, path, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return invalid(p, "must be a non-negative integer");
    if (v->valuedouble > MAX_ITEMS)
        return unsupported(path, key, "values above 4096");
    *out = (uint32_t)v->valuedouble;
    return LLM_OK;
}

/* "{m,n}" for bounds; max UINT32_MAX = unbounded. */
static void put_bounds(sc *c, uint32_t min, uint32_t max) {
    if (max == UINT32_MAX)
        llmi_gtext_printf(&c->out, "{%u,}", min);
    else
        llmi_gtext_printf(&c->out, "{%u,%u}", min, max);
}

static llm_status gen_string(sc *c, const cJSON *node, const char *path) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(node, "format");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(node, "pattern");
    uint32_t min = 0, max = UINT32_MAX;
    bool has_min, has_max;
    LLMI_TRY(read_count(node, "minLength", path, &min, &has_min));
    LLMI_TRY(read_count(node, "maxLength", path, &max, &has_max));
    if ((fmt || pat) && (has_min || has_max))
        return unsupported(path, has_min ? "minLength" : "maxLength",
                           "together with format or pattern");
    if (fmt && pat)
        return unsupported(path, "pattern", "together with format");
    if (has_min && has_max && max < min)
        return invalid(path, "maxLength < minLength");
    if (fmt) {
        static const char *const known[] = {"date", "date-time", "time", "uuid", "email", NULL};
        if (!cJSON_IsString(fmt))
            return invalid(path, "format must be a string");
        if (!in_list(known, fmt->valuestring))
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "schema: format '%s' at %s/format is not supported (date, "
                              "date-time, time, uuid, email are)",
                              fmt->valuestring, path);
        const char *body =
            strcmp(fmt->valuestring, "date-time") == 0 ? "date \"T\" time" : fmt->valuestring;
        llmi_gtext_printf(&c->out, "\"\\\"\" %s \"\\\"\"", body);
        return LLM_OK;
    }
    if (pat) {
        char p[512];
        sub_path(p, sizeof p, path, "pattern");
        if (!cJSON_IsString(pat))
            return invalid(p, "pattern must be a string");
        char where[600];
        snprintf(where, sizeof where, "schema %s", p);
        llmi_gtext_puts(&c->out, "\"\\\"\" ");
        LLMI_TRY(llmi_regex_emit(pat->valuestring, strlen(pat->valuestring), true, where, &c->out));
        llmi_gtext_puts(&c->out, " \"\\\"\"");
        return LLM_OK;
    }
    if (!has_min && !has_max) {
        llmi_gtext_puts(&c->out, "string");
        return LLM_OK;
    }
    llmi_gtext_puts(&c->out, "\"\\\"\" char");
    put_bounds(c, min, max);
    llmi_gtext_puts(&c->out, " \"\\\"\"");
    return LLM_OK;
}

static llm_status gen_array(sc *c, const cJSON *node, const char *path) {
    uint32_t min = 0, max = UINT32_MAX, item = 0;
    bool has_min, has_max;
    LLMI_TRY(read_count(node, "minItems", path, &min, &has_min));
    LLMI_TRY(read_count(node, "maxItems", path, &max, &has_max));
    if (has_min && has_max && max < min)
        return invalid(path, "maxItems < minItems");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(node, "items");
    char p[512];
    sub_path(p, sizeof p, path, "items");
    bool any = !items || cJSON_IsTrue(items);
    if (!any)
        LLMI_TRY(gen(c, items, p, &item));
    char name[32];
    if (any)
        snprintf(name, sizeof name, "value");
    else
        snprintf(name, sizeof name, "s%u", item);
    if (max == 0) {
        llmi_gtext_puts(&c->out, "\"[\" ws \"]\"");
        return LLM_OK;
    }
    llmi_gtext_printf(&c->out, "\"[\" ws ( %s ws ( \",\" ws %s ws )", name, name);
    put_bounds(c, min ? min - 1 : 0, max == UINT32_MAX ? UINT32_MAX : max - 1);
    llmi_gtext_puts(&c->out, min ? " )" : " )?");
    llmi_gtext_puts(&c->out, " \"]\"");
    return LLM_OK;
}

/* One "key": value member, as the text of a GBNF sequence. */
static llm_status put_member(sc *c, const char *key, uint32_t value_rule, bool any,
                             const char *path) {
    llmi_gtext_puts(&c->out, "\"\\\"\" ");
    /* the key as it appears in JSON text: escaped */
    cJSON *k = cJSON_CreateString(key);
    if (!k)
        return llmi_oom("schema key");
    char *text = cJSON_PrintUnformatted(k);
    cJSON_Delete(k);
    if (!text)
        return llmi_oom("schema key");
    size_t n = strlen(text);
    llm_status st = put_literal(c, text + 1, n >= 2 ? n - 2 : 0, path);
    cJSON_free(text);
    LLMI_TRY(st);
    if (any)
        llmi_gtext_puts(&c->out, " \"\\\"\" ws \":\" ws value ws");
    else
        llmi_gtext_printf(&c->out, " \"\\\"\" ws \":\" ws s%u ws", value_rule);
    return LLM_OK;
}

static bool is_required(const cJSON *required, const char *key) {
    const cJSON *r;
    cJSON_ArrayForEach(r, required) if (cJSON_IsString(r) &&
                                        strcmp(r->valuestring, key) == 0) return true;
    return false;
}

static llm_status gen_object(sc *c, const cJSON *node, const char *path) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    const cJSON *required = cJSON_GetObjectItemCaseSensitive(node, "required");
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(node, "additionalProperties");
    char p[512];
    if (props && !cJSON_IsObject(props))
        return invalid(path, "properties must be an object");
    if (required && !cJSON_IsArray(required))
        return invalid(path, "required must be an array");
    const cJSON *r;
    cJSON_ArrayForEach(r, required) {
        if (!cJSON_IsString(r))
            return invalid(path, "required must list strings");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "schema: required property '%s' at %s/required has no schema in "
                              "properties",
                              r->valuestring, path);
    }
    if (extra && cJSON_IsObject(extra) && !props) { /* a map of one value type */
        uint32_t v;
        sub_path(p, sizeof p, path, "additionalProperties");
        LLMI_TRY(gen(c, extra, p, &v));
        llmi_gtext_printf(&c->out,
                          "\"{\" ws ( string ws \":\" ws s%u ws ( \",\" ws string ws \":\" ws s%u "
                          "ws ){0,63} )? \"}\"",
                          v, v);
        return LLM_OK;
    }
    if (extra && !cJSON_IsBool(extra))
        return unsupported(path, "additionalProperties", "a schema together with properties");
    if (!props) {
        llmi_gtext_puts(&c->out, "object");
        return LLM_OK;
    }
    /* Only the listed properties are produced, which satisfies
     * additionalProperties true and false alike. Rules A_i (nothing
     * written yet) and B_i (something written: a comma first). */
    uint32_t n = (uint32_t)cJSON_GetArraySize(props), base = c->n_rules;
    c->n_rules += 2 * n + 2;
    uint32_t *value = llmi_calloc(n ? n : 1, sizeof *value);
    if (!value)
        return llmi_oom("schema object");
    llm_status st = LLM_OK;
    const cJSON *prop;
    uint32_t i = 0;
    cJSON_ArrayForEach(prop, props) {
        sub_path(p, sizeof p, path, "properties");
        char pp[512];
        sub_path(pp, sizeof pp, p, prop->string);
        st = gen(c, prop, pp, &value[i++]);
        if (st != LLM_OK)
            break;
    }
    llmi_gtext_printf(&c->out, "\"{\" ws s%u \"}\"\n", base); /* ends the caller's rule */
    i = 0;
    cJSON_ArrayForEach(prop, props) {
        if (st != LLM_OK)
            break;
        bool req = is_required(required, prop->string);
        uint32_t a = base + 2 * i, b = a + 1, a_next = a + 2, b_next = a + 3;
        rule_head(c, a);
        st = put_member(c, prop->string, value[i], false, path);
        llmi_gtext_printf(&c->out, " s%u", b_next);
        if (!req)
            llmi_gtext_printf(&c->out, " | s%u", a_next);
        llmi_gtext_puts(&c->out, "\n");
        rule_head(c, b);
        llmi_gtext_puts(&c->out, "\",\" ws ");
        if (st == LLM_OK)
            st = put_member(c, prop->string, value[i], false, path);
        llmi_gtext_printf(&c->out, " s%u", b_next);
        if (!req)
            llmi_gtext_printf(&c->out, " | s%u", b_next);
        llmi_gtext_puts(&c->out, "\n");
        i++;
    }
    llmi_gtext_printf(&c->out, "s%u ::= \"\"\ns%u ::= \"\"", base + 2 * n, base + 2 * n + 1);
    llmi_free(value);
    return st;
}

static llm_status gen_type(sc *c, const cJSON *node, const char *type, const char *path) {
    if (strcmp(type, "string") == 0)
        return gen_string(c, node, path);
    if (strcmp(type, "array") == 0)
        return gen_array(c, node, path);
    if (strcmp(type, "object") == 0)
        return gen_object(c, node, path);
    if (strcmp(type, "integer") == 0 || strcmp(type, "number") == 0 ||
        strcmp(type, "boolean") == 0 || strcmp(type, "null") == 0) {
        llmi_gtext_puts(&c->out, type);
        return LLM_OK;
    }
    return llmi_error(LLM_ERR_INVALID_ARGUMENT, "schema: unknown type '%s' at %s/type", type, path);
}

/* Resolves a local reference "#/a/b" against the root. */
static const cJSON *resolve(const sc *c, const char *ref) {
    if (ref[0] != '#')
        return NULL;
    const cJSON *cur = c->root;
    const char *s = ref + 1;
    while (*s) {
        if (*s != '/')
            return NULL;
        s++;
        char key[256];
        size_t n = 0;
        while (*s && *s != '/' && n + 1 < sizeof key) {
            if (s[0] == '~' && (s[1] == '0' || s[1] == '1')) {
                key[n++] = s[1] == '0' ? '~' : '/';
                s += 2;
            } else {
                key[n++] = *s++;
            }
        }
        key[n] = 0;
        if (cJSON_IsArray(cur)) {
            char *end;
            long idx = strtol(key, &end, 10);
            cur = *end ? NULL : cJSON_GetArrayItem(cur, (int)idx);
        } else {
            cur = cJSON_GetObjectItemCaseSensitive(cur, key);
        }
        if (!cur)
            return NULL;
    }
    return cur;
}

static llm_status gen_ref(sc *c, const cJSON *ref, const char *path, uint32_t *rule) {
    if (!cJSON_IsString(ref))
        return invalid(path, "$ref must be a string");
    const cJSON *target = resolve(c, ref->valuestring);
    if (!target)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "schema: $ref '%s' at %s/$ref does not resolve (only local '#/...' "
                          "references are supported)",
                          ref->valuestring, path);
    for (uint32_t i = 0; i < c->n_refs; i++)
        if (c->ref_node[i] == target) {
            *rule = c->ref_rule[i];
            return LLM_OK;
        }
    if (c->n_refs == MAX_REFS)
        return unsupported(path, "$ref", "more than 1024 targets");
    /* register first, so a reference back to it inside ends the recursion */
    *rule = c->n_rules++;
    c->ref_node[c->n_refs] = target;
    c->ref_rule[c->n_refs++] = *rule;
    uint32_t body;
    LLMI_TRY(gen(c, target, ref->valuestring + 1, &body));
    llmi_gtext_printf(&c->done, "s%u ::= s%u\n", *rule, body);
    return LLM_OK;
}

static llm_status check_keywords(const cJSON *node, const char *path) {
    const cJSON *k;
    cJSON_ArrayForEach(k, node) {
        if (!in_list(KEYWORDS, k->string) && !in_list(ANNOTATIONS, k->string))
            return unsupported(path, k->string, NULL);
    }
    return LLM_OK;
}

/* Generates the body of subschema `node` (rule *rule) into c->out. */
static llm_status gen_body(sc *c, const cJSON *node, const char *path, uint32_t r) {
    char p[512];
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "const"))) {
        sub_path(p, sizeof p, path, "const");
        return put_value_literal(c, v, p);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "enum"))) {
        sub_path(p, sizeof p, path, "enum");
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
            return invalid(p, "enum must be a non-empty array");
        const cJSON *e;
        bool first = true;
        cJSON_ArrayForEach(e, v) {
            if (!first)
                llmi_gtext_puts(&c->out, " | ");
            first = false;
            LLMI_TRY(put_value_literal(c, e, p));
        }
        return LLM_OK;
    }
    const char *combo = cJSON_GetObjectItemCaseSensitive(node, "anyOf") ? "anyOf" : "allOf";
    if ((v = cJSON_GetObjectItemCaseSensitive(node, combo))) {
        sub_path(p, sizeof p, path, combo);
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
            return invalid(p, "must be a non-empty array of schemas");
        if (combo[1] == 'l' && cJSON_GetArraySize(v) != 1)
            return unsupported(path, "allOf", "with more than one schema");
        if (cJSON_GetObjectItemCaseSensitive(node, "type"))
            return unsupported(path, combo, "together with type");
        uint32_t n = (uint32_t)cJSON_GetArraySize(v), *alt = llmi_calloc(n, sizeof *alt);
        if (!alt)
            return llmi_oom("schema anyOf");
        llm_status st = LLM_OK;
        for (uint32_t i = 0; i < n && st == LLM_OK; i++) {
            char pi[512], idx[16];
            snprintf(idx, sizeof idx, "%u", i);
            sub_path(pi, sizeof pi, p, idx);
            st = gen(c, cJSON_GetArrayItem(v, (int)i), pi, &alt[i]);
        }
        for (uint32_t i = 0; i < n && st == LLM_OK; i++)
            llmi_gtext_printf(&c->out, "%ss%u", i ? " | " : "", alt[i]);
        llmi_free(alt);
        return st;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(node, "type");
    if (!type) {
        if (cJSON_GetObjectItemCaseSensitive(node, "properties"))
            return gen_object(c, node, path);
        if (cJSON_GetObjectItemCaseSensitive(node, "items"))
            return gen_array(c, node, path);
        llmi_gtext_puts(&c->out, "value");
        return LLM_OK;
    }
    if (cJSON_IsString(type))
        return gen_type(c, node, type->valuestring, path);
    if (!cJSON_IsArray(type) || cJSON_GetArraySize(type) == 0)
        return invalid(path, "type must be a string or a non-empty array of strings");
    /* several types: one rule per type, as alternatives */
    const cJSON *t;
    uint32_t i = 0;
    cJSON_ArrayForEach(t, type) {
        if (!cJSON_IsString(t))
            return invalid(path, "type must list strings");
        llmi_gtext_printf(&c->out, "%ss%u-t%u", i ? " | " : "", r, i);
        i++;
    }
    llmi_gtext_puts(&c->out, "\n");
    i = 0;
    cJSON_ArrayForEach(t, type) {
        llmi_gtext_printf(&c->out, "s%u-t%u ::= ", r, i++);
        LLMI_TRY(gen_type(c, node, t->valuestring, path));
        if (t->next)
            llmi_gtext_puts(&c->out, "\n");
    }
    return LLM_OK;
}

static llm_status gen(sc *c, const cJSON *node, const char *path, uint32_t *rule) {
    if (cJSON_IsTrue(node) || (cJSON_IsObject(node) && !node->child)) {
        *rule = c->n_rules++;
        llmi_gtext_printf(&c->done, "s%u ::= value\n", *rule);
        return LLM_OK;
    }
    if (!cJSON_IsObject(node))
        return invalid(path, cJSON_IsFalse(node) ? "the schema false matches nothing"
                                                 : "a schema must be an object or a boolean");
    if (++c->depth > MAX_SCHEMA_DEPTH)
        return llmi_error(LLM_ERR_UNSUPPORTED, "schema: nested deeper than %d at %s",
                          MAX_SCHEMA_DEPTH, path);
    LLMI_TRY(check_keywords(node, path));
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(node, "$ref");
    if (ref) {
        const cJSON *k;
        cJSON_ArrayForEach(k, node) if (!in_list(ANNOTATIONS, k->string) &&
                                        strcmp(k->string, "$ref") !=
                                            0) return unsupported(path, k->string, "next to $ref");
        LLMI_TRY(gen_ref(c, ref, path, rule));
        c->depth--;
        return LLM_OK;
    }
    *rule = c->n_rules++;
    /* the body is written into its own buffer: generating it may emit
     * other rules first */
    llmi_gtext saved = c->out;
    memset(&c->out, 0, sizeof c->out);
    rule_head(c, *rule);
    llm_status st = gen_body(c, node, path, *rule);
    llmi_gtext_puts(&c->out, "\n");
    llmi_gtext body = c->out;
    c->out = saved;
    if (body.oom)
        st = llmi_oom("schema grammar");
    if (st == LLM_OK && body.s)
        llmi_gtext_put(&c->done, body.s, body.n);
    llmi_free(body.s);
    c->depth--;
    return st;
}

llm_status llmi_schema_to_ebnf(const char *json, size_t len, uint32_t ws_mode, char **text) {
    *text = NULL;
    if (!json && len)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "schema: NULL");
    cJSON *doc = cJSON_ParseWithLength(json ? json : "", len);
    if (!doc) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && json && at >= json && at <= json + len ? (size_t)(at - json) : 0;
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "schema: not valid JSON (near offset %zu)",
                          off);
    }
    sc *c = llmi_calloc(1, sizeof *c);
    if (!c) {
        cJSON_Delete(doc);
        return llmi_oom("schema");
    }
    c->root = doc;
    c->flexible = ws_mode == LLMI_GRAMMAR_WS_FLEXIBLE;
    put_common(c);
    uint32_t top;
    llm_status st = gen(c, doc, "", &top);
    llmi_gtext_printf(&c->done, "root ::= s%u\n", top);
    if (st == LLM_OK && c->done.oom)
        st = llmi_oom("schema grammar");
    if (st == LLM_OK)
        *text = c->done.s;
    else
        llmi_free(c->done.s);
    llmi_free(c->out.s);
    cJSON_Delete(doc);
    llmi_free(c);
    return st;
}

llm_status llmi_grammar_from_schema(const char *json, size_t len, uint32_t ws_mode,
                                    llmi_grammar **out) {
    *out = NULL;
    char *text = NULL;
    LLMI_TRY(llmi_schema_to_ebnf(json, len, ws_mode, &text));
    llm_status st = llmi_grammar_from_ebnf(text, strlen(text), "root", out);
    llmi_free(text);
    return st;
}
