#include "ops/grad_norm.h"

#include <cmath>
#include <vector>

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

// torch 2.15.0: torch.nn.utils.clip_grad_norm_ over grads [3, -4, 1.5] and
// [[0.25, 2], [-1, 0.5]] with max_norm 1.5: the returned norm and the clipped grads.
TEST(GradNorm, NormAndClipMatchTorch) {
    const Context ctx = cpu_context();
    HostTensor a = tensor_of(Shape{3}, {3.0f, -4.0f, 1.5f});
    HostTensor b = tensor_of(Shape{2, 2}, {0.25f, 2.0f, -1.0f, 0.5f});
    HostTensor norm = f32(Shape{1});
    const ConstTensorView grads[] = {a.view(), b.view()};
    grad_norm_l2(norm.view(), grads, ctx);
    EXPECT_EQ(norm.as<float>()[0], 0x1.6d34f00000000p+2f);
    const TensorView mutable_grads[] = {a.view(), b.view()};
    grad_clip_by_norm(mutable_grads, norm.view(), 1.5f, ctx);
    const float clipped[] = {0x1.93c2a00000000p-1f, -0x1.0d2c6a0000000p+0f, 0x1.93c2a00000000p-2f,
                             0x1.0d2c6a0000000p-4f, 0x1.0d2c6a0000000p-1f,  -0x1.0d2c6a0000000p-2f,
                             0x1.0d2c6a0000000p-3f};
    for (int i = 0; i < 3; ++i) EXPECT_EQ(a.as<float>()[i], clipped[i]) << i;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(b.as<float>()[i], clipped[3 + i]) << i;
}

TEST(GradNorm, LargeFlatBufferAndNoClipBelowMax) {
    const Context ctx = cpu_context();
    // 10000 elements (several fixed blocks) of value 0.01: norm = 0.01 * 100 = 1.
    HostTensor g = f32(Shape{10000});
    std::fill_n(g.as<float>(), 10000, 0.01f);
    HostTensor norm = f32(Shape{1});
    const ConstTensorView grads[] = {g.view()};
    grad_norm_l2(norm.view(), grads, ctx);
    EXPECT_NEAR(norm.as<float>()[0], 1.0f, 1e-6);
    const TensorView mg[] = {g.view()};
    grad_clip_by_norm(mg, norm.view(), 2.0f, ctx);  // below max: untouched
    EXPECT_EQ(g.as<float>()[123], 0.01f);
    EXPECT_EQ(grad_clip_coefficient(4.0f, 1.0f), 1.0f / (4.0f + float(1e-6)));
    EXPECT_EQ(grad_clip_coefficient(0.5f, 1.0f), 1.0f);
    // A non-finite norm leaves the gradients for the trainer to inspect.
    g.as<float>()[7] = std::nanf("");
    grad_norm_l2(norm.view(), grads, ctx);
    EXPECT_TRUE(std::isnan(norm.as<float>()[0]));
    grad_clip_by_norm(mg, norm.view(), 1.0f, ctx);
    EXPECT_EQ(g.as<float>()[123], 0.01f);
}

}  // namespace
}  // namespace lathe::optest
