/* Speculative decoding: proposers, the verifier and the cost model that
 * picks how many tokens to draft.
 *
 * One step of a speculating sequence whose history is h[0, L) (the target's
 * KV holds positions [0, L - 1)):
 *   1. propose: k drafts d_1..d_k for positions L..L+k-1, written to
 *      h[L, L + k) as scratch (not yet part of the history). The n-gram
 *      proposer copies what followed an earlier occurrence of the last
 *      tokens; the draft model samples them one by one in its own KV and
 *      records each distribution q. A draft model that samples (the request
 *      is not greedy) drafts one more token, d_{k+1}, so that every position
 *      is decided by the same rule (see verify.c).
 *   2. the target computes rows (h[L-1] @ L-1, d_1 @ L, ..., d_k @ L+k-1),
 *      all with logits: row j gives p for position L + j.
 *   3. verify: walk j = 0.. deciding the token at L + j from p_j (after the
 *      whole sampling pipeline, with the accepted drafts in the history);
 *      stop at the first token that is not the draft.
 *   4. roll back: the target's KV is truncated to the new history length
 *      minus one, the draft's to at most that.
 *
 * verify.c: the verifier. spec.c: proposers, per-sequence state, the draft
 * model's runner, the cost model. */
#ifndef LLMI_SPEC_H
#define LLMI_SPEC_H

#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sample/sample.h"

enum {
    LLMI_SPEC_MAX_K = LLM_SPEC_MAX_K, /* drafts per step, fixed k */
    LLMI_SPEC_AUTO_MAX_K = 16,        /* largest k the adaptive choice tries */
    LLMI_SPEC_COST_MAX_ROWS = 64,     /* forward passes timed for the cost model
                                         (at most this many rows, all with logits) */
    LLMI_SPEC_N_RATES = 6,            /* acceptance estimates per sequence */
};

/* Random-number streams of the verifier (plain sampling uses stream 0).
 * Keyed with (seed, position) like every other draw. */
#define LLMI_SPEC_STREAM_DRAFT 0x5350454344524654ull    /* "SPECDRFT" */
#define LLMI_SPEC_STREAM_ACCEPT 0x5350454341434350ull   /* "SPECACCP" */
#define LLMI_SPEC_STREAM_RESIDUAL 0x5350454352455344ull /* "SPECRESD" */

/* Least-squares fit t(n) = a + b n of forward-pass seconds against rows,
 * with older passes decaying, and a weak prior b = beta0 a so that it is
 * defined from the first observation on. */
typedef struct llmi_spec_cost {
    double w, sn, snn, st, snt;
} llmi_spec_cost;

void llmi_spec_cost_observe(llmi_spec_cost *c, uint32_t rows, double seconds);
/* Fitted a and b; false (and a = 1, b = beta0) before any observation. */
bool llmi_spec_cost_fit(const llmi_spec_cost *c, double *a, double *b);

/* Acceptance: decayed counts of drafts accepted and examined. */
typedef struct llmi_spec_rate {
    double acc, exam;
} llmi_spec_rate;

/* Session-wide state: the draft model's KV, forward scratch and sampler,
 * the cost models, counters. Used by the stepping thread only (and under
 * the session lock where the scheduler's state is involved). */
typedef struct llmi_spec {
    const llm_model *draft;  /* NULL: no draft model */
    llmi_engine *deng;       /* the draft's engine (the target's backend instance) */
    llmi_kv *dkv;            /* its KV pool: deng->kv */
    llmi_batch_row *drows;   /* [max_rows] */
    float *dlogits;          /* [cap_dlogits][n_vocab] */
    uint32_t cap_dlogits;
    llmi_sampler dsampler;   /* the draft's distributions q */
    float *qdense;           /* [n_vocab], zero between uses */
    uint32_t n_vocab, max_rows;
    bool prefix_cache;       /* share the draft's KV of common prefixes too */
    double draft_ratio;      /* draft / target weight bytes: cost before timing */
    llmi_spec_cost target_cost, draft_cost;
} llmi_spec;

/* `draft` may be NULL. The draft KV gets n_blocks blocks of block_size
 * tokens, stored as kv_type (the session's). */
llm_status llmi_spec_init(llmi_spec *sp, const llm_model *target, const llm_model *draft,
                          const llmi_engine *target_engine, uint32_t n_blocks, uint32_t block_size,
                          llm_kv_type kv_type, uint32_t max_rows, uint32_t n_ctx,
                          bool prefix_cache);
void llmi_spec_destroy(llmi_spec *sp);

/* LLM_OK when `draft` can draft for `target`: same n_vocab, special tokens
 * (BOS, EOS, EOT, PAD) and token texts of the first and last few ids. Else
 * LLM_ERR_INVALID_ARGUMENT naming the first difference. */
llm_status llmi_spec_check_vocab(const llm_model *target, const llm_model *draft);

/* Validates spec_mode/spec_k of a request or generate call (`what` names
 * the struct in messages). */
llm_status llmi_spec_check_params(const char *what, uint32_t mode, uint32_t k,
                                  const llm_model *draft);

/* Per-sequence state. Zero-initialised memory is a valid "off" state. */
typedef struct llmi_spec_req {
    uint32_t mode;     /* LLM_SPEC_* */
    uint32_t k_fixed;  /* 0 = adaptive */
    bool off;          /* the draft model switched itself off */
    uint32_t n_steps;  /* verification steps with drafts so far */
    uint32_t declined; /* n-gram: steps since the last drafting one */
    /* acceptance: [0] the draft model; [1..5] n-gram matches by how far
     * back they reach (1, 2, 3-5, 6-15, 16 or more tokens) */
    llmi_spec_rate rate[LLMI_SPEC_N_RATES];
    /* this step */
    uint32_t order;    /* n-gram: rate bucket of the proposal */
    uint32_t k;        /* extra target rows (drafts fed to the target) */
    uint32_t n_drafts; /* drafts to verify: k, or k + 1 for a sampling draft model */
    bool run_draft;    /* the draft model must produce the drafts */
    uint32_t step_accepted, step_examined; /* set by llmi_spec_verify */
    llmi_kv_seq dseq;  /* the draft model's sequence: a prefix of the history */
    /* q of each draft (draft model, sampling): candidates of draft j are
     * q[q_off[j], q_off[j + 1]) */
    llmi_candidate *q;
    uint32_t cap_q;
    uint32_t q_off[LLMI_SPEC_MAX_K + 2];
    /* counters */
    uint64_t steps, drafted, accepted;
} llmi_spec_req;

void llmi_spec_req_init(llmi_spec_req *r, uint32_t mode, uint32_t k_fixed);
/* Frees the q storage and the draft sequence. */
void llmi_spec_req_release(llmi_spec *sp, llmi_spec_req *r);
/* Drops the draft model's KV of the sequence (preemption): it is rebuilt
 * from the history when drafting resumes. */
void llmi_spec_req_drop_draft_kv(llmi_spec *sp, llmi_spec_req *r);

static inline bool llmi_spec_greedy(const llm_sampling_params *p) {
    return p->temperature <= 0.0f || p->top_k == 1;
}

/* What the scheduler knows about the step being planned, for the cost
 * model: rows planned so far and requests that will produce a token. */
typedef struct llmi_spec_batch {
    uint32_t n_rows, n_producing;
} llmi_spec_batch;

/* Plans one step of a sequence with history h[0, L), L >= 1, whose target
 * KV holds [0, L - 1): sets r->k (extra target rows, at most max_k),
 * r->n_drafts and r->run_draft. The n-gram proposer writes its drafts to
 * h[L, L + k) now; the draft model's are written by llmi_spec_draft_run,
 * for which this reserves draft KV (the draft KV belongs to the stepping
 * thread; a full draft pool means fewer drafts). `h` must have room for
 * L + max_k + 1 tokens. Fails only when out of memory (then nothing is
 * drafted, and the step must fail: see verify.c on why a sampling draft
 * model must not quietly fall back to plain sampling). */
llm_status llmi_spec_plan(llmi_spec *sp, llmi_spec_req *r, const llm_sampling_params *p,
                          llm_token *h, uint32_t L, uint32_t max_k, llmi_spec_batch batch);

/* One sequence for the draft model's runner. */
typedef struct llmi_spec_job {
    llmi_spec_req *r;
    llm_token *h;          /* history; drafts go to h[L, L + r->n_drafts) */
    uint32_t L;
    uint32_t n_generated;  /* generated tokens in h[0, L), for min_tokens */
    const llm_sampling_params *p;
    const llmi_tokenizer *tok;
} llmi_spec_job;

/* Runs the draft model for every job with r->run_draft: catches its KV up
 * with the history, then drafts r->n_drafts tokens each, all jobs batched
 * into one forward pass per draft position. Records q for sampling jobs. */
llm_status llmi_spec_draft_run(llmi_spec *sp, llmi_spec_job *jobs, uint32_t n_jobs);

/* Receives each token the verifier decides, in order. The verifier has
 * already written it to h[L + i]; `push` makes it part of the history (its
 * length and generated count grow by one), emits it, and returns false when
 * the sequence must stop (a stop condition, the callback, an error). */
typedef struct llmi_spec_sink {
    bool (*push)(void *ctx, llm_token tok, const float *logits);
    void *ctx;
} llmi_spec_sink;

/* Decides tokens from the target's rows: `logits` holds r->k + 1 rows (the
 * row of h[L - 1], then one per fed draft). Pushes each token to `sink`
 * until the first one that is not a draft, or until the sink says stop.
 * With r->n_drafts == 0 this is plain sampling of one token. Returns the
 * number of tokens pushed; *stopped tells whether the sink said stop. */
uint32_t llmi_spec_verify(llmi_spec *sp, llmi_spec_req *r, llmi_sampler *sampler,
                          const float *logits, const llm_sampling_params *p, llm_token *h,
                          uint32_t L, uint32_t n_generated, const llmi_tokenizer *tok,
                          llmi_spec_sink sink, bool *stopped);

/* After verification: `n_hist` is the history's new length. Truncates the
 * draft KV to what is still valid, updates acceptance and counters (adds
 * this step to *steps, *drafted, *accepted when not NULL; drafts after a
 * stop are not counted). `produced` is what llmi_spec_verify returned. */
void llmi_spec_finish(llmi_spec *sp, llmi_spec_req *r, const llm_token *h, uint32_t n_hist,
                      uint32_t produced, bool stopped, uint64_t *steps, uint64_t *drafted,
                      uint64_t *accepted);

/* Test hook: 0 = correct verifier; 1 = accept every draft; 2 = on a
 * rejection draw from p instead of the residual. Process-wide. */
void llmi_spec_test_break(int mode);

/* N-gram proposer: the most recent earlier occurrence of the last n tokens
 * of h[0, L) (n = 3, 2, 1, the longest that matches) and the tokens that
 * followed it, continued periodically past the end of the history; writes
 * max_k of them to out. Returns how many (0: no match); *order = n, and
 * *match_len how many tokens back the two occurrences agree (>= n, at most
 * 32): the longer, the likelier the drafts are accepted. */
uint32_t llmi_spec_ngram(const llm_token *h, uint32_t L, uint32_t max_k, llm_token *out,
                         uint32_t *order, uint32_t *match_len);

#endif
