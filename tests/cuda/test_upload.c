/* The weight upload's host side (cuda/upload.c), without a GPU: a fake
 * device whose copies happen late, as a stream's do. A send is only
 * queued; its bytes leave the staging buffer when that buffer is waited
 * for again (or at the end), so an uploader that refilled a buffer before
 * waiting for it would deliver the wrong bytes. Every destination byte is
 * compared with its source; the gaps between tensors must stay untouched. */
#include "upload.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

enum { MAX_SLOTS = 4, FILL = 0xA5 };

typedef struct fake_device {
    unsigned char *dst;
    size_t dst_bytes;
    /* The queued send of each slot. */
    const char *buffer[MAX_SLOTS];
    llmi_upload_seg segs[MAX_SLOTS][256];
    size_t n[MAX_SLOTS];
    unsigned waits, sends, fail_at_wait; /* fail_at_wait: 1-based, 0 = never */
} fake_device;

static void drain(fake_device *d, unsigned slot) {
    for (size_t i = 0; i < d->n[slot]; i++) {
        const llmi_upload_seg *s = &d->segs[slot][i];
        assert_true(s->dst + s->bytes <= d->dst_bytes);
        memcpy(d->dst + s->dst, d->buffer[slot] + s->staged, s->bytes);
    }
    d->n[slot] = 0;
}

static llm_status fake_wait(void *ctx, unsigned slot) {
    fake_device *d = ctx;
    assert_true(slot < MAX_SLOTS);
    if (++d->waits == d->fail_at_wait)
        return LLM_ERR_BACKEND;
    drain(d, slot);
    return LLM_OK;
}

static llm_status fake_send(void *ctx, unsigned slot, const char *buffer,
                            const llmi_upload_seg *segs, size_t n) {
    fake_device *d = ctx;
    assert_true(slot < MAX_SLOTS);
    assert_int_equal(d->n[slot], 0); /* waited for before this send */
    assert_true(n > 0 && n <= 256);
    d->buffer[slot] = buffer;
    memcpy(d->segs[slot], segs, n * sizeof *segs);
    d->n[slot] = n;
    d->sends++;
    return LLM_OK;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n items with random sizes (some empty, some spanning several buffers)
 * from one random source, placed in the destination with gaps between
 * them; returns the destination size. */
static size_t make_items(uint64_t *seed, llmi_upload_item *items, size_t n, size_t max_item,
                         unsigned char **src_out) {
    size_t *sizes = malloc(n * sizeof *sizes), src_total = 0;
    assert_non_null(sizes);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(seed);
        sizes[i] = r % 7 == 0 ? 0 : (size_t)(rng_next(seed) % max_item) + 1;
        src_total += sizes[i];
    }
    unsigned char *src = malloc(src_total + 1);
    assert_non_null(src);
    for (size_t i = 0; i < src_total; i++)
        src[i] = (unsigned char)rng_next(seed);
    size_t at = 0, dst = 0;
    for (size_t i = 0; i < n; i++) {
        dst += rng_next(seed) % 64; /* a gap */
        items[i] = (llmi_upload_item){.src = src + at, .bytes = sizes[i], .dst = dst};
        at += sizes[i];
        dst += sizes[i];
    }
    free(sizes);
    *src_out = src;
    return dst + 64;
}

static void check_run(uint64_t seed, size_t n_items, size_t max_item, unsigned n_buffers,
                      size_t buffer_bytes, unsigned threads) {
    const uint64_t seed0 = seed;
    llmi_upload_item items[64];
    assert_true(n_items <= 64);
    unsigned char *src;
    size_t dst_bytes = make_items(&seed, items, n_items, max_item, &src);
    fake_device d = {.dst_bytes = dst_bytes};
    d.dst = malloc(dst_bytes);
    assert_non_null(d.dst);
    memset(d.dst, FILL, dst_bytes);
    char *buffers[MAX_SLOTS] = {NULL};
    for (unsigned i = 0; i < n_buffers; i++) {
        buffers[i] = malloc(buffer_bytes);
        assert_non_null(buffers[i]);
    }
    const llmi_upload_ops ops = {fake_wait, fake_send, &d};
    assert_int_equal(
        llmi_upload_run(items, n_items, buffers, n_buffers, buffer_bytes, threads, &ops), LLM_OK);
    for (unsigned i = 0; i < n_buffers; i++)
        drain(&d, i);
    size_t total = 0, next = 0;
    for (size_t i = 0; i < n_items; i++) {
        for (size_t b = next; b < items[i].dst; b++)
            if (d.dst[b] != FILL)
                fail_msg("seed %llu: byte %zu between tensors was written",
                         (unsigned long long)seed0, b);
        if (memcmp(d.dst + items[i].dst, items[i].src, items[i].bytes) != 0)
            fail_msg("seed %llu: item %zu (%zu bytes at %zu) differs", (unsigned long long)seed0, i,
                     items[i].bytes, items[i].dst);
        total += items[i].bytes;
        next = items[i].dst + items[i].bytes;
    }
    /* Every buffer but the last is full: sends = ceil(total / buffer). */
    assert_int_equal(d.sends, (total + buffer_bytes - 1) / buffer_bytes);
    for (unsigned i = 0; i < n_buffers; i++)
        free(buffers[i]);
    free(d.dst);
    free(src);
}

static void test_small_buffers(void **state) {
    (void)state;
    /* Buffers of a few hundred bytes: items split across many of them. */
    for (uint64_t seed = 1; seed <= 200; seed++)
        check_run(seed, 1 + seed % 40, 2000, 1 + (unsigned)(seed % 3), 97 + (seed * 31) % 900,
                  1 + (unsigned)(seed % 4));
}

static void test_threads_fill(void **state) {
    (void)state;
    /* Buffers past the threads' threshold (4 MiB), odd sizes. */
    check_run(7, 12, 3u << 20, 3, (5u << 20) + 4093, 8);
    check_run(8, 3, 9u << 20, 2, 6u << 20, 3);
    check_run(9, 40, 1u << 20, 1, (8u << 20) - 1, 16);
    check_run(10, 5, 12u << 20, 3, 64u << 20, 40); /* more threads than the cap */
}

static void test_one_buffer_holds_all(void **state) {
    (void)state;
    check_run(11, 30, 100, 1, 1u << 20, 8);
}

static void test_errors(void **state) {
    (void)state;
    unsigned char src[1000];
    memset(src, 1, sizeof src);
    llmi_upload_item items[3] = {{src, 400, 0}, {src + 400, 400, 400}, {src + 800, 200, 800}};
    unsigned char dst[1000];
    fake_device d = {.dst = dst, .dst_bytes = sizeof dst, .fail_at_wait = 2};
    char b0[300], b1[300];
    char *buffers[2] = {b0, b1};
    const llmi_upload_ops ops = {fake_wait, fake_send, &d};
    /* The second wait fails: its status comes back, nothing sent after it. */
    assert_int_equal(llmi_upload_run(items, 3, buffers, 2, 300, 1, &ops), LLM_ERR_BACKEND);
    assert_int_equal(d.sends, 1);
    assert_int_equal(llmi_upload_run(items, 3, buffers, 0, 300, 1, &ops), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llmi_upload_run(items, 3, buffers, 2, 0, 1, &ops), LLM_ERR_INVALID_ARGUMENT);
    assert_int_equal(llmi_upload_run(items, 0, buffers, 2, 300, 1, &ops), LLM_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_buffers),
        cmocka_unit_test(test_threads_fill),
        cmocka_unit_test(test_one_buffer_holds_all),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
