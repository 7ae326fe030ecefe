// The launchers of ops/cuda/embedding.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/embedding.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::embedding_forward(bf16*, const int32_t*, const int32_t*, const bf16*, const bf16*,
                             int64_t, int64_t, int64_t, int64_t, int64_t, CUstream_st*) {
    detail::no_cuda("cuda::embedding_forward");
}

void cuda::embedding_backward(float*, float*, const bf16*, const int32_t*, const int32_t*, int64_t,
                              int64_t, int64_t, int64_t, int64_t, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::embedding_backward");
}

void cuda::embedding_backward_shard(float*, const bf16*, const int32_t*, int64_t, int64_t, int64_t,
                                    int64_t, int64_t, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::embedding_backward_shard");
}

size_t cuda::embedding_backward_scratch_bytes(int64_t, int64_t) {
    detail::no_cuda("cuda::embedding_backward_scratch_bytes");
}

}  // namespace lathe
