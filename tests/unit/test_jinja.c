/* The Jinja interpreter (lib/jinja): every case tests/models/gen_jinja_cases.py
 * recorded from jinja2 3.1.6 (set up as transformers sets it up) over the
 * template corpus (tests/models/jinja-corpus/), the chat-template families
 * and the real models' templates is rendered and compared byte for byte, and
 * where jinja2 raises we must fail with LLM_ERR_INVALID_ARGUMENT. Then the
 * errors jinja2 cannot tell us about: syntax errors with line:column,
 * unknown filters named, raise_exception's message, every limit giving
 * LLM_ERR_LIMIT, allocation failures unwinding without leaks. */
#include "core/core.h"
#include "jinja/jinja.h"

#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define OK(expr) assert_int_equal((expr), LLM_OK)

static char *unhex(const char *h, size_t n, size_t *len) {
    assert_true(n % 2 == 0);
    char *s = malloc(n / 2 + 1);
    assert_non_null(s);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        assert_int_equal(sscanf(h + 2 * i, "%2x", &v), 1);
        s[i] = (char)v;
    }
    s[n / 2] = '\0';
    if (len)
        *len = n / 2;
    return s;
}

/* Renders `tmpl` with the JSON variables `vars`; returns the status and
 * sets *out (free with llmi_free) on success. */
static llm_status render(const char *tmpl, const char *vars, const llmi_jinja_limits *lim,
                         char **out) {
    cJSON *j = vars ? cJSON_Parse(vars) : NULL;
    if (vars)
        assert_non_null(j);
    size_t n = 0;
    *out = NULL;
    llm_status st = llmi_jinja_render(tmpl, strlen(tmpl), j, lim, -1, out, &n);
    if (st == LLM_OK)
        assert_int_equal(n, strlen(*out));
    else
        assert_null(*out);
    cJSON_Delete(j);
    return st;
}

static void expect_text(const char *tmpl, const char *vars, const char *want) {
    char *out;
    llm_status st = render(tmpl, vars, NULL, &out);
    if (st != LLM_OK)
        fail_msg("%s: %d %s", tmpl, (int)st, llmi_error_message());
    if (strcmp(out, want) != 0)
        fail_msg("%s:\n got  \"%s\"\n want \"%s\"", tmpl, out, want);
    llmi_free(out);
}

static void expect_error(const char *tmpl, const char *vars, const llmi_jinja_limits *lim,
                         llm_status want, const char *substr) {
    char *out;
    llm_status st = render(tmpl, vars, lim, &out);
    if (st != want || !strstr(llmi_error_message(), substr))
        fail_msg("%s: got %d \"%s\", want %d containing \"%s\"", tmpl, (int)st,
                 llmi_error_message(), (int)want, substr);
}

static void test_against_jinja2(void **state) {
    (void)state;
    const char *dir = getenv("LLM_TEST_MODELS");
    if (!dir)
        skip();
    char path[4096];
    snprintf(path, sizeof path, "%s/jinja/cases.txt", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: missing (run make test-models)", path);
    char *line = NULL, *tmpl = NULL, *vars = NULL, name[256] = "";
    size_t cap = 0, tmpl_len = 0, n_cases = 0, n_rejects = 0, n_failed = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        if (line[got - 1] == '\n')
            line[--got] = '\0';
        char *sp = strchr(line, ' ');
        assert_non_null(sp);
        *sp = '\0';
        const char *val = sp + 1;
        size_t vl = strlen(val);
        if (strcmp(line, "case") == 0) {
            snprintf(name, sizeof name, "%s", val);
        } else if (strcmp(line, "template") == 0) {
            free(tmpl);
            tmpl = unhex(val, vl, &tmpl_len);
        } else if (strcmp(line, "vars") == 0) {
            free(vars);
            vars = unhex(val, vl, NULL);
        } else {
            bool reject = strcmp(line, "reject") == 0;
            assert_true(reject || strcmp(line, "want") == 0);
            char *want = unhex(val, vl, NULL);
            cJSON *j = cJSON_Parse(vars);
            assert_non_null(j);
            char *out = NULL;
            size_t n = 0;
            llm_status st = llmi_jinja_render(tmpl, tmpl_len, j, NULL, -1, &out, &n);
            cJSON_Delete(j);
            if (reject && st != LLM_ERR_INVALID_ARGUMENT) {
                print_error("%s: jinja2 raises \"%s\" but we gave %d \"%s\"\n", name, want, (int)st,
                            st == LLM_OK ? out : llmi_error_message());
                n_failed++;
            } else if (!reject && (st != LLM_OK || n != strlen(want) || memcmp(out, want, n))) {
                print_error("%s:\n got  %d \"%s\"\n want \"%s\"\n", name, (int)st,
                            st == LLM_OK ? out : llmi_error_message(), want);
                n_failed++;
            }
            n_rejects += reject;
            n_cases++;
            llmi_free(out);
            free(want);
        }
    }
    free(line);
    free(tmpl);
    free(vars);
    fclose(f);
    print_message("%zu cases (%zu raise in jinja2), %zu differ\n", n_cases, n_rejects, n_failed);
    assert_int_equal(n_failed, 0);
    assert_true(n_cases >= 500);
    assert_true(n_rejects > 10);
}

static void test_basics(void **state) {
    (void)state;
    expect_text("{{ x }}", "{\"x\": \"hi\"}", "hi");
    expect_text("a{{ missing }}b", NULL, "ab");
    expect_text("{% for m in xs %}{{ m.a }},{% endfor %}",
                "{\"xs\": [{\"a\": 1}, {\"a\": \"two\"}]}", "1,two,");
    expect_text("{{ raise_exception }}", NULL, "<function raise_exception>");
    /* the template's final newline goes, as in jinja2 */
    expect_text("x\n", NULL, "x");
    expect_text("", NULL, "");
}

static void test_syntax_errors(void **state) {
    (void)state;
    expect_error("line one\n{{ 1 + }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT, "line 2:8");
    expect_error("{% if x %}\n  open", NULL, NULL, LLM_ERR_INVALID_ARGUMENT,
                 "line 2:7: syntax error: unexpected end of template, expected 'elif' or 'else' or "
                 "'endif'");
    expect_error("{% for %}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT, "line 1:8");
    expect_error("{{ 'unterminated }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT,
                 "unterminated string");
    expect_error("ab\n  {{ x", NULL, NULL, LLM_ERR_INVALID_ARGUMENT, "unclosed variable tag");
    expect_error("{# never closed", NULL, NULL, LLM_ERR_INVALID_ARGUMENT, "unclosed comment");
    expect_error("{% endfor %}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT, "unexpected 'endfor'");
    expect_error("{% include 'x' %}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT,
                 "unsupported tag 'include'");
    expect_error("\n\n{{ 1 | no_such_filter }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT,
                 "line 3:8: TemplateAssertionError: No filter named 'no_such_filter'");
    expect_error("{{ 1 is no_such_test }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT,
                 "No test named 'no_such_test'");
    expect_error("{{ x @ y }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT, "unexpected character");
    expect_error("{{ '\xc3(' }}", NULL, NULL, LLM_ERR_INVALID_UTF8, "byte 4");
}

static void test_runtime_errors(void **state) {
    (void)state;
    expect_error("{{ raise_exception('Only user and assistant roles') }}", NULL, NULL,
                 LLM_ERR_INVALID_ARGUMENT, "Only user and assistant roles");
    expect_error("{{ x.y }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT, "'x' is undefined");
    expect_error("{{ 1 + 'a' }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT,
                 "unsupported operand type(s) for +: 'int' and 'str'");
    expect_error("{{ 1 // 0 }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT, "ZeroDivisionError");
    expect_error("{% set xs = [] %}{{ xs.append(1) }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT,
                 "SecurityError");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT, "overflow");
    expect_error("{% set x = 1 %}{% set x.a = 2 %}", NULL, NULL, LLM_ERR_INVALID_ARGUMENT,
                 "non-namespace");
    expect_error("{{ x }}", "[1]", NULL, LLM_ERR_INVALID_ARGUMENT, "must be an object");
}

static void test_limits(void **state) {
    (void)state;
    llmi_jinja_limits lim = llmi_jinja_default_limits();
    /* a macro that calls itself forever */
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL,
                 LLM_ERR_LIMIT, "macro calls nest deeper than 100");
    /* nested loops that would run 10^12 times */
    expect_error("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}"
                 "{% endfor %}{% endfor %}{% endfor %}",
                 NULL, NULL, LLM_ERR_LIMIT, "loop iterations");
    lim.max_steps = 1000;
    expect_error("{% for a in range(900) %}{{ a }}{% endfor %}", NULL, &lim, LLM_ERR_LIMIT,
                 "evaluation steps");
    lim = llmi_jinja_default_limits();
    lim.max_output = 100;
    expect_error("{% for a in range(60) %}xy{% endfor %}", NULL, &lim, LLM_ERR_LIMIT,
                 "output exceeds 100 bytes");
    expect_error("{{ 'x' * 100000000 }}", NULL, NULL, LLM_ERR_LIMIT, "too long");
    lim = llmi_jinja_default_limits();
    lim.max_memory = 1 << 20;
    expect_error("{% set ns = namespace(s='x') %}{% for i in range(100000) %}"
                 "{% set ns.s = ns.s ~ 'abcdefgh' %}{% endfor %}",
                 NULL, &lim, LLM_ERR_LIMIT, "more than");
    /* macro calls inside deep expressions: the evaluation depth bounds the C stack */
    expect_error("{% macro f(n) %}{{ [[[[[[[[[[[[[[[[f(n + 1)]]]]]]]]]]]]]]]] }}{% endmacro %}"
                 "{{ f(0) }}",
                 NULL, NULL, LLM_ERR_LIMIT, "evaluation nests deeper than 1000");
    /* values a template nests without bound: printing stops, comparing is false */
    expect_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
                 "{% endfor %}{{ ns.x }}",
                 NULL, NULL, LLM_ERR_LIMIT, "nests deeper than 1000");
    expect_text("{% set ns = namespace(x=[], y=[]) %}{% for i in range(5000) %}"
                "{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}{{ ns.x == ns.y }}",
                NULL, "False");
    expect_error("{% set ns = namespace(x=[], y=[]) %}{% for i in range(5000) %}"
                 "{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}{{ ns.x < ns.y }}",
                 NULL, NULL, LLM_ERR_LIMIT, "nest deeper than 1000");
    /* parser nesting: 200 parentheses, 200 nested ifs */
    char deep[4096] = "{{ ";
    for (int i = 0; i < 200; i++)
        strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 200; i++)
        strcat(deep, ")");
    strcat(deep, " }}");
    expect_error(deep, NULL, NULL, LLM_ERR_LIMIT, "nesting deeper than 100");
    char ifs[8192] = "";
    for (int i = 0; i < 200; i++)
        strcat(ifs, "{% if 1 %}");
    expect_error(ifs, NULL, NULL, LLM_ERR_LIMIT, "nesting deeper than 100");
    char arr[4096] = "";
    for (int i = 0; i < 150; i++)
        strcat(arr, "[");
    char vars[4200];
    snprintf(vars, sizeof vars, "{\"x\": %s", arr);
    for (int i = 0; i < 150; i++)
        strcat(vars, "]");
    strcat(vars, "}");
    expect_error("{{ x }}", vars, NULL, LLM_ERR_LIMIT, "nests deeper");
}

#ifdef LLMI_TEST_HOOKS
/* Every allocation of a render fails in turn: a clean status, no leak. */
static void test_allocation_failures(void **state) {
    (void)state;
    static const char tmpl[] =
        "{% macro m(x) %}<{{ x | upper }}>{% endmacro %}{% set ns = namespace(n=0) %}"
        "{% for k, v in d.items() if v %}{{ m(k) }}{% set ns.n = ns.n + 1 %}{% endfor %}"
        "{{ d | tojson(indent=2) }}{{ ns.n }}{{ 'a b'.split() }}";
    cJSON *j = cJSON_Parse("{\"d\": {\"a\": 1, \"b\": [1, 2], \"c\": 0}}");
    assert_non_null(j);
    char *want = NULL, *out = NULL;
    size_t n;
    OK(llmi_jinja_render(tmpl, strlen(tmpl), j, NULL, -1, &want, &n));
    size_t fails = 0;
    for (uint64_t k = 1; k < 10000; k++) {
        llmi_alloc_fail_after(k);
        llm_status st = llmi_jinja_render(tmpl, strlen(tmpl), j, NULL, -1, &out, &n);
        llmi_alloc_fail_after(0);
        if (st == LLM_OK) {
            assert_string_equal(out, want);
            llmi_free(out);
            break;
        }
        assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
        assert_null(out);
        fails++;
    }
    assert_true(fails >= 2);
    llmi_free(want);
    cJSON_Delete(j);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basics),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_limits),
#ifdef LLMI_TEST_HOOKS
        cmocka_unit_test(test_allocation_failures),
#endif
        cmocka_unit_test(test_against_jinja2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
