/* Hugging Face checkpoint folders (lib/hf). The references are files we did
 * not write with our code: tests/models/gen_hf_models.py writes each random
 * model as a folder (safetensors package) and as the GGUF llama.cpp's
 * converter makes of it (gguf package, q/k permuted with numpy as the
 * converter does). A folder must give the same tensors, byte for byte, the
 * same metadata and the same logits as its GGUF. Malformed folders are made
 * here, each with one defect, and must be refused naming file and field. */
#include "engine/engine.h"
#include "hf/hf_internal.h"
#include "model/model.h"
#include "session/session.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

static char g_models[512], g_tmp[512];

static const char *model_path(const char *name) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", g_models, name);
    return p;
}

static int setup(void **state) {
    const char *m = getenv("LLM_TEST_MODELS"), *t = getenv("LLM_TEST_TMP");
    snprintf(g_models, sizeof g_models, "%s", m ? m : "build/test-models");
    snprintf(g_tmp, sizeof g_tmp, "%s/hf", t ? t : "/tmp");
    mkdir(t ? t : "/tmp", 0755);
    mkdir(g_tmp, 0755);
    struct stat sb;
    if (stat(model_path("hf-llama-f32.gguf"), &sb) != 0) {
        fprintf(stderr, "test_hf: %s missing (make test-models)\n",
                model_path("hf-llama-f32.gguf"));
        return -1;
    }
    return 0;
}

/* ---- folder == converted GGUF ---- */

static void same_tensors(const llmi_gguf *a, const llmi_gguf *b, const char *what) {
    if (a->n_tensors != b->n_tensors)
        fail_msg("%s: %llu tensors vs %llu in the GGUF", what, (unsigned long long)a->n_tensors,
                 (unsigned long long)b->n_tensors);
    for (uint64_t i = 0; i < b->n_tensors; i++) {
        const llmi_gguf_tensor *tb = &b->tensors[i];
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)tb->name.len, tb->name.ptr);
        const llmi_gguf_tensor *ta = llmi_gguf_find_tensor(a, name);
        if (!ta)
            fail_msg("%s: no tensor '%s'", what, name);
        assert_int_equal(ta->type, tb->type);
        assert_int_equal(ta->n_dims, tb->n_dims);
        for (int d = 0; d < 4; d++)
            assert_int_equal(ta->ne[d], tb->ne[d]);
        assert_int_equal(ta->nbytes, tb->nbytes);
        if (memcmp(ta->data, tb->data, tb->nbytes) != 0)
            fail_msg("%s: tensor '%s' differs from the converted GGUF", what, name);
    }
}

static bool kv_equal(const llmi_gguf_kv *a, const llmi_gguf_kv *b) {
    if (a->type != b->type)
        return false;
    if (a->type == LLMI_GGUF_STRING)
        return a->str.len == b->str.len && memcmp(a->str.ptr, b->str.ptr, a->str.len) == 0;
    if (a->type != LLMI_GGUF_ARRAY)
        return memcmp(&a->scalar, &b->scalar, sizeof a->scalar) == 0;
    if (a->arr_type != b->arr_type || a->arr_len != b->arr_len)
        return false;
    if (a->arr_type == LLMI_GGUF_STRING) {
        for (uint64_t i = 0; i < a->arr_len; i++)
            if (a->arr_strs[i].len != b->arr_strs[i].len ||
                memcmp(a->arr_strs[i].ptr, b->arr_strs[i].ptr, a->arr_strs[i].len) != 0)
                return false;
        return true;
    }
    size_t es =
        a->arr_type == LLMI_GGUF_U8 || a->arr_type == LLMI_GGUF_I8 || a->arr_type == LLMI_GGUF_BOOL
            ? 1
        : a->arr_type == LLMI_GGUF_U16 || a->arr_type == LLMI_GGUF_I16 ? 2
        : a->arr_type >= LLMI_GGUF_U64                                 ? 8
                                                                       : 4;
    return memcmp(a->arr_data, b->arr_data, es * a->arr_len) == 0;
}

/* Every key of the converted GGUF, with its type and value, and no other
 * (general.name is the folder's name, so a renamed folder differs there). */
static void same_metadata(const llmi_gguf *a, const llmi_gguf *b, const char *what,
                          bool same_name) {
    for (uint64_t i = 0; i < b->n_kv; i++) {
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)b->kv[i].key.len, b->kv[i].key.ptr);
        const llmi_gguf_kv *ka = llmi_gguf_find(a, key);
        if (!ka)
            fail_msg("%s: key '%s' missing", what, key);
        if (!same_name && strcmp(key, "general.name") == 0)
            continue;
        if (!kv_equal(ka, &b->kv[i]))
            fail_msg("%s: key '%s' differs from the converted GGUF", what, key);
    }
    if (a->n_kv != b->n_kv)
        fail_msg("%s: %llu keys vs %llu in the GGUF", what, (unsigned long long)a->n_kv,
                 (unsigned long long)b->n_kv);
}

static float *logits_of(const llm_model *m, const llm_token *toks, int n) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 1;
    sp.n_ctx = 64;
    llm_session *s = NULL;
    assert_int_equal(llmi_session_create(m, &sp, &s), LLM_OK);
    llmi_kv_seq seq = {0};
    assert_int_equal(llmi_kv_seq_reserve(s->kv, &seq, (uint32_t)n), LLM_OK);
    size_t V = m->hp.n_vocab;
    float *logits = malloc((size_t)n * V * sizeof *logits);
    llmi_batch_row rows[16];
    for (int i = 0; i < n; i++)
        rows[i] = (llmi_batch_row){toks[i], (uint32_t)i, &seq, true};
    assert_int_equal(llmi_engine_run(s->eng, rows, (uint32_t)n, logits), LLM_OK);
    llmi_kv_seq_destroy(s->kv, &seq);
    llmi_session_free(s);
    return logits;
}

static void check_pair(const char *folder_name, const char *gguf_name, bool use_mmap,
                       bool same_name) {
    char folder[1024], gguf[1024];
    snprintf(folder, sizeof folder, "%s", model_path(folder_name));
    snprintf(gguf, sizeof gguf, "%s", model_path(gguf_name));
    assert_true(llmi_hf_is_folder(folder));
    assert_false(llmi_hf_is_folder(gguf));
    llmi_hf_test_tokenizer_source(gguf);
    llm_model *mf = NULL, *mg = NULL;
    llm_status st = llmi_model_load(folder, use_mmap, &mf);
    if (st != LLM_OK)
        fail_msg("%s: %s", folder_name, llmi_error_message());
    assert_int_equal(llmi_model_load(gguf, true, &mg), LLM_OK);
    same_tensors(mf->file, mg->file, folder_name);
    same_metadata(mf->file, mg->file, folder_name, same_name);
    /* tensors listed in the converter's order: the same model identity, so
     * state files move between a folder and its GGUF */
    if (mf->fingerprint != mg->fingerprint)
        fail_msg("%s: fingerprint %016llx, the converted GGUF's %016llx", folder_name,
                 (unsigned long long)mf->fingerprint, (unsigned long long)mg->fingerprint);
    llm_token toks[] = {1, 504, 3458, 282, 4649, 314, 17, 9, 48000, 2};
    int n = (int)(sizeof toks / sizeof toks[0]);
    for (int i = 0; i < n; i++)
        toks[i] %= (llm_token)mg->hp.n_vocab;
    float *lf = logits_of(mf, toks, n), *lg = logits_of(mg, toks, n);
    size_t count = (size_t)n * mg->hp.n_vocab;
    bool finite = true;
    for (size_t i = 0; i < count; i++)
        finite &= isfinite(lg[i]) != 0;
    assert_true(finite);
    if (memcmp(lf, lg, count * sizeof *lf) != 0)
        fail_msg("%s: logits differ from the converted GGUF's", folder_name);
    free(lf);
    free(lg);
    llmi_model_free(mf);
    llmi_model_free(mg);
    llmi_hf_test_tokenizer_source(NULL);
}

static void test_llama_f32(void **state) {
    check_pair("hf-llama-f32", "hf-llama-f32.gguf", true, true);
}
static void test_llama_f16(void **state) {
    check_pair("hf-llama-f16", "hf-llama-f16.gguf", true, true);
}
static void test_llama_bf16(void **state) {
    check_pair("hf-llama-bf16", "hf-llama-bf16.gguf", true, true);
}
static void test_sharded_read(void **state) {
    /* read instead of mapped, and split over two shards with an index; the
     * converted file lists the tensors shard by shard */
    check_pair("hf-llama-bf16-sharded", "hf-llama-bf16-sharded.gguf", false, true);
}
static void test_qwen2_f32(void **state) {
    check_pair("hf-qwen2-f32", "hf-qwen2-f32.gguf", true, true);
}
static void test_llama3_rope_scaling(void **state) {
    /* rope_scaling type llama3: rope_freqs.weight computed from config.json
     * equals the converter's (numpy transcription), and is used */
    check_pair("hf-llama3-f32", "hf-llama3-f32.gguf", true, true);
    llm_model *m = NULL;
    llmi_hf_test_tokenizer_source(model_path("hf-llama3-f32.gguf"));
    assert_int_equal(llmi_model_load(model_path("hf-llama3-f32"), true, &m), LLM_OK);
    llmi_hf_test_tokenizer_source(NULL);
    assert_non_null(m->w[LLMI_ROLE_ROPE_FREQS].data);
    llmi_model_free(m);
}
static void test_linear_rope_scaling(void **state) {
    /* rope_scaling type linear: the converter's rope.scaling keys, and the
     * model loads with positions divided by the factor */
    check_pair("hf-llama-linear-f32", "hf-llama-linear-f32.gguf", true, true);
    llm_model *m = NULL;
    llmi_hf_test_tokenizer_source(model_path("hf-llama-linear-f32.gguf"));
    assert_int_equal(llmi_model_load(model_path("hf-llama-linear-f32"), true, &m), LLM_OK);
    llmi_hf_test_tokenizer_source(NULL);
    assert_true(m->hp.rope_freq_scale == 0.25f);
    llmi_model_free(m);
}
/* Rows added after the mapping: now down to the logits. */
static void test_qwen3_logits(void **state) {
    check_pair("hfmap-qwen3", "hfmap-qwen3.gguf", true, true);
}
static void test_phi3_logits(void **state) {
    check_pair("hfmap-phi3", "hfmap-phi3.gguf", false, true);
}

/* Every mapped class, rows in the model table or not: the folder read as
 * GGUF (tensors and keys) equals the converter-made file. */
static void check_mapping(const char *kind) {
    char folder[1024], gguf[1100], name[64];
    snprintf(name, sizeof name, "hfmap-%s", kind);
    snprintf(folder, sizeof folder, "%s", model_path(name));
    snprintf(gguf, sizeof gguf, "%s.gguf", folder);
    llmi_hf_test_tokenizer_source(gguf); /* none: these files have no tokenizer */
    llmi_gguf *a = NULL, *b = NULL;
    if (llmi_hf_open(folder, true, &a) != LLM_OK)
        fail_msg("%s: %s", name, llmi_error_message());
    assert_int_equal(llmi_gguf_open(gguf, true, &b), LLM_OK);
    same_tensors(a, b, name);
    same_metadata(a, b, name, true);
    llmi_gguf_close(a);
    llmi_gguf_close(b);
    llmi_hf_test_tokenizer_source(NULL);
}

static void test_map_qwen3(void **state) { check_mapping("qwen3"); }
static void test_map_gemma3(void **state) { check_mapping("gemma3"); }
static void test_map_phi3(void **state) { check_mapping("phi3"); }
static void test_map_qwen3moe(void **state) { check_mapping("qwen3moe"); }
static void test_map_mixtral(void **state) { check_mapping("mixtral"); }

/* ---- the public API on a folder ---- */

typedef struct collected {
    llm_token prompt[32];
    size_t n_prompt;
    llm_token tok[64];
    uint32_t n;
} collected;

static bool collect(llm_token token, const char *piece, size_t len, void *user) {
    (void)piece, (void)len;
    collected *c = user;
    if (c->n < 64)
        c->tok[c->n++] = token;
    return true;
}

static void generate_tokens(const char *path, collected *c) {
    llm_model *m = NULL;
    if (llm_model_load(path, NULL, &m) != LLM_OK)
        fail_msg("%s: %s", path, llm_last_error());
    llm_session *s = NULL;
    assert_int_equal(llm_session_create(m, NULL, &s), LLM_OK);
    const char *text = "The capital of France is 12345 caf\xc3\xa9 <|im_start|>";
    assert_int_equal(llm_tokenize(m, text, strlen(text), LLM_TOKENIZE_PARSE_SPECIAL, c->prompt, 32,
                                  &c->n_prompt),
                     LLM_OK);
    llm_token *prompt = c->prompt;
    size_t n = c->n_prompt;
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 12;
    gp.ignore_eos = true;
    gp.on_token = collect;
    gp.user = c;
    c->n = 0;
    assert_int_equal(llm_generate(s, prompt, n, &gp, NULL), LLM_OK);
    llm_session_free(s);
    llm_model_free(m);
}

/* End to end: the folder's own tokenizer.json (no test hook), the public
 * API; the prompt's tokens and the greedy continuation equal the GGUF's. */
static void test_public_api_generates(void **state) {
    char folder[1024], gguf[1024];
    snprintf(folder, sizeof folder, "%s", model_path("hf-qwen2-f32"));
    snprintf(gguf, sizeof gguf, "%s", model_path("hf-qwen2-f32.gguf"));
    collected a, b;
    generate_tokens(folder, &a);
    generate_tokens(gguf, &b);
    assert_int_equal(a.n, 12);
    assert_int_equal(b.n, 12);
    assert_int_equal(a.n_prompt, b.n_prompt);
    assert_memory_equal(a.prompt, b.prompt, sizeof a.prompt[0] * a.n_prompt);
    assert_memory_equal(a.tok, b.tok, sizeof a.tok[0] * a.n);
}

/* The tokenizer keys a Llama-class folder derives from its tokenizer.json
 * and tokenizer_config.json (SmolLM2's vocabulary and config fields) equal
 * those llama.cpp's converter wrote into SmolLM2's GGUF, key for key. */
static void test_folder_tokenizer_keys(void **state) {
    const char *gguf = getenv("LLM_TEST_MODEL");
    if (!gguf)
        skip();
    llmi_gguf *a = NULL, *b = NULL;
    if (llmi_hf_open(model_path("hf-llama-f32"), true, &a) != LLM_OK)
        fail_msg("hf-llama-f32: %s", llmi_error_message());
    assert_int_equal(llmi_gguf_open(gguf, true, &b), LLM_OK);
    const llmi_gguf *both[2] = {a, b};
    int compared = 0;
    for (int side = 0; side < 2; side++)
        for (uint64_t i = 0; i < both[side]->n_kv; i++) {
            const llmi_gguf_kv *k = &both[side]->kv[i];
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)k->key.len, k->key.ptr);
            if (strncmp(key, "tokenizer.", 10) != 0)
                continue;
            const llmi_gguf_kv *other = llmi_gguf_find(both[1 - side], key);
            if (!other)
                fail_msg("key '%s' only in the %s", key, side ? "GGUF" : "folder");
            if (!kv_equal(k, other))
                fail_msg("key '%s' differs between the folder and the GGUF", key);
            compared++;
        }
    assert_true(compared >= 2 * 12);
    llmi_gguf_close(a);
    llmi_gguf_close(b);
    /* the converter's Qwen2 class has neither Llama rule */
    if (llmi_hf_open(model_path("hf-qwen2-f32"), true, &a) != LLM_OK)
        fail_msg("hf-qwen2-f32: %s", llmi_error_message());
    assert_null(llmi_gguf_find(a, "tokenizer.ggml.add_space_prefix"));
    assert_null(llmi_gguf_find(a, "tokenizer.ggml.add_bos_token"));
    llmi_gguf_close(a);
}

static size_t unhex(const char *h, char *out) {
    if (h[0] == '-')
        return 0;
    size_t n = 0;
    for (; h[0] && h[1] && h[0] != ' '; h += 2) {
        unsigned v;
        sscanf(h, "%2x", &v);
        out[n++] = (char)v;
    }
    return n;
}

/* End to end through the public API and each folder's own tokenizer.json:
 * the golden text set tokenizes as llama.cpp tokenized it with SmolLM2's
 * GGUF (tests/golden/smollm2-tokenize.txt). */
static void golden_tokenize(const char *folder_name) {
    char path[1024];
    const char *data = getenv("LLM_TEST_DATA");
    snprintf(path, sizeof path, "%s/golden/smollm2-tokenize.txt", data ? data : "tests");
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    llm_model *m = NULL;
    if (llm_model_load(model_path(folder_name), NULL, &m) != LLM_OK)
        fail_msg("%s: %s", folder_name, llm_last_error());
    enum { LINE = 65536, MAX_TOK = 1024 };
    char *line = malloc(LINE), *text = malloc(LINE), *hex = malloc(LINE);
    llm_token *want = malloc(MAX_TOK * sizeof *want), *got = malloc(MAX_TOK * sizeof *got);
    assert_true(line && text && hex && want && got);
    int rows = 0, same = 0;
    while (fgets(line, LINE, f)) {
        if (strncmp(line, "tok ", 4) != 0)
            continue;
        int special, add_bos, off = 0;
        if (sscanf(line, "tok %d %d %65535s :%n", &special, &add_bos, hex, &off) != 3)
            fail_msg("bad row: %s", line);
        size_t len = unhex(hex, text), n_want = 0, n_got = 0;
        for (char *p = line + off, *end;; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            assert_true(n_want < MAX_TOK);
            want[n_want++] = (llm_token)v;
        }
        uint32_t flags = (special ? LLM_TOKENIZE_PARSE_SPECIAL : 0) |
                         (add_bos ? LLM_TOKENIZE_ADD_SPECIAL : 0);
        assert_int_equal(llm_tokenize(m, text, len, flags, got, MAX_TOK, &n_got), LLM_OK);
        rows++;
        if (n_got == n_want && memcmp(got, want, n_got * sizeof *got) == 0)
            same++;
        else
            print_error("%s: '%.*s' (special %d, add_bos %d): %zu ids, llama.cpp %zu\n",
                        folder_name, (int)len, text, special, add_bos, n_got, n_want);
    }
    fclose(f);
    free(line);
    free(text);
    free(hex);
    free(want);
    free(got);
    llm_model_free(m);
    assert_true(rows >= 80);
    assert_int_equal(same, rows);
}

static void test_golden_tokenize_llama_folder(void **state) { golden_tokenize("hf-llama-f32"); }
static void test_golden_tokenize_qwen2_folder(void **state) { golden_tokenize("hf-qwen2-f32"); }

/* ---- malformed folders ---- */

static const char *tmp_folder(const char *name) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", g_tmp, name);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(mkdir(p, 0755), 0);
    return p;
}

static void put_file(const char *dir, const char *name, const void *data, size_t n) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void put_text(const char *dir, const char *name, const char *text) {
    put_file(dir, name, text, strlen(text));
}

/* A safetensors image: length, header (padded to 8), `data_bytes` bytes. */
static void put_safetensors(const char *dir, const char *name, const char *header,
                            size_t data_bytes) {
    size_t hl = strlen(header), pad = (8 - hl % 8) % 8, n = 8 + hl + pad + data_bytes;
    uint8_t *b = calloc(1, n);
    uint64_t len = hl + pad;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(len >> (8 * i));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, ' ', pad);
    put_file(dir, name, b, n);
    free(b);
}

/* A tiny Llama (hidden 4, 2 heads of 2, 1 KV head, FFN 8, vocab 8, 1 layer)
 * with the fields of the JSON object `overrides` replaced or added. */
static void put_config(const char *dir, const char *overrides) {
    cJSON *c = cJSON_Parse("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": "
                           "\"llama\", \"hidden_size\": 4, \"intermediate_size\": 8, "
                           "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                           "\"num_key_value_heads\": 1, \"rms_norm_eps\": 1e-5, "
                           "\"vocab_size\": 8, \"tie_word_embeddings\": true}");
    cJSON *o = cJSON_Parse(overrides);
    assert_non_null(c);
    assert_non_null(o);
    for (cJSON *it = o->child; it; it = o->child) {
        cJSON_DetachItemViaPointer(o, it);
        if (cJSON_IsNull(it) && !cJSON_GetObjectItemCaseSensitive(c, it->string)) {
            cJSON_Delete(it);
            continue;
        }
        char key[64]; /* cJSON frees the item's own name while replacing */
        snprintf(key, sizeof key, "%s", it->string);
        if (cJSON_GetObjectItemCaseSensitive(c, key))
            cJSON_ReplaceItemInObjectCaseSensitive(c, key, it);
        else
            cJSON_AddItemToObject(c, key, it);
    }
    char *text = cJSON_Print(c);
    put_text(dir, "config.json", text);
    cJSON_free(text);
    cJSON_Delete(o);
    cJSON_Delete(c);
}

static const char EMBD_OK[] =
    "{\"model.embed_tokens.weight\": {\"dtype\": \"F32\", \"shape\": [8, 4], "
    "\"data_offsets\": [0, 128]}}";

static void expect(const char *dir, llm_status want, const char *s1, const char *s2) {
    llmi_gguf *g = NULL;
    llm_status st = llmi_hf_open(dir, true, &g);
    const char *msg = llmi_error_message();
    if (st != want || !strstr(msg, s1) || (s2 && !strstr(msg, s2)))
        fail_msg("%s: got %d '%s', want %d naming '%s' and '%s'", dir, st, msg, want, s1,
                 s2 ? s2 : "");
    assert_null(g);
}

static void test_bad_config(void **state) {
    const char *d = tmp_folder("cfg");
    put_safetensors(d, "model.safetensors", EMBD_OK, 128);
    put_text(d, "config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4,");
    expect(d, LLM_ERR_BAD_FORMAT, "config.json", "JSON");
    put_text(d, "config.json",
             "{\"architectures\": [\"LlamaForCausalLM\"], "
             "\"intermediate_size\": 8, \"num_hidden_layers\": 1, "
             "\"num_attention_heads\": 2, \"rms_norm_eps\": 1e-5, "
             "\"vocab_size\": 8}");
    expect(d, LLM_ERR_BAD_FORMAT, "config.json", "'hidden_size'");
    put_config(d, "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\"}");
    expect(d, LLM_ERR_UNSUPPORTED, "config.json", "GPT2LMHeadModel");
    put_config(d, "{\"num_key_value_heads\": 3}");
    expect(d, LLM_ERR_BAD_FORMAT, "config.json", "num_key_value_heads");
    put_config(d, "{\"hidden_size\": 4.5}");
    expect(d, LLM_ERR_BAD_FORMAT, "config.json", "'hidden_size'");
    put_config(d, "{\"rope_scaling\": {\"type\": \"linear\"}}");
    expect(d, LLM_ERR_BAD_FORMAT, "config.json", "no field 'factor'");
    put_config(d, "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "
                  "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}");
    expect(d, LLM_ERR_UNSUPPORTED, "config.json", "Llama and Gemma 3 models only");
    put_config(d, "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}");
    expect(d, LLM_ERR_UNSUPPORTED, "config.json", "'yarn'");
    put_config(d, "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": \"8\"}}");
    expect(d, LLM_ERR_BAD_FORMAT, "config.json", "'rope_scaling.factor'");
    put_config(d, "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"low_freq_factor\": 4.0}}");
    expect(d, LLM_ERR_BAD_FORMAT, "config.json", "high_freq_factor");
    put_config(d, "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "
                  "\"rope_scaling\": {\"rope_type\": \"llama3\"}}");
    expect(d, LLM_ERR_UNSUPPORTED, "config.json", "Llama models only");
    put_config(d, "{\"torch_dtype\": \"int8\"}");
    expect(d, LLM_ERR_UNSUPPORTED, "config.json", "torch_dtype");
}

static void test_bad_safetensors(void **state) {
    const char *d = tmp_folder("st");
    put_config(d, "{}");
    /* truncated: the data section ends before the tensor */
    put_safetensors(d, "model.safetensors", EMBD_OK, 100);
    expect(d, LLM_ERR_BAD_FORMAT, "model.safetensors", "data_offsets");
    /* header length past the end of the file */
    uint8_t hdr[16] = {0x40, 0x42, 0x0f, 0, 0, 0, 0, 0, '{', '}'};
    put_file(d, "model.safetensors", hdr, sizeof hdr);
    expect(d, LLM_ERR_BAD_FORMAT, "model.safetensors", "header length");
    put_file(d, "model.safetensors", hdr, 5);
    expect(d, LLM_ERR_BAD_FORMAT, "model.safetensors", "truncated");
    put_safetensors(d, "model.safetensors", "{\"a\": [1,", 0);
    expect(d, LLM_ERR_BAD_FORMAT, "model.safetensors", "JSON");
    put_safetensors(d, "model.safetensors",
                    "{\"model.embed_tokens.weight\": {\"dtype\": \"F32\", \"shape\": [8, 4], "
                    "\"data_offsets\": [0, 128]}, \"model.norm.weight\": {\"dtype\": \"F32\", "
                    "\"shape\": [4], \"data_offsets\": [120, 136]}}",
                    136);
    expect(d, LLM_ERR_BAD_FORMAT, "model.safetensors", "overlap");
    put_safetensors(d, "model.safetensors",
                    "{\"model.norm.weight\": {\"dtype\": \"I64\", \"shape\": [4], "
                    "\"data_offsets\": [0, 32]}}",
                    32);
    expect(d, LLM_ERR_UNSUPPORTED, "model.norm.weight", "I64");
    put_safetensors(d, "model.safetensors",
                    "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [4], "
                    "\"data_offsets\": [0, 12]}}",
                    16);
    expect(d, LLM_ERR_BAD_FORMAT, "model.norm.weight", "'shape'");
    put_safetensors(d, "model.safetensors",
                    "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [4], "
                    "\"data_offsets\": [0, 16]}, \"model.norm.weight\": {\"dtype\": \"F32\", "
                    "\"shape\": [4], \"data_offsets\": [16, 32]}}",
                    32);
    expect(d, LLM_ERR_BAD_FORMAT, "model.norm.weight", "twice");
    /* shape disagreeing with config.json (hidden_size 4) */
    put_safetensors(d, "model.safetensors",
                    "{\"__metadata__\": {\"format\": \"pt\"}, \"model.embed_tokens.weight\": "
                    "{\"dtype\": \"F32\", \"shape\": [8, 5], \"data_offsets\": [0, 160]}}",
                    160);
    expect(d, LLM_ERR_BAD_FORMAT, "model.embed_tokens.weight", "hidden_size");
    put_safetensors(d, "model.safetensors",
                    "{\"model.layers.0.mystery.weight\": {\"dtype\": \"F32\", \"shape\": [4], "
                    "\"data_offsets\": [0, 16]}}",
                    16);
    expect(d, LLM_ERR_UNSUPPORTED, "model.safetensors", "model.layers.0.mystery.weight");
    put_safetensors(d, "model.safetensors",
                    "{\"model.layers.3.input_layernorm.weight\": {\"dtype\": \"F32\", "
                    "\"shape\": [4], \"data_offsets\": [0, 16]}}",
                    16);
    expect(d, LLM_ERR_BAD_FORMAT, "model.layers.3.input_layernorm.weight", "num_hidden_layers");
    put_safetensors(d, "model.safetensors", EMBD_OK, 128);
    put_config(d, "{\"tie_word_embeddings\": false}");
    expect(d, LLM_ERR_BAD_FORMAT, "lm_head.weight", "tie_word_embeddings");
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    remove(p);
    put_config(d, "{}");
    expect(d, LLM_ERR_IO, "model.safetensors", "index");
}

static void test_bad_index(void **state) {
    const char *d = tmp_folder("index");
    put_config(d, "{}");
    put_safetensors(d, "model-00001-of-00002.safetensors", EMBD_OK, 128);
    put_text(d, "model.safetensors.index.json",
             "{\"weight_map\": {\"model.embed_tokens.weight\": "
             "\"model-00001-of-00002.safetensors\", \"model.norm.weight\": "
             "\"model-00002-of-00002.safetensors\"}}");
    expect(d, LLM_ERR_BAD_FORMAT, "model-00002-of-00002.safetensors", "not in the folder");
    put_text(d, "model.safetensors.index.json",
             "{\"weight_map\": {\"model.embed_tokens.weight\": "
             "\"model-00001-of-00002.safetensors\", \"model.norm.weight\": "
             "\"model-00001-of-00002.safetensors\"}}");
    expect(d, LLM_ERR_BAD_FORMAT, "model.norm.weight", "not in shard");
    put_text(d, "model.safetensors.index.json",
             "{\"weight_map\": {\"model.embed_tokens.weight\": \"../secret.safetensors\"}}");
    expect(d, LLM_ERR_BAD_FORMAT, "model.safetensors.index.json", "model.embed_tokens.weight");
    put_text(d, "model.safetensors.index.json", "{\"metadata\": {}}");
    expect(d, LLM_ERR_BAD_FORMAT, "model.safetensors.index.json", "weight_map");
}

/* A sentence-transformers folder: hf-llama-f32's files linked into a
 * folder with modules.json and the Pooling module's config. The modes map
 * as llama.cpp's converter maps them (mean 1, CLS 2, last token 3) to
 * <arch>.pooling_type, which llm_model_pooling reads; modes it refuses are
 * refused at load, naming the file and the field. */
static const char *pooling_folder(const char *modules, const char *pooling_config) {
    const char *d = tmp_folder("pooling");
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char from[1200], to[1200];
        snprintf(from, sizeof from, "%s/%s", model_path("hf-llama-f32"), files[i]);
        snprintf(to, sizeof to, "%s/%s", d, files[i]);
        assert_int_equal(symlink(from, to), 0);
    }
    if (modules)
        put_text(d, "modules.json", modules);
    if (pooling_config) {
        char sub[1200];
        snprintf(sub, sizeof sub, "%s/1_Pooling", d);
        assert_int_equal(mkdir(sub, 0755), 0);
        put_text(sub, "config.json", pooling_config);
    }
    return d;
}

static void expect_pooling(const char *modules, const char *mode, llm_pooling want) {
    char cfg[256];
    snprintf(cfg, sizeof cfg, "{\"word_embedding_dimension\": 8, \"%s\": true}", mode);
    const char *d = pooling_folder(modules, mode ? cfg : NULL);
    llm_model *m = NULL;
    if (llm_model_load(d, NULL, &m) != LLM_OK)
        fail_msg("%s: %s", mode, llm_last_error());
    llm_pooling got = LLM_POOLING_MODEL;
    assert_int_equal(llm_model_pooling(m, &got), LLM_OK);
    if (got != want)
        fail_msg("%s: pooling %d, want %d", mode ? mode : "(none)", got, want);
    llm_model_free(m);
}

static void test_sentence_transformers_pooling(void **state) {
    static const char modules[] = "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", "
                                  "\"type\": \"sentence_transformers.models.Transformer\"}, "
                                  "{\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", "
                                  "\"type\": \"sentence_transformers.models.Pooling\"}, "
                                  "{\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", "
                                  "\"type\": \"sentence_transformers.models.Normalize\"}]";
    expect_pooling(modules, "pooling_mode_lasttoken", LLM_POOLING_LAST);
    expect_pooling(modules, "pooling_mode_cls_token", LLM_POOLING_FIRST);
    expect_pooling(modules, "pooling_mode_mean_tokens", LLM_POOLING_MEAN);
    expect_pooling(NULL, NULL, LLM_POOLING_MEAN); /* no modules.json: the default */
    const char *d = pooling_folder(modules, "{\"pooling_mode_max_tokens\": true}");
    expect(d, LLM_ERR_UNSUPPORTED, "1_Pooling/config.json", "pooling_mode_max_tokens");
    d = pooling_folder(modules, "{\"pooling_mode_cls_token\": false}");
    expect(d, LLM_ERR_BAD_FORMAT, "1_Pooling/config.json", "no pooling_mode_");
    d = pooling_folder(modules, NULL);
    expect(d, LLM_ERR_IO, "1_Pooling/config.json", NULL);
    d = pooling_folder("{\"path\": 1}", NULL);
    expect(d, LLM_ERR_BAD_FORMAT, "modules.json", "array");
    d = pooling_folder("[{\"path\": \"../x\", \"type\": \"x.Pooling\"}]", NULL);
    expect(d, LLM_ERR_BAD_FORMAT, "modules.json", "Pooling module's path");
    d = pooling_folder("[1, 2", NULL);
    expect(d, LLM_ERR_BAD_FORMAT, "modules.json", "JSON");
}

static void test_is_folder(void **state) {
    assert_false(llmi_hf_is_folder(NULL));
    assert_false(llmi_hf_is_folder(g_tmp)); /* a directory without config.json */
    assert_false(llmi_hf_is_folder(model_path("hf-llama-f32.gguf")));
    assert_true(llmi_hf_is_folder(model_path("hf-llama-f32")));
    /* through the model loader the message names the folder too */
    const char *d = tmp_folder("loader");
    put_config(d, "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\"}");
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(d, true, &m), LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(llmi_error_message(), d));
    assert_null(m);
}

/* Every allocation of a folder open fails in turn: an error, never a
 * crash or leak (the ASan build checks the leaks). */
static void test_alloc_failures(void **state) {
    const char *folder = model_path("hf-llama-bf16-sharded");
    char folder_copy[1024];
    snprintf(folder_copy, sizeof folder_copy, "%s", folder);
    llmi_hf_test_tokenizer_source(model_path("hf-llama-bf16.gguf"));
    int failed = 0;
    for (uint64_t n = 1; n < 400; n += n < 100 ? 1 : 7) {
        llmi_gguf *g = NULL;
        llmi_alloc_fail_after(n);
        llm_status st = llmi_hf_open(folder_copy, n % 2 == 0, &g);
        llmi_alloc_fail_after(0);
        if (st == LLM_OK) {
            llmi_gguf_close(g);
            continue;
        }
        failed++;
        assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
        assert_null(g);
    }
    assert_true(failed > 50);
    llmi_hf_test_tokenizer_source(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_f32),       cmocka_unit_test(test_llama_f16),
        cmocka_unit_test(test_llama_bf16),      cmocka_unit_test(test_sharded_read),
        cmocka_unit_test(test_qwen2_f32),       cmocka_unit_test(test_llama3_rope_scaling),
        cmocka_unit_test(test_linear_rope_scaling),
        cmocka_unit_test(test_qwen3_logits),    cmocka_unit_test(test_phi3_logits),
        cmocka_unit_test(test_public_api_generates),
        cmocka_unit_test(test_folder_tokenizer_keys),
        cmocka_unit_test(test_golden_tokenize_llama_folder),
        cmocka_unit_test(test_golden_tokenize_qwen2_folder),
        cmocka_unit_test(test_map_qwen3),       cmocka_unit_test(test_map_gemma3),
        cmocka_unit_test(test_map_phi3),        cmocka_unit_test(test_map_qwen3moe),
        cmocka_unit_test(test_map_mixtral),     cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_bad_safetensors), cmocka_unit_test(test_bad_index),
        cmocka_unit_test(test_is_folder),       cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_sentence_transformers_pooling),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
