#pragma once
// numpy.random.RandomState, bit for bit: the legacy MT19937 generator that GPT-NeoX and Megatron
// use to shuffle documents and samples (`np.random.RandomState(seed)`), so that lathe builds the
// same index files and feeds the same samples in the same order.
//
// What is reproduced (numpy >= 1.17 `_legacy` path, which itself reproduces the older randomkit):
//   - seeding: an integer seed in [0, 2^32) goes through MT19937's init_genrand (numpy's
//     `mt19937_seed`); an array seed goes through init_by_array. Both leave pos = 624, so the first
//     draw regenerates the whole state.
//   - next_uint32: one tempered MT19937 output. next_uint64: (first draw << 32) | second draw.
//   - random_sample: 53-bit double from two draws, (a >> 5, b >> 6), as randomkit's rk_double.
//   - interval(max): numpy's random_interval, the masked rejection sampler that shuffle uses:
//     mask = smallest 2^k-1 >= max; draw 32 bits (64 bits when max > 2^32-1) & mask until <= max.
//   - shuffle: Fisher-Yates from the back, for i = n-1 .. 1: j = interval(i), swap(x[i], x[j]).
//     Works on any element type, so shuffling rows of a 2-D array is shuffling a span of rows.
//   - randint(low, high, size, dtype): the legacy masked rejection per dtype, including the
//     buffered 16/8/1-bit draws (two uint16, four uint8 or 32 bools per 32-bit draw; the buffer
//     lives for one call, so a scalar call and an array call of the same length differ).
//
// Not thread-safe: one RandomState per thread, as in numpy (which holds a lock).

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"

namespace lathe {

// The dtypes numpy's legacy randint draws with; each has its own bit budget per draw.
enum class NumpyIntDtype {
    kInt64,
    kInt32,
    kInt16,
    kInt8,
    kUint64,
    kUint32,
    kUint16,
    kUint8,
    kBool
};

class NumpyRandomState {
public:
    static constexpr int kStateLength = 624;  // MT19937 words (numpy's RK_STATE_LEN)

    // `np.random.RandomState(seed)` for an integer seed (numpy accepts [0, 2^32 - 1]).
    explicit NumpyRandomState(uint32_t seed);

    // `np.random.RandomState(np.array(key, dtype=np.uint32))`: init_by_array, except that a
    // one-element key is squeezed to a scalar and seeds as the integer (numpy does the same). An
    // empty key is an invalid argument, as numpy's "Seed must be non-empty".
    static Result<NumpyRandomState> from_array(std::span<const uint32_t> key);

    // The generator's raw state as `RandomState.get_state()` returns it: ('MT19937', key, pos,
    // ...). Restoring a saved state continues the stream exactly (used for exact resume).
    const std::array<uint32_t, kStateLength>& key() const { return key_; }
    int pos() const { return pos_; }
    // Fails (invalid argument) when pos is outside [0, 624] or the key is all zero.
    Status set_state(std::span<const uint32_t> key, int pos);

    uint32_t next_uint32();
    uint64_t next_uint64();  // first draw in the high half, as numpy's mt19937_next64
    // `random_sample()`: uniform double in [0, 1) with 53 random bits.
    double random_sample();

    // numpy's random_interval: a uniform integer in [0, max] by masked rejection.
    uint64_t interval(uint64_t max);

    // `RandomState.shuffle(x)` for a 1-D array (or the rows of an N-D array): in place.
    // The swap targets of a block of steps are drawn first (the same draws in the same order),
    // then the swaps run with the targets a few steps ahead prefetched: on arrays larger than the
    // caches the random accesses, not the generator, set the speed.
    template <typename T>
    void shuffle(std::span<T> values) {
        constexpr size_t kBlock = 4096;
        constexpr size_t kPrefetchDistance = 16;
        size_t targets[kBlock];
        size_t i = values.size();  // steps run for last = i - 1 down to 1
        while (i > 1) {
            const size_t steps = std::min(kBlock, i - 1);
            for (size_t k = 0; k < steps; ++k)
                targets[k] = static_cast<size_t>(interval(i - 1 - k));
            for (size_t k = 0; k < steps; ++k) {
                if (k + kPrefetchDistance < steps) {
                    __builtin_prefetch(&values[targets[k + kPrefetchDistance]], 1);
                }
                std::swap(values[i - 1 - k], values[targets[k]]);
            }
            i -= steps;
        }
    }

    // `RandomState.permutation(n)`: a shuffled arange(n) (int64, as numpy's default int on Linux).
    std::vector<int64_t> permutation(int64_t n);

    // `RandomState.randint(low, high, size=count, dtype=...)`: integers in [low, high) drawn as
    // legacy numpy draws them for that dtype, returned widened to int64 (for kUint64 the bits of
    // the uint64 value). Errors (invalid argument) as numpy's: low >= high, or a bound outside the
    // dtype's range ("low is out of bounds for int32"). For kUint64 pass bounds below 2^63.
    Result<std::vector<int64_t>> randint(int64_t low, int64_t high, int64_t count,
                                         NumpyIntDtype dtype = NumpyIntDtype::kInt64);
    // `randint(low, high)` with size=None: one value, the buffer starting empty.
    Result<int64_t> randint_scalar(int64_t low, int64_t high,
                                   NumpyIntDtype dtype = NumpyIntDtype::kInt64);

private:
    NumpyRandomState() = default;
    void seed_genrand(uint32_t seed);
    void regenerate();

    std::array<uint32_t, kStateLength> key_{};
    int pos_ = kStateLength;
};

}  // namespace lathe
