#pragma once
// CUDA twins of ops/cpu/vocab_parallel.h (ops/vocab_parallel.h has the math): one thread per
// element, bf16 rows for vocab_shard_zero_rows, f32 statistics; the mean of finish is one block
// (fp64 partial sums per thread, then a fixed-order block reduction: deterministic). An id outside
// [0, total) traps the kernel. Enqueued on `stream`.
#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe::cuda {

void vocab_shard_ids(int32_t* local, const int32_t* ids, int64_t N, int64_t begin, int64_t V,
                     int64_t total, CUstream_st* stream);

void vocab_shard_zero_rows(bf16* x, const int32_t* ids, int64_t N, int64_t C, int64_t begin,
                           int64_t V, CUstream_st* stream);

void cross_entropy_vocab_parallel_prepare(float* work, const float* lse, const float* losses,
                                          int64_t N, CUstream_st* stream);
void cross_entropy_vocab_parallel_exp(float* work, const float* lse, int64_t N,
                                      CUstream_st* stream);
void cross_entropy_vocab_parallel_finish(float* loss, float* losses, float* lse,
                                         const int32_t* targets, const float* work, int64_t N,
                                         CUstream_st* stream);

}  // namespace lathe::cuda
