/* libFuzzer target: whole-model loading from arbitrary file bytes.
 *
 * The input is written to a memfd and loaded through llmi_model_load by
 * path, with mmap and with read(); both must give the same status. This
 * reaches what the GGUF layer does not check: hyper-parameters, tensor
 * shapes and types against them, and the tokenizer built from (mutated)
 * vocabulary, merges and chat template. A model that loads is then used the
 * way a program would: info, tokenize, detokenize, chat template, and a
 * two-token greedy generation on a small session, so validation gaps show
 * up as out-of-bounds reads in the forward pass. Seeds (tests/fuzz/corpus/
 * model) are tiny test models from make_corpus.c. */
#include "model/model.h"
#include "session/session.h"

#include "fuzz_util.h"

#include <sys/mman.h>
#include <unistd.h>

static int g_fd = -1;
static char g_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g_fd = memfd_create("fuzz_model", 0);
    if (g_fd < 0) {
        perror("memfd_create");
        abort();
    }
    snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    return 0;
}

static void write_input(const uint8_t *data, size_t size) {
    if (ftruncate(g_fd, 0) != 0)
        abort();
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(g_fd, data + done, size - done, (off_t)done);
        if (n <= 0)
            abort();
        done += (size_t)n;
    }
}

typedef struct gen_state {
    uint32_t n_vocab, n_tokens;
} gen_state;

static bool on_token(llm_token tok, const char *piece, size_t n, void *user) {
    gen_state *g = user;
    FUZZ_CHECK(tok == LLM_TOKEN_NONE || (tok >= 0 && (uint32_t)tok < g->n_vocab),
               "generated token %d of %u", tok, g->n_vocab);
    FUZZ_CHECK(fuzz_utf8_valid(piece, n), "piece is not valid UTF-8");
    FUZZ_CHECK(piece[n] == '\0', "piece not NUL-terminated");
    g->n_tokens++;
    return true;
}

static void use_model(llm_model *m) {
    llm_model_info info = {sizeof info};
    FUZZ_CHECK(llm_model_get_info(m, &info) == LLM_OK, "info");
    FUZZ_CHECK(info.n_vocab == m->hp.n_vocab && info.n_vocab > 0, "n_vocab");
    uint32_t tv = llmi_tokenizer_n_vocab(m->tok);
    FUZZ_CHECK(tv <= m->hp.n_vocab, "tokenizer vocab %u > %u", tv, m->hp.n_vocab);
    llm_token special[] = {info.bos, info.eos, info.eot, info.pad};
    for (size_t i = 0; i < 4; i++)
        FUZZ_CHECK(special[i] == LLM_TOKEN_NONE || (special[i] >= 0 && (uint32_t)special[i] < tv),
                   "special token %d of %u", special[i], tv);

    /* Tokenizer built from the (possibly mutated) vocabulary. */
    static const char text[] = "Hello world, <|im_start|>user\n 123 caf\xc3\xa9 \xf0\x9f\x98\x80!";
    llm_token toks[256];
    size_t n = 0;
    llm_status st =
        llmi_tokenize(m->tok, text, sizeof text - 1,
                      LLM_TOKENIZE_ADD_SPECIAL | LLM_TOKENIZE_PARSE_SPECIAL, toks, 256, &n);
    if (st == LLM_OK) {
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(toks[i] >= 0 && (uint32_t)toks[i] < tv, "token %d of %u", toks[i], tv);
        char out[2048];
        size_t nb = 0;
        if (llmi_detokenize(m->tok, toks, n, LLM_DETOKENIZE_SPECIAL, out, sizeof out, &nb) ==
            LLM_OK)
            FUZZ_CHECK(fuzz_utf8_valid(out, nb), "detokenized text is not valid UTF-8");
    } else {
        n = 0;
    }
    char chat[1024];
    size_t nc = 0;
    const llm_chat_message msgs[] = {{"user", "hi"}, {"assistant", "hello"}};
    /* The model's own template runs as Jinja: a template that does not
     * parse or raises is INVALID_ARGUMENT, one past the interpreter's
     * limits is LIMIT, one whose text (or output) is not UTF-8 is
     * INVALID_UTF8; each says why. */
    st = llmi_chat_apply(m->tok, msgs, 2, true, chat, sizeof chat, &nc);
    FUZZ_CHECK(st == LLM_OK || st == LLM_ERR_UNSUPPORTED || st == LLM_ERR_BUFFER_TOO_SMALL ||
                   st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_LIMIT ||
                   st == LLM_ERR_INVALID_UTF8 || st == LLM_ERR_OUT_OF_MEMORY,
               "chat %d", st);
    FUZZ_CHECK(st == LLM_OK || llmi_error_message()[0] != '\0', "chat %d without a message", st);

    /* A small session and a two-token greedy generation. */
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 1;
    sp.n_ctx = 32;
    sp.max_batch_tokens = 8;
    sp.kv_block_size = 16;
    sp.kv_cache_bytes =
        2 * llmi_kv_block_bytes(m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim, sp.kv_block_size);
    llm_session *s = NULL;
    st = llmi_session_create(m, &sp, &s);
    FUZZ_CHECK(st == LLM_OK || st == LLM_ERR_OUT_OF_MEMORY, "session %d: %s", st,
               llmi_error_message());
    if (st != LLM_OK)
        return;
    if (n == 0 || n > 16) {
        toks[0] = 0;
        toks[1] = (llm_token)(m->hp.n_vocab - 1);
        n = 2;
    }
    gen_state gs = {m->hp.n_vocab, 0};
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 2;
    gp.on_token = on_token;
    gp.user = &gs;
    gp.ignore_eos = true;
    llm_generate_result res = {sizeof res};
    st = llmi_session_generate(s, toks, n, &gp, &res);
    FUZZ_CHECK(st == LLM_OK, "generate %d: %s", st, llmi_error_message());
    FUZZ_CHECK(res.n_generated_tokens == 2, "generated %u", res.n_generated_tokens);
    llmi_session_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    write_input(data, size);
    llm_status first = LLM_OK;
    for (int mmap_mode = 1; mmap_mode >= 0; mmap_mode--) {
        llm_model *m = (llm_model *)(uintptr_t)1;
        llm_status st = llmi_model_load(g_path, mmap_mode, &m);
        if (mmap_mode)
            first = st;
        else
            FUZZ_CHECK(st == first, "mmap load gave %d, read load %d", first, st);
        if (st != LLM_OK) {
            FUZZ_CHECK(m == NULL, "failed load left *out set");
            FUZZ_CHECK(st == LLM_ERR_BAD_FORMAT || st == LLM_ERR_UNSUPPORTED ||
                           st == LLM_ERR_OUT_OF_MEMORY || st == LLM_ERR_IO,
                       "status %d (%s)", st, llmi_error_message());
            FUZZ_CHECK(llmi_error_message()[0] != '\0', "no message for status %d", st);
            continue;
        }
        if (mmap_mode)
            use_model(m); /* the weights are the same bytes either way */
        llmi_model_free(m);
    }
    return 0;
}
