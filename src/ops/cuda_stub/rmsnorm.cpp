// The launchers of ops/cuda/rmsnorm.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/rmsnorm.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::rmsnorm_forward(bf16*, float*, const bf16*, const bf16*, int64_t, int64_t, float,
                           CUstream_st*, float*) {
    detail::no_cuda("cuda::rmsnorm_forward");
}

void cuda::rmsnorm_residual_forward(bf16*, bf16*, float*, const bf16*, const bf16*, const bf16*,
                                    int64_t, int64_t, float, CUstream_st*, float*) {
    detail::no_cuda("cuda::rmsnorm_residual_forward");
}

void cuda::rmsnorm_backward(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*,
                            int64_t, int64_t, bool, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::rmsnorm_backward");
}

}  // namespace lathe
