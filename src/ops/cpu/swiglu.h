#pragma once
// CPU reference kernels behind ops/swiglu.h.
#include <cstdint>

namespace lathe::cpu {

// gate_up (N, 2F) rows [gate | up]; out (N, F).
void swiglu_forward(float* out, const float* gate_up, int64_t N, int64_t F);
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                     int64_t F);

}  // namespace lathe::cpu
