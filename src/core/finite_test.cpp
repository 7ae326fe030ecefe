#include "core/finite.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace lathe {
namespace {

TEST(Finite, CountsNanAndInfinitiesAndFindsTheFirst) {
    std::vector<float> x(1000, 0.5f);
    x[3] = std::numeric_limits<float>::denorm_min();  // tiny, still finite
    x[4] = std::numeric_limits<float>::max();
    x[5] = -0.0f;
    NonFiniteCount c = count_non_finite(x.data(), int64_t(x.size()));
    EXPECT_EQ(c.count, 0);
    EXPECT_EQ(c.first, -1);

    x[700] = std::numeric_limits<float>::quiet_NaN();
    x[250] = -std::numeric_limits<float>::infinity();
    x[999] = std::numeric_limits<float>::infinity();
    x[800] = -std::numeric_limits<float>::signaling_NaN();
    c = count_non_finite(x.data(), int64_t(x.size()));
    EXPECT_EQ(c.count, 4);
    EXPECT_EQ(c.first, 250);
    EXPECT_TRUE(std::isinf(c.first_value) && c.first_value < 0);
    EXPECT_EQ(count_non_finite(x.data(), 250).count, 0);
    EXPECT_EQ(count_non_finite(x.data(), 0).first, -1);
}

}  // namespace
}  // namespace lathe
