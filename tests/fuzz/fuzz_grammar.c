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
 * parent. */
#include "grammar/grammar.h"

#include "fuzz_util.h"

static bool ok_failure(llm_status st) {
    return st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_UNSUPPORTED || st == LLM_ERR_LIMIT ||
           st == LLM_ERR_OUT_OF_MEMORY;
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
    llmi_gstate_free(whole);
    llmi_gstate_free(each);
    llmi_grammar_free(g);
    return 0;
}
