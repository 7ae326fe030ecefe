#include "core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace lathe {
namespace {

// All finite non-negative values of a format, ascending, with their bit patterns.
template <typename Fp8, typename Decode>
std::vector<std::pair<float, uint8_t>> finite_ascending(Decode decode) {
    std::vector<std::pair<float, uint8_t>> out;
    for (int b = 0; b < 0x80; ++b) {
        const float v = decode(Fp8{uint8_t(b)});
        if (std::isfinite(v)) out.push_back({v, uint8_t(b)});
    }
    return out;
}

TEST(DType, SizesAndNames) {
    EXPECT_EQ(dtype_size(DType::kBF16), 2u);
    EXPECT_EQ(dtype_size(DType::kE4M3), 1u);
    EXPECT_EQ(dtype_size(DType::kI32), 4u);
    EXPECT_EQ(dtype_name(DType::kE5M2), "e5m2");
}

TEST(DType, Bf16RoundTripsEveryPattern) {
    for (uint32_t b = 0; b < 0x10000; ++b) {
        const float f = bf16_to_float(bf16{uint16_t(b)});
        const uint16_t back = float_to_bf16(f).bits;
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(bf16_to_float(bf16{back}))) << b;
        } else {
            EXPECT_EQ(back, b) << b;
        }
    }
}

TEST(DType, Bf16RoundsToNearestEven) {
    // 1 + 2^-8 lies exactly between bf16 1.0 (mantissa even) and 1 + 2^-7: goes down to 1.0.
    EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)), 1.0f);
    // 1 + 3*2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up.
    EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
    // Just above the midpoint goes up.
    EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
    EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(3.4e38f))));
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
    // A NaN whose payload sits only in the low bits must not turn into infinity.
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7F800001u)))));
}

TEST(DType, F16RoundTripsEveryEncoding) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = f16_to_float(uint16_t(h));
        const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
        if (nan) {
            EXPECT_TRUE(std::isnan(f)) << h;
            EXPECT_EQ(float_to_f16(f), (h & 0x8000) | 0x7E00) << h;
        } else {
            ASSERT_EQ(float_to_f16(f), h) << std::hex << h;
        }
    }
    EXPECT_EQ(f16_to_float(0x3C00), 1.0f);
    EXPECT_EQ(f16_to_float(0x0001), 0x1p-24f);
    EXPECT_EQ(f16_to_float(0x7BFF), 65504.0f);
}

TEST(DType, F16RoundsToNearestEven) {
    EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f), 0x3C00);             // tie -> even (down)
    EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);         // tie -> even (up)
    EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // above the tie
    EXPECT_EQ(float_to_f16(65519.0f), 0x7BFF);
    EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);  // the tie above 65504 goes to infinity
    EXPECT_EQ(float_to_f16(-1e10f), 0xFC00);
    EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);            // half the smallest subnormal: tie -> 0
    EXPECT_EQ(float_to_f16(3 * 0x1p-25f), 0x0002);        // 1.5 units: tie -> 2
    EXPECT_EQ(float_to_f16(1023.5f * 0x1p-24f), 0x0400);  // rounds up into the normals
    EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
    EXPECT_EQ(float_to_f16(1e-30f), 0x0000);
}

#if defined(__FLT16_MAX__)
// The compiler's half type: _Float16, which GCC's C++ has on x86-64 from GCC 12 and on aarch64
// from GCC 13; before that, aarch64's __fp16 (IEEE binary16 there, converted by fcvt).
#if defined(__aarch64__) && !defined(__clang__) && __GNUC__ < 13
using CompilerHalf = __fp16;
#else
using CompilerHalf = _Float16;
#endif

// The compiler's half conversion (IEEE round to nearest even) as an independent oracle.
TEST(DType, F16AgreesWithTheCompilersFloat16) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> bits;
    for (int i = 0; i < 2'000'000; ++i) {
        uint32_t x = bits(rng);
        // Concentrate on the f16 range (exponents 100..145) half of the time.
        if (i % 2) x = (x & 0x807FFFFFu) | ((100u + x % 46u) << 23);
        const float f = std::bit_cast<float>(x);
        if (std::isnan(f)) continue;
        const CompilerHalf h = static_cast<CompilerHalf>(f);
        ASSERT_EQ(float_to_f16(f), std::bit_cast<uint16_t>(h)) << std::hexfloat << f;
    }
}
#endif

TEST(DType, Fp8KnownEncodings) {
    EXPECT_EQ(e4m3_to_float(fp8_e4m3{0x7E}), 448.0f);
    EXPECT_EQ(e4m3_to_float(fp8_e4m3{0x08}), 0x1p-6f);
    EXPECT_EQ(e4m3_to_float(fp8_e4m3{0x01}), 0x1p-9f);
    EXPECT_TRUE(std::isnan(e4m3_to_float(fp8_e4m3{0x7F})));
    EXPECT_TRUE(std::isnan(e4m3_to_float(fp8_e4m3{0xFF})));
    EXPECT_EQ(e5m2_to_float(fp8_e5m2{0x7B}), 57344.0f);
    EXPECT_EQ(e5m2_to_float(fp8_e5m2{0x01}), 0x1p-16f);
    EXPECT_TRUE(std::isinf(e5m2_to_float(fp8_e5m2{0x7C})));
    EXPECT_EQ(e5m2_to_float(fp8_e5m2{0xBC}), -1.0f);
}

// Values and bit patterns produced with torch 2.15.0:
//   torch.tensor(xs, dtype=torch.float32).to(torch.float8_e4m3fn / float8_e5m2 / bfloat16)
// (torch saturates E4M3 overflow to 448, our kSaturate mode).
TEST(DType, MatchesTorchConversions) {
    const float xs[] = {0.3f,   -1.7f,  1000.0f,  3e-3f,        1e-3f,
                        470.0f, 460.0f, 0x1p-10f, 3 * 0x1p-11f, 5 * 0x1p-11f};
    const uint8_t e4m3[] = {42, 190, 126, 2, 1, 126, 126, 0, 1, 1};
    const uint8_t e5m2[] = {53, 191, 100, 26, 20, 95, 95, 20, 22, 25};
    const int16_t bf[] = {16026, -16422, 17530, 15173, 14979, 17387, 17382, 14976, 15040, 15136};
    for (int i = 0; i < 10; ++i) {
        EXPECT_EQ(float_to_e4m3(xs[i]).bits, e4m3[i]) << xs[i];
        EXPECT_EQ(float_to_e5m2(xs[i]).bits, e5m2[i]) << xs[i];
        EXPECT_EQ(int16_t(float_to_bf16(xs[i]).bits), bf[i]) << xs[i];
    }
}

template <typename Fp8, typename Encode, typename Decode>
void check_fp8_rounding(Encode encode, Decode decode) {
    const auto vals = finite_ascending<Fp8>(decode);
    for (const auto& [v, bits] : vals) {
        EXPECT_EQ(encode(v), bits) << v;
        EXPECT_EQ(encode(-v), uint8_t(bits | 0x80)) << -v;
    }
    for (size_t i = 0; i + 1 < vals.size(); ++i) {
        const auto [lo, lo_bits] = vals[i];
        const auto [hi, hi_bits] = vals[i + 1];
        const float mid = 0.5f * (lo + hi);  // exact in fp32
        const uint8_t even = (lo_bits & 1) == 0 ? lo_bits : hi_bits;
        EXPECT_EQ(encode(mid), even) << "tie between " << lo << " and " << hi;
        EXPECT_EQ(encode(std::nextafter(mid, hi)), hi_bits) << mid;
        EXPECT_EQ(encode(std::nextafter(mid, lo)), lo_bits) << mid;
    }
}

TEST(DType, E4M3RoundsToNearestEvenEverywhere) {
    check_fp8_rounding<fp8_e4m3>([](float f) { return float_to_e4m3(f).bits; }, e4m3_to_float);
}

TEST(DType, E5M2RoundsToNearestEvenEverywhere) {
    check_fp8_rounding<fp8_e5m2>([](float f) { return float_to_e5m2(f).bits; }, e5m2_to_float);
}

// Each of the 256 codes of each format: NaN codes decode to NaN (E4M3: S.1111.111; E5M2: exponent
// all ones with a mantissa), every other code decodes to a value that encodes back to the same
// code, signed zeros and E5M2's infinities included (without saturation), and a code with the
// sign bit set is the negation of the code without it.
TEST(DType, Fp8EveryCodeRoundTrips) {
    for (int c = 0; c < 256; ++c) {
        const uint8_t b = uint8_t(c);
        const float v4 = e4m3_to_float(fp8_e4m3{b});
        const float v5 = e5m2_to_float(fp8_e5m2{b});
        const bool nan4 = (b & 0x7F) == 0x7F, nan5 = (b & 0x7C) == 0x7C && (b & 0x03) != 0;
        EXPECT_EQ(std::isnan(v4), nan4) << c;
        EXPECT_EQ(std::isnan(v5), nan5) << c;
        if (!nan4) {
            EXPECT_EQ(float_to_e4m3(v4, Fp8Overflow::kNoSaturate).bits, b) << c;
            EXPECT_EQ(std::signbit(v4), (b & 0x80) != 0) << c;
            EXPECT_EQ(v4, -e4m3_to_float(fp8_e4m3{uint8_t(b ^ 0x80)})) << c;
        }
        if (!nan5) {
            EXPECT_EQ(float_to_e5m2(v5, Fp8Overflow::kNoSaturate).bits, b) << c;
            EXPECT_EQ(std::signbit(v5), (b & 0x80) != 0) << c;
            EXPECT_EQ(v5, -e5m2_to_float(fp8_e5m2{uint8_t(b ^ 0x80)})) << c;
        }
    }
    EXPECT_EQ(e5m2_to_float(fp8_e5m2{0x7C}), std::numeric_limits<float>::infinity());
    EXPECT_EQ(e5m2_to_float(fp8_e5m2{0xFC}), -std::numeric_limits<float>::infinity());
    EXPECT_EQ(e4m3_to_float(fp8_e4m3{0x7E}), 448.0f);
    EXPECT_EQ(e4m3_to_float(fp8_e4m3{0x01}), 0x1p-9f);
    EXPECT_EQ(e5m2_to_float(fp8_e5m2{0x7B}), 57344.0f);
    EXPECT_EQ(e5m2_to_float(fp8_e5m2{0x01}), 0x1p-16f);
}

TEST(DType, Fp8Overflow) {
    const float inf = std::numeric_limits<float>::infinity();
    // 464 is the midpoint between 448 and the (non-existent) 480: ties to even 448.
    EXPECT_EQ(float_to_e4m3(464.0f, Fp8Overflow::kNoSaturate).bits, 0x7E);
    EXPECT_EQ(float_to_e4m3(465.0f, Fp8Overflow::kNoSaturate).bits, 0x7F);
    EXPECT_EQ(float_to_e4m3(-1e6f, Fp8Overflow::kNoSaturate).bits, 0xFF);
    EXPECT_EQ(float_to_e4m3(465.0f, Fp8Overflow::kSaturate).bits, 0x7E);
    EXPECT_EQ(float_to_e4m3(-inf, Fp8Overflow::kSaturate).bits, 0xFE);
    EXPECT_EQ(float_to_e4m3(std::nanf("")).bits & 0x7F, 0x7F);
    // E5M2: 61440 is the midpoint between 57344 and 65536 (odd neighbour 0x7B is odd): to inf.
    EXPECT_EQ(float_to_e5m2(61439.0f, Fp8Overflow::kNoSaturate).bits, 0x7B);
    EXPECT_EQ(float_to_e5m2(61440.0f, Fp8Overflow::kNoSaturate).bits, 0x7C);
    EXPECT_EQ(float_to_e5m2(inf, Fp8Overflow::kNoSaturate).bits, 0x7C);
    EXPECT_EQ(float_to_e5m2(inf, Fp8Overflow::kSaturate).bits, 0x7B);
    EXPECT_TRUE(std::isnan(e5m2_to_float(float_to_e5m2(std::nanf("")))));
    // Underflow: below half the smallest subnormal goes to (signed) zero.
    EXPECT_EQ(float_to_e4m3(0x1p-11f).bits, 0x00);
    EXPECT_EQ(float_to_e4m3(-0x1p-11f).bits, 0x80);
    EXPECT_EQ(float_to_e5m2(0x1p-18f).bits, 0x00);
}

}  // namespace
}  // namespace lathe
