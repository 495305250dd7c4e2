/* tokenizer.json -> tokenizer.ggml.* keys (lib/hf/tokenizer_json.c).
 *
 * Against independent references: the folders tests/models/gen_tokenizers.py
 * writes under $LLM_TEST_MODELS/tok/ (tokenizer.json rebuilt with the
 * `tokenizers` package from the SmolLM2 and Gemma 3 GGUF vocabularies, plus
 * the ids `tokenizers` gives for a varied text set): our tokenizer loaded
 * from the derived keys must give those ids and decode them as `tokenizers`
 * does; the derived keys must equal the ones llama.cpp's converter wrote into
 * the GGUF file (its tokenizer.* keys copied into vocab.gguf), and the
 * tokenizer loaded from those must give the same ids. A test skips when its
 * folder is absent. Then bad input on small inline JSON. */
#define LLMI_TOKENIZER_INTERNAL
#include "core/core.h"
#include "gguf/gguf.h"
#include "hf/hf.h"
#include "tokenizer/tokenizer.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define OK(expr) assert_int_equal((expr), LLM_OK)

#define EXPECT_ERR(expr, status, substr)                                                           \
    do {                                                                                           \
        llm_status st_ = (expr);                                                                   \
        if (st_ != (status) || !strstr(llmi_error_message(), (substr)))                            \
            fail_msg("%s: got %d \"%s\", want %d containing \"%s\"", #expr, (int)st_,              \
                     llmi_error_message(), (int)(status), substr);                                 \
    } while (0)

/* A tokenizer with the GGUF it was loaded from. */
typedef struct loaded {
    void *data;
    llmi_gguf *g;
    llmi_tokenizer *tok;
} loaded;

static void unload(loaded *l) {
    llmi_tokenizer_free(l->tok);
    llmi_gguf_close(l->g);
    llmi_free(l->data);
    memset(l, 0, sizeof *l);
}

/* Runs the writer's keys through a GGUF in memory, as the folder loader
 * does. */
static llm_status load_keys(llmi_gguf_writer *w, loaded *l) {
    size_t size = 0;
    llm_status st = llmi_gguf_writer_to_memory(w, &l->data, &size);
    if (st == LLM_OK)
        st = llmi_gguf_open_memory(l->data, size, &l->g);
    if (st == LLM_OK)
        st = llmi_tokenizer_load(l->g, &l->tok);
    return st;
}

static llm_status load_folder(const char *folder, loaded *l) {
    memset(l, 0, sizeof *l);
    llmi_gguf_writer *w = NULL;
    llm_status st = llmi_gguf_writer_create(&w);
    if (st == LLM_OK)
        st = llmi_hf_tokenizer_keys(folder, w);
    if (st == LLM_OK)
        st = load_keys(w, l);
    llmi_gguf_writer_free(w);
    return st;
}

static llm_status load_json(const char *tok_json, const char *cfg_json, loaded *l) {
    memset(l, 0, sizeof *l);
    llmi_gguf_writer *w = NULL;
    llm_status st = llmi_gguf_writer_create(&w);
    if (st == LLM_OK)
        st = llmi_hf_tokenizer_keys_from_json(tok_json, strlen(tok_json), cfg_json,
                                              cfg_json ? strlen(cfg_json) : 0, w);
    if (st == LLM_OK)
        st = load_keys(w, l);
    llmi_gguf_writer_free(w);
    return st;
}

/* $LLM_TEST_MODELS/tok/<name>, or NULL (the caller skips). */
static char *tok_folder(const char *name) {
    const char *base = getenv("LLM_TEST_MODELS");
    static char path[4096];
    if (!base)
        return NULL;
    snprintf(path, sizeof path, "%s/tok/%s/ids.txt", base, name);
    if (access(path, R_OK) != 0)
        return NULL;
    snprintf(path, sizeof path, "%s/tok/%s", base, name);
    return path;
}

static size_t unhex(const char *h, char *out) {
    if (strcmp(h, "-") == 0)
        return 0;
    size_t n = 0;
    for (; h[0] && h[1]; h += 2) {
        unsigned v;
        sscanf(h, "%2x", &v);
        out[n++] = (char)v;
    }
    return n;
}

/* ---- arrays of keys ---- */

static void expect_same_strs(const llmi_gguf *a, const llmi_gguf *b, const char *key) {
    const llmi_gguf_kv *ka = NULL, *kb = NULL;
    OK(llmi_gguf_get_arr(a, key, true, LLMI_GGUF_STRING, &ka));
    OK(llmi_gguf_get_arr(b, key, true, LLMI_GGUF_STRING, &kb));
    assert_int_equal(ka->arr_len, kb->arr_len);
    for (uint64_t i = 0; i < ka->arr_len; i++) {
        llmi_str x = ka->arr_strs[i], y = kb->arr_strs[i];
        if (x.len != y.len || memcmp(x.ptr, y.ptr, x.len) != 0)
            fail_msg("%s[%llu]: '%.*s' vs '%.*s'", key, (unsigned long long)i, (int)x.len, x.ptr,
                     (int)y.len, y.ptr);
    }
}

static void expect_same_i32s(const llmi_gguf *a, const llmi_gguf *b, const char *key) {
    const llmi_gguf_kv *ka = NULL, *kb = NULL;
    OK(llmi_gguf_get_arr(a, key, true, LLMI_GGUF_I32, &ka));
    OK(llmi_gguf_get_arr(b, key, true, LLMI_GGUF_I32, &kb));
    assert_int_equal(ka->arr_len, kb->arr_len);
    for (uint64_t i = 0; i < ka->arr_len; i++) {
        int32_t x, y;
        memcpy(&x, ka->arr_data + 4 * i, 4);
        memcpy(&y, kb->arr_data + 4 * i, 4);
        if (x != y)
            fail_msg("%s[%llu]: %d vs %d", key, (unsigned long long)i, x, y);
    }
}

static void expect_same_u32(const llmi_gguf *a, const llmi_gguf *b, const char *key) {
    uint32_t x = 0xffffffffu, y = 0xffffffffu;
    OK(llmi_gguf_get_u32(a, key, false, &x));
    OK(llmi_gguf_get_u32(b, key, false, &y));
    if (x != y)
        fail_msg("%s: %u vs %u", key, x, y);
}

static void expect_same_bool(const llmi_gguf *a, const llmi_gguf *b, const char *key) {
    bool x = false, y = false;
    OK(llmi_gguf_get_bool(a, key, false, &x));
    OK(llmi_gguf_get_bool(b, key, false, &y));
    if (x != y)
        fail_msg("%s: %d vs %d", key, x, y);
}

/* ---- against tokenizers and the GGUF ---- */

/* decode: compare our detokenization with tokenizers' decode (not for
 * WordPiece, whose decoder joins pieces its own way). */
static void check_vocabulary_ex(const char *name, bool from_gguf, bool sentencepiece, bool decode) {
    const char *folder = tok_folder(name);
    if (!folder)
        skip();
    loaded hf;
    if (load_folder(folder, &hf) != LLM_OK)
        fail_msg("%s: %s", folder, llmi_error_message());
    loaded file = {0};
    if (from_gguf) {
        char path[4200];
        snprintf(path, sizeof path, "%s/vocab.gguf", folder);
        OK(llmi_gguf_open(path, true, &file.g));
        OK(llmi_tokenizer_load(file.g, &file.tok));
        expect_same_strs(hf.g, file.g, "tokenizer.ggml.tokens");
        expect_same_i32s(hf.g, file.g, "tokenizer.ggml.token_type");
        if (!sentencepiece) {
            expect_same_strs(hf.g, file.g, "tokenizer.ggml.merges");
            llmi_str a, b;
            OK(llmi_gguf_get_str(hf.g, "tokenizer.ggml.pre", true, &a));
            OK(llmi_gguf_get_str(file.g, "tokenizer.ggml.pre", true, &b));
            assert_true(a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0);
            expect_same_strs(hf.g, file.g, "tokenizer.ggml.merges");
        }
        expect_same_u32(hf.g, file.g, "tokenizer.ggml.bos_token_id");
        expect_same_u32(hf.g, file.g, "tokenizer.ggml.eos_token_id");
        expect_same_u32(hf.g, file.g, "tokenizer.ggml.unknown_token_id");
        expect_same_u32(hf.g, file.g, "tokenizer.ggml.padding_token_id");
        expect_same_bool(hf.g, file.g, "tokenizer.ggml.add_bos_token");
        expect_same_bool(hf.g, file.g, "tokenizer.ggml.add_space_prefix");
    }

    char ids_path[4200];
    snprintf(ids_path, sizeof ids_path, "%s/ids.txt", folder);
    FILE *f = fopen(ids_path, "r");
    assert_non_null(f);
    size_t cap = 1 << 16;
    char *line = malloc(cap), *text = malloc(cap), *want_dec = malloc(cap), *got_dec = malloc(cap);
    llm_token *want = malloc(cap * sizeof(llm_token)), *got = malloc(cap * sizeof(llm_token));
    assert_true(line && text && want_dec && got_dec && want && got);
    int rows = 0, failures = 0;
    while (fgets(line, (int)cap, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        char *colon = strstr(line, " : ");
        assert_non_null(colon);
        *colon = 0;
        int add_special = 0;
        char hex_text[1 << 14], hex_dec[1 << 14];
        assert_int_equal(sscanf(line, "%d %16383s %16383s", &add_special, hex_text, hex_dec), 3);
        size_t len = unhex(hex_text, text), dec_len = unhex(hex_dec, want_dec);
        size_t n_want = 0;
        for (char *p = colon + 3, *end; *p && *p != '\n'; p = end) {
            want[n_want++] = (llm_token)strtol(p, &end, 10);
            while (*end == ' ')
                end++;
        }
        uint32_t flags = LLM_TOKENIZE_PARSE_SPECIAL | (add_special ? LLM_TOKENIZE_ADD_SPECIAL : 0);
        size_t n_got = 0;
        OK(llmi_tokenize(hf.tok, text, len, flags, got, cap, &n_got));
        rows++;
        if (n_got != n_want || memcmp(got, want, n_got * sizeof(llm_token)) != 0) {
            print_error("%s: '%.*s' (add_special %d): %zu ids, want %zu; first difference at %zu\n",
                        name, (int)len, text, add_special, n_got, n_want, (size_t)0);
            failures++;
            continue;
        }
        size_t n_dec = 0;
        OK(llmi_detokenize(hf.tok, want, n_want, LLM_DETOKENIZE_SPECIAL, got_dec, cap, &n_dec));
        if (decode && (n_dec != dec_len || memcmp(got_dec, want_dec, dec_len) != 0)) {
            print_error("%s: decode of '%.*s' gives '%.*s', tokenizers '%.*s'\n", name, (int)len,
                        text, (int)n_dec, got_dec, (int)dec_len, want_dec);
            failures++;
        }
        if (file.tok) {
            OK(llmi_tokenize(file.tok, text, len, flags, got, cap, &n_got));
            if (n_got != n_want || memcmp(got, want, n_got * sizeof(llm_token)) != 0) {
                print_error("%s: '%.*s': the GGUF's tokenizer differs\n", name, (int)len, text);
                failures++;
            }
        }
    }
    fclose(f);
    print_message("%s: %d texts\n", name, rows);
    free(line);
    free(text);
    free(want_dec);
    free(got_dec);
    free(want);
    free(got);
    unload(&hf);
    unload(&file);
    assert_true(rows >= 20);
    assert_int_equal(failures, 0);
}

static void check_vocabulary(const char *name, bool from_gguf, bool sentencepiece) {
    check_vocabulary_ex(name, from_gguf, sentencepiece, true);
}

static void test_smollm2(void **state) {
    (void)state;
    check_vocabulary("smollm2", true, false);
}

static void test_gemma3(void **state) {
    (void)state;
    check_vocabulary("gemma3", true, true);
}

/* Merge ranks that disagree with vocabulary order, Llama 2's normalizer
 * (a space before every fragment), byte fallback, BOS from the
 * post-processor's template and tokenizer_config.json. */
static void test_tiny_sentencepiece(void **state) {
    (void)state;
    check_vocabulary("tiny-spm", false, true);
}

/* WordPiece: all-MiniLM-L6-v2's uncased BERT vocabulary (BertNormalizer
 * with accent stripping, CJK spacing, [CLS] ... [SEP] from
 * TemplateProcessing) on accents, CJK, Hangul, emoji, control and format
 * characters, punctuation of many scripts, words past
 * max_input_chars_per_word. */
static void test_minilm_wordpiece(void **state) {
    (void)state;
    check_vocabulary_ex("minilm", false, false, false);
}

/* WordPiece with BertNormalizer's other switches (cased, accents kept, no
 * CJK spacing), max_input_chars_per_word 12 and BertProcessing. */
static void test_tiny_wordpiece(void **state) {
    (void)state;
    check_vocabulary_ex("tiny-wpm", false, false, false);
}

/* ---- small inline tokenizer.json files ---- */

#define BL_PRE                                                                                     \
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"                        \
    "\"trim_offsets\":true,\"use_regex\":true},\"decoder\":{\"type\":\"ByteLevel\"}"

/* A byte-level vocabulary: the 256 byte characters are not all there, so
 * only ASCII letters tokenize. */
static const char small_bpe[] =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":5,\"content\":\"<|end|>\","
    "\"special\":true},{\"id\":6,\"content\":\"<tool>\",\"special\":false}],"
    "\"normalizer\":null," BL_PRE ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,"
    "\"ab\":2,\"\\u0120\":3,\"\\u0120ab\":4,\"<|end|>\":5,\"<tool>\":6},"
    "\"merges\":[\"a b\",[\"\\u0120\",\"ab\"]]}}";

static void test_small_bpe(void **state) {
    (void)state;
    static const char cfg[] =
        "{\"bos_token\":null,\"eos_token\":{\"content\":\"<|end|>\",\"special\":true},"
        "\"added_tokens_decoder\":{\"1\":{\"content\":\"b\",\"special\":true},"
        "\"2\":{\"content\":\"not ab\",\"special\":true},\"x\":{},\"99\":{\"content\":\"b\"}},"
        "\"add_bos_token\":false,\"add_eos_token\":true,\"chat_template\":["
        "{\"name\":\"default\",\"template\":\"T1\"},{\"name\":\"rag\",\"template\":\"T2\"}]}";
    loaded l;
    if (load_json(small_bpe, cfg, &l) != LLM_OK)
        fail_msg("%s", llmi_error_message());
    llmi_str s;
    OK(llmi_gguf_get_str(l.g, "tokenizer.ggml.pre", true, &s));
    assert_true(llmi_str_eq(s, "gpt-2"));
    OK(llmi_gguf_get_str(l.g, "tokenizer.chat_template.rag", true, &s));
    assert_true(llmi_str_eq(s, "T2"));
    assert_string_equal(llmi_tokenizer_chat_template(l.tok), "T1");
    /* the named templates reach the tokenizer (llm_chat_params.template_name) */
    assert_string_equal(llmi_tokenizer_chat_template_named(l.tok, "rag"), "T2");
    assert_string_equal(llmi_tokenizer_chat_template_named(l.tok, "default"), "T1");
    assert_null(llmi_tokenizer_chat_template_named(l.tok, "tool_use"));
    assert_int_equal(llmi_tokenizer_eos(l.tok), 5);
    assert_int_equal(llmi_tokenizer_token_type(l.tok, 5), LLMI_TOKTYPE_CONTROL);
    assert_int_equal(llmi_tokenizer_token_type(l.tok, 6), LLMI_TOKTYPE_USER_DEFINED);
    /* added_tokens_decoder marks "b" special; its other entries do not apply */
    assert_int_equal(llmi_tokenizer_token_type(l.tok, 1), LLMI_TOKTYPE_CONTROL);
    assert_int_equal(llmi_tokenizer_token_type(l.tok, 2), LLMI_TOKTYPE_NORMAL);
    assert_false(llmi_tokenizer_add_bos(l.tok));
    assert_true(llmi_tokenizer_add_eos(l.tok));
    llm_token ids[8];
    size_t n = 0;
    OK(llmi_tokenize(l.tok, "ab ab<tool>", 11, LLM_TOKENIZE_ADD_SPECIAL, ids, 8, &n));
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 4);
    assert_int_equal(ids[2], 6);
    assert_int_equal(ids[3], 5);
    unload(&l);
}

/* SentencePiece-style, with the newer Metaspace pre-tokenizer instead of
 * Llama 2's normalizer. */
static const char small_spm[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":6,\"content\":\"\\u2581\\u2581\","
    "\"special\":false}],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\","
    "\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":false},"
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"vocab\":{"
    "\"<unk>\":0,\"<s>\":1,\"<0x41>\":2,\"\\u2581\":3,\"x\":4,\"\\u2581x\":5,\"\\u2581\\u2581\":6,"
    "\"y\":7,\"z\":8,\"yz\":9,\"\\u2581y\":10,\"\\u2581yz\":11},"
    "\"merges\":[[\"\\u2581\",\"x\"],[\"\\u2581\",\"\\u2581\"],[\"y\",\"z\"],[\"\\u2581\",\"y\"]]}"
    "}";

static void test_small_spm(void **state) {
    (void)state;
    loaded l;
    if (load_json(small_spm, "{\"bos_token\":\"<s>\",\"add_bos_token\":true}", &l) != LLM_OK)
        fail_msg("%s", llmi_error_message());
    llmi_str s;
    OK(llmi_gguf_get_str(l.g, "tokenizer.ggml.model", true, &s));
    assert_true(llmi_str_eq(s, "llama"));
    bool prefix = false;
    OK(llmi_gguf_get_bool(l.g, "tokenizer.ggml.add_space_prefix", true, &prefix));
    assert_true(prefix);
    assert_int_equal(llmi_tokenizer_token_type(l.tok, 0), LLMI_TOKTYPE_CONTROL);
    assert_int_equal(llmi_tokenizer_token_type(l.tok, 2), LLMI_TOKTYPE_BYTE);
    assert_int_equal(llmi_tokenizer_token_type(l.tok, 4), LLMI_TOKTYPE_NORMAL);
    /* a user-defined token is stored with spaces, as the converter does */
    size_t n = 0;
    const char *text = llmi_tokenizer_token_text(l.tok, 6, &n);
    assert_int_equal(n, 2);
    assert_memory_equal(text, "  ", 2);
    llm_token ids[8];
    OK(llmi_tokenize(l.tok, "xA", 2, LLM_TOKENIZE_ADD_SPECIAL, ids, 8, &n));
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 5);
    assert_int_equal(ids[2], 2);
    /* "\u2581yz": y+z merges first (lower rank); no merge joins the space and
     * "yz", although the vocabulary has "\u2581yz", so BPE stops at two
     * tokens where merging by score would reach one */
    OK(llmi_tokenize(l.tok, "yz", 2, 0, ids, 8, &n));
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 9);
    unload(&l);
}

/* Every allocation of ours that fails gives LLM_ERR_OUT_OF_MEMORY and leaks
 * nothing (cJSON allocates with malloc, outside the sweep). */
/* WordPiece with a lowercasing, accent-stripping BertNormalizer,
 * max_input_chars_per_word 8 and BertProcessing (ids checked with
 * `tokenizers`: [1, 3, 4, 7, 5, 6, 0, 0, 2] for WPM_TEXT). */
static const char small_wpm[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"[UNK]\",\"special\":true},{\"id\":1,"
    "\"content\":\"[CLS]\",\"special\":true},{\"id\":2,\"content\":\"[SEP]\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"lowercase\":true,\"strip_accents\":null},"
    "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"post_processor\":{\"type\":"
    "\"BertProcessing\",\"sep\":[\"[SEP]\",2],\"cls\":[\"[CLS]\",1]},\"model\":{\"type\":"
    "\"WordPiece\",\"unk_token\":\"[UNK]\",\"max_input_chars_per_word\":8,\"vocab\":{"
    "\"[UNK]\":0,\"[CLS]\":1,\"[SEP]\":2,\"un\":3,\"##able\":4,\"cafe\":5,\"\\u4e2d\":6,"
    "\",\":7,\"##a\":8,\"a\":9}}}";
#define WPM_TEXT "Unable, CAF\xc3\x89 \xe4\xb8\xad\xe6\x96\x87 aaaaaaaaaa"

/* The unknown token for a character the vocabulary lacks and for a word
 * past max_input_chars_per_word; LLM_TOKENIZE_STRICT names the first such
 * word's input offset; every allocation of tokenizing can fail cleanly. */
static void test_small_wordpiece(void **state) {
    (void)state;
    loaded l;
    OK(load_json(small_wpm, "{\"unk_token\":\"[UNK]\"}", &l));
    static const llm_token want[] = {1, 3, 4, 7, 5, 6, 0, 0, 2};
    llm_token got[32];
    size_t n = 0;
    OK(llmi_tokenize(l.tok, WPM_TEXT, strlen(WPM_TEXT), LLM_TOKENIZE_ADD_SPECIAL, got, 32, &n));
    assert_int_equal(n, 9);
    assert_memory_equal(got, want, sizeof want);
    OK(llmi_tokenize(l.tok, "aaaa", 4, 0, got, 32, &n));
    assert_int_equal(n, 4); /* a ##a ##a ##a */
    assert_int_equal(got[0], 9);
    assert_int_equal(got[3], 8);
    EXPECT_ERR(llmi_tokenize(l.tok, WPM_TEXT, strlen(WPM_TEXT), LLM_TOKENIZE_STRICT, got, 32, &n),
               LLM_ERR_INVALID_ARGUMENT, "byte offset 17");
    int ok = 0;
    for (uint64_t k = 1; k < 100 && ok < 3; k++) {
        llmi_alloc_fail_after(k);
        llm_status st = llmi_tokenize(l.tok, WPM_TEXT, strlen(WPM_TEXT), 0, got, 32, &n);
        llmi_alloc_fail_after(0);
        if (st == LLM_OK)
            ok++;
        else if (st != LLM_ERR_OUT_OF_MEMORY)
            fail_msg("allocation %llu: %d %s", (unsigned long long)k, (int)st,
                     llmi_error_message());
    }
    assert_true(ok > 0);
    unload(&l);
}

static void test_alloc_failures(void **state) {
    (void)state;
    const char *inputs[] = {small_bpe, small_spm, small_wpm}, *config = "{\"chat_template\":\"x\"}";
    for (size_t i = 0; i < 3; i++) {
        int ok = 0;
        for (uint64_t k = 1; k < 200 && ok < 3; k++) {
            llmi_gguf_writer *w = NULL;
            OK(llmi_gguf_writer_create(&w));
            llmi_alloc_fail_after(k);
            llm_status st = llmi_hf_tokenizer_keys_from_json(inputs[i], strlen(inputs[i]), config,
                                                             strlen(config), w);
            llmi_alloc_fail_after(0);
            llmi_gguf_writer_free(w);
            if (st == LLM_OK)
                ok++;
            else if (st != LLM_ERR_OUT_OF_MEMORY)
                fail_msg("input %zu, allocation %llu: %d %s", i, (unsigned long long)k, (int)st,
                         llmi_error_message());
        }
        assert_true(ok > 0);
    }
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The folder entry point: files read, a missing tokenizer.json is an I/O
 * error naming it, chat_template.jinja used when the config has none. */
static void test_folder(void **state) {
    (void)state;
    const char *tmp = getenv("LLM_TEST_TMP");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/hf_tokenizer_XXXXXX", tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    loaded l;
    EXPECT_ERR(load_folder(dir, &l), LLM_ERR_IO, "tokenizer.json");
    unload(&l);
    write_text(dir, "tokenizer.json", small_bpe);
    write_text(dir, "chat_template.jinja", "{{ messages }}");
    OK(load_folder(dir, &l));
    assert_string_equal(llmi_tokenizer_chat_template(l.tok), "{{ messages }}");
    unload(&l);
    write_text(dir, "tokenizer_config.json", "{\"chat_template\":\"from config\"}");
    OK(load_folder(dir, &l));
    assert_string_equal(llmi_tokenizer_chat_template(l.tok), "from config");
    unload(&l);
    write_text(dir, "tokenizer_config.json", "{\"chat_template\":");
    EXPECT_ERR(load_folder(dir, &l), LLM_ERR_BAD_FORMAT, "tokenizer_config.json: malformed JSON");
    unload(&l);
    char path[4200];
    static const char *const names[] = {"tokenizer.json", "chat_template.jinja",
                                        "tokenizer_config.json"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

typedef struct bad_case {
    const char *json, *config;
    llm_status status;
    const char *message;
} bad_case;

static void test_bad_input(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"{\"model\":", NULL, LLM_ERR_BAD_FORMAT, "tokenizer.json: malformed JSON"},
        {"[1,2]", NULL, LLM_ERR_BAD_FORMAT, "tokenizer.json: the top level"},
        {"{\"version\":\"1.0\"}", NULL, LLM_ERR_BAD_FORMAT, "tokenizer.json: model is missing"},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"merges\":[]}}", NULL, LLM_ERR_BAD_FORMAT,
         "tokenizer.json: model.vocab is missing"},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},"
         "\"merges\":[\"a c\"]}}",
         NULL, LLM_ERR_BAD_FORMAT, "tokenizer.json: model.merges[0] names 'c'"},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},"
         "\"merges\":[\"a b\"]}}",
         NULL, LLM_ERR_BAD_FORMAT, "model.merges[0] names 'ab'"},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},"
         "\"merges\":[7]}}",
         NULL, LLM_ERR_BAD_FORMAT, "model.merges[0] is not a pair"},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":9},\"merges\":[]}}",
         NULL, LLM_ERR_BAD_FORMAT, "tokenizer.json: model.vocab['b'] is not a token id"},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":-1},\"merges\":[]}}",
         NULL, LLM_ERR_BAD_FORMAT, "model.vocab['b']"},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0.5},\"merges\":[]}}",
         NULL, LLM_ERR_BAD_FORMAT, "model.vocab['b']"},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}",
         NULL, LLM_ERR_BAD_FORMAT, "tokenizer.json: model.vocab: id 0 is given to both"},
        {"{\"added_tokens\":[{\"id\":1,\"content\":\"x\"},{\"id\":1,\"content\":\"y\"}]," BL_PRE
         ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         NULL, LLM_ERR_BAD_FORMAT, "tokenizer.json: added_tokens: id 1 is given twice"},
        {"{\"added_tokens\":[{\"id\":\"1\",\"content\":\"x\"}]," BL_PRE
         ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         NULL, LLM_ERR_BAD_FORMAT, "tokenizer.json: added_tokens: an entry"},
        {"{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"type\":\"WordPiece\","
         "\"vocab\":{\"a\":0}}}",
         NULL, LLM_ERR_UNSUPPORTED, "pre_tokenizer 'Whitespace' is not supported with WordPiece"},
        {"{\"pre_tokenizer\":null,\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", NULL,
         LLM_ERR_UNSUPPORTED, "pre_tokenizer 'null'"},
        {"{\"normalizer\":{\"type\":\"NFKC\"},\"pre_tokenizer\":{\"type\":"
         "\"BertPreTokenizer\"},\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}",
         NULL, LLM_ERR_UNSUPPORTED, "normalizer 'NFKC' is not supported with WordPiece"},
        {"{\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"model\":{\"type\":"
         "\"WordPiece\",\"continuing_subword_prefix\":\"@@\",\"vocab\":{\"a\":0}}}",
         NULL, LLM_ERR_UNSUPPORTED, "continuing_subword_prefix"},
        {"{\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"model\":{\"type\":"
         "\"WordPiece\",\"max_input_chars_per_word\":0,\"vocab\":{\"a\":0}}}",
         NULL, LLM_ERR_BAD_FORMAT, "max_input_chars_per_word is not a positive integer"},
        {"{\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"model\":{\"type\":"
         "\"WordPiece\",\"vocab\":[\"a\"]}}",
         NULL, LLM_ERR_BAD_FORMAT, "model.vocab is missing or not an object"},
        {"{" BL_PRE ",\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}", NULL,
         LLM_ERR_UNSUPPORTED, "model.type 'Unigram'"},
        {"{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
         "\"pattern\":{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\",\"invert\":false},"
         "{\"type\":\"ByteLevel\",\"use_regex\":false}]},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         NULL, LLM_ERR_UNSUPPORTED, "pre_tokenizer regex '\\w+' is not known"},
        {"{" BL_PRE ",\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0},"
         "\"merges\":[]}}",
         NULL, LLM_ERR_UNSUPPORTED,
         "model.ignore_merges is not supported with pre-tokenizer 'gpt-2'"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", NULL,
         LLM_ERR_UNSUPPORTED, "neither byte-level nor SentencePiece-style"},
        {small_bpe, "{\"eos_token\":5}", LLM_ERR_BAD_FORMAT, "tokenizer_config.json: eos_token"},
        {small_bpe, "{\"chat_template\":7}", LLM_ERR_BAD_FORMAT,
         "tokenizer_config.json: chat_template"},
        {small_bpe, "{\"chat_template\":[{\"name\":\"x\"}]}", LLM_ERR_BAD_FORMAT,
         "tokenizer_config.json: chat_template: an entry"},
        {small_bpe, "{", LLM_ERR_BAD_FORMAT, "tokenizer_config.json: malformed JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        loaded l;
        llm_status st = load_json(cases[i].json, cases[i].config, &l);
        if (st != cases[i].status || !strstr(llmi_error_message(), cases[i].message))
            fail_msg("case %zu: got %d \"%s\", want %d containing \"%s\"", i, (int)st,
                     llmi_error_message(), (int)cases[i].status, cases[i].message);
        unload(&l);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_tiny_sentencepiece),
        cmocka_unit_test(test_minilm_wordpiece),
        cmocka_unit_test(test_tiny_wordpiece),
        cmocka_unit_test(test_small_bpe),
        cmocka_unit_test(test_small_spm),
        cmocka_unit_test(test_small_wordpiece),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_folder),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
