#pragma once
// CPU reference kernels behind ops/residual.h.
#include <cstdint>

namespace lathe::cpu {

// out may equal a or b. da, db may be null.
void residual_forward(float* out, const float* a, const float* b, int64_t n);
void residual_backward(float* da, float* db, const float* dout, int64_t n);

}  // namespace lathe::cpu
