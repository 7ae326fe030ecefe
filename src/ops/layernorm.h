#pragma once
// LayerNorm over the last dimension, with weight and bias (GPT-2, GPT-NeoX; torch.nn.LayerNorm).
//   mean[n] = mean_c x[n, c],  rstd[n] = 1 / sqrt(mean_c (x[n, c] - mean[n])^2 + eps)  (biased var)
//   y[n, c] = (x[n, c] - mean[n]) * rstd[n] * weight[c] + bias[c]
// Backward, with xhat = (x - mean) * rstd and g = dy * weight:
//   dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
//   dweight[c] += sum_n dy[n, c] * xhat[n, c],   dbias[c] += sum_n dy[n, c]
// Shapes: x, y, dy, dx (N, C) (leading dims flattened) | weight, bias, dweight, dbias (C) |
//   mean, rstd (N) f32, saved by the forward for the backward.
// Dtypes: CPU f32. CUDA: bf16 x, y, weight, bias; f32 mean, rstd.
// Gradients: dx per `dx_mode` (= or +=); dweight, dbias accumulate (+=), may be null (frozen).
// Deterministic (fp64 row statistics; parameter gradients sum rows in order).
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void layernorm_forward(TensorView y, TensorView mean, TensorView rstd, ConstTensorView x,
                       ConstTensorView weight, ConstTensorView bias, float eps, const Context& ctx);

// The residual add before a norm, fused (a block's x_mid = x + o followed by norm2):
//   x_out = a + b  (residual_forward),  then  layernorm_forward(y, mean, rstd, x_out, ...)
// with the same results bit for bit on either backend (the CPU runs the two ops; CUDA one kernel
// that rounds the sum to bf16 as residual_forward does and normalizes the rounded row, saving a
// pass over x_out and a launch). Shapes: a, b, x_out, y (N, C); x_out may be a or b.
void layernorm_residual_forward(TensorView x_out, TensorView y, TensorView mean, TensorView rstd,
                                ConstTensorView a, ConstTensorView b, ConstTensorView weight,
                                ConstTensorView bias, float eps, const Context& ctx);

void layernorm_backward(TensorView dx, TensorView dweight, TensorView dbias, ConstTensorView dy,
                        ConstTensorView x, ConstTensorView weight, ConstTensorView mean,
                        ConstTensorView rstd, GradMode dx_mode, const Context& ctx);

}  // namespace lathe
