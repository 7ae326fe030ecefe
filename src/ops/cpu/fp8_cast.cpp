// The reference fp8 casts (ops/cpu/fp8_cast.h).

#include "ops/cpu/fp8_cast.h"

#include <bit>
#include <cstring>
#include <vector>

#include "core/check.h"

namespace lathe::cpu {

namespace {

// |x| as the bits of the f32 it widens to: maxima of these unsigned patterns are maxima of the
// values, with any NaN above every number (the CUDA kernels reduce the same integers).
uint32_t magnitude_bits(bf16 v) {
    return uint32_t(v.bits & 0x7FFFu) << 16;
}

uint8_t encode(float v, DType t) {
    return t == DType::kE4M3 ? float_to_e4m3(v, Fp8Overflow::kSaturate).bits
                             : float_to_e5m2(v, Fp8Overflow::kSaturate).bits;
}

void check_dtype(DType t, const char* what) {
    LATHE_CHECK(is_fp8(t), "{}: the fp8 dtype must be e4m3 or e5m2, not {}", what, dtype_name(t));
}

}  // namespace

float fp8_amax(const bf16* x, int64_t n) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, magnitude_bits(x[i]));
    return std::bit_cast<float>(m);
}

float fp8_amax(const float* x, int64_t n) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
    return std::bit_cast<float>(m);
}

void fp8_cast(const Fp8CastArgs& a) {
    check_dtype(a.dtype, "fp8_cast");
    LATHE_CHECK(a.rows >= 0 && a.cols >= 0 && a.x != nullptr, "fp8_cast: no input ({} x {})",
                a.rows, a.cols);
    LATHE_CHECK(a.q != nullptr || a.qt != nullptr, "fp8_cast: neither q nor qt to write");
    LATHE_CHECK(a.scale_inv != nullptr, "fp8_cast: no scale_inv to write");
    LATHE_CHECK(a.scale != nullptr || a.amax != nullptr,
                "fp8_cast: current scaling needs an amax pointer");
    const int64_t n = a.rows * a.cols;
    float scale;
    if (a.scale != nullptr) {
        scale = *a.scale;
        if (a.amax != nullptr) *a.amax = fp8_amax(a.x, n);
    } else {
        if (!a.amax_ready) *a.amax = fp8_amax(a.x, n);
        scale = fp8_scale_from_amax(*a.amax, a.dtype);
    }
    auto* q = static_cast<uint8_t*>(a.q);
    auto* qt = static_cast<uint8_t*>(a.qt);
    for (int64_t r = 0; r < a.rows; ++r)
        for (int64_t c = 0; c < a.cols; ++c) {
            const uint8_t code = encode(bf16_to_float(a.x[r * a.cols + c]) * scale, a.dtype);
            if (q) q[r * a.cols + c] = code;
            if (qt) qt[c * a.rows + r] = code;
        }
    *a.scale_inv = 1.0f / scale;
}

void fp8_block_cast(const Fp8BlockCastArgs& a) {
    check_dtype(a.dtype, "fp8_block_cast");
    LATHE_CHECK(a.rows >= 0 && a.cols >= 0 && a.x != nullptr, "fp8_block_cast: no input");
    LATHE_CHECK(a.q != nullptr || a.qt != nullptr, "fp8_block_cast: neither q nor qt to write");
    LATHE_CHECK(a.q == nullptr || a.scale_inv != nullptr, "fp8_block_cast: q without scale_inv");
    LATHE_CHECK(a.block == Fp8Block::k128x128 || a.qt == nullptr || a.scale_inv_t != nullptr,
                "fp8_block_cast: a 1x128 qt without scale_inv_t");
    LATHE_CHECK(a.block == Fp8Block::k1x128 || a.q != nullptr,
                "fp8_block_cast: 128x128 blocks write qt next to q (its scales are q's)");
    const int64_t R = a.rows, C = a.cols, rb = fp8_blocks(R), cb = fp8_blocks(C);
    constexpr int64_t B = kFp8BlockSize;
    auto* q = static_cast<uint8_t*>(a.q);
    auto* qt = static_cast<uint8_t*>(a.qt);
    auto value = [&](int64_t r, int64_t c) { return bf16_to_float(a.x[r * C + c]); };
    if (a.block == Fp8Block::k128x128) {
        for (int64_t bi = 0; bi < rb; ++bi)
            for (int64_t bj = 0; bj < cb; ++bj) {
                const int64_t r1 = std::min(R, (bi + 1) * B), c1 = std::min(C, (bj + 1) * B);
                uint32_t m = 0;
                for (int64_t r = bi * B; r < r1; ++r)
                    for (int64_t c = bj * B; c < c1; ++c)
                        m = std::max(m, magnitude_bits(a.x[r * C + c]));
                const float scale = fp8_scale_from_amax(std::bit_cast<float>(m), a.dtype);
                for (int64_t r = bi * B; r < r1; ++r)
                    for (int64_t c = bj * B; c < c1; ++c) {
                        const uint8_t code = encode(value(r, c) * scale, a.dtype);
                        q[r * C + c] = code;
                        if (qt) qt[c * R + r] = code;
                    }
                a.scale_inv[bi * cb + bj] = 1.0f / scale;
            }
        return;
    }
    if (q) {
        for (int64_t r = 0; r < R; ++r)
            for (int64_t bj = 0; bj < cb; ++bj) {
                const int64_t c1 = std::min(C, (bj + 1) * B);
                uint32_t m = 0;
                for (int64_t c = bj * B; c < c1; ++c)
                    m = std::max(m, magnitude_bits(a.x[r * C + c]));
                const float scale = fp8_scale_from_amax(std::bit_cast<float>(m), a.dtype);
                for (int64_t c = bj * B; c < c1; ++c)
                    q[r * C + c] = encode(value(r, c) * scale, a.dtype);
                a.scale_inv[r * cb + bj] = 1.0f / scale;
            }
    }
    if (qt) {
        for (int64_t c = 0; c < C; ++c)
            for (int64_t bi = 0; bi < rb; ++bi) {
                const int64_t r1 = std::min(R, (bi + 1) * B);
                uint32_t m = 0;
                for (int64_t r = bi * B; r < r1; ++r)
                    m = std::max(m, magnitude_bits(a.x[r * C + c]));
                const float scale = fp8_scale_from_amax(std::bit_cast<float>(m), a.dtype);
                for (int64_t r = bi * B; r < r1; ++r)
                    qt[c * R + r] = encode(value(r, c) * scale, a.dtype);
                a.scale_inv_t[c * rb + bi] = 1.0f / scale;
            }
    }
}

}  // namespace lathe::cpu
