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
//   CUDA: bf16 x, y, weight (cuBLASLt, bias epilogue), f32 accumulation.
// Gradients: dx per `dx_mode` (= or +=), null when the input needs none; dweight and dbias
//   accumulate (+=), null when frozen.
// Deterministic for a given BLAS build, whatever the thread count (dbias: fp64 row sums in order).
//
// The GELU MLP's projections as one op each (the CUDA backend computes the tanh GELU in the up
// projection's GEMM epilogue, ops/cuda/linear.h; the CPU runs the separate ops, bit for bit as
// the unfused sequence):
//   linear_gelu_forward:  pre = x W^T + b;  act = gelu(pre)
//       = linear_forward(pre, x, W, b) then gelu_forward(act, pre).
//   linear_gelu_backward, for the projection y = act W^T + b that reads act = gelu(pre):
//       dpre = gelu'(pre) * (dy W)  (=)        dweight += dy^T act        dbias += sum_n dy[n, :]
//       dpre_bias += sum_n dpre[n, :]           (the bias gradient of the linear that made pre)
//       = linear_backward(dpre, dweight, dbias, dy, act, W, overwrite), gelu_backward in place
//         on dpre, then dpre_bias as linear_backward computes a bias gradient.
//   Shapes: x (N, I), pre and act (N, F), W (F, I) and b (F) for the forward; dy (N, O),
//   act, pre, dpre (N, I), W (O, I), dpre_bias (I), dbias (O) for the backward (I is the GELU
//   width there). dpre_bias, dweight, dbias may be null (frozen). Dtypes as linear's.
//   On CUDA the tanh GELU runs inside cuBLASLt, from the fp32 accumulator (pre is still saved
//   rounded to bf16); the erf GELU, which cuBLASLt does not have, runs as the separate kernel.
#include "core/tensor.h"
#include "ops/context.h"
#include "ops/gelu.h"

namespace lathe {

void linear_forward(TensorView y, ConstTensorView x, ConstTensorView weight, ConstTensorView bias,
                    const Context& ctx);

// A projection whose output joins the residual stream:  y = residual + (x W^T + b).
//   = linear_forward(y, x, W, b) then residual_forward(y, residual, y): so on the CPU, bit for bit
//   a linear into a temporary followed by a residual add. CUDA: one GEMM reading the
//   residual as cuBLASLt's C (one bf16 rounding instead of two; no temporary, no add kernel).
//   Shapes: residual and y as y of linear_forward; y must not be residual or x (checked).
//   The backward is linear_backward's, with the residual's gradient passing through unchanged.
void linear_residual_forward(TensorView y, ConstTensorView x, ConstTensorView weight,
                             ConstTensorView bias, ConstTensorView residual, const Context& ctx);

void linear_backward(TensorView dx, TensorView dweight, TensorView dbias, ConstTensorView dy,
                     ConstTensorView x, ConstTensorView weight, GradMode dx_mode,
                     const Context& ctx);

void linear_gelu_forward(TensorView act, TensorView pre, ConstTensorView x, ConstTensorView weight,
                         ConstTensorView bias, GeluKind kind, const Context& ctx);

void linear_gelu_backward(TensorView dpre, TensorView dpre_bias, TensorView dweight,
                          TensorView dbias, ConstTensorView dy, ConstTensorView act,
                          ConstTensorView pre, ConstTensorView weight, GeluKind kind,
                          const Context& ctx);

}  // namespace lathe
