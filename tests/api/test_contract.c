/* Black-box tests of what llm.h promises for the engine (the contract a
 * downstream test suite checks), through llm.h and the shared library on
 * the real SmolLM2 model: one test per promise. */
#include <llm.h>

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static llm_model *g_model;
static uint32_t g_vocab;

static llm_session *session(uint32_t n_ctx) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    p.kv_cache_bytes = 64u << 20;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(g_model, &p, &s), LLM_OK);
    return s;
}

static size_t tokenize(const char *text, llm_token *out, size_t cap) {
    size_t n = 0;
    assert_int_equal(llm_tokenize(g_model, text, strlen(text), 0, out, cap, &n), LLM_OK);
    return n;
}

static void expect_error(llm_status got, llm_status want, const char *substr) {
    if (got != want || !strstr(llm_last_error(), substr))
        fail_msg("got %s \"%s\", want %s with \"%s\"", llm_status_name(got), llm_last_error(),
                 llm_status_name(want), substr);
}

/* Steps until the session is idle; returns the number of events. */
static size_t drain(llm_session *s) {
    llm_event ev[16];
    size_t total = 0, got = 0;
    for (int guard = 0; guard < 10000; guard++) {
        assert_int_equal(llm_session_step(s, ev, 16, sizeof ev[0], &got), LLM_OK);
        total += got;
        llm_session_stats st = {sizeof st};
        assert_int_equal(llm_session_get_stats(s, &st), LLM_OK);
        if (got == 0 && st.n_running + st.n_waiting == 0) return total;
    }
    fail_msg("the session never became idle");
    return total;
}

/* ---- llm_session_logits: a decode's logits outlive steps and generate ---- */

static void expect_same_logits(llm_session *s, const float *want, const char *after) {
    const float *lg = NULL;
    llm_status st = llm_session_logits(s, 0, &lg);
    if (st != LLM_OK)
        fail_msg("after %s: llm_session_logits gives %s (%s)", after, llm_status_name(st),
                 llm_last_error());
    uint32_t diff = 0;
    for (uint32_t i = 0; i < g_vocab; i++) diff += memcmp(&lg[i], &want[i], sizeof *lg) != 0;
    if (diff)
        fail_msg("after %s: row 0 gives other logits (%u of %u floats differ, [0] %.8g vs %.8g)",
                 after, diff, g_vocab, lg[0], want[0]);
}

static void test_logits_outlive_step_and_generate(void **state) {
    (void)state;
    llm_session *s = session(512);
    llm_token prompt[64];
    size_t n = tokenize("The capital of France is", prompt, 64);
    llm_seq_id seq;
    assert_int_equal(llm_seq_open(s, &seq), LLM_OK);
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(64, &b), LLM_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(llm_batch_add(b, seq, (uint32_t)i, prompt[i], i == 0), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    const float *lg = NULL;
    assert_int_equal(llm_session_logits(s, 0, &lg), LLM_OK);
    float *want = malloc(g_vocab * sizeof *want);
    assert_non_null(want);
    memcpy(want, lg, g_vocab * sizeof *want);

    /* A request computed by llm_session_step. */
    llm_token other[64];
    size_t n_other = tokenize("Once upon a time there was a dragon who", other, 64);
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 3;
    llm_request_id id;
    assert_int_equal(llm_session_submit(s, other, n_other, &rp, &id), LLM_OK);
    llm_event ev[4];
    size_t got = 0;
    assert_int_equal(llm_session_step(s, ev, 4, sizeof ev[0], &got), LLM_OK);
    expect_same_logits(s, want, "llm_session_step");
    assert_true(drain(s) > 0);
    expect_same_logits(s, want, "draining the request");

    /* llm_generate with n-gram speculation (logits on several rows). */
    llm_token rep[128];
    size_t n_rep = tokenize("one two three four one two three four one two three four one two",
                            rep, 128);
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 16;
    gp.spec_mode = LLM_SPEC_NGRAM;
    gp.spec_k = 4;
    llm_generate_result res = {sizeof res};
    assert_int_equal(llm_generate(s, rep, n_rep, &gp, &res), LLM_OK);
    assert_true(res.n_spec_steps > 0);
    expect_same_logits(s, want, "llm_generate with LLM_SPEC_NGRAM");

    /* The next decode replaces them; a failed one leaves none. */
    llm_batch_clear(b);
    assert_int_equal(llm_batch_add(b, seq, (uint32_t)n, prompt[0], false), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    expect_error(llm_session_logits(s, 0, &lg), LLM_ERR_INVALID_ARGUMENT, "did not ask");
    assert_null(lg);
    llm_batch_clear(b);
    assert_int_equal(llm_batch_add(b, seq, 0, prompt[0], true), LLM_OK); /* wrong position */
    assert_int_equal(llm_session_decode(s, b), LLM_ERR_INVALID_ARGUMENT);
    expect_error(llm_session_logits(s, 0, &lg), LLM_ERR_INVALID_ARGUMENT, "not in the last");
    free(want);
    llm_batch_free(b);
    llm_session_free(s);
}

/* ---- logprob and top_logprobs come from one log-softmax ---- */

static void test_logprob_equals_top_entry(void **state) {
    (void)state;
    llm_session *s = session(1024);
    static const char *prompts[] = {
        "The history of the Roman Empire begins",
        "def fibonacci(n):",
        "My favourite recipe for bread is",
        "In quantum mechanics, the wave function",
    };
    enum { N_REQ = 4, N_NEW = 128, N_TOP = 5 };
    llm_request_id ids[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        llm_token p[64];
        size_t n = tokenize(prompts[i], p, 64);
        llm_request_params rp;
        llm_request_params_init(&rp);
        rp.max_new_tokens = N_NEW;
        rp.ignore_eos = true;
        rp.logprobs = true;
        rp.top_logprobs = N_TOP;
        assert_int_equal(llm_session_submit(s, p, n, &rp, &ids[i]), LLM_OK);
    }
    unsigned tokens = 0, first = 0, in_top = 0, bad = 0, finished = 0;
    llm_event ev[8];
    for (int guard = 0; finished < N_REQ && guard < 10000; guard++) {
        size_t got = 0;
        assert_int_equal(llm_session_step(s, ev, 8, sizeof ev[0], &got), LLM_OK);
        for (size_t e = 0; e < got; e++) {
            finished += ev[e].finish_reason != LLM_FINISH_NONE;
            if (ev[e].token == LLM_TOKEN_NONE) continue;
            tokens++;
            assert_int_equal(ev[e].n_top, N_TOP);
            first += ev[e].top_tokens[0] == ev[e].token; /* greedy: the top token */
            for (uint32_t j = 0; j < ev[e].n_top; j++) {
                if (ev[e].top_tokens[j] != ev[e].token) continue;
                in_top++;
                if (memcmp(&ev[e].logprob, &ev[e].top_logprobs[j], sizeof(float)) != 0) {
                    if (bad++ < 3)
                        printf("# token %u (%d): logprob %.9g, top_logprobs[%u] %.9g\n", tokens,
                               ev[e].token, ev[e].logprob, j, ev[e].top_logprobs[j]);
                }
            }
        }
    }
    printf("# %u tokens, %u the top one, %u in the top list, %u differ\n", tokens, first, in_top,
           bad);
    assert_int_equal(finished, N_REQ);
    assert_int_equal(tokens, N_REQ * N_NEW);
    assert_int_equal(first, tokens);
    assert_int_equal(bad, 0);
    llm_session_free(s);
}

/* ---- cancel while the finish event waits to be delivered ---- */

static void test_cancel_with_finish_pending(void **state) {
    (void)state;
    llm_session *s = session(256);
    llm_token p[64];
    size_t n = tokenize("Hello there", p, 64);
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 1;
    llm_request_id a, b;
    assert_int_equal(llm_session_submit(s, p, n, &rp, &a), LLM_OK);
    assert_int_equal(llm_session_submit(s, p, n, &rp, &b), LLM_OK);
    /* One step finishes both; room for one event leaves the other pending. */
    llm_event ev;
    size_t got = 0;
    for (int guard = 0; got == 0 && guard < 100; guard++)
        assert_int_equal(llm_session_step(s, &ev, 1, sizeof ev, &got), LLM_OK);
    assert_int_equal(got, 1);
    assert_int_equal(ev.finish_reason, LLM_FINISH_LENGTH);
    llm_request_id pending = ev.request == a ? b : a;
    llm_status st = llm_session_cancel(s, pending);
    if (st != LLM_OK)
        fail_msg("cancel of a request whose finish is pending: %s (%s)", llm_status_name(st),
                 llm_last_error());
    assert_int_equal(llm_session_cancel(s, pending), LLM_OK); /* idempotent */
    /* Its one finish event still comes, as it was. */
    assert_int_equal(llm_session_step(s, &ev, 1, sizeof ev, &got), LLM_OK);
    assert_int_equal(got, 1);
    assert_true(ev.request == pending);
    assert_int_equal(ev.finish_reason, LLM_FINISH_LENGTH);
    assert_int_equal(drain(s), 0);
    /* Reported: now it is unknown. */
    expect_error(llm_session_cancel(s, pending), LLM_ERR_NOT_FOUND, "request");
    expect_error(llm_session_cancel(s, ev.request == a ? b : a), LLM_ERR_NOT_FOUND, "request");
    llm_session_free(s);
}

/* ---- memory that cannot be backed ---- */

static void test_kv_cache_beyond_memory(void **state) {
    (void)state;
    uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t ask = 4 * phys > (1ull << 40) ? 4 * phys : (1ull << 40);
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 1;
    p.n_ctx = 256;
    p.kv_cache_bytes = ask;
    llm_session *s = (llm_session *)0x1;
    llm_status st = llm_session_create(g_model, &p, &s);
    if (st == LLM_OK) llm_session_free(s);
    if (st != LLM_ERR_OUT_OF_MEMORY || !strstr(llm_last_error(), "kv_cache_bytes"))
        fail_msg("kv_cache_bytes %llu on %llu bytes of memory: %s \"%s\"",
                 (unsigned long long)ask, (unsigned long long)phys, llm_status_name(st),
                 llm_last_error());
    assert_null(s);
    /* What fits is still taken. */
    p.kv_cache_bytes = 16u << 20;
    assert_int_equal(llm_session_create(g_model, &p, &s), LLM_OK);
    llm_session_free(s);
}

/* The process's virtual size now, from /proc/self/status (0 if unknown). */
static uint64_t vm_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb << 10;
}

static void test_mmap_enomem_is_out_of_memory(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    uint64_t vm = vm_size();
    if (vm == 0 || sb.st_size < (64 << 20)) skip();
    /* Room for small allocations, not for a mapping of the whole file. */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)(vm + (uint64_t)sb.st_size / 4);
    if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < lim.rlim_cur) skip();
    assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
    llm_model_params mp;
    llm_model_params_init(&mp);
    mp.use_mmap = true;
    llm_model *m = (llm_model *)0x1;
    llm_status st = llm_model_load(path, &mp, &m);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", llm_last_error());
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
    if (st == LLM_OK) llm_model_free(m);
    if (st != LLM_ERR_OUT_OF_MEMORY || !strstr(msg, "map"))
        fail_msg("mmap without address space: %s \"%s\"", llm_status_name(st), msg);
    assert_null(m);
}

/* ---- strict tokenization ---- */

static void test_tokenize_strict(void **state) {
    (void)state;
    llm_token a[64], b[64];
    size_t na = 0, nb = 0;
    /* Text every byte of which has a token: the same tokens either way. */
    const char *clean = "Hello, world! <|im_start|> 42";
    size_t len = strlen(clean);
    uint32_t flags[] = {0, LLM_TOKENIZE_ADD_SPECIAL, LLM_TOKENIZE_PARSE_SPECIAL,
                        LLM_TOKENIZE_ADD_SPECIAL | LLM_TOKENIZE_PARSE_SPECIAL};
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        assert_int_equal(llm_tokenize(g_model, clean, len, flags[f], a, 64, &na), LLM_OK);
        llm_status st = llm_tokenize(g_model, clean, len, flags[f] | LLM_TOKENIZE_STRICT, b, 64,
                                     &nb);
        if (st != LLM_OK)
            fail_msg("strict on clean text (flags 0x%x): %s %s", flags[f], llm_status_name(st),
                     llm_last_error());
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof a[0]);
    }
    /* SmolLM2's vocabulary has no token for 0x04, 0x06, 0x13, 0x14, 0x16,
     * 0x1d, 0xf1 and 0xf2: dropped by default, refused with the offset
     * when strict. */
    static const struct {
        const char *text;
        size_t len, at;
    } cases[] = {
        {"ab\x04" "cd", 5, 2},
        {"\x06", 1, 0},
        {"x\x13\x14", 3, 1},
        {"hello \x16", 7, 6},
        {"\x1d" "a", 2, 0},
        {"caf\xc3\xa9 \xf1\x80\x80\x80", 10, 6},
        {"<|im_start|>\xf2\x80\x80\x80", 16, 12},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_int_equal(llm_tokenize(g_model, cases[c].text, cases[c].len,
                                      LLM_TOKENIZE_PARSE_SPECIAL, a, 64, &na),
                         LLM_OK);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", cases[c].at);
        nb = 99;
        expect_error(llm_tokenize(g_model, cases[c].text, cases[c].len,
                                  LLM_TOKENIZE_PARSE_SPECIAL | LLM_TOKENIZE_STRICT, b, 64, &nb),
                     LLM_ERR_INVALID_ARGUMENT, want);
        assert_int_equal(nb, 0);
    }
    /* Default: 0x04 vanishes, "ab\x04cd" gives the tokens of "abcd"'s pieces. */
    assert_int_equal(llm_tokenize(g_model, "ab\x04", 3, 0, a, 64, &na), LLM_OK);
    assert_int_equal(llm_tokenize(g_model, "ab", 2, 0, b, 64, &nb), LLM_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof a[0]);
    /* Other unknown flags are still refused. */
    expect_error(llm_tokenize(g_model, "a", 1, 1u << 7, a, 64, &na), LLM_ERR_INVALID_ARGUMENT,
                 "unknown flags");
}

/* ---- llm_generate: a seed gives the same tokens every call ---- */

typedef struct collect {
    llm_token tok[64];
    size_t n;
} collect;

static bool on_token(llm_token t, const char *piece, size_t len, void *user) {
    (void)piece;
    (void)len;
    collect *c = user;
    if (t != LLM_TOKEN_NONE && c->n < 64) c->tok[c->n++] = t;
    return true;
}

static void test_generate_seed_repeats(void **state) {
    (void)state;
    llm_session *s = session(256);
    llm_token p[64];
    size_t n = tokenize("Write a short poem about the sea:", p, 64);
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = 1234;
    collect c[2];
    for (int i = 0; i < 2; i++) {
        memset(&c[i], 0, sizeof c[i]);
        llm_generate_params gp;
        llm_generate_params_init(&gp);
        gp.max_new_tokens = 32;
        gp.ignore_eos = true;
        gp.sampling = &sp;
        gp.on_token = on_token;
        gp.user = &c[i];
        assert_int_equal(llm_generate(s, p, n, &gp, NULL), LLM_OK);
    }
    assert_int_equal(c[0].n, 32);
    assert_int_equal(c[1].n, 32);
    assert_memory_equal(c[0].tok, c[1].tok, sizeof c[0].tok);
    /* A request with the same seed draws the same tokens too. */
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.sampling = &sp;
    rp.max_new_tokens = 32;
    rp.ignore_eos = true;
    llm_request_id id;
    assert_int_equal(llm_session_submit(s, p, n, &rp, &id), LLM_OK);
    llm_event ev[4];
    size_t got, k = 0;
    for (int guard = 0; k < 32 && guard < 1000; guard++) {
        assert_int_equal(llm_session_step(s, ev, 4, sizeof ev[0], &got), LLM_OK);
        for (size_t e = 0; e < got; e++)
            if (ev[e].token != LLM_TOKEN_NONE) assert_int_equal(ev[e].token, c[0].tok[k++]);
    }
    assert_int_equal(k, 32);
    drain(s);
    llm_session_free(s);
}

/* ---- llm_generate is a request: one context rule, no blocks kept ---- */

/* A session whose KV pool has exactly n_blocks blocks of 16 tokens. */
static llm_session *session_blocks(uint32_t n_ctx, uint32_t n_blocks) {
    llm_session *probe = session(n_ctx);
    llm_session_stats st = {sizeof st};
    assert_int_equal(llm_session_get_stats(probe, &st), LLM_OK);
    llm_session_free(probe);
    uint64_t block_bytes = (64ull << 20) / st.blocks_total; /* at most one block short */
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    p.kv_cache_bytes = n_blocks * block_bytes + block_bytes / 2;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(g_model, &p, &s), LLM_OK);
    assert_int_equal(llm_session_get_stats(s, &st), LLM_OK);
    assert_int_equal(st.blocks_total, n_blocks);
    return s;
}

static void fill_prompt(llm_token *t, size_t n) {
    for (size_t i = 0; i < n; i++) t[i] = (llm_token)(100 + (i * 37) % 1000);
}

/* Steps until request `id` finishes; returns its finish event. */
static llm_event run_request(llm_session *s, llm_request_id id, llm_token *toks, size_t *n_toks) {
    llm_event ev[16];
    size_t got;
    *n_toks = 0;
    for (int guard = 0; guard < 1000; guard++) {
        assert_int_equal(llm_session_step(s, ev, 16, sizeof ev[0], &got), LLM_OK);
        for (size_t e = 0; e < got; e++) {
            assert_true(ev[e].request == id);
            if (ev[e].token != LLM_TOKEN_NONE && ev[e].finish_reason != LLM_FINISH_EOS)
                toks[(*n_toks)++] = ev[e].token;
            if (ev[e].finish_reason != LLM_FINISH_NONE) return ev[e];
        }
    }
    fail_msg("request %llu got no finish in 1000 steps", (unsigned long long)id);
    return ev[0];
}

/* Defect: after llm_generate, 7 of 8 blocks stayed used and an accepted
 * 100 + 20-token request then waited forever. */
static void test_generate_keeps_no_blocks(void **state) {
    (void)state;
    llm_session *s = session_blocks(512, 8);
    llm_token prompt[100];
    fill_prompt(prompt, 100);
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 4;
    assert_int_equal(llm_generate(s, prompt, 100, &gp, NULL), LLM_OK);
    llm_session_stats st = {sizeof st};
    assert_int_equal(llm_session_get_stats(s, &st), LLM_OK);
    if (st.blocks_used != 0)
        fail_msg("after llm_generate %u of %u blocks stay used", st.blocks_used, st.blocks_total);
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 20;
    rp.ignore_eos = true;
    llm_request_id id;
    assert_int_equal(llm_session_submit(s, prompt, 100, &rp, &id), LLM_OK);
    llm_token toks[32];
    size_t n = 0;
    llm_event fin = run_request(s, id, toks, &n);
    assert_int_equal(fin.finish_reason, LLM_FINISH_LENGTH);
    assert_int_equal(n, 20);
    llm_session_free(s);
}

/* Defect: a request that can never get its blocks, because a token-level
 * sequence holds them and nothing runs, waited forever. It now ends with
 * LLM_FINISH_ERROR and LLM_ERR_LIMIT; after the sequence closes, the same
 * request runs. */
static void test_blocks_held_by_sequences(void **state) {
    (void)state;
    llm_session *s = session_blocks(512, 8);
    llm_token prompt[100];
    fill_prompt(prompt, 100);
    llm_seq_id seq;
    assert_int_equal(llm_seq_open(s, &seq), LLM_OK);
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(100, &b), LLM_OK);
    for (uint32_t i = 0; i < 100; i++)
        assert_int_equal(llm_batch_add(b, seq, i, prompt[i], false), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 20;
    rp.ignore_eos = true;
    llm_request_id id;
    assert_int_equal(llm_session_submit(s, prompt, 100, &rp, &id), LLM_OK);
    llm_token toks[32];
    size_t n = 0;
    llm_event fin = run_request(s, id, toks, &n);
    assert_int_equal(fin.finish_reason, LLM_FINISH_ERROR);
    assert_int_equal(fin.status, LLM_ERR_LIMIT);
    assert_int_equal(n, 0);
    /* llm_generate reports the same instead of hanging. */
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 20;
    llm_generate_result res = {sizeof res};
    expect_error(llm_generate(s, prompt, 100, &gp, &res), LLM_ERR_LIMIT, "token-level");
    assert_int_equal(res.finish_reason, LLM_FINISH_ERROR);
    assert_int_equal(llm_seq_close(s, seq), LLM_OK);
    assert_int_equal(llm_session_submit(s, prompt, 100, &rp, &id), LLM_OK);
    fin = run_request(s, id, toks, &n);
    assert_int_equal(fin.finish_reason, LLM_FINISH_LENGTH);
    assert_int_equal(n, 20);
    llm_batch_free(b);
    llm_session_free(s);
}

/* Defect: with n_ctx 64 and a 60-token prompt a request gave 4 tokens and
 * llm_generate 5; a prompt of n_ctx tokens was refused by submit only. One
 * rule now: prompt + generated <= n_ctx, and the prompt leaves room. */
static void test_one_context_rule(void **state) {
    (void)state;
    llm_session *s = session(64);
    llm_token prompt[64];
    fill_prompt(prompt, 64);
    collect c = {0};
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 20;
    gp.ignore_eos = true;
    gp.on_token = on_token;
    gp.user = &c;
    llm_generate_result res = {sizeof res};
    assert_int_equal(llm_generate(s, prompt, 60, &gp, &res), LLM_OK);
    assert_int_equal(res.finish_reason, LLM_FINISH_LENGTH);
    assert_int_equal(res.n_generated_tokens, 4);
    assert_int_equal(c.n, 4);
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 20;
    rp.ignore_eos = true;
    llm_request_id id;
    assert_int_equal(llm_session_submit(s, prompt, 60, &rp, &id), LLM_OK);
    llm_token toks[32];
    size_t n = 0;
    llm_event fin = run_request(s, id, toks, &n);
    assert_int_equal(fin.finish_reason, LLM_FINISH_LENGTH);
    assert_int_equal(n, 4);
    assert_memory_equal(toks, c.tok, 4 * sizeof *toks);
    expect_error(llm_generate(s, prompt, 64, &gp, NULL), LLM_ERR_LIMIT, "64");
    expect_error(llm_session_submit(s, prompt, 64, &rp, &id), LLM_ERR_LIMIT, "64");
    llm_session_free(s);
}

/* llm_generate steps the whole session: a request submitted before it
 * advances in its steps, and none of that request's events is lost or
 * taken: after llm_generate returns, llm_session_step delivers them, and
 * the request's tokens equal its tokens when run alone. */
static void test_generate_keeps_other_events(void **state) {
    (void)state;
    llm_token p1[64], p2[64];
    size_t n1 = tokenize("The three primary colors are", p1, 64);
    size_t n2 = tokenize("Once upon a time", p2, 64);
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 24;
    rp.ignore_eos = true;
    /* Alone. */
    llm_session *s = session(512);
    llm_request_id id;
    llm_token solo[32];
    size_t n_solo = 0;
    assert_int_equal(llm_session_submit(s, p1, n1, &rp, &id), LLM_OK);
    llm_event fin = run_request(s, id, solo, &n_solo);
    assert_int_equal(fin.finish_reason, LLM_FINISH_LENGTH);
    assert_int_equal(n_solo, 24);
    llm_session_free(s);
    /* Submitted, then llm_generate, then stepped. */
    s = session(512);
    assert_int_equal(llm_session_submit(s, p1, n1, &rp, &id), LLM_OK);
    collect c = {0};
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 8;
    gp.ignore_eos = true;
    gp.on_token = on_token;
    gp.user = &c;
    assert_int_equal(llm_generate(s, p2, n2, &gp, NULL), LLM_OK);
    assert_int_equal(c.n, 8);
    llm_event ev[64];
    size_t got = 0, n_tok = 0, n_fin = 0;
    llm_token toks[32];
    for (int guard = 0; guard < 1000 && n_fin == 0; guard++) {
        assert_int_equal(llm_session_step(s, ev, 64, sizeof ev[0], &got), LLM_OK);
        for (size_t e = 0; e < got; e++) {
            assert_true(ev[e].request == id); /* nothing of llm_generate's leaks */
            if (ev[e].token != LLM_TOKEN_NONE) {
                assert_true(n_tok < 32);
                toks[n_tok++] = ev[e].token;
            }
            n_fin += ev[e].finish_reason != LLM_FINISH_NONE;
        }
    }
    assert_int_equal(n_fin, 1);
    assert_int_equal(n_tok, n_solo);
    assert_memory_equal(toks, solo, n_solo * sizeof *toks);
    /* llm_generate's tokens are its tokens alone, too. */
    collect alone = {0};
    gp.user = &alone;
    assert_int_equal(llm_generate(s, p2, n2, &gp, NULL), LLM_OK);
    assert_memory_equal(alone.tok, c.tok, 8 * sizeof *c.tok);
    llm_session_free(s);
}

/* ---- submit: what is refused and what ends with LENGTH ---- */

static void test_submit_limits(void **state) {
    (void)state;
    llm_session *s = session(64);
    llm_token p[80];
    size_t n = tokenize("A prompt of a few tokens", p, 80);
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = 500; /* prompt + max_new_tokens beyond n_ctx: accepted */
    rp.ignore_eos = true;
    llm_request_id id;
    assert_int_equal(llm_session_submit(s, p, n, &rp, &id), LLM_OK);
    llm_event ev[4];
    size_t got, generated = 0;
    llm_finish_reason why = LLM_FINISH_NONE;
    for (int guard = 0; why == LLM_FINISH_NONE && guard < 1000; guard++) {
        assert_int_equal(llm_session_step(s, ev, 4, sizeof ev[0], &got), LLM_OK);
        for (size_t e = 0; e < got; e++) {
            generated += ev[e].token != LLM_TOKEN_NONE;
            if (ev[e].finish_reason) why = ev[e].finish_reason;
        }
    }
    assert_int_equal(why, LLM_FINISH_LENGTH);
    assert_true(n + generated <= 64);
    /* A prompt that leaves no room in the context is refused. */
    for (size_t i = n; i < 64; i++) p[i] = p[0];
    expect_error(llm_session_submit(s, p, 64, &rp, &id), LLM_ERR_LIMIT, "context");
    /* A NULL stop string is named as such. */
    const char *stops[] = {"end", NULL};
    rp.max_new_tokens = 4;
    rp.stop_strings = stops;
    rp.n_stop_strings = 2;
    expect_error(llm_session_submit(s, p, n, &rp, &id), LLM_ERR_INVALID_ARGUMENT,
                 "stop string 1 is NULL");
    stops[1] = "";
    expect_error(llm_session_submit(s, p, n, &rp, &id), LLM_ERR_INVALID_ARGUMENT,
                 "stop string 1 is empty");
    llm_session_free(s);
}

static int setup(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path) {
        fprintf(stderr, "LLM_TEST_MODEL is not set (make test sets it)\n");
        return -1;
    }
    if (llm_model_load(path, NULL, &g_model) != LLM_OK) return -1;
    llm_model_info info = {sizeof info};
    llm_model_get_info(g_model, &info);
    g_vocab = info.n_vocab;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llm_model_free(g_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_outlive_step_and_generate),
        cmocka_unit_test(test_logprob_equals_top_entry),
        cmocka_unit_test(test_cancel_with_finish_pending),
        cmocka_unit_test(test_kv_cache_beyond_memory),
        cmocka_unit_test(test_mmap_enomem_is_out_of_memory),
        cmocka_unit_test(test_tokenize_strict),
        cmocka_unit_test(test_generate_seed_repeats),
        cmocka_unit_test(test_submit_limits),
        cmocka_unit_test(test_generate_keeps_no_blocks),
        cmocka_unit_test(test_blocks_held_by_sequences),
        cmocka_unit_test(test_one_context_rule),
        cmocka_unit_test(test_generate_keeps_other_events),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
