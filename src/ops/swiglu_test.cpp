#include "ops/swiglu.h"

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

TEST(SwiGlu, ForwardByHand) {
    // Row [gate | up] = [1, -2 | 2, 3]: silu(1) * 2 and silu(-2) * 3.
    HostTensor gate_up = tensor_of(Shape{1, 4}, {1, -2, 2, 3});
    HostTensor out = f32(Shape{1, 2});
    swiglu_forward(out.view(), gate_up.view(), cpu_context());
    EXPECT_NEAR(out.as<float>()[0], 2.0 / (1.0 + std::exp(-1.0)), 1e-6);
    EXPECT_NEAR(out.as<float>()[1], 3.0 * -2.0 / (1.0 + std::exp(2.0)), 1e-6);
}

// out_amax and dgate_up_amax on the CPU: the largest |value|, exactly one of the values.
TEST(SwiGlu, OutputAmaxIsTheLargestMagnitude) {
    HostTensor gate_up = tensor_of(Shape{1, 4}, {1, -2, 2, 3});
    HostTensor out = f32(Shape{1, 2}), amax = f32(Shape{1});
    swiglu_forward(out.view(), gate_up.view(), cpu_context(), amax.view());
    EXPECT_EQ(amax.as<float>()[0],
              std::max(std::fabs(out.as<float>()[0]), std::fabs(out.as<float>()[1])));
    HostTensor dout = tensor_of(Shape{1, 2}, {0.5, -1}), dgu = f32(Shape{1, 4});
    swiglu_backward(dgu.view(), dout.view(), gate_up.view(), cpu_context(), amax.view());
    float want = 0;
    for (int i = 0; i < 4; ++i) want = std::max(want, std::fabs(dgu.as<float>()[i]));
    EXPECT_EQ(amax.as<float>()[0], want);
}

TEST(SwiGlu, GradientsMatchFiniteDifferences) {
    const Context ctx = cpu_context();
    Rng rng(71);
    const int64_t F = 5;
    HostTensor gate_up = random_tensor(rng, Shape{2, 3, 2 * F}, -3.0f, 3.0f);
    HostTensor out = f32(Shape{2, 3, F}), r = random_tensor(rng, Shape{2, 3, F});
    auto loss = [&] {
        swiglu_forward(out.view(), gate_up.view(), ctx);
        return weighted_sum(out.view(), r.view());
    };
    HostTensor d = f32(Shape{2, 3, 2 * F});
    swiglu_backward(d.view(), r.view(), gate_up.view(), ctx);
    EXPECT_TRUE(gradient_matches(gate_up, d, loss));
}

}  // namespace
}  // namespace lathe::optest
