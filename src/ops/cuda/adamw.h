#pragma once
// CUDA AdamW over flat fp32 master weights (ops/adamw.h has the math: torch.optim.AdamW).
//   params, m, v (P) f32 updated in place from grads (P) f32, for every element of every segment;
//   params_bf16 (P) bf16, when not null, receives the updated weights rounded to nearest even:
//   the compute copy the forward reads, written in the same pass (no second sweep over P).
// The per-segment scalars (decay, step size) are formed on the host in fp64 as torch forms them;
// the elementwise arithmetic uses explicitly rounded intrinsics (__fmul_rn, __fadd_rn, fmaf,
// __fdiv_rn, __fsqrt_rn) in the CPU twin's order, so nvcc cannot contract it differently and the
// two backends compute the same bits. All segments go in ceil(S / 64) launches (the segment table
// travels as a kernel parameter), not one launch per tensor. Deterministic (elementwise).

#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "ops/adamw.h"

struct CUstream_st;

namespace lathe::cuda {

// Segments must lie in [0, P) and not overlap (the dispatcher checks); step >= 1.
// clip_norm (device, one f32), when not null, is the gradient norm grad_norm_l2 wrote: every
// gradient element is first scaled as grad_clip_by_norm would scale it (coef = max_norm /
// (norm + 1e-6) when below 1 and the norm is finite), in registers: the gradients in memory stay
// unclipped, and the separate clip pass over them (a read and a write of every gradient) is gone.
void adamw_update(float* params, bf16* params_bf16, float* m, float* v, const float* grads,
                  std::span<const AdamWSegment> segments, const AdamWHyper& hyper, int64_t step,
                  const float* clip_norm, float max_norm, CUstream_st* stream);
// The same over bf16 moments (ops/adamw.h: widened on load, rounded to nearest even on store).
void adamw_update(float* params, bf16* params_bf16, bf16* m, bf16* v, const float* grads,
                  std::span<const AdamWSegment> segments, const AdamWHyper& hyper, int64_t step,
                  const float* clip_norm, float max_norm, CUstream_st* stream);

}  // namespace lathe::cuda
