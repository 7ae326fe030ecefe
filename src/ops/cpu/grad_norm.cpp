#include "ops/cpu/grad_norm.h"

#include <algorithm>
#include <vector>

#include "ops/cpu/parallel.h"

namespace lathe::cpu {

double sum_of_squares(const float* g, int64_t n) {
    constexpr int64_t kBlock = 4096;  // fixed: the result must not depend on the thread count
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<double> partial(size_t(blocks), 0.0);
    LATHE_OMP_PARALLEL_FOR(n)
    for (int64_t b = 0; b < blocks; ++b) {
        double s = 0.0;
        for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
            s += double(g[i]) * g[i];
        partial[size_t(b)] = s;
    }
    double total = 0.0;
    for (double s : partial) total += s;
    return total;
}

void scale_inplace(float* g, int64_t n, float coef) {
    LATHE_OMP_PARALLEL_FOR(n)
    for (int64_t i = 0; i < n; ++i) g[i] = g[i] * coef;
}

}  // namespace lathe::cpu
