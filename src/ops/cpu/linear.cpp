#include "ops/cpu/linear.h"

#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"

namespace lathe::cpu {

void linear_forward(float* y, const float* x, const float* weight, const float* bias, int64_t N,
                    int64_t I, int64_t O) {
    // y (N, O) = x (N, I) @ weight^T, weight stored (O, I).
    sgemm(false, true, N, O, I, 1.0f, x, weight, 0.0f, y);
    if (bias == nullptr) return;
    LATHE_OMP_PARALLEL_FOR(N * O)
    for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < O; ++o) y[n * O + o] += bias[o];
}

void linear_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                     const float* weight, int64_t N, int64_t I, int64_t O, bool accumulate_dx) {
    // dx (N, I) = dy (N, O) @ weight (O, I)
    if (dx) sgemm(false, false, N, I, O, 1.0f, dy, weight, accumulate_dx ? 1.0f : 0.0f, dx);
    // dweight (O, I) += dy^T (O, N) @ x (N, I)
    if (dweight) sgemm(true, false, O, I, N, 1.0f, dy, x, 1.0f, dweight);
    if (dbias == nullptr) return;
    LATHE_OMP_PARALLEL_FOR(N * O)
    for (int64_t o = 0; o < O; ++o) {
        double acc = 0.0;
        for (int64_t n = 0; n < N; ++n) acc += dy[n * O + o];
        dbias[o] += float(acc);
    }
}

}  // namespace lathe::cpu
