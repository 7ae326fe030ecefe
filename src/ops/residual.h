#pragma once
// Residual add, the skip connection around each block.
//   out = a + b   (elementwise)
// Backward: the gradient reaches both inputs unchanged:  da += dout,  db += dout.
// (Models usually fold this into the norm's backward with GradMode::kAccumulate, which adds the
// branch's gradient into the residual stream's gradient in place.)
// Shapes: a, b, out, da, db, dout: any shape, all equal. out may be a or b (in place).
//   da and db must not be dout (checked); either may be null.
// Dtypes: CPU f32. CUDA: bf16. Gradients: da, db accumulate (+=). Deterministic.
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void residual_forward(TensorView out, ConstTensorView a, ConstTensorView b, const Context& ctx);

void residual_backward(TensorView da, TensorView db, ConstTensorView dout, const Context& ctx);

}  // namespace lathe
