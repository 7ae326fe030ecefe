// The functions of ops/cuda/attention.h that the dispatcher (ops/attention.cpp) and the model
// (model/model.cpp) call, in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/attention.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

// Asked before any model is made (run/compute_device.h, `lathe doctor`): a sentence, no stop.
const char* cuda::attention_unavailable_reason() {
    return "this lathe was built without the CUDA backend";
}

void cuda::attention_forward(bf16*, float*, const bf16*, const bf16*, const bf16*, const int32_t*,
                             const AttentionShape&, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::attention_forward");
}

void cuda::attention_backward(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*,
                              const bf16*, const bf16*, const float*, const int32_t*,
                              const AttentionShape&, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::attention_backward");
}

void cuda::attention_forward_rows(bf16*, float*, const bf16*, const bf16*, const bf16*,
                                  const int32_t*, const int32_t*, const AttentionRowsShape&,
                                  CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::attention_forward_rows");
}

void cuda::attention_decode_paged(bf16*, float*, const bf16*, const bf16*, const bf16*,
                                  const int32_t*, int64_t, int64_t, const int32_t*,
                                  const AttentionRowsShape&, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::attention_decode_paged");
}

void cuda::kv_rows_scatter(void*, const void*, const int32_t*, int64_t, size_t, CUstream_st*) {
    detail::no_cuda("cuda::kv_rows_scatter");
}

void cuda::kv_rows_gather(void*, const void*, const int32_t*, int64_t, size_t, CUstream_st*) {
    detail::no_cuda("cuda::kv_rows_gather");
}

size_t cuda::attention_prepare(CudaState&, const AttentionShape&) {
    detail::no_cuda("cuda::attention_prepare");
}

size_t cuda::attention_buffer_bytes(const CudaState&) {
    detail::no_cuda("cuda::attention_buffer_bytes");
}

size_t cuda::attention_workspace_bytes(CudaState&, const AttentionShape&) {
    detail::no_cuda("cuda::attention_workspace_bytes");
}

void cuda::attention_lend_workspace(CudaState&, void*, size_t) {
    detail::no_cuda("cuda::attention_lend_workspace");
}

void cuda::attention_end_loan(CudaState&, const void*) {
    detail::no_cuda("cuda::attention_end_loan");
}

}  // namespace lathe
