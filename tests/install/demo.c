/*
 * A downstream program, built by tests/install/run.sh against an installed
 * libllminfer through pkg-config only: <llm.h> and -lllminfer, nothing from
 * the source tree.
 *
 *   demo [model.gguf]    (the model also comes from $LLM_TEST_MODEL)
 *
 * Checks the version, the error path of llm_model_load() and, given a model,
 * tokenizes "Hello" and generates 8 greedy tokens. Exit status 0 on success.
 */
#include <llm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "demo: FAILED: %s (%s:%d): ", #cond, __FILE__, __LINE__);              \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

struct text {
    char buf[512];
    size_t len;
    unsigned calls;
};

static bool on_token(llm_token token, const char *piece, size_t piece_len, void *user) {
    struct text *t = user;
    (void)token;
    t->calls++;
    if (piece_len > sizeof t->buf - 1 - t->len)
        piece_len = sizeof t->buf - 1 - t->len;
    memcpy(t->buf + t->len, piece, piece_len);
    t->len += piece_len;
    t->buf[t->len] = '\0';
    return true;
}

static void run_model(const char *path) {
    llm_model *model = NULL;
    llm_status st = llm_model_load(path, NULL, &model);
    CHECK(st == LLM_OK, "llm_model_load(%s): %s: %s", path, llm_status_name(st), llm_last_error());
    if (st != LLM_OK)
        return;

    llm_model_info info = {.struct_size = sizeof info};
    st = llm_model_get_info(model, &info);
    CHECK(st == LLM_OK, "llm_model_get_info: %s: %s", llm_status_name(st), llm_last_error());
    if (st == LLM_OK)
        printf("demo: model %s (%s), %u layers, %u tokens in vocabulary\n",
               info.name ? info.name : "?", info.architecture ? info.architecture : "?",
               info.n_layers, info.n_vocab);

    llm_token prompt[64];
    size_t n_prompt = 0;
    st = llm_tokenize(model, "Hello", 5, LLM_TOKENIZE_ADD_SPECIAL, prompt, 64, &n_prompt);
    CHECK(st == LLM_OK, "llm_tokenize: %s: %s", llm_status_name(st), llm_last_error());
    CHECK(st != LLM_OK || n_prompt > 0, "llm_tokenize(\"Hello\") gave no tokens");

    llm_session *session = NULL;
    if (st == LLM_OK && n_prompt > 0) {
        llm_session_params sp;
        llm_session_params_init(&sp);
        sp.n_ctx = 256;
        st = llm_session_create(model, &sp, &session);
        CHECK(st == LLM_OK, "llm_session_create: %s: %s", llm_status_name(st), llm_last_error());
    }
    if (session) {
        struct text out = {{0}, 0, 0};
        llm_generate_params gp;
        llm_generate_params_init(&gp);
        gp.max_new_tokens = 8;
        gp.sampling = NULL; /* greedy */
        gp.on_token = on_token;
        gp.user = &out;
        gp.ignore_eos = true;
        llm_generate_result res = {.struct_size = sizeof res};
        st = llm_generate(session, prompt, n_prompt, &gp, &res);
        CHECK(st == LLM_OK, "llm_generate: %s: %s", llm_status_name(st), llm_last_error());
        if (st == LLM_OK) {
            CHECK(res.n_generated_tokens == 8, "generated %u tokens, expected 8",
                  res.n_generated_tokens);
            CHECK(res.n_prompt_tokens == n_prompt, "n_prompt_tokens %u, expected %zu",
                  res.n_prompt_tokens, n_prompt);
            CHECK(res.finish_reason == LLM_FINISH_LENGTH, "finish_reason %d, expected %d",
                  (int)res.finish_reason, (int)LLM_FINISH_LENGTH);
            CHECK(out.calls == 8, "on_token called %u times, expected 8", out.calls);
            printf("demo: \"Hello\" -> %zu prompt tokens, generated \"%s\"\n", n_prompt, out.buf);
        }
        llm_session_free(session);
    }
    llm_model_free(model);
}

int main(int argc, char **argv) {
    printf("demo: libllminfer %s (%u), built against %d.%d.%d\n", llm_version_string(),
           llm_version_number(), LLM_VERSION_MAJOR, LLM_VERSION_MINOR, LLM_VERSION_PATCH);
    CHECK(llm_version_number() == LLM_VERSION_NUMBER, "run-time version %u, header version %d",
          llm_version_number(), LLM_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", LLM_VERSION_MAJOR, LLM_VERSION_MINOR,
             LLM_VERSION_PATCH);
    CHECK(strcmp(llm_version_string(), want) == 0, "llm_version_string() is \"%s\"",
          llm_version_string());

    const char *s = llm_status_str(LLM_ERR_IO);
    CHECK(s != NULL && s[0] != '\0', "llm_status_str(LLM_ERR_IO) is empty");

    llm_model *model = (llm_model *)&failures; /* must be reset to NULL */
    llm_status st = llm_model_load("/nonexistent/llminfer-install-test.gguf", NULL, &model);
    CHECK(st == LLM_ERR_IO, "loading a missing file gave %s (%s), expected LLM_ERR_IO",
          llm_status_name(st), llm_status_str(st));
    CHECK(model == NULL, "llm_model_load left *out != NULL on failure");
    if (st != LLM_OK)
        printf("demo: missing file -> %s (%s): %s\n", llm_status_name(st), llm_status_str(st),
               llm_last_error());
    if (st == LLM_OK)
        llm_model_free(model);

    const char *path = argc > 1 ? argv[1] : getenv("LLM_TEST_MODEL");
    if (path && *path)
        run_model(path);
    else
        printf("demo: no model given (LLM_TEST_MODEL unset); skipped generation\n");

    if (failures) {
        fprintf(stderr, "demo: %d check(s) failed\n", failures);
        return 1;
    }
    return 0;
}
