#pragma once
// CUDA residual add (ops/residual.h has the math).
//   forward:  out = a + b;   backward: da += dout, db += dout (either may be null)
// n elements, bf16, fp32 add, one rounding. out may be a or b (in place), so no restrict on
// those. Deterministic (elementwise). Enqueued on `stream`.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe::cuda {

void residual_forward(bf16* out, const bf16* a, const bf16* b, int64_t n, CUstream_st* stream);

void residual_backward(bf16* da, bf16* db, const bf16* dout, int64_t n, CUstream_st* stream);

}  // namespace lathe::cuda
