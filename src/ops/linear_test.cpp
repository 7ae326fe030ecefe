#include "ops/linear.h"

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

TEST(Linear, ForwardUsesTheOutInWeightLayout) {
    HostTensor x = tensor_of(Shape{1, 2}, {1, 2});
    HostTensor w = tensor_of(Shape{3, 2}, {1, 0, 0, 1, 1, 1});  // [out, in]
    HostTensor b = tensor_of(Shape{3}, {0.5f, 0, -1});
    HostTensor y = f32(Shape{1, 3});
    linear_forward(y.view(), x.view(), w.view(), b.view(), cpu_context());
    EXPECT_EQ(y.as<float>()[0], 1.5f);
    EXPECT_EQ(y.as<float>()[1], 2.0f);
    EXPECT_EQ(y.as<float>()[2], 2.0f);
    linear_forward(y.view(), x.view(), w.view(), {}, cpu_context());
    EXPECT_EQ(y.as<float>()[0], 1.0f);
}

TEST(Linear, GradientsMatchFiniteDifferences) {
    const Context ctx = cpu_context();
    Rng rng(41);
    const int64_t B = 2, T = 3, I = 5, O = 4;
    HostTensor x = random_tensor(rng, Shape{B, T, I}), w = random_tensor(rng, Shape{O, I});
    HostTensor b = random_tensor(rng, Shape{O});
    HostTensor y = f32(Shape{B, T, O}), r = random_tensor(rng, Shape{B, T, O});
    auto loss = [&] {
        linear_forward(y.view(), x.view(), w.view(), b.view(), ctx);
        return weighted_sum(y.view(), r.view());
    };
    HostTensor dx = f32(Shape{B, T, I}), dw = f32(Shape{O, I}), db = f32(Shape{O});
    linear_backward(dx.view(), dw.view(), db.view(), r.view(), x.view(), w.view(),
                    GradMode::kOverwrite, ctx);
    EXPECT_TRUE(gradient_matches(x, dx, loss)) << "x";
    EXPECT_TRUE(gradient_matches(w, dw, loss)) << "weight";
    EXPECT_TRUE(gradient_matches(b, db, loss)) << "bias";

    HostTensor dx1 = copy_tensor(dx.view()), dw1 = copy_tensor(dw.view());
    linear_backward(dx.view(), dw.view(), {}, r.view(), x.view(), w.view(), GradMode::kAccumulate,
                    ctx);
    for (int64_t i = 0; i < B * T * I; ++i)
        EXPECT_FLOAT_EQ(dx.as<float>()[i], 2 * dx1.as<float>()[i]);
    for (int64_t i = 0; i < O * I; ++i) EXPECT_FLOAT_EQ(dw.as<float>()[i], 2 * dw1.as<float>()[i]);
}

}  // namespace
}  // namespace lathe::optest
