#pragma once
// The project's one hash of byte strings: hash tables (tokenizer vocabularies and caches, the term
// counter's table and shards) and content fingerprints (the align stage cache, two seeds for 128
// bits). Multiply-xorshift over 8-byte words, then a multiply and fold. Fast, not cryptographic,
// stable across runs and machines (fingerprints written to disk depend on that).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace lathe {

inline constexpr uint64_t kHashSeed = 0x2545F4914F6CDD1Dull;

// 64-bit hash of the n bytes at p; a different seed gives an independent-looking hash.
inline uint64_t hash_bytes(const char* p, size_t n, uint64_t seed = kHashSeed) {
    constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
    uint64_t h = seed ^ (n * kMul);
    while (n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        h = (h ^ w) * kMul;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    if (n > 0) {
        uint64_t w = 0;
        std::memcpy(&w, p, n);
        h = (h ^ w) * kMul;
        h ^= h >> 29;
    }
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h;
}

inline uint64_t hash_bytes(std::string_view bytes, uint64_t seed = kHashSeed) {
    return hash_bytes(bytes.data(), bytes.size(), seed);
}

}  // namespace lathe
