// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/swiglu.h"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 256;

// The lanes of a `threads`-thread block that take one row of F / kVec vectors: all of them for a
// long row, one per vector for a short one (then threads / lanes rows a pass). The grid's size
// on the host and RowTiling on the device both count rows with it.
__host__ __device__ inline int64_t swiglu_lanes(int64_t F, int kVec, int64_t threads) {
    const int64_t vectors = F / kVec;
    return vectors < threads ? vectors : threads;
}

// The rows of an (N, F) output, kVec consecutive columns a thread at a time: a pass of the block
// covers `rows` rows of `lanes` threads each (lanes = min(F / kVec, block size)), so no thread
// divides a flat index by F (a 64-bit division, dozens of instructions, per vector).
// A thread past rows * lanes idles (a narrow F), but stays for the block's amax.
struct RowTiling {
    int64_t vectors, lanes, rows, row, lane;
    __device__ RowTiling(int64_t F, int kVec) {
        vectors = F / kVec;
        lanes = swiglu_lanes(F, kVec, blockDim.x);
        rows = blockDim.x / lanes;
        row = threadIdx.x / lanes;
        lane = threadIdx.x % lanes;
        if (row >= rows) row = -1;
    }
};

int64_t swiglu_rows_per_block(int64_t F, int kVec) {
    return kThreads / swiglu_lanes(F, kVec, kThreads);
}

unsigned swiglu_blocks(int64_t N, int64_t F, int kVec) {
    return blocks_for(N, swiglu_rows_per_block(F, kVec), 8192);
}

template <int kVec>
__global__ void swiglu_forward_kernel(__nv_bfloat16* __restrict__ out,
                                      const __nv_bfloat16* __restrict__ gate_up, int64_t N,
                                      int64_t F, unsigned* out_amax) {
    const RowTiling t(F, kVec);
    unsigned m = 0;
    for (int64_t n = t.row < 0 ? N : int64_t(blockIdx.x) * t.rows + t.row; n < N;
         n += int64_t(gridDim.x) * t.rows) {
        for (int64_t j = t.lane; j < t.vectors; j += t.lanes) {
            const int64_t f = j * kVec;
            float g[kVec], u[kVec], o[kVec];
            load_bf16<kVec>(g, gate_up + n * 2 * F + f);
            load_bf16<kVec>(u, gate_up + n * 2 * F + F + f);
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
                o[i] = g[i] * fast_sigmoid(g[i]) * u[i];
                m = max(m, bf16_magnitude_bits(o[i]));
            }
            store_bf16<kVec>(out + n * F + f, o);
        }
    }
    if (out_amax != nullptr) block_amax_into<kThreads>(m, out_amax);
}

// dgate = dout * up * sg * (1 + gate * (1 - sg)),  dup = dout * gate * sg.
template <int kVec>
__global__ void swiglu_backward_kernel(__nv_bfloat16* __restrict__ dgate_up,
                                       const __nv_bfloat16* __restrict__ dout,
                                       const __nv_bfloat16* __restrict__ gate_up, int64_t N,
                                       int64_t F, unsigned* dgate_up_amax) {
    const RowTiling t(F, kVec);
    unsigned m = 0;
    for (int64_t n = t.row < 0 ? N : int64_t(blockIdx.x) * t.rows + t.row; n < N;
         n += int64_t(gridDim.x) * t.rows) {
        for (int64_t j = t.lane; j < t.vectors; j += t.lanes) {
            const int64_t f = j * kVec;
            float g[kVec], u[kVec], d[kVec], dg[kVec], du[kVec];
            load_bf16<kVec>(g, gate_up + n * 2 * F + f);
            load_bf16<kVec>(u, gate_up + n * 2 * F + F + f);
            load_bf16<kVec>(d, dout + n * F + f);
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
                const float sg = fast_sigmoid(g[i]);
                dg[i] = d[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
                du[i] = d[i] * g[i] * sg;
                m = max(m, max(bf16_magnitude_bits(dg[i]), bf16_magnitude_bits(du[i])));
            }
            store_bf16<kVec>(dgate_up + n * 2 * F + f, dg);
            store_bf16<kVec>(dgate_up + n * 2 * F + F + f, du);
        }
    }
    if (dgate_up_amax != nullptr) block_amax_into<kThreads>(m, dgate_up_amax);
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate_up, int64_t N, int64_t F, CUstream_st* stream,
                    float* out_amax) {
    auto* amax = reinterpret_cast<unsigned*>(out_amax);
    if (amax != nullptr) LATHE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(unsigned), stream));
    if (N * F == 0) return;
    auto* o = reinterpret_cast<__nv_bfloat16*>(out);
    const auto* gu = reinterpret_cast<const __nv_bfloat16*>(gate_up);
    if (vec8_ok(F, {out, gate_up}))
        swiglu_forward_kernel<8>
            <<<swiglu_blocks(N, F, 8), kThreads, 0, stream>>>(o, gu, N, F, amax);
    else
        swiglu_forward_kernel<1>
            <<<swiglu_blocks(N, F, 1), kThreads, 0, stream>>>(o, gu, N, F, amax);
    LATHE_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t N, int64_t F,
                     CUstream_st* stream, float* dgate_up_amax) {
    auto* amax = reinterpret_cast<unsigned*>(dgate_up_amax);
    if (amax != nullptr) LATHE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(unsigned), stream));
    if (N * F == 0) return;
    auto* dgu = reinterpret_cast<__nv_bfloat16*>(dgate_up);
    const auto* d = reinterpret_cast<const __nv_bfloat16*>(dout);
    const auto* gu = reinterpret_cast<const __nv_bfloat16*>(gate_up);
    if (vec8_ok(F, {dgate_up, dout, gate_up}))
        swiglu_backward_kernel<8>
            <<<swiglu_blocks(N, F, 8), kThreads, 0, stream>>>(dgu, d, gu, N, F, amax);
    else
        swiglu_backward_kernel<1>
            <<<swiglu_blocks(N, F, 1), kThreads, 0, stream>>>(dgu, d, gu, N, F, amax);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace lathe::cuda
