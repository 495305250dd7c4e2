/* The tensor-core path for batches wider than the GEMV kernel takes: a
 * weight already stored in the operand type (BF16, or F32 with f32
 * activations: llmi_cuda_gemm_in_place) is multiplied where it lies in one
 * matmul; any other has its rows dequantized a chunk at a time (bf16, or
 * f32) into scratch, then one cuBLASLt matmul per chunk, with f32 output. Row-major y[n][m] =
 * x[n][k] * W[m][k]^T is, in cuBLASLt's column-major terms, C (m x n, ld y_stride) = op(A)^T (A: W
 * as k x m, ld k)
 * * B (x as k x n, ld k): the "TN" product tensor cores like best. Each
 * shape's descriptors and algorithm are set up once per instance (the
 * heuristic query costs more than a small matmul) and kept. */
#include "cuda_backend.h"

#include <string.h>

llm_status llmi_cuda_lt_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return LLM_OK;
    return llmi_cuda_error(
        st == CUBLAS_STATUS_ALLOC_FAILED ? LLM_ERR_OUT_OF_MEMORY : LLM_ERR_BACKEND,
        "cuBLASLt: %s: %s (%s)", what, cublasLtGetStatusString(st), cublasLtGetStatusName(st));
}

static void plan_free(llmi_cuda_gemm_plan *p) {
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->c)
        cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

void llmi_cuda_gemm_plans_free(llmi_cuda_instance *inst) {
    for (uint32_t i = 0; i < inst->n_plans; i++)
        plan_free(&inst->plans[i]);
    inst->n_plans = inst->next_plan = 0;
}

static llm_status set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                           const void *value, size_t size) {
    return llmi_cuda_lt_check(cublasLtMatmulDescSetAttribute(d, attr, value, size),
                              "setting up a matmul");
}

/* Descriptors of the shape in *p (m, n, k, ldc, f32, bias already set) and
 * the heuristic's first algorithm for them. */
static llm_status plan_make(llmi_cuda_instance *inst, llmi_cuda_gemm_plan *p) {
    const cudaDataType_t ab = p->f32 ? CUDA_R_32F : CUDA_R_16BF;
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    const cublasLtEpilogue_t epi = p->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const cudaDataType_t bias_type = CUDA_R_32F;
    cublasLtMatmulPreference_t pref = NULL;
    llm_status st = llmi_cuda_lt_check(
        cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "creating a matmul");
    if (st == LLM_OK)
        st = set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t);
    if (st == LLM_OK)
        st = set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n);
    if (st == LLM_OK)
        st = set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (st == LLM_OK && p->bias)
        st = set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    if (st == LLM_OK)
        st = llmi_cuda_lt_check(cublasLtMatrixLayoutCreate(&p->a, ab, p->k, p->m, p->k),
                                "creating a matrix layout");
    if (st == LLM_OK)
        st = llmi_cuda_lt_check(cublasLtMatrixLayoutCreate(&p->b, ab, p->k, p->n, p->k),
                                "creating a matrix layout");
    if (st == LLM_OK)
        st = llmi_cuda_lt_check(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, p->m, p->n, p->ldc),
                                "creating a matrix layout");
    if (st == LLM_OK)
        st = llmi_cuda_lt_check(cublasLtMatmulPreferenceCreate(&pref), "creating a preference");
    if (st == LLM_OK)
        st = llmi_cuda_lt_check(cublasLtMatmulPreferenceSetAttribute(
                                    pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                    &inst->workspace_bytes, sizeof inst->workspace_bytes),
                                "setting a preference");
    if (st == LLM_OK) {
        cublasLtMatmulHeuristicResult_t result;
        int found = 0;
        st = llmi_cuda_lt_check(cublasLtMatmulAlgoGetHeuristic(inst->lt, p->desc, p->a, p->b, p->c,
                                                               p->c, pref, 1, &result, &found),
                                "choosing a matmul algorithm");
        if (st == LLM_OK && found == 0)
            st = llmi_cuda_error(LLM_ERR_BACKEND,
                                 "cuBLASLt has no algorithm for a %s matmul of %u x %u x %u",
                                 p->f32 ? "f32" : "bf16", p->m, p->n, p->k);
        if (st == LLM_OK)
            p->algo = result.algo;
    }
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (st != LLM_OK)
        plan_free(p);
    return st;
}

/* The instance's plan for a shape, made on first use. When the cache is
 * full the oldest plan is replaced (prefill chunk sizes vary; decode
 * shapes come back every step). */
static llm_status plan_get(llmi_cuda_instance *inst, uint32_t m, uint32_t n, uint32_t k,
                           uint32_t ldc, bool f32, bool bias, llmi_cuda_gemm_plan **out) {
    for (uint32_t i = 0; i < inst->n_plans; i++) {
        llmi_cuda_gemm_plan *p = &inst->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->ldc == ldc && p->f32 == f32 &&
            p->bias == bias) {
            *out = p;
            return LLM_OK;
        }
    }
    llmi_cuda_gemm_plan *p;
    if (inst->n_plans < LLMI_CUDA_GEMM_PLANS) {
        p = &inst->plans[inst->n_plans];
    } else {
        p = &inst->plans[inst->next_plan];
        inst->next_plan = (inst->next_plan + 1) % LLMI_CUDA_GEMM_PLANS;
        plan_free(p);
    }
    *p = (llmi_cuda_gemm_plan){.m = m, .n = n, .k = k, .ldc = ldc, .f32 = f32, .bias = bias};
    LLMI_TRY(plan_make(inst, p));
    if (p == &inst->plans[inst->n_plans])
        inst->n_plans++;
    *out = p;
    return LLM_OK;
}

llm_status llmi_cuda_gemm(llmi_cuda_instance *inst, const llmi_cu_matrix *w, const void *x,
                          uint32_t n, const float *bias, float *y, uint32_t y_stride, bool f32,
                          void *deq, size_t deq_bytes) {
    const float alpha = 1.0f, beta = 0.0f;
    if (llmi_cuda_gemm_in_place(w->type, f32)) {
        llmi_cuda_gemm_plan *p;
        LLMI_TRY(plan_get(inst, w->rows, n, w->cols, y_stride, f32, bias != NULL, &p));
        if (bias)
            LLMI_TRY(set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        return llmi_cuda_lt_check(cublasLtMatmul(inst->lt, p->desc, &alpha, w->data, p->a, x, p->b,
                                                 &beta, y, p->c, y, p->c, &p->algo, inst->workspace,
                                                 inst->workspace_bytes, inst->stream),
                                  "running a matmul");
    }
    const uint32_t chunk = llmi_cuda_chunk_rows(w->rows, w->cols, f32 ? 4 : 2, deq_bytes);
    if (chunk == 0)
        return llmi_cuda_error(LLM_ERR_INTERNAL,
                               "dequantization scratch of %zu bytes is too small for %u columns",
                               deq_bytes, w->cols);
    for (uint32_t row0 = 0; row0 < w->rows; row0 += chunk) {
        const uint32_t mc = w->rows - row0 < chunk ? w->rows - row0 : chunk;
        LLMI_TRY(llmi_cuda_call(llmi_cu_dequantize(inst->stream, w, row0, mc, !f32, deq),
                                "dequantizing a weight"));
        llmi_cuda_gemm_plan *p;
        LLMI_TRY(plan_get(inst, mc, n, w->cols, y_stride, f32, bias != NULL, &p));
        if (bias) {
            const float *b = bias + row0;
            LLMI_TRY(set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b));
        }
        float *out = y + row0;
        LLMI_TRY(llmi_cuda_lt_check(
            cublasLtMatmul(inst->lt, p->desc, &alpha, deq, p->a, x, p->b, &beta, out, p->c, out,
                           p->c, &p->algo, inst->workspace, inst->workspace_bytes, inst->stream),
            "running a matmul"));
    }
    return LLM_OK;
}
