#pragma once
// Token embedding, plus learned absolute positions where the model has them (GPT-2's wpe).
//   out[b, t, :] = wte[tokens[b, t], :] + wpe[pos(b, t), :]    (wpe term only when wpe is given)
//   pos(b, t) = positions[b, t] when positions is given, else t.
// Shapes: tokens, positions (B, T) i32 | wte, dwte (V, C) | wpe, dwpe (P, C) | out, dout (B, T, C).
//   positions, wpe, dwpe may be null (no learned positions; positions default to 0..T-1).
// Dtypes: CPU f32 (ids i32). CUDA: bf16 out and weights.
// Gradients: dwte and dwpe accumulate (+=): over micro-batches, and with the tied LM head, which
//   adds its weight gradient to the same dwte. Either may be null (frozen).
// Token ids outside [0, V) and positions outside [0, P) are bugs upstream (the data layer checks
// token files against the vocabulary): checked on the CPU.
// Deterministic: each element of dwte sums its rows in (b, t) order (CPU: threads split columns).
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void embedding_forward(TensorView out, ConstTensorView tokens, ConstTensorView positions,
                       ConstTensorView wte, ConstTensorView wpe, const Context& ctx);

void embedding_backward(TensorView dwte, TensorView dwpe, ConstTensorView dout,
                        ConstTensorView tokens, ConstTensorView positions, const Context& ctx);

}  // namespace lathe
