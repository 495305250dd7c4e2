/* llm-perplexity's base file and KL divergence statistics (kld.h). */
#include "kld.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char MAGIC[8] = {'L', 'L', 'M', 'K', 'L', 'D', 'B', '1'};

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_f32(uint8_t *p, float f) {
    uint32_t v;
    memcpy(&v, &f, sizeof v);
    put_u32(p, v);
}

static float get_f32(const uint8_t *p) {
    const uint32_t v = get_u32(p);
    float f;
    memcpy(&f, &v, sizeof f);
    return f;
}

uint64_t kld_token_hash(const int32_t *tok, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++)
            h = (h ^ (((uint32_t)tok[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    return h;
}

size_t kld_record_bytes(uint32_t top_k) { return 4 + 8 * (size_t)top_k; }

void kld_header_encode(const kld_header *h, uint8_t out[KLD_HEADER_BYTES]) {
    memcpy(out, MAGIC, sizeof MAGIC);
    put_u32(out + 8, h->n_vocab);
    put_u32(out + 12, h->top_k);
    put_u32(out + 16, h->ctx);
    put_u32(out + 20, 0);
    put_u64(out + 24, h->text_tokens);
    put_u64(out + 32, h->token_hash);
    put_u64(out + 40, h->n_scored);
}

const char *kld_header_decode(const uint8_t *buf, size_t len, kld_header *h) {
    if (len < KLD_HEADER_BYTES || memcmp(buf, MAGIC, sizeof MAGIC) != 0)
        return "not an llm-perplexity base file";
    h->n_vocab = get_u32(buf + 8);
    h->top_k = get_u32(buf + 12);
    h->ctx = get_u32(buf + 16);
    h->text_tokens = get_u64(buf + 24);
    h->token_hash = get_u64(buf + 32);
    h->n_scored = get_u64(buf + 40);
    if (get_u32(buf + 20) != 0)
        return "unknown base file version";
    if (h->n_vocab == 0 || h->n_vocab > INT32_MAX || h->top_k == 0 || h->top_k > h->n_vocab)
        return "the base file's vocabulary or top-k is out of range";
    if (h->n_scored == 0 || h->n_scored >= h->text_tokens)
        return "the base file's count of scored tokens is out of range";
    return NULL;
}

double kld_log_sum_exp(const float *logits, uint32_t n) {
    double mx = -INFINITY, sum = 0.0;
    for (uint32_t i = 0; i < n; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)logits[i] - mx);
    return log(sum) + mx;
}

/* ---- the base side ---- */

/* Whether token a ranks below token b: less likely, or as likely with a
 * larger id (so the first of equal maxima ranks first, as an argmax). */
static int ranks_below(const float *logits, int32_t a, int32_t b) {
    return logits[a] < logits[b] || (logits[a] == logits[b] && a > b);
}

static void sift_down(int32_t *heap, uint32_t n, uint32_t i, const float *logits) {
    for (;;) {
        uint32_t lo = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_below(logits, heap[l], heap[lo]))
            lo = l;
        if (r < n && ranks_below(logits, heap[r], heap[lo]))
            lo = r;
        if (lo == i)
            return;
        const int32_t t = heap[i];
        heap[i] = heap[lo];
        heap[lo] = t;
        i = lo;
    }
}

int kld_writer_open(kld_writer *w, const char *path, const kld_header *h, const char **err) {
    memset(w, 0, sizeof *w);
    w->n_vocab = h->n_vocab;
    w->top_k = h->top_k;
    w->heap = malloc((size_t)h->top_k * sizeof *w->heap);
    w->record = malloc(kld_record_bytes(h->top_k));
    if (!w->heap || !w->record) {
        *err = "out of memory";
        goto fail;
    }
    w->f = fopen(path, "wb");
    if (!w->f) {
        *err = "cannot create the base file";
        goto fail;
    }
    uint8_t head[KLD_HEADER_BYTES];
    kld_header_encode(h, head);
    if (fwrite(head, 1, sizeof head, w->f) != sizeof head) {
        *err = "cannot write the base file";
        fclose(w->f);
        goto fail;
    }
    return 0;
fail:
    free(w->heap);
    free(w->record);
    memset(w, 0, sizeof *w);
    return -1;
}

int kld_writer_row(kld_writer *w, const float *logits, double lse, double nll) {
    const uint32_t k = w->top_k;
    int32_t *heap = w->heap;
    for (uint32_t i = 0; i < k; i++)
        heap[i] = (int32_t)i;
    for (uint32_t i = k / 2; i-- > 0;)
        sift_down(heap, k, i, logits);
    for (uint32_t i = k; i < w->n_vocab; i++) {
        if (ranks_below(logits, (int32_t)i, heap[0]))
            continue;
        heap[0] = (int32_t)i;
        sift_down(heap, k, 0, logits);
    }
    /* Pop the least likely to the end: the array ends up most likely first. */
    for (uint32_t n = k; n > 1; n--) {
        const int32_t t = heap[0];
        heap[0] = heap[n - 1];
        heap[n - 1] = t;
        sift_down(heap, n - 1, 0, logits);
    }
    uint8_t *p = w->record;
    put_f32(p, (float)nll);
    for (uint32_t i = 0; i < k; i++) {
        put_f32(p + 4 + 4 * (size_t)i, (float)((double)logits[heap[i]] - lse));
        put_u32(p + 4 + 4 * (size_t)k + 4 * (size_t)i, (uint32_t)heap[i]);
    }
    return fwrite(p, 1, kld_record_bytes(k), w->f) == kld_record_bytes(k) ? 0 : -1;
}

int kld_writer_close(kld_writer *w) {
    int rc = 0;
    if (w->f) {
        rc = ferror(w->f) ? -1 : 0;
        if (fclose(w->f) != 0)
            rc = -1;
    }
    free(w->heap);
    free(w->record);
    memset(w, 0, sizeof *w);
    return rc;
}

/* ---- the compared side ---- */

int kld_reader_open(kld_reader *r, const char *path, const kld_header *want, const char **err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        memset(r, 0, sizeof *r);
        *err = "cannot open the base file";
        return -1;
    }
    return kld_reader_attach(r, f, want, err);
}

int kld_reader_attach(kld_reader *r, FILE *f, const kld_header *want, const char **err) {
    memset(r, 0, sizeof *r);
    uint8_t head[KLD_HEADER_BYTES];
    r->f = f;
    const size_t got = fread(head, 1, sizeof head, r->f);
    if ((*err = kld_header_decode(head, got, &r->h)) != NULL)
        goto fail;
    if (r->h.n_vocab != want->n_vocab || r->h.text_tokens != want->text_tokens ||
        r->h.token_hash != want->token_hash) {
        *err = "the base file was made with another vocabulary or text (token ids differ)";
        goto fail;
    }
    if (r->h.ctx != want->ctx || r->h.n_scored != want->n_scored) {
        *err = "the base file was made with another --ctx";
        goto fail;
    }
    /* The records fill the rest of the file exactly (checked by division:
     * the header's counts may be anything). */
    const size_t rec = kld_record_bytes(r->h.top_k);
    const long end = fseek(r->f, 0, SEEK_END) == 0 ? ftell(r->f) : -1;
    if (end < KLD_HEADER_BYTES || (uint64_t)(end - KLD_HEADER_BYTES) % rec != 0 ||
        (uint64_t)(end - KLD_HEADER_BYTES) / rec != r->h.n_scored ||
        fseek(r->f, KLD_HEADER_BYTES, SEEK_SET) != 0) {
        *err = "the base file's size does not match its header";
        goto fail;
    }
    r->record = malloc(rec);
    r->kld = malloc((size_t)r->h.n_scored * sizeof *r->kld);
    if (!r->record || !r->kld) {
        *err = "out of memory";
        goto fail;
    }
    return 0;
fail:
    kld_reader_close(r);
    return -1;
}

int kld_reader_row(kld_reader *r, const float *logits, double lse, double nll, const char **err) {
    const uint32_t k = r->h.top_k;
    if (r->n >= r->h.n_scored ||
        fread(r->record, 1, kld_record_bytes(k), r->f) != kld_record_bytes(k)) {
        *err = "the base file ends early";
        return -1;
    }
    const uint8_t *p = r->record;
    const double nll_base = get_f32(p);
    double head = 0.0, mass_p = 0.0, mass_q = 0.0;
    for (uint32_t i = 0; i < k; i++) {
        const uint32_t id = get_u32(p + 4 + 4 * (size_t)k + 4 * (size_t)i);
        const double lp = get_f32(p + 4 + 4 * (size_t)i);
        if (id >= r->h.n_vocab || !(lp <= 0.0)) {
            *err = "the base file holds a bad token id or log-probability";
            return -1;
        }
        /* Rounded to float like the base's values, so a run identical to
         * the base gives exactly 0. */
        const double lq = (float)((double)logits[id] - lse);
        head += exp(lp) * (lp - lq);
        mass_p += exp(lp);
        mass_q += exp(lq);
    }
    const double tail_p = mass_p < 1.0 ? 1.0 - mass_p : 0.0;
    const double tail_q = mass_q < 1.0 ? 1.0 - mass_q : 0.0;
    double kld = head;
    if (tail_p > 0.0)
        kld += tail_p * (log(tail_p) - log(tail_q > 1e-300 ? tail_q : 1e-300));
    /* The base's first token against this row's argmax (first of equals). */
    uint32_t top = 0;
    for (uint32_t i = 1; i < r->h.n_vocab; i++)
        top = logits[i] > logits[top] ? i : top;
    r->same_top += top == get_u32(p + 4 + 4 * (size_t)k);
    const double d = (double)(float)nll - nll_base; /* 0 for a run identical to the base */
    r->kld[r->n++] = kld;
    r->sum_nll_base += nll_base;
    r->sum_d += d;
    r->sum_d2 += d * d;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of n sorted values, interpolated linearly between order
 * statistics (numpy's default). */
static double quantile(const double *v, size_t n, double q) {
    const double pos = q * (double)(n - 1);
    const size_t lo = (size_t)pos;
    return lo + 1 < n ? v[lo] + (pos - (double)lo) * (v[lo + 1] - v[lo]) : v[n - 1];
}

/* Mean and standard error of the mean of n values from their sums. */
static void mean_se(double sum, double sum2, size_t n, double *mean, double *se) {
    *mean = sum / (double)n;
    const double var = n > 1 ? (sum2 - sum * *mean) / (double)(n - 1) : 0.0;
    *se = var > 0.0 ? sqrt(var / (double)n) : 0.0;
}

void kld_reader_print(kld_reader *r, FILE *out) {
    const size_t n = r->n;
    if (n == 0)
        return;
    double sum = 0.0, sum2 = 0.0, mean, se, d, d_se;
    for (size_t i = 0; i < n; i++) {
        sum += r->kld[i];
        sum2 += r->kld[i] * r->kld[i];
    }
    mean_se(sum, sum2, n, &mean, &se);
    mean_se(r->sum_d, r->sum_d2, n, &d, &d_se);
    qsort(r->kld, n, sizeof *r->kld, cmp_double);
    const double ratio = exp(d), same = (double)r->same_top / (double)n;
    fprintf(out,
            ", \"base_perplexity\": %.6f, \"delta_ppl_pct\": %.4f, \"delta_ppl_pct_se\": %.4f, "
            "\"kld_mean\": %.9f, \"kld_mean_se\": %.9f, \"kld_median\": %.9f, "
            "\"kld_p99\": %.9f, \"kld_max\": %.9f, \"kld_top_k\": %u, "
            "\"same_top_pct\": %.3f, \"same_top_pct_se\": %.3f",
            exp(r->sum_nll_base / (double)n), 100.0 * (ratio - 1.0), 100.0 * ratio * d_se, mean, se,
            quantile(r->kld, n, 0.5), quantile(r->kld, n, 0.99), r->kld[n - 1], r->h.top_k,
            100.0 * same, 100.0 * sqrt(same * (1.0 - same) / (double)n));
}

void kld_reader_close(kld_reader *r) {
    if (r->f)
        fclose(r->f);
    free(r->record);
    free(r->kld);
    memset(r, 0, sizeof *r);
}
