/* The safetensors reader. The file is untrusted: the header length is
 * bounded before anything is parsed, and every tensor's offsets, shape and
 * dtype are checked against each other and the data section, so a tensor
 * handed on always lies inside the file and never shares bytes with another. */
#include "hf/hf_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Integers JSON numbers (doubles) hold exactly. */
#define JSON_INT_MAX 9007199254740992.0

static bool json_u64(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item))
        return false;
    double v = item->valuedouble;
    if (!(v >= 0.0 && v <= JSON_INT_MAX) || v != (double)(uint64_t)v)
        return false;
    *out = (uint64_t)v;
    return true;
}

/* The dtypes we multiply; the others (F64, integers, F8_*) are refused. */
static bool st_dtype(const char *s, llmi_ttype *t) {
    if (strcmp(s, "F32") == 0)
        *t = LLMI_T_F32;
    else if (strcmp(s, "F16") == 0)
        *t = LLMI_T_F16;
    else if (strcmp(s, "BF16") == 0)
        *t = LLMI_T_BF16;
    else
        return false;
    return true;
}

static size_t dtype_size(llmi_ttype t) { return t == LLMI_T_F32 ? 4 : 2; }

/* transformers' position_ids buffer (I64, BERT checkpoints keep it): no
 * weight of any architecture, so it is left out of the table. Other
 * integer tensors are refused as unknown dtypes. */
static bool integer_buffer(const cJSON *e) {
    const char *suffix = ".position_ids";
    size_t n = strlen(e->string), k = strlen(suffix);
    if (n < k || strcmp(e->string + n - k, suffix) != 0)
        return false;
    static const char *const ints[] = {"I64", "I32", "I16", "I8",  "U64",
                                       "U32", "U16", "U8",  "BOOL"};
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dtype))
        return false;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (strcmp(dtype->valuestring, ints[i]) == 0)
            return true;
    return false;
}

void llmi_st_tensors_free(llmi_st_tensor *t, size_t n) {
    if (!t)
        return;
    for (size_t i = 0; i < n; i++)
        llmi_free(t[i].name);
    llmi_free(t);
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const llmi_st_tensor *)a)->name, ((const llmi_st_tensor *)b)->name);
}

static int by_offset(const void *a, const void *b) {
    const llmi_st_tensor *x = *(const llmi_st_tensor *const *)a;
    const llmi_st_tensor *y = *(const llmi_st_tensor *const *)b;
    if (x->data != y->data)
        return x->data < y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

const llmi_st_tensor *llmi_st_find(const llmi_st_tensor *t, size_t n, const char *name) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(t[mid].name, name);
        if (c == 0)
            return &t[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* One header entry: {"dtype": ..., "shape": [...], "data_offsets": [b, e]}. */
static llm_status parse_entry(const cJSON *e, const char *what, const uint8_t *data,
                              size_t data_size, llmi_st_tensor *t) {
    const char *nm = e->string;
    if (!cJSON_IsObject(e))
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: header entry '%s' is not an object", what, nm);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dtype))
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%s' has no string field 'dtype'", what,
                          nm);
    if (!st_dtype(dtype->valuestring, &t->type))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: tensor '%s' has dtype '%s' (F32, F16 and BF16 are supported)", what,
                          nm, dtype->valuestring);
    if (!cJSON_IsArray(shape))
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%s' has no array field 'shape'", what,
                          nm);
    int nd = cJSON_GetArraySize(shape);
    if (nd < 1 || nd > 4)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: tensor '%s' has %d dimensions in 'shape' (1..4 are supported)", what,
                          nm, nd);
    t->n_dims = (uint32_t)nd;
    uint64_t elems = 1;
    for (int d = 0; d < 4; d++)
        t->shape[d] = 1;
    int d = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape) {
        if (!json_u64(dim, &t->shape[d]))
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "%s: tensor '%s': 'shape'[%d] is not a non-negative integer", what,
                              nm, d);
        if (t->shape[d] && elems > UINT64_MAX / 4 / t->shape[d])
            return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%s': 'shape' overflows", what, nm);
        elems *= t->shape[d];
        d++;
    }
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_u64(cJSON_GetArrayItem(offs, 0), &begin) ||
        !json_u64(cJSON_GetArrayItem(offs, 1), &end))
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: tensor '%s': 'data_offsets' is not two non-negative integers", what,
                          nm);
    if (begin > end || end > data_size)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: tensor '%s': 'data_offsets' [%" PRIu64 ", %" PRIu64
                          "] lie outside the %zu-byte data section (truncated or corrupt)",
                          what, nm, begin, end, data_size);
    uint64_t want = elems * dtype_size(t->type);
    if (want != end - begin)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: tensor '%s': 'shape' holds %" PRIu64 " bytes of %s but "
                          "'data_offsets' span %" PRIu64,
                          what, nm, want, dtype->valuestring, end - begin);
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    return LLM_OK;
}

static llm_status check_layout(llmi_st_tensor *t, size_t n, const char *what) {
    if (n == 0)
        return LLM_OK;
    const llmi_st_tensor **order = llmi_calloc(n, sizeof *order);
    if (!order)
        return llmi_oom("safetensors offset index");
    for (size_t i = 0; i < n; i++)
        order[i] = &t[i];
    qsort(order, n, sizeof *order, by_offset);
    llm_status st = LLM_OK;
    for (size_t i = 1; i < n && st == LLM_OK; i++) {
        const llmi_st_tensor *a = order[i - 1], *b = order[i];
        if (a->data + a->nbytes > b->data)
            st = llmi_error(LLM_ERR_BAD_FORMAT,
                            "%s: tensors '%s' and '%s' overlap in 'data_offsets'", what, a->name,
                            b->name);
    }
    llmi_free(order);
    if (st != LLM_OK)
        return st;
    qsort(t, n, sizeof *t, by_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(t[i - 1].name, t[i].name) == 0)
            return llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%s' is listed twice", what,
                              t[i].name);
    return LLM_OK;
}

llm_status llmi_st_parse(const void *data, size_t size, const char *what, llmi_st_tensor **tensors,
                         size_t *n_tensors) {
    *tensors = NULL;
    *n_tensors = 0;
    const uint8_t *p = data;
    if (size < 8)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: truncated: %zu bytes, the 8-byte header length does not fit", what,
                          size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | p[i];
    if (hlen > size - 8)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)",
                          what, hlen, size);
    if (hlen > LLMI_ST_MAX_HEADER || hlen < 2)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "%s: header length %" PRIu64 " is out of range (2..%u)", what, hlen,
                          LLMI_ST_MAX_HEADER);
    LLMI_TRY(llmi_hf_json_check_nul(what, (const char *)p + 8, (size_t)hlen, 8));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)p + 8, (size_t)hlen, &end, false);
    if (!root) {
        size_t at = end ? (size_t)(end - (const char *)p) : 8;
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: header is not valid JSON (near byte %zu)", what,
                          at);
    }
    llm_status st = LLM_OK;
    llmi_st_tensor *t = NULL;
    size_t n = 0;
    /* The writer pads the header with spaces; anything else after the
     * object is not a header we understand. */
    for (const char *q = end; q < (const char *)p + 8 + hlen; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            st = llmi_error(LLM_ERR_BAD_FORMAT,
                            "%s: header has bytes after its JSON object (at "
                            "byte %zu)",
                            what, (size_t)(q - (const char *)p));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        st = llmi_error(LLM_ERR_BAD_FORMAT, "%s: header is not a JSON object", what);
        goto done;
    }
    const uint8_t *dstart = p + 8 + hlen;
    size_t dsize = size - 8 - (size_t)hlen;
    size_t cap = (size_t)cJSON_GetArraySize(root);
    if (cap) {
        t = llmi_calloc(cap, sizeof *t);
        if (!t) {
            st = llmi_oom("safetensors tensor table");
            goto done;
        }
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!e->string) {
            st = llmi_error(LLM_ERR_BAD_FORMAT, "%s: header entry without a name", what);
            goto done;
        }
        if (strcmp(e->string, "__metadata__") == 0 || integer_buffer(e))
            continue;
        if ((st = parse_entry(e, what, dstart, dsize, &t[n])) != LLM_OK)
            goto done;
        if (!(t[n].name = llmi_strdup(e->string))) {
            st = llmi_oom("safetensors tensor name");
            goto done;
        }
        n++;
    }
    st = check_layout(t, n, what);
done:
    cJSON_Delete(root);
    if (st != LLM_OK) {
        llmi_st_tensors_free(t, n);
        return st;
    }
    *tensors = t;
    *n_tensors = n;
    return LLM_OK;
}

static llm_status read_all(int fd, uint8_t *buf, size_t size, const char *what) {
    size_t got = 0;
    while (got < size) {
        size_t want = size - got > (1u << 30) ? (1u << 30) : size - got;
        ssize_t r = read(fd, buf + got, want);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return llmi_error(LLM_ERR_IO, "cannot read %s: %s", what, strerror(errno));
        if (r == 0)
            return llmi_error(LLM_ERR_IO, "short read of %s: %zu of %zu bytes", what, got, size);
        got += (size_t)r;
    }
    return LLM_OK;
}

llm_status llmi_st_open(const char *path, const char *what, bool use_mmap, llmi_st_file *f) {
    memset(f, 0, sizeof *f);
    int fd = -1;
    uint64_t file_size = 0;
    llm_status st = llmi_open_regular(path, what, NULL, &fd, &file_size);
    if (st != LLM_OK)
        return st;
    if (file_size > SIZE_MAX / 2) {
        st = llmi_error(LLM_ERR_LIMIT, "%s is too large to address", what);
        goto fail;
    }
    f->size = (size_t)file_size;
    static const uint8_t empty[1];
    f->base = empty;
    if (f->size && use_mmap) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            st = llmi_error(e == ENOMEM ? LLM_ERR_OUT_OF_MEMORY : LLM_ERR_IO, "cannot map %s: %s",
                            what, strerror(e));
            goto fail;
        }
        f->map = m;
        f->base = m;
    } else if (f->size) {
        if (!(f->buf = llmi_malloc_aligned(f->size))) {
            st = llmi_oom("safetensors file contents");
            goto fail;
        }
        f->base = f->buf;
        if ((st = read_all(fd, f->buf, f->size, what)) != LLM_OK)
            goto fail;
    }
    close(fd);
    fd = -1;
    if ((st = llmi_st_parse(f->base, f->size, what, &f->tensors, &f->n_tensors)) != LLM_OK)
        goto fail;
    return LLM_OK;
fail:
    if (fd >= 0)
        close(fd);
    llmi_st_close(f);
    return st;
}

void llmi_st_close(llmi_st_file *f) {
    if (!f)
        return;
    llmi_st_tensors_free(f->tensors, f->n_tensors);
    if (f->map)
        munmap(f->map, f->size);
    llmi_free_aligned(f->buf);
    memset(f, 0, sizeof *f);
}
