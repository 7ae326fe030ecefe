#pragma once
// Linear layer with Hugging Face's weight layout [out, in] (nn.Linear), optional bias.
//   y[n, o] = sum_i x[n, i] * weight[o, i] + bias[o]           (y = x W^T + b)
// Backward:
//   dx = dy W            dweight += dy^T x            dbias += sum_n dy[n, :]
// Shapes: x, dx (N, I) (leading dims flattened) | y, dy (N, O) | weight, dweight (O, I) |
//   bias, dbias (O) or null (no bias). Fused projections are one linear over stacked weights:
//   q/k/v (O = (H + 2 Hkv) D) and gate/up (O = 2F) stack row blocks, which is how an arena holding
//   HF's separate [out, in] tensors next to each other lays them out anyway.
// Dtypes: CPU f32 (sgemm from BLAS when the build has it, plain loops otherwise).
//   CUDA (issue 4): bf16 x, y, weight (cuBLASLt, bias epilogue), f32 accumulation.
// Gradients: dx per `dx_mode` (= or +=), null when the input needs none; dweight and dbias
//   accumulate (+=), null when frozen.
// Deterministic for a given BLAS build, whatever the thread count (dbias: fp64 row sums in order).
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void linear_forward(TensorView y, ConstTensorView x, ConstTensorView weight, ConstTensorView bias,
                    const Context& ctx);

void linear_backward(TensorView dx, TensorView dweight, TensorView dbias, ConstTensorView dy,
                     ConstTensorView x, ConstTensorView weight, GradMode dx_mode,
                     const Context& ctx);

}  // namespace lathe
