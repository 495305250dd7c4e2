/* llm-run: generate text with a model from the command line.
 * Text goes to stdout as it is generated; timings go to stderr.
 * Exit status: 0 ok, 1 usage error, 2 runtime error. */
/* --tp and --device set llm_device_params (tensor_parallel, backend). */
#define LLM_EXPERIMENTAL
#include <llm.h>

#include "../common/progress_bar.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct options {
    const char *model;
    const char *prompt;
    long n_new;
    llm_sampling_params sampling;
    bool chat, no_mmap, verbose, quiet;
    long threads;
    long tp;            /* tensor-parallel ranks (llm_device_params.tensor_parallel) */
    const char *device; /* llm_device_params.backend: "cpu", "cuda", "auto" */
    uint32_t spec_mode; /* llm_spec_mode */
    long spec_k;
    const char *draft_model;
    long kv_type;     /* llm_kv_type; hidden option --kv-type f32|f16|bf16|q8_0|q4_0|fp8 */
    const char *lora; /* LoRA adapter file or PEFT folder (llm_adapter_load) */
    float lora_scale; /* llm_generate_params.adapter_scale */
} options;

static void usage(FILE *f) {
    fprintf(f, "NAME\n"
               "  llm-run - generate text with a language model on libllminfer\n"
               "\n"
               "SYNOPSIS\n"
               "  llm-run [-m MODEL] [-p PROMPT] [-n N] [--chat] [options]\n"
               "\n"
               "DESCRIPTION\n"
               "  Loads a GGUF model (or a Hugging Face folder), streams the continuation\n"
               "  of the prompt to stdout and prints load time, time to first token and\n"
               "  tokens/s to stderr.\n"
               "\n"
               "OPTIONS\n"
               "  -m PATH        model file (default " DEFAULT_MODEL ")\n"
               "  -p TEXT        prompt (default \"Once upon a time\")\n"
               "  -n N           new tokens to generate (default 64)\n"
               "  --temp T       temperature, 0 = greedy (default 0.8)\n"
               "  --seed S       random seed (default 0)\n"
               "  --top-k K      keep the K most likely tokens, 0 = off (default 40)\n"
               "  --top-p P      nucleus sampling mass, 1 = off (default 0.95)\n"
               "  --min-p P      drop tokens below P x the best one (default 0.05)\n"
               "  --repeat-penalty P     penalise tokens of the last N: logit / P (if > 0)\n"
               "                         or x P, 1 = off (default 1)\n"
               "  --repeat-last-n N      penalty window, -1 = whole history, 0 = no\n"
               "                         penalties (default 64)\n"
               "  --presence-penalty P   subtract P from tokens in the window (default 0)\n"
               "  --frequency-penalty P  subtract P x their count in the window (default 0)\n"
               "  --spec MODE    speculative decoding: none, ngram (prompt lookup) or draft\n"
               "                 (needs --draft-model); the output is what decoding without\n"
               "                 it gives (default none)\n"
               "  --draft-model PATH  draft model for --spec draft (same vocabulary)\n"
               "  --lora PATH    run with a LoRA adapter: a llama.cpp LoRA GGUF or a PEFT\n"
               "                 folder (docs/lora.md)\n"
               "  --lora-scale S multiplies the adapter's alpha / rank (default 1)\n"
               "  --spec-k K     drafts per step, 1..32; 0 = adaptive (default 0)\n"
               "  --chat         wrap the prompt in the model's chat template\n"
               "  -t THREADS     threads (default: all cores)\n"
               "  --tp N         split the model across N ranks: CPU threads, or GPUs with\n"
               "                 --device cuda (tensor parallelism, experimental; default 1)\n"
               "  --device NAME  backend to run on: cpu, cuda or auto (the first available\n"
               "                 one besides the CPU, else the CPU); experimental (default cpu)\n"
               "  --no-mmap      read the model into memory instead of mapping it\n"
               "  -v             log library messages to stderr\n"
               "  -q, --quiet    no load progress on stderr (a bar on a terminal, else a\n"
               "                 line per phase: read, upload, warm-up)\n"
               "  -h, --help     this text\n"
               "\n"
               "EXIT STATUS\n"
               "  0 ok, 1 usage error, 2 runtime error (the status name and message go to\n"
               "  stderr).\n"
               "\n"
               "ENVIRONMENT\n"
               "  LLM_PLUGIN_PATH  where to look for backend plug-ins such as\n"
               "                   libllminfer-cuda.so (default: beside the library)\n"
               "\n"
               "EXAMPLE\n"
               "  llm-run --chat -p \"What is the capital of Germany?\" -n 64\n"
               "\n"
               "SEE ALSO\n"
               "  llm-serve(1), llm-bench(1), llm-quantize(1); README.md and docs/api.md\n");
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0' || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

static int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *s == '\0' || *end != '\0')
        return 0;
    *out = v;
    return 1;
}

/* Returns 0 on success, 1 on a usage error (message printed), -1 for --help. */
static int parse_args(int argc, char **argv, options *o) {
    o->model = DEFAULT_MODEL;
    o->prompt = "Once upon a time";
    o->n_new = 64;
    o->threads = 0;
    o->tp = 1;
    o->lora_scale = 1.0f;
    llm_sampling_params_init(&o->sampling);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        int ok = 1, takes_value = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return -1;
        if (!strcmp(a, "--chat")) {
            o->chat = true;
            takes_value = 0;
        } else if (!strcmp(a, "--no-mmap")) {
            o->no_mmap = true;
            takes_value = 0;
        } else if (!strcmp(a, "-v")) {
            o->verbose = true;
            takes_value = 0;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o->quiet = true;
            takes_value = 0;
        } else if (!v) {
            fprintf(stderr, "llm-run: %s needs a value\n", a);
            return 1;
        } else if (!strcmp(a, "-m"))
            o->model = v;
        else if (!strcmp(a, "-p"))
            o->prompt = v;
        else if (!strcmp(a, "--draft-model"))
            o->draft_model = v;
        else if (!strcmp(a, "--device"))
            o->device = v;
        else if (!strcmp(a, "--lora"))
            o->lora = v;
        else if (!strcmp(a, "--lora-scale"))
            ok = parse_float(v, &o->lora_scale);
        else if (!strcmp(a, "--spec-k"))
            ok = parse_long(v, 0, LLM_SPEC_MAX_K, &o->spec_k);
        else if (!strcmp(a, "--spec")) {
            if (!strcmp(v, "none"))
                o->spec_mode = LLM_SPEC_NONE;
            else if (!strcmp(v, "ngram"))
                o->spec_mode = LLM_SPEC_NGRAM;
            else if (!strcmp(v, "draft"))
                o->spec_mode = LLM_SPEC_DRAFT;
            else
                ok = 0;
        } else if (!strcmp(a, "--kv-type"))
            ok = (o->kv_type = !strcmp(v, "f32")    ? LLM_KV_F32
                               : !strcmp(v, "f16")  ? LLM_KV_F16
                               : !strcmp(v, "bf16") ? LLM_KV_BF16
                               : !strcmp(v, "q8_0") ? LLM_KV_Q8_0
                               : !strcmp(v, "q4_0") ? LLM_KV_Q4_0
                               : !strcmp(v, "fp8")  ? LLM_KV_FP8_E4M3
                                                    : -1) >= 0;
        else if (!strcmp(a, "-n"))
            ok = parse_long(v, 0, 1 << 24, &o->n_new);
        else if (!strcmp(a, "-t"))
            ok = parse_long(v, 1, 512, &o->threads);
        else if (!strcmp(a, "--tp"))
            ok = parse_long(v, 1, 64, &o->tp);
        else if (!strcmp(a, "--temp"))
            ok = parse_float(v, &o->sampling.temperature);
        else if (!strcmp(a, "--top-p"))
            ok = parse_float(v, &o->sampling.top_p);
        else if (!strcmp(a, "--min-p"))
            ok = parse_float(v, &o->sampling.min_p);
        else if (!strcmp(a, "--repeat-penalty"))
            ok = parse_float(v, &o->sampling.repeat_penalty);
        else if (!strcmp(a, "--presence-penalty"))
            ok = parse_float(v, &o->sampling.presence_penalty);
        else if (!strcmp(a, "--frequency-penalty"))
            ok = parse_float(v, &o->sampling.frequency_penalty);
        else if (!strcmp(a, "--repeat-last-n")) {
            ok = parse_long(v, -1, INT32_MAX, &l);
            o->sampling.repeat_last_n = (int32_t)l;
        } else if (!strcmp(a, "--top-k")) {
            ok = parse_long(v, 0, 1 << 24, &l);
            o->sampling.top_k = (int32_t)l;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->sampling.seed = strtoull(v, &end, 10);
            ok = !errno && *v && *end == '\0';
        } else {
            fprintf(stderr, "llm-run: unknown option '%s'\n", a);
            return 1;
        }
        if (!ok) {
            fprintf(stderr, "llm-run: bad value '%s' for %s\n", v, a);
            return 1;
        }
        i += takes_value;
    }
    if (o->spec_mode == LLM_SPEC_DRAFT && !o->draft_model) {
        fprintf(stderr, "llm-run: --spec draft needs --draft-model PATH\n");
        return 1;
    }
    if (o->draft_model && o->spec_mode == LLM_SPEC_NONE)
        o->spec_mode = LLM_SPEC_DRAFT;
    return 0;
}

static void log_to_stderr(llm_log_level level, const char *msg, void *user) {
    (void)user;
    static const char *names[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "[%s] %s\n", names[level & 3], msg);
}

static bool print_piece(llm_token tok, const char *piece, size_t len, void *user) {
    (void)tok;
    (void)user;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return true;
}

static int fail(const char *what, llm_status st) {
    fprintf(stderr, "llm-run: %s: %s: %s\n", what, llm_status_name(st), llm_last_error());
    return 2;
}

/* Prompt text → tokens, through the chat template when asked. Caller frees. */
static llm_status make_prompt(const llm_model *m, const options *o, llm_token **out, size_t *n) {
    const char *text = o->prompt;
    char *templated = NULL;
    llm_status st;
    if (o->chat) {
        llm_chat_message msg = {"user", o->prompt};
        size_t len = 0;
        st = llm_chat_template_apply(m, &msg, 1, true, NULL, 0, &len);
        if (st != LLM_ERR_BUFFER_TOO_SMALL && st != LLM_OK)
            return st;
        templated = malloc(len + 1);
        if (!templated)
            return LLM_ERR_OUT_OF_MEMORY;
        st = llm_chat_template_apply(m, &msg, 1, true, templated, len + 1, &len);
        if (st != LLM_OK) {
            free(templated);
            return st;
        }
        text = templated;
    }
    uint32_t flags = LLM_TOKENIZE_ADD_SPECIAL | LLM_TOKENIZE_PARSE_SPECIAL;
    size_t need = 0;
    st = llm_tokenize(m, text, strlen(text), flags, NULL, 0, &need);
    if (st == LLM_OK || st == LLM_ERR_BUFFER_TOO_SMALL) {
        *out = malloc((need ? need : 1) * sizeof **out);
        st = *out ? llm_tokenize(m, text, strlen(text), flags, *out, need, n)
                  : LLM_ERR_OUT_OF_MEMORY;
    }
    /* Templates that write bos_token themselves (Llama, Gemma, Mistral)
     * would otherwise start the prompt with two BOS tokens. */
    llm_model_info info = {sizeof info};
    if (st == LLM_OK && o->chat && *n >= 2 && llm_model_get_info(m, &info) == LLM_OK &&
        info.bos != LLM_TOKEN_NONE && (*out)[0] == info.bos && (*out)[1] == info.bos) {
        memmove(*out, *out + 1, (*n - 1) * sizeof **out);
        (*n)--;
    }
    free(templated);
    return st;
}

int main(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        usage(rc < 0 ? stdout : stderr);
        return rc < 0 ? 0 : 1;
    }
    if (o.verbose)
        llm_log_set(log_to_stderr, LLM_LOG_INFO, NULL);

    llm_model_params mp;
    llm_model_params_init(&mp);
    mp.use_mmap = !o.no_mmap;
    /* Load progress on stderr: a bar on a terminal, a line per phase in a log. */
    progress_bar bar;
    progress_bar_init(&bar, "llm-run", stderr);
    if (!o.quiet) {
        mp.progress = progress_bar_update;
        mp.progress_user = &bar;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    llm_model *model = NULL, *draft = NULL;
    llm_adapter *adapter = NULL;
    llm_status st = llm_model_load(o.model, &mp, &model);
    if (st != LLM_OK)
        return fail("loading the model", st);
    if (o.draft_model && (st = llm_model_load(o.draft_model, &mp, &draft)) != LLM_OK) {
        llm_model_free(model);
        return fail("loading the draft model", st);
    }
    if (o.lora && (st = llm_adapter_load(model, o.lora, NULL, &adapter)) != LLM_OK) {
        llm_model_free(draft);
        llm_model_free(model);
        return fail("loading the adapter", st);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double load_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;

    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = (uint32_t)o.threads;
    sp.kv_type = (llm_kv_type)o.kv_type;
    sp.draft_model = draft;
    sp.progress = mp.progress;
    sp.progress_user = mp.progress_user;
    llm_session *session = NULL;
    llm_token *prompt = NULL;
    size_t n_prompt = 0;
    int exit_code = 0;
    llm_device_params dp;
    llm_device_params_init(&dp);
    dp.tensor_parallel = (uint32_t)o.tp;
    dp.backend = o.device;
    if ((st = llm_session_create_ex(model, &sp, &dp, &session)) != LLM_OK) {
        exit_code = fail("creating the session", st);
    } else if ((st = make_prompt(model, &o, &prompt, &n_prompt)) != LLM_OK) {
        exit_code = fail("tokenizing the prompt", st);
    } else {
        llm_generate_params gp;
        llm_generate_params_init(&gp);
        gp.max_new_tokens = (uint32_t)o.n_new;
        gp.sampling = &o.sampling;
        gp.on_token = print_piece;
        gp.spec_mode = o.spec_mode;
        gp.spec_k = (uint32_t)o.spec_k;
        gp.adapter = adapter;
        gp.adapter_scale = o.lora_scale;
        llm_generate_result res = {sizeof res};
        if (!o.chat)
            fputs(o.prompt, stdout);
        st = llm_generate(session, prompt, n_prompt, &gp, &res);
        fputc('\n', stdout);
        fflush(stdout);
        if (st != LLM_OK) {
            exit_code = fail("generating", st);
        } else {
            double gen_tps = res.n_generated_tokens > 1 && res.generate_seconds > 0
                                 ? (res.n_generated_tokens - 1) / res.generate_seconds
                                 : 0.0;
            fprintf(stderr,
                    "load %.3f s | prompt %u tokens, TTFT %.1f ms, %.1f tokens/s | "
                    "generated %u tokens, %.1f tokens/s\n",
                    load_s, res.n_prompt_tokens, res.prompt_seconds * 1e3,
                    res.prompt_seconds > 0 ? res.n_prompt_tokens / res.prompt_seconds : 0.0,
                    res.n_generated_tokens, gen_tps);
            if (o.spec_mode != LLM_SPEC_NONE)
                fprintf(stderr,
                        "speculative (%s, k %s): %u steps checked %u drafts, %u accepted "
                        "(%.1f%%, %.2f per step)\n",
                        o.spec_mode == LLM_SPEC_NGRAM ? "ngram" : "draft",
                        o.spec_k ? "fixed" : "adaptive", res.n_spec_steps, res.n_draft_tokens,
                        res.n_accepted_tokens,
                        res.n_draft_tokens ? 100.0 * res.n_accepted_tokens / res.n_draft_tokens
                                           : 0.0,
                        res.n_spec_steps ? (double)res.n_accepted_tokens / res.n_spec_steps : 0.0);
        }
    }
    free(prompt);
    llm_session_free(session);
    llm_adapter_free(adapter);
    llm_model_free(draft);
    llm_model_free(model);
    return exit_code;
}
