#pragma once
// Deterministic column sums, the shape of every parameter gradient of a norm or a bias:
//   dst[c] += sum_n f(n, c)    over the N rows of an (N, C) problem.
// No float atomics: the rows are cut into R fixed chunks, pass 1 writes one fp32 partial sum per
// (chunk, column) into an (R, C) array, and pass 2 adds the R partials of each column into dst in
// a fixed tree. R and every summation order depend on (N, C) only, never on the GPU, the pointers'
// alignment or timing: the same inputs give the same bits on every run and every GPU.
// Pass 1 is column_partials_kernel (column_reduce.cuh) with the op's row functor (norm backward:
// dy * xhat and dy); column_sum_bf16_accumulate() runs both passes for f = src (a bias gradient).
// Internal to ops/cuda.

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/cuda_state.h"

struct CUstream_st;

namespace lathe::cuda {

// Pass 1's block covers kColumnTile columns of one row chunk (column_reduce.cuh).
inline constexpr int64_t kColumnTile = 256;
// Pass-1 blocks to aim for: several waves of 132 SMs, so the read of the (N, C) input streams at
// memory bandwidth. A constant, not the device's SM count: R must not depend on the GPU.
inline constexpr int64_t kTargetPartialBlocks = 1024;
inline constexpr int64_t kMinRowsPerChunk = 64;  // 8 rows per warp of a pass-1 block
inline constexpr int64_t kMaxRowChunks = 1024;
// The most partial arrays one op keeps at once (LayerNorm: dweight and dbias). R is capped so
// that many (R, C) fp32 arrays fit CudaState::kScratchBytes (32 MiB), whatever the op.
inline constexpr int64_t kMaxPartialArrays = 2;
inline constexpr int64_t kScratchFloats = int64_t(CudaState::kScratchBytes / sizeof(float));

// R for an (N, C) problem: about kTargetPartialBlocks pass-1 blocks in all, each chunk at least
// kMinRowsPerChunk rows, at most kMaxRowChunks chunks, kMaxPartialArrays (R, C) arrays within
// the scratch. Depends on N and C only.
inline int64_t column_reduce_chunks(int64_t N, int64_t C) {
    const int64_t tiles = C > 0 ? (C + kColumnTile - 1) / kColumnTile : 1;
    int64_t r = (kTargetPartialBlocks + tiles - 1) / tiles;
    const int64_t by_rows = (N + kMinRowsPerChunk - 1) / kMinRowsPerChunk;
    if (r > by_rows) r = by_rows;
    if (r > kMaxRowChunks) r = kMaxRowChunks;
    const int64_t by_scratch = C > 0 ? kScratchFloats / (kMaxPartialArrays * C) : r;
    if (r > by_scratch) r = by_scratch;
    return r < 1 ? 1 : r;
}

// Rows per chunk for N rows in R chunks (the last chunks may be shorter or empty).
inline int64_t column_reduce_rows_per_chunk(int64_t N, int64_t R) {
    return (N + R - 1) / R;
}

// Pass 2: dst[c] += sum_{r < R} partials[r * C + c], dst (C) f32. The R partials of a column
// are split round-robin over 32 groups (group g adds r = g, g + 32, ... in order), then the 32
// group sums are added in group order: fixed by R. One block per 8 columns, so R is read in
// parallel (the old one-thread-per-column loop was latency bound: 17 us for C = 768).
void column_partials_accumulate(float* dst, const float* partials, int64_t R, int64_t C,
                                CUstream_st* stream);

// Pass 2 of two (R, C) arrays in one launch: dst0 from partials, dst1 from partials + R * C;
// a null destination is skipped (same bits as column_partials_accumulate on each array).
void column_partials_accumulate2(float* dst0, float* dst1, const float* partials, int64_t R,
                                 int64_t C, CUstream_st* stream);

// Both passes for dst[c] += sum_n src[n, c], src (N, C) bf16, dst (C) f32; the partials live in
// the state's scratch (R * C floats, checked against its size with `op` in the message).
void column_sum_bf16_accumulate(float* dst, const bf16* src, int64_t N, int64_t C, const char* op,
                                CudaState& state, CUstream_st* stream);

}  // namespace lathe::cuda
