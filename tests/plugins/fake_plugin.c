/* Fake backend plug-ins for tests/unit/test_plugins.c: one source, built
 * once per kind (-DFAKE_KIND_<kind>) into build/tests/plugins/fake_<kind>.so,
 * each linked with --no-undefined like a real plug-in: it calls nothing of
 * the core but the host services it is handed.
 *   probe    a valid table whose probe fails with its own message; its
 *            entry logs through the host
 *   ok       a valid table, available with 2 devices
 *   version  a table of interface version 99, which the core refuses
 *   noentry  no entry point at all
 *   null     an entry that sets an error and returns NULL
 *   missing  a table without step_run (a required entry)
 *   cpu      a valid table named "cpu"
 *   other    a valid table named "other" (not "cuda")
 * The operations are never run by the tests: they fail if they are. */
#include "backend/plugin.h"

#include <stdio.h>

#define EXPORT __attribute__((visibility("default")))
/* Some kinds leave an operation out of their table. */
#define MAYBE_UNUSED __attribute__((unused))

static const llmi_plugin_host *host;

static llm_status refuse(void) {
    return host->set_error(LLM_ERR_BACKEND, "fake plug-in: operations are not implemented");
}

MAYBE_UNUSED static llm_status probe_fails(void) {
    return host->set_error(LLM_ERR_UNSUPPORTED, "fake probe: no fake device in this machine");
}

static llm_status two_devices(uint32_t *n) {
    *n = 2;
    return LLM_OK;
}

static llm_status op_open(const llmi_backend_config *cfg, void **out) {
    *out = NULL;
    return refuse();
}
static void op_close(void *b) {}
static llm_status op_weights_load(const llm_model *m, int32_t device, void **out) {
    *out = NULL;
    return refuse();
}
static void op_free(void *p) {}
static llm_status op_kv_create(void *b, const llmi_kv_layout *layout, void **out) {
    *out = NULL;
    return refuse();
}
static llm_status op_kv_copy(void *kv, uint32_t dst, uint32_t src, uint32_t n) { return refuse(); }
static llm_status op_kv_read(void *kv, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                             void *dst) {
    return refuse();
}
static llm_status op_kv_write(void *kv, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                              const void *src) {
    return refuse();
}
static llm_status op_step_create(void *b, const llm_model *m, void *w, uint32_t rows, uint32_t ctx,
                                 void **out) {
    *out = NULL;
    return refuse();
}
MAYBE_UNUSED static llm_status op_step_run(void *step, void *kv, const llmi_step *st,
                                           float *logits) {
    return refuse();
}
static llm_status op_sync(void *b) { return refuse(); }

#if defined(FAKE_KIND_cpu)
#define FAKE_NAME "cpu"
#elif defined(FAKE_KIND_other)
#define FAKE_NAME "other"
#else
#define FAKE_NAME "cuda"
#endif

static const llmi_backend_ops table = {
#ifdef FAKE_KIND_version
    .version = 99,
#else
    .version = LLMI_BACKEND_VERSION,
#endif
    .name = FAKE_NAME,
#ifdef FAKE_KIND_probe
    .probe = probe_fails,
#endif
    .open = op_open,
    .close = op_close,
    .weights_load = op_weights_load,
    .weights_free = op_free,
    .kv_create = op_kv_create,
    .kv_free = op_free,
    .kv_copy = op_kv_copy,
    .kv_read = op_kv_read,
    .kv_write = op_kv_write,
    .step_create = op_step_create,
    .step_free = op_free,
#ifndef FAKE_KIND_missing
    .step_run = op_step_run,
#endif
    .sync = op_sync,
    .device_count = two_devices,
};

#ifdef FAKE_KIND_noentry
/* Exports something, so the file is a valid shared object. */
EXPORT uint32_t llmi_fake_plugin_without_entry(void) { return table.version; }
#else
EXPORT const llmi_backend_ops *llmi_backend_plugin_init(const llmi_plugin_host *h) {
    host = h;
#if defined(FAKE_KIND_null)
    (void)table;
    h->set_error(LLM_ERR_UNSUPPORTED, "fake plug-in: this core is too old for it");
    return NULL;
#else
#ifdef FAKE_KIND_probe
    char msg[64];
    snprintf(msg, sizeof msg, "fake plug-in: started (host version %u)", h->version);
    h->log(LLM_LOG_INFO, msg);
#endif
    return &table;
#endif
}
#endif
