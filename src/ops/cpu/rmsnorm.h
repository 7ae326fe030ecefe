#pragma once
// CPU reference kernels behind ops/rmsnorm.h.
#include <cstdint>

namespace lathe::cpu {

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* weight, int64_t N,
                     int64_t C, float eps);
// dweight may be null; accumulate_dx selects dx += instead of dx =.
void rmsnorm_backward(float* dx, float* dweight, const float* dy, const float* x,
                      const float* weight, const float* rstd, int64_t N, int64_t C,
                      bool accumulate_dx);

}  // namespace lathe::cpu
