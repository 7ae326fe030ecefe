#pragma once
// Element types of tensors and the narrow floating-point storage formats: bf16, IEEE fp16 (the F16
// of checkpoints, as a bit pattern), fp8 E4M3 and E5M2.
//
// Storage types are plain bit containers (one uint16_t or uint8_t) with explicit conversions; all
// arithmetic happens in fp32. Every narrowing conversion rounds to nearest, ties to even (RNE),
// which is what the hardware conversions of Hopper (cvt.rn) do, so CPU references built from these
// functions agree bit for bit with the CUDA backend's conversions.
//
// FP8 formats (OCP 8-bit floating point specification, as NVIDIA implements it):
//   E4M3 ("fn": finite + NaN): 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities;
//        S.1111.111 is NaN. Largest finite 448, smallest normal 2^-6, smallest subnormal 2^-9.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like with infinities and NaNs
//        (the top byte of an fp16). Largest finite 57344, smallest subnormal 2^-16.
// Overflow follows the two modes of CUDA's __nv_cvt_float_to_fp8: kSaturate clamps finite values
// and infinities to the largest finite value of the sign (NaN stays NaN); kNoSaturate turns a value
// that rounds beyond the largest finite into NaN (E4M3) or infinity (E5M2). A NaN encodes as
// S.1111111 in both formats and widens to a quiet f32 NaN of its sign with the fp8 mantissa on top:
// torch's float8_e4m3fn (kSaturate) and float8_e5m2 (kNoSaturate) casts, bit for bit
// (tests/test_fp8_formats.py).
//
// Host code only: CUDA kernels use cuda_bf16.h / cuda_fp8.h, and their tests compare against these.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

namespace lathe {

enum class DType : uint8_t {
    kF32,
    kBF16,
    kE4M3,
    kE5M2,
    kI32,  // token ids, targets (-100 = ignored), document ids, positions
    kI64,
    kU8,  // raw bytes (arena scratch)
};

// Bytes per element.
constexpr size_t dtype_size(DType t) {
    switch (t) {
        case DType::kF32:
            return 4;
        case DType::kBF16:
            return 2;
        case DType::kE4M3:
            return 1;
        case DType::kE5M2:
            return 1;
        case DType::kI32:
            return 4;
        case DType::kI64:
            return 8;
        case DType::kU8:
            return 1;
    }
    return 0;
}

// "f32", "bf16", "e4m3", "e5m2", "i32", "i64", "u8" (the names used in memory plans and messages).
constexpr std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::kF32:
            return "f32";
        case DType::kBF16:
            return "bf16";
        case DType::kE4M3:
            return "e4m3";
        case DType::kE5M2:
            return "e5m2";
        case DType::kI32:
            return "i32";
        case DType::kI64:
            return "i64";
        case DType::kU8:
            return "u8";
    }
    return "?";
}

// bfloat16 storage: the top 16 bits of an fp32.
struct bf16 {
    uint16_t bits = 0;
};
// fp8 storage.
struct fp8_e4m3 {
    uint8_t bits = 0;
};
struct fp8_e5m2 {
    uint8_t bits = 0;
};

enum class Fp8Overflow { kSaturate, kNoSaturate };

// Exact: every bf16 is an fp32.
inline float bf16_to_float(bf16 h) {
    return std::bit_cast<float>(uint32_t(h.bits) << 16);
}

// Round to nearest even. Values beyond the largest bf16 round to infinity as IEEE rounding says;
// NaN maps to a quiet NaN of the same sign (never to infinity, which truncation could produce).
inline bf16 float_to_bf16(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    if (std::isnan(f)) return bf16{uint16_t((u >> 16) | 0x0040u)};
    const uint32_t lsb = (u >> 16) & 1u;               // ties go to the even neighbour
    return bf16{uint16_t((u + 0x7FFFu + lsb) >> 16)};  // carries into the exponent as needed
}

// IEEE binary16 (the F16 of fp16 checkpoints such as Pythia's), as a bit pattern, to fp32: exact,
// NaN payloads kept.
inline float f16_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t man = h & 0x3FFu;
    if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));  // inf, NaN
    if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
    // Zero or subnormal: man * 2^-24, exact in f32.
    const float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
}

// fp32 to IEEE binary16 as torch converts: round to nearest even, f16 subnormals kept, beyond the
// largest finite (65504) rounds to infinity from 65520 on, NaN becomes the quiet NaN 0x7E00 of its
// sign.
inline uint16_t float_to_f16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return sign | 0x7E00u;
    // 65520 = 65504 + half an ulp: from here on, round to nearest even gives infinity.
    if (ax >= 0x477FF000u) return sign | 0x7C00u;
    if (ax >= 0x38800000u) {  // a normal f16 (>= 2^-14): rebias the exponent, round 13 bits away
        const uint32_t odd = (ax >> 13) & 1u;
        return sign | uint16_t((ax - 0x38000000u + 0x0FFFu + odd) >> 13);
    }
    // Subnormal or zero: the value in units of 2^-24, rounded to nearest even (a carry to 1024
    // is the smallest normal's encoding). The scaling is exact, nearbyint rounds ties to even.
    const float units = std::nearbyint(std::bit_cast<float>(ax) * 0x1p24f);
    return sign | uint16_t(units);
}

namespace detail {

// Rounds |f| (finite, > 0) to a format with kExpBits/kManBits and the given bias, ignoring the
// upper range; returns the unsigned bit pattern (exponent and mantissa fields), which may exceed
// the largest finite encoding: the caller applies the overflow policy.
// With e = max(floor(log2 a), e_min) and r = rne(a / 2^(e - M)), the encoding is
// ((e + bias) << M) + r - 2^M: this covers subnormals (e = e_min, r < 2^M) and the carry of a
// mantissa that rounds up to 2^(M+1) into the next exponent.
template <int kManBits, int kBias>
inline uint32_t fp8_encode_magnitude(float a) {
    constexpr int kEmin = 1 - kBias;
    int k = 0;
    std::frexp(a, &k);  // a = m * 2^k, m in [0.5, 1)
    int e = k - 1;      // floor(log2 a)
    if (e < kEmin) e = kEmin;
    const float x = std::ldexp(a, kManBits - e);  // exact: a power-of-two scaling
    float r = std::floor(x);
    const float frac = x - r;  // exact for these magnitudes
    if (frac > 0.5f || (frac == 0.5f && std::fmod(r, 2.0f) != 0.0f)) r += 1.0f;
    const int64_t bits = (int64_t(e + kBias) << kManBits) + int64_t(r) - (int64_t(1) << kManBits);
    return bits < 0 ? 0u : uint32_t(bits);  // r == 0 (a tiny value) gives bits == 0 via e_min
}

}  // namespace detail

// fp8 E4M3 (fn): round to nearest even; overflow per `mode` (see the file comment).
inline fp8_e4m3 float_to_e4m3(float f, Fp8Overflow mode = Fp8Overflow::kSaturate) {
    constexpr uint8_t kNaN = 0x7F, kMaxFinite = 0x7E;  // 448
    const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    if (std::isnan(f)) return fp8_e4m3{uint8_t(sign | kNaN)};
    const float a = std::fabs(f);
    if (a == 0.0f) return fp8_e4m3{sign};
    const uint32_t bits = std::isinf(a) ? 0xFFFFu : detail::fp8_encode_magnitude<3, 7>(a);
    if (bits > kMaxFinite)
        return fp8_e4m3{uint8_t(sign | (mode == Fp8Overflow::kSaturate ? kMaxFinite : kNaN))};
    return fp8_e4m3{uint8_t(sign | bits)};
}

// fp8 E5M2: round to nearest even; overflow per `mode`; infinities stay infinite unless saturated.
inline fp8_e5m2 float_to_e5m2(float f, Fp8Overflow mode = Fp8Overflow::kSaturate) {
    // NaN gives S.11111.11 as torch's float8_e5m2 cast does (the tests compare with torch).
    constexpr uint8_t kInf = 0x7C, kNaN = 0x7F, kMaxFinite = 0x7B;  // 57344
    const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    if (std::isnan(f)) return fp8_e5m2{uint8_t(sign | kNaN)};
    const float a = std::fabs(f);
    if (a == 0.0f) return fp8_e5m2{sign};
    const uint32_t bits = std::isinf(a) ? 0xFFFFu : detail::fp8_encode_magnitude<2, 15>(a);
    if (bits > kMaxFinite)
        return fp8_e5m2{uint8_t(sign | (mode == Fp8Overflow::kSaturate ? kMaxFinite : kInf))};
    return fp8_e5m2{uint8_t(sign | bits)};
}

// Exact widening conversions.
inline float e4m3_to_float(fp8_e4m3 h) {
    const bool neg = h.bits & 0x80;
    const int exp = (h.bits >> 3) & 0xF, man = h.bits & 0x7;
    float v;
    if (exp == 0xF && man == 0x7)  // the NaN: quiet, its mantissa on top as torch widens it
        return std::bit_cast<float>((neg ? 0x80000000u : 0u) | 0x7FF00000u);
    if (exp == 0)
        v = std::ldexp(float(man), -9);  // subnormal: man * 2^-6 / 8
    else
        v = std::ldexp(float(8 + man), exp - 7 - 3);
    return neg ? -v : v;
}

inline float e5m2_to_float(fp8_e5m2 h) {
    const bool neg = h.bits & 0x80;
    const int exp = (h.bits >> 2) & 0x1F, man = h.bits & 0x3;
    float v;
    if (exp == 0x1F && man != 0)  // NaN: quiet, its mantissa on top as torch widens it
        return std::bit_cast<float>((neg ? 0x80000000u : 0u) | 0x7FC00000u | uint32_t(man) << 21);
    if (exp == 0x1F)
        v = std::numeric_limits<float>::infinity();
    else if (exp == 0)
        v = std::ldexp(float(man), -16);  // subnormal: man * 2^-14 / 4
    else
        v = std::ldexp(float(4 + man), exp - 15 - 2);
    return neg ? -v : v;
}

// The DType of a C++ element type, for checked typed access to tensor views.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
    static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<bf16> {
    static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<fp8_e4m3> {
    static constexpr DType value = DType::kE4M3;
};
template <>
struct DTypeOf<fp8_e5m2> {
    static constexpr DType value = DType::kE5M2;
};
template <>
struct DTypeOf<int32_t> {
    static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
    static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<uint8_t> {
    static constexpr DType value = DType::kU8;
};

}  // namespace lathe
