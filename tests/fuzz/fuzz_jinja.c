/* libFuzzer target: the Jinja interpreter (lib/jinja) on arbitrary
 * templates and variables.
 *
 * Input: the template text up to the first NUL byte; after it, a JSON
 * object of variables (anything else: no variables). Rendered under small
 * limits so a template that loops or nests deeply stops quickly.
 *
 * Expectations: the status is one of OK, INVALID_ARGUMENT (syntax and
 * template errors), LIMIT, INVALID_UTF8 (a template that is not UTF-8,
 * and only then); on success the text is NUL-terminated at its reported
 * length with no NUL inside, is valid UTF-8 when the variables were, and a
 * second render gives the same bytes; on failure there is no text. */
#include "core/core.h"
#include "jinja/jinja.h"

#include <cjson/cJSON.h>

#include "fuzz_util.h"

static llm_status render(const char *tmpl, size_t len, const cJSON *vars, char **out, size_t *n) {
    llmi_jinja_limits lim = llmi_jinja_default_limits();
    lim.max_steps = 200000;
    lim.max_loop = 20000;
    lim.max_output = 1 << 20;
    lim.max_memory = 64u << 20;
    /* a fixed time keeps strftime_now deterministic */
    return llmi_jinja_render(tmpl, len, vars, &lim, 1700000000.0, out, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    size_t tlen = nul ? (size_t)(nul - text) : size;
    cJSON *vars = NULL;
    bool vars_utf8 = true;
    if (nul) {
        size_t vlen = size - tlen - 1;
        char *json = malloc(vlen + 1);
        FUZZ_CHECK(json != NULL, "malloc");
        memcpy(json, nul + 1, vlen);
        json[vlen] = '\0';
        vars = cJSON_Parse(json);
        vars_utf8 = fuzz_utf8_valid(json, strlen(json));
        free(json);
        if (vars && !cJSON_IsObject(vars)) {
            cJSON_Delete(vars);
            vars = NULL;
        }
    }
    char *out = NULL, *again = NULL;
    size_t n = 0, n2 = 0;
    llm_status st = render(text, tlen, vars, &out, &n);
    bool utf8 = fuzz_utf8_valid(text, tlen);
    FUZZ_CHECK(st == LLM_OK || st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_LIMIT ||
                   st == LLM_ERR_INVALID_UTF8,
               "status %d: %s", (int)st, llmi_error_message());
    FUZZ_CHECK((st == LLM_ERR_INVALID_UTF8) == !utf8, "status %d for a template %s UTF-8", (int)st,
               utf8 ? "in" : "not in");
    if (st != LLM_OK) {
        FUZZ_CHECK(out == NULL && n == 0, "text returned with status %d", (int)st);
        FUZZ_CHECK(llmi_error_message()[0] != '\0', "status %d without a message", (int)st);
    } else {
        FUZZ_CHECK(out != NULL && out[n] == '\0' && strlen(out) == n,
                   "the text is not NUL-terminated at its length %zu", n);
        FUZZ_CHECK(!vars_utf8 || fuzz_utf8_valid(out, n), "invalid UTF-8 out of valid input");
        FUZZ_CHECK(render(text, tlen, vars, &again, &n2) == LLM_OK && n2 == n &&
                       memcmp(out, again, n) == 0,
                   "a second render differs");
    }
    llmi_free(out);
    llmi_free(again);
    cJSON_Delete(vars);
    return 0;
}
