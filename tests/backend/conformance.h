/* Helpers of the backend conformance suite (test_conformance.c): the
 * backend under test, tiny random models, and a "pair" of engines, one on
 * the reference (the CPU backend) and one on the backend under test, that
 * run the same rows on the same model and compare their logits. */
#ifndef TEST_CONFORMANCE_H
#define TEST_CONFORMANCE_H

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/testmodel.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

enum {
    CONF_THREADS = 2,
    CONF_CTX = 256,     /* engine attention span */
    CONF_MAX_ROWS = 64, /* rows per step */
    CONF_MAX_SEQS = 6,
};

/* ---- the backend under test ---- */

typedef struct conf_backend {
    const llmi_backend_ops *ops; /* NULL: not available (tests skip) */
    char why[256];               /* why not, for the skip message */
    bool exact;                  /* runs the CPU's code: results must be bit-identical */
    bool f32_act;                /* has step_set_f32_activations */
    double tol_override;         /* LLM_TEST_TOL, or 0 */
} conf_backend;

/* Logits tolerance, relative to max |ref| (docs/design.md, "Backend
 * conformance suite"): for a backend that keeps f32 activations 1e-3
 * (4e-3 with a bf16 KV cache); for one without the entry 1e-2 with float
 * weights and 1.5e-1 with quantized weights (8-bit activations: the CPU's
 * own 8-bit path is up to 1e-1 off its f32 path on these models);
 * LLM_TEST_TOL overrides. */
double conf_tolerance(const llm_model *m, llm_kv_type kv_type);

extern conf_backend g_dut;

/* Skips the calling test when there is no backend to test. */
#define CONF_REQUIRE_BACKEND()                                                                     \
    do {                                                                                           \
        if (!g_dut.ops) {                                                                          \
            printf("# skipped: %s\n", g_dut.why);                                                  \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* ---- random numbers (fixed seeds, printed by the tests) ---- */

static inline uint32_t conf_rand(uint64_t *rng) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*rng >> 33);
}
/* Uniform in [lo, hi]. */
static inline uint32_t conf_range(uint64_t *rng, uint32_t lo, uint32_t hi) {
    return lo + conf_rand(rng) % (hi - lo + 1);
}
/* Uniform in [-1, 1). */
static inline float conf_unit(uint64_t *rng) {
    return (float)conf_rand(rng) / (float)(1u << 30) - 1.0f;
}

/* ---- models ---- */

/* Writes the test model to a scratch file and loads it. */
llm_model *conf_model(const llmi_testmodel_params *p);
/* Standard params: n_embd 96 (not a power of two), 6 heads of 16, 2 KV
 * heads (GQA), n_ff 160, vocabulary 307 (not a multiple of 32). */
void conf_params(llmi_testmodel_params *p, llmi_ttype type, uint64_t seed);

/* ---- engines ---- */

/* An engine of `ops` on m; the pool's free blocks are shuffled with `seed`
 * (0: left in order) so that sequences get scattered block ids. */
llmi_engine *conf_engine(const llmi_backend_ops *ops, const llm_model *m, llm_kv_type kv_type,
                         uint32_t block_size, uint32_t n_blocks, uint64_t shuffle_seed);
/* Whether the backend under test refuses m as LLM_ERR_UNSUPPORTED (a
 * tensor-parallel table whose ranks m does not split across); prints the
 * reason: the caller skips that case. */
bool conf_refused(const llm_model *m);
/* The same with a KV cache of kv_type: a backend that does not implement
 * the type (the CUDA plug-in and LLM_KV_Q4_0; a tensor-parallel CUDA group
 * and every block type) must refuse it as LLM_ERR_UNSUPPORTED at engine
 * creation; the caller skips the case. */
bool conf_refused_kv(const llm_model *m, llm_kv_type kv_type);
/* Frees the blocks in random order: later allocations take them in it. */
void conf_shuffle_pool(llmi_kv *kv, uint64_t seed);

/* One row of a step, by sequence index. */
typedef struct conf_row {
    llm_token token;
    uint32_t pos, seq;
    bool want;
} conf_row;

/* The same sequences on the reference and on the backend under test. */
typedef struct conf_side {
    llmi_engine *e;
    llmi_kv_seq seq[CONF_MAX_SEQS];
    float *logits; /* [CONF_MAX_ROWS + 1][n_vocab]: the last row is a guard */
} conf_side;

typedef struct conf_pair {
    const llm_model *m;
    uint32_t n_vocab;
    conf_side ref, dut;
    double tol;
    const char *what; /* the case, for messages */
    /* the largest error seen, relative to max |ref| (reported) */
    double max_err;
} conf_pair;

void conf_pair_open(conf_pair *p, const llm_model *m, llm_kv_type kv_type, uint32_t block_size,
                    uint32_t n_blocks, uint64_t shuffle_seed, const char *what);
void conf_pair_close(conf_pair *p);
/* Reserves positions up to n_tokens of sequence s on both sides. */
void conf_pair_reserve(conf_pair *p, uint32_t s, uint32_t n_tokens);
/* Runs the rows on both sides (poisoned logits, guard row checked) and
 * compares the logits; returns the rows' logits count. */
uint32_t conf_pair_step(conf_pair *p, const conf_row *rows, uint32_t n);
/* Runs the rows on one side only (poisoned logits, guard row checked,
 * every wanted logit finite); returns the logits count. */
uint32_t conf_side_step(const conf_pair *p, conf_side *sd, const conf_row *rows, uint32_t n);

/* Compares logits of n rows: bit-identical when `exact`, else within
 * tol * max |ref| and the same argmax where ref's top-2 gap is clear.
 * Returns the largest error relative to max |ref|. */
double conf_compare(const float *ref, const float *got, uint32_t n_rows, uint32_t n_vocab,
                    bool exact, double tol, const char *what);

/* NaN with a payload that no computation produces. */
void conf_poison(float *x, size_t n);
bool conf_is_poison(const float *x, size_t n);

#endif
