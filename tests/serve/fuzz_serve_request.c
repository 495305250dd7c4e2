/* libFuzzer target: request JSON -> generation settings (request.c), the
 * part of llm-serve that reads untrusted bytes before any model work. The
 * first byte picks the endpoint (chat or completions). A chat request with
 * tools also has its last message read as a model's reply holding tool
 * calls (tool_parse.c), in each format, and its tool-call grammar built. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"
#include "tool_parse.h"
#include "tools.h"

static void check_tools(const serve_request *req) {
    const char *reply = req->messages[req->n_messages - 1].content;
    static const char *const formats[] = {"hermes", "llama3"};
    for (size_t f = 0; f < sizeof formats / sizeof *formats; f++) {
        const tool_format *fmt = tool_format_find(formats[f]);
        tool_reply r;
        if (!fmt)
            abort();
        if (tool_reply_parse(reply, fmt, req->tools_json, &r)) {
            /* Content is all of the reply or a prefix of it. */
            if (!r.n_calls && (!r.content || strcmp(r.content, reply)))
                abort();
            if (r.content && strncmp(r.content, reply, strlen(r.content)))
                abort();
            for (size_t i = 0; i < r.n_calls; i++) {
                cJSON *args = cJSON_Parse(r.calls[i].arguments);
                if (!cJSON_IsObject(args) || strlen(r.calls[i].id) != 29)
                    abort();
                cJSON_Delete(args);
            }
        }
        tool_reply_free(&r);
    }
    if (req->tool_choice == SERVE_TOOL_CHOICE_REQUIRED ||
        req->tool_choice == SERVE_TOOL_CHOICE_NAMED) {
        serve_error err = {0};
        char *grammar = tool_grammar_text(req, tool_format_find("hermes"), &err);
        if (!grammar && err.http_status != 400 && err.http_status != 503)
            abort();
        free(grammar);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bool chat = data[0] & 1;
    const serve_limits limits = {.max_tokens_limit = 4096, .max_n = 16, .n_vocab = 49152};
    serve_request req;
    serve_error err;
    if (!serve_request_parse((const char *)data + 1, size - 1, chat, &limits, &req, &err)) {
        if (err.http_status != 400 || !err.message[0] || strlen(err.param) >= sizeof err.param)
            abort();
        return 0;
    }
    if (req.n < 1 || req.n > limits.max_n || req.n_stop > SERVE_MAX_STOP ||
        (req.has_max_tokens && (req.max_tokens < 1 || req.max_tokens > limits.max_tokens_limit)) ||
        req.top_logprobs > SERVE_MAX_TOP_LOGPROBS || (chat ? !req.n_messages : !req.prompt))
        abort();
    for (size_t i = 0; i < req.n_logit_bias; i++)
        if (req.logit_bias[i].token < 0 || (uint32_t)req.logit_bias[i].token >= limits.n_vocab)
            abort();
    const char *stops[SERVE_MAX_STOP];
    llm_sampling_params sampling;
    llm_request_params params;
    serve_request_params(&req, 16, stops, &sampling, &params);
    for (size_t i = 0; i < params.n_stop_strings; i++)
        if (!params.stop_strings[i][0]) abort(); /* the library refuses empty stops */
    if (req.tools_json)
        check_tools(&req);
    serve_request_free(&req);
    return 0;
}
