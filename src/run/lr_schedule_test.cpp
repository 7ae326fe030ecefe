#include "run/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace lathe {
namespace {

// Reference values computed by hand from GPT-NeoX's AnnealingLR.get_lr (learning_rates.py).
TEST(LrSchedule, CosineWithWarmupFollowsGptNeox) {
    auto s = LrSchedule::make(6e-4, 6e-5, 0.01, 1000, LrDecayStyle::kCosine);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->warmup_steps, 10);
    EXPECT_DOUBLE_EQ(s->lr_at(0), 0.0);  // GPT-NeoX's first step runs at lr 0
    EXPECT_DOUBLE_EQ(s->lr_at(5), 6e-4 * 5 / 10);
    EXPECT_DOUBLE_EQ(s->lr_at(10), 6e-4);  // s <= W is still warmup: lr0 * 10/10
    // s = 510: n = 500, lr = lr0/2 (cos(pi/2) + 1) = lr0/2
    EXPECT_NEAR(s->lr_at(510), 3e-4, 1e-15);
    // past E - W the argument stops moving: n = 990 - 10 = 980
    const double tail = 6e-4 / 2 * (std::cos(M_PI * 980.0 / 1000.0) + 1);
    EXPECT_DOUBLE_EQ(s->lr_at(995), std::max(tail, 6e-5));
    EXPECT_DOUBLE_EQ(s->lr_at(5000), std::max(tail, 6e-5));
}

TEST(LrSchedule, LinearExponentialConstantAndFloor) {
    auto lin = LrSchedule::make(1.0, 0.1, 0.0, 100, LrDecayStyle::kLinear);
    ASSERT_TRUE(lin.ok());
    EXPECT_DOUBLE_EQ(lin->lr_at(0), 1.0);
    EXPECT_DOUBLE_EQ(lin->lr_at(50), 0.5);
    EXPECT_DOUBLE_EQ(lin->lr_at(95), 0.1);  // floored at min_lr
    auto ex = LrSchedule::make(1.0, 0.0, 0.0, 100, LrDecayStyle::kExponential);
    EXPECT_DOUBLE_EQ(ex->lr_at(100), std::exp(-0.693));
    auto c = LrSchedule::make(2.0, 0.0, 0.1, 100, LrDecayStyle::kConstant);
    EXPECT_DOUBLE_EQ(c->lr_at(5), 1.0);
    EXPECT_DOUBLE_EQ(c->lr_at(50), 2.0);
}

TEST(LrSchedule, BadSettingsAreErrors) {
    EXPECT_FALSE(LrSchedule::make(1e-3, 1e-2, 0.0, 10, LrDecayStyle::kCosine).ok());
    EXPECT_FALSE(LrSchedule::make(1e-3, 0.0, 1.5, 10, LrDecayStyle::kCosine).ok());
    EXPECT_FALSE(LrSchedule::make(1e-3, 0.0, 0.1, 0, LrDecayStyle::kCosine).ok());
    auto bad = lr_decay_style_from_string("cosin");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("cosine"), std::string::npos);
}

}  // namespace
}  // namespace lathe
