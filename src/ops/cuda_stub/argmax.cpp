// The launcher of ops/cuda/argmax.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/argmax.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::argmax_rows(int32_t*, const bf16*, int64_t, int64_t, CUstream_st*) {
    detail::no_cuda("cuda::argmax_rows");
}

}  // namespace lathe
