#pragma once
// CPU reference kernels behind ops/adamw.h and ops/grad_norm.h (flat f32 buffers).
#include <cstdint>

namespace lathe::cpu {

// One contiguous range of one parameter group: n elements, its scalars already formed.
void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, double lr,
                  double weight_decay, double beta1, double beta2, double eps, int64_t step);

// sum of g^2 over n elements in fp64, in fixed blocks summed in order (thread-count independent).
double sum_of_squares(const float* g, int64_t n);

// g *= coef.
void scale_inplace(float* g, int64_t n, float coef);

}  // namespace lathe::cpu
