#include "infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lathe {

Status sampling_validate(const SamplingParams& p) {
    if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature))
        return invalid_argument_error("--temperature must be a finite number >= 0, got {}",
                                      p.temperature);
    if (p.top_k < 0)
        return invalid_argument_error("--top-k must be >= 0 (0 = off), got {}", p.top_k);
    if (!(p.top_p > 0.0 && p.top_p <= 1.0))
        return invalid_argument_error("--top-p must be in (0, 1] (1 = off), got {}", p.top_p);
    if (!(p.min_p >= 0.0 && p.min_p <= 1.0))
        return invalid_argument_error("--min-p must be in [0, 1] (0 = off), got {}", p.min_p);
    if (!(p.repetition_penalty > 0.0) || !std::isfinite(p.repetition_penalty))
        return invalid_argument_error("--repetition-penalty must be a finite number > 0, got {}",
                                      p.repetition_penalty);
    return ok_status();
}

uint64_t SampleRng::next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double SampleRng::next_double() {
    return double(next_u64() >> 11) * 0x1.0p-53;
}

uint64_t sample_seed(uint64_t seed, uint64_t index) {
    SampleRng mix(seed ^ (index * 0xD1B54A32D192ED03ull));
    return mix.next_u64();
}

int32_t sample_token(std::span<float> logits, std::span<const int32_t> seen,
                     const SamplingParams& p, SampleRng& rng, std::vector<double>& prob,
                     std::vector<int32_t>& order) {
    const int64_t V = int64_t(logits.size());
    if (p.repetition_penalty != 1.0) {
        const float r = float(p.repetition_penalty);
        // Each distinct token once: a second visit would apply the penalty twice.
        order.assign(seen.begin(), seen.end());
        std::sort(order.begin(), order.end());
        order.erase(std::unique(order.begin(), order.end()), order.end());
        for (int32_t t : order) {
            if (t < 0 || t >= V) continue;
            float& l = logits[size_t(t)];
            l = l > 0.0f ? l / r : l * r;
        }
    }
    auto value = [&](int64_t i) {
        const float l = logits[size_t(i)];
        return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l;
    };
    if (p.temperature == 0.0) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; ++i)
            if (value(i) > value(best)) best = i;
        return int32_t(best);
    }
    // Softmax of l / T in double, as exp((l - max l) / T): l / T first overflows to inf for a
    // subnormal T (inf - inf is NaN), the difference first gives 0 for the largest logits and
    // -inf or a finite number for the others.
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(value(i)));
    if (mx == -std::numeric_limits<double>::infinity()) return 0;  // every logit -inf or NaN
    prob.resize(size_t(V));
    double sum = 0.0;
    for (int64_t i = 0; i < V; ++i) {
        const double l = value(i);
        prob[size_t(i)] = l == mx ? 1.0 : std::exp((l - mx) / p.temperature);
        sum += prob[size_t(i)];
    }
    for (double& x : prob) x /= sum;
    order.resize(size_t(V));
    for (int64_t i = 0; i < V; ++i) order[size_t(i)] = int32_t(i);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return prob[size_t(a)] != prob[size_t(b)] ? prob[size_t(a)] > prob[size_t(b)] : a < b;
    });
    int64_t keep = V;
    if (p.top_k > 0) keep = std::min(keep, p.top_k);
    if (p.top_p < 1.0) {
        double mass = 0.0;
        int64_t n = 0;
        while (n < keep) {
            mass += prob[size_t(order[size_t(n)])];
            ++n;
            if (mass >= p.top_p) break;
        }
        keep = std::max<int64_t>(n, 1);
    }
    if (p.min_p > 0.0) {
        const double floor = p.min_p * prob[size_t(order[0])];
        int64_t n = 1;
        while (n < keep && prob[size_t(order[size_t(n)])] >= floor) ++n;
        keep = n;
    }
    double total = 0.0;
    for (int64_t i = 0; i < keep; ++i) total += prob[size_t(order[size_t(i)])];
    const double u = rng.next_double() * total;
    double cum = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
        cum += prob[size_t(order[size_t(i)])];
        if (cum > u) return order[size_t(i)];
    }
    return order[size_t(keep - 1)];
}

}  // namespace lathe
