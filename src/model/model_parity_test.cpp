// Whole-model parity with Hugging Face transformers / PyTorch (fp32, CPU): for each family, a
// small random-weight model built by tests/reference/make_model_fixtures.py from a real
// configuration scaled down. lathe loads the same config.json and weights and must reproduce the
// logits, the loss, every parameter gradient (in the HF layout) and the losses of ten
// torch.optim.AdamW steps, each with relative error below 1e-4, where the relative error of a
// tensor is max|lathe - torch| / max|torch| (so that elements near zero are judged against the
// tensor's scale, as an fp32 reduction's rounding is).
//
// The fixtures are committed (tests/fixtures/models); regenerating them needs torch (see the
// script's docstring), running this test does not.

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/model.h"
#include "model/model_fixture_test_util.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "ops/adamw.h"

namespace lathe {
namespace {

constexpr double kTolerance = 1e-4;

using model_fixture::Fixture;
using model_fixture::rel_error;

double rel_error(double a, double b) {
    return std::abs(a - b) / std::abs(b);
}

Fixture load_fixture(const std::string& name) {
    return model_fixture::load(name);
}

Model make_model(const Fixture& f, int64_t lm_head_chunk_rows = 0) {
    Result<Model> model =
        Model::create(f.config, ModelShape{f.B, f.T, lm_head_chunk_rows}, cpu_context());
    LATHE_CHECK(model.ok(), "{}", model.status().to_string());
    const Status loaded = model_load_hf(*model, f.weights);
    LATHE_CHECK(loaded.ok(), "{}", loaded.to_string());
    return std::move(*model);
}

class ModelParity : public testing::TestWithParam<std::string> {};

// The parameter table is exactly the checkpoint's tensor list: same names, same stored shapes.
TEST_P(ModelParity, ParameterTableMatchesHuggingFaceNamesAndShapes) {
    const Fixture f = load_fixture(GetParam());
    const ParamTable table = model_param_table(f.config);
    std::vector<std::string> names;
    for (const HfParam& p : table.hf_params()) {
        names.push_back(p.name);
        Result<const SafetensorsTensor*> t = f.weights.tensor(p.name);
        ASSERT_TRUE(t.ok()) << t.status().to_string();
        std::vector<int64_t> shape;
        for (int i = 0; i < p.shape.rank(); ++i) shape.push_back(p.shape[i]);
        EXPECT_EQ((*t)->shape, shape) << p.name;
    }
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, f.weights.names());
    EXPECT_EQ(table.num_elements(), model_config_num_parameters(f.config));
}

TEST_P(ModelParity, LogitsLossAndEveryGradientMatchTransformers) {
    const Fixture f = load_fixture(GetParam());
    Model model = make_model(f);
    const ModelBatch batch = f.batch();

    HostTensor logits(DType::kF32, Shape{f.B, f.T, f.config.vocab_size});
    model.logits(logits.view(), batch);
    const double logits_err = rel_error(logits.view(), f.ref("logits"));
    EXPECT_LT(logits_err, kTolerance);

    model.zero_grads();
    const float loss = model.forward_backward(batch);
    const double loss_err = rel_error(loss, f.meta.at("loss").get<double>());
    EXPECT_LT(loss_err, kTolerance) << "lathe " << loss << " torch " << f.meta.at("loss");

    double worst = 0.0;
    std::string worst_name;
    for (const HfParam& p : model.params().hf_params()) {
        HostTensor grad(DType::kF32, p.shape);
        model_read_grad_hf(model, p.name, grad.view());
        const double err = rel_error(grad.view(), f.ref("grad." + p.name));
        EXPECT_LT(err, kTolerance) << p.name;
        if (err >= worst) {
            worst = err;
            worst_name = p.name;
        }
    }
    std::printf("[parity] %-20s logits %.2e  loss %.2e  worst gradient %.2e (%s)\n",
                GetParam().c_str(), logits_err, loss_err, worst, worst_name.c_str());
}

// forward() then backward() is the same computation as forward_backward() (the LM head run twice
// instead of once), and a chunked LM head (3 rows at a time) changes nothing either.
TEST_P(ModelParity, SeparateBackwardAndChunkedHeadAgreeWithFusedStep) {
    const Fixture f = load_fixture(GetParam());
    Model fused = make_model(f);
    Model split = make_model(f, /*lm_head_chunk_rows=*/3);
    EXPECT_EQ(split.plan().shape.lm_head_chunk_rows, 3);
    fused.zero_grads();
    split.zero_grads();
    const float a = fused.forward_backward(f.batch());
    const float b = split.forward(f.batch());
    split.backward();
    EXPECT_NEAR(a, b, 1e-6 * std::abs(a));
    for (const HfParam& p : fused.params().hf_params()) {
        HostTensor ga(DType::kF32, p.shape), gb(DType::kF32, p.shape);
        model_read_grad_hf(fused, p.name, ga.view());
        model_read_grad_hf(split, p.name, gb.view());
        EXPECT_LT(rel_error(gb.view(), ga.view()), 1e-5) << p.name;
    }
}

TEST_P(ModelParity, TenAdamWStepsReproduceTorchLosses) {
    const Fixture f = load_fixture(GetParam());
    Model model = make_model(f);
    const nlohmann::json& h = f.meta.at("adamw");
    const std::vector<double> expected = f.meta.at("adamw_losses").get<std::vector<double>>();
    Result<HostArena> m = HostArena::allocate(model.plan().params);
    Result<HostArena> v = HostArena::allocate(model.plan().params);
    ASSERT_TRUE(m.ok() && v.ok());
    auto flat = [](HostArena& a) {
        return TensorView(a.bytes().data(), DType::kF32,
                          Shape{int64_t(a.layout().total_bytes() / sizeof(float))});
    };
    const std::vector<AdamWSegment> segments =
        model.adamw_segments(h.at("lr").get<double>(), h.at("weight_decay").get<double>());
    const AdamWHyper hyper{h.at("beta1").get<double>(), h.at("beta2").get<double>(),
                           h.at("eps").get<double>()};
    const ModelBatch batch = f.batch();
    double worst = 0.0;
    for (size_t step = 1; step <= expected.size(); ++step) {
        model.zero_grads();
        const float loss = model.forward_backward(batch);
        const double err = rel_error(loss, expected[step - 1]);
        EXPECT_LT(err, kTolerance)
            << "step " << step << ": lathe " << loss << " torch " << expected[step - 1];
        worst = std::max(worst, err);
        adamw_update(model.params_flat(), flat(*m), flat(*v), model.grads_flat(), segments, hyper,
                     int64_t(step), cpu_context());
    }
    const float final_loss = model.forward(batch);
    const double final_err = rel_error(final_loss, f.meta.at("final_loss").get<double>());
    EXPECT_LT(final_err, kTolerance);
    std::printf(
        "[parity] %-20s AdamW: worst step loss %.2e, after 10 updates %.2e "
        "(loss %.6f -> %.6f)\n",
        GetParam().c_str(), worst, final_err, expected.front(), double(final_loss));
}

INSTANTIATE_TEST_SUITE_P(Families, ModelParity,
                         testing::Values("llama", "llama_bias_packed", "mistral", "qwen2",
                                         "gpt_neox", "gpt_neox_sequential", "gpt2"),
                         [](const testing::TestParamInfo<std::string>& info) {
                             return info.param;
                         });

}  // namespace
}  // namespace lathe
