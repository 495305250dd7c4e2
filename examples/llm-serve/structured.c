#include "structured.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"

#define INVALID(param, ...)                                                                        \
    (serve_error_set(err, 400, "invalid_request_error", param, __VA_ARGS__), false)

/* One constraint found in the request, `value` as text (a string's own
 * text, else its JSON); a second one is refused. */
static bool set_constraint(serve_request *req, serve_constraint kind, const char *param,
                           const cJSON *value, serve_error *err) {
    if (req->constraint != SERVE_CONSTRAINT_NONE)
        return INVALID(param,
                       "'%s' and '%s' both constrain the output; give at most one of "
                       "response_format (json_object, json_schema), grammar, json_schema, "
                       "guided_json, guided_regex, guided_grammar",
                       req->constraint_param, param);
    char *text =
        cJSON_IsString(value) ? serve_strdup(value->valuestring) : cJSON_PrintUnformatted(value);
    if (!text)
        return serve_error_out_of_memory(err, "while parsing the request"), false;
    req->constraint = kind;
    req->constraint_text = text;
    snprintf(req->constraint_param, sizeof req->constraint_param, "%s", param);
    return true;
}

static const cJSON *field(const cJSON *root, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

/* response_format: {"type": "text" | "json_object" | "json_schema"}. */
static bool parse_response_format(const cJSON *root, serve_request *req, serve_error *err) {
    const cJSON *rf = field(root, "response_format");
    if (!rf)
        return true;
    if (!cJSON_IsObject(rf))
        return INVALID("response_format", "'response_format' must be an object");
    const cJSON *type = field(rf, "type");
    if (!cJSON_IsString(type))
        return INVALID("response_format.type", "'response_format.type' must be a string");
    const char *t = type->valuestring;
    if (!strcmp(t, "text"))
        return true;
    if (!strcmp(t, "json_object")) {
        /* Any JSON object: the schema {"type":"object"}, as its text. */
        static char any_object_schema[] = "{\"type\":\"object\"}";
        cJSON any_object = {.type = cJSON_String, .valuestring = any_object_schema};
        return set_constraint(req, SERVE_CONSTRAINT_JSON_SCHEMA, "response_format", &any_object,
                              err);
    }
    if (strcmp(t, "json_schema"))
        return INVALID("response_format.type",
                       "'response_format.type' must be 'text', 'json_object' or 'json_schema', "
                       "not '%.40s'",
                       t);
    const cJSON *js = field(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return INVALID("response_format.json_schema",
                       "'response_format.json_schema' must be an object with the schema");
    const cJSON *name = field(js, "name"), *strict = field(js, "strict");
    const cJSON *description = field(js, "description"), *schema = field(js, "schema");
    if (name && !cJSON_IsString(name))
        return INVALID("response_format.json_schema.name",
                       "'response_format.json_schema.name' must be a string");
    if (strict && !cJSON_IsBool(strict))
        return INVALID("response_format.json_schema.strict",
                       "'response_format.json_schema.strict' must be a boolean");
    if (description && !cJSON_IsString(description))
        return INVALID("response_format.json_schema.description",
                       "'response_format.json_schema.description' must be a string");
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return INVALID("response_format.json_schema.schema",
                       "'response_format.json_schema.schema' must be a JSON Schema (an object)");
    return set_constraint(req, SERVE_CONSTRAINT_JSON_SCHEMA, "response_format", schema, err);
}

bool serve_parse_constraint(const cJSON *root, serve_request *req, serve_error *err) {
    if (!parse_response_format(root, req, err))
        return false;
    /* The other servers' fields, each text or a schema object. */
    static const struct {
        const char *name;
        serve_constraint kind;
        bool schema; /* a JSON Schema: an object (or its JSON text) */
    } extensions[] = {
        {"json_schema", SERVE_CONSTRAINT_JSON_SCHEMA, true},
        {"guided_json", SERVE_CONSTRAINT_JSON_SCHEMA, true},
        {"grammar", SERVE_CONSTRAINT_GBNF, false},
        {"guided_grammar", SERVE_CONSTRAINT_GBNF, false},
        {"guided_regex", SERVE_CONSTRAINT_REGEX, false},
    };
    for (size_t i = 0; i < sizeof extensions / sizeof *extensions; i++) {
        const char *name = extensions[i].name;
        const cJSON *f = field(root, name);
        if (!f)
            continue;
        if (extensions[i].schema ? !cJSON_IsObject(f) && !cJSON_IsString(f) && !cJSON_IsBool(f)
                                 : !cJSON_IsString(f))
            return INVALID(name, "'%s' must be %s", name,
                           extensions[i].schema ? "a JSON Schema (an object or its JSON text)"
                                                : "a string");
        if (cJSON_IsString(f) && !f->valuestring[0])
            return INVALID(name, "'%s' must not be empty", name);
        if (!set_constraint(req, extensions[i].kind, name, f, err))
            return false;
    }
    return true;
}

/* ---- the cache ---------------------------------------------------------- */

struct grammar_ref {
    grammar_cache *cache;
    serve_constraint kind;
    char *key; /* the text, then NUL, then the root rule name */
    size_t key_len;
    llm_grammar *grammar;
    int refs;      /* users, plus one while the cache lists it */
    uint64_t used; /* the cache's clock at the last lookup */
};

struct grammar_cache {
    pthread_mutex_t lock;
    const llm_model *model;
    grammar_ref **entries;
    size_t n, capacity;
    uint64_t clock;
    grammar_cache_stats stats;
};

grammar_cache *grammar_cache_create(const llm_model *model, size_t capacity) {
    grammar_cache *c = serve_calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->entries = serve_calloc(capacity ? capacity : 1, sizeof *c->entries);
    if (!c->entries) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->model = model;
    c->capacity = capacity;
    return c;
}

static void ref_free(grammar_ref *r) {
    llm_grammar_free(r->grammar);
    free(r->key);
    free(r);
}

void grammar_cache_free(grammar_cache *c) {
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        grammar_ref_release(c->entries[i]);
    pthread_mutex_destroy(&c->lock);
    free(c->entries);
    free(c);
}

const llm_grammar *grammar_ref_grammar(const grammar_ref *ref) { return ref->grammar; }

void grammar_ref_release(grammar_ref *ref) {
    if (!ref)
        return;
    grammar_cache *c = ref->cache;
    pthread_mutex_lock(&c->lock);
    int left = --ref->refs;
    pthread_mutex_unlock(&c->lock);
    if (!left)
        ref_free(ref);
}

static grammar_ref *find(grammar_cache *c, serve_constraint kind, const char *key, size_t len) {
    for (size_t i = 0; i < c->n; i++) {
        grammar_ref *r = c->entries[i];
        if (r->kind == kind && r->key_len == len && !memcmp(r->key, key, len))
            return r;
    }
    return NULL;
}

/* Lists `r` in the cache, forgetting the least recently used grammar when
 * it is full (its users keep it alive). Called with the lock held. */
static void remember(grammar_cache *c, grammar_ref *r) {
    if (!c->capacity)
        return;
    if (c->n == c->capacity) {
        size_t oldest = 0;
        for (size_t i = 1; i < c->n; i++)
            if (c->entries[i]->used < c->entries[oldest]->used)
                oldest = i;
        grammar_ref *gone = c->entries[oldest];
        c->entries[oldest] = c->entries[--c->n];
        if (!--gone->refs)
            ref_free(gone);
    }
    r->refs++;
    c->entries[c->n++] = r;
}

static llm_status compile(const llm_model *model, serve_constraint kind, const char *text,
                          const char *root, llm_grammar **out) {
    llm_grammar_params params;
    llm_grammar_params_init(&params);
    params.root = root;
    size_t len = strlen(text);
    switch (kind) {
    case SERVE_CONSTRAINT_JSON_SCHEMA:
        return llm_grammar_compile_json_schema(model, text, len, &params, out);
    case SERVE_CONSTRAINT_GBNF:
        return llm_grammar_compile_ebnf(model, text, len, &params, out);
    default:
        return llm_grammar_compile_regex(model, text, len, &params, out);
    }
}

grammar_ref *grammar_cache_get(grammar_cache *c, serve_constraint kind, const char *text,
                               const char *root, const char *param, serve_error *err) {
    size_t text_len = strlen(text), root_len = root ? strlen(root) : 0;
    size_t key_len = text_len + 1 + root_len;
    char *key = serve_malloc(key_len + 1);
    if (!key) {
        serve_error_out_of_memory(err, "while compiling the grammar");
        return NULL;
    }
    memcpy(key, text, text_len + 1);
    if (root)
        memcpy(key + text_len + 1, root, root_len + 1);
    else
        key[key_len] = '\0';
    pthread_mutex_lock(&c->lock);
    grammar_ref *r = find(c, kind, key, key_len);
    if (r) {
        r->refs++;
        r->used = ++c->clock;
        c->stats.hits++;
        pthread_mutex_unlock(&c->lock);
        free(key);
        return r;
    }
    pthread_mutex_unlock(&c->lock);
    /* Compiled outside the lock: a large schema must not hold up requests
     * whose grammar is already here. Two requests may compile the same
     * text at once; the first one listed wins. */
    llm_grammar *g = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    llm_status st = compile(c->model, kind, text, root, &g);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_mutex_lock(&c->lock);
    c->stats.compiles++;
    c->stats.compile_seconds += (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    pthread_mutex_unlock(&c->lock);
    if (st != LLM_OK) {
        free(key);
        if (st == LLM_ERR_OUT_OF_MEMORY)
            serve_error_out_of_memory(err, "while compiling the grammar");
        else
            serve_error_set(err, 400, "invalid_request_error", param, "'%s': %s", param,
                            llm_last_error());
        return NULL;
    }
    r = serve_calloc(1, sizeof *r);
    if (!r) {
        llm_grammar_free(g);
        free(key);
        serve_error_out_of_memory(err, "while compiling the grammar");
        return NULL;
    }
    *r = (grammar_ref){
        .cache = c, .kind = kind, .key = key, .key_len = key_len, .grammar = g, .refs = 1};
    pthread_mutex_lock(&c->lock);
    grammar_ref *raced = find(c, kind, key, key_len);
    if (raced) {
        raced->refs++;
        raced->used = ++c->clock;
    } else {
        r->used = ++c->clock;
        remember(c, r);
    }
    pthread_mutex_unlock(&c->lock);
    if (raced) {
        ref_free(r);
        return raced;
    }
    return r;
}

void grammar_cache_get_stats(grammar_cache *c, grammar_cache_stats *out) {
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    out->entries = c->n;
    pthread_mutex_unlock(&c->lock);
}
