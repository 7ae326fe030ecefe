#include "ops/cpu/swiglu.h"

#include <cmath>

#include "ops/cpu/parallel.h"

namespace lathe::cpu {

namespace {
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

}  // namespace lathe::cpu
