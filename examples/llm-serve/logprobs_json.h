/* The OpenAI JSON of token log-probabilities: chat entries and the
 * completions object of arrays. Every function returns NULL or false when
 * out of memory. */
#ifndef LLM_SERVE_LOGPROBS_JSON_H
#define LLM_SERVE_LOGPROBS_JSON_H

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "llm.h"
#include "request.h"

/* A generated token whose log-probabilities wait until its text is sent:
 * text held back for a possible stop string may never be sent, and then
 * neither may the tokens it came from. */
typedef struct held_token {
    size_t start; /* characters of the sample's decoded text before this token's */
    llm_token token;
    float logprob;
    uint32_t n_top;
    llm_token top_tokens[SERVE_MAX_TOP_LOGPROBS];
    float top_logprobs[SERVE_MAX_TOP_LOGPROBS];
} held_token;

cJSON *chat_logprob_entry(const llm_model *model, const held_token *tok);
cJSON *completion_logprobs_new(void);
bool completion_logprobs_add(const llm_model *model, cJSON *lp, const held_token *tok,
                             size_t offset);

#endif
