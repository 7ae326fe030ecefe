// The CPU reference of the blockwise fp8 GEMMs (ops/fp8_blockwise.h) against the plain product of
// the dequantized operands (codes times their block's scale, summed in double), within the fp32
// rounding the reference's summation order allows; the same product read through the GEMM-ready
// scale layout; beta; and the byte sizes of the linear's buffers.

#include "ops/fp8_blockwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/cpu/fp8_cast.h"

namespace lathe {
namespace {

// bf16 values whose magnitude changes by up to 2^±6 from one 32-element run to the next, so that
// neighbouring blocks get scales far apart: reading a neighbour's scale is a large error.
std::vector<bf16> random_bf16(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> expo(-6, 6);
    std::vector<bf16> v(static_cast<size_t>(n));
    int e = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (i % 32 == 0) e = expo(rng);
        v[size_t(i)] = float_to_bf16(std::ldexp(normal(rng), e));
    }
    return v;
}

float decode(uint8_t c) {
    return e4m3_to_float(fp8_e4m3{c});
}

struct Cast {
    std::vector<uint8_t> q;
    std::vector<float> s;
};

// x (R, K) cast to E4M3 in `block` blocks (q and its row-major scales).
Cast cast(const std::vector<bf16>& x, int64_t R, int64_t K, Fp8Block block) {
    Cast c;
    c.q.resize(size_t(R * K));
    c.s.resize(
        size_t(block == Fp8Block::k1x128 ? R * fp8_blocks(K) : fp8_blocks(R) * fp8_blocks(K)));
    Fp8BlockCastArgs a;
    a.rows = R;
    a.cols = K;
    a.x = x.data();
    a.block = block;
    a.q = c.q.data();
    a.scale_inv = c.s.data();
    cpu::fp8_block_cast(a);
    return c;
}

// The view of a cast operand with the casts' row-major scales.
Fp8BlockOperandView view(const Cast& c, int64_t K, Fp8Block block) {
    Fp8BlockOperandView v;
    v.q = c.q.data();
    v.ld = K;
    v.scale = c.s.data();
    v.row_block = block == Fp8Block::k1x128 ? 1 : kFp8BlockSize;
    v.scale_row_stride = fp8_blocks(K);
    v.scale_k_stride = 1;
    return v;
}

// The element's dequantized value: its code times its block's scale.
double dequant(const Cast& c, int64_t K, Fp8Block block, int64_t r, int64_t k) {
    const int64_t rb = block == Fp8Block::k1x128 ? r : r / kFp8BlockSize;
    return double(decode(c.q[size_t(r * K + k)])) *
           double(c.s[size_t(rb * fp8_blocks(K) + k / kFp8BlockSize)]);
}

void expect_matches_dequantized(int64_t M, int64_t N, int64_t K, Fp8Block a_block,
                                Fp8Block b_block) {
    SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K);
    const Cast a = cast(random_bf16(M * K, 11), M, K, a_block);
    const Cast b = cast(random_bf16(N * K, 12), N, K, b_block);
    std::vector<float> d(size_t(M * N)), mag(size_t(M * N));
    fp8_blockwise_gemm_reference(d.data(), N, view(a, K, a_block), view(b, K, b_block), M, N, K,
                                 0.0f, mag.data());
    // The reference's error against the exact sum: each block's inner sum of at most 128 exact
    // products in fp32 (127 roundings), the scale product and its multiply (2), and the fp32 sum
    // over the ceil(K/128) blocks (Kb - 1 roundings), each at most 2^-24 of the magnitude S of
    // the terms: (128 + 2 + Kb) 2^-24 S, first order; 1.01 covers the second-order terms. The
    // double sum's own error (2^-53 K S) is far below.
    const double rel = double(128 + 2 + fp8_blocks(K)) * 0x1p-24 * 1.01;
    double worst = 0;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            double exact = 0, s = 0;
            for (int64_t k = 0; k < K; ++k) {
                const double t = dequant(a, K, a_block, m, k) * dequant(b, K, b_block, n, k);
                exact += t;
                s += std::fabs(t);
            }
            const double got = d[size_t(m * N + n)];
            EXPECT_LE(std::fabs(got - exact), rel * s + 1e-30) << "at " << m << ", " << n;
            // The magnitude output is the same S, within the same rounding.
            EXPECT_NEAR(mag[size_t(m * N + n)], s, rel * s + 1e-30);
            worst = std::max(worst, std::fabs(got - exact) / (rel * s + 1e-30));
        }
    EXPECT_LE(worst, 1.0);
}

TEST(Fp8BlockwiseReference, OneBy128TimesBlocksMatchesTheDequantizedProduct) {
    expect_matches_dequantized(24, 40, 512, Fp8Block::k1x128, Fp8Block::k128x128);
}

TEST(Fp8BlockwiseReference, OneBy128TimesOneBy128MatchesTheDequantizedProduct) {
    expect_matches_dequantized(24, 40, 384, Fp8Block::k1x128, Fp8Block::k1x128);
}

TEST(Fp8BlockwiseReference, PartialBlocksAtEveryEdge) {
    // 200 rows: a 128-row block and a 72-row one; K 300: blocks of 128, 128 and 44.
    expect_matches_dequantized(20, 200, 300, Fp8Block::k1x128, Fp8Block::k128x128);
    expect_matches_dequantized(200, 20, 300, Fp8Block::k128x128, Fp8Block::k1x128);
}

TEST(Fp8BlockwiseReference, ReadsTheGemmReadyLayoutThroughItsStrides) {
    constexpr int64_t M = 36, N = 260, K = 520;  // Kb 5 (R4 8), N blocks 3
    const Cast a = cast(random_bf16(M * K, 21), M, K, Fp8Block::k1x128);
    const Cast b = cast(random_bf16(N * K, 22), N, K, Fp8Block::k128x128);
    const int64_t Kb = fp8_blocks(K), Nb = fp8_blocks(N);
    // The layouts of ops/fp8_blockwise.h, filled from the row-major scales; padding NaN (never
    // read).
    std::vector<float> sa(size_t(fp8_block_gemm_scale_count(Fp8Block::k1x128, M, K)), NAN);
    std::vector<float> sb(size_t(fp8_block_gemm_scale_count(Fp8Block::k128x128, N, K)), NAN);
    ASSERT_EQ(sa.size(), size_t(Kb * fp8_round4(M)));
    ASSERT_EQ(sb.size(), size_t(Nb * fp8_round4(Kb)));
    for (int64_t m = 0; m < M; ++m)
        for (int64_t kb = 0; kb < Kb; ++kb)
            sa[size_t(kb * fp8_round4(M) + m)] = a.s[size_t(m * Kb + kb)];
    for (int64_t nb = 0; nb < Nb; ++nb)
        for (int64_t kb = 0; kb < Kb; ++kb)
            sb[size_t(nb * fp8_round4(Kb) + kb)] = b.s[size_t(nb * Kb + kb)];
    Fp8BlockOperandView va = view(a, K, Fp8Block::k1x128), vb = view(b, K, Fp8Block::k128x128);
    std::vector<float> want(size_t(M * N)), got(size_t(M * N));
    fp8_blockwise_gemm_reference(want.data(), N, va, vb, M, N, K, 0.0f);
    va.scale = sa.data();
    va.scale_row_stride = 1;
    va.scale_k_stride = fp8_round4(M);
    vb.scale = sb.data();
    vb.scale_row_stride = fp8_round4(Kb);
    vb.scale_k_stride = 1;
    fp8_blockwise_gemm_reference(got.data(), N, va, vb, M, N, K, 0.0f);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "at " << i;
}

TEST(Fp8BlockwiseReference, BetaAddsTheProductToD) {
    constexpr int64_t M = 8, N = 16, K = 256;
    const Cast a = cast(random_bf16(M * K, 31), M, K, Fp8Block::k1x128);
    const Cast b = cast(random_bf16(N * K, 32), N, K, Fp8Block::k1x128);
    std::vector<float> prod(size_t(M * N)), d(size_t(M * N));
    for (size_t i = 0; i < d.size(); ++i) d[i] = float(i) * 0.25f - 3.0f;
    const std::vector<float> d0 = d;
    fp8_blockwise_gemm_reference(prod.data(), N, view(a, K, Fp8Block::k1x128),
                                 view(b, K, Fp8Block::k1x128), M, N, K, 0.0f);
    fp8_blockwise_gemm_reference(d.data(), N, view(a, K, Fp8Block::k1x128),
                                 view(b, K, Fp8Block::k1x128), M, N, K, 1.0f);
    for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i], d0[i] + prod[i]) << "at " << i;
}

// The MMA error bound on one row of products worked by hand (scales 1, one 32-wide step, 14
// bits): 32 products of 1 are all on the grid of their largest (2^-13), so only the step's result
// is truncated: 32 2^-13; a product of 256 moves the grid to 2^-5, where products of 1 still lie
// (256 + 31) 2^-13, but products of 2^-6 do not: each of the 31 adds 2^-5; a second step adds
// its own terms and the running sum's (one more grid unit of the running sum's magnitude).
TEST(Fp8BlockwiseReference, MmaErrorBoundCountsTheTermsOffTheAlignedGrid) {
    constexpr uint8_t kOne = 0x38, k256 = 0x78, kTiny = 0x08;  // e4m3 1, 256, 2^-6
    const std::vector<float> ones(1, 1.0f);
    const auto bound_of = [&](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
        Fp8BlockOperandView va, vb;
        va.q = a.data();
        vb.q = b.data();
        va.ld = vb.ld = int64_t(a.size());
        va.scale = vb.scale = ones.data();
        va.scale_row_stride = vb.scale_row_stride = 0;
        va.scale_k_stride = vb.scale_k_stride = 0;
        float bound = 0;
        fp8_blockwise_mma_error_bound(&bound, 1, va, vb, 1, 1, int64_t(a.size()), 32, 14);
        return double(bound);
    };
    const double tol = 0x1p-19;  // the function's (1 + 2^-20) and float rounding
    std::vector<uint8_t> a(32, kOne), b(32, kOne);
    EXPECT_NEAR(bound_of(a, b) / (32 * 0x1p-13), 1.0, tol);
    a[0] = k256;
    EXPECT_NEAR(bound_of(a, b) / ((256 + 31) * 0x1p-13), 1.0, tol);
    for (size_t k = 1; k < 32; ++k) a[k] = kTiny;
    const double one_step = 31 * 0x1p-5 + (256 + 31 * 0x1p-6) * 0x1p-13;
    EXPECT_NEAR(bound_of(a, b) / one_step, 1.0, tol);
    // Second step: 32 products of 1 against a running sum near 256.49 (+ one_step): grid 2^-5,
    // the products on it, the running sum off it (1 unit), the result truncated.
    std::vector<uint8_t> a2 = a, b2(64, kOne);
    a2.resize(64, kOne);
    const double part = 256 + 31 * 0x1p-6;
    const double two_steps = one_step + 0x1p-5 + (part + one_step + 32) * 0x1p-13;
    EXPECT_NEAR(bound_of(a2, b2) / two_steps, 1.0, tol);
}

TEST(Fp8BlockwiseBuffers, ByteSizesOfALlamaLayerAndARaggedOne) {
    // N 512 tokens, I 4096, O 1024: Ib 32, Ob 8, Nb 4.
    const Fp8BlockwiseBufferBytes s = fp8_blockwise_buffer_bytes(512, 4096, 1024);
    EXPECT_EQ(s.wq, 1024u * 4096u);
    EXPECT_EQ(s.wqt, 1024u * 4096u);
    EXPECT_EQ(s.w_scale, 4u * 8u * 32u);   // Ob rows of R4(Ib)
    EXPECT_EQ(s.wt_scale, 4u * 32u * 8u);  // Ib rows of R4(Ob)
    EXPECT_EQ(s.xq, 512u * 4096u);
    EXPECT_EQ(s.x_scale, 4u * 32u * 512u);   // Ib rows of R4(N)
    EXPECT_EQ(s.xt_scale, 4u * 4u * 4096u);  // Nb rows of R4(I)
    EXPECT_EQ(s.dyq, 512u * 1024u);
    EXPECT_EQ(s.dy_scale, 4u * 8u * 512u);
    EXPECT_EQ(s.dyt_scale, 4u * 4u * 1024u);
    EXPECT_EQ(s.cast_scales, 4u * (512u * 32u + 4096u * 4u));  // x's two scale sets, the largest
    // Each buffer starts 256-byte aligned: the scale buffers here are multiples of 256 already.
    EXPECT_EQ(s.total(), 2 * s.wq + s.w_scale + s.wt_scale + 2 * s.xq + s.x_scale + s.xt_scale +
                             2 * s.dyq + s.dy_scale + s.dyt_scale + s.cast_scales);

    // N 272, I 400, O 336: Ib 4, Ob 3 (R4 4), Nb 3; padding in the 128x128 layouts.
    const Fp8BlockwiseBufferBytes r = fp8_blockwise_buffer_bytes(272, 400, 336);
    EXPECT_EQ(r.w_scale, 4u * 3u * 4u);
    EXPECT_EQ(r.wt_scale, 4u * 4u * 4u);
    EXPECT_EQ(r.x_scale, 4u * 4u * 272u);
    EXPECT_EQ(r.xt_scale, 4u * 3u * 400u);
    EXPECT_EQ(r.dyt_scale, 4u * 3u * 336u);
    EXPECT_EQ(r.total() % 256, 0u);
    EXPECT_GE(r.total(), r.wq + r.wqt + r.xq + r.xqt + r.dyq + r.dyqt);
}

}  // namespace
}  // namespace lathe
