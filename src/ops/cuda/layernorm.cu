// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/column_reduce.cuh"
#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/layernorm.h"

namespace lathe::cuda {

namespace {

constexpr int kRowThreads = 256;  // 8 warps, one row each
constexpr int kRowsPerBlock = kRowThreads / kWarpSize;

// kResidual: the row is x = res_a + res_b (rounded to bf16 as residual_forward does), written to
// x_out on the first pass and read back from there by the later passes (each lane rereads only what
// it wrote, so no synchronization); `x` is unused. Otherwise x is read and a, b, x_out unused.
template <int kVec, bool kResidual>
__global__ void layernorm_forward_warp_per_row_kernel(
    __nv_bfloat16* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
    const __nv_bfloat16* __restrict__ x, __nv_bfloat16* x_out, const __nv_bfloat16* res_a,
    const __nv_bfloat16* res_b, const __nv_bfloat16* __restrict__ weight,
    const __nv_bfloat16* __restrict__ bias, int64_t N, int64_t C, float eps) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
    if (n >= N) return;
    const __nv_bfloat16* xr = kResidual ? x_out + n * C : x + n * C;
    float sum = 0.0f;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float v[kVec];
        if constexpr (kResidual) {
            add_store_reload_bf16<kVec>(v, res_a + n * C + c, res_b + n * C + c, x_out + n * C + c);
        } else {
            load_bf16<kVec>(v, xr + c);
        }
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

// The same forward with a block per row (row_block_plan in kernel_util.cuh): thread t holds the
// row's vectors t, t + blockDim.x, ... (kIters of them), so the row is read once; the mean and
// then the variance about it are the block's fixed-order sums.
template <int kVec, int kIters, bool kResidual>
__global__ void __launch_bounds__(kRowBlockMaxThreads) layernorm_forward_block_per_row_kernel(
    __nv_bfloat16* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
    const __nv_bfloat16* __restrict__ x, __nv_bfloat16* x_out, const __nv_bfloat16* res_a,
    const __nv_bfloat16* res_b, const __nv_bfloat16* __restrict__ weight,
    const __nv_bfloat16* __restrict__ bias, int64_t C, float eps) {
    __shared__ float smem[kWarpSize];
    const int64_t n = blockIdx.x;
    float v[kIters][kVec];
    float sum = 0.0f;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        const int64_t c = (int64_t(it) * blockDim.x + threadIdx.x) * kVec;
        if (c >= C) continue;
        load_norm_input<kVec, kResidual>(v[it], x, x_out, res_a, res_b, n * C + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum += v[it][i];
    }
    const float m = block_sum(sum, smem) / float(C);
    float var = 0.0f;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        const int64_t c = (int64_t(it) * blockDim.x + threadIdx.x) * kVec;
        if (c >= C) continue;
#pragma unroll
        for (int i = 0; i < kVec; ++i) var += (v[it][i] - m) * (v[it][i] - m);
    }
    const float s = 1.0f / sqrtf(block_sum(var, smem) / float(C) + eps);
    if (threadIdx.x == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        const int64_t c = (int64_t(it) * blockDim.x + threadIdx.x) * kVec;
        if (c >= C) continue;
        float w[kVec], b[kVec], out[kVec];
        load_bf16<kVec>(w, weight + c);
        load_bf16<kVec>(b, bias + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) out[i] = (v[it][i] - m) * s * w[i] + b[i];
        store_bf16<kVec>(y + n * C + c, out);
    }
}

template <int kVec, bool kResidual>
void launch_layernorm_forward_block_per_row(const RowBlockPlan& plan, int64_t N,
                                            CUstream_st* stream, __nv_bfloat16* y, float* mean,
                                            float* rstd, const __nv_bfloat16* x,
                                            __nv_bfloat16* x_out, const __nv_bfloat16* a,
                                            const __nv_bfloat16* b, const __nv_bfloat16* w,
                                            const __nv_bfloat16* bias, int64_t C, float eps) {
    if (plan.iters == 1)
        layernorm_forward_block_per_row_kernel<kVec, 1, kResidual>
            <<<unsigned(N), plan.threads, 0, stream>>>(y, mean, rstd, x, x_out, a, b, w, bias, C,
                                                       eps);
    else
        layernorm_forward_block_per_row_kernel<kVec, 2, kResidual>
            <<<unsigned(N), plan.threads, 0, stream>>>(y, mean, rstd, x, x_out, a, b, w, bias, C,
                                                       eps);
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

// dx and the parameter partials in one pass over x and dy (column_reduce.cuh, fused plan): block
// r owns row chunk r, warp w its rows w, w + 8, ...; the row's x and dy stay in registers between
// the statistics and dx. The block's shared memory (fused_acc_bytes<2, kGroups>, column_reduce.cuh)
// sums dy * xhat (output 0, dweight) and dy (output 1, dbias). kGroups 256-column groups,
// C % 8 == 0, 16-byte aligned rows.
template <int kGroups>
__global__ void __launch_bounds__(kColumnThreads)
    layernorm_backward_fused_kernel(__nv_bfloat16* __restrict__ dx, float* __restrict__ partials,
                                    unsigned keep, const __nv_bfloat16* __restrict__ dy,
                                    const __nv_bfloat16* __restrict__ x,
                                    const __nv_bfloat16* __restrict__ weight,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    int64_t N, int64_t C, int64_t R, int64_t rows_per_chunk,
                                    bool accumulate) {
    extern __shared__ float4 acc_smem[];
    float* acc = reinterpret_cast<float*>(acc_smem);
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int64_t r = blockIdx.x;
    const int64_t n_begin = r * rows_per_chunk;
    const int64_t n_end = min(N, n_begin + rows_per_chunk);
    fused_acc_zero<2, kGroups>(acc);
    for (int64_t n = n_begin + warp; n < n_end; n += kColumnWarps) {
        const float m = mean[n], s = rstd[n];
        uint4 xr[kGroups], dr[kGroups];
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
            const int64_t c = int64_t(g) * kColumnTile + lane * 8;
            if (c < C) {
                xr[g] = *reinterpret_cast<const uint4*>(x + n * C + c);
                dr[g] = *reinterpret_cast<const uint4*>(dy + n * C + c);
            }
        }
        float sum_g = 0.0f, sum_g_xhat = 0.0f;
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
            const int64_t c = int64_t(g) * kColumnTile + lane * 8;
            if (c >= C) continue;
            float xv[8], dv[8], w[8], dvx[8];
            unpack_bf16x8(xv, xr[g]);
            unpack_bf16x8(dv, dr[g]);
            load_bf16<8>(w, weight + c);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float xhat = (xv[i] - m) * s;
                const float gi = dv[i] * w[i];
                sum_g += gi;
                sum_g_xhat += gi * xhat;
                dvx[i] = dv[i] * xhat;
            }
            fused_acc_add<2, kGroups>(acc, 0, g, dvx);
            fused_acc_add<2, kGroups>(acc, 1, g, dv);
        }
        const float mean_g = warp_sum(sum_g) / float(C);
        const float mean_g_xhat = warp_sum(sum_g_xhat) / float(C);
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
            const int64_t c = int64_t(g) * kColumnTile + lane * 8;
            if (c >= C) continue;
            float xv[8], dv[8], w[8], out[8];
            unpack_bf16x8(xv, xr[g]);
            unpack_bf16x8(dv, dr[g]);
            load_bf16<8>(w, weight + c);
            if (accumulate) load_bf16<8>(out, dx + n * C + c);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float xhat = (xv[i] - m) * s;
                const float d = s * (dv[i] * w[i] - mean_g - xhat * mean_g_xhat);
                out[i] = accumulate ? out[i] + d : d;
            }
            store_bf16<8>(dx + n * C + c, out);
        }
    }
    fused_acc_epilogue<2, kGroups>(partials, keep, acc, C, R, r);
}

// The rows of the parameter gradients: output 0 (dweight) dy * xhat, output 1 (dbias) dy.
struct LayernormParamRows {
    const __nv_bfloat16* __restrict__ dy;
    const __nv_bfloat16* __restrict__ x;
    const float* __restrict__ mean;
    const float* __restrict__ rstd;
    int64_t C;
    template <int kVec>
    __device__ __forceinline__ void operator()(int64_t n, int64_t c, float (&v)[2][kVec]) const {
        float xv[kVec];
        load_bf16<kVec>(xv, x + n * C + c);
        load_bf16<kVec>(v[1], dy + n * C + c);
        const float m = mean[n], s = rstd[n];
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[0][i] = v[1][i] * ((xv[i] - m) * s);
    }
};

}  // namespace

void layernorm_forward(bf16* y, float* mean, float* rstd, const bf16* x, const bf16* weight,
                       const bf16* bias, int64_t N, int64_t C, float eps, CUstream_st* stream) {
    layernorm_residual_forward(nullptr, y, mean, rstd, x, nullptr, weight, bias, N, C, eps, stream);
}

void layernorm_residual_forward(bf16* x_out, bf16* y, float* mean, float* rstd, const bf16* a,
                                const bf16* b, const bf16* weight, const bf16* bias, int64_t N,
                                int64_t C, float eps, CUstream_st* stream) {
    if (N == 0) return;
    auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
    auto* xo = reinterpret_cast<__nv_bfloat16*>(x_out);
    const auto* ab = reinterpret_cast<const __nv_bfloat16*>(a);
    const auto* bb2 = reinterpret_cast<const __nv_bfloat16*>(b);
    const auto* wb = reinterpret_cast<const __nv_bfloat16*>(weight);
    const auto* bb = reinterpret_cast<const __nv_bfloat16*>(bias);
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    const bool vec = vec8_ok(C, {y, x_out, a, b, weight, bias});
    const RowBlockPlan plan = row_block_plan(N, C, vec ? 8 : 1);
    if (plan.iters > 0) {
        if (x_out == nullptr && vec)
            launch_layernorm_forward_block_per_row<8, false>(
                plan, N, stream, yb, mean, rstd, ab, nullptr, nullptr, nullptr, wb, bb, C, eps);
        else if (x_out == nullptr)
            launch_layernorm_forward_block_per_row<1, false>(
                plan, N, stream, yb, mean, rstd, ab, nullptr, nullptr, nullptr, wb, bb, C, eps);
        else if (vec)
            launch_layernorm_forward_block_per_row<8, true>(plan, N, stream, yb, mean, rstd,
                                                            nullptr, xo, ab, bb2, wb, bb, C, eps);
        else
            launch_layernorm_forward_block_per_row<1, true>(plan, N, stream, yb, mean, rstd,
                                                            nullptr, xo, ab, bb2, wb, bb, C, eps);
    } else if (x_out == nullptr) {  // plain: a is x
        if (vec)
            layernorm_forward_warp_per_row_kernel<8, false><<<blocks, kRowThreads, 0, stream>>>(
                yb, mean, rstd, ab, nullptr, nullptr, nullptr, wb, bb, N, C, eps);
        else
            layernorm_forward_warp_per_row_kernel<1, false><<<blocks, kRowThreads, 0, stream>>>(
                yb, mean, rstd, ab, nullptr, nullptr, nullptr, wb, bb, N, C, eps);
    } else {
        if (vec)
            layernorm_forward_warp_per_row_kernel<8, true><<<blocks, kRowThreads, 0, stream>>>(
                yb, mean, rstd, nullptr, xo, ab, bb2, wb, bb, N, C, eps);
        else
            layernorm_forward_warp_per_row_kernel<1, true><<<blocks, kRowThreads, 0, stream>>>(
                yb, mean, rstd, nullptr, xo, ab, bb2, wb, bb, N, C, eps);
    }
    LATHE_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(bf16* dx, float* dweight, float* dbias, const bf16* dy, const bf16* x,
                        const bf16* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, bool dx_accumulate, CudaState& state, CUstream_st* stream) {
    if (N == 0) return;
    auto* dxb = reinterpret_cast<__nv_bfloat16*>(dx);
    const auto* dyb = reinterpret_cast<const __nv_bfloat16*>(dy);
    const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    const auto* wb = reinterpret_cast<const __nv_bfloat16*>(weight);
    const bool vec = vec8_ok(C, {dx, dy, x, weight});
    const bool params = dweight != nullptr || dbias != nullptr;
    const unsigned keep = (dweight ? 1u : 0u) | (dbias ? 2u : 0u);
    const int groups = vec && params ? norm_fused_groups(C) : 0;
    if (groups > 0) {
        // One pass: dx and the partials; then pass 2 of the column reduction.
        const int64_t R = fused_norm_chunks(N, C);
        float* partials = static_cast<float*>(
            state.scratch(2 * size_t(R * C) * sizeof(float), "layernorm_backward"));
        const int64_t rows = column_reduce_rows_per_chunk(N, R);
        auto launch = [&](auto kernel, size_t smem) {
            allow_dynamic_smem(kernel, smem);
            kernel<<<unsigned(R), kColumnThreads, smem, stream>>>(
                dxb, partials, keep, dyb, xb, wb, mean, rstd, N, C, R, rows, dx_accumulate);
        };
        switch (groups) {
            case 1:
                launch(layernorm_backward_fused_kernel<1>, fused_acc_bytes<2, 1>);
                break;
            case 2:
                launch(layernorm_backward_fused_kernel<2>, fused_acc_bytes<2, 2>);
                break;
            case 3:
                launch(layernorm_backward_fused_kernel<3>, fused_acc_bytes<2, 3>);
                break;
            case 4:
                launch(layernorm_backward_fused_kernel<4>, fused_acc_bytes<2, 4>);
                break;
            case 6:
                launch(layernorm_backward_fused_kernel<6>, fused_acc_bytes<2, 6>);
                break;
            default:
                launch(layernorm_backward_fused_kernel<8>, fused_acc_bytes<2, 8>);
                break;
        }
        LATHE_CUDA_CHECK_LAUNCH();
        column_partials_accumulate2(dweight, dbias, partials, R, C, stream);
        return;
    }
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    if (vec)
        layernorm_backward_dx_warp_per_row_kernel<8>
            <<<blocks, kRowThreads, 0, stream>>>(dxb, dyb, xb, wb, mean, rstd, N, C, dx_accumulate);
    else
        layernorm_backward_dx_warp_per_row_kernel<1>
            <<<blocks, kRowThreads, 0, stream>>>(dxb, dyb, xb, wb, mean, rstd, N, C, dx_accumulate);
    LATHE_CUDA_CHECK_LAUNCH();
    if (!params) return;
    // Both partial arrays always have their place (R depends on N and C only), so dweight's
    // bits do not depend on whether dbias is wanted.
    const int64_t R = column_reduce_chunks(N, C);
    float* partials =
        static_cast<float*>(state.scratch(2 * size_t(R * C) * sizeof(float), "layernorm_backward"));
    launch_column_partials<2>(partials, keep, LayernormParamRows{dyb, xb, mean, rstd, C}, vec, N, C,
                              R, stream);
    LATHE_CUDA_CHECK_LAUNCH();
    column_partials_accumulate2(dweight, dbias, partials, R, C, stream);
}

}  // namespace lathe::cuda
