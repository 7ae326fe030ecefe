#pragma once
// Choosing the next token from one row of logits, on the CPU, the same way on every backend (the
// engine hands f32 logits to the host), so that a seed gives the same tokens for the same logits.
//
// Order of the steps, for logits l[0..V) and the tokens `seen` so far (prompt and generated):
//   1. repetition penalty r (1 = off): for each distinct token t in seen,
//      l[t] = l[t] / r if l[t] > 0, else l[t] * r                      (transformers' definition)
//   2. temperature 0: the argmax (the lowest id among equal maxima); nothing below applies.
//   3. p = softmax(l / temperature), in double.
//   4. top-k (0 = off): keep the k most probable tokens.
//   5. top-p (1 = off): in order of decreasing probability, keep the shortest prefix whose mass
//      reaches p (at least one token).
//   6. min-p (0 = off): keep the tokens with p >= min_p * (the largest p).
//   7. Renormalize what is kept and draw: u uniform in [0, 1), the first kept token (decreasing p,
//      ties by increasing id) whose cumulative mass exceeds u total.
// Ordering everywhere is by decreasing probability, ties by increasing id (a total order).
//
// The RNG is SplitMix64 (Steele, Lea, Flood 2014): state += 0x9E3779B97F4A7C15, then the
// output mix z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9, (z ^ z >> 27) * 0x94D049BB133111EB,
// z ^ z >> 31; u = (z >> 11) * 2^-53. One draw per sampled token. A generation request's
// generator starts from sample_seed(seed, index) so that each request's tokens depend on the seed
// and its own index only, not on the batch it ran in.

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace lathe {

struct SamplingParams {
    double temperature = 1.0;         // 0 = greedy
    int64_t top_k = 0;                // 0 = off
    double top_p = 1.0;               // 1 = off
    double min_p = 0.0;               // 0 = off
    double repetition_penalty = 1.0;  // 1 = off
};

// Whether sample_token's choice under `params` is the argmax of the logits alone (temperature 0,
// no repetition penalty): what ops/argmax.h picks where the logits are (decode_greedy).
inline bool sampling_is_argmax(const SamplingParams& params) {
    return params.temperature == 0.0 && params.repetition_penalty == 1.0;
}

// Errors name the flag: temperature < 0, top_k < 0, top_p outside (0, 1], min_p outside [0, 1],
// repetition_penalty <= 0, and NaN anywhere.
Status sampling_validate(const SamplingParams& params);

class SampleRng {
public:
    explicit SampleRng(uint64_t state = 0) : state_(state) {}
    uint64_t next_u64();
    double next_double();  // in [0, 1)

private:
    uint64_t state_;
};

// The starting state of request `index`'s generator under `seed`.
uint64_t sample_seed(uint64_t seed, uint64_t index);

// The next token (the steps above). `logits` is modified (the penalty); `scratch` is reused
// between calls. Logits must be finite or -inf, with at least one finite (checked by the caller's
// model; a NaN row picks by the order above with NaN treated as -inf).
int32_t sample_token(std::span<float> logits, std::span<const int32_t> seen,
                     const SamplingParams& params, SampleRng& rng, std::vector<double>& scratch,
                     std::vector<int32_t>& order);

}  // namespace lathe
