/* Choosing a backend by name (backend/backend.c, session/device.c) with
 * fake backends registered beside the CPU: each is the CPU backend under
 * another name, with its own probe and device count.
 *   - the list: registered backends in order, then known plug-ins that are
 *     not registered ("cuda"), with probe messages as reasons, the thread's
 *     last error untouched;
 *   - by name: an unavailable backend gives LLM_ERR_UNSUPPORTED with its
 *     reason; a registered "cuda" replaces the entry of the plug-in that is
 *     not loaded (this test disables plug-ins: LLM_PLUGIN_PATH=none);
 *   - "auto": the first available backend other than the CPU, each one
 *     skipped logged with why; the CPU when there is none;
 *   - a session created on a backend's device 1 opens that device;
 *   - tensor_parallel > 1 on a backend that offers groups (version 3's
 *     `group` entry) runs the table it returns, on the devices asked for
 *     (here the CPU ranks' table stands in for a GPU group); devices
 *     listed twice or missing, too few devices, and backends without
 *     groups are refused. */
#include "sched_util.h"

#include "backend/backend.h"
#include "backend/tp/tp.h"

static llm_model *g_model;

static llm_status probe_fails(void) {
    return llmi_error(LLM_ERR_UNSUPPORTED, "driver 1.0 is too old");
}

static llm_status count_zero(uint32_t *n) {
    *n = 0;
    return LLM_OK;
}

static llm_status count_two(uint32_t *n) {
    *n = 2;
    return LLM_OK;
}

static llm_status count_four(uint32_t *n) {
    *n = 4;
    return LLM_OK;
}

static int32_t g_opened_device = -1;

/* What the last call of group_cpu_ranks was asked for. */
static uint32_t g_group_ranks;
static int32_t g_group_devices[8];
static llm_status g_group_status = LLM_OK;

static llm_status group_cpu_ranks(uint32_t n_ranks, const int32_t *devices,
                                  const llmi_backend_ops **out) {
    *out = NULL;
    g_group_ranks = n_ranks;
    memcpy(g_group_devices, devices, n_ranks * sizeof *devices);
    if (g_group_status != LLM_OK)
        return llmi_error(g_group_status, "the group's devices cannot reach each other");
    *out = llmi_backend_tp(n_ranks);
    return LLM_OK;
}

/* Devices of the fake backends are all the CPU's device 0 underneath. */
static llm_status open_recording(const llmi_backend_config *cfg, void **out) {
    g_opened_device = cfg->device;
    llmi_backend_config cpu = *cfg;
    cpu.device = 0;
    return llmi_backend_cpu.open(&cpu, out);
}

static llm_status weights_load_any(const llm_model *m, int32_t device, void **out) {
    (void)device;
    return llmi_backend_cpu.weights_load(m, 0, out);
}

static llmi_backend_ops fake(const char *name, llm_status (*probe)(void),
                             llm_status (*count)(uint32_t *)) {
    llmi_backend_ops ops = llmi_backend_cpu;
    ops.name = name;
    ops.probe = probe;
    ops.device_count = count;
    ops.open = open_recording;
    ops.weights_load = weights_load_any;
    return ops;
}

static llmi_backend_ops g_broken, g_empty, g_two, g_v1, g_cuda, g_quad;

static char g_log[4096];

/* Why "cuda" is unavailable while no plug-in is loaded. */
#define NO_CUDA "the CUDA plug-in was not looked for: plug-ins are disabled (LLM_PLUGIN_PATH=none)"

static void log_sink(llm_log_level level, const char *message, void *user) {
    (void)user;
    size_t len = strlen(g_log);
    if (level == LLM_LOG_INFO)
        snprintf(g_log + len, sizeof g_log - len, "%s\n", message);
}

static void check_state(size_t i, const char *name, bool available, uint32_t n_devices,
                        const char *reason) {
    llmi_backend_state st;
    assert_int_equal(llmi_backend_state_get(i, &st), LLM_OK);
    assert_string_equal(st.name, name);
    assert_int_equal(st.available, available);
    assert_int_equal(st.n_devices, n_devices);
    assert_string_equal(st.reason, reason);
}

static void test_list(void **state) {
    (void)state;
    assert_int_equal(llmi_backend_state_count(), 2);
    check_state(0, "cpu", true, 1, "");
    check_state(1, "cuda", false, 0, NO_CUDA);
    assert_int_equal(llmi_backend_register(&g_broken), LLM_OK);
    assert_int_equal(llmi_backend_register(&g_empty), LLM_OK);
    assert_int_equal(llmi_backend_register(&g_v1), LLM_OK);
    llmi_error(LLM_ERR_IO, "an earlier failure");
    assert_int_equal(llmi_backend_state_count(), 5);
    check_state(0, "cpu", true, 1, "");
    check_state(1, "broken", false, 0, "driver 1.0 is too old");
    check_state(2, "empty", false, 0, "no device found");
    check_state(3, "v1", true, 1, ""); /* a version 1 table: device_count not read */
    check_state(4, "cuda", false, 0, NO_CUDA);
    llmi_backend_state st;
    assert_int_equal(llmi_backend_state_get(5, &st), LLM_ERR_NOT_FOUND);
    assert_int_equal(llmi_backend_register(&g_cuda), LLM_OK);
    assert_int_equal(llmi_backend_state_count(), 5); /* "cuda" is now registered */
    check_state(4, "cuda", true, 2, "");
    llmi_backend_unregister("cuda");
    llmi_backend_unregister("broken");
    llmi_backend_unregister("empty");
    llmi_backend_unregister("v1");
    assert_int_equal(llmi_backend_state_count(), 2);
}

static void test_list_keeps_error(void **state) {
    (void)state;
    assert_int_equal(llmi_backend_register(&g_broken), LLM_OK);
    llmi_error(LLM_ERR_IO, "an earlier failure");
    llmi_backend_state st;
    for (size_t i = 0; i < llmi_backend_state_count(); i++)
        assert_int_equal(llmi_backend_state_get(i, &st), LLM_OK);
    assert_string_equal(llmi_error_message(), "an earlier failure");
    llmi_backend_unregister("broken");
}

static void expect_unsupported(const char *name, const char *text) {
    const llmi_backend_ops *ops = &llmi_backend_cpu;
    uint32_t n = 7;
    assert_int_equal(llmi_backend_select(name, &ops, &n), LLM_ERR_UNSUPPORTED);
    assert_null(ops);
    assert_int_equal(n, 0);
    if (!strstr(llmi_error_message(), text))
        fail_msg("'%s' does not say '%s'", llmi_error_message(), text);
}

static void test_by_name(void **state) {
    (void)state;
    assert_int_equal(llmi_backend_register(&g_broken), LLM_OK);
    assert_int_equal(llmi_backend_register(&g_empty), LLM_OK);
    assert_int_equal(llmi_backend_register(&g_two), LLM_OK);
    const llmi_backend_ops *ops;
    uint32_t n;
    assert_int_equal(llmi_backend_select(NULL, &ops, &n), LLM_OK);
    assert_ptr_equal(ops, &llmi_backend_cpu);
    assert_int_equal(n, 1);
    assert_int_equal(llmi_backend_select("", &ops, &n), LLM_OK);
    assert_ptr_equal(ops, &llmi_backend_cpu);
    assert_int_equal(llmi_backend_select("two", &ops, &n), LLM_OK);
    assert_ptr_equal(ops, &g_two);
    assert_int_equal(n, 2);
    expect_unsupported("broken", "backend 'broken' is not available: driver 1.0 is too old");
    expect_unsupported("empty", "backend 'empty' is not available: no device found");
    expect_unsupported("cuda", "backend 'cuda' is not available: " NO_CUDA);
    expect_unsupported("nope", "no backend named 'nope'; the backends are 'cpu', 'broken', "
                               "'empty', 'two', 'cuda' (not loaded), or 'auto'");
    llmi_backend_unregister("broken");
    llmi_backend_unregister("empty");
    llmi_backend_unregister("two");
}

static void test_auto(void **state) {
    (void)state;
    const llmi_backend_ops *ops;
    uint32_t n;
    llm_log_set(log_sink, LLM_LOG_INFO, NULL);

    g_log[0] = '\0';
    assert_int_equal(llmi_backend_select("auto", &ops, &n), LLM_OK);
    assert_ptr_equal(ops, &llmi_backend_cpu);
    assert_string_equal(g_log, "backend 'auto' skipped 'cuda': " NO_CUDA "\n"
                               "backend 'auto' chose 'cpu'\n");

    assert_int_equal(llmi_backend_register(&g_broken), LLM_OK);
    assert_int_equal(llmi_backend_register(&g_empty), LLM_OK);
    g_log[0] = '\0';
    assert_int_equal(llmi_backend_select("auto", &ops, &n), LLM_OK);
    assert_ptr_equal(ops, &llmi_backend_cpu);
    assert_non_null(strstr(g_log, "skipped 'broken': driver 1.0 is too old\n"));
    assert_non_null(strstr(g_log, "skipped 'empty': no device found\n"));

    assert_int_equal(llmi_backend_register(&g_two), LLM_OK);
    g_log[0] = '\0';
    assert_int_equal(llmi_backend_select("auto", &ops, &n), LLM_OK);
    assert_ptr_equal(ops, &g_two);
    assert_int_equal(n, 2);
    assert_non_null(strstr(g_log, "backend 'auto' chose 'two' (2 devices)"));

    llm_log_set(NULL, LLM_LOG_INFO, NULL);
    llmi_backend_unregister("broken");
    llmi_backend_unregister("empty");
    llmi_backend_unregister("two");
}

static llm_session *create(const llm_device_params *d, llm_status want) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 1;
    p.n_ctx = 64;
    p.kv_cache_bytes = 1u << 20;
    llmi_session_device dev = {NULL, -1};
    llm_status st = llmi_session_device_resolve(d, &dev);
    llm_session *s = NULL;
    if (st == LLM_OK)
        st = llmi_session_create_on(g_model, &p, &dev, &s);
    if (st != want)
        fail_msg("%s (%s), expected %s", llm_status_name(st), llmi_error_message(),
                 llm_status_name(want));
    return s;
}

static void test_session_on_device(void **state) {
    (void)state;
    assert_int_equal(llmi_backend_register(&g_two), LLM_OK);
    llm_device_params d;
    llm_device_params_init(&d);
    d.backend = "two";
    int32_t id = 1;
    d.devices = &id;
    d.n_devices = 1;
    g_opened_device = -1;
    llm_session *s = create(&d, LLM_OK);
    assert_int_equal(g_opened_device, 1);
    assert_ptr_equal(s->eng->ops, &g_two);
    assert_int_equal(s->eng->device, 1);
    llmi_session_free(s);
    id = 2;
    assert_null(create(&d, LLM_ERR_INVALID_ARGUMENT));
    assert_non_null(
        strstr(llmi_error_message(), "backend 'two' has no device 2 (it has 2, ids 0 to 1)"));
    d.backend = "auto";
    id = 0;
    s = create(&d, LLM_OK);
    assert_ptr_equal(s->eng->ops, &g_two);
    assert_int_equal(g_opened_device, 0);
    llmi_session_free(s);
    llmi_backend_unregister("two");
    s = create(&d, LLM_OK); /* auto: the CPU again */
    assert_ptr_equal(s->eng->ops, &llmi_backend_cpu);
    llmi_session_free(s);
}

/* One decode step of a 3-token prompt on `s`, and its last row's logits. */
static void decode_prompt(llm_session *s, float *logits, uint32_t n_vocab) {
    llm_seq_id seq;
    assert_int_equal(llm_seq_open(s, &seq), LLM_OK);
    llm_batch *b = NULL;
    assert_int_equal(llm_batch_create(4, &b), LLM_OK);
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(llm_batch_add(b, seq, i, (llm_token)(5 + 7 * i), i == 2), LLM_OK);
    assert_int_equal(llm_session_decode(s, b), LLM_OK);
    const float *row = NULL;
    assert_int_equal(llm_session_logits(s, 2, &row), LLM_OK);
    memcpy(logits, row, n_vocab * sizeof *logits);
    llm_batch_free(b);
    assert_int_equal(llm_seq_close(s, seq), LLM_OK);
}

static void expect_refused(const llm_device_params *d, llm_status want, const char *text) {
    assert_null(create(d, want));
    if (!strstr(llmi_error_message(), text))
        fail_msg("'%s' does not say '%s'", llmi_error_message(), text);
}

static void test_groups(void **state) {
    (void)state;
    assert_int_equal(llmi_backend_register(&g_quad), LLM_OK);
    const uint32_t n_vocab = g_model->hp.n_vocab;
    float *want = malloc(n_vocab * sizeof *want), *got = malloc(n_vocab * sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    llm_device_params d;
    llm_device_params_init(&d);
    d.backend = "quad";
    llm_session *s = create(&d, LLM_OK); /* tensor_parallel 1: the backend itself */
    assert_ptr_equal(s->eng->ops, &g_quad);
    decode_prompt(s, want, n_vocab);
    llmi_session_free(s);

    /* Devices 0 .. N-1 by default; the group's table runs the session on
     * its "device" 0. */
    d.tensor_parallel = 2;
    g_group_ranks = 0;
    s = create(&d, LLM_OK);
    assert_int_equal(g_group_ranks, 2);
    assert_int_equal(g_group_devices[0], 0);
    assert_int_equal(g_group_devices[1], 1);
    assert_ptr_equal(s->eng->ops, llmi_backend_tp(2));
    assert_int_equal(s->eng->device, 0);
    decode_prompt(s, got, n_vocab);
    /* The CPU ranks standing in for the group are exact. */
    assert_memory_equal(got, want, n_vocab * sizeof *got);
    llmi_session_free(s);

    /* The caller's devices, in the caller's order; "auto" picks the
     * backend with groups too. */
    int32_t ids[4] = {3, 1, 0, 2};
    d.devices = ids;
    d.n_devices = 4;
    d.tensor_parallel = 4;
    d.backend = "auto";
    s = create(&d, LLM_OK);
    assert_int_equal(g_group_ranks, 4);
    assert_memory_equal(g_group_devices, ids, sizeof ids);
    assert_ptr_equal(s->eng->ops, llmi_backend_tp(4));
    llmi_session_free(s);

    d.backend = "quad";
    ids[2] = 1;
    expect_refused(&d, LLM_ERR_INVALID_ARGUMENT, "device 1 is listed twice");
    ids[2] = 4;
    expect_refused(&d, LLM_ERR_INVALID_ARGUMENT, "backend 'quad' has no device 4");
    ids[2] = -1;
    expect_refused(&d, LLM_ERR_INVALID_ARGUMENT, "no device -1");
    d.devices = NULL;
    d.n_devices = 0;
    d.tensor_parallel = 5;
    expect_refused(&d, LLM_ERR_UNSUPPORTED, "needs 5 devices; it has 4");
    /* "auto" runs CPU ranks instead (the model is checked when it loads). */
    d.backend = "auto";
    llmi_session_device dev = {NULL, -1};
    assert_int_equal(llmi_session_device_resolve(&d, &dev), LLM_OK);
    assert_ptr_equal(dev.ops, llmi_backend_tp(5));
    d.backend = "quad";
    /* The group entry's own failure comes back as it said it. */
    d.tensor_parallel = 2;
    g_group_status = LLM_ERR_BACKEND;
    expect_refused(&d, LLM_ERR_BACKEND, "cannot reach each other");
    g_group_status = LLM_OK;

    /* A backend without groups keeps refusing; "auto" falls back to CPU
     * ranks when what it picks has none. */
    llmi_backend_unregister("quad");
    assert_int_equal(llmi_backend_register(&g_two), LLM_OK);
    d.backend = "two";
    expect_refused(&d, LLM_ERR_UNSUPPORTED, "backend 'two' does not split a model");
    d.backend = "auto";
    s = create(&d, LLM_OK);
    assert_ptr_equal(s->eng->ops, llmi_backend_tp(2));
    llmi_session_free(s);
    llmi_backend_unregister("two");
    free(want);
    free(got);
}

static int setup(void **state) {
    (void)state;
    g_model = tiny_model(64, 99);
    g_broken = fake("broken", probe_fails, NULL);
    g_empty = fake("empty", NULL, count_zero);
    g_two = fake("two", NULL, count_two);
    g_v1 = fake("v1", NULL, count_zero);
    g_v1.version = 1;
    g_cuda = fake("cuda", NULL, count_two);
    g_quad = fake("quad", NULL, count_four);
    g_quad.group = group_cpu_ranks;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_model);
    return 0;
}

int main(void) {
    setenv("LLM_PLUGIN_PATH", "none", 1); /* the backends are the ones registered here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_list_keeps_error),
        cmocka_unit_test(test_by_name),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_session_on_device),
        cmocka_unit_test(test_groups),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
