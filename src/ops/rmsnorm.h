#pragma once
// RMSNorm over the last dimension (Llama, Mistral, Qwen2; HF LlamaRMSNorm in fp32).
//   y[n, c] = x[n, c] * rstd[n] * weight[c],   rstd[n] = 1 / sqrt(mean_c(x[n, c]^2) + eps)
// Backward, with norm = x * rstd and g = dy * weight:
//   dx = rstd * (g - norm * mean_c(g * norm)),   dweight[c] += sum_n dy[n, c] * norm[n, c]
// Shapes: x, y, dy, dx (N, C) (any leading dims, flattened to N rows) | weight, dweight (C) |
//   rstd (N) f32, saved by the forward for the backward.
// Dtypes: CPU f32. CUDA: bf16 x, y, weight; f32 rstd.
// Gradients: dx per `dx_mode` (= or +=); dweight accumulates (+=), may be null (frozen).
// Deterministic (fp64 row sums; dweight sums rows in order).
// y_amax (forwards, (1) f32, or null): amax(y) as ops/fp8_cast.h defines it, over the values y
//   holds (bf16 on CUDA, f32 on the CPU), for an fp8 cast of y that follows
//   (Fp8CastArgs::amax_ready, LinearSpec::x_amax): CUDA computes it as y is written, so the
//   cast reads y once instead of twice.
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void rmsnorm_forward(TensorView y, TensorView rstd, ConstTensorView x, ConstTensorView weight,
                     float eps, const Context& ctx, TensorView y_amax = {});

// The residual add before a norm, fused (a block's x_mid = x + o followed by norm2):
//   x_out = a + b  (residual_forward),  then  rmsnorm_forward(y, rstd, x_out, ...)
// with the same results bit for bit on either backend (the CPU runs the two ops; CUDA one kernel
// that rounds the sum to bf16 as residual_forward does and normalizes the rounded row, saving a
// pass over x_out and a launch). Shapes: a, b, x_out, y (N, C); x_out may be a or b.
void rmsnorm_residual_forward(TensorView x_out, TensorView y, TensorView rstd, ConstTensorView a,
                              ConstTensorView b, ConstTensorView weight, float eps,
                              const Context& ctx, TensorView y_amax = {});

void rmsnorm_backward(TensorView dx, TensorView dweight, ConstTensorView dy, ConstTensorView x,
                      ConstTensorView weight, ConstTensorView rstd, GradMode dx_mode,
                      const Context& ctx);

}  // namespace lathe
