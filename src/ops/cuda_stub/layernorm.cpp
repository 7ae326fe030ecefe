// The launchers of ops/cuda/layernorm.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/layernorm.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::layernorm_forward(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int64_t,
                             int64_t, float, CUstream_st*) {
    detail::no_cuda("cuda::layernorm_forward");
}

void cuda::layernorm_residual_forward(bf16*, bf16*, float*, float*, const bf16*, const bf16*,
                                      const bf16*, const bf16*, int64_t, int64_t, float,
                                      CUstream_st*) {
    detail::no_cuda("cuda::layernorm_residual_forward");
}

void cuda::layernorm_backward(bf16*, float*, float*, const bf16*, const bf16*, const bf16*,
                              const float*, const float*, int64_t, int64_t, bool, CudaState&,
                              CUstream_st*) {
    detail::no_cuda("cuda::layernorm_backward");
}

}  // namespace lathe
