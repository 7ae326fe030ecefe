#include "ops/residual.h"

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

TEST(Residual, ForwardAddsAndBackwardAccumulatesIntoBoth) {
    const Context ctx = cpu_context();
    Rng rng(91);
    HostTensor a = random_tensor(rng, Shape{3, 4}), b = random_tensor(rng, Shape{3, 4});
    HostTensor out = f32(Shape{3, 4});
    residual_forward(out.view(), a.view(), b.view(), ctx);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(out.as<float>()[i], a.as<float>()[i] + b.as<float>()[i]);
    // In place into a.
    HostTensor a2 = copy_tensor(a.view());
    residual_forward(a2.view(), a2.view(), b.view(), ctx);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(a2.as<float>()[i], out.as<float>()[i]);

    HostTensor r = random_tensor(rng, Shape{3, 4});
    auto loss = [&] {
        residual_forward(out.view(), a.view(), b.view(), ctx);
        return weighted_sum(out.view(), r.view());
    };
    HostTensor da = f32(Shape{3, 4}), db = f32(Shape{3, 4});
    residual_backward(da.view(), db.view(), r.view(), ctx);
    EXPECT_TRUE(gradient_matches(a, da, loss));
    EXPECT_TRUE(gradient_matches(b, db, loss));
    residual_backward(da.view(), {}, r.view(), ctx);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(da.as<float>()[i], 2 * r.as<float>()[i]);
}

TEST(ResidualDeathTest, GradientMayNotAliasDout) {
    HostTensor d = f32(Shape{4});
    EXPECT_DEATH(residual_backward(d.view(), {}, d.view(), cpu_context()), "distinct buffers");
}

}  // namespace
}  // namespace lathe::optest
