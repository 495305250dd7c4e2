/* The plug-in loader (backend/plugin.c), with fake plug-ins
 * (tests/plugins/fake_plugin.c, built into $LLM_TEST_PLUGINS) and, when it
 * was built, the real CUDA plug-in ($LLM_TEST_CUDA_PLUGIN):
 *   - llmi_backend_plugin_load: every bad file gives its status and a
 *     message naming the file and what failed, and leaves nothing
 *     registered or loaded (dlopen RTLD_NOLOAD finds no trace of it);
 *   - a plug-in that loads is listed by llm_backend_get_info with its
 *     probe's verdict; a session on it fails with the probe's message and
 *     "auto" falls back to the CPU, logging why;
 *   - the search at first use (LLM_PLUGIN_PATH files, folders, lists,
 *     "none"; not installed), run in child processes of this program
 *     because it happens once per process: the "cuda" entry of
 *     llm_backend_get_info, and a session on "cuda", say why.
 * This process sets LLM_PLUGIN_PATH=none first, so its own search loads
 * nothing and the plug-ins it sees are those it loads. */
#include "sched_util.h"

#include "backend/backend.h"
#include "backend/plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static llm_model *g_model;
static char g_fakes[512];       /* folder of the fake plug-ins */
static char g_cuda_plugin[512]; /* the real plug-in; "" when not built */
static char g_search_path[512]; /* LLM_PLUGIN_PATH as the test runner set it */
static char g_tmp[512];

static char g_log[8192];

static void log_sink(llm_log_level level, const char *message, void *user) {
    (void)user;
    size_t len = strlen(g_log);
    if (level >= LLM_LOG_INFO)
        snprintf(g_log + len, sizeof g_log - len, "%s\n", message);
}

static void fake(const char *kind, char *out, size_t cap) {
    snprintf(out, cap, "%s/fake_%s.so", g_fakes, kind);
}

static void expect_text(const char *text, const char *part) {
    if (!strstr(text, part))
        fail_msg("'%s' does not say '%s'", text, part);
}

/* The "cuda" entry of the public backend list. */
static llm_backend_info cuda_info(void) {
    for (size_t i = 0; i < llm_backend_count(); i++) {
        llm_backend_info info = {sizeof info};
        assert_int_equal(llm_backend_get_info(i, &info), LLM_OK);
        if (strcmp(info.name, "cuda") == 0)
            return info;
    }
    fail_msg("'cuda' is not listed");
    return (llm_backend_info){0};
}

static llm_status create_on(const char *backend, llm_session **out) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.n_threads = 1;
    p.n_ctx = 64;
    p.kv_cache_bytes = 1u << 20;
    llm_device_params d;
    llm_device_params_init(&d);
    d.backend = backend;
    return llm_session_create_ex(g_model, &p, &d, out);
}

/* A session on "cuda" fails with the reason the list gives; "auto" runs on
 * the CPU and logs that it skipped "cuda" for that reason. */
static void expect_cuda_unusable(const char *reason) {
    llm_session *s = (llm_session *)&g_model;
    assert_int_equal(create_on("cuda", &s), LLM_ERR_UNSUPPORTED);
    assert_null(s);
    char want[512];
    snprintf(want, sizeof want, "backend 'cuda' is not available: %s", reason);
    assert_string_equal(llm_last_error(), want);

    g_log[0] = '\0';
    llm_log_set(log_sink, LLM_LOG_INFO, NULL);
    llm_status st = create_on("auto", &s);
    llm_log_set(NULL, LLM_LOG_INFO, NULL);
    assert_int_equal(st, LLM_OK);
    assert_ptr_equal(s->eng->ops, &llmi_backend_cpu);
    llm_session_free(s);
    snprintf(want, sizeof want, "backend 'auto' skipped 'cuda': %s\n", reason);
    expect_text(g_log, want);
    expect_text(g_log, "backend 'auto' chose 'cpu'\n");
}

static size_t n_registered(void) {
    const llmi_backend_ops *ops[LLMI_BACKEND_MAX];
    return llmi_backend_list(ops, LLMI_BACKEND_MAX);
}

/* ---- llmi_backend_plugin_load ---- */

static void expect_load_fails(const char *path, llm_status want, const char *what) {
    llmi_error(LLM_ERR_IO, "an earlier failure");
    llm_status st = llmi_backend_plugin_load(path);
    printf("%s: %s: %s\n", path ? path : "(null)", llm_status_name(st), llmi_error_message());
    assert_int_equal(st, want);
    if (path && *path)
        expect_text(llmi_error_message(), path);
    expect_text(llmi_error_message(), what);
    assert_int_equal(n_registered(), 1);
    assert_null(llmi_backend_find("cuda"));
    if (path && *path && strchr(path, '/'))
        assert_null(dlopen(path, RTLD_NOW | RTLD_NOLOAD)); /* closed again */
}

static void test_load_failures(void **state) {
    (void)state;
    char path[600];
    fake("version", path, sizeof path);
    char want[128];
    snprintf(want, sizeof want,
             "backend 'cuda' has interface version 99; this library takes %d to %d",
             LLMI_BACKEND_VERSION_MIN, LLMI_BACKEND_VERSION);
    expect_load_fails(path, LLM_ERR_UNSUPPORTED, want);
    fake("noentry", path, sizeof path);
    expect_load_fails(path, LLM_ERR_BAD_FORMAT,
                      "has no entry point llmi_backend_plugin_init: it is not a libllminfer "
                      "plug-in");
    fake("null", path, sizeof path);
    expect_load_fails(path, LLM_ERR_UNSUPPORTED,
                      "refused to start: fake plug-in: this core is too old for it");
    fake("missing", path, sizeof path);
    expect_load_fails(path, LLM_ERR_INVALID_ARGUMENT, "backend 'cuda' lacks a required operation");
    fake("cpu", path, sizeof path);
    expect_load_fails(path, LLM_ERR_UNSUPPORTED, "holds a backend named 'cpu'");

    snprintf(path, sizeof path, "%s/not-a-plugin.so", g_tmp);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("this text file is no shared object, whatever its name says\n", f);
    fclose(f);
    expect_load_fails(path, LLM_ERR_UNSUPPORTED, "cannot be loaded: ");
    remove(path);

    snprintf(path, sizeof path, "%s/absent-plugin.so", g_tmp);
    expect_load_fails(path, LLM_ERR_NOT_FOUND, "No such file or directory");
    /* A bare name goes to the dynamic loader, which says what it missed. */
    expect_load_fails("libllminfer-absent-plugin.so", LLM_ERR_UNSUPPORTED,
                      "cannot open shared object file");
    expect_load_fails(NULL, LLM_ERR_INVALID_ARGUMENT, "plug-in path is NULL or empty");
    expect_load_fails("", LLM_ERR_INVALID_ARGUMENT, "plug-in path is NULL or empty");
}

/* A plug-in whose probe fails: listed, unavailable with its message. */
static void test_load_probe_fails(void **state) {
    (void)state;
    char path[600];
    fake("probe", path, sizeof path);
    g_log[0] = '\0';
    llm_log_set(log_sink, LLM_LOG_INFO, NULL);
    assert_int_equal(llmi_backend_plugin_load(path), LLM_OK);
    llm_log_set(NULL, LLM_LOG_INFO, NULL);
    /* Its entry logged through the host services. */
    expect_text(g_log, "fake plug-in: started (host version 1)\n");
    const llmi_backend_ops *ops = llmi_backend_find("cuda");
    assert_non_null(ops);
    assert_int_equal(n_registered(), 2);

    llm_backend_info info = cuda_info();
    assert_false(info.available);
    assert_int_equal(info.n_devices, 0);
    assert_string_equal(info.reason, "fake probe: no fake device in this machine");
    expect_cuda_unusable(info.reason);

    /* Loading it again registers the same table once. */
    assert_int_equal(llmi_backend_plugin_load(path), LLM_OK);
    assert_ptr_equal(llmi_backend_find("cuda"), ops);
    assert_int_equal(n_registered(), 2);

    llmi_backend_unregister("cuda");
    info = cuda_info(); /* listed again as not loaded, with this process's reason */
    assert_false(info.available);
    expect_text(info.reason, "LLM_PLUGIN_PATH=none");
}

/* A plug-in that is available: "auto" picks it. Any name loads through
 * llmi_backend_plugin_load, but "cpu". */
static void test_load_available(void **state) {
    (void)state;
    char path[600];
    fake("ok", path, sizeof path);
    assert_int_equal(llmi_backend_plugin_load(path), LLM_OK);
    llm_backend_info info = cuda_info();
    assert_true(info.available);
    assert_int_equal(info.n_devices, 2);
    assert_string_equal(info.reason, "");
    const llmi_backend_ops *ops = NULL;
    uint32_t n = 0;
    assert_int_equal(llmi_backend_select("auto", &ops, &n), LLM_OK);
    assert_ptr_equal(ops, llmi_backend_find("cuda"));
    assert_int_equal(n, 2);

    fake("other", path, sizeof path);
    assert_int_equal(llmi_backend_plugin_load(path), LLM_OK);
    assert_non_null(llmi_backend_find("other"));
    assert_int_equal(n_registered(), 3);
    llmi_backend_unregister("other");
    llmi_backend_unregister("cuda");
    assert_int_equal(n_registered(), 1);
}

static bool probe_reason(const char *reason) {
    static const char *const probe_says[] = {
        "no CUDA driver: ", "no CUDA device: ", "the CUDA driver supports CUDA ",
        "CUDA could not list devices: "};
    for (size_t i = 0; i < sizeof probe_says / sizeof *probe_says; i++)
        if (strncmp(reason, probe_says[i], strlen(probe_says[i])) == 0)
            return true;
    return false;
}

/* The real plug-in loads and tells whether this machine has a GPU. */
static void test_load_cuda(void **state) {
    (void)state;
    if (!g_cuda_plugin[0])
        skip(); /* built with CUDA=0, or no nvcc */
    assert_int_equal(llmi_backend_plugin_load(g_cuda_plugin), LLM_OK);
    llm_backend_info info = cuda_info();
    printf("cuda: %s, %u device(s)%s%s\n", info.available ? "available" : "unavailable",
           info.n_devices, info.available ? "" : ": ", info.reason);
    if (info.available) {
        assert_true(info.n_devices >= 1);
    } else {
        if (!probe_reason(info.reason))
            fail_msg("'%s' is not the CUDA probe's message", info.reason);
        expect_cuda_unusable(info.reason);
    }
    llmi_backend_unregister("cuda");
}

/* ---- the search at first use, in child processes ---- */

typedef struct {
    llm_backend_info cuda;
    char select[1024]; /* a session on "cuda": status name and message */
} child_view;

/* The child: prints the "cuda" entry of the list and what selecting it
 * gives, one tab-separated line each. */
static int child_main(void) {
    llm_backend_info info = cuda_info();
    printf("cuda\t%d\t%u\t%s\n", (int)info.available, info.n_devices, info.reason);
    const llmi_backend_ops *ops = NULL;
    uint32_t n = 0;
    llm_status st = llmi_backend_select("cuda", &ops, &n);
    printf("select\t%s\t%s\n", llm_status_name(st), st == LLM_OK ? "" : llmi_error_message());
    return 0;
}

/* Runs this program as a child with LLM_PLUGIN_PATH = `search` (NULL:
 * unset) and no LD_LIBRARY_PATH, and reads what it printed. */
static child_view run_child(const char *search) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        if (search)
            setenv("LLM_PLUGIN_PATH", search, 1);
        else
            unsetenv("LLM_PLUGIN_PATH");
        unsetenv("LD_LIBRARY_PATH");
        execl("/proc/self/exe", "test_plugins", "--child", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char out[4096];
    size_t len = 0;
    ssize_t r;
    while ((r = read(fds[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)r;
    out[len] = '\0';
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    printf("LLM_PLUGIN_PATH=%s:\n%s", search ? search : "(unset)", out);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the child failed (status %d)", status);
    child_view v = {{sizeof v.cuda}, ""};
    char *line2 = strstr(out, "\nselect\t");
    assert_non_null(line2);
    *line2 = '\0';
    int available = -1;
    int consumed = 0;
    assert_int_equal(sscanf(out, "cuda\t%d\t%u\t%n", &available, &v.cuda.n_devices, &consumed), 2);
    v.cuda.available = available == 1;
    snprintf(v.cuda.reason, sizeof v.cuda.reason, "%s", out + consumed);
    snprintf(v.select, sizeof v.select, "%s", line2 + strlen("\nselect\t"));
    char *nl = strchr(v.select, '\n');
    if (nl)
        *nl = '\0';
    return v;
}

/* The child could not use "cuda", for a reason that says `what`. */
static child_view expect_child_reason(const char *search, const char *what) {
    child_view v = run_child(search);
    assert_false(v.cuda.available);
    expect_text(v.cuda.reason, what);
    expect_text(v.select, "LLM_ERR_UNSUPPORTED\tbackend 'cuda' is not available: ");
    expect_text(v.select, what);
    return v;
}

static void test_search_files(void **state) {
    (void)state;
    char path[600];
    fake("probe", path, sizeof path);
    child_view v = expect_child_reason(path, "fake probe: no fake device in this machine");
    assert_string_equal(v.cuda.reason, "fake probe: no fake device in this machine");

    static const struct {
        const char *kind, *what;
    } bad[] = {
        {"version", "has interface version 99"},
        {"noentry", "has no entry point llmi_backend_plugin_init"},
        {"null", "refused to start: fake plug-in: this core is too old for it"},
        {"missing", "lacks a required operation"},
        {"cpu", "holds a backend named 'cpu'"},
        {"other", "holds backend 'other', not 'cuda'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fake(bad[i].kind, path, sizeof path);
        v = expect_child_reason(path, bad[i].what);
        expect_text(v.cuda.reason, path);
    }

    snprintf(path, sizeof path, "%s/not-a-plugin.so", g_tmp);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("no ELF here\n", f);
    fclose(f);
    expect_child_reason(path, "cannot be loaded: ");
    remove(path);

    v = expect_child_reason("none", "plug-ins are disabled (LLM_PLUGIN_PATH=none)");
}

static void test_search_folders(void **state) {
    (void)state;
    char dir[600], link_path[700], target[600], search[2048];
    snprintf(dir, sizeof dir, "%s/plugins-%d", g_tmp, (int)getpid());
    assert_int_equal(mkdir(dir, 0755), 0);

    /* An empty folder, an absent one and an empty entry: not installed,
     * saying where the loader looked. */
    snprintf(search, sizeof search, "%s/absent::%s", g_tmp, dir);
    child_view v = expect_child_reason(search, "the CUDA plug-in is not installed (looked for "
                                               "libllminfer-cuda.so in ");
    expect_text(v.cuda.reason, dir);
    expect_text(v.cuda.reason, "/absent, ");
    /* The list's reason holds 256 bytes; the session's message all of it. */
    expect_text(v.select, "the dynamic loader's search path)");

    /* The first folder holding the file wins. */
    snprintf(link_path, sizeof link_path, "%s/libllminfer-cuda.so", dir);
    fake("ok", target, sizeof target);
    assert_int_equal(symlink(target, link_path), 0);
    snprintf(search, sizeof search, "%s/absent:%s:%s", g_tmp, dir, g_fakes);
    v = run_child(search);
    assert_true(v.cuda.available);
    assert_int_equal(v.cuda.n_devices, 2);
    assert_string_equal(v.select, "LLM_OK\t");

    remove(link_path);
    fake("probe", target, sizeof target);
    assert_int_equal(symlink(target, link_path), 0);
    expect_child_reason(dir, "fake probe: no fake device in this machine");
    remove(link_path);
    rmdir(dir);

    /* The test runner's setting: the build folder, which holds the real
     * plug-in when it was built. */
    if (g_cuda_plugin[0] && g_search_path[0]) {
        v = run_child(g_search_path);
        if (!v.cuda.available && !probe_reason(v.cuda.reason))
            fail_msg("'%s' is not the CUDA probe's message", v.cuda.reason);
    }
}

static int setup(void **state) {
    (void)state;
    const char *fakes = getenv("LLM_TEST_PLUGINS");
    const char *tmp = getenv("LLM_TEST_TMP");
    if (!fakes || !*fakes) {
        printf("LLM_TEST_PLUGINS (the folder of the fake plug-ins) is not set\n");
        return -1;
    }
    snprintf(g_fakes, sizeof g_fakes, "%s", fakes);
    snprintf(g_tmp, sizeof g_tmp, "%s", tmp && *tmp ? tmp : "/tmp");
    g_model = tiny_model(64, 7);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    llmi_model_free(g_model);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--child") == 0)
        return child_main();
    const char *cuda = getenv("LLM_TEST_CUDA_PLUGIN");
    snprintf(g_cuda_plugin, sizeof g_cuda_plugin, "%s", cuda ? cuda : "");
    const char *search = getenv("LLM_PLUGIN_PATH");
    snprintf(g_search_path, sizeof g_search_path, "%s", search ? search : "");
    setenv("LLM_PLUGIN_PATH", "none", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_failures),  cmocka_unit_test(test_load_probe_fails),
        cmocka_unit_test(test_load_available), cmocka_unit_test(test_load_cuda),
        cmocka_unit_test(test_search_files),   cmocka_unit_test(test_search_folders),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
