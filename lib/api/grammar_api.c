/* The exported grammar functions (llm.h, "Grammars"): argument checks over
 * lib/grammar, which does the work. */
#include "core/core.h"
#include "grammar/grammar.h"
#include "model/model.h"

#define CHECK_ARG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, __VA_ARGS__);                              \
    } while (0)

LLM_API void llm_grammar_params_init_sized(llm_grammar_params *p, size_t size) {
    llm_grammar_params d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.whitespace = LLM_GRAMMAR_WS_COMPACT;
    d.root = NULL;
    llmi_params_init_sized(p, size, &d, sizeof d);
}

LLM_API void llm_grammar_params_init(llm_grammar_params *p) {
    llm_grammar_params_init_sized(p, sizeof *p);
}

enum grammar_kind { KIND_SCHEMA, KIND_EBNF, KIND_REGEX };

static llm_status compile(const char *fn, enum grammar_kind kind, const llm_model *m,
                          const char *text, size_t len, const llm_grammar_params *params,
                          llm_grammar **out) {
    CHECK_ARG(out, "%s: out is NULL", fn);
    *out = NULL;
    CHECK_ARG(m, "%s: model is NULL", fn);
    CHECK_ARG(text || len == 0, "%s: text is NULL with len %zu", fn, len);
    llm_grammar_params p;
    llm_grammar_params_init_sized(&p, sizeof p);
    LLMI_TRY(llmi_params_copy("llm_grammar_params", params, &p, sizeof p));
    CHECK_ARG(p.whitespace <= LLM_GRAMMAR_WS_FLEXIBLE,
              "%s: llm_grammar_params.whitespace %u is not an llm_grammar_whitespace", fn,
              p.whitespace);
    llmi_grammar *g = NULL;
    llm_status st;
    if (kind == KIND_SCHEMA)
        st = llmi_grammar_from_schema(text, len, p.whitespace, &g);
    else if (kind == KIND_EBNF)
        st = llmi_grammar_from_ebnf(text, len, p.root ? p.root : "root", &g);
    else
        st = llmi_grammar_from_regex(text, len, &g);
    if (st == LLM_OK)
        st = llmi_grammar_bind_model(g, m);
    if (st != LLM_OK) {
        llmi_grammar_free(g);
        llmi_error_prefix("%s", fn);
        return st;
    }
    *out = g;
    return LLM_OK;
}

LLM_API llm_status llm_grammar_compile_json_schema(const llm_model *m, const char *schema,
                                                   size_t len, const llm_grammar_params *params,
                                                   llm_grammar **out) {
    return compile("llm_grammar_compile_json_schema", KIND_SCHEMA, m, schema, len, params, out);
}

LLM_API llm_status llm_grammar_compile_ebnf(const llm_model *m, const char *text, size_t len,
                                            const llm_grammar_params *params, llm_grammar **out) {
    return compile("llm_grammar_compile_ebnf", KIND_EBNF, m, text, len, params, out);
}

LLM_API llm_status llm_grammar_compile_regex(const llm_model *m, const char *regex, size_t len,
                                             const llm_grammar_params *params, llm_grammar **out) {
    return compile("llm_grammar_compile_regex", KIND_REGEX, m, regex, len, params, out);
}

LLM_API llm_status llm_grammar_schema_to_ebnf(const char *schema, size_t len,
                                              const llm_grammar_params *params, char *buf,
                                              size_t capacity, size_t *n_bytes) {
    static const char fn[] = "llm_grammar_schema_to_ebnf";
    CHECK_ARG(n_bytes, "%s: n_bytes is NULL", fn);
    *n_bytes = 0;
    CHECK_ARG(schema || len == 0, "%s: schema is NULL with len %zu", fn, len);
    CHECK_ARG(buf || capacity == 0, "%s: buf is NULL with capacity %zu", fn, capacity);
    llm_grammar_params p;
    llm_grammar_params_init_sized(&p, sizeof p);
    LLMI_TRY(llmi_params_copy("llm_grammar_params", params, &p, sizeof p));
    CHECK_ARG(p.whitespace <= LLM_GRAMMAR_WS_FLEXIBLE,
              "%s: llm_grammar_params.whitespace %u is not an llm_grammar_whitespace", fn,
              p.whitespace);
    char *text = NULL;
    llm_status st = llmi_schema_to_ebnf(schema, len, p.whitespace, &text);
    if (st != LLM_OK) {
        llmi_error_prefix("%s", fn);
        return st;
    }
    size_t need = strlen(text) + 1;
    *n_bytes = need;
    if (capacity < need) {
        llmi_free(text);
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL, "%s: need %zu bytes (with NUL), have %zu", fn,
                          need, capacity);
    }
    memcpy(buf, text, need);
    llmi_free(text);
    return LLM_OK;
}

LLM_API void llm_grammar_free(llm_grammar *g) { llmi_grammar_free(g); }

LLM_API llm_status llm_grammar_state_create(const llm_grammar *g, llm_grammar_state **out) {
    CHECK_ARG(out, "llm_grammar_state_create: out is NULL");
    *out = NULL;
    CHECK_ARG(g, "llm_grammar_state_create: grammar is NULL");
    return llmi_gstate_create(g, out);
}

LLM_API llm_status llm_grammar_state_fork(const llm_grammar_state *s, llm_grammar_state **out) {
    CHECK_ARG(out, "llm_grammar_state_fork: out is NULL");
    *out = NULL;
    CHECK_ARG(s, "llm_grammar_state_fork: state is NULL");
    return llmi_gstate_fork(s, out);
}

LLM_API void llm_grammar_state_free(llm_grammar_state *s) { llmi_gstate_free(s); }

LLM_API llm_status llm_grammar_state_accept_token(llm_grammar_state *s, llm_token t) {
    CHECK_ARG(s, "llm_grammar_state_accept_token: state is NULL");
    return llmi_gstate_accept_token(s, t);
}

LLM_API llm_status llm_grammar_state_fill_mask(llm_grammar_state *s, uint32_t *mask,
                                               size_t n_words) {
    CHECK_ARG(s && mask, "llm_grammar_state_fill_mask: state and mask must not be NULL");
    size_t need = ((size_t)s->g->n_vocab + 31) / 32;
    if (n_words < need)
        return llmi_error(LLM_ERR_BUFFER_TOO_SMALL,
                          "llm_grammar_state_fill_mask: %zu words, the vocabulary needs %zu",
                          n_words, need);
    return llmi_gstate_fill_mask(s, mask);
}

LLM_API llm_status llm_grammar_state_can_end(const llm_grammar_state *s, bool *out) {
    CHECK_ARG(s && out, "llm_grammar_state_can_end: state and out must not be NULL");
    *out = llmi_gstate_can_end(s);
    return LLM_OK;
}

LLM_API llm_status llm_grammar_state_is_complete(const llm_grammar_state *s, bool *out) {
    CHECK_ARG(s && out, "llm_grammar_state_is_complete: state and out must not be NULL");
    *out = llmi_gstate_is_complete(s);
    return LLM_OK;
}

LLM_API llm_status llm_grammar_state_rollback(llm_grammar_state *s, uint32_t n) {
    CHECK_ARG(s, "llm_grammar_state_rollback: state is NULL");
    return llmi_gstate_rollback(s, n);
}
