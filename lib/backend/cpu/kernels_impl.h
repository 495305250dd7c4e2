/* Private interface of the CPU kernels: what the kernel files export to the
 * dispatch (kernels_dispatch.c) and nothing else.
 *
 * Dependencies run one way, so each file can be read and changed alone:
 *   cpu_features.c        the level (a leaf: includes no kernel header)
 *   kernels.c             portable float rows kernels and the row helpers
 *   kernels_q8.c          Q8_0/Q8_1 activations, portable integer kernels
 *   kernels_k.c           Q8_K activations, portable K-quant kernels
 *   kernels_kvq.c         row operations of the quantized KV cache
 *   kernels_*x86.c        the SIMD versions of the three above
 *   kernels_q8_vnni.c     the AVX-512 VNNI GEMM of kernels_q8.c's types
 *   kernels_dispatch.c    the weight-type traits table, the row split and
 *                         the matmul and activation entry points of kernels.h
 * Kernel files ask cpu_features.h for the level and call only the row
 * helpers of kernels.h (llmi_dot_f32); only the dispatch calls across
 * families.
 *
 * Contract of every rows function: y[t*ldy + r] for r in [r0, r1) and
 * t < nt, where 1 <= nt <= the implementation's tile; nothing else is
 * written, and the result for (r, t) depends only on row r and token t. */
#ifndef LLMI_KERNELS_IMPL_H
#define LLMI_KERNELS_IMPL_H

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"

/* Dense index of the float-activation kernel templates of kernels.c and
 * kernels_x86.c (compile-time parameters there, not a dispatch key). */
enum {
    LLMI_KT_F32,
    LLMI_KT_F16,
    LLMI_KT_BF16,
    LLMI_KT_Q4_0,
    LLMI_KT_Q4_1,
    LLMI_KT_Q8_0,
    LLMI_KT_COUNT
};

/* Dense index of the integer kernel templates of kernels_q8.c and
 * kernels_q8_x86.c. */
enum { LLMI_QT_Q4_0, LLMI_QT_Q4_1, LLMI_QT_Q8_0, LLMI_QT_Q5_0, LLMI_QT_Q5_1, LLMI_QT_COUNT };

/* Types with a per-block minimum m (x = d*q + m), which pair with Q8_1
 * activations and add m_w * s_x per block. */
static inline int llmi_qt_has_min(int qt) { return qt == LLMI_QT_Q4_1 || qt == LLMI_QT_Q5_1; }
/* Types whose block holds a 5th bit per weight in qh[4]. */
static inline int llmi_qt_is_q5(int qt) { return qt == LLMI_QT_Q5_0 || qt == LLMI_QT_Q5_1; }

/* Bytes of one weight block, where its quants start, and (Q5 only) where
 * its qh[4], the fifth bits, start. */
static inline size_t llmi_qt_block_bytes(int qt) {
    return qt == LLMI_QT_Q4_0   ? sizeof(llmi_block_q4_0)
           : qt == LLMI_QT_Q4_1 ? sizeof(llmi_block_q4_1)
           : qt == LLMI_QT_Q5_0 ? sizeof(llmi_block_q5_0)
           : qt == LLMI_QT_Q5_1 ? sizeof(llmi_block_q5_1)
                                : sizeof(llmi_block_q8_0);
}
static inline size_t llmi_qt_qs_offset(int qt) {
    return qt == LLMI_QT_Q4_0   ? offsetof(llmi_block_q4_0, qs)
           : qt == LLMI_QT_Q4_1 ? offsetof(llmi_block_q4_1, qs)
           : qt == LLMI_QT_Q5_0 ? offsetof(llmi_block_q5_0, qs)
           : qt == LLMI_QT_Q5_1 ? offsetof(llmi_block_q5_1, qs)
                                : offsetof(llmi_block_q8_0, qs);
}
static inline size_t llmi_qt_qh_offset(int qt) {
    return qt == LLMI_QT_Q5_0 ? offsetof(llmi_block_q5_0, qh) : offsetof(llmi_block_q5_1, qh);
}

/* Full unrolling of the small constant loops over tiles and lanes of the
 * SIMD kernels, so that arrays of vectors become registers (GCC and Clang
 * spell it differently). */
#if defined(__clang__)
#define LLMI_UNROLL _Pragma("clang loop unroll(full)")
#else
#define LLMI_UNROLL _Pragma("GCC unroll 16")
#endif

/* Token t's f32 activations at x + t*w->cols. */
typedef void (*llmi_rows_fn)(const llmi_weight *w, int64_t r0, int64_t r1, const float *x, int nt,
                             float *y, int64_t ldy);

/* Token t's quantized row (kernels.h gives the layouts) at xq + t*xstride. */
typedef void (*llmi_qrows_fn)(const llmi_weight *w, int64_t r0, int64_t r1, const uint8_t *xq,
                              size_t xstride, int nt, float *y, int64_t ldy);

/* Quantizes one row of nb activation blocks (block size of the activation
 * type) into the layout of kernels.h, writing all row_bytes bytes (zero
 * padding). q81 selects Q8_1's s over Q8_0's c; Q8_K ignores it. */
typedef void (*llmi_aquant_fn)(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes);

/* A rows kernel and the most tokens it takes per call: the dispatch walks
 * more tokens in row blocks and token tiles. INT_MAX for GEMM kernels,
 * which block for the caches themselves. */
typedef struct llmi_rows_impl {
    int tile;
    llmi_rows_fn fn;
} llmi_rows_impl;

typedef struct llmi_qrows_impl {
    int tile;
    llmi_qrows_fn fn;
} llmi_qrows_impl;

/* What the dispatch needs to know about one element type; one entry per
 * llmi_ttype (kernels_dispatch.c). Block sizes and bytes are core's
 * (llmi_ttype_get); the table adds what only the kernels know. */
typedef struct llmi_ktraits {
    /* As a weight. act_type: the activations it multiplies (LLMI_T_F32 for
     * float weights). f32: rows kernels on f32 activations, by
     * llmi_kernels_level(); NULL where the type is no weight type. q: rows
     * kernels on act_type activations, by llmi_kernels_int_level(); NULL
     * for float weights. */
    llmi_ttype act_type;
    const llmi_rows_impl *f32[LLMI_KLEVEL_COUNT];
    const llmi_qrows_impl *q[LLMI_KLEVEL_COUNT];
    /* Packed weights (kernels.h): the integer template (LLMI_QT_*) and the
     * AVX-512 VNNI kernel that reads llmi_weight.packed; NULL when the type
     * has no packed layout. */
    int qt;
    const llmi_qrows_impl *q_packed;
    /* As an activation type (Q8_0, Q8_1, Q8_K): bytes an activation row
     * spends per block (values, scale, and c, s or bsums), and its
     * quantizer by llmi_kernels_int_level(). 0 and NULL otherwise. */
    uint32_t act_block_bytes;
    llmi_aquant_fn quant[LLMI_KLEVEL_COUNT];
} llmi_ktraits;

/* The entry of `type`; NULL for a type the table does not have. */
const llmi_ktraits *llmi_ktraits_get(uint32_t type);

/* The row helpers of one level (kernels.c picks the current one). */
enum {
    LLMI_RT_F32,
    LLMI_RT_F16,
    LLMI_RT_BF16,
    LLMI_RT_Q8_0,
    LLMI_RT_Q4_0,
    LLMI_RT_FP8_E4M3,
    LLMI_RT_COUNT
};

typedef struct llmi_kernel_set {
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n);
    double (*sumsq)(const float *x, int n);
    llmi_row_ops row_ops[LLMI_RT_COUNT];
} llmi_kernel_set;

/* The set of the current level (kernels.c). */
const llmi_kernel_set *llmi_kernels_current(void);

/* ---- what each kernel file exports --------------------------------------
 * Names: llmi_rows_<weight>_<level> on f32 activations, llmi_qrows_... on
 * quantized ones, llmi_aquant_... activation quantizers. */

/* kernels.c. llmi_rows_dequant_f32 is the f32 path of K-quants and Q5
 * weights: it dequantizes with quant.c's reference (ggml's values, bit for
 * bit) and takes llmi_dot_f32 at the current level, so one implementation
 * serves every level. */
extern const llmi_rows_impl llmi_rows_f32_c, llmi_rows_f16_c, llmi_rows_bf16_c, llmi_rows_q4_0_c,
    llmi_rows_q4_1_c, llmi_rows_q8_0_c;
extern const llmi_rows_impl llmi_rows_dequant_f32;

/* kernels_q8.c */
void llmi_aquant_q8_c(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes);
extern const llmi_qrows_impl llmi_qrows_q4_0_c, llmi_qrows_q4_1_c, llmi_qrows_q8_0_c,
    llmi_qrows_q5_0_c, llmi_qrows_q5_1_c;

/* kernels_k.c */
void llmi_aquant_q8_k(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes);
extern const llmi_qrows_impl llmi_qrows_q4_k_c, llmi_qrows_q6_k_c;

/* kernels_kvq.c: the quantized KV cache's row operations (llmi_row_ops);
 * store is core's reference quantizer at every level. */
void llmi_kvq_store_q8_0(void *dst, const float *src, int n);
void llmi_kvq_store_q4_0(void *dst, const float *src, int n);
float llmi_kvq_dot_q8_0_c(const float *a, const void *b, int n);
float llmi_kvq_dot_q4_0_c(const float *a, const void *b, int n);
void llmi_kvq_axpy_q8_0_c(float *y, float a, const void *x, int n);
void llmi_kvq_axpy_q4_0_c(float *y, float a, const void *x, int n);
/* FP8: the portable version (a table of the 256 codes' values) and, in
 * kernels_kvq_x86.c, AVX2 and AVX-512 ones. */
extern const float llmi_kvq_fp8_e4m3_values[256];
void llmi_kvq_store_fp8_e4m3(void *dst, const float *src, int n);
float llmi_kvq_dot_fp8_e4m3_c(const float *a, const void *b, int n);
void llmi_kvq_axpy_fp8_e4m3_c(float *y, float a, const void *x, int n);

#if defined(LLMI_KERNELS_X86)
/* kernels_kvq_x86.c */
float llmi_kvq_dot_q8_0_avx2(const float *a, const void *b, int n);
float llmi_kvq_dot_q4_0_avx2(const float *a, const void *b, int n);
void llmi_kvq_axpy_q8_0_avx2(float *y, float a, const void *x, int n);
void llmi_kvq_axpy_q4_0_avx2(float *y, float a, const void *x, int n);
float llmi_kvq_dot_q8_0_avx512(const float *a, const void *b, int n);
float llmi_kvq_dot_q4_0_avx512(const float *a, const void *b, int n);
void llmi_kvq_axpy_q8_0_avx512(float *y, float a, const void *x, int n);
void llmi_kvq_axpy_q4_0_avx512(float *y, float a, const void *x, int n);
float llmi_kvq_dot_fp8_e4m3_avx2(const float *a, const void *b, int n);
void llmi_kvq_axpy_fp8_e4m3_avx2(float *y, float a, const void *x, int n);
float llmi_kvq_dot_fp8_e4m3_avx512(const float *a, const void *b, int n);
void llmi_kvq_axpy_fp8_e4m3_avx512(float *y, float a, const void *x, int n);

/* kernels_x86.c */
extern const llmi_kernel_set llmi_kernels_avx2, llmi_kernels_avx512;
extern const llmi_rows_impl llmi_rows_f32_avx2, llmi_rows_f16_avx2, llmi_rows_bf16_avx2,
    llmi_rows_q4_0_avx2, llmi_rows_q4_1_avx2, llmi_rows_q8_0_avx2;
extern const llmi_rows_impl llmi_rows_f32_avx512, llmi_rows_f16_avx512, llmi_rows_bf16_avx512,
    llmi_rows_q4_0_avx512, llmi_rows_q4_1_avx512, llmi_rows_q8_0_avx512;

/* kernels_q8_x86.c (its quantizer serves both SIMD levels) */
void llmi_aquant_q8_avx2(const float *x, int64_t nb, int q81, uint8_t *row, size_t row_bytes);
extern const llmi_qrows_impl llmi_qrows_q4_0_avx2, llmi_qrows_q4_1_avx2, llmi_qrows_q8_0_avx2,
    llmi_qrows_q5_0_avx2, llmi_qrows_q5_1_avx2;
/* kernels_q8_vnni.c; the packed layout (every LLMI_QT_* type), nb blocks
 * per row. */
size_t llmi_v5p_group_bytes(int qt, int64_t nb);
void llmi_v5p_pack(int qt, const llmi_weight *w, uint8_t *dst, int64_t g0, int64_t g1);
extern const llmi_qrows_impl llmi_qrows_q4_0_vnni_packed, llmi_qrows_q4_1_vnni_packed,
    llmi_qrows_q8_0_vnni_packed, llmi_qrows_q5_0_vnni_packed, llmi_qrows_q5_1_vnni_packed;
extern const llmi_qrows_impl llmi_qrows_q4_0_vnni, llmi_qrows_q4_1_vnni, llmi_qrows_q8_0_vnni,
    llmi_qrows_q5_0_vnni, llmi_qrows_q5_1_vnni;

/* kernels_k_x86.c */
extern const llmi_qrows_impl llmi_qrows_q4_k_avx2, llmi_qrows_q6_k_avx2;
extern const llmi_qrows_impl llmi_qrows_q4_k_vnni, llmi_qrows_q6_k_vnni;
#endif

#endif
