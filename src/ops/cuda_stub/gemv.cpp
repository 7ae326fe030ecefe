// The launcher of ops/cuda/gemv.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/gemv.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::gemv_forward(bf16*, const bf16*, const bf16*, const bf16*, const bf16*, int64_t, int64_t,
                        int64_t, CUstream_st*) {
    detail::no_cuda("cuda::gemv_forward");
}

}  // namespace lathe
