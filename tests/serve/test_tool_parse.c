/* Unit tests of llm-serve's tool-call handling that need no model: the
 * reply parser on crafted replies in each format (what a model might say,
 * well-formed or not), format detection from template text, the grammar
 * text that forces calls, and the message JSON a reply becomes. */
#include <cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "request.h"
#include "tool_parse.h"
#include "tools.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]";

/* A request offering TOOLS, parallel calls allowed. */
static serve_request TOOLS_REQUEST = {
    .chat = true, .tools_json = (char *)TOOLS, .n_tools = 2, .parallel_tool_calls = true};

typedef struct expect {
    const char *reply;
    const char *content; /* NULL: none */
    size_t n_calls;
    const char *names[2];
    const char *arguments[2];
} expect;

static void check(const char *format, const expect *e) {
    const tool_format *fmt = tool_format_find(format);
    assert_non_null(fmt);
    tool_reply r;
    assert_true(tool_reply_parse(e->reply, fmt, TOOLS, &r));
    if (r.n_calls != e->n_calls)
        fail_msg("%s: '%s': %zu calls, want %zu", format, e->reply, r.n_calls, e->n_calls);
    if (e->content) {
        if (!r.content || strcmp(r.content, e->content))
            fail_msg("%s: '%s': content '%s', want '%s'", format, e->reply,
                     r.content ? r.content : "(null)", e->content);
    } else {
        assert_null(r.content);
    }
    for (size_t i = 0; i < r.n_calls; i++) {
        assert_string_equal(r.calls[i].name, e->names[i]);
        assert_string_equal(r.calls[i].arguments, e->arguments[i]);
        assert_int_equal(strlen(r.calls[i].id), 29);
        assert_memory_equal(r.calls[i].id, "call_", 5);
        for (size_t k = 5; k < 29; k++)
            assert_true(strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                               r.calls[i].id[k]));
    }
    if (r.n_calls == 2)
        assert_string_not_equal(r.calls[0].id, r.calls[1].id);
    tool_reply_free(&r);
}

static void test_hermes_replies(void **state) {
    (void)state;
    static const expect cases[] = {
        {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
         "</tool_call>",
         NULL,
         1,
         {"get_weather"},
         {"{\"city\":\"Paris\"}"}},
        /* text before the calls is content; two calls */
        {"Let me check.\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}"
         "\n</tool_call>\n<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>\n",
         "Let me check.",
         2,
         {"get_weather", "get_time"},
         {"{\"city\":\"Rome\"}", "{}"}},
        /* arguments given as JSON text; the close cut off at the end */
        {"<tool_call>{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}",
         NULL,
         1,
         {"get_weather"},
         {"{\"city\":\"Oslo\"}"}},
        /* not calls: plain text, an undeclared function, broken JSON, arguments that
         * are not an object, text after the calls, a call without a name */
        {"Paris is sunny.", "Paris is sunny.", 0, {0}, {0}},
        {"<tool_call>\n{\"name\":\"rm_rf\",\"arguments\":{}}\n</tool_call>",
         "<tool_call>\n{\"name\":\"rm_rf\",\"arguments\":{}}\n</tool_call>",
         0,
         {0},
         {0}},
        {"<tool_call>\n{\"name\":\"get_time\",\"arguments\":{\"x\":}}\n</tool_call>",
         "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{\"x\":}}\n</tool_call>",
         0,
         {0},
         {0}},
        {"<tool_call>{\"name\":\"get_time\",\"arguments\":[1]}</tool_call>",
         "<tool_call>{\"name\":\"get_time\",\"arguments\":[1]}</tool_call>",
         0,
         {0},
         {0}},
        {"<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call> and more",
         "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call> and more",
         0,
         {0},
         {0}},
        {"<tool_call>{\"arguments\":{}}</tool_call>",
         "<tool_call>{\"arguments\":{}}</tool_call>",
         0,
         {0},
         {0}},
        /* the Llama key is accepted in the Hermes wrapper too */
        {"<tool_call>{\"name\":\"get_time\",\"parameters\":{}}</tool_call>",
         NULL,
         1,
         {"get_time"},
         {"{}"}},
        {"", "", 0, {0}, {0}},
        /* cut short by max_tokens: the complete calls count, a lone partial one does not */
        {"<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n"
         "{\"name\":\"get_wea",
         NULL,
         1,
         {"get_time"},
         {"{}"}},
        {"<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>\n<tool_c",
         NULL,
         1,
         {"get_time"},
         {"{}"}},
        {"<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool",
         NULL,
         1,
         {"get_time"},
         {"{}"}},
        {"<tool_call>\n{\"name\":\"get_time\",\"argum",
         "<tool_call>\n{\"name\":\"get_time\",\"argum",
         0,
         {0},
         {0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check("hermes", &cases[i]);
}

static void test_llama3_replies(void **state) {
    (void)state;
    static const expect cases[] = {
        {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
         NULL,
         1,
         {"get_weather"},
         {"{\"city\":\"Paris\"}"}},
        {"<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}",
         NULL,
         1,
         {"get_time"},
         {"{}"}},
        {"  {\"name\":\"get_time\",\"parameters\":{}}; {\"name\":\"get_weather\",\"arguments\":"
         "{\"city\":\"Rome\"}}\n",
         NULL,
         2,
         {"get_time", "get_weather"},
         {"{}", "{\"city\":\"Rome\"}"}},
        /* a call must be the whole reply */
        {"Sure: {\"name\":\"get_time\",\"parameters\":{}}",
         "Sure: {\"name\":\"get_time\",\"parameters\":{}}",
         0,
         {0},
         {0}},
        {"{\"name\":\"get_time\",\"parameters\":{}} done",
         "{\"name\":\"get_time\",\"parameters\":{}} done",
         0,
         {0},
         {0}},
        {"{\"answer\": 42}", "{\"answer\": 42}", 0, {0}, {0}},
        {"{\"name\":\"get_time\",\"parameters\":{}}; {\"name\"", NULL, 1, {"get_time"}, {"{}"}},
        {"<tool_call>{\"name\":\"get_time\",\"parameters\":{}}</tool_call>",
         "<tool_call>{\"name\":\"get_time\",\"parameters\":{}}</tool_call>",
         0,
         {0},
         {0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check("llama3", &cases[i]);
}

static void test_no_tools_no_calls(void **state) {
    (void)state;
    tool_reply r;
    const char *reply = "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>";
    assert_true(tool_reply_parse(reply, tool_format_find("hermes"), NULL, &r));
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, reply);
    tool_reply_free(&r);
}

static void test_format_detection(void **state) {
    (void)state;
    assert_string_equal(tool_format_detect(NULL)->name, "hermes");
    assert_string_equal(tool_format_detect("{{ messages }}")->name, "hermes");
    assert_string_equal(
        tool_format_detect("{% for t in tools %}<tool_call>{{ t | tojson }}{% endfor %}")->name,
        "hermes");
    assert_string_equal(
        tool_format_detect("{\"name\": function name, \"parameters\": dictionary}")->name,
        "llama3");
    assert_string_equal(tool_format_detect("<|start_header_id|>ipython<|end_header_id|>")->name,
                        "llama3");
    assert_null(tool_format_find("unknown"));
}

static void parse_request(const char *body, serve_request *req) {
    const serve_limits limits = {.max_tokens_limit = 64, .max_n = 4, .n_vocab = 1000};
    serve_error err;
    if (!serve_request_parse(body, strlen(body), true, &limits, req, &err))
        fail_msg("%d %s", err.http_status, err.message);
}

static void test_grammar_text(void **state) {
    (void)state;
    char body[1024];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":%s,"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}},"
             "\"parallel_tool_calls\":false}",
             TOOLS);
    serve_request req;
    parse_request(body, &req);
    serve_error err;
    char *text = tool_grammar_text(&req, tool_format_find("hermes"), &err);
    assert_non_null(text);
    /* exactly one call of the named function */
    assert_non_null(
        strstr(text, "\ntool-call-list ::= \"<tool_call>\\n\" root \"\\n</tool_call>\"\n"));
    assert_non_null(strstr(text, "get_time"));
    assert_null(strstr(text, "get_weather"));
    free(text);
    req.parallel_tool_calls = true;
    req.tool_choice = SERVE_TOOL_CHOICE_REQUIRED;
    text = tool_grammar_text(&req, tool_format_find("llama3"), &err);
    assert_non_null(text);
    assert_non_null(strstr(text, "tool-call-list ::= \"\" root \"\" ( \";\"\"\" root \"\" )*"));
    assert_non_null(strstr(text, "get_weather"));
    assert_non_null(strstr(text, "parameters"));
    free(text);
    serve_request_free(&req);
}

static void test_reply_json(void **state) {
    (void)state;
    cJSON *m = cJSON_CreateObject();
    bool calls = false;
    assert_true(
        tool_reply_put(m, "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>",
                       tool_format_find("hermes"), &TOOLS_REQUEST, false, 0, &calls));
    assert_true(calls);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(m, "content")));
    cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 0);
    assert_string_equal(cJSON_GetObjectItem(call, "type")->valuestring, "function");
    assert_null(cJSON_GetObjectItem(call, "index"));
    cJSON *fn = cJSON_GetObjectItem(call, "function");
    assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "get_time");
    assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{}");
    cJSON_Delete(m);
    /* a stream's delta: the call's index; no content key when there is none */
    m = cJSON_CreateObject();
    assert_true(tool_reply_put(m, "{\"name\":\"get_time\",\"parameters\":{}}",
                               tool_format_find("llama3"), &TOOLS_REQUEST, true, 0, &calls));
    assert_null(cJSON_GetObjectItem(m, "content"));
    call = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 0);
    assert_int_equal(cJSON_GetObjectItem(call, "index")->valueint, 0);
    cJSON_Delete(m);
    m = cJSON_CreateObject();
    assert_true(tool_reply_put(m, "Just text.", tool_format_find("hermes"), &TOOLS_REQUEST, false,
                               0, &calls));
    assert_false(calls);
    assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, "Just text.");
    assert_null(cJSON_GetObjectItem(m, "tool_calls"));
    cJSON_Delete(m);
}

/* What may be streamed before the reply ends: never a byte of a call, nor
 * the whitespace the parsed content drops; the last delta brings the rest. */
static void test_streamed_prefix(void **state) {
    (void)state;
    const tool_format *hermes = tool_format_find("hermes"), *llama3 = tool_format_find("llama3");
    static const struct {
        const char *text;
        size_t hermes, llama3;
    } cases[] = {
        {"", 0, 0},
        {"Sure, ", 5, 6},
        {"Sure.\n<", 5, 7},
        {"Sure.\n<tool", 5, 11},
        {"Sure.\n<tool_call>\n{\"name\"", 5, 25},
        {"Sure. <b>bold</b>", 17, 17},
        {"  {\"name\"", 9, 0},
        {"<|python", 8, 0},
        {"<|python_tag|>{", 15, 0},
        {"x <tool_c", 1, 9},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len = strlen(cases[i].text);
        assert_int_equal(tool_reply_sendable(cases[i].text, len, hermes), cases[i].hermes);
        assert_int_equal(tool_reply_sendable(cases[i].text, len, llama3), cases[i].llama3);
    }
    /* the last delta: the content after what was streamed, then the call */
    cJSON *m = cJSON_CreateObject();
    bool calls = false;
    assert_true(tool_reply_put(m,
                               "Let me look.\n<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}"
                               "\n</tool_call>",
                               hermes, &TOOLS_REQUEST, true, 6, &calls));
    assert_true(calls);
    assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, " look.");
    cJSON_Delete(m);
    /* two calls, parallel calls not allowed: the first one */
    serve_request single = TOOLS_REQUEST;
    single.parallel_tool_calls = false;
    m = cJSON_CreateObject();
    assert_true(
        tool_reply_put(m,
                       "{\"name\":\"get_time\",\"parameters\":{}};{\"name\":\"get_weather\","
                       "\"parameters\":{\"city\":\"Oslo\"}}",
                       llama3, &single, false, 0, &calls));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(m, "tool_calls")), 1);
    cJSON_Delete(m);
    m = cJSON_CreateObject();
    assert_true(tool_reply_put(m,
                               "{\"name\":\"get_time\",\"parameters\":{}};{\"name\":\"get_time\","
                               "\"parameters\":{}}",
                               llama3, &TOOLS_REQUEST, false, 0, &calls));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(m, "tool_calls")), 2);
    cJSON_Delete(m);
    m = cJSON_CreateObject();
    assert_true(tool_reply_put(m, "Let me look.", hermes, &TOOLS_REQUEST, true, 12, &calls));
    assert_false(calls);
    assert_null(cJSON_GetObjectItem(m, "content"));
    cJSON_Delete(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes_replies),    cmocka_unit_test(test_llama3_replies),
        cmocka_unit_test(test_no_tools_no_calls), cmocka_unit_test(test_format_detection),
        cmocka_unit_test(test_grammar_text),      cmocka_unit_test(test_reply_json),
        cmocka_unit_test(test_streamed_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
