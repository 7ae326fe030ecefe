#include "ops/gelu.h"

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

// torch 2.15.0 in fp64: F.gelu(x) and F.gelu(x, approximate="tanh") (= HF gelu_new).
TEST(Gelu, ForwardMatchesTorch) {
    HostTensor x = tensor_of(Shape{7}, {-3.0f, -1.0f, -0.5f, 0.0f, 0.7f, 1.0f, 2.5f});
    const double erf_ref[] = {-0.00404969409489031, -0.15865525393145702, -0.15426876936299344, 0.0,
                              0.5306254434438489,   0.841344746068543,    2.4844758366855597};
    const double tanh_ref[] = {
        -0.0036373920817729943, -0.15880800939172324, -0.15428599017485606, 0.0,
        0.5305701347051167,     0.8411919906082768,   2.484915733910001};
    HostTensor y = f32(Shape{7});
    gelu_forward(y.view(), x.view(), GeluKind::kErf, cpu_context());
    for (int i = 0; i < 7; ++i) EXPECT_NEAR(y.as<float>()[i], erf_ref[i], 3e-7) << i;
    gelu_forward(y.view(), x.view(), GeluKind::kTanh, cpu_context());
    for (int i = 0; i < 7; ++i) EXPECT_NEAR(y.as<float>()[i], tanh_ref[i], 3e-7) << i;
}

TEST(Gelu, GradientsMatchFiniteDifferences) {
    const Context ctx = cpu_context();
    Rng rng(81);
    for (GeluKind kind : {GeluKind::kErf, GeluKind::kTanh}) {
        HostTensor x = random_tensor(rng, Shape{4, 6}, -4.0f, 4.0f);
        HostTensor y = f32(Shape{4, 6}), r = random_tensor(rng, Shape{4, 6});
        auto loss = [&] {
            gelu_forward(y.view(), x.view(), kind, ctx);
            return weighted_sum(y.view(), r.view());
        };
        HostTensor dx = f32(Shape{4, 6});
        gelu_backward(dx.view(), r.view(), x.view(), kind, ctx);
        EXPECT_TRUE(gradient_matches(x, dx, loss)) << (kind == GeluKind::kErf ? "erf" : "tanh");
        // The two forms are different functions (so the kind is really honoured).
        HostTensor other = f32(Shape{4, 6});
        gelu_backward(other.view(), r.view(), x.view(),
                      kind == GeluKind::kErf ? GeluKind::kTanh : GeluKind::kErf, ctx);
        EXPECT_FALSE(close_to(other.view(), dx.view(), 1e-4));
    }
}

}  // namespace
}  // namespace lathe::optest
