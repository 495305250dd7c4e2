/* llm-serve: an OpenAI-compatible HTTP server on libllminfer (docs/serve.md). */
/* --device, --tp and --devices use the experimental device API of llm.h. */
#define LLM_EXPERIMENTAL
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../common/progress_bar.h"
#include "alloc.h"
#include "device.h"
#include "engine.h"
#include "http.h"
#include "llm.h"
#include "metrics.h"
#include "server.h"

typedef struct options {
    const char *model_path;
    const char *host;
    long port;
    const char *api_key;
    long threads, ctx, max_concurrent, max_tokens_limit, kv_cache_mib, shutdown_timeout;
    long max_connections, max_connections_per_ip, idle_timeout, http_threads;
    long long max_body_bytes;
    const char *served_model_name;
    const char *draft_model_path;
    const char *chat_template_path;
    const char *loras[SERVE_MAX_LORAS]; /* "NAME=PATH" */
    size_t n_loras;
    serve_device device;
    int verbose, quiet;
    bool matryoshka;
    llm_kv_type kv_type;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "NAME\n"
            "  llm-serve - an OpenAI-compatible HTTP server on libllminfer\n"
            "\n"
            "SYNOPSIS\n"
            "  llm-serve -m MODEL [--port N] [options]\n"
            "\n"
            "DESCRIPTION\n"
            "  Serves /v1/chat/completions, /v1/completions (streaming or not),\n"
            "  /v1/models, /health and Prometheus /metrics with continuous batching.\n"
            "  Prints its address on stdout once it listens; SIGTERM or SIGINT stops it.\n"
            "\n"
            "OPTIONS\n"
            "  -m, --model PATH          GGUF model to serve\n"
            "  --host HOST               address to listen on (default 127.0.0.1)\n"
            "  --port N                  port; 0 picks a free one (default 8080)\n"
            "  --api-key KEY             require 'Authorization: Bearer KEY'\n"
            "                            (default: env LLM_SERVE_API_KEY, else none)\n"
            "  --threads N               compute threads, 0 = one per CPU (default 0)\n"
            "  --ctx N                   context per sequence, 0 = the model's (default 0)\n"
            "  --max-concurrent N        generation requests served at once; more get 429\n"
            "                            (default 64)\n"
            "  --max-body-bytes N        largest request body; larger get 413 (default 1048576)\n"
            "  --max-tokens-limit N      largest max_tokens a request may ask (default 4096)\n"
            "  --served-model-name NAME  model id in responses (default: the file's name)\n"
            "  --kv-cache-mib N          KV cache size, 0 = the library's default (default 0)\n"
            "  --kv-type TYPE            KV cache type: f32, f16, bf16, q8_0, q4_0 or fp8;\n"
            "                            q8_0 holds 3.8x the tokens of f32 in the same\n"
            "                            memory (q4_0: CPU only; default f32)\n"
            "  --device NAME             backend to run on: cpu, cuda or auto (the first\n"
            "                            available one besides the CPU, else the CPU);\n"
            "                            experimental (default cpu)\n"
            "  --tp N                    split the model across N ranks: CPU threads, or GPUs\n"
            "                            with --device cuda (tensor parallelism,\n"
            "                            experimental; default 1)\n"
            "  --devices LIST            device ids to run on, N of them for --tp N, like 0,1\n"
            "                            (default: device 0, or 0 .. N-1)\n"
            "  --chat-template FILE      Jinja chat template to use instead of the model's\n"
            "                            (e.g. one with a tools section for tool calling)\n"
            "  --draft-model PATH        draft model (same vocabulary) for requests that ask\n"
            "                            for \"speculative\": \"draft\"\n"
            "  --lora NAME=PATH          serve a LoRA adapter (GGUF or PEFT folder) as the\n"
            "                            model NAME: requests whose \"model\" is NAME run\n"
            "                            with it (repeatable; CPU backend only)\n"
            "  --max-connections N       open connections at most; more get a fast 503\n"
            "                            (default 1024)\n"
            "  --max-connections-per-ip N  open connections from one address; more are\n"
            "                            closed at once, 0 = no limit (default 256)\n"
            "  --idle-timeout S          close a connection that sends nothing for S seconds\n"
            "                            while a request is awaited: unfinished headers or\n"
            "                            body, or idle keep-alive (default 10)\n"
            "  --http-threads N          HTTP event-loop threads (default 2)\n"
            "  --shutdown-timeout S      seconds in-flight requests get to finish on\n"
            "                            SIGTERM/SIGINT before they are cancelled (default 10)\n"
            "  --matryoshka              the model's embeddings were trained to be cut short\n"
            "                            (Matryoshka): /v1/embeddings then takes 'dimensions'\n"
            "                            below the model's width (truncated, renormalized)\n"
            "  -v                        log requests and library messages to stderr\n"
            "  -q, --quiet               no load progress on stderr (a bar on a terminal,\n"
            "                            else a line per phase: read, upload, warm-up)\n"
            "  -h, --help                this text\n"
            "\n"
            "EXIT STATUS\n"
            "  0 after a clean shutdown, 1 usage error, 2 start-up error (model, device,\n"
            "  memory or address; the message goes to stderr).\n"
            "\n"
            "ENVIRONMENT\n"
            "  LLM_SERVE_API_KEY  the key clients must send, unless --api-key is given\n"
            "  LLM_PLUGIN_PATH    where to look for backend plug-ins\n"
            "\n"
            "EXAMPLE\n"
            "  llm-serve -m SmolLM2-135M-Instruct.Q4_1.gguf --port 8080\n"
            "\n"
            "SEE ALSO\n"
            "  llm-run(1), llm-bench(1); docs/serve.md\n");
}

static bool parse_long(const char *flag, const char *text, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || !*text || *end || v < lo || v > hi) {
        fprintf(stderr, "llm-serve: %s needs an integer in [%ld, %ld], not '%s'\n", flag, lo, hi,
                text);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_args(int argc, char **argv, options *o)
{
    *o = (options){.host = "127.0.0.1",
                   .port = 8080,
                   .max_concurrent = 64,
                   .max_tokens_limit = 4096,
                   .max_body_bytes = 1 << 20,
                   .shutdown_timeout = 10,
                   .max_connections = 1024,
                   .max_connections_per_ip = 256,
                   .idle_timeout = 10,
                   .http_threads = 2,
                   .device = {.backend = "cpu", .tensor_parallel = 1}};
    o->api_key = getenv("LLM_SERVE_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "-v")) {
            o->verbose = 1;
            continue;
        }
        if (!strcmp(a, "--matryoshka")) {
            o->matryoshka = true;
            continue;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "llm-serve: unknown option or missing value: %s\n", a);
            return false;
        }
        const char *v = argv[++i];
        long n;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_path = v;
        else if (!strcmp(a, "--host")) o->host = v;
        else if (!strcmp(a, "--api-key")) o->api_key = v;
        else if (!strcmp(a, "--served-model-name")) o->served_model_name = v;
        else if (!strcmp(a, "--draft-model")) o->draft_model_path = v;
        else if (!strcmp(a, "--chat-template"))
            o->chat_template_path = v;
        else if (!strcmp(a, "--lora")) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || !eq[1] || o->n_loras == SERVE_MAX_LORAS) {
                fprintf(stderr, "llm-serve: --lora takes NAME=PATH (at most %d of them)\n",
                        SERVE_MAX_LORAS);
                return false;
            }
            o->loras[o->n_loras++] = v;
        }
        else if (!strcmp(a, "--device"))
            o->device.backend = v;
        else if (!strcmp(a, "--tp")) {
            if (!parse_long(a, v, 1, 64, &o->device.tensor_parallel))
                return false;
        } else if (!strcmp(a, "--devices")) {
            if (!serve_device_parse_list(&o->device, v))
                return false;
        } else if (!strcmp(a, "--port")) {
            if (!parse_long(a, v, 0, 65535, &o->port))
                return false;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_long(a, v, 0, 1024, &o->threads))
                return false;
        } else if (!strcmp(a, "--ctx")) {
            if (!parse_long(a, v, 0, 1 << 24, &o->ctx))
                return false;
        } else if (!strcmp(a, "--max-concurrent")) {
            if (!parse_long(a, v, 1, 100000, &o->max_concurrent))
                return false;
        } else if (!strcmp(a, "--max-tokens-limit")) {
            if (!parse_long(a, v, 1, 1 << 24, &o->max_tokens_limit))
                return false;
        } else if (!strcmp(a, "--kv-cache-mib")) {
            if (!parse_long(a, v, 0, 1 << 24, &o->kv_cache_mib))
                return false;
        } else if (!strcmp(a, "--kv-type")) {
            static const struct {
                const char *name;
                llm_kv_type type;
            } kv_types[] = {{"f32", LLM_KV_F32},
                            {"f16", LLM_KV_F16},
                            {"bf16", LLM_KV_BF16},
                            {"q8_0", LLM_KV_Q8_0},
                            {"q4_0", LLM_KV_Q4_0},
                            {"fp8", LLM_KV_FP8_E4M3}};
            size_t k = 0;
            while (k < sizeof kv_types / sizeof kv_types[0] && strcmp(v, kv_types[k].name))
                k++;
            if (k == sizeof kv_types / sizeof kv_types[0]) {
                fprintf(stderr, "llm-serve: --kv-type is f32, f16, bf16, q8_0, q4_0 or fp8, not '%s'\n",
                        v);
                return false;
            }
            o->kv_type = kv_types[k].type;
        } else if (!strcmp(a, "--max-connections")) {
            if (!parse_long(a, v, 1, 1 << 20, &o->max_connections))
                return false;
        } else if (!strcmp(a, "--max-connections-per-ip")) {
            if (!parse_long(a, v, 0, 1 << 20, &o->max_connections_per_ip))
                return false;
        } else if (!strcmp(a, "--idle-timeout")) {
            if (!parse_long(a, v, 1, 86400, &o->idle_timeout))
                return false;
        } else if (!strcmp(a, "--http-threads")) {
            if (!parse_long(a, v, 1, 256, &o->http_threads))
                return false;
        } else if (!strcmp(a, "--shutdown-timeout")) {
            if (!parse_long(a, v, 0, 3600, &o->shutdown_timeout))
                return false;
        } else if (!strcmp(a, "--max-body-bytes")) {
            if (!parse_long(a, v, 1024, LONG_MAX, &n)) return false;
            o->max_body_bytes = n;
        } else {
            fprintf(stderr, "llm-serve: unknown option: %s\n", a);
            return false;
        }
    }
    if (!o->model_path) {
        fprintf(stderr, "llm-serve: -m MODEL is required\n");
        return false;
    }
    if (o->api_key && !o->api_key[0]) o->api_key = NULL;
    return true;
}

static void log_to_stderr(llm_log_level level, const char *message, void *user)
{
    (void)user;
    static const char *names[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "libllminfer %s: %s\n", names[level <= LLM_LOG_ERROR ? level : LLM_LOG_ERROR],
            message);
}

/* The model id: the file name without directories and ".gguf"; NULL when
 * out of memory. */
static char *default_model_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *name = strdup(base);
    if (!name) return NULL;
    size_t n = strlen(name);
    if (n > 5 && !strcmp(name + n - 5, ".gguf")) name[n - 5] = '\0';
    return name;
}

/* The whole of a text file, NUL-terminated; NULL with a message on stderr. */
static char *read_text_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llm-serve: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char *text = NULL;
    size_t len = 0, cap = 0, n;
    do {
        if (len + 4096 + 1 > cap) {
            cap = cap * 2 + 4096 + 1;
            char *bigger = realloc(text, cap);
            if (!bigger) {
                fprintf(stderr, "llm-serve: out of memory reading %s\n", path);
                free(text);
                fclose(f);
                return NULL;
            }
            text = bigger;
        }
        n = fread(text + len, 1, 4096, f);
        len += n;
    } while (n == 4096);
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        fprintf(stderr, "llm-serve: cannot read %s\n", path);
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

/* --chat-template: the file's text, checked by rendering one message. */
static char *load_chat_template(const llm_model *model, const char *path) {
    char *text = read_text_file(path);
    if (!text)
        return NULL;
    llm_chat_params cp;
    llm_chat_params_init(&cp);
    cp.messages_json = "[{\"role\":\"user\",\"content\":\"Hello\"}]";
    cp.template_text = text;
    size_t need = 0;
    llm_status st = llm_chat_apply(model, &cp, NULL, 0, &need);
    if (st != LLM_OK && st != LLM_ERR_BUFFER_TOO_SMALL) {
        fprintf(stderr, "llm-serve: --chat-template %s: %s\n", path, llm_last_error());
        free(text);
        return NULL;
    }
    return text;
}

/* Each connection holds a descriptor (two while its generation runs), and
 * the model, the listener and the event loops need some: raises the soft
 * limit to the hard one and lowers the connection cap to what fits. */
static long fit_connections_to_fd_limit(long wanted)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return wanted;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur == RLIM_INFINITY) return wanted;
    long fit = ((long)rl.rlim_cur - 256) / 2;
    if (fit < 16) fit = 16;
    if (wanted > fit) {
        fprintf(stderr, "llm-serve: --max-connections %ld lowered to %ld to fit the limit of %ld "
                        "open files\n", wanted, fit, (long)rl.rlim_cur);
        return fit;
    }
    return wanted;
}

static void sleep_ms(long ms) { nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL); }

/* Waits up to `timeout_ms` for in-flight generations to end. */
static bool wait_idle(server *srv, long timeout_ms)
{
    for (long waited = 0; waited <= timeout_ms; waited += 20) {
        if (atomic_load(&srv->generating) == 0) return true;
        sleep_ms(20);
    }
    return atomic_load(&srv->generating) == 0;
}

int main(int argc, char **argv)
{
    options o;
    if (!parse_args(argc, argv, &o)) {
        fprintf(stderr, "llm-serve: 'llm-serve --help' lists the options\n");
        return 1;
    }
    serve_alloc_read_test_hook();
    /* Every thread created from here on inherits the blocked signals, so
     * only sigwait() below sees them. A client that hangs up must not kill
     * the server with SIGPIPE. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (o.verbose) llm_log_set(log_to_stderr, LLM_LOG_INFO, NULL);

    char errbuf[512] = "";
    llm_model_params mp;
    llm_model_params_init(&mp);
    mp.error_message = errbuf;
    mp.error_capacity = sizeof errbuf;
    progress_bar bar;
    progress_bar_init(&bar, "llm-serve", stderr);
    if (!o.quiet) {
        mp.progress = progress_bar_update;
        mp.progress_user = &bar;
    }
    llm_model *model = NULL;
    llm_status st = llm_model_load(o.model_path, &mp, &model);
    if (st != LLM_OK) {
        fprintf(stderr, "llm-serve: cannot load %s: %s\n", o.model_path, errbuf);
        return 2;
    }
    llm_model *draft = NULL;
    if (o.draft_model_path) {
        st = llm_model_load(o.draft_model_path, &mp, &draft);
        if (st != LLM_OK) {
            fprintf(stderr, "llm-serve: cannot load %s: %s\n", o.draft_model_path, errbuf);
            llm_model_free(model);
            return 2;
        }
    }
    server srv = {0};
    srv.model = model;
    srv.info.struct_size = sizeof srv.info;
    llm_model_get_info(model, &srv.info);
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = (uint32_t)o.threads;
    sp.n_ctx = (uint32_t)o.ctx;
    sp.kv_cache_bytes = (uint64_t)o.kv_cache_mib << 20;
    sp.kv_type = o.kv_type;
    sp.draft_model = draft;
    sp.error_message = errbuf;
    sp.error_capacity = sizeof errbuf;
    sp.progress = mp.progress;
    sp.progress_user = mp.progress_user;
    llm_device_params dp;
    llm_device_params_init(&dp);
    dp.backend = o.device.backend;
    dp.tensor_parallel = (uint32_t)o.device.tensor_parallel;
    dp.devices = o.device.n_devices ? o.device.devices : NULL;
    dp.n_devices = o.device.n_devices;
    st = llm_session_create_ex(model, &sp, &dp, &srv.session);
    if (st != LLM_OK) {
        fprintf(stderr, "llm-serve: cannot create a session: %s\n", errbuf);
        llm_model_free(draft);
        llm_model_free(model);
        return 2;
    }
    char *model_name = o.served_model_name ? strdup(o.served_model_name)
                                           : default_model_name(o.model_path);
    if (!model_name) {
        fprintf(stderr, "llm-serve: out of memory at startup\n");
        return 2;
    }
    for (size_t i = 0; i < o.n_loras; i++) {
        const char *eq = strchr(o.loras[i], '=');
        char *name = strndup(o.loras[i], (size_t)(eq - o.loras[i]));
        llm_adapter *ad = NULL;
        st = name ? llm_adapter_load(model, eq + 1, NULL, &ad) : LLM_ERR_OUT_OF_MEMORY;
        if (st != LLM_OK) {
            fprintf(stderr, "llm-serve: cannot load the LoRA adapter %s: %s\n", eq + 1,
                    llm_last_error());
            return 2;
        }
        srv.loras[srv.n_loras++] = (serve_lora){name, ad};
    }
    srv.model_name = model_name;
    snprintf(srv.fingerprint, sizeof srv.fingerprint, "llminfer-%s", llm_version_string());
    srv.api_key = o.api_key;
    srv.device_name = serve_device_resolved_name(&o.device);
    srv.tensor_parallel = (uint32_t)o.device.tensor_parallel;
    srv.n_ctx = o.ctx ? (uint32_t)o.ctx : srv.info.n_ctx_train;
    llm_session_stats kv = {.struct_size = sizeof kv};
    if (llm_session_get_stats(srv.session, &kv) != LLM_OK) {
        fprintf(stderr, "llm-serve: cannot read the KV pool's size: %s\n", llm_last_error());
        return 1;
    }
    srv.kv_pool_tokens = (uint64_t)kv.blocks_total * kv.block_size;
    srv.max_sequence_tokens =
        srv.kv_pool_tokens < srv.n_ctx ? (uint32_t)srv.kv_pool_tokens : srv.n_ctx;
    srv.limits = (serve_limits){(uint32_t)o.max_tokens_limit, 16, srv.info.n_vocab};
    srv.max_concurrent = (int)o.max_concurrent;
    srv.max_body_bytes = (size_t)o.max_body_bytes;
    srv.verbose = o.verbose;
    srv.matryoshka = o.matryoshka;
    srv.max_connections = (int)fit_connections_to_fd_limit(o.max_connections);
    srv.max_connections_per_ip = (int)o.max_connections_per_ip;
    srv.idle_timeout = (int)o.idle_timeout;
    srv.http_threads = (int)o.http_threads;
    char *chat_template = NULL;
    if (o.chat_template_path && !(chat_template = load_chat_template(model, o.chat_template_path)))
        return 2;
    srv.chat_template = chat_template;
    /* Compiled response_format and tool grammars kept for reuse. */
    srv.grammars = grammar_cache_create(model, 64);
    srv.metrics = metrics_create();
    srv.engine = engine_start(srv.session);
    if (!srv.metrics || !srv.engine || !srv.grammars) {
        fprintf(stderr, "llm-serve: out of memory at startup\n");
        return 2;
    }
    uint16_t port = 0;
    http_server *http = http_start(&srv, o.host, (uint16_t)o.port, &port);
    if (!http)
        return 2;
    const char *shown_host = strchr(o.host, ':') ? "[%s]" : "%s";
    char host_text[300];
    snprintf(host_text, sizeof host_text, shown_host, o.host);
    serve_alloc_arm_test_hook();
    printf("llm-serve: serving %s at http://%s:%u/v1 (context %u, KV pool %llu tokens, device %s, "
           "tensor parallel %u)\n",
           model_name, host_text, port, srv.n_ctx, (unsigned long long)srv.kv_pool_tokens,
           srv.device_name, srv.tensor_parallel);
    fflush(stdout);

    int sig = 0;
    sigwait(&stop_signals, &sig);
    fprintf(stderr, "llm-serve: %s, shutting down\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    atomic_store(&srv.draining, true);
    http_quiesce(http);
    if (!wait_idle(&srv, o.shutdown_timeout * 1000)) {
        fprintf(stderr, "llm-serve: cancelling %d unfinished requests\n",
                atomic_load(&srv.generating));
        engine_cancel_all(srv.engine);
        wait_idle(&srv, 5000);
    }
    http_stop(http);
    engine_stop(srv.engine);
    grammar_cache_free(srv.grammars); /* after the last request let go of its grammar */
    free(chat_template);
    metrics_free(srv.metrics);
    llm_session_free(srv.session);
    for (size_t i = 0; i < srv.n_loras; i++) {
        llm_adapter_free(srv.loras[i].adapter);
        free((char *)srv.loras[i].name);
    }
    llm_model_free(draft);
    llm_model_free(model);
    free(model_name);
    return 0;
}
