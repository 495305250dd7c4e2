/* K-quant matmuls (kernels_k.c: activations, portable C, dispatch;
 * kernels_k_x86.c: AVX2 and AVX-512 VNNI): Q4_K and Q6_K weights with Q8_K
 * activations (kernels.h, "8-bit activations") and with f32 activations
 * (llmi_matmul). Private to the backend: kernels.c and kernels_q8.c route
 * these types here. */
#ifndef LLMI_KERNELS_K_H
#define LLMI_KERNELS_K_H

#include "backend/kernels_impl.h"

/* Whether `type` is a K-quant weight type handled here (Q4_K, Q6_K). */
int llmi_kq_is_k(uint32_t type);

/* llmi_act_scratch_bytes / llmi_act_prepare for Q8_K activations. */
size_t llmi_kq_act_scratch_bytes(int64_t cols, int n_tok);
void llmi_kq_act_prepare(llmi_pool *pool, const float *x, int n_tok, int64_t cols, void *scratch,
                         llmi_act *out);

/* llmi_matmul_act_part and llmi_matmul_part for K-quant weights: the same
 * row split, tiling and determinism. */
void llmi_kq_matmul_act_part(const llmi_weight *w, const llmi_act *x, float *y, int ith, int nth);
void llmi_kq_matmul_f32_part(const llmi_weight *w, const float *x, int n_tok, float *y, int ith,
                             int nth);

/* One Q8_K activation row (kernels.h gives the layout) from 256*nb floats,
 * writing all row_bytes bytes: quant_k.c's reference Q8_K values. */
void llmi_kq_act_quant_row(const float *x, int64_t nb, uint8_t *row, size_t row_bytes);

/* Dense index of the K weight types, and the kernel sets. The rows
 * functions take Q8_K rows (xq + t*xstride, t < nt <= tile). */
enum { LLMI_KQ_Q4_K, LLMI_KQ_Q6_K, LLMI_KQ_COUNT };

typedef struct llmi_kqkernel_set {
    int tile;
    llmi_qrows_fn rows[LLMI_KQ_COUNT];
} llmi_kqkernel_set;

#if defined(LLMI_KERNELS_X86)
extern const llmi_kqkernel_set llmi_kqkernels_avx2;
extern const llmi_kqkernel_set llmi_kqkernels_avx512vnni;
#endif

#endif
