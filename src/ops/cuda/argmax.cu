// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <climits>

#include "core/check.h"
#include "ops/cuda/argmax.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 512;

// (value, index) with NaN as -inf; `a` wins over `b` when larger, or equal with a lower index.
struct Pick {
    float v;
    int i;
};

__device__ __forceinline__ Pick better(Pick a, Pick b) {
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

__device__ __forceinline__ float finite_or_minus_inf(float v) {
    return isnan(v) ? -INFINITY : v;
}

// One block per row. Each thread walks its elements in increasing index order (kVec at a time,
// strided by the block), keeping the first of equal maxima; then warp shuffles and one pass over
// the warps' picks, each combine taking the larger value or, on a tie, the lower index.
template <int kVec>
__global__ void argmax_rows_kernel(int32_t* __restrict__ ids, const __nv_bfloat16* __restrict__ x,
                                   int64_t V) {
    const __nv_bfloat16* row = x + int64_t(blockIdx.x) * V;
    Pick p{-INFINITY, INT_MAX};
    for (int64_t base = int64_t(threadIdx.x) * kVec; base < V; base += int64_t(blockDim.x) * kVec) {
        float v[kVec];
        load_bf16<kVec>(v, row + base);
#pragma unroll
        for (int k = 0; k < kVec; ++k)
            p = better(p, Pick{finite_or_minus_inf(v[k]), int(base + k)});
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const Pick o{__shfl_down_sync(0xffffffffu, p.v, off),
                     __shfl_down_sync(0xffffffffu, p.i, off)};
        p = better(p, o);
    }
    __shared__ Pick warp_pick[kThreads / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_pick[warp] = p;
    __syncthreads();
    if (threadIdx.x == 0) {
        Pick best = warp_pick[0];
        for (int w = 1; w < int(blockDim.x) / 32; ++w) best = better(best, warp_pick[w]);
        // A row of only -inf and NaN: every element ties at -inf and index 0 wins.
        ids[blockIdx.x] = best.i;
    }
}

}  // namespace

void argmax_rows(int32_t* ids, const bf16* x, int64_t N, int64_t V, CUstream_st* stream) {
    if (N == 0) return;
    LATHE_CHECK(V > 0 && V <= INT_MAX, "argmax_rows: V = {} is outside [1, 2^31)", V);
    const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    if (vec8_ok(V, {x}))
        argmax_rows_kernel<8><<<unsigned(N), kThreads, 0, stream>>>(ids, xb, V);
    else
        argmax_rows_kernel<1><<<unsigned(N), kThreads, 0, stream>>>(ids, xb, V);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace lathe::cuda
