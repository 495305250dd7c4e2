/* libFuzzer target: the GGUF parser on arbitrary bytes.
 *
 * llmi_gguf_open_memory parses the input in place. A rejected input must
 * leave *out NULL with a known status and a message; an accepted one is
 * walked completely: every key, string, array and tensor must lie inside
 * the input, every key and tensor name must be found again by the lookups,
 * and every typed getter must agree with the stored type and value. */
#include "gguf/gguf.h"

#include "fuzz_util.h"

static size_t vsize(llmi_gguf_vtype t) {
    switch (t) {
    case LLMI_GGUF_U8:
    case LLMI_GGUF_I8:
    case LLMI_GGUF_BOOL:
        return 1;
    case LLMI_GGUF_U16:
    case LLMI_GGUF_I16:
        return 2;
    case LLMI_GGUF_U32:
    case LLMI_GGUF_I32:
    case LLMI_GGUF_F32:
        return 4;
    case LLMI_GGUF_U64:
    case LLMI_GGUF_I64:
    case LLMI_GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

static bool is_unsigned(llmi_gguf_vtype t) {
    return t == LLMI_GGUF_U8 || t == LLMI_GGUF_U16 || t == LLMI_GGUF_U32 || t == LLMI_GGUF_U64;
}
static bool is_signed(llmi_gguf_vtype t) {
    return t == LLMI_GGUF_I8 || t == LLMI_GGUF_I16 || t == LLMI_GGUF_I32 || t == LLMI_GGUF_I64;
}

static volatile uint8_t g_sink;
static void touch(const void *p, size_t n) {
    if (n == 0)
        return;
    g_sink ^= ((const uint8_t *)p)[0];
    g_sink ^= ((const uint8_t *)p)[n - 1];
}

/* NUL-terminated copy of s, or NULL when s holds a NUL (not a C key). */
static char *cstr(llmi_str s) {
    if (memchr(s.ptr, 0, (size_t)s.len))
        return NULL;
    char *c = malloc((size_t)s.len + 1);
    memcpy(c, s.ptr, (size_t)s.len);
    c[s.len] = '\0';
    return c;
}

static void check_getters(const llmi_gguf *g, const llmi_gguf_kv *kv, const char *key) {
    for (int req = 0; req < 2; req++) {
        uint32_t u = 0xdeadbeef;
        llm_status st = llmi_gguf_get_u32(g, key, req, &u);
        bool fits =
            (is_unsigned(kv->type) && kv->scalar.u <= UINT32_MAX) ||
            (is_signed(kv->type) && kv->scalar.i >= 0 && kv->scalar.i <= (int64_t)UINT32_MAX);
        if (fits) {
            FUZZ_CHECK(st == LLM_OK, "get_u32('%s') = %d", key, st);
            FUZZ_CHECK(
                u == (is_unsigned(kv->type) ? (uint32_t)kv->scalar.u : (uint32_t)kv->scalar.i),
                "get_u32('%s') value %u", key, u);
        } else {
            FUZZ_CHECK(st == LLM_ERR_BAD_FORMAT && u == 0xdeadbeef, "get_u32('%s') = %d", key, st);
            FUZZ_CHECK(strstr(llmi_error_message(), key), "message '%s' lacks the key",
                       llmi_error_message());
        }

        float f = -1.0f;
        st = llmi_gguf_get_f32(g, key, req, &f);
        if (kv->type == LLMI_GGUF_F32 || kv->type == LLMI_GGUF_F64)
            FUZZ_CHECK(st == LLM_OK, "get_f32('%s') = %d", key, st);
        else
            FUZZ_CHECK(st == LLM_ERR_BAD_FORMAT && f == -1.0f, "get_f32('%s') = %d", key, st);

        bool b = false;
        st = llmi_gguf_get_bool(g, key, req, &b);
        if (kv->type == LLMI_GGUF_BOOL)
            FUZZ_CHECK(st == LLM_OK && b == kv->scalar.b, "get_bool('%s') = %d", key, st);
        else
            FUZZ_CHECK(st == LLM_ERR_BAD_FORMAT, "get_bool('%s') = %d", key, st);

        llmi_str s = {0};
        st = llmi_gguf_get_str(g, key, req, &s);
        if (kv->type == LLMI_GGUF_STRING)
            FUZZ_CHECK(st == LLM_OK && s.ptr == kv->str.ptr && s.len == kv->str.len,
                       "get_str('%s') = %d", key, st);
        else
            FUZZ_CHECK(st == LLM_ERR_BAD_FORMAT && s.ptr == NULL, "get_str('%s') = %d", key, st);

        for (uint32_t et = 0; et <= LLMI_GGUF_F64; et++) {
            const llmi_gguf_kv *a = NULL;
            st = llmi_gguf_get_arr(g, key, req, (llmi_gguf_vtype)et, &a);
            if (kv->type == LLMI_GGUF_ARRAY && kv->arr_type == et)
                FUZZ_CHECK(st == LLM_OK && a == kv, "get_arr('%s', %u) = %d", key, et, st);
            else
                FUZZ_CHECK(st == LLM_ERR_BAD_FORMAT && a == NULL, "get_arr('%s', %u) = %d", key, et,
                           st);
        }
    }
}

static void walk(const llmi_gguf *g, const uint8_t *data, size_t size) {
    FUZZ_CHECK(g->version == 2 || g->version == 3, "version %u", g->version);
    FUZZ_CHECK(g->alignment != 0 && (g->alignment & (g->alignment - 1)) == 0, "alignment %u",
               g->alignment);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const llmi_gguf_kv *kv = &g->kv[i];
        FUZZ_CHECK(kv->key.len > 0 && fuzz_within(kv->key.ptr, kv->key.len, data, size),
                   "key %llu outside the input", (unsigned long long)i);
        touch(kv->key.ptr, (size_t)kv->key.len);
        FUZZ_CHECK((uint32_t)kv->type <= LLMI_GGUF_F64, "kv type %u", kv->type);
        (void)llmi_gguf_vtype_name(kv->type);
        if (kv->type == LLMI_GGUF_STRING) {
            FUZZ_CHECK(fuzz_within(kv->str.ptr, kv->str.len, data, size), "string outside");
            touch(kv->str.ptr, (size_t)kv->str.len);
        } else if (kv->type == LLMI_GGUF_ARRAY) {
            FUZZ_CHECK(kv->arr_type != LLMI_GGUF_ARRAY && (uint32_t)kv->arr_type <= LLMI_GGUF_F64,
                       "array element type %u", kv->arr_type);
            if (kv->arr_type == LLMI_GGUF_STRING) {
                FUZZ_CHECK(kv->arr_len == 0 || kv->arr_strs, "string array without strings");
                for (uint64_t j = 0; j < kv->arr_len; j++) {
                    llmi_str s = kv->arr_strs[j];
                    FUZZ_CHECK(fuzz_within(s.ptr, s.len, data, size), "array string outside");
                    touch(s.ptr, (size_t)s.len);
                }
            } else {
                size_t es = vsize(kv->arr_type);
                FUZZ_CHECK(kv->arr_len <= size / es, "array longer than the input");
                FUZZ_CHECK(kv->arr_len == 0 ||
                               fuzz_within(kv->arr_data, kv->arr_len * es, data, size),
                           "array data outside");
                if (kv->arr_len)
                    touch(kv->arr_data, (size_t)kv->arr_len * es);
                if (kv->arr_type == LLMI_GGUF_BOOL)
                    for (uint64_t j = 0; j < kv->arr_len; j++)
                        FUZZ_CHECK(kv->arr_data[j] <= 1, "bool element %u", kv->arr_data[j]);
            }
        } else if (kv->type == LLMI_GGUF_BOOL) {
            FUZZ_CHECK(kv->scalar.b == 0 || kv->scalar.b == 1, "bool");
        }
        char *key = cstr(kv->key);
        if (key) {
            FUZZ_CHECK(llmi_gguf_find(g, key) == kv, "find('%s') misses entry %llu", key,
                       (unsigned long long)i);
            check_getters(g, kv, key);
            free(key);
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const llmi_gguf_tensor *t = &g->tensors[i];
        FUZZ_CHECK(fuzz_within(t->name.ptr, t->name.len, data, size), "tensor name outside");
        touch(t->name.ptr, (size_t)t->name.len);
        FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= 4, "n_dims %u", t->n_dims);
        uint64_t rows = 1;
        for (uint32_t d = 0; d < 4; d++) {
            FUZZ_CHECK(t->ne[d] >= 1, "ne[%u] = 0", d);
            if (d >= t->n_dims)
                FUZZ_CHECK(t->ne[d] == 1, "unused ne[%u] = %llu", d, (unsigned long long)t->ne[d]);
            if (d > 0)
                rows *= t->ne[d]; /* no overflow: the parser bounds the product */
        }
        size_t row = llmi_ttype_row_bytes(t->type, t->ne[0]);
        FUZZ_CHECK(row > 0 && t->nbytes == row * rows, "nbytes %zu, row %zu x %llu", t->nbytes, row,
                   (unsigned long long)rows);
        FUZZ_CHECK(t->offset % g->alignment == 0, "offset not aligned");
        FUZZ_CHECK(t->data && fuzz_within(t->data, t->nbytes, data, size), "tensor data outside");
        touch(t->data, t->nbytes);
        char *name = cstr(t->name);
        if (name) {
            FUZZ_CHECK(llmi_gguf_find_tensor(g, name) == t, "find_tensor('%s') misses it", name);
            free(name);
        }
    }
    /* Absent keys: optional gives OK and leaves the output, required NOT_FOUND. */
    const char *absent = "\x01 no such key \x01";
    uint32_t u = 7;
    FUZZ_CHECK(llmi_gguf_get_u32(g, absent, false, &u) == LLM_OK && u == 7, "optional absent");
    FUZZ_CHECK(llmi_gguf_get_u32(g, absent, true, &u) == LLM_ERR_NOT_FOUND, "required absent");
    FUZZ_CHECK(llmi_gguf_find_tensor(g, absent) == NULL, "absent tensor found");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    llmi_gguf *g = (llmi_gguf *)(uintptr_t)1;
    llm_status st = llmi_gguf_open_memory(size ? data : (const uint8_t *)"", size, &g);
    if (st != LLM_OK) {
        FUZZ_CHECK(g == NULL, "failed open left *out set");
        FUZZ_CHECK(st == LLM_ERR_BAD_FORMAT || st == LLM_ERR_UNSUPPORTED ||
                       st == LLM_ERR_OUT_OF_MEMORY,
                   "status %d (%s)", st, llmi_error_message());
        FUZZ_CHECK(llmi_error_message()[0] != '\0', "no error message for status %d", st);
        return 0;
    }
    walk(g, data, size);
    llmi_gguf_close(g);
    return 0;
}
