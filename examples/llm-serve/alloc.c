#include "alloc.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static unsigned long fail_every_nth;
static atomic_bool armed;
static atomic_ulong calls;

void serve_alloc_read_test_hook(void)
{
    const char *v = getenv("LLM_SERVE_TEST_FAIL_ALLOC");
    fail_every_nth = v ? strtoul(v, NULL, 10) : 0;
}

void serve_alloc_arm_test_hook(void) { atomic_store(&armed, fail_every_nth != 0); }

static bool injected_failure(void)
{
    if (!atomic_load(&armed)) return false;
    return (atomic_fetch_add(&calls, 1) + 1) % fail_every_nth == 0;
}

void *serve_malloc(size_t size) { return injected_failure() ? NULL : malloc(size); }

void *serve_calloc(size_t count, size_t size)
{
    return injected_failure() ? NULL : calloc(count, size);
}

/* On failure the old block stays valid and owned by the caller, as with realloc. */
void *serve_realloc(void *ptr, size_t size) { return injected_failure() ? NULL : realloc(ptr, size); }

char *serve_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = serve_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}
