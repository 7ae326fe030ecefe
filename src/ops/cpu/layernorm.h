#pragma once
// CPU reference kernels behind ops/layernorm.h.
#include <cstdint>

namespace lathe::cpu {

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps);
// dweight, dbias may be null; accumulate_dx selects dx += instead of dx =.
void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                        const float* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, bool accumulate_dx);

}  // namespace lathe::cpu
