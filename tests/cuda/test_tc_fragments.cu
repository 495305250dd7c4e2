/* The tensor-core prefill kernel's index math (cuda/device_math.h), run
 * on the host: where mma.sync m16n8k16 fragments hold their elements and
 * which rows ldmatrix reads, against the PTX ISA's layouts; one warp's
 * S = Q K^T and P V simulated through the kernel's addresses and fragment
 * choices against plain matrix products (heads of 64 and 128); the 64-key
 * chunks and when a chunk needs no mask. Needs no GPU: the kernel calls the
 * same functions. Seeds are fixed and printed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

extern "C" {
#include <cmocka.h>

#include "core/core.h"
#include "core/ttype.h"
}

#include "device_math.h"

/* ---- deterministic random numbers ---- */

static uint64_t rng_state;

static void rng_seed(uint64_t seed, const char *what) {
    rng_state = seed;
    printf("# %s: seed %llu\n", what, (unsigned long long)seed);
}

static uint64_t rng_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t rng_below(uint32_t n) { return (uint32_t)(rng_u64() % n); }

static float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rng_u64() >> 11) * 0x1.0p-53);
}

/* ---- fragments ----
 * The PTX ISA's layouts ("Matrix fragments for mma.m16n8k16 with
 * floating point type" and ldmatrix), transcribed in its own terms:
 * element i of a fragment, groupID = laneid >> 2, threadID_in_group =
 * laneid % 4. The simulated ldmatrix and mma below use only these, so a
 * mistake in device_math.h's functions shows up as a wrong product. */

static void isa_a(uint32_t lane, uint32_t i, uint32_t *row, uint32_t *col) {
    const uint32_t g = lane >> 2, t = lane % 4;
    *row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
    *col = i < 4 ? t * 2 + (i & 1) : t * 2 + (i & 1) + 8;
}

static void isa_b(uint32_t lane, uint32_t i, uint32_t *row, uint32_t *col) {
    const uint32_t g = lane >> 2, t = lane % 4;
    *row = i < 2 ? t * 2 + (i & 1) : t * 2 + (i & 1) + 8;
    *col = g;
}

static void isa_c(uint32_t lane, uint32_t i, uint32_t *row, uint32_t *col) {
    const uint32_t g = lane >> 2, t = lane % 4;
    *row = i < 2 ? g : g + 8;
    *col = t * 2 + (i & 1);
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].b16: lane l gives the address of
 * row l % 8 of matrix l / 8 (8 consecutive elements); destination register
 * j of lane l holds matrix j's elements (l / 4, 2 (l % 4)) and (l / 4,
 * 2 (l % 4) + 1), or with .trans (2 (l % 4), l / 4) and (2 (l % 4) + 1,
 * l / 4); the first in the low half. addr: element offsets into mem. */
static void sim_ldmatrix(const uint16_t *mem, const size_t addr[32], bool trans,
                         uint32_t out[32][4]) {
    for (uint32_t l = 0; l < 32; l++)
        for (uint32_t j = 0; j < 4; j++) {
            uint16_t e[2];
            for (uint32_t h = 0; h < 2; h++) {
                const uint32_t r = trans ? 2 * (l % 4) + h : l / 4;
                const uint32_t c = trans ? l / 4 : 2 * (l % 4) + h;
                e[h] = mem[addr[8 * j + r] + c];
            }
            out[l][j] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
        }
}

static double b16_value(uint32_t reg, uint32_t half) {
    return llmi_bf16_to_f32((uint16_t)(reg >> (16 * half)));
}

/* D = A B + C for one warp of m16n8k16 (bf16 inputs, sums in double). */
static void sim_mma(double d[32][4], const uint32_t a[32][4], const uint32_t b[32][2]) {
    double am[16][16], bm[16][8], cm[16][8];
    uint32_t r, c;
    for (uint32_t l = 0; l < 32; l++) {
        for (uint32_t i = 0; i < 8; i++) {
            isa_a(l, i, &r, &c);
            am[r][c] = b16_value(a[l][i / 2], i % 2);
        }
        for (uint32_t i = 0; i < 4; i++) {
            isa_b(l, i, &r, &c);
            bm[r][c] = b16_value(b[l][i / 2], i % 2);
            isa_c(l, i, &r, &c);
            cm[r][c] = d[l][i];
        }
    }
    for (uint32_t l = 0; l < 32; l++)
        for (uint32_t i = 0; i < 4; i++) {
            isa_c(l, i, &r, &c);
            double sum = cm[r][c];
            for (uint32_t k = 0; k < 16; k++)
                sum += am[r][k] * bm[k][c];
            d[l][i] = sum;
        }
}

/* device_math.h's fragment layouts against the ISA's, element by element,
 * with a few entries read off the ISA's figures, and each a one-to-one
 * map of (lane, element) onto the matrix. */
static void test_mma_fragments(void **state) {
    (void)state;
    uint8_t seen_a[16][16] = {{0}}, seen_b[16][8] = {{0}}, seen_c[16][8] = {{0}};
    for (uint32_t l = 0; l < 32; l++) {
        uint32_t r, c, rr, cc;
        for (uint32_t i = 0; i < 8; i++) {
            llmi_cu_mma_a_rc(l, i, &r, &c);
            isa_a(l, i, &rr, &cc);
            assert_int_equal(r, rr);
            assert_int_equal(c, cc);
            seen_a[r][c]++;
        }
        for (uint32_t i = 0; i < 4; i++) {
            llmi_cu_mma_b_kn(l, i, &r, &c);
            isa_b(l, i, &rr, &cc);
            assert_int_equal(r, rr);
            assert_int_equal(c, cc);
            seen_b[r][c]++;
            llmi_cu_mma_c_rc(l, i, &r, &c);
            isa_c(l, i, &rr, &cc);
            assert_int_equal(r, rr);
            assert_int_equal(c, cc);
            seen_c[r][c]++;
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
    /* From the figures: T0 {a0,a1} = A[0][0..1], T5 a3 = A[9][10..11], T31
     * a2 = A[7][14..15]; T6 b1 = B[12..13][1]; T5 {c2,c3} = C[9][2..3]. */
    uint32_t r, c;
    llmi_cu_mma_a_rc(0, 1, &r, &c);
    assert_true(r == 0 && c == 1);
    llmi_cu_mma_a_rc(5, 6, &r, &c);
    assert_true(r == 9 && c == 10);
    llmi_cu_mma_a_rc(31, 5, &r, &c);
    assert_true(r == 7 && c == 15);
    llmi_cu_mma_b_kn(6, 2, &r, &c);
    assert_true(r == 12 && c == 1);
    llmi_cu_mma_c_rc(5, 3, &r, &c);
    assert_true(r == 9 && c == 3);
    /* P from the score accumulators: A element (row, key) of k-step kk is
     * accumulator element (row, key % 8) of key tile 2 kk + key / 8. */
    for (uint32_t l = 0; l < 32; l++)
        for (uint32_t reg = 0; reg < 4; reg++)
            for (uint32_t h = 0; h < 2; h++) {
                uint32_t t, e, ar, ac, cr, cc;
                llmi_cu_p_from_c(reg, h, &t, &e);
                isa_a(l, 2 * reg + h, &ar, &ac);
                isa_c(l, e, &cr, &cc);
                assert_int_equal(t, ac / 8);
                assert_int_equal(cr, ar);
                assert_int_equal(cc, ac % 8);
            }
    assert_int_equal(llmi_cu_pack_b16(0x1234, 0xabcd), 0xabcd1234u);
}

/* One warp of the tensor-core prefill kernel, simulated: its rows (warp 1:
 * CTA rows 16 .. 31) of staged queries times a 64-key chunk of K, through
 * the kernel's ldmatrix addresses, fragment choices and accumulator layout,
 * against a plain matrix product; then weights P (laid in the score
 * accumulators) times the chunk's V through ldmatrix.trans, against P V.
 * Shared rows padded by 8 elements as in the kernel; bf16 values. */
static void sim_warp(uint32_t hd) {
    const uint32_t stride = hd + 8, keys = 64, warp = 1, rows = 32;
    uint16_t *qs = (uint16_t *)calloc((size_t)rows * stride, 2);
    uint16_t *ks = (uint16_t *)calloc((size_t)keys * stride, 2);
    uint16_t *vs = (uint16_t *)calloc((size_t)keys * stride, 2);
    for (uint32_t m = 0; m < rows; m++)
        for (uint32_t d = 0; d < hd; d++)
            qs[m * stride + d] = llmi_f32_to_bf16(rng_uniform(-1.0f, 1.0f));
    for (uint32_t j = 0; j < keys; j++)
        for (uint32_t d = 0; d < hd; d++) {
            ks[j * stride + d] = llmi_f32_to_bf16(rng_uniform(-1.0f, 1.0f));
            vs[j * stride + d] = llmi_f32_to_bf16(rng_uniform(-1.0f, 1.0f));
        }
    const uint32_t ksteps = hd / 16, dtiles = hd / 8;
    uint32_t(*qa)[32][4] = (uint32_t(*)[32][4])malloc(sizeof(uint32_t[32][4]) * ksteps);
    size_t addr[32];
    for (uint32_t k = 0; k < ksteps; k++) {
        for (uint32_t l = 0; l < 32; l++) {
            uint32_t r, c;
            llmi_cu_ldsm_q_src(l, &r, &c);
            addr[l] = (size_t)(warp * 16 + r) * stride + c + 16 * k;
        }
        sim_ldmatrix(qs, addr, false, qa[k]);
    }
    double sc[8][32][4] = {{{0}}};
    for (uint32_t k = 0; k < ksteps; k++)
        for (uint32_t t = 0; t < 8; t += 2) {
            uint32_t b[32][4], b_lo[32][2], b_hi[32][2];
            for (uint32_t l = 0; l < 32; l++) {
                uint32_t key, dim;
                llmi_cu_ldsm_k_src(l, &key, &dim);
                addr[l] = (size_t)(8 * t + key) * stride + 16 * k + dim;
            }
            sim_ldmatrix(ks, addr, false, b);
            for (uint32_t l = 0; l < 32; l++) {
                b_lo[l][0] = b[l][0];
                b_lo[l][1] = b[l][1];
                b_hi[l][0] = b[l][2];
                b_hi[l][1] = b[l][3];
            }
            sim_mma(sc[t], qa[k], b_lo);
            sim_mma(sc[t + 1], qa[k], b_hi);
        }
    for (uint32_t t = 0; t < 8; t++)
        for (uint32_t l = 0; l < 32; l++)
            for (uint32_t e = 0; e < 4; e++) {
                uint32_t r, c;
                llmi_cu_mma_c_rc(l, e, &r, &c);
                const uint32_t m = warp * 16 + r, key = 8 * t + c;
                double want = 0.0;
                for (uint32_t d = 0; d < hd; d++)
                    want += (double)llmi_bf16_to_f32(qs[m * stride + d]) *
                            llmi_bf16_to_f32(ks[key * stride + d]);
                if (fabs(sc[t][l][e] - want) > 1e-9)
                    fail_msg("hd %u: S[%u][%u] %.17g, plain product %.17g", hd, m, key, sc[t][l][e],
                             want);
            }

    /* P V: weights pm[row][key] placed in the accumulators as the ISA lays
     * them out, packed to A fragments as the kernel does. */
    static float pm[16][64];
    for (uint32_t r = 0; r < 16; r++)
        for (uint32_t j = 0; j < keys; j++)
            pm[r][j] = rng_uniform(0.0f, 1.0f);
    float acc_p[8][32][4];
    for (uint32_t t = 0; t < 8; t++)
        for (uint32_t l = 0; l < 32; l++)
            for (uint32_t e = 0; e < 4; e++) {
                uint32_t r, c;
                isa_c(l, e, &r, &c);
                acc_p[t][l][e] = pm[r][8 * t + c];
            }
    double(*o)[32][4] = (double(*)[32][4])calloc(dtiles, sizeof(double[32][4]));
    for (uint32_t kk = 0; kk < keys / 16; kk++) {
        uint32_t pa[32][4];
        for (uint32_t l = 0; l < 32; l++)
            for (uint32_t reg = 0; reg < 4; reg++) {
                uint32_t t0, e0, t1, e1;
                llmi_cu_p_from_c(reg, 0, &t0, &e0);
                llmi_cu_p_from_c(reg, 1, &t1, &e1);
                pa[l][reg] = llmi_cu_pack_b16(llmi_cu_f32_to_bf16(acc_p[2 * kk + t0][l][e0]),
                                              llmi_cu_f32_to_bf16(acc_p[2 * kk + t1][l][e1]));
            }
        for (uint32_t t = 0; t < dtiles; t += 2) {
            uint32_t b[32][4], b_lo[32][2], b_hi[32][2];
            for (uint32_t l = 0; l < 32; l++) {
                uint32_t key, dim;
                llmi_cu_ldsm_vt_src(l, &key, &dim);
                addr[l] = (size_t)(16 * kk + key) * stride + 8 * t + dim;
            }
            sim_ldmatrix(vs, addr, true, b);
            for (uint32_t l = 0; l < 32; l++) {
                b_lo[l][0] = b[l][0];
                b_lo[l][1] = b[l][1];
                b_hi[l][0] = b[l][2];
                b_hi[l][1] = b[l][3];
            }
            sim_mma(o[t], pa, b_lo);
            sim_mma(o[t + 1], pa, b_hi);
        }
    }
    for (uint32_t t = 0; t < dtiles; t++)
        for (uint32_t l = 0; l < 32; l++)
            for (uint32_t e = 0; e < 4; e++) {
                uint32_t r, c;
                llmi_cu_mma_c_rc(l, e, &r, &c);
                const uint32_t d = 8 * t + c;
                double want = 0.0;
                for (uint32_t j = 0; j < keys; j++)
                    want += (double)llmi_bf16_to_f32(llmi_f32_to_bf16(pm[r][j])) *
                            llmi_bf16_to_f32(vs[j * stride + d]);
                if (fabs(o[t][l][e] - want) > 1e-9)
                    fail_msg("hd %u: O[%u][%u] %.17g, plain product %.17g", hd, r, d, o[t][l][e],
                             want);
            }
    free(o);
    free(qa);
    free(qs);
    free(ks);
    free(vs);
}

static void test_tc_warp_products(void **state) {
    (void)state;
    rng_seed(0x5eed000c, "tensor-core warp products");
    sim_warp(64);
    sim_warp(128);
}

/* The tensor-core kernel's 64-key chunks: for random tiles, every key a row
 * sees lies in them, the chunks holding a row's keys are the aligned ones
 * from its first key to its own position, whatever tile it is in, and a
 * chunk is unmasked (full) exactly when every row sees all of it. */
static void test_tc_chunks(void **state) {
    (void)state;
    rng_seed(0x5eed000d, "tensor-core chunks");
    const uint32_t chunk = 64;
    for (int trial = 0; trial < 3000; trial++) {
        const uint32_t p0 = rng_below(trial % 2 ? 5000 : 150), n = 1 + rng_below(32);
        const uint32_t window = rng_below(3) == 0 ? 0 : 1 + rng_below(trial % 3 ? 200 : 3000);
        uint32_t kb0, n_chunks;
        llmi_cu_prefill_chunks(p0, n, window, chunk, &kb0, &n_chunks);
        const uint64_t end = (uint64_t)kb0 + (uint64_t)n_chunks * chunk;
        assert_int_equal(kb0 % chunk, 0);
        assert_true(kb0 <= llmi_cu_attn_first(p0, window) && end > p0 + n - 1 &&
                    end - chunk <= p0 + n - 1);
        /* A chunk called full is seen whole by every row; the chunks
         * strictly inside the causal and window bounds of all rows are
         * called full. */
        for (uint32_t c = 0; c < n_chunks; c++) {
            const uint32_t kb = kb0 + c * chunk;
            bool all = true;
            for (uint32_t i = 0; i < n && all; i++)
                for (uint32_t q = kb; q < kb + chunk && all; q++)
                    all = llmi_cu_prefill_sees(p0, n, window, i, q);
            assert_int_equal(llmi_cu_prefill_chunk_full(p0, n, window, kb, chunk), all);
        }
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t p = p0 + i, first = window && p >= window ? p - window + 1 : 0;
            assert_true(first >= kb0 && p < end);
            /* A tile starting at this row would begin its chunks at or after
             * this tile's, at the chunk of the row's first key. */
            uint32_t kb_alone, n_alone;
            llmi_cu_prefill_chunks(p, 1, window, chunk, &kb_alone, &n_alone);
            assert_int_equal(kb_alone, first / chunk * chunk);
            assert_int_equal(kb_alone + (n_alone - 1) * chunk, p / chunk * chunk);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mma_fragments),
        cmocka_unit_test(test_tc_warp_products),
        cmocka_unit_test(test_tc_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
