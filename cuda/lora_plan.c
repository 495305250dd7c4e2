/* Row grouping and device layout of LoRA adapters (lora_plan.h). */
#include "lora_plan.h"

bool llmi_cuda_lora_group(const uint32_t *row_adapter, uint32_t n_rows, uint32_t n_adapters,
                          uint32_t *rows, uint32_t *seg) {
    /* A counting sort on the values v = row_adapter (1 .. n_adapters); the
     * pass in row order keeps each segment ascending. */
    for (uint32_t a = 0; a <= n_adapters; a++)
        seg[a] = 0;
    for (uint32_t r = 0; r < n_rows; r++) {
        const uint32_t a = row_adapter[r];
        if (a > n_adapters)
            return false;
        if (a)
            seg[a]++;
    }
    /* seg[v] becomes the end of value v's rows; shifted down one, it is
     * the start of value v's rows (seg[0] = 0 is value 1's start). */
    for (uint32_t a = 1; a <= n_adapters; a++)
        seg[a] += seg[a - 1];
    for (uint32_t a = n_adapters; a > 0; a--)
        seg[a] = seg[a - 1];
    seg[0] = 0;
    /* Filling advances each seg[v] past value v's rows to their end, which
     * is the result's convention: adapter a = v - 1 spans [seg[a], seg[a + 1]). */
    for (uint32_t r = 0; r < n_rows; r++) {
        const uint32_t a = row_adapter[r];
        if (a)
            rows[seg[a]++] = r;
    }
    return true;
}

/* n rounded up to the alignment; false on overflow. */
static bool add_aligned(size_t at, size_t n, size_t *end) {
    if (n > SIZE_MAX - at - (LLMI_CUDA_LORA_ALIGN - 1))
        return false;
    size_t e = at + n;
    *end = (e + LLMI_CUDA_LORA_ALIGN - 1) / LLMI_CUDA_LORA_ALIGN * LLMI_CUDA_LORA_ALIGN;
    return true;
}

bool llmi_cuda_lora_layout(const llm_adapter *a, uint32_t n_layer, size_t *off, size_t *total) {
    size_t at = 0;
    for (uint32_t l = 0; l < n_layer; l++)
        for (uint32_t t = 0; t < LLMI_LORA_TARGETS; t++) {
            const llmi_lora_pair *p = llmi_adapter_pair(a, l, (llmi_lora_target)t);
            size_t *o = &off[2 * ((size_t)l * LLMI_LORA_TARGETS + t)];
            if (!p->a) {
                o[0] = o[1] = LLMI_CUDA_LORA_ABSENT;
                continue;
            }
            size_t na, nb;
            if (!llmi_mul_ok(p->rank, p->in, &na) || !llmi_mul_ok(p->rank, p->out, &nb))
                return false;
            o[0] = at;
            if (!add_aligned(at, na, &at))
                return false;
            o[1] = at;
            if (!add_aligned(at, nb, &at))
                return false;
        }
    *total = at;
    return true;
}
