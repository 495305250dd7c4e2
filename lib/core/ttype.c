/* Tensor type table. Sizes follow GGUF's block layouts so a tensor's byte
 * size computed here matches what a GGUF writer laid out in the file. */
#include "core/ttype.h"

static const llmi_ttype_info info_f32 = {"F32", 1, 4, true};
static const llmi_ttype_info info_f16 = {"F16", 1, 2, true};
static const llmi_ttype_info info_bf16 = {"BF16", 1, 2, true};
static const llmi_ttype_info info_q4_0 = {"Q4_0", LLMI_QK, sizeof(llmi_block_q4_0), true};
static const llmi_ttype_info info_q4_1 = {"Q4_1", LLMI_QK, sizeof(llmi_block_q4_1), true};
static const llmi_ttype_info info_q5_0 = {"Q5_0", LLMI_QK, sizeof(llmi_block_q5_0), true};
static const llmi_ttype_info info_q5_1 = {"Q5_1", LLMI_QK, sizeof(llmi_block_q5_1), true};
static const llmi_ttype_info info_q8_0 = {"Q8_0", LLMI_QK, sizeof(llmi_block_q8_0), true};
static const llmi_ttype_info info_q8_1 = {"Q8_1", LLMI_QK, sizeof(llmi_block_q8_1), false};
static const llmi_ttype_info info_q4_k = {"Q4_K", LLMI_QK_K, sizeof(llmi_block_q4_k), true};
static const llmi_ttype_info info_q6_k = {"Q6_K", LLMI_QK_K, sizeof(llmi_block_q6_k), true};
static const llmi_ttype_info info_q8_k = {"Q8_K", LLMI_QK_K, sizeof(llmi_block_q8_k), false};
static const llmi_ttype_info info_fp8_e4m3 = {"FP8_E4M3", LLMI_QK, sizeof(llmi_block_fp8_e4m3),
                                              false};

/* The block structs must have no padding, or files would not map onto them. */
_Static_assert(sizeof(llmi_block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(llmi_block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(llmi_block_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(llmi_block_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(llmi_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(llmi_block_q8_1) == 36, "Q8_1 block is 36 bytes");
_Static_assert(sizeof(llmi_block_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(llmi_block_q6_k) == 210, "Q6_K block is 210 bytes");
_Static_assert(sizeof(llmi_block_q8_k) == 292, "Q8_K block is 292 bytes");
_Static_assert(sizeof(llmi_block_fp8_e4m3) == 36, "FP8_E4M3 block is 36 bytes");

const llmi_ttype_info *llmi_ttype_get(uint32_t type) {
    switch (type) {
    case LLMI_T_F32:
        return &info_f32;
    case LLMI_T_F16:
        return &info_f16;
    case LLMI_T_BF16:
        return &info_bf16;
    case LLMI_T_Q4_0:
        return &info_q4_0;
    case LLMI_T_Q4_1:
        return &info_q4_1;
    case LLMI_T_Q5_0:
        return &info_q5_0;
    case LLMI_T_Q5_1:
        return &info_q5_1;
    case LLMI_T_Q8_0:
        return &info_q8_0;
    case LLMI_T_Q8_1:
        return &info_q8_1;
    case LLMI_T_Q4_K:
        return &info_q4_k;
    case LLMI_T_Q6_K:
        return &info_q6_k;
    case LLMI_T_Q8_K:
        return &info_q8_k;
    case LLMI_T_FP8_E4M3:
        return &info_fp8_e4m3;
    default:
        return NULL;
    }
}

size_t llmi_ttype_row_bytes(uint32_t type, uint64_t n) {
    const llmi_ttype_info *ti = llmi_ttype_get(type);
    if (!ti || n % ti->block != 0)
        return 0;
    uint64_t blocks = n / ti->block;
    if (blocks > SIZE_MAX / ti->block_bytes)
        return 0;
    return (size_t)blocks * ti->block_bytes;
}
