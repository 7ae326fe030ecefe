#include "ops/cpu/residual.h"

#include "ops/cpu/parallel.h"

namespace lathe::cpu {

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
