#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>

llm_status llmi_sampler_init(llmi_sampler *s, uint32_t n_vocab) {
    memset(s, 0, sizeof *s);
    s->n_vocab = n_vocab;
    s->cand = llmi_calloc(n_vocab ? n_vocab : 1, sizeof *s->cand);
    s->work = llmi_calloc(n_vocab ? n_vocab : 1, sizeof *s->work);
    s->counts = llmi_calloc(n_vocab ? n_vocab : 1, sizeof *s->counts);
    s->touched = llmi_calloc(n_vocab ? n_vocab : 1, sizeof *s->touched);
    s->allow = llmi_calloc(n_vocab / 32 + 1, sizeof *s->allow);
    if (!s->cand || !s->work || !s->counts || !s->touched || !s->allow) {
        llmi_sampler_destroy(s);
        return llmi_oom("sampler scratch");
    }
    return LLM_OK;
}

void llmi_sampler_destroy(llmi_sampler *s) {
    llmi_free(s->cand);
    llmi_free(s->work);
    llmi_free(s->counts);
    llmi_free(s->touched);
    llmi_free(s->allow);
    s->allow = NULL;
    s->grammar = NULL;
    s->cand = NULL;
    s->work = NULL;
    s->counts = NULL;
    s->touched = NULL;
}

/* ---- parameters ---- */

enum { MAX_LOGIT_BIAS = 1 << 20 };

/* -INFINITY bans; anything else must be finite. */
static bool bias_ok(float b) { return isfinite(b) || (isinf(b) && b < 0); }

/* True when the -INFINITY entries of the bias list cover the vocabulary. */
static llm_status bans_everything(const llm_sampling_params *p, uint32_t n_vocab, bool *all) {
    size_t n_bans = 0;
    *all = false;
    for (size_t i = 0; i < p->n_logit_bias; i++) n_bans += isinf(p->logit_bias[i].bias);
    if (n_bans < n_vocab) return LLM_OK;
    uint8_t *seen = llmi_calloc(n_vocab, 1);
    if (!seen) return llmi_oom("logit_bias check");
    uint32_t distinct = 0;
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        llm_token t = p->logit_bias[i].token;
        if (isinf(p->logit_bias[i].bias) && !seen[t]) {
            seen[t] = 1;
            distinct++;
        }
    }
    llmi_free(seen);
    *all = distinct == n_vocab;
    return LLM_OK;
}

static llm_status validate(const llm_sampling_params *p, uint32_t n_vocab) {
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.temperature %g must be finite and >= 0",
                          (double)p->temperature);
    if (p->top_k < 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llm_sampling_params.top_k %d must be >= 0",
                          p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.top_p %g must be in (0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.min_p %g must be in [0, 1]", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.repeat_penalty %g must be finite and > 0 "
                          "(1 = off)",
                          (double)p->repeat_penalty);
    if (p->repeat_last_n < -1)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.repeat_last_n %d must be >= -1 (-1 = whole "
                          "history, 0 = off)",
                          p->repeat_last_n);
    if (!isfinite(p->presence_penalty))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.presence_penalty %g must be finite",
                          (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.frequency_penalty %g must be finite",
                          (double)p->frequency_penalty);
    if (p->n_logit_bias && !p->logit_bias)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.logit_bias is NULL with n_logit_bias %zu",
                          p->n_logit_bias);
    if (p->n_logit_bias > MAX_LOGIT_BIAS)
        return llmi_error(LLM_ERR_LIMIT,
                          "llm_sampling_params.n_logit_bias %zu exceeds the maximum of %d",
                          p->n_logit_bias, MAX_LOGIT_BIAS);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        const llm_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || (uint32_t)b->token >= n_vocab)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "llm_sampling_params.logit_bias[%zu].token %d is outside the "
                              "vocabulary of %u",
                              i, b->token, n_vocab);
        if (!bias_ok(b->bias))
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "llm_sampling_params.logit_bias[%zu].bias %g must be finite or "
                              "-INFINITY",
                              i, (double)b->bias);
    }
    if (p->grammar && p->grammar->n_vocab != n_vocab)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.grammar was compiled for a vocabulary of %u "
                          "tokens, not this model's %u",
                          p->grammar->n_vocab, n_vocab);
    bool all = false;
    LLMI_TRY(bans_everything(p, n_vocab, &all));
    if (all)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "llm_sampling_params.logit_bias bans every token of the vocabulary");
    return LLM_OK;
}

LLM_API void llm_sampling_params_init_sized(llm_sampling_params *p, size_t size) {
    llm_sampling_params d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.temperature = 0.8f;
    d.top_k = 40;
    d.top_p = 0.95f;
    d.min_p = 0.05f;
    d.repeat_penalty = 1.0f;
    d.repeat_last_n = 64;
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API void llm_sampling_params_init(llm_sampling_params *p) {
    llm_sampling_params_init_sized(p, LLMI_LEGACY_SAMPLING_PARAMS_SIZE);
}

llm_status llmi_sampling_params_read(const llm_sampling_params *in, uint32_t n_vocab,
                                     llm_sampling_params *out) {
    llm_sampling_params_init_sized(out, sizeof *out);
    if (!in) {
        out->temperature = 0.0f;
        return LLM_OK;
    }
    LLMI_TRY(llmi_params_copy("llm_sampling_params", in, out, sizeof *out));
    if (out->n_logit_bias == 0) out->logit_bias = NULL;
    llm_status st = validate(out, n_vocab);
    if (st != LLM_OK) {
        out->logit_bias = NULL; /* nothing borrowed on failure */
        out->n_logit_bias = 0;
    }
    return st;
}

llm_status llmi_sampling_params_copy(const llm_sampling_params *in, uint32_t n_vocab,
                                     llm_sampling_params *out) {
    LLMI_TRY(llmi_sampling_params_read(in, n_vocab, out));
    if (out->n_logit_bias == 0) return LLM_OK;
    llm_logit_bias *copy = llmi_malloc(out->n_logit_bias * sizeof *copy);
    if (!copy) {
        out->logit_bias = NULL;
        out->n_logit_bias = 0;
        return llmi_oom("logit_bias copy");
    }
    memcpy(copy, out->logit_bias, out->n_logit_bias * sizeof *copy);
    out->logit_bias = copy;
    return LLM_OK;
}

void llmi_sampling_params_free(llm_sampling_params *p) {
    llmi_free((void *)(uintptr_t)p->logit_bias);
    p->logit_bias = NULL;
    p->n_logit_bias = 0;
}

/* ---- random numbers ---- */

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

uint64_t llmi_sample_seed(uint64_t seed, uint32_t sample_index) {
    if (sample_index == 0) return seed;
    return splitmix64(splitmix64(seed ^ 0x53414d504c45ull /* "SAMPLE" */) + sample_index);
}

/* ---- ordering and selection ---- */

llm_token llmi_argmax(const float *logits, uint32_t n) {
    uint32_t best = 0;
    bool found = false;
    for (uint32_t i = 0; i < n; i++) {
        if (isnan(logits[i])) continue;
        if (!found || logits[i] > logits[best]) best = i;
        found = true;
    }
    return (llm_token)best;
}

/* a comes before b: larger logit, then lower id. A strict total order on
 * candidates without NaN logits. */
static inline bool before(const llmi_candidate *a, const llmi_candidate *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int by_logit_desc(const void *a, const void *b) {
    const llmi_candidate *x = a, *y = b;
    return before(x, y) ? -1 : before(y, x) ? 1 : 0;
}

static inline void swap_cand(llmi_candidate *a, llmi_candidate *b) {
    llmi_candidate t = *a;
    *a = *b;
    *b = t;
}

/* A bounded heap of the best candidates seen so far; its root c[0] is the
 * worst of them, so most tokens cost one comparison. */
static void heap_up(llmi_candidate *c, uint32_t i) {
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!before(&c[parent], &c[i])) break;
        swap_cand(&c[parent], &c[i]);
        i = parent;
    }
}

static void heap_down(llmi_candidate *c, uint32_t n, uint32_t i) {
    for (;;) {
        uint32_t worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(&c[worst], &c[l])) worst = l;
        if (r < n && before(&c[worst], &c[r])) worst = r;
        if (worst == i) return;
        swap_cand(&c[i], &c[worst]);
        i = worst;
    }
}

/* Offers candidate x to a heap of h entries holding at most k; returns the
 * new count. */
static inline uint32_t heap_offer(llmi_candidate *c, uint32_t h, uint32_t k, llmi_candidate x) {
    if (h < k) {
        c[h] = x;
        heap_up(c, h);
        return h + 1;
    }
    if (before(&x, &c[0])) {
        c[0] = x;
        heap_down(c, k, 0);
    }
    return h;
}

/* ---- the pipeline ---- */

static void apply_bias(llmi_sampler *s, const llm_sampling_params *p) {
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        llm_token t = p->logit_bias[i].token;
        if (t >= 0 && (uint32_t)t < s->n_vocab) s->work[t] += p->logit_bias[i].bias;
    }
}

static bool penalties_on(const llm_sampling_params *p, const llm_token *history,
                         size_t n_history) {
    return p->repeat_last_n != 0 && n_history > 0 && history &&
           (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
            p->frequency_penalty != 0.0f);
}

/* Repetition, presence and frequency penalties over the last repeat_last_n
 * tokens of the history. Counts live in s->counts, which is zero again on
 * return: only the entries touched are reset. */
static void apply_penalties(llmi_sampler *s, const llm_sampling_params *p,
                            const llm_token *history, size_t n_history) {
    size_t start = 0;
    if (p->repeat_last_n > 0 && (size_t)p->repeat_last_n < n_history)
        start = n_history - (size_t)p->repeat_last_n;
    uint32_t n_touched = 0;
    for (size_t i = start; i < n_history; i++) {
        llm_token t = history[i];
        if (t < 0 || (uint32_t)t >= s->n_vocab) continue;
        if (s->counts[t]++ == 0) s->touched[n_touched++] = t;
    }
    for (uint32_t j = 0; j < n_touched; j++) {
        llm_token t = s->touched[j];
        uint32_t count = s->counts[t];
        s->counts[t] = 0;
        float l = s->work[t];
        if (p->repeat_penalty != 1.0f) l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)count;
        s->work[t] = l;
    }
}

/* Bans end-of-generation tokens, unless that would leave no token at all. */
static void ban_eog(llmi_sampler *s, const llmi_tokenizer *tok) {
    uint32_t n_eog = 0;
    bool other = false;
    for (uint32_t i = 0; i < s->n_vocab; i++) {
        if (llmi_tokenizer_is_eog(tok, (llm_token)i))
            s->touched[n_eog++] = (llm_token)i;
        else if (s->work[i] > -INFINITY)
            other = true;
    }
    if (!other) return;
    for (uint32_t j = 0; j < n_eog; j++) s->work[s->touched[j]] = -INFINITY;
}

static inline bool allowed(const uint32_t *mask, uint32_t t) {
    return (mask[t >> 5] >> (t & 31)) & 1;
}

/* Step 0: the grammar's mask into s->allow; false when there is none. */
static bool grammar_mask(llmi_sampler *s) {
    if (!s->grammar) return false;
    llm_status st = llmi_gstate_fill_mask(s->grammar, s->allow);
    if (st == LLM_OK) { /* the grammar never dead-ends; a finished one allows nothing */
        bool any = false;
        for (uint32_t w = 0; w <= s->n_vocab / 32 && !any; w++) any = s->allow[w] != 0;
        if (!any)
            st = llmi_error(LLM_ERR_INVALID_ARGUMENT, "grammar: no token is allowed here");
    }
    if (st != LLM_OK) {
        if (s->grammar_status == LLM_OK) s->grammar_status = st;
        return false;
    }
    return true;
}

/* Steps 0-3: the logits themselves when nothing applies, else s->work.
 * *masked: whether s->allow holds the grammar's mask. */
/* s->work = logits where the mask allows them, -inf elsewhere, a word of
 * 32 tokens at a time: most words allow all of theirs or none. */
static void copy_masked(llmi_sampler *s, const float *logits) {
    uint32_t V = s->n_vocab;
    for (uint32_t base = 0; base < V; base += 32) {
        uint32_t n = V - base < 32 ? V - base : 32, bits = s->allow[base >> 5];
        float *w = s->work + base;
        const float *l = logits + base;
        if (bits == 0)
            for (uint32_t k = 0; k < n; k++) w[k] = -INFINITY;
        else if (bits == UINT32_MAX && n == 32)
            memcpy(w, l, sizeof(float) * 32);
        else
            for (uint32_t k = 0; k < n; k++) w[k] = (bits >> k) & 1 ? l[k] : -INFINITY;
    }
}

/* The logits after steps 0-3. NULL when only the grammar's mask applies
 * and the caller is greedy (`greedy`): it then reads the allowed logits
 * straight from `logits` and s->allow. */
static const float *process(llmi_sampler *s, const float *logits, const llm_sampling_params *p,
                            const llm_token *history, size_t n_history, uint32_t n_generated,
                            const llmi_tokenizer *tok, bool greedy, bool *masked) {
    bool pen = penalties_on(p, history, n_history), ban = tok && n_generated < p->min_tokens;
    *masked = grammar_mask(s);
    bool more = p->n_logit_bias != 0 || pen || ban;
    if (!more && !*masked) return logits;
    if (!more && greedy) return NULL;
    if (*masked)
        copy_masked(s, logits);
    else
        memcpy(s->work, logits, (size_t)s->n_vocab * sizeof *s->work);
    apply_bias(s, p);
    if (pen) apply_penalties(s, p, history, n_history);
    if (ban) ban_eog(s, tok);
    return s->work;
}

/* Nothing finite is left: the largest raw logit wins (among the tokens
 * the grammar allows, when it allows any). */
static uint32_t fallback(llmi_sampler *s, const float *logits, bool masked,
                         llmi_candidate **out) {
    llm_token best = llmi_argmax(logits, s->n_vocab);
    if (masked) {
        bool found = false;
        for (uint32_t i = 0; i < s->n_vocab; i++) {
            if (!allowed(s->allow, i)) continue;
            if (!found || logits[i] > logits[best] || isnan(logits[best])) best = (llm_token)i;
            found = true;
        }
    }
    s->cand[0] = (llmi_candidate){best, logits[best], 1.0f};
    *out = s->cand;
    return 1;
}

/* The first index of the largest value above -inf (NaN never wins), as a
 * strict `>` scan finds it, or UINT32_MAX: the maximum in eight lanes
 * (which vectorizes: a batch's greedy rows each scan the whole
 * vocabulary), then its first occurrence. */
static uint32_t first_max(const float *x, uint32_t n, float *top) {
    float lane[8], best = -INFINITY;
    for (uint32_t k = 0; k < 8; k++) lane[k] = -INFINITY;
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (uint32_t k = 0; k < 8; k++) lane[k] = x[i + k] > lane[k] ? x[i + k] : lane[k];
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    for (uint32_t k = 0; k < 8; k++) best = lane[k] > best ? lane[k] : best;
    if (!(best > -INFINITY)) return UINT32_MAX;
    for (i = 0; x[i] != best; i++) {
    }
    *top = best;
    return i;
}

/* logit - max without inf - inf = NaN: equal values are 0 apart. */
static inline double centered(float logit, float max) {
    return logit == max ? 0.0 : (double)logit - (double)max;
}

uint32_t llmi_sample_dist(llmi_sampler *s, const float *logits, const llm_sampling_params *p,
                          const llm_token *history, size_t n_history, uint32_t n_generated,
                          const llmi_tokenizer *tok, llmi_candidate **out) {
    uint32_t V = s->n_vocab;
    llmi_candidate *c = s->cand;
    bool masked = false, greedy = p->temperature <= 0.0f || p->top_k == 1;
    const float *lg = process(s, logits, p, history, n_history, n_generated, tok, greedy, &masked);

    if (greedy) {
        uint32_t best = UINT32_MAX;
        float top = -INFINITY;
        if (!lg) { /* only the mask: its allowed tokens, in order */
            for (uint32_t base = 0; base < V; base += 32)
                for (uint32_t b = s->allow[base >> 5]; b; b &= b - 1) {
                    uint32_t i = base + (uint32_t)__builtin_ctz(b);
                    if (i < V && logits[i] > top) {
                        top = logits[i];
                        best = i;
                    }
                }
        } else {
            best = first_max(lg, V, &top);
        }
        if (best == UINT32_MAX) return fallback(s, logits, masked, out);
        c[0] = (llmi_candidate){(llm_token)best, top, 1.0f};
        *out = c;
        return 1;
    }

    /* Candidates: banned tokens (and NaN) are left out, so the rest have a
     * total order. With top-k, only the k best, sorted. */
    uint32_t n = 0;
    bool sorted = false;
    float max = -INFINITY;
    if (p->top_k > 0 && (uint32_t)p->top_k < V) {
        uint32_t k = (uint32_t)p->top_k;
        for (uint32_t i = 0; i < V; i++)
            if (lg[i] > -INFINITY) n = heap_offer(c, n, k, (llmi_candidate){(llm_token)i, lg[i], 0});
        if (n == 0) return fallback(s, logits, masked, out);
        qsort(c, n, sizeof *c, by_logit_desc);
        sorted = true;
        max = c[0].logit;
    } else {
        for (uint32_t i = 0; i < V; i++)
            if (lg[i] > -INFINITY) {
                c[n++] = (llmi_candidate){(llm_token)i, lg[i], 0};
                if (lg[i] > max) max = lg[i];
            }
        if (n == 0) return fallback(s, logits, masked, out);
    }

    /* temperature and softmax (unnormalised: the best token has p = 1) */
    double inv_t = 1.0 / (double)p->temperature, sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        c[i].p = (float)exp(centered(c[i].logit, max) * inv_t);
        sum += c[i].p;
    }

    /* min-p keeps p >= min_p * p_best = min_p. Without top-k the survivors
     * are filtered first so only they need sorting; min-p and top-p both
     * keep a prefix of the sorted order, so this changes nothing. */
    uint32_t n_sorted = n;
    if (!sorted) {
        if (p->min_p > 0.0f) {
            n_sorted = 0;
            for (uint32_t i = 0; i < n; i++)
                if (c[i].p >= p->min_p * 1.0f) swap_cand(&c[i], &c[n_sorted++]);
        }
        qsort(c, n_sorted, sizeof *c, by_logit_desc);
    }

    /* top-p: the smallest prefix whose share of the whole mass reaches top_p. */
    uint32_t keep = n_sorted;
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        for (uint32_t i = 0; i < n_sorted; i++) {
            cum += c[i].p / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    /* min-p: drop tokens less likely than min_p times the best one. */
    float floor = p->min_p * c[0].p;
    while (keep > 1 && c[keep - 1].p < floor) keep--;

    double mass = 0.0;
    for (uint32_t i = 0; i < keep; i++) mass += c[i].p;
    for (uint32_t i = 0; i < keep; i++) c[i].p = (float)(c[i].p / mass);
    *out = c;
    return keep;
}

llm_token llmi_sample_pick(const llmi_candidate *c, uint32_t n, double u) {
    double cum = 0.0;
    uint32_t last = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (c[i].p <= 0.0f) continue;
        cum += c[i].p;
        last = i;
        if (u < cum) return c[i].id;
    }
    return c[last].id;
}

float llmi_sample_prob(const llmi_candidate *c, uint32_t n, llm_token t) {
    for (uint32_t i = 0; i < n; i++)
        if (c[i].id == t) return c[i].p;
    return 0.0f;
}

llm_token llmi_sample(llmi_sampler *s, const float *logits, const llm_sampling_params *p,
                      const llm_token *history, size_t n_history, uint32_t n_generated,
                      const llmi_tokenizer *tok, uint64_t stream, uint64_t position) {
    llmi_candidate *c = NULL;
    uint32_t n = llmi_sample_dist(s, logits, p, history, n_history, n_generated, tok, &c);
    if (n == 1) return c[0].id;
    return llmi_sample_pick(c, n, llmi_rng_uniform(p->seed, stream, position));
}

/* ---- log-probabilities ---- */

/* The one log-softmax of every log-probability we report: the largest
 * logit, log(sum exp(l - max)) in index order, then (l - max) - lse per
 * token, so a token's logprob is bitwise its top-N entry. */
float llmi_logprobs(llmi_sampler *s, const float *logits, llm_token tok, uint32_t top_n,
                    llm_token *tokens, float *logprobs, uint32_t *n_top) {
    uint32_t V = s->n_vocab;
    if (top_n > V) top_n = V;
    llmi_candidate *c = s->cand;
    float max = -INFINITY;
    for (uint32_t i = 0; i < V; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    uint32_t h = 0;
    for (uint32_t i = 0; i < V; i++) {
        float l = isnan(logits[i]) ? -INFINITY : logits[i];
        sum += exp(centered(l, max));
        if (top_n) h = heap_offer(c, h, top_n, (llmi_candidate){(llm_token)i, l, 0.0f});
    }
    double lse = log(sum);
    if (top_n) qsort(c, top_n, sizeof *c, by_logit_desc);
    for (uint32_t j = 0; j < top_n; j++) {
        tokens[j] = c[j].id;
        logprobs[j] = (float)(centered(c[j].logit, max) - lse);
    }
    if (n_top) *n_top = top_n;
    if (tok < 0 || (uint32_t)tok >= V) return 0.0f;
    float l = isnan(logits[tok]) ? -INFINITY : logits[tok];
    return (float)(centered(l, max) - lse);
}

uint32_t llmi_logprobs_top(llmi_sampler *s, const float *logits, uint32_t top_n,
                           llm_token *tokens, float *logprobs) {
    uint32_t n = 0;
    llmi_logprobs(s, logits, LLM_TOKEN_NONE, top_n, tokens, logprobs, &n);
    return n;
}
