#pragma once
// CPU reference kernel behind ops/adamw.h (flat f32 buffers; the moments f32 or bf16).
#include <cstdint>

#include "core/dtype.h"

namespace lathe::cpu {

// One contiguous range of one parameter group: n elements, its scalars already formed. With bf16
// moments each load widens exactly and each store rounds to nearest even (float_to_bf16); the
// update between them is the f32 one.
void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, double lr,
                  double weight_decay, double beta1, double beta2, double eps, int64_t step);
void adamw_update(float* params, bf16* m, bf16* v, const float* grads, int64_t n, double lr,
                  double weight_decay, double beta1, double beta2, double eps, int64_t step);

}  // namespace lathe::cpu
