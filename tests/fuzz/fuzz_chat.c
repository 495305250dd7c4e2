/* libFuzzer target: chat templates on arbitrary messages.
 *
 * Input: byte 0 bit 0 = add_generation_prompt; the rest is split at NUL
 * bytes into at most 64 messages. A message holding a 0x1f byte is
 * "role\x1fcontent"; otherwise its role cycles system, user, assistant.
 *
 * Each message list is rendered with four tokenizers: the tiny test model's
 * (SmolLM2's ChatML template, which adds a default system message), the real
 * model's when LLM_TEST_MODEL names one, a plain ChatML template and Meta's
 * Llama 3 template. Invalid UTF-8 in any role or content must give
 * LLM_ERR_INVALID_UTF8. Otherwise the output must equal the rendering
 * computed here independently (which contains every role and content, the
 * Llama 3 contents trimmed as Jinja's trim filter does), the size query
 * must report its length, and a buffer one byte short must be refused.
 *
 * More small templates (holding the text the built-in family renderers
 * once recognised; all now run as Jinja, checked against jinja2 in
 * test_chat and test_jinja) run too: either a rejection with
 * LLM_ERR_INVALID_ARGUMENT, or a size query and a rendering that agree with
 * each other. fuzz_jinja fuzzes the interpreter itself. */
#define LLMI_TOKENIZER_INTERNAL
#include "gguf/gguf.h"
#include "model/testmodel.h"
#include "tokenizer/tokenizer.h"

#include "fuzz_util.h"

enum { MAX_MSG = 64 };
enum kind { CHATML, CHATML_SMOL, LLAMA3, OTHER_FAMILY };

static const char smol_system[] = "<|im_start|>system\nYou are a helpful AI assistant named "
                                  "SmolLM, trained by Hugging Face<|im_end|>\n";
static const char chatml_tmpl[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";
static const char llama3_tmpl[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/* The text the built-in renderers (lib/tokenizer/chat.c) recognise each
 * remaining family by. */
static const char *const other_family_tmpls[] = {
    "{{ bos_token }}<start_of_turn>first_user_prefix",           /* Gemma 3 */
    "{{ bos_token }}<start_of_turn>System role not supported",   /* Gemma 2 */
    "<|im_start|><tool_response>messages[0]['role'] == 'system'" /* Qwen2.5 */
    "{{ '<|im_start|>system\\nDefault.<|im_end|>\\n' }}",
    "<|im_start|>last_query_index</think>",                       /* Qwen3 */
    "<<SYS>>[INST]{{ bos_token + '[INST] ' + content.strip() }}", /* Llama 2 */
    "{{ bos_token }}'[INST] ' + message['content'] + ' [/INST]'", /* Mistral v1 */
    "{{ bos_token }}[INST]' [INST] ' + system_message",           /* Mistral v0.2 */
    "{{ bos_token }}[AVAILABLE_TOOLS]\"[INST] \"",                /* Mistral v3 */
    "<|system|><|user|><|assistant|><|end|>eos_token",            /* Phi-3 */
    "{{ bos_token }}<|user|><|assistant|><|end|>",                /* Phi-3, first release */
};

typedef struct tok_case {
    llmi_tokenizer *t;
    enum kind kind;
} tok_case;
static tok_case g_cases[4 + sizeof other_family_tmpls / sizeof *other_family_tmpls];
static int g_n_cases;

static llmi_tokenizer *from_buffer(void *data, size_t size) {
    llmi_gguf *g = NULL;
    llmi_tokenizer *t = NULL;
    if (llmi_gguf_open_memory(data, size, &g) != LLM_OK || llmi_tokenizer_load(g, &t) != LLM_OK) {
        fprintf(stderr, "fuzz_chat: %s\n", llmi_error_message());
        abort();
    }
    llmi_gguf_close(g);
    llmi_free(data);
    return t;
}

/* A SentencePiece vocabulary whose BOS is <|begin_of_text|>. */
static llmi_tokenizer *with_template(const char *tmpl) {
    static const char *const tokens[] = {"<unk>", "<|begin_of_text|>", "</s>", "a", "b"};
    static const int32_t types[] = {LLMI_TOKTYPE_UNKNOWN, LLMI_TOKTYPE_CONTROL,
                                    LLMI_TOKTYPE_CONTROL, LLMI_TOKTYPE_NORMAL, LLMI_TOKTYPE_NORMAL};
    llmi_gguf_writer *w = NULL;
    void *data = NULL;
    size_t size = 0;
    if (llmi_gguf_writer_create(&w) != LLM_OK ||
        llmi_gguf_w_str(w, "tokenizer.ggml.model", "llama") != LLM_OK ||
        llmi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, 5) != LLM_OK ||
        llmi_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, 5) != LLM_OK ||
        llmi_gguf_w_str(w, "tokenizer.chat_template", tmpl) != LLM_OK ||
        llmi_gguf_writer_to_memory(w, &data, &size) != LLM_OK)
        abort();
    llmi_gguf_writer_free(w);
    return from_buffer(data, size);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_layer = 1, p.n_embd = 4, p.n_head = 2, p.n_head_kv = 1, p.n_ff = 4;
    void *data = NULL;
    size_t size = 0;
    if (llmi_testmodel_to_memory(&p, &data, &size) != LLM_OK)
        abort();
    g_cases[g_n_cases++] = (tok_case){from_buffer(data, size), CHATML_SMOL};
    const char *path = getenv("LLM_TEST_MODEL");
    llmi_gguf *g = NULL;
    llmi_tokenizer *t = NULL;
    if (path && *path && llmi_gguf_open(path, true, &g) == LLM_OK) {
        if (llmi_tokenizer_load(g, &t) != LLM_OK)
            abort();
        llmi_gguf_close(g);
        /* SmolLM2-Instruct: ChatML with the same default system message. */
        const char *tmpl = llmi_tokenizer_chat_template(t);
        if (tmpl && strstr(tmpl, "<|im_start|>") && strstr(tmpl, "named SmolLM")) {
            g_cases[g_n_cases++] = (tok_case){t, CHATML_SMOL};
            fprintf(stderr, "fuzz_chat: also the template of %s\n", path);
        } else {
            llmi_tokenizer_free(t);
        }
    }
    g_cases[g_n_cases++] = (tok_case){with_template(chatml_tmpl), CHATML};
    g_cases[g_n_cases++] = (tok_case){with_template(llama3_tmpl), LLAMA3};
    for (size_t i = 0; i < sizeof other_family_tmpls / sizeof *other_family_tmpls; i++)
        g_cases[g_n_cases++] = (tok_case){with_template(other_family_tmpls[i]), OTHER_FAMILY};
    return 0;
}

/* ---- the expected rendering, computed independently ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        while (b->n + n + 1 > b->cap)
            b->cap = b->cap ? b->cap * 2 : 256;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Decodes the (valid) character at s[i]; returns its length. */
static size_t decode(const unsigned char *s, size_t i, uint32_t *cp) {
    unsigned c = s[i];
    if (c < 0x80)
        return *cp = c, 1;
    size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    uint32_t v = c & (0x7f >> len);
    for (size_t k = 1; k < len; k++)
        v = v << 6 | (s[i + k] & 0x3f);
    *cp = v;
    return len;
}

/* Python's str.isspace(): Unicode White_Space plus the separators 0x1c-0x1f
 * (bidirectional classes WS, B, S), as Jinja's trim uses. */
static bool py_isspace(uint32_t c) {
    switch (c) {
    case 0x09:
    case 0x0a:
    case 0x0b:
    case 0x0c:
    case 0x0d:
    case 0x1c:
    case 0x1d:
    case 0x1e:
    case 0x1f:
    case 0x20:
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
        return true;
    default:
        return c >= 0x2000 && c <= 0x200a;
    }
}

static void put_trimmed(sbuf *b, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), start = 0, end = 0, i = 0;
    bool seen = false;
    while (i < n) { /* first and one-past-last non-space characters */
        uint32_t cp;
        size_t l = decode(u, i, &cp);
        if (!py_isspace(cp)) {
            if (!seen)
                start = i;
            seen = true;
            end = i + l;
        }
        i += l;
    }
    if (seen)
        put(b, s + start, end - start);
}

static void expected(enum kind k, const llm_chat_message *m, size_t n, bool gen, sbuf *b) {
    if (k == LLAMA3) {
        if (n > 0)
            puts_(b, "<|begin_of_text|>");
        for (size_t i = 0; i < n; i++) {
            puts_(b, "<|start_header_id|>");
            puts_(b, m[i].role);
            puts_(b, "<|end_header_id|>\n\n");
            put_trimmed(b, m[i].content);
            puts_(b, "<|eot_id|>");
        }
        if (gen)
            puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        return;
    }
    if (k == CHATML_SMOL && n > 0 && strcmp(m[0].role, "system") != 0)
        puts_(b, smol_system);
    for (size_t i = 0; i < n; i++) {
        puts_(b, "<|im_start|>");
        puts_(b, m[i].role);
        puts_(b, "\n");
        puts_(b, m[i].content);
        puts_(b, "<|im_end|>\n");
    }
    if (gen)
        puts_(b, "<|im_start|>assistant\n");
}

/* A family without an independent rendering here: the template's own
 * rejection, or a rendering of exactly the size the query reported. */
static void check_other_family(const llmi_tokenizer *t, const llm_chat_message *msgs, size_t n,
                               bool gen, llm_status st, size_t need) {
    if (st == LLM_ERR_INVALID_ARGUMENT) {
        FUZZ_CHECK(strstr(llmi_error_message(), "template"), "rejection without a reason: %s",
                   llmi_error_message());
        return;
    }
    FUZZ_CHECK(st == LLM_ERR_BUFFER_TOO_SMALL && need >= 1, "size query gave %d (%s)", st,
               llmi_error_message());
    char *buf = malloc(need);
    size_t got = 0;
    if (need > 1)
        FUZZ_CHECK(llmi_chat_apply(t, msgs, n, gen, buf, need - 1, &got) ==
                           LLM_ERR_BUFFER_TOO_SMALL &&
                       got == need,
                   "one byte short: %zu", got);
    st = llmi_chat_apply(t, msgs, n, gen, buf, need, &got);
    FUZZ_CHECK(st == LLM_OK && got + 1 == need && buf[got] == '\0' && strlen(buf) <= got,
               "render %d, %zu bytes of %zu", st, got, need);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    bool gen = data[0] & 1;
    /* NUL-terminated copy: segments become C strings in place. */
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    llm_chat_message msgs[MAX_MSG];
    static const char *const roles[] = {"system", "user", "assistant"};
    size_t n = 0;
    bool valid = true;
    if (size > 1) {
        for (char *p = text; n < MAX_MSG; n++) {
            size_t len = strlen(p);
            char *sep = memchr(p, 0x1f, len);
            if (sep) {
                *sep = '\0';
                msgs[n] = (llm_chat_message){p, sep + 1};
            } else {
                msgs[n] = (llm_chat_message){roles[n % 3], p};
            }
            valid = valid && fuzz_utf8_valid(msgs[n].role, strlen(msgs[n].role)) &&
                    fuzz_utf8_valid(msgs[n].content, strlen(msgs[n].content));
            if (p + len >= text + size - 1) {
                n++;
                break;
            }
            p += len + 1;
        }
    }
    for (int c = 0; c < g_n_cases; c++) {
        const llmi_tokenizer *t = g_cases[c].t;
        size_t need = 0;
        llm_status st = llmi_chat_apply(t, msgs, n, gen, NULL, 0, &need);
        if (!valid) {
            FUZZ_CHECK(st == LLM_ERR_INVALID_UTF8, "invalid UTF-8 gave %d", st);
            continue;
        }
        if (g_cases[c].kind == OTHER_FAMILY) {
            check_other_family(t, msgs, n, gen, st, need);
            continue;
        }
        FUZZ_CHECK(st == LLM_ERR_BUFFER_TOO_SMALL, "size query gave %d (%s)", st,
                   llmi_error_message());
        sbuf want = {0};
        expected(g_cases[c].kind, msgs, n, gen, &want);
        /* The size asked for holds the text and its NUL. */
        FUZZ_CHECK(need == want.n + 1, "case %d: size %zu, expected %zu", c, need, want.n + 1);
        char *buf = malloc(need);
        size_t got = 0;
        if (need > 1)
            FUZZ_CHECK(llmi_chat_apply(t, msgs, n, gen, buf, need - 1, &got) ==
                               LLM_ERR_BUFFER_TOO_SMALL &&
                           got == need,
                       "one byte short: %zu", got);
        st = llmi_chat_apply(t, msgs, n, gen, buf, need, &got);
        FUZZ_CHECK(st == LLM_OK && got == want.n && buf[got] == '\0', "render %d", st);
        FUZZ_CHECK(memcmp(buf, want.p ? want.p : "", want.n) == 0,
                   "case %d: rendered\n%s\nexpected\n%s", c, buf, want.p ? want.p : "");
        for (size_t i = 0; i < n; i++) { /* spelled out: every role and content is there */
            FUZZ_CHECK(strstr(buf, msgs[i].role), "role %zu missing", i);
            if (g_cases[c].kind != LLAMA3)
                FUZZ_CHECK(strstr(buf, msgs[i].content), "content %zu missing", i);
        }
        free(buf);
        free(want.p);
    }
    free(text);
    return 0;
}
