// The backward schedule's gradients-ready hook and models created without gradients (evaluation
// and inference), on the CPU reference.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "model/registry.h"
#include "model/tiny_model_test_util.h"

namespace lathe {
namespace {

// tiny_model::kLlamaJson: two layers (the hook's order shows), untied head (one more entry
// outside the layers).
using tiny_model::ids;
using tiny_model::kLlamaJson;
using tiny_model::parse;

// Three layers, learned positions (their embedding is one of the entries outside the layers).
constexpr std::string_view kGpt2Json = R"({
  "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
  "vocab_size": 50, "n_embd": 16, "n_layer": 3, "n_head": 2, "n_positions": 12
})";

Model make(const ModelConfig& config, int64_t B, int64_t T, bool training,
           Recompute recompute = Recompute::kNone) {
    ModelShape shape;
    shape.batch = B;
    shape.seq_len = T;
    shape.training = training;
    shape.recompute = recompute;
    Result<Model> m = Model::create(config, shape, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    m->init(11);
    return std::move(*m);
}

// The gradient bytes of every entry of `layer` (-1: the entries outside the blocks).
std::vector<std::vector<float>> layer_grads(const Model& m, int layer) {
    std::vector<std::vector<float>> out;
    const std::vector<ParamEntry>& entries = m.params().entries();
    for (size_t e = 0; e < entries.size(); ++e) {
        if (entries[e].layer != layer) continue;
        const ConstTensorView g = m.grad_entry(entries[e].arena_index);
        out.emplace_back(g.as<float>(), g.as<float>() + g.numel());
    }
    return out;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].size() != b[i].size() ||
            std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
            return false;
    return true;
}

// The hook fires for layers L-1 .. 0 and then once for the parameters outside the layers, per
// micro-batch; at each call that layer's gradients already hold their values at the end of the
// micro-batch's backward (accumulated over the micro-batches so far), bit for bit.
void expect_hook_order_and_final_grads(const ModelConfig& c, Recompute recompute) {
    Model m = make(c, 2, 8, true, recompute);
    const int L = int(c.num_layers);
    std::vector<int> calls;
    std::vector<std::vector<std::vector<float>>> seen;  // per call
    m.set_grads_ready_hook([&](int layer) {
        calls.push_back(layer);
        seen.push_back(layer_grads(m, layer));
    });
    std::vector<int> want_order;
    for (int l = L - 1; l >= 0; --l) want_order.push_back(l);
    want_order.push_back(Model::kOutsideLayers);

    m.zero_grads();
    for (int micro = 0; micro < 2; ++micro) {
        const HostTensor t = ids(2, 8, c.vocab_size, 1 + 2 * micro);
        const HostTensor y = ids(2, 8, c.vocab_size, 2 + 2 * micro);
        calls.clear();
        seen.clear();
        m.forward_backward(ModelBatch{t.view(), y.view(), {}, {}}, 0.5f);
        EXPECT_EQ(calls, want_order) << "micro-batch " << micro;
        for (size_t i = 0; i < calls.size(); ++i) {
            const std::vector<std::vector<float>> now = layer_grads(m, calls[i]);
            EXPECT_FALSE(now.empty()) << "layer " << calls[i];
            EXPECT_TRUE(same_bits(seen[i], now))
                << "layer " << calls[i] << "'s gradients changed after its hook, micro-batch "
                << micro;
        }
    }
    // Unset: no calls.
    m.set_grads_ready_hook({});
    calls.clear();
    const HostTensor t = ids(2, 8, c.vocab_size, 9), y = ids(2, 8, c.vocab_size, 10);
    m.forward_backward(ModelBatch{t.view(), y.view(), {}, {}});
    EXPECT_TRUE(calls.empty());
}

TEST(ModelSchedule, GradsReadyHookFiresPerLayerInBackwardOrderWithFinalGradients) {
    expect_hook_order_and_final_grads(parse(kLlamaJson), Recompute::kNone);
    expect_hook_order_and_final_grads(parse(kGpt2Json), Recompute::kNone);
}

TEST(ModelSchedule, GradsReadyHookUnderRecompute) {
    expect_hook_order_and_final_grads(parse(kLlamaJson), Recompute::kFull);
    expect_hook_order_and_final_grads(parse(kGpt2Json), Recompute::kSelective);
}

// A hook changes nothing the backward computes.
TEST(ModelSchedule, GradsReadyHookLeavesTheGradientsAsTheyAre) {
    const ModelConfig c = parse(kLlamaJson);
    Model a = make(c, 2, 8, true), b = make(c, 2, 8, true);
    int calls = 0;
    b.set_grads_ready_hook([&](int) { ++calls; });
    const HostTensor t = ids(2, 8, 64, 3), y = ids(2, 8, 64, 4);
    const ModelBatch batch{t.view(), y.view(), {}, {}};
    a.zero_grads();
    b.zero_grads();
    EXPECT_EQ(a.forward_backward(batch), b.forward_backward(batch));
    EXPECT_EQ(calls, int(c.num_layers) + 1);
    const ConstTensorView ga = a.grads_flat(), gb = b.grads_flat();
    ASSERT_EQ(ga.numel(), gb.numel());
    EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.bytes()), 0);
}

// A model created for evaluation has no gradient arena (the plan counts none, nor optimizer
// state) and computes the same loss and logits as a training model of the same weights.
TEST(ModelSchedule, EvaluationModelHasNoGradients) {
    const ModelConfig c = parse(kGpt2Json);
    Model train = make(c, 2, 8, true), eval = make(c, 2, 8, false);
    EXPECT_TRUE(train.training());
    EXPECT_FALSE(eval.training());
    EXPECT_EQ(eval.grads_flat().numel(), 0);
    EXPECT_EQ(eval.plan().gradient_bytes(), 0u);
    EXPECT_EQ(eval.plan().optimizer_bytes(), 0u);
    EXPECT_EQ(train.plan().gradient_bytes(), train.plan().params.total_bytes());
    EXPECT_EQ(train.plan().optimizer_bytes(), 2 * train.plan().params.total_bytes());
    EXPECT_EQ(train.plan().total_bytes() - eval.plan().total_bytes(),
              3 * train.plan().params.total_bytes());
    EXPECT_NE(eval.plan().table("eval").find(fmt::format("{:<30} {:>16} B", "gradients", 0)),
              std::string::npos)
        << eval.plan().table("eval");

    const HostTensor t = ids(2, 8, c.vocab_size, 5), y = ids(2, 8, c.vocab_size, 6);
    const ModelBatch batch{t.view(), y.view(), {}, {}};
    EXPECT_EQ(eval.forward(batch), train.forward(batch));
    HostTensor la(DType::kF32, Shape{2, 8, c.vocab_size}),
        lb(DType::kF32, Shape{2, 8, c.vocab_size});
    eval.logits(la.view(), batch);
    train.logits(lb.view(), batch);
    EXPECT_EQ(std::memcmp(la.view().data(), lb.view().data(), la.view().bytes()), 0);
}

TEST(ModelScheduleDeathTest, EvaluationModelRefusesBackward) {
    const ModelConfig c = parse(kGpt2Json);
    Model eval = make(c, 2, 8, false);
    const HostTensor t = ids(2, 8, c.vocab_size, 5), y = ids(2, 8, c.vocab_size, 6);
    EXPECT_DEATH(eval.forward_backward(ModelBatch{t.view(), y.view(), {}, {}}),
                 "created without gradients");
}

}  // namespace
}  // namespace lathe
