/* NCCL through dlopen (nccl.h): its types come from the header, its code
 * from whichever libnccl.so.2 the machine has, resolved once. */
#include "nccl_comm.h"

#include <dlfcn.h>
#include <stdio.h>
/* nccl.h declares ncclGroupStart() without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct {
    void *lib;
    int version;
    ncclResult_t (*get_version)(int *);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*abort_)(ncclComm_t);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                              cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
} api;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static llm_status load_status;
static char load_message[512];

struct llmi_nccl_comm {
    ncclComm_t comm;
    uint32_t rank;
    int32_t device;
    bool failed; /* aborted, or an error seen: free aborts instead of destroying */
};

static void load(void) {
    const char *name = getenv("LLM_NCCL_LIBRARY");
    if (!name || !*name)
        name = "libnccl.so.2";
    api.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!api.lib) {
        const char *why = dlerror();
        snprintf(load_message, sizeof load_message,
                 "NCCL is needed for tensor parallelism on GPUs and could not be loaded: %s",
                 why ? why : name);
        load_status = LLM_ERR_UNSUPPORTED;
        return;
    }
    static const struct {
        const char *name;
        size_t offset;
    } entries[] = {
#define ENTRY(sym, field) {#sym, offsetof(__typeof__(api), field)}
        ENTRY(ncclGetVersion, get_version),
        ENTRY(ncclGetErrorString, error_string),
        ENTRY(ncclGetUniqueId, get_unique_id),
        ENTRY(ncclCommInitAll, init_all),
        ENTRY(ncclCommInitRankConfig, init_rank_config),
        ENTRY(ncclCommDestroy, destroy),
        ENTRY(ncclCommAbort, abort_),
        ENTRY(ncclCommGetAsyncError, async_error),
        ENTRY(ncclAllReduce, all_reduce),
        ENTRY(ncclAllGather, all_gather),
        ENTRY(ncclBroadcast, broadcast),
        ENTRY(ncclGroupStart, group_start),
        ENTRY(ncclGroupEnd, group_end),
#undef ENTRY
    };
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        void *fn = dlsym(api.lib, entries[i].name);
        if (!fn) {
            snprintf(load_message, sizeof load_message, "%s lacks %s (NCCL 2.14 or later is needed)",
                     name, entries[i].name);
            load_status = LLM_ERR_UNSUPPORTED;
            dlclose(api.lib);
            api.lib = NULL;
            return;
        }
        memcpy((char *)&api + entries[i].offset, &fn, sizeof fn);
    }
    if (api.get_version(&api.version) != ncclSuccess)
        api.version = 0;
    load_status = LLM_OK;
}

llm_status llmi_nccl_load(int *version) {
    pthread_once(&load_once, load);
    if (version)
        *version = api.version;
    if (load_status != LLM_OK)
        return llmi_cuda_error(load_status, "%s", load_message);
    return LLM_OK;
}

static const char *nccl_words(ncclResult_t r) {
    return api.error_string ? api.error_string(r) : "unknown NCCL error";
}

static llm_status nccl_fail(llmi_nccl_comm *c, ncclResult_t r, const char *what) {
    if (c)
        c->failed = true;
    return llmi_cuda_error(LLM_ERR_BACKEND, "NCCL: rank %u: %s: %s (error %d)",
                           c ? c->rank : 0u, what, nccl_words(r), (int)r);
}

llm_status llmi_nccl_comm_init_all(uint32_t n, const int32_t *devices, llmi_nccl_comm **out) {
    for (uint32_t r = 0; r < n; r++)
        out[r] = NULL;
    if (n == 0 || n > 64)
        return llmi_cuda_error(LLM_ERR_INVALID_ARGUMENT, "NCCL: %u ranks (1 to 64 are allowed)", n);
    llm_status st = llmi_nccl_load(NULL);
    if (st != LLM_OK)
        return st;
    ncclComm_t comms[64];
    int devs[64];
    for (uint32_t r = 0; r < n; r++)
        devs[r] = devices[r];
    ncclResult_t res = api.init_all(comms, (int)n, devs);
    if (res != ncclSuccess)
        return llmi_cuda_error(LLM_ERR_BACKEND,
                               "NCCL: creating the communicators of %u ranks on devices %d..%d "
                               "failed: %s (error %d)",
                               n, devs[0], devs[n - 1], nccl_words(res), (int)res);
    for (uint32_t r = 0; r < n; r++) {
        out[r] = calloc(1, sizeof *out[r]);
        if (!out[r]) {
            for (uint32_t k = 0; k < n; k++) {
                if (out[k])
                    free(out[k]);
                out[k] = NULL;
                api.destroy(comms[k]);
            }
            return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "NCCL: out of memory");
        }
        *out[r] = (llmi_nccl_comm){.comm = comms[r], .rank = r, .device = devs[r]};
    }
    return LLM_OK;
}

llm_status llmi_nccl_unique_id(uint8_t id[LLMI_NCCL_ID_BYTES]) {
    _Static_assert(sizeof(ncclUniqueId) == LLMI_NCCL_ID_BYTES, "NCCL id size");
    llm_status st = llmi_nccl_load(NULL);
    if (st != LLM_OK)
        return st;
    ncclUniqueId u;
    ncclResult_t res = api.get_unique_id(&u);
    if (res != ncclSuccess)
        return nccl_fail(NULL, res, "making the unique id (rank 0)");
    memcpy(id, u.internal, LLMI_NCCL_ID_BYTES);
    return LLM_OK;
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void nap(void) {
    struct timespec ts = {0, 200000}; /* 0.2 ms: collectives take microseconds */
    nanosleep(&ts, NULL);
}

llm_status llmi_nccl_comm_join(const uint8_t id[LLMI_NCCL_ID_BYTES], uint32_t rank,
                               uint32_t world, int32_t device, uint32_t timeout_ms,
                               llmi_nccl_comm **out) {
    *out = NULL;
    if (world == 0 || rank >= world)
        return llmi_cuda_error(LLM_ERR_INVALID_ARGUMENT,
                               "NCCL: rank %u of a world of %u ranks", rank, world);
    llm_status st = llmi_nccl_load(NULL);
    if (st != LLM_OK)
        return st;
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess)
        return llmi_cuda_error(LLM_ERR_BACKEND, "NCCL: rank %u of %u: device %d: %s (%s)", rank,
                               world, (int)device, cudaGetErrorString(err), cudaGetErrorName(err));
    llmi_nccl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return llmi_cuda_error(LLM_ERR_OUT_OF_MEMORY, "NCCL: out of memory");
    c->rank = rank;
    c->device = device;
    ncclUniqueId u;
    memcpy(u.internal, id, LLMI_NCCL_ID_BYTES);
    /* Non-blocking, so that a peer that never joins is a time-out, not a
     * hang. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t res = api.init_rank_config(&c->comm, (int)world, u, (int)rank, &config);
    uint64_t start = now_ms();
    while (res == ncclInProgress) {
        ncclResult_t state = ncclInProgress;
        res = api.async_error(c->comm, &state);
        if (res == ncclSuccess)
            res = state;
        if (res == ncclInProgress) {
            if (now_ms() - start > timeout_ms) {
                api.abort_(c->comm);
                free(c);
                return llmi_cuda_error(LLM_ERR_BACKEND,
                                       "NCCL: rank %u of %u: the other ranks did not join within "
                                       "%u ms",
                                       rank, world, timeout_ms);
            }
            nap();
        }
    }
    if (res != ncclSuccess) {
        if (c->comm)
            api.abort_(c->comm);
        free(c);
        return llmi_cuda_error(LLM_ERR_BACKEND, "NCCL: rank %u of %u: joining failed: %s (error %d)",
                               rank, world, nccl_words(res), (int)res);
    }
    *out = c;
    return LLM_OK;
}

uint32_t llmi_nccl_comm_rank(const llmi_nccl_comm *c) { return c->rank; }

void llmi_nccl_comm_free(llmi_nccl_comm *c) {
    if (!c)
        return;
    if (c->comm)
        (c->failed ? api.abort_ : api.destroy)(c->comm);
    free(c);
}

llm_status llmi_nccl_all_reduce(llmi_nccl_comm *c, const float *send, float *recv, size_t n,
                                cudaStream_t stream) {
    ncclResult_t res = api.all_reduce(send, recv, n, ncclFloat32, ncclSum, c->comm, stream);
    return res == ncclSuccess || res == ncclInProgress ? LLM_OK : nccl_fail(c, res, "all-reduce");
}

llm_status llmi_nccl_all_gather(llmi_nccl_comm *c, const float *send, float *recv, size_t n,
                                cudaStream_t stream) {
    ncclResult_t res = api.all_gather(send, recv, n, ncclFloat32, c->comm, stream);
    return res == ncclSuccess || res == ncclInProgress ? LLM_OK : nccl_fail(c, res, "all-gather");
}

llm_status llmi_nccl_broadcast(llmi_nccl_comm *c, const float *send, float *recv, size_t n,
                               uint32_t root, cudaStream_t stream) {
    ncclResult_t res = api.broadcast(send, recv, n, ncclFloat32, (int)root, c->comm, stream);
    return res == ncclSuccess || res == ncclInProgress ? LLM_OK : nccl_fail(c, res, "broadcast");
}

llm_status llmi_nccl_group_begin(void) {
    llm_status st = llmi_nccl_load(NULL);
    if (st != LLM_OK)
        return st;
    ncclResult_t res = api.group_start();
    return res == ncclSuccess ? LLM_OK : nccl_fail(NULL, res, "starting a group");
}

llm_status llmi_nccl_group_end(void) {
    ncclResult_t res = api.group_end();
    return res == ncclSuccess || res == ncclInProgress ? LLM_OK
                                                       : nccl_fail(NULL, res, "ending a group");
}

llm_status llmi_nccl_wait(llmi_nccl_comm *c, cudaStream_t stream, uint32_t timeout_ms) {
    uint64_t start = now_ms();
    for (;;) {
        cudaError_t err = cudaStreamQuery(stream);
        if (err == cudaSuccess)
            return LLM_OK;
        if (err != cudaErrorNotReady) {
            c->failed = true;
            return llmi_cuda_error(LLM_ERR_BACKEND, "NCCL: rank %u (device %d): %s (%s)", c->rank,
                                   (int)c->device, cudaGetErrorString(err), cudaGetErrorName(err));
        }
        ncclResult_t state = ncclSuccess;
        ncclResult_t res = api.async_error(c->comm, &state);
        if (res != ncclSuccess)
            return nccl_fail(c, res, "reading the communicator's state");
        if (state != ncclSuccess && state != ncclInProgress) {
            api.abort_(c->comm);
            c->comm = NULL;
            return nccl_fail(c, state, "a collective failed");
        }
        if (now_ms() - start > timeout_ms) {
            api.abort_(c->comm);
            c->comm = NULL;
            c->failed = true;
            return llmi_cuda_error(LLM_ERR_BACKEND,
                                   "NCCL: rank %u (device %d): a collective did not finish within "
                                   "%u ms (a peer is gone or stuck); the communicator was aborted",
                                   c->rank, (int)c->device, timeout_ms);
        }
        nap();
    }
}
