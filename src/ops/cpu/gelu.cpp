#include "ops/cpu/gelu.h"

#include <cmath>
#include <numbers>

#include "ops/cpu/parallel.h"

namespace lathe::cpu {

namespace {
constexpr double kGeluTanhCoef = 0.044715;
const double kSqrt2OverPi = std::sqrt(2.0 / std::numbers::pi);
const double kInvSqrt2 = 1.0 / std::numbers::sqrt2;
const double kInvSqrt2Pi = 1.0 / std::sqrt(2.0 * std::numbers::pi);
}  // namespace

void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx) {
    LATHE_OMP_PARALLEL_FOR(n * 8)
    for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        const double cdf =
            tanh_approx ? 0.5 * (1.0 + std::tanh(kSqrt2OverPi * (v + kGeluTanhCoef * v * v * v)))
                        : 0.5 * (1.0 + std::erf(v * kInvSqrt2));
        y[i] = float(v * cdf);
    }
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx) {
    LATHE_OMP_PARALLEL_FOR(n * 8)
    for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        double grad;
        if (tanh_approx) {
            const double th = std::tanh(kSqrt2OverPi * (v + kGeluTanhCoef * v * v * v));
            grad = 0.5 * (1.0 + th) +
                   0.5 * v * (1.0 - th * th) * kSqrt2OverPi * (1.0 + 3.0 * kGeluTanhCoef * v * v);
        } else {
            grad = 0.5 * (1.0 + std::erf(v * kInvSqrt2)) + v * kInvSqrt2Pi * std::exp(-0.5 * v * v);
        }
        dx[i] = float(double(dy[i]) * grad);
    }
}

}  // namespace lathe::cpu
