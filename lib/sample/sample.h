/* Token sampling: logit bias, repetition/presence/frequency penalties, the
 * min_tokens end-of-generation ban, greedy, top-k, temperature, top-p and
 * min-p, in the order llm.h documents for llm_sampling_params. Random numbers
 * come from a counter-based generator keyed by (seed, stream, position), so a
 * seeded sequence draws the same numbers whatever else runs beside it.
 *
 * The pipeline is split in two so that a speculative-decoding verifier can
 * compare distributions: llmi_sample_dist() builds the final, renormalised
 * distribution, llmi_sample_pick() draws from it with a given u.
 * llmi_sample() is the two together with the keyed random number. */
#ifndef LLMI_SAMPLE_H
#define LLMI_SAMPLE_H

#include "core/core.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

/* One token of a distribution. `logit` is the processed logit (after bias,
 * penalties and bans; before temperature), `p` its final probability. */
typedef struct llmi_candidate {
    llm_token id;
    float logit;
    float p;
} llmi_candidate;

/* Scratch for one thread of sampling; nothing is allocated per call. */
typedef struct llmi_sampler {
    uint32_t n_vocab;
    llmi_candidate *cand; /* n_vocab entries: the last distribution built */
    float *work;          /* n_vocab: logits after bias, penalties and bans */
    uint32_t *counts;     /* per token, occurrences in the penalty window;
                             all zero between calls */
    llm_token *touched;   /* n_vocab entries: tokens a call made non-zero */
    /* Grammar: while `grammar` is set (borrowed, by the caller, around its
     * calls), llmi_sample_dist bans every token the state does not allow
     * before anything else. A mask that could not be computed leaves the
     * distribution unconstrained and its status in grammar_status, which
     * the caller checks (LLM_OK otherwise; the caller resets it). */
    llmi_gstate *grammar;
    uint32_t *allow; /* ceil(n_vocab / 32) words: the last mask */
    llm_status grammar_status;
} llmi_sampler;

llm_status llmi_sampler_init(llmi_sampler *s, uint32_t n_vocab);
void llmi_sampler_destroy(llmi_sampler *s);

/* Copies and validates sampling params (NULL = greedy) into `out`, reading
 * only the bytes the caller's struct_size covers. Bias tokens are checked
 * against n_vocab. out->logit_bias still points at the caller's array. */
llm_status llmi_sampling_params_read(const llm_sampling_params *in, uint32_t n_vocab,
                                     llm_sampling_params *out);
/* Same, but out->logit_bias is a copy `out` owns: release it with
 * llmi_sampling_params_free(). On failure nothing is owned. */
llm_status llmi_sampling_params_copy(const llm_sampling_params *in, uint32_t n_vocab,
                                     llm_sampling_params *out);
/* Frees what llmi_sampling_params_copy() allocated; harmless on zeroed params. */
void llmi_sampling_params_free(llm_sampling_params *p);

/* Uniform double in [0, 1) for (seed, stream, counter). */
double llmi_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);

/* The seed of sample `sample_index` of a request with several samples
 * (llm_request_params::n_samples): `seed` itself for sample 0, so that it
 * matches the request with one sample; a well-mixed function of both for
 * the others. */
uint64_t llmi_sample_seed(uint64_t seed, uint32_t sample_index);

/* Applies the pipeline (the grammar of s->grammar first, when set) to
 * `logits` (n_vocab floats; not modified) up to the
 * renormalised distribution and points *out at its candidates: sorted by
 * probability descending (by processed logit, lowest id on ties), p summing
 * to 1. Returns how many (at least 1). Greedy gives one candidate with
 * p = 1. `p` must come from llmi_sampling_params_read/copy. `history` is the
 * prompt then the generated tokens (ids outside the vocabulary are
 * ignored); `n_generated` of them were generated; `tok` names the
 * end-of-generation tokens that min_tokens bans (NULL: no ban). *out points
 * into the sampler's scratch, valid until its next call. */
uint32_t llmi_sample_dist(llmi_sampler *s, const float *logits, const llm_sampling_params *p,
                          const llm_token *history, size_t n_history, uint32_t n_generated,
                          const llmi_tokenizer *tok, llmi_candidate **out);

/* Draws from a distribution of n >= 1 candidates with u in [0, 1): the first
 * candidate whose cumulative probability exceeds u (the last one if
 * rounding leaves u beyond the total). */
llm_token llmi_sample_pick(const llmi_candidate *c, uint32_t n, double u);

/* Probability of token t in a distribution (0 when absent). */
float llmi_sample_prob(const llmi_candidate *c, uint32_t n, llm_token t);

/* Picks the next token: llmi_sample_dist, then llmi_sample_pick with
 * u = llmi_rng_uniform(p->seed, stream, position). */
llm_token llmi_sample(llmi_sampler *s, const float *logits, const llm_sampling_params *p,
                      const llm_token *history, size_t n_history, uint32_t n_generated,
                      const llmi_tokenizer *tok, uint64_t stream, uint64_t position);

/* The min(top_n, n_vocab) most likely tokens of log-softmax(logits), most
 * likely first (lowest id on ties), into tokens/logprobs. NaN logits count
 * as -infinity. Uses the sampler's candidate scratch. Returns the count. */
uint32_t llmi_logprobs_top(llmi_sampler *s, const float *logits, uint32_t top_n,
                           llm_token *tokens, float *logprobs);
/* The same in one pass, plus token `tok`'s log-probability as the return
 * value (0 for a token outside the vocabulary, e.g. LLM_TOKEN_NONE):
 * bitwise equal to its entry wherever it is among the top ones. top_n may
 * be 0 (tokens and logprobs unused); *n_top (may be NULL) = the count. */
float llmi_logprobs(llmi_sampler *s, const float *logits, llm_token tok, uint32_t top_n,
                    llm_token *tokens, float *logprobs, uint32_t *n_top);

/* Index of the largest logit (lowest index on ties; NaN never wins). */
llm_token llmi_argmax(const float *logits, uint32_t n);

#endif
