#include "ops/layernorm.h"

#include "ops/op_test.h"
#include "ops/residual.h"

namespace lathe::optest {
namespace {

TEST(LayerNorm, ForwardByHand) {
    HostTensor x = tensor_of(Shape{1, 3}, {1, 2, 3});
    HostTensor w = tensor_of(Shape{3}, {1, 1, 2}), b = tensor_of(Shape{3}, {0, 0, 0.5f});
    HostTensor y = f32(Shape{1, 3}), mean = f32(Shape{1}), rstd = f32(Shape{1});
    layernorm_forward(y.view(), mean.view(), rstd.view(), x.view(), w.view(), b.view(), 0.0f,
                      cpu_context());
    const double s = 1.0 / std::sqrt(2.0 / 3.0);  // biased variance of 1, 2, 3 is 2/3
    EXPECT_NEAR(mean.as<float>()[0], 2.0, 1e-7);
    EXPECT_NEAR(rstd.as<float>()[0], s, 1e-6);
    EXPECT_NEAR(y.as<float>()[0], -s, 1e-6);
    EXPECT_NEAR(y.as<float>()[1], 0.0, 1e-7);
    EXPECT_NEAR(y.as<float>()[2], 2.0 * s + 0.5, 1e-6);
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
    const Context ctx = cpu_context();
    Rng rng(31);
    const int64_t N = 5, C = 8;
    HostTensor x = random_tensor(rng, Shape{N, C}), w = random_tensor(rng, Shape{C}, 0.5f, 1.5f);
    HostTensor b = random_tensor(rng, Shape{C});
    HostTensor y = f32(Shape{N, C}), mean = f32(Shape{N}), rstd = f32(Shape{N});
    HostTensor r = random_tensor(rng, Shape{N, C});
    auto loss = [&] {
        layernorm_forward(y.view(), mean.view(), rstd.view(), x.view(), w.view(), b.view(), 1e-5f,
                          ctx);
        return weighted_sum(y.view(), r.view());
    };
    loss();
    HostTensor dx = f32(Shape{N, C}), dw = f32(Shape{C}), db = f32(Shape{C});
    layernorm_backward(dx.view(), dw.view(), db.view(), r.view(), x.view(), w.view(), mean.view(),
                       rstd.view(), GradMode::kOverwrite, ctx);
    EXPECT_TRUE(gradient_matches(x, dx, loss)) << "x";
    EXPECT_TRUE(gradient_matches(w, dw, loss)) << "weight";
    EXPECT_TRUE(gradient_matches(b, db, loss)) << "bias";

    HostTensor dx1 = copy_tensor(dx.view()), db1 = copy_tensor(db.view());
    layernorm_backward(dx.view(), {}, db.view(), r.view(), x.view(), w.view(), mean.view(),
                       rstd.view(), GradMode::kAccumulate, ctx);
    for (int64_t i = 0; i < N * C; ++i) EXPECT_FLOAT_EQ(dx.as<float>()[i], 2 * dx1.as<float>()[i]);
    for (int64_t i = 0; i < C; ++i) EXPECT_FLOAT_EQ(db.as<float>()[i], 2 * db1.as<float>()[i]);
}

// The residual add fused in is residual_forward then the norm, bit for bit, also in place.
TEST(LayerNorm, ResidualFusedIsTheTwoOps) {
    const Context ctx = cpu_context();
    Rng rng(61);
    const int64_t N = 6, C = 10;
    const HostTensor a = random_tensor(rng, Shape{N, C}), b = random_tensor(rng, Shape{N, C});
    const HostTensor w = random_tensor(rng, Shape{C}), bias = random_tensor(rng, Shape{C});
    HostTensor x1 = f32(Shape{N, C}), y1 = f32(Shape{N, C}), m1 = f32(Shape{N}), r1 = f32(Shape{N});
    residual_forward(x1.view(), a.view(), b.view(), ctx);
    layernorm_forward(y1.view(), m1.view(), r1.view(), x1.view(), w.view(), bias.view(), 1e-5f,
                      ctx);
    HostTensor x2 = copy_tensor(a.view()), y2 = f32(Shape{N, C}), m2 = f32(Shape{N}),
               r2 = f32(Shape{N});
    layernorm_residual_forward(x2.view(), y2.view(), m2.view(), r2.view(), x2.view(), b.view(),
                               w.view(), bias.view(), 1e-5f, ctx);
    for (int64_t i = 0; i < N * C; ++i) {
        EXPECT_EQ(x2.as<float>()[i], x1.as<float>()[i]);
        EXPECT_EQ(y2.as<float>()[i], y1.as<float>()[i]);
    }
    for (int64_t i = 0; i < N; ++i) {
        EXPECT_EQ(m2.as<float>()[i], m1.as<float>()[i]);
        EXPECT_EQ(r2.as<float>()[i], r1.as<float>()[i]);
    }
}

}  // namespace
}  // namespace lathe::optest
