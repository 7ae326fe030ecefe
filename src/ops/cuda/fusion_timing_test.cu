// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

// The block's fusions (docs/CUDA.md, "Fusions in the block") at the two training shapes (GPT-2
// 124M, Llama-1B), fused against the unfused sequence they replace, on the same device inputs: the
// outputs must agree within bf16 tolerances (a model-sized correctness check the small tests do not
// reach), and the median time of each variant is printed ("[fusion] ..." lines), so one GPU run
// tells whether each fusion pays. The unfused baselines call the separate kernels directly (plain
// GEMMs, the gelu kernels, the column reduction), i.e. the code path before the fusions.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "ops/cuda/cuda_test_util.h"
#include "ops/cuda/gelu.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/layernorm.h"
#include "ops/cuda/linear.h"
#include "ops/cuda/residual.h"
#include "ops/cuda/rmsnorm.h"
#include "ops/cuda/rope.h"

namespace lathe {
namespace {

using namespace cudatest;

__global__ void fill_uniform_kernel(__nv_bfloat16* p, int64_t n, uint32_t seed, float lo,
                                    float hi) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        uint64_t z = uint64_t(i) * 0x9E3779B97F4A7C15ull + seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        const float u = float(uint32_t(z >> 40)) / float(1u << 24);
        p[i] = __float2bfloat16_rn(lo + (hi - lo) * u);
    }
}

// A bf16 device tensor of pseudo-random values in [lo, hi) (filled on the device: these tensors
// hold up to 100M elements).
DeviceTensor random_device_bf16(Shape shape, uint32_t seed, float lo, float hi, CudaState& state) {
    DeviceTensor t = device_tensor(DType::kBF16, shape, state);
    const int64_t n = shape.numel();
    fill_uniform_kernel<<<cuda::blocks_for(n, 256), 256, 0, state.stream()>>>(
        static_cast<__nv_bfloat16*>(t.view.data()), n, seed, lo, hi);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    return t;
}

// Median milliseconds of `reps` runs of f after 3 warm-up runs, CUDA events on the state's stream.
double time_ms(CudaState& state, const std::function<void()>& f, int reps = 10) {
    for (int i = 0; i < 3; ++i) f();
    cudaEvent_t start, stop;
    EXPECT_EQ(cudaEventCreate(&start), cudaSuccess);
    EXPECT_EQ(cudaEventCreate(&stop), cudaSuccess);
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
        cudaEventRecord(start, state.stream());
        f();
        cudaEventRecord(stop, state.stream());
        cudaEventSynchronize(stop);
        float t = 0.0f;
        cudaEventElapsedTime(&t, start, stop);
        ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

void report(const char* what, double unfused, double fused) {
    std::printf("[fusion] %-46s unfused %8.3f ms  fused %8.3f ms  (%.2fx)\n", what, unfused, fused,
                unfused / fused);
}

template <typename T>
T* ptr(const DeviceTensor& t) {
    return static_cast<T*>(t.view.data());
}

// GPT-2 124M at B=32, T=1024: the MLP's forward (768 -> 3072 -> 768, tanh GELU, biases). (The
// backward epilogues this test also timed, DGELU_BGRAD and BGRADB, were slower and are gone:
// gemm.h.)
TEST(CudaFusionTiming, Gpt2Mlp) {
    const int64_t N = 32 * 1024, C = 768, F = 3072;
    CudaState state(0);
    CUstream_st* s = state.stream();
    DeviceTensor x = random_device_bf16({N, C}, 1, -1.0f, 1.0f, state);
    DeviceTensor w_up = random_device_bf16({F, C}, 2, -0.05f, 0.05f, state);
    DeviceTensor b_up = random_device_bf16({F}, 3, -0.5f, 0.5f, state);
    DeviceTensor w_down = random_device_bf16({C, F}, 4, -0.05f, 0.05f, state);
    DeviceTensor dy = random_device_bf16({N, C}, 5, -1.0f, 1.0f, state);

    // Forward: GEMM + bias, then the gelu kernel; against one GEMM with the GELU epilogue.
    DeviceTensor pre1 = device_tensor(DType::kBF16, {N, F}, state);
    DeviceTensor act1 = device_tensor(DType::kBF16, {N, F}, state);
    DeviceTensor pre2 = device_tensor(DType::kBF16, {N, F}, state);
    DeviceTensor act2 = device_tensor(DType::kBF16, {N, F}, state);
    auto fwd_unfused = [&] {
        cuda::linear_forward(ptr<bf16>(pre1), ptr<bf16>(x), ptr<bf16>(w_up), ptr<bf16>(b_up), N, C,
                             F, state, s);
        cuda::gelu_forward(ptr<bf16>(act1), ptr<bf16>(pre1), N * F, true, s);
    };
    auto fwd_fused = [&] {
        cuda::linear_gelu_forward(ptr<bf16>(act2), ptr<bf16>(pre2), ptr<bf16>(x), ptr<bf16>(w_up),
                                  ptr<bf16>(b_up), N, C, F, true, state, s);
    };
    report("up projection + tanh GELU (N=32768 768->3072)", time_ms(state, fwd_unfused),
           time_ms(state, fwd_fused));
    EXPECT_TRUE(matches(download_f32(pre2.view, state), download_f32(pre1.view, state), kBf16Sum))
        << "pre";
    EXPECT_TRUE(
        matches(download_f32(act2.view, state), download_f32(act1.view, state), kBf16Derived))
        << "act";

    // The down projection joining the residual stream: GEMM into a temporary + the add kernel,
    // against one GEMM reading the residual as C.
    DeviceTensor res = random_device_bf16({N, C}, 7, -4.0f, 4.0f, state);
    DeviceTensor tmp = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor out1 = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor out2 = device_tensor(DType::kBF16, {N, C}, state);
    DeviceTensor b_down = random_device_bf16({C}, 8, -0.5f, 0.5f, state);
    auto down_unfused = [&] {
        cuda::linear_forward(ptr<bf16>(tmp), ptr<bf16>(act1), ptr<bf16>(w_down), ptr<bf16>(b_down),
                             N, F, C, state, s);
        cuda::residual_forward(ptr<bf16>(out1), ptr<bf16>(res), ptr<bf16>(tmp), N * C, s);
    };
    auto down_fused = [&] {
        cuda::linear_residual_forward(ptr<bf16>(out2), ptr<bf16>(act1), ptr<bf16>(w_down),
                                      ptr<bf16>(b_down), ptr<bf16>(res), N, F, C, state, s);
    };
    report("down projection + residual (N=32768 3072->768)", time_ms(state, down_unfused),
           time_ms(state, down_fused));
    EXPECT_TRUE(matches(download_f32(out2.view, state), download_f32(out1.view, state), kBf16Sum))
        << "x_out";
}

// The residual add + norm at both shapes (bitwise the same by construction; checked), and RoPE
// of q and k at the Llama shape.
TEST(CudaFusionTiming, ResidualNormAndRope) {
    CudaState state(0);
    CUstream_st* s = state.stream();
    for (const bool rms : {false, true}) {
        const int64_t N = rms ? 16384 : 32768, C = rms ? 2048 : 768;
        DeviceTensor a = random_device_bf16({N, C}, 11, -2.0f, 2.0f, state);
        DeviceTensor b = random_device_bf16({N, C}, 12, -1.0f, 1.0f, state);
        DeviceTensor w = random_device_bf16({C}, 13, 0.5f, 1.5f, state);
        DeviceTensor bias = random_device_bf16({C}, 14, -0.5f, 0.5f, state);
        DeviceTensor x1 = device_tensor(DType::kBF16, {N, C}, state);
        DeviceTensor x2 = device_tensor(DType::kBF16, {N, C}, state);
        DeviceTensor y1 = device_tensor(DType::kBF16, {N, C}, state);
        DeviceTensor y2 = device_tensor(DType::kBF16, {N, C}, state);
        DeviceTensor mean = device_tensor(DType::kF32, {N}, state);
        DeviceTensor rstd = device_tensor(DType::kF32, {N}, state);
        auto unfused = [&] {
            cuda::residual_forward(ptr<bf16>(x1), ptr<bf16>(a), ptr<bf16>(b), N * C, s);
            if (rms)
                cuda::rmsnorm_forward(ptr<bf16>(y1), ptr<float>(rstd), ptr<bf16>(x1), ptr<bf16>(w),
                                      N, C, 1e-5f, s);
            else
                cuda::layernorm_forward(ptr<bf16>(y1), ptr<float>(mean), ptr<float>(rstd),
                                        ptr<bf16>(x1), ptr<bf16>(w), ptr<bf16>(bias), N, C, 1e-5f,
                                        s);
        };
        auto fused = [&] {
            if (rms)
                cuda::rmsnorm_residual_forward(ptr<bf16>(x2), ptr<bf16>(y2), ptr<float>(rstd),
                                               ptr<bf16>(a), ptr<bf16>(b), ptr<bf16>(w), N, C,
                                               1e-5f, s);
            else
                cuda::layernorm_residual_forward(ptr<bf16>(x2), ptr<bf16>(y2), ptr<float>(mean),
                                                 ptr<float>(rstd), ptr<bf16>(a), ptr<bf16>(b),
                                                 ptr<bf16>(w), ptr<bf16>(bias), N, C, 1e-5f, s);
        };
        report(rms ? "residual + rmsnorm (N=16384 C=2048)" : "residual + layernorm (N=32768 C=768)",
               time_ms(state, unfused), time_ms(state, fused));
        EXPECT_TRUE(bitwise_equal(download_raw(x2.view, state), download_raw(x1.view, state)));
        EXPECT_TRUE(bitwise_equal(download_raw(y2.view, state), download_raw(y1.view, state)));
    }

    const int64_t B = 8, T = 2048, H = 32, Hkv = 8, D = 64, R = 64, P = T;
    DeviceTensor q = random_device_bf16({B, T, H, D}, 21, -1.0f, 1.0f, state);
    DeviceTensor k = random_device_bf16({B, T, Hkv, D}, 22, -1.0f, 1.0f, state);
    HostTensor cos_h(DType::kF32, {P, R / 2}), sin_h(DType::kF32, {P, R / 2});
    for (int64_t p = 0; p < P; ++p)
        for (int64_t i = 0; i < R / 2; ++i) {
            const double angle = double(p) * std::pow(500000.0, -2.0 * double(i) / double(R));
            cos_h.as<float>()[p * (R / 2) + i] = float(std::cos(angle));
            sin_h.as<float>()[p * (R / 2) + i] = float(std::sin(angle));
        }
    DeviceTensor cos = upload(cos_h, DType::kF32, state), sin = upload(sin_h, DType::kF32, state);
    DeviceTensor q1 = device_tensor(DType::kBF16, {B, T, H, D}, state);
    DeviceTensor k1 = device_tensor(DType::kBF16, {B, T, Hkv, D}, state);
    DeviceTensor q2 = device_tensor(DType::kBF16, {B, T, H, D}, state);
    DeviceTensor k2 = device_tensor(DType::kBF16, {B, T, Hkv, D}, state);
    auto two = [&] {
        cuda::rope_forward(ptr<bf16>(q1), ptr<bf16>(q), nullptr, ptr<float>(cos), ptr<float>(sin),
                           B, T, H, D, R, P, s);
        cuda::rope_forward(ptr<bf16>(k1), ptr<bf16>(k), nullptr, ptr<float>(cos), ptr<float>(sin),
                           B, T, Hkv, D, R, P, s);
    };
    auto one = [&] {
        cuda::rope_qk(ptr<bf16>(q2), ptr<bf16>(k2), ptr<bf16>(q), ptr<bf16>(k), nullptr,
                      ptr<float>(cos), ptr<float>(sin), B, T, H, Hkv, D, R, P, false, s);
    };
    report("rope q + k (B=8 T=2048 H=32 Hkv=8 D=64)", time_ms(state, two), time_ms(state, one));
    EXPECT_TRUE(bitwise_equal(download_raw(q2.view, state), download_raw(q1.view, state)));
    EXPECT_TRUE(bitwise_equal(download_raw(k2.view, state), download_raw(k1.view, state)));
}

}  // namespace
}  // namespace lathe
