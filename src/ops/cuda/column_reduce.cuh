#pragma once
// Device side of the deterministic column reduction (column_reduce.h has the plan): the pass-1
// kernel, generic over what a row contributes, so the bias gradient and the norm weight gradients
// share one tiling and one summation order. Internal to .cu files.
//
// Block (t, r) owns the column tile [256 t, 256 t + 256) and row chunk r (rows_per_chunk rows).
// Its 8 warps split the chunk's rows round-robin: warp w adds rows n_begin + w, n_begin + w + 8,
// ... in increasing order into per-lane registers; then the 8 warp sums of each column are added
// in warp order through shared memory and written as the chunk's partial. Each column's order of
// additions is thus fixed by (N, C) alone: the 16-byte path (a lane owns 8 adjacent columns, one
// 512-byte row slice per warp load) and the scalar path (a lane owns columns lane + 32 j) add the
// same numbers in the same order, so they give the same bits too.

#include "ops/cuda/column_reduce.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

inline constexpr int kColumnWarps = 8;
inline constexpr int kColumnThreads = kColumnWarps * kWarpSize;
static_assert(kColumnTile == kWarpSize * 8, "a lane owns 8 columns of a tile");

// Pass 1. `Rows` is a trivially copyable functor:
//   __device__ void operator()(int64_t n, int64_t c, float (&v)[kOut][kVec]) const
// writes row n's contribution to columns c .. c + kVec - 1 of each of the kOut outputs
// (c % 8 == 0 and the row's pointers 16-byte aligned when kVec == 8). Partials of output k go to
// partials[k * R * C + r * C + c] (k < kOut); an output whose `keep` bit is clear is not written.
template <int kVec, int kOut, typename Rows>
__global__ void __launch_bounds__(kColumnThreads)
    column_partials_kernel(float* __restrict__ partials, unsigned keep, Rows rows, int64_t N,
                           int64_t C, int64_t R, int64_t rows_per_chunk) {
    static_assert(kVec == 1 || kVec == 8, "kVec is 1 or 8");
    constexpr int kGroups = 8 / kVec;  // column groups per lane
    __shared__ float smem[kOut][kColumnWarps][kColumnTile];
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int64_t tile0 = int64_t(blockIdx.x) * kColumnTile;
    const int64_t r = blockIdx.y;
    const int64_t n_begin = r * rows_per_chunk;
    const int64_t n_end = min(N, n_begin + rows_per_chunk);
    // Column (within the tile) of group g, element i of this lane.
    auto col = [&](int g, int i) -> int { return kVec == 8 ? lane * 8 + i : lane + kWarpSize * g; };
    float acc[kOut][8];
#pragma unroll
    for (int k = 0; k < kOut; ++k)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[k][i] = 0.0f;
            // Rows of this warp: n_begin + warp + kColumnWarps * j. Unrolled so several rows' loads
            // are in flight; the additions stay in row order.
#pragma unroll 4
    for (int64_t n = n_begin + warp; n < n_end; n += kColumnWarps) {
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
            const int64_t c = tile0 + col(g, 0);
            if (c + kVec > C) continue;  // kVec == 8: C % 8 == 0, so a group is all in or out
            float v[kOut][kVec];
            rows(n, c, v);
#pragma unroll
            for (int k = 0; k < kOut; ++k)
#pragma unroll
                for (int i = 0; i < kVec; ++i) acc[k][g * kVec + i] += v[k][i];
        }
    }
#pragma unroll
    for (int k = 0; k < kOut; ++k)
#pragma unroll
        for (int g = 0; g < kGroups; ++g)
#pragma unroll
            for (int i = 0; i < kVec; ++i) smem[k][warp][col(g, i)] = acc[k][g * kVec + i];
    __syncthreads();
    // Thread t finishes column tile0 + t: the 8 warp sums in warp order.
    const int t = threadIdx.x;
    const int64_t c = tile0 + t;
    if (c >= C) return;
#pragma unroll
    for (int k = 0; k < kOut; ++k) {
        if (!(keep & (1u << k))) continue;
        float s = smem[k][0][t];
#pragma unroll
        for (int w = 1; w < kColumnWarps; ++w) s += smem[k][w][t];
        partials[k * R * C + r * C + c] = s;
    }
}

// Launches pass 1 over the (R, C) plan of column_reduce_chunks(N, C): the 16-byte path when
// `vec` (C % 8 == 0 and every row pointer of `rows` 16-byte aligned), the scalar one otherwise.
template <int kOut, typename Rows>
void launch_column_partials(float* partials, unsigned keep, const Rows& rows, bool vec, int64_t N,
                            int64_t C, int64_t R, CUstream_st* stream) {
    const dim3 grid(unsigned((C + kColumnTile - 1) / kColumnTile), unsigned(R));
    const int64_t per_chunk = column_reduce_rows_per_chunk(N, R);
    if (vec)
        column_partials_kernel<8, kOut>
            <<<grid, kColumnThreads, 0, stream>>>(partials, keep, rows, N, C, R, per_chunk);
    else
        column_partials_kernel<1, kOut>
            <<<grid, kColumnThreads, 0, stream>>>(partials, keep, rows, N, C, R, per_chunk);
}

// Fused norm backwards (layernorm.cu, rmsnorm.cu): one block per row chunk of the
// fused_norm_chunks(N) plan covers all C columns, each warp a row at a time (the row's statistics
// need the whole row), keeping the row's x and dy in registers as packed bf16 and its own
// column sums in shared memory (fused_acc_* below): kGroups 256-column groups per warp,
// C <= 256 kGroups, C % 8 == 0.
// The instantiated group counts; norm_fused_groups(C) picks one, or 0 (two-kernel path).
inline int norm_fused_groups(int64_t C) {
    const int64_t g = (C + kColumnTile - 1) / kColumnTile;
    if (C % 8 != 0 || g > 8) return 0;
    if (g <= 4) return int(g < 1 ? 1 : g);
    return g <= 6 ? 6 : 8;
}

// R of the fused plan: chunks of at least 32 rows (4 per warp), at most kMaxRowChunks, within
// the scratch's kMaxPartialArrays arrays. Depends on N and C only.
inline int64_t fused_norm_chunks(int64_t N, int64_t C) {
    int64_t r = (N + 31) / 32;
    if (r > kMaxRowChunks) r = kMaxRowChunks;
    const int64_t by_scratch = C > 0 ? kScratchFloats / (kMaxPartialArrays * C) : r;
    if (r > by_scratch) r = by_scratch;
    return r < 1 ? 1 : r;
}

// 8 packed bf16 (one 16-byte load) to fp32.
__device__ __forceinline__ void unpack_bf16x8(float (&out)[8], const uint4& raw) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

// The fused kernels' column sums in shared memory, not registers: kOut x kGroups x 8 floats a
// thread held the norm backward at one block of 8 warps per SM at C = 2048 (178 registers), too
// few rows in flight to stream at the memory's bandwidth. `acc` is the block's dynamic shared
// memory, fused_acc_bytes<kOut, kGroups> of it: warp w's sum of column 256 g + j of output k at
// acc[((w * kOut + k) * kGroups + g) * 256 + j]. Each lane reads and writes only its own 8
// columns of its warp's sums until the epilogue, so the adds need no barrier, and every sum is the
// same chain of fp32 additions as in registers.
template <int kOut, int kGroups>
inline constexpr size_t fused_acc_bytes = size_t(kColumnWarps) * kOut* kGroups* kColumnTile *
                                          sizeof(float);

template <int kOut, int kGroups>
__device__ __forceinline__ float4* fused_acc_lane(float* acc, int k, int g) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    return reinterpret_cast<float4*>(acc + ((warp * kOut + k) * kGroups + g) * kColumnTile +
                                     lane * 8);
}

// Zeroes this lane's sums.
template <int kOut, int kGroups>
__device__ __forceinline__ void fused_acc_zero(float* acc) {
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < kOut; ++k)
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
            float4* p = fused_acc_lane<kOut, kGroups>(acc, k, g);
            p[0] = zero;
            p[1] = zero;
        }
}

// Adds v to this lane's sums of columns 256 g + 8 lane + i of output k.
template <int kOut, int kGroups>
__device__ __forceinline__ void fused_acc_add(float* acc, int k, int g, const float (&v)[8]) {
    float4* p = fused_acc_lane<kOut, kGroups>(acc, k, g);
    float4 a = p[0], b = p[1];
    a.x += v[0], a.y += v[1], a.z += v[2], a.w += v[3];
    b.x += v[4], b.y += v[5], b.z += v[6], b.w += v[7];
    p[0] = a;
    p[1] = b;
}

// The epilogue of the sums in shared memory: adds the 8 warps' sums of each column in warp order
// and writes the chunk's partial of output k to partials[k * R * C + r * C + c] where keep bit k is
// set. Every thread calls it.
template <int kOut, int kGroups>
__device__ __forceinline__ void fused_acc_epilogue(float* __restrict__ partials, unsigned keep,
                                                   const float* acc, int64_t C, int64_t R,
                                                   int64_t r) {
    __syncthreads();
    const int t = threadIdx.x;
#pragma unroll
    for (int k = 0; k < kOut; ++k) {
        if (!(keep & (1u << k))) continue;
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
            const int64_t c = int64_t(g) * kColumnTile + t;
            if (c >= C) continue;
            float s = acc[(k * kGroups + g) * kColumnTile + t];
#pragma unroll
            for (int w = 1; w < kColumnWarps; ++w)
                s += acc[((w * kOut + k) * kGroups + g) * kColumnTile + t];
            partials[k * R * C + r * C + c] = s;
        }
    }
}

}  // namespace lathe::cuda
