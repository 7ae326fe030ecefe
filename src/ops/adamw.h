#pragma once
// AdamW with decoupled weight decay and bias correction, exactly torch.optim.AdamW's update
// (amsgrad=False, maximize=False), over fp32 master weights and fp32 moments.
// For update number t >= 1 (counting this one) and every element of every segment:
//   p = p * (1 - lr * wd)
//   m = m + (1 - beta1) * (g - m)     (torch's lerp, one fused multiply-add)
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// with the per-segment lr and wd (parameter groups: no decay on norms and biases), scalars
// (1 - lr*wd, the bias corrections, the step size) formed in fp64 as torch forms them in Python,
// and the elementwise math in fp32 in torch's order.
// Layout: params, m, v, grads are the same flat f32 buffers of P elements (a parameter arena and
//   its twins seen as one vector); segments name the [offset, offset + count) ranges to update
//   and their group's lr and weight decay. Elements outside every segment are left alone.
//   Segments must lie inside [0, P) and not overlap (checked).
// Dtypes: params and grads f32; m and v both f32, or both bf16 (optimizer.state_dtype: bf16):
//   each moment load widens exactly, the update above runs in f32 (p from the unrounded m and v),
//   each moment store rounds to nearest even (core/dtype.h float_to_bf16), as optim/cpu_adamw.h's
//   kBF16 storage does, bit for bit (on CUDA for every value but NaN, which stays NaN with the
//   GPU's canonical bits).
//   adamw_update_with_copy also writes params_bf16 (P bf16,
//   element for element params' twin), the updated weights rounded to nearest even, for every
//   element of every segment: the compute copy the CUDA forward reads, written in the same pass.
// Deterministic (elementwise).
#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

// Hyperparameters are doubles, like the Python floats torch forms its scalars from; the
// elementwise math converts them to fp32 where torch does.
struct AdamWSegment {
    int64_t offset = 0;
    int64_t count = 0;
    double lr = 0.0;
    double weight_decay = 0.0;
};

struct AdamWHyper {
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
};

// step is t, the number of this update (1 for the first). params, m, v are updated in place.
void adamw_update(TensorView params, TensorView m, TensorView v, ConstTensorView grads,
                  std::span<const AdamWSegment> segments, const AdamWHyper& hyper, int64_t step,
                  const Context& ctx);

// adamw_update, then params_bf16[i] = bf16(params[i]) over the segments (null: no copy).
// With clip_norm (one f32, where ctx computes: the norm grad_norm_l2 wrote) the update uses the
// gradients as grad_clip_by_norm(grads, clip_norm, max_norm) would leave them, without writing
// them: the same bits as clipping first (the CUDA kernel scales each element in registers; the
// CPU reference scales a copy). Null clip_norm: no clipping.
void adamw_update_with_copy(TensorView params, TensorView params_bf16, TensorView m, TensorView v,
                            ConstTensorView grads, std::span<const AdamWSegment> segments,
                            const AdamWHyper& hyper, int64_t step, ConstTensorView clip_norm,
                            float max_norm, const Context& ctx);

}  // namespace lathe
