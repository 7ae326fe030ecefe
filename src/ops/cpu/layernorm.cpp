#include "ops/cpu/layernorm.h"

#include <cmath>

#include "ops/cpu/parallel.h"

namespace lathe::cpu {

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps) {
    LATHE_OMP_PARALLEL_FOR(N * C * 3)
    for (int64_t n = 0; n < N; ++n) {
        const float* xr = x + n * C;
        double m = 0.0;
        for (int64_t c = 0; c < C; ++c) m += xr[c];
        m /= double(C);
        double var = 0.0;  // two passes: no cancellation from E[x^2] - E[x]^2
        for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
        var /= double(C);
        const float s = float(1.0 / std::sqrt(var + double(eps)));
        mean[n] = float(m);
        rstd[n] = s;
        for (int64_t c = 0; c < C; ++c) y[n * C + c] = (xr[c] - float(m)) * s * weight[c] + bias[c];
    }
}

// With xhat = (x - mean) * s and g = dy * weight:  dx = s * (g - mean(g) - xhat * mean(g * xhat)).
void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                        const float* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, bool accumulate_dx) {
    LATHE_OMP_PARALLEL_FOR(N * C * 3)
    for (int64_t n = 0; n < N; ++n) {
        const float s = rstd[n], m = mean[n];
        const float* xr = x + n * C;
        const float* dyr = dy + n * C;
        double mean_g = 0.0, mean_g_xhat = 0.0;
        for (int64_t c = 0; c < C; ++c) {
            const double g = double(dyr[c]) * weight[c];
            mean_g += g;
            mean_g_xhat += g * ((xr[c] - m) * s);
        }
        mean_g /= double(C);
        mean_g_xhat /= double(C);
        for (int64_t c = 0; c < C; ++c) {
            const float xhat = (xr[c] - m) * s;
            const float g = s * (dyr[c] * weight[c] - float(mean_g) - xhat * float(mean_g_xhat));
            dx[n * C + c] = accumulate_dx ? dx[n * C + c] + g : g;
        }
    }
    if (dweight == nullptr && dbias == nullptr) return;
    LATHE_OMP_PARALLEL_FOR(N * C * 2)
    for (int64_t c = 0; c < C; ++c) {
        double dw = 0.0, db = 0.0;
        for (int64_t n = 0; n < N; ++n) {
            dw += double(dy[n * C + c]) * ((x[n * C + c] - mean[n]) * rstd[n]);
            db += dy[n * C + c];
        }
        if (dweight) dweight[c] += float(dw);
        if (dbias) dbias[c] += float(db);
    }
}

}  // namespace lathe::cpu
