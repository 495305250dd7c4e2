#include "logprobs_json.h"

#include "json_out.h"

/* Text of one token on its own, for logprobs; NULL when out of memory. */
static cJSON *token_text(const llm_model *model, llm_token token, cJSON **bytes_out)
{
    char buf[256];
    size_t n = 0;
    if (llm_detokenize(model, &token, 1, LLM_DETOKENIZE_SPECIAL, buf, sizeof buf, &n) != LLM_OK)
        n = 0, buf[0] = '\0';
    bool ok = true;
    if (bytes_out) {
        *bytes_out = cJSON_CreateArray();
        for (size_t i = 0; i < n && *bytes_out; i++)
            push_item(*bytes_out, cJSON_CreateNumber((unsigned char)buf[i]), &ok);
        if (!*bytes_out) ok = false;
    }
    cJSON *text = ok ? cJSON_CreateString(buf) : NULL;
    if (!text && bytes_out) {
        cJSON_Delete(*bytes_out);
        *bytes_out = NULL;
    }
    return text;
}

cJSON *chat_logprob_entry(const llm_model *model, const held_token *tok)
{
    bool ok = true;
    cJSON *entry = cJSON_CreateObject();
    cJSON *bytes = NULL;
    put_item(entry, "token", token_text(model, tok->token, &bytes), &ok);
    put_number(entry, "logprob", tok->logprob, &ok);
    put_item(entry, "bytes", bytes, &ok);
    cJSON *top = put_array(entry, "top_logprobs", &ok);
    for (uint32_t i = 0; i < tok->n_top && ok; i++) {
        cJSON *alt = cJSON_CreateObject();
        bytes = NULL;
        put_item(alt, "token", token_text(model, tok->top_tokens[i], &bytes), &ok);
        put_number(alt, "logprob", tok->top_logprobs[i], &ok);
        put_item(alt, "bytes", bytes, &ok);
        push_item(top, alt, &ok);
    }
    if (ok) return entry;
    cJSON_Delete(entry);
    return NULL;
}

/* NULL when out of memory. */
cJSON *completion_logprobs_new(void)
{
    bool ok = true;
    cJSON *lp = cJSON_CreateObject();
    put_array(lp, "tokens", &ok);
    put_array(lp, "token_logprobs", &ok);
    put_array(lp, "top_logprobs", &ok);
    put_array(lp, "text_offset", &ok);
    if (ok) return lp;
    cJSON_Delete(lp);
    return NULL;
}

bool completion_logprobs_add(const llm_model *model, cJSON *lp, const held_token *tok, size_t offset)
{
    bool ok = true;
    push_item(cJSON_GetObjectItem(lp, "tokens"), token_text(model, tok->token, NULL), &ok);
    push_item(cJSON_GetObjectItem(lp, "token_logprobs"), cJSON_CreateNumber(tok->logprob), &ok);
    cJSON *top = cJSON_CreateObject();
    for (uint32_t i = 0; i < tok->n_top && top && ok; i++) {
        cJSON *name = token_text(model, tok->top_tokens[i], NULL);
        if (!name) ok = false;
        else if (!cJSON_GetObjectItemCaseSensitive(top, name->valuestring))
            put_number(top, name->valuestring, tok->top_logprobs[i], &ok);
        cJSON_Delete(name);
    }
    push_item(cJSON_GetObjectItem(lp, "top_logprobs"), top, &ok);
    push_item(cJSON_GetObjectItem(lp, "text_offset"), cJSON_CreateNumber((double)offset), &ok);
    return ok;
}
