#pragma once
// CPU reference kernel behind ops/adamw.h (flat f32 buffers).
#include <cstdint>

namespace lathe::cpu {

// One contiguous range of one parameter group: n elements, its scalars already formed.
void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, double lr,
                  double weight_decay, double beta1, double beta2, double eps, int64_t step);

}  // namespace lathe::cpu
