// The launchers of ops/cuda/swiglu.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/swiglu.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::swiglu_forward(bf16*, const bf16*, int64_t, int64_t, CUstream_st*, float*) {
    detail::no_cuda("cuda::swiglu_forward");
}

void cuda::swiglu_backward(bf16*, const bf16*, const bf16*, int64_t, int64_t, CUstream_st*,
                           float*) {
    detail::no_cuda("cuda::swiglu_backward");
}

}  // namespace lathe
