/* Token sampling: greedy, temperature, top-k, top-p, min-p. Random numbers
 * come from a counter-based generator keyed by (seed, stream, position), so a
 * seeded request draws the same numbers whatever else runs beside it. */
#ifndef LLMI_SAMPLE_H
#define LLMI_SAMPLE_H

#include "core/core.h"

typedef struct llmi_candidate { llm_token id; float logit; float p; } llmi_candidate;

typedef struct llmi_sampler {
    uint32_t n_vocab;
    llmi_candidate *cand; /* scratch, n_vocab entries */
} llmi_sampler;

llm_status llmi_sampler_init(llmi_sampler *s, uint32_t n_vocab);
void llmi_sampler_destroy(llmi_sampler *s);

/* Copies and validates sampling params (NULL = greedy) into `out`, reading
 * only the bytes the caller's struct_size covers. */
llm_status llmi_sampling_params_read(const llm_sampling_params *in, llm_sampling_params *out);

/* Uniform double in [0, 1) for (seed, stream, counter). */
double llmi_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);

/* Picks the next token from logits (n_vocab floats; not modified). */
llm_token llmi_sample(llmi_sampler *s, const float *logits, const llm_sampling_params *p,
                      uint64_t stream, uint64_t position);

/* Index of the largest logit (lowest index on ties). */
llm_token llmi_argmax(const float *logits, uint32_t n);

#endif
