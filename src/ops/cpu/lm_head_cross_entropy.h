#pragma once
// CPU reference kernels behind ops/lm_head_cross_entropy.h. x (N, C), weight (V, C),
// targets (N), scratch (Nc, V).
#include <cstdint>

namespace lathe::cpu {

// losses may be null. vocab_begin, vocab_total: a vocabulary shard (LmHeadVocabShard; 0, 0: the
// whole vocabulary).
void lm_head_cross_entropy_forward(float* loss, float* losses, float* lse, const float* x,
                                   const int32_t* targets, const float* weight, float* scratch,
                                   int64_t N, int64_t C, int64_t V, int64_t Nc,
                                   int64_t vocab_begin = 0, int64_t vocab_total = 0);

// dweight may be null.
void lm_head_cross_entropy_backward(float* dx, float* dweight, const float* x,
                                    const int32_t* targets, const float* weight, const float* lse,
                                    float dloss, float* scratch, int64_t N, int64_t C, int64_t V,
                                    int64_t Nc, int64_t vocab_begin = 0, int64_t vocab_total = 0);

// Both in one pass; losses and dweight may be null.
void lm_head_cross_entropy_forward_backward(float* loss, float* losses, float* dx, float* dweight,
                                            const float* x, const int32_t* targets,
                                            const float* weight, float dloss, float* scratch,
                                            int64_t N, int64_t C, int64_t V, int64_t Nc);

}  // namespace lathe::cpu
