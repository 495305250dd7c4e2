#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>

llm_status llmi_sampler_init(llmi_sampler *s, uint32_t n_vocab) {
    s->n_vocab = n_vocab;
    s->cand = llmi_calloc(n_vocab, sizeof *s->cand);
    if (!s->cand) return llmi_oom("sampler candidates");
    return LLM_OK;
}

void llmi_sampler_destroy(llmi_sampler *s) {
    llmi_free(s->cand);
    s->cand = NULL;
}

llm_status llmi_sampling_params_read(const llm_sampling_params *in, llm_sampling_params *out) {
    llm_sampling_params_init(out);
    if (!in) {
        out->temperature = 0.0f;
        return LLM_OK;
    }
    if (in->struct_size < sizeof(uint32_t) || in->struct_size > (1u << 16))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.struct_size %u is invalid (call "
                          "llm_sampling_params_init)",
                          in->struct_size);
    size_t n = in->struct_size < sizeof *out ? in->struct_size : sizeof *out;
    memcpy(out, in, n);
    out->struct_size = sizeof *out;
    if (!(out->temperature >= 0.0f) || isinf(out->temperature))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "temperature %g must be finite and >= 0",
                          (double)out->temperature);
    if (out->top_k < 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "top_k %d must be >= 0", out->top_k);
    if (!(out->top_p > 0.0f && out->top_p <= 1.0f))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "top_p %g must be in (0, 1]",
                          (double)out->top_p);
    if (!(out->min_p >= 0.0f && out->min_p <= 1.0f))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "min_p %g must be in [0, 1]",
                          (double)out->min_p);
    return LLM_OK;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double llmi_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t h = splitmix64(seed);
    h = splitmix64(h ^ stream);
    h = splitmix64(h ^ counter);
    return (double)(h >> 11) * 0x1.0p-53;
}

llm_token llmi_argmax(const float *logits, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return (llm_token)best;
}

static int by_logit_desc(const void *a, const void *b) {
    const llmi_candidate *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Keeps the k largest logits at the front of cand, sorted descending. A
 * bounded selection keeps top-k cheap on large vocabularies. */
static uint32_t select_top(llmi_candidate *cand, uint32_t n, uint32_t k) {
    if (k == 0 || k >= n) {
        qsort(cand, n, sizeof *cand, by_logit_desc);
        return n;
    }
    /* Partial selection: sort the first k, then insert better ones. */
    qsort(cand, k, sizeof *cand, by_logit_desc);
    for (uint32_t i = k; i < n; i++) {
        if (by_logit_desc(&cand[i], &cand[k - 1]) >= 0) continue;
        llmi_candidate c = cand[i];
        uint32_t j = k - 1;
        while (j > 0 && by_logit_desc(&c, &cand[j - 1]) < 0) {
            cand[j] = cand[j - 1];
            j--;
        }
        cand[j] = c;
    }
    return k;
}

llm_token llmi_sample(llmi_sampler *s, const float *logits, const llm_sampling_params *p,
                      uint64_t stream, uint64_t position) {
    if (p->temperature <= 0.0f || p->top_k == 1) return llmi_argmax(logits, s->n_vocab);
    llmi_candidate *c = s->cand;
    for (uint32_t i = 0; i < s->n_vocab; i++) c[i] = (llmi_candidate){(llm_token)i, logits[i], 0};
    uint32_t n = select_top(c, s->n_vocab, (uint32_t)p->top_k);
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        c[i].p = (float)exp((double)(c[i].logit - c[0].logit) / p->temperature);
        sum += c[i].p;
    }
    /* top-p: the smallest prefix whose mass reaches top_p. */
    double cum = 0.0;
    uint32_t keep = n;
    for (uint32_t i = 0; i < n; i++) {
        cum += c[i].p / sum;
        if (cum >= p->top_p) {
            keep = i + 1;
            break;
        }
    }
    /* min-p: drop tokens less likely than min_p times the best one. */
    float floor = p->min_p * c[0].p;
    while (keep > 1 && c[keep - 1].p < floor) keep--;
    double mass = 0.0;
    for (uint32_t i = 0; i < keep; i++) mass += c[i].p;
    double u = llmi_rng_uniform(p->seed, stream, position) * mass;
    for (uint32_t i = 0; i < keep; i++) {
        u -= c[i].p;
        if (u < 0.0) return c[i].id;
    }
    return c[keep - 1].id;
}
