/* The server's own allocations. They go through one place so that every
 * out-of-memory path can be exercised by a test: LLM_SERVE_TEST_FAIL_ALLOC=N
 * makes every N-th call fail once serving has begun (docs/serve.md). */
#ifndef LLM_SERVE_ALLOC_H
#define LLM_SERVE_ALLOC_H

#include <stddef.h>

/* Reads the test hook from the environment; the failures start only with
 * serve_alloc_arm_test_hook(), so that startup itself is not what a test
 * of request handling exercises. */
void serve_alloc_read_test_hook(void);
void serve_alloc_arm_test_hook(void);

void *serve_malloc(size_t size);
void *serve_calloc(size_t count, size_t size);
void *serve_realloc(void *ptr, size_t size);
char *serve_strdup(const char *s);

#endif
