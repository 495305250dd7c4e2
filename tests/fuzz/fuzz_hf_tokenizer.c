/* libFuzzer target: tokenizer.json + tokenizer_config.json -> tokenizer.ggml.*
 * keys (lib/hf/tokenizer_json.c), then the tokenizer built from them.
 *
 * The input is up to three parts separated by NUL bytes: tokenizer.json,
 * tokenizer_config.json (absent when there is no NUL) and a text. Checks:
 *  - the converter returns LLM_OK or one of BAD_FORMAT / UNSUPPORTED / LIMIT
 *    / OUT_OF_MEMORY, and a format error names the file it is about;
 *  - on LLM_OK the keys make a GGUF that opens; the tokenizer either loads or
 *    gives a clear status; a loaded tokenizer tokenizes the text (LLM_OK or
 *    LLM_ERR_INVALID_UTF8) into ids below its vocabulary size, and those
 *    ids detokenize to valid UTF-8. */
#include "gguf/gguf.h"
#include "hf/hf.h"
#include "tokenizer/tokenizer.h"

#include "fuzz_util.h"

static bool names_a_file(const char *msg) {
    return strstr(msg, "tokenizer.json: ") || strstr(msg, "tokenizer_config.json: ");
}

static void check_tokenizer(const llmi_tokenizer *t, const char *text, size_t len) {
    enum { CAP = 8192 };
    static llm_token ids[CAP];
    static char out[4 * CAP * 64];
    size_t n = 0;
    llm_status st = llmi_tokenize(
        t, text, len, LLM_TOKENIZE_PARSE_SPECIAL | LLM_TOKENIZE_ADD_SPECIAL, ids, CAP, &n);
    FUZZ_CHECK(st == LLM_OK || st == LLM_ERR_INVALID_UTF8 || st == LLM_ERR_BUFFER_TOO_SMALL ||
                   st == LLM_ERR_BAD_FORMAT || st == LLM_ERR_OUT_OF_MEMORY,
               "tokenize: %d %s", (int)st, llmi_error_message());
    if (st != LLM_OK)
        return;
    uint32_t n_vocab = llmi_tokenizer_n_vocab(t);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < n_vocab, "id %d of %u", ids[i], n_vocab);
    size_t got = 0;
    st = llmi_detokenize(t, ids, n, LLM_DETOKENIZE_SPECIAL, out, sizeof out, &got);
    FUZZ_CHECK(st == LLM_OK || st == LLM_ERR_BUFFER_TOO_SMALL || st == LLM_ERR_OUT_OF_MEMORY,
               "detokenize: %d %s", (int)st, llmi_error_message());
    if (st == LLM_OK)
        FUZZ_CHECK(fuzz_utf8_valid(out, got), "detokenized text is not UTF-8");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* tokenizer.json \0 tokenizer_config.json \0 text (which may hold NULs) */
    const char *parts[3] = {(const char *)data, NULL, NULL};
    size_t lens[3] = {size, 0, 0};
    int n_parts = 1;
    for (size_t i = 0, start = 0; i < size && n_parts < 3; i++) {
        if (data[i] != 0)
            continue;
        lens[n_parts - 1] = i - start;
        start = i + 1;
        parts[n_parts] = (const char *)data + start;
        lens[n_parts] = size - start;
        n_parts++;
    }
    const char *tok = parts[0], *cfg = parts[1] ? parts[1] : "", *text = parts[2];
    size_t tok_len = lens[0], cfg_len = lens[1], text_len = lens[2];
    bool has_cfg = parts[1] != NULL, has_text = parts[2] != NULL;
    /* Parts are not NUL-terminated at the end of the input: copy them. */
    char *tok_copy = malloc(tok_len + 1), *cfg_copy = malloc(cfg_len + 1);
    if (!tok_copy || !cfg_copy)
        abort();
    memcpy(tok_copy, tok, tok_len);
    memcpy(cfg_copy, cfg, cfg_len);
    tok_copy[tok_len] = cfg_copy[cfg_len] = 0;

    llmi_gguf_writer *w = NULL;
    if (llmi_gguf_writer_create(&w) != LLM_OK)
        abort();
    llm_status st =
        llmi_hf_tokenizer_keys_from_json(tok_copy, tok_len, has_cfg ? cfg_copy : NULL, cfg_len, w);
    FUZZ_CHECK(st == LLM_OK || st == LLM_ERR_BAD_FORMAT || st == LLM_ERR_UNSUPPORTED ||
                   st == LLM_ERR_LIMIT || st == LLM_ERR_OUT_OF_MEMORY,
               "keys: %d %s", (int)st, llmi_error_message());
    if (st == LLM_ERR_BAD_FORMAT || st == LLM_ERR_UNSUPPORTED)
        FUZZ_CHECK(names_a_file(llmi_error_message()), "message names no file: %s",
                   llmi_error_message());
    void *gguf_data = NULL;
    size_t gguf_size = 0;
    llmi_gguf *g = NULL;
    llmi_tokenizer *t = NULL;
    if (st == LLM_OK) {
        st = llmi_gguf_writer_to_memory(w, &gguf_data, &gguf_size);
        FUZZ_CHECK(st == LLM_OK, "writer: %s", llmi_error_message());
        st = llmi_gguf_open_memory(gguf_data, gguf_size, &g);
        FUZZ_CHECK(st == LLM_OK, "the keys do not make a GGUF: %s", llmi_error_message());
        st = llmi_tokenizer_load(g, &t);
        FUZZ_CHECK(st == LLM_OK || st == LLM_ERR_BAD_FORMAT || st == LLM_ERR_UNSUPPORTED ||
                       st == LLM_ERR_LIMIT,
                   "tokenizer: %d %s", (int)st, llmi_error_message());
        if (st == LLM_OK)
            check_tokenizer(t, has_text ? text : "Hello world", has_text ? text_len : 11);
    }
    llmi_tokenizer_free(t);
    llmi_gguf_close(g);
    llmi_free(gguf_data);
    llmi_gguf_writer_free(w);
    free(tok_copy);
    free(cfg_copy);
    return 0;
}
