// The launchers of ops/cuda/lm_head_cross_entropy.h in a build without CUDA
// (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/lm_head_cross_entropy.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::lm_head_cross_entropy_forward(CudaState&, CUstream_st*, float*, float*, float*,
                                         const bf16*, const int32_t*, const bf16*, float*, int64_t,
                                         int64_t, int64_t, int64_t) {
    detail::no_cuda("cuda::lm_head_cross_entropy_forward");
}

void cuda::lm_head_cross_entropy_backward(CudaState&, CUstream_st*, bf16*, float*, const bf16*,
                                          const int32_t*, const bf16*, const float*, float, float*,
                                          int64_t, int64_t, int64_t, int64_t) {
    detail::no_cuda("cuda::lm_head_cross_entropy_backward");
}

void cuda::lm_head_cross_entropy_forward_backward(CudaState&, CUstream_st*, float*, float*, bf16*,
                                                  float*, const bf16*, const int32_t*, const bf16*,
                                                  float, float*, int64_t, int64_t, int64_t,
                                                  int64_t) {
    detail::no_cuda("cuda::lm_head_cross_entropy_forward_backward");
}

void cuda::cross_entropy_rows_forward_backward(CUstream_st*, bf16*, int64_t, int64_t, int64_t,
                                               const int32_t*, float*, float*, const int*, float) {
    detail::no_cuda("cuda::cross_entropy_rows_forward_backward");
}

}  // namespace lathe
