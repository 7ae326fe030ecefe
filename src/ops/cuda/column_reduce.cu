// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/column_reduce.cuh"
#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kReduceColumns = 8;  // pass 2: columns per block (one 32-byte sector per row)
constexpr int kReduceGroups = 32;  // pass 2: row groups per column
constexpr int kReduceThreads = kReduceColumns * kReduceGroups;

// f = src: a bias gradient's rows.
struct ColumnSumRows {
    const __nv_bfloat16* __restrict__ src;
    int64_t C;
    template <int kVec>
    __device__ __forceinline__ void operator()(int64_t n, int64_t c, float (&v)[1][kVec]) const {
        load_bf16<kVec>(v[0], src + n * C + c);
    }
};

// Thread (g, j) of a block adds partials r = g, g + kReduceGroups, ... of column
// kReduceColumns * blockIdx.x + j in order of r; thread (0, j) adds the group sums in group order.
// blockIdx.y picks the array: dst0 from partials, dst1 from partials + R * C.
__global__ void __launch_bounds__(kReduceThreads)
    column_partials_accumulate_kernel(float* __restrict__ dst0, float* __restrict__ dst1,
                                      const float* __restrict__ partials, int64_t R, int64_t C) {
    __shared__ float smem[kReduceGroups][kReduceColumns];
    const bool second = blockIdx.y == 1 || dst0 == nullptr;  // (grid.y is 1 when one is null)
    float* dst = second ? dst1 : dst0;
    if (second) partials += R * C;
    const int j = threadIdx.x % kReduceColumns, g = threadIdx.x / kReduceColumns;
    const int64_t c = int64_t(blockIdx.x) * kReduceColumns + j;
    float sum = 0.0f;
    if (c < C) {
#pragma unroll 8
        for (int64_t r = g; r < R; r += kReduceGroups) sum += partials[r * C + c];
    }
    smem[g][j] = sum;
    __syncthreads();
    if (g != 0 || c >= C) return;
    float total = smem[0][j];
#pragma unroll
    for (int i = 1; i < kReduceGroups; ++i) total += smem[i][j];
    dst[c] += total;
}

}  // namespace

void column_partials_accumulate(float* dst, const float* partials, int64_t R, int64_t C,
                                CUstream_st* stream) {
    column_partials_accumulate2(dst, nullptr, partials, R, C, stream);
}

void column_partials_accumulate2(float* dst0, float* dst1, const float* partials, int64_t R,
                                 int64_t C, CUstream_st* stream) {
    const unsigned arrays = (dst0 ? 1u : 0u) + (dst1 ? 1u : 0u);
    if (C == 0 || arrays == 0) return;
    const dim3 grid(blocks_for(C, kReduceColumns, INT32_MAX), arrays);
    column_partials_accumulate_kernel<<<grid, kReduceThreads, 0, stream>>>(dst0, dst1, partials, R,
                                                                           C);
    LATHE_CUDA_CHECK_LAUNCH();
}

void column_sum_bf16_accumulate(float* dst, const bf16* src, int64_t N, int64_t C, const char* op,
                                CudaState& state, CUstream_st* stream) {
    if (N == 0 || C == 0) return;
    const int64_t R = column_reduce_chunks(N, C);
    float* partials = static_cast<float*>(state.scratch(size_t(R * C) * sizeof(float), op));
    const ColumnSumRows rows{reinterpret_cast<const __nv_bfloat16*>(src), C};
    launch_column_partials<1>(partials, 1u, rows, vec8_ok(C, {src}), N, C, R, stream);
    LATHE_CUDA_CHECK_LAUNCH();
    column_partials_accumulate(dst, partials, R, C, stream);
}

}  // namespace lathe::cuda
