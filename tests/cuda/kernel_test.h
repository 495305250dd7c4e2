/* Helpers of the CUDA kernel tests (tests/cuda/test_*.cu): seeded random
 * numbers, poisoned device buffers, tolerance checks, KV caches on the
 * host and shuffled block tables. Included by each test file after
 * cmocka.h, core/core.h (the CPU's f16/bf16 conversions), core/ttype.h,
 * kernels.h and cuda_runtime.h (it includes core/quant.h and core/fp8.h); every helper is static
 * inline so that a file may leave some unused. */
#ifndef LLMI_TESTS_CUDA_KERNEL_TEST_H
#define LLMI_TESTS_CUDA_KERNEL_TEST_H

extern "C" {
#include "core/quant.h"
}
#include "core/fp8.h"

static bool have_device;

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            fail_msg("%s: %s", #call, cudaGetErrorString(err_));                                   \
    } while (0)

#define NEED_DEVICE()                                                                              \
    do {                                                                                           \
        if (!have_device)                                                                          \
            skip();                                                                                \
    } while (0)

/* ---- random numbers (splitmix64), seeds printed ---- */

static uint64_t rng_state;
static inline void rng_seed(uint64_t s, const char *what) {
    rng_state = s;
    printf("# %s: seed %llu\n", what, (unsigned long long)s);
}
static inline uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline uint32_t rng_below(uint32_t n) { return (uint32_t)(rng_u64() % n); }
static inline float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rng_u64() >> 11) * 0x1.0p-53);
}
static inline void fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++)
        x[i] = rng_uniform(lo, hi);
}
static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- device buffers ---- */

static inline void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    CU(cudaMemset(p, 0xff, bytes ? bytes : 1)); /* NaN floats */
    return p;
}
static inline void *dev_copy(const void *h, size_t bytes) {
    void *p = dev_alloc(bytes);
    CU(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    return p;
}
static inline void to_host(void *h, const void *d, size_t bytes) {
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* |got - want| <= tol * scale, reported with the place. */
static inline void near(double got, double want, double tol, double scale, const char *what,
                        size_t i) {
    if (!(fabs(got - want) <= tol * scale))
        fail_msg("%s[%zu]: %.9g, reference %.9g (tolerance %.3g)", what, i, got, want, tol * scale);
}

static inline size_t cache_elem(llmi_ttype t) { return t == LLMI_T_F32 ? 4 : 2; }

/* v rounded into the cache type, and back (the value attention reads). */
static inline void cache_put(llmi_ttype t, void *cache, size_t i, float v) {
    if (t == LLMI_T_F32)
        ((float *)cache)[i] = v;
    else if (t == LLMI_T_F16)
        ((uint16_t *)cache)[i] = llmi_f32_to_f16(v);
    else
        ((uint16_t *)cache)[i] = llmi_f32_to_bf16(v);
}
static inline float cache_get(llmi_ttype t, const void *cache, size_t i) {
    if (t == LLMI_T_F32)
        return ((const float *)cache)[i];
    if (t == LLMI_T_F16)
        return llmi_f16_to_f32(((const uint16_t *)cache)[i]);
    return llmi_bf16_to_f32(((const uint16_t *)cache)[i]);
}

static const llmi_ttype cache_types[] = {LLMI_T_F32, LLMI_T_F16, LLMI_T_BF16};
/* Every type the KV kernels take: the float ones and the blocks of 32
 * (Q8_0, FP8_E4M3), whose rows (kv_dim) are whole blocks. */
static const llmi_ttype kv_cache_types[] = {LLMI_T_F32, LLMI_T_F16, LLMI_T_BF16, LLMI_T_Q8_0,
                                            LLMI_T_FP8_E4M3};
#define N_KV_CACHE_TYPES (sizeof kv_cache_types / sizeof kv_cache_types[0])

static inline bool cache_blocked(llmi_ttype t) { return t == LLMI_T_Q8_0 || t == LLMI_T_FP8_E4M3; }

/* Bytes of n elements (for the block types n is a multiple of 32). */
static inline size_t cache_bytes(llmi_ttype t, size_t n) {
    if (t == LLMI_T_Q8_0)
        return n / LLMI_QK * sizeof(llmi_block_q8_0);
    if (t == LLMI_T_FP8_E4M3)
        return n / LLMI_QK * sizeof(llmi_block_fp8_e4m3);
    return n * cache_elem(t);
}

/* Element i as attention reads it: the float types' value, or the block
 * types' dequantized one (d * q, as llmi_dequantize_row gives it). */
static inline float cache_value(llmi_ttype t, const void *cache, size_t i) {
    if (t == LLMI_T_Q8_0) {
        const llmi_block_q8_0 *b = (const llmi_block_q8_0 *)cache + i / LLMI_QK;
        return (float)b->qs[i % LLMI_QK] * llmi_f16_to_f32(b->d);
    }
    if (t == LLMI_T_FP8_E4M3) {
        const llmi_block_fp8_e4m3 *b = (const llmi_block_fp8_e4m3 *)cache + i / LLMI_QK;
        return b->d * llmi_fp8_e4m3_to_f32(b->qs[i % LLMI_QK]);
    }
    return cache_get(t, cache, i);
}

/* n elements of uniform values in [lo, hi] plus ramp * (i % period),
 * rounded (float types) or quantized by core's quantizer (block types, n a
 * multiple of 32) into the cache. */
static inline void cache_fill(llmi_ttype t, void *cache, size_t n, float lo, float hi, float ramp,
                              unsigned period) {
    float x[LLMI_QK];
    for (size_t i0 = 0; i0 < n; i0 += LLMI_QK) {
        const size_t m = n - i0 < LLMI_QK ? n - i0 : LLMI_QK;
        for (size_t j = 0; j < m; j++)
            x[j] = rng_uniform(lo, hi) + ramp * (float)((i0 + j) % period);
        if (cache_blocked(t))
            llmi_quantize_row(t, x, (uint8_t *)cache + cache_bytes(t, i0), LLMI_QK);
        else
            for (size_t j = 0; j < m; j++)
                cache_put(t, cache, i0 + j, x[j]);
    }
}

/* A shuffled CSR block table: sequence s gets blocks_per_seq[s] blocks of a
 * permutation of n_blocks. */
static inline void shuffled_table(uint32_t n_seqs, const uint32_t *blocks_per_seq,
                                  uint32_t n_blocks, uint32_t *block_start, uint32_t *blocks) {
    uint32_t *perm = (uint32_t *)malloc(4 * n_blocks);
    for (uint32_t i = 0; i < n_blocks; i++)
        perm[i] = i;
    for (uint32_t i = n_blocks - 1; i > 0; i--) {
        const uint32_t j = rng_below(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    block_start[0] = 0;
    for (uint32_t s = 0; s < n_seqs; s++)
        block_start[s + 1] = block_start[s] + blocks_per_seq[s];
    assert_true(block_start[n_seqs] <= n_blocks);
    memcpy(blocks, perm, 4 * block_start[n_seqs]);
    free(perm);
}

/* ---- attention in double ---- */

/* Host copies of what an attention launch reads (its args hold the device
 * copies): q at the args' q_stride, the caches, rows and block tables. */
typedef struct attn_host {
    const float *q;
    const void *k, *v;
    const uint32_t *pos, *seq, *block_start, *blocks;
} attn_host;

/* How a kernel rounds its operands: Q and the softmax weights P to a
 * 16-bit type with unit roundoff u (relative) and a (absolute, half the
 * type's smallest subnormal), scores summed in f32 by tensor cores with a
 * relative error of at most acc per addition; o: the output rounded to
 * that type too (o = u), and so are partial results over splits of the
 * keys before their f32 merge (at most o mag more: the merge's weights sum
 * to 1 and each partial is at most its keys' weighted |v|), or not (0).
 * All zero: no rounding. */
typedef struct attn_rounding {
    double u, a, acc, o;
} attn_rounding;

/* Head h of row r of an attention's output (`out`, head_dim floats) against
 * softmax(q . k * scale) v in double over the row's keys, with the window
 * and GQA of `a`; relative to the sum of |v| weights (mag). w: scratch for
 * pos[r] + 1 doubles. `index` names the first element in a failure.
 * With rounding rd (NULL: none), the tolerance adds its worst case: a
 * score i moves by at most e_i = scale * sum_d (u |q_d| + a + hd acc |q_d|)
 * |k_d|, so every normalized weight by a factor within exp(+-2 e) (e the
 * largest e_i), and the output by (exp(2 e) - 1) mag; the rounded weights
 * (relative u, absolute a, the row's sum l >= 1 unrounded) add u mag +
 * a sum |v_i|. */
static inline void check_attention_head_rounded(const llmi_cu_attention_args *a,
                                                const attn_host *in, uint32_t r, uint32_t h,
                                                const float *out, const char *what, size_t index,
                                                double *w, const attn_rounding *rd) {
    const uint32_t hd = a->head_dim, bs = a->block_size, pos = in->pos[r];
    const uint32_t first = a->window && pos >= a->window ? pos - a->window + 1 : 0;
    const uint32_t n = pos + 1 - first, kvh = h / (a->n_head / a->n_head_kv);
    const uint32_t *table = in->blocks + in->block_start[in->seq[r]];
    const float *q = in->q + (size_t)r * a->q_stride + (size_t)h * hd;
#define KV_ROW(p) (((size_t)table[(p) / bs] * bs + (p) % bs) * a->kv_dim + (size_t)kvh * hd)
    double mx = -INFINITY, sum = 0.0, e_max = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        double dot = 0.0, e = 0.0;
        for (uint32_t d = 0; d < hd; d++) {
            const double k = cache_value(a->cache_type, in->k, KV_ROW(first + i) + d);
            dot += (double)q[d] * k;
            if (rd)
                e += (rd->u * fabs(q[d]) + rd->a + hd * rd->acc * fabs(q[d])) * fabs(k);
        }
        w[i] = dot * a->scale;
        mx = w[i] > mx ? w[i] : mx;
        e_max = e * a->scale > e_max ? e * a->scale : e_max;
    }
    for (uint32_t i = 0; i < n; i++)
        sum += (w[i] = exp(w[i] - mx));
    for (uint32_t d = 0; d < hd; d++) {
        double want = 0.0, mag = 0.0, abs_v = 0.0;
        for (uint32_t i = 0; i < n; i++) {
            const double v = cache_value(a->cache_type, in->v, KV_ROW(first + i) + d);
            want += w[i] / sum * v;
            mag += w[i] / sum * fabs(v);
            abs_v += fabs(v);
        }
        double tol = 2e-5 * (mag + 1e-6);
        if (rd)
            tol += (exp(2.0 * e_max) - 1.0) * (1.0 + rd->u) * mag + rd->u * mag + rd->a * abs_v;
        if (rd && rd->o > 0.0) /* |fl(x) - x| <= o |x| + a, |x| <= |want| + tol */
            tol += rd->o * mag + rd->o * (fabs(want) + tol) + 2.0 * rd->a;
        near(out[d], want, tol, 1.0, what, index + d);
    }
#undef KV_ROW
}

static inline void check_attention_head(const llmi_cu_attention_args *a, const attn_host *in,
                                        uint32_t r, uint32_t h, const float *out, const char *what,
                                        size_t index, double *w) {
    check_attention_head_rounded(a, in, r, h, out, what, index, w, NULL);
}

#endif
