#pragma once
// Deterministic column sums, the shape of every parameter gradient of a norm or a bias:
//   dst[c] += sum_n f(n, c)    over the N rows of an (N, C) problem.
// No float atomics: the rows are cut into R fixed chunks (R depends on N only), pass 1 writes one
// fp32 partial sum per (chunk, column) into a (R, C) array, and pass 2 adds the R partials of each
// column into dst in chunk order. The same inputs give the same bits on every run and every GPU.
// Pass 1 is the op's own kernel where f needs more than one input (norm backward: dy * xhat);
// column_sum_bf16_accumulate() runs both passes for f = src (a bias gradient).
// Internal to ops/cuda.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

inline constexpr int64_t kMaxRowChunks = 128;
inline constexpr int64_t kMinRowsPerChunk = 32;

// R for N rows: enough chunks to fill the GPU, each of at least kMinRowsPerChunk rows.
inline int64_t column_reduce_chunks(int64_t N) {
    int64_t r = (N + kMinRowsPerChunk - 1) / kMinRowsPerChunk;
    if (r < 1) r = 1;
    return r < kMaxRowChunks ? r : kMaxRowChunks;
}

// Rows per chunk for N rows in R chunks (the last chunk may be shorter or empty).
inline int64_t column_reduce_rows_per_chunk(int64_t N, int64_t R) {
    return (N + R - 1) / R;
}

// Pass 2: dst[c] += sum_{r < R} partials[r * C + c], in order of r. dst (C) f32.
void column_partials_accumulate(float* dst, const float* partials, int64_t R, int64_t C,
                                CUstream_st* stream);

// Both passes for dst[c] += sum_n src[n, c], src (N, C) bf16, dst (C) f32; the partials live in
// the state's scratch (R * C floats, checked against its size with `op` in the message).
void column_sum_bf16_accumulate(CudaState& state, CUstream_st* stream, float* dst, const bf16* src,
                                int64_t N, int64_t C, const char* op);

}  // namespace lathe::cuda
