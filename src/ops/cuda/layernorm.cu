// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/layernorm.h"

namespace lathe::cuda {

namespace {

constexpr int kRowThreads = 256;  // 8 warps, one row each
constexpr int kRowsPerBlock = kRowThreads / kWarpSize;
constexpr int kPartialThreads = 128;

template <int kVec>
__global__ void layernorm_forward_warp_per_row_kernel(
    __nv_bfloat16* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
    const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ weight,
    const __nv_bfloat16* __restrict__ bias, int64_t N, int64_t C, float eps) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
    if (n >= N) return;
    const __nv_bfloat16* xr = x + n * C;
    float sum = 0.0f;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float v[kVec];
        load_bf16<kVec>(v, xr + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum += v[i];
    }
    const float m = warp_sum(sum) / float(C);
    float var = 0.0f;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float v[kVec];
        load_bf16<kVec>(v, xr + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) var += (v[i] - m) * (v[i] - m);
    }
    const float s = 1.0f / sqrtf(warp_sum(var) / float(C) + eps);
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
    __nv_bfloat16* yr = y + n * C;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float v[kVec], w[kVec], b[kVec], out[kVec];
        load_bf16<kVec>(v, xr + c);
        load_bf16<kVec>(w, weight + c);
        load_bf16<kVec>(b, bias + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) out[i] = (v[i] - m) * s * w[i] + b[i];
        store_bf16<kVec>(yr + c, out);
    }
}

// dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),  g = dy * weight, xhat = (x - mean) rstd.
template <int kVec>
__global__ void layernorm_backward_dx_warp_per_row_kernel(__nv_bfloat16* __restrict__ dx,
                                                          const __nv_bfloat16* __restrict__ dy,
                                                          const __nv_bfloat16* __restrict__ x,
                                                          const __nv_bfloat16* __restrict__ weight,
                                                          const float* __restrict__ mean,
                                                          const float* __restrict__ rstd, int64_t N,
                                                          int64_t C, bool accumulate) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
    if (n >= N) return;
    const float m = mean[n], s = rstd[n];
    const __nv_bfloat16* xr = x + n * C;
    const __nv_bfloat16* dyr = dy + n * C;
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float xv[kVec], dv[kVec], w[kVec];
        load_bf16<kVec>(xv, xr + c);
        load_bf16<kVec>(dv, dyr + c);
        load_bf16<kVec>(w, weight + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            const float g = dv[i] * w[i];
            sum_g += g;
            sum_g_xhat += g * ((xv[i] - m) * s);
        }
    }
    const float mean_g = warp_sum(sum_g) / float(C);
    const float mean_g_xhat = warp_sum(sum_g_xhat) / float(C);
    __nv_bfloat16* dxr = dx + n * C;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float xv[kVec], dv[kVec], w[kVec], out[kVec];
        load_bf16<kVec>(xv, xr + c);
        load_bf16<kVec>(dv, dyr + c);
        load_bf16<kVec>(w, weight + c);
        if (accumulate) load_bf16<kVec>(out, dxr + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            const float xhat = (xv[i] - m) * s;
            const float d = s * (dv[i] * w[i] - mean_g - xhat * mean_g_xhat);
            out[i] = accumulate ? out[i] + d : d;
        }
        store_bf16<kVec>(dxr + c, out);
    }
}

// dw_partials[r, c] = sum over chunk r of dy * xhat;  db_partials[r, c] = sum over chunk r of dy.
// Either output may be null.
template <int kVec>
__global__ void layernorm_param_partials_kernel(float* __restrict__ dw_partials,
                                                float* __restrict__ db_partials,
                                                const __nv_bfloat16* __restrict__ dy,
                                                const __nv_bfloat16* __restrict__ x,
                                                const float* __restrict__ mean,
                                                const float* __restrict__ rstd, int64_t N,
                                                int64_t C, int64_t rows_per_chunk) {
    const int64_t c0 = (int64_t(blockIdx.x) * kPartialThreads + threadIdx.x) * kVec;
    if (c0 >= C) return;
    const int64_t r = blockIdx.y;
    const int64_t n_end = min(N, (r + 1) * rows_per_chunk);
    float acc_w[kVec] = {}, acc_b[kVec] = {};
    for (int64_t n = r * rows_per_chunk; n < n_end; ++n) {
        float xv[kVec], dv[kVec];
        load_bf16<kVec>(xv, x + n * C + c0);
        load_bf16<kVec>(dv, dy + n * C + c0);
        const float m = mean[n], s = rstd[n];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            acc_w[i] += dv[i] * ((xv[i] - m) * s);
            acc_b[i] += dv[i];
        }
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
        if (dw_partials) dw_partials[r * C + c0 + i] = acc_w[i];
        if (db_partials) db_partials[r * C + c0 + i] = acc_b[i];
    }
}

}  // namespace

void layernorm_forward(bf16* y, float* mean, float* rstd, const bf16* x, const bf16* weight,
                       const bf16* bias, int64_t N, int64_t C, float eps, CUstream_st* stream) {
    if (N == 0) return;
    auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
    const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    const auto* wb = reinterpret_cast<const __nv_bfloat16*>(weight);
    const auto* bb = reinterpret_cast<const __nv_bfloat16*>(bias);
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    if (vec8_ok(C, {y, x, weight, bias}))
        layernorm_forward_warp_per_row_kernel<8>
            <<<blocks, kRowThreads, 0, stream>>>(yb, mean, rstd, xb, wb, bb, N, C, eps);
    else
        layernorm_forward_warp_per_row_kernel<1>
            <<<blocks, kRowThreads, 0, stream>>>(yb, mean, rstd, xb, wb, bb, N, C, eps);
    LATHE_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(CudaState& state, CUstream_st* stream, bf16* dx, float* dweight,
                        float* dbias, const bf16* dy, const bf16* x, const bf16* weight,
                        const float* mean, const float* rstd, int64_t N, int64_t C,
                        bool dx_accumulate) {
    if (N == 0) return;
    auto* dxb = reinterpret_cast<__nv_bfloat16*>(dx);
    const auto* dyb = reinterpret_cast<const __nv_bfloat16*>(dy);
    const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    const auto* wb = reinterpret_cast<const __nv_bfloat16*>(weight);
    const bool vec = vec8_ok(C, {dx, dy, x, weight});
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    if (vec)
        layernorm_backward_dx_warp_per_row_kernel<8>
            <<<blocks, kRowThreads, 0, stream>>>(dxb, dyb, xb, wb, mean, rstd, N, C, dx_accumulate);
    else
        layernorm_backward_dx_warp_per_row_kernel<1>
            <<<blocks, kRowThreads, 0, stream>>>(dxb, dyb, xb, wb, mean, rstd, N, C, dx_accumulate);
    LATHE_CUDA_CHECK_LAUNCH();
    if (dweight == nullptr && dbias == nullptr) return;
    const int64_t R = column_reduce_chunks(N);
    const int64_t rows = column_reduce_rows_per_chunk(N, R);
    float* partials =
        static_cast<float*>(state.scratch(2 * size_t(R * C) * sizeof(float), "layernorm_backward"));
    float* dw_partials = dweight ? partials : nullptr;
    float* db_partials = dbias ? partials + R * C : nullptr;
    if (vec) {
        const dim3 grid(blocks_for(C / 8, kPartialThreads, INT32_MAX), unsigned(R));
        layernorm_param_partials_kernel<8><<<grid, kPartialThreads, 0, stream>>>(
            dw_partials, db_partials, dyb, xb, mean, rstd, N, C, rows);
    } else {
        const dim3 grid(blocks_for(C, kPartialThreads, INT32_MAX), unsigned(R));
        layernorm_param_partials_kernel<1><<<grid, kPartialThreads, 0, stream>>>(
            dw_partials, db_partials, dyb, xb, mean, rstd, N, C, rows);
    }
    LATHE_CUDA_CHECK_LAUNCH();
    if (dweight) column_partials_accumulate(dweight, dw_partials, R, C, stream);
    if (dbias) column_partials_accumulate(dbias, db_partials, R, C, stream);
}

}  // namespace lathe::cuda
