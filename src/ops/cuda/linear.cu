// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/gelu.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/linear.h"

namespace lathe::cuda {

namespace {

// dst[i] += src[i] (n values): folds an epilogue's written bias gradient into the accumulating
// one. Elementwise, so deterministic.
__global__ void accumulate_f32_kernel(float* __restrict__ dst, const float* __restrict__ src,
                                      int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        dst[i] += src[i];
}

// The same from a bf16 bias gradient (an epilogue that writes only bf16 ones).
__global__ void accumulate_bf16_kernel(float* __restrict__ dst,
                                       const __nv_bfloat16* __restrict__ src, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        dst[i] += __bfloat162float(src[i]);
}

void accumulate_bf16(float* dst, const bf16* src, int64_t n, CUstream_st* stream) {
    constexpr int kThreads = 256;
    accumulate_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
        dst, reinterpret_cast<const __nv_bfloat16*>(src), n);
    LATHE_CUDA_CHECK_LAUNCH();
}

void accumulate_f32(float* dst, const float* src, int64_t n, CUstream_st* stream) {
    constexpr int kThreads = 256;
    accumulate_f32_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dst, src, n);
    LATHE_CUDA_CHECK_LAUNCH();
}

// Scratch for the epilogues' bias gradients: `count` f32 arrays of the given lengths, each at a
// 256-byte boundary (cuBLASLt picks kernels by the vector's alignment). Null lengths get null.
struct BiasGradScratch {
    float* p[2] = {nullptr, nullptr};
    BiasGradScratch(CudaState& state, int64_t n0, int64_t n1, const char* op) {
        auto padded = [](int64_t n) { return (n + 63) / 64 * 64; };
        const int64_t total = padded(n0) + padded(n1);
        if (total == 0) return;
        float* base = static_cast<float*>(state.scratch(size_t(total) * sizeof(float), op));
        if (n0 > 0) p[0] = base;
        if (n1 > 0) p[1] = base + padded(n0);
    }
};

// The backward epilogues (DGELU_BGRAD for the GELU MLP's dx GEMM, BGRADB for bias gradients in
// the weight GEMM) are built and tested but off: on the H100 (cuBLAS 13.0, 2026-11-26,
// ops_gpu_tests' CudaFusionTiming) cuBLASLt refuses an f32 bias gradient next to a bf16 D, and
// with a bf16 one the fused down-projection backward took 1.17 ms against 0.76 ms for the separate
// GEMMs + GELU backward + column sum at GPT-2's MLP (N=32768, 768 x 3072); BGRADB on the qkv weight
// gradient 0.255 vs 0.239 ms. The whole GPT-2 step went from 62.8 to 66.0 ms with them on. The
// forward epilogues (GELU_AUX_BIAS 1.23x, the residual as C 1.18x) stay on.
constexpr bool kBackwardEpilogues = false;

GemmArgs dx_gemm(bf16* dx, const bf16* dy, const bf16* weight, int64_t N, int64_t I, int64_t O) {
    // dx (N, I) = dy (N, O) . weight (O, I)
    GemmArgs g;
    g.M = N, g.N = I, g.K = O;
    g.A = dy, g.lda = O, g.trans_a = false;
    g.B = weight, g.ldb = I, g.trans_b = false;
    g.D = dx, g.ldd = I, g.d_dtype = DType::kBF16;
    return g;
}

// dweight (O, I) += dy^T (O, N) . x (N, I), dy stored (N, O); and dbias (O) += sum_n dy, in the
// GEMM's epilogue (into `dbias_tmp`, then added) when cuBLASLt can, else by the column reduction.
void weight_and_bias_grad(CudaState& state, CUstream_st* stream, float* dweight, float* dbias,
                          float* dbias_tmp, const bf16* dy, const bf16* x, int64_t N, int64_t I,
                          int64_t O, const char* op) {
    bool bias_done = dbias == nullptr;
    if (dweight != nullptr) {
        GemmArgs g;
        g.M = O, g.N = I, g.K = N;
        g.A = dy, g.lda = O, g.trans_a = true;
        g.B = x, g.ldb = I, g.trans_b = false;
        g.D = dweight, g.ldd = I, g.d_dtype = DType::kF32;
        g.beta = 1.0f;
        if (!bias_done && kBackwardEpilogues) {
            GemmArgs fused = g;
            fused.epilogue = GemmEpilogue::kRowSumA;
            fused.bias_grad = dbias_tmp;
            if (gemm_bf16_try(state, stream, fused)) {
                accumulate_f32(dbias, dbias_tmp, O, stream);
                bias_done = true;
            } else {
                gemm_bf16(state, stream, g);
            }
        } else {
            gemm_bf16(state, stream, g);
        }
    }
    if (!bias_done) column_sum_bf16_accumulate(state, stream, dbias, dy, N, O, op);
}

}  // namespace

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

void linear_residual_forward(CudaState& state, CUstream_st* stream, bf16* y, const bf16* x,
                             const bf16* weight, const bf16* bias, const bf16* residual, int64_t N,
                             int64_t I, int64_t O) {
    if (N == 0) return;
    GemmArgs g;
    g.M = N, g.N = O, g.K = I;
    g.A = x, g.lda = I, g.trans_a = false;
    g.B = weight, g.ldb = I, g.trans_b = true;
    g.D = y, g.ldd = O, g.d_dtype = DType::kBF16;
    g.bias = bias;
    g.C = residual, g.ldc = O, g.beta = 1.0f;
    gemm_bf16(state, stream, g);
}

void linear_backward(CudaState& state, CUstream_st* stream, bf16* dx, float* dweight, float* dbias,
                     const bf16* dy, const bf16* x, const bf16* weight, int64_t N, int64_t I,
                     int64_t O, bool dx_accumulate) {
    if (N == 0) return;
    if (dx != nullptr) {
        GemmArgs g = dx_gemm(dx, dy, weight, N, I, O);
        g.beta = dx_accumulate ? 1.0f : 0.0f;
        gemm_bf16(state, stream, g);
    }
    const BiasGradScratch tmp(state, dweight && dbias ? O : 0, 0, "linear_backward");
    weight_and_bias_grad(state, stream, dweight, dbias, tmp.p[0], dy, x, N, I, O,
                         "linear_backward");
}

void linear_gelu_forward(CudaState& state, CUstream_st* stream, bf16* act, bf16* pre, const bf16* x,
                         const bf16* weight, const bf16* bias, int64_t N, int64_t I, int64_t O,
                         bool tanh_form) {
    if (N == 0) return;
    if (tanh_form && O % 8 == 0) {
        // One GEMM: cuBLASLt's GELU epilogue is the tanh form (gemm.h), computed from the fp32
        // accumulator plus bias; pre is its aux output.
        GemmArgs g;
        g.M = N, g.N = O, g.K = I;
        g.A = x, g.lda = I, g.trans_a = false;
        g.B = weight, g.ldb = I, g.trans_b = true;
        g.D = act, g.ldd = O, g.d_dtype = DType::kBF16;
        g.bias = bias;
        g.epilogue = GemmEpilogue::kGeluAux;
        g.aux = pre, g.ldaux = O;
        if (gemm_bf16_try(state, stream, g)) return;
    }
    linear_forward(state, stream, pre, x, weight, bias, N, I, O);
    gelu_forward(act, pre, N * O, tanh_form, stream);
}

void linear_gelu_backward(CudaState& state, CUstream_st* stream, bf16* dpre, float* dpre_bias,
                          float* dweight, float* dbias, const bf16* dy, const bf16* act,
                          const bf16* pre, const bf16* weight, int64_t N, int64_t I, int64_t O,
                          bool tanh_form) {
    if (N == 0) return;
    const BiasGradScratch tmp(state, dpre_bias ? I : 0, dweight && dbias ? O : 0,
                              "linear_gelu_backward");
    bool dgelu_done = false, dpre_bias_done = dpre_bias == nullptr;
    if (kBackwardEpilogues && tanh_form && I % 8 == 0) {
        // dpre = (dy W) * gelu'(pre) in the dx GEMM's epilogue, with the column sums of dpre
        // (BGRAD) when wanted; without BGRAD if cuBLASLt has no algorithm with it.
        GemmArgs g = dx_gemm(dpre, dy, weight, N, I, O);
        g.epilogue = GemmEpilogue::kDGelu;
        g.aux = const_cast<bf16*>(pre), g.ldaux = I;
        if (dpre_bias != nullptr) {
            GemmArgs with_bias = g;
            with_bias.bias_grad = tmp.p[0];
            if (gemm_bf16_try(state, stream, with_bias)) {
                accumulate_f32(dpre_bias, tmp.p[0], I, stream);
                dgelu_done = dpre_bias_done = true;
            } else {
                // cuBLASLt may take only a bias gradient of D's type (bf16): summed in f32 inside
                // the epilogue, rounded once to bf16 (relative 2^-9), then added to the f32 one.
                // The scratch holds I floats, room for I bf16 values.
                with_bias.bias_grad_dtype = DType::kBF16;
                if (gemm_bf16_try(state, stream, with_bias)) {
                    accumulate_bf16(dpre_bias, reinterpret_cast<const bf16*>(tmp.p[0]), I, stream);
                    dgelu_done = dpre_bias_done = true;
                }
            }
        }
        if (!dgelu_done) dgelu_done = gemm_bf16_try(state, stream, g);
    }
    if (!dgelu_done) {
        gemm_bf16(state, stream, dx_gemm(dpre, dy, weight, N, I, O));
        gelu_backward(dpre, dpre, pre, N * I, tanh_form, stream);  // in place (gelu.h allows it)
    }
    if (!dpre_bias_done)
        column_sum_bf16_accumulate(state, stream, dpre_bias, dpre, N, I, "linear_gelu_backward");
    weight_and_bias_grad(state, stream, dweight, dbias, tmp.p[1], dy, act, N, I, O,
                         "linear_gelu_backward");
}

}  // namespace lathe::cuda
