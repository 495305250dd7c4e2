/* libFuzzer target: the safetensors header parser (lib/hf/safetensors.c)
 * on arbitrary bytes.
 *
 * A rejected input must leave the table empty with a known status and a
 * message. An accepted one is checked against the format, independently of
 * the parser's own checks: every tensor's bytes lie inside the data section
 * after the header, their count is the product of the shape times the dtype
 * size, no two tensors share a byte, names are sorted and unique and each
 * is found again by llmi_st_find. */
#include "hf/hf_internal.h"

#include "fuzz_util.h"

static size_t esize(llmi_ttype t) { return t == LLMI_T_F32 ? 4 : 2; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    llmi_st_tensor *t = NULL;
    size_t n = 0;
    llm_status st = llmi_st_parse(data, size, "fuzz.safetensors", &t, &n);
    if (st != LLM_OK) {
        FUZZ_CHECK(st == LLM_ERR_BAD_FORMAT || st == LLM_ERR_UNSUPPORTED ||
                       st == LLM_ERR_OUT_OF_MEMORY,
                   "status %d", st);
        FUZZ_CHECK(t == NULL && n == 0, "table left on failure");
        FUZZ_CHECK(llmi_error_message()[0] != '\0', "no message");
        return 0;
    }
    FUZZ_CHECK(size >= 8, "accepted %zu bytes", size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | data[i];
    FUZZ_CHECK(hlen <= size - 8, "header length %llu", (unsigned long long)hlen);
    const uint8_t *lo = data + 8 + hlen, *hi = data + size;
    for (size_t i = 0; i < n; i++) {
        const llmi_st_tensor *a = &t[i];
        FUZZ_CHECK(a->type == LLMI_T_F32 || a->type == LLMI_T_F16 || a->type == LLMI_T_BF16,
                   "type %d", a->type);
        FUZZ_CHECK(a->n_dims >= 1 && a->n_dims <= 4, "n_dims %u", a->n_dims);
        unsigned long long elems = 1;
        for (uint32_t d = 0; d < a->n_dims; d++)
            elems *= a->shape[d];
        FUZZ_CHECK(elems * esize(a->type) == a->nbytes, "'%s': size %zu", a->name, a->nbytes);
        FUZZ_CHECK(a->data >= lo && a->data <= hi && a->nbytes <= (size_t)(hi - a->data),
                   "'%s' outside the data section", a->name);
        if (a->nbytes)
            FUZZ_CHECK(a->data[0] == a->data[0] && a->data[a->nbytes - 1] == a->data[a->nbytes - 1],
                       "unreadable");
        FUZZ_CHECK(i == 0 || strcmp(t[i - 1].name, a->name) < 0, "names not sorted/unique");
        FUZZ_CHECK(llmi_st_find(t, n, a->name) == a, "'%s' not found again", a->name);
        if (n <= 512)
            for (size_t j = 0; j < i; j++) {
                const llmi_st_tensor *b = &t[j];
                bool apart = a->nbytes == 0 || b->nbytes == 0 || a->data + a->nbytes <= b->data ||
                             b->data + b->nbytes <= a->data;
                FUZZ_CHECK(apart, "'%s' and '%s' overlap", a->name, b->name);
            }
    }
    llmi_st_tensors_free(t, n);
    return 0;
}
