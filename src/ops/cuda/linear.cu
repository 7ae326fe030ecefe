// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/column_reduce.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/linear.h"

namespace lathe::cuda {

void linear_forward(CudaState& state, CUstream_st* stream, bf16* y, const bf16* x,
                    const bf16* weight, const bf16* bias, int64_t N, int64_t I, int64_t O) {
    if (N == 0) return;
    // y (N, O) = x (N, I) . weight^T, weight stored (O, I).
    GemmArgs g;
    g.M = N, g.N = O, g.K = I;
    g.A = x, g.lda = I, g.trans_a = false;
    g.B = weight, g.ldb = I, g.trans_b = true;
    g.D = y, g.ldd = O, g.d_dtype = DType::kBF16;
    g.bias = bias;
    gemm_bf16(state, stream, g);
}

void linear_backward(CudaState& state, CUstream_st* stream, bf16* dx, float* dweight, float* dbias,
                     const bf16* dy, const bf16* x, const bf16* weight, int64_t N, int64_t I,
                     int64_t O, bool dx_accumulate) {
    if (N == 0) return;
    if (dx != nullptr) {
        // dx (N, I) = dy (N, O) . weight (O, I)
        GemmArgs g;
        g.M = N, g.N = I, g.K = O;
        g.A = dy, g.lda = O, g.trans_a = false;
        g.B = weight, g.ldb = I, g.trans_b = false;
        g.D = dx, g.ldd = I, g.d_dtype = DType::kBF16;
        g.beta = dx_accumulate ? 1.0f : 0.0f;
        gemm_bf16(state, stream, g);
    }
    if (dweight != nullptr) {
        // dweight (O, I) += dy^T (O, N) . x (N, I), dy stored (N, O)
        GemmArgs g;
        g.M = O, g.N = I, g.K = N;
        g.A = dy, g.lda = O, g.trans_a = true;
        g.B = x, g.ldb = I, g.trans_b = false;
        g.D = dweight, g.ldd = I, g.d_dtype = DType::kF32;
        g.beta = 1.0f;
        gemm_bf16(state, stream, g);
    }
    if (dbias != nullptr)
        column_sum_bf16_accumulate(state, stream, dbias, dy, N, O, "linear_backward");
}

}  // namespace lathe::cuda
