#include "ops/cpu/argmax.h"

#include <cmath>
#include <limits>

namespace lathe::cpu {

void argmax_rows(int32_t* ids, const float* x, int64_t N, int64_t V) {
    const auto value = [](float v) {
        return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
    };
    for (int64_t n = 0; n < N; ++n) {
        const float* row = x + n * V;
        int64_t best = 0;
        for (int64_t i = 1; i < V; ++i)
            if (value(row[i]) > value(row[best])) best = i;
        ids[n] = int32_t(best);
    }
}

}  // namespace lathe::cpu
