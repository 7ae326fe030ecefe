#pragma once
// CPU reference kernels behind ops/gelu.h.
#include <cstdint>

namespace lathe::cpu {

// tanh_approx selects GPT-2's tanh form over the exact erf form. y may equal x, dx may equal dy.
void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx);

}  // namespace lathe::cpu
