#include "ops/rmsnorm.h"

#include "ops/op_test.h"
#include "ops/residual.h"

namespace lathe::optest {
namespace {

TEST(RmsNorm, ForwardByHand) {
    HostTensor x = tensor_of(Shape{1, 2}, {3, 4}), w = tensor_of(Shape{2}, {1, 2});
    HostTensor y = f32(Shape{1, 2}), rstd = f32(Shape{1});
    rmsnorm_forward(y.view(), rstd.view(), x.view(), w.view(), 0.0f, cpu_context());
    const double rms = std::sqrt((9.0 + 16.0) / 2.0);
    EXPECT_NEAR(rstd.as<float>()[0], 1.0 / rms, 1e-7);
    EXPECT_NEAR(y.as<float>()[0], 3.0 / rms, 1e-6);
    EXPECT_NEAR(y.as<float>()[1], 8.0 / rms, 1e-6);
}

// y_amax on the CPU: the largest |y|, exactly one of y's values; the residual-fused op the same.
TEST(RmsNorm, OutputAmaxIsTheLargestMagnitude) {
    HostTensor x = tensor_of(Shape{2, 2}, {3, 4, -5, 1}), w = tensor_of(Shape{2}, {1, 2});
    HostTensor y = f32(Shape{2, 2}), rstd = f32(Shape{2}), amax = f32(Shape{1});
    rmsnorm_forward(y.view(), rstd.view(), x.view(), w.view(), 0.0f, cpu_context(), amax.view());
    float want = 0;
    for (int i = 0; i < 4; ++i) want = std::max(want, std::fabs(y.as<float>()[i]));
    EXPECT_EQ(amax.as<float>()[0], want);
    HostTensor zero = tensor_of(Shape{2, 2}, {0, 0, 0, 0}), x_out = f32(Shape{2, 2});
    HostTensor amax2 = f32(Shape{1});
    rmsnorm_residual_forward(x_out.view(), y.view(), rstd.view(), x.view(), zero.view(), w.view(),
                             0.0f, cpu_context(), amax2.view());
    EXPECT_EQ(amax2.as<float>()[0], want);
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
    const Context ctx = cpu_context();
    Rng rng(21);
    const int64_t N = 6, C = 8;
    HostTensor x = random_tensor(rng, Shape{2, 3, C}), w = random_tensor(rng, Shape{C}, 0.5f, 1.5f);
    HostTensor y = f32(Shape{2, 3, C}), rstd = f32(Shape{N}),
               r = random_tensor(rng, Shape{2, 3, C});
    auto loss = [&] {
        rmsnorm_forward(y.view(), rstd.view(), x.view(), w.view(), 1e-5f, ctx);
        return weighted_sum(y.view(), r.view());
    };
    loss();
    HostTensor dx = f32(Shape{2, 3, C}), dw = f32(Shape{C});
    rmsnorm_backward(dx.view(), dw.view(), r.view(), x.view(), w.view(), rstd.view(),
                     GradMode::kOverwrite, ctx);
    EXPECT_TRUE(gradient_matches(x, dx, loss)) << "x";
    EXPECT_TRUE(gradient_matches(w, dw, loss)) << "weight";

    // dx per GradMode, dweight +=.
    HostTensor dx1 = copy_tensor(dx.view()), dw1 = copy_tensor(dw.view());
    rmsnorm_backward(dx.view(), dw.view(), r.view(), x.view(), w.view(), rstd.view(),
                     GradMode::kAccumulate, ctx);
    for (int64_t i = 0; i < N * C; ++i) EXPECT_FLOAT_EQ(dx.as<float>()[i], 2 * dx1.as<float>()[i]);
    for (int64_t i = 0; i < C; ++i) EXPECT_FLOAT_EQ(dw.as<float>()[i], 2 * dw1.as<float>()[i]);
    rmsnorm_backward(dx.view(), {}, r.view(), x.view(), w.view(), rstd.view(), GradMode::kOverwrite,
                     ctx);
    for (int64_t i = 0; i < N * C; ++i) EXPECT_EQ(dx.as<float>()[i], dx1.as<float>()[i]);
}

// The residual add fused in is residual_forward then the norm, bit for bit, also in place.
TEST(RmsNorm, ResidualFusedIsTheTwoOps) {
    const Context ctx = cpu_context();
    Rng rng(62);
    const int64_t N = 6, C = 10;
    const HostTensor a = random_tensor(rng, Shape{N, C}), b = random_tensor(rng, Shape{N, C});
    const HostTensor w = random_tensor(rng, Shape{C});
    HostTensor x1 = f32(Shape{N, C}), y1 = f32(Shape{N, C}), r1 = f32(Shape{N});
    residual_forward(x1.view(), a.view(), b.view(), ctx);
    rmsnorm_forward(y1.view(), r1.view(), x1.view(), w.view(), 1e-6f, ctx);
    HostTensor x2 = copy_tensor(a.view()), y2 = f32(Shape{N, C}), r2 = f32(Shape{N});
    rmsnorm_residual_forward(x2.view(), y2.view(), r2.view(), x2.view(), b.view(), w.view(), 1e-6f,
                             ctx);
    for (int64_t i = 0; i < N * C; ++i) {
        EXPECT_EQ(x2.as<float>()[i], x1.as<float>()[i]);
        EXPECT_EQ(y2.as<float>()[i], y1.as<float>()[i]);
    }
    for (int64_t i = 0; i < N; ++i) EXPECT_EQ(r2.as<float>()[i], r1.as<float>()[i]);
}

}  // namespace
}  // namespace lathe::optest
