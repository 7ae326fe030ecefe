// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/column_reduce.cuh"
#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/rmsnorm.h"

namespace lathe::cuda {

namespace {

constexpr int kRowThreads = 256;  // 8 warps, one row each
constexpr int kRowsPerBlock = kRowThreads / kWarpSize;

// Pass 1 reads the row for sum(x^2); pass 2 reads it again (from L1/L2) and writes y.
// kResidual: the row is x = res_a + res_b (rounded to bf16 as residual_forward does), written to
// x_out by pass 1 and reread from there by pass 2 (each lane rereads only what it wrote, so no
// synchronization); `x` is unused. Otherwise x is read and res_a, res_b, x_out are unused.
template <int kVec, bool kResidual>
__global__ void rmsnorm_forward_warp_per_row_kernel(
    __nv_bfloat16* __restrict__ y, float* __restrict__ rstd, const __nv_bfloat16* __restrict__ x,
    __nv_bfloat16* x_out, const __nv_bfloat16* res_a, const __nv_bfloat16* res_b,
    const __nv_bfloat16* __restrict__ weight, int64_t N, int64_t C, float eps, unsigned* y_amax) {
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
        for (int i = 0; i < kVec; ++i) sum += v[i] * v[i];
    }
    sum = warp_sum(sum);
    const float s = 1.0f / sqrtf(sum / float(C) + eps);
    if (lane == 0) rstd[n] = s;
    __nv_bfloat16* yr = y + n * C;
    unsigned m = 0;
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float v[kVec], w[kVec], out[kVec];
        load_bf16<kVec>(v, xr + c);
        load_bf16<kVec>(w, weight + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            out[i] = v[i] * s * w[i];
            m = max(m, bf16_magnitude_bits(out[i]));
        }
        store_bf16<kVec>(yr + c, out);
    }
    if (y_amax != nullptr) warp_amax_into(m, y_amax);  // the whole warp is here (one row)
}

// The same forward with a block per row (row_block_plan in kernel_util.cuh): thread t holds the
// row's vectors t, t + blockDim.x, ... (kIters of them) and the weight's, so the row is read once;
// the sum of squares is the block's fixed-order sum.
template <int kVec, int kIters, bool kResidual>
__global__ void __launch_bounds__(kRowBlockMaxThreads)
    rmsnorm_forward_block_per_row_kernel(__nv_bfloat16* __restrict__ y, float* __restrict__ rstd,
                                         const __nv_bfloat16* __restrict__ x, __nv_bfloat16* x_out,
                                         const __nv_bfloat16* res_a, const __nv_bfloat16* res_b,
                                         const __nv_bfloat16* __restrict__ weight, int64_t C,
                                         float eps, unsigned* y_amax) {
    __shared__ float smem[kWarpSize];
    const int64_t n = blockIdx.x;
    float v[kIters][kVec], w[kIters][kVec];
    float sum = 0.0f;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        const int64_t c = (int64_t(it) * blockDim.x + threadIdx.x) * kVec;
        if (c >= C) continue;
        load_norm_input<kVec, kResidual>(v[it], x, x_out, res_a, res_b, n * C + c);
        load_bf16<kVec>(w[it], weight + c);
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum += v[it][i] * v[it][i];
    }
    sum = block_sum(sum, smem);
    const float s = 1.0f / sqrtf(sum / float(C) + eps);
    if (threadIdx.x == 0) rstd[n] = s;
    unsigned m = 0;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        const int64_t c = (int64_t(it) * blockDim.x + threadIdx.x) * kVec;
        if (c >= C) continue;
        float out[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
            out[i] = v[it][i] * s * w[it][i];
            m = max(m, bf16_magnitude_bits(out[i]));
        }
        store_bf16<kVec>(y + n * C + c, out);
    }
    if (y_amax != nullptr) warp_amax_into(m, y_amax);  // blockDim.x is a multiple of 32
}

template <int kVec, bool kResidual>
void launch_rmsnorm_forward_block_per_row(const RowBlockPlan& plan, int64_t N, CUstream_st* stream,
                                          __nv_bfloat16* y, float* rstd, const __nv_bfloat16* x,
                                          __nv_bfloat16* x_out, const __nv_bfloat16* a,
                                          const __nv_bfloat16* b, const __nv_bfloat16* w, int64_t C,
                                          float eps, unsigned* amax) {
    if (plan.iters == 1)
        rmsnorm_forward_block_per_row_kernel<kVec, 1, kResidual>
            <<<unsigned(N), plan.threads, 0, stream>>>(y, rstd, x, x_out, a, b, w, C, eps, amax);
    else
        rmsnorm_forward_block_per_row_kernel<kVec, 2, kResidual>
            <<<unsigned(N), plan.threads, 0, stream>>>(y, rstd, x, x_out, a, b, w, C, eps, amax);
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

// dx and the dweight partials in one pass over x and dy (column_reduce.cuh, fused plan): block r
// owns row chunk r, warp w its rows w, w + 8, ...; the row's x and dy stay in registers between
// the statistic and dx; the block's shared memory sums dy * x * rstd (fused_acc_bytes<1, kGroups>
// of it, column_reduce.cuh). kGroups 256-column groups, C % 8 == 0, 16-byte aligned rows.
template <int kGroups>
__global__ void __launch_bounds__(kColumnThreads)
    rmsnorm_backward_fused_kernel(__nv_bfloat16* __restrict__ dx, float* __restrict__ partials,
                                  const __nv_bfloat16* __restrict__ dy,
                                  const __nv_bfloat16* __restrict__ x,
                                  const __nv_bfloat16* __restrict__ weight,
                                  const float* __restrict__ rstd, int64_t N, int64_t C, int64_t R,
                                  int64_t rows_per_chunk, bool accumulate) {
    extern __shared__ float4 acc_smem[];
    float* acc = reinterpret_cast<float*>(acc_smem);
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int64_t r = blockIdx.x;
    const int64_t n_begin = r * rows_per_chunk;
    const int64_t n_end = min(N, n_begin + rows_per_chunk);
    fused_acc_zero<1, kGroups>(acc);
    for (int64_t n = n_begin + warp; n < n_end; n += kColumnWarps) {
        const float s = rstd[n];
        uint4 xr[kGroups], dr[kGroups];
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
            const int64_t c = int64_t(g) * kColumnTile + lane * 8;
            if (c < C) {
                xr[g] = *reinterpret_cast<const uint4*>(x + n * C + c);
                dr[g] = *reinterpret_cast<const uint4*>(dy + n * C + c);
            }
        }
        float dot = 0.0f;
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
            const int64_t c = int64_t(g) * kColumnTile + lane * 8;
            if (c >= C) continue;
            float xv[8], dv[8], w[8], v[8];
            unpack_bf16x8(xv, xr[g]);
            unpack_bf16x8(dv, dr[g]);
            load_bf16<8>(w, weight + c);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                dot += dv[i] * w[i] * (xv[i] * s);
                v[i] = dv[i] * (xv[i] * s);
            }
            fused_acc_add<1, kGroups>(acc, 0, g, v);
        }
        const float mean_g_norm = warp_sum(dot) / float(C);
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
                const float gi = s * (dv[i] * w[i] - xv[i] * s * mean_g_norm);
                out[i] = accumulate ? out[i] + gi : gi;
            }
            store_bf16<8>(dx + n * C + c, out);
        }
    }
    fused_acc_epilogue<1, kGroups>(partials, 1u, acc, C, R, r);
}

// The rows of dweight: dy * (x * rstd).
struct RmsnormDweightRows {
    const __nv_bfloat16* __restrict__ dy;
    const __nv_bfloat16* __restrict__ x;
    const float* __restrict__ rstd;
    int64_t C;
    template <int kVec>
    __device__ __forceinline__ void operator()(int64_t n, int64_t c, float (&v)[1][kVec]) const {
        float xv[kVec], dv[kVec];
        load_bf16<kVec>(xv, x + n * C + c);
        load_bf16<kVec>(dv, dy + n * C + c);
        const float s = rstd[n];
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[0][i] = dv[i] * (xv[i] * s);
    }
};

}  // namespace

void rmsnorm_forward(bf16* y, float* rstd, const bf16* x, const bf16* weight, int64_t N, int64_t C,
                     float eps, CUstream_st* stream, float* y_amax) {
    rmsnorm_residual_forward(nullptr, y, rstd, x, nullptr, weight, N, C, eps, stream, y_amax);
}

void rmsnorm_residual_forward(bf16* x_out, bf16* y, float* rstd, const bf16* a, const bf16* b,
                              const bf16* weight, int64_t N, int64_t C, float eps,
                              CUstream_st* stream, float* y_amax) {
    auto* amax = reinterpret_cast<unsigned*>(y_amax);
    if (amax != nullptr) LATHE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(unsigned), stream));
    if (N == 0) return;
    auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
    auto* xo = reinterpret_cast<__nv_bfloat16*>(x_out);
    const auto* ab = reinterpret_cast<const __nv_bfloat16*>(a);
    const auto* bb = reinterpret_cast<const __nv_bfloat16*>(b);
    const auto* wb = reinterpret_cast<const __nv_bfloat16*>(weight);
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    const bool vec = vec8_ok(C, {y, x_out, a, b, weight});
    const RowBlockPlan plan = row_block_plan(N, C, vec ? 8 : 1);
    if (plan.iters > 0) {
        if (x_out == nullptr && vec)
            launch_rmsnorm_forward_block_per_row<8, false>(plan, N, stream, yb, rstd, ab, nullptr,
                                                           nullptr, nullptr, wb, C, eps, amax);
        else if (x_out == nullptr)
            launch_rmsnorm_forward_block_per_row<1, false>(plan, N, stream, yb, rstd, ab, nullptr,
                                                           nullptr, nullptr, wb, C, eps, amax);
        else if (vec)
            launch_rmsnorm_forward_block_per_row<8, true>(plan, N, stream, yb, rstd, nullptr, xo,
                                                          ab, bb, wb, C, eps, amax);
        else
            launch_rmsnorm_forward_block_per_row<1, true>(plan, N, stream, yb, rstd, nullptr, xo,
                                                          ab, bb, wb, C, eps, amax);
    } else if (x_out == nullptr) {  // plain: a is x
        if (vec)
            rmsnorm_forward_warp_per_row_kernel<8, false><<<blocks, kRowThreads, 0, stream>>>(
                yb, rstd, ab, nullptr, nullptr, nullptr, wb, N, C, eps, amax);
        else
            rmsnorm_forward_warp_per_row_kernel<1, false><<<blocks, kRowThreads, 0, stream>>>(
                yb, rstd, ab, nullptr, nullptr, nullptr, wb, N, C, eps, amax);
    } else {
        if (vec)
            rmsnorm_forward_warp_per_row_kernel<8, true><<<blocks, kRowThreads, 0, stream>>>(
                yb, rstd, nullptr, xo, ab, bb, wb, N, C, eps, amax);
        else
            rmsnorm_forward_warp_per_row_kernel<1, true><<<blocks, kRowThreads, 0, stream>>>(
                yb, rstd, nullptr, xo, ab, bb, wb, N, C, eps, amax);
    }
    LATHE_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(bf16* dx, float* dweight, const bf16* dy, const bf16* x, const bf16* weight,
                      const float* rstd, int64_t N, int64_t C, bool dx_accumulate, CudaState& state,
                      CUstream_st* stream) {
    if (N == 0) return;
    auto* dxb = reinterpret_cast<__nv_bfloat16*>(dx);
    const auto* dyb = reinterpret_cast<const __nv_bfloat16*>(dy);
    const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    const auto* wb = reinterpret_cast<const __nv_bfloat16*>(weight);
    const bool vec = vec8_ok(C, {dx, dy, x, weight});
    const int groups = vec && dweight != nullptr ? norm_fused_groups(C) : 0;
    if (groups > 0) {
        // One pass: dx and the partials; then pass 2 of the column reduction.
        const int64_t R = fused_norm_chunks(N, C);
        float* partials =
            static_cast<float*>(state.scratch(size_t(R * C) * sizeof(float), "rmsnorm_backward"));
        const int64_t rows = column_reduce_rows_per_chunk(N, R);
        auto launch = [&](auto kernel, size_t smem) {
            allow_dynamic_smem(kernel, smem);
            kernel<<<unsigned(R), kColumnThreads, smem, stream>>>(dxb, partials, dyb, xb, wb, rstd,
                                                                  N, C, R, rows, dx_accumulate);
        };
        switch (groups) {
            case 1:
                launch(rmsnorm_backward_fused_kernel<1>, fused_acc_bytes<1, 1>);
                break;
            case 2:
                launch(rmsnorm_backward_fused_kernel<2>, fused_acc_bytes<1, 2>);
                break;
            case 3:
                launch(rmsnorm_backward_fused_kernel<3>, fused_acc_bytes<1, 3>);
                break;
            case 4:
                launch(rmsnorm_backward_fused_kernel<4>, fused_acc_bytes<1, 4>);
                break;
            case 6:
                launch(rmsnorm_backward_fused_kernel<6>, fused_acc_bytes<1, 6>);
                break;
            default:
                launch(rmsnorm_backward_fused_kernel<8>, fused_acc_bytes<1, 8>);
                break;
        }
        LATHE_CUDA_CHECK_LAUNCH();
        column_partials_accumulate(dweight, partials, R, C, stream);
        return;
    }
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    if (vec)
        rmsnorm_backward_dx_warp_per_row_kernel<8>
            <<<blocks, kRowThreads, 0, stream>>>(dxb, dyb, xb, wb, rstd, N, C, dx_accumulate);
    else
        rmsnorm_backward_dx_warp_per_row_kernel<1>
            <<<blocks, kRowThreads, 0, stream>>>(dxb, dyb, xb, wb, rstd, N, C, dx_accumulate);
    LATHE_CUDA_CHECK_LAUNCH();
    if (dweight == nullptr) return;
    const int64_t R = column_reduce_chunks(N, C);
    float* partials =
        static_cast<float*>(state.scratch(size_t(R * C) * sizeof(float), "rmsnorm_backward"));
    launch_column_partials<1>(partials, 1u, RmsnormDweightRows{dyb, xb, rstd, C}, vec, N, C, R,
                              stream);
    LATHE_CUDA_CHECK_LAUNCH();
    column_partials_accumulate(dweight, partials, R, C, stream);
}

}  // namespace lathe::cuda
