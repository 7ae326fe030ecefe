// The launchers of ops/cuda/adamw.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/adamw.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::adamw_update(float*, bf16*, float*, float*, const float*, std::span<const AdamWSegment>,
                        const AdamWHyper&, int64_t, const float*, float, CUstream_st*) {
    detail::no_cuda("cuda::adamw_update");
}

void cuda::adamw_update(float*, bf16*, bf16*, bf16*, const float*, std::span<const AdamWSegment>,
                        const AdamWHyper&, int64_t, const float*, float, CUstream_st*) {
    detail::no_cuda("cuda::adamw_update");
}

}  // namespace lathe
