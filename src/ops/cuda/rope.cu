// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/rope.h"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 256;

// One tensor of a launch: out/x (B, T, Hx, D), and its thread count B T Hx (D - R/2).
struct RopeTensor {
    __nv_bfloat16* out;
    const __nv_bfloat16* x;
    int64_t Hx;
    int64_t total;
};

// One thread per (tensor, row n, head h, k) with k < D - R/2: k < R/2 rotates the pair
// (k, k + R/2), larger k copies the unrotated dim R + (k - R/2) (skipped when in place). The
// first t0.total threads work on t0 (the queries), the next t1.total on t1 (the keys; 0 for a
// one-tensor launch), so q and k take one launch with the same per-element arithmetic.
__global__ void rope_rotate_pair_per_thread_kernel(RopeTensor t0, RopeTensor t1,
                                                   const int32_t* __restrict__ positions,
                                                   const float* __restrict__ cos,
                                                   const float* __restrict__ sin, int64_t T,
                                                   int64_t D, int64_t R, int64_t P, float sign) {
    const int64_t half = R / 2, per_head = D - half;
    const int64_t total = t0.total + t1.total;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total;
         g += int64_t(gridDim.x) * blockDim.x) {
        const bool second = g >= t0.total;
        const RopeTensor& t = second ? t1 : t0;
        const int64_t idx = second ? g - t0.total : g;
        const int64_t k = idx % per_head;
        const int64_t head = idx / per_head;  // n * Hx + h
        const int64_t n = head / t.Hx;
        const __nv_bfloat16* xh = t.x + head * D;
        __nv_bfloat16* oh = t.out + head * D;
        if (k < half) {
            const int64_t pos = positions ? int64_t(positions[n]) : n % T;
            LATHE_DEVICE_CHECK(pos >= 0 && pos < P, "rope position %lld at row %lld, table %lld",
                               (long long)pos, (long long)n, (long long)P);
            const float c = cos[pos * half + k];
            const float s = sign * sin[pos * half + k];
            const float x1 = __bfloat162float(xh[k]);
            const float x2 = __bfloat162float(xh[k + half]);  // both read before either write
            oh[k] = __float2bfloat16_rn(x1 * c - x2 * s);
            oh[k + half] = __float2bfloat16_rn(x2 * c + x1 * s);
        } else if (oh != xh) {
            const int64_t j = R + (k - half);
            oh[j] = xh[j];
        }
    }
}

RopeTensor rope_tensor(bf16* out, const bf16* x, int64_t B, int64_t T, int64_t Hx, int64_t D,
                       int64_t R) {
    return RopeTensor{reinterpret_cast<__nv_bfloat16*>(out),
                      reinterpret_cast<const __nv_bfloat16*>(x), Hx, B * T * Hx * (D - R / 2)};
}

void rope_launch(const RopeTensor& t0, const RopeTensor& t1, const int32_t* positions,
                 const float* cos, const float* sin, int64_t T, int64_t D, int64_t R, int64_t P,
                 float sign, CUstream_st* stream) {
    const int64_t total = t0.total + t1.total;
    if (total == 0) return;
    rope_rotate_pair_per_thread_kernel<<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
        t0, t1, positions, cos, sin, T, D, R, P, sign);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(bf16* out, const bf16* x, const int32_t* positions, const float* cos,
                  const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                  int64_t P, CUstream_st* stream) {
    rope_launch(rope_tensor(out, x, B, T, Hx, D, R), RopeTensor{nullptr, nullptr, 1, 0}, positions,
                cos, sin, T, D, R, P, 1.0f, stream);
}

void rope_backward(bf16* dx, const bf16* dout, const int32_t* positions, const float* cos,
                   const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                   int64_t P, CUstream_st* stream) {
    rope_launch(rope_tensor(dx, dout, B, T, Hx, D, R), RopeTensor{nullptr, nullptr, 1, 0},
                positions, cos, sin, T, D, R, P, -1.0f, stream);
}

void rope_qk(bf16* q_out, bf16* k_out, const bf16* q, const bf16* k, const int32_t* positions,
             const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t Hkv,
             int64_t D, int64_t R, int64_t P, bool backward, CUstream_st* stream) {
    rope_launch(rope_tensor(q_out, q, B, T, H, D, R), rope_tensor(k_out, k, B, T, Hkv, D, R),
                positions, cos, sin, T, D, R, P, backward ? -1.0f : 1.0f, stream);
}

}  // namespace lathe::cuda
