// The CUDA twin of align_top2_cpu (align/map.h): scores of a tile by the backend's GEMM
// (ops/cuda/gemm.h: cuBLASLt, f32 in and out, fp32 accumulation, no TF32) on the CudaState's
// stream, handle and workspace, merged into a running per-row top-2 by one warp per row.
// Deterministic: the GEMM of a given shape is, and the merge has a fixed order with explicit
// tie-breaking by column index.
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <limits>
#include <vector>

#include "align/map.h"
#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/memory.h"

namespace lathe {

namespace {

// A candidate: score and column; an empty slot has index INT_MAX and score -FLT_MAX... compared
// through `better`, which also breaks score ties by the lower column.
struct Cand {
    float score;
    int index;
};

__device__ __forceinline__ bool better(Cand a, Cand b) {
    return a.score > b.score || (a.score == b.score && a.index < b.index);
}

// Inserts c into the ordered pair (first, second).
__device__ __forceinline__ void insert(Cand& first, Cand& second, Cand c) {
    if (better(c, first)) {
        second = first;
        first = c;
    } else if (better(c, second)) {
        second = c;
    }
}

// scores (rows, cols) row-major, a tile whose column 0 is global column `col0`; best/second hold
// the running top-2 of each of the tile's rows (index -1 = empty) and are updated (=).
// One warp per row: each lane scans columns lane, lane + 32, ... keeping its own top-2, then the
// warp merges the 32 pairs by shuffles, and lane 0 merges the result with the running pair.
__global__ void top2_merge_tile_warp_per_row(const float* __restrict__ scores, int64_t rows,
                                             int64_t cols, int64_t col0, int* __restrict__ best,
                                             int* __restrict__ second,
                                             float* __restrict__ best_score,
                                             float* __restrict__ second_score) {
    const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const Cand empty{-FLT_MAX, INT_MAX};
    Cand first = empty, sec = empty;
    const float* r = scores + row * cols;
    for (int64_t j = lane; j < cols; j += 32) insert(first, sec, Cand{r[j], int(col0 + j)});
    for (int offset = 16; offset > 0; offset /= 2) {
        Cand of{__shfl_down_sync(0xffffffffu, first.score, offset),
                __shfl_down_sync(0xffffffffu, first.index, offset)};
        Cand os{__shfl_down_sync(0xffffffffu, sec.score, offset),
                __shfl_down_sync(0xffffffffu, sec.index, offset)};
        insert(first, sec, of);
        insert(first, sec, os);
    }
    if (lane != 0) return;
    Cand rf = best[row] < 0 ? empty : Cand{best_score[row], best[row]};
    Cand rs = second[row] < 0 ? empty : Cand{second_score[row], second[row]};
    insert(rf, rs, first);
    insert(rf, rs, sec);
    best[row] = rf.index == INT_MAX ? -1 : rf.index;
    best_score[row] = rf.score;
    second[row] = rs.index == INT_MAX ? -1 : rs.index;
    second_score[row] = rs.score;
}

}  // namespace

bool align_top2_cuda_available() {
    return cuda_device_count() > 0;
}

Status align_top2_cuda(const Context& ctx, std::span<AlignTop2> out, const float* A, int64_t M,
                       const float* B, int64_t N, int64_t K, int64_t tile_rows, int64_t tile_cols) {
    LATHE_CHECK(int64_t(out.size()) == M, "top2: {} outputs for {} rows", int64_t(out.size()), M);
    LATHE_CHECK(tile_rows > 0 && tile_cols > 0, "top2 tiles {}x{}", tile_rows, tile_cols);
    LATHE_CHECK(N < INT_MAX && K < INT_MAX && tile_rows < INT_MAX && tile_cols < INT_MAX,
                "top2 sizes {}x{}x{}", M, N, K);
    CudaState& state = cuda_state_of(ctx, "align top2");
    CUstream_st* stream = state.stream();
    for (AlignTop2& t : out) t = AlignTop2{};
    if (M == 0) return ok_status();
    tile_rows = std::min(tile_rows, M);
    tile_cols = std::min(tile_cols, std::max<int64_t>(N, 1));
    // Device memory: A, B, one score tile and the running top-2 (index and score, twice).
    const size_t a_bytes = size_t(M * K) * sizeof(float);
    const size_t b_bytes = size_t(N * K) * sizeof(float);
    const size_t tile_bytes = size_t(tile_rows * tile_cols) * sizeof(float);
    const size_t top_bytes = size_t(M) * (2 * sizeof(int) + 2 * sizeof(float));
    const size_t need = a_bytes + b_bytes + tile_bytes + top_bytes;
    const size_t free_bytes = cuda_memory_info(state.device()).free_bytes;
    if (need > free_bytes) {
        return failed_precondition_error(
            "align map --device cuda: cannot allocate {} MiB of device memory ({} MiB free) for "
            "the target and source relative representations, a {}x{} score tile and the top-2; "
            "use smaller tiles or --device cpu",
            need >> 20, free_bytes >> 20, tile_rows, tile_cols);
    }
    DeviceBuffer dA(a_bytes), dB(b_bytes), dS(tile_bytes);
    DeviceBuffer db(size_t(M) * sizeof(int)), dsec(size_t(M) * sizeof(int));
    DeviceBuffer dbs(size_t(M) * sizeof(float)), dss(size_t(M) * sizeof(float));
    float* a_dev = static_cast<float*>(dA.data());
    float* b_dev = static_cast<float*>(dB.data());
    float* s_dev = static_cast<float*>(dS.data());
    int* best_dev = static_cast<int*>(db.data());
    int* second_dev = static_cast<int*>(dsec.data());
    float* best_score_dev = static_cast<float*>(dbs.data());
    float* second_score_dev = static_cast<float*>(dss.data());
    LATHE_CUDA_CHECK(cudaMemcpyAsync(a_dev, A, a_bytes, cudaMemcpyHostToDevice, stream));
    if (N > 0) LATHE_CUDA_CHECK(cudaMemcpyAsync(b_dev, B, b_bytes, cudaMemcpyHostToDevice, stream));
    LATHE_CUDA_CHECK(cudaMemsetAsync(best_dev, 0xff, size_t(M) * sizeof(int), stream));  // -1
    LATHE_CUDA_CHECK(cudaMemsetAsync(second_dev, 0xff, size_t(M) * sizeof(int), stream));

    // Plain fp32 (no TF32): the top-2 must match the CPU's up to fp32 rounding.
    GemmArgs g;
    g.K = K;
    g.a_dtype = g.b_dtype = g.d_dtype = DType::kF32;
    g.lda = K;
    g.trans_b = true;  // B's tile is stored (cols, K)
    g.ldb = K;
    constexpr int kWarpsPerBlock = 8;
    for (int64_t r0 = 0; r0 < M; r0 += tile_rows) {
        const int64_t rows = std::min(tile_rows, M - r0);
        for (int64_t c0 = 0; c0 < N; c0 += tile_cols) {
            const int64_t cols = std::min(tile_cols, N - c0);
            // The row-major tile S (rows, cols) = A_tile (rows, K) · B_tile^T.
            g.M = rows;
            g.N = cols;
            g.A = a_dev + r0 * K;
            g.B = b_dev + c0 * K;
            g.D = s_dev;
            g.ldd = cols;
            cuda::gemm(state, stream, g);
            const unsigned blocks = unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
            top2_merge_tile_warp_per_row<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
                s_dev, rows, cols, c0, best_dev + r0, second_dev + r0, best_score_dev + r0,
                second_score_dev + r0);
            LATHE_CUDA_CHECK_LAUNCH();
        }
    }
    std::vector<int> best(static_cast<size_t>(M)), second(static_cast<size_t>(M));
    std::vector<float> bs(static_cast<size_t>(M)), ss(static_cast<size_t>(M));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(best.data(), best_dev, size_t(M) * sizeof(int),
                                     cudaMemcpyDeviceToHost, stream));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(second.data(), second_dev, size_t(M) * sizeof(int),
                                     cudaMemcpyDeviceToHost, stream));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(bs.data(), best_score_dev, size_t(M) * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
    LATHE_CUDA_CHECK(cudaMemcpyAsync(ss.data(), second_score_dev, size_t(M) * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
    LATHE_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int64_t i = 0; i < M; ++i) {
        AlignTop2& t = out[size_t(i)];
        t.best = best[size_t(i)];
        t.second = second[size_t(i)];
        t.best_score = t.best < 0 ? -std::numeric_limits<float>::infinity() : bs[size_t(i)];
        t.second_score = t.second < 0 ? -std::numeric_limits<float>::infinity() : ss[size_t(i)];
    }
    return ok_status();
}

}  // namespace lathe
