// The launchers of ops/cuda/attention.h that the dispatcher (ops/attention.cpp) calls, in a build
// without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/attention.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

// Asked before any model is made (run/compute_device.h, `lathe doctor`): a sentence, no stop.
const char* cuda::attention_unavailable_reason() {
    return "this lathe was built without the CUDA backend";
}

void cuda::attention_forward(CudaState&, CUstream_st*, bf16*, float*, const bf16*, const bf16*,
                             const bf16*, const int32_t*, const AttentionShape&) {
    detail::no_cuda("cuda::attention_forward");
}

void cuda::attention_backward(CudaState&, CUstream_st*, bf16*, bf16*, bf16*, const bf16*,
                              const bf16*, const bf16*, const bf16*, const bf16*, const float*,
                              const int32_t*, const AttentionShape&) {
    detail::no_cuda("cuda::attention_backward");
}

void cuda::attention_forward_rows(CudaState&, CUstream_st*, bf16*, float*, const bf16*, const bf16*,
                                  const bf16*, const int32_t*, const int32_t*,
                                  const AttentionRowsShape&) {
    detail::no_cuda("cuda::attention_forward_rows");
}

}  // namespace lathe
