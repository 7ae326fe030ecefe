#pragma once
// Global gradient L2 norm and clipping, as torch.nn.utils.clip_grad_norm_ (norm_type 2).
//   norm = sqrt(sum over all tensors, all elements of g^2)
//   coef = min(1, max_norm / (norm + 1e-6));   g = g * coef   (only when coef < 1)
// The norm is accumulated in fp64 in a fixed order (tensor by tensor, fixed blocks within one),
// so it is deterministic and independent of the thread count.
// Shapes: each gradient any shape (a whole gradient arena seen flat is one tensor) | norm (1) f32.
// Dtypes: f32 (CPU). CUDA: f32 gradients, norm left on the device for clip to read.
// A NaN or Inf gradient gives a NaN/Inf norm, which the trainer's skip-step policy looks at; clip
// then leaves the gradients as they are (torch would multiply them by NaN).
#include <span>

#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

void grad_norm_l2(TensorView norm, std::span<const ConstTensorView> grads, const Context& ctx);

// Scales every gradient by min(1, max_norm / (norm + 1e-6)), reading norm (1) as grad_norm_l2
// wrote it. max_norm > 0 (checked).
void grad_clip_by_norm(std::span<const TensorView> grads, ConstTensorView norm, float max_norm,
                       const Context& ctx);

// The clip coefficient in torch's fp32 arithmetic: min(1, max_norm / (norm + 1e-6)).
float grad_clip_coefficient(float norm, float max_norm);

}  // namespace lathe
