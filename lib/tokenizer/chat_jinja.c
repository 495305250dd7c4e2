/* Chat templates run as Jinja: the template a model ships
 * (tokenizer.chat_template) rendered by lib/jinja with the variables
 * transformers passes (messages, tools, documents, add_generation_prompt,
 * bos_token and eos_token as text, then the caller's extra variables), so
 * the prompt is the one the model was trained on. The built-in families in
 * chat.c remain for templates given by family name. */
#define LLMI_TOKENIZER_INTERNAL
#include "jinja/jinja.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <string.h>

/* A built-in family's name instead of template text. */
static bool is_family_name(const char *tmpl) {
    return strcmp(tmpl, "chatml") == 0 || strcmp(tmpl, "llama3") == 0;
}

/* bos_token / eos_token: the token's text, or nothing (undefined in the
 * template, as transformers leaves a model's missing special token). */
static llm_status add_special(cJSON *vars, const llmi_tokenizer *t, const char *name,
                              llm_token id) {
    if (id == LLM_TOKEN_NONE || cJSON_GetObjectItemCaseSensitive(vars, name))
        return LLM_OK;
    size_t len = 0;
    const char *s = llmi_tokenizer_token_text(t, id, &len);
    if (!s)
        return LLM_OK;
    char *copy = llmi_strndup(s, len);
    if (!copy)
        return llmi_oom("chat: special token text");
    cJSON *v = cJSON_CreateString(copy);
    llmi_free(copy);
    if (!v || !cJSON_AddItemToObject(vars, name, v)) {
        cJSON_Delete(v);
        return llmi_oom("chat: template variables");
    }
    return LLM_OK;
}

/* Python's str.strip() bounds of s[0..n) as [*b, *e) (ASCII whitespace
 * and the common Unicode spaces). */
static void strip_bounds(const char *s, size_t n, size_t *b, size_t *e) {
    static const char *const wide[] = {"\xc2\x85", "\xc2\xa0", "\xe2\x80\xa8", "\xe2\x80\xa9",
                                       "\xe3\x80\x80"};
    *b = 0;
    *e = n;
    for (bool moved = true; moved && *b < *e;) {
        moved = false;
        unsigned char ch = (unsigned char)s[*b];
        if (ch == ' ' || (ch >= 0x09 && ch <= 0x0d) || (ch >= 0x1c && ch <= 0x1f)) {
            ++*b;
            moved = true;
        }
        for (size_t k = 0; !moved && k < sizeof wide / sizeof *wide; k++) {
            size_t l = strlen(wide[k]);
            if (*e - *b >= l && memcmp(s + *b, wide[k], l) == 0) {
                *b += l;
                moved = true;
            }
        }
    }
    for (bool moved = true; moved && *e > *b;) {
        moved = false;
        unsigned char ch = (unsigned char)s[*e - 1];
        if (ch == ' ' || (ch >= 0x09 && ch <= 0x0d) || (ch >= 0x1c && ch <= 0x1f)) {
            --*e;
            moved = true;
        }
        for (size_t k = 0; !moved && k < sizeof wide / sizeof *wide; k++) {
            size_t l = strlen(wide[k]);
            if (*e - *b >= l && memcmp(s + *e - l, wide[k], l) == 0) {
                *e -= l;
                moved = true;
            }
        }
    }
}

/* transformers' continue_final_message: the text ends right after the
 * last occurrence of the final message's stripped content (its last text
 * part when the content is a list of parts), or of the whole content when
 * the template kept its trailing whitespace. */
static llm_status cut_after_final(const cJSON *vars, const char *text, size_t *len) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(vars, "messages");
    const cJSON *last = NULL, *content = NULL;
    for (const cJSON *m = msgs ? msgs->child : NULL; m; m = m->next)
        last = m;
    if (last)
        content = cJSON_GetObjectItemCaseSensitive(last, "content");
    if (cJSON_IsArray(content)) {
        const cJSON *part = NULL;
        for (const cJSON *p = content->child; p; p = p->next)
            if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "text")))
                part = cJSON_GetObjectItemCaseSensitive(p, "text");
        content = part;
    }
    if (!cJSON_IsString(content))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "chat: continue_final_message needs a last message whose content is a "
                          "string or has a text part");
    const char *s = content->valuestring;
    size_t b, e;
    strip_bounds(s, strlen(s), &b, &e);
    size_t n = e - b;
    size_t full = strlen(s);
    for (size_t i = *len + 1; i-- > 0;)
        if (i + n <= *len && memcmp(text + i, s + b, n) == 0) {
            /* the message's trailing spaces stay where the template kept
             * them (and the message has no leading ones) */
            bool kept = b == 0 && i + full <= *len && memcmp(text + i, s, full) == 0;
            *len = i + (kept ? full : n);
            return LLM_OK;
        }
    return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                      "chat: continue_final_message is set but the final message does not appear "
                      "in the rendered text");
}

/* Renders `tmpl` with `vars` (bos/eos are added to it) into the caller's
 * buffer; with `cut`, only up to the end of the final message. */
static llm_status render(const llmi_tokenizer *t, const char *tmpl, cJSON *vars, bool cut,
                         char *buf, size_t cap, size_t *n_out) {
    LLMI_TRY(add_special(vars, t, "bos_token", t->bos));
    LLMI_TRY(add_special(vars, t, "eos_token", t->eos));
    char *text = NULL;
    size_t len = 0;
    LLMI_TRY(llmi_jinja_render(tmpl, strlen(tmpl), vars, NULL, -1, &text, &len));
    llm_status st = cut ? cut_after_final(vars, text, &len) : LLM_OK;
    if (st != LLM_OK) {
        llmi_free(text);
        return st;
    }
    text[len] = '\0';
    *n_out = len + 1;
    if (len >= cap) {
        llmi_free(text);
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL, "chat: %zu bytes and the NUL do not fit in %zu",
                          len, cap);
    }
    memcpy(buf, text, len + 1);
    llmi_free(text);
    *n_out = len;
    return LLM_OK;
}

static llm_status set_bool(cJSON *vars, const char *name, bool v) {
    if (!cJSON_AddBoolToObject(vars, name, v))
        return llmi_oom("chat: template variables");
    return LLM_OK;
}

llm_status llmi_chat_apply(const llmi_tokenizer *t, const llm_chat_message *msgs, size_t n,
                           bool add_generation_prompt, char *buf, size_t cap, size_t *n_out) {
    if (!t || !n_out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: NULL model or length");
    *n_out = 0;
    if (!buf && cap > 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: buffer is NULL");
    if (!msgs && n > 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: messages is NULL");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: message %zu has a NULL %s", i,
                              msgs[i].role ? "content" : "role");
        size_t lr = strlen(msgs[i].role), lc = strlen(msgs[i].content);
        size_t br = llmi_utf8_valid_prefix(msgs[i].role, lr);
        size_t bc = llmi_utf8_valid_prefix(msgs[i].content, lc);
        if (br != lr || bc != lc)
            return llmi_error(LLM_ERR_INVALID_UTF8,
                              "chat: message %zu at byte %zu is not valid UTF-8", i,
                              br != lr ? br : bc);
    }
    const char *tmpl = t->chat_template;
    if (!tmpl)
        return llmi_error(LLM_ERR_UNSUPPORTED, "the model has no chat template");
    if (is_family_name(tmpl))
        return llmi_chat_apply_builtin(t, tmpl, msgs, n, add_generation_prompt, buf, cap, n_out);
    cJSON *vars = cJSON_CreateObject(), *list = cJSON_CreateArray();
    llm_status st = vars && list && cJSON_AddItemToObject(vars, "messages", list)
                        ? LLM_OK
                        : llmi_oom("chat: template variables");
    if (st != LLM_OK)
        cJSON_Delete(list);
    for (size_t i = 0; st == LLM_OK && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddItemToArray(list, m) || /* the list owns m from here */
            !cJSON_AddStringToObject(m, "role", msgs[i].role) ||
            !cJSON_AddStringToObject(m, "content", msgs[i].content))
            st = llmi_oom("chat: template variables");
    }
    /* transformers passes tools and documents as None when there are none */
    if (st == LLM_OK &&
        (!cJSON_AddNullToObject(vars, "tools") || !cJSON_AddNullToObject(vars, "documents")))
        st = llmi_oom("chat: template variables");
    if (st == LLM_OK)
        st = set_bool(vars, "add_generation_prompt", add_generation_prompt);
    if (st == LLM_OK)
        st = render(t, tmpl, vars, false, buf, cap, n_out);
    cJSON_Delete(vars);
    return st;
}

/* Parses an optional JSON argument of the given shape. */
static llm_status parse_json(const char *what, const char *text, bool array, cJSON **out) {
    *out = NULL;
    if (!text)
        return LLM_OK;
    size_t len = strlen(text), bad = llmi_utf8_valid_prefix(text, len);
    if (bad != len)
        return llmi_error(LLM_ERR_INVALID_UTF8, "chat: %s is not valid UTF-8 at byte %zu", what,
                          bad);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len + 1, &end, true); /* the NUL ends it */
    if (!j)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: %s is not valid JSON (at byte %zu)",
                          what, end ? (size_t)(end - text) : (size_t)0);
    if (array ? !cJSON_IsArray(j) : !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: %s must be a JSON %s", what,
                          array ? "array" : "object");
    }
    *out = j;
    return LLM_OK;
}

/* Each message must be an object with a string role. */
static llm_status check_messages(const cJSON *msgs) {
    size_t i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
        if (!cJSON_IsString(role))
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "chat: message %zu must be an object with a string \"role\"", i);
    }
    return LLM_OK;
}

/* Moves *item into vars under `name` (*item = NULL: vars owns it or it is
 * freed). */
static llm_status put(cJSON *vars, const char *name, cJSON **item) {
    cJSON *it = *item;
    *item = NULL;
    if (it && !cJSON_AddItemToObject(vars, name, it)) {
        cJSON_Delete(it);
        return llmi_oom("chat: template variables");
    }
    return LLM_OK;
}

/* A built-in family (the template is only its name) renders plain
 * {role, content} messages, nothing else. */
static llm_status builtin_from_json(const llmi_tokenizer *t, const char *tmpl, const cJSON *msgs,
                                    const llm_chat_params *p, char *buf, size_t cap,
                                    size_t *n_out) {
    if (p->tools_json || p->documents_json || p->continue_final_message)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "chat: the built-in \"%s\" template takes no tools, documents or "
                          "continue_final_message",
                          tmpl);
    size_t n = (size_t)cJSON_GetArraySize(msgs), i = 0;
    llm_chat_message *m = llmi_calloc(n ? n : 1, sizeof *m);
    if (!m)
        return llmi_oom("chat: messages");
    for (const cJSON *e = msgs->child; e; e = e->next, i++) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(content)) {
            llmi_free(m);
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "chat: the built-in \"%s\" template needs string contents "
                              "(message %zu)",
                              tmpl, i);
        }
        m[i].role = cJSON_GetObjectItemCaseSensitive(e, "role")->valuestring;
        m[i].content = content->valuestring;
    }
    llm_status st =
        llmi_chat_apply_builtin(t, tmpl, m, n, p->add_generation_prompt, buf, cap, n_out);
    llmi_free(m);
    return st;
}

llm_status llmi_chat_apply_json(const llmi_tokenizer *t, const llm_chat_params *p, char *buf,
                                size_t cap, size_t *n_out) {
    *n_out = 0;
    const char *tmpl = p->template_text;
    if (!tmpl && p->template_name) {
        tmpl = llmi_tokenizer_chat_template_named(t, p->template_name);
        if (!tmpl)
            return llmi_error(LLM_ERR_NOT_FOUND, "chat: the model has no chat template named '%s'",
                              p->template_name);
    }
    /* transformers picks the "tool_use" template for a call with tools */
    if (!tmpl && p->tools_json)
        tmpl = llmi_tokenizer_chat_template_named(t, "tool_use");
    if (!tmpl)
        tmpl = t->chat_template;
    if (!tmpl)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "the model has no chat template; give one in template_text");
    if (!p->messages_json)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llm_chat_apply: messages_json is NULL");
    cJSON *vars = cJSON_CreateObject(), *msgs = NULL, *tools = NULL, *docs = NULL, *extra = NULL;
    llm_status st = vars ? LLM_OK : llmi_oom("chat: template variables");
    if (st == LLM_OK)
        st = parse_json("messages_json", p->messages_json, true, &msgs);
    if (st == LLM_OK)
        st = check_messages(msgs);
    if (st == LLM_OK)
        st = parse_json("tools_json", p->tools_json, true, &tools);
    if (st == LLM_OK)
        st = parse_json("documents_json", p->documents_json, true, &docs);
    if (st == LLM_OK)
        st = parse_json("variables_json", p->variables_json, false, &extra);
    static const char *const reserved[] = {"messages", "tools", "documents",
                                           "add_generation_prompt"};
    for (size_t i = 0; st == LLM_OK && extra && i < 4; i++)
        if (cJSON_GetObjectItemCaseSensitive(extra, reserved[i]))
            st = llmi_error(LLM_ERR_INVALID_ARGUMENT,
                            "chat: variables_json may not set \"%s\" (it has its own field)",
                            reserved[i]);
    /* transformers passes tools and documents as None when there are none */
    if (st == LLM_OK && !tools && !(tools = cJSON_CreateNull()))
        st = llmi_oom("chat: template variables");
    if (st == LLM_OK && !docs && !(docs = cJSON_CreateNull()))
        st = llmi_oom("chat: template variables");
    if (st == LLM_OK)
        st = put(vars, "messages", &msgs);
    if (st == LLM_OK)
        st = put(vars, "tools", &tools);
    if (st == LLM_OK)
        st = put(vars, "documents", &docs);
    if (st == LLM_OK)
        st = set_bool(vars, "add_generation_prompt", p->add_generation_prompt);
    /* the caller's variables last: they may override bos_token/eos_token */
    while (st == LLM_OK && extra && extra->child) {
        cJSON *item = cJSON_DetachItemViaPointer(extra, extra->child);
        char *key = llmi_strdup(item->string ? item->string : "");
        st = key ? put(vars, key, &item) : llmi_oom("chat: template variables");
        cJSON_Delete(item);
        llmi_free(key);
    }
    if (st == LLM_OK && p->continue_final_message && p->add_generation_prompt)
        st =
            llmi_error(LLM_ERR_INVALID_ARGUMENT,
                       "chat: continue_final_message and add_generation_prompt exclude each other");
    if (st == LLM_OK && is_family_name(tmpl))
        st = builtin_from_json(t, tmpl, cJSON_GetObjectItemCaseSensitive(vars, "messages"), p, buf,
                               cap, n_out);
    else if (st == LLM_OK)
        st = render(t, tmpl, vars, p->continue_final_message, buf, cap, n_out);
    cJSON_Delete(vars);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(docs);
    cJSON_Delete(extra);
    return st;
}
