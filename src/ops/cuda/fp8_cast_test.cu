// The CUDA fp8 casts (ops/cuda/fp8_cast.h) against the CPU reference (ops/cpu/fp8_cast.h), bit
// for bit: codes, scales and amax are each one correctly rounded fp32 operation or an exact max,
// so any difference is a bug, not a tolerance. Shapes cover the vector and scalar paths, the
// 32 x 32 transposing tiles and the 128 x 128 block tiles, with edges; inputs span 2^-16 to 2^16
// (subnormal codes and saturation both appear); a tensor with a NaN gives a NaN amax and scale.

// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/cpu/fp8_cast.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/fp8_cast.h"

#if defined(__NVCC__)
#pragma nv_diag_suppress 177
#endif

namespace lathe {
namespace {

std::vector<bf16> random_bf16(int64_t n, uint32_t seed, float spread) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> expo(-spread, spread);
    std::vector<bf16> v(static_cast<size_t>(n));
    for (auto& x : v) x = float_to_bf16(normal(rng) * std::exp2(expo(rng)));
    return v;
}

// Device memory holding `bytes`, filled with 0xFF (poison: a byte never written shows).
struct Dev {
    DeviceBuffer buf;
    explicit Dev(size_t bytes) : buf(bytes > 0 ? bytes : 1) {
        EXPECT_EQ(cudaMemset(buf.data(), 0xFF, bytes > 0 ? bytes : 1), cudaSuccess);
    }
    template <typename T>
    T* as() const {
        return static_cast<T*>(buf.data());
    }
};

template <typename T>
Dev upload(const std::vector<T>& h) {
    Dev d(h.size() * sizeof(T));
    EXPECT_EQ(cudaMemcpy(d.buf.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    return d;
}

template <typename T>
std::vector<T> download(const Dev& d, size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), d.buf.data(), n * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return h;
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

enum class Mode { kCurrent, kCurrentAmaxReady, kDelayed };

void check_tensorwise(int64_t R, int64_t C, DType t, Mode mode, bool want_q, bool want_qt,
                      uint32_t seed) {
    SCOPED_TRACE(::testing::Message() << R << "x" << C << " " << dtype_name(t) << " mode "
                                      << int(mode) << " q " << want_q << " qt " << want_qt);
    CudaState state(0);
    const auto x = random_bf16(R * C, seed, 16.0f);
    const size_t n = size_t(R * C);
    // CPU reference.
    std::vector<uint8_t> q(n), qt(n);
    float amax = 0, scale_inv = 0;
    const float given_scale = t == DType::kE4M3 ? 0.03125f : 3.0f;  // saturates the largest
    Fp8CastArgs a;
    a.rows = R;
    a.cols = C;
    a.x = x.data();
    a.dtype = t;
    a.q = want_q ? q.data() : nullptr;
    a.qt = want_qt ? qt.data() : nullptr;
    a.amax = &amax;
    a.scale_inv = &scale_inv;
    if (mode == Mode::kDelayed) a.scale = &given_scale;
    if (mode == Mode::kCurrentAmaxReady) {
        amax = cpu::fp8_amax(x.data(), R * C);
        a.amax_ready = true;
    }
    cpu::fp8_cast(a);
    // CUDA.
    Dev dx = upload(x), dq(n), dqt(n), damax(16), dscale_inv(16);
    const Dev dscale = upload(std::vector<float>{given_scale});
    if (mode == Mode::kCurrentAmaxReady)
        cuda::fp8_amax(dx.as<bf16>(), R * C, damax.as<float>(), state.stream());
    Fp8CastArgs g = a;
    g.x = dx.as<bf16>();
    g.q = want_q ? dq.as<void>() : nullptr;
    g.qt = want_qt ? dqt.as<void>() : nullptr;
    g.amax = damax.as<float>();
    g.scale_inv = dscale_inv.as<float>();
    g.scale = mode == Mode::kDelayed ? dscale.as<float>() : nullptr;
    cuda::fp8_cast(g, state.stream());
    EXPECT_EQ(bits(download<float>(damax, 1)[0]), bits(amax));
    EXPECT_EQ(bits(download<float>(dscale_inv, 1)[0]), bits(scale_inv));
    if (want_q) {
        const auto got = download<uint8_t>(dq, n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(int(got[i]), int(q[i])) << "q element " << i;
    }
    if (want_qt) {
        const auto got = download<uint8_t>(dqt, n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(int(got[i]), int(qt[i])) << "qt element " << i;
    }
}

TEST(CudaFp8Cast, TensorwiseMatchesCpuBitForBit) {
    uint32_t seed = 1;
    for (DType t : {DType::kE4M3, DType::kE5M2})
        for (Mode m : {Mode::kCurrent, Mode::kCurrentAmaxReady, Mode::kDelayed}) {
            check_tensorwise(256, 1024, t, m, true, false, seed++);  // vector path
            check_tensorwise(33, 77, t, m, true, false, seed++);     // scalar path
            check_tensorwise(96, 160, t, m, true, true, seed++);     // 128 x 128 tiles, edges
            check_tensorwise(45, 70, t, m, true, true, seed++);      // 32 x 32 tiles, edges
            check_tensorwise(40, 64, t, m, false, true, seed++);     // qt alone, 128 x 128
            check_tensorwise(42, 66, t, m, false, true, seed++);     // qt alone, 32 x 32
            check_tensorwise(128, 256, t, m, true, true, seed++);    // 128 x 128, whole tiles
            check_tensorwise(8, 8, t, m, true, true, seed++);        // 128 x 128, one partial tile
            check_tensorwise(264, 392, t, m, true, true, seed++);    // 3 x 4 tiles, both edges
        }
}

TEST(CudaFp8Cast, AmaxOfALargeTensorAndNaN) {
    CudaState state(0);
    const int64_t n = (int64_t(1) << 22) + 8;
    auto x = random_bf16(n, 99, 20.0f);
    Dev dx = upload(x), damax(16);
    cuda::fp8_amax(dx.as<bf16>(), n, damax.as<float>(), state.stream());
    EXPECT_EQ(bits(download<float>(damax, 1)[0]), bits(cpu::fp8_amax(x.data(), n)));
    x[n / 2] = float_to_bf16(std::nanf(""));
    Dev dx2 = upload(x);
    cuda::fp8_amax(dx2.as<bf16>(), n, damax.as<float>(), state.stream());
    EXPECT_TRUE(std::isnan(download<float>(damax, 1)[0]));
    // And the scale made from it: NaN too (a NaN step is seen, never hidden by the cast).
    Dev dq(static_cast<size_t>(n)), dsi(16);
    Fp8CastArgs g;
    g.rows = 1;
    g.cols = n;
    g.x = dx2.as<bf16>();
    g.q = dq.as<void>();
    g.amax = damax.as<float>();
    g.scale_inv = dsi.as<float>();
    cuda::fp8_cast(g, state.stream());
    EXPECT_TRUE(std::isnan(download<float>(dsi, 1)[0]));
}

void check_blockwise(int64_t R, int64_t C, DType t, Fp8Block block, bool want_q, bool want_qt,
                     uint32_t seed) {
    SCOPED_TRACE(::testing::Message() << R << "x" << C << " " << dtype_name(t) << " block "
                                      << int(block) << " q " << want_q << " qt " << want_qt);
    CudaState state(0);
    const auto x = random_bf16(R * C, seed, 12.0f);
    const size_t n = size_t(R * C);
    const int64_t rb = fp8_blocks(R), cb = fp8_blocks(C);
    const size_t ns = block == Fp8Block::k1x128 ? size_t(R * cb) : size_t(rb * cb);
    const size_t nst = size_t(C * rb);
    std::vector<uint8_t> q(n), qt(n);
    std::vector<float> s(ns), st(nst);
    Fp8BlockCastArgs a;
    a.rows = R;
    a.cols = C;
    a.x = x.data();
    a.dtype = t;
    a.block = block;
    a.q = want_q ? q.data() : nullptr;
    a.scale_inv = want_q ? s.data() : nullptr;
    a.qt = want_qt ? qt.data() : nullptr;
    a.scale_inv_t = want_qt && block == Fp8Block::k1x128 ? st.data() : nullptr;
    cpu::fp8_block_cast(a);
    Dev dx = upload(x), dq(n), dqt(n), ds(ns * 4), dst(nst * 4);
    Fp8BlockCastArgs g = a;
    g.x = dx.as<bf16>();
    g.q = want_q ? dq.as<void>() : nullptr;
    g.scale_inv = want_q ? ds.as<float>() : nullptr;
    g.qt = want_qt ? dqt.as<void>() : nullptr;
    g.scale_inv_t = a.scale_inv_t ? dst.as<float>() : nullptr;
    cuda::fp8_block_cast(g, state.stream());
    if (want_q) {
        const auto got = download<uint8_t>(dq, n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(int(got[i]), int(q[i])) << "q element " << i;
        const auto gs = download<float>(ds, ns);
        for (size_t i = 0; i < ns; ++i) ASSERT_EQ(bits(gs[i]), bits(s[i])) << "scale " << i;
    }
    if (want_qt) {
        const auto got = download<uint8_t>(dqt, n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(int(got[i]), int(qt[i])) << "qt element " << i;
    }
    if (a.scale_inv_t) {
        const auto gs = download<float>(dst, nst);
        for (size_t i = 0; i < nst; ++i) ASSERT_EQ(bits(gs[i]), bits(st[i])) << "scale_t " << i;
    }
}

TEST(CudaFp8Cast, BlockwiseMatchesCpuBitForBit) {
    uint32_t seed = 100;
    for (DType t : {DType::kE4M3, DType::kE5M2}) {
        for (auto [R, C] : {std::pair<int64_t, int64_t>{256, 512}, {130, 300}, {1, 129}}) {
            check_blockwise(R, C, t, Fp8Block::k1x128, true, true, seed++);
            check_blockwise(R, C, t, Fp8Block::k1x128, true, false, seed++);
            check_blockwise(R, C, t, Fp8Block::k1x128, false, true, seed++);
            check_blockwise(R, C, t, Fp8Block::k128x128, true, true, seed++);
            check_blockwise(R, C, t, Fp8Block::k128x128, true, false, seed++);
        }
    }
}

}  // namespace
}  // namespace lathe
