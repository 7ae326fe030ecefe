#pragma once
// Non-finite values (NaN, +inf, -inf) in f32 data read from a file. Weights and optimizer moments
// are checked on the host as they are read, before anything computes with them: a model with one
// NaN weight computes NaN everywhere, and a training run started from one skips every step.

#include <fmt/format.h>

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

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

// Adds the non-finite values among x[0, n), a piece read in several, to `total`: its first is
// kept with the piece's index `offset` added (the index in what the pieces make up).
inline void add_non_finite(NonFiniteCount& total, const float* x, int64_t n, int64_t offset) {
    const NonFiniteCount c = count_non_finite(x, n);
    if (c.count > 0 && total.count == 0) {
        total.first = offset + c.first;
        total.first_value = c.first_value;
    }
    total.count += c.count;
}

// The words of an error about `c` among `n` values read, its first at `first_index` (the index
// the reader names, e.g. in the whole tensor of which `n` values are a slice; `of` names what
// that index counts in, e.g. " of the parameter vector").
inline std::string non_finite_phrase(const NonFiniteCount& c, int64_t n, int64_t first_index,
                                     std::string_view of = {}) {
    return fmt::format(
        "{} of the {} values read are not finite (NaN or infinity), the first at element {}{} ({})",
        c.count, n, first_index, of, c.first_value);
}

}  // namespace lathe
