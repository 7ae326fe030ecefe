#pragma once
// CPU reference kernel behind ops/argmax.h.
#include <cstdint>

namespace lathe::cpu {

// ids[n] = the lowest index of row n's largest value (NaN as -inf) of x (N, V).
void argmax_rows(int32_t* ids, const float* x, int64_t N, int64_t V);

}  // namespace lathe::cpu
