/* llm-perplexity: teacher-forced perplexity of a model on a text file, to
 * measure what a KV cache type (or anything else) costs in quality.
 *
 *   llm-perplexity -m MODEL -f TEXT [--kv-type f32|f16|bf16|q8_0|q4_0]
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
 * "kv_bytes_per_token", "ctx", "nll"}. kv_bytes_per_token is K and V of
 * every layer, 2 * n_layers * n_kv_heads * head_dim elements with head_dim
 * = n_embd / n_heads (the models this is used on), at the type's size:
 * 4 (f32), 2 (f16, bf16), 34/32 (q8_0), 18/32 (q4_0) bytes per element.
 *
 * Uses llm.h only. Exit status 0 on success, 1 on a usage or library error
 * (the message on stderr). */
#include "llm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kv_name {
    const char *name;
    llm_kv_type type;
    double bytes_per_elem;
} kv_name;

static const kv_name kv_names[] = {
    {"f32", LLM_KV_F32, 4.0},           {"f16", LLM_KV_F16, 2.0},
    {"bf16", LLM_KV_BF16, 2.0},         {"q8_0", LLM_KV_Q8_0, 34.0 / 32.0},
    {"q4_0", LLM_KV_Q4_0, 18.0 / 32.0},
};

static int usage(const char *msg) {
    fprintf(stderr,
            "llm-perplexity: %s\n"
            "usage: llm-perplexity -m MODEL -f TEXT [--kv-type f32|f16|bf16|q8_0|q4_0]\n"
            "                      [--ctx N] [--threads N]\n",
            msg);
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

/* -log softmax(logits)[target], in double. */
static double nll_of(const float *logits, uint32_t n_vocab, llm_token target) {
    double mx = -INFINITY, sum = 0.0;
    for (uint32_t i = 0; i < n_vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (uint32_t i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - mx);
    return log(sum) + mx - (double)logits[target];
}

/* Decodes tokens [start, start + len) into a fresh sequence and adds the
 * NLL of each token in (score_from, start + len) given the ones before. */
static llm_status score_window(llm_session *s, llm_batch *b, const llm_token *tok, size_t start,
                               size_t len, size_t score_from, uint32_t n_vocab, double *nll,
                               size_t *n_scored) {
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
    for (size_t i = 0; i + 1 < len && st == LLM_OK; i++) {
        if (start + i + 1 < score_from)
            continue;
        const float *logits = NULL;
        st = llm_session_logits(s, (uint32_t)i, &logits);
        if (st == LLM_OK) {
            *nll += nll_of(logits, n_vocab, tok[start + i + 1]);
            (*n_scored)++;
        }
    }
    llm_status cst = llm_seq_close(s, seq);
    return st != LLM_OK ? st : cst;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL;
    const kv_name *kv = &kv_names[0];
    long ctx = 256, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
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
        else if (!strcmp(a, "--kv-type")) {
            kv = NULL;
            for (size_t k = 0; k < sizeof kv_names / sizeof kv_names[0]; k++)
                if (!strcmp(v, kv_names[k].name))
                    kv = &kv_names[k];
            if (!kv)
                return usage("--kv-type is one of f32, f16, bf16, q8_0, q4_0");
        } else
            return usage("unknown option");
    }
    if (!model_path || !text_path)
        return usage("-m and -f are required");
    if (ctx < 4 || ctx > 65536 || threads < 0 || threads > 512)
        return usage("--ctx is 4..65536, --threads 0..512");

    size_t text_len = 0;
    char *text = read_file(text_path, &text_len);
    if (!text)
        return 1;
    int rc = 1;
    llm_model *m = NULL;
    llm_session *s = NULL;
    llm_batch *b = NULL;
    llm_token *tok = NULL;
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
    const size_t half = (size_t)ctx / 2;
    double nll = 0.0;
    size_t scored = 0;
    for (size_t start = 0;; start += half) {
        const size_t len = n_tok - start < (size_t)ctx ? n_tok - start : (size_t)ctx;
        const size_t from = start == 0 ? 1 : start + half;
        if (from >= start + len)
            break;
        st = score_window(s, b, tok, start, len, from, info.n_vocab, &nll, &scored);
        if (st != LLM_OK) {
            rc = fail("decoding", st);
            goto done;
        }
        if (start + len == n_tok)
            break;
    }
    const double per_token = 2.0 * info.n_layers * info.n_kv_heads *
                             (double)(info.n_embd / info.n_heads) * kv->bytes_per_elem;
    printf("{\"kv_type\": \"%s\", \"tokens\": %zu, \"perplexity\": %.6f, "
           "\"kv_bytes_per_token\": %.0f, \"ctx\": %ld, \"nll\": %.6f}\n",
           kv->name, scored, exp(nll / (double)scored), per_token, ctx, nll / (double)scored);
    rc = 0;
done:
    llm_batch_free(b);
    llm_session_free(s);
    llm_model_free(m);
    free(tok);
    free(text);
    return rc;
}
