/* The plug-in built without FlashInfer (`make cuda`, FLASHINFER unset):
 * cuda/attention_flashinfer.cu's functions, taking nothing. */
#include "attention_flashinfer.h"

bool llmi_cu_flashinfer_built(void) { return false; }

llmi_fi_refusal llmi_cu_flashinfer_takes(cudaStream_t stream, const llmi_cu_attention_args *a) {
    (void)stream;
    (void)a;
    return LLMI_FI_NOT_BUILT;
}

cudaError_t llmi_cu_attention_flashinfer(cudaStream_t stream, const llmi_cu_attention_args *a) {
    (void)stream;
    (void)a;
    return cudaErrorNotSupported;
}
