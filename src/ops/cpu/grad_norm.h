#pragma once
// CPU reference kernels behind ops/grad_norm.h (flat f32 buffers).
#include <cstdint>

namespace lathe::cpu {

// sum of g^2 over n elements in fp64, in fixed blocks summed in order (thread-count independent).
double sum_of_squares(const float* g, int64_t n);

// g *= coef.
void scale_inplace(float* g, int64_t n, float coef);

}  // namespace lathe::cpu
