/* Tensor parallelism on CPU ranks (backend/tp): a model split across N
 * ranks computes exactly what the CPU backend computes on the whole model.
 *   - Logits and K/V at TP 1, 2, 3, 4 and 6 (KV heads split, and
 *     replicated when there are fewer than ranks; slices of uneven width;
 *     Q8_0, Q4_1 and F32 weights; mixture-of-experts layers) are
 *     bit-identical to the CPU backend's, with 8-bit and with f32
 *     activations (test_tp_rows.c checks the kernel property this rests
 *     on).
 *   - Sessions (continuous batching, preemption, prefix cache, n samples,
 *     n-gram speculation, cancellation) give the same tokens at TP 2 and 4
 *     as on the CPU backend.
 *   - K/V reads assemble the ranks' heads as the CPU backend lays them out;
 *     writes scatter them back: a sequence state saved on one backend
 *     continues on the other, bit for bit (both ways, split and replicated
 *     KV heads).
 *   - The in-process communicator: all-reduce in rank order, all-gather,
 *     broadcast, errors naming the rank.
 *   - An interrupt raised during a step stops every rank at the same layer;
 *     a communicator error fails the step cleanly; the engine goes on.
 *   - Each allocation of a tp engine's creation failing: a clean
 *     LLM_ERR_OUT_OF_MEMORY, nothing leaked.
 *   - SmolLM2-135M (9 heads, 3 KV heads): TP 3 gives TP 1's logits bit for
 *     bit and its greedy tokens, with the default 8-bit activations; TP 2
 *     is refused naming the sizes that work.
 *   - Models that do not split are refused with a message naming why. */
#include "backend/tp/tp.h"
#include "sched_util.h"

#include <math.h>
#include <pthread.h>

enum { N_CTX = 256, PROMPT = 12 };

static llm_model *load_testmodel(const llmi_testmodel_params *p, const char *tag) {
    void *data = NULL;
    size_t size = 0;
    assert_int_equal(llmi_testmodel_to_memory(p, &data, &size), LLM_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/tp-%s.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp", tag);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
    llmi_free(data);
    llm_model *m = NULL;
    if (llmi_model_load(path, false, &m) != LLM_OK)
        fail_msg("load: %s", llmi_error_message());
    remove(path);
    return m;
}

/* 12 heads of 32 (splits in 1, 2, 3, 4, 6), FFN 384 (slices of 32 up to 12
 * ranks), Q8_0 or F32 matrices. */
static llm_model *split_model(uint32_t n_head_kv, llmi_ttype type, uint64_t seed) {
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_ctx = N_CTX;
    p.seed = seed;
    p.type = type;
    p.n_embd = 128;
    p.n_head = 12;
    p.head_dim = 32;
    p.n_head_kv = n_head_kv;
    p.n_ff = 384;
    char tag[64];
    snprintf(tag, sizeof tag, "kv%u-t%d-%llu", n_head_kv, (int)type, (unsigned long long)seed);
    return load_testmodel(&p, tag);
}

/* Skip 8-bit activations (the matmuls then multiply f32 rows). */
static bool g_f32_activations;

static llmi_engine *engine_on(const llm_model *m, const llmi_backend_ops *ops, uint32_t threads) {
    llmi_engine_config cfg = {.model = m,
                              .ops = ops,
                              .backend_cfg = {threads, 0},
                              .kv_block_size = 4,
                              .kv_blocks = 16,
                              .kv_type = LLM_KV_F32,
                              .max_rows = 16,
                              .max_ctx = N_CTX};
    llmi_engine *e = NULL;
    if (llmi_engine_create(&cfg, &e) != LLM_OK)
        fail_msg("engine: %s", llmi_error_message());
    llmi_engine_set_f32_activations(e, g_f32_activations);
    return e;
}

/* Runs a prompt with logits for every row; seq keeps its K/V. */
static void run_prompt(llmi_engine *e, llmi_kv_seq *seq, const llm_token *prompt, float *logits) {
    assert_int_equal(llmi_kv_seq_reserve(e->kv, seq, PROMPT), LLM_OK);
    for (uint32_t i = 0; i < PROMPT; i++)
        e->rows[i] = (llmi_batch_row){prompt[i], i, seq, true};
    if (llmi_engine_run(e, e->rows, PROMPT, logits) != LLM_OK)
        fail_msg("run: %s", llmi_error_message());
}

/* The logits and every layer's K and V at TP n against the CPU backend's:
 * the same bits. */
static void compare_logits(const llm_model *m, uint32_t n) {
    const uint32_t V = m->hp.n_vocab, n_layer = m->hp.n_layer;
    const size_t n_logits = (size_t)PROMPT * V,
                 kv_n = (size_t)PROMPT * m->hp.n_head_kv * m->hp.head_dim,
                 kv_all = 2 * kv_n * n_layer;
    float *ref = llmi_malloc(n_logits * sizeof *ref), *got = llmi_malloc(n_logits * sizeof *got);
    float *kref = llmi_malloc(kv_all * sizeof *kref), *kgot = llmi_malloc(kv_all * sizeof *kgot);
    assert_true(ref && got && kref && kgot);
    memset(got, 0xff, n_logits * sizeof *got); /* NaN: nothing written passes */
    llm_token prompt[PROMPT];
    uint64_t rng = 5 + n;
    random_prompt(prompt, PROMPT, V, &rng);

    llmi_engine *cpu = engine_on(m, &llmi_backend_cpu, 2);
    llmi_kv_seq s0 = {0};
    run_prompt(cpu, &s0, prompt, ref);
    for (uint32_t l = 0; l < n_layer; l++)
        for (int v = 0; v < 2; v++)
            assert_int_equal(
                llmi_engine_kv_read(cpu, &s0, l, v, 0, PROMPT, kref + (2 * l + v) * kv_n), LLM_OK);
    llmi_kv_seq_destroy(cpu->kv, &s0);
    llmi_engine_free(cpu);

    llmi_engine *tp = engine_on(m, llmi_backend_tp(n), 2);
    llmi_kv_seq s1 = {0};
    run_prompt(tp, &s1, prompt, got);
    for (uint32_t l = 0; l < n_layer; l++)
        for (int v = 0; v < 2; v++)
            assert_int_equal(
                llmi_engine_kv_read(tp, &s1, l, v, 0, PROMPT, kgot + (2 * l + v) * kv_n), LLM_OK);

    size_t first = 0;
    while (first < n_logits && memcmp(&ref[first], &got[first], sizeof *ref) == 0)
        first++;
    printf("# TP %u, %u KV heads, %s weights, %s activations: %s\n", n, m->hp.n_head_kv,
           llmi_ttype_get(m->layers[0].w[LLMI_ROLE_Q].type)->name,
           g_f32_activations ? "f32" : "8-bit",
           first == n_logits ? "logits and K/V bit-identical to the CPU backend" : "DIFFERENT");
    if (first < n_logits)
        fail_msg("TP %u: logit %zu is %.9g, CPU backend %.9g", n, first, (double)got[first],
                 (double)ref[first]);
    assert_memory_equal(kref, kgot, kv_all * sizeof *kref);

    /* Writes scatter to every rank holding a head (replicas too): what is
     * written reads back, and the next step attends to it on every rank. */
    const uint32_t L = n_layer - 1;
    for (size_t i = 0; i < kv_n; i++)
        kgot[i] = (float)(i % 97) * 0.01f - 0.3f;
    assert_int_equal(llmi_engine_kv_write(tp, &s1, L, false, 0, PROMPT, kgot), LLM_OK);
    assert_int_equal(llmi_engine_kv_read(tp, &s1, L, false, 0, PROMPT, kgot + kv_n), LLM_OK);
    assert_memory_equal(kgot, kgot + kv_n, kv_n * sizeof *kgot);
    llmi_kv_seq_destroy(tp->kv, &s1);
    llmi_engine_free(tp);
    llmi_free(ref);
    llmi_free(got);
    llmi_free(kref);
    llmi_free(kgot);
}

/* compare_logits with 8-bit activations, then with f32 ones. */
static void compare_both(const llm_model *m, uint32_t n) {
    g_f32_activations = false;
    compare_logits(m, n);
    g_f32_activations = true;
    compare_logits(m, n);
    g_f32_activations = false;
}

static void test_logits_kv_heads_split(void **state) {
    (void)state;
    llm_model *m = split_model(6, LLMI_T_Q8_0, 1);
    for (uint32_t n = 1; n <= 3; n++)
        compare_both(m, n);
    compare_both(m, 6);
    llmi_model_free(m);
    m = split_model(6, LLMI_T_Q4_1, 1);
    for (uint32_t n = 1; n <= 3; n++)
        compare_both(m, n);
    llmi_model_free(m);
    m = split_model(12, LLMI_T_F32, 2);
    for (uint32_t n = 1; n <= 4; n++)
        compare_both(m, n);
    llmi_model_free(m);
}

/* Two KV heads: split at TP 2, replicated at TP 4 (each pair of ranks holds
 * a copy of its group's head); one KV head replicated at TP 3. */
static void test_logits_kv_heads_replicated(void **state) {
    (void)state;
    llm_model *m = split_model(2, LLMI_T_Q8_0, 3);
    compare_both(m, 2);
    compare_both(m, 4);
    llmi_model_free(m);
    m = split_model(1, LLMI_T_Q8_0, 4);
    compare_both(m, 3);
    llmi_model_free(m);
}

/* Slices of uneven width: n_embd 64 and n_ff 96 at TP 3 (21/21/22 and
 * 32-wide), at TP 4 (16 and 24: FFN slices off Q8_0's 32-blocks, which the
 * exact split does not need). */
static void test_logits_uneven_slices(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_ctx = N_CTX;
    p.seed = 21;
    p.type = LLMI_T_Q8_0;
    p.n_head = 12;
    p.head_dim = 16;
    p.n_head_kv = 12;
    p.n_ff = 96;
    llm_model *m = load_testmodel(&p, "uneven");
    compare_both(m, 3);
    compare_both(m, 4);
    llmi_model_free(m);
}

/* Routed FFNs run whole on every rank: still the CPU backend's bits, with
 * and without a shared expert. */
static void test_logits_experts(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_ctx = N_CTX;
    p.seed = 22;
    p.type = LLMI_T_Q8_0;
    p.n_expert = 4;
    p.n_expert_used = 2;
    llm_model *m = load_testmodel(&p, "moe");
    compare_both(m, 2);
    compare_both(m, 4);
    llmi_model_free(m);
    p.arch = "qwen2moe"; /* Q/K/V biases, and a shared expert of its own width */
    p.qkv_bias = true;
    p.n_ff_exp = 32;
    p.n_ff_shexp = 96;
    p.seed = 23;
    m = load_testmodel(&p, "moe-shexp");
    compare_both(m, 2);
    llmi_model_free(m);
}

/* ---- sessions ---- */

typedef struct workload_result {
    outcome out[8][2]; /* [request][sample] */
} workload_result;

/* A workload: 6 requests (greedy, seeded sampling, 2 samples, n-gram
 * speculation), one cancelled mid-way, in a KV cache small enough to
 * preempt, with the prefix cache (shared prompt heads). */
static void run_workload(const llm_model *m, const llmi_backend_ops *ops, workload_result *res) {
    memset(res, 0, sizeof *res);
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = N_CTX;
    p.max_batch_tokens = 16;
    p.kv_block_size = 4;
    p.prefix_cache = true;
    p.kv_cache_bytes = 24 * llmi_kv_block_bytes(m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim, 4);
    llmi_session_device dev = {ops, 0};
    llm_session *s = NULL;
    if (llmi_session_create_on(m, &p, &dev, &s) != LLM_OK)
        fail_msg("session: %s", llmi_error_message());
    enum { N_REQ = 6 };
    llm_request_id ids[N_REQ];
    uint64_t rng = 99;
    llm_token head[8], prompt[N_REQ][16];
    random_prompt(head, 8, m->hp.n_vocab, &rng);
    for (uint32_t r = 0; r < N_REQ; r++) {
        memcpy(prompt[r], head, sizeof head);
        random_prompt(prompt[r] + 8, 8, m->hp.n_vocab, &rng);
        llm_request_params q;
        llm_request_params_init(&q);
        q.max_new_tokens = 24 + 4 * r;
        q.ignore_eos = true;
        llm_sampling_params sp;
        llm_sampling_params_init(&sp);
        sp.temperature = 0.8f;
        sp.seed = 1000 + r;
        if (r % 2)
            q.sampling = &sp; /* copied at submit */
        if (r == 2)
            q.n_samples = 2;
        if (r == 3 || r == 4) {
            q.spec_mode = LLM_SPEC_NGRAM;
            q.spec_k = 3;
        }
        if (llmi_session_submit(s, prompt[r], 16, &q, &ids[r]) != LLM_OK)
            fail_msg("submit: %s", llmi_error_message());
    }
    for (int step = 0; step < 2000; step++) {
        llm_event ev[64];
        size_t n = 0;
        if (llmi_session_step(s, ev, 64, sizeof ev[0], &n) != LLM_OK)
            fail_msg("step: %s", llmi_error_message());
        for (size_t i = 0; i < n; i++) {
            uint32_t r = 0;
            while (r < N_REQ && ids[r] != ev[i].request)
                r++;
            assert_true(r < N_REQ && ev[i].sample_index < 2);
            outcome *o = &res->out[r][ev[i].sample_index];
            if (ev[i].token != LLM_TOKEN_NONE && o->n < MAX_OUT)
                o->toks[o->n++] = ev[i].token;
            if (ev[i].finish_reason != LLM_FINISH_NONE)
                o->finish = ev[i].finish_reason;
        }
        if (step == 6)
            assert_int_equal(llmi_session_cancel(s, ids[5]), LLM_OK);
        check_invariants(s);
        llm_session_stats st = {sizeof st};
        llmi_session_stats(s, &st);
        if (n == 0 && st.n_running == 0 && st.n_waiting == 0)
            break;
    }
    llmi_session_free(s);
}

static void expect_same_tokens(const workload_result *a, const workload_result *b, uint32_t n) {
    for (uint32_t r = 0; r < 6; r++)
        for (uint32_t k = 0; k < 2; k++) {
            const outcome *x = &a->out[r][k], *y = &b->out[r][k];
            assert_int_equal(x->finish, y->finish);
            assert_int_equal(x->n, y->n);
            for (uint32_t i = 0; i < x->n; i++)
                if (x->toks[i] != y->toks[i])
                    fail_msg("TP %u: request %u sample %u token %u: %d, CPU %d", n, r, k, i,
                             y->toks[i], x->toks[i]);
        }
}

static void test_session_workload(void **state) {
    (void)state;
    llm_model *m = split_model(2, LLMI_T_Q8_0, 7);
    workload_result *ref = llmi_calloc(1, sizeof *ref), *got = llmi_calloc(1, sizeof *got);
    assert_true(ref && got);
    run_workload(m, &llmi_backend_cpu, ref);
    assert_true(ref->out[0][0].n == 24 && ref->out[2][1].n == 32);
    for (uint32_t n = 2; n <= 4; n += 2) {
        run_workload(m, llmi_backend_tp(n), got);
        expect_same_tokens(ref, got, n);
    }
    llmi_free(ref);
    llmi_free(got);
    llmi_model_free(m);
}

/* ---- state ---- */

static llm_session *plain_session(const llm_model *m, const llmi_backend_ops *ops) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = N_CTX;
    llmi_session_device dev = {ops, 0};
    llm_session *s = NULL;
    if (llmi_session_create_on(m, &p, &dev, &s) != LLM_OK)
        fail_msg("session: %s", llmi_error_message());
    return s;
}

/* Decodes tokens[0, n) into seq (positions from `pos`); the last row's
 * logits into out. */
static void decode(llm_session *s, llm_seq_id seq, uint32_t pos, const llm_token *tokens,
                   uint32_t n, float *out, uint32_t n_vocab) {
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(n, &b), LLM_OK);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(llm_batch_add(b, seq, pos + i, tokens[i], i == n - 1), LLM_OK);
    if (llm_session_decode(s, b) != LLM_OK)
        fail_msg("decode: %s", llm_last_error());
    const float *l = NULL;
    assert_int_equal(llm_session_logits(s, n - 1, &l), LLM_OK);
    memcpy(out, l, n_vocab * sizeof *out);
    llm_batch_free(b);
}

/* A sequence state saved at TP n loads on the CPU backend and the other
 * way round; both continue like the sequence that never left. */
static void state_across(const llm_model *m, uint32_t n) {
    const uint32_t V = m->hp.n_vocab;
    llm_token t[PROMPT + 1];
    uint64_t rng = 41 + n;
    random_prompt(t, PROMPT + 1, V, &rng);
    float *ref = llmi_malloc(V * sizeof *ref), *got = llmi_malloc(V * sizeof *got);
    assert_true(ref && got);
    const llmi_backend_ops *ops[2] = {&llmi_backend_cpu, llmi_backend_tp(n)};
    for (int dir = 0; dir < 2; dir++) {
        llm_session *from = plain_session(m, ops[dir]), *to = plain_session(m, ops[1 - dir]);
        llm_seq_id a, b;
        assert_int_equal(llm_seq_open(from, &a), LLM_OK);
        decode(from, a, 0, t, PROMPT, ref, V);
        size_t size = 0;
        assert_int_equal(llm_seq_state_save(from, a, NULL, 0, &size), LLM_ERR_BUFFER_TOO_SMALL);
        void *buf = llmi_malloc(size);
        assert_non_null(buf);
        assert_int_equal(llm_seq_state_save(from, a, buf, size, &size), LLM_OK);
        if (llm_seq_state_load(to, buf, size, &b) != LLM_OK)
            fail_msg("load: %s", llm_last_error());
        decode(from, a, PROMPT, t + PROMPT, 1, ref, V);
        decode(to, b, PROMPT, t + PROMPT, 1, got, V);
        printf("# state saved on %s, loaded on %s (TP %u): the same logits\n", dir ? "tp" : "cpu",
               dir ? "cpu" : "tp", n);
        assert_memory_equal(ref, got, V * sizeof *ref);
        llmi_free(buf);
        llmi_session_free(from);
        llmi_session_free(to);
    }
    llmi_free(ref);
    llmi_free(got);
}

static void test_state_across_backends(void **state) {
    (void)state;
    llm_model *m = split_model(2, LLMI_T_Q8_0, 11);
    state_across(m, 2);
    state_across(m, 4); /* replicated KV heads */
    llmi_model_free(m);
}

/* Every allocation of a tp engine's creation failing in turn: a clean
 * LLM_ERR_OUT_OF_MEMORY, nothing leaked (ASan), then success. */
static void test_out_of_memory(void **state) {
    (void)state;
    llm_model *m = split_model(2, LLMI_T_Q8_0, 12);
    llmi_engine_config cfg = {.model = m,
                              .ops = llmi_backend_tp(4),
                              .backend_cfg = {2, 0},
                              .kv_block_size = 4,
                              .kv_blocks = 8,
                              .kv_type = LLM_KV_F32,
                              .max_rows = 8,
                              .max_ctx = 64};
    uint64_t k = 1;
    for (; k < 10000; k++) {
        llmi_engine *e = NULL;
        llmi_alloc_fail_after(k);
        llm_status st = llmi_engine_create(&cfg, &e);
        bool fired = alloc_disarm(k) == 0;
        if (st == LLM_OK) {
            assert_false(fired);
            llmi_engine_free(e);
            break;
        }
        assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
        assert_null(e);
    }
    printf("# engine creation at TP 4 survives each of its %llu allocations failing\n",
           (unsigned long long)(k - 1));
    assert_true(k > 10 && k < 10000);
    llmi_model_free(m);
}

/* ---- the communicator ---- */

enum { COMM_RANKS = 3, COMM_N = 1000 };

typedef struct comm_job {
    llmi_tp_comm *comm;
    uint32_t rank;
    float x[COMM_N], gathered[COMM_RANKS][COMM_N];
    int32_t bcast;
    uint32_t rounds_ok; /* back-to-back gathers and broadcasts that read right */
    llm_status st[4];
    char error[256];
} comm_job;

static void *comm_rank(void *arg) {
    comm_job *j = arg;
    const llmi_tp_comm_ops *ops = j->comm->ops;
    void *ctx = j->comm->ctx;
    j->st[0] = ops->all_gather(ctx, j->rank, j->x, sizeof j->x, j->gathered);
    j->st[1] = ops->all_reduce(ctx, j->rank, j->x, COMM_N);
    j->bcast = (int32_t)(100 + j->rank);
    j->st[2] = ops->broadcast(ctx, j->rank, 1, &j->bcast, sizeof j->bcast);
    j->st[3] = ops->all_reduce(ctx, j->rank, j->x, COMM_N + 1); /* over its size */
    llmi_error_copy_to(j->error, sizeof j->error);
    /* Back to back, no other barrier between: the staging slots of one
     * collective must not be overwritten while a slow rank still reads. */
    for (uint32_t k = 0; k < 500; k++) {
        uint32_t mine = j->rank * 100000 + k, all[COMM_RANKS];
        int32_t b = (int32_t)(mine + 7);
        if (ops->all_gather(ctx, j->rank, &mine, sizeof mine, all) != LLM_OK ||
            ops->broadcast(ctx, j->rank, k % COMM_RANKS, &b, sizeof b) != LLM_OK)
            return NULL;
        bool ok = b == (int32_t)((k % COMM_RANKS) * 100000 + k + 7);
        for (uint32_t r = 0; r < COMM_RANKS; r++)
            ok &= all[r] == r * 100000 + k;
        j->rounds_ok += ok;
    }
    return NULL;
}

/* Three rank threads: all-gather, all-reduce (added in rank order: the
 * bits of a serial sum in that order), broadcast from rank 1, and an
 * all-reduce over the communicator's size refused on every rank, naming
 * it. */
static void test_comm_local(void **state) {
    (void)state;
    llmi_tp_comm comm;
    assert_int_equal(llmi_tp_comm_local(COMM_RANKS, COMM_N, sizeof(float) * COMM_N, &comm), LLM_OK);
    comm_job *jobs = llmi_calloc(COMM_RANKS, sizeof *jobs);
    float *expect = llmi_malloc(COMM_N * sizeof *expect);
    assert_true(jobs && expect);
    uint64_t rng = 77;
    for (uint32_t r = 0; r < COMM_RANKS; r++) {
        jobs[r].comm = &comm;
        jobs[r].rank = r;
        for (uint32_t i = 0; i < COMM_N; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            jobs[r].x[i] = ((float)(rng >> 40) / (float)(1 << 24) - 0.5f) * 1e3f;
        }
    }
    for (uint32_t i = 0; i < COMM_N; i++)
        expect[i] = (jobs[0].x[i] + jobs[1].x[i]) + jobs[2].x[i];
    comm_job inputs[COMM_RANKS];
    memcpy(inputs, jobs, sizeof inputs);
    pthread_t t[COMM_RANKS];
    for (uint32_t r = 0; r < COMM_RANKS; r++)
        assert_int_equal(pthread_create(&t[r], NULL, comm_rank, &jobs[r]), 0);
    for (uint32_t r = 0; r < COMM_RANKS; r++)
        assert_int_equal(pthread_join(t[r], NULL), 0);
    for (uint32_t r = 0; r < COMM_RANKS; r++) {
        for (int k = 0; k < 3; k++)
            assert_int_equal(jobs[r].st[k], LLM_OK);
        for (uint32_t q = 0; q < COMM_RANKS; q++)
            assert_memory_equal(jobs[r].gathered[q], inputs[q].x, sizeof inputs[q].x);
        assert_memory_equal(jobs[r].x, expect, COMM_N * sizeof *expect);
        assert_int_equal(jobs[r].bcast, 101);
        assert_int_equal(jobs[r].rounds_ok, 500);
        assert_int_equal(jobs[r].st[3], LLM_ERR_LIMIT);
        char want[32];
        snprintf(want, sizeof want, "rank %u:", r);
        if (!strstr(jobs[r].error, want))
            fail_msg("'%s' does not name %s", jobs[r].error, want);
    }
    printf("# %s\n", jobs[2].error);
    comm.ops->free(comm.ctx);
    llmi_free(jobs);
    llmi_free(expect);
}

/* ---- interrupts and communicator errors within a step ---- */

/* Wraps a step's communicator: on the broadcast that opens layer
 * `interrupt_layer` (rank_layer_begin's), rank 0 raises the interrupt flag
 * once that broadcast is done, so the decision falls before the next
 * layer; every all-gather from number `fail_gather` on fails on every
 * rank. */
typedef struct wrap_comm {
    llmi_tp_comm inner;
    atomic_int *flag;
    int interrupt_layer;
    int fail_gather;
    atomic_int broadcasts[LLMI_TP_MAX], gathers[LLMI_TP_MAX];
} wrap_comm;

static llm_status wrap_barrier(void *ctx, uint32_t rank) {
    wrap_comm *w = ctx;
    return w->inner.ops->barrier(w->inner.ctx, rank);
}

static llm_status wrap_all_reduce(void *ctx, uint32_t rank, float *x, size_t n) {
    wrap_comm *w = ctx;
    return w->inner.ops->all_reduce(w->inner.ctx, rank, x, n);
}

static llm_status wrap_all_gather(void *ctx, uint32_t rank, const void *x, size_t bytes,
                                  void *out) {
    wrap_comm *w = ctx;
    const int k = atomic_fetch_add(&w->gathers[rank], 1);
    if (w->fail_gather >= 0 && k >= w->fail_gather)
        return llmi_error(LLM_ERR_BACKEND, "test communicator, rank %u: link down", rank);
    return w->inner.ops->all_gather(w->inner.ctx, rank, x, bytes, out);
}

static llm_status wrap_broadcast(void *ctx, uint32_t rank, uint32_t root, void *x, size_t bytes) {
    wrap_comm *w = ctx;
    const int k = atomic_fetch_add(&w->broadcasts[rank], 1);
    llm_status st = w->inner.ops->broadcast(w->inner.ctx, rank, root, x, bytes);
    if (rank == 0 && k == w->interrupt_layer)
        atomic_store(w->flag, 1);
    return st;
}

static const llmi_tp_comm_ops wrap_ops = {.barrier = wrap_barrier,
                                          .all_reduce = wrap_all_reduce,
                                          .all_gather = wrap_all_gather,
                                          .broadcast = wrap_broadcast,
                                          .free = NULL};

/* A tp engine whose step's communicator is wrapped by w (restored by
 * unwrap before the engine is freed). */
static llmi_engine *wrapped_engine(const llm_model *m, uint32_t n, atomic_int *flag, wrap_comm *w) {
    llmi_engine_config cfg = {.model = m,
                              .ops = llmi_backend_tp(n),
                              .backend_cfg = {2, 0},
                              .kv_block_size = 4,
                              .kv_blocks = 16,
                              .kv_type = LLM_KV_F32,
                              .max_rows = 16,
                              .max_ctx = N_CTX,
                              .interrupt = flag};
    llmi_engine *e = NULL;
    if (llmi_engine_create(&cfg, &e) != LLM_OK)
        fail_msg("engine: %s", llmi_error_message());
    llmi_tp_comm *c = llmi_tp_step_comm(e->step);
    w->inner = *c;
    w->flag = flag;
    *c = (llmi_tp_comm){&wrap_ops, w, c->n_ranks};
    return e;
}

static void unwrap(llmi_engine *e, wrap_comm *w) { *llmi_tp_step_comm(e->step) = w->inner; }

/* The interrupt raised while layer 1 runs: every rank stops before layer
 * 2 (each opened exactly 3 layers: the same count on every rank, or one
 * would still be waiting at a gather); layers 0-1 of the prompt hold K/V,
 * layer 2 none. The engine then runs the prompt again to the CPU
 * backend's bits. */
static void test_interrupt_between_layers(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_ctx = N_CTX;
    p.seed = 31;
    p.type = LLMI_T_Q8_0;
    p.n_layer = 4;
    llm_model *m = load_testmodel(&p, "interrupt");
    const uint32_t V = m->hp.n_vocab, n = 2;
    const size_t kv_n = (size_t)PROMPT * m->hp.n_head_kv * m->hp.head_dim;
    float *ref = llmi_malloc((size_t)PROMPT * V * sizeof *ref),
          *got = llmi_malloc((size_t)PROMPT * V * sizeof *got), *k = llmi_malloc(kv_n * sizeof *k);
    assert_true(ref && got && k);
    llm_token prompt[PROMPT];
    uint64_t rng = 8;
    random_prompt(prompt, PROMPT, V, &rng);
    llmi_engine *cpu = engine_on(m, &llmi_backend_cpu, 2);
    llmi_kv_seq s0 = {0};
    run_prompt(cpu, &s0, prompt, ref);
    llmi_kv_seq_destroy(cpu->kv, &s0);
    llmi_engine_free(cpu);

    atomic_int flag = 0;
    wrap_comm w = {.interrupt_layer = 1, .fail_gather = -1};
    llmi_engine *e = wrapped_engine(m, n, &flag, &w);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(e->kv, &seq, PROMPT), LLM_OK);
    const float poison = -12345.0f;
    for (size_t i = 0; i < kv_n; i++)
        k[i] = poison;
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        assert_int_equal(llmi_engine_kv_write(e, &seq, l, false, 0, PROMPT, k), LLM_OK);
    for (uint32_t i = 0; i < PROMPT; i++)
        e->rows[i] = (llmi_batch_row){prompt[i], i, &seq, true};
    assert_int_equal(llmi_engine_run(e, e->rows, PROMPT, got), LLM_ERR_CANCELLED);
    printf("# %s\n", llmi_error_message());
    assert_non_null(strstr(llmi_error_message(), "at layer 2"));
    for (uint32_t r = 0; r < n; r++)
        assert_int_equal(atomic_load(&w.broadcasts[r]), 3);
    assert_int_equal(seq.n_tokens, 0); /* a failed step moves no length */
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        assert_int_equal(llmi_engine_kv_read(e, &seq, l, false, 0, PROMPT, k), LLM_OK);
        bool written = k[0] != poison && k[kv_n - 1] != poison;
        bool untouched = k[0] == poison && k[kv_n - 1] == poison;
        assert_true(l < 2 ? written : untouched);
    }
    atomic_store(&flag, 0);
    w.interrupt_layer = -1;
    assert_int_equal(llmi_engine_run(e, e->rows, PROMPT, got), LLM_OK);
    assert_memory_equal(ref, got, (size_t)PROMPT * V * sizeof *ref);
    printf("# interrupted at TP %u before layer 2 on every rank; the rerun is the CPU "
           "backend's bits\n",
           n);
    llmi_kv_seq_destroy(e->kv, &seq);
    unwrap(e, &w);
    llmi_engine_free(e);

    /* A communicator that fails from the 3rd all-gather on (layer 1):
     * the step fails with its message, nothing moves, and once the link is
     * back the engine computes the CPU backend's logits. */
    wrap_comm f = {.interrupt_layer = -1, .fail_gather = 2};
    e = wrapped_engine(m, 4, &flag, &f);
    llmi_kv_seq s2 = {0};
    assert_int_equal(llmi_kv_seq_reserve(e->kv, &s2, PROMPT), LLM_OK);
    for (uint32_t i = 0; i < PROMPT; i++)
        e->rows[i] = (llmi_batch_row){prompt[i], i, &s2, true};
    assert_int_equal(llmi_engine_run(e, e->rows, PROMPT, got), LLM_ERR_BACKEND);
    printf("# %s\n", llmi_error_message());
    assert_non_null(strstr(llmi_error_message(), "rank 0: link down"));
    assert_int_equal(s2.n_tokens, 0);
    f.fail_gather = -1;
    assert_int_equal(llmi_engine_run(e, e->rows, PROMPT, got), LLM_OK);
    assert_memory_equal(ref, got, (size_t)PROMPT * V * sizeof *ref);
    llmi_kv_seq_destroy(e->kv, &s2);
    unwrap(e, &f);
    llmi_engine_free(e);
    llmi_free(ref);
    llmi_free(got);
    llmi_free(k);
    llmi_model_free(m);
}

/* ---- refusals ---- */

static void expect_refused(const llm_model *m, uint32_t n, const char *text) {
    llmi_engine_config cfg = {.model = m,
                              .ops = llmi_backend_tp(n),
                              .backend_cfg = {2, 0},
                              .kv_block_size = 4,
                              .kv_blocks = 8,
                              .kv_type = LLM_KV_F32,
                              .max_rows = 8,
                              .max_ctx = 64};
    llmi_engine *e = NULL;
    assert_int_equal(llmi_engine_create(&cfg, &e), LLM_ERR_UNSUPPORTED);
    assert_null(e);
    printf("# %s\n", llmi_error_message());
    if (!strstr(llmi_error_message(), text))
        fail_msg("'%s' does not say '%s'", llmi_error_message(), text);
}

static void test_refusals(void **state) {
    (void)state;
    assert_null(llmi_backend_tp(0));
    assert_null(llmi_backend_tp(LLMI_TP_MAX + 1));
    llm_model *m = split_model(2, LLMI_T_Q8_0, 3);
    expect_refused(m, 3, "2 KV heads neither split in 3 nor replicate to 3");
    expect_refused(m, 3, "sizes that work: 1, 2, 4, 6");
    expect_refused(m, 5, "12 attention heads do not split in 5");
    llmi_model_free(m);
}

/* ---- SmolLM2 ---- */

static void greedy(const llm_model *m, const llmi_backend_ops *ops, const llm_token *prompt,
                   uint32_t n_prompt, uint32_t n_new, llm_token *out) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = 256;
    llmi_session_device dev = {ops, 0};
    llm_session *s = NULL;
    if (llmi_session_create_on(m, &p, &dev, &s) != LLM_OK)
        fail_msg("session: %s", llmi_error_message());
    llmi_engine_set_f32_activations(s->eng, g_f32_activations);
    llm_request_params q;
    llm_request_params_init(&q);
    q.max_new_tokens = n_new;
    q.ignore_eos = true;
    llm_request_id id;
    assert_int_equal(llmi_session_submit(s, prompt, n_prompt, &q, &id), LLM_OK);
    uint32_t got = 0;
    for (int step = 0; step < 1000 && got < n_new; step++) {
        llm_event ev[16];
        size_t n = 0;
        if (llmi_session_step(s, ev, 16, sizeof ev[0], &n) != LLM_OK)
            fail_msg("step: %s", llmi_error_message());
        for (size_t i = 0; i < n; i++)
            if (ev[i].token != LLM_TOKEN_NONE)
                out[got++] = ev[i].token;
    }
    assert_int_equal(got, n_new);
    llmi_session_free(s);
}

static void test_smollm2(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path)
        skip();
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(path, true, &m), LLM_OK);
    if (m->hp.n_head != 9 || m->hp.n_head_kv != 3) {
        llmi_model_free(m);
        skip();
    }
    expect_refused(m, 2, "9 attention heads do not split in 2 (sizes that work: 1, 3)");
    compare_both(m, 3); /* the default 8-bit activations first */
    enum { N_NEW = 32 };
    const char *text = "The capital of France is";
    llm_token prompt[32];
    size_t n_prompt = 0;
    assert_int_equal(
        llm_tokenize(m, text, strlen(text), LLM_TOKENIZE_ADD_SPECIAL, prompt, 32, &n_prompt),
        LLM_OK);
    assert_true(n_prompt > 0);
    llm_token ref[N_NEW], got[N_NEW];
    greedy(m, &llmi_backend_cpu, prompt, (uint32_t)n_prompt, N_NEW, ref);
    greedy(m, llmi_backend_tp(3), prompt, (uint32_t)n_prompt, N_NEW, got);
    for (uint32_t i = 0; i < N_NEW; i++)
        if (ref[i] != got[i])
            fail_msg("token %u: TP 3 %d, TP 1 %d", i, got[i], ref[i]);
    printf("# SmolLM2 TP 3, 8-bit activations: %u greedy tokens identical to TP 1\n", N_NEW);
    llmi_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_kv_heads_split),
        cmocka_unit_test(test_logits_kv_heads_replicated),
        cmocka_unit_test(test_logits_uneven_slices),
        cmocka_unit_test(test_logits_experts),
        cmocka_unit_test(test_comm_local),
        cmocka_unit_test(test_interrupt_between_layers),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_session_workload),
        cmocka_unit_test(test_state_across_backends),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
