#pragma once
// CPU reference kernels behind ops/vocab_parallel.h (raw pointers, sizes explicit).
#include <cstdint>

namespace lathe::cpu {

void vocab_shard_ids(int32_t* local, const int32_t* ids, int64_t N, int64_t begin, int64_t V,
                     int64_t total);

void vocab_shard_zero_rows(float* x, const int32_t* ids, int64_t N, int64_t C, int64_t begin,
                           int64_t V);

// dwte (V, C) += dx rows of the ids in [begin, begin + V), at row id - begin; ids checked against
// [0, total). Threads split the columns: each element sums its rows in row order.
void vocab_shard_embedding_backward(float* dwte, const float* dx, const int32_t* ids, int64_t N,
                                    int64_t C, int64_t begin, int64_t V, int64_t total);

// The combination's three steps around the reductions: work (3, N) = [m; e; t].
//   prepare: m = lse, t = lse - losses;   exp: e = exp(lse - m);
//   finish: lse = m + log e, losses = lse - t (0 ignored), loss = the mean.
void cross_entropy_vocab_parallel_prepare(float* work, const float* lse, const float* losses,
                                          int64_t N);
void cross_entropy_vocab_parallel_exp(float* work, const float* lse, int64_t N);
void cross_entropy_vocab_parallel_finish(float* loss, float* losses, float* lse,
                                         const int32_t* targets, const float* work, int64_t N);

}  // namespace lathe::cpu
