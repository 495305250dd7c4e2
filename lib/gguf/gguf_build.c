/* A gguf assembled from parts (gguf.h, "assembled from parts"): the metadata
 * is a tensor-less GGUF image the writer produces, parsed by the ordinary
 * reader so every getter behaves as for a file; the tensor table is filled
 * from the parts and the parts' memory lives as long as the gguf. */
#include "gguf/gguf.h"
#include "gguf/gguf_impl.h"

#include <inttypes.h>
#include <sys/mman.h>

typedef struct mapping {
    void *addr;
    size_t len;
} mapping;

struct llmi_gguf_parts {
    mapping *maps;
    size_t n_maps, maps_cap;
    void **bufs; /* llmi_malloc_aligned */
    size_t n_bufs, bufs_cap;
    llmi_gguf_tensor *tensors; /* names are llmi_strdup'd */
    size_t n_tensors, tensors_cap;
    void *meta; /* the metadata image (llmi_malloc), once finished */
};

static bool grow(void **buf, size_t *cap, size_t need, size_t size) {
    if (need <= *cap)
        return true;
    size_t ncap = *cap ? *cap * 2 : 16, bytes;
    if (ncap < need || !llmi_mul_ok(ncap, size, &bytes))
        return false;
    void *p = llmi_realloc(*buf, bytes);
    if (!p)
        return false;
    *buf = p;
    *cap = ncap;
    return true;
}

llm_status llmi_gguf_parts_create(llmi_gguf_parts **out) {
    if (!out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_parts_create: out is NULL");
    *out = llmi_calloc(1, sizeof **out);
    return *out ? LLM_OK : llmi_oom("GGUF parts");
}

void llmi_gguf_parts_release(llmi_gguf_parts *p) {
    if (!p)
        return;
    for (size_t i = 0; i < p->n_maps; i++)
        munmap(p->maps[i].addr, p->maps[i].len);
    for (size_t i = 0; i < p->n_bufs; i++)
        llmi_free_aligned(p->bufs[i]);
    for (size_t i = 0; i < p->n_tensors; i++)
        llmi_free((void *)p->tensors[i].name.ptr);
    llmi_free(p->maps);
    llmi_free(p->bufs);
    llmi_free(p->tensors);
    llmi_free(p->meta);
    llmi_free(p);
}

llm_status llmi_gguf_parts_keep_mapping(llmi_gguf_parts *p, void *addr, size_t len) {
    if (!p || !addr) {
        if (addr)
            munmap(addr, len);
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_parts_keep_mapping: NULL argument");
    }
    if (!grow((void **)&p->maps, &p->maps_cap, p->n_maps + 1, sizeof *p->maps)) {
        munmap(addr, len);
        return llmi_oom("GGUF parts mapping list");
    }
    p->maps[p->n_maps++] = (mapping){addr, len};
    return LLM_OK;
}

llm_status llmi_gguf_parts_keep_buffer(llmi_gguf_parts *p, void *buf) {
    if (!p || !buf) {
        llmi_free_aligned(buf);
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_parts_keep_buffer: NULL argument");
    }
    if (!grow((void **)&p->bufs, &p->bufs_cap, p->n_bufs + 1, sizeof *p->bufs)) {
        llmi_free_aligned(buf);
        return llmi_oom("GGUF parts buffer list");
    }
    p->bufs[p->n_bufs++] = buf;
    return LLM_OK;
}

llm_status llmi_gguf_parts_tensor(llmi_gguf_parts *p, const char *name, llmi_ttype type,
                                  uint32_t n_dims, const uint64_t *ne, const void *data,
                                  size_t nbytes) {
    if (!p || !name || !ne || (!data && nbytes))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_parts_tensor: NULL argument");
    if (n_dims < 1 || n_dims > 4)
        return llmi_error(LLM_ERR_UNSUPPORTED, "tensor '%s' has %u dimensions (1..4 are supported)",
                          name, n_dims);
    llmi_gguf_tensor t = {.n_dims = n_dims, .type = type, .data = data, .nbytes = nbytes};
    uint64_t elems = 1;
    for (uint32_t d = 0; d < 4; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || elems > (uint64_t)INT64_MAX / t.ne[d])
            return llmi_error(LLM_ERR_BAD_FORMAT, "tensor '%s' has an empty or too large shape",
                              name);
        elems *= t.ne[d];
    }
    size_t row = llmi_ttype_row_bytes(type, t.ne[0]), want;
    uint64_t rows = elems / t.ne[0];
    if (row == 0 || rows > SIZE_MAX || !llmi_mul_ok(row, (size_t)rows, &want) || want != nbytes)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "tensor '%s': %zu bytes do not hold %" PRIu64 " elements of type %u",
                          name, nbytes, elems, (unsigned)type);
    if (!grow((void **)&p->tensors, &p->tensors_cap, p->n_tensors + 1, sizeof *p->tensors))
        return llmi_oom("GGUF parts tensor table");
    char *copy = llmi_strdup(name);
    if (!copy)
        return llmi_oom("GGUF parts tensor name");
    t.name = (llmi_str){copy, strlen(copy)};
    p->tensors[p->n_tensors++] = t;
    return LLM_OK;
}

llm_status llmi_gguf_parts_finish(llmi_gguf_parts *p, llmi_gguf_writer *meta, llmi_gguf **out) {
    if (out)
        *out = NULL;
    if (!p || !meta || !out) {
        llmi_gguf_parts_release(p);
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_gguf_parts_finish: NULL argument");
    }
    gguf_impl *gi = llmi_calloc(1, sizeof *gi);
    if (!gi) {
        llmi_gguf_parts_release(p);
        return llmi_oom("GGUF handle");
    }
    gi->parts = p;
    gi->release_parts = llmi_gguf_parts_release;
    size_t size = 0;
    llm_status st = llmi_gguf_writer_to_memory(meta, &p->meta, &size);
    if (st != LLM_OK)
        goto fail;
    gi->pub.base = p->meta;
    gi->pub.size = size;
    if ((st = llmi_gguf_parse(gi)) != LLM_OK)
        goto fail;
    if (gi->pub.n_tensors != 0) {
        st = llmi_error(LLM_ERR_INVALID_ARGUMENT,
                        "llmi_gguf_parts_finish: the metadata writer holds tensors");
        goto fail;
    }
    /* The table stays the parts' (names included); the gguf borrows it. */
    gi->pub.tensors = NULL;
    gi->pub.n_tensors = p->n_tensors;
    if (p->n_tensors) {
        gi->pub.tensors = llmi_calloc(p->n_tensors, sizeof *gi->pub.tensors);
        if (!gi->pub.tensors) {
            st = llmi_oom("GGUF tensor infos");
            goto fail;
        }
        memcpy(gi->pub.tensors, p->tensors, p->n_tensors * sizeof *p->tensors);
    }
    if ((st = llmi_gguf_index_tensors(gi)) != LLM_OK)
        goto fail;
    *out = &gi->pub;
    return LLM_OK;
fail:
    llmi_gguf_impl_free(gi);
    return st;
}
