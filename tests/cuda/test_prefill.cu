/* The prefill attention kernel (llmi_cu_attention with a tile table) on the
 * GPU against a double-precision reference: chunks that start mid-sequence
 * (earlier keys already cached), prompts from position 0, tiles shorter
 * than LLMI_CU_PREFILL_TILE and starting at any position, GQA and MQA,
 * sliding windows, every cache type, head sizes up to
 * LLMI_CU_PREFILL_MAX_HEAD_DIM (odd ones too), shuffled block tables of
 * several block sizes. Rows of the same step go to the split kernel through
 * the decode list; a row in neither list keeps its poison. A row's result
 * is checked to be the same bits whatever tile it is in, and the decode
 * rows the same bits as a step without tiles. The tensor-core prefill
 * kernel (llmi_cu_attention_tc) runs the same step for F16 and BF16
 * caches and heads of 64 and 128, within a bound reasoned from its
 * rounding of Q and P. Timings of 2,048-token prompts (prefill, tensor-core
 * prefill against split) are printed, not asserted. With the plug-in
 * built by `make cuda FLASHINFER=1`, FlashInfer's paged prefill
 * (llmi_cu_attention_flashinfer) runs the same steps for every row within
 * the tensor-core bound plus its rounding of the output, and its line is
 * printed beside the others.
 * Without a CUDA device every test skips. */
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

#include "attention_flashinfer.h"
#include "device_math.h"
#include "kernels.h"

#include <cuda_runtime.h>

#include "kernel_test.h"

typedef struct pf_case {
    uint32_t n_head, n_head_kv, head_dim, window, block_size;
} pf_case;

/* The step: four sequences' rows in batch order (pos, seq), the tiles and
 * decode rows given to the kernels, and one row in neither. */
enum { N_SEQS = 4, N_ROWS = 45 + 1 + 70 + 10 + 1 };
static const uint32_t seq_len[N_SEQS] = {600, 45, 301, 87};

static void make_rows(uint32_t *pos, uint32_t *seq) {
    uint32_t r = 0;
    for (uint32_t i = 0; i < 45; i++, r++) { /* a prompt from position 0 */
        seq[r] = 1;
        pos[r] = i;
    }
    seq[r] = 2; /* a decode row */
    pos[r++] = 300;
    for (uint32_t i = 0; i < 70; i++, r++) { /* a chunk after 530 cached keys */
        seq[r] = 0;
        pos[r] = 530 + i;
    }
    for (uint32_t i = 0; i < 10; i++, r++) { /* a short run: the split kernel */
        seq[r] = 3;
        pos[r] = 77 + i;
    }
    seq[r] = 2; /* untouched */
    pos[r++] = 100;
    assert_int_equal(r, N_ROWS);
}

/* Tilings of the rows above (pairs {first row, rows}); the chunk of
 * sequence 0 (rows 46 ..) cut two ways. */
static const uint32_t tiles_a[] = {0, 32, 32, 13, 46, 32, 78, 32, 110, 6};
static const uint32_t tiles_b[] = {0, 1, 1, 32, 33, 12, 46, 7, 53, 32, 85, 31};
static const uint32_t decode_rows[] = {45, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125};
enum { UNTOUCHED = N_ROWS - 1 };

typedef struct pf_bufs {
    llmi_cu_attention_args a;
    uint32_t os, qd;
    float *out; /* host copy of the output */
} pf_bufs;

/* Who runs a step: llmi_cu_attention (f32 prefill and split kernels),
 * llmi_cu_attention_tc (the tensor-core kernel takes the tiles) or
 * llmi_cu_attention_flashinfer (FlashInfer takes every row). */
typedef enum attn_path { PATH_F32, PATH_TC, PATH_FLASHINFER } attn_path;

static cudaError_t launch_path(const llmi_cu_attention_args *a, attn_path path) {
    if (path == PATH_TC)
        return llmi_cu_attention_tc(0, a);
    if (path == PATH_FLASHINFER)
        return llmi_cu_attention_flashinfer(0, a);
    return llmi_cu_attention(0, a);
}

static void run(pf_bufs *b, const uint32_t *tiles, uint32_t n_tiles, bool with_decode,
                attn_path path) {
    uint32_t *dt = n_tiles ? (uint32_t *)dev_copy(tiles, 8 * n_tiles) : NULL;
    uint32_t *dd = (uint32_t *)dev_copy(decode_rows, sizeof decode_rows);
    CU(cudaMemset(b->a.out, 0xff, 4 * (size_t)N_ROWS * b->os));
    b->a.tiles = dt;
    b->a.n_tiles = n_tiles;
    b->a.decode_rows = with_decode ? dd : NULL;
    b->a.n_decode_rows = with_decode ? (uint32_t)(sizeof decode_rows / 4) : 0;
    CU(launch_path(&b->a, path));
    CU(cudaDeviceSynchronize());
    to_host(b->out, b->a.out, 4 * (size_t)N_ROWS * b->os);
    cudaFree(dt);
    cudaFree(dd);
}

/* The tensor-core kernel's rounding (kernel_test.h's attn_rounding): Q and
 * P to the cache's type, round to nearest (unit roundoff 2^-8 for bf16,
 * 2^-11 for f16; half the smallest subnormal, 2^-134 and 2^-25, absolute);
 * tensor-core f32 sums taken at 2^-22 (two f32 ulps) an addition. */
static attn_rounding tc_rounding(llmi_ttype ct) {
    attn_rounding rd;
    rd.u = ct == LLMI_T_BF16 ? ldexp(1.0, -8) : ldexp(1.0, -11);
    rd.a = ct == LLMI_T_BF16 ? ldexp(1.0, -134) : ldexp(1.0, -25);
    rd.acc = ldexp(1.0, -22);
    rd.o = 0.0;
    return rd;
}

/* Every row of b's output against the double reference; rows in
 * is_decode with the split kernel's tolerance unless FlashInfer ran them.
 * poisoned: the row in neither list must hold its poison. */
static void check_rows(const pf_bufs *b, const pf_case *c, const attn_host *in,
                       const bool *is_decode, attn_path path, const attn_rounding *rd, double *w,
                       bool poisoned) {
    const char *what = path == PATH_TC           ? "tensor-core prefill"
                       : path == PATH_FLASHINFER ? "FlashInfer attention"
                                                 : "prefill attention";
    for (uint32_t r = 0; r < N_ROWS; r++) {
        if (r == UNTOUCHED && poisoned) {
            for (uint32_t i = 0; i < b->qd; i++)
                assert_int_equal(bits_of(b->out[r * b->os + i]), 0xffffffffu);
            continue;
        }
        const bool rounded = path == PATH_FLASHINFER || (path == PATH_TC && !is_decode[r]);
        for (uint32_t h = 0; h < c->n_head; h++)
            check_attention_head_rounded(
                &b->a, in, r, h, b->out + (size_t)r * b->os + (size_t)h * c->head_dim, what,
                (size_t)r * b->qd + (size_t)h * c->head_dim, w, rounded ? rd : NULL);
    }
}

static void run_case(const pf_case *c, llmi_ttype ct, attn_path path) {
    const uint32_t bs = c->block_size, hd = c->head_dim, kv_dim = c->n_head_kv * hd;
    uint32_t per_seq[N_SEQS], n_blocks = 3, block_start[N_SEQS + 1];
    for (uint32_t s = 0; s < N_SEQS; s++)
        n_blocks += (per_seq[s] = (seq_len[s] + bs - 1) / bs);
    uint32_t *blocks = (uint32_t *)malloc(4 * n_blocks), pos[N_ROWS], seq[N_ROWS];
    shuffled_table(N_SEQS, per_seq, n_blocks, block_start, blocks);
    make_rows(pos, seq);
    const size_t n_slots = (size_t)n_blocks * bs, cbytes = cache_bytes(ct, n_slots * kv_dim);
    uint8_t *kc = (uint8_t *)malloc(cbytes), *vc = (uint8_t *)malloc(cbytes);
    cache_fill(ct, kc, n_slots * kv_dim, -1.0f, 1.0f, 0.0f, 1);
    cache_fill(ct, vc, n_slots * kv_dim, -1.0f, 1.0f, 0.3f, 5);
    pf_bufs b;
    b.qd = c->n_head * hd;
    b.os = b.qd + 8;
    const uint32_t qs = b.qd + 3;
    float *q = (float *)malloc(4 * (size_t)N_ROWS * qs);
    fill(q, (size_t)N_ROWS * qs, -0.6f, 0.6f);
    float *ref_tiles = (float *)malloc(4 * (size_t)N_ROWS * b.os);
    b.out = (float *)malloc(4 * (size_t)N_ROWS * b.os);
    llmi_cu_attention_args *a = &b.a;
    memset(a, 0, sizeof *a);
    a->q = (const float *)dev_copy(q, 4 * (size_t)N_ROWS * qs);
    a->q_stride = qs;
    a->out = (float *)dev_alloc(4 * (size_t)N_ROWS * b.os);
    a->out_stride = b.os;
    a->k_cache = dev_copy(kc, cbytes);
    a->v_cache = dev_copy(vc, cbytes);
    a->cache_type = ct;
    a->n_rows = N_ROWS;
    a->n_head = c->n_head;
    a->n_head_kv = c->n_head_kv;
    a->head_dim = hd;
    a->kv_dim = kv_dim;
    a->block_size = bs;
    a->pos = (const uint32_t *)dev_copy(pos, sizeof pos);
    a->seq = (const uint32_t *)dev_copy(seq, sizeof seq);
    a->block_start = (const uint32_t *)dev_copy(block_start, sizeof block_start);
    a->blocks = (const uint32_t *)dev_copy(blocks, 4 * n_blocks);
    a->max_pos = 599;
    a->scale = 1.0f / sqrtf((float)hd);
    a->window = c->window;
    a->scratch =
        (float *)dev_alloc(4 * llmi_cu_attention_scratch_floats(N_ROWS, c->n_head, hd, 600));

    run(&b, tiles_a, sizeof tiles_a / 8, true, path);
    memcpy(ref_tiles, b.out, 4 * (size_t)N_ROWS * b.os);
    double *w = (double *)malloc(sizeof(double) * 600);
    const attn_host in = {q, kc, vc, pos, seq, block_start, blocks};
    attn_rounding rd = tc_rounding(ct);
    if (path == PATH_FLASHINFER)
        rd.o = rd.u;
    bool is_decode[N_ROWS] = {false};
    for (size_t k = 0; k < sizeof decode_rows / 4; k++)
        is_decode[decode_rows[k]] = true;
    check_rows(&b, c, &in, is_decode, path, &rd, w, true);
    if (path == PATH_FLASHINFER) {
        /* Its own tiling and order of sums: the other tiling and no tiles
         * at all (every row a request, the untouched one too) are checked
         * against the reference, not for the same bits. */
        run(&b, tiles_b, sizeof tiles_b / 8, true, path);
        check_rows(&b, c, &in, is_decode, path, &rd, w, true);
        run(&b, NULL, 0, false, path);
        check_rows(&b, c, &in, is_decode, path, &rd, w, false);
    } else {
        /* Another tiling: the same bits for every row. */
        run(&b, tiles_b, sizeof tiles_b / 8, true, path);
        for (uint32_t r = 0; r < N_ROWS; r++)
            for (uint32_t i = 0; i < b.qd; i++)
                if (bits_of(b.out[r * b.os + i]) != bits_of(ref_tiles[r * b.os + i]))
                    fail_msg("row %u, element %u: %.9g with one tiling, %.9g with another", r, i,
                             b.out[r * b.os + i], ref_tiles[r * b.os + i]);
        /* No tiles: the split kernel's rows give the bits they give with tiles. */
        run(&b, NULL, 0, false, PATH_F32);
        for (size_t k = 0; k < sizeof decode_rows / 4; k++) {
            const uint32_t r = decode_rows[k];
            for (uint32_t i = 0; i < b.qd; i++)
                if (bits_of(b.out[r * b.os + i]) != bits_of(ref_tiles[r * b.os + i]))
                    fail_msg("decode row %u, element %u: %.9g alone, %.9g beside tiles", r, i,
                             b.out[r * b.os + i], ref_tiles[r * b.os + i]);
        }
    }
    free(w);
    cudaFree((void *)a->q);
    cudaFree(a->out);
    cudaFree((void *)a->k_cache);
    cudaFree((void *)a->v_cache);
    cudaFree((void *)a->pos);
    cudaFree((void *)a->seq);
    cudaFree((void *)a->block_start);
    cudaFree((void *)a->blocks);
    cudaFree(a->scratch);
    free(blocks);
    free(kc);
    free(vc);
    free(q);
    free(ref_tiles);
    free(b.out);
}

static void test_prefill_attention(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0101, "prefill attention");
    const pf_case cases[] = {{4, 2, 64, 0, 16},   {8, 8, 128, 0, 16}, {2, 1, 256, 0, 16},
                             {4, 1, 64, 300, 16}, {4, 2, 80, 5, 5},   {6, 3, 96, 40, 16},
                             {2, 2, 200, 33, 8},  {1, 1, 32, 0, 3},   {3, 1, 130, 64, 32}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t t = 0; t < N_KV_CACHE_TYPES; t++) {
            const llmi_ttype ct = kv_cache_types[t];
            if (cache_blocked(ct) && cases[c].head_dim % 32) /* rows of whole blocks only */
                continue;
            printf("# case %zu, cache type %d\n", c, (int)ct);
            run_case(&cases[c], ct, PATH_F32);
        }
}

/* The tensor-core kernel on the same step: GQA ratios 1, 3, 4, 5 and 8 (8:
 * two slices of four heads per CTA; 5: one head a CTA), heads of 64 and
 * 128, block sizes 16 and 32, windows (one shorter than a chunk), both
 * 16-bit cache types; the tilings' ragged tiles, the prompt from position
 * 0 and the chunk after 530 cached keys of make_rows. Within the reasoned
 * rounding bound of the reference, the same bits under either tiling,
 * decode rows as without tiles. */
static void test_prefill_tc_attention(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0103, "tensor-core prefill attention");
    const pf_case cases[] = {{4, 4, 64, 0, 16},   {8, 2, 128, 0, 32}, {16, 2, 64, 300, 16},
                             {8, 1, 128, 40, 32}, {12, 4, 64, 0, 32}, {5, 1, 128, 5, 16},
                             {2, 2, 128, 100, 16}};
    const llmi_ttype types[] = {LLMI_T_F16, LLMI_T_BF16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t t = 0; t < 2; t++) {
            printf("# tensor-core case %zu, cache type %d\n", c, (int)types[t]);
            run_case(&cases[c], types[t], PATH_TC);
        }
}

/* FlashInfer (built with FLASHINFER=1) on the same step, every row of it:
 * the shapes it is instantiated for (heads of 64 and 128, GQA 1 to 8,
 * both 16-bit caches), windows, block sizes 16 and 32 and a ragged 5,
 * prompts from position 0 and a chunk after 530 cached keys, tiles and
 * single rows. Within the tensor-core bound plus the output's rounding to
 * the cache's type. Skips without FlashInfer or a device. */
static void test_prefill_flashinfer_attention(void **state) {
    (void)state;
    NEED_DEVICE();
    if (!llmi_cu_flashinfer_built()) {
        printf("# built without FLASHINFER=1: the FlashInfer test skips\n");
        skip();
    }
    rng_seed(0x6e0104, "FlashInfer attention");
    const pf_case cases[] = {{4, 4, 64, 0, 16},    {8, 2, 128, 0, 32}, {16, 2, 64, 300, 16},
                             {8, 1, 128, 40, 32},  {12, 4, 64, 0, 5},  {5, 1, 128, 5, 16},
                             {2, 2, 128, 100, 16}, {32, 8, 64, 0, 16}};
    const llmi_ttype types[] = {LLMI_T_F16, LLMI_T_BF16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t t = 0; t < 2; t++) {
            printf("# FlashInfer case %zu, cache type %d\n", c, (int)types[t]);
            run_case(&cases[c], types[t], PATH_FLASHINFER);
        }
}

/* What FlashInfer does not take is refused with its reason, on any
 * machine (the plug-in built with it or not). */
static void test_flashinfer_refusals(void **state) {
    (void)state;
    llmi_cu_attention_args a;
    memset(&a, 0, sizeof a);
    a.cache_type = LLMI_T_BF16;
    a.n_rows = 1;
    a.n_head = 8;
    a.n_head_kv = 1;
    a.head_dim = 128;
    a.kv_dim = 128;
    a.block_size = 16;
    a.k_cache = a.v_cache = (const void *)(uintptr_t)0x1000;
    if (!llmi_cu_flashinfer_built()) {
        assert_int_equal(llmi_cu_flashinfer_takes(0, &a), LLMI_FI_NOT_BUILT);
        assert_int_equal(llmi_cu_attention_flashinfer(0, &a), cudaErrorNotSupported);
        return;
    }
    if (have_device)
        assert_int_equal(llmi_cu_flashinfer_takes(0, &a), LLMI_FI_TAKES);
    a.cache_type = LLMI_T_F32;
    assert_int_equal(llmi_cu_flashinfer_takes(0, &a), LLMI_FI_CACHE_TYPE);
    assert_int_equal(llmi_cu_attention_flashinfer(0, &a), cudaErrorInvalidValue);
    a.cache_type = LLMI_T_F16;
    a.head_dim = 96;
    a.kv_dim = 96;
    assert_int_equal(llmi_cu_flashinfer_takes(0, &a), LLMI_FI_HEAD_DIM);
    a.head_dim = 64;
    a.kv_dim = 64;
    a.n_head = 9;
    assert_int_equal(llmi_cu_flashinfer_takes(0, &a), LLMI_FI_GROUP);
    a.n_head = 8;
    a.kv_dim = 68;
    assert_int_equal(llmi_cu_flashinfer_takes(0, &a), LLMI_FI_LAYOUT);
    a.kv_dim = 64;
    a.v_cache = (const void *)(uintptr_t)0x1008;
    assert_int_equal(llmi_cu_flashinfer_takes(0, &a), LLMI_FI_LAYOUT);
}

/* What the tensor-core kernel does not take is refused before anything
 * runs (no device needed): f32 caches, other head sizes, a kv_dim that is
 * not a multiple of 8, unaligned caches. */
static void test_prefill_tc_refusals(void **state) {
    (void)state;
    static const uint32_t tiles[2] = {0, 1};
    llmi_cu_attention_args a;
    memset(&a, 0, sizeof a);
    a.cache_type = LLMI_T_BF16;
    a.n_rows = 1;
    a.n_head = 2;
    a.n_head_kv = 1;
    a.head_dim = 64;
    a.kv_dim = 64;
    a.block_size = 16;
    a.tiles = tiles;
    a.n_tiles = 1;
    a.k_cache = a.v_cache = (const void *)(uintptr_t)0x1000;
    assert_true(llmi_cu_prefill_tc_takes(&a));
    a.cache_type = LLMI_T_F32;
    assert_false(llmi_cu_prefill_tc_takes(&a));
    assert_int_equal(llmi_cu_attention_tc(0, &a), cudaErrorInvalidValue);
    a.cache_type = LLMI_T_F16;
    a.head_dim = 96;
    a.kv_dim = 96;
    assert_int_equal(llmi_cu_attention_tc(0, &a), cudaErrorInvalidValue);
    a.head_dim = 128;
    a.kv_dim = 132;
    assert_int_equal(llmi_cu_attention_tc(0, &a), cudaErrorInvalidValue);
    a.kv_dim = 128;
    a.v_cache = (const void *)(uintptr_t)0x1008;
    assert_int_equal(llmi_cu_attention_tc(0, &a), cudaErrorInvalidValue);
    a.v_cache = a.k_cache;
    assert_true(llmi_cu_prefill_tc_takes(&a));
}

static void test_prefill_refusals(void **state) {
    (void)state;
    NEED_DEVICE();
    static const uint32_t tiles[2] = {0, 1};
    llmi_cu_attention_args a;
    memset(&a, 0, sizeof a);
    a.cache_type = LLMI_T_F16;
    a.n_rows = 1;
    a.n_head = 2;
    a.n_head_kv = 1;
    a.head_dim = 64;
    a.kv_dim = 64;
    a.block_size = 16;
    a.n_tiles = 1; /* no table */
    assert_int_equal(llmi_cu_attention(0, &a), cudaErrorInvalidValue);
    a.tiles = tiles;
    a.n_tiles = 2; /* more tiles than rows */
    assert_int_equal(llmi_cu_attention(0, &a), cudaErrorInvalidValue);
    a.n_tiles = 1;
    a.n_decode_rows = 1; /* decode rows without a list */
    assert_int_equal(llmi_cu_attention(0, &a), cudaErrorInvalidValue);
    a.n_decode_rows = 0;
    a.head_dim = LLMI_CU_PREFILL_MAX_HEAD_DIM + 8;
    a.kv_dim = a.head_dim;
    assert_int_equal(llmi_cu_attention(0, &a), cudaErrorInvalidValue);
}

/* A 2,048-token prompt, 32 heads over 8 KV heads of hd, bf16 cache;
 * milliseconds of each path (split, f32 prefill, tensor-core prefill), best
 * of three (printed for the device check's figures, with the tensor-core
 * kernel's TFLOP/s: 4 hd flops per (query, key) pair a head, n (n + 1) / 2
 * pairs), and the prefill paths against the split kernel: the f32 one
 * within f32 rounding, the tensor-core one within its worst case for
 * |q| <= 0.5, |k|, |v| <= 1 (kernel_test.h's bound with e = scale * hd *
 * 0.5 * (2^-8 + hd 2^-22) and mag, sum |v| weights, at most 1). */
static void prefill_speed(uint32_t hd) {
    const uint32_t n = 2048, nh = 32, nkv = 8, bs = 16, kv_dim = nkv * hd;
    const uint32_t qd = nh * hd, n_blocks = n / bs;
    uint32_t *pos = (uint32_t *)malloc(4 * n), *seq = (uint32_t *)calloc(n, 4);
    uint32_t *tiles = (uint32_t *)malloc(8 * n), block_start[2] = {0, n_blocks};
    uint32_t *blocks = (uint32_t *)malloc(4 * n_blocks);
    shuffled_table(1, &n_blocks, n_blocks, block_start, blocks);
    uint32_t n_tiles = 0;
    for (uint32_t r = 0; r < n; r++)
        pos[r] = r;
    for (uint32_t r = 0; r < n; r += LLMI_CU_PREFILL_TILE, n_tiles++) {
        tiles[2 * n_tiles] = r;
        tiles[2 * n_tiles + 1] = LLMI_CU_PREFILL_TILE;
    }
    const size_t cache_elems = (size_t)n * kv_dim;
    uint16_t *kc = (uint16_t *)malloc(2 * cache_elems), *vc = (uint16_t *)malloc(2 * cache_elems);
    for (size_t i = 0; i < cache_elems; i++) {
        kc[i] = llmi_f32_to_bf16(rng_uniform(-1.0f, 1.0f));
        vc[i] = llmi_f32_to_bf16(rng_uniform(-1.0f, 1.0f));
    }
    float *q = (float *)malloc(4 * (size_t)n * qd);
    fill(q, (size_t)n * qd, -0.5f, 0.5f);
    llmi_cu_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = (const float *)dev_copy(q, 4 * (size_t)n * qd);
    a.q_stride = qd;
    a.out = (float *)dev_alloc(4 * (size_t)n * qd);
    a.out_stride = qd;
    a.k_cache = dev_copy(kc, 2 * cache_elems);
    a.v_cache = dev_copy(vc, 2 * cache_elems);
    a.cache_type = LLMI_T_BF16;
    a.n_rows = n;
    a.n_head = nh;
    a.n_head_kv = nkv;
    a.head_dim = hd;
    a.kv_dim = kv_dim;
    a.block_size = bs;
    a.pos = (const uint32_t *)dev_copy(pos, 4 * n);
    a.seq = (const uint32_t *)dev_copy(seq, 4 * n);
    a.block_start = (const uint32_t *)dev_copy(block_start, sizeof block_start);
    a.blocks = (const uint32_t *)dev_copy(blocks, 4 * n_blocks);
    a.max_pos = n - 1;
    a.scale = 1.0f / sqrtf((float)hd);
    a.scratch = (float *)dev_alloc(4 * llmi_cu_attention_scratch_floats(n, nh, hd, n));
    uint32_t *dtiles = (uint32_t *)dev_copy(tiles, 8 * n_tiles);
    float *out_split = (float *)malloc(4 * (size_t)n * qd),
          *out_tiles = (float *)malloc(4 * (size_t)n * qd),
          *out_tc = (float *)malloc(4 * (size_t)n * qd),
          *out_fi = (float *)malloc(4 * (size_t)n * qd);
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float best[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    float *outs[4] = {out_split, out_tiles, out_tc, out_fi};
    const bool fi = llmi_cu_flashinfer_built();
    for (int path = 0; path < (fi ? 4 : 3); path++) {
        a.tiles = path ? dtiles : NULL;
        a.n_tiles = path ? n_tiles : 0;
        for (int rep = 0; rep < 4; rep++) {
            CU(cudaEventRecord(e0, 0));
            CU(launch_path(&a, path == 3 ? PATH_FLASHINFER : path == 2 ? PATH_TC : PATH_F32));
            CU(cudaEventRecord(e1, 0));
            CU(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CU(cudaEventElapsedTime(&ms, e0, e1));
            if (rep > 0 && ms < best[path]) /* the first run loads the kernels */
                best[path] = ms;
        }
        to_host(outs[path], a.out, 4 * (size_t)n * qd);
    }
    const double flops = 4.0 * hd * nh * (double)n * (n + 1) / 2.0;
    printf("# attention of a 2048-token prompt, 32 x %u heads over 8 KV heads, bf16 cache: "
           "split %.3f ms, prefill %.3f ms, tensor-core prefill %.3f ms (%.1f TFLOP/s)\n",
           hd, best[0], best[1], best[2], flops / (best[2] * 1e-3) / 1e12);
    if (fi)
        printf("# the same prompt, FlashInfer %.3f ms (%.1f TFLOP/s)\n", best[3],
               flops / (best[3] * 1e-3) / 1e12);
    const double u = ldexp(1.0, -8), e = a.scale * hd * 0.5 * (u + hd * ldexp(1.0, -22));
    const double tc_tol = (exp(2.0 * e) - 1.0) * (1.0 + u) + u + 2e-5;
    for (size_t i = 0; i < (size_t)n * qd; i++) {
        near(out_tiles[i], out_split[i], 1e-5, 1.0, "prefill against split", i);
        near(out_tc[i], out_split[i], tc_tol, 1.0, "tensor-core prefill against split", i);
        if (fi) /* plus the output rounded to bf16: u times |out| <= 1 */
            near(out_fi[i], out_split[i], tc_tol + u, 1.0, "FlashInfer against split", i);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(dtiles);
    cudaFree((void *)a.q);
    cudaFree(a.out);
    cudaFree((void *)a.k_cache);
    cudaFree((void *)a.v_cache);
    cudaFree((void *)a.pos);
    cudaFree((void *)a.seq);
    cudaFree((void *)a.block_start);
    cudaFree((void *)a.blocks);
    cudaFree(a.scratch);
    free(pos);
    free(seq);
    free(tiles);
    free(blocks);
    free(kc);
    free(vc);
    free(q);
    free(out_split);
    free(out_tiles);
    free(out_tc);
    free(out_fi);
}

/* The 8B's attention shape (heads of 128) and the 1B's (heads of 64). */
static void test_prefill_speed(void **state) {
    (void)state;
    NEED_DEVICE();
    rng_seed(0x6e0102, "prefill speed");
    prefill_speed(128);
    prefill_speed(64);
}

static int setup(void **state) {
    (void)state;
    int n = 0;
    have_device = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    if (!have_device)
        printf("# no CUDA device: the prefill attention tests skip\n");
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_attention),
        cmocka_unit_test(test_prefill_refusals),
        cmocka_unit_test(test_prefill_tc_attention),
        cmocka_unit_test(test_prefill_tc_refusals),
        cmocka_unit_test(test_prefill_flashinfer_attention),
        cmocka_unit_test(test_flashinfer_refusals),
        cmocka_unit_test(test_prefill_speed),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
