/* The CUDA plug-in's entry refuses a core of another release; its NCCL
 * communicator (cuda/nccl_comm.c), on a machine with or without a GPU:
 *   - NCCL loads through dlopen and its entry points resolve; a missing
 *     library is LLM_ERR_UNSUPPORTED naming the file (in a child process:
 *     loading happens once per process);
 *   - without a GPU, creating communicators and joining fail with
 *     LLM_ERR_BACKEND and a message naming the rank, promptly;
 *   - with one GPU, a one-rank communicator's all-reduce, all-gather and
 *     broadcast return the input, and waiting on them succeeds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern "C" {
#include <cmocka.h>
}
#include <cuda_runtime.h>

#include "nccl_comm.h"

/* The plug-in's entry (cuda/plugin.c) takes the host's services; this test
 * is the host and keeps the last message. */
struct host_services {
    uint32_t version;
    uint32_t release;
    llm_status (*set_error)(llm_status status, const char *message);
    void (*log)(llm_log_level level, const char *message);
};
extern "C" const void *llmi_backend_plugin_init(const host_services *host);

static char last_message[1024];
static llm_status record(llm_status status, const char *message) {
    snprintf(last_message, sizeof last_message, "%s", message);
    return status;
}
static void quiet(llm_log_level, const char *) {}
static const host_services host = {1, LLM_VERSION_NUMBER, record, quiet};

/* A plug-in reads the core's structs: it refuses a core of another
 * release, saying which. */
static void test_release_mismatch(void **state) {
    (void)state;
    const host_services older = {1, LLM_VERSION_NUMBER - 1, record, quiet};
    last_message[0] = 0;
    assert_null(llmi_backend_plugin_init(&older));
    assert_non_null(strstr(last_message, "install the plug-in of the library's own release"));
    assert_non_null(llmi_backend_plugin_init(&host));
}

static bool have_gpu(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static void test_load(void **state) {
    (void)state;
    int version = 0;
    assert_int_equal(llmi_nccl_load(&version), LLM_OK);
    printf("NCCL %d\n", version);
    assert_true(version >= 21400);
}

static void test_missing_library(void **state) {
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("LLM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
        last_message[0] = 0;
        llm_status st = llmi_nccl_load(NULL);
        bool ok = st == LLM_ERR_UNSUPPORTED && strstr(last_message, "could not be loaded") &&
                  strstr(last_message, "/nonexistent/libnccl.so.2");
        if (!ok)
            fprintf(stderr, "status %d, message '%s'\n", (int)st, last_message);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_bad_arguments(void **state) {
    (void)state;
    llmi_nccl_comm *comm[2] = {(llmi_nccl_comm *)1, (llmi_nccl_comm *)1};
    assert_int_equal(llmi_nccl_comm_init_all(0, NULL, comm), LLM_ERR_INVALID_ARGUMENT);
    uint8_t id[LLMI_NCCL_ID_BYTES] = {0};
    llmi_nccl_comm *one = (llmi_nccl_comm *)1;
    assert_int_equal(llmi_nccl_comm_join(id, 2, 2, 0, 100, &one), LLM_ERR_INVALID_ARGUMENT);
    assert_null(one);
    assert_non_null(strstr(last_message, "rank 2 of a world of 2"));
    llmi_nccl_comm_free(NULL);
}

static void test_without_gpu(void **state) {
    (void)state;
    if (have_gpu())
        skip();
    int32_t devices[2] = {0, 1};
    llmi_nccl_comm *comm[2] = {NULL, NULL};
    last_message[0] = 0;
    assert_int_equal(llmi_nccl_comm_init_all(2, devices, comm), LLM_ERR_BACKEND);
    assert_null(comm[0]);
    assert_null(comm[1]);
    assert_non_null(strstr(last_message, "NCCL"));
    printf("init_all: %s\n", last_message);
    uint8_t id[LLMI_NCCL_ID_BYTES] = {0};
    llmi_nccl_comm *one = NULL;
    last_message[0] = 0;
    assert_int_equal(llmi_nccl_comm_join(id, 0, 2, 0, 200, &one), LLM_ERR_BACKEND);
    assert_null(one);
    assert_non_null(strstr(last_message, "rank 0 of 2"));
    printf("join: %s\n", last_message);
}

static void test_one_gpu(void **state) {
    (void)state;
    if (!have_gpu())
        skip();
    int32_t device = 0;
    llmi_nccl_comm *comm = NULL;
    assert_int_equal(llmi_nccl_comm_init_all(1, &device, &comm), LLM_OK);
    enum { N = 1000 };
    float host_in[N], host_out[N];
    for (int i = 0; i < N; i++)
        host_in[i] = (float)i * 0.5f - 7.0f;
    float *in = NULL, *out = NULL;
    assert_int_equal(cudaMalloc(&in, sizeof host_in), cudaSuccess);
    assert_int_equal(cudaMalloc(&out, sizeof host_in), cudaSuccess);
    cudaStream_t stream;
    assert_int_equal(cudaStreamCreate(&stream), cudaSuccess);
    assert_int_equal(cudaMemcpy(in, host_in, sizeof host_in, cudaMemcpyHostToDevice), cudaSuccess);
    for (int op = 0; op < 3; op++) {
        assert_int_equal(cudaMemset(out, 0, sizeof host_in), cudaSuccess);
        llm_status st = op == 0   ? llmi_nccl_all_reduce(comm, in, out, N, stream)
                        : op == 1 ? llmi_nccl_all_gather(comm, in, out, N, stream)
                                  : llmi_nccl_broadcast(comm, in, out, N, 0, stream);
        assert_int_equal(st, LLM_OK);
        assert_int_equal(llmi_nccl_wait(comm, stream, 10000), LLM_OK);
        assert_int_equal(cudaMemcpy(host_out, out, sizeof host_out, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        assert_memory_equal(host_out, host_in, sizeof host_in);
    }
    cudaStreamDestroy(stream);
    cudaFree(in);
    cudaFree(out);
    llmi_nccl_comm_free(comm);
}

int main(void) {
    llmi_backend_plugin_init(&host);
    const struct CMUnitTest tests[] = {
        /* First: the child must start before this process loads NCCL. */
        cmocka_unit_test(test_missing_library), cmocka_unit_test(test_load),
        cmocka_unit_test(test_bad_arguments), cmocka_unit_test(test_without_gpu),
        cmocka_unit_test(test_release_mismatch),
        cmocka_unit_test(test_one_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
