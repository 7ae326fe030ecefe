#pragma once
// GELU in its two forms.
//   kErf  (HF "gelu", GPT-NeoX/Pythia):  y = 0.5 x (1 + erf(x / sqrt 2))
//   kTanh (HF "gelu_new", GPT-2):        y = 0.5 x (1 + tanh u),  u = sqrt(2/pi) (x + 0.044715 x^3)
// Backward:
//   kErf:  dx = dout * (Phi(x) + x phi(x)),  Phi, phi the standard normal cdf and pdf
//   kTanh: dx = dout * (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2))
// Shapes: x, y, dy, dx: any shape, all equal. y may be x (in place) and dx may be dout.
// Dtypes: CPU f32 (math in fp64). CUDA: bf16, f32 math.
// Gradients: dx is overwritten (=). Deterministic (elementwise).
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

enum class GeluKind { kErf, kTanh };

void gelu_forward(TensorView y, ConstTensorView x, GeluKind kind, const Context& ctx);

void gelu_backward(TensorView dx, ConstTensorView dy, ConstTensorView x, GeluKind kind,
                   const Context& ctx);

}  // namespace lathe
