// The launchers of ops/cuda/fp8_blockwise.h in a build without CUDA (ops/cuda_stub/no_cuda.h).

#include "ops/cuda/fp8_blockwise.h"
#include "ops/cuda_stub/no_cuda.h"

namespace lathe {

void cuda::fp8_block_scales_to_gemm(const float*, Fp8Block, bool, int64_t, int64_t, float*,
                                    CUstream_st*) {
    detail::no_cuda("cuda::fp8_block_scales_to_gemm");
}

void cuda::fp8_blockwise_forward_gemm(bf16*, Fp8BlockOperand, Fp8BlockOperand, const bf16*,
                                      const bf16*, int64_t, int64_t, int64_t, CudaState&,
                                      CUstream_st*) {
    detail::no_cuda("cuda::fp8_blockwise_forward_gemm");
}

void cuda::fp8_blockwise_input_grad_gemm(bf16*, Fp8BlockOperand, Fp8BlockOperand, int64_t, int64_t,
                                         int64_t, bool, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::fp8_blockwise_input_grad_gemm");
}

void cuda::fp8_blockwise_weight_grad_gemm(float*, Fp8BlockOperand, Fp8BlockOperand, int64_t,
                                          int64_t, int64_t, bool, CudaState&, CUstream_st*) {
    detail::no_cuda("cuda::fp8_blockwise_weight_grad_gemm");
}

}  // namespace lathe
