/* The FP8 E4M3 ("fn") codec of the FP8 KV cache (core/fp8.h) against
 * ml_dtypes' float8_e4m3fn: tests/golden/fp8-e4m3fn.txt, recorded by
 * tests/golden/make_fp8_table.py (all 256 codes decoded; every midpoint
 * between neighbouring codes and the floats beside it, the saturation
 * edge, infinities, NaNs, subnormals and random floats encoded). With
 * LLM_TEST_FP8_TABLE=FILE a second table of the same format is checked too
 * (tests/golden/check_fp8.py writes one of a million random floats).
 *
 * The one documented difference: ml_dtypes turns a finite float past the
 * largest code (|x| > 464 after rounding) and an infinity into NaN; the
 * cache saturates them to +-448.
 *
 * Also: the CPU kernels' decoding table, and every kernel level's row
 * operations (an axpy of all 256 codes with scale 1), give the decoder's
 * values; a block is
 * quantized as d = amax / 448 and codes of x / d, and dequantizes to within
 * half an E4M3 step of each value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/kernels_impl.h"
#include "core/fp8.h"
#include "core/quant.h"
#include "core/ttype.h"

#include <math.h>

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static bool code_is_nan(uint8_t c) { return (c & 0x7f) == 0x7f; }

typedef struct counts {
    long dec, enc, saturated;
} counts;

/* Checks every line of `path`; fails at the first difference. */
static void check_table(const char *path, counts *n) {
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    char line[128];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        char kind[8];
        unsigned a = 0, b = 0;
        if (sscanf(line, "%7s %x %x", kind, &a, &b) != 3)
            fail_msg("%s: bad line '%.40s'", path, line);
        if (strcmp(kind, "dec") == 0) {
            const float got = llmi_fp8_e4m3_to_f32((uint8_t)a);
            const float lut = llmi_kvq_fp8_e4m3_values[a & 255];
            if (isnan(u2f(b)) ? !isnan(got) || !isnan(lut) : f2u(got) != b || f2u(lut) != b)
                fail_msg("decode %02x: %08x (table %08x), ml_dtypes %08x", a, f2u(got), f2u(lut),
                         b);
            n->dec++;
        } else if (strcmp(kind, "enc") == 0) {
            const float x = u2f(a);
            const uint8_t got = llmi_f32_to_fp8_e4m3(x);
            uint8_t want = (uint8_t)b;
            if (isnan(x)) {
                if (!code_is_nan(got) || !code_is_nan(want))
                    fail_msg("encode NaN %08x: %02x, ml_dtypes %02x", a, got, want);
                n->enc++;
                continue;
            }
            if (code_is_nan(want)) { /* ml_dtypes overflows; we saturate */
                if (!(fabsf(x) > 464.0f))
                    fail_msg("ml_dtypes gives NaN for %g", (double)x);
                want = (uint8_t)((a >> 24 & 0x80) | 0x7e);
                n->saturated++;
            }
            if (got != want)
                fail_msg("encode %08x (%.9g): %02x, want %02x", a, (double)x, got, want);
            n->enc++;
        } else
            fail_msg("%s: unknown line kind '%s'", path, kind);
    }
    fclose(f);
}

static void test_against_ml_dtypes(void **state) {
    (void)state;
    char path[1024];
    const char *dir = getenv("LLM_TEST_DATA");
    snprintf(path, sizeof path, "%s/golden/fp8-e4m3fn.txt", dir ? dir : "tests");
    counts n = {0, 0, 0};
    check_table(path, &n);
    print_message("%s: %ld codes decoded, %ld floats encoded (%ld saturated)\n", path, n.dec, n.enc,
                  n.saturated);
    assert_int_equal(n.dec, 256);
    assert_true(n.enc > 4000 && n.saturated > 100);
    const char *extra = getenv("LLM_TEST_FP8_TABLE");
    if (extra && *extra) {
        counts m = {0, 0, 0};
        check_table(extra, &m);
        print_message("%s: %ld codes decoded, %ld floats encoded (%ld saturated)\n", extra, m.dec,
                      m.enc, m.saturated);
        assert_true(m.enc > 0);
    }
}

/* Round trip of every finite code, and the properties the table shows. */
static void test_codes(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        const float v = llmi_fp8_e4m3_to_f32((uint8_t)c);
        if (code_is_nan((uint8_t)c)) {
            assert_true(isnan(v));
            continue;
        }
        assert_int_equal(llmi_f32_to_fp8_e4m3(v), c);
    }
    assert_true(llmi_fp8_e4m3_to_f32(0x7e) == LLMI_FP8_E4M3_MAX);
    assert_true(llmi_fp8_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_int_equal(llmi_f32_to_fp8_e4m3(INFINITY), 0x7e);
    assert_int_equal(llmi_f32_to_fp8_e4m3(-INFINITY), 0xfe);
    assert_int_equal(llmi_f32_to_fp8_e4m3(-NAN) & 0x7f, 0x7f);
    assert_int_equal(llmi_f32_to_fp8_e4m3(-0.0f), 0x80);
}

/* Blocks: d = amax / 448 in f32, codes of x / d; x comes back within half
 * an E4M3 step (2^-4 relative for normals, d * 2^-10 absolute below). */
static void test_blocks(void **state) {
    (void)state;
    uint64_t rng = 4242;
    print_message("block seed 4242\n");
    for (int it = 0; it < 200; it++) {
        float x[64], back[64];
        llmi_block_fp8_e4m3 q[2];
        for (int i = 0; i < 64; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const double u = (double)(rng >> 11) / 9007199254740992.0;
            x[i] = (float)((u - 0.5) * pow(2.0, (double)(it % 40) - 20.0));
        }
        if (it == 7)
            memset(x, 0, 32 * sizeof *x); /* a zero block */
        llmi_quantize_row(LLMI_T_FP8_E4M3, x, q, 64);
        llmi_dequantize_row(LLMI_T_FP8_E4M3, q, back, 64);
        for (int b = 0; b < 2; b++) {
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[32 * b + j]));
            assert_true(f2u(q[b].d) == f2u(amax / 448.0f));
            for (int j = 0; j < 32; j++) {
                const float xi = x[32 * b + j], d = q[b].d;
                assert_int_equal(q[b].qs[j], d != 0.0f ? llmi_f32_to_fp8_e4m3(xi / d) : 0);
                const double err = fabs((double)back[32 * b + j] - xi);
                const double tol = fmax(fabs((double)xi) * 0x1p-4, (double)d * 0x1p-10) * 1.0001;
                if (err > tol)
                    fail_msg("block %d value %d: %.9g back as %.9g", it, j, (double)xi,
                             (double)back[32 * b + j]);
            }
        }
    }
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_FP8_E4M3, 128), 4 * 36);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_FP8_E4M3, 48), 0);
    assert_false(llmi_ttype_get(LLMI_T_FP8_E4M3)->weight);
}

/* y = 0 + 1 * (1 * value(code)): the value itself, at every level. */
static void test_levels_decode(void **state) {
    (void)state;
    llmi_block_fp8_e4m3 b[8];
    for (int c = 0; c < 256; c++) {
        b[c / 32].d = 1.0f;
        b[c / 32].qs[c % 32] = (uint8_t)c;
    }
    for (int level = 0; level <= llmi_kernels_best_level(); level++) {
        llmi_kernels_set_level(level);
        float y[256] = {0};
        llmi_row_ops_get(LLMI_T_FP8_E4M3)->axpy(y, 1.0f, b, 256);
        for (int c = 0; c < 256; c++) {
            const float want = llmi_fp8_e4m3_to_f32((uint8_t)c);
            if (isnan(want) ? !isnan(y[c]) : y[c] != want) /* -0 + 0 is +0: compare values */
                fail_msg("level %d code %02x: %a, want %a", level, c, y[c], want);
        }
        /* dot: 1.0 (code 0x38) times 3.0 at element 5, scale 0.5, zeros elsewhere */
        llmi_block_fp8_e4m3 one = {0.5f, {0}};
        one.qs[5] = 0x38;
        float a[32] = {0};
        a[5] = 3.0f;
        assert_true(llmi_row_ops_get(LLMI_T_FP8_E4M3)->dot(a, &one, 32) == 1.5f);
    }
    llmi_kernels_set_level(-1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_ml_dtypes),
        cmocka_unit_test(test_codes),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_levels_decode),
    };
    if (getenv("LLM_TEST_FILTER"))
        cmocka_set_test_filter(getenv("LLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
