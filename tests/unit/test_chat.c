/* Chat templates, run by the Jinja interpreter: ChatML (plain and
 * SmolLM2's, which adds a default system message) and Llama 3, rendered
 * exactly as Jinja renders the templates
 * (expected strings from jinja2 3.1.6 on the same templates), generation
 * prompts, unsupported or missing templates, argument and buffer errors.
 * Every recognised family is compared byte for byte with what jinja2 renders
 * from the models' own templates (tests/models/gen_chat_templates.py writes
 * the conversations and the expected texts into $LLM_TEST_MODELS/chat/).
 * Tokenizers are built in memory with the GGUF writer; the real model's
 * template is checked too when LLM_TEST_MODEL names a readable file. */
#include "core/core.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define OK(expr) assert_int_equal((expr), LLM_OK)

#define EXPECT_ERR(expr, status, substr)                                                           \
    do {                                                                                           \
        llm_status st_ = (expr);                                                                   \
        if (st_ != (status) || !strstr(llmi_error_message(), (substr)))                            \
            fail_msg("%s: got %d \"%s\", want %d containing \"%s\"", #expr, (int)st_,              \
                     llmi_error_message(), (int)(status), substr);                                 \
    } while (0)

/* tokenizer.chat_template of SmolLM2-135M-Instruct */
static const char smol_tmpl[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";
/* a plain ChatML template (escaped newlines, as most tokenizer configs have) */
static const char chatml_tmpl[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";
/* Meta-Llama-3-8B-Instruct */
static const char llama3_tmpl[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/* A SentencePiece vocabulary whose BOS (id 1) and EOS (id 2) have the given
 * texts, with `tmpl` as tokenizer.chat_template (none when NULL). */
static llmi_tokenizer *make_with(const char *tmpl, const char *bos, const char *eos) {
    const char *const tokens[] = {"<unk>", bos, eos, "a", "b"};
    static const int32_t types[] = {LLMI_TOKTYPE_UNKNOWN, LLMI_TOKTYPE_CONTROL,
                                    LLMI_TOKTYPE_CONTROL, LLMI_TOKTYPE_NORMAL, LLMI_TOKTYPE_NORMAL};
    llmi_gguf_writer *w;
    void *data;
    size_t size;
    llmi_gguf *g;
    llmi_tokenizer *t;
    OK(llmi_gguf_writer_create(&w));
    OK(llmi_gguf_w_str(w, "tokenizer.ggml.model", "llama"));
    OK(llmi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, 5));
    OK(llmi_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, 5));
    OK(llmi_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1));
    OK(llmi_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2));
    if (tmpl)
        OK(llmi_gguf_w_str(w, "tokenizer.chat_template", tmpl));
    OK(llmi_gguf_writer_to_memory(w, &data, &size));
    llmi_gguf_writer_free(w);
    OK(llmi_gguf_open_memory(data, size, &g));
    OK(llmi_tokenizer_load(g, &t));
    llmi_gguf_close(g);
    llmi_free(data);
    return t;
}
static llmi_tokenizer *make(const char *tmpl) {
    return make_with(tmpl, "<|begin_of_text|>", "</s>");
}

static const llm_chat_message user_only[] = {{"user", "Hello!"}};
static const llm_chat_message sys_user[] = {{"system", "Be brief."}, {"user", "Hi"}};
static const llm_chat_message multi[] = {
    {"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "  and 3+3? \n"}};

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void expect(const llmi_tokenizer *t, const llm_chat_message *m, size_t n, bool gen,
                   const char *want) {
    char buf[1024];
    size_t len = 0;
    llm_status st = llmi_chat_apply(t, m, n, gen, buf, sizeof buf, &len);
    if (st != LLM_OK)
        fail_msg("chat_apply: %d %s", (int)st, llmi_error_message());
    assert_int_equal(len, strlen(want));
    assert_string_equal(buf, want);
}

#define SMOL_SYS                                                                                   \
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "         \
    "Face<|im_end|>\n"

static void test_smollm2(void **state) {
    (void)state;
    llmi_tokenizer *t = make(smol_tmpl);
    expect(t, user_only, 1, false, SMOL_SYS "<|im_start|>user\nHello!<|im_end|>\n");
    expect(t, user_only, 1, true,
           SMOL_SYS "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
    expect(t, sys_user, 2, false,
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    expect(t, sys_user, 2, true,
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
           "<|im_start|>assistant\n");
    expect(t, multi, 3, true,
           SMOL_SYS "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
                    "<|im_start|>user\n  and 3+3? \n<|im_end|>\n<|im_start|>assistant\n");
    expect(t, NULL, 0, false, "");
    expect(t, NULL, 0, true, "<|im_start|>assistant\n");
    llmi_tokenizer_free(t);
}

static void test_chatml(void **state) {
    (void)state;
    llmi_tokenizer *t = make(chatml_tmpl);
    expect(t, user_only, 1, false, "<|im_start|>user\nHello!<|im_end|>\n");
    expect(t, user_only, 1, true, "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
    expect(t, sys_user, 2, true,
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
           "<|im_start|>assistant\n");
    expect(t, multi, 3, false,
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
           "<|im_start|>user\n  and 3+3? \n<|im_end|>\n");
    expect(t, NULL, 0, true, "<|im_start|>assistant\n");
    llmi_tokenizer_free(t);
}

static void test_llama3(void **state) {
    (void)state;
    llmi_tokenizer *t = make(llama3_tmpl);
    expect(t, user_only, 1, false,
           "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>");
    expect(t, user_only, 1, true,
           "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect(t, sys_user, 2, false,
           "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
    /* content is trimmed (Jinja's trim) */
    expect(t, multi, 3, true,
           "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nand 3+3?<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    static const llm_chat_message unicode_ws[] = {{"user", "\xe3\x80\x80\xc2\xa0 x \xe2\x80\x83"}};
    expect(t, unicode_ws, 1, false,
           "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
    /* no message, no bos_token (it is added with the first message) */
    expect(t, NULL, 0, false, "");
    expect(t, NULL, 0, true, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    llmi_tokenizer_free(t);
}

/* Any template runs as Jinja now: those no family matches render, template
 * errors are the template's; a template that is a family's name uses the
 * built-in renderer; no template at all is unsupported. */
static void test_any_template(void **state) {
    (void)state;
    char buf[256];
    size_t n;
    llmi_tokenizer *t = make(NULL);
    assert_null(llmi_tokenizer_chat_template(t));
    EXPECT_ERR(llmi_chat_apply(t, user_only, 1, true, buf, sizeof buf, &n), LLM_ERR_UNSUPPORTED,
               "no chat template");
    llmi_tokenizer_free(t);
    t = make("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}");
    expect(t, user_only, 1, true, "[INST] Hello! [/INST]");
    llmi_tokenizer_free(t);
    /* Phi-4's <|im_sep|>, bos_token and eos_token from the vocabulary, tools
     * and documents None as transformers passes them */
    t = make("{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m.role + '<|im_sep|>' + "
             "m.content + '<|im_end|>' }}{% endfor %}{{ eos_token }}{{ tools }}{{ documents is "
             "none }}");
    expect(t, sys_user, 2, false,
           "<|begin_of_text|><|im_start|>system<|im_sep|>Be brief.<|im_end|><|im_start|>user"
           "<|im_sep|>Hi<|im_end|></s>NoneTrue");
    llmi_tokenizer_free(t);
    /* what the template raises, and its syntax errors, are the caller's */
    t = make("{% if messages[0].role != 'system' %}{{ raise_exception('System first!') }}"
             "{% endif %}");
    EXPECT_ERR(llmi_chat_apply(t, user_only, 1, true, buf, sizeof buf, &n),
               LLM_ERR_INVALID_ARGUMENT, "System first!");
    llmi_tokenizer_free(t);
    t = make("{% for m in messages %}\n{{ m.content + }}{% endfor %}");
    EXPECT_ERR(llmi_chat_apply(t, user_only, 1, true, buf, sizeof buf, &n),
               LLM_ERR_INVALID_ARGUMENT, "line 2:");
    llmi_tokenizer_free(t);
    t = make("{% for m in messages %}{% for x in range(1000000) %}{{ x }}{% endfor %}{% endfor %}");
    EXPECT_ERR(llmi_chat_apply(t, user_only, 1, true, buf, sizeof buf, &n), LLM_ERR_LIMIT,
               "loop iterations");
    llmi_tokenizer_free(t);
    /* a family's name runs the built-in renderer */
    t = make("chatml");
    expect(t, user_only, 1, true, "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
    llmi_tokenizer_free(t);
    t = make("llama3");
    expect(t, user_only, 1, false,
           "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>");
    llmi_tokenizer_free(t);
}

/* Named templates (tokenizer.chat_template.<name>): chosen by name, and
 * "tool_use" by default for a call with tools, as transformers chooses. */
static void test_named_templates(void **state) {
    (void)state;
    llmi_gguf_writer *w;
    void *data;
    size_t size;
    llmi_gguf *g;
    llmi_tokenizer *t;
    const char *const tokens[] = {"<unk>", "<s>", "</s>", "a", "b"};
    OK(llmi_gguf_writer_create(&w));
    OK(llmi_gguf_w_str(w, "tokenizer.ggml.model", "llama"));
    OK(llmi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, 5));
    OK(llmi_gguf_w_str(w, "tokenizer.chat_template", "default:{{ messages | length }}"));
    OK(llmi_gguf_w_str(w, "tokenizer.chat_template.tool_use", "tools:{{ tools | length }}"));
    OK(llmi_gguf_w_str(w, "tokenizer.chat_template.rag", "rag:{{ documents[0].text }}"));
    OK(llmi_gguf_writer_to_memory(w, &data, &size));
    llmi_gguf_writer_free(w);
    OK(llmi_gguf_open_memory(data, size, &g));
    OK(llmi_tokenizer_load(g, &t));
    llmi_gguf_close(g);
    llmi_free(data);
    assert_string_equal(llmi_tokenizer_chat_template_named(t, "rag"),
                        "rag:{{ documents[0].text }}");
    assert_null(llmi_tokenizer_chat_template_named(t, "missing"));
    llm_chat_params p = {.struct_size = sizeof p, .messages_json = "[{\"role\": \"user\"}]"};
    char buf[64];
    size_t n;
    OK(llmi_chat_apply_json(t, &p, buf, sizeof buf, &n));
    assert_string_equal(buf, "default:1");
    p.tools_json = "[{}, {}]";
    OK(llmi_chat_apply_json(t, &p, buf, sizeof buf, &n));
    assert_string_equal(buf, "tools:2");
    p.template_name = "default";
    OK(llmi_chat_apply_json(t, &p, buf, sizeof buf, &n));
    assert_string_equal(buf, "default:1");
    p.template_name = "rag";
    p.documents_json = "[{\"text\": \"d\"}]";
    OK(llmi_chat_apply_json(t, &p, buf, sizeof buf, &n));
    assert_string_equal(buf, "rag:d");
    p.template_name = "missing";
    EXPECT_ERR(llmi_chat_apply_json(t, &p, buf, sizeof buf, &n), LLM_ERR_NOT_FOUND, "'missing'");
    p.template_text = "text:{{ 1 }}"; /* text wins over a name */
    OK(llmi_chat_apply_json(t, &p, buf, sizeof buf, &n));
    assert_string_equal(buf, "text:1");
    /* a built-in family's name renders plain messages only */
    p.template_text = "chatml";
    p.tools_json = p.documents_json = NULL;
    p.messages_json = "[{\"role\": \"user\", \"content\": \"Hi\"}]";
    OK(llmi_chat_apply_json(t, &p, buf, sizeof buf, &n));
    assert_string_equal(buf, "<|im_start|>user\nHi<|im_end|>\n");
    p.messages_json = "[{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]";
    EXPECT_ERR(llmi_chat_apply_json(t, &p, buf, sizeof buf, &n), LLM_ERR_UNSUPPORTED,
               "string contents");
    llmi_tokenizer_free(t);
}

static void test_errors_and_buffers(void **state) {
    (void)state;
    llmi_tokenizer *t = make(chatml_tmpl);
    static const char want[] = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n";
    const size_t len = sizeof want - 1;
    char buf[128];
    size_t n = 0;
    /* The reported size is what the buffer must hold: the text and its NUL. */
    EXPECT_ERR(llmi_chat_apply(t, user_only, 1, true, buf, len, &n), LLM_ERR_BUFFER_TOO_SMALL, "");
    assert_int_equal(n, len + 1);
    n = 0;
    EXPECT_ERR(llmi_chat_apply(t, user_only, 1, true, NULL, 0, &n), LLM_ERR_BUFFER_TOO_SMALL, "");
    assert_int_equal(n, len + 1);
    OK(llmi_chat_apply(t, user_only, 1, true, buf, len + 1, &n));
    assert_int_equal(n, len);
    assert_string_equal(buf, want);

    static const llm_chat_message no_role[] = {{NULL, "x"}};
    static const llm_chat_message no_content[] = {{"user", NULL}};
    static const llm_chat_message bad_utf8[] = {{"user", "ok \xc3("}};
    EXPECT_ERR(llmi_chat_apply(t, no_role, 1, true, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT,
               "NULL role");
    EXPECT_ERR(llmi_chat_apply(t, no_content, 1, true, buf, sizeof buf, &n),
               LLM_ERR_INVALID_ARGUMENT, "NULL content");
    EXPECT_ERR(llmi_chat_apply(t, NULL, 2, true, buf, sizeof buf, &n), LLM_ERR_INVALID_ARGUMENT,
               "messages");
    EXPECT_ERR(llmi_chat_apply(t, user_only, 1, true, NULL, 8, &n), LLM_ERR_INVALID_ARGUMENT,
               "buffer");
    EXPECT_ERR(llmi_chat_apply(t, user_only, 1, true, buf, sizeof buf, NULL),
               LLM_ERR_INVALID_ARGUMENT, "");
    EXPECT_ERR(llmi_chat_apply(t, bad_utf8, 1, true, buf, sizeof buf, &n), LLM_ERR_INVALID_UTF8,
               "byte 3");
    llmi_tokenizer_free(t);
}

/* --- every family against jinja2 (gen_chat_templates.py) --------------- */

/* The families gen_chat_templates.py renders; a missing file fails. */
static const char *const families[] = {
    "chatml", "smollm2", "qwen2",      "qwen2.5",           "qwen3",      "llama3", "llama2",
    "gemma2", "gemma3",  "mistral-v1", "mistral-v1-system", "mistral-v3", "phi3",   "phi3-early",
};

#define MAX_MSGS 8

/* Decodes the hex text of a line's field into a new NUL-terminated string. */
static char *unhex(const char *h, size_t n) {
    assert_true(n % 2 == 0);
    char *s = malloc(n / 2 + 1);
    assert_non_null(s);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        assert_int_equal(sscanf(h + 2 * i, "%2x", &v), 1);
        s[i] = (char)v;
    }
    s[n / 2] = '\0';
    return s;
}

/* The next space-separated field of *p (a line without its newline). */
static char *field(const char **p, const char *end) {
    const char *b = *p;
    while (*p < end && **p != ' ')
        (*p)++;
    size_t n = (size_t)(*p - b);
    if (*p < end)
        (*p)++;
    return unhex(b, n);
}

typedef struct chat_case {
    char name[64];
    bool gen;
    size_t n;
    llm_chat_message m[MAX_MSGS];
} chat_case;

static void free_case(chat_case *c) {
    for (size_t i = 0; i < c->n; i++) {
        free((char *)c->m[i].role);
        free((char *)c->m[i].content);
    }
    c->n = 0;
}

/* Renders one case and compares it with the template's own outcome. */
static void check_case(const char *family, const llmi_tokenizer *t, const chat_case *c,
                       bool rejected, const char *want) {
    size_t need = 0;
    llm_status st = llmi_chat_apply(t, c->m, c->n, c->gen, NULL, 0, &need);
    if (rejected) {
        if (st != LLM_ERR_INVALID_ARGUMENT || !strstr(llmi_error_message(), "template"))
            fail_msg("%s/%s gen=%d: the template raises (%s) but we gave %d \"%s\"", family,
                     c->name, c->gen, want, (int)st, llmi_error_message());
        return;
    }
    if (st != LLM_ERR_BUFFER_TOO_SMALL)
        fail_msg("%s/%s gen=%d: sizing gave %d \"%s\"", family, c->name, c->gen, (int)st,
                 llmi_error_message());
    char *buf = malloc(need);
    assert_non_null(buf);
    size_t len = 0;
    st = llmi_chat_apply(t, c->m, c->n, c->gen, buf, need, &len);
    if (st != LLM_OK)
        fail_msg("%s/%s gen=%d: %d \"%s\"", family, c->name, c->gen, (int)st, llmi_error_message());
    if (len != strlen(want) || memcmp(buf, want, len) != 0)
        fail_msg("%s/%s gen=%d:\n got  \"%s\"\n want \"%s\"", family, c->name, c->gen, buf, want);
    free(buf);
}

static void check_family(const char *dir, const char *family) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat/%s.txt", dir, family);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: missing (run make test-models)", path);
    char *tmpl = NULL, *bos = NULL, *eos = NULL;
    llmi_tokenizer *t = NULL;
    chat_case c = {0};
    size_t n_cases = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        const char *p = line, *end = line + got - (line[got - 1] == '\n');
        const char *key = p;
        while (p < end && *p != ' ')
            p++;
        size_t lk = (size_t)(p - key);
        if (p < end)
            p++;
#define KEY(k) (lk == strlen(k) && memcmp(key, k, lk) == 0)
        if (KEY("template")) {
            tmpl = field(&p, end);
        } else if (KEY("bos") || KEY("eos")) {
            /* a model without the token: a placeholder its template never reads */
            char *v = *p == '-' ? strdup(KEY("bos") ? "<no-bos>" : "<no-eos>") : field(&p, end);
            *(KEY("bos") ? &bos : &eos) = v;
        } else if (KEY("case")) {
            if (!t) {
                assert_non_null(tmpl);
                assert_non_null(bos);
                assert_non_null(eos);
                t = make_with(tmpl, bos, eos);
            }
            free_case(&c);
            const char *b = p;
            while (p < end && *p != ' ')
                p++;
            snprintf(c.name, sizeof c.name, "%.*s", (int)(p - b), b);
            c.gen = p + 1 < end && p[1] == '1';
        } else if (KEY("msg")) {
            assert_true(c.n < MAX_MSGS);
            c.m[c.n].role = field(&p, end);
            c.m[c.n].content = field(&p, end);
            c.n++;
        } else if (KEY("want") || KEY("reject")) {
            char *v = field(&p, end);
            check_case(family, t, &c, KEY("reject"), v);
            free(v);
            n_cases++;
        } else {
            fail_msg("%s: unexpected line \"%.*s\"", path, (int)lk, key);
        }
#undef KEY
    }
    free(line);
    fclose(f);
    free_case(&c);
    assert_true(n_cases > 20);
    llmi_tokenizer_free(t);
    free(tmpl);
    free(bos);
    free(eos);
}

static void test_families_against_jinja(void **state) {
    (void)state;
    const char *dir = getenv("LLM_TEST_MODELS");
    if (!dir)
        skip();
    for (size_t i = 0; i < N(families); i++)
        check_family(dir, families[i]);
}

static void test_real_model(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path || access(path, R_OK) != 0)
        skip();
    llmi_gguf *g;
    llmi_tokenizer *t;
    OK(llmi_gguf_open(path, true, &g));
    OK(llmi_tokenizer_load(g, &t));
    llmi_gguf_close(g); /* the tokenizer keeps its own copy of the template */
    assert_string_equal(llmi_tokenizer_chat_template(t), smol_tmpl);
    expect(t, user_only, 1, true,
           SMOL_SYS "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
    expect(t, sys_user, 2, false,
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    llmi_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_chatml),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_any_template),
        cmocka_unit_test(test_named_templates),
        cmocka_unit_test(test_errors_and_buffers),
        cmocka_unit_test(test_families_against_jinja),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
