/* libFuzzer target: the grammar compilers (GBNF, JSON Schema, regular
 * expressions) and the matcher.
 *
 * Input: byte 0 picks the compiler (mod 3: EBNF, JSON Schema, regex; bit 2
 * flexible whitespace for schemas); the rest up to the first NUL byte is the
 * grammar text, the bytes after it are fed to the matcher.
 *
 * Checks: a failed compile gives LLM_ERR_INVALID_ARGUMENT, UNSUPPORTED or
 * LIMIT (OUT_OF_MEMORY aside) with a message and no grammar; a compiled one
 * gives a state whose verdict on the bytes is the same whether they come
 * all at once or one by one (a rejected byte leaves the state unchanged, so
 * feeding stops there in both), and rollback-free forks agree with their
 * parent. Every other compiled grammar (chosen by the text's length, so the
 * speed of the rest is kept) is also bound to the tiny test model's
 * vocabulary, which builds its position masks (a limit is a clean
 * failure), and the mask after the accepted bytes must agree with the
 * token-by-token check. */
#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "model/testmodel.h"
#include "tokenizer/tokenizer.h"

#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>

static llmi_tokenizer *g_tok;

static bool ok_failure(llm_status st) {
    return st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_UNSUPPORTED || st == LLM_ERR_LIMIT ||
           st == LLM_ERR_OUT_OF_MEMORY;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_layer = 1, p.n_embd = 4, p.n_head = 2, p.n_head_kv = 1, p.n_ff = 4;
    void *data = NULL;
    size_t size = 0;
    llmi_gguf *g = NULL;
    if (llmi_testmodel_to_memory(&p, &data, &size) != LLM_OK ||
        llmi_gguf_open_memory(data, size, &g) != LLM_OK ||
        llmi_tokenizer_load(g, &g_tok) != LLM_OK) {
        fprintf(stderr, "fuzz_grammar: %s\n", llmi_error_message());
        abort();
    }
    llmi_gguf_close(g);
    llmi_free(data);
    return 0;
}

/* Binds g and checks the mask of `s` (a state of g, before binding: the
 * vocabulary does not change what it accepted) token by token. */
static void check_mask(llmi_grammar *g, llmi_gstate *s) {
    llm_status st = llmi_grammar_bind_vocab(g, g_tok);
    if (st != LLM_OK) {
        FUZZ_CHECK(st == LLM_ERR_LIMIT || st == LLM_ERR_OUT_OF_MEMORY, "bind: status %d", st);
        return;
    }
    uint32_t *mask = calloc((g->n_vocab + 31) / 32 + 1, sizeof *mask);
    if (!mask)
        return;
    st = llmi_gstate_fill_mask(s, mask);
    if (st == LLM_OK)
        for (uint32_t t = 0; t < g->n_vocab; t++)
            FUZZ_CHECK(((mask[t >> 5] >> (t & 31)) & 1) == llmi_gstate_allows(s, (llm_token)t),
                       "token %u: the mask and the check differ", t);
    else
        FUZZ_CHECK(ok_failure(st), "mask: status %d", st);
    free(mask);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    const char *text = (const char *)data + 1;
    size_t rest = size - 1, len = 0;
    while (len < rest && text[len] != 0)
        len++;
    const char *bytes = text + len + (len < rest);
    size_t n_bytes = len < rest ? rest - len - 1 : 0;
    llmi_grammar *g = NULL;
    llm_status st;
    switch (mode % 3) {
    case 0:
        st = llmi_grammar_from_ebnf(text, len, "root", &g);
        break;
    case 1:
        st = llmi_grammar_from_schema(text, len, (mode >> 2) & 1, &g);
        break;
    default:
        st = llmi_grammar_from_regex(text, len, &g);
        break;
    }
    if (st != LLM_OK) {
        FUZZ_CHECK(ok_failure(st), "status %d", st);
        FUZZ_CHECK(g == NULL, "grammar left on failure");
        FUZZ_CHECK(llmi_error_message()[0] != 0, "no message");
        return 0;
    }
    llmi_gstate *whole = NULL, *each = NULL, *fork = NULL;
    st = llmi_gstate_create(g, &whole);
    if (st == LLM_OK)
        st = llmi_gstate_create(g, &each);
    if (st != LLM_OK) {
        FUZZ_CHECK(ok_failure(st), "state: status %d", st);
        llmi_gstate_free(whole);
        llmi_grammar_free(g);
        return 0;
    }
    if (n_bytes > 256)
        n_bytes = 256;
    llm_status sw = llmi_gstate_accept_bytes(whole, bytes, n_bytes);
    size_t fed = 0;
    llm_status se = LLM_OK;
    for (; fed < n_bytes && se == LLM_OK; fed++)
        se = llmi_gstate_accept_bytes(each, bytes + fed, 1);
    if (sw == LLM_OK || se == LLM_OK) {
        FUZZ_CHECK(sw == se, "all at once %d, one by one %d", sw, se);
        FUZZ_CHECK(llmi_gstate_can_end(whole) == llmi_gstate_can_end(each), "can_end differs");
    } else {
        FUZZ_CHECK(ok_failure(sw) && ok_failure(se), "statuses %d %d", sw, se);
    }
    if (llmi_gstate_fork(each, &fork) == LLM_OK) {
        FUZZ_CHECK(llmi_gstate_can_end(fork) == llmi_gstate_can_end(each), "fork differs");
        llmi_gstate_free(fork);
    }
    if (len & 1)
        check_mask(g, each);
    llmi_gstate_free(whole);
    llmi_gstate_free(each);
    llmi_grammar_free(g);
    return 0;
}
