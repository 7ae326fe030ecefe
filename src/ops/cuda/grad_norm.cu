// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/grad_norm.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kElemsPerBlock = 64 * 1024;  // a tensor of n elements gets ceil(n / this) blocks
constexpr int64_t kMaxBlocksPerTensor = 1024;
constexpr int kFinalThreads = 1024;

__global__ void sum_of_squares_partials_kernel(double* __restrict__ partials,
                                               const float* __restrict__ g, int64_t n) {
    __shared__ double smem[32];
    double s = 0.0;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        const double v = g[i];
        s += v * v;
    }
    s = block_sum(s, smem);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void norm_from_partials_kernel(float* __restrict__ norm,
                                          const double* __restrict__ partials, int64_t count) {
    __shared__ double smem[32];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
    s = block_sum(s, smem);
    if (threadIdx.x == 0) *norm = float(sqrt(s));
}

// torch's fp32 arithmetic: coef = max_norm / (norm + 1e-6), applied only when below 1.
__global__ void grad_scale_by_norm_kernel(float* __restrict__ g, int64_t n,
                                          const float* __restrict__ norm, float max_norm) {
    const float total = *norm;
    if (!isfinite(total)) return;  // the trainer skips the step; keep the gradients as evidence
    const float coef = fminf(__fdiv_rn(max_norm, __fadd_rn(total, 1e-6f)), 1.0f);
    if (coef >= 1.0f) return;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        g[i] = __fmul_rn(g[i], coef);
}

int64_t blocks_of(int64_t n) {
    const int64_t b = (n + kElemsPerBlock - 1) / kElemsPerBlock;
    return b < kMaxBlocksPerTensor ? b : kMaxBlocksPerTensor;
}

}  // namespace

void grad_norm_l2(float* norm, std::span<const ConstGradSpan> grads, CudaState& state,
                  CUstream_st* stream) {
    int64_t total_blocks = 0;
    for (const ConstGradSpan& t : grads) total_blocks += blocks_of(t.count);
    double* partials = static_cast<double*>(state.scratch(
        size_t(total_blocks > 0 ? total_blocks : 1) * sizeof(double), "grad_norm_l2"));
    int64_t offset = 0;
    for (const ConstGradSpan& t : grads) {
        const int64_t blocks = blocks_of(t.count);
        if (blocks == 0) continue;
        sum_of_squares_partials_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(partials + offset,
                                                                                  t.data, t.count);
        LATHE_CUDA_CHECK_LAUNCH();
        offset += blocks;
    }
    norm_from_partials_kernel<<<1, kFinalThreads, 0, stream>>>(norm, partials, offset);
    LATHE_CUDA_CHECK_LAUNCH();
}

void grad_clip_by_norm(std::span<const GradSpan> grads, const float* norm, float max_norm,
                       CUstream_st* stream) {
    for (const GradSpan& t : grads) {
        if (t.count == 0) continue;
        grad_scale_by_norm_kernel<<<blocks_for(t.count, int64_t(kThreads) * 8), kThreads, 0,
                                    stream>>>(t.data, t.count, norm, max_norm);
        LATHE_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace lathe::cuda
