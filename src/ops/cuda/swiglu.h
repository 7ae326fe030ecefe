#pragma once
// CUDA SwiGLU (ops/swiglu.h has the math).
//   forward:  out (N, F) bf16 = silu(gate) * up, gate_up (N, 2F) bf16 rows [gate | up]
//   backward: dgate_up (N, 2F) bf16 (=) from dout (N, F) and gate_up
// fp32 math, one rounding to bf16 per output; 8 elements per thread when F % 8 == 0.
// Deterministic (elementwise). Enqueued on `stream`.
// out_amax (forward, may be null): *out_amax = amax(out) as ops/fp8_cast.h defines it (the f32
// bits of the largest |out| of the stored bf16 values), for the fp8 cast of out that follows
// (Fp8CastArgs::amax_ready): computed as out is written, saving the cast's amax pass.
// dgate_up_amax (backward, may be null): the same of dgate_up, for the fp8 cast of the gradient
// that the gate/up projection's backward makes.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe::cuda {

void swiglu_forward(bf16* out, const bf16* gate_up, int64_t N, int64_t F, CUstream_st* stream,
                    float* out_amax = nullptr);

void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t N, int64_t F,
                     CUstream_st* stream, float* dgate_up_amax = nullptr);

}  // namespace lathe::cuda
