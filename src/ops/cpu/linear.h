#pragma once
// CPU reference kernels behind ops/linear.h.
#include <cstdint>

namespace lathe::cpu {

// bias may be null.
void linear_forward(float* y, const float* x, const float* weight, const float* bias, int64_t N,
                    int64_t I, int64_t O);
// dx, dweight, dbias may each be null; accumulate_dx selects dx += instead of dx =.
void linear_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                     const float* weight, int64_t N, int64_t I, int64_t O, bool accumulate_dx);

}  // namespace lathe::cpu
