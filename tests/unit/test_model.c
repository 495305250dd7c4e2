/* Model loading from GGUF files that are valid except for one thing: each
 * must fail with a clear status and a message naming what is wrong. The
 * variants are made by copying a random test model through the GGUF writer
 * while dropping or replacing one key or tensor. */
#include "model/model.h"
#include "model/testmodel.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

static void *g_base;
static size_t g_base_size;
static llmi_gguf *g_src;

typedef struct edit {
    const char *drop_key;    /* metadata key to leave out */
    const char *drop_tensor; /* tensor to leave out */
    const char *u32_key;     /* replace (or add) this u32 key */
    uint32_t u32_value;
    const char *f32_key; /* replace (or add) this f32 key */
    float f32_value;
    const char *str_key; /* replace this string key */
    const char *str_value;
    const char *reshape_tensor; /* write this tensor with ne[0] halved */
    const char *retype_tensor;  /* write this 1-D F32 tensor as F16 */
} edit;

static void copy_kv(llmi_gguf_writer *w, const llmi_gguf_kv *kv, const char *key) {
    llm_status st;
    if (kv->type == LLMI_GGUF_STRING) {
        char *v = strndup(kv->str.ptr, kv->str.len);
        st = llmi_gguf_w_str(w, key, v);
        free(v);
    } else if (kv->type == LLMI_GGUF_ARRAY && kv->arr_type == LLMI_GGUF_STRING) {
        char **v = calloc(kv->arr_len, sizeof *v);
        for (uint64_t i = 0; i < kv->arr_len; i++)
            v[i] = strndup(kv->arr_strs[i].ptr, kv->arr_strs[i].len);
        st = llmi_gguf_w_arr_str(w, key, (const char *const *)v, kv->arr_len);
        for (uint64_t i = 0; i < kv->arr_len; i++)
            free(v[i]);
        free(v);
    } else if (kv->type == LLMI_GGUF_ARRAY) {
        st = llmi_gguf_w_arr(w, key, kv->arr_type, kv->arr_data, kv->arr_len);
    } else if (kv->type == LLMI_GGUF_F32) {
        st = llmi_gguf_w_f32(w, key, (float)kv->scalar.f);
    } else if (kv->type == LLMI_GGUF_BOOL) {
        st = llmi_gguf_w_bool(w, key, kv->scalar.b);
    } else if (kv->type == LLMI_GGUF_I32) {
        st = llmi_gguf_w_i32(w, key, (int32_t)kv->scalar.i);
    } else {
        st = llmi_gguf_w_u32(w, key, (uint32_t)kv->scalar.u);
    }
    assert_int_equal(st, LLM_OK);
}

/* Writes the edited copy to a temp file; returns its path. */
static const char *write_edited(const edit *e) {
    llmi_gguf_writer *w = NULL;
    assert_int_equal(llmi_gguf_writer_create(&w), LLM_OK);
    for (uint64_t i = 0; i < g_src->n_kv; i++) {
        const llmi_gguf_kv *kv = &g_src->kv[i];
        char *key = strndup(kv->key.ptr, kv->key.len);
        bool replaced = (e->u32_key && !strcmp(key, e->u32_key)) ||
                        (e->f32_key && !strcmp(key, e->f32_key)) ||
                        (e->str_key && !strcmp(key, e->str_key));
        if (!(e->drop_key && !strcmp(key, e->drop_key)) && !replaced)
            copy_kv(w, kv, key);
        free(key);
    }
    if (e->u32_key)
        assert_int_equal(llmi_gguf_w_u32(w, e->u32_key, e->u32_value), LLM_OK);
    if (e->f32_key)
        assert_int_equal(llmi_gguf_w_f32(w, e->f32_key, e->f32_value), LLM_OK);
    if (e->str_key)
        assert_int_equal(llmi_gguf_w_str(w, e->str_key, e->str_value), LLM_OK);
    for (uint64_t i = 0; i < g_src->n_tensors; i++) {
        const llmi_gguf_tensor *t = &g_src->tensors[i];
        char *name = strndup(t->name.ptr, t->name.len);
        uint64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (e->drop_tensor && !strcmp(name, e->drop_tensor)) {
            free(name);
            continue;
        }
        llm_status st;
        if (e->reshape_tensor && !strcmp(name, e->reshape_tensor)) {
            ne[0] /= 2;
            st = llmi_gguf_w_tensor_raw(w, name, t->type, t->n_dims, ne, t->data,
                                        llmi_ttype_row_bytes(t->type, ne[0]) * ne[1]);
        } else if (e->retype_tensor && !strcmp(name, e->retype_tensor)) {
            st = llmi_gguf_w_tensor(w, name, LLMI_T_F16, t->n_dims, ne, t->data);
        } else {
            st = llmi_gguf_w_tensor_raw(w, name, t->type, t->n_dims, ne, t->data, t->nbytes);
        }
        assert_int_equal(st, LLM_OK);
        free(name);
    }
    static char path[512];
    snprintf(path, sizeof path, "%s/edited.gguf",
             getenv("LLM_TEST_TMP") ? getenv("LLM_TEST_TMP") : "/tmp");
    assert_int_equal(llmi_gguf_writer_save(w, path), LLM_OK);
    llmi_gguf_writer_free(w);
    return path;
}

static void expect_fail(const edit *e, llm_status want, const char *substr) {
    llm_model *m = (llm_model *)0x1;
    llm_status st = llmi_model_load(write_edited(e), true, &m);
    if (st != want || !strstr(llmi_error_message(), substr))
        fail_msg("got %d '%s', want %d containing '%s'", st, llmi_error_message(), want, substr);
    assert_null(m);
}

static void test_unedited_copy_loads(void **state) {
    (void)state;
    edit e = {0};
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(write_edited(&e), false, &m), LLM_OK);
    assert_int_equal(m->hp.n_layer, 2);
    assert_int_equal(m->hp.n_vocab, llmi_testmodel_n_vocab());
    assert_false(m->hp.tied_embeddings);
    llmi_model_free(m);
}

static void test_missing_keys(void **state) {
    (void)state;
    const char *required[] = {"general.architecture",       "llama.block_count",
                              "llama.embedding_length",     "llama.feed_forward_length",
                              "llama.attention.head_count", "tokenizer.ggml.tokens",
                              "tokenizer.ggml.model"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        edit e = {.drop_key = required[i]};
        expect_fail(&e, LLM_ERR_BAD_FORMAT, required[i]);
    }
}

static void test_missing_tensors(void **state) {
    (void)state;
    const char *names[] = {"token_embd.weight", "output_norm.weight", "blk.1.ffn_up.weight",
                           "blk.0.attn_k.weight", "blk.1.attn_norm.weight"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        edit e = {.drop_tensor = names[i]};
        expect_fail(&e, LLM_ERR_BAD_FORMAT, names[i]);
    }
    /* Without output.weight the model ties it to token_embd: still valid. */
    edit tied = {.drop_tensor = "output.weight"};
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(write_edited(&tied), true, &m), LLM_OK);
    assert_true(m->hp.tied_embeddings);
    llmi_model_free(m);
}

static void test_bad_values(void **state) {
    (void)state;
    edit arch = {.str_key = "general.architecture", .str_value = "gpt-99"};
    expect_fail(&arch, LLM_ERR_UNSUPPORTED, "gpt-99");
    edit zero_layers = {.u32_key = "llama.block_count", .u32_value = 0};
    expect_fail(&zero_layers, LLM_ERR_BAD_FORMAT, "block_count");
    edit many_layers = {.u32_key = "llama.block_count", .u32_value = 3};
    expect_fail(&many_layers, LLM_ERR_BAD_FORMAT, "blk.2.");
    edit absurd = {.u32_key = "llama.embedding_length", .u32_value = 0xffffffffu};
    expect_fail(&absurd, LLM_ERR_BAD_FORMAT, "embedding_length");
    edit kv_heads = {.u32_key = "llama.attention.head_count_kv", .u32_value = 3};
    expect_fail(&kv_heads, LLM_ERR_BAD_FORMAT, "head_count");
    edit shape = {.reshape_tensor = "blk.0.ffn_gate.weight"};
    expect_fail(&shape, LLM_ERR_BAD_FORMAT, "blk.0.ffn_gate.weight");
    edit norm_type = {.retype_tensor = "blk.0.ffn_norm.weight"};
    expect_fail(&norm_type, LLM_ERR_UNSUPPORTED, "blk.0.ffn_norm.weight");
    edit tok_model = {.str_key = "tokenizer.ggml.model", .str_value = "wordpiece"};
    expect_fail(&tok_model, LLM_ERR_UNSUPPORTED, "wordpiece");
}

/* Values that are well-formed but cannot be right: each is refused naming
 * its key rather than loaded into a model that misbehaves later. */
static void test_inconsistent_values(void **state) {
    (void)state;
    edit bos = {.u32_key = "tokenizer.ggml.bos_token_id", .u32_value = 0xfffffff0u};
    expect_fail(&bos, LLM_ERR_BAD_FORMAT, "'tokenizer.ggml.bos_token_id' = 4294967280 is outside");
    edit eos = {.u32_key = "tokenizer.ggml.eos_token_id", .u32_value = 1000000};
    expect_fail(&eos, LLM_ERR_BAD_FORMAT, "'tokenizer.ggml.eos_token_id' = 1000000 is outside");
    edit eos_edge = {.u32_key = "tokenizer.ggml.eos_token_id",
                     .u32_value = llmi_testmodel_n_vocab()};
    expect_fail(&eos_edge, LLM_ERR_BAD_FORMAT, "eos_token_id");
    edit rope = {.f32_key = "llama.rope.freq_base", .f32_value = INFINITY};
    expect_fail(&rope, LLM_ERR_BAD_FORMAT, "llama.rope.freq_base = inf is not a finite number");
    edit rope_nan = {.f32_key = "llama.rope.freq_base", .f32_value = NAN};
    expect_fail(&rope_nan, LLM_ERR_BAD_FORMAT, "llama.rope.freq_base");
    edit eps = {.f32_key = "llama.attention.layer_norm_rms_epsilon", .f32_value = INFINITY};
    expect_fail(&eps, LLM_ERR_BAD_FORMAT, "layer_norm_rms_epsilon");
    edit vocab = {.u32_key = "llama.vocab_size", .u32_value = llmi_testmodel_n_vocab() + 1};
    expect_fail(&vocab, LLM_ERR_BAD_FORMAT, "llama.vocab_size");
    /* The largest id in the vocabulary is fine, and so is an agreeing
     * vocab_size. */
    edit last = {.u32_key = "tokenizer.ggml.eos_token_id",
                 .u32_value = llmi_testmodel_n_vocab() - 1};
    llm_model *m = NULL;
    assert_int_equal(llmi_model_load(write_edited(&last), true, &m), LLM_OK);
    llmi_model_free(m);
    edit same = {.u32_key = "llama.vocab_size", .u32_value = llmi_testmodel_n_vocab()};
    assert_int_equal(llmi_model_load(write_edited(&same), true, &m), LLM_OK);
    llmi_model_free(m);
}

static void test_alloc_failures(void **state) {
    (void)state;
    edit e = {0};
    const char *path = write_edited(&e);
    int failures = 0;
    for (uint64_t n = 1; n < 100000; n++) {
        llm_model *m = NULL;
        llmi_alloc_fail_after(n);
        llm_status st = llmi_model_load(path, n % 2 == 0, &m);
        llmi_alloc_fail_after(0);
        if (st == LLM_OK) {
            llmi_model_free(m);
            break;
        }
        assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
        assert_null(m);
        failures++;
    }
    printf("# model load: %d allocation failure points, each clean\n", failures);
    assert_true(failures > 5);
}

static int setup(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.type = LLMI_T_Q8_0;
    if (llmi_testmodel_to_memory(&p, &g_base, &g_base_size) != LLM_OK)
        return -1;
    return llmi_gguf_open_memory(g_base, g_base_size, &g_src) == LLM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    llmi_gguf_close(g_src);
    llmi_free(g_base);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unedited_copy_loads), cmocka_unit_test(test_missing_keys),
        cmocka_unit_test(test_missing_tensors),     cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_inconsistent_values), cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
