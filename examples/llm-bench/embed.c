/* llm-bench --embed: embedding throughput (llm_session_embed), sentences
 * per second at batch 1 (one call per sentence) and at batch 64 (64
 * sentences per call, sharing forward passes). Sentences are --requests
 * random token sequences of --prompt-len tokens; mean pooling, normalized. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct embed_result {
    size_t batch;
    double wall_s, sentences_s, tokens_s;
} embed_result;

/* Embeds every sentence, `batch` per call; fills r. */
static int run_batch(llm_session *s, const llm_token *const *in, const size_t *len, size_t n,
                     size_t batch, uint32_t n_embd, uint64_t tokens, embed_result *r) {
    float *out = malloc(batch * n_embd * sizeof *out);
    if (!out)
        return bench_fail("allocating the output", LLM_ERR_OUT_OF_MEMORY);
    llm_embed_params ep;
    llm_embed_params_init(&ep);
    ep.pooling = LLM_POOLING_MEAN;
    const double t0 = now_s();
    for (size_t i = 0; i < n; i += batch) {
        size_t k = n - i < batch ? n - i : batch, written = 0;
        llm_status st =
            llm_session_embed(s, in + i, len + i, k, &ep, out, batch * n_embd, &written);
        if (st != LLM_OK) {
            free(out);
            return bench_fail("embedding", st);
        }
    }
    r->batch = batch;
    r->wall_s = now_s() - t0;
    r->sentences_s = (double)n / r->wall_s;
    r->tokens_s = (double)tokens / r->wall_s;
    free(out);
    return 0;
}

static int write_json(const bench_opts *o, const llm_model_info *info, size_t n, uint64_t tokens,
                      const embed_result *rs, size_t n_rs) {
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "llm-bench: cannot write %s\n", o->json);
        return 2;
    }
    fprintf(f, "{\"benchmark\":\"embed\",\"model\":");
    bench_json_str(f, o->model);
    fprintf(f, ",\"architecture\":");
    bench_json_str(f, info->architecture);
    fprintf(f, ",\"n_embd\":%u,\"threads\":%ld,\"sentences\":%zu,\"tokens\":%llu,", info->n_embd,
            o->threads, n, (unsigned long long)tokens);
    fprintf(f, "\"sentence_len\":[%ld,%ld],\"seed\":%llu,\"pooling\":\"mean\",\"runs\":[",
            o->prompt_len.lo, o->prompt_len.hi, (unsigned long long)o->seed);
    for (size_t i = 0; i < n_rs; i++) {
        fprintf(f, "%s{\"batch\":%zu,\"wall_s\":", i ? "," : "", rs[i].batch);
        bench_json_num(f, rs[i].wall_s);
        fprintf(f, ",\"sentences_per_s\":");
        bench_json_num(f, rs[i].sentences_s);
        fprintf(f, ",\"tokens_per_s\":");
        bench_json_num(f, rs[i].tokens_s);
        fprintf(f, "}");
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : 2;
}

int bench_embed(const llm_model *model, const bench_opts *o) {
    llm_model_info info = {sizeof info};
    llm_status st = llm_model_get_info(model, &info);
    if (st != LLM_OK)
        return bench_fail("reading the model info", st);
    bench_workload w;
    if (bench_workload_make(model, o, &w) != 0)
        return 2;
    const size_t n = w.n;
    const llm_token **in = calloc(n ? n : 1, sizeof *in);
    size_t *len = calloc(n ? n : 1, sizeof *len);
    llm_session *s = NULL;
    int rc = in && len ? 0 : bench_fail("allocating the inputs", LLM_ERR_OUT_OF_MEMORY);
    uint64_t tokens = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        in[i] = w.req[i].prompt;
        len[i] = w.req[i].n_prompt;
        tokens += w.req[i].n_prompt;
    }
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = (uint32_t)o->threads;
    if (o->kv_cache_mb)
        sp.kv_cache_bytes = (uint64_t)o->kv_cache_mb << 20;
    if (o->max_batch_tokens)
        sp.max_batch_tokens = (uint32_t)o->max_batch_tokens;
    if (rc == 0 && (st = bench_session_create(model, &sp, o, &s)) != LLM_OK)
        rc = bench_fail("creating the session", st);
    embed_result rs[2];
    const size_t batches[2] = {1, 64};
    if (rc == 0 && o->warmup)
        rc = run_batch(s, in, len, n < 2 ? n : 2, 1, info.n_embd, 0, &rs[0]);
    for (size_t b = 0; rc == 0 && b < 2; b++) {
        fprintf(stderr, "llm-bench: embedding %zu sentences, %zu per call\n", n, batches[b]);
        rc = run_batch(s, in, len, n, batches[b], info.n_embd, tokens, &rs[b]);
    }
    if (rc == 0) {
        printf("embeddings: %zu sentences of %ld:%ld tokens (%llu in all), mean pooling, n_embd "
               "%u\n\n%-10s %10s %14s %12s\n",
               n, o->prompt_len.lo, o->prompt_len.hi, (unsigned long long)tokens, info.n_embd,
               "batch", "wall s", "sentences/s", "tokens/s");
        for (size_t b = 0; b < 2; b++)
            printf("%-10zu %10.2f %14.1f %12.1f\n", rs[b].batch, rs[b].wall_s, rs[b].sentences_s,
                   rs[b].tokens_s);
        printf("\nbatch 64 / batch 1: %.2fx\n", rs[1].sentences_s / rs[0].sentences_s);
        fflush(stdout);
        if (o->json)
            rc = write_json(o, &info, n, tokens, rs, 2);
    }
    llm_session_free(s);
    free(in);
    free(len);
    bench_workload_free(&w);
    return rc;
}
