// The launchers of ops/cuda/lm_head_cross_entropy.h in a build without CUDA
// (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/lm_head_cross_entropy.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::lm_head_cross_entropy_forward(float*, float*, float*, const bf16*, const int32_t*,
                                         const bf16*, float*, int64_t, int64_t, int64_t, int64_t,
                                         CudaState&, CUstream_st*, const LmHeadFp8*, int64_t,
                                         int64_t) {
    detail::no_cuda("cuda::lm_head_cross_entropy_forward");
}

void cuda::lm_head_cross_entropy_backward(bf16*, float*, bool, const bf16*, const int32_t*,
                                          const bf16*, const float*, float, float*, int64_t,
                                          int64_t, int64_t, int64_t, CudaState&, CUstream_st*,
                                          const LmHeadFp8*, int64_t, int64_t) {
    detail::no_cuda("cuda::lm_head_cross_entropy_backward");
}

void cuda::lm_head_cross_entropy_forward_backward(float*, float*, bf16*, float*, bool, const bf16*,
                                                  const int32_t*, const bf16*, float, float*,
                                                  int64_t, int64_t, int64_t, int64_t, CudaState&,
                                                  CUstream_st*, const LmHeadFp8*) {
    detail::no_cuda("cuda::lm_head_cross_entropy_forward_backward");
}

void cuda::cross_entropy_rows_forward_backward(bf16*, float*, float*, const int32_t*, const int*,
                                               float, int64_t, int64_t, int64_t, CUstream_st*) {
    detail::no_cuda("cuda::cross_entropy_rows_forward_backward");
}

}  // namespace lathe
