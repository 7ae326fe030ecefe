// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kGemvWarps = 4;  // warps of a block, splitting K
constexpr int kGemvThreads = kGemvWarps * kWarpSize;
constexpr int kGemvCols = 4;  // weight rows (output columns) of a block: each x chunk read
                              // from L1 serves this many weight chunks
constexpr int kChunk = 8;     // bf16 elements of one 16-byte load

// A 16-byte load of weight bytes that are read once: through the non-coherent path without
// allocating in L1, which keeps L1 for x (read by every block).
__device__ __forceinline__ uint4 load_streamed(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// 8 bf16 (one 16-byte chunk) widened to fp32: a bf16 is the top half of its fp32.
__device__ __forceinline__ void widen8(float (&f)[kChunk], const uint4& raw) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}

// y[m, n0 + c] for the block's kGemvCols rows n0.. of weight. kMaxRows >= M: the sums' register
// array (rows m >= M are skipped, uniformly across the block). kUnroll: chunks per weight row a
// thread loads before it multiplies, so kUnroll x kGemvCols loads of 16 bytes are in flight.
template <int kMaxRows, int kUnroll>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(__nv_bfloat16* y, const __nv_bfloat16* __restrict__ x,
                const __nv_bfloat16* __restrict__ weight, const __nv_bfloat16* __restrict__ bias,
                const __nv_bfloat16* residual, int M, int K, int N) {
    // y and residual may be one buffer (gemv.h): neither is __restrict__.
    __shared__ float partial[kGemvWarps][kMaxRows][kGemvCols];
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int64_t n0 = int64_t(blockIdx.x) * kGemvCols;
    const int chunks = K / kChunk;
    // Rows past N (the last block) read row N - 1 again; their sums are not stored.
    const uint4* wrow[kGemvCols];
#pragma unroll
    for (int c = 0; c < kGemvCols; ++c) {
        const int64_t n = n0 + c < N ? n0 + c : int64_t(N) - 1;
        wrow[c] = reinterpret_cast<const uint4*>(weight + n * K);
    }
    const uint4* xrow = reinterpret_cast<const uint4*>(x);

    float acc[kMaxRows][kGemvCols];
#pragma unroll
    for (int m = 0; m < kMaxRows; ++m)
#pragma unroll
        for (int c = 0; c < kGemvCols; ++c) acc[m][c] = 0.0f;

    for (int base = threadIdx.x; base < chunks; base += kGemvThreads * kUnroll) {
        uint4 wv[kUnroll][kGemvCols];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int k = base + u * kGemvThreads;
#pragma unroll
            for (int c = 0; c < kGemvCols; ++c)
                wv[u][c] = k < chunks ? load_streamed(wrow[c] + k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int k = base + u * kGemvThreads;
            if (k >= chunks) break;
            float wf[kGemvCols][kChunk];
#pragma unroll
            for (int c = 0; c < kGemvCols; ++c) widen8(wf[c], wv[u][c]);
#pragma unroll
            for (int m = 0; m < kMaxRows; ++m) {
                if (m >= M) break;
                float xf[kChunk];
                widen8(xf, __ldg(xrow + int64_t(m) * chunks + k));
#pragma unroll
                for (int c = 0; c < kGemvCols; ++c)
#pragma unroll
                    for (int e = 0; e < kChunk; ++e) acc[m][c] = fmaf(xf[e], wf[c][e], acc[m][c]);
            }
        }
    }

#pragma unroll
    for (int m = 0; m < kMaxRows; ++m) {
        if (m >= M) break;
#pragma unroll
        for (int c = 0; c < kGemvCols; ++c) {
            const float s = warp_sum(acc[m][c]);
            if (lane == 0) partial[warp][m][c] = s;
        }
    }
    __syncthreads();
    const int t = threadIdx.x;
    if (t < kMaxRows * kGemvCols) {
        const int m = t / kGemvCols, c = t % kGemvCols;
        const int64_t n = n0 + c;
        if (m < M && n < N) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < kGemvWarps; ++w) s += partial[w][m][c];
            if (bias != nullptr) s += __bfloat162float(bias[n]);
            const int64_t at = int64_t(m) * N + n;
            if (residual != nullptr) s += __bfloat162float(residual[at]);
            y[at] = __float2bfloat16_rn(s);
        }
    }
}

template <int kMaxRows, int kUnroll>
void launch(bf16* y, const bf16* x, const bf16* weight, const bf16* bias, const bf16* residual,
            int64_t M, int64_t K, int64_t N, CUstream_st* stream) {
    const int64_t blocks = (N + kGemvCols - 1) / kGemvCols;
    LATHE_CHECK(blocks < (int64_t(1) << 31), "gemv_forward: N {} too large", N);
    gemv_kernel<kMaxRows, kUnroll><<<unsigned(blocks), kGemvThreads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(y), reinterpret_cast<const __nv_bfloat16*>(x),
        reinterpret_cast<const __nv_bfloat16*>(weight),
        reinterpret_cast<const __nv_bfloat16*>(bias),
        reinterpret_cast<const __nv_bfloat16*>(residual), int(M), int(K), int(N));
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gemv_forward(bf16* y, const bf16* x, const bf16* weight, const bf16* bias,
                  const bf16* residual, int64_t M, int64_t K, int64_t N, CUstream_st* stream) {
    LATHE_CHECK(gemv_supports(M, K, N, x, weight),
                "gemv_forward: M {} K {} N {} (x {}, weight {}) outside gemv_supports", M, K, N,
                static_cast<const void*>(x), static_cast<const void*>(weight));
    // Registers: M x kGemvCols sums plus kUnroll x kGemvCols x 4 words of loads in flight; at
    // 8 and 16 rows the sums take the room of the deeper unroll.
    if (M <= 1)
        launch<1, 4>(y, x, weight, bias, residual, M, K, N, stream);
    else if (M <= 2)
        launch<2, 4>(y, x, weight, bias, residual, M, K, N, stream);
    else if (M <= 4)
        launch<4, 4>(y, x, weight, bias, residual, M, K, N, stream);
    else if (M <= 8)
        launch<8, 2>(y, x, weight, bias, residual, M, K, N, stream);
    else
        launch<16, 2>(y, x, weight, bias, residual, M, K, N, stream);
}

}  // namespace lathe::cuda
