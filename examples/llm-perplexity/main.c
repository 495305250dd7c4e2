/* llm-perplexity: teacher-forced perplexity of a model on a text file, to
 * measure what a KV cache type (or anything else) costs in quality.
 *
 *   llm-perplexity -m MODEL -f TEXT [--kv-type f32|f16|bf16|q8_0|q4_0|fp8]
 *                  [--ctx N] [--threads N]
 *
 * The text is tokenized whole (no BOS/EOS added) and read in windows of
 * --ctx tokens (default 256) that start every ctx/2 tokens: each window is
 * decoded from an empty sequence and scores the tokens of its second half
 * (the first window scores all but its first token), so every token after
 * the first is scored once, with at least ctx/2 - 1 tokens of context
 * (fewer only in the first window). Perplexity = exp(mean negative
 * log-likelihood), the log-softmax taken in double.
 *
 * Prints one JSON object: {"kv_type", "tokens" (scored), "perplexity",
 * "kv_bytes_per_token", "ctx", "nll"}. kv_bytes_per_token is what one
 * token takes in the session's KV pool (K and V of every layer), found
 * through the public API from the sizes of small pools (0 if it could not
 * be found).
 *
 * Comparing two runs token by token (what a KV type costs, measured more
 * finely than by perplexity alone):
 *   --kld-base FILE  saves this run's per-token distributions: each scored
 *                    token's nll and the log-probabilities of the
 *                    --kld-top-k (default 1024) most likely tokens;
 *   --kld FILE       compares this run with such a file (same model, text
 *                    and --ctx) and adds to the JSON: "base_perplexity",
 *                    "delta_ppl_pct" (100 * (ppl / base ppl - 1)) and
 *                    "delta_ppl_pct_se" (its standard error from the
 *                    per-token nll differences, tokens taken as
 *                    independent), "kld_mean" and "kld_mean_se",
 *                    "kld_median", "kld_p99", "kld_max" (KL(base || this)
 *                    per token, over the base's top-k tokens and one bucket
 *                    for the rest: a lower bound, exact when top-k is the
 *                    vocabulary), "kld_top_k", "same_top_pct" and
 *                    "same_top_pct_se" (how often both runs' most likely
 *                    token is the same). kld.h describes the file.
 *
 * Uses llm.h only. Exit status 0 on success, 1 on a usage or library error
 * (the message on stderr). */
#include "kld.h"
#include "llm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kv_name {
    const char *name;
    llm_kv_type type;
} kv_name;

static const kv_name kv_names[] = {
    {"f32", LLM_KV_F32},   {"f16", LLM_KV_F16},   {"bf16", LLM_KV_BF16},
    {"q8_0", LLM_KV_Q8_0}, {"q4_0", LLM_KV_Q4_0}, {"fp8", LLM_KV_FP8_E4M3},
};

static const char USAGE[] =
    "usage: llm-perplexity -m MODEL -f TEXT [--kv-type f32|f16|bf16|q8_0|q4_0|fp8]\n"
    "                      [--ctx N] [--threads N] [--kld-base FILE | --kld FILE]\n"
    "                      [--kld-top-k K]\n";

static int usage(const char *msg) {
    fprintf(stderr, "llm-perplexity: %s\n%s", msg, USAGE);
    return 1;
}

static int fail(const char *what, llm_status st) {
    fprintf(stderr, "llm-perplexity: %s: %s: %s\n", what, llm_status_str(st), llm_last_error());
    return 1;
}

/* The whole file, NUL-terminated; NULL (after a message) on failure. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llm-perplexity: cannot open %s\n", path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = realloc(buf, 2 * cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (!buf || ferror(f)) {
        fprintf(stderr, "llm-perplexity: cannot read %s\n", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Blocks of one token slot a pool of `bytes` holds (0 when none, or when
 * the session cannot be made). */
static uint32_t slots_for(const llm_model *m, llm_kv_type type, uint64_t bytes) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 1;
    sp.n_ctx = 16;
    sp.max_batch_tokens = 16;
    sp.kv_block_size = 1;
    sp.kv_cache_bytes = bytes;
    sp.kv_type = type;
    llm_session *s = NULL;
    if (llm_session_create(m, &sp, &s) != LLM_OK)
        return 0;
    llm_session_stats st = {sizeof st};
    uint32_t n = llm_session_get_stats(s, &st) == LLM_OK ? st.blocks_total : 0;
    llm_session_free(s);
    return n;
}

/* KV bytes per token as the library sizes its pool: a pool of one-token
 * blocks holds floor(bytes / B) of them, so one pool of PROBE bytes puts B
 * in a narrow range and a few one-block pools find it exactly. 0 if the
 * pool cannot be made (then the caller prints null). */
static uint64_t kv_bytes_per_token(const llm_model *m, llm_kv_type type) {
    enum { PROBE = 1 << 28 };
    const uint32_t n = slots_for(m, type, PROBE);
    if (n == 0)
        return 0;
    uint64_t lo = (uint64_t)PROBE / (n + 1ull) + 1, hi = (uint64_t)PROBE / n;
    while (lo < hi) { /* the least pool size that holds one token */
        const uint64_t mid = lo + (hi - lo) / 2;
        if (slots_for(m, type, mid) >= 1)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* What is done with each scored row: its nll summed, and the row saved to
 * or compared with a base file. */
typedef struct scorer {
    uint32_t n_vocab;
    double nll;
    size_t scored;
    kld_writer *base_out; /* --kld-base, or NULL */
    kld_reader *base_in;  /* --kld, or NULL */
    const char *err;      /* set when a row could not be saved or compared */
} scorer;

static void score_row(scorer *sc, const float *logits, llm_token target) {
    const double lse = kld_log_sum_exp(logits, sc->n_vocab);
    const double nll = lse - (double)logits[target];
    sc->nll += nll;
    sc->scored++;
    if (sc->base_out && kld_writer_row(sc->base_out, logits, lse, nll) != 0)
        sc->err = "cannot write the base file";
    if (sc->base_in)
        kld_reader_row(sc->base_in, logits, lse, nll, &sc->err);
}

/* Decodes tokens [start, start + len) into a fresh sequence and scores
 * each token in [score_from, start + len) given the ones before. */
static llm_status score_window(llm_session *s, llm_batch *b, const llm_token *tok, size_t start,
                               size_t len, size_t score_from, scorer *sc) {
    llm_seq_id seq;
    llm_status st = llm_seq_open(s, &seq);
    if (st != LLM_OK)
        return st;
    llm_batch_clear(b);
    for (size_t i = 0; i < len && st == LLM_OK; i++) {
        /* Row i predicts token start + i + 1. */
        const bool want = start + i + 1 < start + len && start + i + 1 >= score_from;
        st = llm_batch_add(b, seq, (uint32_t)i, tok[start + i], want);
    }
    if (st == LLM_OK)
        st = llm_session_decode(s, b);
    for (size_t i = 0; i + 1 < len && st == LLM_OK && !sc->err; i++) {
        if (start + i + 1 < score_from)
            continue;
        const float *logits = NULL;
        st = llm_session_logits(s, (uint32_t)i, &logits);
        if (st == LLM_OK)
            score_row(sc, logits, tok[start + i + 1]);
    }
    llm_status cst = llm_seq_close(s, seq);
    return st != LLM_OK ? st : cst;
}

/* The windows: [start, start + len) scoring [from, start + len). The first
 * is (0, 0, 0); false after the last. */
static bool next_window(size_t n_tok, size_t ctx, size_t *start, size_t *len, size_t *from) {
    const size_t half = ctx / 2;
    if (*len != 0) {
        if (*start + *len == n_tok)
            return false;
        *start += half;
    }
    *len = n_tok - *start < ctx ? n_tok - *start : ctx;
    *from = *start == 0 ? 1 : *start + half;
    return *from < *start + *len;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL;
    const kv_name *kv = &kv_names[0];
    const char *kld_base_path = NULL, *kld_path = NULL;
    long ctx = 256, threads = 0, top_k = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("llm-perplexity: teacher-forced perplexity of a text file, as JSON\n%s", USAGE);
            return 0;
        }
        if (!v)
            return usage("every option takes a value");
        i++;
        if (!strcmp(a, "-m"))
            model_path = v;
        else if (!strcmp(a, "-f"))
            text_path = v;
        else if (!strcmp(a, "--ctx"))
            ctx = strtol(v, NULL, 10);
        else if (!strcmp(a, "--threads"))
            threads = strtol(v, NULL, 10);
        else if (!strcmp(a, "--kld-base"))
            kld_base_path = v;
        else if (!strcmp(a, "--kld"))
            kld_path = v;
        else if (!strcmp(a, "--kld-top-k"))
            top_k = strtol(v, NULL, 10);
        else if (!strcmp(a, "--kv-type")) {
            kv = NULL;
            for (size_t k = 0; k < sizeof kv_names / sizeof kv_names[0]; k++)
                if (!strcmp(v, kv_names[k].name))
                    kv = &kv_names[k];
            if (!kv)
                return usage("--kv-type is one of f32, f16, bf16, q8_0, q4_0, fp8");
        } else
            return usage("unknown option");
    }
    if (!model_path || !text_path)
        return usage("-m and -f are required");
    if (ctx < 4 || ctx > 65536 || threads < 0 || threads > 512)
        return usage("--ctx is 4..65536, --threads 0..512");
    if (kld_base_path && kld_path)
        return usage("--kld-base saves a base run, --kld compares with one: not both");
    if (top_k < 1 || top_k > 1 << 20)
        return usage("--kld-top-k is 1..1048576");

    size_t text_len = 0;
    char *text = read_file(text_path, &text_len);
    if (!text)
        return 1;
    int rc = 1;
    llm_model *m = NULL;
    llm_session *s = NULL;
    llm_batch *b = NULL;
    llm_token *tok = NULL;
    kld_writer base_out = {0};
    kld_reader base_in = {0};
    scorer sc = {0};
    llm_status st = llm_model_load(model_path, NULL, &m);
    if (st != LLM_OK) {
        rc = fail("loading the model", st);
        goto done;
    }
    llm_model_info info = {sizeof info};
    if ((st = llm_model_get_info(m, &info)) != LLM_OK) {
        rc = fail("model info", st);
        goto done;
    }
    size_t n_tok = 0;
    st = llm_tokenize(m, text, text_len, 0, NULL, 0, &n_tok);
    if (st != LLM_OK && st != LLM_ERR_BUFFER_TOO_SMALL) {
        rc = fail("tokenizing", st);
        goto done;
    }
    tok = malloc((n_tok ? n_tok : 1) * sizeof *tok);
    if (!tok || (st = llm_tokenize(m, text, text_len, 0, tok, n_tok, &n_tok)) != LLM_OK) {
        rc = tok ? fail("tokenizing", st) : usage("out of memory");
        goto done;
    }
    if (n_tok < 2) {
        rc = usage("the text has fewer than 2 tokens");
        goto done;
    }
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = (uint32_t)threads;
    sp.n_ctx = (uint32_t)ctx;
    sp.kv_type = kv->type;
    sp.prefix_cache = false; /* every window is computed, never reused */
    if ((st = llm_session_create(m, &sp, &s)) != LLM_OK) {
        rc = fail("creating the session", st);
        goto done;
    }
    if ((st = llm_batch_create((uint32_t)ctx, &b)) != LLM_OK) {
        rc = fail("batch", st);
        goto done;
    }
    sc.n_vocab = info.n_vocab;
    size_t start = 0, len = 0, from = 0;
    kld_header kh = {info.n_vocab, (uint32_t)top_k, (uint32_t)ctx, n_tok, 0, 0};
    kh.top_k = kh.top_k < kh.n_vocab ? kh.top_k : kh.n_vocab;
    kh.token_hash = kld_token_hash(tok, n_tok);
    while (next_window(n_tok, (size_t)ctx, &start, &len, &from))
        kh.n_scored += start + len - from;
    const char *err = NULL;
    if (kld_base_path) {
        if (kld_writer_open(&base_out, kld_base_path, &kh, &err) != 0) {
            fprintf(stderr, "llm-perplexity: %s: %s\n", kld_base_path, err);
            goto done;
        }
        sc.base_out = &base_out;
    }
    if (kld_path) {
        if (kld_reader_open(&base_in, kld_path, &kh, &err) != 0) {
            fprintf(stderr, "llm-perplexity: %s: %s\n", kld_path, err);
            goto done;
        }
        sc.base_in = &base_in;
    }
    start = len = 0;
    while (next_window(n_tok, (size_t)ctx, &start, &len, &from)) {
        st = score_window(s, b, tok, start, len, from, &sc);
        if (st != LLM_OK) {
            rc = fail("decoding", st);
            goto done;
        }
        if (sc.err) {
            fprintf(stderr, "llm-perplexity: %s\n", sc.err);
            goto done;
        }
    }
    if (kld_base_path) {
        sc.base_out = NULL;
        if (kld_writer_close(&base_out) != 0) {
            fprintf(stderr, "llm-perplexity: %s: cannot write the base file\n", kld_base_path);
            goto done;
        }
    }
    const uint64_t per_token = kv_bytes_per_token(m, kv->type);
    printf("{\"kv_type\": \"%s\", \"tokens\": %zu, \"perplexity\": %.6f, "
           "\"kv_bytes_per_token\": %llu, \"ctx\": %ld, \"nll\": %.6f",
           kv->name, sc.scored, exp(sc.nll / (double)sc.scored), (unsigned long long)per_token, ctx,
           sc.nll / (double)sc.scored);
    if (kld_path)
        kld_reader_print(&base_in, stdout);
    printf("}\n");
    rc = 0;
done:
    if (sc.base_out)
        kld_writer_close(&base_out);
    kld_reader_close(&base_in);
    llm_batch_free(b);
    llm_session_free(s);
    llm_model_free(m);
    free(tok);
    free(text);
    return rc;
}
