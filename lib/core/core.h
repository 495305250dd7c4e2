/* Shared internals: error recording, logging, checked allocation, half-float
 * conversion, clocks. Every module may include this header. */
#ifndef LLMI_CORE_H
#define LLMI_CORE_H

/* The library implements the experimental section of llm.h too. */
#ifndef LLM_EXPERIMENTAL
#define LLM_EXPERIMENTAL
#endif
#include "llm.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define LLMI_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define LLMI_PRINTF(f, a)
#endif

/* Records `status` and a formatted message as the calling thread's last error
 * and returns `status`, so callers can write `return llmi_error(...)`. */
llm_status llmi_error(llm_status status, const char *fmt, ...) LLMI_PRINTF(2, 3);
/* Prefixes the current thread's last error with context ("loading x: ..."). */
void llmi_error_prefix(const char *fmt, ...) LLMI_PRINTF(1, 2);
void llmi_error_clear(void);
const char *llmi_error_message(void);
/* Sets the calling thread's last error message back to `saved` (a copy of
 * an earlier llmi_error_message()), for a call that succeeds although
 * something it tried failed. Logs nothing. */
void llmi_error_restore(const char *saved);

/* Copies a caller's versioned params struct (`name`, e.g.
 * "llm_session_params") into `out`, which holds the library's defaults and
 * is `size` bytes: only the bytes the caller's struct_size covers are
 * read, then out's struct_size is set to `size`. A struct_size smaller than
 * the field itself or implausibly large (over 64 KiB) gives
 * LLM_ERR_INVALID_ARGUMENT. `in` NULL keeps the defaults. Both structs
 * start with uint32_t struct_size. */
llm_status llmi_params_copy(const char *name, const void *in, void *out, size_t size);

/* The *_params_init_sized functions: copies the first min(size, full) bytes
 * of `defaults` (a complete struct of `full` bytes) to `dst` and sets its
 * struct_size to that number; nothing past it is written. A size too small
 * to hold struct_size writes nothing; `dst` NULL is a no-op. */
void llmi_params_init_sized(void *dst, size_t size, const void *defaults, size_t full);

/* A caller's progress callback (llm_progress_fn) and its user pointer;
 * fn NULL reports nothing. */
typedef struct llmi_progress {
    llm_progress_fn fn;
    void *user;
} llmi_progress;
/* Reports `done` of `total` in `phase`; LLM_ERR_CANCELLED with a message when
 * the callback returns false. `p` NULL is a no-op. */
llm_status llmi_progress_report(const llmi_progress *p, llm_progress_phase phase, uint64_t done,
                                uint64_t total);

/* The smallest layout each params struct has had in a 1.x header: what the
 * exported T_init functions, which programs built against 1.0 and 1.1
 * headers call without a size, may write. Never changes. */
enum {
    LLMI_LEGACY_MODEL_PARAMS_SIZE = 8,
    LLMI_LEGACY_SESSION_PARAMS_SIZE = 32,
    LLMI_LEGACY_SAMPLING_PARAMS_SIZE = 32,
    LLMI_LEGACY_GENERATE_PARAMS_SIZE = 40,
    LLMI_LEGACY_REQUEST_PARAMS_SIZE = 64,
    LLMI_LEGACY_DEVICE_PARAMS_SIZE = 32, /* experimental, added in 1.1 */
};

/* Copies the calling thread's error message into buf (capacity bytes,
 * NUL-terminated, cut to fit); NULL or 0 is a no-op. */
void llmi_error_copy_to(char *buf, size_t capacity);

/* Return early on failure, keeping the callee's message. */
#define LLMI_TRY(expr)                                                                             \
    do {                                                                                           \
        llm_status llmi_try_st_ = (expr);                                                          \
        if (llmi_try_st_ != LLM_OK)                                                                \
            return llmi_try_st_;                                                                   \
    } while (0)

/* Logging to the host's sink (never stdout). */
void llmi_log_set(llm_log_fn fn, llm_log_level min_level, void *user);
void llmi_log(llm_log_level level, const char *fmt, ...) LLMI_PRINTF(2, 3);

/* Allocation. Every allocation of the library goes through these so tests can
 * inject failures (llmi_alloc_fail_after, in test builds). They never abort; the caller checks
 * NULL and reports LLM_ERR_OUT_OF_MEMORY. Sizes are overflow-checked. */
void *llmi_malloc(size_t size);
void *llmi_calloc(size_t count, size_t size);
void *llmi_realloc(void *ptr, size_t size);
/* 64-byte aligned, for SIMD buffers; free with llmi_free_aligned. */
void *llmi_malloc_aligned(size_t size);
/* As llmi_malloc_aligned, for a large buffer read as a stream: aligned to
 * 2 MiB and advised to be backed by transparent huge pages where the kernel
 * allows (fewer page faults to fill it, fewer TLB misses to read it). Freed
 * with llmi_free_aligned. */
void *llmi_malloc_huge(size_t size);
void llmi_free(void *ptr);
void llmi_free_aligned(void *ptr);
char *llmi_strdup(const char *s);
char *llmi_strndup(const char *s, size_t n);

/* Test hooks. Code that exists only for white-box tests is compiled only
 * with LLMI_TEST_HOOKS defined: the Makefile builds the library a second
 * time that way into libllminfer-test.a, which tests/unit and the fuzz
 * targets link; the shared library and the installed libllminfer.a carry
 * no hooks. A module's hooks sit under the same macro in its header. */
#ifdef LLMI_TEST_HOOKS
/* The n-th allocation from now fails (n >= 1); 0 disables. */
void llmi_alloc_fail_after(uint64_t n);
#endif
/* Shorthand for the common "allocate or fail" error. */
llm_status llmi_oom(const char *what);

/* a * b without overflow; returns false on overflow. */
static inline int llmi_mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

/* IEEE half and bfloat16 conversions (round to nearest even). */
float llmi_f16_to_f32(uint16_t h);
uint16_t llmi_f32_to_f16(float f);
static inline float llmi_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t llmi_f32_to_bf16(float f);

/* Monotonic seconds. */
double llmi_now(void);

/* Opens `path` read-only if it is a regular file. The open itself does not
 * block (O_NONBLOCK), so a FIFO or a device in place of a model file is
 * refused instead of hanging the load; the flag is cleared again before
 * returning. `what` names the file in messages (LLM_ERR_IO). On success
 * *fd is open (the caller closes it) and *size is the file's size. With
 * `absent` non-NULL a missing file gives LLM_OK, *absent true and *fd -1. */
llm_status llmi_open_regular(const char *path, const char *what, bool *absent, int *fd,
                             uint64_t *size);

/* Number of online CPUs (at least 1). */
int llmi_cpu_count(void);

/* The most memory this process can ever be given: the machine's physical
 * memory, or its container's cgroup limit where that is lower (v2
 * memory.max, v1 memory.limit_in_bytes, as mounted at /sys/fs/cgroup). */
uint64_t llmi_mem_limit(void);
/* LLM_ERR_OUT_OF_MEMORY naming `what` when `bytes` exceed llmi_mem_limit():
 * memory reserved lazily that could never be backed fails here, with a
 * status, instead of later under the OOM killer. */
llm_status llmi_mem_check(uint64_t bytes, const char *what);

/* UTF-8: length of the longest valid prefix of s (== len when all valid), so
 * the return value is the offset of the first bad byte. Rejects overlongs,
 * surrogates and code points above U+10FFFF. */
size_t llmi_utf8_valid_prefix(const char *s, size_t len);
/* Bytes in a UTF-8 sequence starting with lead byte c (1-4), 0 if not a lead. */
int llmi_utf8_seq_len(unsigned char c);
/* Writes code point cp (at most U+10FFFF) as UTF-8 to out; returns its
 * length, 1 to 4 bytes. */
size_t llmi_utf8_encode(uint32_t cp, char *out);

#endif
