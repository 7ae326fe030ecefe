// The launchers of ops/cuda/residual.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/residual.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::residual_forward(bf16*, const bf16*, const bf16*, int64_t, CUstream_st*) {
    detail::no_cuda("cuda::residual_forward");
}

void cuda::residual_backward(bf16*, bf16*, const bf16*, int64_t, CUstream_st*) {
    detail::no_cuda("cuda::residual_backward");
}

}  // namespace lathe
