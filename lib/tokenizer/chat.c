/* Built-in chat templates: the fallback when there is no Jinja template to
 * run (chat_jinja.c runs the model's own template). The families below are
 * recognised by their text or by name ("chatml", "llama3"; the way
 * llama.cpp's llm_chat_detect_template does) and each rendered exactly as
 * its template renders plain {role, content} messages, rejections included
 * (tests/unit/test_chat.c compares with jinja2 on the templates in
 * tests/models/chat-templates/):
 *
 *  ChatML     "<|im_start|>{role}\n{content}<|im_end|>\n"; a default system
 *             message when the first is not one (SmolLM2, Qwen2), read from
 *             the template's string literal.
 *  Qwen2.5    ChatML, always a system turn (the template's default one when
 *             none is given), "tool" messages as <tool_response> blocks in a
 *             user turn, roles other than user/system/assistant/tool dropped.
 *  Qwen3      as Qwen2.5 without a default system turn; an assistant turn
 *             keeps only the text after </think>, and turns after the last
 *             user query get a <think> block with the reasoning.
 *  Llama 3    bos_token, "<|start_header_id|>{role}<|end_header_id|>\n\n"
 *             + trim(content) + "<|eot_id|>".
 *  Llama 2    bos_token "[INST] " + strip(<<SYS>> block + content) + " [/INST]",
 *             " " + strip(answer) + " " eos_token; roles alternate.
 *  Gemma      bos_token, "<start_of_turn>{user|model}\n" + trim(content) +
 *             "<end_of_turn>\n"; roles alternate; Gemma 3 folds the system
 *             message into the first user turn, Gemma 2 rejects it.
 *  Mistral    v1 (7B v0.1): "[INST] {content} [/INST]{answer}</s>";
 *             v1 with a system prompt (7B v0.2): " [INST] " ... " [/INST]",
 *             the system message in the first user turn;
 *             v3 (7B v0.3): "[INST] {content}[/INST] trim(answer)</s>", the
 *             system message in the last user turn. Roles alternate.
 *  Phi-3      "<|{system,user,assistant}|>\n{content}<|end|>\n", then
 *             "<|assistant|>\n" or eos_token; the first release's template
 *             appends "<|assistant|>\n" to every user turn.
 *
 * Where the template raises (roles not alternating, a role it does not
 * know, no message where it reads messages[0]) the call fails with
 * LLM_ERR_INVALID_ARGUMENT and the template's reason. */
#define LLMI_TOKENIZER_INTERNAL
#include "tokenizer/tokenizer.h"

#include <string.h>

typedef struct out {
    char *buf;
    size_t cap, n;
} out;

static void put(out *o, const char *s, size_t n) {
    if (o->n + n < o->cap && n)
        memcpy(o->buf + o->n, s, n);
    o->n += n;
}
static void puts_(out *o, const char *s) { put(o, s, strlen(s)); }

/* Python's str.isspace(), which Jinja's trim filter uses. */
static bool py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Jinja's trim filter and Python's str.strip(): no Unicode whitespace at
 * either end. */
static void put_trimmed_n(out *o, const char *s, size_t n) {
    size_t b = 0, e = n;
    while (b < e) {
        uint32_t cp;
        size_t l = llmi_tok_utf8_decode(s + b, e - b, &cp);
        if (!py_space(cp))
            break;
        b += l;
    }
    while (e > b) {
        size_t k = e - 1; /* start of the last character */
        while (k > b && ((unsigned char)s[k] & 0xc0) == 0x80)
            k--;
        uint32_t cp;
        llmi_tok_utf8_decode(s + k, e - k, &cp);
        if (!py_space(cp))
            break;
        e = k;
    }
    put(o, s + b, e - b);
}
static void put_trimmed(out *o, const char *s) { put_trimmed_n(o, s, strlen(s)); }

/* Finds the first Jinja string literal inside {{ }} / {% %} tags whose
 * value starts with `prefix` and ends with `suffix` and is longer than
 * both; *found = its decoded value (llmi_free), or NULL when none. */
static llm_status find_literal(const char *tmpl, const char *prefix, const char *suffix,
                               char **found) {
    *found = NULL;
    size_t lp = strlen(prefix), ls = strlen(suffix);
    const char *p = tmpl;
    while ((p = strchr(p, '{')) != NULL) {
        if (p[1] != '{' && p[1] != '%') {
            p++;
            continue;
        }
        const char close = p[1] == '{' ? '}' : '%';
        p += 2;
        while (*p && !(p[0] == close && p[1] == '}')) {
            if (*p != '\'' && *p != '"') {
                p++;
                continue;
            }
            char q = *p++;
            const char *start = p;
            while (*p && *p != q)
                p += (*p == '\\' && p[1]) ? 2 : 1;
            size_t raw = (size_t)(p - start);
            char *v = llmi_malloc(raw + 1);
            if (!v)
                return llmi_oom("chat template literal");
            size_t n = 0;
            for (const char *s = start; s < p; s++) {
                if (*s == '\\' && s + 1 < p) {
                    s++;
                    switch (*s) {
                    case 'n':
                        v[n++] = '\n';
                        break;
                    case 't':
                        v[n++] = '\t';
                        break;
                    case 'r':
                        v[n++] = '\r';
                        break;
                    case '\\':
                    case '\'':
                    case '"':
                        v[n++] = *s;
                        break;
                    default:
                        v[n++] = '\\';
                        v[n++] = *s;
                        break;
                    }
                } else {
                    v[n++] = *s;
                }
            }
            v[n] = '\0';
            if (n > lp + ls && memcmp(v, prefix, lp) == 0 && memcmp(v + n - ls, suffix, ls) == 0) {
                *found = v;
                return LLM_OK;
            }
            llmi_free(v);
            if (*p)
                p++;
        }
    }
    return LLM_OK;
}

typedef enum family {
    F_NONE,
    F_CHATML,
    F_QWEN25,
    F_QWEN3,
    F_LLAMA3,
    F_LLAMA2,
    F_GEMMA,
    F_MISTRAL_V1,
    F_MISTRAL_V1_SYSTEM,
    F_MISTRAL_V3,
    F_PHI3,
} family;

static const char *const family_names[] = {
    [F_NONE] = "unknown",
    [F_CHATML] = "ChatML",
    [F_QWEN25] = "Qwen2.5",
    [F_QWEN3] = "Qwen3",
    [F_LLAMA3] = "Llama 3",
    [F_LLAMA2] = "Llama 2",
    [F_GEMMA] = "Gemma",
    [F_MISTRAL_V1] = "Mistral v1",
    [F_MISTRAL_V1_SYSTEM] = "Mistral v1",
    [F_MISTRAL_V3] = "Mistral v3",
    [F_PHI3] = "Phi-3",
};

static bool has(const char *t, const char *s) { return strstr(t, s) != NULL; }

static family detect(const char *t) {
    if (strcmp(t, "chatml") == 0)
        return F_CHATML;
    if (strcmp(t, "llama3") == 0)
        return F_LLAMA3;
    if (has(t, "<|im_start|>")) {
        /* Phi-4 and SmolVLM use <|im_start|> but are not ChatML */
        if (has(t, "<|im_sep|>") || has(t, "<end_of_utterance>"))
            return F_NONE;
        if (has(t, "last_query_index"))
            return F_QWEN3;
        /* other reasoning templates (QwQ, SmolLM3) treat <think> their own way */
        if (has(t, "<think>") || has(t, "</think>"))
            return F_NONE;
        if (has(t, "<tool_response>"))
            return F_QWEN25;
        return F_CHATML;
    }
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>"))
        return F_LLAMA3;
    if (has(t, "<start_of_turn>"))
        return F_GEMMA;
    if (has(t, "<|user|>") && has(t, "<|assistant|>") && has(t, "<|end|>"))
        return F_PHI3;
    if (has(t, "[INST]")) {
        if (has(t, "[SYSTEM_PROMPT]"))
            return F_NONE; /* v7 */
        if (has(t, "<<SYS>>"))
            return has(t, "bos_token + '[INST] '") && has(t, "content.strip()") ? F_LLAMA2 : F_NONE;
        if (has(t, "[AVAILABLE_TOOLS]"))
            return has(t, "\"[INST] \"") ? F_MISTRAL_V3 : F_NONE; /* not v3-tekken */
        if (has(t, "' [INST] ' + system_message"))
            return F_MISTRAL_V1_SYSTEM;
        if (has(t, "'[INST] ' + message['content'] + ' [/INST]'"))
            return F_MISTRAL_V1;
    }
    return F_NONE;
}

/* Templates that read messages[0] outside the message loop fail on an empty
 * conversation. */
static bool needs_a_message(family f) {
    return f == F_QWEN25 || f == F_QWEN3 || f == F_LLAMA2 || f == F_GEMMA ||
           f == F_MISTRAL_V1_SYSTEM || f == F_MISTRAL_V3;
}

typedef struct ctx {
    const llmi_tokenizer *t;
    const char *tmpl;
    family f;
    const llm_chat_message *m;
    size_t n;
    bool gen;
    out *o;
} ctx;

static bool is(const llm_chat_message *m, const char *role) { return strcmp(m->role, role) == 0; }

static void put_special(const ctx *c, llm_token id) {
    size_t len = 0;
    const char *s = id != LLM_TOKEN_NONE ? llmi_tokenizer_token_text(c->t, id, &len) : NULL;
    if (s)
        put(c->o, s, len);
}
static void put_bos(const ctx *c) { put_special(c, c->t->bos); }
static void put_eos(const ctx *c) { put_special(c, c->t->eos); }

static llm_status reject(const ctx *c, const char *why, size_t i) {
    return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                      "chat: the %s template rejects the conversation at message %zu (role "
                      "'%s'): %s",
                      family_names[c->f], i, c->m[i].role, why);
}

/* Roles must go user, assistant, user, ... from message `from` on (the
 * templates' (role == 'user') != (index % 2 == 0) check). */
static llm_status check_alternation(const ctx *c, size_t from) {
    for (size_t i = from; i < c->n; i++)
        if (is(&c->m[i], "user") != ((i - from) % 2 == 0))
            return reject(c, "roles must alternate user/assistant after an optional system message",
                          i);
    return LLM_OK;
}

static bool first_is_system(const ctx *c) { return c->n > 0 && is(&c->m[0], "system"); }

static llm_status render_chatml(const ctx *c) {
    if (c->n > 0 && !first_is_system(c) &&
        (has(c->tmpl, "!= 'system'") || has(c->tmpl, "!= \"system\"") ||
         has(c->tmpl, "== 'system'") || has(c->tmpl, "== \"system\""))) {
        char *sys = NULL;
        LLMI_TRY(find_literal(c->tmpl, "<|im_start|>system\n", "<|im_end|>\n", &sys));
        if (sys)
            puts_(c->o, sys);
        llmi_free(sys);
    }
    for (size_t i = 0; i < c->n; i++) {
        puts_(c->o, "<|im_start|>");
        puts_(c->o, c->m[i].role);
        puts_(c->o, "\n");
        puts_(c->o, c->m[i].content);
        puts_(c->o, "<|im_end|>\n");
    }
    if (c->gen)
        puts_(c->o, "<|im_start|>assistant\n");
    return LLM_OK;
}

/* A byte span of a message, for Python's split/strip on it. */
typedef struct span {
    const char *s;
    size_t n;
} span;

static const char *find_in(span sp, const char *needle) {
    size_t ln = strlen(needle);
    for (size_t i = 0; i + ln <= sp.n; i++)
        if (memcmp(sp.s + i, needle, ln) == 0)
            return sp.s + i;
    return NULL;
}
static const char *find_last_in(span sp, const char *needle) {
    size_t ln = strlen(needle);
    for (size_t i = sp.n + 1; i-- > 0;)
        if (i + ln <= sp.n && memcmp(sp.s + i, needle, ln) == 0)
            return sp.s + i;
    return NULL;
}
static span lstrip_nl(span sp) {
    while (sp.n && sp.s[0] == '\n')
        sp.s++, sp.n--;
    return sp;
}
static span rstrip_nl(span sp) {
    while (sp.n && sp.s[sp.n - 1] == '\n')
        sp.n--;
    return sp;
}
static bool starts_ends(const char *s, const char *pre, const char *suf) {
    size_t n = strlen(s), lp = strlen(pre), ls = strlen(suf);
    return n >= lp && n >= ls && memcmp(s, pre, lp) == 0 && memcmp(s + n - ls, suf, ls) == 0;
}

/* Qwen's tool results: consecutive "tool" messages share one user turn. */
static void put_tool_response(const ctx *c, size_t i) {
    if (i == 0 || !is(&c->m[i - 1], "tool"))
        puts_(c->o, "<|im_start|>user");
    puts_(c->o, "\n<tool_response>\n");
    puts_(c->o, c->m[i].content);
    puts_(c->o, "\n</tool_response>");
    if (i + 1 == c->n || !is(&c->m[i + 1], "tool"))
        puts_(c->o, "<|im_end|>\n");
}

static void put_turn(const ctx *c, const char *role, span content) {
    puts_(c->o, "<|im_start|>");
    puts_(c->o, role);
    puts_(c->o, "\n");
    put(c->o, content.s, content.n);
}

/* Qwen3's assistant turn: the reasoning is what lies between the last
 * <think> and the first </think>, the answer what follows the last
 * </think>; turns after the last user query show both. */
static void put_qwen3_assistant(const ctx *c, size_t i, size_t last_query) {
    span content = {c->m[i].content, strlen(c->m[i].content)}, reasoning = {"", 0};
    const char *close = find_in(content, "</think>");
    if (close) {
        span before = rstrip_nl((span){content.s, (size_t)(close - content.s)});
        const char *open = find_last_in(before, "<think>");
        if (open)
            before = (span){open + 7, before.n - (size_t)(open + 7 - before.s)};
        reasoning = lstrip_nl(before);
        const char *last_close = find_last_in(content, "</think>");
        content =
            lstrip_nl((span){last_close + 8, content.n - (size_t)(last_close + 8 - content.s)});
    }
    if (i > last_query && (i + 1 == c->n || reasoning.n > 0)) {
        put_turn(c, "assistant", (span){"<think>\n", 8});
        span r = rstrip_nl(lstrip_nl(reasoning));
        put(c->o, r.s, r.n);
        puts_(c->o, "\n</think>\n\n");
        span answer = lstrip_nl(content);
        put(c->o, answer.s, answer.n);
    } else {
        put_turn(c, "assistant", content);
    }
    puts_(c->o, "<|im_end|>\n");
}

static llm_status render_qwen(const ctx *c) {
    if (first_is_system(c)) {
        puts_(c->o, "<|im_start|>system\n");
        puts_(c->o, c->m[0].content);
        puts_(c->o, "<|im_end|>\n");
    } else if (c->f == F_QWEN25) {
        char *sys = NULL;
        LLMI_TRY(find_literal(c->tmpl, "<|im_start|>system\n", "<|im_end|>\n", &sys));
        if (sys)
            puts_(c->o, sys);
        llmi_free(sys);
    }
    size_t last_query = c->n - 1;
    for (size_t i = c->n; i-- > 0;)
        if (is(&c->m[i], "user") &&
            !starts_ends(c->m[i].content, "<tool_response>", "</tool_response>")) {
            last_query = i;
            break;
        }
    for (size_t i = 0; i < c->n; i++) {
        const llm_chat_message *m = &c->m[i];
        if (is(m, "user") || (is(m, "system") && i > 0) ||
            (is(m, "assistant") && c->f == F_QWEN25)) {
            put_turn(c, m->role, (span){m->content, strlen(m->content)});
            puts_(c->o, "<|im_end|>\n");
        } else if (is(m, "assistant")) {
            put_qwen3_assistant(c, i, last_query);
        } else if (is(m, "tool")) {
            put_tool_response(c, i);
        }
    }
    if (c->gen)
        puts_(c->o, "<|im_start|>assistant\n");
    return LLM_OK;
}

static llm_status render_llama3(const ctx *c) {
    /* bos_token before the first message */
    bool bos = has(c->tmpl, "bos_token") || has(c->tmpl, "<|begin_of_text|>") ||
               strcmp(c->tmpl, "llama3") == 0;
    if (bos && (c->n > 0 || !has(c->tmpl, "loop.index0 == 0"))) {
        if (c->t->bos != LLM_TOKEN_NONE && has(c->tmpl, "bos_token"))
            put_bos(c);
        else
            puts_(c->o, "<|begin_of_text|>");
    }
    for (size_t i = 0; i < c->n; i++) {
        puts_(c->o, "<|start_header_id|>");
        puts_(c->o, c->m[i].role);
        puts_(c->o, "<|end_header_id|>\n\n");
        put_trimmed(c->o, c->m[i].content);
        puts_(c->o, "<|eot_id|>");
    }
    if (c->gen)
        puts_(c->o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return LLM_OK;
}

static llm_status render_llama2(const ctx *c) {
    size_t from = first_is_system(c) ? 1 : 0;
    LLMI_TRY(check_alternation(c, from));
    for (size_t i = from; i < c->n; i++) {
        const llm_chat_message *m = &c->m[i];
        bool user = is(m, "user");
        if (!user && !is(m, "assistant"))
            continue;
        if (user) {
            put_bos(c);
            puts_(c->o, "[INST] ");
        } else {
            puts_(c->o, " ");
        }
        if (i == from && from == 1) {
            /* strip() sees the <<SYS>> block and the content as one string */
            out block = {NULL, 0, 0};
            const char *sys = c->m[0].content;
            size_t ls = strlen(sys), lc = strlen(m->content);
            size_t n = 8 + ls + 12 + lc;
            char *s = llmi_malloc(n + 1);
            if (!s)
                return llmi_oom("chat: Llama 2 system block");
            block.buf = s;
            block.cap = n + 1;
            puts_(&block, "<<SYS>>\n");
            puts_(&block, sys);
            puts_(&block, "\n<</SYS>>\n\n");
            puts_(&block, m->content);
            put_trimmed_n(c->o, s, block.n);
            llmi_free(s);
        } else {
            put_trimmed(c->o, m->content);
        }
        if (user) {
            puts_(c->o, " [/INST]");
        } else {
            puts_(c->o, " ");
            put_eos(c);
        }
    }
    return LLM_OK;
}

static llm_status render_gemma(const ctx *c) {
    bool fold_system = has(c->tmpl, "first_user_prefix");
    if (has(c->tmpl, "bos_token"))
        put_bos(c);
    if (first_is_system(c) && !fold_system)
        return reject(c, "the system role is not supported", 0);
    size_t from = first_is_system(c) ? 1 : 0;
    LLMI_TRY(check_alternation(c, from));
    for (size_t i = from; i < c->n; i++) {
        puts_(c->o, "<start_of_turn>");
        puts_(c->o, is(&c->m[i], "assistant") ? "model" : c->m[i].role);
        puts_(c->o, "\n");
        if (i == from && from == 1) {
            puts_(c->o, c->m[0].content);
            puts_(c->o, "\n\n");
        }
        put_trimmed(c->o, c->m[i].content);
        puts_(c->o, "<end_of_turn>\n");
    }
    if (c->gen)
        puts_(c->o, "<start_of_turn>model\n");
    return LLM_OK;
}

static llm_status render_mistral(const ctx *c) {
    bool v3 = c->f == F_MISTRAL_V3, v1 = c->f == F_MISTRAL_V1;
    size_t from = !v1 && first_is_system(c) ? 1 : 0;
    /* v3 leaves tool messages out of the alternation, then rejects them for
     * lacking a tool_call_id */
    for (size_t i = from, k = 0; i < c->n; i++) {
        bool tool = v3 && (is(&c->m[i], "tool") || is(&c->m[i], "tool_results"));
        if (!tool && is(&c->m[i], "user") != (k++ % 2 == 0))
            return reject(c, "roles must alternate user/assistant after an optional system message",
                          i);
    }
    put_bos(c);
    for (size_t i = from; i < c->n; i++) {
        const llm_chat_message *m = &c->m[i];
        if (is(m, "user")) {
            bool with_system = from == 1 && (v3 ? i + 1 == c->n : i == from);
            puts_(c->o, v3 ? "[INST] " : v1 ? "[INST] " : " [INST] ");
            if (with_system) {
                puts_(c->o, c->m[0].content);
                puts_(c->o, "\n\n");
            }
            puts_(c->o, m->content);
            puts_(c->o, v3 ? "[/INST]" : " [/INST]");
        } else if (is(m, "assistant")) {
            if (!v1)
                puts_(c->o, " ");
            if (v3)
                put_trimmed(c->o, m->content);
            else
                puts_(c->o, m->content);
            put_eos(c);
        } else if (v3 && (is(m, "tool") || is(m, "tool_results"))) {
            return reject(c, "tool results need a tool_call_id", i);
        } else {
            return reject(c, "only user and assistant roles are supported", i);
        }
    }
    return LLM_OK;
}

static llm_status render_phi3(const ctx *c) {
    if (!has(c->tmpl, "<|system|>")) {
        /* the first release: every user turn opens the assistant's */
        if (has(c->tmpl, "bos_token"))
            put_bos(c);
        for (size_t i = 0; i < c->n; i++) {
            if (is(&c->m[i], "user")) {
                puts_(c->o, "<|user|>\n");
                puts_(c->o, c->m[i].content);
                puts_(c->o, "<|end|>\n<|assistant|>\n");
            } else if (is(&c->m[i], "assistant")) {
                puts_(c->o, c->m[i].content);
                puts_(c->o, "<|end|>\n");
            }
        }
        return LLM_OK;
    }
    /* Phi-3.5 drops an empty system message */
    bool skip_empty_system = has(c->tmpl, "'system' and message['content']");
    for (size_t i = 0; i < c->n; i++) {
        const llm_chat_message *m = &c->m[i];
        if (!is(m, "system") && !is(m, "user") && !is(m, "assistant"))
            continue;
        if (is(m, "system") && skip_empty_system && !m->content[0])
            continue;
        puts_(c->o, "<|");
        puts_(c->o, m->role);
        puts_(c->o, "|>\n");
        puts_(c->o, m->content);
        puts_(c->o, "<|end|>\n");
    }
    if (c->gen)
        puts_(c->o, "<|assistant|>\n");
    else if (has(c->tmpl, "eos_token"))
        put_eos(c);
    return LLM_OK;
}

static llm_status render(const ctx *c) {
    if (c->n == 0 && needs_a_message(c->f))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "chat: the %s template reads the first message; give at least one",
                          family_names[c->f]);
    switch (c->f) {
    case F_CHATML:
        return render_chatml(c);
    case F_QWEN25:
    case F_QWEN3:
        return render_qwen(c);
    case F_LLAMA3:
        return render_llama3(c);
    case F_LLAMA2:
        return render_llama2(c);
    case F_GEMMA:
        return render_gemma(c);
    case F_MISTRAL_V1:
    case F_MISTRAL_V1_SYSTEM:
    case F_MISTRAL_V3:
        return render_mistral(c);
    case F_PHI3:
        return render_phi3(c);
    case F_NONE:
        break;
    }
    return llmi_error(LLM_ERR_INTERNAL, "chat: no renderer for family %d", (int)c->f);
}

llm_status llmi_chat_apply_builtin(const llmi_tokenizer *t, const char *tmpl,
                                   const llm_chat_message *msgs, size_t n,
                                   bool add_generation_prompt, char *buf, size_t cap,
                                   size_t *n_out) {
    family f = detect(tmpl);
    if (f == F_NONE)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "chat template not recognised (supported: ChatML, Qwen2/2.5/3, Llama 2, "
                          "Llama 3, Gemma 2/3, Mistral v1/v3, Phi-3)");
    out o = {buf, cap, 0};
    ctx c = {t, tmpl, f, msgs, n, add_generation_prompt, &o};
    LLMI_TRY(render(&c));
    *n_out = o.n;
    if (o.n >= cap) {
        *n_out = o.n + 1; /* what the buffer must hold, NUL included */
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL, "chat: %zu bytes and the NUL do not fit in %zu",
                          o.n, cap);
    }
    buf[o.n] = '\0';
    return LLM_OK;
}
