// Sampling: greedy and its ties, each filter's kept set, the repetition penalty's definition,
// the draw's frequencies against the kept distribution, seeds, and parameter errors.
#include "infer/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "ops/argmax.h"

namespace lathe {
namespace {

int32_t draw(std::vector<float> logits, const SamplingParams& p, SampleRng& rng,
             std::vector<int32_t> seen = {}) {
    std::vector<double> scratch;
    std::vector<int32_t> order;
    return sample_token(logits, seen, p, rng, scratch, order);
}

// Frequencies of n draws.
std::map<int32_t, int> histogram(const std::vector<float>& logits, const SamplingParams& p, int n) {
    SampleRng rng(sample_seed(7, 0));
    std::map<int32_t, int> h;
    for (int i = 0; i < n; ++i) ++h[draw(logits, p, rng)];
    return h;
}

TEST(Sampling, GreedyTakesTheLowestIdAmongEqualMaxima) {
    SamplingParams p;
    p.temperature = 0.0;
    SampleRng rng;
    EXPECT_EQ(draw({0.f, 3.f, 1.f, 3.f}, p, rng), 1);
    EXPECT_EQ(draw({-INFINITY, -2.f, NAN}, p, rng), 1);
}

// The engine's device pick (ops/argmax.h, decode_greedy) is this rule: the same id as
// sample_token at temperature 0 on rows with ties, NaNs, infinities and signed zeros.
TEST(Sampling, GreedyEqualsArgmaxRows) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    std::mt19937 gen(11);
    std::uniform_int_distribution<int> grid(-8, 8), kind(0, 9);
    constexpr int64_t kRows = 200, kV = 33;
    std::vector<float> rows(static_cast<size_t>(kRows * kV));
    for (float& v : rows) {
        const int k = kind(gen);
        v = k == 0   ? nan
            : k == 1 ? -inf
            : k == 2 ? (grid(gen) > 6 ? inf : -0.0f)
                     : float(grid(gen));
    }
    std::vector<int32_t> ids(static_cast<size_t>(kRows));
    argmax_rows(TensorView(ids.data(), DType::kI32, Shape{kRows}, Device::kCpu),
                ConstTensorView(rows.data(), DType::kF32, Shape{kRows, kV}, Device::kCpu),
                cpu_context());
    SamplingParams p;
    p.temperature = 0.0;
    SampleRng rng(1);
    for (int64_t r = 0; r < kRows; ++r) {
        const std::vector<float> row(rows.begin() + r * kV, rows.begin() + (r + 1) * kV);
        EXPECT_EQ(draw(row, p, rng), ids[size_t(r)]) << "row " << r;
    }
}

TEST(Sampling, FrequenciesFollowTheSoftmax) {
    // p = (0.5, 0.3, 0.2): each frequency within 5 standard deviations of n p.
    const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
    const int n = 20000;
    const auto h = histogram(l, SamplingParams{}, n);
    const double p[3] = {0.5, 0.3, 0.2};
    for (int t = 0; t < 3; ++t) {
        const double sd = std::sqrt(n * p[t] * (1 - p[t]));
        EXPECT_NEAR(h.count(t) ? h.at(t) : 0, n * p[t], 5 * sd) << "token " << t;
    }
}

TEST(Sampling, TemperatureSharpens) {
    // T = 0.5 squares the probabilities: (25, 9, 4) / 38.
    const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
    SamplingParams p;
    p.temperature = 0.5;
    const int n = 20000;
    const auto h = histogram(l, p, n);
    const double q0 = 25.0 / 38.0;
    EXPECT_NEAR(h.at(0), n * q0, 5 * std::sqrt(n * q0 * (1 - q0)));
}

// A subnormal temperature is sampling at the limit T -> 0: the largest logit, whatever the draw
// (l / T overflows to inf there; the softmax takes (l - max) / T).
TEST(Sampling, SubnormalTemperatureTakesTheLargestLogit) {
    const std::vector<float> l = {0.5f, 3.0f, -1.0f, 2.9f};
    SamplingParams p;
    for (const double t : {1e-310, 5e-324, 1e-300}) {
        p.temperature = t;
        const auto h = histogram(l, p, 200);
        EXPECT_EQ(h.size(), 1u) << t;
        EXPECT_EQ(h.begin()->first, 1) << t;
    }
}

TEST(Sampling, FiltersKeepTheirSets) {
    const std::vector<float> l = {std::log(0.1f), std::log(0.5f), std::log(0.25f), std::log(0.15f)};
    SamplingParams k2;
    k2.top_k = 2;  // tokens 1 and 2
    for (const auto& [t, c] : histogram(l, k2, 2000)) EXPECT_TRUE(t == 1 || t == 2) << t;
    SamplingParams p07;
    p07.top_p = 0.7;  // 0.5 then 0.75 >= 0.7: tokens 1 and 2
    for (const auto& [t, c] : histogram(l, p07, 2000)) EXPECT_TRUE(t == 1 || t == 2) << t;
    SamplingParams p05;
    p05.top_p = 0.5;  // 0.5 reaches 0.5 alone
    for (const auto& [t, c] : histogram(l, p05, 500)) EXPECT_EQ(t, 1);
    SamplingParams m;
    m.min_p = 0.4;  // p >= 0.2: tokens 1 and 2
    const auto h = histogram(l, m, 4000);
    for (const auto& [t, c] : h) EXPECT_TRUE(t == 1 || t == 2) << t;
    EXPECT_EQ(h.size(), 2u);
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeOnce) {
    SamplingParams p;
    p.temperature = 0.0;
    p.repetition_penalty = 2.0;
    std::vector<float> l = {2.0f, 1.5f, -1.0f};
    std::vector<double> scratch;
    std::vector<int32_t> order;
    SampleRng rng;
    const std::vector<int32_t> seen = {0, 0, 2};
    // 2.0 / 2 = 1.0 (once, though seen twice) < 1.5: token 1 wins; -1 * 2 = -2.
    EXPECT_EQ(sample_token(l, seen, p, rng, scratch, order), 1);
    EXPECT_EQ(l[0], 1.0f);
    EXPECT_EQ(l[2], -2.0f);
}

TEST(Sampling, SameSeedSameTokensOtherSeedOthers) {
    std::vector<float> l(50);
    for (int i = 0; i < 50; ++i) l[size_t(i)] = float(i % 7) * 0.3f;
    auto run = [&](uint64_t seed) {
        SampleRng rng(sample_seed(seed, 3));
        std::vector<int32_t> out;
        for (int i = 0; i < 40; ++i) out.push_back(draw(l, SamplingParams{}, rng));
        return out;
    };
    EXPECT_EQ(run(11), run(11));
    EXPECT_NE(run(11), run(12));
    EXPECT_NE(sample_seed(11, 0), sample_seed(11, 1));
}

TEST(Sampling, RngIsSplitMix64) {
    // The first output of SplitMix64 from state 0 (the published reference value).
    SampleRng rng(0);
    EXPECT_EQ(rng.next_u64(), 0xE220A8397B1DCDAFull);
    const double u = rng.next_double();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
}

TEST(Sampling, ValidateNamesTheFlag) {
    auto msg = [](SamplingParams p) { return sampling_validate(p).message(); };
    SamplingParams p;
    EXPECT_TRUE(sampling_validate(p).ok());
    p.temperature = -1;
    EXPECT_NE(msg(p).find("--temperature"), std::string::npos);
    p = {};
    p.top_k = -2;
    EXPECT_NE(msg(p).find("--top-k"), std::string::npos);
    p = {};
    p.top_p = 0;
    EXPECT_NE(msg(p).find("--top-p"), std::string::npos);
    p = {};
    p.min_p = 1.5;
    EXPECT_NE(msg(p).find("--min-p"), std::string::npos);
    p = {};
    p.repetition_penalty = 0;
    EXPECT_NE(msg(p).find("--repetition-penalty"), std::string::npos);
    p = {};
    p.top_p = NAN;
    EXPECT_FALSE(sampling_validate(p).ok());
}

}  // namespace
}  // namespace lathe
