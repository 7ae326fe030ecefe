// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/fp8_linear.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/check.h"
#include "ops/cpu/fp8_cast.h"
#include "ops/cpu/gemm.h"
#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/fp8_cast.h"
#include "ops/cuda/gemm.h"

namespace lathe::cuda {

namespace {

// The scaled product D = sa sb (A (M, K) . B (N, K)^T), fp8 "TN" as cuBLASLt takes it.
GemmArgs tn_args(Fp8Operand a, Fp8Operand b, int64_t M, int64_t N, int64_t K) {
    GemmArgs g;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = a.data;
    g.a_dtype = a.dtype;
    g.lda = K;
    g.B = b.data;
    g.b_dtype = b.dtype;
    g.ldb = K;
    g.trans_b = true;
    g.a_scale = a.scale_inv;
    g.b_scale = b.scale_inv;
    return g;
}

}  // namespace

void fp8_linear_forward(bf16* y, Fp8Operand x, Fp8Operand w, const bf16* bias, const bf16* residual,
                        int64_t N, int64_t I, int64_t O, CudaState& state, CUstream_st* stream) {
    LATHE_CHECK(residual == nullptr || residual != y,
                "cuda::fp8_linear_forward: y must be another buffer than the residual");
    GemmArgs g = tn_args(x, w, N, O, I);
    g.D = y;
    g.d_dtype = DType::kBF16;
    g.ldd = O;
    if (residual != nullptr) {
        g.C = residual;
        g.c_dtype = DType::kBF16;
        g.ldc = O;
        g.beta = 1.0f;
    }
    if (bias != nullptr) {
        g.epilogue = GemmEpilogue::kBias;
        g.bias = bias;
        g.bias_dtype = DType::kBF16;
    }
    gemm(state, stream, g);
}

void fp8_linear_backward_input(bf16* dx, Fp8Operand dy, Fp8Operand wt, int64_t N, int64_t I,
                               int64_t O, bool dx_accumulate, CudaState& state,
                               CUstream_st* stream) {
    GemmArgs g = tn_args(dy, wt, N, I, O);
    g.D = dx;
    g.d_dtype = DType::kBF16;
    g.ldd = I;
    g.beta = dx_accumulate ? 1.0f : 0.0f;
    gemm(state, stream, g);
}

void fp8_linear_backward_weight(float* dweight, Fp8Operand dyt, Fp8Operand xt, int64_t N, int64_t I,
                                int64_t O, bool accumulate, CudaState& state, CUstream_st* stream) {
    GemmArgs g = tn_args(dyt, xt, O, I, N);
    g.D = dweight;
    g.d_dtype = DType::kF32;
    g.ldd = I;
    g.beta = accumulate ? 1.0f : 0.0f;
    gemm(state, stream, g);
}

void fp8_linear_backward_bias(float* dbias, const bf16* dy, int64_t N, int64_t O, CudaState& state,
                              CUstream_st* stream) {
    column_sum_bf16_accumulate(dbias, dy, N, O, "fp8 linear_backward", state, stream);
}

std::string fp8_support_problem(int device) {
    cudaDeviceProp prop{};
    const cudaError_t err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess)
        return fmt::format("GPU {}: the CUDA runtime cannot describe it ({})", device,
                           cudaGetErrorString(err));
    if (prop.major * 10 + prop.minor >= 89) return {};
    return fmt::format(
        "GPU {} ({}, compute capability {}.{}) has no FP8 tensor cores (8.9 or newer: Ada, "
        "Hopper)",
        device, prop.name, prop.major, prop.minor);
}

std::string fp8_self_test(int device, bool& ok) {
    ok = false;
    const std::string problem = fp8_support_problem(device);
    if (!problem.empty()) return "fp8: none (" + problem + ")";
    cudaDeviceProp prop{};
    LATHE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    constexpr int64_t M = 256, N = 512, K = 1024;
    std::mt19937 rng(20240601);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<bf16> x(size_t(M * K)), w(size_t(N * K));
    for (auto& v : x) v = float_to_bf16(normal(rng));
    for (auto& v : w) v = float_to_bf16(0.05f * normal(rng));

    CudaState state(device);
    CUstream_st* stream = state.stream();
    const size_t bytes = (x.size() + w.size()) * 2 + (x.size() + w.size()) + M * N * 2 + 4 * 64;
    DeviceBuffer buf(bytes);
    auto* base = static_cast<unsigned char*>(buf.data());
    float* scalars = reinterpret_cast<float*>(base);  // 16-byte aligned slots: 0, 4, 8, 12
    bf16* dx = reinterpret_cast<bf16*>(base + 256);
    bf16* dw = dx + x.size();
    unsigned char* qx = reinterpret_cast<unsigned char*>(dw + w.size());
    unsigned char* qw = qx + x.size();
    bf16* dy = reinterpret_cast<bf16*>(qw + w.size());
    LATHE_CUDA_CHECK(cudaMemcpyAsync(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice, stream));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice, stream));
    Fp8CastArgs cx;
    cx.rows = M;
    cx.cols = K;
    cx.x = dx;
    cx.q = qx;
    cx.amax = scalars + 0;
    cx.scale_inv = scalars + 4;
    fp8_cast(cx, stream);
    Fp8CastArgs cw = cx;
    cw.rows = N;
    cw.x = dw;
    cw.q = qw;
    cw.amax = scalars + 8;
    cw.scale_inv = scalars + 12;
    fp8_cast(cw, stream);
    fp8_linear_forward(dy, {qx, DType::kE4M3, scalars + 4}, {qw, DType::kE4M3, scalars + 12},
                       nullptr, nullptr, M, K, N, state, stream);
    std::vector<uint8_t> hx(x.size()), hw(w.size());
    std::vector<bf16> hy(size_t(M * N));
    float hs[16];
    LATHE_CUDA_CHECK(cudaMemcpyAsync(hx.data(), qx, hx.size(), cudaMemcpyDeviceToHost, stream));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(hw.data(), qw, hw.size(), cudaMemcpyDeviceToHost, stream));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(hy.data(), dy, hy.size() * 2, cudaMemcpyDeviceToHost, stream));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(hs, scalars, sizeof(hs), cudaMemcpyDeviceToHost, stream));
    LATHE_CUDA_CHECK(cudaStreamSynchronize(stream));

    // The CPU reference: the same codes and scales through the CPU's gemm (fp32), and the sums of
    // |terms| for the bound.
    std::vector<float> ref(size_t(M * N)), mag(size_t(M * N)), ax(hx.size()), aw(hw.size());
    GemmArgs g;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = hx.data();
    g.a_dtype = DType::kE4M3;
    g.lda = K;
    g.B = hw.data();
    g.b_dtype = DType::kE4M3;
    g.ldb = K;
    g.trans_b = true;
    g.D = ref.data();
    g.d_dtype = DType::kF32;
    g.ldd = N;
    g.a_scale = &hs[4];
    g.b_scale = &hs[12];
    cpu::gemm(g);
    for (size_t i = 0; i < hx.size(); ++i) ax[i] = std::fabs(e4m3_to_float(fp8_e4m3{hx[i]}));
    for (size_t i = 0; i < hw.size(); ++i) aw[i] = std::fabs(e4m3_to_float(fp8_e4m3{hw[i]}));
    cpu::sgemm(false, true, M, N, K, hs[4] * hs[12], ax.data(), aw.data(), 0.0f, mag.data());
    // Products of two E4M3 values are exact in fp32; two fp32 summation orders of K terms differ
    // by at most 2 K 2^-24 of the sum of |terms| (S); Hopper's FP8 MMA accumulates with about 14
    // significant bits before cuBLASLt promotes to fp32 (2^-13 S more); the bf16 output adds half
    // an ulp (2^-8 of the value: bf16 has 8 significant bits). Worst element: its error over that
    // bound.
    double worst = 0, worst_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double got = bf16_to_float(hy[i]);
        const double err = std::fabs(got - ref[i]);
        const double bound =
            std::ldexp(std::fabs(ref[i]), -8) + (2.0 * K * 0x1p-24 + 0x1p-13) * mag[i] + 1e-30;
        if (!(err / bound <= worst)) {
            worst = std::isnan(err) ? INFINITY : err / bound;
            worst_err = err;
        }
    }
    ok = worst <= 1.0;
    return fmt::format(
        "fp8: {} ({}, compute capability {}.{}; e4m3 GEMM {}x{}x{} against the CPU reference: "
        "largest error {:.3g}, {:.2f} of its bound)",
        ok ? "ok" : "FAIL", prop.name, prop.major, prop.minor, M, N, K, worst_err, worst);
}

}  // namespace lathe::cuda
