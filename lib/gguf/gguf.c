/* GGUF reader. The file is untrusted input: every count, length and offset is
 * checked against the bytes that remain before it is used, and counts are
 * checked against the smallest possible encoding of their items before any
 * allocation is sized from them, so a hostile header cannot make us allocate
 * more than a small multiple of the file size. */
#include "gguf/gguf.h"
#include "gguf/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32u
/* Smallest encodings: key length + 1-byte key + type + 1-byte value; name
 * length + n_dims + one dimension + type + offset. */
#define KV_MIN_BYTES 14u
#define TENSOR_MIN_BYTES 32u
/* Longest name quoted in an error message. */
#define NAME_MAX_PRINT 128

typedef struct reader {
    const uint8_t *p;
    size_t size, pos;
    /* What is being read, so a truncation message can name it. */
    const char *item; /* "metadata entry", "tensor info" */
    uint64_t index;
    llmi_str name; /* key or tensor name once known */
} reader;

static int name_len(llmi_str s) { return s.len > NAME_MAX_PRINT ? NAME_MAX_PRINT : (int)s.len; }

static llm_status truncated(const reader *r, const char *what) {
    if (r->name.ptr)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "truncated at byte %zu while reading %s of %s '%.*s' (at offset %zu)",
                          r->size, what, r->item, name_len(r->name), r->name.ptr, r->pos);
    if (r->item)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "truncated at byte %zu while reading %s of %s %" PRIu64
                          " (at offset %zu)",
                          r->size, what, r->item, r->index, r->pos);
    return llmi_error(LLM_ERR_BAD_FORMAT, "truncated at byte %zu while reading %s", r->size, what);
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

static llm_status rd_u32(reader *r, uint32_t *v, const char *what) {
    if (r->size - r->pos < 4)
        return truncated(r, what);
    *v = le32(r->p + r->pos);
    r->pos += 4;
    return LLM_OK;
}

static llm_status rd_u64(reader *r, uint64_t *v, const char *what) {
    if (r->size - r->pos < 8)
        return truncated(r, what);
    *v = le64(r->p + r->pos);
    r->pos += 8;
    return LLM_OK;
}

static llm_status rd_str(reader *r, llmi_str *s, const char *what) {
    uint64_t len = 0;
    LLMI_TRY(rd_u64(r, &len, what));
    if (len > r->size - r->pos) {
        r->pos -= 8; /* report where the string starts */
        return truncated(r, what);
    }
    s->ptr = (const char *)r->p + r->pos;
    s->len = len;
    r->pos += (size_t)len;
    return LLM_OK;
}

const char *llmi_gguf_vtype_name(uint32_t t) {
    static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

size_t llmi_gguf_vtype_size(uint32_t t) {
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

/* ggml type names we recognise but cannot run, for clearer messages. */
static const char *ggml_type_name(uint32_t t) {
    static const char *const names[] = {
        [0] = "F32",     [1] = "F16",      [2] = "Q4_0",   [3] = "Q4_1",    [6] = "Q5_0",
        [7] = "Q5_1",    [8] = "Q8_0",     [9] = "Q8_1",   [10] = "Q2_K",   [11] = "Q3_K",
        [12] = "Q4_K",   [13] = "Q5_K",    [14] = "Q6_K",  [15] = "Q8_K",   [16] = "IQ2_XXS",
        [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S",
        [22] = "IQ2_S",  [23] = "IQ4_XS",  [24] = "I8",    [25] = "I16",    [26] = "I32",
        [27] = "I64",    [28] = "F64",     [29] = "IQ1_M", [30] = "BF16",
    };
    if (t < sizeof names / sizeof names[0] && names[t])
        return names[t];
    return "unknown";
}

/* Decodes one fixed-size scalar; bools must be 0 or 1 as the format says. */
static llm_status decode_scalar(reader *r, llmi_gguf_kv *kv, uint32_t type) {
    size_t n = llmi_gguf_vtype_size(type);
    if (r->size - r->pos < n)
        return truncated(r, "value");
    const uint8_t *p = r->p + r->pos;
    switch (type) {
    case LLMI_GGUF_U8:
        kv->scalar.u = p[0];
        break;
    case LLMI_GGUF_I8:
        kv->scalar.i = (int8_t)p[0];
        break;
    case LLMI_GGUF_U16:
        kv->scalar.u = (uint16_t)(p[0] | p[1] << 8);
        break;
    case LLMI_GGUF_I16:
        kv->scalar.i = (int16_t)(uint16_t)(p[0] | p[1] << 8);
        break;
    case LLMI_GGUF_U32:
        kv->scalar.u = le32(p);
        break;
    case LLMI_GGUF_I32:
        kv->scalar.i = (int32_t)le32(p);
        break;
    case LLMI_GGUF_U64:
        kv->scalar.u = le64(p);
        break;
    case LLMI_GGUF_I64:
        kv->scalar.i = (int64_t)le64(p);
        break;
    case LLMI_GGUF_F32: {
        uint32_t u = le32(p);
        float f;
        memcpy(&f, &u, 4);
        kv->scalar.f = f;
        break;
    }
    case LLMI_GGUF_F64: {
        uint64_t u = le64(p);
        memcpy(&kv->scalar.f, &u, 8);
        break;
    }
    case LLMI_GGUF_BOOL:
        if (p[0] > 1)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "metadata key '%.*s': bool value %u is not 0 or 1", name_len(kv->key),
                              kv->key.ptr, p[0]);
        kv->scalar.b = p[0] != 0;
        break;
    default:
        return llmi_error(LLM_ERR_INTERNAL, "decode_scalar: type %u", type);
    }
    r->pos += n;
    return LLM_OK;
}

static llm_status parse_array(reader *r, llmi_gguf_kv *kv) {
    uint32_t et;
    uint64_t len = 0;
    LLMI_TRY(rd_u32(r, &et, "array element type"));
    LLMI_TRY(rd_u64(r, &len, "array length"));
    if (et == LLMI_GGUF_ARRAY)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "metadata key '%.*s': nested arrays are not supported", name_len(kv->key),
                          kv->key.ptr);
    if (et > LLMI_GGUF_F64)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "metadata key '%.*s': unknown array element type %" PRIu32,
                          name_len(kv->key), kv->key.ptr, et);
    kv->arr_type = (llmi_gguf_vtype)et;
    kv->arr_len = len;
    size_t left = r->size - r->pos;
    if (et == LLMI_GGUF_STRING) {
        /* Each string needs at least its 8-byte length. */
        if (len > left / 8)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "metadata key '%.*s': array of %" PRIu64
                              " strings cannot fit in the %zu bytes left (truncated or corrupt)",
                              name_len(kv->key), kv->key.ptr, len, left);
        if (len == 0)
            return LLM_OK;
        kv->arr_strs = llmi_calloc((size_t)len, sizeof *kv->arr_strs);
        if (!kv->arr_strs)
            return llmi_oom("GGUF string array");
        for (uint64_t i = 0; i < len; i++)
            LLMI_TRY(rd_str(r, &kv->arr_strs[i], "array string"));
        return LLM_OK;
    }
    size_t esize = llmi_gguf_vtype_size(et), bytes;
    if (len > SIZE_MAX || !llmi_mul_ok((size_t)len, esize, &bytes) || bytes > left)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "metadata key '%.*s': array of %" PRIu64
                          " %s elements overflows the %zu bytes left (truncated or corrupt)",
                          name_len(kv->key), kv->key.ptr, len, llmi_gguf_vtype_name(et), left);
    if (et == LLMI_GGUF_BOOL) {
        for (size_t i = 0; i < bytes; i++)
            if (r->p[r->pos + i] > 1)
                return llmi_error(LLM_ERR_BAD_FORMAT,
                                  "metadata key '%.*s': bool element %zu is %u, not 0 or 1",
                                  name_len(kv->key), kv->key.ptr, i, r->p[r->pos + i]);
    }
    kv->arr_data = r->p + r->pos;
    r->pos += bytes;
    return LLM_OK;
}

static llm_status parse_kv(reader *r, llmi_gguf_kv *kv, uint64_t index) {
    r->item = "metadata entry";
    r->index = index;
    r->name = (llmi_str){0};
    LLMI_TRY(rd_str(r, &kv->key, "key"));
    if (kv->key.len == 0)
        return llmi_error(LLM_ERR_BAD_FORMAT, "metadata entry %" PRIu64 " has an empty key", index);
    r->item = "metadata key";
    r->name = kv->key;
    uint32_t type;
    LLMI_TRY(rd_u32(r, &type, "value type"));
    if (type > LLMI_GGUF_F64)
        return llmi_error(LLM_ERR_BAD_FORMAT, "metadata key '%.*s' has unknown value type %" PRIu32,
                          name_len(kv->key), kv->key.ptr, type);
    kv->type = (llmi_gguf_vtype)type;
    if (type == LLMI_GGUF_STRING)
        return rd_str(r, &kv->str, "string value");
    if (type == LLMI_GGUF_ARRAY)
        return parse_array(r, kv);
    return decode_scalar(r, kv, type);
}

static llm_status parse_tensor_info(reader *r, llmi_gguf_tensor *t, uint64_t index,
                                    uint32_t alignment) {
    r->item = "tensor info";
    r->index = index;
    r->name = (llmi_str){0};
    LLMI_TRY(rd_str(r, &t->name, "name"));
    r->item = "tensor";
    r->name = t->name;
    int nl = name_len(t->name);
    const char *nm = t->name.ptr;
    LLMI_TRY(rd_u32(r, &t->n_dims, "n_dims"));
    if (t->n_dims < 1 || t->n_dims > 4)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "tensor '%.*s' has n_dims = %" PRIu32 " (must be 1..4)", nl, nm,
                          t->n_dims);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < 4; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims)
            continue;
        LLMI_TRY(rd_u64(r, &t->ne[d], "dimensions"));
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return llmi_error(LLM_ERR_BAD_FORMAT, "tensor '%.*s' has invalid ne[%u] = %" PRIu64, nl,
                              nm, d, t->ne[d]);
        if (elems > (uint64_t)INT64_MAX / t->ne[d])
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "tensor '%.*s': element count overflows at ne[%u] = %" PRIu64, nl, nm,
                              d, t->ne[d]);
        elems *= t->ne[d];
    }
    uint32_t type;
    LLMI_TRY(rd_u32(r, &type, "type"));
    LLMI_TRY(rd_u64(r, &t->offset, "offset"));
    const llmi_ttype_info *ti = llmi_ttype_get(type);
    if (!ti)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "tensor '%.*s' has type %" PRIu32
                          " (%s), which is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
                          "Q8_0, Q4_K, Q6_K are)",
                          nl, nm, type, ggml_type_name(type));
    t->type = (llmi_ttype)type;
    if (t->ne[0] % ti->block != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "tensor '%.*s': ne[0] = %" PRIu64
                          " is not a multiple of the %s block size %" PRIu32,
                          nl, nm, t->ne[0], ti->name, ti->block);
    size_t row = llmi_ttype_row_bytes(type, t->ne[0]);
    uint64_t rows = elems / t->ne[0];
    if (row == 0 || rows > SIZE_MAX || !llmi_mul_ok(row, (size_t)rows, &t->nbytes))
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "tensor '%.*s': byte size overflows (%" PRIu64 " elements)", nl, nm,
                          elems);
    if (t->offset % alignment != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "tensor '%.*s': offset %" PRIu64
                          " is not a multiple of the alignment %" PRIu32,
                          nl, nm, t->offset, alignment);
    return LLM_OK;
}

static int str_cmp(llmi_str a, llmi_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c)
        return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

static int kv_ptr_cmp(const void *a, const void *b) {
    return str_cmp((*(const llmi_gguf_kv *const *)a)->key, (*(const llmi_gguf_kv *const *)b)->key);
}

static int tensor_ptr_cmp(const void *a, const void *b) {
    return str_cmp((*(const llmi_gguf_tensor *const *)a)->name,
                   (*(const llmi_gguf_tensor *const *)b)->name);
}

static llm_status index_kv(gguf_impl *gi) {
    const llmi_gguf *g = &gi->pub;
    if (g->n_kv == 0)
        return LLM_OK;
    gi->kv_sorted = llmi_calloc((size_t)g->n_kv, sizeof *gi->kv_sorted);
    if (!gi->kv_sorted)
        return llmi_oom("GGUF key index");
    for (size_t i = 0; i < g->n_kv; i++)
        gi->kv_sorted[i] = &g->kv[i];
    qsort(gi->kv_sorted, (size_t)g->n_kv, sizeof *gi->kv_sorted, kv_ptr_cmp);
    for (size_t i = 1; i < g->n_kv; i++) {
        llmi_str k = gi->kv_sorted[i]->key;
        if (str_cmp(gi->kv_sorted[i - 1]->key, k) == 0)
            return llmi_error(LLM_ERR_BAD_FORMAT, "duplicate metadata key '%.*s'", name_len(k),
                              k.ptr);
    }
    return LLM_OK;
}

llm_status llmi_gguf_index_tensors(gguf_impl *gi) {
    const llmi_gguf *g = &gi->pub;
    if (g->n_tensors == 0)
        return LLM_OK;
    gi->t_sorted = llmi_calloc((size_t)g->n_tensors, sizeof *gi->t_sorted);
    if (!gi->t_sorted)
        return llmi_oom("GGUF tensor index");
    for (size_t i = 0; i < g->n_tensors; i++)
        gi->t_sorted[i] = &g->tensors[i];
    qsort(gi->t_sorted, (size_t)g->n_tensors, sizeof *gi->t_sorted, tensor_ptr_cmp);
    for (size_t i = 1; i < g->n_tensors; i++) {
        llmi_str n = gi->t_sorted[i]->name;
        if (str_cmp(gi->t_sorted[i - 1]->name, n) == 0)
            return llmi_error(LLM_ERR_BAD_FORMAT, "duplicate tensor name '%.*s'", name_len(n),
                              n.ptr);
    }
    return LLM_OK;
}

static llm_status read_alignment(const llmi_gguf *g, uint32_t *out) {
    *out = GGUF_DEFAULT_ALIGNMENT;
    const llmi_gguf_kv *kv = llmi_gguf_find(g, "general.alignment");
    if (!kv)
        return LLM_OK;
    uint64_t v;
    switch (kv->type) {
    case LLMI_GGUF_U8:
    case LLMI_GGUF_U16:
    case LLMI_GGUF_U32:
    case LLMI_GGUF_U64:
        v = kv->scalar.u;
        break;
    case LLMI_GGUF_I8:
    case LLMI_GGUF_I16:
    case LLMI_GGUF_I32:
    case LLMI_GGUF_I64:
        v = kv->scalar.i < 0 ? 0 : (uint64_t)kv->scalar.i;
        break;
    default:
        return llmi_error(LLM_ERR_BAD_FORMAT, "general.alignment has type %s, expected u32",
                          llmi_gguf_vtype_name(kv->type));
    }
    if (v == 0 || v > UINT32_MAX || (v & (v - 1)) != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "general.alignment = %" PRIu64 " is not a power of two", v);
    *out = (uint32_t)v;
    return LLM_OK;
}

static int by_offset(const void *a, const void *b) {
    const llmi_gguf_tensor *x = *(const llmi_gguf_tensor *const *)a;
    const llmi_gguf_tensor *y = *(const llmi_gguf_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return (x > y) - (x < y); /* file order among equal offsets: stable messages */
}

/* Two tensors whose data share bytes: writing one (a conversion in place,
 * a backend upload that repacks) would change the other, and no writer
 * produces such a file. Offsets and sizes are in bounds already. */
static llm_status check_no_overlap(const llmi_gguf *g) {
    if (g->n_tensors < 2)
        return LLM_OK;
    const llmi_gguf_tensor **order = llmi_malloc((size_t)g->n_tensors * sizeof *order);
    if (!order)
        return llmi_oom("GGUF tensor order");
    for (uint64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, (size_t)g->n_tensors, sizeof *order, by_offset);
    llm_status st = LLM_OK;
    for (uint64_t i = 1; i < g->n_tensors && st == LLM_OK; i++) {
        const llmi_gguf_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + a->nbytes > b->offset)
            st = llmi_error(LLM_ERR_BAD_FORMAT,
                            "tensor '%.*s': data at offset %" PRIu64 " + %zu bytes overlaps tensor"
                            " '%.*s' at offset %" PRIu64,
                            name_len(a->name), a->name.ptr, a->offset, a->nbytes, name_len(b->name),
                            b->name.ptr, b->offset);
    }
    llmi_free(order);
    return st;
}

llm_status llmi_gguf_parse(gguf_impl *gi) {
    llmi_gguf *g = &gi->pub;
    reader r = {.p = g->base, .size = g->size};
    if (r.size < 4)
        return truncated(&r, "magic");
    if (memcmp(r.p, "GGUF", 4) != 0)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "bad magic %02x %02x %02x %02x: not a GGUF file (expected \"GGUF\")",
                          r.p[0], r.p[1], r.p[2], r.p[3]);
    r.pos = 4;
    LLMI_TRY(rd_u32(&r, &g->version, "version"));
    if (g->version != 2 && g->version != 3) {
        uint32_t v = g->version;
        uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00) | ((v << 8) & 0xff0000) | (v << 24);
        if (swapped == 2 || swapped == 3)
            return llmi_error(LLM_ERR_UNSUPPORTED, "big-endian GGUF files are not supported");
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "GGUF version %" PRIu32 " is not supported (only versions 2 and 3)", v);
    }
    LLMI_TRY(rd_u64(&r, &g->n_tensors, "tensor count"));
    LLMI_TRY(rd_u64(&r, &g->n_kv, "metadata count"));
    size_t left = r.size - r.pos;
    if (g->n_kv > left / KV_MIN_BYTES)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "n_kv = %" PRIu64 " metadata entries cannot fit in the %zu bytes left"
                          " (truncated or corrupt)",
                          g->n_kv, left);
    if (g->n_tensors > left / TENSOR_MIN_BYTES)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "n_tensors = %" PRIu64 " tensor infos cannot fit in the %zu bytes left"
                          " (truncated or corrupt)",
                          g->n_tensors, left);
    if (g->n_kv) {
        g->kv = llmi_calloc((size_t)g->n_kv, sizeof *g->kv);
        if (!g->kv)
            return llmi_oom("GGUF metadata");
    }
    for (uint64_t i = 0; i < g->n_kv; i++)
        LLMI_TRY(parse_kv(&r, &g->kv[i], i));
    LLMI_TRY(index_kv(gi));
    LLMI_TRY(read_alignment(g, &g->alignment));

    if (g->n_tensors) {
        g->tensors = llmi_calloc((size_t)g->n_tensors, sizeof *g->tensors);
        if (!g->tensors)
            return llmi_oom("GGUF tensor infos");
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        LLMI_TRY(parse_tensor_info(&r, &g->tensors[i], i, g->alignment));
    LLMI_TRY(llmi_gguf_index_tensors(gi));

    /* The data section starts at the next multiple of the alignment. */
    size_t pad = (g->alignment - r.pos % g->alignment) % g->alignment;
    if (g->n_tensors == 0)
        return LLM_OK;
    if (pad > r.size - r.pos) {
        r.item = NULL;
        r.name = (llmi_str){0};
        return truncated(&r, "padding before the tensor data");
    }
    size_t data_start = r.pos + pad;
    size_t data_size = r.size - data_start;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        llmi_gguf_tensor *t = &g->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "tensor '%.*s': data at offset %" PRIu64 " + %zu bytes runs past the"
                              " end of the file (data section has %zu bytes; truncated or corrupt)",
                              name_len(t->name), t->name.ptr, t->offset, t->nbytes, data_size);
        t->data = g->base + data_start + t->offset;
    }
    return check_no_overlap(g);
}

void llmi_gguf_impl_free(gguf_impl *gi) {
    if (!gi)
        return;
    llmi_gguf *g = &gi->pub;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++)
            llmi_free(g->kv[i].arr_strs);
    llmi_free(g->kv);
    llmi_free(g->tensors);
    llmi_free(gi->kv_sorted);
    llmi_free(gi->t_sorted);
    if (g->mapped)
        munmap((void *)g->base, g->size);
    if (gi->owned_aligned)
        llmi_free_aligned(g->owned);
    if (gi->parts)
        gi->release_parts(gi->parts);
    llmi_free(gi);
}

void llmi_gguf_close(llmi_gguf *g) { llmi_gguf_impl_free((gguf_impl *)g); }

llm_status llmi_gguf_open_memory(const void *data, size_t size, llmi_gguf **out) {
    if (!out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!data)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_open_memory: data is NULL");
    gguf_impl *gi = llmi_calloc(1, sizeof *gi);
    if (!gi)
        return llmi_oom("GGUF handle");
    gi->pub.base = data;
    gi->pub.size = size;
    llm_status st = llmi_gguf_parse(gi);
    if (st != LLM_OK) {
        llmi_gguf_impl_free(gi);
        return st;
    }
    *out = &gi->pub;
    return LLM_OK;
}

/* Chunks of 64 MiB: a progress report each, and few enough calls. */
#define READ_CHUNK ((size_t)64 << 20)

static llm_status read_all(int fd, uint8_t *buf, size_t size, const char *path,
                           const llmi_progress *progress) {
    size_t got = 0;
    LLMI_TRY(llmi_progress_report(progress, LLM_PROGRESS_READ, 0, size));
    while (got < size) {
        size_t want = size - got > READ_CHUNK ? READ_CHUNK : size - got;
        ssize_t n = read(fd, buf + got, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return llmi_error(LLM_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
        if (n == 0)
            return llmi_error(LLM_ERR_IO, "short read of '%s': got %zu of %zu bytes", path, got,
                              size);
        got += (size_t)n;
        LLMI_TRY(llmi_progress_report(progress, LLM_PROGRESS_READ, got, size));
    }
    return LLM_OK;
}

llm_status llmi_gguf_open(const char *path, bool use_mmap, llmi_gguf **out) {
    return llmi_gguf_open_progress(path, use_mmap, NULL, out);
}

llm_status llmi_gguf_open_progress(const char *path, bool use_mmap, const llmi_progress *progress,
                                   llmi_gguf **out) {
    if (!out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_open: out is NULL");
    *out = NULL;
    if (!path)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_open: path is NULL");
    llm_status st = LLM_OK;
    gguf_impl *gi = NULL;
    /* Messages name the file as '<path>'. */
    size_t path_len = strlen(path);
    char *quoted = llmi_malloc(path_len + 3);
    if (!quoted)
        return llmi_oom("path");
    quoted[0] = '\'';
    memcpy(quoted + 1, path, path_len);
    memcpy(quoted + 1 + path_len, "'", 2);
    int fd = -1;
    uint64_t file_size = 0;
    st = llmi_open_regular(path, quoted, NULL, &fd, &file_size);
    llmi_free(quoted);
    if (st != LLM_OK)
        return st;
    if (file_size > SIZE_MAX) {
        st = llmi_error(LLM_ERR_LIMIT, "'%s' is too large to address", path);
        goto fail;
    }
    gi = llmi_calloc(1, sizeof *gi);
    if (!gi) {
        st = llmi_oom("GGUF handle");
        goto fail;
    }
    llmi_gguf *g = &gi->pub;
    g->size = (size_t)file_size;
    /* An empty file cannot be mapped; it is left for parse() to reject. */
    static const uint8_t empty[1];
    g->base = empty;
    if (g->size > 0 && use_mmap) {
        void *p = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno; /* no address space or memory left is not an I/O error */
            st = llmi_error(e == ENOMEM ? LLM_ERR_OUT_OF_MEMORY : LLM_ERR_IO, "cannot map '%s': %s",
                            path, strerror(e));
            goto fail;
        }
        g->base = p;
        g->mapped = true;
        if ((st = llmi_progress_report(progress, LLM_PROGRESS_READ, 0, g->size)) != LLM_OK ||
            (st = llmi_progress_report(progress, LLM_PROGRESS_READ, g->size, g->size)) != LLM_OK)
            goto fail;
    } else if (g->size > 0) {
        /* Aligned so tensor data inside is as aligned as in a mapping. */
        g->owned = llmi_malloc_aligned(g->size);
        if (!g->owned) {
            st = llmi_oom("GGUF file contents");
            goto fail;
        }
        gi->owned_aligned = true;
        g->base = g->owned;
        st = read_all(fd, g->owned, g->size, path, progress);
        if (st != LLM_OK)
            goto fail;
    }
    close(fd);
    fd = -1;
    st = llmi_gguf_parse(gi);
    if (st != LLM_OK) {
        llmi_error_prefix("'%s'", path);
        goto fail;
    }
    *out = &gi->pub;
    return LLM_OK;
fail:
    if (fd >= 0)
        close(fd);
    llmi_gguf_impl_free(gi);
    return st;
}

/* ---- lookups ---- */

bool llmi_str_eq(llmi_str s, const char *c) {
    if (!c)
        return false;
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

const llmi_gguf_kv *llmi_gguf_find(const llmi_gguf *g, const char *key) {
    if (!g || !key)
        return NULL;
    const gguf_impl *gi = (const gguf_impl *)g;
    llmi_str k = {key, strlen(key)};
    size_t lo = 0, hi = (size_t)g->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(gi->kv_sorted[mid]->key, k);
        if (c == 0)
            return gi->kv_sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const llmi_gguf_tensor *llmi_gguf_find_tensor(const llmi_gguf *g, const char *name) {
    if (!g || !name)
        return NULL;
    const gguf_impl *gi = (const gguf_impl *)g;
    llmi_str k = {name, strlen(name)};
    size_t lo = 0, hi = (size_t)g->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(gi->t_sorted[mid]->name, k);
        if (c == 0)
            return gi->t_sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- typed getters ---- */

/* Shared prologue: argument checks and the lookup. Returns LLM_OK with *kv
 * NULL for an absent optional key. */
static llm_status lookup(const llmi_gguf *g, const char *key, bool required, const void *out,
                         const char *fn, const llmi_gguf_kv **kv) {
    *kv = NULL;
    if (!g || !key || !out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                          !g     ? "gguf"
                          : !key ? "key"
                                 : "out");
    *kv = llmi_gguf_find(g, key);
    if (!*kv && required)
        return llmi_error(LLM_ERR_NOT_FOUND, "required metadata key '%s' not found", key);
    return LLM_OK;
}

static llm_status wrong_type(const char *key, const llmi_gguf_kv *kv, const char *expected) {
    if (kv->type == LLMI_GGUF_ARRAY)
        return llmi_error(LLM_ERR_BAD_FORMAT, "metadata key '%s' is an array of %s, expected %s",
                          key, llmi_gguf_vtype_name(kv->arr_type), expected);
    return llmi_error(LLM_ERR_BAD_FORMAT, "metadata key '%s' has type %s, expected %s", key,
                      llmi_gguf_vtype_name(kv->type), expected);
}

llm_status llmi_gguf_get_u32(const llmi_gguf *g, const char *key, bool required, uint32_t *out) {
    const llmi_gguf_kv *kv;
    LLMI_TRY(lookup(g, key, required, out, "llmi_gguf_get_u32", &kv));
    if (!kv)
        return LLM_OK;
    switch (kv->type) {
    case LLMI_GGUF_U8:
    case LLMI_GGUF_U16:
    case LLMI_GGUF_U32:
    case LLMI_GGUF_U64:
        if (kv->scalar.u > UINT32_MAX)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "metadata key '%s' = %" PRIu64 " does not fit in u32", key,
                              kv->scalar.u);
        *out = (uint32_t)kv->scalar.u;
        return LLM_OK;
    case LLMI_GGUF_I8:
    case LLMI_GGUF_I16:
    case LLMI_GGUF_I32:
    case LLMI_GGUF_I64:
        if (kv->scalar.i < 0 || (uint64_t)kv->scalar.i > UINT32_MAX)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "metadata key '%s' = %" PRId64 " does not fit in u32", key,
                              kv->scalar.i);
        *out = (uint32_t)kv->scalar.i;
        return LLM_OK;
    default:
        return wrong_type(key, kv, "an integer");
    }
}

llm_status llmi_gguf_get_f32(const llmi_gguf *g, const char *key, bool required, float *out) {
    const llmi_gguf_kv *kv;
    LLMI_TRY(lookup(g, key, required, out, "llmi_gguf_get_f32", &kv));
    if (!kv)
        return LLM_OK;
    if (kv->type != LLMI_GGUF_F32 && kv->type != LLMI_GGUF_F64)
        return wrong_type(key, kv, "f32");
    *out = (float)kv->scalar.f;
    return LLM_OK;
}

llm_status llmi_gguf_get_bool(const llmi_gguf *g, const char *key, bool required, bool *out) {
    const llmi_gguf_kv *kv;
    LLMI_TRY(lookup(g, key, required, out, "llmi_gguf_get_bool", &kv));
    if (!kv)
        return LLM_OK;
    if (kv->type != LLMI_GGUF_BOOL)
        return wrong_type(key, kv, "bool");
    *out = kv->scalar.b;
    return LLM_OK;
}

llm_status llmi_gguf_get_str(const llmi_gguf *g, const char *key, bool required, llmi_str *out) {
    const llmi_gguf_kv *kv;
    LLMI_TRY(lookup(g, key, required, out, "llmi_gguf_get_str", &kv));
    if (!kv)
        return LLM_OK;
    if (kv->type != LLMI_GGUF_STRING)
        return wrong_type(key, kv, "string");
    *out = kv->str;
    return LLM_OK;
}

llm_status llmi_gguf_get_arr(const llmi_gguf *g, const char *key, bool required,
                             llmi_gguf_vtype elem_type, const llmi_gguf_kv **out) {
    const llmi_gguf_kv *kv;
    LLMI_TRY(lookup(g, key, required, out, "llmi_gguf_get_arr", &kv));
    if (!kv)
        return LLM_OK;
    if (kv->type != LLMI_GGUF_ARRAY || kv->arr_type != elem_type) {
        char expected[32];
        snprintf(expected, sizeof expected, "an array of %s", llmi_gguf_vtype_name(elem_type));
        return wrong_type(key, kv, expected);
    }
    *out = kv;
    return LLM_OK;
}

void llmi_gguf_release_pages(const llmi_gguf *g, const void *data, size_t bytes) {
    const uintptr_t base = (uintptr_t)g->base, p = (uintptr_t)data;
    if (!g->mapped || p < base || bytes > g->size || p - base > g->size - bytes)
        return;
    const long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0)
        return;
    const uintptr_t page = (uintptr_t)ps;
    const uintptr_t lo = (p + page - 1) / page * page, hi = (p + bytes) / page * page;
    if (lo < hi)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: nothing to undo on failure */
}
