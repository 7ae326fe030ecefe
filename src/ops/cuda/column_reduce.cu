// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/column_reduce.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kPartialThreads = 128;
constexpr int kReduceThreads = 256;

// One thread per kVec consecutive columns and one chunk of rows (blockIdx.y).
template <int kVec>
__global__ void column_sum_partials_kernel(float* __restrict__ partials,
                                           const __nv_bfloat16* __restrict__ src, int64_t N,
                                           int64_t C, int64_t rows_per_chunk) {
    const int64_t c0 = (int64_t(blockIdx.x) * kPartialThreads + threadIdx.x) * kVec;
    if (c0 >= C) return;
    const int64_t r = blockIdx.y;
    const int64_t n_begin = r * rows_per_chunk;
    const int64_t n_end = min(N, n_begin + rows_per_chunk);
    float acc[kVec] = {};
    for (int64_t n = n_begin; n < n_end; ++n) {
        float v[kVec];
        load_bf16<kVec>(v, src + n * C + c0);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] += v[i];
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) partials[r * C + c0 + i] = acc[i];
}

__global__ void column_partials_accumulate_kernel(float* __restrict__ dst,
                                                  const float* __restrict__ partials, int64_t R,
                                                  int64_t C) {
    const int64_t c = int64_t(blockIdx.x) * kReduceThreads + threadIdx.x;
    if (c >= C) return;
    float sum = 0.0f;
    for (int64_t r = 0; r < R; ++r) sum += partials[r * C + c];
    dst[c] += sum;
}

}  // namespace

void column_partials_accumulate(float* dst, const float* partials, int64_t R, int64_t C,
                                CUstream_st* stream) {
    if (C == 0) return;
    column_partials_accumulate_kernel<<<blocks_for(C, kReduceThreads, INT32_MAX), kReduceThreads, 0,
                                        stream>>>(dst, partials, R, C);
    LATHE_CUDA_CHECK_LAUNCH();
}

void column_sum_bf16_accumulate(CudaState& state, CUstream_st* stream, float* dst, const bf16* src,
                                int64_t N, int64_t C, const char* op) {
    if (N == 0 || C == 0) return;
    const int64_t R = column_reduce_chunks(N);
    float* partials = static_cast<float*>(state.scratch(size_t(R * C) * sizeof(float), op));
    const int64_t rows = column_reduce_rows_per_chunk(N, R);
    const auto* s = reinterpret_cast<const __nv_bfloat16*>(src);
    if (vec8_ok(C, {src})) {
        const dim3 grid(blocks_for(C / 8, kPartialThreads, INT32_MAX), unsigned(R));
        column_sum_partials_kernel<8>
            <<<grid, kPartialThreads, 0, stream>>>(partials, s, N, C, rows);
    } else {
        const dim3 grid(blocks_for(C, kPartialThreads, INT32_MAX), unsigned(R));
        column_sum_partials_kernel<1>
            <<<grid, kPartialThreads, 0, stream>>>(partials, s, N, C, rows);
    }
    LATHE_CUDA_CHECK_LAUNCH();
    column_partials_accumulate(dst, partials, R, C, stream);
}

}  // namespace lathe::cuda
