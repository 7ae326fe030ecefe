#pragma once
// CUDA SwiGLU (ops/swiglu.h has the math).
//   forward:  out (N, F) bf16 = silu(gate) * up, gate_up (N, 2F) bf16 rows [gate | up]
//   backward: dgate_up (N, 2F) bf16 (=) from dout (N, F) and gate_up
// fp32 math, one rounding to bf16 per output; 8 elements per thread when F % 8 == 0.
// Deterministic (elementwise). Enqueued on `stream`.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe::cuda {

void swiglu_forward(bf16* out, const bf16* gate_up, int64_t N, int64_t F, CUstream_st* stream);

void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t N, int64_t F,
                     CUstream_st* stream);

}  // namespace lathe::cuda
