/* The verifier: decides the tokens of one speculative step from the
 * target's rows so that each token has exactly the target's distribution.
 *
 * Position P = L + j is decided from p, the target's distribution there
 * after the whole sampling pipeline (bias, penalties with the accepted
 * drafts in the history, min_tokens, top-k, temperature, top-p, min-p):
 *
 *  - point-mass drafts (n-gram, or any greedy request): the token is the
 *    plain draw, pick(p, u) with u = rng(seed, 0, P), the number plain
 *    sampling uses; the draft is accepted when it is that token. That
 *    accepts x with probability p(x), and a rejection gives a token
 *    distributed as p without x, renormalised: the rejection-sampling rule
 *    for a point mass q, with the output of a run without speculation.
 *  - a sampling draft model: x ~ q (drawn with rng(seed, DRAFT, P)) is
 *    accepted when rng(seed, ACCEPT, P) < p(x) / q(x); otherwise the token
 *    is drawn from normalize(max(0, p - q)) with rng(seed, RESIDUAL, P).
 *    P(token = y) = q(y) min(1, p(y)/q(y)) + (1 - sum_x min(p(x), q(x)))
 *    (p(y) - q(y))+ / sum_x (p(x) - q(x))+ = min(p, q)(y) + (p - q)+(y)
 *    = p(y). The three numbers are independent (different streams) and
 *    each position is decided once, so tokens depend on (seed, position)
 *    and the history only: not on k, nor on what else is in the batch.
 *  - a position without a draft (the bonus after k accepted point-mass
 *    drafts): the plain draw.
 */
#include "spec/spec.h"

static int g_break; /* llmi_spec_test_break */

void llmi_spec_test_break(int mode) { g_break = mode; }

/* The plain draw at position P (stream 0, as llmi_sample). */
static llm_token plain_pick(const llmi_candidate *c, uint32_t n, const llm_sampling_params *p,
                            uint32_t P) {
    if (n == 1) return c[0].id;
    return llmi_sample_pick(c, n, llmi_rng_uniform(p->seed, 0, P));
}

/* q of draft j at token t. */
static float q_prob(const llmi_spec_req *r, uint32_t j, llm_token t) {
    for (uint32_t i = r->q_off[j]; i < r->q_off[j + 1]; i++)
        if (r->q[i].id == t) return r->q[i].p;
    return 0.0f;
}

/* Below this mass p and q agree up to rounding: draw from p itself. */
#define RESIDUAL_MIN_MASS 1e-6

/* Draws from normalize(max(0, p - q_j)); rewrites the candidates' p. */
static llm_token residual_pick(llmi_spec *sp, const llmi_spec_req *r, uint32_t j,
                               llmi_candidate *c, uint32_t n, const llm_sampling_params *p,
                               uint32_t P) {
    double u = llmi_rng_uniform(p->seed, LLMI_SPEC_STREAM_RESIDUAL, P);
    if (g_break == 2) return llmi_sample_pick(c, n, u); /* deliberately wrong */
    float *qd = sp->qdense;
    for (uint32_t i = r->q_off[j]; i < r->q_off[j + 1]; i++) qd[r->q[i].id] = r->q[i].p;
    double mass = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        float d = c[i].p - qd[c[i].id];
        mass += d > 0.0f ? d : 0.0f;
    }
    if (mass > RESIDUAL_MIN_MASS) {
        for (uint32_t i = 0; i < n; i++) {
            float d = c[i].p - qd[c[i].id];
            c[i].p = d > 0.0f ? (float)(d / mass) : 0.0f;
        }
    }
    for (uint32_t i = r->q_off[j]; i < r->q_off[j + 1]; i++) qd[r->q[i].id] = 0.0f;
    return llmi_sample_pick(c, n, u);
}

uint32_t llmi_spec_verify(llmi_spec *sp, llmi_spec_req *r, llmi_sampler *sampler,
                          const float *logits, const llm_sampling_params *p, llm_token *h,
                          uint32_t L, uint32_t n_generated, const llmi_tokenizer *tok,
                          llmi_spec_sink sink, bool *stopped) {
    uint32_t V = sp->n_vocab, produced = 0, accepted = 0, examined = 0;
    bool with_q = r->run_draft && !llmi_spec_greedy(p);
    *stopped = false;
    for (uint32_t j = 0; j <= r->k; j++) {
        uint32_t P = L + j;
        const float *lg = logits + (size_t)j * V;
        llmi_candidate *c = NULL;
        uint32_t n = llmi_sample_dist(sampler, lg, p, h, P, n_generated + j, tok, &c);
        bool has_draft = j < r->n_drafts, ok = false;
        llm_token t;
        if (!has_draft) {
            t = plain_pick(c, n, p, P);
        } else if (!with_q) {
            llm_token d = h[P];
            t = plain_pick(c, n, p, P);
            ok = t == d;
            examined++;
            if (g_break == 1) {
                t = d;
                ok = true;
            } else if (!ok && g_break == 2) {
                t = llmi_sample_pick(c, n, llmi_rng_uniform(p->seed, LLMI_SPEC_STREAM_RESIDUAL, P));
            }
        } else {
            llm_token d = h[P];
            float pd = llmi_sample_prob(c, n, d), qd = q_prob(r, j, d);
            double u = llmi_rng_uniform(p->seed, LLMI_SPEC_STREAM_ACCEPT, P);
            ok = g_break == 1 || (qd > 0.0f && u * (double)qd < (double)pd);
            t = ok ? d : residual_pick(sp, r, j, c, n, p, P);
            examined++;
        }
        accepted += ok;
        h[P] = t;
        produced++;
        if (!sink.push(sink.ctx, t, lg)) {
            *stopped = true;
            break;
        }
        if (!ok) break;
    }
    r->step_accepted = accepted;
    r->step_examined = examined;
    return produced;
}
