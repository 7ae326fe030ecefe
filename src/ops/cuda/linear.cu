// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gelu.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/linear.h"

namespace lathe::cuda {

namespace {

// y (N, O) = x (N, I) . weight^T (+ bias), weight stored (O, I): the forward GEMM of every linear.
GemmArgs forward_gemm(bf16* y, const bf16* x, const bf16* weight, const bf16* bias, int64_t N,
                      int64_t I, int64_t O) {
    GemmArgs g;
    g.M = N, g.N = O, g.K = I;
    g.A = x, g.lda = I, g.trans_a = false;
    g.B = weight, g.ldb = I, g.trans_b = true;
    g.D = y, g.ldd = O, g.d_dtype = DType::kBF16;
    g.bias = bias, g.bias_dtype = DType::kBF16;
    g.epilogue = bias != nullptr ? GemmEpilogue::kBias : GemmEpilogue::kNone;
    return g;
}

// dx (N, I) = dy (N, O) . weight (O, I).
GemmArgs dx_gemm(bf16* dx, const bf16* dy, const bf16* weight, int64_t N, int64_t I, int64_t O) {
    GemmArgs g;
    g.M = N, g.N = I, g.K = O;
    g.A = dy, g.lda = O, g.trans_a = false;
    g.B = weight, g.ldb = I, g.trans_b = false;
    g.D = dx, g.ldd = I, g.d_dtype = DType::kBF16;
    return g;
}

// dweight (O, I) += dy^T (O, N) . x (N, I) (= when !dw_accumulate: beta 0), dy stored (N, O);
// dbias (O) += sum_n dy by the two-pass column reduction. Either may be null.
void weight_and_bias_grad(CudaState& state, CUstream_st* stream, float* dweight, float* dbias,
                          const bf16* dy, const bf16* x, int64_t N, int64_t I, int64_t O,
                          bool dw_accumulate, const char* op) {
    if (dweight != nullptr) {
        GemmArgs g;
        g.M = O, g.N = I, g.K = N;
        g.A = dy, g.lda = O, g.trans_a = true;
        g.B = x, g.ldb = I, g.trans_b = false;
        g.D = dweight, g.ldd = I, g.d_dtype = DType::kF32;
        g.beta = dw_accumulate ? 1.0f : 0.0f;
        gemm(state, stream, g);
    }
    if (dbias != nullptr) column_sum_bf16_accumulate(dbias, dy, N, O, op, state, stream);
}

}  // namespace

void linear_forward(bf16* y, const bf16* x, const bf16* weight, const bf16* bias, int64_t N,
                    int64_t I, int64_t O, CudaState& state, CUstream_st* stream) {
    if (N == 0) return;
    gemm(state, stream, forward_gemm(y, x, weight, bias, N, I, O));
}

void linear_residual_forward(bf16* y, const bf16* x, const bf16* weight, const bf16* bias,
                             const bf16* residual, int64_t N, int64_t I, int64_t O,
                             CudaState& state, CUstream_st* stream) {
    if (N == 0) return;
    GemmArgs g = forward_gemm(y, x, weight, bias, N, I, O);
    g.C = residual, g.ldc = O, g.beta = 1.0f;
    gemm(state, stream, g);
}

void linear_backward(bf16* dx, float* dweight, float* dbias, const bf16* dy, const bf16* x,
                     const bf16* weight, int64_t N, int64_t I, int64_t O, bool dx_accumulate,
                     bool dw_accumulate, CudaState& state, CUstream_st* stream) {
    if (N == 0) return;
    if (dx != nullptr) {
        GemmArgs g = dx_gemm(dx, dy, weight, N, I, O);
        g.beta = dx_accumulate ? 1.0f : 0.0f;
        gemm(state, stream, g);
    }
    weight_and_bias_grad(state, stream, dweight, dbias, dy, x, N, I, O, dw_accumulate,
                         "linear_backward");
}

void linear_gelu_forward(bf16* act, bf16* pre, const bf16* x, const bf16* weight, const bf16* bias,
                         int64_t N, int64_t I, int64_t O, bool tanh_form, CudaState& state,
                         CUstream_st* stream) {
    if (N == 0) return;
    if (tanh_form && O % 8 == 0) {
        // One GEMM: cuBLASLt's GELU epilogue is the tanh form (gemm.h), computed from the fp32
        // accumulator plus bias; pre is its aux output.
        GemmArgs g = forward_gemm(act, x, weight, bias, N, I, O);
        g.epilogue = bias != nullptr ? GemmEpilogue::kGeluAuxBias : GemmEpilogue::kGeluAux;
        g.aux = pre, g.ldaux = O;
        if (gemm_try(state, stream, g)) return;
    }
    linear_forward(pre, x, weight, bias, N, I, O, state, stream);
    gelu_forward(act, pre, N * O, tanh_form, stream);
}

void linear_gelu_backward(bf16* dpre, float* dpre_bias, float* dweight, float* dbias,
                          const bf16* dy, const bf16* act, const bf16* pre, const bf16* weight,
                          int64_t N, int64_t I, int64_t O, bool tanh_form, bool dw_accumulate,
                          CudaState& state, CUstream_st* stream) {
    if (N == 0) return;
    gemm(state, stream, dx_gemm(dpre, dy, weight, N, I, O));
    gelu_backward(dpre, dpre, pre, N * I, tanh_form, stream);  // in place (gelu.h allows it)
    if (dpre_bias != nullptr)
        column_sum_bf16_accumulate(dpre_bias, dpre, N, I, "linear_gelu_backward", state, stream);
    weight_and_bias_grad(state, stream, dweight, dbias, dy, act, N, I, O, dw_accumulate,
                         "linear_gelu_backward");
}

namespace {

__global__ void amax_max_into_kernel(unsigned* step_amax, const unsigned* amax) {
    atomicMax(step_amax, *amax);
}

}  // namespace

void fp8_amax_max_into(float* step_amax, const float* amax, CUstream_st* stream) {
    amax_max_into_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<unsigned*>(step_amax),
                                              reinterpret_cast<const unsigned*>(amax));
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace lathe::cuda
