#pragma once
// CUDA argmax of each row (ops/argmax.h has the rule): ids[n] = the lowest index of row n's
// largest value of x (N, V) bf16, NaN as -inf. A block per row; deterministic (the pick is a
// total order on (value, index)). Enqueued on `stream`.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe::cuda {

void argmax_rows(int32_t* ids, const bf16* x, int64_t N, int64_t V, CUstream_st* stream);

}  // namespace lathe::cuda
