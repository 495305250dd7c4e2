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
    LLMI_MMTC_DEQ,      /* Q4_1, Q5_0, Q5_1: the dequantized value rounded to bf16 */
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
        return LLMI_MMTC_DEQ;
    default:
        return LLMI_MMTC_NONE;
    }
}

/* Bytes of one 32-element block of the block types the kernel takes; 2 (one
 * element) for the 16-bit types; 0 otherwise. */
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
 * 128 for the 16-bit types, two blocks otherwise; always a multiple of 4,
 * the cp.async size of the block types (16 for the 16-bit ones). */
LLMI_MMTC_HD uint32_t llmi_mmtc_chunk_bytes(llmi_ttype type) {
    const uint32_t bb = llmi_mmtc_block_bytes(type);
    return bb == 2 ? 2 * LLMI_MMTC_KC : 2 * bb;
}

/* Whether the kernel takes a [rows][cols] weight of `type` at `data` with
 * rows row_bytes apart: cols a multiple of LLMI_MMTC_KC (a stage never
 * ends inside a block), rows that start at a multiple of the copy size. */
LLMI_MMTC_HD bool llmi_mmtc_takes(llmi_ttype type, uint32_t cols, uint64_t row_bytes,
                                  uint64_t address) {
    const llmi_mmtc_kind kind = llmi_mmtc_kind_of(type);
    if (kind == LLMI_MMTC_NONE || cols == 0 || cols % LLMI_MMTC_KC != 0)
        return false;
    const uint32_t align = kind == LLMI_MMTC_BF16 || kind == LLMI_MMTC_F16 ? 16 : 4;
    return row_bytes % align == 0 && address % align == 0 &&
           row_bytes >= (uint64_t)(cols / LLMI_MMTC_KC) * llmi_mmtc_chunk_bytes(type);
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
LLMI_MMTC_HD uint32_t llmi_mmtc_copy_bytes(llmi_ttype type) {
    return llmi_mmtc_block_bytes(type) == 2 ? 16 : 4;
}
LLMI_MMTC_HD uint64_t llmi_mmtc_a_src(llmi_ttype type, uint64_t row_bytes, uint32_t row,
                                      uint32_t kc, uint32_t c) {
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
 * Elements j and j + 1 (j even, < 32) of a block as the integers whose
 * product with the block's scale d (the f16 at blk[0..1], llmi_mmtc_scale)
 * is the dequantized value: Q8_0 q[j]; Q4_0 the nibble minus 8 (element j
 * < 16 the low nibble of byte 2 + j, else the high one of byte 2 + j - 16).
 * Both fit bf16 exactly (|q| <= 128), and d * q is exact in f32. */
LLMI_MMTC_HD void llmi_mmtc_int_pair(llmi_ttype type, const uint8_t *blk, uint32_t j, int q[2]) {
    if (type == LLMI_T_Q8_0) {
        q[0] = (int8_t)blk[2 + j];
        q[1] = (int8_t)blk[3 + j];
    } else {
        const uint32_t shift = j < 16 ? 0 : 4;
        q[0] = (int)((blk[2 + j % 16] >> shift) & 15u) - 8;
        q[1] = (int)((blk[3 + j % 16] >> shift) & 15u) - 8;
    }
}

LLMI_MMTC_HD uint32_t llmi_mmtc_scale_bits(const uint8_t *blk) {
    return (uint32_t)blk[0] | (uint32_t)blk[1] << 8;
}

#endif
