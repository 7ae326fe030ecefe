#pragma once
// CUDA global gradient L2 norm and clipping (ops/grad_norm.h has the math: clip_grad_norm_).
//   grad_norm_l2:      norm (1) f32 on the device = sqrt(sum over tensors and elements of g^2)
//   grad_clip_by_norm: g *= min(1, max_norm / (norm + 1e-6)) when that is < 1 and norm is finite,
//                      reading norm on the device (no host round trip)
// Gradients are f32. Two-pass deterministic reduction: pass 1 gives each tensor a block count that
// depends on its size only, each block sums a fixed grid-stride share of g^2 in fp64 and writes
// one partial; pass 2 (one block) sums all partials in order, in fp64. No atomics.
// The partials live in the state's scratch. Enqueued on `stream` (the state's).

#include <cstdint>
#include <span>

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

// One device pointer and element count per gradient tensor, read-only (norm) or scaled (clip).
struct ConstGradSpan {
    const float* data;
    int64_t count;
};
struct GradSpan {
    float* data;
    int64_t count;
};

void grad_norm_l2(float* norm, std::span<const ConstGradSpan> grads, CudaState& state,
                  CUstream_st* stream);

void grad_clip_by_norm(std::span<const GradSpan> grads, const float* norm, float max_norm,
                       CUstream_st* stream);

}  // namespace lathe::cuda
