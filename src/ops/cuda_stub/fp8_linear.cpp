// The launchers of ops/cuda/fp8_linear.h in a build without CUDA (ops/cuda_stub/no_cuda.h). The
// two queries answer instead of stopping: `lathe doctor` asks them in every build.

#include "ops/cuda/fp8_linear.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::fp8_linear_forward(bf16*, Fp8Operand, Fp8Operand, const bf16*, const bf16*, int64_t,
                              int64_t, int64_t, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::fp8_linear_forward");
}

void cuda::fp8_linear_backward_input(bf16*, Fp8Operand, Fp8Operand, int64_t, int64_t, int64_t, bool,
                                     CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::fp8_linear_backward_input");
}

void cuda::fp8_linear_backward_weight(float*, Fp8Operand, Fp8Operand, int64_t, int64_t, int64_t,
                                      bool, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::fp8_linear_backward_weight");
}

void cuda::fp8_linear_backward_bias(float*, const bf16*, int64_t, int64_t, CudaState&,
                                    CUstream_st*) {
    detail::no_cuda("cuda::fp8_linear_backward_bias");
}

std::string cuda::fp8_support_problem(int) {
    return "this lathe was built without CUDA: FP8 training needs a CUDA build and a GPU with FP8 "
           "tensor cores (compute capability 8.9 or newer)";
}

std::string cuda::fp8_self_test(int device, bool& ok) {
    ok = false;
    return "fp8: none (" + fp8_support_problem(device) + ")";
}

}  // namespace lathe
