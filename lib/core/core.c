/* Error recording, logging, checked allocation, conversions, clocks. */
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- errors: one message per thread, so concurrent callers never mix ---- */

enum { ERR_CAP = 1024 };
static _Thread_local char err_msg[ERR_CAP];

llm_status llmi_error(llm_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, ERR_CAP, fmt, ap);
    va_end(ap);
    llmi_log(LLM_LOG_DEBUG, "error %d: %s", (int)status, err_msg);
    return status;
}

void llmi_error_prefix(const char *fmt, ...) {
    char prefix[512];
    char old[ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, ERR_CAP);
    size_t plen = strnlen(prefix, sizeof prefix - 1);
    size_t room = ERR_CAP - 1;
    size_t n = plen < room ? plen : room;
    memcpy(err_msg, prefix, n);
    if (n + 2 <= room) {
        memcpy(err_msg + n, ": ", 2);
        n += 2;
    }
    size_t olen = strnlen(old, ERR_CAP - 1);
    if (olen > room - n)
        olen = room - n;
    memcpy(err_msg + n, old, olen);
    err_msg[n + olen] = '\0';
}

void llmi_error_clear(void) { err_msg[0] = '\0'; }

void llmi_error_restore(const char *saved) {
    if (saved != err_msg)
        snprintf(err_msg, ERR_CAP, "%s", saved);
}
const char *llmi_error_message(void) { return err_msg; }

llm_status llmi_oom(const char *what) {
    return llmi_error(LLM_ERR_OUT_OF_MEMORY, "out of memory allocating %s", what);
}

/* ---- logging: the sink is one of the two process-wide mutable globals ---- */

/* The sink (function, user, level) changes as one under the lock, and
 * messages are delivered under it, so llm_log_set returns only when no
 * call of the old sink runs. A mutex, not a reader-writer lock: glibc's
 * prefers readers, and threads logging without pause would starve
 * llm_log_set. So sink calls are serialized, which also spares sinks a
 * lock of their own. `log_min` and `log_on` are copies for the common case
 * of a message nobody wants, read without the lock. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static llm_log_fn log_fn;
static void *log_user;
static int log_level = LLM_LOG_INFO;
static atomic_int log_min = LLM_LOG_INFO;
static atomic_bool log_on;
/* Set while this thread runs the sink: nested messages are dropped and
 * llm_log_set is ignored, so a sink cannot deadlock on the lock. */
static _Thread_local bool in_sink;

void llmi_log_set(llm_log_fn fn, llm_log_level min_level, void *user) {
    if (in_sink)
        return;
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = user;
    log_level = (int)min_level;
    atomic_store(&log_min, (int)min_level);
    atomic_store(&log_on, fn != NULL);
    pthread_mutex_unlock(&log_lock);
}

void llmi_log(llm_log_level level, const char *fmt, ...) {
    if (!atomic_load_explicit(&log_on, memory_order_relaxed) ||
        (int)level < atomic_load_explicit(&log_min, memory_order_relaxed) || in_sink)
        return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_lock);
    if (log_fn && (int)level >= log_level) {
        in_sink = true;
        log_fn(level, buf, log_user);
        in_sink = false;
    }
    pthread_mutex_unlock(&log_lock);
}

/* ---- allocation, with failure injection in test builds ---- */

#ifdef LLMI_TEST_HOOKS
static _Atomic uint64_t alloc_fail_countdown;

void llmi_alloc_fail_after(uint64_t n) { atomic_store(&alloc_fail_countdown, n); }

static int alloc_should_fail(void) {
    uint64_t c = atomic_load(&alloc_fail_countdown);
    while (c != 0) {
        if (atomic_compare_exchange_weak(&alloc_fail_countdown, &c, c - 1))
            return c == 1;
    }
    return 0;
}
#else
/* Release builds: no hook, and no atomic load on every allocation. */
static inline int alloc_should_fail(void) { return 0; }
#endif

void *llmi_malloc(size_t size) {
    if (alloc_should_fail())
        return NULL;
    return malloc(size ? size : 1);
}

void *llmi_calloc(size_t count, size_t size) {
    size_t total;
    if (!llmi_mul_ok(count, size, &total) || alloc_should_fail())
        return NULL;
    return calloc(total ? total : 1, 1);
}

void *llmi_realloc(void *ptr, size_t size) {
    if (alloc_should_fail())
        return NULL;
    return realloc(ptr, size ? size : 1);
}

void *llmi_malloc_aligned(size_t size) {
    if (alloc_should_fail())
        return NULL;
    void *p = NULL;
    size_t rounded = (size + 63) & ~(size_t)63;
    if (rounded < size)
        return NULL;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        return NULL;
    return p;
}

void *llmi_malloc_huge(size_t size) {
    enum { HUGE_PAGE = 2 << 20 };
    if (alloc_should_fail())
        return NULL;
    void *p = NULL;
    size_t rounded = (size + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
    if (rounded < size)
        return NULL;
    if (posix_memalign(&p, HUGE_PAGE, rounded ? rounded : HUGE_PAGE) != 0)
        return NULL;
#if defined(MADV_HUGEPAGE)
    (void)madvise(p, rounded, MADV_HUGEPAGE); /* a hint: without it, small pages */
#endif
    return p;
}

void llmi_free(void *ptr) { free(ptr); }
void llmi_free_aligned(void *ptr) { free(ptr); }

char *llmi_strndup(const char *s, size_t n) {
    char *d = llmi_malloc(n + 1);
    if (!d)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *llmi_strdup(const char *s) { return llmi_strndup(s, strlen(s)); }

/* ---- half floats ---- */

float llmi_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = (float)man * 5.9604644775390625e-8f;
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

uint16_t llmi_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)
        return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
    if (ax >= 0x477ff000u)
        return sign | 0x7c00; /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {   /* below 2^-14: subnormal half */
        float a;
        memcpy(&a, &ax, 4);
        /* a * 2^24 rounded to nearest even gives the subnormal mantissa */
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    uint32_t mant_round = ax + 0xfffu + ((ax >> 13) & 1u);
    return sign | (uint16_t)((mant_round - 0x38000000u) >> 13);
}

uint16_t llmi_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- misc ---- */

double llmi_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int llmi_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* A cgroup limit file: its number, or UINT64_MAX if absent or "max". */
static uint64_t cgroup_limit(const char *path) {
    FILE *f = fopen(path, "re");
    if (!f)
        return UINT64_MAX;
    unsigned long long v = 0;
    int ok = fscanf(f, "%llu", &v);
    fclose(f);
    return ok == 1 && v > 0 ? (uint64_t)v : UINT64_MAX;
}

uint64_t llmi_mem_limit(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t lim = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
    uint64_t v2 = cgroup_limit("/sys/fs/cgroup/memory.max");
    uint64_t v1 = cgroup_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (v2 < lim)
        lim = v2;
    if (v1 < lim)
        lim = v1;
    return lim;
}

llm_status llmi_mem_check(uint64_t bytes, const char *what) {
    uint64_t lim = llmi_mem_limit();
    if (bytes <= lim)
        return LLM_OK;
    return llmi_error(LLM_ERR_OUT_OF_MEMORY,
                      "%s of %llu bytes exceeds the %llu bytes of memory this process can have "
                      "(physical memory, or its container's limit)",
                      what, (unsigned long long)bytes, (unsigned long long)lim);
}

size_t llmi_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

int llmi_utf8_seq_len(unsigned char c) {
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return 2;
    if (c >= 0xe0 && c <= 0xef)
        return 3;
    if (c >= 0xf0 && c <= 0xf4)
        return 4;
    return 0;
}

/* Validates one sequence at s (n bytes available); returns its length or 0. */
static size_t utf8_one(const unsigned char *s, size_t n) {
    int len = llmi_utf8_seq_len(s[0]);
    if (len == 0 || (size_t)len > n)
        return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if (len == 3) {
        if (s[0] == 0xe0 && s[1] < 0xa0)
            return 0; /* overlong */
        if (s[0] == 0xed && s[1] >= 0xa0)
            return 0; /* surrogates */
    } else if (len == 4) {
        if (s[0] == 0xf0 && s[1] < 0x90)
            return 0; /* overlong */
        if (s[0] == 0xf4 && s[1] >= 0x90)
            return 0; /* above U+10FFFF */
    }
    return (size_t)len;
}

size_t llmi_utf8_valid_prefix(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t l = utf8_one(u + i, len - i);
        if (l == 0)
            return i;
        i += l;
    }
    return len;
}

void llmi_params_init_sized(void *dst, size_t size, const void *defaults, size_t full) {
    if (!dst || size < sizeof(uint32_t))
        return;
    size_t n = size < full ? size : full;
    memcpy(dst, defaults, n);
    uint32_t n32 = (uint32_t)n;
    memcpy(dst, &n32, sizeof n32);
}

void llmi_error_copy_to(char *buf, size_t capacity) {
    if (!buf || capacity == 0)
        return;
    snprintf(buf, capacity, "%s", err_msg);
}

llm_status llmi_params_copy(const char *name, const void *in, void *out, size_t size) {
    if (!in)
        return LLM_OK;
    uint32_t in_size;
    memcpy(&in_size, in, sizeof in_size);
    if (in_size < sizeof(uint32_t) || in_size > (1u << 16))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "%s.struct_size %u is invalid (call %s_init)",
                          name, in_size, name);
    memcpy(out, in, in_size < size ? in_size : size);
    uint32_t full = (uint32_t)size;
    memcpy(out, &full, sizeof full);
    return LLM_OK;
}

llm_status llmi_open_regular(const char *path, const char *what, bool *absent, int *fd,
                             uint64_t *size) {
    *fd = -1;
    *size = 0;
    if (absent)
        *absent = false;
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) {
        if (absent && errno == ENOENT) {
            *absent = true;
            return LLM_OK;
        }
        return llmi_error(LLM_ERR_IO, "cannot open %s: %s", what, strerror(errno));
    }
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        int e = errno;
        close(f);
        return llmi_error(LLM_ERR_IO, "cannot stat %s: %s", what, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        const char *kind = S_ISFIFO(sb.st_mode)   ? "a FIFO"
                           : S_ISDIR(sb.st_mode)  ? "a directory"
                           : S_ISCHR(sb.st_mode)  ? "a character device"
                           : S_ISBLK(sb.st_mode)  ? "a block device"
                           : S_ISSOCK(sb.st_mode) ? "a socket"
                                                  : "not a file";
        return llmi_error(LLM_ERR_IO, "%s is not a regular file (%s)", what, kind);
    }
    /* Reads of a regular file never block; clearing the flag keeps them
     * ordinary blocking reads whatever the file system makes of it. */
    int flags = fcntl(f, F_GETFL);
    if (flags >= 0)
        (void)fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
    *fd = f;
    *size = (uint64_t)sb.st_size;
    return LLM_OK;
}

/* ---- progress ---- */

LLM_API const char *llm_progress_phase_name(llm_progress_phase phase) {
    switch (phase) {
    case LLM_PROGRESS_READ:
        return "read";
    case LLM_PROGRESS_UPLOAD:
        return "upload";
    case LLM_PROGRESS_WARMUP:
        return "warm-up";
    }
    return "unknown";
}

llm_status llmi_progress_report(const llmi_progress *p, llm_progress_phase phase, uint64_t done,
                                uint64_t total) {
    if (!p || !p->fn || p->fn(phase, done, total, p->user))
        return LLM_OK;
    return llmi_error(
        LLM_ERR_CANCELLED, "cancelled by the progress callback during %s (%llu of %llu)",
        llm_progress_phase_name(phase), (unsigned long long)done, (unsigned long long)total);
}
