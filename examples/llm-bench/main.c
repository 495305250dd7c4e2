/* llm-bench: synthetic load for the continuous-batching engine.
 * Generates requests with random prompts and exact output lengths, feeds
 * them to a session (continuous batching, or static batching as the
 * baseline), and reports throughput, latency and KV-cache figures.
 * Exit status: 0 ok, 1 usage error, 2 runtime error or engine problem. */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "NAME\n"
               "  llm-bench - synthetic load on libllminfer's continuous batching\n"
               "\n"
               "SYNOPSIS\n"
               "  llm-bench [-m MODEL] [--requests N] [--compare] [options]\n"
               "\n"
               "DESCRIPTION\n"
               "  Generates requests with random prompts and exact output lengths, runs\n"
               "  them on one session and reports throughput, latency and KV-cache figures.\n"
               "\n"
               "OPTIONS\n"
               "  -m PATH                 model file (default " DEFAULT_MODEL ")\n"
               "  -t THREADS              threads (default: all cores)\n"
               "  --tp N                  split the model across N ranks: CPU threads, or\n"
               "                          GPUs with --device cuda (tensor parallelism,\n"
               "                          experimental; default 1)\n"
               "  --device NAME           backend: cpu, cuda or auto (the first available one\n"
               "                          besides the CPU, else the CPU); experimental\n"
               "                          (default cpu)\n"
               "  --requests N            number of requests (default 64)\n"
               "  --prompt-len MIN:MAX    prompt tokens per request, uniform (default 32:256)\n"
               "  --output-len MIN:MAX    new tokens per request, exact (default 16:128)\n"
               "  --arrival-rate R        requests per second, Poisson; 0 = all at once "
               "(default 0)\n"
               "  --shared-prefix-len L   length of a prompt prefix shared by requests "
               "(default 0)\n"
               "  --shared-prefix-frac F  fraction of requests that start with it (default 0)\n"
               "  --mode continuous|static  scheduling (default continuous)\n"
               "  --static-batch G        group size of static batching (default 16)\n"
               "  --prefix-cache on|off   share KV of common prefixes (default on)\n"
               "  --kv-cache-mb MB        KV cache size, 0 = library default (default 0)\n"
               "  --block-size B          tokens per KV block, 0 = library default (16)\n"
               "  --max-batch-tokens T    tokens per forward pass, 0 = library default (512)\n"
               "  --seed S                workload seed (default 1)\n"
               "  --json FILE             also write the results as JSON\n"
               "  --compare               run continuous and static (and prefix cache on and\n"
               "                          off when a shared prefix is set), print ratios\n"
               "  --no-warmup             skip the short warm-up request\n"
               "  --embed                 embedding throughput instead: --requests sentences\n"
               "                          of --prompt-len tokens at batch 1 and 64\n"
               "  --spec none|ngram|draft speculative decoding: run every request at batch 1\n"
               "                          without and with it, report speedup and acceptance\n"
               "                          (default none: the load benchmark above)\n"
               "  --draft-model PATH      draft model for --spec draft (same vocabulary)\n"
               "  --lora PATH             run every request of the load with this LoRA\n"
               "                          adapter (GGUF or PEFT folder; docs/lora.md)\n"
               "  --lora-scale S          its scale (default 1)\n"
               "  --spec-k K              drafts per step, 1..32; 0 = adaptive (default 0)\n"
               "  --workload W            random (token ids), repetitive (chat prompts that\n"
               "                          ask to repeat or edit a given text) or free (free\n"
               "                          generation); default random, repetitive with --spec\n"
               "  --temp T                with --spec: sampling temperature, 0 = greedy (0)\n"
               "  -v                      log library messages to stderr\n"
               "  -h, --help              this text\n"
               "  A request's prompt is the shared prefix (if it has one) followed by its\n"
               "  own MIN:MAX random tokens.\n"
               "\n"
               "EXIT STATUS\n"
               "  0 ok, 1 usage error, 2 runtime error or engine problem.\n"
               "\n"
               "SEE ALSO\n"
               "  llm-run(1), llm-serve(1); docs/bench.md says what each metric means\n");
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

static int parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *s == '\0' || *end != '\0' || !(v >= lo && v <= hi))
        return 0;
    *out = v;
    return 1;
}

/* "MIN:MAX" or "N" (both ends N). */
static int parse_range(const char *s, long lo, long hi, bench_range *out) {
    const char *colon = strchr(s, ':');
    char buf[64];
    if (!colon) {
        if (!parse_long(s, lo, hi, &out->lo))
            return 0;
        out->hi = out->lo;
        return 1;
    }
    size_t n = (size_t)(colon - s);
    if (n == 0 || n >= sizeof buf)
        return 0;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return parse_long(buf, lo, hi, &out->lo) && parse_long(colon + 1, lo, hi, &out->hi) &&
           out->lo <= out->hi;
}

static int parse_onoff(const char *s, bool *out) {
    if (!strcmp(s, "on"))
        *out = true;
    else if (!strcmp(s, "off"))
        *out = false;
    else
        return 0;
    return 1;
}

/* Returns 0 on success, 1 on a usage error (message printed), -1 for --help. */
static int parse_args(int argc, char **argv, bench_opts *o) {
    o->model = DEFAULT_MODEL;
    o->requests = 64;
    o->tp = 1;
    o->prompt_len = (bench_range){32, 256};
    o->output_len = (bench_range){16, 128};
    o->mode = MODE_CONTINUOUS;
    o->prefix_cache = true;
    o->static_batch = 16;
    o->seed = 1;
    o->warmup = true;
    o->lora_scale = 1.0;
    o->workload = WORKLOAD_RANDOM;
    bool workload_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1, takes_value = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return -1;
        if (!strcmp(a, "--compare")) {
            o->compare = true;
            takes_value = 0;
        } else if (!strcmp(a, "--embed")) {
            o->embed = true;
            takes_value = 0;
        } else if (!strcmp(a, "--no-warmup")) {
            o->warmup = false;
            takes_value = 0;
        } else if (!strcmp(a, "-v")) {
            o->verbose = true;
            takes_value = 0;
        } else if (!v) {
            fprintf(stderr, "llm-bench: %s needs a value\n", a);
            return 1;
        } else if (!strcmp(a, "-m"))
            o->model = v;
        else if (!strcmp(a, "--json"))
            o->json = v;
        else if (!strcmp(a, "-t"))
            ok = parse_long(v, 1, 512, &o->threads);
        else if (!strcmp(a, "--tp"))
            ok = parse_long(v, 1, 64, &o->tp);
        else if (!strcmp(a, "--device"))
            o->device = v;
        else if (!strcmp(a, "--requests")) {
            ok = parse_long(v, 1, 1000000, &o->requests);
            o->requests_set = true;
        } else if (!strcmp(a, "--prompt-len"))
            ok = parse_range(v, 1, 1 << 20, &o->prompt_len);
        else if (!strcmp(a, "--output-len")) {
            ok = parse_range(v, 1, 1 << 20, &o->output_len);
            o->output_len_set = true;
        } else if (!strcmp(a, "--draft-model"))
            o->draft_model = v;
        else if (!strcmp(a, "--lora"))
            o->lora = v;
        else if (!strcmp(a, "--lora-scale"))
            ok = parse_double(v, -1e6, 1e6, &o->lora_scale);
        else if (!strcmp(a, "--spec-k"))
            ok = parse_long(v, 0, LLM_SPEC_MAX_K, &o->spec_k);
        else if (!strcmp(a, "--temp")) {
            double t = 0;
            ok = parse_double(v, 0, 100, &t);
            o->temperature = (float)t;
        } else if (!strcmp(a, "--spec")) {
            if (!strcmp(v, "none"))
                o->spec_mode = LLM_SPEC_NONE;
            else if (!strcmp(v, "ngram"))
                o->spec_mode = LLM_SPEC_NGRAM;
            else if (!strcmp(v, "draft"))
                o->spec_mode = LLM_SPEC_DRAFT;
            else
                ok = 0;
        } else if (!strcmp(a, "--workload")) {
            workload_set = true;
            if (!strcmp(v, "random"))
                o->workload = WORKLOAD_RANDOM;
            else if (!strcmp(v, "repetitive"))
                o->workload = WORKLOAD_REPETITIVE;
            else if (!strcmp(v, "free"))
                o->workload = WORKLOAD_FREE;
            else
                ok = 0;
        } else if (!strcmp(a, "--arrival-rate"))
            ok = parse_double(v, 0, 1e9, &o->arrival_rate);
        else if (!strcmp(a, "--shared-prefix-len"))
            ok = parse_long(v, 0, 1 << 20, &o->prefix_len);
        else if (!strcmp(a, "--shared-prefix-frac"))
            ok = parse_double(v, 0, 1, &o->prefix_frac);
        else if (!strcmp(a, "--static-batch"))
            ok = parse_long(v, 1, 1000000, &o->static_batch);
        else if (!strcmp(a, "--prefix-cache"))
            ok = parse_onoff(v, &o->prefix_cache);
        else if (!strcmp(a, "--kv-cache-mb"))
            ok = parse_long(v, 0, 1L << 30, &o->kv_cache_mb);
        else if (!strcmp(a, "--block-size"))
            ok = parse_long(v, 0, 1024, &o->block_size);
        else if (!strcmp(a, "--max-batch-tokens"))
            ok = parse_long(v, 0, 65536, &o->max_batch_tokens);
        else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "continuous"))
                o->mode = MODE_CONTINUOUS;
            else if (!strcmp(v, "static"))
                o->mode = MODE_STATIC;
            else
                ok = 0;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            ok = !errno && *v && *v != '-' && *end == '\0';
        } else {
            fprintf(stderr, "llm-bench: unknown option '%s'\n", a);
            return 1;
        }
        if (!ok) {
            fprintf(stderr, "llm-bench: bad value '%s' for %s\n", v, a);
            return 1;
        }
        i += takes_value;
    }
    if (o->spec_mode == LLM_SPEC_DRAFT && !o->draft_model) {
        fprintf(stderr, "llm-bench: --spec draft needs --draft-model PATH\n");
        return 1;
    }
    if (o->spec_mode != LLM_SPEC_NONE && !workload_set)
        o->workload = WORKLOAD_REPETITIVE;
    if (o->spec_mode == LLM_SPEC_NONE && o->workload != WORKLOAD_RANDOM) {
        fprintf(stderr, "llm-bench: --workload %s is for --spec runs\n",
                bench_workload_name(o->workload));
        return 1;
    }
    if (o->spec_mode != LLM_SPEC_NONE && (o->compare || o->mode == MODE_STATIC)) {
        fprintf(stderr, "llm-bench: --spec runs at batch 1; --compare and --mode do not apply\n");
        return 1;
    }
    return 0;
}

static void log_to_stderr(llm_log_level level, const char *msg, void *user) {
    (void)user;
    static const char *names[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "[%s] %s\n", names[level & 3], msg);
}

static bool has_shared_prefix(const bench_opts *o) {
    return o->prefix_len > 0 && o->prefix_frac > 0;
}

static const char *onoff(bool b) { return b ? "on" : "off"; }

static double ratio(double a, double b) { return b > 0 && isfinite(a) ? a / b : NAN; }

/* ---- table ---- */

static void run_label(const bench_result *r, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/pc-%s", bench_mode_name(r->mode), onoff(r->prefix_cache));
}

static void print_table(const bench_opts *o, const bench_workload *w, const bench_result *rs,
                        size_t n) {
    printf("workload: %zu requests, prompt %ld:%ld (+%ld shared prefix on %llu), output "
           "%ld:%ld, arrival %s",
           w->n, o->prompt_len.lo, o->prompt_len.hi, o->prefix_len,
           (unsigned long long)w->shared_requests, o->output_len.lo, o->output_len.hi,
           o->arrival_rate > 0 ? "" : "all at once");
    if (o->arrival_rate > 0)
        printf("%g req/s", o->arrival_rate);
    printf("; %llu prompt + %llu output tokens; seed %llu\n", (unsigned long long)w->prompt_tokens,
           (unsigned long long)w->output_tokens, (unsigned long long)o->seed);
    printf("KV: %u blocks x %u tokens\n\n", rs[0].blocks_total, rs[0].block_size);
    char label[48];
    printf("%-22s", "metric");
    for (size_t i = 0; i < n; i++) {
        run_label(&rs[i], label, sizeof label);
        printf(" %20s", label);
    }
    printf("\n");
#define ROW(name, fmt, expr)                                                                       \
    do {                                                                                           \
        printf("%-22s", name);                                                                     \
        for (size_t i = 0; i < n; i++) {                                                           \
            const bench_result *r = &rs[i];                                                        \
            printf(" %20" fmt, expr);                                                              \
        }                                                                                          \
        printf("\n");                                                                              \
    } while (0)
    ROW("wall s", ".2f", r->wall_s);
    ROW("generated tokens", "llu", (unsigned long long)r->generated_tokens);
    ROW("throughput tok/s", ".1f", r->throughput_tok_s);
    ROW("prompt tok/s", ".1f", r->prompt_tok_s);
    ROW("TTFT p50 ms", ".1f", r->ttft_ms.p50);
    ROW("TTFT p95 ms", ".1f", r->ttft_ms.p95);
    ROW("TTFT p99 ms", ".1f", r->ttft_ms.p99);
    ROW("TPOT p50 ms", ".2f", r->tpot_ms.p50);
    ROW("TPOT p95 ms", ".2f", r->tpot_ms.p95);
    ROW("TPOT p99 ms", ".2f", r->tpot_ms.p99);
    ROW("E2E p50 ms", ".1f", r->e2e_ms.p50);
    ROW("E2E p99 ms", ".1f", r->e2e_ms.p99);
    ROW("KV waste mean %", ".2f", r->kv_waste_mean * 100);
    ROW("KV waste max %", ".2f", r->kv_waste_max * 100);
    ROW("KV utilization mean %", ".2f", r->kv_util_mean * 100);
    ROW("KV utilization max %", ".2f", r->kv_util_max * 100);
    ROW("prefix hit rate %", ".2f", r->prefix_hit_rate * 100);
    ROW("  of admitted %", ".2f", r->prefix_hit_rate_admitted * 100);
    ROW("prompt tokens computed", "llu", (unsigned long long)r->prompt_tokens_computed);
    ROW("preemptions", "llu", (unsigned long long)r->preemptions);
    ROW("steps", "llu", (unsigned long long)r->steps);
#undef ROW
    for (size_t i = 0; i < n; i++)
        if (rs[i].kv_overcount_steps) {
            printf("note: in %llu of %llu steps of run %zu the engine reported more KV tokens "
                   "used than its used blocks hold, so KV waste is negative there\n",
                   (unsigned long long)rs[i].kv_overcount_steps,
                   (unsigned long long)rs[i].kv_samples, i + 1);
        }
}

/* ---- JSON ---- */

void bench_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Non-finite numbers (no samples) become null. */
void bench_json_num(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

static void json_pct(FILE *f, const char *key, const bench_pct *p) {
    fprintf(f, "\"%s\": {\"p50\": ", key);
    bench_json_num(f, p->p50);
    fputs(", \"p95\": ", f);
    bench_json_num(f, p->p95);
    fputs(", \"p99\": ", f);
    bench_json_num(f, p->p99);
    fputs(", \"mean\": ", f);
    bench_json_num(f, p->mean);
    fprintf(f, ", \"n\": %zu}", p->n);
}

/* `r` gives the run's mode, prefix cache and resolved KV shape; `mode` overrides
 * the mode's name (the top-level object of --compare says "compare"). */
static void json_config(FILE *f, const bench_opts *o, const bench_result *r, const char *mode,
                        const char *ind) {
    fprintf(f, "{\n%s  \"model\": ", ind);
    bench_json_str(f, o->model);
    fprintf(f, ",\n%s  \"device\": ", ind);
    bench_json_str(f, o->device ? o->device : "cpu");
    fprintf(f, ",\n%s  \"lora\": ", ind);
    if (o->lora)
        bench_json_str(f, o->lora);
    else
        fputs("null", f);
    fprintf(f, ",\n%s  \"lora_scale\": ", ind);
    bench_json_num(f, o->lora_scale);
    fprintf(f,
            ",\n%s  \"threads\": %ld,\n%s  \"tp\": %ld,\n%s  \"requests\": %ld,\n"
            "%s  \"prompt_len\": [%ld, %ld],\n%s  \"output_len\": [%ld, %ld],\n"
            "%s  \"arrival_rate\": ",
            ind, o->threads, ind, o->tp, ind, o->requests, ind, o->prompt_len.lo, o->prompt_len.hi,
            ind, o->output_len.lo, o->output_len.hi, ind);
    bench_json_num(f, o->arrival_rate);
    fprintf(f, ",\n%s  \"shared_prefix_len\": %ld,\n%s  \"shared_prefix_frac\": ", ind,
            o->prefix_len, ind);
    bench_json_num(f, o->prefix_frac);
    fprintf(f,
            ",\n%s  \"mode\": \"%s\",\n%s  \"prefix_cache\": %s,\n"
            "%s  \"static_batch\": %ld,\n%s  \"kv_cache_mb\": %ld,\n"
            "%s  \"block_size\": %u,\n%s  \"blocks_total\": %u,\n"
            "%s  \"max_batch_tokens\": %ld,\n%s  \"seed\": %llu\n%s}",
            ind, mode ? mode : bench_mode_name(r->mode), ind,
            (mode ? o->prefix_cache : r->prefix_cache) ? "true" : "false", ind, o->static_batch,
            ind, o->kv_cache_mb, ind, r->block_size, ind, r->blocks_total, ind, o->max_batch_tokens,
            ind, (unsigned long long)o->seed, ind);
}

/* The members of one run's object (without braces). */
static void json_result(FILE *f, const bench_opts *o, const bench_result *r, const char *ind) {
    fprintf(f, "%s\"config\": ", ind);
    json_config(f, o, r, NULL, ind);
    fprintf(f, ",\n%s\"wall_s\": ", ind);
    bench_json_num(f, r->wall_s);
    fprintf(f, ",\n%s\"prompt_tokens\": %llu,\n%s\"generated_tokens\": %llu,\n", ind,
            (unsigned long long)r->prompt_tokens, ind, (unsigned long long)r->generated_tokens);
    fprintf(f, "%s\"throughput_tok_s\": ", ind);
    bench_json_num(f, r->throughput_tok_s);
    fprintf(f, ",\n%s\"prompt_tok_s\": ", ind);
    bench_json_num(f, r->prompt_tok_s);
    fprintf(f, ",\n%s", ind);
    json_pct(f, "ttft_ms", &r->ttft_ms);
    fprintf(f, ",\n%s", ind);
    json_pct(f, "tpot_ms", &r->tpot_ms);
    fprintf(f, ",\n%s", ind);
    json_pct(f, "e2e_ms", &r->e2e_ms);
    fprintf(f, ",\n%s\"kv_waste\": ", ind);
    bench_json_num(f, r->kv_waste_mean);
    fprintf(f, ",\n%s\"kv_waste_max\": ", ind);
    bench_json_num(f, r->kv_waste_max);
    fprintf(f, ",\n%s\"kv_utilization\": ", ind);
    bench_json_num(f, r->kv_util_mean);
    fprintf(f, ",\n%s\"kv_utilization_max\": ", ind);
    bench_json_num(f, r->kv_util_max);
    fprintf(f, ",\n%s\"kv_blocks_used_max\": %u,\n%s\"prefix_hit_rate\": ", ind, r->blocks_used_max,
            ind);
    bench_json_num(f, r->prefix_hit_rate);
    fprintf(f, ",\n%s\"prefix_hit_rate_admitted\": ", ind);
    bench_json_num(f, r->prefix_hit_rate_admitted);
    fprintf(f,
            ",\n%s\"prefix_hit_tokens\": %llu,\n%s\"prompt_tokens_computed\": %llu,\n"
            "%s\"preemptions\": %llu,\n%s\"steps\": %llu,\n%s\"failed_requests\": %llu,\n"
            "%s\"wrong_length_requests\": %llu,\n%s\"stray_events\": %llu,\n"
            "%s\"kv_overcount_steps\": %llu",
            ind, (unsigned long long)r->prefix_hit_tokens, ind,
            (unsigned long long)r->prompt_tokens_computed, ind, (unsigned long long)r->preemptions,
            ind, (unsigned long long)r->steps, ind, (unsigned long long)r->failed, ind,
            (unsigned long long)r->wrong_length, ind, (unsigned long long)r->stray_events, ind,
            (unsigned long long)r->kv_overcount_steps);
}

typedef struct bench_ratios {
    double thr_cont_over_static, ttft_p99_static_over_cont, ttft_p50_static_over_cont;
    double ttft_p50_off_over_on, ttft_p99_off_over_on, ttft_mean_off_over_on, thr_on_over_off;
    bool have_mode, have_prefix;
} bench_ratios;

static int write_json(const bench_opts *o, const bench_result *rs, size_t n,
                      const bench_ratios *q) {
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "llm-bench: cannot write '%s': %s\n", o->json, strerror(errno));
        return 2;
    }
    if (!o->compare) {
        fputs("{\n", f);
        json_result(f, o, &rs[0], "  ");
        fputs("\n}\n", f);
    } else {
        fputs("{\n  \"config\": ", f);
        json_config(f, o, &rs[0], "compare", "  ");
        fputs(",\n  \"runs\": [\n", f);
        for (size_t i = 0; i < n; i++) {
            fputs("    {\n", f);
            json_result(f, o, &rs[i], "      ");
            fprintf(f, "\n    }%s\n", i + 1 < n ? "," : "");
        }
        fputs("  ],\n  \"ratios\": {", f);
        const char *sep = "\n";
        if (q->have_mode) {
            fprintf(f, "%s    \"throughput_continuous_over_static\": ", sep);
            bench_json_num(f, q->thr_cont_over_static);
            fputs(",\n    \"ttft_p99_static_over_continuous\": ", f);
            bench_json_num(f, q->ttft_p99_static_over_cont);
            fputs(",\n    \"ttft_p50_static_over_continuous\": ", f);
            bench_json_num(f, q->ttft_p50_static_over_cont);
            sep = ",\n";
        }
        if (q->have_prefix) {
            fprintf(f, "%s    \"ttft_p50_prefix_off_over_on\": ", sep);
            bench_json_num(f, q->ttft_p50_off_over_on);
            fputs(",\n    \"ttft_p99_prefix_off_over_on\": ", f);
            bench_json_num(f, q->ttft_p99_off_over_on);
            fputs(",\n    \"ttft_mean_prefix_off_over_on\": ", f);
            bench_json_num(f, q->ttft_mean_off_over_on);
            fputs(",\n    \"throughput_prefix_on_over_off\": ", f);
            bench_json_num(f, q->thr_on_over_off);
        }
        fputs("\n  }\n}\n", f);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "llm-bench: writing '%s' failed: %s\n", o->json, strerror(errno));
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        usage(rc < 0 ? stdout : stderr);
        return rc < 0 ? 0 : 1;
    }
    if (o.verbose)
        llm_log_set(log_to_stderr, LLM_LOG_INFO, NULL);

    llm_model *model = NULL;
    llm_status st = llm_model_load(o.model, NULL, &model);
    if (st != LLM_OK)
        return bench_fail("loading the model", st);
    llm_adapter *adapter = NULL;
    if (o.lora) {
        st = llm_adapter_load(model, o.lora, NULL, &adapter);
        if (st != LLM_OK) {
            llm_model_free(model);
            return bench_fail("loading the LoRA adapter", st);
        }
        o.adapter = adapter;
    }
    if (o.embed) {
        rc = bench_embed(model, &o);
        llm_adapter_free(adapter);
        llm_model_free(model);
        return rc;
    }
    if (o.spec_mode != LLM_SPEC_NONE) {
        rc = bench_spec(model, &o);
        llm_adapter_free(adapter);
        llm_model_free(model);
        return rc;
    }
    bench_workload w;
    rc = bench_workload_make(model, &o, &w);
    if (rc == 0 && o.warmup)
        rc = bench_warmup(model, &o);

    /* Runs: the chosen one, or with --compare continuous and static with the
     * chosen prefix-cache setting, plus continuous with the other setting
     * when there is a shared prefix. */
    bench_result rs[3];
    bench_mode modes[3] = {o.mode, MODE_STATIC, MODE_CONTINUOUS};
    bool caches[3] = {o.prefix_cache, o.prefix_cache, !o.prefix_cache};
    size_t n_runs = 1;
    if (o.compare) {
        modes[0] = MODE_CONTINUOUS;
        n_runs = has_shared_prefix(&o) ? 3 : 2;
    }
    bool engine_problem = false;
    for (size_t i = 0; rc == 0 && i < n_runs; i++) {
        fprintf(stderr, "llm-bench: run %zu/%zu: %s, prefix cache %s\n", i + 1, n_runs,
                bench_mode_name(modes[i]), onoff(caches[i]));
        rc = bench_run(model, &o, &w, modes[i], caches[i], &rs[i]);
        if (rc == 0 && (rs[i].failed || rs[i].wrong_length || rs[i].stray_events))
            engine_problem = true;
    }
    if (rc == 0) {
        print_table(&o, &w, rs, n_runs);
        bench_ratios q = {0};
        if (o.compare) {
            q.have_mode = true;
            q.thr_cont_over_static = ratio(rs[0].throughput_tok_s, rs[1].throughput_tok_s);
            q.ttft_p99_static_over_cont = ratio(rs[1].ttft_ms.p99, rs[0].ttft_ms.p99);
            q.ttft_p50_static_over_cont = ratio(rs[1].ttft_ms.p50, rs[0].ttft_ms.p50);
            printf("\ncontinuous/static throughput: %.2fx   static/continuous TTFT p99: %.2fx"
                   "   p50: %.2fx\n",
                   q.thr_cont_over_static, q.ttft_p99_static_over_cont,
                   q.ttft_p50_static_over_cont);
        }
        if (o.compare && n_runs == 3) {
            const bench_result *on = rs[0].prefix_cache ? &rs[0] : &rs[2];
            const bench_result *off = rs[0].prefix_cache ? &rs[2] : &rs[0];
            q.have_prefix = true;
            q.ttft_p50_off_over_on = ratio(off->ttft_ms.p50, on->ttft_ms.p50);
            q.ttft_p99_off_over_on = ratio(off->ttft_ms.p99, on->ttft_ms.p99);
            q.ttft_mean_off_over_on = ratio(off->ttft_ms.mean, on->ttft_ms.mean);
            q.thr_on_over_off = ratio(on->throughput_tok_s, off->throughput_tok_s);
            printf("prefix cache off/on TTFT p50: %.2fx   p99: %.2fx   mean: %.2fx   "
                   "on/off throughput: %.2fx\n",
                   q.ttft_p50_off_over_on, q.ttft_p99_off_over_on, q.ttft_mean_off_over_on,
                   q.thr_on_over_off);
        }
        fflush(stdout);
        if (o.json)
            rc = write_json(&o, rs, n_runs, &q);
    }
    if (rc == 0 && engine_problem) {
        fprintf(stderr, "llm-bench: the engine misbehaved (see above)\n");
        rc = 2;
    }
    bench_workload_free(&w);
    llm_adapter_free(adapter);
    llm_model_free(model);
    return rc;
}
