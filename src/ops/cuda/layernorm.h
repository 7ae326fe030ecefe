#pragma once
// CUDA LayerNorm (ops/layernorm.h has the math).
//   forward:  y (N, C) bf16, mean (N) f32, rstd (N) f32 from x (N, C), weight (C), bias (C) bf16
//   backward: dx (N, C) bf16 (= or += per dx_accumulate); dweight, dbias (C) f32 += (null: frozen)
// Kernels: one warp per row (16-byte loads when C % 8 == 0); the variance from a second pass over
// the row (x - mean)^2, not E[x^2] - mean^2, so large means do not cancel. dweight and dbias
// through per-chunk partial sums and a second pass (column_reduce.h); with C % 8 == 0 and
// C <= 2048 one kernel computes dx and the partials (x and dy read once). Deterministic: every
// summation order depends on N and C only.
// Device pointers; enqueued on `stream` (the state's, which holds the partials).

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

void layernorm_forward(bf16* y, float* mean, float* rstd, const bf16* x, const bf16* weight,
                       const bf16* bias, int64_t N, int64_t C, float eps, CUstream_st* stream);

// Residual add fused in: x_out = a + b (each element rounded to bf16, as residual_forward), then
// the forward above on x_out, in one kernel: the same bits as residual_forward followed by
// layernorm_forward. x_out may be a or b.
void layernorm_residual_forward(bf16* x_out, bf16* y, float* mean, float* rstd, const bf16* a,
                                const bf16* b, const bf16* weight, const bf16* bias, int64_t N,
                                int64_t C, float eps, CUstream_st* stream);

void layernorm_backward(bf16* dx, float* dweight, float* dbias, const bf16* dy, const bf16* x,
                        const bf16* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, bool dx_accumulate, CudaState& state, CUstream_st* stream);

}  // namespace lathe::cuda
