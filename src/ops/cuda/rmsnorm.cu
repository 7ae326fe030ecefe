// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/rmsnorm.h"

namespace lathe::cuda {

namespace {

constexpr int kRowThreads = 256;  // 8 warps, one row each
constexpr int kRowsPerBlock = kRowThreads / kWarpSize;
constexpr int kPartialThreads = 128;

// Pass 1 reads the row for sum(x^2); pass 2 reads it again (from L1/L2) and writes y.
template <int kVec>
__global__ void rmsnorm_forward_warp_per_row_kernel(__nv_bfloat16* __restrict__ y,
                                                    float* __restrict__ rstd,
                                                    const __nv_bfloat16* __restrict__ x,
                                                    const __nv_bfloat16* __restrict__ weight,
                                                    int64_t N, int64_t C, float eps) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
    if (n >= N) return;
    const __nv_bfloat16* xr = x + n * C;
    float sum = 0.0f;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float v[kVec];
        load_bf16<kVec>(v, xr + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum += v[i] * v[i];
    }
    sum = warp_sum(sum);
    const float s = 1.0f / sqrtf(sum / float(C) + eps);
    if (lane == 0) rstd[n] = s;
    __nv_bfloat16* yr = y + n * C;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float v[kVec], w[kVec], out[kVec];
        load_bf16<kVec>(v, xr + c);
        load_bf16<kVec>(w, weight + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) out[i] = v[i] * s * w[i];
        store_bf16<kVec>(yr + c, out);
    }
}

// dx = rstd * (g - norm * mean_c(g * norm)),  g = dy * weight, norm = x * rstd.
template <int kVec>
__global__ void rmsnorm_backward_dx_warp_per_row_kernel(__nv_bfloat16* __restrict__ dx,
                                                        const __nv_bfloat16* __restrict__ dy,
                                                        const __nv_bfloat16* __restrict__ x,
                                                        const __nv_bfloat16* __restrict__ weight,
                                                        const float* __restrict__ rstd, int64_t N,
                                                        int64_t C, bool accumulate) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
    if (n >= N) return;
    const float s = rstd[n];
    const __nv_bfloat16* xr = x + n * C;
    const __nv_bfloat16* dyr = dy + n * C;
    float dot = 0.0f;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float xv[kVec], dv[kVec], w[kVec];
        load_bf16<kVec>(xv, xr + c);
        load_bf16<kVec>(dv, dyr + c);
        load_bf16<kVec>(w, weight + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot += dv[i] * w[i] * (xv[i] * s);
    }
    const float mean_g_norm = warp_sum(dot) / float(C);
    __nv_bfloat16* dxr = dx + n * C;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float xv[kVec], dv[kVec], w[kVec], out[kVec];
        load_bf16<kVec>(xv, xr + c);
        load_bf16<kVec>(dv, dyr + c);
        load_bf16<kVec>(w, weight + c);
        if (accumulate) load_bf16<kVec>(out, dxr + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            const float g = s * (dv[i] * w[i] - xv[i] * s * mean_g_norm);
            out[i] = accumulate ? out[i] + g : g;
        }
        store_bf16<kVec>(dxr + c, out);
    }
}

// partials[r, c] = sum over the rows of chunk r of dy[n, c] * x[n, c] * rstd[n].
template <int kVec>
__global__ void rmsnorm_dweight_partials_kernel(float* __restrict__ partials,
                                                const __nv_bfloat16* __restrict__ dy,
                                                const __nv_bfloat16* __restrict__ x,
                                                const float* __restrict__ rstd, int64_t N,
                                                int64_t C, int64_t rows_per_chunk) {
    const int64_t c0 = (int64_t(blockIdx.x) * kPartialThreads + threadIdx.x) * kVec;
    if (c0 >= C) return;
    const int64_t r = blockIdx.y;
    const int64_t n_end = min(N, (r + 1) * rows_per_chunk);
    float acc[kVec] = {};
    for (int64_t n = r * rows_per_chunk; n < n_end; ++n) {
        float xv[kVec], dv[kVec];
        load_bf16<kVec>(xv, x + n * C + c0);
        load_bf16<kVec>(dv, dy + n * C + c0);
        const float s = rstd[n];
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] += dv[i] * (xv[i] * s);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) partials[r * C + c0 + i] = acc[i];
}

}  // namespace

void rmsnorm_forward(bf16* y, float* rstd, const bf16* x, const bf16* weight, int64_t N, int64_t C,
                     float eps, CUstream_st* stream) {
    if (N == 0) return;
    auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
    const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    const auto* wb = reinterpret_cast<const __nv_bfloat16*>(weight);
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    if (vec8_ok(C, {y, x, weight}))
        rmsnorm_forward_warp_per_row_kernel<8>
            <<<blocks, kRowThreads, 0, stream>>>(yb, rstd, xb, wb, N, C, eps);
    else
        rmsnorm_forward_warp_per_row_kernel<1>
            <<<blocks, kRowThreads, 0, stream>>>(yb, rstd, xb, wb, N, C, eps);
    LATHE_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(CudaState& state, CUstream_st* stream, bf16* dx, float* dweight,
                      const bf16* dy, const bf16* x, const bf16* weight, const float* rstd,
                      int64_t N, int64_t C, bool dx_accumulate) {
    if (N == 0) return;
    auto* dxb = reinterpret_cast<__nv_bfloat16*>(dx);
    const auto* dyb = reinterpret_cast<const __nv_bfloat16*>(dy);
    const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    const auto* wb = reinterpret_cast<const __nv_bfloat16*>(weight);
    const bool vec = vec8_ok(C, {dx, dy, x, weight});
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    if (vec)
        rmsnorm_backward_dx_warp_per_row_kernel<8>
            <<<blocks, kRowThreads, 0, stream>>>(dxb, dyb, xb, wb, rstd, N, C, dx_accumulate);
    else
        rmsnorm_backward_dx_warp_per_row_kernel<1>
            <<<blocks, kRowThreads, 0, stream>>>(dxb, dyb, xb, wb, rstd, N, C, dx_accumulate);
    LATHE_CUDA_CHECK_LAUNCH();
    if (dweight == nullptr) return;
    const int64_t R = column_reduce_chunks(N);
    const int64_t rows = column_reduce_rows_per_chunk(N, R);
    float* partials =
        static_cast<float*>(state.scratch(size_t(R * C) * sizeof(float), "rmsnorm_backward"));
    if (vec) {
        const dim3 grid(blocks_for(C / 8, kPartialThreads, INT32_MAX), unsigned(R));
        rmsnorm_dweight_partials_kernel<8>
            <<<grid, kPartialThreads, 0, stream>>>(partials, dyb, xb, rstd, N, C, rows);
    } else {
        const dim3 grid(blocks_for(C, kPartialThreads, INT32_MAX), unsigned(R));
        rmsnorm_dweight_partials_kernel<1>
            <<<grid, kPartialThreads, 0, stream>>>(partials, dyb, xb, rstd, N, C, rows);
    }
    LATHE_CUDA_CHECK_LAUNCH();
    column_partials_accumulate(dweight, partials, R, C, stream);
}

}  // namespace lathe::cuda
