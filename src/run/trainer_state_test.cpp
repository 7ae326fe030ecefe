#include "run/trainer_state.h"

#include <gtest/gtest.h>

namespace lathe {
namespace {

TEST(TrainerState, RoundTripsExactlyThroughJsonText) {
    TrainerState s;
    s.step = 120;
    s.adam_step = 118;
    s.skipped_steps = 2;
    s.loss_mean = 3.141592653589793 / 7.0;
    s.loss_count = 118;
    s.interval_loss_sum = 0.1 + 0.2;
    s.interval_steps = 3;
    s.eval_passes = 4;
    const auto back =
        trainer_state_from_json(nlohmann::json::parse(trainer_state_to_json(s).dump(2)), "t.json");
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->step, 120);
    EXPECT_EQ(back->adam_step, 118);
    EXPECT_EQ(back->loss_mean, s.loss_mean);  // bit for bit
    EXPECT_EQ(back->interval_loss_sum, s.interval_loss_sum);
    EXPECT_EQ(back->eval_passes, 4);
}

TEST(TrainerState, MissingKeyAndInconsistencyAreErrors) {
    nlohmann::json j = trainer_state_to_json(TrainerState{});
    j.erase("adam_step");
    const auto missing = trainer_state_from_json(j, "ck/trainer_state.json");
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("ck/trainer_state.json"), std::string::npos);
    nlohmann::json k = trainer_state_to_json(TrainerState{});
    k["adam_step"] = 5;
    EXPECT_FALSE(trainer_state_from_json(k, "x").ok());
}

}  // namespace
}  // namespace lathe
