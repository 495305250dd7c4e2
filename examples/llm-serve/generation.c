#include "generation.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "alloc.h"
#include "chat_render.h"
#include "json_out.h"
#include "logprobs_json.h"
#include "tool_parse.h"

#define WAIT_SLICE_MS 100
/* Longest time a request waits for its next event before it is given up:
 * the engine always makes progress, so this only ends hung requests. */
#define STALL_LIMIT_MS (10 * 60 * 1000)
/* What a stream ends with when the server runs out of memory in the middle
 * of it: fixed text, since nothing more can be allocated. */
static const char STREAM_OUT_OF_MEMORY_END[] =
    "data: {\"error\":{\"message\":\"out of memory while streaming the response; the "
    "request was cancelled\",\"type\":\"server_error\",\"param\":null,\"code\":"
    "\"out_of_memory\"}}\n\ndata: [DONE]\n\n";

typedef struct sample_out {
    char *text;
    size_t len, cap;
    llm_finish_reason finish;
    cJSON *logprobs; /* chat: array of entries; completions: object of arrays */
    /* Only with logprobs: the library's text stream decoded again here, so
     * that each token's place in it is known even while the library holds
     * its text back. */
    llm_detokenizer *detok;
    char *piece;
    size_t piece_cap;
    size_t decoded_chars; /* characters `detok` produced */
    size_t sent_chars;    /* characters of the answer sent (or collected) */
    held_token *held;
    size_t n_held, cap_held;
    bool made_calls;     /* the reply held tool calls */
    size_t content_sent; /* with tools, streaming: bytes of `text` sent as content */
} sample_out;

struct generation {
    server *srv;
    const char *model_name; /* the LoRA adapter's, or NULL: the server's */
    serve_request req;
    job *job;
    llm_token *prompt;
    size_t n_prompt;
    char id[48];
    long long created;
    const tool_format *tool_format; /* with tools: how the reply writes calls */
    grammar_ref *grammar;           /* until the job owns it */
    double t_submit, t_first, t_last;
    double next_client_check;
    uint32_t n_generated;
    uint32_t n_finished;
    sample_out *samples;
    size_t echo_chars; /* text_offset of the first generated character */
    int client_fd;
    bool submitted;
    /* streaming */
    int phase; /* 0 role chunks, 1 tokens, 2 usage, 3 [DONE] sent */
    char *pending;
    size_t pending_len, pending_off;
    /* Out of memory mid-stream: STREAM_OUT_OF_MEMORY_END is sent from here on. */
    bool stream_failed;
    size_t failed_end_off;
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t utf8_chars(const char *s, size_t n)
{
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((unsigned char)s[i] & 0xC0) != 0x80;
    return chars;
}

static bool append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = (*cap ? *cap * 2 : 256) + n;
        char *b = serve_realloc(*buf, c);
        if (!b) return false;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

static bool tokenize(server *srv, const char *text, uint32_t flags, llm_token **out, size_t *n,
                     serve_error *err)
{
    size_t need = 0;
    size_t len = strlen(text);
    llm_status st = llm_tokenize(srv->model, text, len, flags, NULL, 0, &need);
    *out = NULL;
    if (st == LLM_ERR_BUFFER_TOO_SMALL || st == LLM_OK) {
        *out = serve_malloc((need ? need : 1) * sizeof **out);
        if (!*out) {
            serve_error_out_of_memory(err, "while tokenizing the prompt");
            return false;
        }
        st = llm_tokenize(srv->model, text, len, flags, *out, need, n);
    }
    if (st != LLM_OK) {
        free(*out);
        *out = NULL;
        serve_error_set(err, 400, "invalid_request_error", NULL, "cannot tokenize the prompt: %s",
                        llm_last_error());
        return false;
    }
    return true;
}

static void release_grammar(void *ref) { grammar_ref_release(ref); }

generation *generation_start(server *srv, const char *body, size_t len, bool chat,
                             serve_error *err)
{
    generation *g = serve_calloc(1, sizeof *g);
    if (!g) {
        serve_error_out_of_memory(err, "while starting the request");
        return NULL;
    }
    g->srv = srv;
    g->client_fd = -1;
    if (!serve_request_parse(body, len, chat, &srv->limits, &g->req, err)) {
        free(g);
        return NULL;
    }
    serve_request *req = &g->req;
    if (!req->has_seed) {
        /* OpenAI samples differently on each call unless a seed is given. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        req->sampling.seed = (uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)ts.tv_sec ^
                             (uint64_t)(uintptr_t)g;
    }
    if (req->n_prompt_tokens) {
        g->prompt = serve_malloc(req->n_prompt_tokens * sizeof *g->prompt);
        if (!g->prompt) {
            serve_error_out_of_memory(err, "while copying the prompt");
            goto fail;
        }
        memcpy(g->prompt, req->prompt_tokens, req->n_prompt_tokens * sizeof *g->prompt);
        g->n_prompt = req->n_prompt_tokens;
    } else {
        char *text = chat ? chat_render(srv, req, &g->tool_format, err) : serve_strdup(req->prompt);
        if (!text) {
            if (!chat) serve_error_out_of_memory(err, "while copying the prompt");
            goto fail;
        }
        /* The template already holds the special tokens, as text to parse. */
        bool ok = tokenize(srv, text, LLM_TOKENIZE_ADD_SPECIAL | LLM_TOKENIZE_PARSE_SPECIAL,
                           &g->prompt, &g->n_prompt, err);
        free(text);
        if (!ok) goto fail;
        /* Templates that write bos_token themselves (Llama, Gemma, Mistral)
         * would otherwise start the prompt with two BOS tokens. */
        llm_model_info info = {sizeof info};
        if (chat && g->n_prompt >= 2 && llm_model_get_info(srv->model, &info) == LLM_OK &&
            info.bos != LLM_TOKEN_NONE && g->prompt[0] == info.bos && g->prompt[1] == info.bos) {
            memmove(g->prompt, g->prompt + 1, (g->n_prompt - 1) * sizeof *g->prompt);
            g->n_prompt--;
        }
    }
    if (!g->n_prompt) {
        serve_error_set(err, 400, "invalid_request_error", chat ? "messages" : "prompt",
                        "the prompt is empty");
        goto fail;
    }
    if (g->n_prompt >= srv->max_sequence_tokens) {
        serve_error_set(err, 400, "invalid_request_error", chat ? "messages" : "prompt",
                        "the prompt has %zu tokens; %s holds %u, which must leave room for at "
                        "least one generated token",
                        g->n_prompt,
                        srv->max_sequence_tokens < srv->n_ctx ? "this server's KV cache"
                                                              : "this model's context",
                        srv->max_sequence_tokens);
        err->code = "context_length_exceeded";
        goto fail;
    }
    /* The default fills what is left of the context and of the KV pool, so
     * a request without max_tokens is never refused for its own default. */
    uint32_t room = srv->max_sequence_tokens - (uint32_t)g->n_prompt;
    uint32_t max_new = req->has_max_tokens ? req->max_tokens : room;
    if (max_new > srv->limits.max_tokens_limit) max_new = srv->limits.max_tokens_limit;
    const char *stops[SERVE_MAX_STOP];
    llm_sampling_params sampling;
    llm_request_params params;
    serve_request_params(req, max_new, stops, &sampling, &params);
    if (!serve_request_grammar(srv->grammars, req, g->tool_format, &g->grammar, err))
        goto fail;
    sampling.grammar = g->grammar ? grammar_ref_grammar(g->grammar) : NULL;
    bool unknown_model = false;
    const serve_lora *lora = serve_find_lora(srv, req->model, &unknown_model);
    if (unknown_model) {
        serve_error_set(err, 404, "invalid_request_error", "model",
                        "the model '%s' does not exist: this server has '%s' and its LoRA "
                        "adapters (GET /v1/models)",
                        req->model, srv->model_name);
        err->code = "model_not_found";
        goto fail;
    }
    if (lora) {
        params.adapter = lora->adapter;
        g->model_name = lora->name;
    }
    g->job = job_create(req->n);
    if (g->job && g->grammar) {
        /* The library borrows the grammar until the request is gone. */
        g->job->on_free = release_grammar;
        g->job->on_free_arg = g->grammar;
        g->grammar = NULL;
    }
    g->samples = serve_calloc(req->n, sizeof *g->samples);
    if (!g->job || !g->samples) {
        serve_error_out_of_memory(err, "while starting the request");
        goto fail;
    }
    for (uint32_t i = 0; i < req->n && req->logprobs; i++) {
        sample_out *s = &g->samples[i];
        s->logprobs = chat ? cJSON_CreateArray() : NULL;
        if ((chat && !s->logprobs) || llm_detokenizer_create(srv->model, 0, &s->detok) != LLM_OK) {
            serve_error_out_of_memory(err, "while preparing logprobs");
            goto fail;
        }
    }
    if (!chat && req->echo) g->echo_chars = utf8_chars(req->prompt, strlen(req->prompt));
    static atomic_ullong next_serial;
    snprintf(g->id, sizeof g->id, "%s-%llx%06llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)time(NULL), atomic_fetch_add(&next_serial, 1) & 0xffffff);
    g->created = (long long)time(NULL);
    g->t_submit = now_seconds();
    char msg[256];
    llm_status st = engine_submit(srv->engine, g->job, g->prompt, g->n_prompt, &params, msg,
                                  sizeof msg);
    if (st != LLM_OK) {
        if (st == LLM_ERR_CANCELLED)
            serve_error_set(err, 503, "server_error", NULL, "%s", msg);
        else if (st == LLM_ERR_LIMIT)
            serve_error_set(err, 400, "invalid_request_error", "max_tokens",
                            "the request does not fit this server's KV memory: %s", msg);
        else
            serve_error_set(err, 400, "invalid_request_error", NULL, "%s", msg);
        goto fail;
    }
    g->submitted = true;
    return g;
fail:
    generation_end(g, false);
    return NULL;
}

bool generation_streams(const generation *g) { return g->req.stream; }

void generation_set_client_fd(generation *g, int fd) { g->client_fd = fd; }

static bool client_gone(const generation *g)
{
    if (g->client_fd < 0) return false;
    char c;
    ssize_t n = recv(g->client_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Whether the token of `ev` belongs to the answer: the end-of-turn token
 * that ends a reply is not part of it. */
static bool token_is_content(const job_event *ev)
{
    return ev->token != LLM_TOKEN_NONE && ev->finish_reason != LLM_FINISH_EOS;
}

/* Records a content token of `s` and where its text starts; false when out
 * of memory. */
static bool hold_token(sample_out *s, const job_event *ev)
{
    if (s->n_held == s->cap_held) {
        size_t cap = s->cap_held ? s->cap_held * 2 : 8;
        held_token *h = serve_realloc(s->held, cap * sizeof *h);
        if (!h) return false;
        s->held = h;
        s->cap_held = cap;
    }
    size_t n = 0;
    llm_status st = llm_detokenizer_push(s->detok, ev->token, s->piece, s->piece_cap, &n);
    if (st == LLM_ERR_BUFFER_TOO_SMALL) {
        char *bigger = serve_realloc(s->piece, n); /* n counts the NUL */
        if (!bigger) return false;
        s->piece = bigger;
        s->piece_cap = n;
        st = llm_detokenizer_push(s->detok, ev->token, s->piece, s->piece_cap, &n);
    }
    if (st != LLM_OK) n = 0;
    held_token *h = &s->held[s->n_held++];
    h->start = s->decoded_chars;
    h->token = ev->token;
    h->logprob = ev->logprob;
    h->n_top = ev->n_top < SERVE_MAX_TOP_LOGPROBS ? ev->n_top : SERVE_MAX_TOP_LOGPROBS;
    memcpy(h->top_tokens, ev->top_tokens, h->n_top * sizeof *h->top_tokens);
    memcpy(h->top_logprobs, ev->top_logprobs, h->n_top * sizeof *h->top_logprobs);
    s->decoded_chars += utf8_chars(s->piece, n);
    return true;
}

/* Takes in one event of `s`; sets `*n_out` to how many held tokens, oldest
 * first, now have text in the answer. A token counts from its first
 * character on, so one that straddles the start of a stop string is kept.
 * Only a stop string, a cancel or an error drops held text; after a finish
 * by length or end of turn every token is kept, those with no text of their
 * own too. False when out of memory. */
static bool tokens_with_text(sample_out *s, const job_event *ev, size_t *n_out)
{
    if (token_is_content(ev) && !hold_token(s, ev)) return false;
    s->sent_chars += utf8_chars(ev->text, ev->text_len);
    if (ev->finish_reason == LLM_FINISH_LENGTH || ev->finish_reason == LLM_FINISH_EOS) {
        *n_out = s->n_held;
        return true;
    }
    size_t n = 0;
    while (n < s->n_held && s->held[n].start < s->sent_chars) n++;
    *n_out = n;
    return true;
}

/* Adds the first `n` held tokens of `s` to `lp` (chat: an array of entries;
 * completions: an object of arrays) and forgets them; after a finish the
 * rest are never sent. False when out of memory. */
static bool release_tokens(generation *g, sample_out *s, size_t n, cJSON *lp,
                           llm_finish_reason finish)
{
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        if (g->req.chat)
            push_item(lp, chat_logprob_entry(g->srv->model, &s->held[i]), &ok);
        else
            ok = completion_logprobs_add(g->srv->model, lp, &s->held[i], g->echo_chars + s->held[i].start);
    }
    if (finish != LLM_FINISH_NONE) {
        s->n_held = 0;
    } else if (n) {
        s->n_held -= n;
        memmove(s->held, s->held + n, s->n_held * sizeof *s->held);
    }
    return ok;
}

static const char *finish_name(llm_finish_reason r)
{
    switch (r) {
    case LLM_FINISH_LENGTH: return "length";
    case LLM_FINISH_CANCELLED: return "abort";
    case LLM_FINISH_ERROR: return "error";
    default: return "stop";
    }
}

/* Bookkeeping common to streaming and not: counts, timings, finishes. */
static void account(generation *g, const job_event *ev)
{
    if (token_is_content(ev)) {
        double t = now_seconds();
        if (!g->n_generated) g->t_first = t;
        g->t_last = t;
        g->n_generated++;
    }
    if (ev->finish_reason != LLM_FINISH_NONE) {
        g->n_finished++;
        if (ev->sample_index < g->req.n) g->samples[ev->sample_index].finish = ev->finish_reason;
    }
}

static void put_usage(cJSON *root, const generation *g, bool *ok)
{
    cJSON *u = put_object(root, "usage", ok);
    put_number(u, "prompt_tokens", (double)g->n_prompt, ok);
    put_number(u, "completion_tokens", g->n_generated, ok);
    put_number(u, "total_tokens", (double)(g->n_prompt + g->n_generated), ok);
}

static cJSON *response_head(const generation *g, const char *object, bool *ok)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) *ok = false;
    put_string(root, "id", g->id, ok);
    put_string(root, "object", object, ok);
    put_number(root, "created", (double)g->created, ok);
    put_string(root, "model", g->model_name ? g->model_name : g->srv->model_name, ok);
    put_string(root, "system_fingerprint", g->srv->fingerprint, ok);
    return root;
}

/* Waits for the next event, giving up when the client left or the job
 * failed for lack of memory. The socket is checked every slice even while
 * events keep coming, since a busy request may never wait that long for one. */
static job_event *next_event(generation *g)
{
    double deadline = now_seconds() + STALL_LIMIT_MS / 1000.0;
    for (;;) {
        double t = now_seconds();
        if (t >= g->next_client_check) {
            if (client_gone(g)) return NULL;
            g->next_client_check = t + WAIT_SLICE_MS / 1000.0;
        }
        job_event *ev = job_next(g->job, WAIT_SLICE_MS);
        if (ev) return ev;
        if (job_out_of_memory(g->job)) return NULL;
        if (now_seconds() > deadline) return NULL;
    }
}

/* Takes in one event of a non-streaming request; false when out of memory. */
static bool collect_event(generation *g, const job_event *ev)
{
    sample_out *s = ev->sample_index < g->req.n ? &g->samples[ev->sample_index] : NULL;
    account(g, ev);
    if (!s) return true;
    if (g->req.logprobs) {
        size_t n;
        if (!tokens_with_text(s, ev, &n)) return false;
        if (n && !s->logprobs && !(s->logprobs = completion_logprobs_new())) return false;
        if (!release_tokens(g, s, n, s->logprobs, ev->finish_reason)) return false;
    }
    return !ev->text_len || append(&s->text, &s->len, &s->cap, ev->text, ev->text_len);
}

static void put_choice_text(cJSON *c, const generation *g, const sample_out *s, bool *ok)
{
    const char *prefix = g->req.echo ? g->req.prompt : "";
    size_t plen = strlen(prefix), tlen = s->len;
    char *full = serve_malloc(plen + tlen + 1);
    if (!full) {
        *ok = false;
        return;
    }
    memcpy(full, prefix, plen);
    if (tlen) memcpy(full + plen, s->text, tlen);
    full[plen + tlen] = '\0';
    put_string(c, "text", full, ok);
    free(full);
}

static char *response_body(generation *g)
{
    bool chat = g->req.chat, ok = true;
    cJSON *root = response_head(g, chat ? "chat.completion" : "text_completion", &ok);
    cJSON *choices = put_array(root, "choices", &ok);
    for (uint32_t i = 0; i < g->req.n && ok; i++) {
        sample_out *s = &g->samples[i];
        cJSON *c = cJSON_CreateObject();
        push_item(choices, c, &ok);
        if (!ok) break;
        put_number(c, "index", i, &ok);
        if (chat) {
            cJSON *m = put_object(c, "message", &ok);
            put_string(m, "role", "assistant", &ok);
            bool calls = false;
            if (serve_request_uses_tools(&g->req))
                ok = ok && tool_reply_put(m, s->text, g->tool_format, &g->req, false, 0, &calls);
            else
                put_string(m, "content", s->text ? s->text : "", &ok);
            s->made_calls = calls;
            if (g->req.logprobs) {
                cJSON *lp = put_object(c, "logprobs", &ok);
                put_item(lp, "content", s->logprobs, &ok);
                s->logprobs = NULL;
            } else {
                put_null(c, "logprobs", &ok);
            }
        } else {
            put_choice_text(c, g, s, &ok);
            if (s->logprobs) {
                put_item(c, "logprobs", s->logprobs, &ok);
                s->logprobs = NULL;
            } else if (g->req.logprobs) {
                put_item(c, "logprobs", completion_logprobs_new(), &ok);
            } else {
                put_null(c, "logprobs", &ok);
            }
        }
        put_string(c, "finish_reason", s->made_calls ? "tool_calls" : finish_name(s->finish), &ok);
    }
    put_usage(root, g, &ok);
    char *out = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return out;
}

char *generation_collect(generation *g, serve_error *err)
{
    while (g->n_finished < g->req.n) {
        job_event *ev = next_event(g);
        if (!ev) {
            if (job_out_of_memory(g->job))
                serve_error_out_of_memory(err, "while queueing generated tokens");
            else
                serve_error_set(err, 499, "client_closed", NULL, "the client closed the connection");
            return NULL;
        }
        bool ok = collect_event(g, ev);
        if (ok && ev->finish_reason == LLM_FINISH_ERROR) {
            serve_error_set(err, 500, "server_error", NULL, "generation failed: %s",
                            llm_status_str(ev->status));
            free(ev);
            return NULL;
        }
        free(ev);
        if (!ok) {
            serve_error_out_of_memory(err, "while collecting the response");
            return NULL;
        }
    }
    char *out = response_body(g);
    if (!out) serve_error_out_of_memory(err, "while building the response");
    return out;
}

/* Queues `chunk` (consumed) as one server-sent event; false when out of
 * memory. */
static bool queue_chunk(generation *g, cJSON *chunk, bool built)
{
    char *json = built ? cJSON_PrintUnformatted(chunk) : NULL;
    cJSON_Delete(chunk);
    if (!json) return false;
    size_t cap = g->pending_len + strlen(json) + 9;
    char *buf = serve_realloc(g->pending, cap);
    if (!buf) {
        free(json);
        return false;
    }
    g->pending = buf;
    g->pending_len += (size_t)sprintf(g->pending + g->pending_len, "data: %s\n\n", json);
    free(json);
    return true;
}

static bool queue_raw(generation *g, const char *s)
{
    size_t n = strlen(s);
    char *buf = serve_realloc(g->pending, g->pending_len + n + 1);
    if (!buf) return false;
    g->pending = buf;
    memcpy(g->pending + g->pending_len, s, n + 1);
    g->pending_len += n;
    return true;
}

static cJSON *stream_chunk(generation *g, uint32_t index, cJSON **choice_out, bool *ok)
{
    cJSON *root =
        response_head(g, g->req.chat ? "chat.completion.chunk" : "text_completion", ok);
    cJSON *choices = put_array(root, "choices", ok);
    cJSON *c = cJSON_CreateObject();
    push_item(choices, c, ok);
    put_number(*ok ? c : NULL, "index", index, ok);
    *choice_out = *ok ? c : NULL;
    return root;
}

/* A reply that may hold tool calls: its text is streamed only as far as it
 * cannot be part of a call; the rest, and each call whole in one delta,
 * when it ends (a call is known only once complete). False when out of
 * memory. */
static bool queue_tool_event(generation *g, sample_out *s, const job_event *ev) {
    if (ev->text_len && !append(&s->text, &s->len, &s->cap, ev->text, ev->text_len))
        return false;
    bool ok = true, calls = false;
    cJSON *c, *chunk;
    if (ev->finish_reason == LLM_FINISH_NONE) {
        /* "auto": text that cannot be part of a call goes out as it comes. */
        size_t n = g->req.tool_choice == SERVE_TOOL_CHOICE_AUTO && s->text
                       ? tool_reply_sendable(s->text, s->len, g->tool_format)
                       : 0;
        if (n <= s->content_sent)
            return true;
        char held = s->text[n];
        s->text[n] = '\0';
        chunk = stream_chunk(g, ev->sample_index, &c, &ok);
        put_string(put_object(c, "delta", &ok), "content", s->text + s->content_sent, &ok);
        s->text[n] = held;
        put_null(c, "logprobs", &ok);
        put_null(c, "finish_reason", &ok);
        s->content_sent = n;
        return queue_chunk(g, chunk, ok);
    }
    chunk = stream_chunk(g, ev->sample_index, &c, &ok);
    cJSON *delta = put_object(c, "delta", &ok);
    ok = ok &&
         tool_reply_put(delta, s->text, g->tool_format, &g->req, true, s->content_sent, &calls);
    put_null(c, "logprobs", &ok);
    put_null(c, "finish_reason", &ok);
    if (ok && !cJSON_GetArraySize(delta)) {
        cJSON_Delete(chunk); /* nothing was said */
    } else if (!queue_chunk(g, chunk, ok)) {
        return false;
    }
    ok = true;
    chunk = stream_chunk(g, ev->sample_index, &c, &ok);
    put_object(c, "delta", &ok);
    put_null(c, "logprobs", &ok);
    put_string(c, "finish_reason", calls ? "tool_calls" : finish_name(ev->finish_reason), &ok);
    return queue_chunk(g, chunk, ok);
}

/* Turns one event into chunks; false when out of memory. */
static bool queue_event(generation *g, const job_event *ev)
{
    sample_out *s = ev->sample_index < g->req.n ? &g->samples[ev->sample_index] : NULL;
    account(g, ev);
    if (!s) return true;
    if (serve_request_uses_tools(&g->req))
        return queue_tool_event(g, s, ev);
    size_t n_tokens = 0;
    if (g->req.logprobs && !tokens_with_text(s, ev, &n_tokens)) return false;
    if (ev->text_len || n_tokens) {
        bool ok = true;
        cJSON *c;
        cJSON *chunk = stream_chunk(g, ev->sample_index, &c, &ok);
        if (g->req.chat) put_string(put_object(c, "delta", &ok), "content", ev->text, &ok);
        else put_string(c, "text", ev->text, &ok);
        if (n_tokens) {
            cJSON *lp;
            if (g->req.chat)
                lp = put_array(put_object(c, "logprobs", &ok), "content", &ok);
            else
                lp = put_item(c, "logprobs", completion_logprobs_new(), &ok);
            if (ok && !release_tokens(g, s, n_tokens, lp, ev->finish_reason)) ok = false;
        } else {
            put_null(c, "logprobs", &ok);
        }
        put_null(c, "finish_reason", &ok);
        if (!queue_chunk(g, chunk, ok)) return false;
    }
    if (ev->finish_reason != LLM_FINISH_NONE) {
        bool ok = true;
        cJSON *c;
        cJSON *chunk = stream_chunk(g, ev->sample_index, &c, &ok);
        if (g->req.chat) put_object(c, "delta", &ok);
        else put_string(c, "text", "", &ok);
        put_null(c, "logprobs", &ok);
        put_string(c, "finish_reason", finish_name(ev->finish_reason), &ok);
        if (!queue_chunk(g, chunk, ok)) return false;
    }
    return true;
}

/* The first chunks: the assistant role for chat, the echoed prompt for
 * completions. False when out of memory. */
static bool queue_opening(generation *g)
{
    for (uint32_t i = 0; i < g->req.n && (g->req.chat || g->req.echo); i++) {
        bool ok = true;
        cJSON *c;
        cJSON *chunk = stream_chunk(g, i, &c, &ok);
        if (g->req.chat) {
            cJSON *delta = put_object(c, "delta", &ok);
            put_string(delta, "role", "assistant", &ok);
            put_string(delta, "content", "", &ok);
        } else {
            put_string(c, "text", g->req.prompt, &ok);
        }
        put_null(c, "logprobs", &ok);
        put_null(c, "finish_reason", &ok);
        if (!queue_chunk(g, chunk, ok)) return false;
    }
    return true;
}

/* Out of memory mid-stream: the request is cancelled and the stream ends
 * with an error event and [DONE], written from fixed text. */
static void fail_stream(generation *g)
{
    if (g->n_finished < g->req.n) engine_cancel(g->srv->engine, g->job);
    g->stream_failed = true;
    g->pending_len = g->pending_off = 0;
}

/* Fills `pending` with the next bytes; false at the end or on failure. */
static bool refill(generation *g)
{
    g->pending_len = g->pending_off = 0;
    if (g->phase == 0) {
        if (!queue_opening(g)) {
            fail_stream(g);
            return true;
        }
        g->phase = 1;
        if (g->pending_len) return true;
    }
    if (g->phase == 1) {
        if (g->n_finished < g->req.n) {
            job_event *ev = next_event(g);
            if (!ev) {
                if (job_out_of_memory(g->job)) fail_stream(g);
                return g->stream_failed;
            }
            bool ok = true;
            if (ev->finish_reason == LLM_FINISH_ERROR) {
                char msg[160];
                snprintf(msg, sizeof msg,
                         "data: {\"error\":{\"message\":\"generation failed: %s\",\"type\":"
                         "\"server_error\",\"param\":null,\"code\":null}}\n\n",
                         llm_status_str(ev->status));
                ok = queue_raw(g, msg);
            }
            ok = ok && queue_event(g, ev);
            free(ev);
            if (!ok) fail_stream(g);
            /* An event that completes no character queues nothing; the
             * caller asks again. */
            return true;
        }
        g->phase = 2;
    }
    if (g->phase == 2) {
        if (g->req.include_usage) {
            bool ok = true;
            cJSON *root =
                response_head(g, g->req.chat ? "chat.completion.chunk" : "text_completion", &ok);
            put_array(root, "choices", &ok);
            put_usage(root, g, &ok);
            if (!queue_chunk(g, root, ok)) {
                fail_stream(g);
                return true;
            }
        }
        if (!queue_raw(g, "data: [DONE]\n\n")) {
            fail_stream(g);
            return true;
        }
        g->phase = 3;
        return true;
    }
    return false;
}

static ssize_t send_failed_end(generation *g, char *buf, size_t max)
{
    size_t n = sizeof STREAM_OUT_OF_MEMORY_END - 1 - g->failed_end_off;
    if (n > max) n = max;
    memcpy(buf, STREAM_OUT_OF_MEMORY_END + g->failed_end_off, n);
    g->failed_end_off += n;
    return (ssize_t)n;
}

ssize_t generation_stream_read(generation *g, char *buf, size_t max)
{
    while (g->pending_off >= g->pending_len) {
        if (g->stream_failed) return send_failed_end(g, buf, max);
        if (g->phase == 3) return 0;
        if (!refill(g)) return g->phase == 3 ? 0 : -1;
    }
    size_t n = g->pending_len - g->pending_off;
    if (n > max) n = max;
    memcpy(buf, g->pending + g->pending_off, n);
    g->pending_off += n;
    return (ssize_t)n;
}

void generation_end(generation *g, bool completed)
{
    if (!g) return;
    if (g->submitted && g->n_finished < g->req.n) engine_cancel(g->srv->engine, g->job);
    if (g->submitted && completed) {
        double ttft = g->n_generated ? g->t_first - g->t_submit : -1;
        double tpot = g->n_generated > 1 ? (g->t_last - g->t_first) / (g->n_generated - 1) : -1;
        metrics_observe_generation(g->srv->metrics, (uint32_t)g->n_prompt, g->n_generated, ttft,
                                   tpot);
    }
    job_release(g->job);
    grammar_ref_release(g->grammar);
    if (g->samples) {
        for (uint32_t i = 0; i < g->req.n; i++) {
            free(g->samples[i].text);
            cJSON_Delete(g->samples[i].logprobs);
            llm_detokenizer_free(g->samples[i].detok);
            free(g->samples[i].piece);
            free(g->samples[i].held);
        }
    }
    free(g->samples);
    free(g->prompt);
    free(g->pending);
    serve_request_free(&g->req);
    free(g);
}
