/* The arithmetic of the batch-invariant tensor-core matmul
 * (cuda/kernels_matmul_tc.cu), in C that both nvcc and the host compiler
 * take, so that tests/cuda/test_matmul_order.c checks it on any machine:
 * which weight types the kernel takes and how, its tile shapes, where each
 * lane's fragment elements lie, and how a quantized block's elements become
 * the integers a fragment holds.
 *
 * The rule that makes a row's result independent of the batch: every
 * output element y[j][o] is accumulated by one warp over K in 16-element
 * k-steps in ascending order into one f32 accumulator (for Q8_0 and Q4_0:
 * each 32-element block's two k-steps into a zeroed partial, then
 * acc = fma(d, partial, acc), blocks in ascending order), whatever the
 * tile shape, and a tile shape never splits K. The tile shape, chosen by
 * the row count, only decides which warp does it. */
#ifndef LLMI_CUDA_MATMUL_TC_MATH_H
#define LLMI_CUDA_MATMUL_TC_MATH_H

#include "core/ttype.h"

#include <stdbool.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define LLMI_MMTC_HD __host__ __device__ __forceinline__ constexpr
#else
#define LLMI_MMTC_HD static inline
#endif

/* Elements of K per pipeline stage: two 32-element blocks, four k-steps. */
#define LLMI_MMTC_KC 64u

/* How the kernel builds the weight (A) fragments of a type. */
typedef enum llmi_mmtc_kind {
    LLMI_MMTC_NONE = 0, /* not taken */
    LLMI_MMTC_BF16,     /* ldmatrix, as stored */
    LLMI_MMTC_F16,      /* ldmatrix, then w = hi + lo, both bf16 (exact), two mma */
    LLMI_MMTC_SCALED,   /* Q8_0, Q4_0: the block's integers (exact in bf16), d after */
    LLMI_MMTC_DEQ,      /* Q4_1, Q5_0, Q5_1, Q4_K: the dequantized value rounded to bf16 */
} llmi_mmtc_kind;

LLMI_MMTC_HD llmi_mmtc_kind llmi_mmtc_kind_of(llmi_ttype type) {
    switch (type) {
    case LLMI_T_BF16:
        return LLMI_MMTC_BF16;
    case LLMI_T_F16:
        return LLMI_MMTC_F16;
    case LLMI_T_Q8_0:
    case LLMI_T_Q4_0:
        return LLMI_MMTC_SCALED;
    case LLMI_T_Q4_1:
    case LLMI_T_Q5_0:
    case LLMI_T_Q5_1:
    case LLMI_T_Q4_K:
        return LLMI_MMTC_DEQ;
    default:
        return LLMI_MMTC_NONE;
    }
}

/* Bytes of one 32-element block of the block types the kernel takes; 2 (one
 * element) for the 16-bit types; 0 otherwise (Q4_K too: its 256-element
 * super-blocks are staged as below). */
LLMI_MMTC_HD uint32_t llmi_mmtc_block_bytes(llmi_ttype type) {
    switch (type) {
    case LLMI_T_BF16:
    case LLMI_T_F16:
        return 2;
    case LLMI_T_Q8_0:
        return 34;
    case LLMI_T_Q4_0:
        return 18;
    case LLMI_T_Q4_1:
        return 20;
    case LLMI_T_Q5_0:
        return 22;
    case LLMI_T_Q5_1:
        return 24;
    default:
        return 0;
    }
}

/* Bytes of one weight row's LLMI_MMTC_KC elements (one stage's copy):
 * 128 for the 16-bit types, two blocks for the 32-element block types; for
 * Q4_K the super-block's first 16 bytes (d, dmin, the packed scales) and
 * the 32 bytes of qs that hold the stage's 64 elements (group g = kc % 4 of
 * the super-block kc / 4: elements 64 g + l in the low nibbles of qs[32 g
 * + l], 64 g + 32 + l in the high ones). Always a multiple of the copy
 * size: 4 bytes for the 32-element block types, 16 for the others. */
LLMI_MMTC_HD uint32_t llmi_mmtc_chunk_bytes(llmi_ttype type) {
    const uint32_t bb = llmi_mmtc_block_bytes(type);
    return type == LLMI_T_Q4_K ? 48 : bb == 2 ? 2 * LLMI_MMTC_KC : 2 * bb;
}

LLMI_MMTC_HD uint32_t llmi_mmtc_copy_bytes(llmi_ttype type) {
    return llmi_mmtc_block_bytes(type) == 2 || type == LLMI_T_Q4_K ? 16 : 4;
}

/* Whether the kernel takes a [rows][cols] weight of `type` at `data` with
 * rows row_bytes apart: cols a multiple of LLMI_MMTC_KC (256 for Q4_K: a
 * stage never ends inside a block), rows that start at a multiple of the
 * copy size. */
LLMI_MMTC_HD bool llmi_mmtc_takes(llmi_ttype type, uint32_t cols, uint64_t row_bytes,
                                  uint64_t address) {
    const uint32_t group = type == LLMI_T_Q4_K ? 256 : LLMI_MMTC_KC;
    if (llmi_mmtc_kind_of(type) == LLMI_MMTC_NONE || cols == 0 || cols % group != 0)
        return false;
    const uint32_t align = llmi_mmtc_copy_bytes(type);
    const uint64_t min_row = type == LLMI_T_Q4_K
                                 ? (uint64_t)(cols / 256) * 144
                                 : (uint64_t)(cols / LLMI_MMTC_KC) * llmi_mmtc_chunk_bytes(type);
    return row_bytes % align == 0 && address % align == 0 && row_bytes >= min_row;
}

/* ---- tile shapes ----
 * A CTA computes BM weight rows (the mma's M side: weights are always the
 * A operand, whatever n) by BN activation rows (the N side) with
 * WARPS_M x WARPS_N warps, each warp (BM / WARPS_M) x (BN / WARPS_N) as
 * MI x NI tiles of 16 x 8, over every k-stage of K with STAGES stages of
 * cp.async in flight. */
typedef struct llmi_mmtc_tile {
    uint32_t bm, bn, warps_m, warps_n, stages;
} llmi_mmtc_tile;

#define LLMI_MMTC_TILE_DECODE 0 /* n <= 16: many small CTAs, deep pipeline */
#define LLMI_MMTC_TILE_MID 1    /* n <= 64 */
#define LLMI_MMTC_TILE_PREFILL 2
#define LLMI_MMTC_TILES 3

#define LLMI_MMTC_DECODE_SHAPE 32, 16, 2, 1, 8
#define LLMI_MMTC_MID_SHAPE 64, 32, 2, 2, 4
#define LLMI_MMTC_PREFILL_SHAPE 128, 128, 4, 2, 3

LLMI_MMTC_HD llmi_mmtc_tile llmi_mmtc_tile_shape(uint32_t id) {
    const llmi_mmtc_tile shapes[LLMI_MMTC_TILES] = {
        {LLMI_MMTC_DECODE_SHAPE}, {LLMI_MMTC_MID_SHAPE}, {LLMI_MMTC_PREFILL_SHAPE}};
    return shapes[id < LLMI_MMTC_TILES ? id : LLMI_MMTC_TILE_PREFILL];
}

/* The tile shape for n activation rows: a speed choice only. */
LLMI_MMTC_HD uint32_t llmi_mmtc_tile_for(uint32_t n) {
    return n <= 16 ? LLMI_MMTC_TILE_DECODE : n <= 64 ? LLMI_MMTC_TILE_MID : LLMI_MMTC_TILE_PREFILL;
}

/* Dynamic shared memory of a shape for a weight type: per stage BM rows of
 * the weight chunk (the 16-bit types padded by 16 bytes a row so that
 * ldmatrix's eight rows fall in distinct banks) and BN rows of LLMI_MMTC_KC
 * bf16 activations, padded the same way. */
LLMI_MMTC_HD uint32_t llmi_mmtc_a_row_bytes(llmi_ttype type) {
    return llmi_mmtc_block_bytes(type) == 2 ? 2 * LLMI_MMTC_KC + 16 : llmi_mmtc_chunk_bytes(type);
}
#define LLMI_MMTC_B_ROW_BYTES (2u * LLMI_MMTC_KC + 16u)
LLMI_MMTC_HD uint32_t llmi_mmtc_smem_bytes(llmi_mmtc_tile t, llmi_ttype type) {
    return t.stages * (t.bm * llmi_mmtc_a_row_bytes(type) + t.bn * LLMI_MMTC_B_ROW_BYTES);
}

/* ---- stage copies ----
 * Stage kc holds elements [64 kc, 64 kc + 64) of the CTA's weight rows and
 * activation rows. Weight row r (local) of the stage is copied in
 * chunk / copy pieces: piece c from byte llmi_mmtc_a_src of the weight to
 * byte llmi_mmtc_a_dst of the stage. Activation row r: 8 pieces of 8 bf16
 * elements, piece c from element llmi_mmtc_b_src to byte llmi_mmtc_b_dst. */
LLMI_MMTC_HD uint64_t llmi_mmtc_a_src(llmi_ttype type, uint64_t row_bytes, uint32_t row,
                                      uint32_t kc, uint32_t c) {
    if (type == LLMI_T_Q4_K) /* the header, then the group's 32 bytes of qs */
        return row * row_bytes + (uint64_t)(kc / 4) * 144 +
               (c == 0 ? 0 : 16 + 32 * (kc % 4) + 16 * (c - 1));
    return row * row_bytes + (uint64_t)kc * llmi_mmtc_chunk_bytes(type) +
           (uint64_t)c * llmi_mmtc_copy_bytes(type);
}
LLMI_MMTC_HD uint32_t llmi_mmtc_a_dst(llmi_ttype type, uint32_t r, uint32_t c) {
    return r * llmi_mmtc_a_row_bytes(type) + c * llmi_mmtc_copy_bytes(type);
}
LLMI_MMTC_HD uint64_t llmi_mmtc_b_src(uint64_t x_stride, uint32_t row, uint32_t kc, uint32_t c) {
    return row * x_stride + (uint64_t)kc * LLMI_MMTC_KC + 8u * c;
}
LLMI_MMTC_HD uint32_t llmi_mmtc_b_dst(uint32_t r, uint32_t c) {
    return r * LLMI_MMTC_B_ROW_BYTES + 16u * c;
}

/* In a stage: the byte of element 32 h + 16 s + col of local weight row r
 * (16-bit types), and of block h of it (block types: the stage's two
 * blocks); the byte of element 32 h + 16 s + col of activation row r. */
LLMI_MMTC_HD uint32_t llmi_mmtc_a_elem(llmi_ttype type, uint32_t r, uint32_t h, uint32_t s,
                                       uint32_t col) {
    return r * llmi_mmtc_a_row_bytes(type) + 2 * (32 * h + 16 * s + col);
}
LLMI_MMTC_HD uint32_t llmi_mmtc_a_block(llmi_ttype type, uint32_t r, uint32_t h) {
    return r * llmi_mmtc_a_row_bytes(type) + h * llmi_mmtc_block_bytes(type);
}

/* Q4_K in a stage (row: llmi_mmtc_a_block(Q4_K, r, h), the staged header
 * first): element 32 h + e (e < 32) of the stage's 64 is the quant in
 * nibble h of byte 16 + e, in sub-block 2 (kc % 4) + h of the
 * super-block, whose header (d, dmin, scales) the row starts with as the
 * super-block does. */
LLMI_MMTC_HD uint32_t llmi_mmtc_q4k_quant(const uint8_t *row, uint32_t h, uint32_t e) {
    return (uint32_t)(row[16 + e] >> (4 * h)) & 15u;
}
LLMI_MMTC_HD uint32_t llmi_mmtc_q4k_sub(uint32_t kc, uint32_t h) { return 2 * (kc % 4) + h; }
LLMI_MMTC_HD uint32_t llmi_mmtc_b_elem(uint32_t r, uint32_t h, uint32_t s, uint32_t col) {
    return r * LLMI_MMTC_B_ROW_BYTES + 2 * (32 * h + 16 * s + col);
}

/* ---- fragments of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ----
 * Register r (0 .. 3) of a lane's A fragment holds two elements of row
 * a_row, columns a_col and a_col + 1 (the low half the first); register r
 * (0, 1) of its B fragment two of column (activation row) lane / 4, k
 * b_k and b_k + 1; accumulator element e (0 .. 3) is (c_row, c_col). */
LLMI_MMTC_HD uint32_t llmi_mmtc_a_row(uint32_t lane, uint32_t r) { return lane / 4 + 8 * (r % 2); }
LLMI_MMTC_HD uint32_t llmi_mmtc_a_col(uint32_t lane, uint32_t r) {
    return 2 * (lane % 4) + 8 * (r / 2);
}
LLMI_MMTC_HD uint32_t llmi_mmtc_b_k(uint32_t lane, uint32_t r) { return 2 * (lane % 4) + 8 * r; }
LLMI_MMTC_HD uint32_t llmi_mmtc_c_row(uint32_t lane, uint32_t e) { return lane / 4 + 8 * (e / 2); }
LLMI_MMTC_HD uint32_t llmi_mmtc_c_col(uint32_t lane, uint32_t e) { return 2 * (lane % 4) + e % 2; }

/* ---- Q8_0 and Q4_0 as integers ----
 * Element j (< 32) of a block as the integer whose product with the
 * block's scale d (the f16 at blk[0..1], llmi_mmtc_scale_bits) is the
 * dequantized value: Q8_0 q[j]; Q4_0 the nibble minus 8 (element j < 16
 * the low nibble of byte 2 + j, else the high one of byte 2 + j - 16).
 * Both fit bf16 exactly (|q| <= 128), and d * q is exact in f32. Read
 * through the 16-bit word holding elements j and j ^ 1, so that a pair
 * costs one shared-memory load on the device. */
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ uint32_t llmi_mmtc_u16(const uint8_t *p) {
    return *(const uint16_t *)p; /* p 2-byte aligned: blocks start at even offsets */
}
#else
LLMI_MMTC_HD uint32_t llmi_mmtc_u16(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}
#endif

LLMI_MMTC_HD int llmi_mmtc_int_at(llmi_ttype type, const uint8_t *blk, uint32_t j) {
    if (type == LLMI_T_Q8_0)
        return (int8_t)(llmi_mmtc_u16(blk + 2 + (j & ~1u)) >> (8 * (j & 1)));
    const uint32_t word = llmi_mmtc_u16(blk + 2 + (j % 16 & ~1u));
    return (int)((word >> (8 * (j & 1) + (j < 16 ? 0 : 4))) & 15u) - 8;
}

LLMI_MMTC_HD uint32_t llmi_mmtc_scale_bits(const uint8_t *blk) { return llmi_mmtc_u16(blk); }

#endif
