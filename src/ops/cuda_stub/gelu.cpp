// The launchers of ops/cuda/gelu.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/gelu.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::gelu_forward(bf16*, const bf16*, int64_t, bool, CUstream_st*) {
    detail::no_cuda("cuda::gelu_forward");
}

void cuda::gelu_backward(bf16*, const bf16*, const bf16*, int64_t, bool, CUstream_st*) {
    detail::no_cuda("cuda::gelu_backward");
}

}  // namespace lathe
