#include "tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "llm.h"

#define INVALID(param, ...)                                                                        \
    (serve_error_set(err, 400, "invalid_request_error", param, __VA_ARGS__), false)
#define OUT_OF_MEMORY() (serve_error_out_of_memory(err, "while parsing the request"), false)

/* The families, most specific first; a new family is one entry here. */
static const tool_format FORMATS[] = {
    /* Hermes, Qwen 2.5/3 and others: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
     */
    {"hermes", {"<tool_call>"}, "<tool_call>\n", "\n</tool_call>", "\n", "arguments"},
    /* Llama 3.1-3.3: {"name": ..., "parameters": {...}} as the whole reply */
    {"llama3", {"\"parameters\"", "ipython"}, "", "", ";", "parameters"},
};
#define N_FORMATS (sizeof FORMATS / sizeof *FORMATS)

const tool_format *tool_format_detect(const char *template_text) {
    for (size_t i = 0; template_text && i < N_FORMATS; i++)
        for (size_t m = 0; m < 3 && FORMATS[i].markers[m]; m++)
            if (strstr(template_text, FORMATS[i].markers[m]))
                return &FORMATS[i];
    return &FORMATS[0];
}

const tool_format *tool_format_find(const char *name) {
    for (size_t i = 0; i < N_FORMATS; i++)
        if (!strcmp(FORMATS[i].name, name))
            return &FORMATS[i];
    return NULL;
}

static const cJSON *field(const cJSON *root, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

/* OpenAI's rule for function names: letters, digits, '_' and '-', at most 64. */
static bool valid_name(const char *s) {
    size_t n = strlen(s);
    if (!n || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && !(c >= '0' && c <= '9') &&
            c != '_' && c != '-' && c != '.')
            return false;
    }
    return true;
}

static bool check_tool(const cJSON *tool, size_t i, const cJSON *tools, serve_error *err) {
    char param[64];
    snprintf(param, sizeof param, "tools[%zu]", i);
    if (!cJSON_IsObject(tool))
        return INVALID(param, "'%s' must be an object", param);
    const cJSON *type = field(tool, "type"), *fn = field(tool, "function");
    if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function")))
        return INVALID(param, "'%s.type' must be 'function'", param);
    if (!cJSON_IsObject(fn))
        return INVALID(param, "'%s.function' must be an object with the function's name", param);
    const cJSON *name = field(fn, "name");
    if (!cJSON_IsString(name))
        return INVALID(param, "'%s.function.name' is required (a string)", param);
    if (!valid_name(name->valuestring))
        return INVALID(param, "'%s.function.name' must be 1 to 64 letters, digits, '_', '-' or '.'",
                       param);
    const cJSON *desc = field(fn, "description");
    if (desc && !cJSON_IsString(desc))
        return INVALID(param, "'%s.function.description' must be a string", param);
    const cJSON *params = field(fn, "parameters");
    if (params) {
        const cJSON *ptype = field(params, "type");
        if (!cJSON_IsObject(params) ||
            (ptype && (!cJSON_IsString(ptype) || strcmp(ptype->valuestring, "object"))))
            return INVALID(param,
                           "'%s.function.parameters' must be a JSON Schema of an object "
                           "({\"type\": \"object\", ...})",
                           param);
    }
    const cJSON *other;
    size_t j = 0;
    cJSON_ArrayForEach(other, tools) {
        if (j++ >= i)
            break;
        const cJSON *other_name = field(field(other, "function"), "name");
        if (!strcmp(other_name->valuestring, name->valuestring))
            return INVALID(param, "'%s': a second function named '%.64s'", param,
                           name->valuestring);
    }
    return true;
}

static bool declared(const cJSON *tools, const char *name) {
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        if (!strcmp(field(field(tool, "function"), "name")->valuestring, name))
            return true;
    }
    return false;
}

static bool parse_tool_choice(const cJSON *choice, const cJSON *tools, serve_request *req,
                              serve_error *err) {
    if (!tools)
        return INVALID("tool_choice", "'tool_choice' needs 'tools' (a list of functions)");
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (!strcmp(c, "auto"))
            req->tool_choice = SERVE_TOOL_CHOICE_AUTO;
        else if (!strcmp(c, "none"))
            req->tool_choice = SERVE_TOOL_CHOICE_NONE;
        else if (!strcmp(c, "required"))
            req->tool_choice = SERVE_TOOL_CHOICE_REQUIRED;
        else
            return INVALID("tool_choice",
                           "'tool_choice' must be 'none', 'auto', 'required' or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        return true;
    }
    const cJSON *type = field(choice, "type"), *fn = field(choice, "function");
    const cJSON *name = field(fn, "name");
    if (!cJSON_IsObject(choice) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
        !cJSON_IsString(name))
        return INVALID("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or "
                                      "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (!declared(tools, name->valuestring))
        return INVALID("tool_choice",
                       "'tool_choice' names the function '%.64s', which is not "
                       "in 'tools'",
                       name->valuestring);
    req->tool_choice = SERVE_TOOL_CHOICE_NAMED;
    req->tool_choice_name = serve_strdup(name->valuestring);
    return req->tool_choice_name ? true : OUT_OF_MEMORY();
}

bool serve_parse_tools(const cJSON *root, serve_request *req, serve_error *err) {
    req->parallel_tool_calls = true;
    const cJSON *parallel = field(root, "parallel_tool_calls");
    if (parallel) {
        if (!cJSON_IsBool(parallel))
            return INVALID("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
        req->parallel_tool_calls = cJSON_IsTrue(parallel);
    }
    const cJSON *tools = field(root, "tools");
    if (tools && !cJSON_IsArray(tools))
        return INVALID("tools", "'tools' must be an array of functions");
    if (tools && !cJSON_GetArraySize(tools))
        tools = NULL; /* an empty list: no tools */
    const cJSON *tool;
    size_t i = 0;
    cJSON_ArrayForEach(tool, tools) {
        if (!check_tool(tool, i++, tools, err))
            return false;
    }
    const cJSON *choice = field(root, "tool_choice");
    if (choice && !parse_tool_choice(choice, tools, req, err))
        return false;
    if (!tools)
        return true;
    req->n_tools = i;
    req->tools_json = cJSON_PrintUnformatted(tools);
    return req->tools_json ? true : OUT_OF_MEMORY();
}

/* The schema of one call: {"name": <const>, <arguments_key>: <parameters>}. */
static cJSON *call_schema(const cJSON *fn, const tool_format *fmt) {
    cJSON *s = cJSON_CreateObject(), *props = cJSON_CreateObject(), *name = cJSON_CreateObject();
    cJSON *required = cJSON_CreateArray();
    const cJSON *params = field(fn, "parameters");
    cJSON *args = params ? cJSON_Duplicate(params, true) : cJSON_CreateObject();
    bool ok = s && props && name && required && args;
    ok = ok && cJSON_AddStringToObject(name, "const", field(fn, "name")->valuestring);
    if (ok && !params)
        ok = cJSON_AddStringToObject(args, "type", "object") != NULL;
    if (ok) {
        cJSON_AddItemToObject(props, "name", name);
        cJSON_AddItemToObject(props, fmt->arguments_key, args);
        name = args = NULL;
        ok = cJSON_AddStringToObject(s, "type", "object") &&
             cJSON_AddItemToArray(required, cJSON_CreateString("name")) &&
             cJSON_AddItemToArray(required, cJSON_CreateString(fmt->arguments_key));
        cJSON_AddItemToObject(s, "properties", props);
        cJSON_AddItemToObject(s, "required", required);
        props = required = NULL;
        ok = ok && cJSON_AddFalseToObject(s, "additionalProperties");
    }
    cJSON_Delete(props);
    cJSON_Delete(name);
    cJSON_Delete(required);
    cJSON_Delete(args);
    if (!ok) {
        cJSON_Delete(s);
        return NULL;
    }
    return s;
}

/* A JSON Schema accepting one call to any allowed tool: an anyOf of them. */
static char *calls_schema(const serve_request *req, const tool_format *fmt) {
    cJSON *tools = cJSON_Parse(req->tools_json);
    cJSON *schema = cJSON_CreateObject();
    cJSON *any = schema ? cJSON_AddArrayToObject(schema, "anyOf") : NULL;
    bool ok = tools && any;
    const cJSON *tool;
    cJSON *each = ok ? tools : NULL;
    cJSON_ArrayForEach(tool, each) {
        const cJSON *fn = field(tool, "function");
        if (req->tool_choice == SERVE_TOOL_CHOICE_NAMED &&
            strcmp(field(fn, "name")->valuestring, req->tool_choice_name))
            continue;
        cJSON *one = call_schema(fn, fmt);
        if (!one || !cJSON_AddItemToArray(any, one)) {
            cJSON_Delete(one);
            ok = false;
            break;
        }
    }
    char *text = ok ? cJSON_PrintUnformatted(schema) : NULL;
    cJSON_Delete(schema);
    cJSON_Delete(tools);
    return text;
}

/* Writes `s` as a GBNF string literal. */
static size_t put_literal(char *out, const char *s) {
    size_t n = 0;
    out[n++] = '"';
    for (; *s; s++) {
        if (*s == '\n')
            out[n++] = '\\', out[n++] = 'n';
        else if (*s == '"' || *s == '\\')
            out[n++] = '\\', out[n++] = *s;
        else
            out[n++] = *s;
    }
    out[n++] = '"';
    return n;
}

/* Which tool's parameters the compiler refuses: its error, with the JSON
 * pointer inside that schema, names `tools[i]`. */
static void report_bad_parameters(const serve_request *req, serve_error *err) {
    cJSON *tools = cJSON_Parse(req->tools_json);
    const cJSON *tool;
    size_t i = 0;
    serve_error_set(err, 400, "invalid_request_error", "tools", "a tool's parameters: %s",
                    llm_last_error());
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *params = field(field(tool, "function"), "parameters");
        char *text = params ? cJSON_PrintUnformatted(params) : NULL;
        size_t need = 0;
        llm_status st = text ? llm_grammar_schema_to_ebnf(text, strlen(text), NULL, NULL, 0, &need)
                             : LLM_ERR_BUFFER_TOO_SMALL;
        free(text);
        if (st != LLM_ERR_BUFFER_TOO_SMALL && st != LLM_OK && st != LLM_ERR_OUT_OF_MEMORY) {
            char param[32];
            snprintf(param, sizeof param, "tools[%zu]", i);
            serve_error_set(err, 400, "invalid_request_error", param,
                            "'%s.function.parameters': %s", param, llm_last_error());
            break;
        }
        i++;
    }
    cJSON_Delete(tools);
}

char *tool_grammar_text(const serve_request *req, const tool_format *fmt, serve_error *err) {
    char *schema = calls_schema(req, fmt);
    if (!schema) {
        serve_error_out_of_memory(err, "while building the tool-call grammar");
        return NULL;
    }
    size_t need = 0;
    /* Optional whitespace between JSON tokens, as in llama.cpp's tool
     * grammars: models learned calls written with spaces ({"name": ...}). */
    llm_grammar_params params;
    llm_grammar_params_init(&params);
    params.whitespace = LLM_GRAMMAR_WS_FLEXIBLE;
    llm_status st = llm_grammar_schema_to_ebnf(schema, strlen(schema), &params, NULL, 0, &need);
    /* The wrapper: each call is `open root close`, calls apart by `separator`;
     * a literal takes at most twice its length, escaped. */
    size_t extra = 4 * (strlen(fmt->open) + strlen(fmt->close) + strlen(fmt->separator)) + 256;
    char *text = st == LLM_ERR_BUFFER_TOO_SMALL ? serve_malloc(need + extra) : NULL;
    if (text)
        st = llm_grammar_schema_to_ebnf(schema, strlen(schema), &params, text, need, &need);
    free(schema);
    if (st != LLM_OK) {
        free(text);
        if (st == LLM_ERR_OUT_OF_MEMORY || (!text && st == LLM_ERR_BUFFER_TOO_SMALL))
            serve_error_out_of_memory(err, "while building the tool-call grammar");
        else
            report_bad_parameters(req, err);
        return NULL;
    }
    size_t n = need - 1;
    n += (size_t)sprintf(text + n, "%s ::= ", TOOL_GRAMMAR_ROOT);
    n += put_literal(text + n, fmt->open);
    n += (size_t)sprintf(text + n, " root ");
    n += put_literal(text + n, fmt->close);
    if (req->parallel_tool_calls) {
        n += (size_t)sprintf(text + n, " ( ");
        n += put_literal(text + n, fmt->separator);
        n += put_literal(text + n, fmt->open);
        n += (size_t)sprintf(text + n, " root ");
        n += put_literal(text + n, fmt->close);
        n += (size_t)sprintf(text + n, " )*");
    }
    sprintf(text + n, "\n");
    return text;
}

char *tool_preamble(const serve_request *req, const tool_format *fmt) {
    static const char head[] =
        "You can call functions. These are the functions available, as JSON:\n";
    static const char how[] =
        "\nTo call a function, reply with a JSON object of its name and its arguments, written "
        "as:\n";
    char example[256];
    snprintf(example, sizeof example,
             "%s{\"name\": <function name>, \"%s\": <arguments as a JSON object>}%s\n", fmt->open,
             fmt->arguments_key, fmt->close);
    static const char tail[] =
        "Write one such call for each function to call. Reply with text, without a call, when "
        "no function is needed.";
    size_t n = sizeof head + strlen(req->tools_json) + sizeof how + strlen(example) + sizeof tail;
    char *text = serve_malloc(n);
    if (!text)
        return NULL;
    snprintf(text, n, "%s%s%s%s%s", head, req->tools_json, how, example, tail);
    return text;
}

bool serve_request_grammar(grammar_cache *cache, const serve_request *req, const tool_format *fmt,
                           grammar_ref **out, serve_error *err) {
    *out = NULL;
    if (req->constraint != SERVE_CONSTRAINT_NONE) {
        *out = grammar_cache_get(cache, req->constraint, req->constraint_text, NULL,
                                 req->constraint_param, err);
        return *out != NULL;
    }
    if (!serve_request_uses_tools(req) || req->tool_choice == SERVE_TOOL_CHOICE_AUTO)
        return true;
    char *text = tool_grammar_text(req, fmt, err);
    if (!text)
        return false;
    *out = grammar_cache_get(cache, SERVE_CONSTRAINT_GBNF, text, TOOL_GRAMMAR_ROOT, "tools", err);
    free(text);
    return *out != NULL;
}
