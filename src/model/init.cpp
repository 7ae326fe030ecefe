#include "model/init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace lathe {

namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// A double in (0, 1]: 53 random bits, never 0 (log(0) would be -inf).
double unit_open_closed(uint64_t bits) {
    return double((bits >> 11) + 1) * 0x1.0p-53;
}

}  // namespace

uint64_t init_key(std::string_view name) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (unsigned char ch : name) {
        h ^= ch;
        h *= 0x100000001B3ull;
    }
    return h;
}

void init_normal_pair(uint64_t seed, uint64_t key, uint64_t even_index, float out[2]) {
    const uint64_t base = splitmix64(splitmix64(seed) ^ key) + even_index;
    const double u1 = unit_open_closed(splitmix64(base));
    const double u2 = unit_open_closed(splitmix64(base + 1));
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    out[0] = float(r * std::cos(angle));
    out[1] = float(r * std::sin(angle));
}

float init_normal(uint64_t seed, uint64_t key, uint64_t index) {
    float pair[2];
    init_normal_pair(seed, key, index - index % 2, pair);
    return pair[index % 2];
}

HfParamInit hf_param_init(const ModelConfig& c, const HfParam& p) {
    HfParamInit init;
    init.kind = p.init;
    if (p.init == InitKind::kNormal || p.init == InitKind::kNormalScaledByDepth) {
        init.std = c.initializer_range;
        if (p.init == InitKind::kNormalScaledByDepth)
            init.std /= std::sqrt(2.0 * double(c.num_layers));
        init.key = init_key(p.name);
    }
    return init;
}

void init_hf_param(const ModelConfig& c, const HfParam& p, TensorView entry, uint64_t seed) {
    LATHE_CHECK(entry.device() == Device::kCpu, "init runs on host memory");
    TensorView rows = entry.slice(p.row_begin, p.row_begin + p.rows);
    float* x = rows.as<float>();
    const int64_t n = rows.numel();
    const HfParamInit init = hf_param_init(c, p);
    if (init.kind == InitKind::kZeros || init.kind == InitKind::kOnes) {
        std::fill(x, x + n, init.at(seed, 0));
        return;
    }
    // Counter-based draws: the threads' split changes no value (an 8B model's 8e9 draws take
    // minutes on one core, seconds on a GPU machine's sixteen). Each Box-Muller pair gives both
    // of its elements (one logarithm and two uniforms for two numbers), as at() would one by one.
    const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (pairs > (int64_t(1) << 15))
    for (int64_t k = 0; k < pairs; ++k) {
        float z[2];
        init_normal_pair(seed, init.key, uint64_t(2 * k), z);
        x[2 * k] = float(init.std * z[0]);
        if (2 * k + 1 < n) x[2 * k + 1] = float(init.std * z[1]);
    }
}

}  // namespace lathe
