/* llm-grammar: generations under a grammar (for the reference checks in
 * tests/grammar/) and the grammar benchmark.
 *
 *   llm-grammar gen (--model PATH | --tiny SEED) (--schema FILE | --ebnf FILE
 *                   | --regex FILE) [--ws compact|flexible] [--runs N]
 *                   [--temp T] [--seed S] [--max-new N] [--spec ngram]
 *                   [--prompt TEXT] [--threads N]
 *       One JSON line per generation: {"text": ..., "finish": ..., "tokens": n}.
 *       --runs N draws N seeded generations (seeds S, S+1, ...); --temp 0
 *       is greedy. --tiny writes a random-weight test model (its seed).
 *   llm-grammar accept (--ebnf FILE | --regex FILE)
 *       Reads JSON strings, one per line, on stdin; prints 1 for each the
 *       grammar matches as a whole, else 0 (the engine's verdict, for the
 *       comparison with an independent parser).
 *   llm-grammar bench --model PATH --schemas DIR [--threads N] [--walks N]
 *       JSON: compile time per schema, the largest position-mask table
 *       (chains, memory), mask time p50/p99 (cold: a grammar's first
 *       walks; warm: the same walks again), and generated tokens/s with
 *       and without a grammar.
 *
 * Exit status: 0 ok, 1 usage, 2 runtime error. */
#include "grammar/grammar.h"
#include "core/core.h"
#include "model/testmodel.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: llm-grammar gen (--model PATH | --tiny SEED) (--schema F | --ebnf F "
                    "| --regex F) [options]\n       llm-grammar bench --model PATH --schemas "
                    "DIR [--threads N] [--walks N]\n");
    return 1;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) {
        s[n] = 0;
        *len = (size_t)n;
    }
    return s;
}

static void json_string(FILE *o, const char *s, size_t n) {
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(o, "\\%c", c);
        else if (c < 0x20)
            fprintf(o, "\\u%04x", c);
        else
            fputc(c, o);
    }
    fputc('"', o);
}

typedef struct text_buf {
    char *s;
    size_t n, cap;
} text_buf;

static bool on_token(llm_token tok, const char *piece, size_t len, void *user) {
    (void)tok;
    text_buf *b = user;
    if (b->n + len + 1 > b->cap) {
        size_t c = b->cap ? 2 * b->cap : 4096;
        while (c < b->n + len + 1)
            c *= 2;
        char *q = realloc(b->s, c);
        if (!q)
            return false;
        b->s = q;
        b->cap = c;
    }
    memcpy(b->s + b->n, piece, len);
    b->n += len;
    return true;
}

static llm_model *load(const char *path, long tiny_seed) {
    llm_model *m = NULL;
    char tmp[256];
    if (!path) {
        llmi_testmodel_params p;
        llmi_testmodel_params_init(&p);
        p.seed = (uint64_t)tiny_seed;
        p.n_ctx = 4096;
        snprintf(tmp, sizeof tmp, "%s/llm-grammar-tiny-%ld.gguf",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", tiny_seed);
        if (llmi_testmodel_write(&p, tmp) != LLM_OK)
            return NULL;
        path = tmp;
    }
    llm_model_params mp;
    llm_model_params_init(&mp);
    if (llm_model_load(path, &mp, &m) != LLM_OK)
        m = NULL;
    if (path == tmp)
        remove(tmp);
    return m;
}

static int cmd_gen(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *prompt = "Output:\n";
    int kind = -1, runs = 1, max_new = 512, threads = 2;
    long tiny = -1;
    double temp = 0.0;
    uint64_t seed = 1;
    uint32_t ws = LLM_GRAMMAR_WS_COMPACT, spec = LLM_SPEC_NONE;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--tiny"))
            tiny = atol(v);
        else if (!strcmp(a, "--schema"))
            kind = 0, file = v;
        else if (!strcmp(a, "--ebnf"))
            kind = 1, file = v;
        else if (!strcmp(a, "--regex"))
            kind = 2, file = v;
        else if (!strcmp(a, "--ws"))
            ws = !strcmp(v, "flexible");
        else if (!strcmp(a, "--runs"))
            runs = atoi(v);
        else if (!strcmp(a, "--temp"))
            temp = atof(v);
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--max-new"))
            max_new = atoi(v);
        else if (!strcmp(a, "--spec"))
            spec = !strcmp(v, "ngram") ? LLM_SPEC_NGRAM : LLM_SPEC_NONE;
        else if (!strcmp(a, "--prompt"))
            prompt = v;
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else
            return usage();
    }
    if (kind < 0 || (!model && tiny < 0))
        return usage();
    size_t len = 0;
    char *text = read_file(file, &len);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", file);
        return 2;
    }
    if (kind == 2) /* a regex file holds one line */
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
            text[--len] = 0;
    llm_model *m = load(model, tiny);
    if (!m) {
        fprintf(stderr, "load: %s\n", llm_last_error());
        return 2;
    }
    llm_grammar_params gp;
    llm_grammar_params_init(&gp);
    gp.whitespace = ws;
    llm_grammar *g = NULL;
    llm_status st = kind == 0   ? llm_grammar_compile_json_schema(m, text, len, &gp, &g)
                    : kind == 1 ? llm_grammar_compile_ebnf(m, text, len, &gp, &g)
                                : llm_grammar_compile_regex(m, text, len, &gp, &g);
    if (st != LLM_OK) {
        fprintf(stderr, "compile %s: %s\n", file, llm_last_error());
        return 2;
    }
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = threads;
    llm_session *s = NULL;
    if (llm_session_create(m, &sp, &s) != LLM_OK) {
        fprintf(stderr, "session: %s\n", llm_last_error());
        return 2;
    }
    llm_token toks[512];
    size_t n_prompt = 0;
    if (llm_tokenize(m, prompt, strlen(prompt), LLM_TOKENIZE_ADD_SPECIAL, toks, 512, &n_prompt) !=
        LLM_OK) {
        fprintf(stderr, "tokenize: %s\n", llm_last_error());
        return 2;
    }
    int rc = 0;
    for (int r = 0; r < runs; r++) {
        llm_sampling_params smp;
        llm_sampling_params_init(&smp);
        smp.temperature = (float)temp;
        smp.seed = seed + (uint64_t)r;
        smp.grammar = g;
        llm_generate_params p;
        llm_generate_params_init(&p);
        p.max_new_tokens = (uint32_t)max_new;
        p.sampling = &smp;
        p.spec_mode = spec;
        p.spec_k = spec ? 4 : 0;
        text_buf b = {0};
        p.on_token = on_token;
        p.user = &b;
        llm_generate_result res = {.struct_size = sizeof res};
        st = llm_generate(s, toks, n_prompt, &p, &res);
        if (st != LLM_OK) {
            fprintf(stderr, "generate: %s\n", llm_last_error());
            rc = 2;
            break;
        }
        static const char *const finish[] = {"none", "eos", "length", "stop", "cancelled", "error"};
        printf("{\"text\": ");
        json_string(stdout, b.s ? b.s : "", b.n);
        printf(", \"finish\": \"%s\", \"tokens\": %u}\n",
               res.finish_reason < 6 ? finish[res.finish_reason] : "?", res.n_generated_tokens);
        free(b.s);
    }
    llm_session_free(s);
    llm_grammar_free(g);
    llm_model_free(m);
    free(text);
    return rc;
}

/* ---- accept ---- */

/* Decodes one JSON string literal (the whole line) into out; its length. */
static long json_unquote(const char *s, char *out) {
    if (*s++ != '"')
        return -1;
    long n = 0;
    while (*s && *s != '"') {
        if (*s != '\\') {
            out[n++] = *s++;
            continue;
        }
        s++;
        char e = *s++;
        if (e == 'n')
            out[n++] = '\n';
        else if (e == 't')
            out[n++] = '\t';
        else if (e == 'r')
            out[n++] = '\r';
        else if (e == 'u') {
            unsigned cp = 0;
            if (sscanf(s, "%4x", &cp) != 1)
                return -1;
            s += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && s[0] == '\\' && s[1] == 'u') {
                unsigned lo = 0;
                if (sscanf(s + 2, "%4x", &lo) != 1)
                    return -1;
                s += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            n += (long)llmi_utf8_encode(cp, out + n);
        } else
            out[n++] = e;
    }
    return *s == '"' ? n : -1;
}

static int cmd_accept(int argc, char **argv) {
    if (argc != 4)
        return usage();
    size_t len = 0;
    char *text = read_file(argv[3], &len);
    if (!text)
        return 2;
    bool regex = !strcmp(argv[2], "--regex");
    if (regex)
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
            text[--len] = 0;
    llmi_grammar *g = NULL;
    llm_status st = regex ? llmi_grammar_from_regex(text, len, &g)
                          : llmi_grammar_from_ebnf(text, len, "root", &g);
    if (st != LLM_OK) {
        fprintf(stderr, "compile: %s\n", llmi_error_message());
        return 2;
    }
    static char line[1 << 16], buf[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        long n = json_unquote(line, buf);
        if (n < 0) {
            fprintf(stderr, "bad input line\n");
            return 2;
        }
        llmi_gstate *s = NULL;
        if (llmi_gstate_create(g, &s) != LLM_OK)
            return 2;
        bool ok = llmi_gstate_accept_bytes(s, buf, (size_t)n) == LLM_OK && llmi_gstate_can_end(s);
        printf("%d\n", ok);
        llmi_gstate_free(s);
    }
    llmi_grammar_free(g);
    free(text);
    return 0;
}

/* ---- bench ---- */

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double q) {
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i];
}

typedef struct times {
    double *v;
    size_t n, cap;
} times;

static void push_time(times *t, double x) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->v = realloc(t->v, t->cap * sizeof *t->v);
    }
    t->v[t->n++] = x;
}

/* A walk of up to 64 tokens drawn uniformly from the allowed ones. */
static void walk(llm_grammar *g, uint32_t n_vocab, uint64_t seed, times *out) {
    llm_grammar_state *s = NULL;
    if (llm_grammar_state_create(g, &s) != LLM_OK)
        return;
    size_t words = (n_vocab + 31) / 32;
    uint32_t *mask = malloc(words * 4);
    for (int step = 0; step < 64; step++) {
        double t0 = llmi_now();
        if (llm_grammar_state_fill_mask(s, mask, words) != LLM_OK)
            break;
        push_time(out, (llmi_now() - t0) * 1e6);
        uint32_t n = 0;
        for (size_t w = 0; w < words; w++)
            n += (uint32_t)__builtin_popcount(mask[w]);
        if (n == 0)
            break;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t pick = (uint32_t)(seed >> 33) % n, t = 0;
        for (;; t++)
            if ((mask[t >> 5] >> (t & 31)) & 1 && pick-- == 0)
                break;
        if (llm_grammar_state_accept_token(s, (llm_token)t) != LLM_OK)
            break;
        bool done = false;
        llm_grammar_state_is_complete(s, &done);
        if (done)
            break;
    }
    free(mask);
    llm_grammar_state_free(s);
}

static double gen_tps(llm_session *s, const llm_model *m, const llm_grammar *g, int n_tok) {
    llm_token toks[64];
    size_t n = 0;
    const char *prompt = "Describe a person as JSON:\n";
    llm_tokenize(m, prompt, strlen(prompt), LLM_TOKENIZE_ADD_SPECIAL, toks, 64, &n);
    llm_sampling_params smp;
    llm_sampling_params_init(&smp);
    smp.temperature = 0.0f;
    smp.grammar = g;
    llm_generate_params p;
    llm_generate_params_init(&p);
    p.max_new_tokens = (uint32_t)n_tok;
    p.sampling = &smp;
    p.ignore_eos = g == NULL;
    llm_generate_result res = {.struct_size = sizeof res};
    if (llm_generate(s, toks, n, &p, &res) != LLM_OK)
        return 0;
    return res.generate_seconds > 0 && res.n_generated_tokens > 1
               ? (res.n_generated_tokens - 1) / res.generate_seconds
               : 0;
}

static int cmd_bench(int argc, char **argv) {
    const char *model = NULL, *dir = NULL;
    int threads = 2, walks = 4;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--schemas"))
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--walks"))
            walks = atoi(argv[i + 1]);
        else
            return usage();
    }
    if (!model || !dir)
        return usage();
    llm_model *m = load(model, -1);
    if (!m)
        return 2;
    llm_model_info info = {.struct_size = sizeof info};
    llm_model_get_info(m, &info);
    DIR *d = opendir(dir);
    if (!d)
        return 2;
    char *names[256];
    int n_names = 0;
    for (struct dirent *e; (e = readdir(d)) && n_names < 256;)
        if (strstr(e->d_name, ".json"))
            names[n_names++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n_names, sizeof *names, cmp_name);
    times cold = {0}, warm = {0};
    printf("{\n  \"model\": \"%s\",\n  \"n_vocab\": %u,\n  \"compile_ms\": {", model, info.n_vocab);
    llm_grammar *first = NULL;
    double compile_sum = 0;
    uint32_t chains_max = 0;
    size_t table_max = 0;
    for (int i = 0; i < n_names; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        size_t len = 0;
        char *text = read_file(path, &len);
        llm_grammar *g = NULL;
        double t0 = llmi_now();
        llm_status st = text ? llm_grammar_compile_json_schema(m, text, len, NULL, &g) : LLM_ERR_IO;
        double ms = (llmi_now() - t0) * 1e3;
        free(text);
        printf("%s\n    \"%s\": %.2f", i ? "," : "", names[i], st == LLM_OK ? ms : -1.0);
        if (st != LLM_OK)
            continue;
        compile_sum += ms;
        if (g->posmasks) { /* the position masks (lib/grammar/posmask.c) */
            uint32_t c = llmi_gpostable_size(g->posmasks);
            size_t b = llmi_gpostable_bytes(g->posmasks);
            chains_max = c > chains_max ? c : chains_max;
            table_max = b > table_max ? b : table_max;
        }
        for (int w = 0; w < walks; w++)
            walk(g, info.n_vocab, 1000 + (uint64_t)w, &cold);
        for (int w = 0; w < walks; w++)
            walk(g, info.n_vocab, 1000 + (uint64_t)w, &warm);
        if (!first)
            first = g;
        else
            llm_grammar_free(g);
    }
    size_t n_masks = cold.n;
    printf("\n  },\n  \"compile_ms_mean\": %.2f,\n", n_names ? compile_sum / n_names : 0);
    printf("  \"position_masks_max\": {\"chains\": %u, \"kib\": %.1f},\n", chains_max,
           table_max / 1024.0);
    printf("  \"masks\": %zu,\n  \"mask_us_cold\": {\"p50\": %.1f, \"p99\": %.1f},\n", n_masks,
           pct(cold.v, cold.n, 0.5), pct(cold.v, cold.n, 0.99));
    printf("  \"mask_us_warm\": {\"p50\": %.1f, \"p99\": %.1f},\n", pct(warm.v, warm.n, 0.5),
           pct(warm.v, warm.n, 0.99));
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = threads;
    llm_session *s = NULL;
    if (llm_session_create(m, &sp, &s) != LLM_OK)
        return 2;
    gen_tps(s, m, NULL, 16); /* warm-up */
    double plain = gen_tps(s, m, NULL, 96), constrained = gen_tps(s, m, first, 96);
    printf("  \"threads\": %d,\n  \"tokens_per_s\": {\"unconstrained\": %.1f, \"constrained\": "
           "%.1f, \"ratio\": %.3f}\n}\n",
           threads, plain, constrained, plain > 0 ? constrained / plain : 0);
    llm_session_free(s);
    llm_grammar_free(first);
    llm_model_free(m);
    for (int i = 0; i < n_names; i++)
        free(names[i]);
    free(cold.v);
    free(warm.v);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return usage();
    if (!strcmp(argv[1], "gen"))
        return cmd_gen(argc, argv);
    if (!strcmp(argv[1], "bench"))
        return cmd_bench(argc, argv);
    if (!strcmp(argv[1], "accept"))
        return cmd_accept(argc, argv);
    return usage();
}
