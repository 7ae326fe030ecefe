// The FP8 formats of core/dtype.h against torch's float8_e4m3fn / float8_e5m2, bit for bit.
//
// A driver, not a CTest: tests/test_fp8_formats.py generates the inputs with torch (every bf16
// bit pattern, every fp8 code, the midpoints between neighbouring codes and the floats next to
// them, the overflow thresholds, random float32 bit patterns with NaNs, infinities and
// subnormals), runs this test with LATHE_FP8_IN naming a file of raw little-endian f32 values,
// and compares what it writes with torch's conversions of the same values. The Python side owns
// the comparison so that torch stays out of the C++ build; the input set is generated rather than
// checked in because it is millions of values.
//
// Written to LATHE_FP8_OUT (raw bytes):
//   for each input f, 4 bytes: float_to_e4m3(f, kSaturate), float_to_e4m3(f, kNoSaturate),
//                              float_to_e5m2(f, kSaturate), float_to_e5m2(f, kNoSaturate);
//   then 256 f32: e4m3_to_float(code) for code 0..255, then 256 f32: e5m2_to_float(code).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace lathe {
namespace {

TEST(Fp8FormatInterop, DISABLED_EncodeDecodeForPython) {
    const char* in_path = std::getenv("LATHE_FP8_IN");
    const char* out_path = std::getenv("LATHE_FP8_OUT");
    ASSERT_TRUE(in_path && out_path) << "set LATHE_FP8_IN and LATHE_FP8_OUT";
    std::ifstream in(in_path, std::ios::binary);
    ASSERT_TRUE(in) << in_path;
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
    ASSERT_EQ(bytes.size() % 4, 0u) << in_path << ": not a whole number of f32 values";
    const size_t n = bytes.size() / 4;
    ASSERT_GT(n, 0u) << in_path << " is empty";

    std::vector<uint8_t> codes(4 * n);
    for (size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, bytes.data() + 4 * i, 4);
        codes[4 * i + 0] = float_to_e4m3(f, Fp8Overflow::kSaturate).bits;
        codes[4 * i + 1] = float_to_e4m3(f, Fp8Overflow::kNoSaturate).bits;
        codes[4 * i + 2] = float_to_e5m2(f, Fp8Overflow::kSaturate).bits;
        codes[4 * i + 3] = float_to_e5m2(f, Fp8Overflow::kNoSaturate).bits;
    }
    std::vector<float> decoded(512);
    for (int c = 0; c < 256; ++c) {
        decoded[c] = e4m3_to_float(fp8_e4m3{uint8_t(c)});
        decoded[256 + c] = e5m2_to_float(fp8_e5m2{uint8_t(c)});
    }
    const std::string tmp = std::string(out_path) + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        ASSERT_TRUE(out) << tmp;
        out.write(reinterpret_cast<const char*>(codes.data()), std::streamsize(codes.size()));
        out.write(reinterpret_cast<const char*>(decoded.data()),
                  std::streamsize(decoded.size() * sizeof(float)));
        ASSERT_TRUE(out.good()) << tmp;
    }
    ASSERT_EQ(std::rename(tmp.c_str(), out_path), 0) << out_path;
}

}  // namespace
}  // namespace lathe
