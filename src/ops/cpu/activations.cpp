#include "ops/cpu/activations.h"

#include <cmath>
#include <numbers>

#include "ops/cpu/parallel.h"

namespace lathe::cpu {

namespace {
constexpr double kGeluTanhCoef = 0.044715;
const double kSqrt2OverPi = std::sqrt(2.0 / std::numbers::pi);
const double kInvSqrt2 = 1.0 / std::numbers::sqrt2;
const double kInvSqrt2Pi = 1.0 / std::sqrt(2.0 * std::numbers::pi);

double sigmoid(double x) {
    return 1.0 / (1.0 + std::exp(-x));
}
}  // namespace

void swiglu_forward(float* out, const float* gate_up, int64_t N, int64_t F) {
    LATHE_OMP_PARALLEL_FOR(N * F * 8)
    for (int64_t n = 0; n < N; ++n) {
        const float* gate = gate_up + n * 2 * F;
        const float* up = gate + F;
        for (int64_t f = 0; f < F; ++f) {
            const double g = gate[f];
            out[n * F + f] = float(g * sigmoid(g) * up[f]);
        }
    }
}

// d/dg silu(g) = sg + g sg (1 - sg) = sg (1 + g (1 - sg)),  sg = sigmoid(g).
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                     int64_t F) {
    LATHE_OMP_PARALLEL_FOR(N * F * 8)
    for (int64_t n = 0; n < N; ++n) {
        const float* gate = gate_up + n * 2 * F;
        const float* up = gate + F;
        float* dgate = dgate_up + n * 2 * F;
        float* dup = dgate + F;
        for (int64_t f = 0; f < F; ++f) {
            const double g = gate[f], sg = sigmoid(g), d = dout[n * F + f];
            dgate[f] = float(d * up[f] * sg * (1.0 + g * (1.0 - sg)));
            dup[f] = float(d * g * sg);
        }
    }
}

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

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
    LATHE_OMP_PARALLEL_FOR(n)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, int64_t n) {
    LATHE_OMP_PARALLEL_FOR(n)
    for (int64_t i = 0; i < n; ++i) {
        if (da) da[i] += dout[i];
        if (db) db[i] += dout[i];
    }
}

}  // namespace lathe::cpu
