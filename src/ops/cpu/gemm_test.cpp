#include "ops/cpu/gemm.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "ops/cpu/linear.h"
#include "ops/op_test.h"

namespace lathe::optest {
namespace {

// sgemm (BLAS when the build has it) agrees with the plain loops for every transpose combination,
// and beta = 0 overwrites C without reading it.
TEST(Gemm, BlasMatchesReferenceForAllTransposes) {
    Rng rng(7);
    const int64_t M = 5, N = 7, K = 3;
    for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
            HostTensor a = random_tensor(rng, ta ? Shape{K, M} : Shape{M, K});
            HostTensor b = random_tensor(rng, tb ? Shape{N, K} : Shape{K, N});
            HostTensor c0 = random_tensor(rng, Shape{M, N});
            HostTensor c1 = copy_tensor(c0.view()), c2 = copy_tensor(c0.view());
            cpu::sgemm(ta, tb, M, N, K, 0.5f, a.as<float>(), b.as<float>(), 2.0f, c1.as<float>());
            cpu::sgemm_reference(ta, tb, M, N, K, 0.5f, a.as<float>(), ta ? M : K, b.as<float>(),
                                 tb ? K : N, 2.0f, c2.as<float>(), N);
            EXPECT_TRUE(close_to(c1.view(), c2.view(), 1e-6)) << ta << tb;
            // Spot-check one element by hand.
            double ref = 0.0;
            for (int64_t k = 0; k < K; ++k)
                ref += double(ta ? a.as<float>()[k * M + 1] : a.as<float>()[1 * K + k]) *
                       double(tb ? b.as<float>()[2 * K + k] : b.as<float>()[k * N + 2]);
            EXPECT_NEAR(c2.as<float>()[1 * N + 2], 0.5 * ref + 2.0 * c0.as<float>()[1 * N + 2],
                        1e-6);
        }
    }
    HostTensor a = random_tensor(rng, Shape{M, K}), b = random_tensor(rng, Shape{K, N});
    // Strided: the middle 2 columns of a (M, 6) buffer times rows of b, into columns of a wider C.
    HostTensor wide = random_tensor(rng, Shape{M, 6}), cw = f32(Shape{M, 9});
    cpu::sgemm_strided(false, false, M, N, 2, 1.0f, wide.as<float>() + 2, 6, b.as<float>(), N, 0.0f,
                       cw.as<float>() + 1, 9);
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
            const double ref = double(wide.as<float>()[m * 6 + 2]) * b.as<float>()[n] +
                               double(wide.as<float>()[m * 6 + 3]) * b.as<float>()[N + n];
            EXPECT_NEAR(cw.as<float>()[m * 9 + 1 + n], ref, 1e-6);
        }
        EXPECT_EQ(cw.as<float>()[m * 9], 0.0f);  // untouched outside the N columns
        EXPECT_EQ(cw.as<float>()[m * 9 + 8], 0.0f);
    }
    HostTensor c = f32(Shape{M, N});
    for (int64_t i = 0; i < M * N; ++i) c.as<float>()[i] = std::nanf("");
    cpu::sgemm(false, false, M, N, K, 1.0f, a.as<float>(), b.as<float>(), 0.0f, c.as<float>());
    for (int64_t i = 0; i < M * N; ++i) EXPECT_FALSE(std::isnan(c.as<float>()[i]));
}

// The reference of the tests below: P = op(A) op(B) in fp64 from f32 stored matrices.
double product(const std::vector<float>& a, int64_t lda, bool ta, const std::vector<float>& b,
               int64_t ldb, bool tb, int64_t K, int64_t i, int64_t j, int64_t a0 = 0,
               int64_t b0 = 0) {
    double acc = 0.0;
    for (int64_t k = 0; k < K; ++k)
        acc += double(a[size_t(a0 + (ta ? k * lda + i : i * lda + k))]) *
               double(b[size_t(b0 + (tb ? j * ldb + k : k * ldb + j))]);
    return acc;
}

std::vector<float> random_values(Rng& rng, int64_t n) {
    HostTensor t = random_tensor(rng, Shape{n});
    return std::vector<float>(t.as<float>(), t.as<float>() + n);
}

// f32 operands through the description: every transpose, padded row strides, two batches with
// padded batch strides, alpha and beta (D read as C); elements outside the N columns of D stay.
TEST(Gemm, ArgsF32TransposesStridesAndBatches) {
    Rng rng(11);
    const int64_t M = 5, N = 7, K = 3, batches = 2;
    for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
            const int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldd = N + 3;
            const int64_t sa = (ta ? K : M) * lda + 4, sb = (tb ? N : K) * ldb + 2, sd = M * ldd;
            const std::vector<float> a = random_values(rng, batches * sa);
            const std::vector<float> b = random_values(rng, batches * sb);
            const std::vector<float> d0 = random_values(rng, batches * sd);
            std::vector<float> d = d0;
            GemmArgs g;
            g.M = M, g.N = N, g.K = K;
            g.A = a.data(), g.a_dtype = DType::kF32, g.lda = lda, g.trans_a = ta;
            g.B = b.data(), g.b_dtype = DType::kF32, g.ldb = ldb, g.trans_b = tb;
            g.D = d.data(), g.d_dtype = DType::kF32, g.ldd = ldd;
            g.alpha = 0.5f, g.beta = 2.0f;
            g.batch_count = batches;
            g.batch_stride_a = sa, g.batch_stride_b = sb, g.batch_stride_d = sd;
            cpu::gemm(g);
            for (int64_t bt = 0; bt < batches; ++bt) {
                for (int64_t i = 0; i < M; ++i) {
                    for (int64_t j = 0; j < ldd; ++j) {
                        const size_t at = size_t(bt * sd + i * ldd + j);
                        if (j >= N) {
                            EXPECT_EQ(d[at], d0[at]);
                            continue;
                        }
                        const double ref =
                            0.5 * product(a, lda, ta, b, ldb, tb, K, i, j, bt * sa, bt * sb) +
                            2.0 * d0[at];
                        EXPECT_NEAR(d[at], ref, 1e-5) << ta << tb << " batch " << bt;
                    }
                }
            }
        }
    }
}

// A linear's forward through the description (x W^T, the bias epilogue in f32) is bit for bit
// cpu::linear_forward: the same sgemm call and the same bias loop.
TEST(Gemm, ArgsBiasEpilogueIsTheLinearForward) {
    Rng rng(12);
    const int64_t N = 9, I = 6, O = 4;
    const std::vector<float> x = random_values(rng, N * I), w = random_values(rng, O * I),
                             bias = random_values(rng, O);
    std::vector<float> y1(size_t(N * O)), y2(size_t(N * O));
    cpu::linear_forward(y1.data(), x.data(), w.data(), bias.data(), N, I, O);
    GemmArgs g;
    g.M = N, g.N = O, g.K = I;
    g.A = x.data(), g.a_dtype = DType::kF32, g.lda = I;
    g.B = w.data(), g.b_dtype = DType::kF32, g.ldb = I, g.trans_b = true;
    g.D = y2.data(), g.d_dtype = DType::kF32, g.ldd = O;
    g.epilogue = GemmEpilogue::kBias, g.bias = bias.data(), g.bias_dtype = DType::kF32;
    cpu::gemm(g);
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0);
}

// bf16 operands widen exactly: the product equals the f32 one of the widened values, and a bf16
// D is that f32 result rounded once (to nearest even). A bf16 C (the residual) joins before the
// rounding.
TEST(Gemm, ArgsBf16OperandsWidenAndRoundOnce) {
    Rng rng(13);
    const int64_t M = 4, N = 6, K = 37;
    const std::vector<float> af = random_values(rng, M * K), bf = random_values(rng, N * K),
                             cf = random_values(rng, M * N);
    std::vector<bf16> a(af.size()), b(bf.size()), c(cf.size());
    std::vector<float> aw(af.size()), bw(bf.size());
    for (size_t i = 0; i < af.size(); ++i) aw[i] = bf16_to_float(a[i] = float_to_bf16(af[i]));
    for (size_t i = 0; i < bf.size(); ++i) bw[i] = bf16_to_float(b[i] = float_to_bf16(bf[i]));
    for (size_t i = 0; i < cf.size(); ++i) c[i] = float_to_bf16(cf[i]);
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.A = a.data(), g.a_dtype = DType::kBF16, g.lda = K;
    g.B = b.data(), g.b_dtype = DType::kBF16, g.ldb = K, g.trans_b = true;
    std::vector<float> d32(size_t(M * N));
    g.D = d32.data(), g.d_dtype = DType::kF32, g.ldd = N;
    cpu::gemm(g);
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
            EXPECT_NEAR(d32[size_t(i * N + j)], product(aw, K, false, bw, K, true, K, i, j), 1e-5);
    std::vector<bf16> d16(size_t(M * N));
    g.D = d16.data(), g.d_dtype = DType::kBF16;
    g.C = c.data(), g.c_dtype = DType::kBF16, g.ldc = N, g.beta = 1.0f;
    cpu::gemm(g);
    for (size_t i = 0; i < d16.size(); ++i)
        EXPECT_EQ(d16[i].bits, float_to_bf16(d32[i] + bf16_to_float(c[i])).bits) << i;
}

// fp8 operands (an e4m3 A, an e5m2 B: the gradient case) with per-tensor scales, an e4m3 D with
// its scale, and the amax of the unscaled result. The values are drawn as (2^m + r) 2^(e - m)
// with e in [-2, 1] (m = 3 mantissa bits for e4m3, 2 for e5m2): exact in their format, products
// with 7 significant bits at or above 2^-9, sums of 16 below 2^8, so every sum is exact in f32,
// the scales are powers of two, and D is the one rounding of a known value.
TEST(Gemm, ArgsFp8ScalesAndAmax) {
    Rng rng(14);
    const int64_t M = 3, N = 5, K = 16;
    auto draw = [&](int mantissa_bits) {
        const int64_t r = rng.integer(0, (int64_t(1) << mantissa_bits) - 1);
        const int e = int(rng.integer(-2, 1));
        const float v = std::ldexp(float((int64_t(1) << mantissa_bits) + r), e - mantissa_bits);
        return rng.integer(0, 1) != 0 ? -v : v;
    };
    std::vector<fp8_e4m3> a(size_t(M * K));
    std::vector<fp8_e5m2> b(size_t(N * K));
    std::vector<float> aw(a.size()), bw(b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        aw[i] = draw(3);
        a[i] = float_to_e4m3(aw[i]);
        ASSERT_EQ(e4m3_to_float(a[i]), aw[i]);
    }
    for (size_t i = 0; i < b.size(); ++i) {
        bw[i] = draw(2);
        b[i] = float_to_e5m2(bw[i]);
        ASSERT_EQ(e5m2_to_float(b[i]), bw[i]);
    }
    const float a_scale = 0.25f, b_scale = 4.0f, d_scale = 8.0f;
    float amax = -1.0f;
    std::vector<fp8_e4m3> d(size_t(M * N));
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.A = a.data(), g.a_dtype = DType::kE4M3, g.lda = K;
    g.B = b.data(), g.b_dtype = DType::kE5M2, g.ldb = K, g.trans_b = true;
    g.D = d.data(), g.d_dtype = DType::kE4M3, g.ldd = N;
    g.alpha = 0.5f;
    g.a_scale = &a_scale, g.b_scale = &b_scale, g.d_scale = &d_scale, g.d_amax = &amax;
    cpu::gemm(g);
    double want_amax = 0.0;
    for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
            const double t = 0.5 * 0.25 * 4.0 * product(aw, K, false, bw, K, true, K, i, j);
            want_amax = std::max(want_amax, std::fabs(t));
            EXPECT_EQ(d[size_t(i * N + j)].bits, float_to_e4m3(float(8.0 * t)).bits)
                << i << "," << j << ": " << t;
        }
    }
    EXPECT_EQ(double(amax), want_amax);
}

// The GELU epilogue with a bias: aux keeps the pre-activation P + bias, D its tanh GELU, each
// rounded once to bf16.
TEST(Gemm, ArgsGeluAuxBiasEpilogue) {
    Rng rng(15);
    const int64_t M = 3, N = 8, K = 5;
    const std::vector<float> a = random_values(rng, M * K), b = random_values(rng, K * N);
    std::vector<bf16> bias(static_cast<size_t>(N));
    for (auto& v : bias) v = float_to_bf16(random_tensor(rng, Shape{1}).as<float>()[0]);
    std::vector<bf16> d(size_t(M * N)), aux(size_t(M * N));
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.A = a.data(), g.a_dtype = DType::kF32, g.lda = K;
    g.B = b.data(), g.b_dtype = DType::kF32, g.ldb = N;
    g.D = d.data(), g.d_dtype = DType::kBF16, g.ldd = N;
    g.epilogue = GemmEpilogue::kGeluAuxBias;
    g.bias = bias.data(), g.bias_dtype = DType::kBF16;
    g.aux = aux.data(), g.ldaux = N;
    cpu::gemm(g);
    for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
            const double pre =
                product(a, K, false, b, N, false, K, i, j) + double(bf16_to_float(bias[size_t(j)]));
            const double gelu = 0.5 * pre *
                                (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) *
                                                 (pre + 0.044715 * pre * pre * pre)));
            const size_t at = size_t(i * N + j);
            EXPECT_NEAR(bf16_to_float(aux[at]), pre, std::fabs(pre) / 256 + 1e-6) << at;
            EXPECT_NEAR(bf16_to_float(d[at]), gelu, std::fabs(gelu) / 256 + 1e-6) << at;
        }
    }
}

// Arguments outside the description stop naming what is wrong.
TEST(Gemm, ArgsRefuseInconsistentDescriptions) {
    std::vector<float> a(4, 1.0f), b(4, 1.0f), d(4);
    GemmArgs g;
    g.M = 2, g.N = 2, g.K = 2;
    g.A = a.data(), g.a_dtype = DType::kF32, g.lda = 2;
    g.B = b.data(), g.b_dtype = DType::kF32, g.ldb = 2;
    g.D = d.data(), g.d_dtype = DType::kF32, g.ldd = 2;
    GemmArgs no_bias = g;
    no_bias.epilogue = GemmEpilogue::kBias;
    EXPECT_DEATH(cpu::gemm(no_bias), "a bias missing for epilogue bias");
    GemmArgs ints = g;
    ints.a_dtype = DType::kI32;
    EXPECT_DEATH(cpu::gemm(ints), "no kernel for a non-float dtype in M=2 N=2 K=2 A i32");
    GemmArgs narrow = g;
    narrow.ldb = 1;
    EXPECT_DEATH(cpu::gemm(narrow), "row strides too small");
    GemmArgs batched_gelu = g;
    batched_gelu.batch_count = 2, batched_gelu.batch_stride_d = 4;
    batched_gelu.epilogue = GemmEpilogue::kGeluAux, batched_gelu.aux = d.data(),
    batched_gelu.ldaux = 2;
    EXPECT_DEATH(cpu::gemm(batched_gelu), "an epilogue with more than one batch");
}

}  // namespace
}  // namespace lathe::optest
