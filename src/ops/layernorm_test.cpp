#include "ops/layernorm.h"

#include "ops/op_test.h"

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

}  // namespace
}  // namespace lathe::optest
