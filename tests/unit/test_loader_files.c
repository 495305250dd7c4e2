/* Every loader against files that are not what they seem: FIFOs, devices
 * and links to them where a model file or a JSON file of a checkpoint
 * folder is expected, and NUL characters inside JSON text. Each must be
 * refused at once (a watchdog alarm fails a test that blocks), with
 * LLM_ERR_IO or LLM_ERR_BAD_FORMAT and a message naming the file at fault.
 * No fixtures: the folders are written here. */
#include "hf/hf.h"
#include "hf/hf_internal.h"
#include "model/model.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* A loader that blocks on a FIFO would hang the test; the alarm's default
 * action ends the process instead, which fails the run. */
enum { WATCHDOG_SECONDS = 20 };

static char g_tmp[512];

static int setup(void **state) {
    (void)state;
    const char *t = getenv("LLM_TEST_TMP");
    snprintf(g_tmp, sizeof g_tmp, "%s/loader_files_%d", t && *t ? t : "/tmp", (int)getpid());
    if (t && *t)
        mkdir(t, 0755);
    if (mkdir(g_tmp, 0755) != 0)
        return -1;
    alarm(WATCHDOG_SECONDS);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    alarm(0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *path_in(const char *dir, const char *name) {
    static char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static const char *fresh_folder(const char *name) {
    static char d[700];
    snprintf(d, sizeof d, "%s/%s", g_tmp, name);
    mkdir(d, 0755);
    return d;
}

static void put_file(const char *dir, const char *name, const void *data, size_t n) {
    const char *p = path_in(dir, name);
    unlink(p);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void put_text(const char *dir, const char *name, const char *text) {
    put_file(dir, name, text, strlen(text));
}

static void put_fifo(const char *dir, const char *name) {
    const char *p = path_in(dir, name);
    unlink(p);
    assert_int_equal(mkfifo(p, 0644), 0);
}

static void put_link(const char *dir, const char *name, const char *target) {
    const char *p = path_in(dir, name);
    unlink(p);
    assert_int_equal(symlink(target, p), 0);
}

/* A safetensors image: length, header (padded to 8 with spaces), zeros. */
static void put_safetensors(const char *dir, const char *name, const char *header, size_t hl,
                            size_t data_bytes) {
    size_t pad = (8 - hl % 8) % 8, n = 8 + hl + pad + data_bytes;
    uint8_t *b = calloc(1, n);
    assert_non_null(b);
    uint64_t len = hl + pad;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(len >> (8 * i));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, ' ', pad);
    put_file(dir, name, b, n);
    free(b);
}

/* A tiny Llama config (the fields test_hf uses) and its one tensor. */
static const char CONFIG[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
    "\"hidden_size\": 4, \"intermediate_size\": 8, \"num_hidden_layers\": 1, "
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"rms_norm_eps\": 1e-5, "
    "\"vocab_size\": 8, \"tie_word_embeddings\": true}";
static const char EMBD[] = "{\"model.embed_tokens.weight\": {\"dtype\": \"F32\", \"shape\": [8, "
                           "4], \"data_offsets\": [0, 128]}}";

static void expect_folder(const char *dir, llm_status want, const char *s1, const char *s2) {
    llmi_gguf *g = (llmi_gguf *)1;
    llm_status st = llmi_hf_open(dir, true, &g);
    const char *msg = llmi_error_message();
    if (st != want || !strstr(msg, s1) || (s2 && !strstr(msg, s2)))
        fail_msg("%s: got %d '%s', want %d naming '%s' and '%s'", dir, st, msg, want, s1,
                 s2 ? s2 : "");
    assert_null(g);
}

static void expect_model(const char *path, llm_status want, const char *s1, const char *s2) {
    llm_model *m = (llm_model *)1;
    llm_status st = llmi_model_load(path, true, &m);
    const char *msg = llmi_error_message();
    if (st != want || !strstr(msg, s1) || (s2 && !strstr(msg, s2)))
        fail_msg("%s: got %d '%s', want %d naming '%s' and '%s'", path, st, msg, want, s1,
                 s2 ? s2 : "");
    assert_null(m);
}

/* A GGUF path that is a FIFO, a device or a link to one: refused without
 * waiting for a writer, naming the path and what it is. */
static void test_gguf_not_regular(void **state) {
    (void)state;
    const char *d = fresh_folder("gguf");
    put_fifo(d, "fifo.gguf");
    char fifo[1200];
    snprintf(fifo, sizeof fifo, "%s", path_in(d, "fifo.gguf"));
    expect_model(fifo, LLM_ERR_IO, "fifo.gguf", "not a regular file (a FIFO)");
    for (int mmap = 0; mmap < 2; mmap++) {
        llmi_gguf *g = (llmi_gguf *)1;
        assert_int_equal(llmi_gguf_open(fifo, mmap, &g), LLM_ERR_IO);
        assert_null(g);
    }
    expect_model("/dev/zero", LLM_ERR_IO, "'/dev/zero'", "a character device");
    put_link(d, "urandom.gguf", "/dev/urandom");
    expect_model(path_in(d, "urandom.gguf"), LLM_ERR_IO, "urandom.gguf", "a character device");
}

/* config.json that is a FIFO or a link to a device: the folder is still a
 * checkpoint folder, and the message names config.json, not the folder. */
static void test_config_not_regular(void **state) {
    (void)state;
    const char *d = fresh_folder("cfg");
    put_safetensors(d, "model.safetensors", EMBD, strlen(EMBD), 128);
    put_fifo(d, "config.json");
    assert_true(llmi_hf_is_folder(d));
    expect_folder(d, LLM_ERR_IO, "config.json", "a FIFO");
    expect_model(d, LLM_ERR_IO, "config.json", "a FIFO");
    put_link(d, "config.json", "/dev/zero");
    expect_model(d, LLM_ERR_IO, "config.json", "a character device");
    put_link(d, "config.json", "/dev/urandom");
    expect_model(d, LLM_ERR_IO, "config.json", "a character device");
    /* A dangling link names config.json too. */
    put_link(d, "config.json", "no-such-target.json");
    expect_model(d, LLM_ERR_IO, "config.json", "No such file");
}

/* The weights, an index, a shard named by the index, generation_config.json
 * and tokenizer.json in turn as FIFOs. */
static void test_folder_files_not_regular(void **state) {
    (void)state;
    const char *d = fresh_folder("weights");
    put_text(d, "config.json", CONFIG);
    put_fifo(d, "model.safetensors");
    expect_folder(d, LLM_ERR_IO, "model.safetensors", "a FIFO");

    const char *x = fresh_folder("index");
    put_text(x, "config.json", CONFIG);
    put_fifo(x, "model.safetensors.index.json");
    expect_folder(x, LLM_ERR_IO, "model.safetensors.index.json", "a FIFO");
    put_text(x, "model.safetensors.index.json",
             "{\"weight_map\": {\"model.embed_tokens.weight\": \"shard-1.safetensors\"}}");
    put_fifo(x, "shard-1.safetensors");
    expect_folder(x, LLM_ERR_IO, "shard-1.safetensors", "a FIFO");

    const char *t = fresh_folder("tok");
    put_fifo(t, "tokenizer.json");
    llmi_gguf_writer *w = NULL;
    assert_int_equal(llmi_gguf_writer_create(&w), LLM_OK);
    assert_int_equal(llmi_hf_tokenizer_keys(t, w), LLM_ERR_IO);
    assert_non_null(strstr(llmi_error_message(), "tokenizer.json"));
    assert_non_null(strstr(llmi_error_message(), "a FIFO"));
    put_text(t, "tokenizer.json", "{}");
    put_fifo(t, "tokenizer_config.json");
    assert_int_equal(llmi_hf_tokenizer_keys(t, w), LLM_ERR_IO);
    assert_non_null(strstr(llmi_error_message(), "tokenizer_config.json"));
    llmi_gguf_writer_free(w);
}

/* A NUL inside config.json, raw or escaped, and inside a tensor name of a
 * safetensors header: cJSON would read the text cut at the NUL. */
static void test_nul_in_json(void **state) {
    (void)state;
    const char *d = fresh_folder("nul");
    put_safetensors(d, "model.safetensors", EMBD, strlen(EMBD), 128);
    /* Control: the folder itself is good up to the missing tokenizer. */
    put_text(d, "config.json", CONFIG);
    llmi_gguf *g = NULL;
    llm_status st = llmi_hf_open(d, true, &g);
    if (st != LLM_OK)
        assert_null(strstr(llmi_error_message(), "NUL"));
    llmi_gguf_close(g);

    char cfg[sizeof CONFIG];
    memcpy(cfg, CONFIG, sizeof CONFIG);
    char *at = strstr(cfg, "llama\"");
    at[1] = '\0'; /* "model_type": "l\0ama" */
    put_file(d, "config.json", cfg, sizeof CONFIG - 1);
    expect_folder(d, LLM_ERR_BAD_FORMAT, "config.json", "a NUL byte at byte");
    put_text(d, "config.json",
             "{\"architectures\": [\"LlamaForCausalLM\\u0000\"], \"model_type\": \"llama\", "
             "\"hidden_size\": 4, \"intermediate_size\": 8, \"num_hidden_layers\": 1, "
             "\"num_attention_heads\": 2, \"rms_norm_eps\": 1e-5, \"vocab_size\": 8}");
    expect_folder(d, LLM_ERR_BAD_FORMAT, "config.json", "\\u0000");
    /* An escaped backslash before "u0000" is no NUL. */
    assert_int_equal(llmi_hf_json_check_nul("x", "{\"a\": \"\\\\u0000\"}", 16, 0), LLM_OK);

    put_text(d, "config.json", CONFIG);
    static const char raw[] = "{\"model.embed\0tokens.weight\": {\"dtype\": \"F32\", \"shape\": "
                              "[8, 4], \"data_offsets\": [0, 128]}}";
    put_safetensors(d, "model.safetensors", raw, sizeof raw - 1, 128);
    expect_folder(d, LLM_ERR_BAD_FORMAT, "model.safetensors", "a NUL byte at byte 21");
    static const char esc[] = "{\"model.embed_tokens.weight\\u0000x\": {\"dtype\": \"F32\", "
                              "\"shape\": [8, 4], \"data_offsets\": [0, 128]}}";
    put_safetensors(d, "model.safetensors", esc, sizeof esc - 1, 128);
    expect_folder(d, LLM_ERR_BAD_FORMAT, "model.safetensors", "\\u0000");

    const char *t = fresh_folder("tok-nul");
    static const char tok[] = "{\"model\": {\"type\": \"BPE\"\0}}";
    put_file(t, "tokenizer.json", tok, sizeof tok - 1);
    llmi_gguf_writer *w = NULL;
    assert_int_equal(llmi_gguf_writer_create(&w), LLM_OK);
    assert_int_equal(llmi_hf_tokenizer_keys(t, w), LLM_ERR_BAD_FORMAT);
    assert_non_null(strstr(llmi_error_message(), "tokenizer.json: a NUL byte at byte 24"));
    llmi_gguf_writer_free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_not_regular),
        cmocka_unit_test(test_config_not_regular),
        cmocka_unit_test(test_folder_files_not_regular),
        cmocka_unit_test(test_nul_in_json),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
