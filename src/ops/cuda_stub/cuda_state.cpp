// cuda_state_of (ops/cuda/cuda_state.h) in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/cuda_state.h"
#include "ops/cuda_stub/no_cuda.h"

lathe::CudaState& lathe::cuda_state_of(const Context&, std::string_view) {
    detail::no_cuda("cuda_state_of");
}
