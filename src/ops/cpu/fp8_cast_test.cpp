// The reference fp8 casts (ops/cpu/fp8_cast.h): values worked out by hand, the scaling groups of
// each recipe, the round trip within the format's rounding error, and the layouts of q, qt and
// the scales.

#include "ops/cpu/fp8_cast.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace lathe {
namespace {

std::vector<bf16> random_bf16(int64_t n, uint32_t seed, float spread = 4.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> expo(-spread, spread);
    std::vector<bf16> v(static_cast<size_t>(n));
    for (auto& x : v) x = float_to_bf16(normal(rng) * std::exp2(expo(rng)));
    return v;
}

float decode(uint8_t code, DType t) {
    return t == DType::kE4M3 ? e4m3_to_float(fp8_e4m3{code}) : e5m2_to_float(fp8_e5m2{code});
}

// The unit roundoff of the format's normal range: 3 (E4M3) or 2 (E5M2) stored mantissa bits.
double unit(DType t) {
    return t == DType::kE4M3 ? 1.0 / 16 : 1.0 / 8;
}
// The smallest normal, below which the absolute error is half the subnormal spacing.
double min_normal(DType t) {
    return t == DType::kE4M3 ? 0x1p-6 : 0x1p-14;
}
double subnormal_half_step(DType t) {
    return t == DType::kE4M3 ? 0x1p-10 : 0x1p-17;
}

// q * scale_inv is x within one rounding of the format: |q - x s| <= u |x s| in the normal range,
// half a subnormal step below it; then dividing by s (exact up to one f32 rounding each way).
void expect_round_trip(const std::vector<bf16>& x, const uint8_t* q, float scale_inv, DType t) {
    const double s = 1.0 / double(scale_inv);
    for (size_t i = 0; i < x.size(); ++i) {
        const double xs = double(bf16_to_float(x[i])) * s;
        const double err = std::fabs(double(decode(q[i], t)) - xs);
        const double bound = std::fabs(xs) >= min_normal(t) ? unit(t) * std::fabs(xs) * (1 + 1e-6)
                                                            : subnormal_half_step(t) * (1 + 1e-6);
        ASSERT_LE(err, bound) << "element " << i << " x " << bf16_to_float(x[i]) << " code "
                              << int(q[i]);
    }
}

TEST(Fp8Cast, AmaxIsTheLargestMagnitudeAndPropagatesNaN) {
    std::vector<bf16> x = {float_to_bf16(1.5f), float_to_bf16(-7.25f), float_to_bf16(-0.0f),
                           float_to_bf16(3.0f)};
    EXPECT_EQ(cpu::fp8_amax(x.data(), 4), 7.25f);
    EXPECT_EQ(cpu::fp8_amax(x.data(), 0), 0.0f);
    const std::vector<bf16> zeros = {float_to_bf16(-0.0f), float_to_bf16(0.0f)};
    EXPECT_EQ(std::bit_cast<uint32_t>(cpu::fp8_amax(zeros.data(), 2)), 0u);
    x.push_back(float_to_bf16(std::numeric_limits<float>::infinity()));
    EXPECT_TRUE(std::isinf(cpu::fp8_amax(x.data(), 5)));
    x.push_back(float_to_bf16(-std::nanf("")));
    EXPECT_TRUE(std::isnan(cpu::fp8_amax(x.data(), 6)));
}

TEST(Fp8Cast, ScaleFromAmax) {
    EXPECT_EQ(fp8_scale_from_amax(4.0f, DType::kE4M3), 112.0f);
    EXPECT_EQ(fp8_scale_from_amax(8.0f, DType::kE5M2), 7168.0f);
    EXPECT_EQ(fp8_scale_from_amax(0.0f, DType::kE4M3), 448.0f / kFp8AmaxFloor);
    EXPECT_TRUE(std::isfinite(fp8_scale_from_amax(0.0f, DType::kE5M2)));
    EXPECT_TRUE(std::isnan(fp8_scale_from_amax(std::nanf(""), DType::kE4M3)));
    EXPECT_EQ(fp8_scale_from_amax(std::numeric_limits<float>::infinity(), DType::kE4M3), 0.0f);
}

// x = [1, -2, 0.5, 4]: amax 4, scale 448 / 4 = 112, q = 112, -224, 56, 448 (all E4M3 values).
TEST(Fp8Cast, TensorwiseByHand) {
    const std::vector<bf16> x = {float_to_bf16(1.0f), float_to_bf16(-2.0f), float_to_bf16(0.5f),
                                 float_to_bf16(4.0f)};
    std::vector<uint8_t> q(4, 0xAA), qt(4, 0xAA);
    float amax = -1.0f, scale_inv = -1.0f;
    Fp8CastArgs a;
    a.rows = 2;
    a.cols = 2;
    a.x = x.data();
    a.q = q.data();
    a.qt = qt.data();
    a.amax = &amax;
    a.scale_inv = &scale_inv;
    cpu::fp8_cast(a);
    EXPECT_EQ(amax, 4.0f);
    EXPECT_EQ(scale_inv, 1.0f / 112.0f);
    const float want[] = {112.0f, -224.0f, 56.0f, 448.0f};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(e4m3_to_float(fp8_e4m3{q[i]}), want[i]) << i;
    // qt is (2, 2) transposed: qt[c][r] = q[r][c].
    EXPECT_EQ(qt[0], q[0]);
    EXPECT_EQ(qt[1], q[2]);
    EXPECT_EQ(qt[2], q[1]);
    EXPECT_EQ(qt[3], q[3]);
}

TEST(Fp8Cast, TensorwiseCurrentScalingRoundTripsAndFillsTheRange) {
    for (DType t : {DType::kE4M3, DType::kE5M2}) {
        const int64_t R = 37, C = 53;
        const auto x = random_bf16(R * C, 7);
        std::vector<uint8_t> q(size_t(R * C)), qt(size_t(R * C));
        float amax = 0, scale_inv = 0;
        Fp8CastArgs a;
        a.rows = R;
        a.cols = C;
        a.x = x.data();
        a.dtype = t;
        a.q = q.data();
        a.qt = qt.data();
        a.amax = &amax;
        a.scale_inv = &scale_inv;
        cpu::fp8_cast(a);
        EXPECT_EQ(amax, cpu::fp8_amax(x.data(), R * C));
        expect_round_trip(x, q.data(), scale_inv, t);
        // The element of largest magnitude lands on the largest finite value (or one rounding
        // below it: amax * (max / amax) is within an f32 ulp of max).
        float top = 0;
        for (uint8_t c : q) top = std::max(top, std::fabs(decode(c, t)));
        EXPECT_EQ(top, fp8_max(t)) << dtype_name(t);
        for (int64_t r = 0; r < R; ++r)
            for (int64_t c = 0; c < C; ++c) ASSERT_EQ(qt[c * R + r], q[r * C + c]);
        // amax_ready: the given amax is used as it is (here twice the true one: codes halve).
        std::vector<uint8_t> q2(size_t(R * C));
        float amax2 = 2 * amax, scale_inv2 = 0;
        a.q = q2.data();
        a.qt = nullptr;
        a.amax = &amax2;
        a.amax_ready = true;
        a.scale_inv = &scale_inv2;
        cpu::fp8_cast(a);
        EXPECT_EQ(amax2, 2 * amax);
        EXPECT_EQ(scale_inv2, 1.0f / fp8_scale_from_amax(2 * amax, t));
        expect_round_trip(x, q2.data(), scale_inv2, t);
    }
}

TEST(Fp8Cast, DelayedScalingUsesTheGivenScaleSaturatesAndReportsAmax) {
    const std::vector<bf16> x = {float_to_bf16(1.0f), float_to_bf16(-100.0f), float_to_bf16(3.0f)};
    std::vector<uint8_t> q(3);
    const float scale = 8.0f;  // from a history whose amax was 56: -100 * 8 saturates
    float amax = -1, scale_inv = 0;
    Fp8CastArgs a;
    a.rows = 1;
    a.cols = 3;
    a.x = x.data();
    a.q = q.data();
    a.scale = &scale;
    a.amax = &amax;
    a.scale_inv = &scale_inv;
    cpu::fp8_cast(a);
    EXPECT_EQ(amax, 100.0f);
    EXPECT_EQ(scale_inv, 0.125f);
    EXPECT_EQ(e4m3_to_float(fp8_e4m3{q[0]}), 8.0f);
    EXPECT_EQ(e4m3_to_float(fp8_e4m3{q[1]}), -448.0f);
    EXPECT_EQ(e4m3_to_float(fp8_e4m3{q[2]}), 24.0f);
}

TEST(Fp8Cast, Blockwise1x128RowsAndTransposedColumnGroups) {
    const int64_t R = 130, C = 300;  // edge groups in both directions
    const int64_t rb = fp8_blocks(R), cb = fp8_blocks(C);
    ASSERT_EQ(rb, 2);
    ASSERT_EQ(cb, 3);
    auto x = random_bf16(R * C, 11, 8.0f);
    std::vector<uint8_t> q(size_t(R * C)), qt(size_t(R * C));
    std::vector<float> s(size_t(R * cb), -1), st(size_t(C * rb), -1);
    Fp8BlockCastArgs a;
    a.rows = R;
    a.cols = C;
    a.x = x.data();
    a.block = Fp8Block::k1x128;
    a.q = q.data();
    a.scale_inv = s.data();
    a.qt = qt.data();
    a.scale_inv_t = st.data();
    cpu::fp8_block_cast(a);
    for (int64_t r = 0; r < R; ++r)
        for (int64_t bj = 0; bj < cb; ++bj) {
            const int64_t c0 = bj * 128, n = std::min<int64_t>(128, C - c0);
            const float amax = cpu::fp8_amax(&x[size_t(r * C + c0)], n);
            ASSERT_EQ(s[size_t(r * cb + bj)], 1.0f / fp8_scale_from_amax(amax, DType::kE4M3));
            std::vector<bf16> g(x.begin() + r * C + c0, x.begin() + r * C + c0 + n);
            expect_round_trip(g, &q[size_t(r * C + c0)], s[size_t(r * cb + bj)], DType::kE4M3);
        }
    for (int64_t c = 0; c < C; ++c)
        for (int64_t bi = 0; bi < rb; ++bi) {
            const int64_t r0 = bi * 128, n = std::min<int64_t>(128, R - r0);
            std::vector<bf16> g(static_cast<size_t>(n));
            for (int64_t k = 0; k < n; ++k) g[size_t(k)] = x[size_t((r0 + k) * C + c)];
            const float amax = cpu::fp8_amax(g.data(), n);
            ASSERT_EQ(st[size_t(c * rb + bi)], 1.0f / fp8_scale_from_amax(amax, DType::kE4M3));
            expect_round_trip(g, &qt[size_t(c * R + r0)], st[size_t(c * rb + bi)], DType::kE4M3);
        }
    // A group's scale is its own: one huge value changes its row group's scale only.
    x[5] = float_to_bf16(1e4f);
    std::vector<float> s2(s.size());
    a.scale_inv = s2.data();
    a.qt = nullptr;
    cpu::fp8_block_cast(a);
    for (size_t i = 0; i < s.size(); ++i)
        if (i == 0)
            EXPECT_EQ(s2[i], 1.0f / fp8_scale_from_amax(bf16_to_float(x[5]), DType::kE4M3))
                << "the group of x[5]";
        else
            ASSERT_EQ(s2[i], s[i]) << i;
}

TEST(Fp8Cast, Blockwise128x128) {
    const int64_t R = 200, C = 257;
    const int64_t rb = fp8_blocks(R), cb = fp8_blocks(C);
    const auto x = random_bf16(R * C, 13, 8.0f);
    std::vector<uint8_t> q(size_t(R * C)), qt(size_t(R * C));
    std::vector<float> s(size_t(rb * cb), -1);
    Fp8BlockCastArgs a;
    a.rows = R;
    a.cols = C;
    a.x = x.data();
    a.block = Fp8Block::k128x128;
    a.q = q.data();
    a.scale_inv = s.data();
    a.qt = qt.data();
    cpu::fp8_block_cast(a);
    for (int64_t bi = 0; bi < rb; ++bi)
        for (int64_t bj = 0; bj < cb; ++bj) {
            std::vector<bf16> g;
            std::vector<uint8_t> gq;
            for (int64_t r = bi * 128; r < std::min(R, (bi + 1) * 128); ++r)
                for (int64_t c = bj * 128; c < std::min(C, (bj + 1) * 128); ++c) {
                    g.push_back(x[size_t(r * C + c)]);
                    gq.push_back(q[size_t(r * C + c)]);
                    ASSERT_EQ(qt[size_t(c * R + r)], q[size_t(r * C + c)]);
                }
            const float amax = cpu::fp8_amax(g.data(), int64_t(g.size()));
            ASSERT_EQ(s[size_t(bi * cb + bj)], 1.0f / fp8_scale_from_amax(amax, DType::kE4M3));
            expect_round_trip(g, gq.data(), s[size_t(bi * cb + bj)], DType::kE4M3);
        }
}

}  // namespace
}  // namespace lathe
