#pragma once
// Random numbers for stage 3 (token embeddings): seeded, reproducible on every machine, and the
// same on the host and (for the counter-based form) on the device. SplitMix64 (Steele, Lea and
// Flood 2014): a 64-bit counter passed through a strong mixing function; good enough for
// initialisation, shuffling and negative sampling, and cheap.

#include <cstdint>

#if defined(__CUDACC__)
#define LATHE_EMBED_HD __host__ __device__
#else
#define LATHE_EMBED_HD
#endif

namespace lathe {

// SplitMix64's output function: a bijective mix of 64 bits.
LATHE_EMBED_HD inline uint64_t embed_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Counter-based: a uniform float in [0, 1) that depends only on (seed, stream, i): 24 random bits
// scaled by 2^-24, so every value is exact in fp32.
LATHE_EMBED_HD inline float embed_uniform_at(uint64_t seed, uint64_t stream, uint64_t i) {
    const uint64_t z = embed_mix64(embed_mix64(seed ^ (stream * 0x9E3779B97F4A7C15ull)) + i);
    return float(z >> 40) * (1.0f / 16777216.0f);
}

// A sequential generator: the SplitMix64 sequence started from (seed, stream).
class EmbedRng {
public:
    LATHE_EMBED_HD EmbedRng(uint64_t seed, uint64_t stream)
        : state_(embed_mix64(seed ^ (stream * 0x9E3779B97F4A7C15ull))) {}
    LATHE_EMBED_HD uint64_t next() {
        state_ += 0x9E3779B97F4A7C15ull;
        return embed_mix64(state_);
    }
    // Uniform in [0, n) for n > 0 (Lemire's multiply-shift; the bias is below n / 2^64).
    LATHE_EMBED_HD uint64_t below(uint64_t n) {
#if defined(__CUDA_ARCH__)
        return __umul64hi(next(), n);
#else
        return uint64_t((unsigned __int128)next() * n >> 64);
#endif
    }
    // Uniform float in [0, 1), 24 random bits.
    LATHE_EMBED_HD float uniform() {
        return float(next() >> 40) * (1.0f / 16777216.0f);
    }

private:
    uint64_t state_;
};

}  // namespace lathe
