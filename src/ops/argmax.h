#pragma once
// The index of each row's largest value: greedy decoding where the logits are.
//   ids[n] = the lowest i with x[n, i] = max over the row, NaN counted as -inf (a row of only
//            -inf and NaN gives 0)
// The rule of infer/sampling.h's temperature 0, so a device's argmax picks the token the host's
// sampler would pick from the same (widened) logits.
// Shapes: x (N, V), ids (N). Dtypes: CPU x f32; CUDA x bf16 (bf16 to f32 widening is exact, so
// the pick equals the host's over the widened row); ids i32 on both. Enqueued on the context's
// stream on CUDA.
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void argmax_rows(TensorView ids, ConstTensorView x, const Context& ctx);

}  // namespace lathe
