/* Tensor element types. Values are GGUF's (ggml_type) so files map directly. */
#ifndef LLMI_TTYPE_H
#define LLMI_TTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum llmi_ttype {
    LLMI_T_F32 = 0,
    LLMI_T_F16 = 1,
    LLMI_T_Q4_0 = 2,
    LLMI_T_Q4_1 = 3,
    LLMI_T_Q8_0 = 8,
    LLMI_T_Q8_1 = 9,
    LLMI_T_BF16 = 30,
} llmi_ttype;

/* Block layouts, identical to GGUF's. d/m are IEEE half floats. */
#define LLMI_QK 32
typedef struct { uint16_t d; uint8_t qs[LLMI_QK / 2]; } llmi_block_q4_0;            /* x = d*(q-8) */
typedef struct { uint16_t d, m; uint8_t qs[LLMI_QK / 2]; } llmi_block_q4_1;         /* x = d*q + m */
typedef struct { uint16_t d; int8_t qs[LLMI_QK]; } llmi_block_q8_0;                 /* x = d*q */
/* x = d*q; s = d*sum(q), with the unrounded d (llama.cpp's activation type for
 * Q4_1 weights; no model stores its weights in it). */
typedef struct { uint16_t d, s; int8_t qs[LLMI_QK]; } llmi_block_q8_1;
/* In Q4 blocks byte j holds element j in its low nibble and j+16 in its high. */

typedef struct llmi_ttype_info {
    const char *name;   /* "Q4_1" */
    uint32_t block;     /* elements per block (1 for float types) */
    uint32_t block_bytes;
} llmi_ttype_info;

/* NULL for a type this library does not know. */
const llmi_ttype_info *llmi_ttype_get(uint32_t type);

/* Bytes of `n` elements of `type`; returns 0 if n is not a multiple of the
 * block size, the type is unknown, or the size overflows. */
size_t llmi_ttype_row_bytes(uint32_t type, uint64_t n);

#endif
