#include "ops/cpu/rmsnorm.h"

#include <cmath>

#include "ops/cpu/parallel.h"

namespace lathe::cpu {

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* weight, int64_t N,
                     int64_t C, float eps) {
    LATHE_OMP_PARALLEL_FOR(N * C * 2)
    for (int64_t n = 0; n < N; ++n) {
        const float* xr = x + n * C;
        double sum_sq = 0.0;
        for (int64_t c = 0; c < C; ++c) sum_sq += double(xr[c]) * xr[c];
        const float s = float(1.0 / std::sqrt(sum_sq / double(C) + double(eps)));
        rstd[n] = s;
        for (int64_t c = 0; c < C; ++c) y[n * C + c] = xr[c] * s * weight[c];
    }
}

// With norm = x * s and g = dy * weight:  dx = s * (g - norm * mean_c(g * norm)).
void rmsnorm_backward(float* dx, float* dweight, const float* dy, const float* x,
                      const float* weight, const float* rstd, int64_t N, int64_t C,
                      bool accumulate_dx) {
    LATHE_OMP_PARALLEL_FOR(N * C * 2)
    for (int64_t n = 0; n < N; ++n) {
        const float s = rstd[n];
        const float* xr = x + n * C;
        const float* dyr = dy + n * C;
        double mean_g_norm = 0.0;
        for (int64_t c = 0; c < C; ++c) mean_g_norm += double(dyr[c]) * weight[c] * xr[c] * s;
        mean_g_norm /= double(C);
        for (int64_t c = 0; c < C; ++c) {
            const float norm = xr[c] * s;
            const float g = s * (dyr[c] * weight[c] - norm * float(mean_g_norm));
            dx[n * C + c] = accumulate_dx ? dx[n * C + c] + g : g;
        }
    }
    if (dweight == nullptr) return;
    // Threads split channels; each sums its column over rows in order (deterministic).
    LATHE_OMP_PARALLEL_FOR(N * C)
    for (int64_t c = 0; c < C; ++c) {
        double acc = 0.0;
        for (int64_t n = 0; n < N; ++n) acc += double(dy[n * C + c]) * (x[n * C + c] * rstd[n]);
        dweight[c] += float(acc);
    }
}

}  // namespace lathe::cpu
