#pragma once
// CPU reference kernels behind ops/swiglu.h, ops/gelu.h and ops/residual.h (elementwise ops).
#include <cstdint>

namespace lathe::cpu {

// gate_up (N, 2F) rows [gate | up]; out (N, F).
void swiglu_forward(float* out, const float* gate_up, int64_t N, int64_t F);
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                     int64_t F);

// tanh_approx selects GPT-2's tanh form over the exact erf form. y may equal x, dx may equal dy.
void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx);

// out may equal a or b. da, db may be null.
void residual_forward(float* out, const float* a, const float* b, int64_t n);
void residual_backward(float* da, float* db, const float* dout, int64_t n);

}  // namespace lathe::cpu
