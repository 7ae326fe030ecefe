// The launchers of ops/cuda/fp8_cast.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/fp8_cast.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::fp8_amax(const bf16*, int64_t, float*, CUstream_st*) {
    detail::no_cuda("cuda::fp8_amax");
}

void cuda::fp8_cast(const Fp8CastArgs&, CUstream_st*) {
    detail::no_cuda("cuda::fp8_cast");
}

void cuda::fp8_block_cast(const Fp8BlockCastArgs&, CUstream_st*) {
    detail::no_cuda("cuda::fp8_block_cast");
}

}  // namespace lathe
