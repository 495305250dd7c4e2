/* Row grouping and device layout of LoRA adapters (lora_plan.h). */
#include "lora_plan.h"

bool llmi_cuda_lora_group(const uint32_t *row_adapter, uint32_t n_rows, uint32_t n_adapters,
                          uint32_t *rows, uint32_t *seg) {
    /* A counting sort: seg[a + 1] counts adapter a's rows, then becomes the
     * end of its segment; a stable pass in row order keeps each ascending. */
    for (uint32_t a = 0; a <= n_adapters; a++)
        seg[a] = 0;
    for (uint32_t r = 0; r < n_rows; r++) {
        const uint32_t a = row_adapter[r];
        if (a > n_adapters)
            return false;
        if (a)
            seg[a]++;
    }
    for (uint32_t a = 1; a <= n_adapters; a++)
        seg[a] += seg[a - 1];
    /* seg[a] is now the end of adapter a - 1's rows, i.e. the start of
     * adapter a's: fill forward from the starts, held in seg[0 ..
     * n_adapters - 1] shifted by one. */
    for (uint32_t a = n_adapters; a > 0; a--)
        seg[a] = seg[a - 1];
    seg[0] = 0;
    for (uint32_t r = 0; r < n_rows; r++) {
        const uint32_t a = row_adapter[r];
        if (a)
            rows[seg[a]++] = r;
    }
    /* Each seg[a + 1] advanced past adapter a's rows: it is their end. */
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
