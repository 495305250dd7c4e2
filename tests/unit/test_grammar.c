/* Grammar engine: the GBNF parser, JSON Schema and regex compilers and the
 * matcher, against hand-written accept/reject tables; compile errors name
 * their place; the token mask against a brute-force check of every token
 * (llmi_gstate_allows, which runs the token's bytes through the matcher)
 * on a real byte-level BPE vocabulary; partial UTF-8 across tokens; fork
 * and rollback; allocation-failure sweeps of compile and mask; and the
 * sampler: a grammar bans everything else before the other steps. */
#include "sched_util.h"

#include "grammar/grammar.h"
#include "model/model.h"
#include "sample/sample.h"

#include <math.h>
#include <unistd.h>

/* ---- helpers ---- */

static llmi_grammar *ebnf(const char *text) {
    llmi_grammar *g = NULL;
    llm_status st = llmi_grammar_from_ebnf(text, strlen(text), "root", &g);
    if (st != LLM_OK)
        fail_msg("compile %s: %s", text, llmi_error_message());
    return g;
}

/* Whether the whole string s is in the grammar's language. */
static bool matches(const llmi_grammar *g, const char *s, size_t n) {
    llmi_gstate *st = NULL;
    assert_int_equal(llmi_gstate_create(g, &st), LLM_OK);
    bool ok = llmi_gstate_accept_bytes(st, s, n) == LLM_OK && llmi_gstate_can_end(st);
    llmi_gstate_free(st);
    return ok;
}

typedef struct case_ {
    const char *grammar;
    const char *yes[6];
    const char *no[6];
} case_;

static void check_cases(const llmi_grammar *g, const case_ *c) {
    for (int i = 0; i < 6 && c->yes[i]; i++)
        if (!matches(g, c->yes[i], strlen(c->yes[i])))
            fail_msg("%s should accept '%s'", c->grammar, c->yes[i]);
    for (int i = 0; i < 6 && c->no[i]; i++)
        if (matches(g, c->no[i], strlen(c->no[i])))
            fail_msg("%s should reject '%s'", c->grammar, c->no[i]);
}

/* ---- the notation ---- */

static void test_ebnf_language(void **state) {
    (void)state;
    static const case_ cases[] = {
        {"root ::= \"ab\" | \"c\"", {"ab", "c"}, {"", "a", "abc", "cc"}},
        {"root ::= [a-c]+ \"!\"", {"a!", "abcab!"}, {"!", "ad!", "a"}},
        {"root ::= [^a-c]*", {"", "xyz", "\xc3\xa9t\xc3\xa9"}, {"a", "xa"}},
        {"root ::= \"x\"{2,3}", {"xx", "xxx"}, {"x", "xxxx"}},
        {"root ::= \"x\"{2}", {"xx"}, {"x", "xxx"}},
        {"root ::= \"x\"{2,}", {"xx", "xxxxx"}, {"x", ""}},
        {"root ::= (\"a\" | \"b\")? \"c\"", {"c", "ac", "bc"}, {"abc", ""}},
        {"root ::= . .", {"ab", "\xe2\x82\xac\xf0\x9f\x98\x80"}, {"a", "abc"}},
        {"root ::= \"\\x41\\u00e9\\n\\\"\"", {"A\xc3\xa9\n\""}, {"A"}},
        {"root ::= item (\",\" item)*\nitem ::= [0-9]+ # a comment\n",
         {"1", "1,22,333"},
         {"1,", ",1"}},
        {"root ::= \"(\" root \")\" | \"\"", {"", "()", "((()))"}, {"(", "())"}},
        {"root ::= [\\]\\-a]", {"]", "-", "a"}, {"b"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmi_grammar *g = ebnf(cases[i].grammar);
        check_cases(g, &cases[i]);
        llmi_grammar_free(g);
    }
}

static void expect_error(llm_status got, llm_status want, const char *needle) {
    assert_int_equal(got, want);
    if (!strstr(llmi_error_message(), needle))
        fail_msg("error '%s' does not mention '%s'", llmi_error_message(), needle);
}

static void test_ebnf_errors(void **state) {
    (void)state;
    llmi_grammar *g = (llmi_grammar *)1;
    static const struct {
        const char *text, *needle;
        llm_status st;
    } bad[] = {
        {"root ::= \"a\n", "1:10", LLM_ERR_INVALID_ARGUMENT},
        {"root ::= a\n", "'a' is used at 1:10 but never defined", LLM_ERR_INVALID_ARGUMENT},
        {"root ::= [b-a]", "1:10", LLM_ERR_INVALID_ARGUMENT},
        {"x ::= \"a\"", "no rule named 'root'", LLM_ERR_INVALID_ARGUMENT},
        {"root ::= root \"a\" | \"b\"", "left-recursive", LLM_ERR_UNSUPPORTED},
        {"root ::= (\"a\"?)*", "left-recursive", LLM_ERR_UNSUPPORTED},
        {"root ::= \"a\"\n  ) ", "2:3", LLM_ERR_INVALID_ARGUMENT},
        {"root ::= \"\\q\"", "unknown escape", LLM_ERR_INVALID_ARGUMENT},
        {"root ::= \"a\"{5000}", "above 4096", LLM_ERR_UNSUPPORTED},
        {"root ::= \"a\"\nroot ::= \"b\"", "2:1: rule defined twice", LLM_ERR_INVALID_ARGUMENT},
        {"root ::= [^\\x00-\\U0010FFFF]", "matches nothing", LLM_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g = (llmi_grammar *)1;
        expect_error(llmi_grammar_from_ebnf(bad[i].text, strlen(bad[i].text), "root", &g),
                     bad[i].st, bad[i].needle);
        assert_null(g);
    }
}

static void test_regex(void **state) {
    (void)state;
    static const case_ cases[] = {
        {"^a(b|cd)*e$", {"ae", "abcde", "abbe"}, {"a", "abc", "xae"}},
        {"\\d{3}-\\d{4}", {"555-1234"}, {"5551234", "55-1234", "555-12345"}},
        {"[A-Z][a-z]+( [A-Z][a-z]+)?", {"Ada", "Ada Lovelace"}, {"ada", "A", "Ada lovelace"}},
        {"\\w+@\\w+\\.(com|org)", {"a_b@x1.com", "z@q.org"}, {"@x.com", "a@b.net"}},
        {"[^\\s]+", {"abc", "\xc3\xa9"}, {"a b", ""}},
        {"colou?r", {"color", "colour"}, {"colouur"}},
        {"a.c",
         {"abc", "a\xe2\x82\xac"
                 "c"},
         {"a\nc", "ac"}},
        {"(?:ab)+?", {"ab", "abab"}, {"aba", ""}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmi_grammar *g = NULL;
        const char *re = cases[i].grammar;
        if (llmi_grammar_from_regex(re, strlen(re), &g) != LLM_OK)
            fail_msg("regex %s: %s", re, llmi_error_message());
        check_cases(g, &cases[i]);
        llmi_grammar_free(g);
    }
    llmi_grammar *g = NULL;
    expect_error(llmi_grammar_from_regex("(a)\\1", 5, &g), LLM_ERR_UNSUPPORTED, "offset 3");
    expect_error(llmi_grammar_from_regex("a(?=b)", 6, &g), LLM_ERR_UNSUPPORTED, "offset 1");
    expect_error(llmi_grammar_from_regex("(ab", 3, &g), LLM_ERR_INVALID_ARGUMENT, "offset 0");
    expect_error(llmi_grammar_from_regex("*a", 2, &g), LLM_ERR_INVALID_ARGUMENT, "offset 0");
    assert_null(g);
}

/* ---- JSON Schema ---- */

static llmi_grammar *schema(const char *json, uint32_t ws) {
    llmi_grammar *g = NULL;
    if (llmi_grammar_from_schema(json, strlen(json), ws, &g) != LLM_OK)
        fail_msg("schema %s: %s", json, llmi_error_message());
    return g;
}

static void test_schema_language(void **state) {
    (void)state;
    static const case_ cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\"}},\"required\":[\"a\"],\"additionalProperties\":false}",
         {"{\"a\":1}", "{\"a\":-20,\"b\":\"x\"}"},
         {"{}", "{\"b\":\"x\"}", "{\"a\":1,}", "{\"a\":01}", "{\"b\":\"x\",\"a\":1}"}},
        {"{\"enum\":[\"red\",1,null,{\"k\":[true]}]}",
         {"\"red\"", "1", "null", "{\"k\":[true]}"},
         {"\"blue\"", "2"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":2}",
         {"[true]", "[true,false]"},
         {"[]", "[true,true,true]", "[1]"}},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
         {"\"ab\"", "\"a\\nb\"", "\"\xc3\xa9\xc3\xa9\""},
         {"\"a\"", "\"abcd\"", "\"a\"b\""}},
        {"{\"type\":\"string\",\"format\":\"date\"}",
         {"\"2024-02-28\""},
         {"\"2024-2-28\"", "\"x\""}},
        {"{\"type\":\"string\",\"format\":\"uuid\"}",
         {"\"123e4567-e89b-12d3-a456-426614174000\""},
         {"\"123e4567e89b12d3a456426614174000\""}},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\"?$\"}",
         {"\"abc\"", "\"ab\\\"\""},
         {"\"ab\"\"", "\"A\""}},
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"next\":{\"anyOf\":[{\"$ref\":"
         "\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"next\"]}},\"$ref\":\"#/$defs/"
         "node\"}",
         {"{\"next\":null}", "{\"next\":{\"next\":{\"next\":null}}}"},
         {"{\"next\":{}}", "{}"}},
        {"{\"type\":[\"integer\",\"null\"]}", {"12", "null"}, {"1.5", "\"x\""}},
        {"{}", {"{\"a\":[1,2.5e3,\"x\",{}]}", "true", "null"}, {"{a:1}", "[1,]"}},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
         {"{}", "{\"x\":1,\"y\":2}"},
         {"{\"x\":\"1\"}"}},
        {"{\"const\":{\"a\":\"\\u00e9\"}}", {"{\"a\":\"\xc3\xa9\"}"}, {"{\"a\":\"e\"}"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmi_grammar *g = schema(cases[i].grammar, LLMI_GRAMMAR_WS_COMPACT);
        check_cases(g, &cases[i]);
        llmi_grammar_free(g);
    }
    llmi_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\"}}}",
                             LLMI_GRAMMAR_WS_FLEXIBLE);
    const char *yes = "{ \"a\" :\n  [ 1 , {\"b\": 2} ] }";
    assert_true(matches(g, yes, strlen(yes)));
    assert_true(matches(g, "{}", 2));
    llmi_grammar_free(g);
    g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\"}}}",
               LLMI_GRAMMAR_WS_COMPACT);
    assert_false(matches(g, yes, strlen(yes)));
    llmi_grammar_free(g);
}

static void test_schema_errors(void **state) {
    (void)state;
    static const struct {
        const char *json, *needle;
        llm_status st;
    } bad[] = {
        {"{\"type\":\"string\",\"contentMediaType\":\"x\"}",
         "'contentMediaType' at /contentMediaType", LLM_ERR_UNSUPPORTED},
        {"{\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":3}}}",
         "'minimum' at /properties/a/minimum", LLM_ERR_UNSUPPORTED},
        {"{\"type\":\"string\",\"format\":\"ipv4\"}", "format 'ipv4' at /format",
         LLM_ERR_UNSUPPORTED},
        {"{\"$ref\":\"http://x/y\"}", "does not resolve", LLM_ERR_UNSUPPORTED},
        {"{\"type\":\"strin\"}", "unknown type 'strin'", LLM_ERR_INVALID_ARGUMENT},
        {"{\"type\":", "not valid JSON", LLM_ERR_INVALID_ARGUMENT},
        {"{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"(a\"}]}", "/anyOf/0/pattern",
         LLM_ERR_INVALID_ARGUMENT},
        {"{\"oneOf\":[{}]}", "'oneOf' at /oneOf", LLM_ERR_UNSUPPORTED},
        {"{\"type\":\"array\",\"maxItems\":-1}", "/maxItems", LLM_ERR_INVALID_ARGUMENT},
        {"{\"properties\":{\"a/b\":{\"uniqueItems\":true}}}", "/properties/a~1b/uniqueItems",
         LLM_ERR_UNSUPPORTED},
        {"false", "matches nothing", LLM_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        llmi_grammar *g = (llmi_grammar *)1;
        expect_error(llmi_grammar_from_schema(bad[i].json, strlen(bad[i].json), 0, &g), bad[i].st,
                     bad[i].needle);
        assert_null(g);
    }
}

/* ---- partial UTF-8, fork, rollback ---- */

static void test_partial_utf8(void **state) {
    (void)state;
    llmi_grammar *g = ebnf("root ::= \"\xe2\x82\xac\" [\xc3\xa0-\xc3\xbf] \"!\"");
    llmi_gstate *s = NULL;
    assert_int_equal(llmi_gstate_create(g, &s), LLM_OK);
    assert_int_equal(llmi_gstate_accept_bytes(s, "\xe2", 1), LLM_OK);
    assert_false(llmi_gstate_can_end(s));
    assert_int_equal(llmi_gstate_accept_bytes(s, "\x83", 1), LLM_ERR_INVALID_ARGUMENT); /* U+20C? */
    assert_int_equal(llmi_gstate_accept_bytes(s, "\x82\xac\xc3", 3), LLM_OK);
    assert_int_equal(llmi_gstate_accept_bytes(s, "\x9f", 1), LLM_ERR_INVALID_ARGUMENT); /* U+00DF */
    assert_int_equal(llmi_gstate_accept_bytes(s, "\xa9!", 2), LLM_OK);
    assert_true(llmi_gstate_can_end(s));
    assert_true(llmi_gstate_is_complete(s));
    llmi_gstate_free(s);
    llmi_grammar_free(g);
}

/* ---- against a vocabulary ---- */

static llm_model *g_model;

static int setup_model(void **state) {
    (void)state;
    g_model = tiny_model(256, 7);
    return 0;
}

static int teardown_model(void **state) {
    (void)state;
    llm_model_free(g_model);
    return 0;
}

static llmi_grammar *bound(llmi_grammar *g) {
    if (llmi_grammar_bind_vocab(g, g_model->tok) != LLM_OK)
        fail_msg("%s", llmi_error_message());
    return g;
}

static uint32_t n_words(const llmi_grammar *g) { return (g->n_vocab + 31) / 32; }

static bool bit(const uint32_t *m, uint32_t t) { return (m[t >> 5] >> (t & 31)) & 1; }

/* The mask (from the position masks, where they apply) equals the plain trie walk's
 * and the token-by-token check for every token. */
static uint32_t check_mask(llmi_gstate *s, uint32_t *mask) {
    assert_int_equal(llmi_gstate_fill_mask(s, mask), LLM_OK);
    size_t words = (s->g->n_vocab + 31) / 32;
    uint32_t *plain = malloc(words * sizeof *plain);
    s->no_cache = true;
    assert_int_equal(llmi_gstate_fill_mask(s, plain), LLM_OK);
    s->no_cache = false;
    assert_memory_equal(mask, plain, words * sizeof *plain);
    free(plain);
    uint32_t n = 0;
    for (uint32_t t = 0; t < s->g->n_vocab; t++) {
        bool want = llmi_gstate_allows(s, (llm_token)t);
        if (bit(mask, t) != want)
            fail_msg("token %u: mask %d, check %d", t, bit(mask, t), want);
        n += want;
    }
    return n;
}

static const char *const WALK_GRAMMARS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"yz\"]},\"maxItems\":3},\"n\":{"
    "\"type\":\"number\"}},\"required\":[\"name\",\"n\"]}",
    "{\"type\":\"string\",\"pattern\":\"^(\\u00e9|\\u20ac|[a-c]){1,9}$\"}",
};

/* Random walks: the mask matches the brute-force check at every step; the
 * tokens drawn from it always keep the grammar alive, and the text they
 * make is accepted from scratch. */
static void random_walks(llmi_grammar *g, uint32_t *seed) {
    uint32_t *mask = calloc(n_words(g), sizeof *mask);
    for (int walk = 0; walk < 3; walk++) {
        llmi_gstate *s = NULL;
        assert_int_equal(llmi_gstate_create(g, &s), LLM_OK);
        char text[4096];
        size_t len = 0;
        for (int step = 0; step < 40 && !llmi_gstate_is_complete(s); step++) {
            uint32_t n = check_mask(s, mask);
            assert_true(n > 0);
            *seed = *seed * 1103515245u + 12345u;
            uint32_t pick = (*seed >> 8) % n, t = 0;
            for (;; t++)
                if (bit(mask, t) && pick-- == 0)
                    break;
            if (llmi_tokenizer_is_eog(g_model->tok, (llm_token)t)) {
                assert_true(llmi_gstate_can_end(s));
                break;
            }
            assert_int_equal(llmi_gstate_accept_token(s, (llm_token)t), LLM_OK);
            uint32_t tl = g->tok_off[t + 1] - g->tok_off[t];
            assert_true(len + tl < sizeof text);
            memcpy(text + len, g->tok_bytes + g->tok_off[t], tl);
            len += tl;
        }
        /* the prefix is always accepted (the grammar never dead-ends) */
        llmi_gstate *fresh = NULL;
        assert_int_equal(llmi_gstate_create(g, &fresh), LLM_OK);
        assert_int_equal(llmi_gstate_accept_bytes(fresh, text, len), LLM_OK);
        assert_int_equal(llmi_gstate_can_end(fresh), llmi_gstate_can_end(s));
        llmi_gstate_free(fresh);
        llmi_gstate_free(s);
    }
    free(mask);
}

static void test_mask_walk(void **state) {
    (void)state;
    uint32_t seed = 12345;
    for (size_t gi = 0; gi < sizeof WALK_GRAMMARS / sizeof WALK_GRAMMARS[0]; gi++) {
        llmi_grammar *g = bound(schema(WALK_GRAMMARS[gi], gi ? 0 : 1));
        random_walks(g, &seed);
        llmi_grammar_free(g);
    }
}

/* The same check over a real vocabulary (LLM_TEST_MODEL, SmolLM2's 49k
 * tokens): long tokens, multi-byte characters and deep trie subtrees are
 * where the walk takes subtrees whole (a string loop, a bounded string's
 * chain, an email's character class), so the masks must still equal the
 * plain walk's and the token-by-token check at every step. */
static const char *const REAL_VOCAB_SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":"
    "\"string\",\"maxLength\":7}},\"required\":[\"a\",\"b\"]}",
    "{\"type\":\"string\",\"format\":\"email\"}",
    "{\"type\":\"string\",\"pattern\":\"^[a-z\\u00e0-\\u00ff]{2,30}$\"}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":"
    "20}}",
};

static void test_mask_real_vocab(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path || access(path, R_OK) != 0)
        skip();
    llm_model_params mp;
    llm_model_params_init(&mp);
    llm_model *m = NULL;
    assert_int_equal(llm_model_load(path, &mp, &m), LLM_OK);
    uint32_t seed = 777;
    for (size_t gi = 0; gi < sizeof REAL_VOCAB_SCHEMAS / sizeof REAL_VOCAB_SCHEMAS[0]; gi++) {
        llmi_grammar *g = schema(REAL_VOCAB_SCHEMAS[gi], gi & 1);
        assert_int_equal(llmi_grammar_bind_model(g, m), LLM_OK);
        uint32_t *mask = calloc(n_words(g), sizeof *mask);
        for (int walk = 0; walk < 2; walk++) {
            llmi_gstate *s = NULL;
            assert_int_equal(llmi_gstate_create(g, &s), LLM_OK);
            for (int step = 0; step < 12 && !llmi_gstate_is_complete(s); step++) {
                uint32_t n = check_mask(s, mask);
                assert_true(n > 0);
                /* prefer long tokens: they reach deep into the trie */
                llm_token best = -1;
                for (int tries = 0; tries < 4; tries++) {
                    seed = seed * 1103515245u + 12345u;
                    uint32_t pick = (seed >> 8) % n, t = 0;
                    for (;; t++)
                        if (bit(mask, t) && pick-- == 0)
                            break;
                    if (best < 0 ||
                        g->tok_off[t + 1] - g->tok_off[t] > g->tok_off[best + 1] - g->tok_off[best])
                        best = (llm_token)t;
                }
                if (llmi_tokenizer_is_eog(m->tok, best))
                    break;
                assert_int_equal(llmi_gstate_accept_token(s, best), LLM_OK);
            }
            llmi_gstate_free(s);
        }
        free(mask);
        llmi_grammar_free(g);
    }
    llm_model_free(m);
}

/* A walk that meets more distinct stack sets than it keeps falls back to
 * the plain walk (in the cut walk of a position mask, in the uncertain
 * subtrees and in the middle of a character); the masks stay the same. */
static void test_mask_walk_fallback(void **state) {
    for (uint32_t cap = 1; cap <= 3; cap++) {
        llmi_gwalk_test_max_states(cap);
        test_mask_walk(state);
    }
    llmi_gwalk_test_max_states(0);
}

/* The same over the real vocabulary, whose deeper subtrees the fallback
 * walks below an uncertain node. */
static void test_mask_real_vocab_fallback(void **state) {
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path || access(path, R_OK) != 0)
        skip(); /* before the cap: a skip leaves the function */
    llmi_gwalk_test_max_states(3);
    test_mask_real_vocab(state);
    llmi_gwalk_test_max_states(0);
}

/* Every stack the grammars make has its chain of top positions in the
 * table: no mask falls back to the walk from scratch. */
static void test_posmask_complete(void **state) {
    uint64_t before = llmi_gpos_test_misses();
    test_mask_walk(state);
    /* Rules reached through references that end their alternatives (whose
     * frames inherit what lies below the caller), empty alternatives,
     * recursion through several rules, a rule used in many places. */
    static const char *const grammars[] = {
        "root ::= item (\",\" item)*\nitem ::= key | \"[\" list \"]\"\nlist ::= | item "
        "(\";\" item)*\nkey ::= [a-c]+ tail\ntail ::= \"\" | \"!\" tail",
        "root ::= a | b\na ::= \"x\" b\nb ::= \"y\" | \"y\" a | c\nc ::= [0-9] c | [0-9]",
        "root ::= (w \" \")* w\nw ::= [a-z] w | [a-z] | \"(\" root \")\"",
    };
    uint32_t seed = 99;
    for (size_t i = 0; i < sizeof grammars / sizeof grammars[0]; i++) {
        llmi_grammar *g = bound(ebnf(grammars[i]));
        assert_non_null(g->posmasks);
        random_walks(g, &seed);
        llmi_grammar_free(g);
    }
    const char *path = getenv("LLM_TEST_MODEL");
    if (path && access(path, R_OK) == 0)
        test_mask_real_vocab(state);
    assert_int_equal(llmi_gpos_test_misses(), before);
    llmi_grammar *g = bound(schema(WALK_GRAMMARS[0], 1));
    assert_non_null(g->posmasks);
    assert_int_equal(llmi_gpostable_depth(g->posmasks), LLMI_GPOS_DEPTH);
    assert_true(llmi_gpostable_size(g->posmasks) > 0);
    llmi_grammar_free(g);
}

/* Grammars with more chains than the table holds get shallower chains,
 * then none (masks walked from scratch); the masks stay the same. */
static void test_posmask_limits(void **state) {
    llmi_grammar *g = bound(schema(WALK_GRAMMARS[0], 1));
    uint32_t full = llmi_gpostable_size(g->posmasks);
    llmi_grammar_free(g);
    /* {chains, callers, depth expected (0: no table)} */
    const uint32_t cases[][3] = {{full - 1, 0, 2}, {0, 1, 1}, {1, 1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmi_gpos_test_limits(cases[i][0], cases[i][1]);
        g = bound(schema(WALK_GRAMMARS[0], 1));
        if (cases[i][2] == 0)
            assert_null(g->posmasks);
        else {
            assert_non_null(g->posmasks);
            assert_true(llmi_gpostable_depth(g->posmasks) <= cases[i][2]);
        }
        llmi_grammar_free(g);
        for (uint32_t cap = 0; cap <= 3; cap++) { /* and with the walks giving up */
            llmi_gwalk_test_max_states(cap);
            test_mask_walk(state);
        }
        llmi_gwalk_test_max_states(0);
    }
    llmi_gpos_test_limits(0, 0);
}

static void test_fork_rollback(void **state) {
    (void)state;
    llmi_grammar *g = bound(ebnf("root ::= \"{\" [a-z]+ \"}\""));
    llm_token toks[5];
    size_t n = 0;
    assert_int_equal(llm_tokenize(g_model, "{abc}", 5, 0, toks, 5, &n), LLM_OK);
    llmi_gstate *s = NULL, *f = NULL;
    assert_int_equal(llmi_gstate_create(g, &s), LLM_OK);
    uint32_t *m0 = calloc(n_words(g), 4), *m1 = calloc(n_words(g), 4);
    check_mask(s, m0);
    for (size_t i = 0; i + 1 < n; i++)
        assert_int_equal(llmi_gstate_accept_token(s, toks[i]), LLM_OK);
    assert_int_equal(llmi_gstate_fork(s, &f), LLM_OK);
    assert_int_equal(llmi_gstate_accept_token(f, toks[n - 1]), LLM_OK);
    assert_true(llmi_gstate_is_complete(f));
    assert_false(llmi_gstate_is_complete(s)); /* the fork is independent */
    /* a rejected token changes nothing */
    llm_token bad = toks[0];
    assert_int_equal(llmi_gstate_accept_token(s, bad), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llmi_gstate_rollback_depth(s), n - 1);
    assert_int_equal(llmi_gstate_rollback(s, (uint32_t)(n - 1)), LLM_OK);
    check_mask(s, m1);
    assert_memory_equal(m0, m1, n_words(g) * 4);
    assert_int_equal(llmi_gstate_rollback(s, 1), LLM_ERR_INVALID_ARGUMENT);
    /* EOG only where the grammar may end; nothing after it */
    llm_token eos = llmi_tokenizer_eos(g_model->tok);
    assert_int_equal(llmi_gstate_accept_token(f, eos), LLM_OK);
    assert_int_equal(llmi_gstate_accept_token(f, toks[0]), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llmi_gstate_accept_token(s, eos), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llmi_gstate_rollback(f, 1), LLM_OK);
    assert_true(llmi_gstate_is_complete(f) && !f->finished);
    free(m0);
    free(m1);
    llmi_gstate_free(s);
    llmi_gstate_free(f);
    llmi_grammar_free(g);
}

/* A long generation compacts the node arena several times; the rollback
 * history survives it: undoing tokens one by one gives back the masks seen
 * on the way. */
static void test_long_rollback(void **state) {
    (void)state;
    llmi_grammar *g = bound(ebnf("root ::= ( [a-c] | \"(\" root \")\" )*"));
    size_t words = n_words(g);
    enum { STEPS = 3000, KEEP = LLMI_GRAMMAR_MAX_ROLLBACK };
    uint32_t *seen = calloc((size_t)(KEEP + 1) * words, 4), *now = calloc(words, 4);
    llm_token toks[4];
    size_t n = 0;
    const char *pieces[4] = {"a", "(", "b", ")"};
    llm_token piece_tok[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(llm_tokenize(g_model, pieces[i], 1, 0, toks, 4, &n), LLM_OK);
        assert_int_equal(n, 1);
        piece_tok[i] = toks[0];
    }
    llmi_gstate *s = NULL;
    assert_int_equal(llmi_gstate_create(g, &s), LLM_OK);
    int depth = 0;
    uint32_t max_nodes = 0;
    for (int i = 0; i < STEPS; i++) {
        /* nest up to 40 deep, then climb out again, with letters between */
        int k = i % 3 == 0 ? 0 : depth < 40 && (i / 200) % 2 == 0 ? 1 : depth > 0 ? 3 : 2;
        if (i >= STEPS - KEEP)
            assert_int_equal(llmi_gstate_fill_mask(s, seen + (size_t)(i - (STEPS - KEEP)) * words),
                             LLM_OK);
        assert_int_equal(llmi_gstate_accept_token(s, piece_tok[k]), LLM_OK);
        depth += k == 1 ? 1 : k == 3 ? -1 : 0;
        if (s->n_nodes > max_nodes)
            max_nodes = s->n_nodes;
    }
    printf("# long rollback: at most %u stack nodes held\n", max_nodes);
    /* 3000 tokens make far more nodes than that: compaction ran */
    assert_true(max_nodes > 1000 && max_nodes <= 4200);
    assert_int_equal(llmi_gstate_rollback_depth(s), KEEP);
    for (int i = KEEP - 1; i >= 0; i--) {
        assert_int_equal(llmi_gstate_rollback(s, 1), LLM_OK);
        assert_int_equal(llmi_gstate_fill_mask(s, now), LLM_OK);
        assert_memory_equal(now, seen + (size_t)i * words, words * 4);
    }
    free(seen);
    free(now);
    llmi_gstate_free(s);
    llmi_grammar_free(g);
}

/* ---- allocation failures ---- */

static void test_alloc_failures(void **state) {
    (void)state;
    const char *json = WALK_GRAMMARS[0];
    bool done = false;
    for (uint64_t k = 1; !done && k < 100000; k++) {
        llmi_grammar *g = NULL;
        llmi_alloc_fail_after(k);
        llm_status st = llmi_grammar_from_schema(json, strlen(json), 1, &g);
        if (st == LLM_OK)
            st = llmi_grammar_bind_vocab(g, g_model->tok);
        llmi_gstate *s = NULL;
        if (st == LLM_OK)
            st = llmi_gstate_create(g, &s);
        uint32_t *mask = NULL;
        if (st == LLM_OK) {
            llmi_alloc_fail_after(0);
            mask = calloc(n_words(g), 4);
            llmi_alloc_fail_after(k > 40 ? k - 40 : 1);
            st = llmi_gstate_fill_mask(s, mask);
            if (st == LLM_OK)
                st = llmi_gstate_accept_bytes(s, "{\"name\":\"", 9);
        }
        llmi_alloc_fail_after(0);
        if (st == LLM_OK && k > 40)
            done = true;
        else if (st != LLM_OK && st != LLM_ERR_OUT_OF_MEMORY)
            fail_msg("k=%llu: %s", (unsigned long long)k, llmi_error_message());
        free(mask);
        llmi_gstate_free(s);
        llmi_grammar_free(g);
    }
    assert_true(done);
}

/* ---- the sampler ---- */

static void test_sampler_masks_first(void **state) {
    (void)state;
    llmi_grammar *g = bound(ebnf("root ::= [0-9]+"));
    uint32_t V = g->n_vocab;
    llmi_sampler sm;
    assert_int_equal(llmi_sampler_init(&sm, V), LLM_OK);
    float *logits = malloc(V * sizeof *logits);
    for (uint32_t i = 0; i < V; i++)
        logits[i] = (float)((i * 2654435761u) % 1000) / 100.0f;
    llmi_gstate *s = NULL;
    assert_int_equal(llmi_gstate_create(g, &s), LLM_OK);
    uint32_t *mask = calloc(n_words(g), 4);
    assert_int_equal(llmi_gstate_fill_mask(s, mask), LLM_OK);
    /* T = 1, no filters: p(t) = softmax over the allowed tokens only */
    llm_sampling_params in, p;
    llm_sampling_params_init(&in);
    in.temperature = 1.0f;
    in.top_k = 0;
    in.top_p = 1.0f;
    in.min_p = 0.0f;
    assert_int_equal(llmi_sampling_params_read(&in, V, &p), LLM_OK);
    sm.grammar = s;
    llmi_candidate *c = NULL;
    uint32_t n = llmi_sample_dist(&sm, logits, &p, NULL, 0, 0, g_model->tok, &c);
    sm.grammar = NULL;
    assert_int_equal(sm.grammar_status, LLM_OK);
    double z = 0.0, max = -INFINITY;
    uint32_t n_allowed = 0;
    for (uint32_t t = 0; t < V; t++)
        if (bit(mask, t)) {
            n_allowed++;
            if (logits[t] > max)
                max = logits[t];
        }
    for (uint32_t t = 0; t < V; t++)
        if (bit(mask, t))
            z += exp(logits[t] - max);
    assert_int_equal(n, n_allowed);
    assert_true(n_allowed >= 10);
    for (uint32_t i = 0; i < n; i++) {
        assert_true(bit(mask, (uint32_t)c[i].id));
        double want = exp(logits[c[i].id] - max) / z;
        assert_true(fabs(c[i].p - want) < 1e-5);
    }
    /* Greedy: the first allowed token of the largest logit (the values
     * repeat, so ties are met), with the mask alone (read straight from
     * the logits) and with a bias on a refused token (through the copy). */
    uint32_t want_best = UINT32_MAX, refused = UINT32_MAX;
    for (uint32_t t = 0; t < V; t++) {
        if (bit(mask, t) && (want_best == UINT32_MAX || logits[t] > logits[want_best]))
            want_best = t;
        if (!bit(mask, t) && refused == UINT32_MAX)
            refused = t;
    }
    llm_logit_bias bias = {(llm_token)refused, 50.0f};
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        in.temperature = 0.0f;
        in.logit_bias = with_bias ? &bias : NULL;
        in.n_logit_bias = with_bias ? 1 : 0;
        assert_int_equal(llmi_sampling_params_read(&in, V, &p), LLM_OK);
        sm.grammar = s;
        n = llmi_sample_dist(&sm, logits, &p, NULL, 0, 0, g_model->tok, &c);
        sm.grammar = NULL;
        assert_int_equal(n, 1);
        assert_int_equal(c[0].id, want_best);
    }
    free(mask);
    free(logits);
    llmi_gstate_free(s);
    llmi_sampler_destroy(&sm);
    llmi_grammar_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ebnf_language),
        cmocka_unit_test(test_ebnf_errors),
        cmocka_unit_test(test_regex),
        cmocka_unit_test(test_schema_language),
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_partial_utf8),
        cmocka_unit_test_setup_teardown(test_mask_walk, setup_model, teardown_model),
        cmocka_unit_test(test_mask_real_vocab),
        cmocka_unit_test_setup_teardown(test_mask_walk_fallback, setup_model, teardown_model),
        cmocka_unit_test(test_mask_real_vocab_fallback),
        cmocka_unit_test_setup_teardown(test_fork_rollback, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_long_rollback, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_alloc_failures, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_posmask_complete, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_posmask_limits, setup_model, teardown_model),
        cmocka_unit_test_setup_teardown(test_sampler_masks_first, setup_model, teardown_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
