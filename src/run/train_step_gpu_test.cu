// TrainStep with the device optimizer's two schedules on CUDA (CTest label gpu;
// optim/adamw_optimizer.h, "Schedules"): the overlapped schedule (AdamW unit by unit on the
// optimizer stream, the next forward waiting per unit on events, the gradients zeroed there after
// the update) gives the serial schedule's bits: losses, norms, a validation loss, the f32
// masters, the bf16 compute copy and both moments, over steps of two micro-batches with
// clipping, weight decay, a frozen entry, a step computed but not applied, a validation forward
// between steps and a checkpoint resumed in a fresh model and optimizer; in bf16 and with the
// block's linears in fp8 (tensorwise: the weight casts once per step read the compute copy after
// the hook's wait). Before each overlapped update a kernel holds the optimizer stream for about
// 20 ms, so that any read of the weights that does not wait for its unit reads the old ones.
// Exact equality, no tolerance: the same deterministic kernel runs over the same elements with
// the same scalars, only on another stream and in unit-sized launches. With optimizer.overlap_sms
// the GEMMs' SM target is held from each update to the next forward's LM head, and a run repeats
// its own bits; out-of-range values are refused. The serial schedule clears the gradients on the
// optimizer stream beside the next forward (Model::zero_grads_beside_forward): held there as
// long before each update, the step's LM head waits for the clearing and the bits stay the
// overlapped schedule's.
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <string>

#include "model/fp8_state.h"
#include "model/registry.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/fp8_linear.h"
#include "run/train_step_schedule_test_util.h"

namespace lathe {
namespace {

using schedule_test::RunPlan;
using schedule_test::RunResult;

constexpr const char* kLlamaJson = R"({"architectures": ["LlamaForCausalLM"],
  "model_type": "llama", "vocab_size": 384, "hidden_size": 128, "intermediate_size": 256,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
  "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "tie_word_embeddings": false})";

// Spins one thread for about `ns` nanoseconds: enqueued on the optimizer stream before each
// update, it holds the overlapped units back well past the next forward's start, so that a read
// of a unit's weights without its wait reads the old weights and the bits differ.
__global__ void spin_kernel(int64_t ns) {
    for (int64_t waited = 0; waited < ns; waited += 1000) __nanosleep(1000);
}

// Every value two runs leave, bit for bit.
void expect_same_bits(const RunResult& got, const RunResult& want) {
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(got.norms, want.norms);
    EXPECT_EQ(got.evals, want.evals);
    EXPECT_EQ(got.params, want.params);
    EXPECT_EQ(got.compute, want.compute);
    EXPECT_EQ(got.m, want.m);
    EXPECT_EQ(got.v, want.v);
}

class TrainStepScheduleGpu : public ::testing::TestWithParam<bool> {
protected:
    static void SetUpTestSuite() { state_ = new CudaState(0); }
    static void TearDownTestSuite() {
        delete state_;
        state_ = nullptr;
    }
    void SetUp() override {
        if (!GetParam()) return;
        const std::string problem = cuda::fp8_support_problem(0);
        if (!problem.empty()) GTEST_SKIP() << problem;
    }

    static RunPlan plan() {
        RunPlan p;
        p.B = 2;
        p.T = 64;  // B T a multiple of 16 (fp8 GEMMs)
        p.V = 384;
        p.max_norm = 0.05f;
        return p;
    }
    // A model of kLlamaJson at plan()'s shape, bf16 or with the block's linears in fp8
    // (tensorwise), initialized from `seed`.
    static Model make(bool fp8, uint64_t seed) {
        Result<ModelConfig> c = model_config_from_hf_json(kLlamaJson, "test/config.json");
        LATHE_CHECK(c.ok(), "{}", c.status().to_string());
        ModelShape shape;
        shape.batch = plan().B;
        shape.seq_len = plan().T;
        if (fp8) {
            Result<Fp8Settings> s =
                fp8_settings_parse("tensorwise", "auto", false, 16, "max", "test");
            LATHE_CHECK(s.ok(), "{}", s.status().to_string());
            shape.precision = fp8_precision_policy(*s);
            shape.fp8 = *s;
        }
        Result<Model> m = Model::create(*c, shape, state_->context());
        LATHE_CHECK(m.ok(), "{}", m.status().to_string());
        m->init(seed);
        return std::move(*m);
    }

    // Holds the optimizer stream for about 20 ms (spin_kernel), before an update.
    static void delay_optimizer_stream() {
        spin_kernel<<<1, 1, 0, state_->optimizer_stream()>>>(int64_t(20) * 1000 * 1000);
        LATHE_CUDA_CHECK_LAUNCH();
    }

    static CudaState* state_;
};
CudaState* TrainStepScheduleGpu::state_ = nullptr;

TEST_P(TrainStepScheduleGpu, OverlappedGivesTheSerialBits) {
    const bool fp8 = GetParam();
    auto make_model = [fp8](uint64_t seed) { return make(fp8, seed); };
    const RunResult want = schedule_test::run(plan(), OptimizerSchedule::kSerial, make_model);
    const RunResult got = schedule_test::run(plan(), OptimizerSchedule::kOverlapped, make_model,
                                             delay_optimizer_stream);
    ASSERT_EQ(want.losses.size(), size_t(plan().steps));
    for (const float n : want.norms) EXPECT_GT(n, plan().max_norm);  // the clip is exercised
    ASSERT_EQ(want.evals.size(), 1u);
    expect_same_bits(got, want);
    // The run trained: the weights left their initial values.
    EXPECT_NE(want.params, schedule_test::read_params(make(fp8, 1)));
}

// Serial: the clearing of the next step's gradients is enqueued on the optimizer stream behind
// the ~20 ms hold; a backward that did not wait for it would accumulate into the old gradients
// (and have its own wiped), and the norms and weights would differ.
TEST_P(TrainStepScheduleGpu, SerialClearsTheGradientsBesideTheForward) {
    const bool fp8 = GetParam();
    auto make_model = [fp8](uint64_t seed) { return make(fp8, seed); };
    const RunResult want = schedule_test::run(plan(), OptimizerSchedule::kOverlapped, make_model);
    const RunResult got =
        schedule_test::run(plan(), OptimizerSchedule::kSerial, make_model, delay_optimizer_stream);
    expect_same_bits(got, want);
    EXPECT_NE(want.params, schedule_test::read_params(make(fp8, 1)));
}

// optimizer.overlap_sms: from each update's start the compute stream's GEMMs plan for the SMs
// the update leaves (CudaState::gemm_sm_target), until the next forward reaches the LM head's
// weights (every unit updated by then) or finish(); and a run repeats its bits (the GEMMs'
// algorithms under the target may differ from the serial run's, so the serial bits are not
// asked for).
TEST_P(TrainStepScheduleGpu, OverlapSmsHoldTheGemmsUntilTheHeadAndRepeatTheirBits) {
    const bool fp8 = GetParam();
    auto make_model = [fp8](uint64_t seed) { return make(fp8, seed); };
    schedule_test::RunPlan p = plan();
    p.optimizer_sms = 8;
    const int held_target = state_->sm_count() - p.optimizer_sms;
    ASSERT_GT(held_target, 0);
    ASSERT_EQ(state_->gemm_sm_target(), 0);
    int held = 0, released = 0;
    const RunResult a = schedule_test::run(
        p, OptimizerSchedule::kOverlapped, make_model,
        [&] {
            // Before each update: the step's forward reached the head (or nothing held yet).
            if (state_->gemm_sm_target() == 0) ++released;
            delay_optimizer_stream();
        },
        [&] {
            if (state_->gemm_sm_target() == held_target) ++held;
        });
    const int applied = p.steps - 1;  // one step is computed but not applied (skip_at)
    EXPECT_EQ(held, applied);
    EXPECT_EQ(released, applied);
    EXPECT_EQ(state_->gemm_sm_target(), 0);  // the run's finish() released the last
    const RunResult b = schedule_test::run(p, OptimizerSchedule::kOverlapped, make_model);
    EXPECT_EQ(state_->gemm_sm_target(), 0);
    expect_same_bits(a, b);
    EXPECT_NE(a.params, schedule_test::read_params(make(fp8, 1)));
}

// optimizer.overlap_sms that leaves no SM to the GEMMs, or more than kMaxOptimizerSms, is
// refused and keeps the serial schedule.
TEST_P(TrainStepScheduleGpu, OverlapSmsOutOfRangeAreRefused) {
    for (const int sms : {state_->sm_count(), AdamWOptimizer::kMaxOptimizerSms + 1, -1}) {
        Model model = make(GetParam(), 1);
        Result<AdamWOptimizer> opt = AdamWOptimizer::create_for(model);
        ASSERT_TRUE(opt.ok()) << opt.status().to_string();
        const Status st = opt->overlap_with(model, sms);
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << sms << ": " << st.to_string();
        EXPECT_NE(st.message().find("optimizer.overlap_sms"), std::string::npos) << st.to_string();
        EXPECT_EQ(opt->schedule(), OptimizerSchedule::kSerial);
    }
}

INSTANTIATE_TEST_SUITE_P(Precisions, TrainStepScheduleGpu, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                             return std::string(p.param ? "Fp8Tensorwise" : "Bf16");
                         });

}  // namespace
}  // namespace lathe
