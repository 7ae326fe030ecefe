// Whole-model parity with Hugging Face transformers on the GPU (issue 5's GPU case, CTest label
// gpu): the fixtures of model_parity_test.cpp (small random-weight models of each family from real
// configurations, with transformers' fp32 logits, loss, gradients and ten AdamW losses), loaded
// into a CUDA model. The GPU computes from the bf16 copy of the weights with bf16 activations and
// fp32 accumulation, so the bar is bf16's: relative errors (max |lathe - torch| / max |torch| for
// tensors) of a few units of bf16's 2^-8 grown by the depth of the network, not fp32's 1e-4.
//
// The fixtures: model/model_fixture_test_util.h ($LATHE_SOURCE_DIR on the GPU machine).
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/model_fixture_test_util.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {
namespace {

// Logits: one bf16 rounding of the output (u = 2^-8 relative) on top of bf16 activations through
// two layers; the loss, an fp32 reduction of those logits; gradients pass about ten bf16 roundings
// per layer; the AdamW losses compound ten steps of them. The fixtures' AdamW runs drive the loss
// from ~5.8 to ~0.1, where bf16's error is absolute rather than relative (first H100 run: mistral
// step 10, 0.1153 in torch, off by 1.25e-2 relative = 1.4e-3 absolute), so step losses are judged
// relative to max(loss, 0.5).
constexpr double kLogitsTol = 3e-2, kLossTol = 5e-3, kGradTol = 6e-2, kStepLossTol = 1e-2;

using model_fixture::Fixture;
using model_fixture::rel_error;

Fixture load_fixture(const std::string& name) {
    return model_fixture::load(name);
}

class ModelParityGpu : public testing::TestWithParam<std::string> {
protected:
    static void SetUpTestSuite() { state_ = new CudaState(0); }
    static void TearDownTestSuite() {
        delete state_;
        state_ = nullptr;
    }
    Model make_model(const Fixture& f) {
        Result<Model> model = Model::create(f.config, ModelShape{f.B, f.T, 0}, state_->context());
        LATHE_CHECK(model.ok(), "{}", model.status().to_string());
        const Status loaded = model->load_hf(f.weights);
        LATHE_CHECK(loaded.ok(), "{}", loaded.to_string());
        return std::move(*model);
    }
    static CudaState* state_;
};
CudaState* ModelParityGpu::state_ = nullptr;

TEST_P(ModelParityGpu, LogitsLossAndGradientsMatchTransformersWithinBf16) {
    const Fixture f = load_fixture(GetParam());
    Model model = make_model(f);
    const ModelBatch batch = f.batch();
    HostTensor logits(DType::kF32, Shape{f.B, f.T, f.config.vocab_size});
    model.logits(logits.view(), batch);
    const double logits_err = rel_error(logits.view(), f.ref("logits"));
    EXPECT_LT(logits_err, kLogitsTol);

    model.zero_grads();
    const float loss = model.forward_backward(batch);
    const double want = f.meta.at("loss").get<double>();
    const double loss_err = std::abs(loss - want) / want;
    EXPECT_LT(loss_err, kLossTol) << "lathe " << loss << " torch " << want;
    double worst = 0.0;
    std::string worst_name;
    for (const HfParam& p : model.params().hf_params()) {
        HostTensor grad(DType::kF32, p.shape);
        model.read_grad_hf(p.name, grad.view());
        const double err = rel_error(grad.view(), f.ref("grad." + p.name));
        EXPECT_LT(err, kGradTol) << p.name;
        if (err >= worst) {
            worst = err;
            worst_name = p.name;
        }
    }
    std::printf("[gpu parity] %-20s logits %.2e  loss %.2e (%.6f vs torch %.6f)  worst gradient "
                "%.2e (%s)\n",
                GetParam().c_str(), logits_err, loss_err, loss, want, worst, worst_name.c_str());
}

TEST_P(ModelParityGpu, TenAdamWStepsTrackTorchLosses) {
    const Fixture f = load_fixture(GetParam());
    Model model = make_model(f);
    ASSERT_TRUE(model.enable_optimizer().ok());
    const nlohmann::json& h = f.meta.at("adamw");
    const std::vector<double> expected = f.meta.at("adamw_losses").get<std::vector<double>>();
    const std::vector<AdamWSegment> segments =
        model.adamw_segments(h.at("lr").get<double>(), h.at("weight_decay").get<double>());
    const AdamWHyper hyper{h.at("beta1").get<double>(), h.at("beta2").get<double>(),
                           h.at("eps").get<double>()};
    const ModelBatch batch = f.batch();
    double worst = 0.0;
    for (size_t step = 1; step <= expected.size(); ++step) {
        model.zero_grads();
        const float loss = model.forward_backward(batch);
        const double err = std::abs(loss - expected[step - 1]) / std::max(expected[step - 1], 0.5);
        EXPECT_LT(err, kStepLossTol)
            << "step " << step << ": lathe " << loss << " torch " << expected[step - 1];
        worst = std::max(worst, err);
        model.optimizer_step(segments, hyper, int64_t(step));
    }
    const float final_loss = model.forward(batch);
    const double want = f.meta.at("final_loss").get<double>();
    EXPECT_LT(std::abs(final_loss - want) / std::max(want, 0.5), kStepLossTol);
    std::printf("[gpu parity] %-20s AdamW: worst step loss %.2e, final %.6f vs torch %.6f\n",
                GetParam().c_str(), worst, double(final_loss), want);
}

INSTANTIATE_TEST_SUITE_P(Families, ModelParityGpu,
                         testing::Values("llama", "llama_bias_packed", "mistral", "qwen2",
                                         "gpt_neox", "gpt_neox_sequential", "gpt2"),
                         [](const testing::TestParamInfo<std::string>& info) {
                             return info.param;
                         });

}  // namespace
}  // namespace lathe
