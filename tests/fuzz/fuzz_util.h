/* Shared by the libFuzzer targets (tests/fuzz/fuzz_*.c): a check macro that
 * aborts (so libFuzzer saves the input as a crash) and an independent UTF-8
 * validator. Header-only; each target is one translation unit plus the
 * library sources, all built with -fsanitize=fuzzer,address,undefined. */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A violated expectation: report it and abort, which libFuzzer treats as a
 * crash and saves the input. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n    ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Strict UTF-8 (RFC 3629: no overlongs, no surrogates, at most U+10FFFF),
 * written here independently of the library's validator. */
static inline bool fuzz_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (n - i < len)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (p[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

/* Whether [p, p + n) lies inside [base, base + size). */
static inline bool fuzz_within(const void *p, uint64_t n, const void *base, size_t size) {
    const char *a = (const char *)p, *b = (const char *)base;
    return a >= b && (size_t)(a - b) <= size && n <= size - (size_t)(a - b);
}

#endif
