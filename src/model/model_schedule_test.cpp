// The backward schedule's gradients-ready hook, the forward's weights-needed hook, the padding of
// a plan sharded over ranks, and models created without gradients (evaluation and inference), on
// the CPU reference.

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

// The weights-needed hook fires before each piece of weights is read, in the forward's order:
// a model whose weights are all zero and that receives each piece from the hook, just in time,
// computes the loss, gradients and logits of the model it copies them from, bit for bit.
TEST(ModelSchedule, WeightsNeededHookFiresBeforeEachPieceIsRead) {
    for (const std::string_view json : {kLlamaJson, kGpt2Json}) {
        const ModelConfig c = parse(json);
        const int L = int(c.num_layers);
        Model a = make(c, 2, 8, true), b = make(c, 2, 8, true);
        const std::vector<ParamEntry>& entries = a.params().entries();
        // Which piece each entry belongs to: its layer, or the inputs before the first layer and
        // the outputs after the last.
        auto piece_of = [&](size_t e) {
            if (entries[e].layer >= 0) return entries[e].layer;
            for (size_t f = 0; f < e; ++f)
                if (entries[f].layer >= 0) return int(Model::kOutputWeights);
            return int(Model::kInputWeights);
        };
        std::vector<int> calls;
        auto fill_piece = [&](int piece) {
            calls.push_back(piece);
            for (size_t e = 0; e < entries.size(); ++e) {
                if (piece_of(e) != piece) continue;
                const size_t i = entries[e].arena_index;
                b.write_param_entry(i, a.param_entry(i));
            }
        };
        auto zero_all = [&] {
            for (const ParamEntry& e : entries) {
                std::vector<float> zeros(size_t(e.shape.numel()), 0.0f);
                b.write_param_entry(e.arena_index,
                                    ConstTensorView(zeros.data(), DType::kF32, e.shape));
            }
        };
        b.set_weights_needed_hook(fill_piece);
        std::vector<int> want = {Model::kInputWeights};
        for (int l = 0; l < L; ++l) want.push_back(l);
        want.push_back(Model::kOutputWeights);

        const HostTensor t = ids(2, 8, c.vocab_size, 5), y = ids(2, 8, c.vocab_size, 6);
        const ModelBatch batch{t.view(), y.view(), {}, {}};
        a.zero_grads();
        b.zero_grads();
        zero_all();
        const float la = a.forward_backward(batch), lb = b.forward_backward(batch);
        EXPECT_EQ(calls, want);
        EXPECT_EQ(std::memcmp(&la, &lb, sizeof(float)), 0) << la << " vs " << lb;
        const ConstTensorView ga = a.grads_flat(), gb = b.grads_flat();
        EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.bytes()), 0);

        calls.clear();
        zero_all();
        std::vector<float> xa(size_t(2 * 8 * c.vocab_size)), xb(xa.size());
        const Shape lshape{2, 8, c.vocab_size};
        a.logits(TensorView(xa.data(), DType::kF32, lshape), batch);
        b.logits(TensorView(xb.data(), DType::kF32, lshape), batch);
        EXPECT_EQ(calls, want);
        EXPECT_EQ(std::memcmp(xa.data(), xb.data(), xa.size() * sizeof(float)), 0);

        b.set_weights_needed_hook({});
        calls.clear();
        b.forward(batch);
        EXPECT_TRUE(calls.empty());
    }
}

// A plan sharded over W ranks pads the parameter arena (and so the gradients) to a multiple of
// kShardAlignElements * W with one zero entry at its end, and counts one shard of the moments;
// the parameters themselves keep their offsets.
TEST(ModelSchedule, ShardedPlanPadsTheParameterArena) {
    const ModelConfig c = parse(kGpt2Json);
    const ParamTable table = model_param_table(c);
    const size_t unpadded = table.layout().total_bytes();
    for (const int W : {1, 2, 3, 4, 7}) {
        ModelShape shape;
        shape.batch = 2;
        shape.seq_len = 8;
        shape.optimizer_shards = W;
        const Result<MemoryPlan> plan = memory_plan_make(c, table, shape);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const int64_t n = int64_t(plan->params.total_bytes() / sizeof(float));
        EXPECT_EQ(n % (kShardAlignElements * W), 0) << "W " << W;
        EXPECT_GE(plan->params.total_bytes(), unpadded);
        EXPECT_LT(plan->params.total_bytes(), unpadded + size_t(kShardAlignElements * W) * 4);
        EXPECT_EQ(plan->optimizer_bytes(), 2 * plan->params.total_bytes() / size_t(W));
        for (const ParamEntry& e : table.entries())
            EXPECT_EQ(plan->params.entries()[e.arena_index].offset,
                      table.layout().entries()[e.arena_index].offset);
        if (W > 1 && plan->params.total_bytes() > unpadded)
            EXPECT_EQ(plan->params.entries().back().name, kShardPaddingEntry);
    }
    ModelShape bad;
    bad.batch = 2;
    bad.seq_len = 8;
    bad.optimizer_shards = 0;
    EXPECT_FALSE(memory_plan_make(c, table, bad).ok());
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
