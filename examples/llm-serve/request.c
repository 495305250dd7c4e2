#include "request.h"

#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "structured.h"
#include "tools.h"

void serve_error_set(serve_error *err, int http_status, const char *type, const char *param,
                     const char *fmt, ...)
{
    err->http_status = http_status;
    err->type = type;
    err->code = NULL;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

void serve_error_out_of_memory(serve_error *err, const char *what)
{
    serve_error_set(err, 503, "server_error", NULL, "out of memory %s; retry later", what);
    err->code = "out_of_memory";
}

#define INVALID(param, ...) \
    (serve_error_set(err, 400, "invalid_request_error", param, __VA_ARGS__), false)
#define OUT_OF_MEMORY() (serve_error_out_of_memory(err, "while parsing the request"), false)

void serve_request_free(serve_request *req)
{
    for (size_t i = 0; i < req->n_messages; i++) {
        free(req->messages[i].role);
        free(req->messages[i].content);
    }
    free(req->messages);
    free(req->prompt);
    free(req->prompt_tokens);
    for (size_t i = 0; i < req->n_stop; i++) free(req->stop[i]);
    free(req->logit_bias);
    free(req->model);
    free(req->messages_json);
    free(req->constraint_text);
    free(req->tools_json);
    free(req->tool_choice_name);
    memset(req, 0, sizeof *req);
}


/* A field that is present and not JSON null. */
static const cJSON *field(const cJSON *root, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static bool get_number(const cJSON *root, const char *name, double lo, double hi, bool *present,
                       double *out, serve_error *err)
{
    const cJSON *f = field(root, name);
    *present = f != NULL;
    if (!f) return true;
    if (!cJSON_IsNumber(f)) return INVALID(name, "'%s' must be a number", name);
    double v = f->valuedouble;
    if (!isfinite(v) || v < lo || v > hi)
        return INVALID(name, "'%s' must be between %g and %g", name, lo, hi);
    *out = v;
    return true;
}

static bool get_integer(const cJSON *root, const char *name, double lo, double hi,
                        bool *present, double *out, serve_error *err)
{
    const cJSON *f = field(root, name);
    if (f && (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble)))
        return INVALID(name, "'%s' must be an integer", name);
    return get_number(root, name, lo, hi, present, out, err);
}

static bool get_bool(const cJSON *root, const char *name, bool *out, serve_error *err)
{
    const cJSON *f = field(root, name);
    if (!f) return true;
    if (!cJSON_IsBool(f)) return INVALID(name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(f);
    return true;
}

/* Message content: a string or an array of {"type":"text","text":...} parts. */
static bool parse_content(const cJSON *content, size_t index, char **out, serve_error *err)
{
    char name[64];
    snprintf(name, sizeof name, "messages[%zu].content", index);
    if (!content) {
        *out = serve_strdup("");
        return *out ? true : OUT_OF_MEMORY();
    }
    if (cJSON_IsString(content)) {
        *out = serve_strdup(content->valuestring);
        return *out ? true : OUT_OF_MEMORY();
    }
    if (!cJSON_IsArray(content))
        return INVALID(name, "'%s' must be a string or an array of text parts", name);
    size_t total = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text"))
            return INVALID(name, "'%s' supports only parts of type 'text'", name);
        if (!cJSON_IsString(text))
            return INVALID(name, "'%s': a text part needs a string 'text'", name);
        total += strlen(text->valuestring);
    }
    char *joined = serve_malloc(total + 1);
    if (!joined) return OUT_OF_MEMORY();
    size_t at = 0;
    cJSON_ArrayForEach(part, content) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(joined + at, t, n);
        at += n;
    }
    joined[at] = '\0';
    *out = joined;
    return true;
}

/* An assistant message's tool_calls, checked and copied for the template.
 * Arguments given as JSON text become the object itself, as templates that
 * write them with `tojson` expect. */
static bool copy_tool_calls(const cJSON *calls, size_t index, cJSON *to, serve_error *err) {
    char name[64];
    snprintf(name, sizeof name, "messages[%zu].tool_calls", index);
    if (!cJSON_IsArray(calls))
        return INVALID(name, "'%s' must be an array", name);
    cJSON *copy = cJSON_AddArrayToObject(to, "tool_calls");
    if (!copy)
        return OUT_OF_MEMORY();
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        const cJSON *fn = field(call, "function");
        const cJSON *fname = field(fn, "name"), *args = field(fn, "arguments");
        if (!cJSON_IsObject(call) || !cJSON_IsObject(fn) || !cJSON_IsString(fname) ||
            (args && !cJSON_IsString(args) && !cJSON_IsObject(args)))
            return INVALID(name,
                           "'%s' must hold {\"type\": \"function\", \"function\": "
                           "{\"name\": ..., \"arguments\": ...}} objects",
                           name);
        cJSON *c = cJSON_Duplicate(call, true);
        if (!c || !cJSON_AddItemToArray(copy, c)) {
            cJSON_Delete(c);
            return OUT_OF_MEMORY();
        }
        cJSON *cfn = cJSON_GetObjectItemCaseSensitive(c, "function");
        cJSON *cargs = cJSON_GetObjectItemCaseSensitive(cfn, "arguments");
        cJSON *parsed = cJSON_IsString(cargs) ? cJSON_Parse(cargs->valuestring) : NULL;
        /* Text that is not an object's JSON stays text (so does all of it
         * if the replacement cannot be allocated). */
        if (!cJSON_IsObject(parsed) ||
            !cJSON_ReplaceItemInObjectCaseSensitive(cfn, "arguments", parsed))
            cJSON_Delete(parsed);
    }
    return true;
}

/* One message as the template sees it, added to `out`. */
static bool template_message(const cJSON *m, const char *role, const char *content, size_t index,
                             cJSON *out, serve_error *err) {
    cJSON *tm = cJSON_CreateObject();
    if (!tm || !cJSON_AddItemToArray(out, tm)) {
        cJSON_Delete(tm);
        return OUT_OF_MEMORY();
    }
    if (!cJSON_AddStringToObject(tm, "role", role) ||
        !cJSON_AddStringToObject(tm, "content", content))
        return OUT_OF_MEMORY();
    static const char *const passed[] = {"tool_call_id", "name"};
    for (size_t k = 0; k < sizeof passed / sizeof *passed; k++) {
        const cJSON *f = field(m, passed[k]);
        if (!f)
            continue;
        if (!cJSON_IsString(f))
            return INVALID("messages", "'messages[%zu].%s' must be a string", index, passed[k]);
        if (!cJSON_AddStringToObject(tm, passed[k], f->valuestring))
            return OUT_OF_MEMORY();
    }
    const cJSON *calls = field(m, "tool_calls");
    if (calls && strcmp(role, "assistant"))
        return INVALID("messages",
                       "'messages[%zu].tool_calls': only assistant messages make "
                       "tool calls",
                       index);
    return !calls || copy_tool_calls(calls, index, tm, err);
}

static bool parse_messages(const cJSON *root, serve_request *req, serve_error *err)
{
    const cJSON *messages = field(root, "messages");
    if (!messages) return INVALID("messages", "'messages' is required");
    if (!cJSON_IsArray(messages)) return INVALID("messages", "'messages' must be an array");
    int count = cJSON_GetArraySize(messages);
    if (count == 0) return INVALID("messages", "'messages' must not be empty");
    req->messages = serve_calloc((size_t)count, sizeof *req->messages);
    cJSON *for_template = cJSON_CreateArray();
    if (!req->messages || !for_template) {
        cJSON_Delete(for_template);
        return OUT_OF_MEMORY();
    }
    const cJSON *m;
    bool ok = true;
    cJSON_ArrayForEach(m, messages) {
        size_t i = req->n_messages;
        char name[64];
        snprintf(name, sizeof name, "messages[%zu].role", i);
        ok = false;
        if (!cJSON_IsObject(m)) {
            (void)INVALID("messages", "'messages[%zu]' must be an object", i);
            break;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) {
            (void)INVALID(name, "'%s' must be a string", name);
            break;
        }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
            strcmp(r, "tool")) {
            (void)INVALID(name, "'%s' must be 'system', 'user', 'assistant' or 'tool'", name);
            break;
        }
        char *content;
        if (!parse_content(field(m, "content"), i, &content, err))
            break;
        char *role_copy = serve_strdup(r);
        if (!role_copy) {
            free(content);
            (void)OUT_OF_MEMORY();
            break;
        }
        req->messages[i].role = role_copy;
        req->messages[i].content = content;
        req->n_messages++;
        if (!template_message(m, r, content, i, for_template, err))
            break;
        ok = true;
    }
    if (ok && !(req->messages_json = cJSON_PrintUnformatted(for_template)))
        ok = OUT_OF_MEMORY();
    cJSON_Delete(for_template);
    return ok;
}

/* A prompt given as token ids, as OpenAI's API allows. */
static bool parse_prompt_tokens(const cJSON *prompt, const serve_limits *limits,
                                serve_request *req, serve_error *err)
{
    int count = cJSON_GetArraySize(prompt);
    req->prompt_tokens = serve_calloc((size_t)count, sizeof *req->prompt_tokens);
    if (!req->prompt_tokens) return OUT_OF_MEMORY();
    const cJSON *t;
    cJSON_ArrayForEach(t, prompt) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= limits->n_vocab)
            return INVALID("prompt", "'prompt' token ids must be integers below %u", limits->n_vocab);
        req->prompt_tokens[req->n_prompt_tokens++] = (llm_token)t->valuedouble;
    }
    req->prompt = serve_strdup("");
    return req->prompt ? true : OUT_OF_MEMORY();
}

static bool parse_prompt(const cJSON *root, const serve_limits *limits, serve_request *req,
                         serve_error *err)
{
    const cJSON *prompt = field(root, "prompt");
    if (!prompt) return INVALID("prompt", "'prompt' is required");
    if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) > 0 &&
        cJSON_IsNumber(cJSON_GetArrayItem(prompt, 0)))
        return parse_prompt_tokens(prompt, limits, req, err);
    if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1)
        prompt = cJSON_GetArrayItem(prompt, 0);
    if (!cJSON_IsString(prompt))
        return INVALID("prompt", "'prompt' must be a string, an array of one string, or an "
                                 "array of token ids");
    req->prompt = serve_strdup(prompt->valuestring);
    return req->prompt ? true : OUT_OF_MEMORY();
}

static bool add_stop(serve_request *req, const char *text)
{
    char *copy = serve_strdup(text);
    if (!copy) return false;
    req->stop[req->n_stop++] = copy;
    return true;
}

static bool parse_stop(const cJSON *root, serve_request *req, serve_error *err)
{
    const cJSON *stop = field(root, "stop");
    if (!stop) return true;
    if (cJSON_IsString(stop)) {
        if (stop->valuestring[0] && !add_stop(req, stop->valuestring)) return OUT_OF_MEMORY();
        return true;
    }
    if (!cJSON_IsArray(stop)) return INVALID("stop", "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(stop) > SERVE_MAX_STOP)
        return INVALID("stop", "'stop' may hold at most %d strings", SERVE_MAX_STOP);
    const cJSON *s;
    cJSON_ArrayForEach(s, stop) {
        if (!cJSON_IsString(s)) return INVALID("stop", "'stop' must be a string or an array of strings");
        if (s->valuestring[0] && !add_stop(req, s->valuestring)) return OUT_OF_MEMORY();
    }
    return true;
}

static bool parse_logit_bias(const cJSON *root, const serve_limits *limits, serve_request *req,
                             serve_error *err)
{
    const cJSON *bias = field(root, "logit_bias");
    if (!bias) return true;
    if (!cJSON_IsObject(bias)) return INVALID("logit_bias", "'logit_bias' must be an object");
    int count = cJSON_GetArraySize(bias);
    if (count == 0) return true;
    req->logit_bias = serve_calloc((size_t)count, sizeof *req->logit_bias);
    if (!req->logit_bias) return OUT_OF_MEMORY();
    const cJSON *entry;
    cJSON_ArrayForEach(entry, bias) {
        char *end;
        long token = strtol(entry->string, &end, 10);
        if (!entry->string[0] || *end || token < 0 || (uint64_t)token >= limits->n_vocab)
            return INVALID("logit_bias", "'logit_bias' key '%.40s' is not a token id below %u",
                           entry->string, limits->n_vocab);
        if (!cJSON_IsNumber(entry) || !isfinite(entry->valuedouble) || entry->valuedouble < -100 ||
            entry->valuedouble > 100)
            return INVALID("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
        /* OpenAI: -100 bans the token outright. */
        float b = entry->valuedouble <= -100 ? -INFINITY : (float)entry->valuedouble;
        req->logit_bias[req->n_logit_bias++] = (llm_logit_bias){(llm_token)token, b};
    }
    return true;
}

static bool parse_spec(const cJSON *root, serve_request *req, serve_error *err)
{
    const cJSON *spec = field(root, "speculative");
    if (spec) {
        if (!cJSON_IsString(spec)) return INVALID("speculative", "'speculative' must be a string");
        if (!strcmp(spec->valuestring, "none")) req->spec_mode = LLM_SPEC_NONE;
        else if (!strcmp(spec->valuestring, "ngram")) req->spec_mode = LLM_SPEC_NGRAM;
        else if (!strcmp(spec->valuestring, "draft")) req->spec_mode = LLM_SPEC_DRAFT;
        else return INVALID("speculative", "'speculative' must be 'none', 'ngram' or 'draft'");
    }
    bool present;
    double v = 0;
    if (!get_integer(root, "speculative_k", 0, LLM_SPEC_MAX_K, &present, &v, err)) return false;
    req->spec_k = (uint32_t)v;
    return true;
}

static bool parse_sampling(const cJSON *root, serve_request *req, serve_error *err)
{
    llm_sampling_params *s = &req->sampling;
    llm_sampling_params_init(s);
    /* OpenAI defaults, not the library's: plain sampling at temperature 1. */
    s->temperature = 1.0f;
    s->top_k = 0;
    s->top_p = 1.0f;
    s->min_p = 0.0f;
    bool present;
    double v;
    if (!get_number(root, "temperature", 0, 2, &present, &v, err)) return false;
    if (present) s->temperature = (float)v;
    if (!get_number(root, "top_p", 0, 1, &present, &v, err)) return false;
    if (present) s->top_p = v > 0 ? (float)v : 1e-6f;
    if (!get_integer(root, "top_k", 0, 1 << 20, &present, &v, err)) return false;
    if (present) s->top_k = (int32_t)v;
    if (!get_number(root, "min_p", 0, 1, &present, &v, err)) return false;
    if (present) s->min_p = (float)v;
    if (!get_number(root, "presence_penalty", -2, 2, &present, &v, err)) return false;
    if (present) s->presence_penalty = (float)v;
    if (!get_number(root, "frequency_penalty", -2, 2, &present, &v, err)) return false;
    if (present) s->frequency_penalty = (float)v;
    if (!get_number(root, "repeat_penalty", 1e-3, 100, &present, &v, err)) return false;
    if (present) s->repeat_penalty = (float)v;
    if (!get_integer(root, "repeat_last_n", -1, 1 << 20, &present, &v, err)) return false;
    if (present) s->repeat_last_n = (int32_t)v;
    if (!get_integer(root, "min_tokens", 0, 1 << 20, &present, &v, err)) return false;
    if (present) s->min_tokens = (uint32_t)v;
    const cJSON *seed = field(root, "seed");
    if (seed) {
        if (!cJSON_IsNumber(seed) || seed->valuedouble != floor(seed->valuedouble))
            return INVALID("seed", "'seed' must be an integer");
        /* Converting a double outside the target's range is undefined. */
        if (!(seed->valuedouble >= -0x1p63 && seed->valuedouble < 0x1p64))
            return INVALID("seed", "'seed' must be between -2^63 and 2^64 - 1");
        /* Negative seeds are valid in OpenAI's API; keep their bits. */
        s->seed = seed->valuedouble < 0 ? (uint64_t)(int64_t)seed->valuedouble
                                        : (uint64_t)seed->valuedouble;
        req->has_seed = true;
    }
    return true;
}

static bool parse_root(const cJSON *root, bool chat, const serve_limits *limits,
                       serve_request *req, serve_error *err)
{
    if (!cJSON_IsObject(root)) return INVALID(NULL, "the request body must be a JSON object");
    req->chat = chat;
    const cJSON *model = field(root, "model");
    if (model && !cJSON_IsString(model)) return INVALID("model", "'model' must be a string");
    if (model && !(req->model = serve_strdup(model->valuestring))) return OUT_OF_MEMORY();
    if (chat ? !parse_messages(root, req, err) : !parse_prompt(root, limits, req, err)) return false;
    if (!get_bool(root, "stream", &req->stream, err)) return false;
    const cJSON *opts = field(root, "stream_options");
    if (opts) {
        if (!cJSON_IsObject(opts)) return INVALID("stream_options", "'stream_options' must be an object");
        if (!get_bool(opts, "include_usage", &req->include_usage, err)) return false;
    }
    bool present;
    double v;
    const char *max_name = chat && field(root, "max_completion_tokens") ? "max_completion_tokens"
                                                                        : "max_tokens";
    if (!get_integer(root, max_name, 0, 1e12, &present, &v, err)) return false;
    if (present) {
        if (v > limits->max_tokens_limit)
            return INVALID(max_name, "'%s' is %.0f, more than this server's limit of %u",
                           max_name, v, limits->max_tokens_limit);
        if (v < 1) return INVALID(max_name, "'%s' must be at least 1", max_name);
        req->has_max_tokens = true;
        req->max_tokens = (uint32_t)v;
    }
    if (!get_integer(root, "n", 1, limits->max_n, &present, &v, err)) return false;
    req->n = present ? (uint32_t)v : 1;
    if (chat) {
        if (!get_bool(root, "logprobs", &req->logprobs, err)) return false;
        if (!get_integer(root, "top_logprobs", 0, SERVE_MAX_TOP_LOGPROBS, &present, &v, err))
            return false;
        if (present) {
            if (!req->logprobs)
                return INVALID("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
            req->top_logprobs = (uint32_t)v;
        }
    } else {
        /* Completions: logprobs is the number of alternatives (0..5 in OpenAI's API). */
        if (field(root, "logprobs") && cJSON_IsBool(field(root, "logprobs")))
            return INVALID("logprobs", "'logprobs' must be an integer");
        if (!get_integer(root, "logprobs", 0, SERVE_MAX_TOP_LOGPROBS, &present, &v, err))
            return false;
        if (present) {
            req->logprobs = true;
            req->top_logprobs = (uint32_t)v;
        }
        if (!get_bool(root, "echo", &req->echo, err)) return false;
    }
    if (!get_bool(root, "ignore_eos", &req->ignore_eos, err)) return false;
    if (!serve_parse_constraint(root, req, err))
        return false;
    if (chat && !serve_parse_tools(root, req, err))
        return false;
    if (req->constraint != SERVE_CONSTRAINT_NONE && serve_request_uses_tools(req) &&
        req->tool_choice != SERVE_TOOL_CHOICE_AUTO)
        return INVALID("tool_choice",
                       "'tool_choice' '%s' constrains the output to tool calls; it cannot be "
                       "combined with '%s'",
                       req->tool_choice == SERVE_TOOL_CHOICE_REQUIRED ? "required" : "function",
                       req->constraint_param);
    if (serve_request_uses_tools(req) && req->logprobs)
        return INVALID("logprobs", "'logprobs' is not supported with 'tools'");
    return parse_stop(root, req, err) && parse_sampling(root, req, err) &&
           parse_logit_bias(root, limits, req, err) && parse_spec(root, req, err);
}

bool serve_request_parse(const char *body, size_t len, bool chat, const serve_limits *limits,
                         serve_request *out, serve_error *err)
{
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return INVALID(NULL, "the request body is not valid JSON");
    bool ok = parse_root(root, chat, limits, out, err);
    cJSON_Delete(root);
    if (!ok) serve_request_free(out);
    return ok;
}

void serve_request_params(const serve_request *req, uint32_t max_new_tokens,
                          const char **stop_ptrs, llm_sampling_params *sampling,
                          llm_request_params *params)
{
    *sampling = req->sampling;
    sampling->logit_bias = req->logit_bias;
    sampling->n_logit_bias = req->n_logit_bias;
    llm_request_params_init(params);
    params->sampling = sampling;
    params->max_new_tokens = max_new_tokens;
    params->ignore_eos = req->ignore_eos;
    params->logprobs = req->logprobs;
    params->top_logprobs = req->top_logprobs;
    for (size_t i = 0; i < req->n_stop; i++) stop_ptrs[i] = req->stop[i];
    params->stop_strings = req->n_stop ? stop_ptrs : NULL;
    params->n_stop_strings = req->n_stop;
    params->spec_mode = req->spec_mode;
    params->spec_k = req->spec_k;
    params->n_samples = req->n;
}
