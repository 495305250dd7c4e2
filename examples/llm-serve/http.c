#include "http.h"

#include <cJSON.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "alloc.h"
#include "embeddings.h"
#include "generation.h"
#include "json_out.h"
#include "listener.h"
#include "worker.h"

#define STREAM_BLOCK 4096

/* Per-connection request state, from the first call of the access handler
 * to the request-completed callback. */
typedef struct exchange {
    server *srv;
    char *body;
    size_t body_len, body_cap;
    bool too_large;
    bool body_out_of_memory; /* the body could not be stored; answered with 503 */
    bool close_after;        /* the response closes the connection */
    const char *endpoint;
    work *work; /* an admitted generation's worker, shared until completion */
    int status;
} exchange;

/* The error body when even the error cannot be built. */
static const char OUT_OF_MEMORY_BODY[] =
    "{\"error\":{\"message\":\"out of memory; retry later\",\"type\":\"server_error\","
    "\"param\":null,\"code\":\"out_of_memory\"}}";

static enum MHD_Result send_error(struct MHD_Connection *conn, exchange *ex, const serve_error *err);

static enum MHD_Result send_out_of_memory(struct MHD_Connection *conn, exchange *ex,
                                          const char *what)
{
    serve_error err;
    serve_error_out_of_memory(&err, what);
    return send_error(conn, ex, &err);
}

/* Sends `body` (freed here); a NULL body is an allocation that failed. */
static enum MHD_Result send_text(struct MHD_Connection *conn, exchange *ex, int status,
                                 const char *content_type, char *body)
{
    if (!body) return send_out_of_memory(conn, ex, "while building the response");
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", content_type);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    ex->status = status;
    return ret;
}

/* Sends `json` (consumed) unless `built` is false: then a part of it could
 * not be allocated, and a 503 goes out instead. */
static enum MHD_Result send_json(struct MHD_Connection *conn, exchange *ex, int status, cJSON *json,
                                 bool built)
{
    char *body = built ? cJSON_PrintUnformatted(json) : NULL;
    cJSON_Delete(json);
    return send_text(conn, ex, status, "application/json", body);
}

static enum MHD_Result send_error(struct MHD_Connection *conn, exchange *ex, const serve_error *err)
{
    bool ok = true;
    cJSON *root = cJSON_CreateObject();
    cJSON *e = put_object(root, "error", &ok);
    put_string(e, "message", err->message, &ok);
    put_string(e, "type", err->type, &ok);
    if (err->param[0]) put_string(e, "param", err->param, &ok);
    else put_null(e, "param", &ok);
    if (err->code) put_string(e, "code", err->code, &ok);
    else put_null(e, "code", &ok);
    char *body = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    int status = err->http_status;
    struct MHD_Response *r;
    if (body) {
        r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
        if (!r) free(body);
    } else {
        status = 503;
        r = MHD_create_response_from_buffer(sizeof OUT_OF_MEMORY_BODY - 1,
                                            (void *)OUT_OF_MEMORY_BODY, MHD_RESPMEM_PERSISTENT);
    }
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 405) MHD_add_response_header(r, "Allow", "GET, POST");
    if (ex->close_after) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    ex->status = status;
    return ret;
}

static enum MHD_Result fail(struct MHD_Connection *conn, exchange *ex, int status,
                            const char *type, const char *code, const char *message)
{
    serve_error err;
    serve_error_set(&err, status, type, NULL, "%s", message);
    err.code = code;
    return send_error(conn, ex, &err);
}

static bool authorized(struct MHD_Connection *conn, const server *srv)
{
    if (!srv->api_key) return true;
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!auth || strncasecmp(auth, "Bearer ", 7)) return false;
    const char *token = auth + 7;
    while (*token == ' ') token++;
    /* Compare every byte so timing does not reveal the key's prefix. */
    size_t a = strlen(token), b = strlen(srv->api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)token[i] ^ (unsigned char)srv->api_key[i % (b ? b : 1)];
    return diff == 0;
}

static enum MHD_Result handle_generation(struct MHD_Connection *conn, exchange *ex, bool chat)
{
    server *srv = ex->srv;
    if (ex->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than this server's limit of %zu bytes",
                 srv->max_body_bytes);
        return fail(conn, ex, 413, "invalid_request_error", "request_too_large", msg);
    }
    if (atomic_load(&srv->draining))
        return fail(conn, ex, 503, "server_error", NULL, "the server is shutting down");
    if (atomic_fetch_add(&srv->generating, 1) >= srv->max_concurrent) {
        atomic_fetch_sub(&srv->generating, 1);
        return fail(conn, ex, 429, "rate_limit_error", "too_many_requests",
                    "too many concurrent requests; retry later");
    }
    metrics_adjust_active(srv->metrics, 1);
    serve_error err;
    generation *g = generation_start(srv, ex->body ? ex->body : "", ex->body_len, chat, &err);
    if (!g) {
        metrics_adjust_active(srv->metrics, -1);
        atomic_fetch_sub(&srv->generating, 1);
        return send_error(conn, ex, &err);
    }
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    bool streams = generation_streams(g);
    /* From here the worker owns the generation and the admission. A
     * non-streaming request's connection is now suspended; this handler
     * runs again with the answer when the worker resumes it. */
    ex->work = work_start(srv, g, conn, fd ? fd->connect_fd : -1);
    if (!ex->work) {
        generation_end(g, false);
        metrics_adjust_active(srv->metrics, -1);
        atomic_fetch_sub(&srv->generating, 1);
        return send_out_of_memory(conn, ex, "while starting the request's thread");
    }
    if (!streams) return MHD_YES;
    struct MHD_Response *r = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, STREAM_BLOCK, work_stream_reader, ex->work, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    ex->status = 200;
    return ret;
}

/* A non-streaming request's connection, resumed by its worker. */
static enum MHD_Result send_answer(struct MHD_Connection *conn, exchange *ex)
{
    serve_error err;
    char *body = work_take_answer(ex->work, &err);
    return body ? send_text(conn, ex, 200, "application/json", body) : send_error(conn, ex, &err);
}

static enum MHD_Result handle_models(struct MHD_Connection *conn, exchange *ex)
{
    bool ok = true;
    cJSON *root = cJSON_CreateObject();
    put_string(root, "object", "list", &ok);
    cJSON *data = put_array(root, "data", &ok);
    cJSON *m = cJSON_CreateObject();
    push_item(data, m, &ok);
    put_string(m, "id", ex->srv->model_name, &ok);
    put_string(m, "object", "model", &ok);
    put_number(m, "created", 0, &ok);
    put_string(m, "owned_by", "llm-serve", &ok);
    put_number(m, "max_model_len", ex->srv->n_ctx, &ok);
    /* Where the model runs and how much KV memory it has (docs/serve.md). */
    llm_session_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    llm_session_get_stats(ex->srv->session, &stats);
    put_string(m, "device", ex->srv->device_name, &ok);
    put_number(m, "tensor_parallel", ex->srv->tensor_parallel, &ok);
    put_number(m, "kv_cache_blocks", stats.blocks_total, &ok);
    /* Extensions: the limits a request's default max_tokens comes from. */
    put_number(m, "kv_cache_tokens", (double)ex->srv->kv_pool_tokens, &ok);
    put_number(m, "max_sequence_tokens", ex->srv->max_sequence_tokens, &ok);
    put_number(m, "max_tokens_limit", ex->srv->limits.max_tokens_limit, &ok);
    /* LoRA adapters are models of their own, as vLLM lists them. */
    for (size_t i = 0; i < ex->srv->n_loras; i++) {
        cJSON *l = cJSON_CreateObject();
        push_item(data, l, &ok);
        put_string(l, "id", ex->srv->loras[i].name, &ok);
        put_string(l, "object", "model", &ok);
        put_number(l, "created", 0, &ok);
        put_string(l, "owned_by", "llm-serve", &ok);
        put_string(l, "parent", ex->srv->model_name, &ok);
    }
    return send_json(conn, ex, 200, root, ok);
}

static enum MHD_Result bad_request(struct MHD_Connection *conn, exchange *ex, const char *param,
                                   const char *message)
{
    serve_error err;
    serve_error_set(&err, 400, "invalid_request_error", param, "%s", message);
    return send_error(conn, ex, &err);
}

/* POST /tokenize {"prompt": TEXT, "add_special": BOOL}: the ids the server
 * would compute for a completions prompt (add_special defaults to true). */
static enum MHD_Result handle_tokenize(struct MHD_Connection *conn, exchange *ex)
{
    if (ex->too_large) return fail(conn, ex, 413, "invalid_request_error", "request_too_large",
                                   "the request body is too large");
    cJSON *root = cJSON_ParseWithLength(ex->body ? ex->body : "", ex->body_len);
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *special = cJSON_GetObjectItemCaseSensitive(root, "add_special");
    if (!cJSON_IsString(prompt)) {
        cJSON_Delete(root);
        return bad_request(conn, ex, "prompt", "'prompt' must be a string");
    }
    if (special && !cJSON_IsBool(special)) {
        cJSON_Delete(root);
        return bad_request(conn, ex, "add_special", "'add_special' must be a boolean");
    }
    uint32_t flags = LLM_TOKENIZE_PARSE_SPECIAL;
    if (!special || cJSON_IsTrue(special)) flags |= LLM_TOKENIZE_ADD_SPECIAL;
    const char *text = prompt->valuestring;
    size_t need = 0, n = 0;
    llm_status st = llm_tokenize(ex->srv->model, text, strlen(text), flags, NULL, 0, &need);
    llm_token *tokens = serve_malloc((need ? need : 1) * sizeof *tokens);
    if (!tokens) {
        cJSON_Delete(root);
        return send_out_of_memory(conn, ex, "while tokenizing");
    }
    if (st == LLM_ERR_BUFFER_TOO_SMALL || st == LLM_OK)
        st = llm_tokenize(ex->srv->model, text, strlen(text), flags, tokens, need, &n);
    cJSON_Delete(root);
    if (st != LLM_OK) {
        free(tokens);
        return bad_request(conn, ex, "prompt", llm_last_error());
    }
    bool ok = true;
    cJSON *out = cJSON_CreateObject();
    cJSON *arr = put_array(out, "tokens", &ok);
    for (size_t i = 0; i < n && ok; i++) push_item(arr, cJSON_CreateNumber(tokens[i]), &ok);
    free(tokens);
    return send_json(conn, ex, 200, out, ok);
}

/* POST /detokenize {"tokens": [ids]} -> {"prompt": TEXT}. */
static enum MHD_Result handle_detokenize(struct MHD_Connection *conn, exchange *ex)
{
    if (ex->too_large) return fail(conn, ex, 413, "invalid_request_error", "request_too_large",
                                   "the request body is too large");
    cJSON *root = cJSON_ParseWithLength(ex->body ? ex->body : "", ex->body_len);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(root);
        return bad_request(conn, ex, "tokens", "'tokens' must be an array of token ids");
    }
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    llm_token *tokens = serve_malloc((n ? n : 1) * sizeof *tokens);
    if (!tokens) {
        cJSON_Delete(root);
        return send_out_of_memory(conn, ex, "while detokenizing");
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, arr) {
        if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble >= ex->srv->info.n_vocab ||
            t->valuedouble != (double)(llm_token)t->valuedouble) {
            free(tokens);
            cJSON_Delete(root);
            return bad_request(conn, ex, "tokens", "'tokens' must hold token ids of this model");
        }
        tokens[i++] = (llm_token)t->valuedouble;
    }
    cJSON_Delete(root);
    size_t need = 0;
    llm_status st = llm_detokenize(ex->srv->model, tokens, n, 0, NULL, 0, &need);
    char *text = serve_malloc(need ? need : 1);
    if (!text) {
        free(tokens);
        return send_out_of_memory(conn, ex, "while detokenizing");
    }
    text[0] = '\0';
    if (st == LLM_ERR_BUFFER_TOO_SMALL) st = llm_detokenize(ex->srv->model, tokens, n, 0, text, need, &need);
    free(tokens);
    bool ok = true;
    cJSON *out = cJSON_CreateObject();
    put_string(out, "prompt", st == LLM_OK ? text : "", &ok);
    free(text);
    return send_json(conn, ex, 200, out, ok);
}

/* POST /v1/embeddings; admitted like a generation (--max-concurrent). */
static enum MHD_Result handle_embeddings(struct MHD_Connection *conn, exchange *ex)
{
    server *srv = ex->srv;
    if (ex->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than this server's limit of %zu bytes",
                 srv->max_body_bytes);
        return fail(conn, ex, 413, "invalid_request_error", "request_too_large", msg);
    }
    if (atomic_load(&srv->draining))
        return fail(conn, ex, 503, "server_error", NULL, "the server is shutting down");
    if (atomic_fetch_add(&srv->generating, 1) >= srv->max_concurrent) {
        atomic_fetch_sub(&srv->generating, 1);
        return fail(conn, ex, 429, "rate_limit_error", "too_many_requests",
                    "too many concurrent requests; retry later");
    }
    serve_error err;
    char *body = embeddings_handle(srv, ex->body ? ex->body : "", ex->body_len, &err);
    atomic_fetch_sub(&srv->generating, 1);
    return body ? send_text(conn, ex, 200, "application/json", body) : send_error(conn, ex, &err);
}

typedef struct route {
    const char *path;
    const char *method;
    int id;
} route;

enum {
    ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_MODELS, ROUTE_HEALTH, ROUTE_METRICS, ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE, ROUTE_EMBEDDINGS
};

static const route routes[] = {
    {"/v1/chat/completions", "POST", ROUTE_CHAT},
    {"/v1/completions", "POST", ROUTE_COMPLETIONS},
    {"/v1/models", "GET", ROUTE_MODELS},
    {"/v1/embeddings", "POST", ROUTE_EMBEDDINGS},
    {"/health", "GET", ROUTE_HEALTH},
    {"/metrics", "GET", ROUTE_METRICS},
    {"/tokenize", "POST", ROUTE_TOKENIZE},
    {"/detokenize", "POST", ROUTE_DETOKENIZE},
};

static enum MHD_Result dispatch(struct MHD_Connection *conn, exchange *ex, const char *url,
                                const char *method)
{
    const route *found = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) found = &routes[i];
    if (!found) {
        ex->endpoint = "other";
        return fail(conn, ex, 404, "invalid_request_error", "not_found", "no such endpoint");
    }
    ex->endpoint = found->path;
    bool head_ok = !strcmp(found->method, "GET") && !strcmp(method, "HEAD");
    if (strcmp(method, found->method) && !head_ok) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s takes %s, not %.16s", found->path, found->method, method);
        return fail(conn, ex, 405, "invalid_request_error", "method_not_allowed", msg);
    }
    if (found->id != ROUTE_HEALTH && !authorized(conn, ex->srv))
        return fail(conn, ex, 401, "authentication_error", "invalid_api_key",
                    "a valid API key is required: Authorization: Bearer KEY");
    if (ex->body_out_of_memory) return send_out_of_memory(conn, ex, "while reading the request");
    switch (found->id) {
    case ROUTE_CHAT: return handle_generation(conn, ex, true);
    case ROUTE_COMPLETIONS: return handle_generation(conn, ex, false);
    case ROUTE_MODELS: return handle_models(conn, ex);
    case ROUTE_TOKENIZE: return handle_tokenize(conn, ex);
    case ROUTE_DETOKENIZE: return handle_detokenize(conn, ex);
    case ROUTE_EMBEDDINGS: return handle_embeddings(conn, ex);
    case ROUTE_HEALTH:
        if (atomic_load(&ex->srv->draining))
            return fail(conn, ex, 503, "server_error", NULL, "the server is shutting down");
        return send_text(conn, ex, 200, "application/json", serve_strdup("{\"status\":\"ok\"}"));
    default: {
        grammar_cache_stats grammars;
        grammar_cache_get_stats(ex->srv->grammars, &grammars);
        /* metrics_render returns NULL when out of memory; send_text answers 503. */
        return send_text(conn, ex, 200, "text/plain; version=0.0.4",
                         metrics_render(ex->srv->metrics, ex->srv->session, ex->srv->device_name,
                                        ex->srv->tensor_parallel, &grammars));
    }
    }
}

typedef struct framing {
    int n_length;             /* Content-Length headers */
    bool lengths_differ;      /* ... with different values */
    bool transfer_encoding;   /* a Transfer-Encoding header */
    const char *first_length; /* the first Content-Length value */
} framing;

static enum MHD_Result note_framing(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    (void)kind;
    framing *f = cls;
    if (!strcasecmp(key, "Transfer-Encoding")) f->transfer_encoding = true;
    if (strcasecmp(key, "Content-Length")) return MHD_YES;
    if (f->n_length++ == 0) f->first_length = value;
    else if (strcmp(f->first_length, value)) f->lengths_differ = true;
    return MHD_YES;
}

/* A body framed two ways (Content-Length values that differ, or both
 * Content-Length and Transfer-Encoding) is read one way here and possibly
 * the other by a proxy in front: request smuggling. Such a request is
 * refused and its connection closed; NULL when the framing is clear. */
static const char *ambiguous_framing(struct MHD_Connection *conn)
{
    framing f = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, note_framing, &f);
    if (f.lengths_differ) return "conflicting Content-Length headers";
    if (f.n_length && f.transfer_encoding)
        return "both Content-Length and Transfer-Encoding headers";
    return NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **state)
{
    (void)version;
    server *srv = cls;
    exchange *ex = *state;
    if (!ex) {
        ex = serve_calloc(1, sizeof *ex);
        if (!ex) {
            /* Answered at once, with no state kept for the connection. */
            exchange unkept = {.srv = srv, .endpoint = "other"};
            return send_out_of_memory(conn, &unkept, "while accepting the request");
        }
        ex->srv = srv;
        ex->endpoint = "other";
        *state = ex;
        const char *ambiguous = ambiguous_framing(conn);
        if (ambiguous) {
            ex->close_after = true;
            return fail(conn, ex, 400, "invalid_request_error", "bad_framing", ambiguous);
        }
        const char *length = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (length && strtoull(length, NULL, 10) > srv->max_body_bytes) ex->too_large = true;
        return MHD_YES;
    }
    if (ex->work) return send_answer(conn, ex);
    if (*upload_size) {
        if (!ex->too_large && ex->body_len + *upload_size > srv->max_body_bytes) {
            ex->too_large = true;
        } else if (!ex->too_large && !ex->body_out_of_memory) {
            if (ex->body_len + *upload_size + 1 > ex->body_cap) {
                size_t cap = (ex->body_len + *upload_size + 1) * 2;
                char *b = serve_realloc(ex->body, cap);
                if (!b) {
                    ex->body_out_of_memory = true;
                    *upload_size = 0;
                    return MHD_YES;
                }
                ex->body = b;
                ex->body_cap = cap;
            }
            memcpy(ex->body + ex->body_len, upload, *upload_size);
            ex->body_len += *upload_size;
            ex->body[ex->body_len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(conn, ex, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **state,
                         enum MHD_RequestTerminationCode why)
{
    (void)conn;
    server *srv = cls;
    exchange *ex = *state;
    if (!ex) return;
    if (ex->work) {
        bool ok = why == MHD_REQUEST_TERMINATED_COMPLETED_OK;
        work_release(ex->work, ok);
        if (!ok) ex->status = 499; /* the client left before the answer was sent */
    }
    if (ex->status) metrics_count_request(srv->metrics, ex->endpoint, ex->status);
    if (srv->verbose)
        fprintf(stderr, "llm-serve: %s -> %d\n", ex->endpoint, ex->status);
    free(ex->body);
    free(ex);
    *state = NULL;
}

struct http_server {
    listener *listener;
    struct MHD_Daemon *daemon;
};

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    (void)conn;
    (void)socket_context;
    server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) atomic_fetch_add(&srv->open_connections, 1);
    else if (code == MHD_CONNECTION_NOTIFY_CLOSED) atomic_fetch_sub(&srv->open_connections, 1);
}

http_server *http_start(server *srv, const char *host, uint16_t port, uint16_t *bound_port)
{
    http_server *h = serve_calloc(1, sizeof *h);
    if (!h) {
        fprintf(stderr, "llm-serve: out of memory at startup\n");
        return NULL;
    }
    h->listener = listener_open(host, port, bound_port);
    if (!h->listener) {
        free(h);
        return NULL;
    }
    /* Event loops on a few threads (epoll where there is one); the
     * listener accepts and hands connections over. Handlers never block:
     * generations run on their workers (worker.h). */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC |
                     MHD_ALLOW_SUSPEND_RESUME;
    flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL;
    /* Clients hanging up mid-stream are routine; libmicrohttpd's own
     * messages about them only help when debugging. */
    if (srv->verbose) flags |= MHD_USE_ERROR_LOG;
    /* The listener keeps the count below max_connections; libmicrohttpd's
     * own cap, a little higher, only backs it up. */
    h->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)srv->http_threads, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->idle_timeout,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(srv->max_connections + 64),
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)srv->max_connections_per_ip,
        MHD_OPTION_END);
    if (!h->daemon) {
        fprintf(stderr, "llm-serve: cannot start the HTTP event loops\n");
        listener_close(h->listener);
        free(h);
        return NULL;
    }
    metrics_watch_connections(srv->metrics, &srv->open_connections);
    if (!listener_run(h->listener, h->daemon, &srv->open_connections, srv->max_connections,
                      srv->metrics)) {
        MHD_stop_daemon(h->daemon);
        listener_close(h->listener);
        free(h);
        return NULL;
    }
    return h;
}

void http_quiesce(http_server *h)
{
    listener_close(h->listener);
    h->listener = NULL;
}

void http_stop(http_server *h)
{
    if (!h) return;
    listener_close(h->listener);
    MHD_stop_daemon(h->daemon);
    free(h);
}
