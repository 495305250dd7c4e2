/* The backend registry, the weights shared between sessions, and the test
 * hook that injects backend failures. The registry knows nothing of
 * plug-ins: the loader (plugin.c) registers what it loads, and choosing a
 * backend by name, which may load one, is select.c, above both. */
#include "backend/backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

/* ---- registry ---- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static const llmi_backend_ops *registry[LLMI_BACKEND_MAX] = {&llmi_backend_cpu};
static size_t n_registered = 1;

static llm_status check_ops(const llmi_backend_ops *ops) {
    if (!ops || !ops->name || !*ops->name)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "backend table without a name");
    if (ops->version < LLMI_BACKEND_VERSION_MIN || ops->version > LLMI_BACKEND_VERSION)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "backend '%s' has interface version %u; this library takes %u to %u",
                          ops->name, ops->version, LLMI_BACKEND_VERSION_MIN, LLMI_BACKEND_VERSION);
    if (!ops->open || !ops->close || !ops->weights_load || !ops->weights_free || !ops->kv_create ||
        !ops->kv_free || !ops->kv_copy || !ops->kv_read || !ops->kv_write || !ops->step_create ||
        !ops->step_free || !ops->step_run || !ops->sync)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "backend '%s' lacks a required operation",
                          ops->name);
    return LLM_OK;
}

static size_t find_locked(const char *name) {
    for (size_t i = 0; i < n_registered; i++)
        if (strcmp(registry[i]->name, name) == 0)
            return i;
    return SIZE_MAX;
}

llm_status llmi_backend_register(const llmi_backend_ops *ops) {
    LLMI_TRY(check_ops(ops));
    llm_status st = LLM_OK;
    pthread_mutex_lock(&registry_lock);
    size_t i = find_locked(ops->name);
    if (i != SIZE_MAX)
        registry[i] = ops;
    else if (n_registered == LLMI_BACKEND_MAX)
        st = llmi_error(LLM_ERR_LIMIT, "at most %d backends can be registered", LLMI_BACKEND_MAX);
    else
        registry[n_registered++] = ops;
    pthread_mutex_unlock(&registry_lock);
    return st;
}

void llmi_backend_unregister(const char *name) {
    if (!name || strcmp(name, llmi_backend_cpu.name) == 0)
        return;
    pthread_mutex_lock(&registry_lock);
    size_t i = find_locked(name);
    if (i != SIZE_MAX) {
        memmove(registry + i, registry + i + 1, (n_registered - i - 1) * sizeof *registry);
        n_registered--;
    }
    pthread_mutex_unlock(&registry_lock);
}

size_t llmi_backend_list(const llmi_backend_ops **out, size_t cap) {
    pthread_mutex_lock(&registry_lock);
    size_t n = n_registered;
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = registry[i];
    pthread_mutex_unlock(&registry_lock);
    return n;
}

/* ---- weights shared by sessions ---- */

/* Loaded weights, a short list: a process holds a few models on a few
 * backends. */
typedef struct loaded_weights {
    const llmi_backend_ops *ops;
    const llm_model *model;
    int32_t device;
    uint32_t refs;
    void *weights;
    struct loaded_weights *next;
} loaded_weights;

static pthread_mutex_t weights_lock = PTHREAD_MUTEX_INITIALIZER;
static loaded_weights *weights_list;

static loaded_weights **weights_find(const llmi_backend_ops *ops, const llm_model *m,
                                     int32_t device) {
    loaded_weights **p = &weights_list;
    while (*p && !((*p)->ops == ops && (*p)->model == m && (*p)->device == device))
        p = &(*p)->next;
    return p;
}

llm_status llmi_backend_weights_acquire(const llmi_backend_ops *ops, const llm_model *m,
                                        int32_t device, void **out) {
    *out = NULL;
    /* Loading under the lock keeps two sessions from uploading one model
     * twice; loads are rare. */
    pthread_mutex_lock(&weights_lock);
    loaded_weights **p = weights_find(ops, m, device);
    llm_status st = LLM_OK;
    if (*p) {
        (*p)->refs++;
        *out = (*p)->weights;
    } else {
        loaded_weights *w = llmi_calloc(1, sizeof *w);
        if (!w) {
            st = llmi_oom("backend weights");
        } else if ((st = ops->weights_load(m, device, &w->weights)) != LLM_OK) {
            llmi_free(w);
        } else {
            w->ops = ops;
            w->model = m;
            w->device = device;
            w->refs = 1;
            *p = w; /* the list's end: w->next is NULL */
            *out = w->weights;
        }
    }
    pthread_mutex_unlock(&weights_lock);
    return st;
}

void llmi_backend_weights_release(const llmi_backend_ops *ops, const llm_model *m, int32_t device) {
    pthread_mutex_lock(&weights_lock);
    loaded_weights **p = weights_find(ops, m, device);
    loaded_weights *w = *p;
    if (w && --w->refs == 0) {
        *p = w->next;
        ops->weights_free(w->weights);
        llmi_free(w);
    }
    pthread_mutex_unlock(&weights_lock);
}

/* ---- fault injection (tests) ---- */

#ifdef LLMI_TEST_HOOKS
static _Atomic uint64_t fault_calls; /* backend calls since the last inject */
static _Atomic uint64_t fault_at;    /* the call that fails; 0 = none */
static _Atomic int fault_status = LLM_ERR_BACKEND;
static atomic_bool fault_late; /* a failing step fails after the backend ran */

static void fault_arm(uint64_t fail_at, llm_status status, bool late) {
    atomic_store(&fault_at, 0);
    atomic_store(&fault_status, (int)status);
    atomic_store(&fault_late, late);
    atomic_store(&fault_calls, 0);
    atomic_store(&fault_at, status == LLM_OK ? 0 : fail_at);
}

void llmi_backend_fault_inject(uint64_t fail_at, llm_status status) {
    fault_arm(fail_at, status, false);
}

void llmi_backend_fault_inject_late(uint64_t fail_at, llm_status status) {
    fault_arm(fail_at, status, true);
}

uint64_t llmi_backend_fault_calls(void) { return atomic_load(&fault_calls); }

llm_status llmi_backend_fault_check(bool *late) {
    uint64_t n = atomic_fetch_add(&fault_calls, 1) + 1;
    uint64_t at = atomic_load(&fault_at);
    if (at == 0 || n != at)
        return LLM_OK;
    /* Only the caller that disarms it fails, should two calls race. */
    if (!atomic_compare_exchange_strong(&fault_at, &at, 0))
        return LLM_OK;
    if (late && atomic_load(&fault_late)) {
        *late = true;
        return LLM_OK;
    }
    return llmi_backend_fault_late();
}

llm_status llmi_backend_fault_late(void) {
    return llmi_error((llm_status)atomic_load(&fault_status), "injected backend fault");
}
#else
llm_status llmi_backend_fault_check(bool *late) {
    (void)late;
    return LLM_OK;
}

llm_status llmi_backend_fault_late(void) { return LLM_OK; }
#endif
