#include "model/init.h"

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

float init_normal(uint64_t seed, uint64_t key, uint64_t index) {
    const uint64_t base = splitmix64(splitmix64(seed) ^ key) + 2 * (index / 2);
    const double u1 = unit_open_closed(splitmix64(base));
    const double u2 = unit_open_closed(splitmix64(base + 1));
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    return float(index % 2 == 0 ? r * std::cos(angle) : r * std::sin(angle));
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
    // Counter-based draws: the threads' split changes no value (an 8B model's 8e9 draws take
    // minutes on one core, seconds on a GPU machine's sixteen).
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
    for (int64_t i = 0; i < n; ++i) x[i] = init.at(seed, i);
}

}  // namespace lathe
