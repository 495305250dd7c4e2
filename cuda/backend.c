/* PLACEHOLDER (replaced by the real backend before this lands): a table
 * whose probe works and whose other entries refuse. */
#include "backend/backend.h"
#include "internal.h"

static llm_status refuse(void) {
    return llmi_cuda_error(LLM_ERR_UNSUPPORTED, "the CUDA backend is not built yet");
}
static llm_status open_(const llmi_backend_config *cfg, void **out) { *out = NULL; return refuse(); }
static void close_(void *b) { (void)b; }
static llm_status wload(const llm_model *m, int32_t d, void **out) { *out = NULL; return refuse(); }
static void wfree(void *w) { (void)w; }
static llm_status kvc(void *b, const llmi_kv_layout *l, void **out) { *out = NULL; return refuse(); }
static void kvf(void *kv) { (void)kv; }
static llm_status kvcopy(void *kv, uint32_t d, uint32_t s, uint32_t n) { return refuse(); }
static llm_status kvr(void *kv, uint32_t l, bool v, uint32_t s, uint32_t n, void *d) { return refuse(); }
static llm_status kvw(void *kv, uint32_t l, bool v, uint32_t s, uint32_t n, const void *d) { return refuse(); }
static llm_status sc(void *b, const llm_model *m, void *w, uint32_t r, uint32_t c, void **out) { *out = NULL; return refuse(); }
static void sf(void *s) { (void)s; }
static llm_status sr(void *s, void *kv, const llmi_step *st, float *lg) { return refuse(); }
static llm_status sy(void *b) { return LLM_OK; }

static const llmi_backend_ops table = {
    .version = LLMI_BACKEND_VERSION, .name = "cuda", .probe = llmi_cuda_probe,
    .open = open_, .close = close_, .weights_load = wload, .weights_free = wfree,
    .kv_create = kvc, .kv_free = kvf, .kv_copy = kvcopy, .kv_read = kvr, .kv_write = kvw,
    .step_create = sc, .step_free = sf, .step_run = sr, .sync = sy,
    .device_count = llmi_cuda_device_count,
};

const llmi_backend_ops *llmi_cuda_table(void) { return &table; }
