/* libFuzzer target: tokenizer and detokenizers on arbitrary text and ids.
 *
 * Tokenizers, loaded once: the real model's (LLM_TEST_MODEL; SmolLM2's
 * byte-level BPE) or, when unset or unreadable, a tiny test model's, plus
 * two small SentencePiece vocabularies (with and without add_space_prefix).
 *
 * For each tokenizer the input is
 *  - tokenized with every flag combination: invalid UTF-8 must give
 *    LLM_ERR_INVALID_UTF8, valid text LLM_OK with in-range ids; the size
 *    query (capacity 0) must report exactly what the real call writes;
 *    ADD_SPECIAL may only add BOS in front and EOS at the end;
 *  - detokenized again: plain tokens must give the input back exactly
 *    (byte-level BPE always; SentencePiece without add_space_prefix unless
 *    the text holds U+2581, which it cannot tell from a space), and with
 *    PARSE_SPECIAL and LLM_DETOKENIZE_SPECIAL the same for BPE; not when
 *    the text holds a byte the vocabulary has no token for (dropped);
 *  - read as little-endian 16-bit token ids (including out-of-range ones)
 *    pushed one by one through the incremental detokenizer: every piece is
 *    valid UTF-8, a rejected id changes nothing, and the pieces plus the
 *    flush equal llmi_detokenize of the accepted ids. */
#define LLMI_TOKENIZER_INTERNAL
#include "gguf/gguf.h"
#include "model/testmodel.h"
#include "tokenizer/tokenizer.h"

#include "fuzz_util.h"

enum { N_TOK = 3 };
static llmi_tokenizer *g_tok[N_TOK];
static const char *const g_tok_name[N_TOK] = {"main (BPE)", "SentencePiece",
                                              "SentencePiece with add_space_prefix"};
static int g_cur; /* tokenizer being checked, for messages */

static llmi_tokenizer *load_from_gguf(llmi_gguf *g) {
    llmi_tokenizer *t = NULL;
    llm_status st = llmi_tokenizer_load(g, &t);
    llmi_gguf_close(g);
    if (st != LLM_OK) {
        fprintf(stderr, "fuzz_tokenize: tokenizer: %s\n", llmi_error_message());
        abort();
    }
    return t;
}

static llmi_tokenizer *main_tokenizer(void) {
    const char *path = getenv("LLM_TEST_MODEL");
    llmi_gguf *g = NULL;
    if (path && *path && llmi_gguf_open(path, true, &g) == LLM_OK) {
        fprintf(stderr, "fuzz_tokenize: tokenizer of %s\n", path);
        return load_from_gguf(g); /* the mapping goes; the tokenizer copies what it needs */
    }
    fprintf(stderr, "fuzz_tokenize: LLM_TEST_MODEL unset or unreadable: tiny test model\n");
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_layer = 1, p.n_embd = 4, p.n_head = 2, p.n_head_kv = 1, p.n_ff = 4;
    void *data = NULL;
    size_t size = 0;
    if (llmi_testmodel_to_memory(&p, &data, &size) != LLM_OK ||
        llmi_gguf_open_memory(data, size, &g) != LLM_OK)
        abort();
    llmi_tokenizer *t = load_from_gguf(g);
    llmi_free(data);
    return t;
}

/* A SentencePiece vocabulary: <unk> <s> </s>, <0x00>..<0xFF>, some pieces,
 * a control and a user-defined token. */
static llmi_tokenizer *spm_tokenizer(bool add_space_prefix) {
#define U "\xe2\x96\x81"
    static const char *const pieces[] = {
        U,       "h",       "e",   "l",   "o",        "w",           "r",    "d",
        "he",    "ll",      "llo", U "h", U "he",     U "hello",     "or",   U "w",
        U "wor", U "world", U U,   "lo",  "\xc3\xa9", "caf\xc3\xa9", U "caf"};
#undef U
    enum { NP = sizeof pieces / sizeof pieces[0], N = 3 + 256 + NP + 2 };
    static char bytes[256][8];
    const char *tokens[N];
    float scores[N];
    int32_t types[N];
    tokens[0] = "<unk>", tokens[1] = "<s>", tokens[2] = "</s>";
    types[0] = LLMI_TOKTYPE_UNKNOWN, types[1] = types[2] = LLMI_TOKTYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        tokens[3 + b] = bytes[b];
        types[3 + b] = LLMI_TOKTYPE_BYTE;
    }
    for (int i = 0; i < N; i++)
        scores[i] = 0.0f;
    for (int i = 0; i < NP; i++) {
        tokens[259 + i] = pieces[i];
        scores[259 + i] = -(float)(i % 7) - 0.5f;
        types[259 + i] = LLMI_TOKTYPE_NORMAL;
    }
    tokens[N - 2] = "<|im_start|>", types[N - 2] = LLMI_TOKTYPE_CONTROL;
    tokens[N - 1] = "<tool>", types[N - 1] = LLMI_TOKTYPE_USER_DEFINED;
    llmi_gguf_writer *w = NULL;
    void *data = NULL;
    size_t size = 0;
    llmi_gguf *g = NULL;
    if (llmi_gguf_writer_create(&w) != LLM_OK ||
        llmi_gguf_w_str(w, "tokenizer.ggml.model", "llama") != LLM_OK ||
        llmi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, N) != LLM_OK ||
        llmi_gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, N) != LLM_OK ||
        llmi_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, N) != LLM_OK ||
        llmi_gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", add_space_prefix) != LLM_OK ||
        llmi_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", add_space_prefix) != LLM_OK ||
        llmi_gguf_writer_to_memory(w, &data, &size) != LLM_OK ||
        llmi_gguf_open_memory(data, size, &g) != LLM_OK)
        abort();
    llmi_gguf_writer_free(w);
    llmi_tokenizer *t = load_from_gguf(g);
    llmi_free(data);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g_tok[0] = main_tokenizer();
    g_tok[1] = spm_tokenizer(false);
    g_tok[2] = spm_tokenizer(true);
    return 0;
}

static llm_token *tokenize(const llmi_tokenizer *t, const char *text, size_t len, uint32_t flags,
                           bool valid, size_t *n_out) {
    size_t need = 0;
    llm_status st = llmi_tokenize(t, text, len, flags, NULL, 0, &need);
    if (!valid) {
        FUZZ_CHECK(st == LLM_ERR_INVALID_UTF8, "invalid UTF-8 gave %d", st);
        FUZZ_CHECK(strstr(llmi_error_message(), "byte offset"), "message '%s'",
                   llmi_error_message());
        return NULL;
    }
    FUZZ_CHECK(st == (need ? LLM_ERR_BUFFER_TOO_SMALL : LLM_OK), "size query gave %d (%s)", st,
               llmi_error_message());
    llm_token *toks = malloc((need + 1) * sizeof *toks);
    toks[need] = 12345;
    size_t n = 0;
    st = llmi_tokenize(t, text, len, flags, toks, need, &n);
    FUZZ_CHECK(st == LLM_OK && n == need, "tokenize gave %d, %zu of %zu tokens", st, n, need);
    FUZZ_CHECK(toks[need] == 12345, "wrote past the capacity");
    if (need > 0) {
        size_t m = 0;
        FUZZ_CHECK(llmi_tokenize(t, text, len, flags, toks, need - 1, &m) ==
                           LLM_ERR_BUFFER_TOO_SMALL &&
                       m == need,
                   "one short: %zu", m);
    }
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(toks[i] >= 0 && (uint32_t)toks[i] < t->n_vocab, "token %d of %u", toks[i],
                   t->n_vocab);
    /* Strict gives the same tokens, or refuses naming a byte offset. */
    llm_token *strict = malloc((need + 1) * sizeof *strict);
    size_t ns = 0;
    st = llmi_tokenize(t, text, len, flags | LLM_TOKENIZE_STRICT, strict, need, &ns);
    FUZZ_CHECK((st == LLM_OK && ns == n && (n == 0 || !memcmp(strict, toks, n * sizeof *toks))) ||
                   (st == LLM_ERR_INVALID_ARGUMENT && ns == 0 &&
                    strstr(llmi_error_message(), "byte offset")),
               "strict gave %d (%s), %zu of %zu tokens", st, llmi_error_message(), ns, n);
    free(strict);
    *n_out = n;
    return toks;
}

static char *detokenize(const llmi_tokenizer *t, const llm_token *toks, size_t n, uint32_t flags,
                        size_t *len) {
    size_t need = 0; /* what the buffer must hold, the NUL included */
    llm_status st = llmi_detokenize(t, toks, n, flags, NULL, 0, &need);
    FUZZ_CHECK(st == LLM_ERR_BUFFER_TOO_SMALL && need >= 1, "detokenize size query gave %d, %zu",
               st, need);
    char *buf = malloc(need);
    size_t got = 0;
    if (need > 1)
        FUZZ_CHECK(llmi_detokenize(t, toks, n, flags, buf, need - 1, &got) ==
                           LLM_ERR_BUFFER_TOO_SMALL &&
                       got == need,
                   "one byte short: %zu of %zu", got, need);
    st = llmi_detokenize(t, toks, n, flags, buf, need, &got);
    FUZZ_CHECK(st == LLM_OK && got + 1 == need && buf[got] == '\0', "detokenize %d, %zu of %zu",
               st, got, need);
    FUZZ_CHECK(fuzz_utf8_valid(buf, got), "detokenized text is not valid UTF-8");
    *len = got;
    return buf;
}

static void check_text(const llmi_tokenizer *t, const char *text, size_t len) {
    bool valid = fuzz_utf8_valid(text, len);
    size_t n[4] = {0};
    llm_token *toks[4] = {0};
    for (uint32_t flags = 0; flags < 4; flags++)
        toks[flags] = tokenize(t, text, len, flags, valid, &n[flags]);
    if (!valid)
        return;

    /* ADD_SPECIAL: [BOS] + plain + [EOS], nothing else changes. */
    for (uint32_t base = 0; base < 4; base += 2) {
        const llm_token *a = toks[base], *b = toks[base | LLM_TOKENIZE_ADD_SPECIAL];
        size_t lead = t->add_bos, tail = t->add_eos;
        FUZZ_CHECK(n[base | 1] == n[base] + lead + tail, "ADD_SPECIAL: %zu vs %zu tokens",
                   n[base | 1], n[base]);
        FUZZ_CHECK(!lead || b[0] == t->bos, "no BOS");
        FUZZ_CHECK(!tail || b[n[base | 1] - 1] == t->eos, "no EOS");
        FUZZ_CHECK(n[base] == 0 || memcmp(a, b + lead, n[base] * sizeof *a) == 0,
                   "ADD_SPECIAL changed the tokens");
    }

    /* A byte without a byte token is dropped, as llama.cpp drops it (SmolLM2
     * has none for 0x04 0x06 0x13 0x14 0x16 0x1d 0xf1 0xf2): no round trip. */
    bool lossless = true;
    for (size_t i = 0; i < len && lossless; i++)
        lossless = t->byte_tok[(uint8_t)text[i]] >= 0;
    bool bpe = lossless && t->model == LLMI_TOKMODEL_BPE;
    bool has_u2581 = memmem(text, len, "\xe2\x96\x81", 3) != NULL;
    size_t dl = 0;
    char *back = detokenize(t, toks[0], n[0], 0, &dl);
    if (bpe || (lossless && !t->add_space_prefix && !has_u2581))
        FUZZ_CHECK(dl == len && memcmp(back, text, len) == 0,
                   "%s: round trip: %zu bytes in, %zu out: '%.*s'", g_tok_name[g_cur], len, dl,
                   (int)dl, back);
    free(back);
    back = detokenize(t, toks[LLM_TOKENIZE_PARSE_SPECIAL], n[LLM_TOKENIZE_PARSE_SPECIAL],
                      LLM_DETOKENIZE_SPECIAL, &dl);
    if (bpe)
        FUZZ_CHECK(dl == len && memcmp(back, text, len) == 0,
                   "%s: special round trip: %zu bytes in, %zu out: '%.*s'", g_tok_name[g_cur], len,
                   dl, (int)dl, back);
    free(back);
    for (int i = 0; i < 4; i++)
        free(toks[i]);
}

static void check_ids(const llmi_tokenizer *t, const uint8_t *data, size_t size, uint32_t flags) {
    size_t n_ids = size / 2;
    llm_token *accepted = malloc((n_ids + 1) * sizeof *accepted);
    size_t n_acc = 0, total = 0, cap = 256;
    char *all = malloc(cap);
    llmi_detok d;
    llmi_detok_init(&d, t, flags);
    char piece[64];
    for (size_t i = 0; i < n_ids; i++) {
        uint32_t v = (uint32_t)data[2 * i] | (uint32_t)data[2 * i + 1] << 8;
        llm_token id = (llm_token)(v % (t->n_vocab + 2)) - 1; /* -1 .. n_vocab */
        llmi_detok before = d;
        size_t need = 0;
        llm_status st = llmi_detok_push(&d, id, NULL, 0, &need);
        if (id < 0 || (uint32_t)id >= t->n_vocab) {
            FUZZ_CHECK(st == LLM_ERR_INVALID_ARGUMENT, "bad id %d gave %d", id, st);
            FUZZ_CHECK(memcmp(&before, &d, sizeof d) == 0, "bad id changed the state");
            continue;
        }
        FUZZ_CHECK(st == LLM_ERR_BUFFER_TOO_SMALL, "size query gave %d", st);
        FUZZ_CHECK(memcmp(&before, &d, sizeof d) == 0, "BUFFER_TOO_SMALL changed the state");
        FUZZ_CHECK(need >= 1, "size query asked for %zu bytes", need); /* NUL included */
        char *buf = need <= sizeof piece ? piece : malloc(need);
        size_t got = 0;
        st = llmi_detok_push(&d, id, buf, need, &got);
        FUZZ_CHECK(st == LLM_OK && got + 1 == need && buf[got] == '\0', "push %d: %zu of %zu", st,
                   got, need);
        FUZZ_CHECK(fuzz_utf8_valid(buf, got), "piece of token %d is not valid UTF-8", id);
        FUZZ_CHECK(d.n_pending < 4, "%zu bytes held back", d.n_pending);
        while (total + got + 16 > cap)
            all = realloc(all, cap *= 2);
        memcpy(all + total, buf, got);
        total += got;
        if (buf != piece)
            free(buf);
        accepted[n_acc++] = id;
    }
    size_t got = 0;
    llm_status st = llmi_detok_flush(&d, piece, sizeof piece, &got);
    FUZZ_CHECK(st == LLM_OK && fuzz_utf8_valid(piece, got), "flush %d", st);
    FUZZ_CHECK(d.n_pending == 0, "flush kept bytes");
    memcpy(all + total, piece, got);
    total += got;
    size_t whole_len = 0;
    char *whole = detokenize(t, accepted, n_acc, flags, &whole_len);
    FUZZ_CHECK(whole_len == total && memcmp(whole, all, total) == 0,
               "incremental (%zu bytes) != whole (%zu bytes)", total, whole_len);
    free(whole);
    free(all);
    free(accepted);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int i = 0; i < N_TOK; i++) {
        g_cur = i;
        check_text(g_tok[i], (const char *)data, size);
        check_ids(g_tok[i], data, size, 0);
        check_ids(g_tok[i], data, size, LLM_DETOKENIZE_SPECIAL);
    }
    return 0;
}
