// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <algorithm>

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/lm_head_cross_entropy.h"

namespace lathe::cuda {

namespace {

constexpr int32_t kIgnore = -100;  // ops/lm_head_cross_entropy.h's kIgnoreIndex
constexpr int kRowThreads = 512;
constexpr int kReduceThreads = 1024;
constexpr size_t kCountBytes = 256;  // the count's slot at the start of the scratch

// count[0] = number of targets != -100; every other target must index the vocabulary.
__global__ void cross_entropy_count_kernel(int* __restrict__ count,
                                           const int32_t* __restrict__ targets, int64_t N,
                                           int64_t V) {
    __shared__ int smem[32];
    int c = 0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        const int32_t t = targets[n];
        if (t == kIgnore) continue;
        LATHE_DEVICE_CHECK(t >= 0 && t < V, "target %d at row %lld, vocabulary %lld", int(t),
                           (long long)n, (long long)V);
        ++c;
    }
    c = block_sum(c, smem);
    if (threadIdx.x == 0) *count = c;
}

// One block per row of the chunk (global row n = row0 + blockIdx.x), logits row of V floats.
// Forward (lse_in null): lse and loss of the row. Backward (write_dlogits): bf16 dlogits over
// the row's first 2V bytes, from lse_in or the lse just computed.
__global__ void cross_entropy_block_per_row_kernel(
    float* __restrict__ logits, int64_t V, int64_t row0, const int32_t* __restrict__ targets,
    const float* __restrict__ lse_in, float* __restrict__ lse_out, float* __restrict__ losses,
    const int* __restrict__ count, float dloss, bool write_dlogits) {
    __shared__ float smem[32];
    const int64_t n = row0 + blockIdx.x;
    float* row = logits + int64_t(blockIdx.x) * V;
    const int32_t target = targets[n];
    const bool ignored = target == kIgnore;
    float lse;
    if (lse_in != nullptr) {
        lse = lse_in[n];
    } else {
        // Per-thread running max and sum of exp(l - max), then one fixed-order block reduction.
        float m = -INFINITY, s = 0.0f;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
            const float l = row[v];
            if (l > m) {
                s = s * expf(m - l) + 1.0f;
                m = l;
            } else {
                s += expf(l - m);
            }
        }
        const float row_max = block_max(m, smem);
        s = m == -INFINITY ? 0.0f : s * expf(m - row_max);
        const float sum = block_sum(s, smem);
        lse = row_max + logf(sum);
        if (threadIdx.x == 0) {
            lse_out[n] = lse;
            if (losses != nullptr) losses[n] = ignored ? 0.0f : lse - row[target];
        }
    }
    if (!write_dlogits) return;
    const int total = *count;
    const float scale = ignored || total == 0 ? 0.0f : float(double(dloss) / double(total));
    __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(row);
    for (int64_t base = 0; base < V; base += blockDim.x) {
        const int64_t v = base + threadIdx.x;
        const float l = v < V ? row[v] : 0.0f;
        // Every f32 logit this tile's bf16 writes overlap (elements < base + blockDim.x) has been
        // read by now, in this tile or an earlier one.
        __syncthreads();
        if (v < V) {
            const float d = scale * expf(l - lse) - (v == target ? scale : 0.0f);
            out[v] = __float2bfloat16_rn(d);
        }
    }
}

// loss[0] = sum_n losses[n] / count (0 when count is 0), the sum in fp64 in a fixed order.
__global__ void cross_entropy_mean_kernel(float* __restrict__ loss,
                                          const float* __restrict__ losses,
                                          const int* __restrict__ count, int64_t N) {
    __shared__ double smem[32];
    double s = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) s += double(losses[n]);
    s = block_sum(s, smem);
    if (threadIdx.x == 0) *loss = *count == 0 ? 0.0f : float(s / double(*count));
}

struct ChunkWork {
    float* lse_out = nullptr;
    float* losses = nullptr;
    const float* lse_in = nullptr;
    bool backward = false;
    float dloss = 0.0f;
    __nv_bfloat16* dx = nullptr;
    float* dweight = nullptr;
};

void run_chunks(CudaState& state, CUstream_st* stream, const ChunkWork& w, const int* count,
                const bf16* x, const int32_t* targets, const bf16* weight, float* scratch,
                int64_t N, int64_t C, int64_t V, int64_t Nc) {
    for (int64_t r0 = 0; r0 < N; r0 += Nc) {
        const int64_t rows = std::min(Nc, N - r0);
        const bf16* xc = x + r0 * C;
        GemmArgs logits;  // (rows, V) f32 = x_chunk . weight^T
        logits.M = rows, logits.N = V, logits.K = C;
        logits.A = xc, logits.lda = C;
        logits.B = weight, logits.ldb = C, logits.trans_b = true;
        logits.D = scratch, logits.ldd = V, logits.d_dtype = DType::kF32;
        gemm_bf16(state, stream, logits);
        cross_entropy_block_per_row_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(
            scratch, V, r0, targets, w.lse_in, w.lse_out, w.losses, count, w.dloss, w.backward);
        LATHE_CUDA_CHECK_LAUNCH();
        if (!w.backward) continue;
        GemmArgs dx;  // (rows, C) bf16 = dlogits (rows, V; row stride 2V) . weight (V, C)
        dx.M = rows, dx.N = C, dx.K = V;
        dx.A = scratch, dx.lda = 2 * V;
        dx.B = weight, dx.ldb = C;
        dx.D = w.dx + r0 * C, dx.ldd = C, dx.d_dtype = DType::kBF16;
        gemm_bf16(state, stream, dx);
        if (w.dweight == nullptr) continue;
        GemmArgs dw;  // (V, C) f32 += dlogits^T (V, rows) . x_chunk (rows, C)
        dw.M = V, dw.N = C, dw.K = rows;
        dw.A = scratch, dw.lda = 2 * V, dw.trans_a = true;
        dw.B = xc, dw.ldb = C;
        dw.D = w.dweight, dw.ldd = C, dw.d_dtype = DType::kF32;
        dw.beta = 1.0f;
        gemm_bf16(state, stream, dw);
    }
}

// The count slot and, when asked, two N-float arrays from the state's scratch.
struct OpScratch {
    int* count;
    float* first;
    float* second;
};

OpScratch op_scratch(CudaState& state, int64_t N, int arrays, const char* op) {
    char* base = static_cast<char*>(state.scratch(kCountBytes + size_t(arrays * N) * 4, op));
    float* f = reinterpret_cast<float*>(base + kCountBytes);
    return {reinterpret_cast<int*>(base), f, f + N};
}

void count_targets(int* count, const int32_t* targets, int64_t N, int64_t V, CUstream_st* stream) {
    cross_entropy_count_kernel<<<1, kReduceThreads, 0, stream>>>(count, targets, N, V);
    LATHE_CUDA_CHECK_LAUNCH();
}

void mean_loss(float* loss, const float* losses, const int* count, int64_t N, CUstream_st* stream) {
    cross_entropy_mean_kernel<<<1, kReduceThreads, 0, stream>>>(loss, losses, count, N);
    LATHE_CUDA_CHECK_LAUNCH();
}

void check_sizes(const char* op, int64_t N, int64_t Nc) {
    LATHE_CHECK(N < INT32_MAX && Nc < INT32_MAX && Nc >= 1, "{}: N={} Nc={}", op, N, Nc);
}

}  // namespace

void lm_head_cross_entropy_forward(CudaState& state, CUstream_st* stream, float* loss,
                                   float* losses, float* lse, const bf16* x, const int32_t* targets,
                                   const bf16* weight, float* scratch, int64_t N, int64_t C,
                                   int64_t V, int64_t Nc) {
    constexpr const char* kOp = "lm_head_cross_entropy_forward";
    check_sizes(kOp, N, Nc);
    const OpScratch s = op_scratch(state, N, losses ? 0 : 1, kOp);
    count_targets(s.count, targets, N, V, stream);
    ChunkWork w;
    w.lse_out = lse;
    w.losses = losses ? losses : s.first;
    run_chunks(state, stream, w, s.count, x, targets, weight, scratch, N, C, V, Nc);
    mean_loss(loss, w.losses, s.count, N, stream);
}

void lm_head_cross_entropy_backward(CudaState& state, CUstream_st* stream, bf16* dx, float* dweight,
                                    const bf16* x, const int32_t* targets, const bf16* weight,
                                    const float* lse, float dloss, float* scratch, int64_t N,
                                    int64_t C, int64_t V, int64_t Nc) {
    constexpr const char* kOp = "lm_head_cross_entropy_backward";
    check_sizes(kOp, N, Nc);
    const OpScratch s = op_scratch(state, N, 0, kOp);
    count_targets(s.count, targets, N, V, stream);
    ChunkWork w;
    w.lse_in = lse;
    w.backward = true;
    w.dloss = dloss;
    w.dx = reinterpret_cast<__nv_bfloat16*>(dx);
    w.dweight = dweight;
    run_chunks(state, stream, w, s.count, x, targets, weight, scratch, N, C, V, Nc);
}

void lm_head_cross_entropy_forward_backward(CudaState& state, CUstream_st* stream, float* loss,
                                            float* losses, bf16* dx, float* dweight, const bf16* x,
                                            const int32_t* targets, const bf16* weight, float dloss,
                                            float* scratch, int64_t N, int64_t C, int64_t V,
                                            int64_t Nc) {
    constexpr const char* kOp = "lm_head_cross_entropy_forward_backward";
    check_sizes(kOp, N, Nc);
    const OpScratch s = op_scratch(state, N, 2, kOp);
    count_targets(s.count, targets, N, V, stream);
    ChunkWork w;
    w.lse_out = s.first;
    w.losses = losses ? losses : s.second;
    w.backward = true;
    w.dloss = dloss;
    w.dx = reinterpret_cast<__nv_bfloat16*>(dx);
    w.dweight = dweight;
    run_chunks(state, stream, w, s.count, x, targets, weight, scratch, N, C, V, Nc);
    mean_loss(loss, w.losses, s.count, N, stream);
}

}  // namespace lathe::cuda
