/* GGUF reader/writer, tensor types, reference quantization and the test
 * model generator. Malformed files are made by patching single fields of a
 * writer-produced file, located through the reader on the intact copy. */
#include "core/core.h"
#include "core/quant.h"
#include "gguf/gguf.h"
#include "model/testmodel.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#define LAST_ERROR() llm_last_error()

#define OK(expr) assert_int_equal((expr), LLM_OK)
#define FMT LLM_ERR_BAD_FORMAT
#define UNSUP LLM_ERR_UNSUPPORTED

#define EXPECT_ERR(expr, status, substr)                                                           \
    do {                                                                                           \
        llm_status st_ = (expr);                                                                   \
        if (st_ != (status) || !strstr(LAST_ERROR(), (substr)))                                    \
            fail_msg("%s: got %s \"%s\", want %s containing \"%s\"", #expr, status_name(st_),      \
                     LAST_ERROR(), status_name(status), substr);                                   \
    } while (0)

static const char *status_name(llm_status s) {
#define NAME_(n, v, t)                                                                             \
    case n:                                                                                        \
        return #n;
    switch (s) { LLM_STATUS_LIST(NAME_) }
#undef NAME_
    return "?";
}

static uint64_t rng_state;
static float rnd(void) { /* splitmix64 -> uniform [-1, 1) */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) / 8388608.0f - 1.0f;
}
static void seed(uint64_t s, const char *what) {
    rng_state = s;
    print_message("%s: seed %llu\n", what, (unsigned long long)s);
}

static const llmi_ttype all_types[] = {LLMI_T_F32,  LLMI_T_F16,  LLMI_T_BF16,
                                       LLMI_T_Q4_0, LLMI_T_Q4_1, LLMI_T_Q8_0};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

/* Getters that must succeed. */
static uint32_t u32_of(const llmi_gguf *g, const char *key) {
    uint32_t v = 0;
    OK(llmi_gguf_get_u32(g, key, true, &v));
    return v;
}
static float f32_of(const llmi_gguf *g, const char *key) {
    float v = 0;
    OK(llmi_gguf_get_f32(g, key, true, &v));
    return v;
}
static bool str_is(const llmi_gguf *g, const char *key, const char *want) {
    llmi_str v = {0};
    OK(llmi_gguf_get_str(g, key, true, &v));
    return llmi_str_eq(v, want);
}
static bool bool_of(const llmi_gguf *g, const char *key) {
    bool v = false;
    OK(llmi_gguf_get_bool(g, key, true, &v));
    return v;
}
static const llmi_gguf_kv *arr_of(const llmi_gguf *g, const char *key, llmi_gguf_vtype t) {
    const llmi_gguf_kv *kv = NULL;
    OK(llmi_gguf_get_arr(g, key, true, t, &kv));
    return kv;
}

/* ---- tensor types and quantization ---- */

static void test_ttype(void **state) {
    (void)state;
    assert_int_equal(llmi_ttype_get(LLMI_T_Q4_0)->block_bytes, 18);
    assert_int_equal(llmi_ttype_get(LLMI_T_Q4_1)->block_bytes, 20);
    assert_int_equal(llmi_ttype_get(LLMI_T_Q8_0)->block_bytes, 34);
    assert_string_equal(llmi_ttype_get(LLMI_T_BF16)->name, "BF16");
    assert_null(llmi_ttype_get(99));
    assert_null(llmi_ttype_get(13)); /* Q5_K */
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_F32, 10), 40);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_F16, 10), 20);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_BF16, 3), 6);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_Q4_0, 64), 36);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_Q4_1, 96), 60);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_Q8_0, 32), 34);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_Q8_0, 33), 0);
    assert_int_equal(llmi_ttype_row_bytes(99, 32), 0);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_F32, UINT64_MAX / 2), 0);
}

/* Known answers fix the nibble layout and the scale conventions. */
static void test_quant_known(void **state) {
    (void)state;
    float x[32], y[32];
    llmi_block_q4_0 b40;
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j % 16) - 8.0f; /* max-abs -8: d = 1 */
    llmi_quantize_row(LLMI_T_Q4_0, x, &b40, 32);
    assert_true(llmi_f16_to_f32(b40.d) == 1.0f);
    for (int j = 0; j < 16; j++)
        assert_int_equal(b40.qs[j], j | j << 4);
    llmi_dequantize_row(LLMI_T_Q4_0, &b40, y, 32);
    for (int j = 0; j < 32; j++)
        assert_true(y[j] == x[j]);

    llmi_block_q4_1 b41;
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j < 16 ? j : 31 - j) + 2.0f; /* d=1, m=2 */
    llmi_quantize_row(LLMI_T_Q4_1, x, &b41, 32);
    assert_true(llmi_f16_to_f32(b41.d) == 1.0f && llmi_f16_to_f32(b41.m) == 2.0f);
    for (int j = 0; j < 16; j++)
        assert_int_equal(b41.qs[j], j | (15 - j) << 4);
    llmi_dequantize_row(LLMI_T_Q4_1, &b41, y, 32);
    for (int j = 0; j < 32; j++)
        assert_true(y[j] == x[j]);

    llmi_block_q8_0 b8;
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j * 8 - 127) * (j == 0 ? 1.0f : 0.5f);
    x[0] = -127.0f; /* amax 127: d = 1 */
    llmi_quantize_row(LLMI_T_Q8_0, x, &b8, 32);
    assert_true(llmi_f16_to_f32(b8.d) == 1.0f);
    for (int j = 0; j < 32; j++)
        assert_int_equal(b8.qs[j], (int)roundf(x[j]));

    /* All-zero blocks must not divide by zero. */
    memset(x, 0, sizeof x);
    for (size_t t = 0; t < N_TYPES; t++) {
        uint8_t buf[128];
        llmi_quantize_row(all_types[t], x, buf, 32);
        llmi_dequantize_row(all_types[t], buf, y, 32);
        for (int j = 0; j < 32; j++)
            assert_true(y[j] == 0.0f);
    }
}

/* Largest error element i may have after a round trip: half a step of the
 * block's scale, a whole step where Q4_0 clamps the end opposite the largest
 * magnitude at 15, plus the rounding of the scale (and min) to f16. */
static float tolerance(llmi_ttype t, const float *x, size_t i) {
    if (t == LLMI_T_F32)
        return 0.0f;
    if (t == LLMI_T_F16)
        return fabsf(x[i]) / 2048 + 6e-8f;
    if (t == LLMI_T_BF16)
        return fabsf(x[i]) / 256;
    const float *blk = x + i / 32 * 32;
    float amax = 0, mn = blk[0], mx = blk[0];
    for (int j = 0; j < 32; j++) {
        if (fabsf(blk[j]) > amax)
            amax = fabsf(blk[j]);
        if (blk[j] < mn)
            mn = blk[j];
        if (blk[j] > mx)
            mx = blk[j];
    }
    if (t == LLMI_T_Q4_0)
        return amax / 8 + amax * 2e-3f;
    if (t == LLMI_T_Q4_1)
        return (mx - mn) / 15 * 0.5f + amax * 2e-3f;
    return amax / 127 * 0.5f + amax * 2e-3f; /* Q8_0 */
}

static void check_close(llmi_ttype t, const float *orig, const float *got, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float tol = tolerance(t, orig, i);
        if (!(fabsf(orig[i] - got[i]) <= tol))
            fail_msg("%s element %zu: %g -> %g (tolerance %g)", llmi_ttype_get(t)->name, i, orig[i],
                     got[i], tol);
    }
}

static void test_quant_random(void **state) {
    (void)state;
    enum { N = 32 * 64 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *q = malloc(N * 4);
    for (size_t t = 0; t < N_TYPES; t++) {
        seed(1000 + t, llmi_ttype_get(all_types[t])->name);
        for (int i = 0; i < N; i++)
            x[i] = rnd() * (1.0f + 50.0f * (float)(i / 32 % 4 == 0));
        llmi_quantize_row(all_types[t], x, q, N);
        llmi_dequantize_row(all_types[t], q, y, N);
        check_close(all_types[t], x, y, N);
    }
    free(x);
    free(y);
    free(q);
}

/* ---- writer -> reader round trips ---- */

static void *finish(llmi_gguf_writer *w, size_t *size) {
    void *data;
    OK(llmi_gguf_writer_to_memory(w, &data, size));
    llmi_gguf_writer_free(w);
    return data;
}

static void test_roundtrip_metadata(void **state) {
    (void)state;
    llmi_gguf_writer *w;
    OK(llmi_gguf_writer_create(&w));
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000, u16a[] = {1, 65535};
    int16_t i16 = -30000;
    uint64_t u64 = (1ull << 40) + 1;
    int64_t i64 = -(1ll << 40), i64a[] = {INT64_MIN};
    double f64 = 1e300, f64a[] = {0.25};
    bool ba[] = {true, false, true};
    float fa[] = {1.5f, -2.0f};
    int32_t ia[] = {-1, 7, 9};
    const char *strs[] = {"a", "", "\xc4\xa0the"};
    OK(llmi_gguf_w_scalar(w, "k.u8", LLMI_GGUF_U8, &u8));
    OK(llmi_gguf_w_scalar(w, "k.i8", LLMI_GGUF_I8, &i8));
    OK(llmi_gguf_w_scalar(w, "k.u16", LLMI_GGUF_U16, &u16));
    OK(llmi_gguf_w_scalar(w, "k.i16", LLMI_GGUF_I16, &i16));
    OK(llmi_gguf_w_u32(w, "k.u32", 4000000000u));
    OK(llmi_gguf_w_i32(w, "k.i32", -2000000000));
    OK(llmi_gguf_w_f32(w, "k.f32", 3.5f));
    OK(llmi_gguf_w_bool(w, "k.bool", true));
    OK(llmi_gguf_w_str(w, "k.str", "h\xc3\xa9llo"));
    OK(llmi_gguf_w_str(w, "k.empty", ""));
    OK(llmi_gguf_w_scalar(w, "k.u64", LLMI_GGUF_U64, &u64));
    OK(llmi_gguf_w_scalar(w, "k.i64", LLMI_GGUF_I64, &i64));
    OK(llmi_gguf_w_scalar(w, "k.f64", LLMI_GGUF_F64, &f64));
    OK(llmi_gguf_w_arr_str(w, "a.str", strs, 3));
    OK(llmi_gguf_w_arr_f32(w, "a.f32", fa, 2));
    OK(llmi_gguf_w_arr_i32(w, "a.i32", ia, 3));
    OK(llmi_gguf_w_arr_i32(w, "a.empty", NULL, 0));
    OK(llmi_gguf_w_arr(w, "a.u16", LLMI_GGUF_U16, u16a, 2));
    OK(llmi_gguf_w_arr(w, "a.f64", LLMI_GGUF_F64, f64a, 1));
    OK(llmi_gguf_w_arr(w, "a.bool", LLMI_GGUF_BOOL, ba, 3));
    OK(llmi_gguf_w_arr(w, "a.i64", LLMI_GGUF_I64, i64a, 1));
    EXPECT_ERR(llmi_gguf_w_u32(w, "k.u8", 1), LLM_ERR_INVALID_ARGUMENT, "duplicate key 'k.u8'");
    EXPECT_ERR(llmi_gguf_w_u32(w, "general.alignment", 3), LLM_ERR_INVALID_ARGUMENT,
               "power of two");
    size_t size;
    uint8_t *buf = finish(w, &size);

    llmi_gguf *g;
    OK(llmi_gguf_open_memory(buf, size, &g));
    assert_true(g->version == 3 && g->n_kv == 21 && g->n_tensors == 0 && g->alignment == 32);
    assert_int_equal(llmi_gguf_find(g, "k.u8")->scalar.u, 200);
    assert_int_equal(llmi_gguf_find(g, "k.i8")->scalar.i, -100);
    assert_int_equal(llmi_gguf_find(g, "k.u16")->scalar.u, 60000);
    assert_int_equal(llmi_gguf_find(g, "k.i16")->scalar.i, -30000);
    assert_int_equal(llmi_gguf_find(g, "k.i32")->scalar.i, -2000000000);
    assert_true(llmi_gguf_find(g, "k.u64")->scalar.u == u64);
    assert_true(llmi_gguf_find(g, "k.i64")->scalar.i == i64);
    assert_true(llmi_gguf_find(g, "k.f64")->scalar.f == 1e300);
    assert_int_equal(llmi_gguf_find(g, "k.f64")->type, LLMI_GGUF_F64);
    assert_null(llmi_gguf_find(g, "k.u"));
    assert_null(llmi_gguf_find(g, "k.u88"));
    assert_int_equal(u32_of(g, "k.u8"), 200);
    assert_int_equal(u32_of(g, "k.u32"), 4000000000u);
    assert_true(f32_of(g, "k.f32") == 3.5f);
    assert_true(isinf(f32_of(g, "k.f64")));
    assert_true(bool_of(g, "k.bool"));
    assert_true(str_is(g, "k.str", "h\xc3\xa9llo"));
    assert_true(str_is(g, "k.empty", ""));

    const llmi_gguf_kv *kv = arr_of(g, "a.str", LLMI_GGUF_STRING);
    assert_int_equal(kv->arr_len, 3);
    assert_true(llmi_str_eq(kv->arr_strs[0], "a") && llmi_str_eq(kv->arr_strs[1], "") &&
                llmi_str_eq(kv->arr_strs[2], "\xc4\xa0the"));
    assert_int_equal(arr_of(g, "a.empty", LLMI_GGUF_I32)->arr_len, 0);
    /* Raw elements are little-endian, as is every host this runs on. */
    const struct {
        const char *key;
        llmi_gguf_vtype t;
        size_t n;
        const void *v;
        size_t bytes;
    } arrs[] = {{"a.f32", LLMI_GGUF_F32, 2, fa, sizeof fa},
                {"a.i32", LLMI_GGUF_I32, 3, ia, sizeof ia},
                {"a.u16", LLMI_GGUF_U16, 2, u16a, sizeof u16a},
                {"a.f64", LLMI_GGUF_F64, 1, f64a, sizeof f64a},
                {"a.bool", LLMI_GGUF_BOOL, 3, "\1\0\1", 3},
                {"a.i64", LLMI_GGUF_I64, 1, i64a, sizeof i64a}};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        kv = arr_of(g, arrs[i].key, arrs[i].t);
        assert_int_equal(kv->arr_len, arrs[i].n);
        assert_memory_equal(kv->arr_data, arrs[i].v, arrs[i].bytes);
    }

    /* Getter failures name the key and both types; absent optional keys keep *out. */
    uint32_t u32 = 77;
    float f32;
    bool b;
    llmi_str s;
    OK(llmi_gguf_get_u32(g, "missing.key", false, &u32));
    assert_int_equal(u32, 77);
    EXPECT_ERR(llmi_gguf_get_u32(g, "missing.key", true, &u32), LLM_ERR_NOT_FOUND,
               "required metadata key 'missing.key' not found");
    EXPECT_ERR(llmi_gguf_get_str(g, "missing.str", true, &s), LLM_ERR_NOT_FOUND, "missing.str");
    EXPECT_ERR(llmi_gguf_get_u32(g, "k.i8", true, &u32), FMT, "'k.i8' = -100 does not fit in u32");
    EXPECT_ERR(llmi_gguf_get_u32(g, "k.u64", true, &u32), FMT, "'k.u64' = 1099511627777 does not");
    EXPECT_ERR(llmi_gguf_get_u32(g, "k.str", true, &u32), FMT,
               "'k.str' has type string, expected an integer");
    EXPECT_ERR(llmi_gguf_get_u32(g, "k.f32", true, &u32), FMT, "'k.f32' has type f32");
    EXPECT_ERR(llmi_gguf_get_f32(g, "k.u32", false, &f32), FMT,
               "'k.u32' has type u32, expected f32");
    EXPECT_ERR(llmi_gguf_get_bool(g, "k.u8", true, &b), FMT, "'k.u8' has type u8, expected bool");
    EXPECT_ERR(llmi_gguf_get_str(g, "a.str", true, &s), FMT,
               "'a.str' is an array of string, expected string");
    EXPECT_ERR(llmi_gguf_get_arr(g, "a.str", true, LLMI_GGUF_I32, &kv), FMT,
               "'a.str' is an array of string, expected an array of i32");
    EXPECT_ERR(llmi_gguf_get_arr(g, "k.u32", true, LLMI_GGUF_U32, &kv), FMT,
               "'k.u32' has type u32, expected an array of u32");

    const llm_status INVAL = LLM_ERR_INVALID_ARGUMENT;
    EXPECT_ERR(llmi_gguf_get_u32(NULL, "k.u8", true, &u32), INVAL, "gguf is NULL");
    EXPECT_ERR(llmi_gguf_get_u32(g, NULL, true, &u32), INVAL, "key is NULL");
    EXPECT_ERR(llmi_gguf_get_f32(g, "k.f32", true, NULL), INVAL, "out is NULL");
    EXPECT_ERR(llmi_gguf_get_bool(g, "k.bool", true, NULL), INVAL, "out is NULL");
    EXPECT_ERR(llmi_gguf_get_str(g, "k.str", true, NULL), INVAL, "out is NULL");
    EXPECT_ERR(llmi_gguf_get_arr(g, "a.str", true, LLMI_GGUF_STRING, NULL), INVAL, "out is NULL");
    assert_null(llmi_gguf_find(NULL, "k.u8"));
    assert_null(llmi_gguf_find(g, NULL));
    assert_null(llmi_gguf_find_tensor(g, NULL));
    assert_null(llmi_gguf_find_tensor(g, "x"));
    assert_false(llmi_str_eq(kv->key, NULL));

    /* Every entry copied into a new writer, in order, writes the same file. */
    llmi_gguf_writer *copy;
    OK(llmi_gguf_writer_create(&copy));
    for (uint64_t i = 0; i < g->n_kv; i++)
        OK(llmi_gguf_w_copy_kv(copy, &g->kv[i]));
    EXPECT_ERR(llmi_gguf_w_copy_kv(copy, &g->kv[0]), LLM_ERR_INVALID_ARGUMENT,
               "duplicate key 'k.u8'");
    EXPECT_ERR(llmi_gguf_w_copy_kv(copy, NULL), LLM_ERR_INVALID_ARGUMENT, "no writer or key");
    size_t copy_size;
    uint8_t *copy_buf = finish(copy, &copy_size);
    assert_int_equal(copy_size, size);
    assert_memory_equal(copy_buf, buf, size);
    llmi_free(copy_buf);

    llmi_gguf_close(g);
    llmi_gguf_close(NULL);
    llmi_free(buf);
}

static void test_null_args(void **state) {
    (void)state;
    llmi_gguf *g = (llmi_gguf *)1;
    EXPECT_ERR(llmi_gguf_open_memory(NULL, 10, &g), LLM_ERR_INVALID_ARGUMENT, "data is NULL");
    assert_null(g);
    EXPECT_ERR(llmi_gguf_open_memory("GGUF", 4, NULL), LLM_ERR_INVALID_ARGUMENT, "out is NULL");
    EXPECT_ERR(llmi_gguf_open(NULL, true, &g), LLM_ERR_INVALID_ARGUMENT, "path is NULL");
    EXPECT_ERR(llmi_gguf_open("x", true, NULL), LLM_ERR_INVALID_ARGUMENT, "out is NULL");
    EXPECT_ERR(llmi_gguf_writer_create(NULL), LLM_ERR_INVALID_ARGUMENT, "out is NULL");
    EXPECT_ERR(llmi_gguf_w_u32(NULL, "k", 1), LLM_ERR_INVALID_ARGUMENT, "writer is NULL");
    llmi_gguf_writer *w;
    OK(llmi_gguf_writer_create(&w));
    EXPECT_ERR(llmi_gguf_w_u32(w, NULL, 1), LLM_ERR_INVALID_ARGUMENT, "key is NULL");
    EXPECT_ERR(llmi_gguf_w_str(w, "k", NULL), LLM_ERR_INVALID_ARGUMENT, "value is NULL");
    uint64_t ne[2] = {32, 2};
    float data[64] = {0};
    EXPECT_ERR(llmi_gguf_w_tensor(w, "t", LLMI_T_F32, 2, ne, NULL), LLM_ERR_INVALID_ARGUMENT,
               "data is NULL");
    EXPECT_ERR(llmi_gguf_w_tensor(w, NULL, LLMI_T_F32, 2, ne, data), LLM_ERR_INVALID_ARGUMENT,
               "name");
    EXPECT_ERR(llmi_gguf_w_tensor(w, "t", LLMI_T_F32, 5, ne, data), LLM_ERR_INVALID_ARGUMENT,
               "n_dims 5");
    ne[0] = 31;
    EXPECT_ERR(llmi_gguf_w_tensor(w, "t", LLMI_T_Q4_0, 2, ne, data), LLM_ERR_INVALID_ARGUMENT,
               "not a multiple of 32");
    ne[0] = 32;
    EXPECT_ERR(llmi_gguf_w_tensor_raw(w, "t", LLMI_T_F32, 2, ne, data, 100),
               LLM_ERR_INVALID_ARGUMENT, "100 bytes given, shape needs 256");
    OK(llmi_gguf_w_tensor(w, "t", LLMI_T_F32, 2, ne, data));
    EXPECT_ERR(llmi_gguf_w_tensor(w, "t", LLMI_T_F32, 2, ne, data), LLM_ERR_INVALID_ARGUMENT,
               "duplicate tensor 't'");
    EXPECT_ERR(llmi_gguf_writer_to_memory(w, NULL, NULL), LLM_ERR_INVALID_ARGUMENT, "NULL");
    EXPECT_ERR(llmi_gguf_writer_save(w, NULL), LLM_ERR_INVALID_ARGUMENT, "NULL");
    llmi_gguf_writer_free(w);
    llmi_gguf_writer_free(NULL);
}

static const char *tmp_dir(void) {
    const char *d = getenv("LLM_TEST_TMP");
    if (d && *d) {
        mkdir(d, 0777);
        return d;
    }
    return "/tmp";
}

static void test_roundtrip_tensors(void **state) {
    (void)state;
    static const uint64_t shapes[][4] = {
        {64, 3, 1, 1}, {32, 2, 2, 1}, {96, 1, 2, 2}, {32, 1, 1, 1}};
    static const uint32_t dims[] = {2, 3, 4, 1};
    enum { MAXN = 64 * 3 * 4 };
    float *orig[N_TYPES * 4];
    llmi_gguf_writer *w;
    OK(llmi_gguf_writer_create(&w));
    OK(llmi_gguf_w_u32(w, "general.alignment", 64));
    seed(42, "tensor round trip");
    for (size_t t = 0; t < N_TYPES; t++) {
        for (size_t s = 0; s < 4; s++) {
            float *x = orig[t * 4 + s] = malloc(MAXN * sizeof *x);
            for (int i = 0; i < MAXN; i++)
                x[i] = rnd() * 3.0f;
            char name[64];
            snprintf(name, sizeof name, "t.%s.%zu", llmi_ttype_get(all_types[t])->name, s);
            OK(llmi_gguf_w_tensor(w, name, all_types[t], dims[s], shapes[s], x));
        }
    }
    uint8_t raw[18] = {0x00, 0x3c}; /* Q4_0 block with d = 1.0, all nibbles 0 -> -8 */
    uint64_t ne_raw = 32;
    OK(llmi_gguf_w_tensor_raw(w, "raw", LLMI_T_Q4_0, 1, &ne_raw, raw, 18));
    char path[512];
    snprintf(path, sizeof path, "%s/test_gguf_rt_%d.gguf", tmp_dir(), (int)getpid());
    OK(llmi_gguf_writer_save(w, path));
    size_t size;
    uint8_t *buf = finish(w, &size);

    float *y = malloc(MAXN * sizeof *y);
    for (int mode = 0; mode < 3; mode++) {
        llmi_gguf *g;
        if (mode == 0)
            OK(llmi_gguf_open_memory(buf, size, &g));
        else
            OK(llmi_gguf_open(path, mode == 1, &g));
        assert_int_equal(g->size, size);
        assert_memory_equal(g->base, buf, size);
        assert_int_equal(g->alignment, 64);
        assert_int_equal(g->n_tensors, N_TYPES * 4 + 1);
        for (size_t t = 0; t < N_TYPES; t++) {
            for (size_t s = 0; s < 4; s++) {
                char name[64];
                snprintf(name, sizeof name, "t.%s.%zu", llmi_ttype_get(all_types[t])->name, s);
                const llmi_gguf_tensor *ti = llmi_gguf_find_tensor(g, name);
                assert_non_null(ti);
                assert_int_equal(ti->type, all_types[t]);
                assert_int_equal(ti->n_dims, dims[s]);
                uint64_t n = 1;
                for (int d = 0; d < 4; d++) {
                    assert_int_equal(ti->ne[d], shapes[s][d]);
                    n *= ti->ne[d];
                }
                assert_int_equal(ti->offset % 64, 0);
                assert_int_equal(((const uint8_t *)ti->data - g->base) % 64, 0);
                assert_int_equal(ti->nbytes, llmi_ttype_row_bytes(ti->type, n));
                llmi_dequantize_row(ti->type, ti->data, y, (int64_t)n);
                check_close(ti->type, orig[t * 4 + s], y, n);
            }
        }
        const llmi_gguf_tensor *r = llmi_gguf_find_tensor(g, "raw");
        assert_non_null(r);
        llmi_dequantize_row(r->type, r->data, y, 32);
        assert_true(y[0] == -8.0f && y[31] == -8.0f);
        /* Pages given back stay valid (a mapping faults them in again; a
         * file read into memory, or a range outside the file, is left as
         * it is). */
        llmi_gguf_release_pages(g, g->base, g->size);
        llmi_gguf_release_pages(g, g->base + 1, g->size); /* past the end: ignored */
        llmi_gguf_release_pages(g, (const void *)((uintptr_t)g->base - 4096),
                                g->size / 2);            /* before it */
        llmi_gguf_release_pages(g, y, MAXN * sizeof *y); /* not the file's */
        assert_memory_equal(g->base, buf, size);
        llmi_gguf_close(g);
    }
    for (size_t i = 0; i < N_TYPES * 4; i++)
        free(orig[i]);
    free(y);
    llmi_free(buf);
    unlink(path);
}

/* ---- the real model ---- */

static const llmi_gguf_tensor *tensor_of(const llmi_gguf *g, const char *name) {
    const llmi_gguf_tensor *t = llmi_gguf_find_tensor(g, name);
    if (!t)
        fail_msg("tensor '%s' missing", name);
    return t;
}

static void test_real_model(void **state) {
    (void)state;
    const char *path = getenv("LLM_TEST_MODEL");
    if (!path || access(path, R_OK) != 0) {
        print_message("LLM_TEST_MODEL unset or unreadable; skipping\n");
        skip();
    }
    static const struct {
        const char *key;
        uint32_t v;
    } u32s[] = {
        {"llama.block_count", 30},
        {"llama.context_length", 8192},
        {"llama.embedding_length", 576},
        {"llama.feed_forward_length", 1536},
        {"llama.attention.head_count", 9},
        {"llama.attention.head_count_kv", 3},
        {"llama.vocab_size", 49152},
        {"llama.rope.dimension_count", 64},
        {"tokenizer.ggml.bos_token_id", 1},
        {"tokenizer.ggml.eos_token_id", 2},
        {"tokenizer.ggml.padding_token_id", 2},
        {"general.file_type", 3},
    };
    for (int use_mmap = 1; use_mmap >= 0; use_mmap--) {
        llmi_gguf *g;
        OK(llmi_gguf_open(path, use_mmap, &g));
        assert_true(g->version == 3 && g->n_tensors == 272 && g->n_kv == 33 && g->alignment == 32);
        assert_true(str_is(g, "general.architecture", "llama"));
        assert_true(str_is(g, "tokenizer.ggml.pre", "smollm"));
        for (size_t i = 0; i < sizeof u32s / sizeof u32s[0]; i++)
            assert_int_equal(u32_of(g, u32s[i].key), u32s[i].v);
        assert_true(f32_of(g, "llama.rope.freq_base") == 100000.0f);
        assert_true(fabsf(f32_of(g, "llama.attention.layer_norm_rms_epsilon") - 1e-5f) < 1e-9f);
        assert_false(bool_of(g, "tokenizer.ggml.add_bos_token"));
        const llmi_gguf_kv *kv = arr_of(g, "tokenizer.ggml.tokens", LLMI_GGUF_STRING);
        assert_int_equal(kv->arr_len, 49152);
        assert_true(llmi_str_eq(kv->arr_strs[1], "<|im_start|>"));
        kv = arr_of(g, "tokenizer.ggml.merges", LLMI_GGUF_STRING);
        assert_int_equal(kv->arr_len, 48900);
        assert_true(llmi_str_eq(kv->arr_strs[0], "\xc4\xa0 t"));
        assert_int_equal(arr_of(g, "tokenizer.ggml.token_type", LLMI_GGUF_I32)->arr_len, 49152);

        const llmi_gguf_tensor *t = tensor_of(g, "token_embd.weight");
        assert_true(t->type == LLMI_T_Q8_0 && t->ne[0] == 576 && t->ne[1] == 49152);
        t = tensor_of(g, "blk.29.ffn_down.weight");
        assert_true(t->type == LLMI_T_Q4_1 && t->ne[0] == 1536 && t->ne[1] == 576);
        assert_null(llmi_gguf_find_tensor(g, "output.weight")); /* tied embeddings */
        float *row = malloc(1536 * sizeof *row);
        uint64_t total = 0;
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            t = &g->tensors[i];
            const uint8_t *p = t->data;
            assert_true(p >= g->base && p + t->nbytes <= g->base + g->size && t->ne[0] <= 1536);
            /* First and last rows dequantize to finite values. */
            size_t rb = llmi_ttype_row_bytes(t->type, t->ne[0]);
            for (size_t r = 0; r<t->nbytes; r += t->nbytes - rb> rb ? t->nbytes - rb : rb) {
                llmi_dequantize_row(t->type, p + r, row, (int64_t)t->ne[0]);
                for (uint64_t j = 0; j < t->ne[0]; j++)
                    assert_true(isfinite(row[j]));
            }
            total += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        }
        assert_true(total > 130000000 && total < 140000000);
        free(row);
        llmi_gguf_close(g);
    }
}

/* ---- malformed input ---- */

/* A small valid file: scalars, strings, arrays, an alignment key and three
 * tensors, the last ending exactly at the end of the file. */
static uint8_t *small_file(size_t *size) {
    llmi_gguf_writer *w;
    OK(llmi_gguf_writer_create(&w));
    OK(llmi_gguf_w_str(w, "general.architecture", "llama"));
    OK(llmi_gguf_w_str(w, "general.name", "tiny"));
    OK(llmi_gguf_w_u32(w, "general.alignment", 32));
    OK(llmi_gguf_w_u32(w, "dup.aaa", 1));
    OK(llmi_gguf_w_u32(w, "dup.bbb", 2));
    OK(llmi_gguf_w_bool(w, "k.bool", true));
    OK(llmi_gguf_w_f32(w, "k.f32", 0.5f));
    const char *strs[] = {"x", "yz"};
    OK(llmi_gguf_w_arr_str(w, "a.str", strs, 2));
    int32_t ia[] = {1, 2, 3};
    OK(llmi_gguf_w_arr_i32(w, "a.i32", ia, 3));
    float x[64 * 2];
    seed(7, "small file");
    for (int i = 0; i < 64 * 2; i++)
        x[i] = rnd();
    uint64_t ne_a[2] = {64, 2}, ne_b[1] = {32}, ne_c[2] = {32, 2};
    OK(llmi_gguf_w_tensor(w, "t.a", LLMI_T_F32, 2, ne_a, x));
    OK(llmi_gguf_w_tensor(w, "t.b", LLMI_T_Q4_0, 1, ne_b, x));
    OK(llmi_gguf_w_tensor(w, "t.c", LLMI_T_F32, 2, ne_c, x));
    return finish(w, size);
}

typedef struct fixture {
    uint8_t *orig, *buf; /* pristine and patched copies */
    size_t size;
    llmi_gguf *g; /* parse of the pristine copy, to locate fields */
} fixture;

static void fx_open(fixture *f) {
    f->orig = small_file(&f->size);
    f->buf = malloc(f->size);
    memcpy(f->buf, f->orig, f->size);
    OK(llmi_gguf_open_memory(f->orig, f->size, &f->g));
}

static void fx_close(fixture *f) {
    llmi_gguf_close(f->g);
    llmi_free(f->orig);
    free(f->buf);
}

static void fx_reset(fixture *f) { memcpy(f->buf, f->orig, f->size); }

/* Offset of a key's value-type field. */
static size_t kv_pos(const fixture *f, const char *key) {
    const llmi_gguf_kv *kv = llmi_gguf_find(f->g, key);
    assert_non_null(kv);
    return (size_t)((const uint8_t *)kv->key.ptr - f->orig) + kv->key.len;
}

/* Offset of a tensor's n_dims field; ne, type and offset follow it. */
static size_t tensor_pos(const fixture *f, const char *name) {
    const llmi_gguf_tensor *t = llmi_gguf_find_tensor(f->g, name);
    assert_non_null(t);
    return (size_t)((const uint8_t *)t->name.ptr - f->orig) + t->name.len;
}

/* Parses the patched copy, expecting `want` and `msg` in the message. */
static void expect_parse(fixture *f, llm_status want, const char *msg, int line) {
    llmi_gguf *g = (llmi_gguf *)1;
    llm_status st = llmi_gguf_open_memory(f->buf, f->size, &g);
    if (st == LLM_OK)
        llmi_gguf_close(g);
    else
        assert_null(g);
    if (st != want || !strstr(st == LLM_OK ? "" : LAST_ERROR(), msg))
        fail_msg("line %d: got %s \"%s\", want %s containing \"%s\"", line, status_name(st),
                 LAST_ERROR(), status_name(want), msg);
}

/* Writes `v` as a `w`-byte little-endian field at pos of the patched copy. */
static void patch(fixture *f, size_t pos, int w, uint64_t v) {
    assert_true(pos + (size_t)w <= f->size);
    for (int i = 0; i < w; i++)
        f->buf[pos + i] = (uint8_t)(v >> (8 * i));
}

/* One field changed from the intact file must give this error. */
#define BAD(pos, w, v, want, msg)                                                                  \
    do {                                                                                           \
        fx_reset(&f);                                                                              \
        patch(&f, (pos), (w), (v));                                                                \
        expect_parse(&f, (want), (msg), __LINE__);                                                 \
    } while (0)

static void test_truncated(void **state) {
    (void)state;
    fixture f;
    fx_open(&f);
    const llmi_gguf_tensor *last = llmi_gguf_find_tensor(f.g, "t.c");
    assert_int_equal((const uint8_t *)last->data + last->nbytes - f.orig, f.size);
    for (size_t len = 0; len < f.size; len++) {
        /* An exact-size copy, so the sanitizer sees any read past the end. */
        uint8_t *p = malloc(len ? len : 1);
        memcpy(p, f.orig, len);
        llmi_gguf *g = (llmi_gguf *)1;
        llm_status st = llmi_gguf_open_memory(p, len, &g);
        if (st != LLM_ERR_BAD_FORMAT || g != NULL || !strstr(LAST_ERROR(), "truncated"))
            fail_msg("prefix of %zu/%zu bytes: %s \"%s\"", len, f.size, status_name(st),
                     LAST_ERROR());
        free(p);
    }
    /* Every single corrupted byte parses or fails cleanly, with a message. */
    for (size_t i = 0; i < f.size; i++) {
        for (int v = 0; v < 3; v++) {
            fx_reset(&f);
            f.buf[i] = (uint8_t)(v == 0 ? 0xff : v == 1 ? f.orig[i] + 1 : f.orig[i] ^ 0x80);
            llmi_gguf *g = NULL;
            llm_status st = llmi_gguf_open_memory(f.buf, f.size, &g);
            if (st == LLM_OK)
                llmi_gguf_close(g);
            else
                assert_true(g == NULL && LAST_ERROR()[0] != '\0');
        }
    }
    static const uint8_t z = 0;
    llmi_gguf *g;
    EXPECT_ERR(llmi_gguf_open_memory(&z, 0, &g), FMT, "truncated at byte 0 while reading magic");
    EXPECT_ERR(llmi_gguf_open_memory(f.orig, 10, &g), FMT,
               "truncated at byte 10 while reading tensor count");
    EXPECT_ERR(llmi_gguf_open_memory(f.orig, kv_pos(&f, "a.i32") + 12, &g), FMT,
               "while reading array length of metadata key 'a.i32'");
    EXPECT_ERR(llmi_gguf_open_memory(f.orig, tensor_pos(&f, "t.b") + 9, &g), FMT,
               "while reading dimensions of tensor 't.b'");
    EXPECT_ERR(llmi_gguf_open_memory(f.orig, f.size - 1, &g), FMT, "tensor 't.c': data at offset");
    fx_close(&f);
}

static void test_bad_header(void **state) {
    (void)state;
    fixture f;
    fx_open(&f);
    BAD(0, 1, 'X', FMT, "bad magic 58 47 55 46: not a GGUF file");
    BAD(4, 4, 1, UNSUP, "GGUF version 1 is not supported");
    BAD(4, 4, 99, UNSUP, "GGUF version 99 is not supported");
    BAD(4, 4, 0x03000000, UNSUP, "big-endian");
    BAD(4, 4, 2, LLM_OK, ""); /* v2 has the same layout */
    BAD(8, 8, 1ull << 62, FMT, "n_tensors = 4611686018427387904 tensor infos cannot fit");
    BAD(16, 8, 1ull << 62, FMT, "n_kv = 4611686018427387904 metadata entries cannot fit");
    BAD(16, 8, UINT64_MAX, FMT, "n_kv = 18446744073709551615");
    BAD(16, 8, 0, FMT, "tensor"); /* the metadata is then read as tensor infos */
    fx_close(&f);
}

static void test_bad_metadata(void **state) {
    (void)state;
    fixture f;
    fx_open(&f);
    size_t p = kv_pos(&f, "general.name"); /* value type, then the string's length */
    BAD(p + 4, 8, UINT64_MAX - 3, FMT, "while reading string value of metadata key 'general.name'");
    BAD(p + 4, 8, f.size, FMT, "truncated at byte");
    BAD(p - 12 - 8, 8, 1ull << 40, FMT, "while reading key of metadata entry 1");
    BAD(p - 12 - 8, 8, 0, FMT, "metadata entry 1 has an empty key");
    BAD(p, 4, 13, FMT, "'general.name' has unknown value type 13");
    p = kv_pos(&f, "a.i32"); /* type, element type, length, data */
    BAD(p + 8, 8, (1ull << 62) + 1, FMT,
        "'a.i32': array of 4611686018427387905 i32 elements overflows"); /* x4 wraps to 4 */
    BAD(p + 8, 8, 1000, FMT, "array of 1000 i32 elements");
    BAD(p + 4, 4, LLMI_GGUF_ARRAY, UNSUP, "'a.i32': nested arrays are not supported");
    BAD(p + 4, 4, 77, FMT, "'a.i32': unknown array element type 77");
    p = kv_pos(&f, "a.str");
    BAD(p + 8, 8, 1ull << 62, FMT, "'a.str': array of 4611686018427387904 strings cannot fit");
    BAD(p + 8, 8, 3, FMT, ""); /* the next entry is misread; it must still fail cleanly */
    BAD(p + 16 + 8 + 1, 8, UINT64_MAX, FMT, "while reading array string of metadata key 'a.str'");
    BAD(kv_pos(&f, "k.bool") + 4, 1, 2, FMT, "'k.bool': bool value 2 is not 0 or 1");
    p = kv_pos(&f, "general.alignment");
    BAD(p + 4, 4, 3, FMT, "general.alignment = 3 is not a power of two");
    BAD(p + 4, 4, 0, FMT, "general.alignment = 0 is not a power of two");
    BAD(p, 4, LLMI_GGUF_F32, FMT, "general.alignment has type f32");
    BAD(p + 4, 4, 64, FMT, "tensor 't.c': offset 544 is not a multiple of the alignment 64");
    /* "dup.bbb" renamed "dup.aaa": patch the three differing bytes. */
    BAD(kv_pos(&f, "dup.bbb") - 3, 3, 0x616161, FMT, "duplicate metadata key 'dup.aaa'");
    fx_close(&f);
}

static void test_bad_tensors(void **state) {
    (void)state;
    fixture f;
    fx_open(&f);
    size_t p = tensor_pos(&f, "t.a"); /* n_dims, ne[0], ne[1], type, offset */
    BAD(p, 4, 0, FMT, "tensor 't.a' has n_dims = 0 (must be 1..4)");
    BAD(p, 4, 5, FMT, "tensor 't.a' has n_dims = 5 (must be 1..4)");
    BAD(p + 12, 8, 0, FMT, "tensor 't.a' has invalid ne[1] = 0");
    BAD(p + 12, 8, 1ull << 63, FMT, "tensor 't.a' has invalid ne[1] = 9223372036854775808");
    BAD(p + 20, 4, 99, UNSUP, "tensor 't.a' has type 99 (unknown), which is not supported");
    BAD(p + 20, 4, 13, UNSUP, "tensor 't.a' has type 13 (Q5_K)");
    BAD(p + 20, 4, LLMI_T_Q8_0, LLM_OK, ""); /* smaller than the F32 data: in bounds */
    BAD(p + 24, 8, 1, FMT, "tensor 't.a': offset 1 is not a multiple of the alignment 32");
    BAD(p + 24, 8, 1ull << 20, FMT, "tensor 't.a': data at offset 1048576 + 512 bytes runs past");
    BAD(p + 24, 8, UINT64_MAX - 31, FMT, "runs past the end of the file");
    BAD(p + 12, 8, 1ull << 20, FMT, "tensor 't.a': data at offset 0 + 268435456 bytes runs past");
    /* t.b's data moved to t.a's first bytes: in bounds, but shared. */
    const llmi_gguf_tensor *tb = llmi_gguf_find_tensor(f.g, "t.b");
    BAD(tensor_pos(&f, "t.b") + 4 + 8 * tb->n_dims + 4, 8, 0, FMT,
        "tensor 't.a': data at offset 0 + 512 bytes overlaps tensor 't.b' at offset 0");
    fx_reset(&f);
    patch(&f, p + 4, 8, 1ull << 32);
    patch(&f, p + 12, 8, 1ull << 32);
    expect_parse(&f, FMT, "tensor 't.a': element count overflows at ne[1]", __LINE__);
    patch(&f, p + 12, 8, 1ull << 30); /* 2^62 elements: fine as a count, not as bytes */
    expect_parse(&f, FMT, "tensor 't.a': byte size overflows", __LINE__);
    BAD(tensor_pos(&f, "t.b") + 4, 8, 33, FMT,
        "tensor 't.b': ne[0] = 33 is not a multiple of the Q4_0 block size 32");
    BAD(tensor_pos(&f, "t.c") - 1, 1, 'a', FMT, "duplicate tensor name 't.a'");
    BAD(tensor_pos(&f, "t.c") - 3 - 8, 8, 1ull << 50, FMT, "while reading name of tensor info 2");
    fx_close(&f);
}

static void test_open_errors(void **state) {
    (void)state;
    llmi_gguf *g = (llmi_gguf *)1;
    EXPECT_ERR(llmi_gguf_open("/nonexistent/dir/model.gguf", true, &g), LLM_ERR_IO,
               "cannot open '/nonexistent/dir/model.gguf': No such file or directory");
    assert_null(g);
    EXPECT_ERR(llmi_gguf_open(tmp_dir(), false, &g), LLM_ERR_IO, "is not a regular file");
    char path[512];
    snprintf(path, sizeof path, "%s/test_gguf_empty_%d.gguf", tmp_dir(), (int)getpid());
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fclose(fp);
    for (int m = 0; m < 2; m++)
        EXPECT_ERR(llmi_gguf_open(path, m, &g), LLM_ERR_BAD_FORMAT,
                   "empty_"); /* the path prefixes the parse error */
    assert_true(strstr(LAST_ERROR(), "truncated at byte 0 while reading magic") != NULL);
    fp = fopen(path, "wb");
    fwrite("GGUF\1\0\0\0", 1, 8, fp);
    fclose(fp);
    EXPECT_ERR(llmi_gguf_open(path, true, &g), LLM_ERR_UNSUPPORTED, "version 1");
    unlink(path);
    EXPECT_ERR(llmi_gguf_writer_save(NULL, path), LLM_ERR_INVALID_ARGUMENT, "NULL");
    llmi_gguf_writer *w;
    OK(llmi_gguf_writer_create(&w));
    EXPECT_ERR(llmi_gguf_writer_save(w, "/nonexistent/dir/x.gguf"), LLM_ERR_IO,
               "cannot create '/nonexistent/dir/x.gguf'");
    llmi_gguf_writer_free(w);
}

/* Every allocation failure is reported as OUT_OF_MEMORY and leaks nothing
 * (the sanitizer build checks the leaks). */
static void test_alloc_failures(void **state) {
    (void)state;
    size_t size;
    uint8_t *buf = small_file(&size);
    int n, ok = 0;
    for (n = 1; n < 100 && !ok; n++) {
        llmi_gguf *g = NULL;
        llmi_alloc_fail_after((uint64_t)n);
        llm_status st = llmi_gguf_open_memory(buf, size, &g);
        llmi_alloc_fail_after(0);
        if (st == LLM_OK) {
            ok = 1;
            llmi_gguf_close(g);
        } else {
            assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
            assert_null(g);
        }
    }
    assert_true(ok && n > 3);
    llmi_free(buf);
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.n_layer = 1;
    for (ok = 0, n = 1; n < 2000 && !ok; n++) {
        void *data = NULL;
        llmi_alloc_fail_after((uint64_t)n);
        llm_status st = llmi_testmodel_to_memory(&p, &data, &size);
        llmi_alloc_fail_after(0);
        if (st == LLM_OK)
            ok = 1;
        else
            assert_int_equal(st, LLM_ERR_OUT_OF_MEMORY);
        llmi_free(data);
    }
    assert_true(ok);
}

/* ---- test model ---- */

static void check_testmodel(const llmi_gguf *g, const llmi_testmodel_params *p) {
    const struct {
        const char *key;
        uint32_t v;
    } u32s[] = {
        {"llama.block_count", p->n_layer},
        {"llama.embedding_length", p->n_embd},
        {"llama.attention.head_count", p->n_head},
        {"llama.attention.head_count_kv", p->n_head_kv},
        {"llama.feed_forward_length", p->n_ff},
        {"llama.context_length", p->n_ctx},
        {"llama.vocab_size", llmi_testmodel_n_vocab()},
        {"llama.rope.dimension_count", p->n_embd / p->n_head},
    };
    for (size_t i = 0; i < sizeof u32s / sizeof u32s[0]; i++)
        assert_int_equal(u32_of(g, u32s[i].key), u32s[i].v);
    uint32_t nv = llmi_testmodel_n_vocab(), nm = llmi_testmodel_n_merges();
    assert_true(nv == 256 + nm + 3 && nm >= 40);
    assert_true(f32_of(g, "llama.rope.freq_base") == p->rope_base);
    assert_true(f32_of(g, "llama.attention.layer_norm_rms_epsilon") == p->rms_eps);
    assert_true(str_is(g, "general.architecture", "llama"));
    assert_true(str_is(g, "general.name", p->name));
    assert_true(str_is(g, "tokenizer.ggml.model", "gpt2"));
    assert_true(str_is(g, "tokenizer.ggml.pre", "smollm"));
    assert_false(bool_of(g, "tokenizer.ggml.add_bos_token"));
    llmi_str s;
    OK(llmi_gguf_get_str(g, "tokenizer.chat_template", true, &s));
    assert_true(s.len > 100 && memmem(s.ptr, s.len, "<|im_start|>assistant\n", 22));

    const llmi_gguf_kv *tok = arr_of(g, "tokenizer.ggml.tokens", LLMI_GGUF_STRING);
    const llmi_gguf_kv *types = arr_of(g, "tokenizer.ggml.token_type", LLMI_GGUF_I32);
    const llmi_gguf_kv *merges = arr_of(g, "tokenizer.ggml.merges", LLMI_GGUF_STRING);
    assert_true(tok->arr_len == nv && types->arr_len == nv && merges->arr_len == nm);
    /* GPT-2 order: '!' first; the stand-ins from 188 on, U+0120 (space) at 188 + 32. */
    assert_true(llmi_str_eq(tok->arr_strs[0], "!"));
    assert_true(llmi_str_eq(tok->arr_strs[188], "\xc4\x80"));
    assert_true(llmi_str_eq(tok->arr_strs[188 + 32], "\xc4\xa0"));
    for (uint32_t i = 0; i < nv; i++) {
        int32_t t;
        memcpy(&t, types->arr_data + 4 * i, 4);
        assert_int_equal(t, i >= nv - 3 ? 3 : 1); /* control tokens last */
        for (uint32_t j = 0; j < i; j++)          /* tokens are unique */
            assert_false(tok->arr_strs[i].len == tok->arr_strs[j].len &&
                         !memcmp(tok->arr_strs[i].ptr, tok->arr_strs[j].ptr, tok->arr_strs[i].len));
    }
    /* Each merge "a b": a, b and ab are all tokens. */
    for (uint32_t m = 0; m < nm; m++) {
        llmi_str ms = merges->arr_strs[m];
        const char *sp = memchr(ms.ptr, ' ', ms.len);
        assert_non_null(sp);
        char a[64], b[64], ab[128];
        snprintf(a, sizeof a, "%.*s", (int)(sp - ms.ptr), ms.ptr);
        snprintf(b, sizeof b, "%.*s", (int)(ms.ptr + ms.len - sp - 1), sp + 1);
        snprintf(ab, sizeof ab, "%s%s", a, b);
        int found = 0;
        for (uint32_t i = 0; i < nv; i++)
            found |= llmi_str_eq(tok->arr_strs[i], a) | llmi_str_eq(tok->arr_strs[i], b) << 1 |
                     llmi_str_eq(tok->arr_strs[i], ab) << 2;
        if (found != 7)
            fail_msg("merge %u '%.*s': pieces not in the vocabulary", m, (int)ms.len, ms.ptr);
    }
    static const struct {
        const char *key, *tok;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", "<|im_start|>"},
        {"tokenizer.ggml.eos_token_id", "<|im_end|>"},
        {"tokenizer.ggml.padding_token_id", "<|im_end|>"},
        {"tokenizer.ggml.unknown_token_id", "<|endoftext|>"},
    };
    for (size_t i = 0; i < 4; i++) {
        uint32_t u = u32_of(g, ids[i].key);
        assert_true(u < nv && llmi_str_eq(tok->arr_strs[u], ids[i].tok));
    }

    uint32_t e = p->n_embd, kvd = p->n_head_kv * (p->n_embd / p->n_head);
    char last[64];
    snprintf(last, sizeof last, "blk.%u.ffn_down.weight", p->n_layer - 1);
    const struct {
        const char *name;
        uint64_t ne0, ne1;
    } want[] = {
        {"output_norm.weight", e, 1},
        {"blk.0.attn_norm.weight", e, 1},
        {"blk.0.ffn_norm.weight", e, 1},
        {"token_embd.weight", e, nv},
        {"blk.0.attn_q.weight", e, e},
        {"blk.0.attn_k.weight", e, kvd},
        {"blk.0.attn_v.weight", e, kvd},
        {"blk.0.attn_output.weight", e, e},
        {"blk.0.ffn_gate.weight", e, p->n_ff},
        {"blk.0.ffn_up.weight", e, p->n_ff},
        {"blk.0.ffn_down.weight", p->n_ff, e},
        {last, p->n_ff, e},
        {"output.weight", e, nv},
    };
    assert_int_equal(g->n_tensors, 2 + 9 * p->n_layer + !p->tied_embeddings);
    if (p->tied_embeddings)
        assert_null(llmi_gguf_find_tensor(g, "output.weight"));
    for (size_t i = 0; i < sizeof want / sizeof want[0] - p->tied_embeddings; i++) {
        const llmi_gguf_tensor *t = tensor_of(g, want[i].name);
        bool norm = i < 3;
        assert_true(t->ne[0] == want[i].ne0 && t->ne[1] == want[i].ne1);
        assert_int_equal(t->n_dims, norm ? 1 : 2);
        assert_int_equal(t->type, norm ? LLMI_T_F32 : p->type);
        for (uint64_t j = 0; norm && j < t->ne[0]; j++) /* norm scales around 1 */
            assert_true(((const float *)t->data)[j] > 0.85f && ((const float *)t->data)[j] < 1.15f);
    }
}

static void test_testmodel(void **state) {
    (void)state;
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    assert_int_equal(p.n_layer, 2);
    assert_int_equal(p.n_embd, 64);
    char path[512];
    snprintf(path, sizeof path, "%s/test_gguf_model_%d.gguf", tmp_dir(), (int)getpid());
    OK(llmi_testmodel_write(&p, path));
    llmi_gguf *g;
    OK(llmi_gguf_open(path, true, &g));
    check_testmodel(g, &p);
    /* Same params, same bytes, whether written to a file or to memory. */
    void *a, *b;
    size_t na, nb;
    OK(llmi_testmodel_to_memory(&p, &a, &na));
    assert_int_equal(na, g->size);
    assert_memory_equal(a, g->base, na);
    llmi_gguf_close(g);
    unlink(path);
    p.seed = 2;
    OK(llmi_testmodel_to_memory(&p, &b, &nb));
    assert_int_equal(na, nb);
    assert_memory_not_equal(a, b, na);
    llmi_free(a);
    llmi_free(b);

    for (size_t t = 0; t < N_TYPES; t++) {
        llmi_testmodel_params_init(&p);
        p.type = all_types[t];
        p.tied_embeddings = t % 2 == 0;
        p.n_layer = 3;
        p.n_embd = 96;
        p.n_head = 6;
        p.n_head_kv = 3;
        p.n_ff = 160;
        p.rope_base = 500000.0f;
        p.name = "variant";
        OK(llmi_testmodel_to_memory(&p, &a, &na));
        OK(llmi_gguf_open_memory(a, na, &g));
        check_testmodel(g, &p);
        llmi_gguf_close(g);
        llmi_free(a);
    }

    llmi_testmodel_params_init(&p);
    p.n_head = 3;
    EXPECT_ERR(llmi_testmodel_to_memory(&p, &a, &na), LLM_ERR_INVALID_ARGUMENT, "n_head 3");
    llmi_testmodel_params_init(&p);
    p.n_ff = 100;
    p.type = LLMI_T_Q8_0;
    EXPECT_ERR(llmi_testmodel_to_memory(&p, &a, &na), LLM_ERR_INVALID_ARGUMENT, "n_ff 100");
    EXPECT_ERR(llmi_testmodel_to_memory(NULL, &a, &na), LLM_ERR_INVALID_ARGUMENT, "NULL");
    EXPECT_ERR(llmi_testmodel_write(&p, NULL), LLM_ERR_INVALID_ARGUMENT, "path is NULL");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ttype),          cmocka_unit_test(test_quant_known),
        cmocka_unit_test(test_quant_random),   cmocka_unit_test(test_roundtrip_metadata),
        cmocka_unit_test(test_null_args),      cmocka_unit_test(test_roundtrip_tensors),
        cmocka_unit_test(test_real_model),     cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_header),     cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_bad_tensors),    cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_alloc_failures), cmocka_unit_test(test_testmodel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
