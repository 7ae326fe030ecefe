// The launchers of ops/cuda/grad_norm.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/grad_norm.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::grad_norm_l2(float*, std::span<const ConstGradSpan>, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::grad_norm_l2");
}

void cuda::grad_clip_by_norm(std::span<const GradSpan>, const float*, float, CUstream_st*) {
    detail::no_cuda("cuda::grad_clip_by_norm");
}

}  // namespace lathe
