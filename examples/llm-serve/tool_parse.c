#include "tool_parse.h"

#include <cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "alloc.h"

void tool_call_new_id(char id[32]) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char bytes[24];
    if (getrandom(bytes, sizeof bytes, GRND_NONBLOCK) != (ssize_t)sizeof bytes) {
        /* No entropy yet (early boot): ids need only be unlikely to repeat. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15u ^ (uint64_t)ts.tv_sec ^
                     (uint64_t)(uintptr_t)id;
        for (size_t i = 0; i < sizeof bytes; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            bytes[i] = (unsigned char)x;
        }
    }
    memcpy(id, "call_", 5);
    for (size_t i = 0; i < sizeof bytes; i++)
        id[5 + i] = alnum[bytes[i] % (sizeof alnum - 1)];
    id[5 + sizeof bytes] = '\0';
}

void tool_reply_free(tool_reply *r) {
    for (size_t i = 0; i < r->n_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    free(r->content);
    memset(r, 0, sizeof *r);
}

static const char *skip_space(const char *s) {
    while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')
        s++;
    return s;
}

/* `delim` without its leading and trailing whitespace, as (start, length). */
static const char *trimmed(const char *delim, size_t *len) {
    delim = skip_space(delim);
    size_t n = strlen(delim);
    while (n && strchr(" \n\t\r", delim[n - 1]))
        n--;
    *len = n;
    return delim;
}

static bool is_declared(const cJSON *tools, const char *name) {
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name))
            return true;
    }
    return false;
}

/* Whether JSON text that did not parse ends inside an object, array or
 * string whose brackets match so far: the start of a value, cut short. */
static bool json_cut_short(const char *s) {
    char open[64];
    size_t depth = 0;
    bool in_string = false;
    for (; *s; s++) {
        if (in_string) {
            if (*s == '\\' && s[1])
                s++;
            else if (*s == '"')
                in_string = false;
        } else if (*s == '"') {
            in_string = true;
        } else if (*s == '{' || *s == '[') {
            if (depth == sizeof open)
                return false;
            open[depth++] = *s;
        } else if (*s == '}' || *s == ']') {
            if (!depth || open[--depth] != (*s == '}' ? '{' : '['))
                return false;
            if (!depth)
                return false; /* a whole value: it did not parse for another reason */
        }
    }
    return in_string || depth;
}

/* TRUNCATED: the text ends inside a call (a reply cut by max_tokens). */
typedef enum { PARSED, NOT_A_CALL, TRUNCATED, NO_MEMORY } parse_result;

/* One call's JSON at `*at`; advances past it. */
static parse_result parse_call(const char **at, const tool_format *fmt, const cJSON *tools,
                               tool_reply *out) {
    const char *end = NULL;
    cJSON *obj = cJSON_ParseWithLengthOpts(*at, strlen(*at), &end, false);
    if (!obj)
        return json_cut_short(*at) ? TRUNCATED : NOT_A_CALL;
    *at = end;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    /* Models mix up the families' keys: either is taken. */
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(obj, fmt->arguments_key);
    if (!args)
        args = cJSON_GetObjectItemCaseSensitive(obj, "arguments");
    if (!args)
        args = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    parse_result r = NOT_A_CALL;
    cJSON *from_text = NULL;
    if (cJSON_IsString(args))
        args = from_text = cJSON_Parse(args->valuestring);
    if (cJSON_IsObject(obj) && cJSON_IsString(name) && is_declared(tools, name->valuestring) &&
        cJSON_IsObject(args)) {
        r = NO_MEMORY;
        tool_call *calls = serve_realloc(out->calls, (out->n_calls + 1) * sizeof *calls);
        if (calls) {
            out->calls = calls;
            tool_call *c = &calls[out->n_calls];
            c->name = serve_strdup(name->valuestring);
            c->arguments = cJSON_PrintUnformatted(args);
            tool_call_new_id(c->id);
            if (c->name && c->arguments) {
                out->n_calls++;
                r = PARSED;
            } else {
                free(c->name);
                free(c->arguments);
            }
        }
    }
    cJSON_Delete(from_text);
    cJSON_Delete(obj);
    return r;
}

static bool starts_with(const char *s, const char *prefix, size_t n) {
    return !strncmp(s, prefix, n);
}

/* Whether `at` is all that is left and a proper prefix of `delim`. */
static bool cut_short(const char *at, const char *delim, size_t len) {
    size_t n = strlen(at);
    return n < len && !strncmp(at, delim, n);
}

/* The calls from `first` (where the first call's opening is) to the end. */
static parse_result parse_calls(const char *first, const tool_format *fmt, const cJSON *tools,
                                tool_reply *out) {
    size_t open_len, close_len, sep_len;
    const char *open = trimmed(fmt->open, &open_len);
    const char *close = trimmed(fmt->close, &close_len);
    const char *sep = trimmed(fmt->separator, &sep_len);
    const char *at = first;
    /* A reply cut short (by max_tokens) keeps the calls it completed. */
    for (;;) {
        at = skip_space(at + open_len);
        parse_result r = parse_call(&at, fmt, tools, out);
        if (r == TRUNCATED && out->n_calls)
            return PARSED;
        if (r != PARSED)
            return r == TRUNCATED ? NOT_A_CALL : r;
        at = skip_space(at);
        if (close_len) {
            if (cut_short(at, close, close_len))
                return PARSED;
            if (!starts_with(at, close, close_len))
                return NOT_A_CALL;
            at = skip_space(at + close_len);
        }
        if (!*at)
            return PARSED;
        if (sep_len && cut_short(at, sep, sep_len))
            return PARSED;
        if (sep_len && starts_with(at, sep, sep_len))
            at = skip_space(at + sep_len);
        if (open_len && cut_short(at, open, open_len))
            return PARSED;
        if (open_len ? !starts_with(at, open, open_len) : *at != '{')
            return NOT_A_CALL;
    }
}

/* Where the calls start: the first opening tag, with the content before
 * it; a format without one has its calls as the whole reply (after Llama's
 * <|python_tag|>), with no content. */
static const char *first_call(const char *text, const tool_format *fmt, const char **content_end) {
    size_t open_len;
    const char *open = trimmed(fmt->open, &open_len);
    if (open_len) {
        for (const char *at = text; *at; at++)
            if (starts_with(at, open, open_len))
                return *content_end = at;
        return NULL;
    }
    const char *at = skip_space(text);
    static const char python_tag[] = "<|python_tag|>";
    if (starts_with(at, python_tag, sizeof python_tag - 1))
        at = skip_space(at + sizeof python_tag - 1);
    *content_end = text;
    return *at == '{' ? at : NULL;
}

bool tool_reply_parse(const char *text, const tool_format *fmt, const char *tools_json,
                      tool_reply *out) {
    memset(out, 0, sizeof *out);
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    if (tools_json && !tools)
        return false;
    const char *content_end = NULL;
    const char *first = tools ? first_call(text, fmt, &content_end) : NULL;
    parse_result r = first ? parse_calls(first, fmt, tools, out) : NOT_A_CALL;
    cJSON_Delete(tools);
    if (r == NO_MEMORY)
        return false;
    if (r != PARSED) {
        for (size_t i = 0; i < out->n_calls; i++) {
            free(out->calls[i].name);
            free(out->calls[i].arguments);
        }
        out->n_calls = 0;
        content_end = NULL;
    }
    size_t n = content_end ? (size_t)(content_end - text) : strlen(text);
    if (content_end)
        while (n && strchr(" \n\t\r", text[n - 1]))
            n--;
    if (!n && out->n_calls)
        return true;
    out->content = serve_malloc(n + 1);
    if (!out->content)
        return false;
    memcpy(out->content, text, n);
    out->content[n] = '\0';
    return true;
}

bool tool_reply_put(cJSON *message, const char *text, const tool_format *fmt,
                    const serve_request *req, bool delta, size_t content_sent, bool *has_calls) {
    tool_reply reply;
    bool ok = tool_reply_parse(text ? text : "", fmt, req->tools_json, &reply);
    /* Without parallel calls a client expects one at most: the first. */
    for (; ok && !req->parallel_tool_calls && reply.n_calls > 1; reply.n_calls--) {
        free(reply.calls[reply.n_calls - 1].name);
        free(reply.calls[reply.n_calls - 1].arguments);
    }
    *has_calls = ok && reply.n_calls;
    size_t content_len = reply.content ? strlen(reply.content) : 0;
    const char *unsent = delta && content_sent < content_len ? reply.content + content_sent : "";
    if (ok && reply.content && (!delta || unsent[0]))
        ok = cJSON_AddStringToObject(message, "content", delta ? unsent : reply.content) != NULL;
    else if (ok && !delta)
        ok = cJSON_AddNullToObject(message, "content") != NULL;
    cJSON *calls = ok && reply.n_calls ? cJSON_AddArrayToObject(message, "tool_calls") : NULL;
    if (reply.n_calls && !calls)
        ok = false;
    for (size_t i = 0; ok && i < reply.n_calls; i++) {
        cJSON *c = cJSON_CreateObject();
        if (!c || !cJSON_AddItemToArray(calls, c)) {
            cJSON_Delete(c);
            ok = false;
            break;
        }
        /* A stream's delta gives each call's place; the whole call comes at once. */
        if (delta && !cJSON_AddNumberToObject(c, "index", (double)i))
            ok = false;
        cJSON *fn = ok && cJSON_AddStringToObject(c, "id", reply.calls[i].id) &&
                            cJSON_AddStringToObject(c, "type", "function")
                        ? cJSON_AddObjectToObject(c, "function")
                        : NULL;
        ok = fn && cJSON_AddStringToObject(fn, "name", reply.calls[i].name) &&
             cJSON_AddStringToObject(fn, "arguments", reply.calls[i].arguments);
    }
    tool_reply_free(&reply);
    return ok;
}

size_t tool_reply_sendable(const char *text, size_t len, const tool_format *fmt) {
    size_t open_len;
    const char *open = trimmed(fmt->open, &open_len);
    size_t n = len;
    if (!open_len) {
        /* Calls are the whole reply: nothing is sure to be content while
         * the reply may still turn out to be one. */
        static const char python_tag[] = "<|python_tag|>";
        const char *at = skip_space(text);
        size_t rest = len - (size_t)(at - text);
        bool may_be_call =
            !rest || *at == '{' ||
            !strncmp(at, python_tag, rest < sizeof python_tag - 1 ? rest : sizeof python_tag - 1);
        return may_be_call ? 0 : len;
    }
    /* Up to the opening tag, or to a tail that may become one. */
    for (size_t i = 0; i < len; i++) {
        size_t left = len - i;
        if (!strncmp(text + i, open, left < open_len ? left : open_len)) {
            n = i;
            break;
        }
    }
    while (n && strchr(" \n\t\r", text[n - 1]))
        n--;
    return n;
}
