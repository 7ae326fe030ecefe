#pragma once
// CUDA LM head fused with softmax cross-entropy (ops/lm_head_cross_entropy.h has the math).
// x (N, C) bf16, weight (V, C) bf16, targets (N) i32 (-100 = ignored); loss (1), losses (N) (may be
// null), lse (N) f32; dx (N, C) bf16 (=); dweight (V, C) f32 (+=, may be null).
//
// Rows go Nc at a time (Nc = the scratch's rows); per chunk of r <= Nc rows:
//   1. cuBLASLt: logits (r, V) f32 in scratch = x_chunk . weight^T (fp32 accumulation)
//   2. one block per row: max and sum of exponentials (per-thread online max/sum, then a fixed
//      block reduction), lse and the row's loss; for a backward, dlogits
//      = dloss / count * (softmax - onehot(target)) rounded to bf16 and written over the row's own
//      first 2V bytes (a bf16 matrix with row stride 2V elements inside the f32 scratch: tile by
//      tile, every thread reads its f32 logits, the block synchronizes, then writes, so no write
//      lands on a logit not yet read). Only the (Nc, V) f32 chunk ever exists.
//   3. cuBLASLt: dx_chunk (r, C) bf16 = dlogits . weight;  dweight (V, C) f32 += dlogits^T .
//   x_chunk
// count (rows with a target) is reduced on the device, so nothing waits for the host; a target
// neither -100 nor in [0, V) traps the kernel. The mean loss is an fp64 sum over rows in a fixed
// order. Deterministic. The state's scratch holds count, and lse/losses where the caller gives
// none.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe {
struct CudaState;
}

namespace lathe::cuda {

void lm_head_cross_entropy_forward(CudaState& state, CUstream_st* stream, float* loss,
                                   float* losses, float* lse, const bf16* x, const int32_t* targets,
                                   const bf16* weight, float* scratch, int64_t N, int64_t C,
                                   int64_t V, int64_t Nc);

void lm_head_cross_entropy_backward(CudaState& state, CUstream_st* stream, bf16* dx, float* dweight,
                                    const bf16* x, const int32_t* targets, const bf16* weight,
                                    const float* lse, float dloss, float* scratch, int64_t N,
                                    int64_t C, int64_t V, int64_t Nc);

void lm_head_cross_entropy_forward_backward(CudaState& state, CUstream_st* stream, float* loss,
                                            float* losses, bf16* dx, float* dweight, const bf16* x,
                                            const int32_t* targets, const bf16* weight, float dloss,
                                            float* scratch, int64_t N, int64_t C, int64_t V,
                                            int64_t Nc);

}  // namespace lathe::cuda
