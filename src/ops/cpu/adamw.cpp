#include "ops/cpu/adamw.h"

#include <cmath>

#include "ops/cpu/parallel.h"

namespace lathe::cpu {

// torch.optim.AdamW, single-tensor path (what torch runs for CPU tensors), step by step:
//   param.mul_(1 - lr * weight_decay)
//   exp_avg.lerp_(grad, 1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   step_size = lr / (1 - beta1 ** step);  bc2_sqrt = sqrt(1 - beta2 ** step)
//   denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-step_size)
// Scalars are Python floats (fp64) and meet fp32 tensors as fp32. torch's CPU lerp is one fused
// multiply-add: fma(weight, end - self, self) for weight < 0.5, else fma(weight - 1, end - self,
// end); addcmul is self + value * t1 * t2 and addcdiv self + value * t1 / t2, unfused. With these
// the ten-step fixture in adamw_test.cpp matches torch bit for bit.
namespace {

inline float load_moment(const float* s, int64_t i) {
    return s[i];
}
inline float load_moment(const bf16* s, int64_t i) {
    return bf16_to_float(s[i]);
}
inline void store_moment(float* s, int64_t i, float x) {
    s[i] = x;
}
inline void store_moment(bf16* s, int64_t i, float x) {
    s[i] = float_to_bf16(x);
}

template <typename M>
void adamw_range(float* params, M* m, M* v, const float* grads, int64_t n, double lr,
                 double weight_decay, double beta1, double beta2, double eps, int64_t step) {
    const float decay = float(1.0 - lr * weight_decay);
    const bool apply_decay = weight_decay != 0.0;
    const double bias_correction1 = 1.0 - std::pow(beta1, double(step));
    const double bias_correction2 = 1.0 - std::pow(beta2, double(step));
    const float neg_step_size = float(-(lr / bias_correction1));
    const float bc2_sqrt = float(std::sqrt(bias_correction2));
    const float w1 = float(1.0 - beta1), b2 = float(beta2), w2 = float(1.0 - beta2);
    const float epsf = float(eps);
    const bool lerp_low = std::fabs(1.0 - beta1) < 0.5;
    LATHE_OMP_PARALLEL_FOR(n * 8)
    for (int64_t i = 0; i < n; ++i) {
        const float g = grads[i];
        float p = params[i];
        if (apply_decay) p = p * decay;
        const float mo = load_moment(m, i);
        const float mi = lerp_low ? std::fma(w1, g - mo, mo) : std::fma(w1 - 1.0f, g - mo, g);
        const float vi = load_moment(v, i) * b2 + w2 * g * g;
        const float denom = std::sqrt(vi) / bc2_sqrt + epsf;
        params[i] = p + neg_step_size * mi / denom;
        store_moment(m, i, mi);
        store_moment(v, i, vi);
    }
}

}  // namespace

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, double lr,
                  double weight_decay, double beta1, double beta2, double eps, int64_t step) {
    adamw_range(params, m, v, grads, n, lr, weight_decay, beta1, beta2, eps, step);
}

void adamw_update(float* params, bf16* m, bf16* v, const float* grads, int64_t n, double lr,
                  double weight_decay, double beta1, double beta2, double eps, int64_t step) {
    adamw_range(params, m, v, grads, n, lr, weight_decay, beta1, beta2, eps, step);
}

}  // namespace lathe::cpu
