/* Black-box tests of model loading, info, tokenizer and generation through
 * llm.h and the shared library, on the real SmolLM2 model. */
#include <llm.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static const char *model_path(void) { return getenv("LLM_TEST_MODEL"); }

static int load_model(void **state) {
    const char *path = model_path();
    if (!path) {
        fprintf(stderr, "LLM_TEST_MODEL is not set (make test sets it)\n");
        return -1;
    }
    llm_model *m = NULL;
    llm_status st = llm_model_load(path, NULL, &m);
    if (st != LLM_OK) {
        fprintf(stderr, "load failed: %s %s\n", llm_status_name(st), llm_last_error());
        return -1;
    }
    *state = m;
    return 0;
}

static int free_model(void **state) {
    llm_model_free(*state);
    return 0;
}

/* Writes `n` bytes of the model file, then `patch` at `patch_at`, to a temp file. */
static char *write_variant(size_t n, size_t patch_at, const void *patch, size_t patch_len) {
    static char path[512];
    const char *tmp = getenv("LLM_TEST_TMP");
    snprintf(path, sizeof path, "%s/variant.gguf", tmp ? tmp : "/tmp");
    FILE *in = fopen(model_path(), "rb");
    FILE *out = fopen(path, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char *buf = malloc(n ? n : 1);
    assert_int_equal(fread(buf, 1, n, in), n);
    if (patch)
        memcpy(buf + patch_at, patch, patch_len);
    assert_int_equal(fwrite(buf, 1, n, out), n);
    free(buf);
    fclose(in);
    fclose(out);
    return path;
}

static void expect_load_fails(const char *path, llm_status want, const char *substr) {
    llm_model *m = (llm_model *)0x1;
    llm_status st = llm_model_load(path, NULL, &m);
    if (st != want || !strstr(llm_last_error(), substr))
        fail_msg("got %s '%s', want %s containing '%s'", llm_status_name(st), llm_last_error(),
                 llm_status_name(want), substr);
    assert_null(m);
}

static void test_status_strings(void **state) {
    (void)state;
    assert_string_equal(llm_status_name(LLM_ERR_LIMIT), "LLM_ERR_LIMIT");
    assert_string_equal(llm_status_str(LLM_OK), "success");
    assert_string_equal(llm_status_name((llm_status)999), "LLM_STATUS_UNKNOWN");
    assert_non_null(llm_status_str((llm_status)-5));
}

static void test_load_errors(void **state) {
    (void)state;
    llm_model *m = NULL;
    assert_int_equal(llm_model_load(NULL, NULL, &m), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_model_load("x", NULL, NULL), LLM_ERR_INVALID_ARGUMENT);
    expect_load_fails("/nonexistent/model.gguf", LLM_ERR_IO, "/nonexistent/model.gguf");
    expect_load_fails(write_variant(0, 0, NULL, 0), LLM_ERR_BAD_FORMAT, "truncated");
    expect_load_fails(write_variant(3, 0, NULL, 0), LLM_ERR_BAD_FORMAT, "truncated");
    expect_load_fails(write_variant(4096, 0, "GGML", 4), LLM_ERR_BAD_FORMAT, "magic");
    uint32_t v1 = 1, v9 = 9;
    expect_load_fails(write_variant(4096, 4, &v1, 4), LLM_ERR_UNSUPPORTED, "version");
    expect_load_fails(write_variant(4096, 4, &v9, 4), LLM_ERR_UNSUPPORTED, "version");
    /* Metadata intact but tensor data cut off. */
    expect_load_fails(write_variant(4 << 20, 0, NULL, 0), LLM_ERR_BAD_FORMAT, "");
    uint64_t huge = UINT64_MAX / 2;
    expect_load_fails(write_variant(4096, 8, &huge, 8), LLM_ERR_BAD_FORMAT, "");
    /* Bad struct_size. */
    llm_model_params p;
    llm_model_params_init(&p);
    p.struct_size = 0;
    assert_int_equal(llm_model_load(model_path(), &p, &m), LLM_ERR_INVALID_ARGUMENT);
    assert_null(m);
}

static void test_info(void **state) {
    llm_model *m = *state;
    llm_model_info info = {sizeof info};
    assert_int_equal(llm_model_get_info(m, &info), LLM_OK);
    assert_string_equal(info.architecture, "llama");
    assert_int_equal(info.n_layers, 30);
    assert_int_equal(info.n_embd, 576);
    assert_int_equal(info.n_heads, 9);
    assert_int_equal(info.n_kv_heads, 3);
    assert_int_equal(info.n_ff, 1536);
    assert_int_equal(info.n_vocab, 49152);
    assert_int_equal(info.n_ctx_train, 8192);
    assert_true(info.has_chat_template);
    assert_true(info.n_params > 130000000 && info.n_params < 140000000);
    /* An older caller that knows only the first fields gets only those. */
    struct {
        uint32_t struct_size;
        const char *arch;
        uint64_t canary;
    } small;
    memset(&small, 0xab, sizeof small);
    small.struct_size = (uint32_t)offsetof(llm_model_info, name);
    assert_int_equal(llm_model_get_info(m, (llm_model_info *)&small), LLM_OK);
    assert_string_equal(small.arch, "llama");
    assert_true(small.canary == 0xababababababababull);
    assert_int_equal(llm_model_get_info(NULL, &info), LLM_ERR_INVALID_ARGUMENT);
    info.struct_size = 0;
    assert_int_equal(llm_model_get_info(m, &info), LLM_ERR_INVALID_ARGUMENT);
}

static void test_tokenize_errors(void **state) {
    llm_model *m = *state;
    llm_token toks[64];
    size_t n = 99;
    assert_int_equal(llm_tokenize(m, "hello world", 11, 0, toks, 64, &n), LLM_OK);
    assert_true(n >= 2);
    size_t need = n;
    assert_int_equal(llm_tokenize(m, "hello world", 11, 0, NULL, 0, &n), LLM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, need);
    assert_int_equal(llm_tokenize(m, "hello world", 11, 0, toks, 1, &n), LLM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(llm_tokenize(m,
                                  "a\xff"
                                  "b",
                                  3, 0, toks, 64, &n),
                     LLM_ERR_INVALID_UTF8);
    assert_non_null(strstr(llm_last_error(), "1"));
    assert_int_equal(llm_tokenize(m, "\xc3", 1, 0, toks, 64, &n), LLM_ERR_INVALID_UTF8);
    assert_int_equal(llm_tokenize(m, NULL, 4, 0, toks, 64, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_tokenize(NULL, "a", 1, 0, toks, 64, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_tokenize(m, "a", 1, 0, NULL, 5, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_tokenize(m, "a", 1, 0x80, toks, 64, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_tokenize(m, "", 0, 0, toks, 64, &n), LLM_OK);
    assert_int_equal(n, 0);
}

static void test_detokenize(void **state) {
    llm_model *m = *state;
    const char *text = "Héllo, 世界! 🙂 code:\n\tint x = 42;";
    llm_token toks[128];
    size_t n = 0, len = 0;
    assert_int_equal(llm_tokenize(m, text, strlen(text), 0, toks, 128, &n), LLM_OK);
    char buf[256];
    assert_int_equal(llm_detokenize(m, toks, n, 0, buf, sizeof buf, &len), LLM_OK);
    assert_string_equal(buf, text);
    assert_int_equal(len, strlen(text));
    /* Too small: the size reported is what the buffer must hold (text and
     * NUL), so allocating it and calling again succeeds. */
    assert_int_equal(llm_detokenize(m, toks, n, 0, buf, len, &len), LLM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(len, strlen(text) + 1);
    assert_int_equal(llm_detokenize(m, toks, n, 0, buf, len, &len), LLM_OK);
    assert_string_equal(buf, text);
    llm_token bad = 1 << 30;
    assert_int_equal(llm_detokenize(m, &bad, 1, 0, buf, sizeof buf, &len),
                     LLM_ERR_INVALID_ARGUMENT);
    /* Streaming gives the same bytes, and each piece is whole UTF-8. */
    llm_detokenizer *d = NULL;
    assert_int_equal(llm_detokenizer_create(m, 0, &d), LLM_OK);
    char joined[256] = "";
    for (size_t i = 0; i < n; i++) {
        char piece[64];
        size_t pl = 0;
        assert_int_equal(llm_detokenizer_push(d, toks[i], piece, sizeof piece, &pl), LLM_OK);
        assert_int_equal(strlen(piece), pl);
        strcat(joined, piece);
    }
    size_t fl = 0;
    char rest[16];
    assert_int_equal(llm_detokenizer_flush(d, rest, sizeof rest, &fl), LLM_OK);
    assert_int_equal(fl, 0);
    assert_string_equal(joined, text);
    llm_detokenizer_free(d);
    llm_detokenizer_free(NULL);
}

static void test_chat_template(void **state) {
    llm_model *m = *state;
    llm_chat_message msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char buf[512];
    size_t n = 0;
    assert_int_equal(llm_chat_template_apply(m, msgs, 2, true, buf, sizeof buf, &n), LLM_OK);
    assert_string_equal(buf, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                             "<|im_end|>\n<|im_start|>assistant\n");
    assert_int_equal(llm_chat_template_apply(m, msgs, 2, true, buf, 10, &n),
                     LLM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, strlen("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                               "<|im_end|>\n<|im_start|>assistant\n") +
                            1);
    char *exact = malloc(n);
    assert_non_null(exact);
    assert_int_equal(llm_chat_template_apply(m, msgs, 2, true, exact, n, &n), LLM_OK);
    assert_string_equal(exact, buf);
    free(exact);
    llm_chat_message bad = {NULL, "x"};
    assert_int_equal(llm_chat_template_apply(m, &bad, 1, true, buf, sizeof buf, &n),
                     LLM_ERR_INVALID_ARGUMENT);
}

/* llm_chat_apply: the JSON-level call renders what llm_chat_template_apply
 * renders for plain messages, and carries what the old struct cannot:
 * multi-part content, tool calls, tools, documents, extra variables and a
 * template of the caller's. */
static void test_chat_apply(void **state) {
    llm_model *m = *state;
    const char *tmpl = NULL;
    assert_int_equal(llm_model_chat_template(m, NULL, &tmpl), LLM_OK);
    assert_non_null(tmpl);
    const char *same = NULL, *none = "x";
    assert_int_equal(llm_model_chat_template(m, "default", &same), LLM_OK);
    assert_ptr_equal(same, tmpl);
    assert_int_equal(llm_model_chat_template(m, "tool_use", &none), LLM_OK);
    assert_null(none);
    assert_non_null(strstr(tmpl, "<|im_start|>"));
    llm_chat_params p;
    llm_chat_params_init(&p);
    assert_int_equal(p.struct_size, sizeof p);
    assert_true(p.add_generation_prompt);
    p.messages_json = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                      "{\"role\": \"user\", \"content\": \"Hi\"}]";
    char buf[1024], old[1024];
    size_t n = 0, n_old = 0;
    llm_chat_message msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    assert_int_equal(llm_chat_template_apply(m, msgs, 2, true, old, sizeof old, &n_old), LLM_OK);
    llm_status st_ = llm_chat_apply(m, &p, buf, sizeof buf, &n);
    if (st_ != LLM_OK)
        fail_msg("llm_chat_apply: %d %s", (int)st_, llm_last_error());
    assert_int_equal(n, n_old);
    assert_string_equal(buf, old);
    /* sizing: NULL/0 reports the capacity needed, NUL included */
    assert_int_equal(llm_chat_apply(m, &p, NULL, 0, &n), LLM_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, n_old + 1);

    p.template_text =
        "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}"
        "{% else %}{{ m.content | map(attribute='text') | join }}{% endif %}"
        "{% for c in m.tool_calls | default([]) %}<{{ c.function.name }} "
        "{{ c.function.arguments | tojson }}>{% endfor %};{% endfor %}"
        "{{ tools | map(attribute='function.name') | join(',') }}|{{ documents | length }}|"
        "{{ enable_thinking }}|{{ bos_token }}|{{ add_generation_prompt }}";
    p.messages_json = "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                      "\"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}, {\"role\": "
                      "\"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": "
                      "\"function\", \"function\": {\"name\": \"f\", \"arguments\": "
                      "{\"x\": 1}}}]}, {\"role\": \"tool\", \"content\": \"ok\"}]";
    p.tools_json = "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, "
                   "{\"function\": {\"name\": \"g\"}}]";
    p.documents_json = "[{\"text\": \"d1\"}]";
    p.variables_json = "{\"enable_thinking\": false, \"bos_token\": \"<B>\"}";
    p.add_generation_prompt = false;
    assert_int_equal(llm_chat_apply(m, &p, buf, sizeof buf, &n), LLM_OK);
    assert_string_equal(buf, "user:ab;assistant:<f {\"x\": 1}>;tool:ok;f,g|1|False|<B>|False");

    /* continue_final_message: the text stops where the last message ends */
    llm_chat_params cont = p;
    cont.template_text = NULL;
    cont.tools_json = cont.documents_json = cont.variables_json = NULL;
    cont.messages_json = "[{\"role\": \"user\", \"content\": \"2+2?\"}, {\"role\": "
                         "\"assistant\", \"content\": \"It is \"}]";
    cont.continue_final_message = true;
    assert_int_equal(llm_chat_apply(m, &cont, buf, sizeof buf, &n), LLM_OK);
    assert_int_equal(n, strlen(buf));
    assert_true(n > 20 && strcmp(buf + n - 20, "assistant\nIt is <|im") != 0);
    assert_string_equal(buf + n - strlen("<|im_start|>assistant\nIt is "),
                        "<|im_start|>assistant\nIt is ");
    cont.add_generation_prompt = true;
    assert_int_equal(llm_chat_apply(m, &cont, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "exclude each other"));

    /* bad input names what is wrong */
    llm_chat_params bad = p;
    bad.variables_json = "{\"messages\": []}";
    assert_int_equal(llm_chat_apply(m, &bad, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "messages"));
    bad = p;
    bad.tools_json = "[{\"unterminated\": ";
    assert_int_equal(llm_chat_apply(m, &bad, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "tools_json is not valid JSON"));
    bad = p;
    bad.messages_json = "[{\"content\": \"no role\"}]";
    assert_int_equal(llm_chat_apply(m, &bad, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "message 0"));
    bad = p;
    bad.messages_json = NULL;
    assert_int_equal(llm_chat_apply(m, &bad, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT);
    bad = p;
    bad.template_text = "{% if %}";
    assert_int_equal(llm_chat_apply(m, &bad, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "line 1:7"));
    bad = p;
    bad.template_text = "{{ raise_exception('no tools here') }}";
    assert_int_equal(llm_chat_apply(m, &bad, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "no tools here"));
    bad = p;
    bad.struct_size = 2;
    assert_int_equal(llm_chat_apply(m, &bad, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_chat_apply(m, NULL, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_model_chat_template(m, NULL, NULL), LLM_ERR_INVALID_ARGUMENT);
    bad = p;
    bad.template_text = NULL;
    bad.template_name = "nope";
    assert_int_equal(llm_chat_apply(m, &bad, buf, sizeof buf, &n), LLM_ERR_NOT_FOUND);
    assert_non_null(strstr(llm_last_error(), "'nope'"));
}

/* ---- generation ---- */

typedef struct collected {
    llm_token toks[512];
    size_t n;
    char text[4096];
    size_t stop_after;
} collected;

static bool collect(llm_token tok, const char *piece, size_t len, void *user) {
    collected *c = user;
    if (tok != LLM_TOKEN_NONE)
        c->toks[c->n++] = tok;
    strncat(c->text, piece, len);
    return c->stop_after == 0 || c->n < c->stop_after;
}

static llm_status run_generate(llm_model *m, uint32_t threads, const char *prompt,
                               const llm_sampling_params *sp, uint32_t max_new, collected *c,
                               llm_generate_result *res) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = threads;
    p.n_ctx = 512;
    llm_session *s = NULL;
    llm_status st = llm_session_create(m, &p, &s);
    if (st != LLM_OK)
        return st;
    llm_token toks[256];
    size_t n = 0;
    st = llm_tokenize(m, prompt, strlen(prompt), LLM_TOKENIZE_PARSE_SPECIAL, toks, 256, &n);
    if (st == LLM_OK) {
        llm_generate_params gp;
        llm_generate_params_init(&gp);
        gp.max_new_tokens = max_new;
        gp.sampling = sp;
        gp.on_token = collect;
        gp.user = c;
        st = llm_generate(s, toks, n, &gp, res);
    }
    llm_session_free(s);
    return st;
}

static void test_generate_greedy_threads(void **state) {
    llm_model *m = *state;
    collected a = {0}, b = {0};
    llm_generate_result ra = {sizeof ra}, rb = {sizeof rb};
    const char *prompt = "The capital of France is";
    assert_int_equal(run_generate(m, 1, prompt, NULL, 16, &a, &ra), LLM_OK);
    assert_int_equal(run_generate(m, 2, prompt, NULL, 16, &b, &rb), LLM_OK);
    assert_int_equal(ra.n_generated_tokens, 16);
    assert_int_equal(ra.finish_reason, LLM_FINISH_LENGTH);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.toks, b.toks, a.n * sizeof a.toks[0]);
    assert_string_equal(a.text, b.text);
    assert_non_null(strstr(a.text, "Paris"));
}

static void test_generate_sampling_seeded(void **state) {
    llm_model *m = *state;
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.temperature = 1.0f;
    sp.seed = 1234;
    collected a = {0}, b = {0}, c = {0};
    llm_generate_result r = {sizeof r};
    assert_int_equal(run_generate(m, 2, "Once upon a time", &sp, 24, &a, &r), LLM_OK);
    assert_int_equal(run_generate(m, 1, "Once upon a time", &sp, 24, &b, &r), LLM_OK);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.toks, b.toks, a.n * sizeof a.toks[0]);
    sp.seed = 99;
    assert_int_equal(run_generate(m, 2, "Once upon a time", &sp, 24, &c, &r), LLM_OK);
    assert_true(c.n != a.n || memcmp(a.toks, c.toks, a.n * sizeof a.toks[0]) != 0);
}

static void test_generate_stop_and_limits(void **state) {
    llm_model *m = *state;
    collected c = {0};
    c.stop_after = 3;
    llm_generate_result r = {sizeof r};
    assert_int_equal(run_generate(m, 2, "Hello", NULL, 50, &c, &r), LLM_OK);
    assert_int_equal(r.finish_reason, LLM_FINISH_CANCELLED);
    assert_int_equal(c.n, 3);
    /* Chat prompt: the model answers and ends its turn with <|im_end|>. */
    collected d = {0};
    assert_int_equal(run_generate(m, 2,
                                  "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
                                  NULL, 200, &d, &r),
                     LLM_OK);
    assert_int_equal(r.finish_reason, LLM_FINISH_EOS);
    assert_null(strstr(d.text, "<|im_end|>"));

    llm_session_params p;
    llm_session_params_init(&p);
    p.n_ctx = 8;
    p.n_threads = 1;
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(m, &p, &s), LLM_OK);
    llm_token toks[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(llm_generate(s, toks, 9, NULL, NULL), LLM_ERR_LIMIT);
    assert_non_null(strstr(llm_last_error(), "9"));
    assert_non_null(strstr(llm_last_error(), "8"));
    assert_int_equal(llm_generate(s, toks, 0, NULL, NULL), LLM_ERR_INVALID_ARGUMENT);
    llm_token bad = 49152;
    assert_int_equal(llm_generate(s, &bad, 1, NULL, NULL), LLM_ERR_INVALID_ARGUMENT);
    /* Context fills up: generation ends with LENGTH, not an error. */
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 100;
    gp.ignore_eos = true;
    r.finish_reason = LLM_FINISH_NONE;
    assert_int_equal(llm_generate(s, toks, 4, &gp, &r), LLM_OK);
    assert_int_equal(r.finish_reason, LLM_FINISH_LENGTH);
    /* Prompt and generated tokens together fill at most n_ctx, as for a
     * request: 4 + 4 = 8. */
    assert_int_equal(r.n_generated_tokens, 4);
    llm_sampling_params sp;
    llm_sampling_params_init(&sp);
    sp.top_p = 0.0f;
    gp.sampling = &sp;
    assert_int_equal(llm_generate(s, toks, 4, &gp, &r), LLM_ERR_INVALID_ARGUMENT);
    llm_session_free(s);

    llm_session_params_init(&p);
    p.kv_cache_bytes = 1;
    assert_int_equal(llm_session_create(m, &p, &s), LLM_ERR_LIMIT);
    assert_null(s);
    /* K/V in f16 and bf16: half the bytes per token, the same answer. */
    const llm_kv_type half_types[] = {LLM_KV_F16, LLM_KV_BF16};
    for (size_t t = 0; t < 2; t++) {
        llm_session_params_init(&p);
        p.kv_type = half_types[t];
        p.n_ctx = 64;
        p.n_threads = 2;
        assert_int_equal(llm_session_create(m, &p, &s), LLM_OK);
        const char *france = "The capital of France is";
        llm_token ft[32];
        size_t nf = 0;
        assert_int_equal(llm_tokenize(m, france, strlen(france), 0, ft, 32, &nf), LLM_OK);
        collected out;
        memset(&out, 0, sizeof out);
        llm_generate_params fg;
        llm_generate_params_init(&fg);
        fg.max_new_tokens = 8;
        fg.on_token = collect;
        fg.user = &out;
        llm_generate_result fr = {sizeof fr};
        assert_int_equal(llm_generate(s, ft, nf, &fg, &fr), LLM_OK);
        printf("# kv_type %d: \"%s\"\n", (int)half_types[t], out.text);
        assert_non_null(strstr(out.text, "Paris"));
        llm_session_free(s);
    }
    llm_session_params_init(&p);
    p.kv_type = (llm_kv_type)6; /* past the last llm_kv_type */
    assert_int_equal(llm_session_create(m, &p, &s), LLM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(llm_last_error(), "kv_type 6"));
    p.kv_type = (llm_kv_type)-1;
    assert_int_equal(llm_session_create(m, &p, &s), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llm_session_create(NULL, NULL, &s), LLM_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_tokenize_errors),
        cmocka_unit_test(test_detokenize),
        cmocka_unit_test(test_chat_template),
        cmocka_unit_test(test_chat_apply),
        cmocka_unit_test(test_generate_greedy_threads),
        cmocka_unit_test(test_generate_sampling_seeded),
        cmocka_unit_test(test_generate_stop_and_limits),
    };
    return cmocka_run_group_tests(tests, load_model, free_model);
}
