// The harness itself: it must accept a right gradient and reject a wrong one, or every op test
// built on it proves nothing.
#include "ops/op_test.h"

namespace lathe::optest {
namespace {

TEST(GradCheck, AcceptsRightAndRejectsWrongGradients) {
    Rng rng(1);
    HostTensor x = random_tensor(rng, Shape{16});
    HostTensor r = random_tensor(rng, Shape{16});
    // L = sum_i r_i * sin(x_i) * x_i  (fp32 "forward")
    auto loss = [&] {
        double s = 0.0;
        for (int i = 0; i < 16; ++i) {
            const float xi = x.as<float>()[i];
            s += double(r.as<float>()[i]) * double(std::sin(xi) * xi);
        }
        return s;
    };
    HostTensor g = f32(Shape{16});
    for (int i = 0; i < 16; ++i) {
        const float xi = x.as<float>()[i];
        g.as<float>()[i] = r.as<float>()[i] * (std::cos(xi) * xi + std::sin(xi));
    }
    EXPECT_TRUE(gradient_matches(x, g, loss));
    g.as<float>()[5] *= 1.05f;  // one element 5% off
    EXPECT_FALSE(gradient_matches(x, g, loss));
    g.as<float>()[5] /= 1.05f;
    for (int i = 0; i < 16; ++i) g.as<float>()[i] *= 1.01f;  // everything 1% off
    EXPECT_FALSE(gradient_matches(x, g, loss));
}

}  // namespace
}  // namespace lathe::optest
