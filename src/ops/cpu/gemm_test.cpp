#include "ops/cpu/gemm.h"

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

}  // namespace
}  // namespace lathe::optest
