// The backward schedule's gradients-ready hook, the forward's weights-needed hook, the padding of
// a plan sharded over ranks, and models created without gradients (evaluation and inference), on
// the CPU reference.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// A plan sharded over W ranks pads every unit (front, each layer, back) to a multiple of
// kShardAlignElements * W, keeps each entry's offset from its unit's start, and counts 1/W of the
// moments; W = 1 is the table's layout exactly.
TEST(ModelSchedule, ShardedPlanPadsEveryUnit) {
    for (const std::string_view json : {kGpt2Json, kLlamaJson}) {
        const ModelConfig c = parse(json);
        const ParamTable table = model_param_table(c);
        const int64_t used = int64_t(table.layout().total_bytes() / sizeof(float));
        for (const int W : {1, 2, 3, 4, 7}) {
            ModelShape shape;
            shape.batch = 2;
            shape.seq_len = 8;
            shape.unit_shards = W;
            shape.optimizer_shards = W;
            const Result<MemoryPlan> plan = memory_plan_make(c, table, shape);
            ASSERT_TRUE(plan.ok()) << plan.status().to_string();
            const ShardLayout& sl = plan->shards;
            // Every rank keeping the whole state (ZeRO-0) counts all of the moments.
            ModelShape whole = shape;
            whole.optimizer_shards = 1;
            const Result<MemoryPlan> z0 = memory_plan_make(c, table, whole);
            ASSERT_TRUE(z0.ok());
            EXPECT_EQ(z0->params.total_bytes(), plan->params.total_bytes());
            EXPECT_EQ(z0->optimizer_bytes(), 2 * plan->params.total_bytes());
            ASSERT_EQ(sl.units(), size_t(c.num_layers) + 2);
            EXPECT_EQ(sl.used, used);
            EXPECT_EQ(int64_t(plan->params.total_bytes() / sizeof(float)), sl.total);
            EXPECT_EQ(plan->optimizer_bytes(), 2 * plan->params.total_bytes() / size_t(W));
            int64_t a = 0, cpos = 0;
            for (size_t u = 0; u < sl.units(); ++u) {
                EXPECT_EQ(sl.arena[u].begin, a) << "W " << W << " unit " << u;
                EXPECT_EQ(sl.canonical[u].begin, cpos);
                EXPECT_EQ(sl.arena[u].size() % (kShardAlignElements * W), 0);
                EXPECT_GE(sl.arena[u].size(), sl.canonical[u].size());
                EXPECT_LT(sl.arena[u].size(), sl.canonical[u].size() + kShardAlignElements * W);
                if (W == 1) {
                    EXPECT_EQ(sl.arena[u].size(), sl.canonical[u].size());
                }
                a = sl.arena[u].end;
                cpos = sl.canonical[u].end;
                // The chunks of the ranks tile the unit in rank order.
                int64_t at = sl.arena[u].begin;
                for (int r = 0; r < W; ++r) {
                    EXPECT_EQ(sl.chunk(u, r).begin, at);
                    at = sl.chunk(u, r).end;
                }
                EXPECT_EQ(at, sl.arena[u].end);
            }
            EXPECT_EQ(cpos, used);
            for (const ParamEntry& e : table.entries()) {
                const size_t u = e.layer >= 0 ? sl.layer_unit(e.layer)
                                 : table.layout().entries()[e.arena_index].offset <
                                         size_t(sl.canonical[1].begin) * sizeof(float)
                                     ? ShardLayout::kFront
                                     : sl.back();
                const int64_t canon =
                    int64_t(table.layout().entries()[e.arena_index].offset / sizeof(float));
                const int64_t arena =
                    int64_t(plan->params.entries()[e.arena_index].offset / sizeof(float));
                EXPECT_EQ(plan->params.entries()[e.arena_index].name,
                          table.layout().entries()[e.arena_index].name);
                EXPECT_EQ(arena - sl.arena[u].begin, canon - sl.canonical[u].begin) << e.name;
                // to_canonical maps the entry's arena range onto its canonical one.
                const int64_t n = e.shape.numel();
                const FlatRange r{arena, arena + n};
                const std::vector<FlatRange> back =
                    sl.to_canonical(std::span<const FlatRange>(&r, 1));
                ASSERT_EQ(back.size(), 1u);
                EXPECT_EQ(back[0].begin, canon);
                EXPECT_EQ(back[0].end, canon + n);
            }
            // Every rank's chunks, cut to the units' own elements, tile [0, used) in canonical
            // coordinates.
            std::vector<FlatRange> all;
            for (int r = 0; r < W; ++r) {
                const std::vector<FlatRange> mine = sl.chunks(r);
                const std::vector<FlatRange> c = sl.to_canonical(mine);
                all.insert(all.end(), c.begin(), c.end());
            }
            std::sort(all.begin(), all.end(),
                      [](const FlatRange& x, const FlatRange& y) { return x.begin < y.begin; });
            int64_t at = 0;
            for (const FlatRange& r : all) {
                EXPECT_EQ(r.begin, at);
                at = r.end;
            }
            EXPECT_EQ(at, used);
            if (W == 1) {
                ASSERT_EQ(plan->params.entries().size(), table.layout().entries().size());
                for (size_t i = 0; i < plan->params.entries().size(); ++i)
                    EXPECT_EQ(plan->params.entries()[i].offset, table.layout().entries()[i].offset);
                EXPECT_EQ(plan->params.total_bytes(), table.layout().total_bytes());
            }
        }
    }
    ModelShape bad;
    bad.batch = 2;
    bad.seq_len = 8;
    bad.unit_shards = 0;
    EXPECT_FALSE(memory_plan_make(parse(kGpt2Json), model_param_table(parse(kGpt2Json)), bad).ok());
    bad.unit_shards = 2;
    bad.optimizer_shards = 3;
    EXPECT_FALSE(memory_plan_make(parse(kGpt2Json), model_param_table(parse(kGpt2Json)), bad).ok());
}

// A model whose units are padded for W ranks computes, from the same weights, the loss and the
// gradients of a model of the table's layout (W = 1), element for element at the entries, with
// zero gradients in the padding.
TEST(ModelSchedule, ShardedModelComputesTheSameGradients) {
    const ModelConfig c = parse(kGpt2Json);
    Model one = make(c, 2, 8, true);
    ModelShape shape;
    shape.batch = 2;
    shape.seq_len = 8;
    shape.unit_shards = 3;
    Result<Model> made = Model::create(c, shape, cpu_context());
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    Model three = std::move(made).value();
    one.init(7);
    three.init(7);
    std::vector<int32_t> tokens(16), targets(16);
    for (int i = 0; i < 16; ++i) {
        tokens[size_t(i)] = (i * 7 + 3) % int32_t(c.vocab_size);
        targets[size_t(i)] = (i * 5 + 1) % int32_t(c.vocab_size);
    }
    ModelBatch batch;
    batch.tokens = ConstTensorView(tokens.data(), DType::kI32, Shape{2, 8});
    batch.targets = ConstTensorView(targets.data(), DType::kI32, Shape{2, 8});
    one.zero_grads();
    three.zero_grads();
    const float l1 = one.forward_backward(batch, 1.0f), l3 = three.forward_backward(batch, 1.0f);
    EXPECT_EQ(l1, l3);
    const TensorView g1 = one.grads_flat(), g3 = three.grads_flat();
    const ShardLayout& sl = three.plan().shards;
    double padding = 0.0;
    for (size_t u = 0; u < sl.units(); ++u) {
        const int64_t own = sl.canonical[u].size();
        EXPECT_EQ(std::memcmp(g1.as<float>() + sl.canonical[u].begin,
                              g3.as<float>() + sl.arena[u].begin, size_t(own) * sizeof(float)),
                  0)
            << "unit " << u;
        for (int64_t i = sl.arena[u].begin + own; i < sl.arena[u].end; ++i)
            padding += std::fabs(double(g3.as<float>()[i]));
    }
    EXPECT_EQ(padding, 0.0);
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
