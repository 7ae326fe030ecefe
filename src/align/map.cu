// The CUDA twin of align_top2_cpu (align/map.h): scores of a tile by cuBLAS sgemm, merged into a
// running per-row top-2 by one warp per row. Deterministic: the GEMM of a given shape is, and the
// merge has a fixed order with explicit tie-breaking by column index.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt

#include <algorithm>
#include <cfloat>
#include <climits>
#include <limits>
#include <vector>

#include "align/map.h"
#include "core/check.h"
#include "ops/cuda/cuda_check.h"
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

// Device memory freed on scope exit.
template <typename T>
struct DeviceArray {
    T* ptr = nullptr;
    ~DeviceArray() {
        if (ptr) cudaFree(ptr);
    }
    Status allocate(size_t n, const char* what) {
        if (cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) {
            cudaGetLastError();
            ptr = nullptr;
            return failed_precondition_error(
                "align map --device cuda: cannot allocate {} MiB of device memory for "
                "{}; use smaller tiles or --device cpu",
                n * sizeof(T) >> 20, what);
        }
        return ok_status();
    }
};

}  // namespace

bool align_top2_cuda_available() {
    return cuda_device_count() > 0;
}

Status align_top2_cuda(std::span<AlignTop2> out, const float* A, int64_t M, const float* B,
                       int64_t N, int64_t K, int64_t tile_rows, int64_t tile_cols) {
    LATHE_CHECK(int64_t(out.size()) == M, "top2: {} outputs for {} rows", int64_t(out.size()), M);
    LATHE_CHECK(tile_rows > 0 && tile_cols > 0, "top2 tiles {}x{}", tile_rows, tile_cols);
    LATHE_CHECK(N < INT_MAX && K < INT_MAX && tile_rows < INT_MAX && tile_cols < INT_MAX,
                "top2 sizes {}x{}x{}", M, N, K);
    if (!align_top2_cuda_available()) {
        return failed_precondition_error(
            "align map --device cuda: no GPU is visible; use --device cpu or auto");
    }
    for (AlignTop2& t : out) t = AlignTop2{};
    if (M == 0) return ok_status();
    tile_rows = std::min(tile_rows, M);
    tile_cols = std::min(tile_cols, std::max<int64_t>(N, 1));
    DeviceArray<float> dA, dB, dS, dbs, dss;
    DeviceArray<int> db, dsec;
    LATHE_RETURN_IF_ERROR(dA.allocate(size_t(M * K), "the target relative representations"));
    LATHE_RETURN_IF_ERROR(dB.allocate(size_t(N * K), "the source relative representations"));
    LATHE_RETURN_IF_ERROR(dS.allocate(size_t(tile_rows * tile_cols), "a score tile"));
    LATHE_RETURN_IF_ERROR(db.allocate(size_t(M), "top-2"));
    LATHE_RETURN_IF_ERROR(dsec.allocate(size_t(M), "top-2"));
    LATHE_RETURN_IF_ERROR(dbs.allocate(size_t(M), "top-2"));
    LATHE_RETURN_IF_ERROR(dss.allocate(size_t(M), "top-2"));
    LATHE_CUDA_CHECK(cudaMemcpy(dA.ptr, A, size_t(M * K) * sizeof(float), cudaMemcpyHostToDevice));
    if (N > 0)
        LATHE_CUDA_CHECK(
            cudaMemcpy(dB.ptr, B, size_t(N * K) * sizeof(float), cudaMemcpyHostToDevice));
    LATHE_CUDA_CHECK(cudaMemset(db.ptr, 0xff, size_t(M) * sizeof(int)));  // -1: empty
    LATHE_CUDA_CHECK(cudaMemset(dsec.ptr, 0xff, size_t(M) * sizeof(int)));

    cublasHandle_t handle = nullptr;
    LATHE_CUBLAS_CHECK(cublasCreate(&handle));
    struct HandleGuard {
        cublasHandle_t h;
        ~HandleGuard() { cublasDestroy(h); }
    } guard{handle};
    // Plain fp32 (no TF32 tensor ops): the top-2 must match the CPU's up to fp32 rounding.
    LATHE_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    const float one = 1.0f, zero = 0.0f;
    constexpr int kWarpsPerBlock = 8;
    for (int64_t r0 = 0; r0 < M; r0 += tile_rows) {
        const int64_t rows = std::min(tile_rows, M - r0);
        for (int64_t c0 = 0; c0 < N; c0 += tile_cols) {
            const int64_t cols = std::min(tile_cols, N - c0);
            // Column-major view: S_cm (cols, rows) = B_tile (cols, K) · A_tile^T, i.e. the
            // row-major tile S (rows, cols) = A_tile · B_tileᵀ with leading dimension `cols`.
            LATHE_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(cols), int(rows),
                                           int(K), &one, dB.ptr + c0 * K, int(K), dA.ptr + r0 * K,
                                           int(K), &zero, dS.ptr, int(cols)));
            const unsigned blocks = unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
            top2_merge_tile_warp_per_row<<<blocks, kWarpsPerBlock * 32>>>(
                dS.ptr, rows, cols, c0, db.ptr + r0, dsec.ptr + r0, dbs.ptr + r0, dss.ptr + r0);
            LATHE_CUDA_CHECK_LAUNCH();
        }
    }
    std::vector<int> best(static_cast<size_t>(M)), second(static_cast<size_t>(M));
    std::vector<float> bs(static_cast<size_t>(M)), ss(static_cast<size_t>(M));
    LATHE_CUDA_CHECK(
        cudaMemcpy(best.data(), db.ptr, size_t(M) * sizeof(int), cudaMemcpyDeviceToHost));
    LATHE_CUDA_CHECK(
        cudaMemcpy(second.data(), dsec.ptr, size_t(M) * sizeof(int), cudaMemcpyDeviceToHost));
    LATHE_CUDA_CHECK(
        cudaMemcpy(bs.data(), dbs.ptr, size_t(M) * sizeof(float), cudaMemcpyDeviceToHost));
    LATHE_CUDA_CHECK(
        cudaMemcpy(ss.data(), dss.ptr, size_t(M) * sizeof(float), cudaMemcpyDeviceToHost));
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
