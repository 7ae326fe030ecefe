// The launchers of ops/cuda/rope.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/rope.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::rope_forward(bf16*, const bf16*, const int32_t*, const float*, const float*, int64_t,
                        int64_t, int64_t, int64_t, int64_t, int64_t, CUstream_st*) {
    detail::no_cuda("cuda::rope_forward");
}

void cuda::rope_backward(bf16*, const bf16*, const int32_t*, const float*, const float*, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, CUstream_st*) {
    detail::no_cuda("cuda::rope_backward");
}

void cuda::rope_qk(bf16*, bf16*, const bf16*, const bf16*, const int32_t*, const float*,
                   const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                   bool, CUstream_st*) {
    detail::no_cuda("cuda::rope_qk");
}

void cuda::rope_qkv(bf16*, const int32_t*, const float*, const float*, int64_t, int64_t, int64_t,
                    int64_t, int64_t, int64_t, int64_t, bool, CUstream_st*) {
    detail::no_cuda("cuda::rope_qkv");
}

}  // namespace lathe
