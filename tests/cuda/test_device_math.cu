/* The CUDA kernels' arithmetic (cuda/device_math.h), run on the host,
 * against the CPU backend's code and independent references: every block
 * type's dequantization bit for bit (random blocks, quantized rows and the
 * llama.cpp-recorded Q5 blocks of tests/golden/q5-blocks.txt), f16/bf16
 * rounding, KV slot addressing over shuffled block tables, the prefill
 * kernel's tiles (key chunks, causal and window masks, row layout), RoPE
 * angles, the split-KV softmax merge, the GLU activations, and the KV
 * store's Q8_0 / FP8 block quantization (kv_block_math.h) byte for byte
 * against core's quantizer with the values it reads back (the
 * tensor-core fragments: test_tc_fragments.cu). Needs no GPU: the same
 * functions run in the kernels. Seeds are fixed and printed. */
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

#include "backend/cpu/kernels.h"
#include "core/core.h"
#include "core/quant.h"
#include "core/ttype.h"
}

#include "device_math.h"
#include "kv_block_math.h"

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

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- dequantization ---- */

static const llmi_ttype all_types[] = {LLMI_T_F32,  LLMI_T_F16,  LLMI_T_BF16, LLMI_T_Q4_0,
                                       LLMI_T_Q4_1, LLMI_T_Q5_0, LLMI_T_Q5_1, LLMI_T_Q8_0,
                                       LLMI_T_Q4_K, LLMI_T_Q6_K};

/* A finite random half in [-2^e, 2^e] for a block's scale fields. */
static uint16_t random_scale(void) {
    return llmi_f32_to_f16(rng_uniform(-1.0f, 1.0f) * ldexpf(1.0f, (int)rng_below(12) - 8));
}

/* Overwrites a random block's f16 scale fields with finite values, so that
 * outputs compare as numbers (raw NaN scales are covered by the f16 test). */
static void sanitize_scales(llmi_ttype type, uint8_t *blk) {
    uint16_t h;
    size_t offs[2] = {0, SIZE_MAX};
    switch (type) {
    case LLMI_T_Q4_1:
    case LLMI_T_Q5_1:
    case LLMI_T_Q4_K:
        offs[1] = 2;
        break;
    case LLMI_T_Q6_K:
        offs[0] = offsetof(llmi_block_q6_k, d);
        break;
    default:
        break;
    }
    for (int i = 0; i < 2; i++) {
        if (offs[i] == SIZE_MAX)
            continue;
        h = random_scale();
        memcpy(blk + offs[i], &h, 2);
    }
}

/* One row of n elements of `type`: random bytes (scales sanitized) or a
 * quantized row of random floats of a random magnitude. */
static void random_row(llmi_ttype type, uint8_t *row, int64_t n, bool quantized) {
    const uint32_t be = llmi_cu_block_elems(type), bb = llmi_cu_block_bytes(type);
    if (quantized) {
        float *x = (float *)malloc((size_t)n * sizeof *x);
        const float mag = ldexpf(1.0f, (int)rng_below(16) - 10);
        for (int64_t i = 0; i < n; i++)
            x[i] = rng_uniform(-mag, mag) + (rng_below(4) == 0 ? mag : 0.0f);
        llmi_quantize_row(type, x, row, n);
        free(x);
        return;
    }
    for (size_t i = 0; i < (size_t)(n / be) * bb; i++)
        row[i] = (uint8_t)rng_u64();
    if (be > 1)
        for (int64_t b = 0; b < n / be; b++)
            sanitize_scales(type, row + (size_t)b * bb);
}

static void check_row(llmi_ttype type, const uint8_t *row, int64_t n, const float *ref) {
    const uint32_t be = llmi_cu_block_elems(type), bb = llmi_cu_block_bytes(type);
    for (int64_t i = 0; i < n; i++) {
        const float got = llmi_cu_deq_elem(type, row + (size_t)(i / be) * bb, (int)(i % be));
        if (bits_of(got) != bits_of(ref[i]))
            fail_msg("type %u element %lld: %a (0x%08x), CPU %a (0x%08x)", (unsigned)type,
                     (long long)i, got, bits_of(got), ref[i], bits_of(ref[i]));
    }
    if (be == 1)
        return;
    for (int64_t c = 0; c < n / 32; c++) {
        float w[32], wf[32], amax = 0.0f;
        llmi_cu_deq_chunk32(type, row, (uint32_t)c, w);
        llmi_cu_deq_chunk32(type, row, (uint32_t)c, wf, true);
        for (int j = 0; j < 32; j++) {
            if (bits_of(w[j]) != bits_of(ref[32 * c + j]))
                fail_msg("type %u chunk %lld element %d: %a, CPU %a", (unsigned)type, (long long)c,
                         j, w[j], ref[32 * c + j]);
            amax = fmaxf(amax, fabsf(w[j]));
        }
        /* The GEMV's fused variant: one rounding of d * q + m instead of
         * two, so within an ulp of the terms (each at most twice the
         * chunk's largest value); types without an offset are unchanged. */
        const bool offset = type == LLMI_T_Q4_1 || type == LLMI_T_Q5_1 || type == LLMI_T_Q4_K;
        for (int j = 0; j < 32; j++)
            if (offset ? !(fabsf(wf[j] - w[j]) <= ldexpf(amax, -21))
                       : bits_of(wf[j]) != bits_of(w[j]))
                fail_msg("type %u chunk %lld element %d fused: %a, exact %a", (unsigned)type,
                         (long long)c, j, wf[j], w[j]);
    }
}

static void test_dequant_matches_cpu(void **state) {
    (void)state;
    rng_seed(0x5eed0001, "dequantization");
    const int64_t n = 4 * LLMI_QK_K;
    uint8_t *row = (uint8_t *)malloc(n * 4);
    float *ref = (float *)malloc(n * sizeof *ref);
    for (size_t t = 0; t < sizeof all_types / sizeof all_types[0]; t++) {
        const llmi_ttype type = all_types[t];
        assert_int_equal(llmi_cu_block_bytes(type), llmi_ttype_get(type)->block_bytes);
        assert_int_equal(llmi_cu_block_elems(type), llmi_ttype_get(type)->block);
        for (int trial = 0; trial < 200; trial++) {
            random_row(type, row, n, trial % 2 == 0);
            llmi_dequantize_row(type, row, ref, n);
            check_row(type, row, n, ref);
        }
    }
    free(row);
    free(ref);
}

/* The llama.cpp-recorded Q5 blocks: our dequantization gives gguf's floats. */
static void test_dequant_q5_golden(void **state) {
    (void)state;
    char path[1024], line[8192];
    const char *dir = getenv("LLM_TEST_DATA");
    snprintf(path, sizeof path, "%s/golden/q5-blocks.txt", dir ? dir : "tests");
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    int checked = 0;
    while (fgets(line, sizeof line, f)) {
        char type_name[16], tensor[256], hex[128];
        unsigned blockno;
        int used = 0;
        if (sscanf(line, "deq %15s %255s %u %127s :%n", type_name, tensor, &blockno, hex, &used) !=
            4)
            continue;
        const llmi_ttype type = strcmp(type_name, "Q5_0") == 0 ? LLMI_T_Q5_0 : LLMI_T_Q5_1;
        uint8_t blk[32];
        const size_t nb = strlen(hex) / 2;
        assert_int_equal(nb, llmi_cu_block_bytes(type));
        for (size_t i = 0; i < nb; i++) {
            unsigned v;
            assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
            blk[i] = (uint8_t)v;
        }
        const char *p = line + used;
        float want[32], chunk[32];
        for (int j = 0; j < 32; j++) {
            unsigned u;
            int k = 0;
            assert_int_equal(sscanf(p, "%x%n", &u, &k), 1);
            p += k;
            want[j] = float_of(u);
        }
        llmi_cu_deq_chunk32(type, blk, 0, chunk);
        for (int j = 0; j < 32; j++) {
            assert_int_equal(bits_of(llmi_cu_deq_elem(type, blk, j)), bits_of(want[j]));
            assert_int_equal(bits_of(chunk[j]), bits_of(want[j]));
        }
        checked++;
    }
    fclose(f);
    assert_true(checked >= 4);
}

/* ---- f16 / bf16 ---- */

static void check_convert(float x) {
    const uint16_t h = llmi_f32_to_f16(x), b = llmi_f32_to_bf16(x);
    if (llmi_cu_f32_to_f16(x) != h)
        fail_msg("f16(%a): 0x%04x, CPU 0x%04x", x, llmi_cu_f32_to_f16(x), h);
    if (llmi_cu_f32_to_bf16(x) != b)
        fail_msg("bf16(%a): 0x%04x, CPU 0x%04x", x, llmi_cu_f32_to_bf16(x), b);
}

static void test_f16_bf16_rounding(void **state) {
    (void)state;
    const float edges[] = {
        0.0f,          -0.0f,         1.0f,          65504.0f,      65519.99f,
        65520.0f,      65536.0f,      6.1035156e-5f, 6.0975552e-5f, 5.9604645e-8f,
        2.9802322e-8f, 2.9802326e-8f, 8.940697e-8f,  1.0009766f,    1.0004883f,
        1.0014648f,    1.00390625f,   1.0078125f,    1.01171875f,   3.3895314e38f,
        3.4028235e38f, 1e-45f,        INFINITY,      -INFINITY,     NAN};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        check_convert(edges[i]);
        check_convert(-edges[i]);
    }
    /* Every 61st bit pattern (all exponents, both signs, NaNs included) and
     * every pattern around the f16 and bf16 rounding ties. */
    for (uint64_t u = 0; u < 0x100000000ull; u += 61)
        check_convert(float_of((uint32_t)u));
    rng_seed(0x5eed0002, "f16/bf16 ties");
    for (int i = 0; i < 1000000; i++) {
        const uint32_t u = (uint32_t)rng_u64();
        check_convert(float_of((u & ~0x1fffu) | 0x1000u)); /* f16 tie */
        check_convert(float_of((u & ~0xffffu) | 0x8000u)); /* bf16 tie */
    }
    /* Widening is exact: every half and bfloat16. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        assert_int_equal(bits_of(llmi_cu_f16_to_f32(h)), bits_of(llmi_f16_to_f32((uint16_t)h)));
        assert_int_equal(bits_of(llmi_cu_bf16_to_f32(h)), bits_of(llmi_bf16_to_f32((uint16_t)h)));
    }
}

/* ---- KV slots ---- */

/* Block tables built from a shuffled pool of blocks: the slot of (seq, pos)
 * is, by construction, pool block k of the sequence's share times the block
 * size plus pos mod block size; no two (seq, pos) share a slot. */
static void test_kv_slot_shuffled_tables(void **state) {
    (void)state;
    rng_seed(0x5eed0003, "KV slots");
    for (int trial = 0; trial < 200; trial++) {
        const uint32_t bs = 1 + rng_below(64), n_seqs = 1 + rng_below(8);
        uint32_t n_blocks_seq[8], block_start[9] = {0};
        for (uint32_t s = 0; s < n_seqs; s++) {
            n_blocks_seq[s] = 1 + rng_below(12);
            block_start[s + 1] = block_start[s] + n_blocks_seq[s];
        }
        const uint32_t total = block_start[n_seqs], pool = total + rng_below(16);
        uint32_t perm[256], blocks[128];
        for (uint32_t i = 0; i < pool; i++)
            perm[i] = i;
        for (uint32_t i = pool - 1; i > 0; i--) {
            const uint32_t j = rng_below(i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        memcpy(blocks, perm, total * sizeof *blocks);
        uint8_t *seen = (uint8_t *)calloc((size_t)pool * bs, 1);
        for (uint32_t s = 0; s < n_seqs; s++)
            for (uint32_t p = 0; p < n_blocks_seq[s] * bs; p++) {
                const uint32_t want = perm[block_start[s] + p / bs] * bs + p % bs;
                const uint32_t got = llmi_cu_kv_slot(block_start, blocks, bs, s, p);
                assert_int_equal(got, want);
                assert_int_equal(seen[got], 0);
                seen[got] = 1;
            }
        free(seen);
    }
    assert_int_equal(llmi_cu_attn_first(10, 0), 0);
    assert_int_equal(llmi_cu_attn_first(10, 4), 7); /* keys 7..10: p - q < 4 */
    assert_int_equal(llmi_cu_attn_first(3, 4), 0);
    assert_int_equal(llmi_cu_attn_first(4, 4), 1);
}

/* ---- prefill tiles ---- */

/* For random tiles (p0, n rows, window): a row sees exactly the keys q with
 * q <= p and p - q < window (all q <= p without one); every key a row sees
 * lies in the tile's chunks, which are aligned, start at or before the
 * first key and end at or after the last; the chunks holding a row's keys
 * are the aligned ones from its first key to its own position, whatever
 * p0 is (so its result does not depend on the tile); and the warps' score
 * registers hold every row of a tile once, in float4 groups. */
static void test_prefill_tiles(void **state) {
    (void)state;
    rng_seed(0x5eed0008, "prefill tiles");
    const uint32_t chunk = 32, tile = 32;
    for (int trial = 0; trial < 3000; trial++) {
        const uint32_t p0 = rng_below(trial % 2 ? 5000 : 70), n = 1 + rng_below(tile);
        const uint32_t window = rng_below(3) == 0 ? 0 : 1 + rng_below(trial % 3 ? 100 : 3000);
        uint32_t kb0, n_chunks;
        llmi_cu_prefill_chunks(p0, n, window, chunk, &kb0, &n_chunks);
        const uint64_t end = (uint64_t)kb0 + (uint64_t)n_chunks * chunk; /* past the last chunk */
        assert_int_equal(kb0 % chunk, 0);
        assert_true(kb0 <= llmi_cu_attn_first(p0, window) && end > p0 + n - 1 &&
                    end - chunk <= p0 + n - 1);
        for (uint32_t i = 0; i < tile; i++) {
            const uint32_t p = p0 + i;
            for (uint32_t q = kb0; q < end; q++) {
                const bool want = i < n && q <= p && (window == 0 || p - q < window);
                assert_int_equal(llmi_cu_prefill_sees(p0, n, window, i, q), want);
            }
            if (i >= n)
                continue;
            /* This row's chunks: from its first key's to its own. */
            uint64_t lo = UINT64_MAX, hi = 0;
            for (uint32_t q = kb0; q < end; q++)
                if (llmi_cu_prefill_sees(p0, n, window, i, q)) {
                    const uint64_t c = q / chunk * chunk;
                    lo = c < lo ? c : lo;
                    hi = c > hi ? c : hi;
                }
            const uint32_t first = p >= window && window ? p - window + 1 : 0;
            assert_int_equal(lo, first / chunk * chunk);
            assert_int_equal(hi, p / chunk * chunk);
        }
    }
    const uint32_t n_warps = 4, per_warp = tile / n_warps;
    uint8_t seen[32] = {0};
    for (uint32_t w = 0; w < n_warps; w++)
        for (uint32_t k = 0; k < per_warp; k++) {
            const uint32_t r = llmi_cu_prefill_row(w, n_warps, k);
            assert_true(r < tile);
            assert_int_equal(seen[r]++, 0);
            assert_int_equal(r / 4, n_warps * (k / 4) + w); /* the float4 the kernel loads */
            assert_int_equal(r % 4, k % 4);
        }
}

/* ---- RoPE ---- */

/* The CPU's rope_table (backend/cpu/step.c, static there), transcribed: the
 * angles must be bit-identical to it. */
static void cpu_rope_angles(uint32_t pos, float base, float freq_scale, const float *freq_div,
                            uint32_t rope_dim, float *angle) {
    float scale = powf(base, -2.0f / (float)rope_dim);
    float theta = (float)pos;
    for (uint32_t i = 0; i < rope_dim / 2; i++) {
        angle[i] = (freq_div ? theta / freq_div[i] : theta) * freq_scale;
        theta *= scale;
    }
}

static void test_rope_angles(void **state) {
    (void)state;
    rng_seed(0x5eed0004, "RoPE");
    const float bases[] = {10000.0f, 500000.0f, 1000000.0f, 10000.0f * 8};
    float freq_div[128], want[128];
    for (int trial = 0; trial < 400; trial++) {
        const uint32_t rope_dim = 2 * (1 + rng_below(4)) * 16; /* 32 .. 128 */
        const float base = bases[rng_below(4)];
        const float freq_scale = rng_below(2) ? 1.0f : 1.0f / (float)(1 + rng_below(8));
        const bool div = rng_below(2);
        for (uint32_t i = 0; i < rope_dim / 2; i++)
            freq_div[i] = rng_uniform(1.0f, 8.0f);
        const uint32_t pos = rng_below(trial % 4 == 0 ? 1u << 20 : 4096);
        cpu_rope_angles(pos, base, freq_scale, div ? freq_div : NULL, rope_dim, want);
        const float scale = powf(base, -2.0f / (float)rope_dim);
        for (uint32_t i = 0; i < rope_dim / 2; i++) {
            const float theta = llmi_cu_rope_theta(pos, scale, i);
            const float got = llmi_cu_rope_angle(theta, div ? freq_div : NULL, i, freq_scale);
            assert_int_equal(bits_of(got), bits_of(want[i]));
            /* And close to the exact angle: the float recurrence drifts by
             * at most about an ulp per step. */
            const double exact = (double)pos * pow((double)base, -2.0 * i / rope_dim) /
                                 (div ? (double)freq_div[i] : 1.0) * (double)freq_scale;
            assert_true(fabs((double)got - exact) <= (2.0 + i) * 1.2e-7 * fabs(exact) + 1e-30);
        }
    }
    uint32_t a, b;
    llmi_cu_rope_pair(0, 64, 5, &a, &b);
    assert_true(a == 10 && b == 11);
    llmi_cu_rope_pair(1, 64, 5, &a, &b);
    assert_true(a == 5 && b == 37);
    /* The rotation is step.c's rope_apply: x0 c - x1 s, x0 s + x1 c. */
    for (int i = 0; i < 10000; i++) {
        const float x0 = rng_uniform(-4, 4), x1 = rng_uniform(-4, 4), ang = rng_uniform(-9, 9);
        const float c = cosf(ang), s = sinf(ang);
        float y0 = x0, y1 = x1;
        llmi_cu_rope_rotate(c, s, &y0, &y1);
        assert_int_equal(bits_of(y0), bits_of(x0 * c - x1 * s));
        assert_int_equal(bits_of(y1), bits_of(x0 * s + x1 * c));
    }
}

/* ---- split-KV softmax merge ---- */

/* Partials over random splits of random scores, merged in split order as the
 * attention kernels do, against softmax(scores) . values in double. */
static void test_split_merge(void **state) {
    (void)state;
    rng_seed(0x5eed0005, "split merge");
    enum { MAXN = 2000, D = 8 };
    static float s[MAXN], v[MAXN][D];
    for (int trial = 0; trial < 300; trial++) {
        const int n = 1 + (int)rng_below(MAXN);
        const float spread = rng_uniform(0.1f, 40.0f);
        for (int i = 0; i < n; i++) {
            s[i] = rng_uniform(-spread, spread);
            /* Odd dimensions trend with the position, so that partials of
             * different splits have different means. */
            for (int d = 0; d < D; d++)
                v[i][d] = rng_uniform(-1.0f, 1.0f) + (d % 2 ? 3.0f * (float)i / (float)n : 0.0f);
        }
        double mx = -INFINITY, sum = 0.0, ref[D] = {0};
        for (int i = 0; i < n; i++)
            mx = s[i] > mx ? s[i] : mx;
        for (int i = 0; i < n; i++) {
            const double e = exp((double)s[i] - mx);
            sum += e;
            for (int d = 0; d < D; d++)
                ref[d] += e * v[i][d];
        }
        /* Random split points, empty splits included. */
        float m = -INFINITY, l = 0.0f, acc[D] = {0};
        int begin = 0;
        while (begin <= n) {
            const int end = begin + (int)rng_below(n / 3 + 2);
            const int stop = end < n ? end : n;
            float pm = -INFINITY, pl = 0.0f, pacc[D] = {0};
            for (int i = begin; i < stop; i++)
                pm = s[i] > pm ? s[i] : pm;
            for (int i = begin; i < stop; i++) {
                const float p = llmi_cu_softmax_weight(s[i], pm);
                pl += p;
                for (int d = 0; d < D; d++)
                    pacc[d] += p * v[i][d];
            }
            float mm, ca, cb;
            llmi_cu_softmax_merge(m, pm, &mm, &ca, &cb);
            m = mm;
            l = l * ca + pl * cb;
            for (int d = 0; d < D; d++)
                acc[d] = acc[d] * ca + pacc[d] * cb;
            if (stop == n)
                break;
            begin = stop;
        }
        for (int d = 0; d < D; d++) {
            const double want = ref[d] / sum, got = (double)acc[d] / (double)l;
            /* relative to the scale of the values (a weighted mean of
             * numbers in [-1, 1] can cancel to near zero) */
            if (fabs(got - want) > 1e-5 * fmax(fabs(want), 1e-1))
                fail_msg("n %d dim %d: %.9g, reference %.9g", n, d, got, want);
        }
    }
    /* Merging with an empty partial changes nothing. */
    float mm, ca, cb;
    llmi_cu_softmax_merge(3.0f, -INFINITY, &mm, &ca, &cb);
    assert_true(mm == 3.0f && ca == 1.0f && cb == 0.0f);
    llmi_cu_softmax_merge(-INFINITY, -2.0f, &mm, &ca, &cb);
    assert_true(mm == -2.0f && ca == 0.0f && cb == 1.0f);
}

/* ---- activations ---- */

static void test_glu_activations(void **state) {
    (void)state;
    rng_seed(0x5eed0006, "GLU");
    enum { N = 100000 };
    static const float edges[8] = {-100.0f, -88.5f, -20.0f, 0.0f, -0.0f, 20.0f, 88.5f, 100.0f};
    float *g = (float *)malloc(N * sizeof *g), *u = (float *)malloc(N * sizeof *u);
    float *silu = (float *)malloc(N * sizeof *silu), *gelu = (float *)malloc(N * sizeof *gelu);
    for (int i = 0; i < N; i++) {
        g[i] = i < 8 ? edges[i] : rng_uniform(-12.0f, 12.0f);
        u[i] = rng_uniform(-3.0f, 3.0f);
    }
    memcpy(silu, g, N * sizeof *g);
    memcpy(gelu, g, N * sizeof *g);
    llmi_silu_mul(silu, u, N);
    llmi_gelu_tanh_mul(gelu, u, N);
    for (int i = 0; i < N; i++) {
        /* Same operations in the same order with the same libm on the host:
         * the same bits (the GPU's expf and tanhf are within 2 ulp). */
        assert_int_equal(bits_of(llmi_cu_silu_mul(g[i], u[i])), bits_of(silu[i]));
        assert_int_equal(bits_of(llmi_cu_gelu_tanh_mul(g[i], u[i])), bits_of(gelu[i]));
        /* And each against the formula in double. */
        const double gd = g[i], ud = u[i];
        const double sd = gd / (1.0 + exp(-gd)) * ud;
        const double ge =
            0.5 * gd * (1.0 + tanh(0.7978845608 * gd * (1.0 + 0.044715 * gd * gd))) * ud;
        assert_true(fabs(llmi_cu_silu_mul(g[i], u[i]) - sd) <= 1e-6 * fabs(sd) + 1e-30);
        assert_true(fabs(llmi_cu_gelu_tanh_mul(g[i], u[i]) - ge) <= 1e-5 * fabs(ge) + 1e-6);
    }
    const float cap = 30.0f;
    for (int i = 0; i < 1000; i++) {
        const float x = rng_uniform(-200.0f, 200.0f);
        assert_int_equal(bits_of(llmi_cu_softcap(x, 1.0f / cap, cap)),
                         bits_of(tanhf(x * (1.0f / cap)) * cap));
    }
    free(g);
    free(u);
    free(silu);
    free(gelu);
}

/* ---- the quantized KV cache's blocks ---- */

/* Blocks as the KV store kernel quantizes them (kv_block_math.h, compiled
 * for the host here) are core's quantizer's bytes, and the values
 * attention reads are llmi_dequantize_row's: random blocks of magnitudes
 * 2^-30 .. 2^20, blocks with ties, zeros, a NaN, infinities and
 * subnormal scales. */
static void test_kv_blocks_match_cpu(void **state) {
    (void)state;
    rng_seed(0x6d0009, "kv blocks");
    for (int it = 0; it < 4000; it++) {
        float x[LLMI_QK], back[LLMI_QK];
        const float mag = ldexpf(1.0f, (int)rng_below(51) - 30);
        for (int j = 0; j < LLMI_QK; j++)
            x[j] = rng_uniform(-1.0f, 1.0f) * mag;
        switch (it % 8) {
        case 1: /* ties of the E4M3 grid and of Q8_0's rounding */
            for (int j = 0; j < LLMI_QK; j++)
                x[j] = (float)((int)rng_below(64) - 32) * 0.5f * mag;
            break;
        case 2:
            x[rng_below(LLMI_QK)] = 0.0f;
            x[rng_below(LLMI_QK)] = -0.0f;
            break;
        case 3:
            x[rng_below(LLMI_QK)] = NAN;
            break;
        case 4:
            memset(x, 0, sizeof x);
            break;
        case 5:
            x[rng_below(LLMI_QK)] = (rng_u64() & 1) ? INFINITY : -INFINITY;
            break;
        case 6: /* tiny blocks: subnormal scales */
            for (int j = 0; j < LLMI_QK; j++)
                x[j] = rng_uniform(-1.0f, 1.0f) * 1e-38f;
            break;
        default:
            break;
        }
        llmi_block_fp8_e4m3 f_cpu, f_cu;
        llmi_block_q8_0 q_cpu, q_cu;
        llmi_quantize_row(LLMI_T_FP8_E4M3, x, &f_cpu, LLMI_QK);
        llmi_cu_fp8_block(x, &f_cu);
        if (memcmp(&f_cpu, &f_cu, sizeof f_cpu) != 0)
            fail_msg("FP8 block %d: the kernel's bytes differ from the CPU's", it);
        llmi_dequantize_row(LLMI_T_FP8_E4M3, &f_cpu, back, LLMI_QK);
        for (int j = 0; j < LLMI_QK; j++) {
            const float v = llmi_cu_fp8_value(f_cu.d, f_cu.qs[j]);
            if (bits_of(v) != bits_of(back[j]) && !(isnan(v) && isnan(back[j])))
                fail_msg("FP8 block %d value %d: %a, CPU %a", it, j, v, back[j]);
        }
        if (it % 8 == 3 || it % 8 == 5 || it % 8 == 6)
            continue; /* Q8_0 of a NaN, an infinity or a subnormal scale (1 / d
                       * overflows): int8 of a NaN or an infinity, undefined */
        llmi_quantize_row(LLMI_T_Q8_0, x, &q_cpu, LLMI_QK);
        llmi_cu_q8_0_block(x, &q_cu);
        if (memcmp(&q_cpu, &q_cu, sizeof q_cpu) != 0)
            fail_msg("Q8_0 block %d: the kernel's bytes differ from the CPU's", it);
        llmi_dequantize_row(LLMI_T_Q8_0, &q_cpu, back, LLMI_QK);
        for (int j = 0; j < LLMI_QK; j++) {
            const float v = llmi_cu_q8_0_value(q_cu.d, q_cu.qs[j]);
            if (bits_of(v) != bits_of(back[j]))
                fail_msg("Q8_0 block %d value %d: %a, CPU %a", it, j, v, back[j]);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_matches_cpu), cmocka_unit_test(test_dequant_q5_golden),
        cmocka_unit_test(test_f16_bf16_rounding),   cmocka_unit_test(test_kv_slot_shuffled_tables),
        cmocka_unit_test(test_rope_angles),         cmocka_unit_test(test_split_merge),
        cmocka_unit_test(test_glu_activations),     cmocka_unit_test(test_prefill_tiles),
        cmocka_unit_test(test_kv_blocks_match_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
