/* In-memory GGUF v3 writer. Metadata is serialised as it is added, tensors
 * are kept converted until the file is laid out, so the output is produced in
 * one pass either into one buffer or streamed to a file. */
#include "gguf/gguf.h"

#include "core/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#define WRITER_ALIGNMENT 32u

typedef struct wtensor {
    char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    llmi_ttype type;
    uint8_t *data;
    size_t nbytes;
} wtensor;

struct llmi_gguf_writer {
    uint8_t *kv; /* serialised metadata entries */
    size_t kv_len, kv_cap;
    char **keys; /* for the duplicate check */
    size_t n_keys, keys_cap;
    wtensor *tensors;
    size_t n_tensors, tensors_cap;
    uint32_t alignment;
};

llm_status llmi_gguf_writer_create(llmi_gguf_writer **out) {
    if (!out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_writer_create: out is NULL");
    llmi_gguf_writer *w = llmi_calloc(1, sizeof *w);
    *out = w;
    if (!w)
        return llmi_oom("GGUF writer");
    w->alignment = WRITER_ALIGNMENT;
    return LLM_OK;
}

void llmi_gguf_writer_free(llmi_gguf_writer *w) {
    if (!w)
        return;
    for (size_t i = 0; i < w->n_keys; i++)
        llmi_free(w->keys[i]);
    for (size_t i = 0; i < w->n_tensors; i++) {
        llmi_free(w->tensors[i].name);
        llmi_free(w->tensors[i].data);
    }
    llmi_free(w->keys);
    llmi_free(w->tensors);
    llmi_free(w->kv);
    llmi_free(w);
}

/* Grows *buf so it holds `need` items of `size` bytes. */
static bool grow(void **buf, size_t *cap, size_t need, size_t size) {
    if (need <= *cap)
        return true;
    size_t ncap = *cap ? *cap : 16, bytes;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return false;
        ncap *= 2;
    }
    if (!llmi_mul_ok(ncap, size, &bytes))
        return false;
    void *p = llmi_realloc(*buf, bytes);
    if (!p)
        return false;
    *buf = p;
    *cap = ncap;
    return true;
}

static bool put(llmi_gguf_writer *w, const void *data, size_t n) {
    if (n > SIZE_MAX - w->kv_len)
        return false;
    if (!grow((void **)&w->kv, &w->kv_cap, w->kv_len + n, 1))
        return false;
    if (n)
        memcpy(w->kv + w->kv_len, data, n);
    w->kv_len += n;
    return true;
}

static bool put_u32(llmi_gguf_writer *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return put(w, b, 4);
}

static bool put_u64(llmi_gguf_writer *w, uint64_t v) {
    return put_u32(w, (uint32_t)v) && put_u32(w, (uint32_t)(v >> 32));
}

static bool put_str(llmi_gguf_writer *w, const char *s) {
    size_t n = strlen(s);
    return put_u64(w, n) && put(w, s, n);
}

/* Appends one element of a fixed-size type, little-endian. */
static bool put_fixed(llmi_gguf_writer *w, llmi_gguf_vtype t, const void *v) {
    switch (t) {
    case LLMI_GGUF_U8:
    case LLMI_GGUF_I8:
        return put(w, v, 1);
    case LLMI_GGUF_BOOL: {
        uint8_t b = *(const bool *)v ? 1 : 0;
        return put(w, &b, 1);
    }
    case LLMI_GGUF_U16:
    case LLMI_GGUF_I16: {
        uint16_t u;
        memcpy(&u, v, 2);
        uint8_t b[2] = {(uint8_t)u, (uint8_t)(u >> 8)};
        return put(w, b, 2);
    }
    case LLMI_GGUF_U32:
    case LLMI_GGUF_I32:
    case LLMI_GGUF_F32: {
        uint32_t u;
        memcpy(&u, v, 4);
        return put_u32(w, u);
    }
    case LLMI_GGUF_U64:
    case LLMI_GGUF_I64:
    case LLMI_GGUF_F64: {
        uint64_t u;
        memcpy(&u, v, 8);
        return put_u64(w, u);
    }
    default:
        return false;
    }
}

static size_t c_size(llmi_gguf_vtype t) {
    switch (t) {
    case LLMI_GGUF_U8:
    case LLMI_GGUF_I8:
        return 1;
    case LLMI_GGUF_BOOL:
        return sizeof(bool);
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

/* Checks the key and writes its name and type. On any later failure the
 * caller calls end_kv(false), which drops the partial entry. */
static llm_status begin_kv(llmi_gguf_writer *w, const char *key, uint32_t type, size_t *mark) {
    if (!w || !key || !*key)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: %s",
                          !w ? "writer is NULL" : "key is NULL or empty");
    for (size_t i = 0; i < w->n_keys; i++)
        if (strcmp(w->keys[i], key) == 0)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: duplicate key '%s'", key);
    if (!grow((void **)&w->keys, &w->keys_cap, w->n_keys + 1, sizeof *w->keys))
        return llmi_oom("GGUF writer keys");
    *mark = w->kv_len;
    if (!put_str(w, key) || !put_u32(w, type)) {
        w->kv_len = *mark;
        return llmi_oom("GGUF metadata");
    }
    return LLM_OK;
}

static llm_status end_kv(llmi_gguf_writer *w, const char *key, bool ok, size_t mark) {
    char *copy = ok ? llmi_strdup(key) : NULL;
    if (!copy) {
        w->kv_len = mark;
        return llmi_oom("GGUF metadata");
    }
    w->keys[w->n_keys++] = copy;
    return LLM_OK;
}

llm_status llmi_gguf_w_scalar(llmi_gguf_writer *w, const char *key, llmi_gguf_vtype type,
                              const void *value) {
    if (c_size(type) == 0 || !value)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: key '%s': bad scalar type %d",
                          key ? key : "(null)", (int)type);
    /* The writer lays tensors out with this alignment, so it must be one the
     * reader accepts. */
    bool is_alignment = key && strcmp(key, "general.alignment") == 0;
    uint32_t a = 0;
    if (is_alignment && type == LLMI_GGUF_U32)
        memcpy(&a, value, 4);
    if (is_alignment && (a == 0 || (a & (a - 1)) != 0))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "GGUF writer: general.alignment must be a u32 power of two");
    size_t mark;
    LLMI_TRY(begin_kv(w, key, type, &mark));
    LLMI_TRY(end_kv(w, key, put_fixed(w, type, value), mark));
    if (is_alignment)
        w->alignment = a;
    return LLM_OK;
}

llm_status llmi_gguf_w_u32(llmi_gguf_writer *w, const char *key, uint32_t v) {
    return llmi_gguf_w_scalar(w, key, LLMI_GGUF_U32, &v);
}
llm_status llmi_gguf_w_i32(llmi_gguf_writer *w, const char *key, int32_t v) {
    return llmi_gguf_w_scalar(w, key, LLMI_GGUF_I32, &v);
}
llm_status llmi_gguf_w_f32(llmi_gguf_writer *w, const char *key, float v) {
    return llmi_gguf_w_scalar(w, key, LLMI_GGUF_F32, &v);
}
llm_status llmi_gguf_w_bool(llmi_gguf_writer *w, const char *key, bool v) {
    return llmi_gguf_w_scalar(w, key, LLMI_GGUF_BOOL, &v);
}

llm_status llmi_gguf_w_str(llmi_gguf_writer *w, const char *key, const char *v) {
    if (!v)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: key '%s': value is NULL",
                          key ? key : "(null)");
    size_t mark;
    LLMI_TRY(begin_kv(w, key, LLMI_GGUF_STRING, &mark));
    return end_kv(w, key, put_str(w, v), mark);
}

llm_status llmi_gguf_w_arr_str(llmi_gguf_writer *w, const char *key, const char *const *v,
                               size_t n) {
    if (!v && n)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: key '%s': array is NULL",
                          key ? key : "(null)");
    for (size_t i = 0; i < n; i++)
        if (!v[i])
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: key '%s': string %zu is NULL",
                              key ? key : "(null)", i);
    size_t mark;
    LLMI_TRY(begin_kv(w, key, LLMI_GGUF_ARRAY, &mark));
    bool ok = put_u32(w, LLMI_GGUF_STRING) && put_u64(w, n);
    for (size_t i = 0; ok && i < n; i++)
        ok = put_str(w, v[i]);
    return end_kv(w, key, ok, mark);
}

llm_status llmi_gguf_w_arr(llmi_gguf_writer *w, const char *key, llmi_gguf_vtype elem_type,
                           const void *v, size_t n) {
    size_t esize = c_size(elem_type);
    if (esize == 0 || (!v && n))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: key '%s': bad array (type %d)",
                          key ? key : "(null)", (int)elem_type);
    size_t mark;
    LLMI_TRY(begin_kv(w, key, LLMI_GGUF_ARRAY, &mark));
    bool ok = put_u32(w, elem_type) && put_u64(w, n);
    for (size_t i = 0; ok && i < n; i++)
        ok = put_fixed(w, elem_type, (const char *)v + i * esize);
    return end_kv(w, key, ok, mark);
}

/* Narrows a widened scalar back to its C type and writes it. */
static llm_status copy_scalar(llmi_gguf_writer *w, const char *key, const llmi_gguf_kv *kv) {
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
        bool b;
    } v;
    switch (kv->type) {
    case LLMI_GGUF_U8:
        v.u8 = (uint8_t)kv->scalar.u;
        break;
    case LLMI_GGUF_I8:
        v.i8 = (int8_t)kv->scalar.i;
        break;
    case LLMI_GGUF_U16:
        v.u16 = (uint16_t)kv->scalar.u;
        break;
    case LLMI_GGUF_I16:
        v.i16 = (int16_t)kv->scalar.i;
        break;
    case LLMI_GGUF_U32:
        v.u32 = (uint32_t)kv->scalar.u;
        break;
    case LLMI_GGUF_I32:
        v.i32 = (int32_t)kv->scalar.i;
        break;
    case LLMI_GGUF_U64:
        v.u64 = kv->scalar.u;
        break;
    case LLMI_GGUF_I64:
        v.i64 = kv->scalar.i;
        break;
    case LLMI_GGUF_F32:
        v.f32 = (float)kv->scalar.f;
        break;
    case LLMI_GGUF_F64:
        v.f64 = kv->scalar.f;
        break;
    case LLMI_GGUF_BOOL:
        v.b = kv->scalar.b;
        break;
    default:
        return llmi_error(LLM_ERR_UNSUPPORTED, "GGUF writer: key '%s': type %s", key,
                          llmi_gguf_vtype_name(kv->type));
    }
    return llmi_gguf_w_scalar(w, key, kv->type, &v);
}

llm_status llmi_gguf_w_copy_kv(llmi_gguf_writer *w, const llmi_gguf_kv *kv) {
    if (!w || !kv)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: no writer or key to copy");
    char *key = llmi_strndup(kv->key.ptr ? kv->key.ptr : "", (size_t)kv->key.len);
    if (!key)
        return llmi_oom("GGUF key copy");
    llm_status st = LLM_OK;
    if (kv->type == LLMI_GGUF_STRING) {
        char *v = llmi_strndup(kv->str.ptr ? kv->str.ptr : "", (size_t)kv->str.len);
        st = v ? llmi_gguf_w_str(w, key, v) : llmi_oom("GGUF key copy");
        llmi_free(v);
    } else if (kv->type == LLMI_GGUF_ARRAY && kv->arr_type == LLMI_GGUF_STRING) {
        char **v = llmi_calloc(kv->arr_len ? (size_t)kv->arr_len : 1, sizeof *v);
        st = v ? LLM_OK : llmi_oom("GGUF key copy");
        for (uint64_t i = 0; st == LLM_OK && i < kv->arr_len; i++)
            if (!(v[i] = llmi_strndup(kv->arr_strs[i].ptr ? kv->arr_strs[i].ptr : "",
                                      (size_t)kv->arr_strs[i].len)))
                st = llmi_oom("GGUF key copy");
        if (st == LLM_OK)
            st = llmi_gguf_w_arr_str(w, key, (const char *const *)v, (size_t)kv->arr_len);
        for (uint64_t i = 0; v && i < kv->arr_len; i++)
            llmi_free(v[i]);
        llmi_free(v);
    } else if (kv->type == LLMI_GGUF_ARRAY) {
        /* Elements are little-endian in the file, as in memory here; a bool
         * is one byte in both. */
        st = llmi_gguf_w_arr(w, key, kv->arr_type, kv->arr_data, (size_t)kv->arr_len);
    } else {
        st = copy_scalar(w, key, kv);
    }
    llmi_free(key);
    return st;
}

llm_status llmi_gguf_w_arr_f32(llmi_gguf_writer *w, const char *key, const float *v, size_t n) {
    return llmi_gguf_w_arr(w, key, LLMI_GGUF_F32, v, n);
}
llm_status llmi_gguf_w_arr_i32(llmi_gguf_writer *w, const char *key, const int32_t *v, size_t n) {
    return llmi_gguf_w_arr(w, key, LLMI_GGUF_I32, v, n);
}

/* Validates a tensor's shape and computes its byte size and row length. */
static llm_status check_tensor(llmi_gguf_writer *w, const char *name, llmi_ttype type,
                               uint32_t n_dims, const uint64_t *ne, size_t *nbytes,
                               size_t *row_bytes) {
    if (!w || !name || !*name || !ne)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: NULL writer, name or shape");
    if (n_dims < 1 || n_dims > 4)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s': n_dims %u", name,
                          n_dims);
    const llmi_ttype_info *ti = llmi_ttype_get(type);
    if (!ti)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s': unknown type %d",
                          name, (int)type);
    uint64_t rows = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > (uint64_t)INT64_MAX)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s': bad ne[%u]",
                              name, d);
        if (d > 0) {
            if (rows > (uint64_t)INT64_MAX / ne[d])
                return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s' too large",
                                  name);
            rows *= ne[d];
        }
    }
    *row_bytes = llmi_ttype_row_bytes(type, ne[0]);
    if (*row_bytes == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "GGUF writer: tensor '%s': ne[0] = %llu is not a multiple of %u", name,
                          (unsigned long long)ne[0], ti->block);
    if (rows > SIZE_MAX || !llmi_mul_ok(*row_bytes, (size_t)rows, nbytes))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s' too large", name);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: duplicate tensor '%s'", name);
    if (!grow((void **)&w->tensors, &w->tensors_cap, w->n_tensors + 1, sizeof *w->tensors))
        return llmi_oom("GGUF writer tensors");
    return LLM_OK;
}

/* Takes ownership of `bytes` on success and on failure. */
static llm_status add_tensor(llmi_gguf_writer *w, const char *name, llmi_ttype type,
                             uint32_t n_dims, const uint64_t *ne, uint8_t *bytes, size_t nbytes) {
    char *copy = llmi_strdup(name);
    if (!copy) {
        llmi_free(bytes);
        return llmi_oom("GGUF tensor name");
    }
    wtensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = copy;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < 4; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->type = type;
    t->data = bytes;
    t->nbytes = nbytes;
    return LLM_OK;
}

llm_status llmi_gguf_w_tensor(llmi_gguf_writer *w, const char *name, llmi_ttype type,
                              uint32_t n_dims, const uint64_t *ne, const float *data) {
    size_t nbytes, row_bytes;
    LLMI_TRY(check_tensor(w, name, type, n_dims, ne, &nbytes, &row_bytes));
    if (!data)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s': data is NULL", name);
    uint8_t *bytes = llmi_malloc(nbytes);
    if (!bytes)
        return llmi_oom("GGUF tensor data");
    size_t rows = nbytes / row_bytes;
    for (size_t r = 0; r < rows; r++)
        llmi_quantize_row(type, data + r * ne[0], bytes + r * row_bytes, (int64_t)ne[0]);
    return add_tensor(w, name, type, n_dims, ne, bytes, nbytes);
}

llm_status llmi_gguf_w_tensor_raw(llmi_gguf_writer *w, const char *name, llmi_ttype type,
                                  uint32_t n_dims, const uint64_t *ne, const void *data,
                                  size_t nbytes) {
    size_t want, row_bytes;
    LLMI_TRY(check_tensor(w, name, type, n_dims, ne, &want, &row_bytes));
    if (!data || nbytes != want)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "GGUF writer: tensor '%s': %zu bytes given, shape needs %zu", name,
                          data ? nbytes : 0, want);
    uint8_t *bytes = llmi_malloc(nbytes);
    if (!bytes)
        return llmi_oom("GGUF tensor data");
    memcpy(bytes, data, nbytes);
    return add_tensor(w, name, type, n_dims, ne, bytes, nbytes);
}

/* ---- serialisation ---- */

/* Output goes either into a buffer sized in advance or through a staging
 * buffer to a file descriptor. */
typedef struct sink {
    uint8_t *buf;
    size_t pos;
    int fd;
    uint8_t stage[1 << 16];
    size_t staged;
    int err; /* errno of a failed write */
} sink;

static void sink_flush(sink *s) {
    size_t done = 0;
    while (!s->err && done < s->staged) {
        ssize_t n = write(s->fd, s->stage + done, s->staged - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            s->err = n < 0 ? errno : EIO;
        else
            done += (size_t)n;
    }
    s->staged = 0;
}

static void emit(sink *s, const void *data, size_t n) {
    const uint8_t *p = data;
    if (s->buf) {
        memcpy(s->buf + s->pos, p, n);
        s->pos += n;
        return;
    }
    s->pos += n;
    while (n > 0 && !s->err) {
        size_t room = sizeof s->stage - s->staged, k = n < room ? n : room;
        memcpy(s->stage + s->staged, p, k);
        s->staged += k;
        p += k;
        n -= k;
        if (s->staged == sizeof s->stage)
            sink_flush(s);
    }
}

static void emit_u32(sink *s, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    emit(s, b, 4);
}

static void emit_u64(sink *s, uint64_t v) {
    emit_u32(s, (uint32_t)v);
    emit_u32(s, (uint32_t)(v >> 32));
}

static void emit_pad(sink *s, size_t alignment) {
    static const uint8_t zeros[64];
    size_t pad = (alignment - s->pos % alignment) % alignment;
    while (pad > 0) {
        size_t k = pad < sizeof zeros ? pad : sizeof zeros;
        emit(s, zeros, k);
        pad -= k;
    }
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Computes the file size and every tensor's offset in the data section. */
static llm_status layout(const llmi_gguf_writer *w, size_t *total) {
    size_t a = w->alignment, pos = 4 + 4 + 8 + 8 + w->kv_len, data = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        pos += 8 + strlen(w->tensors[i].name) + 4 + 8 * (size_t)w->tensors[i].n_dims + 4 + 8;
        if (w->tensors[i].nbytes > SIZE_MAX / 2 - data)
            return llmi_error(LLM_ERR_LIMIT, "GGUF writer: file too large");
        data = align_up(data + w->tensors[i].nbytes, a);
    }
    pos = align_up(pos, a);
    if (data > SIZE_MAX / 2 - pos)
        return llmi_error(LLM_ERR_LIMIT, "GGUF writer: file too large");
    *total = pos + data;
    return LLM_OK;
}

static void serialise(const llmi_gguf_writer *w, sink *s) {
    emit(s, "GGUF", 4);
    emit_u32(s, 3);
    emit_u64(s, w->n_tensors);
    emit_u64(s, w->n_keys);
    emit(s, w->kv, w->kv_len);
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        size_t n = strlen(t->name);
        emit_u64(s, n);
        emit(s, t->name, n);
        emit_u32(s, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            emit_u64(s, t->ne[d]);
        emit_u32(s, (uint32_t)t->type);
        emit_u64(s, offset);
        offset = align_up(offset + t->nbytes, w->alignment);
    }
    emit_pad(s, w->alignment);
    for (size_t i = 0; i < w->n_tensors; i++) {
        emit(s, w->tensors[i].data, w->tensors[i].nbytes);
        emit_pad(s, w->alignment);
    }
}

llm_status llmi_gguf_writer_to_memory(llmi_gguf_writer *w, void **data, size_t *size) {
    if (!w || !data || !size)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_writer_to_memory: NULL argument");
    *data = NULL;
    *size = 0;
    size_t total;
    LLMI_TRY(layout(w, &total));
    uint8_t *buf = llmi_malloc(total);
    if (!buf)
        return llmi_oom("GGUF file image");
    sink *s = llmi_malloc(sizeof *s);
    if (!s) {
        llmi_free(buf);
        return llmi_oom("GGUF writer state");
    }
    memset(s, 0, sizeof *s);
    s->buf = buf;
    serialise(w, s);
    llmi_free(s);
    *data = buf;
    *size = total;
    return LLM_OK;
}

llm_status llmi_gguf_writer_save(llmi_gguf_writer *w, const char *path) {
    if (!w || !path)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_writer_save: NULL argument");
    size_t total;
    LLMI_TRY(layout(w, &total));
    sink *s = llmi_malloc(sizeof *s);
    if (!s)
        return llmi_oom("GGUF writer state");
    memset(s, 0, sizeof *s);
    s->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (s->fd < 0) {
        llm_status st = llmi_error(LLM_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
        llmi_free(s);
        return st;
    }
    serialise(w, s);
    sink_flush(s);
    int err = s->err;
    if (close(s->fd) != 0 && !err)
        err = errno;
    llmi_free(s);
    if (err)
        return llmi_error(LLM_ERR_IO, "cannot write '%s': %s", path, strerror(err));
    return LLM_OK;
}
