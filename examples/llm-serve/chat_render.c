#include "chat_render.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

/* The template that renders this request: --chat-template's, else the
 * model's ("tool_use" for a request with tools, when the model has one, as
 * transformers chooses). NULL when the model has none. */
static const char *template_text(const server *srv, bool tools) {
    if (srv->chat_template)
        return srv->chat_template;
    const char *text = NULL;
    if (tools && llm_model_chat_template(srv->model, "tool_use", &text) == LLM_OK && text)
        return text;
    if (llm_model_chat_template(srv->model, NULL, &text) != LLM_OK)
        return NULL;
    return text;
}

/* The messages with the tools' preamble in the system message (a new first
 * message when there is none). NULL when out of memory. */
static char *messages_with_preamble(const serve_request *req, const tool_format *fmt) {
    char *preamble = tool_preamble(req, fmt);
    cJSON *msgs = preamble ? cJSON_Parse(req->messages_json) : NULL;
    cJSON *first = cJSON_GetArrayItem(msgs, 0);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(first, "role");
    bool ok = msgs != NULL;
    if (ok && cJSON_IsString(role) && !strcmp(role->valuestring, "system")) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(first, "content");
        const char *old = cJSON_IsString(content) ? content->valuestring : "";
        size_t n = strlen(old) + strlen(preamble) + 3;
        char *joined = serve_malloc(n);
        ok = joined != NULL;
        if (ok) {
            strcpy(joined, old);
            if (old[0])
                strcat(joined, "\n\n");
            strcat(joined, preamble);
            cJSON *s = cJSON_CreateString(joined);
            ok = s && cJSON_ReplaceItemInObjectCaseSensitive(first, "content", s);
            if (!ok)
                cJSON_Delete(s);
        }
        free(joined);
    } else if (ok) {
        cJSON *sys = cJSON_CreateObject();
        ok = sys && cJSON_AddStringToObject(sys, "role", "system") &&
             cJSON_AddStringToObject(sys, "content", preamble) &&
             cJSON_InsertItemInArray(msgs, 0, sys);
        if (!ok)
            cJSON_Delete(sys);
    }
    char *text = ok ? cJSON_PrintUnformatted(msgs) : NULL;
    cJSON_Delete(msgs);
    free(preamble);
    return text;
}

char *chat_render(server *srv, const serve_request *req, const tool_format **fmt,
                  serve_error *err) {
    bool tools = serve_request_uses_tools(req);
    const char *tmpl = template_text(srv, tools);
    /* A template that never mentions `tools` would drop them silently. */
    bool template_renders_tools = tmpl && strstr(tmpl, "tools");
    *fmt = tool_format_detect(template_renders_tools ? tmpl : NULL);
    llm_chat_params params;
    llm_chat_params_init(&params);
    params.template_text = srv->chat_template;
    params.messages_json = req->messages_json;
    char *with_preamble = NULL;
    if (tools && template_renders_tools) {
        params.tools_json = req->tools_json;
    } else if (tools) {
        with_preamble = messages_with_preamble(req, *fmt);
        if (!with_preamble) {
            serve_error_out_of_memory(err, "while rendering the chat template");
            return NULL;
        }
        params.messages_json = with_preamble;
    }
    size_t need = 0;
    char *text = NULL;
    llm_status st = llm_chat_apply(srv->model, &params, NULL, 0, &need);
    if (st == LLM_ERR_BUFFER_TOO_SMALL) {
        text = serve_malloc(need);
        st = text ? llm_chat_apply(srv->model, &params, text, need, &need) : LLM_ERR_OUT_OF_MEMORY;
    }
    free(with_preamble);
    if (st != LLM_OK) {
        free(text);
        if (st == LLM_ERR_OUT_OF_MEMORY) {
            serve_error_out_of_memory(err, "while rendering the chat template");
            return NULL;
        }
        bool server_fault = st == LLM_ERR_INTERNAL;
        serve_error_set(err, server_fault ? 500 : 400,
                        server_fault ? "server_error" : "invalid_request_error", "messages",
                        "cannot apply the chat template: %s", llm_last_error());
        return NULL;
    }
    return text;
}
