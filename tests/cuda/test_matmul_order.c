/* The batch-invariant matmul's arithmetic (cuda/matmul_tc_math.h) on the
 * host, no GPU needed:
 *  - the fragment maps against the PTX ISA's m16n8k16 layouts, written
 *    out here from the ISA's tables;
 *  - the Q8_0 / Q4_0 integers times the block scale against the core's
 *    reference dequantization, bit for bit;
 *  - a model of the kernel: stage copies, fragments, mma, the SCALED
 *    partials and the F16 hi/lo split walked exactly as
 *    cuda/kernels_matmul_tc.cu walks them for every tile shape, with a
 *    stand-in mma (any fixed function of its 16 products and accumulator
 *    does). Every output row must have the same bits for every row count
 *    and every tile shape, and equal the per-element rule (k-steps in
 *    ascending order into one accumulator) computed directly. */
#include "matmul_tc_math.h"

#include "core/core.h"
#include "core/quant.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 17;
}

static float rng_float(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) % 2000000) / 1000000.0 - 1.0);
}

/* ---- fragment layouts ---- */

/* The PTX ISA's tables for mma.m16n8k16 with 16-bit A/B and f32 C/D
 * ("Matrix Fragments for mma.m16n8k16 with floating point type"):
 * groupID = lane >> 2, threadID_in_group = lane % 4;
 * A element a_i (i = 0 .. 7): row groupID for i in {0,1,4,5}, else
 *   groupID + 8; col threadID_in_group * 2 + (i & 1), plus 8 for i >= 4.
 * B element b_i (i = 0 .. 3): row (k) threadID_in_group * 2 + (i & 1),
 *   plus 8 for i >= 2; col (n) groupID.
 * C element c_i (i = 0 .. 3): row groupID, plus 8 for i >= 2; col
 *   threadID_in_group * 2 + (i & 1).
 * A 32-bit register holds two consecutive elements, the lower index in
 * the low half. */
static void ptx_a(uint32_t lane, uint32_t i, uint32_t *row, uint32_t *col) {
    const uint32_t g = lane >> 2, t = lane % 4;
    *row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
    *col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
}
static void ptx_b(uint32_t lane, uint32_t i, uint32_t *k, uint32_t *n) {
    *k = (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0);
    *n = lane >> 2;
}
static void ptx_c(uint32_t lane, uint32_t i, uint32_t *row, uint32_t *col) {
    *row = (lane >> 2) + (i >= 2 ? 8 : 0);
    *col = (lane % 4) * 2 + (i & 1);
}

static void test_fragment_layouts(void **state) {
    (void)state;
    int seen_a[16][16] = {{0}}, seen_b[16][8] = {{0}}, seen_c[16][8] = {{0}};
    for (uint32_t lane = 0; lane < 32; lane++) {
        for (uint32_t i = 0; i < 8; i++) {
            uint32_t row, col;
            ptx_a(lane, i, &row, &col);
            assert_int_equal(llmi_mmtc_a_row(lane, i / 2), row);
            assert_int_equal(llmi_mmtc_a_col(lane, i / 2) + i % 2, col);
            seen_a[row][col]++;
        }
        for (uint32_t i = 0; i < 4; i++) {
            uint32_t k, n, row, col;
            ptx_b(lane, i, &k, &n);
            assert_int_equal(llmi_mmtc_b_k(lane, i / 2) + i % 2, k);
            assert_int_equal(lane / 4, n);
            seen_b[k][n]++;
            ptx_c(lane, i, &row, &col);
            assert_int_equal(llmi_mmtc_c_row(lane, i), row);
            assert_int_equal(llmi_mmtc_c_col(lane, i), col);
            seen_c[row][col]++;
        }
    }
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 16; c++)
            assert_int_equal(seen_a[r][c], 1);
        for (int c = 0; c < 8; c++) {
            assert_int_equal(seen_b[r][c], 1);
            assert_int_equal(seen_c[r][c], 1);
        }
    }
}

/* ---- types ---- */

static void test_types_and_sizes(void **state) {
    (void)state;
    const llmi_ttype taken[] = {LLMI_T_BF16, LLMI_T_F16,  LLMI_T_Q8_0, LLMI_T_Q4_0,
                                LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1};
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        const llmi_ttype t = taken[i];
        const uint32_t bb = llmi_mmtc_block_bytes(t);
        /* Block bytes as the core lays the types out. */
        assert_int_equal(bb, bb == 2 ? llmi_ttype_row_bytes(t, 1) : llmi_ttype_row_bytes(t, 32));
        /* A stage is whole blocks, copied in whole pieces. */
        assert_int_equal(llmi_mmtc_chunk_bytes(t), llmi_ttype_row_bytes(t, LLMI_MMTC_KC));
        assert_int_equal(llmi_mmtc_chunk_bytes(t) % llmi_mmtc_copy_bytes(t), 0);
        const uint64_t rb = llmi_ttype_row_bytes(t, 576);
        assert_true(llmi_mmtc_takes(t, 576, rb, 256));
        assert_false(llmi_mmtc_takes(t, 544, llmi_ttype_row_bytes(t, 544), 256)); /* 17 x 32 */
        assert_false(llmi_mmtc_takes(t, 576, rb, 2));
        assert_false(llmi_mmtc_takes(t, 576, rb - 2, 256));
    }
    /* Q4_K: a stage is the super-block's header and 32 bytes of quants,
     * 16-byte copies; widths of whole super-blocks. */
    assert_int_equal(llmi_mmtc_kind_of(LLMI_T_Q4_K), LLMI_MMTC_DEQ);
    assert_int_equal(llmi_mmtc_chunk_bytes(LLMI_T_Q4_K), 48);
    assert_int_equal(llmi_mmtc_copy_bytes(LLMI_T_Q4_K), 16);
    assert_true(llmi_mmtc_takes(LLMI_T_Q4_K, 512, llmi_ttype_row_bytes(LLMI_T_Q4_K, 512), 256));
    assert_false(llmi_mmtc_takes(LLMI_T_Q4_K, 576, 1 << 20, 256));
    assert_false(llmi_mmtc_takes(LLMI_T_Q4_K, 512, 296, 256)); /* row pitch not 16-aligned */
    const llmi_ttype refused[] = {LLMI_T_F32, LLMI_T_Q6_K, LLMI_T_Q8_1};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        assert_int_equal(llmi_mmtc_kind_of(refused[i]), LLMI_MMTC_NONE);
        assert_false(llmi_mmtc_takes(refused[i], 4096, 1 << 20, 256));
    }
    /* Shapes: tiles of whole warps of whole 16 x 16 pairs; the largest fits
     * an H200's 227 KiB of shared memory a CTA (and an A100's 163). */
    for (uint32_t id = 0; id < LLMI_MMTC_TILES; id++) {
        const llmi_mmtc_tile sh = llmi_mmtc_tile_shape(id);
        assert_int_equal(sh.bm % (16 * sh.warps_m), 0);
        assert_int_equal(sh.bn % (16 * sh.warps_n), 0);
        assert_true(sh.stages >= 2);
        for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++)
            assert_true(llmi_mmtc_smem_bytes(sh, taken[i]) <= 163 * 1024);
        assert_true(llmi_mmtc_smem_bytes(sh, LLMI_T_Q4_K) <= 163 * 1024);
    }
    assert_int_equal(llmi_mmtc_tile_for(1), LLMI_MMTC_TILE_DECODE);
    assert_int_equal(llmi_mmtc_tile_for(16), LLMI_MMTC_TILE_DECODE);
    assert_int_equal(llmi_mmtc_tile_for(17), LLMI_MMTC_TILE_MID);
    assert_int_equal(llmi_mmtc_tile_for(64), LLMI_MMTC_TILE_MID);
    assert_int_equal(llmi_mmtc_tile_for(65), LLMI_MMTC_TILE_PREFILL);
}

/* d * q (f32) is the core's dequantized value bit for bit, and q is exact
 * in bf16: the SCALED fragments lose nothing. */
static void test_scaled_ints_match_reference(void **state) {
    (void)state;
    const llmi_ttype types[] = {LLMI_T_Q8_0, LLMI_T_Q4_0};
    uint64_t s = 0x5eed;
    enum { N = 32 * 64 };
    float src[N], ref[N];
    uint8_t q[N * 2];
    for (size_t ti = 0; ti < 2; ti++) {
        const llmi_ttype t = types[ti];
        for (int i = 0; i < N; i++) /* blocks of very different scales */
            src[i] = rng_float(&s) * ldexpf(1.0f, (int)(i / 32 % 24) - 12);
        llmi_quantize_row(t, src, q, N);
        llmi_dequantize_row(t, q, ref, N);
        const uint32_t bb = llmi_mmtc_block_bytes(t);
        for (int b = 0; b < N / 32; b++) {
            const uint8_t *blk = q + (size_t)b * bb;
            const float d = llmi_f16_to_f32((uint16_t)llmi_mmtc_scale_bits(blk));
            for (uint32_t j = 0; j < 32; j++) {
                const int v = llmi_mmtc_int_at(t, blk, j);
                assert_true(v >= -128 && v <= 127);
                assert_true(llmi_bf16_to_f32(llmi_f32_to_bf16((float)v)) == (float)v);
                const float got = d * (float)v, want = ref[32 * b + j];
                assert_memory_equal(&got, &want, sizeof got);
            }
        }
    }
}

/* Element 32 h + e of stage kc of a Q4_K row from the staged bytes, as the
 * kernel computes it: the sub-block's factors d0 = d * sc and n0 = dmin *
 * m from the staged header, then d0 * q - n0. */
static float q4k_stage_value(const uint8_t *row, uint32_t kc, uint32_t h, uint32_t e) {
    int sc, m;
    llmi_q4k_scale_min(row + 4, (int)llmi_mmtc_q4k_sub(kc, h), &sc, &m);
    const float d0 = llmi_f16_to_f32((uint16_t)llmi_mmtc_u16(row)) * (float)sc;
    const float n0 = llmi_f16_to_f32((uint16_t)llmi_mmtc_u16(row + 2)) * (float)m;
    return d0 * (float)llmi_mmtc_q4k_quant(row, h, e) - n0;
}

/* Q4_K stages copied as the kernel copies them give the core's
 * dequantized values, bit for bit, for every element of a row. */
static void test_q4k_stages_match_reference(void **state) {
    (void)state;
    enum { K = 1024 };
    uint64_t s = 0x4c4b;
    float src[K], ref[K];
    uint8_t q[K], stage[48];
    for (int i = 0; i < K; i++)
        src[i] = rng_float(&s) * ldexpf(1.0f, (int)(i / 32 % 9) - 4) + (i / 64 % 2 ? 0.5f : 0.0f);
    llmi_quantize_row(LLMI_T_Q4_K, src, q, K);
    llmi_dequantize_row(LLMI_T_Q4_K, q, ref, K);
    const uint32_t pieces = llmi_mmtc_chunk_bytes(LLMI_T_Q4_K) / llmi_mmtc_copy_bytes(LLMI_T_Q4_K);
    for (uint32_t kc = 0; kc < K / LLMI_MMTC_KC; kc++) {
        for (uint32_t c = 0; c < pieces; c++)
            memcpy(stage + llmi_mmtc_a_dst(LLMI_T_Q4_K, 0, c),
                   q + llmi_mmtc_a_src(LLMI_T_Q4_K, 0, 0, kc, c), 16);
        for (uint32_t h = 0; h < 2; h++)
            for (uint32_t e = 0; e < 32; e++) {
                const float got = q4k_stage_value(stage + llmi_mmtc_a_block(LLMI_T_Q4_K, 0, h), kc,
                                                  h, e),
                            want = ref[LLMI_MMTC_KC * kc + 32 * h + e];
                assert_memory_equal(&got, &want, sizeof got);
            }
    }
}

/* ---- the kernel's model ---- */

/* Stand-in for one element of the tensor core's d = c + a . b: a fixed
 * function of its inputs (the products are exact; summed in double). */
static float mma_elem(float c, const float a[16], const float b[16]) {
    double sum = 0.0;
    for (int i = 0; i < 16; i++)
        sum += (double)a[i] * (double)b[i];
    return (float)((double)c + sum);
}

static float bf16_round(float f) { return llmi_bf16_to_f32(llmi_f32_to_bf16(f)); }

/* One m16n8k16 on a warp's fragments: a[lane][8] A elements in register
 * order, b[lane][4], c[lane][4], through the ISA's maps. */
static void mma_warp(float c[32][4], const float a[32][8], const float b[32][4]) {
    float A[16][16], B[8][16], C[16][8];
    for (uint32_t lane = 0; lane < 32; lane++) {
        uint32_t r, k, n;
        for (uint32_t i = 0; i < 8; i++) {
            ptx_a(lane, i, &r, &k);
            A[r][k] = a[lane][i];
        }
        for (uint32_t i = 0; i < 4; i++) {
            ptx_b(lane, i, &k, &n);
            B[n][k] = b[lane][i];
            ptx_c(lane, i, &r, &n);
            C[r][n] = c[lane][i];
        }
    }
    for (uint32_t lane = 0; lane < 32; lane++)
        for (uint32_t i = 0; i < 4; i++) {
            uint32_t r, n;
            ptx_c(lane, i, &r, &n);
            c[lane][i] = mma_elem(C[r][n], A[r], B[n]);
        }
}

typedef struct problem {
    llmi_ttype type;
    const uint8_t *w;
    uint64_t row_bytes;
    uint32_t m, k;
    const uint16_t *x; /* bf16, x_stride = k */
    uint32_t n;
    const float *bias;
} problem;

static float u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return (float)v;
}

/* A fragment values of a lane for k-step s of half h of local rows r0..:
 * the kernel's a_frags. lo: F16's second operand. */
static void model_a(const problem *p, const uint8_t *sa, uint32_t r0, uint32_t h, uint32_t kc,
                    uint32_t s, uint32_t lane, float a[8], float lo[8], float d[2]) {
    const llmi_mmtc_kind kind = llmi_mmtc_kind_of(p->type);
    for (uint32_t i = 0; i < 8; i++) {
        const uint32_t r = r0 + llmi_mmtc_a_row(lane, i / 2), col = llmi_mmtc_a_col(lane, i / 2);
        if (kind == LLMI_MMTC_BF16 || kind == LLMI_MMTC_F16) {
            const uint16_t bits =
                (uint16_t)u16_at(sa + llmi_mmtc_a_elem(p->type, r, h, s, col) + 2 * (i % 2));
            const float w = kind == LLMI_MMTC_BF16 ? llmi_bf16_to_f32(bits) : llmi_f16_to_f32(bits);
            a[i] = bf16_round(w);
            lo[i] = bf16_round(w - a[i]);
        } else {
            const uint8_t *blk = sa + llmi_mmtc_a_block(p->type, r, h);
            const uint32_t j = 16 * s + col;
            if (kind == LLMI_MMTC_SCALED) {
                a[i] = (float)llmi_mmtc_int_at(p->type, blk, j + i % 2);
            } else if (p->type == LLMI_T_Q4_K) {
                a[i] = bf16_round(q4k_stage_value(blk, kc, h, j + i % 2));
            } else {
                float v[32];
                llmi_dequantize_row(p->type, blk, v, 32);
                a[i] = bf16_round(v[j + i % 2]);
            }
        }
    }
    for (uint32_t e = 0; e < 2; e++)
        d[e] = llmi_f16_to_f32((uint16_t)llmi_mmtc_scale_bits(
            sa + llmi_mmtc_a_block(p->type, r0 + llmi_mmtc_a_row(lane, e), h)));
}

/* The kernel with tile shape sh over problem p into y[n][m]. */
static void model_kernel(const problem *p, llmi_mmtc_tile sh, float *y) {
    const llmi_ttype t = p->type;
    const llmi_mmtc_kind kind = llmi_mmtc_kind_of(t);
    const uint32_t wm = sh.bm / sh.warps_m, wn = sh.bn / sh.warps_n, mi_n = wm / 16, ni_n = wn / 8;
    const uint32_t per_row = llmi_mmtc_chunk_bytes(t) / llmi_mmtc_copy_bytes(t);
    uint8_t *sa = calloc(sh.bm, llmi_mmtc_a_row_bytes(t));
    uint8_t *sb = calloc(sh.bn, LLMI_MMTC_B_ROW_BYTES);
    float *acc = calloc((size_t)sh.bm * sh.bn, sizeof(float)); /* [warp tiles][lane][4] */
    assert_non_null(sa);
    assert_non_null(sb);
    assert_non_null(acc);
    for (uint32_t m0 = 0; m0 < p->m; m0 += sh.bm)
        for (uint32_t n0 = 0; n0 < p->n; n0 += sh.bn) {
            memset(acc, 0, (size_t)sh.bm * sh.bn * sizeof(float));
            for (uint32_t kc = 0; kc < p->k / LLMI_MMTC_KC; kc++) {
                const uint32_t cp = llmi_mmtc_copy_bytes(t);
                for (uint32_t r = 0; r < sh.bm; r++)
                    for (uint32_t c = 0; c < per_row; c++) {
                        uint8_t *dst = sa + llmi_mmtc_a_dst(t, r, c);
                        if (m0 + r < p->m)
                            memcpy(dst, p->w + llmi_mmtc_a_src(t, p->row_bytes, m0 + r, kc, c), cp);
                        else
                            memset(dst, 0, cp);
                    }
                for (uint32_t r = 0; r < sh.bn; r++)
                    for (uint32_t c = 0; c < LLMI_MMTC_KC / 8; c++) {
                        uint8_t *dst = sb + llmi_mmtc_b_dst(r, c);
                        if (n0 + r < p->n)
                            memcpy(dst, p->x + llmi_mmtc_b_src(p->k, n0 + r, kc, c), 16);
                        else
                            memset(dst, 0, 16);
                    }
                for (uint32_t warp = 0; warp < sh.warps_m * sh.warps_n; warp++) {
                    const uint32_t wm0 = (warp % sh.warps_m) * wm, wn0 = (warp / sh.warps_m) * wn;
                    for (uint32_t h = 0; h < 2; h++)
                        for (uint32_t mi = 0; mi < mi_n; mi++) {
                            static float fa[2][32][8], flo[2][32][8], fd[32][2], fb[32][4];
                            for (uint32_t s = 0; s < 2; s++)
                                for (uint32_t lane = 0; lane < 32; lane++)
                                    model_a(p, sa, wm0 + 16 * mi, h, kc, s, lane, fa[s][lane],
                                            flo[s][lane], fd[lane]);
                            for (uint32_t ni = 0; ni < ni_n; ni++) {
                                float *tile =
                                    acc + (size_t)(warp * mi_n * ni_n + mi * ni_n + ni) * 128;
                                float c[32][4], part[32][4] = {{0}};
                                memcpy(c, tile, sizeof c);
                                for (uint32_t s = 0; s < 2; s++) {
                                    for (uint32_t lane = 0; lane < 32; lane++)
                                        for (uint32_t i = 0; i < 4; i++) {
                                            const uint32_t col = wn0 + 8 * ni + lane / 4;
                                            const uint32_t k = llmi_mmtc_b_k(lane, i / 2) + i % 2;
                                            fb[lane][i] = llmi_bf16_to_f32((uint16_t)u16_at(
                                                sb + llmi_mmtc_b_elem(col, h, s, k)));
                                        }
                                    if (kind == LLMI_MMTC_SCALED) {
                                        mma_warp(part, (const float(*)[8])fa[s], fb);
                                        continue;
                                    }
                                    mma_warp(c, (const float(*)[8])fa[s], fb);
                                    if (kind == LLMI_MMTC_F16)
                                        mma_warp(c, (const float(*)[8])flo[s], fb);
                                }
                                if (kind == LLMI_MMTC_SCALED)
                                    for (uint32_t lane = 0; lane < 32; lane++)
                                        for (uint32_t e = 0; e < 4; e++)
                                            c[lane][e] =
                                                fmaf(fd[lane][e / 2], part[lane][e], c[lane][e]);
                                memcpy(tile, c, sizeof c);
                            }
                        }
                }
            }
            for (uint32_t warp = 0; warp < sh.warps_m * sh.warps_n; warp++) {
                const uint32_t wm0 = (warp % sh.warps_m) * wm, wn0 = (warp / sh.warps_m) * wn;
                for (uint32_t mi = 0; mi < mi_n; mi++)
                    for (uint32_t ni = 0; ni < ni_n; ni++)
                        for (uint32_t lane = 0; lane < 32; lane++)
                            for (uint32_t e = 0; e < 4; e++) {
                                const uint32_t o = m0 + wm0 + 16 * mi + llmi_mmtc_c_row(lane, e);
                                const uint32_t j = n0 + wn0 + 8 * ni + llmi_mmtc_c_col(lane, e);
                                const float v =
                                    acc[(size_t)(warp * mi_n * ni_n + mi * ni_n + ni) * 128 +
                                        lane * 4 + e];
                                if (o < p->m && j < p->n)
                                    y[(size_t)j * p->m + o] = p->bias ? v + p->bias[o] : v;
                            }
            }
        }
    free(sa);
    free(sb);
    free(acc);
}

/* The rule itself for element (j, o): k-steps of 16 in ascending order
 * into one accumulator (per block a zeroed partial and fma(d, .) for the
 * SCALED types; hi then lo per k-step for F16), the bias after. */
static float rule(const problem *p, uint32_t j, uint32_t o, double *exact) {
    const llmi_mmtc_kind kind = llmi_mmtc_kind_of(p->type);
    float *w = malloc(p->k * sizeof(float));
    assert_non_null(w);
    llmi_dequantize_row(p->type, p->w + (size_t)o * p->row_bytes, w, p->k);
    float acc = 0.0f, part = 0.0f;
    *exact = 0.0;
    for (uint32_t ks = 0; ks < p->k / 16; ks++) {
        float a[16], lo[16], b[16];
        for (int i = 0; i < 16; i++) {
            const uint32_t k = 16 * ks + i;
            b[i] = llmi_bf16_to_f32(p->x[(size_t)j * p->k + k]);
            *exact += (double)w[k] * b[i];
            a[i] = bf16_round(w[k]);
            lo[i] = bf16_round(w[k] - a[i]);
        }
        if (kind == LLMI_MMTC_SCALED) {
            const uint8_t *blk =
                p->w + (size_t)o * p->row_bytes + (size_t)(ks / 2) * llmi_mmtc_block_bytes(p->type);
            const float d = llmi_f16_to_f32((uint16_t)llmi_mmtc_scale_bits(blk));
            for (uint32_t i = 0; i < 16; i++)
                a[i] = (float)llmi_mmtc_int_at(p->type, blk, 16 * (ks % 2) + i);
            part = mma_elem(ks % 2 ? part : 0.0f, a, b);
            if (ks % 2)
                acc = fmaf(d, part, acc);
            continue;
        }
        acc = mma_elem(acc, a, b);
        if (kind == LLMI_MMTC_F16)
            acc = mma_elem(acc, lo, b);
    }
    free(w);
    return p->bias ? acc + p->bias[o] : acc;
}

static void check_type(llmi_ttype t, uint64_t seed) {
    enum { M = 72, K = 512, NMAX = 300 };
    uint64_t s = seed;
    const uint64_t rb = llmi_ttype_row_bytes(t, K) + 16; /* a row pitch wider than the row */
    uint8_t *w = calloc(M, rb);
    uint16_t *x = malloc((size_t)NMAX * K * 2);
    float *row = malloc(K * sizeof(float)), bias[M];
    float *y1 = malloc((size_t)M * sizeof(float)), *y = malloc((size_t)NMAX * M * sizeof(float));
    assert_true(w && x && row && y1 && y);
    for (uint32_t o = 0; o < M; o++) {
        for (uint32_t k = 0; k < K; k++)
            row[k] = rng_float(&s) * (o % 3 == 0 ? 100.0f : 0.01f);
        llmi_quantize_row(t, row, w + o * rb, K);
        bias[o] = rng_float(&s);
    }
    for (size_t i = 0; i < (size_t)NMAX * K; i++)
        x[i] = llmi_f32_to_bf16(rng_float(&s) * 4.0f);
    problem p = {t, w, rb, M, K, x, 1, bias};
    const uint32_t ns[] = {1, 2, 3, 7, 8, 16, 17, 64, 65, 300};
    for (uint32_t o = 0; o < M; o++) {
        double exact;
        y1[o] = rule(&p, 0, o, &exact);
    }
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (uint32_t id = 0; id < LLMI_MMTC_TILES; id++) {
            p.n = ns[ni];
            /* Row j of x is row j of the batch: row 0 is the n = 1 row. */
            model_kernel(&p, llmi_mmtc_tile_shape(id), y);
            assert_memory_equal(y, y1, M * sizeof(float));
            for (uint32_t j = 1; j < p.n; j += 37)
                for (uint32_t o = 0; o < M; o++) {
                    double exact;
                    const float want = rule(&p, j, o, &exact);
                    assert_memory_equal(&y[(size_t)j * M + o], &want, sizeof want);
                }
        }
    /* And the rule is the product: the SCALED and F16 weights are exact,
     * the others rounded to bf16 (relative 2^-9 each); the f32 sums add
     * at most K ulps of the sum of |products|. */
    for (uint32_t o = 0; o < M; o++) {
        double exact, mag = 0.0;
        const float got = rule(&p, 0, o, &exact) - bias[o];
        llmi_dequantize_row(t, w + o * rb, row, K);
        for (uint32_t k = 0; k < K; k++)
            mag += fabs((double)row[k] * llmi_bf16_to_f32(x[k]));
        const bool rounded = llmi_mmtc_kind_of(t) == LLMI_MMTC_DEQ;
        const double tol = (rounded ? ldexp(1.0, -9) : 0.0) * mag + K * ldexp(1.0, -24) * mag +
                           ldexp(1.0, -24) * fabs(bias[o]);
        assert_true(fabs((double)got - exact) <= tol);
    }
    free(w);
    free(x);
    free(row);
    free(y1);
    free(y);
}

static void test_model_invariant(void **state) {
    (void)state;
    const llmi_ttype types[] = {LLMI_T_BF16, LLMI_T_F16,  LLMI_T_Q8_0, LLMI_T_Q4_0,
                                LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1, LLMI_T_Q4_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        check_type(types[i], 0x1234 + i);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fragment_layouts),
        cmocka_unit_test(test_types_and_sizes),
        cmocka_unit_test(test_scaled_ints_match_reference),
        cmocka_unit_test(test_q4k_stages_match_reference),
        cmocka_unit_test(test_model_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
