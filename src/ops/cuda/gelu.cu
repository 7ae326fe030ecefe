// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gelu.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kInvSqrt2 = 0.7071067811865476f;     // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;   // 1 / sqrt(2 pi), the normal pdf at 0
constexpr float kGeluTanhCoef = 0.044715f;

__device__ __forceinline__ float gelu_value(float v, bool tanh_form) {
    const float cdf = tanh_form
                          ? 0.5f * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluTanhCoef * v * v * v)))
                          : 0.5f * (1.0f + erff(v * kInvSqrt2));
    return v * cdf;
}

// gelu'(v). The tanh form through the logistic function, which is what 0.5 (1 + tanh u) is:
// s = sigmoid(2u) and 1 - tanh(u)^2 = 4 s (1 - s), u = sqrt(2/pi) (v + 0.044715 v^3), so
//   gelu'(v) = s + 2 v s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 v^2)
// with fast_sigmoid's few instructions instead of tanhf's longer sequence (kernel_util.cuh).
__device__ __forceinline__ float gelu_grad(float v, bool tanh_form) {
    if (tanh_form) {
        const float u = kSqrt2OverPi * (v + kGeluTanhCoef * v * v * v);
        const float s = fast_sigmoid(2.0f * u);
        return s + 2.0f * v * s * (1.0f - s) * kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCoef * v * v);
    }
    return 0.5f * (1.0f + erff(v * kInvSqrt2)) + v * kInvSqrt2Pi * expf(-0.5f * v * v);
}

template <int kVec>
__global__ void gelu_forward_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n,
                                    bool tanh_form) {
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < n / kVec;
         g += int64_t(gridDim.x) * blockDim.x) {
        float v[kVec], o[kVec];
        load_bf16<kVec>(v, x + g * kVec);
#pragma unroll
        for (int i = 0; i < kVec; ++i) o[i] = gelu_value(v[i], tanh_form);
        store_bf16<kVec>(y + g * kVec, o);
    }
}

template <int kVec>
__global__ void gelu_backward_kernel(__nv_bfloat16* dx, const __nv_bfloat16* dy,
                                     const __nv_bfloat16* __restrict__ x, int64_t n,
                                     bool tanh_form) {
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < n / kVec;
         g += int64_t(gridDim.x) * blockDim.x) {
        float v[kVec], d[kVec], o[kVec];
        load_bf16<kVec>(v, x + g * kVec);
        load_bf16<kVec>(d, dy + g * kVec);
#pragma unroll
        for (int i = 0; i < kVec; ++i) o[i] = d[i] * gelu_grad(v[i], tanh_form);
        store_bf16<kVec>(dx + g * kVec, o);
    }
}

}  // namespace

void gelu_forward(bf16* y, const bf16* x, int64_t n, bool tanh_form, CUstream_st* stream) {
    if (n == 0) return;
    auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
    const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    if (vec8_ok(n, {y, x}))
        gelu_forward_kernel<8>
            <<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(yb, xb, n, tanh_form);
    else
        gelu_forward_kernel<1>
            <<<blocks_for(n, kThreads), kThreads, 0, stream>>>(yb, xb, n, tanh_form);
    LATHE_CUDA_CHECK_LAUNCH();
}

void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n, bool tanh_form,
                   CUstream_st* stream) {
    if (n == 0) return;
    auto* dxb = reinterpret_cast<__nv_bfloat16*>(dx);
    const auto* dyb = reinterpret_cast<const __nv_bfloat16*>(dy);
    const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    if (vec8_ok(n, {dx, dy, x}))
        gelu_backward_kernel<8>
            <<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(dxb, dyb, xb, n, tanh_form);
    else
        gelu_backward_kernel<1>
            <<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dxb, dyb, xb, n, tanh_form);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace lathe::cuda
