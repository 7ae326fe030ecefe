// The launchers of ops/cuda/vocab_parallel.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/vocab_parallel.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::vocab_shard_ids(int32_t*, const int32_t*, int64_t, int64_t, int64_t, int64_t,
                           CUstream_st*) {
    detail::no_cuda("cuda::vocab_shard_ids");
}

void cuda::vocab_shard_zero_rows(bf16*, const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                 CUstream_st*) {
    detail::no_cuda("cuda::vocab_shard_zero_rows");
}

void cuda::cross_entropy_vocab_parallel_prepare(float*, const float*, const float*, int64_t,
                                                CUstream_st*) {
    detail::no_cuda("cuda::cross_entropy_vocab_parallel_prepare");
}

void cuda::cross_entropy_vocab_parallel_exp(float*, const float*, int64_t, CUstream_st*) {
    detail::no_cuda("cuda::cross_entropy_vocab_parallel_exp");
}

void cuda::cross_entropy_vocab_parallel_finish(float*, float*, float*, const int32_t*, const float*,
                                               int64_t, CUstream_st*) {
    detail::no_cuda("cuda::cross_entropy_vocab_parallel_finish");
}

}  // namespace lathe
