/* Speculative decoding: proposers, per-sequence state, the draft model's
 * runner and the choice of k. The verifier is in verify.c. */
#include "spec/spec.h"

#include <math.h>

/* ---- cost model ---- */

/* Each new pass weighs 1, older ones fade by this factor per pass. */
#define COST_DECAY 0.95
/* Prior slope b = BETA0 * a (cost of one more row relative to a pass's
 * fixed cost), worth PRIOR_WEIGHT passes. */
#define BETA0 0.1
#define PRIOR_WEIGHT 1.0

void llmi_spec_cost_observe(llmi_spec_cost *c, uint32_t rows, double seconds) {
    if (!(seconds > 0) || !isfinite(seconds)) return;
    double n = rows;
    c->w = c->w * COST_DECAY + 1.0;
    c->sn = c->sn * COST_DECAY + n;
    c->snn = c->snn * COST_DECAY + n * n;
    c->st = c->st * COST_DECAY + seconds;
    c->snt = c->snt * COST_DECAY + n * seconds;
}

/* Minimises sum w (t - a - b n)^2 + PRIOR_WEIGHT (b - BETA0 a)^2: the data
 * decide a + b n at the rows seen, the prior the slope when only one row
 * count was seen. */
bool llmi_spec_cost_fit(const llmi_spec_cost *c, double *a, double *b) {
    if (c->w < 1e-9) {
        *a = 1.0;
        *b = BETA0;
        return false;
    }
    double lp = PRIOR_WEIGHT;
    double m00 = c->w + lp * BETA0 * BETA0, m01 = c->sn - lp * BETA0, m11 = c->snn + lp;
    double det = m00 * m11 - m01 * m01;
    double mean = c->st / c->w;
    if (!(fabs(det) > 1e-12)) {
        *a = mean / (1.0 + BETA0 * c->sn / c->w);
        *b = BETA0 * *a;
        return true;
    }
    double fa = (m11 * c->st - m01 * c->snt) / det;
    double fb = (m00 * c->snt - m01 * c->st) / det;
    /* Noise can push the fit out of the physical range: each pass costs
     * something fixed, and a row never costs nothing. */
    if (!(fa > 0.05 * mean)) fa = 0.05 * mean;
    if (!(fb > 0.01 * fa)) fb = 0.01 * fa;
    *a = fa;
    *b = fb;
    return true;
}

/* ---- acceptance ---- */

/* Counts fade by this factor per verification step, so a sequence that
 * stops copying text is noticed within a few steps. */
#define RATE_DECAY 0.8
#define RATE_PRIOR_WEIGHT 2.0

/* Prior acceptance for a draft model ([0]) and per n-gram match bucket
 * (ngram_bucket): the further back the match reaches, the likelier the
 * text is being copied. */
static const double rate_prior[LLMI_SPEC_N_RATES] = {0.6, 0.2, 0.35, 0.55, 0.75, 0.9};

/* Rate bucket of an n-gram match that reaches `len` tokens back. */
static uint32_t ngram_bucket(uint32_t len) {
    return len <= 2 ? len : len <= 5 ? 3 : len <= 15 ? 4 : 5;
}

static double rate_alpha(const llmi_spec_rate *rt, double prior) {
    double a = (rt->acc + prior * RATE_PRIOR_WEIGHT) / (rt->exam + RATE_PRIOR_WEIGHT);
    return a < 0.0 ? 0.0 : a > 0.99 ? 0.99 : a;
}

/* Adaptive choice: the k in [0, max_k] with the most tokens per second for
 * the step, given acceptance alpha per draft (so k drafts give
 * E(k) = alpha + ... + alpha^k extra tokens on average), the target's cost
 * a + b rows and, for a draft model, its passes. k = 0 unless drafting beats
 * not drafting by a margin. */
#define GAIN_MARGIN 1.03

static uint32_t best_k(const llmi_spec *sp, double alpha, uint32_t max_k, llmi_spec_batch batch,
                       bool draft_model, uint32_t extra_passes) {
    double a, b, pass = 0.0;
    llmi_spec_cost_fit(&sp->target_cost, &a, &b);
    if (draft_model) {
        double da, db;
        if (llmi_spec_cost_fit(&sp->draft_cost, &da, &db))
            pass = da + db;
        else
            pass = sp->draft_ratio * (a + b);
    }
    double n = batch.n_producing ? batch.n_producing : 1;
    double rows = batch.n_rows ? batch.n_rows : 1;
    double best = n / (a + b * rows) * GAIN_MARGIN, extra = 0.0, pw = 1.0;
    uint32_t k_best = 0;
    if (max_k > LLMI_SPEC_AUTO_MAX_K) max_k = LLMI_SPEC_AUTO_MAX_K;
    for (uint32_t k = 1; k <= max_k; k++) {
        pw *= alpha;
        extra += pw;
        double cost = a + b * (rows + k) + pass * (k + extra_passes);
        double rate = (n + extra) / cost;
        if (rate > best) {
            best = rate;
            k_best = k;
        }
    }
    return k_best;
}

/* ---- session state ---- */

llm_status llmi_spec_init(llmi_spec *sp, const llm_model *target, const llm_model *draft,
                          const llmi_engine *target_engine, uint32_t n_blocks, uint32_t block_size,
                          llm_kv_type kv_type, uint32_t max_rows, uint32_t n_ctx,
                          bool prefix_cache) {
    memset(sp, 0, sizeof *sp);
    sp->n_vocab = target->hp.n_vocab;
    sp->max_rows = max_rows;
    sp->prefix_cache = prefix_cache;
    sp->qdense = llmi_calloc(sp->n_vocab, sizeof *sp->qdense);
    if (!sp->qdense) return llmi_oom("speculative decoding scratch");
    if (!draft) return LLM_OK;
    LLMI_TRY(llmi_spec_check_vocab(target, draft));
    sp->draft = draft;
    sp->draft_ratio = target->weight_bytes
                          ? (double)draft->weight_bytes / (double)target->weight_bytes
                          : 1.0;
    llmi_engine_config cfg = {.model = draft,
                              .ops = target_engine->ops,
                              .backend = target_engine->backend,
                              .backend_cfg = {1, target_engine->device},
                              .kv_block_size = block_size,
                              .kv_blocks = n_blocks,
                              .kv_type = kv_type,
                              .max_rows = max_rows,
                              .max_ctx = n_ctx,
                              .interrupt = target_engine->interrupt};
    LLMI_TRY(llmi_engine_create(&cfg, &sp->deng));
    sp->dkv = sp->deng->kv;
    LLMI_TRY(llmi_sampler_init(&sp->dsampler, sp->n_vocab));
    sp->drows = llmi_calloc(max_rows, sizeof *sp->drows);
    if (!sp->drows) return llmi_oom("draft rows");
    return LLM_OK;
}

void llmi_spec_destroy(llmi_spec *sp) {
    llmi_free(sp->qdense);
    llmi_free(sp->drows);
    llmi_free_aligned(sp->dlogits);
    if (sp->dsampler.cand) llmi_sampler_destroy(&sp->dsampler);
    llmi_engine_free(sp->deng);
    memset(sp, 0, sizeof *sp);
}

static llm_status reserve_dlogits(llmi_spec *sp, uint32_t rows) {
    if (rows <= sp->cap_dlogits) return LLM_OK;
    size_t bytes;
    if (!llmi_mul_ok((size_t)rows * sp->n_vocab, sizeof(float), &bytes))
        return llmi_error(LLM_ERR_LIMIT, "draft logits for %u rows overflow", rows);
    float *l = llmi_malloc_aligned(bytes);
    if (!l) return llmi_oom("draft logits");
    llmi_free_aligned(sp->dlogits);
    sp->dlogits = l;
    sp->cap_dlogits = rows;
    return LLM_OK;
}

/* Ids whose texts are compared: both ends of the vocabulary. */
#define VOCAB_ENDS 32u

static llm_status token_differs(const llm_model *t, const llm_model *d, llm_token id) {
    size_t lt = 0, ld = 0;
    const char *st = llmi_tokenizer_token_text(t->tok, id, &lt);
    const char *sd = llmi_tokenizer_token_text(d->tok, id, &ld);
    if (st && sd && lt == ld && memcmp(st, sd, lt) == 0) return LLM_OK;
    return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                      "the draft model's vocabulary differs from the target's: token %d is "
                      "'%.*s' in the target and '%.*s' in the draft model",
                      id, (int)(st ? (lt > 40 ? 40 : lt) : 0), st ? st : "",
                      (int)(sd ? (ld > 40 ? 40 : ld) : 0), sd ? sd : "");
}

llm_status llmi_spec_check_vocab(const llm_model *target, const llm_model *draft) {
    uint32_t V = target->hp.n_vocab;
    if (draft->hp.n_vocab != V || llmi_tokenizer_n_vocab(draft->tok) != V)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "the draft model's vocabulary has %u tokens, the target's %u: a draft "
                          "model must share the target's tokenizer",
                          draft->hp.n_vocab, V);
    static const char *const names[] = {"BOS", "EOS", "EOT", "PAD"};
    llm_token (*const get[])(const llmi_tokenizer *) = {llmi_tokenizer_bos, llmi_tokenizer_eos,
                                                        llmi_tokenizer_eot, llmi_tokenizer_pad};
    for (size_t i = 0; i < sizeof get / sizeof get[0]; i++) {
        llm_token a = get[i](target->tok), b = get[i](draft->tok);
        if (a != b)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                              "the draft model's %s token is %d, the target's %d: a draft "
                              "model must share the target's tokenizer",
                              names[i], b, a);
    }
    uint32_t ends = V < 2 * VOCAB_ENDS ? V : VOCAB_ENDS;
    for (uint32_t i = 0; i < ends; i++) {
        LLMI_TRY(token_differs(target, draft, (llm_token)i));
        LLMI_TRY(token_differs(target, draft, (llm_token)(V - 1 - i)));
    }
    return LLM_OK;
}

llm_status llmi_spec_check_params(const char *what, uint32_t mode, uint32_t k,
                                  const llm_model *draft) {
    if (mode > LLM_SPEC_DRAFT)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "%s.spec_mode %u is not an llm_spec_mode (0 none, 1 ngram, 2 draft)",
                          what, mode);
    if (k > LLMI_SPEC_MAX_K)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "%s.spec_k %u exceeds LLM_SPEC_MAX_K (%d); 0 = adaptive", what, k,
                          LLMI_SPEC_MAX_K);
    if (mode == LLM_SPEC_DRAFT && !draft)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "%s.spec_mode is LLM_SPEC_DRAFT but the session has no draft model "
                          "(llm_session_params.draft_model)",
                          what);
    return LLM_OK;
}

/* ---- per-sequence state ---- */

void llmi_spec_req_init(llmi_spec_req *r, uint32_t mode, uint32_t k_fixed) {
    memset(r, 0, sizeof *r);
    r->mode = mode;
    r->k_fixed = k_fixed;
}

void llmi_spec_req_release(llmi_spec *sp, llmi_spec_req *r) {
    if (sp->dkv) llmi_kv_seq_destroy(sp->dkv, &r->dseq);
    llmi_free(r->q);
    r->q = NULL;
    r->cap_q = 0;
}

void llmi_spec_req_drop_draft_kv(llmi_spec *sp, llmi_spec_req *r) {
    if (sp->dkv) llmi_kv_seq_release(sp->dkv, &r->dseq);
}

/* ---- n-gram proposer ---- */

uint32_t llmi_spec_ngram(const llm_token *h, uint32_t L, uint32_t max_k, llm_token *out,
                         uint32_t *order, uint32_t *match_len) {
    *order = *match_len = 0;
    if (max_k == 0 || L < 2) return 0;
    for (uint32_t n = L - 1 < 3 ? L - 1 : 3; n >= 1; n--) {
        const llm_token *suffix = h + L - n;
        /* Most recent earlier occurrence: start i < L - n. */
        for (uint32_t i = L - n; i-- > 0;) {
            if (h[i] != suffix[0] || memcmp(h + i, suffix, n * sizeof *h) != 0) continue;
            /* What followed, continued with the same period past the end. */
            uint32_t period = L - n - i;
            for (uint32_t j = 0; j < max_k; j++) {
                uint32_t src = L + j - period;
                out[j] = src < L ? h[src] : out[src - L];
            }
            *order = n;
            /* How far back the two occurrences keep agreeing (a confidence
             * for the cost model, up to 32). */
            uint32_t len = n;
            while (len < 32 && i >= len - n + 1 && h[i - (len - n + 1)] == h[L - len - 1]) len++;
            *match_len = len;
            return max_k;
        }
    }
    return 0;
}

/* ---- planning ---- */

/* N-gram: a step that declines to draft this many times in a row drafts
 * one token anyway, to keep measuring. */
#define NGRAM_PROBE_EVERY 16
/* Draft model: the first steps draft this many tokens to measure it. */
#define DRAFT_WARMUP_STEPS 4
#define DRAFT_WARMUP_K 4

static uint32_t plan_ngram(llmi_spec *sp, llmi_spec_req *r, llm_token *h, uint32_t L,
                           uint32_t max_k, llmi_spec_batch batch) {
    uint32_t want = r->k_fixed ? r->k_fixed : LLMI_SPEC_AUTO_MAX_K;
    if (want > max_k) want = max_k;
    uint32_t order = 0, len = 0;
    uint32_t n = llmi_spec_ngram(h, L, want, h + L, &order, &len);
    if (n == 0) return 0;
    uint32_t k = n, bucket = ngram_bucket(len);
    if (!r->k_fixed) {
        double alpha = rate_alpha(&r->rate[bucket], rate_prior[bucket]);
        k = best_k(sp, alpha, n, batch, false, 0);
        if (k == 0) {
            if (++r->declined < NGRAM_PROBE_EVERY) return 0;
            k = 1;
        }
        r->declined = 0;
    }
    r->order = bucket;
    return k;
}

/* Reserves the draft's KV for catching up with h[0, L) and feeding all but
 * the last of n_drafts drafts. */
static llm_status reserve_draft(llmi_spec *sp, llmi_spec_req *r, const llm_token *h,
                                uint32_t L, uint32_t n_drafts) {
    /* Normally the draft's KV ends before h[L - 1]; after a step that failed
     * once the draft had run, it may hold drafts: drop them. */
    if (r->dseq.n_tokens > L - 1) llmi_kv_seq_truncate(sp->dkv, &r->dseq, L - 1);
    if (r->dseq.n_blocks == 0 && sp->prefix_cache)
        llmi_kv_prefix_match(sp->dkv, &r->dseq, h, L - 1); /* at least one row to compute */
    return llmi_kv_seq_reserve(sp->dkv, &r->dseq, L + n_drafts - 1);
}

static llm_status plan_draft(llmi_spec *sp, llmi_spec_req *r, const llm_sampling_params *p,
                             const llm_token *h, uint32_t L, uint32_t max_k,
                             llmi_spec_batch batch) {
    bool sampled = !llmi_spec_greedy(p);
    uint32_t k;
    if (r->k_fixed) {
        k = r->k_fixed < max_k ? r->k_fixed : max_k;
    } else if (r->n_steps < DRAFT_WARMUP_STEPS) {
        k = DRAFT_WARMUP_K < max_k ? DRAFT_WARMUP_K : max_k;
    } else {
        double alpha = rate_alpha(&r->rate[0], rate_prior[0]);
        uint32_t limit = max_k ? max_k : 1; /* is drafting worth it at all? */
        uint32_t best = best_k(sp, alpha, limit, batch, true, sampled ? 1 : 0);
        if (best == 0) { /* slower than plain decoding: off for good */
            llmi_log(LLM_LOG_INFO,
                     "spec: the draft model does not pay for itself (acceptance %.2f after %u "
                     "steps): off for this sequence",
                     alpha, r->n_steps);
            r->off = true;
            llmi_spec_req_drop_draft_kv(sp, r);
            return LLM_OK;
        }
        k = best < max_k ? best : max_k;
    }
    /* A sampling draft model also drafts the token after its last fed
     * draft, so that every position is decided by draft and verifier. */
    for (;;) {
        uint32_t n_drafts = k + (sampled ? 1 : 0);
        if (n_drafts == 0) return LLM_OK;
        llm_status st = reserve_draft(sp, r, h, L, n_drafts);
        if (st == LLM_OK) {
            r->k = k;
            r->n_drafts = n_drafts;
            r->run_draft = true;
            return LLM_OK;
        }
        /* Out of memory fails the step (which changes nothing); a full
         * draft pool means fewer drafts, or none (plain) this step. */
        if (st != LLM_ERR_LIMIT) return st;
        if (k == 0) return LLM_OK;
        k--;
    }
}

llm_status llmi_spec_plan(llmi_spec *sp, llmi_spec_req *r, const llm_sampling_params *p,
                          llm_token *h, uint32_t L, uint32_t max_k, llmi_spec_batch batch) {
    r->k = r->n_drafts = 0;
    r->run_draft = false;
    r->order = 0;
    r->step_accepted = r->step_examined = 0;
    if (r->mode == LLM_SPEC_NONE || r->off || L == 0) return LLM_OK;
    if (max_k > LLMI_SPEC_MAX_K) max_k = LLMI_SPEC_MAX_K;
    if (r->mode == LLM_SPEC_NGRAM) {
        r->k = plan_ngram(sp, r, h, L, max_k, batch);
        r->n_drafts = r->k;
    } else if (r->mode == LLM_SPEC_DRAFT && sp->draft) {
        llm_status st = plan_draft(sp, r, p, h, L, max_k, batch);
        if (st != LLM_OK) {
            r->k = r->n_drafts = 0;
            r->run_draft = false;
            return st;
        }
    }
    return LLM_OK;
}

/* ---- the draft model's runner ---- */

/* Feeds rows to the draft's forward pass in chunks of max_rows; logits of
 * the rows that want them land in sp->dlogits in row order. */
typedef struct feeder {
    llmi_spec *sp;
    uint32_t n, n_want, out_base;
} feeder;

static llm_status feeder_flush(feeder *f) {
    llmi_spec *sp = f->sp;
    if (f->n == 0) return LLM_OK;
    double t0 = llmi_now();
    LLMI_TRY(llmi_engine_run(sp->deng, sp->drows, f->n,
                              sp->dlogits + (size_t)f->out_base * sp->n_vocab));
    if (f->n_want == f->n && f->n <= LLMI_SPEC_COST_MAX_ROWS) /* rows with logits only */
        llmi_spec_cost_observe(&sp->draft_cost, f->n, llmi_now() - t0);
    f->out_base += f->n_want;
    f->n = f->n_want = 0;
    return LLM_OK;
}

static llm_status feeder_add(feeder *f, llmi_batch_row row) {
    if (f->n == f->sp->max_rows) LLMI_TRY(feeder_flush(f));
    f->sp->drows[f->n++] = row;
    f->n_want += row.want_logits;
    return LLM_OK;
}

/* Draws draft i (position L + i) of a job from the draft's logits. */
static llm_status draw_draft(llmi_spec *sp, llmi_spec_job *jb, uint32_t i, const float *lg) {
    llmi_spec_req *r = jb->r;
    uint32_t P = jb->L + i;
    llmi_candidate *c = NULL;
    uint32_t n = llmi_sample_dist(&sp->dsampler, lg, jb->p, jb->h, P, jb->n_generated + i,
                                  jb->tok, &c);
    llm_token t = c[0].id;
    if (!llmi_spec_greedy(jb->p)) {
        if (n > 1) t = llmi_sample_pick(c, n, llmi_rng_uniform(jb->p->seed, LLMI_SPEC_STREAM_DRAFT, P));
        /* Keep q for the verifier. */
        uint32_t base = r->q_off[i];
        if (base + n > r->cap_q) {
            uint32_t cap = r->cap_q ? r->cap_q : 64;
            while (cap < base + n) cap *= 2;
            llmi_candidate *q = llmi_realloc(r->q, (size_t)cap * sizeof *q);
            if (!q) return llmi_oom("draft distributions");
            r->q = q;
            r->cap_q = cap;
        }
        memcpy(r->q + base, c, (size_t)n * sizeof *c);
        r->q_off[i + 1] = base + n;
    }
    jb->h[P] = t;
    return LLM_OK;
}

llm_status llmi_spec_draft_run(llmi_spec *sp, llmi_spec_job *jobs, uint32_t n_jobs) {
    if (!sp->draft) return LLM_OK;
    uint32_t V = sp->n_vocab, active = 0, rounds = 0;
    for (uint32_t j = 0; j < n_jobs; j++)
        if (jobs[j].r->run_draft && jobs[j].r->n_drafts > 0) {
            active++;
            if (jobs[j].r->n_drafts > rounds) rounds = jobs[j].r->n_drafts;
        }
    if (active == 0) return LLM_OK;
    LLMI_TRY(reserve_dlogits(sp, active));
    /* Round 0: catch up with the history; its last row gives draft 0. */
    feeder f = {sp, 0, 0, 0};
    for (uint32_t j = 0; j < n_jobs; j++) {
        llmi_spec_req *r = jobs[j].r;
        if (!r->run_draft || r->n_drafts == 0) continue;
        r->q_off[0] = 0;
        for (uint32_t pos = r->dseq.n_tokens; pos < jobs[j].L; pos++)
            LLMI_TRY(feeder_add(&f, (llmi_batch_row){jobs[j].h[pos], pos, &r->dseq,
                                                     pos + 1 == jobs[j].L}));
    }
    LLMI_TRY(feeder_flush(&f));
    for (uint32_t i = 0; i < rounds; i++) {
        if (i > 0) { /* feed draft i - 1, get draft i */
            f = (feeder){sp, 0, 0, 0};
            for (uint32_t j = 0; j < n_jobs; j++) {
                llmi_spec_req *r = jobs[j].r;
                if (!r->run_draft || r->n_drafts <= i) continue;
                uint32_t pos = jobs[j].L + i - 1;
                LLMI_TRY(feeder_add(&f, (llmi_batch_row){jobs[j].h[pos], pos, &r->dseq, true}));
            }
            LLMI_TRY(feeder_flush(&f));
        }
        uint32_t row = 0;
        for (uint32_t j = 0; j < n_jobs; j++) {
            llmi_spec_req *r = jobs[j].r;
            if (!r->run_draft || r->n_drafts <= i) continue;
            LLMI_TRY(draw_draft(sp, &jobs[j], i, sp->dlogits + (size_t)row++ * V));
        }
    }
    return LLM_OK;
}

/* ---- after verification ---- */

void llmi_spec_finish(llmi_spec *sp, llmi_spec_req *r, const llm_token *h, uint32_t n_hist,
                      uint32_t produced, bool stopped, uint64_t *steps, uint64_t *drafted,
                      uint64_t *accepted) {
    (void)produced;
    if (sp->dkv && r->dseq.n_blocks) {
        /* Valid draft KV: positions whose tokens are still the history's. */
        uint32_t keep = n_hist > 0 ? n_hist - 1 : 0;
        if (r->dseq.n_tokens > keep) llmi_kv_seq_truncate(sp->dkv, &r->dseq, keep);
        if (sp->prefix_cache) llmi_kv_seq_commit(sp->dkv, &r->dseq, h);
    }
    if (r->n_drafts == 0) return;
    /* A stop (EOS, a stop string, the length) ends the sequence: the drafts
     * after it were neither accepted nor rejected, so they do not count. */
    uint32_t checked = stopped ? r->step_examined : r->n_drafts;
    r->steps++;
    r->drafted += checked;
    r->accepted += r->step_accepted;
    if (steps) (*steps)++;
    if (drafted) *drafted += checked;
    if (accepted) *accepted += r->step_accepted;
    if (stopped) return; /* nothing to learn */
    r->n_steps++;
    llmi_spec_rate *rt = &r->rate[r->mode == LLM_SPEC_NGRAM ? r->order : 0];
    rt->acc = rt->acc * RATE_DECAY + r->step_accepted;
    rt->exam = rt->exam * RATE_DECAY + r->step_examined;
    double a, b;
    llmi_spec_cost_fit(&sp->target_cost, &a, &b);
    llmi_log(LLM_LOG_DEBUG,
             "spec: %s at %u: %u drafts (k %u), %u accepted; acceptance estimate %.2f; target "
             "pass %.2f + %.2f ms/row",
             r->mode == LLM_SPEC_NGRAM ? "ngram" : "draft", n_hist, r->n_drafts, r->k,
             r->step_accepted, rate_alpha(rt, rate_prior[r->mode == LLM_SPEC_NGRAM ? r->order : 0]),
             a * 1e3, b * 1e3);
}
