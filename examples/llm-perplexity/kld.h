/* llm-perplexity's comparison of a run against a saved base run: the base
 * file (--kld-base) and the statistics of the second run (--kld).
 *
 * The base file, little-endian:
 *   header (KLD_HEADER_BYTES): "LLMKLDB1", u32 n_vocab, u32 top_k, u32 ctx,
 *     u32 0, u64 text tokens, u64 FNV-1a 64 of the text's token ids (as
 *     little-endian u32), u64 scored tokens;
 *   one record per scored token, in scoring order (kld_record_bytes):
 *     f32 the token's negative log-likelihood, f32 log-probabilities of the
 *     base's top_k most likely tokens (descending; ties by ascending id),
 *     i32 their ids.
 * scripts/kv_quality_llamacpp.py writes the same format from llama.cpp.
 *
 * KL divergence from a record: the base's top_k tokens plus one bucket for
 * the rest of the vocabulary, KL(P || Q) over those top_k + 1 outcomes.
 * Merging outcomes never raises a KL divergence, so this is a lower bound
 * of the full-vocabulary value, exact when top_k = n_vocab.
 *
 * Nothing here needs llm.h: the file checks are plain code over bytes. */
#ifndef LLM_PERPLEXITY_KLD_H
#define LLM_PERPLEXITY_KLD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { KLD_HEADER_BYTES = 48 };

typedef struct kld_header {
    uint32_t n_vocab, top_k, ctx;
    uint64_t text_tokens, token_hash, n_scored;
} kld_header;

uint64_t kld_token_hash(const int32_t *tok, size_t n);
size_t kld_record_bytes(uint32_t top_k);
void kld_header_encode(const kld_header *h, uint8_t out[KLD_HEADER_BYTES]);
/* NULL when buf (len bytes) starts with a well-formed header, else why not. */
const char *kld_header_decode(const uint8_t *buf, size_t len, kld_header *h);

/* log(sum(exp(logits))) over n, in double. */
double kld_log_sum_exp(const float *logits, uint32_t n);

/* The base side: picks each row's top_k and writes its record. */
typedef struct kld_writer {
    FILE *f;
    uint32_t n_vocab, top_k;
    int32_t *heap;   /* top_k ids, the least likely at the root */
    uint8_t *record; /* kld_record_bytes(top_k) */
} kld_writer;

/* 0, or -1 with a message in err (a static string) and nothing to free. */
int kld_writer_open(kld_writer *w, const char *path, const kld_header *h, const char **err);
int kld_writer_row(kld_writer *w, const float *logits, double lse, double nll);
/* Flushes and closes; -1 when the file could not be written whole. */
int kld_writer_close(kld_writer *w);

/* The compared side: reads the base's records one by one and keeps the
 * per-token statistics. */
typedef struct kld_reader {
    FILE *f;
    kld_header h;
    uint8_t *record;
    double *kld; /* per scored token, h.n_scored */
    size_t n;
    double sum_nll_base, sum_d, sum_d2; /* d = nll - nll_base */
    size_t same_top;
} kld_reader;

/* Opens a base file and checks it against this run (the same vocabulary,
 * ctx, tokens and number of scored tokens); 0, or -1 with err set. */
int kld_reader_open(kld_reader *r, const char *path, const kld_header *want, const char **err);
/* The same on an open stream, which the reader then owns (closed by
 * kld_reader_close, or here on failure). */
int kld_reader_attach(kld_reader *r, FILE *f, const kld_header *want, const char **err);
/* Compares this run's row (its logits, their log-sum-exp, its nll) with the
 * next base record; -1 with err set on a short or malformed record. */
int kld_reader_row(kld_reader *r, const float *logits, double lse, double nll, const char **err);
/* Appends the statistics to a JSON object being printed (", \"key\": ..."). */
void kld_reader_print(kld_reader *r, FILE *out);
void kld_reader_close(kld_reader *r);

#endif
