#include "core/numpy_random.h"

#include <algorithm>
#include <numeric>

namespace lathe {
namespace {

constexpr int kShift = 397;  // MT19937's M
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr uint32_t kUpperMask = 0x80000000u;
constexpr uint32_t kLowerMask = 0x7fffffffu;
constexpr uint32_t kInitByArraySeed = 19650218u;  // the reference init_by_array's fixed seed

// Smallest all-ones bit mask >= max (numpy's gen_mask).
uint64_t gen_mask(uint64_t max) {
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    return mask;
}

// The smaller-than-32-bit draws share one 32-bit word per fill call: numpy's buffered_uint16,
// buffered_uint8 and the bool variant hand out the low bits first, then shift.
struct DrawBuffer {
    uint32_t word = 0;
    int remaining = 0;  // draws left in `word` after the current one
};

uint16_t buffered_uint16(NumpyRandomState& rs, DrawBuffer& b) {
    if (b.remaining == 0) {
        b.word = rs.next_uint32();
        b.remaining = 1;
    } else {
        b.word >>= 16;
        b.remaining -= 1;
    }
    return static_cast<uint16_t>(b.word);
}

uint8_t buffered_uint8(NumpyRandomState& rs, DrawBuffer& b) {
    if (b.remaining == 0) {
        b.word = rs.next_uint32();
        b.remaining = 3;
    } else {
        b.word >>= 8;
        b.remaining -= 1;
    }
    return static_cast<uint8_t>(b.word);
}

bool buffered_bool(NumpyRandomState& rs, DrawBuffer& b) {
    if (b.remaining == 0) {
        b.word = rs.next_uint32();
        b.remaining = 31;
    } else {
        b.word >>= 1;
        b.remaining -= 1;
    }
    return (b.word & 1u) != 0;
}

struct DtypeRange {
    int64_t low;
    uint64_t high;  // inclusive
    const char* name;
};

DtypeRange dtype_range(NumpyIntDtype dtype) {
    switch (dtype) {
        case NumpyIntDtype::kInt64:
            return {INT64_MIN, uint64_t(INT64_MAX), "int64"};
        case NumpyIntDtype::kInt32:
            return {INT32_MIN, uint64_t(INT32_MAX), "int32"};
        case NumpyIntDtype::kInt16:
            return {INT16_MIN, uint64_t(INT16_MAX), "int16"};
        case NumpyIntDtype::kInt8:
            return {INT8_MIN, uint64_t(INT8_MAX), "int8"};
        case NumpyIntDtype::kUint64:
            return {0, UINT64_MAX, "uint64"};
        case NumpyIntDtype::kUint32:
            return {0, UINT32_MAX, "uint32"};
        case NumpyIntDtype::kUint16:
            return {0, UINT16_MAX, "uint16"};
        case NumpyIntDtype::kUint8:
            return {0, UINT8_MAX, "uint8"};
        case NumpyIntDtype::kBool:
            return {0, 1, "bool"};
    }
    return {0, 0, "?"};
}

// numpy's random_bounded_uint{64,32,16,8}_fill and random_bounded_bool_fill with use_masked=true
// (the legacy choice): `count` values off + [0, rng], widened to uint64.
void bounded_fill(NumpyRandomState& rs, NumpyIntDtype dtype, uint64_t off, uint64_t rng,
                  int64_t count, uint64_t* out) {
    DrawBuffer buf;
    switch (dtype) {
        case NumpyIntDtype::kInt64:
        case NumpyIntDtype::kUint64: {
            if (rng == 0) {
                std::fill(out, out + count, off);
            } else if (rng <= 0xFFFFFFFFull) {
                const uint32_t mask = static_cast<uint32_t>(gen_mask(rng));
                for (int64_t i = 0; i < count; ++i) {
                    uint32_t v;
                    while ((v = (rs.next_uint32() & mask)) > rng) {
                    }
                    out[i] = off + v;
                }
            } else if (rng == UINT64_MAX) {
                for (int64_t i = 0; i < count; ++i) out[i] = off + rs.next_uint64();
            } else {
                const uint64_t mask = gen_mask(rng);
                for (int64_t i = 0; i < count; ++i) {
                    uint64_t v;
                    while ((v = (rs.next_uint64() & mask)) > rng) {
                    }
                    out[i] = off + v;
                }
            }
            return;
        }
        case NumpyIntDtype::kInt32:
        case NumpyIntDtype::kUint32: {
            const uint32_t o = static_cast<uint32_t>(off), r = static_cast<uint32_t>(rng);
            if (r == 0) {
                std::fill(out, out + count, uint64_t(o));
            } else if (r == 0xFFFFFFFFu) {
                for (int64_t i = 0; i < count; ++i) out[i] = uint32_t(o + rs.next_uint32());
            } else {
                const uint32_t mask = static_cast<uint32_t>(gen_mask(r));
                for (int64_t i = 0; i < count; ++i) {
                    uint32_t v;
                    while ((v = (rs.next_uint32() & mask)) > r) {
                    }
                    out[i] = uint32_t(o + v);
                }
            }
            return;
        }
        case NumpyIntDtype::kInt16:
        case NumpyIntDtype::kUint16: {
            const uint16_t o = static_cast<uint16_t>(off), r = static_cast<uint16_t>(rng);
            if (r == 0) {
                std::fill(out, out + count, uint64_t(o));
            } else if (r == 0xFFFFu) {
                for (int64_t i = 0; i < count; ++i) out[i] = uint16_t(o + buffered_uint16(rs, buf));
            } else {
                const uint16_t mask = static_cast<uint16_t>(gen_mask(r));
                for (int64_t i = 0; i < count; ++i) {
                    uint16_t v;
                    while ((v = (buffered_uint16(rs, buf) & mask)) > r) {
                    }
                    out[i] = uint16_t(o + v);
                }
            }
            return;
        }
        case NumpyIntDtype::kInt8:
        case NumpyIntDtype::kUint8: {
            const uint8_t o = static_cast<uint8_t>(off), r = static_cast<uint8_t>(rng);
            if (r == 0) {
                std::fill(out, out + count, uint64_t(o));
            } else if (r == 0xFFu) {
                for (int64_t i = 0; i < count; ++i) out[i] = uint8_t(o + buffered_uint8(rs, buf));
            } else {
                const uint8_t mask = static_cast<uint8_t>(gen_mask(r));
                for (int64_t i = 0; i < count; ++i) {
                    uint8_t v;
                    while ((v = (buffered_uint8(rs, buf) & mask)) > r) {
                    }
                    out[i] = uint8_t(o + v);
                }
            }
            return;
        }
        case NumpyIntDtype::kBool: {
            // numpy's buffered_bounded_bool ignores the mask: rng is 0 or 1.
            for (int64_t i = 0; i < count; ++i) out[i] = rng == 0 ? off : buffered_bool(rs, buf);
            return;
        }
    }
}

// Reinterprets a value drawn for `dtype` (low bits of `bits`) as the signed/unsigned value numpy
// stores, widened to int64.
int64_t widen(NumpyIntDtype dtype, uint64_t bits) {
    switch (dtype) {
        case NumpyIntDtype::kInt64:
            return static_cast<int64_t>(bits);
        case NumpyIntDtype::kInt32:
            return static_cast<int32_t>(static_cast<uint32_t>(bits));
        case NumpyIntDtype::kInt16:
            return static_cast<int16_t>(static_cast<uint16_t>(bits));
        case NumpyIntDtype::kInt8:
            return static_cast<int8_t>(static_cast<uint8_t>(bits));
        case NumpyIntDtype::kUint64:
            return static_cast<int64_t>(bits);
        case NumpyIntDtype::kUint32:
            return static_cast<uint32_t>(bits);
        case NumpyIntDtype::kUint16:
            return static_cast<uint16_t>(bits);
        case NumpyIntDtype::kUint8:
            return static_cast<uint8_t>(bits);
        case NumpyIntDtype::kBool:
            return bits & 1;
    }
    return 0;
}

}  // namespace

NumpyRandomState::NumpyRandomState(uint32_t seed) {
    seed_genrand(seed);
}

void NumpyRandomState::seed_genrand(uint32_t seed) {
    // Knuth's multiplier, as the MT reference init_genrand (numpy's mt19937_seed).
    for (int i = 0; i < kStateLength; ++i) {
        key_[i] = seed;
        seed = 1812433253u * (seed ^ (seed >> 30)) + static_cast<uint32_t>(i + 1);
    }
    pos_ = kStateLength;
}

Result<NumpyRandomState> NumpyRandomState::from_array(std::span<const uint32_t> init_key) {
    if (init_key.empty()) {
        return invalid_argument_error(
            "an array seed must be non-empty (numpy: 'Seed must be "
            "non-empty')");
    }
    NumpyRandomState rs;
    if (init_key.size() == 1) {
        // numpy squeezes a one-element array to a scalar, which seeds through init_genrand.
        rs.seed_genrand(init_key[0]);
        return rs;
    }
    rs.seed_genrand(kInitByArraySeed);
    uint32_t* mt = rs.key_.data();
    const int key_length = static_cast<int>(init_key.size());
    int i = 1;
    int j = 0;
    for (int k = std::max(kStateLength, key_length); k > 0; --k) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + init_key[j] +
                static_cast<uint32_t>(j);
        ++i;
        ++j;
        if (i >= kStateLength) {
            mt[0] = mt[kStateLength - 1];
            i = 1;
        }
        if (j >= key_length) j = 0;
    }
    for (int k = kStateLength - 1; k > 0; --k) {
        mt[i] =
            (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
        ++i;
        if (i >= kStateLength) {
            mt[0] = mt[kStateLength - 1];
            i = 1;
        }
    }
    mt[0] = 0x80000000u;  // the most significant bit set: the state is never all zero
    rs.pos_ = kStateLength;
    return rs;
}

Status NumpyRandomState::set_state(std::span<const uint32_t> key, int pos) {
    if (key.size() != static_cast<size_t>(kStateLength)) {
        return invalid_argument_error("MT19937 state must have {} words, got {}", kStateLength,
                                      key.size());
    }
    if (pos < 0 || pos > kStateLength) {
        return invalid_argument_error("MT19937 state position must be in [0, {}], got {}",
                                      kStateLength, pos);
    }
    if (std::all_of(key.begin(), key.end(), [](uint32_t w) { return w == 0; })) {
        return invalid_argument_error("MT19937 state is all zero (a corrupt saved state)");
    }
    std::copy(key.begin(), key.end(), key_.begin());
    pos_ = pos;
    return ok_status();
}

void NumpyRandomState::regenerate() {
    int i = 0;
    for (; i < kStateLength - kShift; ++i) {
        const uint32_t y = (key_[i] & kUpperMask) | (key_[i + 1] & kLowerMask);
        key_[i] = key_[i + kShift] ^ (y >> 1) ^ ((0u - (y & 1u)) & kMatrixA);
    }
    for (; i < kStateLength - 1; ++i) {
        const uint32_t y = (key_[i] & kUpperMask) | (key_[i + 1] & kLowerMask);
        key_[i] = key_[i + (kShift - kStateLength)] ^ (y >> 1) ^ ((0u - (y & 1u)) & kMatrixA);
    }
    const uint32_t y = (key_[kStateLength - 1] & kUpperMask) | (key_[0] & kLowerMask);
    key_[kStateLength - 1] = key_[kShift - 1] ^ (y >> 1) ^ ((0u - (y & 1u)) & kMatrixA);
    pos_ = 0;
}

uint32_t NumpyRandomState::next_uint32() {
    if (pos_ == kStateLength) regenerate();
    uint32_t y = key_[pos_++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}

uint64_t NumpyRandomState::next_uint64() {
    const uint64_t high = next_uint32();
    const uint64_t low = next_uint32();
    return (high << 32) | low;
}

double NumpyRandomState::random_sample() {
    const uint32_t a = next_uint32() >> 5;
    const uint32_t b = next_uint32() >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;  // (a * 2^26 + b) / 2^53
}

uint64_t NumpyRandomState::interval(uint64_t max) {
    if (max == 0) return 0;
    const uint64_t mask = gen_mask(max);
    uint64_t value;
    if (max <= 0xFFFFFFFFull) {
        while ((value = (next_uint32() & mask)) > max) {
        }
    } else {
        while ((value = (next_uint64() & mask)) > max) {
        }
    }
    return value;
}

std::vector<int64_t> NumpyRandomState::permutation(int64_t n) {
    std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
    std::iota(out.begin(), out.end(), int64_t{0});
    shuffle(std::span<int64_t>(out));
    return out;
}

Result<std::vector<int64_t>> NumpyRandomState::randint(int64_t low, int64_t high, int64_t count,
                                                       NumpyIntDtype dtype) {
    if (count < 0) return invalid_argument_error("randint: negative size {}", count);
    const DtypeRange range = dtype_range(dtype);
    if (count == 0) return std::vector<int64_t>{};  // numpy returns early, before any checks
    if (low < range.low) return invalid_argument_error("low is out of bounds for {}", range.name);
    // numpy works on the closed interval [low, high - 1].
    if (high <= low) return invalid_argument_error("randint: low >= high ({} >= {})", low, high);
    const int64_t high_closed = high - 1;
    if (high_closed > 0 && static_cast<uint64_t>(high_closed) > range.high) {
        return invalid_argument_error("high is out of bounds for {}", range.name);
    }
    const uint64_t rng = static_cast<uint64_t>(high_closed) - static_cast<uint64_t>(low);
    const uint64_t off = static_cast<uint64_t>(low);
    std::vector<uint64_t> bits(static_cast<size_t>(count));
    bounded_fill(*this, dtype, off, rng, count, bits.data());
    std::vector<int64_t> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = widen(dtype, bits[i]);
    return out;
}

Result<int64_t> NumpyRandomState::randint_scalar(int64_t low, int64_t high, NumpyIntDtype dtype) {
    LATHE_ASSIGN_OR_RETURN(auto values, randint(low, high, 1, dtype));
    return values[0];
}

}  // namespace lathe
