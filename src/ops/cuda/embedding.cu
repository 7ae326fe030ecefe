// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kForwardThreads = 256;  // 8 warps, one row each
constexpr int kRowsPerBlock = kForwardThreads / kWarpSize;
constexpr int kBackwardThreads = 256;
constexpr int kBackwardWarps = kBackwardThreads / kWarpSize;
constexpr int64_t kTableRowsPerBlock = 64;
constexpr int64_t kColsPerBlock = 1024;

template <int kVec>
__global__ void embedding_forward_warp_per_row_kernel(
    __nv_bfloat16* __restrict__ out, const int32_t* __restrict__ tokens,
    const int32_t* __restrict__ positions, const __nv_bfloat16* __restrict__ wte,
    const __nv_bfloat16* __restrict__ wpe, int64_t N, int64_t T, int64_t C, int64_t V, int64_t P) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
    if (n >= N) return;
    const int64_t tok = tokens[n];
    LATHE_DEVICE_CHECK(tok >= 0 && tok < V, "token id %lld at row %lld, vocabulary %lld",
                       (long long)tok, (long long)n, (long long)V);
    const __nv_bfloat16* e = wte + tok * C;
    const __nv_bfloat16* p = nullptr;
    if (wpe != nullptr) {
        const int64_t pos = positions ? int64_t(positions[n]) : n % T;
        LATHE_DEVICE_CHECK(pos >= 0 && pos < P, "position %lld at row %lld, table %lld",
                           (long long)pos, (long long)n, (long long)P);
        p = wpe + pos * C;
    }
    for (int64_t c = int64_t(lane) * kVec; c < C; c += kWarpSize * kVec) {
        float v[kVec];
        load_bf16<kVec>(v, e + c);
        if (p != nullptr) {
            float w[kVec];
            load_bf16<kVec>(w, p + c);
#pragma unroll
            for (int i = 0; i < kVec; ++i) v[i] += w[i];
        }
        store_bf16<kVec>(out + n * C + c, v);
    }
}

// dtable[id(n), c] += dout[n, c] for the rows n whose id falls in this block's table chunk;
// id(n) = ids[n], or n % T when ids is null (positions 0..T-1).
__global__ void embedding_backward_table_chunk_kernel(float* __restrict__ dtable,
                                                      const __nv_bfloat16* __restrict__ dout,
                                                      const int32_t* __restrict__ ids, int64_t N,
                                                      int64_t T, int64_t C, int64_t rows) {
    __shared__ int32_t hits[kBackwardThreads];
    __shared__ int warp_hits[kBackwardWarps];
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int64_t v_begin = int64_t(blockIdx.x) * kTableRowsPerBlock;
    const int64_t v_end = v_begin + kTableRowsPerBlock;
    const int64_t c_begin = int64_t(blockIdx.y) * kColsPerBlock;
    const int64_t c_end = min(C, c_begin + kColsPerBlock);
    const bool reporter = blockIdx.x == 0 && blockIdx.y == 0;  // one block checks the ids
    for (int64_t base = 0; base < N; base += kBackwardThreads) {
        const int64_t n = base + threadIdx.x;
        int64_t id = -1;
        if (n < N) {
            id = ids ? int64_t(ids[n]) : n % T;
            if (reporter)
                LATHE_DEVICE_CHECK(id >= 0 && id < rows, "id %lld at row %lld, table %lld",
                                   (long long)id, (long long)n, (long long)rows);
        }
        const bool hit = id >= v_begin && id < v_end;
        // Compact the hits in row order: warps by index, lanes by index within a warp.
        const unsigned ballot = __ballot_sync(kFullMask, hit);
        if (lane == 0) warp_hits[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < kBackwardWarps; ++w) {
            before += w < warp ? warp_hits[w] : 0;
            total += warp_hits[w];
        }
        if (hit) hits[before + __popc(ballot & ((1u << lane) - 1u))] = int32_t(n);
        __syncthreads();
        for (int j = 0; j < total; ++j) {
            const int64_t m = hits[j];
            const int64_t v = ids ? int64_t(ids[m]) : m % T;
            const __nv_bfloat16* src = dout + m * C;
            float* dst = dtable + v * C;
            for (int64_t c = c_begin + threadIdx.x; c < c_end; c += kBackwardThreads)
                dst[c] += __bfloat162float(src[c]);
        }
        __syncthreads();  // hits and warp_hits are rewritten by the next tile
    }
}

void backward_table(float* dtable, const bf16* dout, const int32_t* ids, int64_t N, int64_t T,
                    int64_t C, int64_t rows, CUstream_st* stream) {
    const dim3 grid(blocks_for(rows, kTableRowsPerBlock, INT32_MAX),
                    blocks_for(C, kColsPerBlock, 65535));
    embedding_backward_table_chunk_kernel<<<grid, kBackwardThreads, 0, stream>>>(
        dtable, reinterpret_cast<const __nv_bfloat16*>(dout), ids, N, T, C, rows);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(bf16* out, const int32_t* tokens, const int32_t* positions, const bf16* wte,
                       const bf16* wpe, int64_t B, int64_t T, int64_t C, int64_t V, int64_t P,
                       CUstream_st* stream) {
    const int64_t N = B * T;
    if (N == 0) return;
    auto* o = reinterpret_cast<__nv_bfloat16*>(out);
    const auto* e = reinterpret_cast<const __nv_bfloat16*>(wte);
    const auto* p = reinterpret_cast<const __nv_bfloat16*>(wpe);
    const unsigned blocks = blocks_for(N, kRowsPerBlock, INT32_MAX);
    if (vec8_ok(C, {out, wte, wpe}))
        embedding_forward_warp_per_row_kernel<8>
            <<<blocks, kForwardThreads, 0, stream>>>(o, tokens, positions, e, p, N, T, C, V, P);
    else
        embedding_forward_warp_per_row_kernel<1>
            <<<blocks, kForwardThreads, 0, stream>>>(o, tokens, positions, e, p, N, T, C, V, P);
    LATHE_CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T, int64_t C, int64_t V,
                        int64_t P, CUstream_st* stream) {
    const int64_t N = B * T;
    if (N == 0) return;
    LATHE_CHECK(N < INT32_MAX, "embedding_backward: {} rows do not fit the row index", N);
    if (dwte != nullptr) backward_table(dwte, dout, tokens, N, T, C, V, stream);
    if (dwpe != nullptr) backward_table(dwpe, dout, positions, N, T, C, P, stream);
}

}  // namespace lathe::cuda
