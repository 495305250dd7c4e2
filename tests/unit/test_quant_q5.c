/* Q5_0 and Q5_1 against llama.cpp's reference: tests/golden/q5-blocks.txt,
 * recorded by tests/golden/make_q5_blocks.py with the PyPI package gguf.
 *
 * deq lines: blocks of a real Q4_K_M file (Gemma 3 270M's Q5_0 matrices);
 * llmi_dequantize_row must give gguf.quants.dequantize's floats bit for bit.
 * quant lines: random f32 blocks; llmi_quantize_row must give the bytes
 * gguf.quants.quantize gives (ggml's reference rounding), and those bytes
 * dequantize to the recorded floats. Also: the kernels' view of the same
 * blocks (a one-row matmul with a one-hot activation picks one weight) and
 * the type table entries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/kernels.h"
#include "core/quant.h"
#include "core/ttype.h"

enum { LINE = 4096, QK = 32, MAX_BLOCK_BYTES = 24 };

static FILE *open_golden(const char *name) {
    char path[1024];
    const char *dir = getenv("LLM_TEST_DATA");
    snprintf(path, sizeof path, "%s/golden/%s", dir ? dir : "tests", name);
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    return f;
}

static llmi_ttype parse_type(const char *s) {
    if (strcmp(s, "Q5_0") == 0)
        return LLMI_T_Q5_0;
    if (strcmp(s, "Q5_1") == 0)
        return LLMI_T_Q5_1;
    fail_msg("unknown type '%s'", s);
    return LLMI_T_F32;
}

/* Hex bytes at *s up to a space; returns the count. */
static size_t parse_bytes(char **s, uint8_t *out, size_t cap) {
    while (**s == ' ')
        (*s)++;
    size_t n = 0;
    while ((*s)[0] && (*s)[0] != ' ' && (*s)[0] != '\n') {
        unsigned v;
        if (n >= cap || sscanf(*s, "%2x", &v) != 1)
            fail_msg("bad block bytes at '%.20s'", *s);
        out[n++] = (uint8_t)v;
        *s += 2;
    }
    return n;
}

/* 32 floats given as the hex of their bits. */
static void parse_floats(char **s, float *out) {
    for (int j = 0; j < QK; j++) {
        char *end;
        const unsigned long bits = strtoul(*s, &end, 16);
        if (end == *s)
            fail_msg("bad float bits at '%.20s'", *s);
        const uint32_t b = (uint32_t)bits;
        memcpy(&out[j], &b, 4);
        *s = end;
    }
}

static void expect_colon(char **s) {
    while (**s == ' ')
        (*s)++;
    if (**s != ':')
        fail_msg("expected ':' at '%.20s'", *s);
    (*s)++;
}

static void assert_same_floats(const float *got, const float *want, const char *what) {
    if (memcmp(got, want, QK * sizeof(float)) != 0)
        for (int j = 0; j < QK; j++)
            if (memcmp(&got[j], &want[j], sizeof(float)) != 0)
                fail_msg("%s: element %d is %.9g, gguf gives %.9g", what, j, got[j], want[j]);
}

/* Row 0 of a one-block weight times the one-hot activation e_j at the float
 * path: exactly element j's value (the other products are w * 0). */
static void check_kernel_view(llmi_ttype type, const uint8_t *blk, const float *want,
                              const char *what) {
    llmi_weight w = {blk, type, 1, QK, llmi_ttype_row_bytes(type, QK)};
    for (int j = 0; j < QK; j++) {
        float x[QK] = {0}, y = -1.0f;
        x[j] = 1.0f;
        llmi_matmul(NULL, &w, x, 1, &y);
        if (memcmp(&y, &want[j], sizeof y) != 0 && !(y == 0.0f && want[j] == 0.0f))
            fail_msg("%s: the f32 matmul sees element %d as %.9g, gguf gives %.9g", what, j, y,
                     want[j]);
    }
}

static void test_recorded_blocks(void **state) {
    (void)state;
    FILE *f = open_golden("q5-blocks.txt");
    char *line = malloc(LINE);
    assert_non_null(line);
    int n_deq[2] = {0, 0}, n_quant[2] = {0, 0};
    while (fgets(line, LINE, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        char kind[16], tname[16];
        int used = 0;
        if (sscanf(line, "%15s %15s %n", kind, tname, &used) != 2)
            fail_msg("bad line '%.40s'", line);
        const llmi_ttype type = parse_type(tname);
        const size_t bb = llmi_ttype_get(type)->block_bytes;
        char *s = line + used;
        uint8_t blk[MAX_BLOCK_BYTES], mine[MAX_BLOCK_BYTES];
        float want[QK], got[QK];
        char what[160];
        if (strcmp(kind, "deq") == 0) {
            char tensor[96];
            long index;
            if (sscanf(s, "%95s %ld %n", tensor, &index, &used) != 2)
                fail_msg("bad deq line '%.40s'", line);
            s += used;
            snprintf(what, sizeof what, "%s %s block %ld", tname, tensor, index);
            assert_int_equal(parse_bytes(&s, blk, sizeof blk), bb);
            expect_colon(&s);
            parse_floats(&s, want);
            llmi_dequantize_row(type, blk, got, QK);
            assert_same_floats(got, want, what);
            check_kernel_view(type, blk, want, what);
            n_deq[type == LLMI_T_Q5_1]++;
        } else if (strcmp(kind, "quant") == 0) {
            float x[QK];
            parse_floats(&s, x);
            expect_colon(&s);
            assert_int_equal(parse_bytes(&s, blk, sizeof blk), bb);
            expect_colon(&s);
            parse_floats(&s, want);
            snprintf(what, sizeof what, "%s quant line %d", tname, n_quant[0] + n_quant[1] + 1);
            llmi_quantize_row(type, x, mine, QK);
            if (memcmp(mine, blk, bb) != 0)
                for (size_t i = 0; i < bb; i++)
                    if (mine[i] != blk[i])
                        fail_msg("%s: byte %zu is %02x, gguf writes %02x", what, i, mine[i],
                                 blk[i]);
            llmi_dequantize_row(type, blk, got, QK);
            assert_same_floats(got, want, what);
            check_kernel_view(type, blk, want, what);
            n_quant[type == LLMI_T_Q5_1]++;
        }
    }
    free(line);
    fclose(f);
    print_message("checked %d Q5_0 file blocks, %d Q5_0 and %d Q5_1 quantized blocks\n", n_deq[0],
                  n_quant[0], n_quant[1]);
    assert_true(n_deq[0] >= 6);
    assert_true(n_quant[0] >= 10 && n_quant[1] >= 10);
}

static void test_type_table(void **state) {
    (void)state;
    const llmi_ttype_info *q50 = llmi_ttype_get(LLMI_T_Q5_0), *q51 = llmi_ttype_get(LLMI_T_Q5_1);
    assert_non_null(q50);
    assert_non_null(q51);
    assert_string_equal(q50->name, "Q5_0");
    assert_string_equal(q51->name, "Q5_1");
    assert_int_equal(q50->block, 32);
    assert_int_equal(q51->block, 32);
    assert_int_equal(q50->block_bytes, 22); /* ggml's block_q5_0 */
    assert_int_equal(q51->block_bytes, 24); /* ggml's block_q5_1 */
    assert_true(q50->weight && q51->weight);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_Q5_0, 640), 20 * 22);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_Q5_1, 640), 20 * 24);
    assert_int_equal(llmi_ttype_row_bytes(LLMI_T_Q5_0, 40), 0);
    assert_true(llmi_kernels_type_supported(LLMI_T_Q5_0));
    assert_true(llmi_kernels_type_supported(LLMI_T_Q5_1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_table),
        cmocka_unit_test(test_recorded_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
