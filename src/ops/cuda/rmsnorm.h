#pragma once
// CUDA RMSNorm (ops/rmsnorm.h has the math).
//   forward:  y (N, C) bf16, rstd (N) f32 from x (N, C) bf16, weight (C) bf16; fp32 math
//   backward: dx (N, C) bf16 (= or += per dx_accumulate), dweight (C) f32 += (null: frozen)
// Kernels: one warp per row (16-byte loads when C % 8 == 0), the row's statistics reduced by warp
// shuffles; dweight through per-chunk partial sums and a second pass (column_reduce.h); with
// C % 8 == 0 and C <= 2048 one kernel computes dx and the partials (x and dy read once).
// Deterministic: every summation order depends on N and C only. Device pointers; enqueued on
// `stream` (the state's, which holds the partials).

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

// y_amax (may be null): *y_amax = amax(y) as ops/fp8_cast.h defines it (the f32 bits of the largest
// |y| of the stored bf16 values), for the fp8 cast of y that follows (Fp8CastArgs::amax_ready):
// computed as y is written, saving the cast's amax pass over y.
void rmsnorm_forward(bf16* y, float* rstd, const bf16* x, const bf16* weight, int64_t N, int64_t C,
                     float eps, CUstream_st* stream, float* y_amax = nullptr);

// Residual add fused in: x_out = a + b (each element rounded to bf16, as residual_forward), then
// the forward above on x_out, in one kernel: the same bits as residual_forward followed by
// rmsnorm_forward. x_out may be a or b.
void rmsnorm_residual_forward(bf16* x_out, bf16* y, float* rstd, const bf16* a, const bf16* b,
                              const bf16* weight, int64_t N, int64_t C, float eps,
                              CUstream_st* stream, float* y_amax = nullptr);

void rmsnorm_backward(bf16* dx, float* dweight, const bf16* dy, const bf16* x, const bf16* weight,
                      const float* rstd, int64_t N, int64_t C, bool dx_accumulate, CudaState& state,
                      CUstream_st* stream);

}  // namespace lathe::cuda
