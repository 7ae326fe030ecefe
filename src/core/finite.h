#pragma once
// Non-finite values (NaN, +inf, -inf) in f32 data read from a file. Weights and optimizer moments
// are checked on the host as they are read, before anything computes with them: a model with one
// NaN weight computes NaN everywhere, and a training run started from one skips every step.

#include <bit>
#include <cstdint>

namespace lathe {

struct NonFiniteCount {
    int64_t count = 0;   // NaNs and infinities among the values
    int64_t first = -1;  // index of the first of them; -1 when count is 0
    float first_value = 0.0f;
};

// Whether `x` is NaN or an infinity, by its bits (an exponent of all ones), so that the answer
// does not depend on floating-point compiler flags.
inline bool is_non_finite(float x) {
    constexpr uint32_t kExponentBits = 0x7F800000u;
    return (std::bit_cast<uint32_t>(x) & kExponentBits) == kExponentBits;
}

// The non-finite values among x[0, n): one pass that counts (vectorizable, no branch), and a
// second up to the first of them only when there is one.
inline NonFiniteCount count_non_finite(const float* x, int64_t n) {
    NonFiniteCount c;
    for (int64_t i = 0; i < n; ++i) c.count += is_non_finite(x[i]) ? 1 : 0;
    if (c.count == 0) return c;
    for (int64_t i = 0; i < n; ++i) {
        if (is_non_finite(x[i])) {
            c.first = i;
            c.first_value = x[i];
            break;
        }
    }
    return c;
}

}  // namespace lathe
