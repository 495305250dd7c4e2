/* The CUDA backend's host arithmetic (cuda/layout.c), on machines without a
 * GPU: the weight arena, the step scratch, dequantization chunks, what the
 * backend refuses, and its copies of the core's tensor names. Checked on
 * random model shapes (fixed, printed seeds) and on the real SmolLM2 and
 * Gemma 3 files, against computations written here from the shapes: byte
 * counts summed independently (and, for real files, the loader's own
 * weight_bytes), ranges checked for overlap after sorting, chunk sizes
 * found by brute force. */
#include "layout.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t rng_range(uint64_t *s, uint32_t lo, uint32_t hi) { /* [lo, hi] */
    return lo + (uint32_t)(rng_next(s) % ((uint64_t)hi - lo + 1));
}

/* ---- fake models: shapes only, data pointers never read ---- */

static char dummy[4096]; /* distinct non-NULL data pointers */

typedef struct fake_model {
    llm_model m;
    int next;
} fake_model;

static void set_w(fake_model *f, llmi_weight *w, llmi_ttype type, int64_t rows, int64_t cols) {
    w->data = &dummy[f->next++];
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = llmi_ttype_row_bytes(type, (uint64_t)cols);
    assert_true(w->row_bytes > 0);
}

static const llmi_ttype all_types[] = {LLMI_T_F32,  LLMI_T_F16,  LLMI_T_BF16, LLMI_T_Q4_0,
                                       LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1, LLMI_T_Q8_0,
                                       LLMI_T_Q4_K, LLMI_T_Q6_K};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

static llmi_ttype pick_type(uint64_t *s, int64_t cols) {
    for (;;) {
        llmi_ttype t = all_types[rng_next(s) % N_TYPES];
        if (cols % llmi_ttype_get(t)->block == 0)
            return t;
    }
}

static void set_matrix(fake_model *f, uint64_t *s, llmi_weight *w, int64_t rows, int64_t cols) {
    set_w(f, w, pick_type(s, cols), rows, cols);
}

static fake_model *fake_new(uint64_t *s) {
    fake_model *f = calloc(1, sizeof *f);
    assert_non_null(f);
    llm_model *m = &f->m;
    llmi_hparams *hp = &m->hp;
    hp->n_layer = rng_range(s, 1, 6);
    hp->n_embd = 32 * rng_range(s, 1, 96);
    hp->head_dim = 32 * rng_range(s, 1, 8);
    hp->n_head_kv = rng_range(s, 1, 4);
    hp->n_head = hp->n_head_kv * rng_range(s, 1, 4);
    hp->n_ff = 32 * rng_range(s, 1, 300);
    hp->n_vocab = rng_range(s, 50, 300000);
    hp->rope_dim = hp->head_dim - 16 * rng_range(s, 0, 1);
    hp->rms_eps = 1e-6f;
    hp->features.norm = LLMI_NORM_RMS;
    const uint32_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    set_matrix(f, s, &m->w[LLMI_ROLE_TOKEN_EMBD], hp->n_vocab, hp->n_embd);
    set_w(f, &m->w[LLMI_ROLE_OUTPUT_NORM], LLMI_T_F32, 1, hp->n_embd);
    hp->tied_embeddings = rng_next(s) % 2;
    if (hp->tied_embeddings)
        m->w[LLMI_ROLE_OUTPUT] = m->w[LLMI_ROLE_TOKEN_EMBD];
    else
        set_matrix(f, s, &m->w[LLMI_ROLE_OUTPUT], hp->n_vocab, hp->n_embd);
    if (rng_next(s) % 3 == 0)
        set_w(f, &m->w[LLMI_ROLE_ROPE_FREQS], LLMI_T_F32, 1, hp->rope_dim / 2);
    const bool bias = rng_next(s) % 2, qk_norm = rng_next(s) % 2, post = rng_next(s) % 2;
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    assert_non_null(m->layers);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        llmi_weight *w = m->layers[l].w;
        set_w(f, &w[LLMI_ROLE_ATTN_NORM], LLMI_T_F32, 1, hp->n_embd);
        set_matrix(f, s, &w[LLMI_ROLE_Q], q_dim, hp->n_embd);
        set_matrix(f, s, &w[LLMI_ROLE_K], kv_dim, hp->n_embd);
        set_matrix(f, s, &w[LLMI_ROLE_V], kv_dim, hp->n_embd);
        set_matrix(f, s, &w[LLMI_ROLE_O], hp->n_embd, q_dim);
        set_w(f, &w[LLMI_ROLE_FFN_NORM], LLMI_T_F32, 1, hp->n_embd);
        set_matrix(f, s, &w[LLMI_ROLE_GATE], hp->n_ff, hp->n_embd);
        set_matrix(f, s, &w[LLMI_ROLE_UP], hp->n_ff, hp->n_embd);
        set_matrix(f, s, &w[LLMI_ROLE_DOWN], hp->n_embd, hp->n_ff);
        if (bias) {
            set_w(f, &w[LLMI_ROLE_Q_BIAS], LLMI_T_F32, 1, q_dim);
            set_w(f, &w[LLMI_ROLE_K_BIAS], LLMI_T_F32, 1, kv_dim);
            set_w(f, &w[LLMI_ROLE_V_BIAS], LLMI_T_F32, 1, kv_dim);
        }
        if (qk_norm) {
            set_w(f, &w[LLMI_ROLE_Q_NORM], LLMI_T_F32, 1, hp->head_dim);
            set_w(f, &w[LLMI_ROLE_K_NORM], LLMI_T_F32, 1, hp->head_dim);
        }
        if (post) {
            set_w(f, &w[LLMI_ROLE_POST_ATTN_NORM], LLMI_T_F32, 1, hp->n_embd);
            set_w(f, &w[LLMI_ROLE_POST_FFN_NORM], LLMI_T_F32, 1, hp->n_embd);
        }
    }
    return f;
}

static void fake_free(fake_model *f) {
    if (!f)
        return;
    free(f->m.layers);
    free(f);
}

/* ---- the roles the backend uploads, from the core's role table ---- */

/* Dense decoder roles: 2-D or vectors, not MoE, not the fused views'
 * source tensors. Written from model/arch.h, not from layout.c. */
static bool role_expected_used(int r) {
    /* the encoders' roles (O_BIAS and after): the backend refuses encoders */
    return llmi_layer_roles[r].stack == LLMI_DIM_ONE && llmi_layer_roles[r].ffn != LLMI_FFN_MOE &&
           r != LLMI_ROLE_QKV && r != LLMI_ROLE_GATE_UP && r < LLMI_ROLE_O_BIAS;
}

static void test_role_names_match_core(void **state) {
    (void)state;
    for (int r = 0; r < LLMI_LAYER_ROLES; r++) {
        assert_int_equal(llmi_cuda_layer_role_used(r), role_expected_used(r));
        if (role_expected_used(r))
            assert_string_equal(llmi_cuda_layer_role_name(r), llmi_layer_roles[r].name);
        else
            assert_null(llmi_cuda_layer_role_name(r));
    }
    for (int r = 0; r < LLMI_MODEL_ROLES; r++)
        assert_string_equal(llmi_cuda_model_role_name(r), llmi_model_roles[r].name);
    assert_false(llmi_cuda_layer_role_used(-1));
    assert_false(llmi_cuda_layer_role_used(LLMI_LAYER_ROLES));
    char buf[24];
    for (uint32_t t = 0; t < 64; t++) {
        const llmi_ttype_info *info = llmi_ttype_get(t);
        const char *name = llmi_cuda_type_name((llmi_ttype)t, buf, sizeof buf);
        if (info)
            assert_string_equal(name, info->name);
        else
            assert_non_null(strstr(name, "type"));
    }
}

/* ---- arena ---- */

static void test_arena_add(void **state) {
    (void)state;
    uint64_t seed = 0xa7e4a, s = seed;
    printf("seed %#llx\n", (unsigned long long)seed);
    for (int round = 0; round < 200; round++) {
        size_t size = 0, prev_end = 0, sum = 0;
        int n = (int)rng_range(&s, 1, 50);
        for (int i = 0; i < n; i++) {
            size_t bytes = rng_next(&s) % 3 == 0 ? 0 : rng_next(&s) % 100000;
            size_t off;
            assert_true(llmi_cuda_arena_add(&size, bytes, &off));
            assert_int_equal(off % LLMI_CUDA_ALIGN, 0);
            assert_true(off >= prev_end);
            assert_true(off - prev_end < LLMI_CUDA_ALIGN);
            assert_int_equal(size, off + bytes);
            prev_end = off + bytes;
            sum += bytes;
        }
        assert_true(size >= sum && size < sum + (size_t)n * LLMI_CUDA_ALIGN);
    }
    /* Overflow: refused, nothing changed. */
    size_t size = SIZE_MAX - 10, off = 77;
    assert_false(llmi_cuda_arena_add(&size, 1, &off));
    assert_int_equal(size, SIZE_MAX - 10);
    assert_int_equal(off, 77);
    size = 1000;
    assert_false(llmi_cuda_arena_add(&size, SIZE_MAX - 500, &off));
    assert_int_equal(size, 1000);
}

/* ---- the weight arena ---- */

typedef struct range {
    size_t off, bytes;
} range;

static int range_cmp(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Checks llmi_cuda_weights_plan on m; returns the unique bytes uploaded. */
static size_t check_weights_plan(const llm_model *m) {
    const size_t n = llmi_cuda_weight_slots(m);
    assert_int_equal(n, LLMI_MODEL_ROLES + (size_t)m->hp.n_layer * LLMI_LAYER_ROLES);
    size_t *off = malloc(n * sizeof *off);
    range *ranges = malloc(n * sizeof *ranges);
    assert_non_null(off);
    assert_non_null(ranges);
    size_t total = 0, n_ranges = 0, sum = 0;
    assert_true(llmi_cuda_weights_plan(m, off, &total));
    const bool tied = m->w[LLMI_ROLE_OUTPUT].data == m->w[LLMI_ROLE_TOKEN_EMBD].data;
    for (size_t i = 0; i < n; i++) {
        const llmi_weight *w;
        bool used;
        if (i < LLMI_MODEL_ROLES) {
            w = &m->w[i];
            used = i != LLMI_ROLE_ROPE_FACTORS_LONG && i != LLMI_ROLE_ROPE_FACTORS_SHORT;
        } else {
            size_t l = (i - LLMI_MODEL_ROLES) / LLMI_LAYER_ROLES;
            int r = (int)((i - LLMI_MODEL_ROLES) % LLMI_LAYER_ROLES);
            w = &m->layers[l].w[r];
            used = role_expected_used(r);
        }
        if (!w->data || !used) {
            assert_true(off[i] == SIZE_MAX);
            continue;
        }
        assert_ptr_equal(llmi_cuda_weight_at(m, i), w);
        assert_true(off[i] != SIZE_MAX);
        assert_int_equal(off[i] % LLMI_CUDA_ALIGN, 0);
        if (i == LLMI_ROLE_OUTPUT && tied) {
            assert_int_equal(off[i], off[LLMI_ROLE_TOKEN_EMBD]);
            continue;
        }
        size_t bytes = (size_t)w->rows * llmi_ttype_row_bytes(w->type, (uint64_t)w->cols);
        ranges[n_ranges++] = (range){off[i], bytes};
        sum += bytes;
    }
    qsort(ranges, n_ranges, sizeof *ranges, range_cmp);
    for (size_t i = 0; i + 1 < n_ranges; i++)
        assert_true(ranges[i].off + ranges[i].bytes <= ranges[i + 1].off);
    assert_int_equal(total, ranges[n_ranges - 1].off + ranges[n_ranges - 1].bytes);
    assert_true(total >= sum && total < sum + n_ranges * LLMI_CUDA_ALIGN);
    free(off);
    free(ranges);
    return sum;
}

static bool all_types_ok(llmi_ttype t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (all_types[i] == t)
            return true;
    return false;
}

static void test_weights_plan_random(void **state) {
    (void)state;
    uint64_t seed = 0x3e1ab, s = seed;
    printf("seed %#llx\n", (unsigned long long)seed);
    for (int round = 0; round < 300; round++) {
        fake_model *f = fake_new(&s);
        char why[320];
        assert_int_equal(llmi_cuda_model_check(&f->m, all_types_ok, why, sizeof why), LLM_OK);
        check_weights_plan(&f->m);
        fake_free(f);
    }
}

/* ---- what the backend refuses ---- */

static bool no_q4_k(llmi_ttype t) { return all_types_ok(t) && t != LLMI_T_Q4_K; }

static void expect_refusal(const llm_model *m, bool (*type_ok)(llmi_ttype), const char *words) {
    char why[320] = "";
    assert_int_equal(llmi_cuda_model_check(m, type_ok, why, sizeof why), LLM_ERR_UNSUPPORTED);
    if (!strstr(why, words))
        fail_msg("refusal \"%s\" does not say \"%s\"", why, words);
}

static void test_model_check_refuses(void **state) {
    (void)state;
    uint64_t s = 0x5eed;
    fake_model *f = fake_new(&s);
    llm_model *m = &f->m;
    char why[320];
    assert_int_equal(llmi_cuda_model_check(m, all_types_ok, why, sizeof why), LLM_OK);

    m->hp.features.attn_softcap = 50.0f;
    expect_refusal(m, all_types_ok, "soft-cap");
    m->hp.features.attn_softcap = 0.0f;
    m->hp.features.n_expert = 8;
    expect_refusal(m, all_types_ok, "mixture-of-experts");
    m->hp.features.n_expert = 0;
    m->hp.features.norm = LLMI_NORM_LAYER;
    expect_refusal(m, all_types_ok, "LayerNorm");
    m->hp.features.encoder = true;
    expect_refusal(m, all_types_ok, "does not implement encoder models");
    m->hp.features.encoder = false;
    m->hp.features.norm = LLMI_NORM_RMS;
    set_w(f, &m->w[LLMI_ROLE_ROPE_FACTORS_LONG], LLMI_T_F32, 1, m->hp.rope_dim / 2);
    expect_refusal(m, all_types_ok, "LongRoPE");
    m->w[LLMI_ROLE_ROPE_FACTORS_LONG].data = NULL;

    /* A matrix of a type the kernels lack: named with its type. */
    llmi_weight saved = m->layers[m->hp.n_layer - 1].w[LLMI_ROLE_DOWN];
    set_w(f, &m->layers[m->hp.n_layer - 1].w[LLMI_ROLE_DOWN], LLMI_T_Q8_1, m->hp.n_embd,
          m->hp.n_ff);
    char name[64];
    snprintf(name, sizeof name, "blk.%u.ffn_down.weight of type Q8_1", m->hp.n_layer - 1);
    expect_refusal(m, all_types_ok, name);
    m->layers[m->hp.n_layer - 1].w[LLMI_ROLE_DOWN] = saved;
    /* A norm vector that is not F32. */
    set_w(f, &m->layers[0].w[LLMI_ROLE_ATTN_NORM], LLMI_T_F16, 1, m->hp.n_embd);
    expect_refusal(m, all_types_ok, "blk.0.attn_norm.weight of type F16");
    set_w(f, &m->layers[0].w[LLMI_ROLE_ATTN_NORM], LLMI_T_F32, 1, m->hp.n_embd);
    /* The embedding too. */
    m->w[LLMI_ROLE_TOKEN_EMBD].type = LLMI_T_Q4_K;
    m->w[LLMI_ROLE_OUTPUT].type = LLMI_T_Q4_K;
    expect_refusal(m, no_q4_k, "token_embd.weight of type Q4_K");
    fake_free(f);
}

/* ---- dequantization chunks ---- */

/* The largest multiple of LLMI_CUDA_CHUNK_ROWS rows (or all rows) whose
 * bytes fit, found by counting up. */
static uint32_t brute_chunk(uint32_t rows, uint32_t cols, size_t eb, size_t scratch) {
    if ((unsigned __int128)rows * cols * eb <= scratch)
        return rows;
    uint32_t best = 0;
    for (uint32_t c = LLMI_CUDA_CHUNK_ROWS; c < rows; c += LLMI_CUDA_CHUNK_ROWS)
        if ((unsigned __int128)c * cols * eb <= scratch)
            best = c;
    return best;
}

static void test_chunk_rows(void **state) {
    (void)state;
    uint64_t seed = 0xc4c4, s = seed;
    printf("seed %#llx\n", (unsigned long long)seed);
    for (int i = 0; i < 3000; i++) {
        uint32_t rows = rng_range(&s, 1, 300000), cols = 32 * rng_range(&s, 1, 600);
        size_t eb = rng_next(&s) % 2 ? 2 : 4;
        size_t scratch = rng_next(&s) % ((size_t)64 << 20);
        assert_int_equal(llmi_cuda_chunk_rows(rows, cols, eb, scratch),
                         brute_chunk(rows, cols, eb, scratch));
    }
    assert_int_equal(llmi_cuda_chunk_rows(10, 0, 4, 100), 0);
}

/* ---- step scratch ---- */

static void check_scratch_plan(const llm_model *m, uint32_t max_rows, size_t attn_floats,
                               bool invariant) {
    const llmi_hparams *hp = &m->hp;
    llmi_cuda_scratch p;
    assert_true(llmi_cuda_scratch_plan(m, max_rows, attn_floats, invariant, &p));
    const size_t q_dim = (size_t)hp->n_head * hp->head_dim,
                 kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    /* logit rows: at least one, at most max_rows, within the cap. */
    assert_true(p.logit_rows >= 1 && p.logit_rows <= max_rows);
    assert_true(p.logit_rows == 1 ||
                (size_t)p.logit_rows * hp->n_vocab * 4 <= LLMI_CUDA_LOGITS_CAP);
    assert_true(p.logit_rows == max_rows ||
                (size_t)(p.logit_rows + 1) * hp->n_vocab * 4 > LLMI_CUDA_LOGITS_CAP);
    /* The batch-invariant matmul takes bf16 activations at every row
     * count and reads weights where they lie: no dequantization chunk. */
    assert_int_equal(p.gemm, invariant || max_rows > LLMI_CU_GEMV_MAX_ROWS);
    if (invariant)
        assert_int_equal(p.deq_bytes, 0);
    size_t widest = hp->n_embd > q_dim ? hp->n_embd : q_dim;
    widest = hp->n_ff > widest ? hp->n_ff : widest;
    const size_t r4 = (size_t)max_rows * 4;
    range want[] = {
        {p.x, r4 * hp->n_embd},
        {p.xb, r4 * hp->n_embd},
        {p.q, r4 * (q_dim + 2 * kv_dim)}, /* a fused Q/K/V product's rows */
        {p.k, r4 * kv_dim},
        {p.v, r4 * kv_dim},
        {p.att, r4 * q_dim},
        {p.gate, r4 * hp->n_ff},
        {p.up, r4 * hp->n_ff},
        {p.hout, r4 * hp->n_embd},
        {p.out_rows, (size_t)p.logit_rows * hp->n_embd * 4},
        {p.logits, (size_t)p.logit_rows * hp->n_vocab * 4},
        {p.attn, attn_floats * 4},
        {p.act, p.gemm ? (size_t)max_rows * widest * 2 : 0},
        {p.deq, p.gemm ? p.deq_bytes : 0},
    };
    const size_t n = sizeof want / sizeof want[0];
    size_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(want[i].off % LLMI_CUDA_ALIGN, 0);
        assert_true(want[i].off + want[i].bytes <= p.size);
        sum += want[i].bytes;
    }
    /* Empty buffers (absent ones sit at 0) overlap nothing. */
    size_t n_used = 0;
    for (size_t i = 0; i < n; i++)
        if (want[i].bytes)
            want[n_used++] = want[i];
    qsort(want, n_used, sizeof *want, range_cmp);
    for (size_t i = 0; i + 1 < n_used; i++)
        assert_true(want[i].off + want[i].bytes <= want[i + 1].off);
    assert_true(p.size >= sum && p.size < sum + n * LLMI_CUDA_ALIGN);
    if (!p.gemm || invariant)
        return;
    /* Every matrix gets chunks of at least LLMI_CUDA_CHUNK_ROWS rows (or
     * is whole) in f32 and bf16; the scratch is no larger than the cap or
     * the smallest chunk of the widest matrix needs. */
    size_t biggest = 0, min_chunk = 0;
    const size_t slots = llmi_cuda_weight_slots(m);
    for (size_t i = 0; i < slots; i++) {
        const llmi_weight *w = llmi_cuda_weight_at(m, i);
        if (!w || w->rows == 1 || i == LLMI_ROLE_TOKEN_EMBD || i == LLMI_ROLE_OUTPUT_NORM ||
            i == LLMI_ROLE_ROPE_FREQS)
            continue;
        uint32_t rows = (uint32_t)w->rows, cols = (uint32_t)w->cols;
        uint32_t c4 = llmi_cuda_chunk_rows(rows, cols, 4, p.deq_bytes);
        uint32_t c2 = llmi_cuda_chunk_rows(rows, cols, 2, p.deq_bytes);
        assert_true(c4 == rows || c4 >= LLMI_CUDA_CHUNK_ROWS);
        assert_true(c2 >= c4);
        size_t whole = (size_t)rows * cols * 4, chunk = (size_t)LLMI_CUDA_CHUNK_ROWS * cols * 4;
        biggest = whole > biggest ? whole : biggest;
        min_chunk = chunk > min_chunk ? chunk : min_chunk;
    }
    size_t bound = LLMI_CUDA_DEQUANT_CAP > min_chunk ? LLMI_CUDA_DEQUANT_CAP : min_chunk;
    assert_true(p.deq_bytes <= bound && p.deq_bytes <= biggest);
}

static void test_scratch_plan_random(void **state) {
    (void)state;
    uint64_t seed = 0x5c7a, s = seed;
    printf("seed %#llx\n", (unsigned long long)seed);
    for (int round = 0; round < 300; round++) {
        fake_model *f = fake_new(&s);
        uint32_t max_rows = rng_next(&s) % 2 ? rng_range(&s, 1, 16) : rng_range(&s, 1, 2048);
        check_scratch_plan(&f->m, max_rows, rng_next(&s) % 1000000, rng_next(&s) % 2);
        fake_free(f);
    }
    /* Overflow: refused. */
    uint64_t s2 = 1;
    fake_model *f = fake_new(&s2);
    llmi_cuda_scratch p;
    assert_false(llmi_cuda_scratch_plan(&f->m, 1, SIZE_MAX / 2, false, &p));
    assert_false(llmi_cuda_scratch_plan(&f->m, 1, SIZE_MAX / 2, true, &p));
    fake_free(f);
}

static void test_gemv_choice_and_max_pos(void **state) {
    (void)state;
    for (uint32_t n = 1; n <= 64; n++)
        assert_int_equal(llmi_cuda_use_gemv(n), n <= LLMI_CU_GEMV_MAX_ROWS);
    uint64_t s = 0x9a9;
    for (int round = 0; round < 100; round++) {
        uint32_t pos[64], n = rng_range(&s, 1, 64), want = 0;
        for (uint32_t r = 0; r < n; r++) {
            pos[r] = (uint32_t)(rng_next(&s) % 100000);
            want = pos[r] > want ? pos[r] : want;
        }
        assert_int_equal(llmi_cuda_max_pos(pos, n), want);
    }
}

/* The matmul takes a weight in place exactly when its stored rows are
 * already dense rows of the operand type (bf16, or f32 with f32
 * activations): what the in-place cuBLASLt call relies on. */
static void test_gemm_in_place(void **state) {
    (void)state;
    uint64_t s = 0x6e1;
    for (size_t t = 0; t < N_TYPES; t++)
        for (int f32 = 0; f32 < 2; f32++) {
            const llmi_ttype type = all_types[t];
            const llmi_ttype operand = f32 ? LLMI_T_F32 : LLMI_T_BF16;
            assert_int_equal(llmi_cuda_gemm_in_place(type, f32), type == operand);
            if (!llmi_cuda_gemm_in_place(type, f32))
                continue;
            for (int round = 0; round < 50; round++) {
                const uint32_t cols = rng_range(&s, 1, 20000);
                assert_int_equal(llmi_ttype_row_bytes(type, cols), (size_t)cols * (f32 ? 4 : 2));
            }
        }
    /* F16 weights never go in place: no f16 x bf16 matmul. */
    assert_false(llmi_cuda_gemm_in_place(LLMI_T_F16, false));
    assert_false(llmi_cuda_gemm_in_place(LLMI_T_F16, true));
}

/* ---- prefill attention tiles ---- */

/* Row r's run, found from r itself: the first row of its stretch of rows
 * of one sequence at consecutive positions, and the stretch's length. */
static void run_of(const uint32_t *pos, const uint32_t *seq, uint32_t n, uint32_t r,
                   uint32_t *start, uint32_t *len) {
    uint32_t a = r, b = r;
    while (a > 0 && seq[a - 1] == seq[a] && pos[a - 1] + 1 == pos[a])
        a--;
    while (b + 1 < n && seq[b + 1] == seq[b] && pos[b] + 1 == pos[b + 1])
        b++;
    *start = a;
    *len = b - a + 1;
}

/* A random descriptor: segments of rows of random sequences, each at
 * consecutive positions from a random start (decode rows are segments of
 * one); neighbouring segments sometimes continue each other. */
static uint32_t random_rows(uint64_t *s, uint32_t *pos, uint32_t *seq, uint32_t cap) {
    uint32_t n = 0;
    const uint32_t want = rng_range(s, 1, cap);
    while (n < want) {
        const uint32_t len = rng_range(s, 0, 3) == 0 ? 1 : rng_range(s, 1, 100);
        uint32_t sq = rng_range(s, 0, 3), p = rng_range(s, 0, 5000);
        if (n > 0 && rng_range(s, 0, 4) == 0) { /* continues the previous row */
            sq = seq[n - 1];
            p = pos[n - 1] + 1;
        }
        for (uint32_t i = 0; i < len && n < want; i++, n++) {
            seq[n] = sq;
            pos[n] = p + i;
        }
    }
    return n;
}

static void test_prefill_plan(void **state) {
    (void)state;
    enum { CAP = 600 };
    uint32_t pos[CAP], seq[CAP], tiles[2 * CAP], decode[CAP], owner[CAP];
    uint64_t s = 0x9f11;
    printf("# prefill plan: seed %llu\n", (unsigned long long)s);
    for (int round = 0; round < 2000; round++) {
        const uint32_t n = random_rows(&s, pos, seq, CAP);
        const uint32_t hd = round % 7 == 0 ? LLMI_CU_PREFILL_MAX_HEAD_DIM + 32 * rng_range(&s, 0, 2)
                                           : 32 * rng_range(&s, 1, 8);
        uint32_t nt = UINT32_MAX, nd = UINT32_MAX;
        llmi_cuda_prefill_plan(pos, seq, n, hd, tiles, &nt, decode, &nd);
        assert_true(nt <= n && nd <= n);
        for (uint32_t r = 0; r < n; r++)
            owner[r] = UINT32_MAX;
        /* Tiles: consecutive rows of one sequence at consecutive positions. */
        for (uint32_t t = 0; t < nt; t++) {
            const uint32_t r0 = tiles[2 * t], len = tiles[2 * t + 1];
            assert_true(len >= 1 && len <= LLMI_CU_PREFILL_TILE && r0 + len <= n);
            for (uint32_t i = 0; i < len; i++) {
                assert_int_equal(seq[r0 + i], seq[r0]);
                assert_int_equal(pos[r0 + i], pos[r0] + i);
                assert_int_equal(owner[r0 + i], UINT32_MAX);
                owner[r0 + i] = t;
            }
        }
        for (uint32_t i = 0; i < nd; i++) {
            assert_true(decode[i] < n);
            if (i > 0)
                assert_true(decode[i] > decode[i - 1]);
            assert_int_equal(owner[decode[i]], UINT32_MAX);
            owner[decode[i]] = UINT32_MAX - 1;
        }
        /* Each row where its own run says it belongs. */
        for (uint32_t r = 0; r < n; r++) {
            uint32_t start, len;
            run_of(pos, seq, n, r, &start, &len);
            if (hd > LLMI_CU_PREFILL_MAX_HEAD_DIM || len < LLMI_CU_PREFILL_MIN_ROWS) {
                assert_int_equal(owner[r], UINT32_MAX - 1);
                continue;
            }
            assert_true(owner[r] < nt);
            const uint32_t k = (r - start) / LLMI_CU_PREFILL_TILE;
            const uint32_t first = start + k * LLMI_CU_PREFILL_TILE, left = len - (first - start);
            assert_int_equal(tiles[2 * owner[r]], first);
            assert_int_equal(tiles[2 * owner[r] + 1],
                             left < LLMI_CU_PREFILL_TILE ? left : LLMI_CU_PREFILL_TILE);
        }
    }
    /* One long prompt: ceil(n / tile) tiles, nothing left for decode. */
    for (uint32_t r = 0; r < CAP; r++) {
        seq[r] = 2;
        pos[r] = 1000 + r;
    }
    uint32_t nt, nd;
    llmi_cuda_prefill_plan(pos, seq, CAP, 64, tiles, &nt, decode, &nd);
    assert_int_equal(nt, (CAP + LLMI_CU_PREFILL_TILE - 1) / LLMI_CU_PREFILL_TILE);
    assert_int_equal(nd, 0);
}

/* ---- CUDA graph shapes ---- */

static void test_graph_rows_and_max_pos(void **state) {
    (void)state;
    const uint32_t max_rows_list[] = {1, 3, 8, 16, 48, 64, 100, 4096};
    const uint32_t logit_list[] = {1, 4, 32, 64, 4096};
    for (size_t i = 0; i < sizeof max_rows_list / sizeof max_rows_list[0]; i++)
        for (size_t j = 0; j < sizeof logit_list / sizeof logit_list[0]; j++)
            for (uint32_t n = 0; n <= 130; n++) {
                uint32_t max_rows = max_rows_list[i], lr = logit_list[j], want = 0;
                if (n >= 1 && n <= LLMI_CUDA_GRAPH_MAX_ROWS && n <= max_rows) {
                    /* the smallest power of two at or above n, within max_rows */
                    uint32_t b = 1;
                    while (b < n)
                        b <<= 1;
                    want = b < max_rows ? b : max_rows;
                    if (want > lr)
                        want = 0;
                }
                assert_int_equal(llmi_cuda_graph_rows(n, max_rows, lr), want);
            }
    uint64_t s = 0x6a9;
    for (int i = 0; i < 5000; i++) {
        uint32_t p = i < 600 ? (uint32_t)i : (uint32_t)(rng_next(&s) % 2000000);
        uint32_t g = llmi_cuda_graph_max_pos(p);
        uint64_t splits = ((uint64_t)g + 1) / LLMI_CU_ATTN_SPLIT;
        assert_true(g >= p);
        assert_int_equal(((uint64_t)g + 1) % LLMI_CU_ATTN_SPLIT, 0);
        assert_int_equal(splits & (splits - 1), 0);
        /* minimal: half as many splits would not cover p */
        if (splits > 1)
            assert_true(splits / 2 * LLMI_CU_ATTN_SPLIT - 1 < p);
    }
}

/* A random step descriptor as the engine lays it out (backend/backend.h). */
typedef struct fake_step {
    llmi_step st;
    uint32_t words[4096];
} fake_step;

static void fake_step_make(uint64_t *s, uint32_t block_size, uint32_t n_blocks, fake_step *f) {
    uint32_t n_seqs = rng_range(s, 1, 20), n = n_seqs + rng_range(s, 0, 30);
    uint32_t *w = f->words, *token = w, *pos = w + n, *seq = pos + n, *block_start = seq + n;
    uint32_t *blocks = block_start + n_seqs + 1;
    uint32_t b = 0, seq_blocks[64];
    for (uint32_t q = 0; q < n_seqs; q++) {
        block_start[q] = b;
        seq_blocks[q] = rng_range(s, 1, 6);
        for (uint32_t i = 0; i < seq_blocks[q]; i++)
            blocks[b++] = (uint32_t)(rng_next(s) % n_blocks);
    }
    block_start[n_seqs] = b;
    uint32_t *logit_rows = blocks + b, n_logits = 0;
    for (uint32_t r = 0; r < n; r++) {
        seq[r] = r < n_seqs ? r : (uint32_t)(rng_next(s) % n_seqs);
        pos[r] = (uint32_t)(rng_next(s) % (seq_blocks[seq[r]] * block_size));
        token[r] = (uint32_t)(rng_next(s) % 50000);
        if (rng_next(s) % 2)
            logit_rows[n_logits++] = r;
    }
    f->st = (llmi_step){.n_rows = n,
                        .n_seqs = n_seqs,
                        .n_logits = n_logits,
                        .block_size = block_size,
                        .token = (const int32_t *)token,
                        .pos = pos,
                        .seq = seq,
                        .block_start = block_start,
                        .blocks = blocks,
                        .logit_rows = logit_rows,
                        .words = w,
                        .n_words = (size_t)(logit_rows + n_logits - w)};
}

static void test_graph_pack(void **state) {
    (void)state;
    uint64_t seed = 0x9ac4, s = seed;
    printf("seed %#llx\n", (unsigned long long)seed);
    for (int round = 0; round < 500; round++) {
        const uint32_t block_size = rng_range(&s, 1, 32), n_blocks = rng_range(&s, 1, 200);
        fake_step f;
        fake_step_make(&s, block_size, n_blocks, &f);
        const llmi_step *st = &f.st;
        const uint32_t max_rows = 64, rows = rng_range(&s, st->n_rows, max_rows);
        const uint32_t spare = n_blocks; /* past the pool: the KV store's extra block */
        llmi_cuda_graph_words lay;
        llmi_cuda_graph_layout(max_rows, 200, &lay);
        range parts[] = {{lay.token, max_rows},      {lay.pos, max_rows},
                         {lay.seq, max_rows},        {lay.block_start, max_rows + 2},
                         {lay.logit_rows, max_rows}, {lay.blocks, lay.blocks_cap}};
        qsort(parts, 6, sizeof *parts, range_cmp);
        for (int i = 0; i < 5; i++)
            assert_true(parts[i].off + parts[i].bytes <= parts[i + 1].off);
        assert_int_equal(parts[5].off + parts[5].bytes, lay.size);
        uint32_t *packed = malloc(lay.size * sizeof *packed);
        assert_non_null(packed);
        assert_true(llmi_cuda_graph_pack(st, rows, spare, &lay, packed));
        /* Read it back as a descriptor of `rows` rows and n_seqs + 1 slots. */
        const llmi_step view = {.n_rows = rows,
                                .n_seqs = st->n_seqs + 1,
                                .block_size = block_size,
                                .token = (const int32_t *)(packed + lay.token),
                                .pos = packed + lay.pos,
                                .seq = packed + lay.seq,
                                .block_start = packed + lay.block_start,
                                .blocks = packed + lay.blocks,
                                .logit_rows = packed + lay.logit_rows};
        for (uint32_t r = 0; r < rows; r++) {
            if (r < st->n_rows) {
                assert_int_equal(view.token[r], st->token[r]);
                assert_int_equal(view.pos[r], st->pos[r]);
                assert_int_equal(llmi_step_slot(&view, view.seq[r], view.pos[r]),
                                 llmi_step_slot(st, st->seq[r], st->pos[r]));
            } else {
                /* padding: a valid token, writing only the spare block */
                assert_int_equal(view.token[r], 0);
                assert_int_equal(llmi_step_slot(&view, view.seq[r], view.pos[r]) / block_size,
                                 spare);
            }
            if (r < st->n_logits)
                assert_int_equal(view.logit_rows[r], st->logit_rows[r]);
            else
                assert_true(view.logit_rows[r] < rows);
        }
        /* Too small a table capacity: refused. */
        llmi_cuda_graph_layout(max_rows, st->block_start[st->n_seqs], &lay);
        assert_false(llmi_cuda_graph_pack(st, rows, spare, &lay, packed));
        free(packed);
    }
}

/* ---- real models ---- */

static void real_model(const char *env, bool has_q4_k) {
    const char *path = getenv(env);
    FILE *fp = path ? fopen(path, "rb") : NULL;
    if (!fp) {
        printf("%s not set or missing: skipped\n", env);
        skip();
    }
    fclose(fp);
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(path, true, &m), LLM_OK);
    char why[320];
    assert_int_equal(llmi_cuda_model_check(m, all_types_ok, why, sizeof why), LLM_OK);
    if (has_q4_k)
        expect_refusal(m, no_q4_k, "of type Q4_K");
    /* Every tensor the loader counted is uploaded once. */
    assert_int_equal(check_weights_plan(m), m->weight_bytes);
    const uint32_t rows[] = {1, 8, 9, 64, 512};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (int inv = 0; inv < 2; inv++)
            check_scratch_plan(m, rows[i], 12345, inv);
    /* Decode-only contexts need no tensor-core scratch; prefill ones get
     * the dequantization chunk of the largest matrix or the cap. */
    llmi_cuda_scratch small, big;
    assert_true(llmi_cuda_scratch_plan(m, 8, 0, false, &small));
    assert_true(llmi_cuda_scratch_plan(m, 512, 0, false, &big));
    assert_false(small.gemm);
    assert_true(big.gemm && big.deq_bytes > 0 && big.deq_bytes <= LLMI_CUDA_DEQUANT_CAP);
    printf("%s: %.1f MiB of weights; scratch %.1f MiB at 8 rows, %.1f MiB at 512 rows\n",
           m->hp.arch, (double)m->weight_bytes / 1048576.0, (double)small.size / 1048576.0,
           (double)big.size / 1048576.0);
    llmi_model_free(m);
}

static void test_smollm2(void **state) {
    (void)state;
    real_model("LLM_TEST_MODEL", false);
}

static void test_gemma3(void **state) {
    (void)state;
    real_model("LLM_TEST_MODEL_GEMMA3", true);
}

/* Views of matrices one after another: the fused Q/K/V and gate/up. */
static void test_stack_rows(void **state) {
    (void)state;
    static char arena[1 << 16];
    const size_t rb = 96;
    llmi_cu_matrix q = {arena, LLMI_T_Q8_0, 12, 64, 72}, k = q, v = q;
    q.row_bytes = k.row_bytes = v.row_bytes = rb;
    k.rows = v.rows = 4;
    k.data = arena + 12 * rb;
    v.data = arena + 16 * rb;
    const llmi_cu_matrix *parts[3] = {&q, &k, &v};
    llmi_cu_matrix out;
    assert_true(llmi_cuda_stack_rows(parts, 3, &out));
    assert_ptr_equal(out.data, arena);
    assert_int_equal(out.rows, 20);
    assert_int_equal(out.cols, 64);
    assert_int_equal(out.row_bytes, rb);
    assert_int_equal(out.type, LLMI_T_Q8_0);
    assert_true(llmi_cuda_stack_rows(parts, 1, &out) && out.rows == 12);
    /* A gap (arena alignment), another type, width or pitch, a part absent. */
    v.data = arena + 16 * rb + 256;
    assert_false(llmi_cuda_stack_rows(parts, 3, &out));
    v.data = arena + 16 * rb;
    k.type = LLMI_T_Q4_0;
    assert_false(llmi_cuda_stack_rows(parts, 3, &out));
    k.type = LLMI_T_Q8_0;
    k.cols = 32;
    assert_false(llmi_cuda_stack_rows(parts, 3, &out));
    k.cols = 64;
    k.row_bytes = 2 * rb;
    assert_false(llmi_cuda_stack_rows(parts, 3, &out));
    k.row_bytes = rb;
    k.data = NULL;
    assert_false(llmi_cuda_stack_rows(parts, 3, &out));
    k.data = arena + 12 * rb;
    q.data = NULL;
    assert_false(llmi_cuda_stack_rows(parts, 3, &out));

    /* Biases: all absent is no bias; some absent, or apart, is no view. */
    llmi_cu_matrix bq = {0}, bk = {0}, bv = {0};
    const llmi_cu_matrix *bias[3] = {&bq, &bk, &bv};
    assert_true(llmi_cuda_join_vectors(bias, 3, &out));
    assert_null(out.data);
    bq = (llmi_cu_matrix){arena, LLMI_T_F32, 1, 8, 32};
    assert_false(llmi_cuda_join_vectors(bias, 3, &out));
    bk = (llmi_cu_matrix){arena + 32, LLMI_T_F32, 1, 2, 8};
    bv = (llmi_cu_matrix){arena + 40, LLMI_T_F32, 1, 2, 8};
    assert_true(llmi_cuda_join_vectors(bias, 3, &out));
    assert_ptr_equal(out.data, arena);
    assert_int_equal(out.cols, 12);
    assert_int_equal(out.rows, 1);
    assert_int_equal(out.row_bytes, 48);
    bv.data = arena + 44;
    assert_false(llmi_cuda_join_vectors(bias, 3, &out));
    bv.data = arena + 40;
    bk.type = LLMI_T_F16;
    assert_false(llmi_cuda_join_vectors(bias, 3, &out));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stack_rows),
        cmocka_unit_test(test_role_names_match_core),
        cmocka_unit_test(test_arena_add),
        cmocka_unit_test(test_weights_plan_random),
        cmocka_unit_test(test_model_check_refuses),
        cmocka_unit_test(test_chunk_rows),
        cmocka_unit_test(test_scratch_plan_random),
        cmocka_unit_test(test_gemv_choice_and_max_pos),
        cmocka_unit_test(test_gemm_in_place),
        cmocka_unit_test(test_prefill_plan),
        cmocka_unit_test(test_graph_rows_and_max_pos),
        cmocka_unit_test(test_graph_pack),
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_gemma3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
