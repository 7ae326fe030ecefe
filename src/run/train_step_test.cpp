// TrainStep with the device optimizer's two schedules on the CPU backend (optim/adamw_optimizer.h,
// "Schedules"): the overlapped schedule, whose units run when a forward first needs their weights,
// gives the serial schedule's bits (losses, norms, validation losses, every weight, both moments)
// over steps of two micro-batches with clipping, a frozen entry, a step computed but not applied,
// a validation forward between steps and a checkpoint resumed in a fresh model and optimizer; the
// update is really deferred (the weights move only when a forward or finish() asks for them), the
// gradients it read are zero after it, and data parallel is refused.

#include "run/train_step.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model/tiny_model_test_util.h"
#include "run/train_step_schedule_test_util.h"

namespace lathe {
namespace {

using schedule_test::RunPlan;
using schedule_test::RunResult;

Model make_llama(uint64_t seed) {
    ModelShape shape;
    shape.batch = 2;
    shape.seq_len = 8;
    Result<Model> m =
        Model::create(tiny_model::parse(tiny_model::kLlamaJson), shape, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    m->init(seed);
    return std::move(*m);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(TrainStepSchedule, OverlappedGivesTheSerialBits) {
    for (const float max_norm : {0.0f, 0.05f}) {
        SCOPED_TRACE(max_norm);
        RunPlan plan;
        plan.max_norm = max_norm;
        const RunResult want = schedule_test::run(plan, OptimizerSchedule::kSerial, make_llama);
        const RunResult got = schedule_test::run(plan, OptimizerSchedule::kOverlapped, make_llama);
        ASSERT_EQ(want.losses.size(), size_t(plan.steps));
        if (max_norm > 0.0f) {
            for (const float n : want.norms) EXPECT_GT(n, max_norm);  // the clip is exercised
        }
        EXPECT_EQ(got.losses, want.losses);
        EXPECT_EQ(got.norms, want.norms);
        ASSERT_EQ(want.evals.size(), 1u);
        EXPECT_EQ(got.evals, want.evals);
        EXPECT_TRUE(same_bits(got.params, want.params));
        EXPECT_TRUE(same_bits(got.m, want.m));
        EXPECT_TRUE(same_bits(got.v, want.v));
        // The run trained: the weights left their initial values.
        EXPECT_FALSE(same_bits(want.params, schedule_test::read_params(make_llama(1))));
    }
}

TEST(TrainStepSchedule, OverlappedUpdateWaitsForTheForwardAndZeroesTheGradients) {
    Model model = make_llama(1);
    Result<AdamWOptimizer> opt = AdamWOptimizer::create_for(model);
    ASSERT_TRUE(opt.ok()) << opt.status().to_string();
    ASSERT_TRUE(opt->overlap_with(model).ok());
    EXPECT_EQ(opt->schedule(), OptimizerSchedule::kOverlapped);
    // Twice: refused.
    EXPECT_EQ(opt->overlap_with(model).code(), StatusCode::kFailedPrecondition);
    TrainStep step(model, *opt);
    RunPlan plan;
    const HostTensor tok = schedule_test::tokens(plan, 1), tgt = schedule_test::tokens(plan, 2);
    const ModelBatch batch{tok.view(), tgt.view(), {}, {}};
    auto next = [&](int64_t) -> Result<ModelBatch> { return batch; };
    ASSERT_TRUE(step.gradients(1, next).ok());
    const int64_t n = model.params_flat().numel();
    const std::vector<float> before(model.params_flat().as<float>(),
                                    model.params_flat().as<float>() + n);
    ASSERT_TRUE(step.apply(1e-2, 0.1, AdamWHyper{}, 1, 0.0f).ok());
    auto weights = [&] {
        return std::vector<float>(model.params_flat().as<float>(),
                                  model.params_flat().as<float>() + n);
    };
    // Posted, not run: no forward has needed the weights yet.
    EXPECT_TRUE(same_bits(weights(), before));
    auto any_nonzero_grad = [&] {
        const float* g = model.grads_flat().as<float>();
        for (int64_t i = 0; i < n; ++i)
            if (g[i] != 0.0f) return true;
        return false;
    };
    EXPECT_TRUE(any_nonzero_grad());
    opt->finish();
    EXPECT_FALSE(same_bits(weights(), before));
    EXPECT_FALSE(any_nonzero_grad());  // zeroed unit by unit after the update read them
}

TEST(TrainStepSchedule, OverlappedRefusesAModelWhoseHookIsTaken) {
    Model model = make_llama(1);
    model.set_weights_needed_hook([](int) {});
    Result<AdamWOptimizer> opt = AdamWOptimizer::create_for(model);
    ASSERT_TRUE(opt.ok()) << opt.status().to_string();
    const Status st = opt->overlap_with(model);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("optimizer.schedule: serial"), std::string::npos) << st.message();
    EXPECT_EQ(opt->schedule(), OptimizerSchedule::kSerial);
    // A shard of the vector (data parallel's ranges): refused.
    Model other = make_llama(1);
    Result<AdamWOptimizer> shard =
        AdamWOptimizer::create_for(other, FlatRange{0, other.params_total() / 2}, other.context());
    ASSERT_TRUE(shard.ok());
    EXPECT_EQ(shard->overlap_with(other).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace lathe
