#pragma once
// SwiGLU, the gated MLP activation of Llama, Mistral and Qwen2: silu(gate) * up.
//   out[n, f] = silu(gate_up[n, f]) * gate_up[n, F + f],   silu(g) = g * sigmoid(g)
// Backward, with sg = sigmoid(gate):
//   dgate = dout * up * sg * (1 + gate * (1 - sg)),   dup = dout * silu(gate)
// Shapes: gate_up, dgate_up (N, 2F): each row is [gate | up], as the fused gate_proj/up_proj linear
//   (weights stacked [gate_proj; up_proj], linear.h) writes it | out, dout (N, F).
// Dtypes: CPU f32. CUDA: bf16, f32 math.
// Gradients: dgate_up is overwritten (=). Deterministic (elementwise).
// out_amax (forward, (1) f32, or null): amax(out) as ops/fp8_cast.h defines it, over the values
//   out holds (bf16 on CUDA, f32 on the CPU), for an fp8 cast of out that follows
//   (Fp8CastArgs::amax_ready, LinearSpec::x_amax): CUDA computes it as out is written, so the
//   cast reads out once instead of twice. dgate_up_amax (backward): the same of dgate_up, for the
//   fp8 cast of the gradient in the gate/up projection's backward (LinearSpec::dy_amax).
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void swiglu_forward(TensorView out, ConstTensorView gate_up, const Context& ctx,
                    TensorView out_amax = {});

void swiglu_backward(TensorView dgate_up, ConstTensorView dout, ConstTensorView gate_up,
                     const Context& ctx, TensorView dgate_up_amax = {});

}  // namespace lathe
