#pragma once
// SwiGLU, the gated MLP activation of Llama, Mistral and Qwen2: silu(gate) * up.
//   out[n, f] = silu(gate_up[n, f]) * gate_up[n, F + f],   silu(g) = g * sigmoid(g)
// Backward, with sg = sigmoid(gate):
//   dgate = dout * up * sg * (1 + gate * (1 - sg)),   dup = dout * silu(gate)
// Shapes: gate_up, dgate_up (N, 2F): each row is [gate | up], as the fused gate_proj/up_proj linear
//   (weights stacked [gate_proj; up_proj], linear.h) writes it | out, dout (N, F).
// Dtypes: CPU f32. CUDA: bf16, f32 math.
// Gradients: dgate_up is overwritten (=). Deterministic (elementwise).
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void swiglu_forward(TensorView out, ConstTensorView gate_up, const Context& ctx);

void swiglu_backward(TensorView dgate_up, ConstTensorView dout, ConstTensorView gate_up,
                     const Context& ctx);

}  // namespace lathe
