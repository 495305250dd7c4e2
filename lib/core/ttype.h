/* Tensor element types and the 2-D weight view: the vocabulary every module
 * shares (core is the leaf all may include). Values are GGUF's (ggml_type)
 * so files map directly. Everything here is constant data and pure
 * functions: thread-safe. */
#ifndef LLMI_TTYPE_H
#define LLMI_TTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum llmi_ttype {
    LLMI_T_F32 = 0,
    LLMI_T_F16 = 1,
    LLMI_T_Q4_0 = 2,
    LLMI_T_Q4_1 = 3,
    LLMI_T_Q5_0 = 6,
    LLMI_T_Q5_1 = 7,
    LLMI_T_Q8_0 = 8,
    LLMI_T_Q8_1 = 9,
    LLMI_T_Q4_K = 12,
    LLMI_T_Q6_K = 14,
    LLMI_T_Q8_K = 15,
    LLMI_T_BF16 = 30,
    /* Not a GGUF type (no model stores weights in it): the FP8 KV cache's
     * blocks. Our own types number from 1024 up, clear of GGUF's. */
    LLMI_T_FP8_E4M3 = 1024,
} llmi_ttype;

/* Block layouts, identical to GGUF's. d/m are IEEE half floats. */
#define LLMI_QK 32
typedef struct { uint16_t d; uint8_t qs[LLMI_QK / 2]; } llmi_block_q4_0;            /* x = d*(q-8) */
typedef struct { uint16_t d, m; uint8_t qs[LLMI_QK / 2]; } llmi_block_q4_1;         /* x = d*q + m */
typedef struct { uint16_t d; int8_t qs[LLMI_QK]; } llmi_block_q8_0;                 /* x = d*q */
/* x = d*q; s = d*sum(q), with the unrounded d (llama.cpp's activation type for
 * Q4_1 weights; no model stores its weights in it). */
typedef struct { uint16_t d, s; int8_t qs[LLMI_QK]; } llmi_block_q8_1;
/* The FP8 KV cache (not GGUF's): x = d * e4m3(q) (core/fp8.h), d = amax / 448
 * of the block's 32 values, in f32 (36 bytes, 4-aligned). */
typedef struct { float d; uint8_t qs[LLMI_QK]; } llmi_block_fp8_e4m3;
/* In Q4 blocks byte j holds element j in its low nibble and j+16 in its high. */
/* Q5 blocks add a fifth bit per element: element j's is bit j of qh read as
 * a little-endian uint32; the low 4 bits sit in qs as in Q4. qh is bytes, so
 * the blocks keep GGUF's 2-byte alignment (22 and 24 bytes).
 * Q5_0: x = d*(q-16); Q5_1: x = d*q + m. */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[LLMI_QK / 2]; } llmi_block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[LLMI_QK / 2]; } llmi_block_q5_1;

/* K-quants: super-blocks of 256 elements with per-sub-block integer scales.
 *
 * Q4_K: 8 sub-blocks of 32; x = d*sc[j]*q - dmin*m[j], q in 0..15, sc and m
 *   6-bit. scales[12] packs them: for j < 4, sc[j] = scales[j] & 63 and
 *   m[j] = scales[j+4] & 63; for j >= 4, sc[j] = (scales[j+4] & 15) |
 *   (scales[j-4] >> 6) << 4 and m[j] = (scales[j+4] >> 4) | (scales[j] >> 6)
 *   << 4. qs: 64-element group g (32 bytes at qs + 32g) holds element 64g+l
 *   in byte l's low nibble and 64g+32+l in its high nibble.
 * Q6_K: 16 sub-blocks of 16; x = d*scales[j]*(q - 32), q in 0..63, scales
 *   int8. Each half h (128 elements) uses ql + 64h, qh + 32h: for l < 32,
 *   element 128h+l     = ql[l] low nibble    | (qh[l] bits 0-1) << 4,
 *           128h+l+32  = ql[l+32] low nibble | (qh[l] bits 2-3) << 4,
 *           128h+l+64  = ql[l] high nibble   | (qh[l] bits 4-5) << 4,
 *           128h+l+96  = ql[l+32] high nibble| (qh[l] bits 6-7) << 4.
 * Q8_K: llama.cpp's activation type for both (x = d*q with an f32 d, and
 *   bsums[j] = the sum of q over elements 16j..16j+15); no model stores its
 *   weights in it. */
#define LLMI_QK_K 256
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[LLMI_QK_K / 2];
} llmi_block_q4_k;
typedef struct {
    uint8_t ql[LLMI_QK_K / 2];
    uint8_t qh[LLMI_QK_K / 4];
    int8_t scales[LLMI_QK_K / 16];
    uint16_t d;
} llmi_block_q6_k;
typedef struct {
    float d;
    int8_t qs[LLMI_QK_K];
    int16_t bsums[LLMI_QK_K / 16];
} llmi_block_q8_k;

typedef struct llmi_ttype_info {
    const char *name;   /* "Q4_1" */
    uint32_t block;     /* elements per block (1 for float types) */
    uint32_t block_bytes;
    /* Weights may be stored in it: the model loader accepts it and every
     * backend multiplies it (false for the activation-only Q8_1, Q8_K). */
    bool weight;
} llmi_ttype_info;

/* NULL for a type this library does not know. */
const llmi_ttype_info *llmi_ttype_get(uint32_t type);

/* Bytes of `n` elements of `type`; returns 0 if n is not a multiple of the
 * block size, the type is unknown, or the size overflows. */
size_t llmi_ttype_row_bytes(uint32_t type, uint64_t n);

/* A 2-D weight view, borrowed from whoever maps the tensor (the model):
 * `rows` rows of `cols` elements; row r starts at data + r * row_bytes.
 * cols is a multiple of the type's block size. Here, not in the backend,
 * because the model builds these and the backend reads them. */
typedef struct llmi_weight {
    const void *data;
    llmi_ttype type;
    int64_t rows, cols;
    size_t row_bytes;
    /* A backend's own copy of the same values in the layout its kernels
     * read fastest, or NULL (the model's views never have one): groups of
     * LLMI_WEIGHT_PACK_ROWS rows, packed_group_bytes apart. The CPU backend
     * makes them (backend/cpu/kernels.h, "Packed weights"). */
    const void *packed;
    size_t packed_group_bytes;
} llmi_weight;

#define LLMI_WEIGHT_PACK_ROWS 16

/* Rows [row0, row0 + n) of w, viewing the same data; an absent weight
 * (data NULL) stays absent. The packed copy goes along when row0 starts a
 * group of it. */
static inline llmi_weight llmi_weight_rows(llmi_weight w, uint64_t row0, uint64_t n) {
    if (!w.data)
        return w;
    w.data = (const uint8_t *)w.data + row0 * w.row_bytes;
    w.rows = (int64_t)n;
    if (w.packed && row0 % LLMI_WEIGHT_PACK_ROWS == 0)
        w.packed = (const uint8_t *)w.packed + row0 / LLMI_WEIGHT_PACK_ROWS * w.packed_group_bytes;
    else
        w.packed = NULL;
    return w;
}

/* Elements [c0, c0 + n) of an F32 vector (a bias or a norm's scales). */
static inline llmi_weight llmi_weight_elems(llmi_weight w, uint64_t c0, uint64_t n) {
    if (!w.data)
        return w;
    w.data = (const float *)w.data + c0;
    w.cols = (int64_t)n;
    w.row_bytes = n * sizeof(float);
    return w;
}

#endif
