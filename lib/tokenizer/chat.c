/* Chat templates. The model carries a Jinja template; rather than running
 * Jinja, recognise the two families this library supports (the way
 * llama.cpp's llm_chat_detect_template does) and render them exactly as
 * their templates would:
 *
 *  ChatML  (template contains "<|im_start|>"):
 *      "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
 *      "<|im_start|>assistant\n" for the generation prompt. Templates that
 *      add a default system message when the first message is not a system
 *      one (SmolLM2, Qwen2.5) carry it as a string literal
 *      "<|im_start|>system\n...<|im_end|>\n"; it is read from the template.
 *  Llama 3 (template contains "<|start_header_id|>" and "<|end_header_id|>"):
 *      bos_token, then "<|start_header_id|>{role}<|end_header_id|>\n\n"
 *      + trim(content) + "<|eot_id|>" per message, then
 *      "<|start_header_id|>assistant<|end_header_id|>\n\n". */
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

static void put_trimmed(out *o, const char *s) {
    size_t n = strlen(s), b = 0, e = n;
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

typedef enum kind { K_NONE, K_CHATML, K_LLAMA3 } kind;

static kind detect(const char *t) {
    if (strcmp(t, "chatml") == 0)
        return K_CHATML;
    if (strcmp(t, "llama3") == 0)
        return K_LLAMA3;
    if (strstr(t, "<|im_start|>")) {
        /* Phi-4 and SmolVLM use <|im_start|> but are not ChatML */
        if (strstr(t, "<|im_sep|>") || strstr(t, "<end_of_utterance>"))
            return K_NONE;
        return K_CHATML;
    }
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|end_header_id|>"))
        return K_LLAMA3;
    return K_NONE;
}

static llm_status render(const llmi_tokenizer *t, const char *tmpl, kind k,
                         const llm_chat_message *m, size_t n, bool gen, out *o) {
    if (k == K_CHATML) {
        char *sys = NULL;
        if (n > 0 && strcmp(m[0].role, "system") != 0 &&
            (strstr(tmpl, "!= 'system'") || strstr(tmpl, "!= \"system\"") ||
             strstr(tmpl, "== 'system'") || strstr(tmpl, "== \"system\""))) {
            LLMI_TRY(find_literal(tmpl, "<|im_start|>system\n", "<|im_end|>\n", &sys));
            if (sys)
                puts_(o, sys);
            llmi_free(sys);
        }
        for (size_t i = 0; i < n; i++) {
            puts_(o, "<|im_start|>");
            puts_(o, m[i].role);
            puts_(o, "\n");
            puts_(o, m[i].content);
            puts_(o, "<|im_end|>\n");
        }
        if (gen)
            puts_(o, "<|im_start|>assistant\n");
        return LLM_OK;
    }
    /* Llama 3: bos_token before the first message */
    bool bos = strstr(tmpl, "bos_token") || strstr(tmpl, "<|begin_of_text|>") ||
               strcmp(tmpl, "llama3") == 0;
    if (bos && (n > 0 || !strstr(tmpl, "loop.index0 == 0"))) {
        size_t bl = 0;
        const char *bt = t->bos >= 0 && strstr(tmpl, "bos_token")
                             ? llmi_tokenizer_token_text(t, t->bos, &bl)
                             : NULL;
        if (bt)
            put(o, bt, bl);
        else
            puts_(o, "<|begin_of_text|>");
    }
    for (size_t i = 0; i < n; i++) {
        puts_(o, "<|start_header_id|>");
        puts_(o, m[i].role);
        puts_(o, "<|end_header_id|>\n\n");
        put_trimmed(o, m[i].content);
        puts_(o, "<|eot_id|>");
    }
    if (gen)
        puts_(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return LLM_OK;
}

llm_status llmi_chat_apply(const llmi_tokenizer *t, const llm_chat_message *msgs, size_t n,
                           bool add_generation_prompt, char *buf, size_t cap, size_t *n_out) {
    if (!t || !n_out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: NULL model or length");
    *n_out = 0;
    if (!buf && cap > 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: buffer is NULL");
    if (!msgs && n > 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: messages is NULL");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "chat: message %zu has a NULL %s", i,
                              msgs[i].role ? "content" : "role");
        size_t lr = strlen(msgs[i].role), lc = strlen(msgs[i].content);
        if (llmi_utf8_valid_prefix(msgs[i].role, lr) != lr ||
            llmi_utf8_valid_prefix(msgs[i].content, lc) != lc)
            return llmi_error(LLM_ERR_INVALID_UTF8,
                              "chat: message %zu at byte %zu is not valid UTF-8", i,
                              llmi_utf8_valid_prefix(msgs[i].role, lr) != lr
                                  ? llmi_utf8_valid_prefix(msgs[i].role, lr)
                                  : llmi_utf8_valid_prefix(msgs[i].content, lc));
    }
    const char *tmpl = t->chat_template;
    if (!tmpl)
        return llmi_error(LLM_ERR_UNSUPPORTED, "the model has no chat template");
    kind k = detect(tmpl);
    if (k == K_NONE)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "chat template not recognised (supported: ChatML, Llama 3)");
    out o = {buf, cap, 0};
    LLMI_TRY(render(t, tmpl, k, msgs, n, add_generation_prompt, &o));
    *n_out = o.n;
    if (o.n >= cap) {
        *n_out = o.n + 1; /* what the buffer must hold, NUL included */
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL, "chat: %zu bytes and the NUL do not fit in %zu",
                          o.n, cap);
    }
    buf[o.n] = '\0';
    return LLM_OK;
}
