// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/vocab_parallel.h"

namespace lathe::cuda {

namespace {

constexpr int32_t kIgnore = -100;  // ops/lm_head_cross_entropy.h's kIgnoreIndex
constexpr int kThreads = 256;
constexpr int kMeanThreads = 1024;

__global__ void vocab_shard_ids_kernel(int32_t* __restrict__ local, const int32_t* __restrict__ ids,
                                       int64_t N, int64_t begin, int64_t V, int64_t total) {
    for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
         n += int64_t(gridDim.x) * blockDim.x) {
        const int64_t id = ids[n];
        LATHE_DEVICE_CHECK(id >= 0 && id < total, "id %lld at row %lld, vocabulary %lld",
                           (long long)id, (long long)n, (long long)total);
        const int64_t i = id - begin;
        local[n] = i >= 0 && i < V ? int32_t(i) : 0;
    }
}

// One thread per element of x (N, C).
__global__ void vocab_shard_zero_rows_kernel(__nv_bfloat16* __restrict__ x,
                                             const int32_t* __restrict__ ids, int64_t N, int64_t C,
                                             int64_t begin, int64_t V) {
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < N * C;
         k += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = int64_t(ids[k / C]) - begin;
        if (i < 0 || i >= V) x[k] = __float2bfloat16_rn(0.0f);
    }
}

__global__ void ce_vocab_parallel_prepare_kernel(float* __restrict__ work,
                                                 const float* __restrict__ lse,
                                                 const float* __restrict__ losses, int64_t N) {
    for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
         n += int64_t(gridDim.x) * blockDim.x) {
        work[n] = lse[n];
        work[2 * N + n] = lse[n] - losses[n];
    }
}

__global__ void ce_vocab_parallel_exp_kernel(float* __restrict__ work,
                                             const float* __restrict__ lse, int64_t N) {
    for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
         n += int64_t(gridDim.x) * blockDim.x)
        work[N + n] = expf(lse[n] - work[n]);
}

__global__ void ce_vocab_parallel_rows_kernel(float* __restrict__ losses, float* __restrict__ lse,
                                              const int32_t* __restrict__ targets,
                                              const float* __restrict__ work, int64_t N) {
    for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
         n += int64_t(gridDim.x) * blockDim.x) {
        const float l = work[n] + logf(work[N + n]);
        lse[n] = l;
        losses[n] = targets[n] == kIgnore ? 0.0f : l - work[2 * N + n];
    }
}

// loss = sum_n losses[n] / count(targets != -100): one block, fp64, fixed order.
__global__ void ce_vocab_parallel_mean_kernel(float* __restrict__ loss,
                                              const float* __restrict__ losses,
                                              const int32_t* __restrict__ targets, int64_t N) {
    __shared__ double dsmem[32];
    __shared__ int ismem[32];
    double s = 0.0;
    int c = 0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        s += double(losses[n]);
        c += targets[n] == kIgnore ? 0 : 1;
    }
    s = block_sum(s, dsmem);
    c = block_sum(c, ismem);
    if (threadIdx.x == 0) *loss = c == 0 ? 0.0f : float(s / double(c));
}

}  // namespace

void vocab_shard_ids(int32_t* local, const int32_t* ids, int64_t N, int64_t begin, int64_t V,
                     int64_t total, CUstream_st* stream) {
    if (N == 0) return;
    vocab_shard_ids_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(local, ids, N, begin,
                                                                             V, total);
    LATHE_CUDA_CHECK_LAUNCH();
}

void vocab_shard_zero_rows(bf16* x, const int32_t* ids, int64_t N, int64_t C, int64_t begin,
                           int64_t V, CUstream_st* stream) {
    if (N * C == 0) return;
    vocab_shard_zero_rows_kernel<<<blocks_for(N * C, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(x), ids, N, C, begin, V);
    LATHE_CUDA_CHECK_LAUNCH();
}

void cross_entropy_vocab_parallel_prepare(float* work, const float* lse, const float* losses,
                                          int64_t N, CUstream_st* stream) {
    if (N == 0) return;
    ce_vocab_parallel_prepare_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(work, lse,
                                                                                       losses, N);
    LATHE_CUDA_CHECK_LAUNCH();
}

void cross_entropy_vocab_parallel_exp(float* work, const float* lse, int64_t N,
                                      CUstream_st* stream) {
    if (N == 0) return;
    ce_vocab_parallel_exp_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(work, lse, N);
    LATHE_CUDA_CHECK_LAUNCH();
}

void cross_entropy_vocab_parallel_finish(float* loss, float* losses, float* lse,
                                         const int32_t* targets, const float* work, int64_t N,
                                         CUstream_st* stream) {
    if (N > 0) {
        ce_vocab_parallel_rows_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(
            losses, lse, targets, work, N);
        LATHE_CUDA_CHECK_LAUNCH();
    }
    ce_vocab_parallel_mean_kernel<<<1, kMeanThreads, 0, stream>>>(loss, losses, targets, N);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace lathe::cuda
