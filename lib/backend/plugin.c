/* The core's plug-in loader (backend/plugin.h): dlopen a file, call its
 * entry with the host services, register its table; and, once per process,
 * look for the known plug-ins and remember why each is not there. */
#include "backend/plugin.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- host services ---- */

/* The plug-in hands us finished text: never read it as a format. */
static llm_status host_set_error(llm_status status, const char *message) {
    return llmi_error(status, "%s", message ? message : "");
}

static void host_log(llm_log_level level, const char *message) {
    llmi_log(level, "%s", message ? message : "");
}

static const llmi_plugin_host plugin_host = {
    .version = LLMI_PLUGIN_HOST_VERSION,
    .release = LLM_VERSION_NUMBER,
    .set_error = host_set_error,
    .log = host_log,
};

/* ---- loading one file ---- */

/* Loads run one at a time: a plug-in's entry may set its own globals. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
/* Libraries whose table is registered: never closed (the registry points
 * into them), and closed once more when loaded again, so that loading one
 * file twice holds one reference. */
static void *loaded[LLMI_BACKEND_MAX];
static size_t n_loaded;

static bool is_loaded_locked(void *lib) {
    for (size_t i = 0; i < n_loaded; i++)
        if (loaded[i] == lib)
            return true;
    return false;
}

/* Calls the entry and registers its table; on failure the caller closes
 * the library. `expect`: the backend name the file must hold, or NULL. */
static llm_status start_locked(void *lib, const char *path, const char *expect) {
    union {
        void *obj;
        llmi_plugin_init_fn fn;
    } entry = {dlsym(lib, LLMI_PLUGIN_INIT_SYMBOL)};
    if (!entry.obj)
        return llmi_error(LLM_ERR_BAD_FORMAT,
                          "plug-in %s has no entry point %s: it is not a libllminfer plug-in", path,
                          LLMI_PLUGIN_INIT_SYMBOL);
    /* Tells a message the plug-in set apart from an older one. */
    llmi_error_clear();
    const llmi_backend_ops *ops = entry.fn(&plugin_host);
    if (!ops) {
        if (!*llmi_error_message())
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "plug-in %s refused to start: its entry point returned no "
                              "backend table",
                              path);
        llmi_error_prefix("plug-in %s refused to start", path);
        return LLM_ERR_UNSUPPORTED;
    }
    if (ops->name && strcmp(ops->name, llmi_backend_cpu.name) == 0)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "plug-in %s holds a backend named 'cpu', the built-in CPU backend's "
                          "name",
                          path);
    if (expect && ops->name && strcmp(ops->name, expect) != 0)
        return llmi_error(LLM_ERR_UNSUPPORTED, "plug-in %s holds backend '%s', not '%s'", path,
                          ops->name, expect);
    llm_status st = llmi_backend_register(ops);
    if (st != LLM_OK)
        llmi_error_prefix("plug-in %s", path);
    return st;
}

/* `dl_error` receives dlopen's own text when dlopen fails, "" otherwise. */
static llm_status load(const char *path, const char *expect, char *dl_error, size_t cap) {
    dl_error[0] = '\0';
    if (!path || !*path)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "plug-in path is NULL or empty");
    struct stat sb;
    if (strchr(path, '/') && stat(path, &sb) != 0)
        return llmi_error(errno == ENOENT ? LLM_ERR_NOT_FOUND : LLM_ERR_IO, "plug-in %s: %s", path,
                          strerror(errno));
    pthread_mutex_lock(&load_lock);
    llm_status st = LLM_OK;
    dlerror();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(dl_error, cap, "%s", why ? why : "dlopen failed");
        st = llmi_error(LLM_ERR_UNSUPPORTED, "plug-in %s cannot be loaded: %s", path, dl_error);
    } else if ((st = start_locked(lib, path, expect)) != LLM_OK) {
        dlclose(lib);
    } else if (is_loaded_locked(lib)) {
        dlclose(lib); /* the reference this call took; the first one stays */
    } else if (n_loaded < LLMI_BACKEND_MAX) {
        loaded[n_loaded++] = lib;
    }
    pthread_mutex_unlock(&load_lock);
    return st;
}

llm_status llmi_backend_plugin_load(const char *path) {
    char dl_error[512];
    return load(path, NULL, dl_error, sizeof dl_error);
}

/* ---- the known plug-ins ---- */

static const struct {
    const char *name, *file, *what;
} known[LLMI_PLUGIN_KNOWN] = {
    {"cuda", "libllminfer-cuda.so", "the CUDA plug-in"},
};

const char *llmi_backend_plugin_known(size_t k) {
    return k < LLMI_PLUGIN_KNOWN ? known[k].name : NULL;
}

/* Written once, by the thread that runs the search, before pthread_once
 * returns to any other; read-only afterwards. */
static char reasons[LLMI_PLUGIN_KNOWN][768];
/* What the search logs, after it (see llmi_backend_plugin_autoload). */
static struct {
    llm_log_level level;
    char text[896];
} report[LLMI_PLUGIN_KNOWN];

const char *llmi_backend_plugin_reason(const char *name) {
    for (size_t k = 0; name && k < LLMI_PLUGIN_KNOWN; k++)
        if (strcmp(known[k].name, name) == 0)
            return reasons[k][0] ? reasons[k] : "its plug-in is being loaded";
    return NULL;
}

/* The folders searched, for the "not installed" message. */
typedef struct {
    char text[512];
    size_t len;
} looked_list;

static void looked_add(looked_list *l, const char *where) {
    if (l->len >= sizeof l->text)
        return;
    int w = snprintf(l->text + l->len, sizeof l->text - l->len, "%s%s", l->len ? ", " : "", where);
    if (w > 0)
        l->len += (size_t)w;
}

/* The folder of `file` (made absolute) in `out`; false when unknown. */
static bool folder_of(const char *file, char out[PATH_MAX]) {
    char full[PATH_MAX];
    if (!file || !strchr(file, '/') || !realpath(file, full))
        return false;
    char *slash = strrchr(full, '/');
    if (slash == full)
        slash++; /* a file in "/" */
    *slash = '\0';
    snprintf(out, PATH_MAX, "%s", full);
    return true;
}

/* Folders the core looks in after LLM_PLUGIN_PATH: the core library's (the
 * program's, when the program links the static library), then the
 * program's own when it differs. */
static size_t own_folders(char dirs[2][PATH_MAX]) {
    size_t n = 0;
    Dl_info info;
    if (dladdr((void *)&llmi_backend_plugin_load, &info) && folder_of(info.dli_fname, dirs[n]))
        n++;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        if (folder_of(exe, dirs[n]) && (n == 0 || strcmp(dirs[0], dirs[n]) != 0))
            n++;
    }
    return n;
}

/* dir/file in `out`; false when it does not fit (then it is not looked at). */
static bool join(char out[PATH_MAX], const char *dir, const char *file) {
    size_t a = strlen(dir), b = strlen(file);
    if (a + 1 + b >= PATH_MAX)
        return false;
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, file, b + 1);
    return true;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Loads `path` as known plug-in k; the outcome becomes its reason.
 * `dl_error` receives dlopen's text when dlopen failed. */
static llm_status load_known(size_t k, const char *path, char dl_error[512]) {
    llm_status st = load(path, known[k].name, dl_error, 512);
    if (st == LLM_OK) {
        snprintf(reasons[k], sizeof reasons[k], "%s %s was loaded, then unregistered",
                 known[k].what, path);
        report[k].level = LLM_LOG_INFO;
        snprintf(report[k].text, sizeof report[k].text, "loaded %s %s", known[k].what, path);
    } else {
        snprintf(reasons[k], sizeof reasons[k], "%s", llmi_error_message());
        report[k].level = LLM_LOG_WARN;
        snprintf(report[k].text, sizeof report[k].text, "%s", reasons[k]);
    }
    return st;
}

static void not_found(size_t k, const looked_list *looked) {
    snprintf(reasons[k], sizeof reasons[k],
             "%s is not installed (looked for %s in %s%sthe dynamic loader's search path)",
             known[k].what, known[k].file, looked->text, looked->len ? " and " : "");
    report[k].level = LLM_LOG_DEBUG;
    snprintf(report[k].text, sizeof report[k].text, "%s", reasons[k]);
}

/* LLM_PLUGIN_PATH's entries: a folder holds the plug-in under its file
 * name; a file is the plug-in itself (with one known plug-in, no entry is
 * ambiguous). Returns whether one was found (and loaded or failed). */
static bool search_env(size_t k, const char *env, looked_list *looked) {
    /* Entries are copied to the stack, not the heap: the search runs once,
     * and an allocation failing then (a test's sweep) must not change it. */
    for (const char *e = env; e && *e;) {
        const char *end = strchrnul(e, ':');
        size_t len = (size_t)(end - e);
        char entry[PATH_MAX], path[PATH_MAX];
        if (len > 0 && len < sizeof entry) {
            memcpy(entry, e, len);
            entry[len] = '\0';
            struct stat sb;
            const char *file = entry;
            if (stat(entry, &sb) == 0 && S_ISDIR(sb.st_mode))
                file = join(path, entry, known[k].file) ? path : "";
            looked_add(looked, entry);
            if (*file && exists(file)) {
                char dl_error[512];
                load_known(k, file, dl_error);
                return true;
            }
        }
        e = *end ? end + 1 : end;
    }
    return false;
}

static void autoload_one(size_t k, const char *env) {
    if (env && strcmp(env, "none") == 0) {
        snprintf(reasons[k], sizeof reasons[k],
                 "%s was not looked for: plug-ins are disabled (LLM_PLUGIN_PATH=none)",
                 known[k].what);
        report[k].level = LLM_LOG_DEBUG;
        snprintf(report[k].text, sizeof report[k].text, "%s", reasons[k]);
        return;
    }
    looked_list looked = {.len = 0};
    looked.text[0] = '\0';
    if (search_env(k, env, &looked))
        return;
    char dirs[2][PATH_MAX];
    size_t n_dirs = own_folders(dirs);
    for (size_t i = 0; i < n_dirs; i++) {
        char path[PATH_MAX];
        looked_add(&looked, dirs[i]);
        if (join(path, dirs[i], known[k].file) && exists(path)) {
            char dl_error[512];
            load_known(k, path, dl_error);
            return;
        }
    }
    /* The dynamic loader's search (LD_LIBRARY_PATH, the core's run path,
     * ld.so.cache, the system folders): a miss reads "<file>: cannot open
     * shared object file"; a dependency that is missing names the
     * dependency instead and is a real load error. */
    char dl_error[512], miss[128];
    if (load_known(k, known[k].file, dl_error) == LLM_OK)
        return;
    snprintf(miss, sizeof miss, "%s: cannot open shared object file", known[k].file);
    if (strncmp(dl_error, miss, strlen(miss)) == 0)
        not_found(k, &looked);
}

static pthread_once_t autoload_once = PTHREAD_ONCE_INIT;
/* Set on the thread running the search: a call back into the registry from
 * there (a plug-in's entry logging to a sink that lists backends) returns
 * at once instead of waiting on itself. */
static _Thread_local bool autoloading;
/* Whether the search's report is still to be logged. */
static atomic_bool report_due;

static void autoload_all(void) {
    autoloading = true;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", llmi_error_message());
    const char *env = getenv("LLM_PLUGIN_PATH");
    for (size_t k = 0; k < LLMI_PLUGIN_KNOWN; k++)
        autoload_one(k, env);
    llmi_error_restore(saved);
    atomic_store(&report_due, true);
    autoloading = false;
}

void llmi_backend_plugin_autoload(void) {
    if (autoloading)
        return;
    pthread_once(&autoload_once, autoload_all);
    /* Logged outside pthread_once: a sink that lists backends from another
     * thread would otherwise wait on the search while it waits on the
     * sink's lock. */
    if (atomic_exchange(&report_due, false))
        for (size_t k = 0; k < LLMI_PLUGIN_KNOWN; k++)
            llmi_log(report[k].level, "%s", report[k].text);
}
