// The launchers of ops/cuda/linear.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/linear.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::linear_forward(bf16*, const bf16*, const bf16*, const bf16*, int64_t, int64_t, int64_t,
                          CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::linear_forward");
}

void cuda::linear_residual_forward(bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                                   int64_t, int64_t, int64_t, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::linear_residual_forward");
}

void cuda::linear_backward(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int64_t,
                           int64_t, int64_t, bool, bool, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::linear_backward");
}

void cuda::linear_gelu_forward(bf16*, bf16*, const bf16*, const bf16*, const bf16*, int64_t,
                               int64_t, int64_t, bool, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::linear_gelu_forward");
}

void cuda::linear_gelu_backward(bf16*, float*, float*, float*, const bf16*, const bf16*,
                                const bf16*, const bf16*, int64_t, int64_t, int64_t, bool, bool,
                                CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::linear_gelu_backward");
}

void cuda::fp8_amax_max_into(float*, const float*, CUstream_st*) {
    detail::no_cuda("cuda::fp8_amax_max_into");
}

}  // namespace lathe
