// Sharded gradients on one process: the model's gradient windows hook (model.h) and the memory
// plan's gradient arena with ModelShape::gradient_shards (memory_plan.h). The backward writes
// each unit's gradients where the hook says, with the bits it writes into the arena, and the plan
// counts the rank's shard and the unit windows instead of the whole gradients. Data parallel over
// ranks (run/data_parallel.h) is tested under mpirun (tests/test_data_parallel.py).

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/tiny_model_test_util.h"

namespace lathe {
namespace {

using tiny_model::ids;
using tiny_model::kGpt2Json;
using tiny_model::kLlamaJson;
using tiny_model::kNeoxJson;
using tiny_model::make;
using tiny_model::parse;
using tiny_model::Window;

ModelShape sharded_shape(int64_t B, int64_t T, int world, int gradient_shards) {
    ModelShape s{B, T, 0};
    s.unit_shards = world;
    s.optimizer_shards = world;
    s.gradient_shards = gradient_shards;
    return s;
}

size_t unit_of(const ShardLayout& sl, int piece) {
    return piece == Model::kInputWeights    ? ShardLayout::kFront
           : piece == Model::kOutputWeights ? sl.back()
                                            : sl.layer_unit(piece);
}

// Two micro-batches (dloss 0.5 each) into the arena of one model and into per-unit windows of
// its twin: every unit's window holds the arena's bits, the twin's arena stays zero where the
// windows took the gradients, and each backward asks for layers L-1 .. 0 once each and for the
// front and back units. With `layers_only` the hook returns windows for layers and a null view
// (the arena) for the front and back units.
void expect_windows_hold_the_arena_bits(std::string_view json, bool layers_only) {
    const ModelConfig c = parse(json);
    const int64_t B = 2, T = 8, V = c.vocab_size;
    const ModelShape shape = sharded_shape(B, T, 2, 1);
    Model a = make(c, shape), b = make(c, shape);
    const ShardLayout& sl = b.plan().shards;
    std::vector<Window> windows;
    for (size_t u = 0; u < sl.units(); ++u) windows.emplace_back(sl.arena[u].size());
    std::vector<int> calls;
    b.set_grad_window_hook([&](int piece) {
        calls.push_back(piece);
        if (layers_only && piece < 0) return TensorView();
        Window& w = windows[unit_of(sl, piece)];
        return TensorView(w.data.get(), DType::kF32, Shape{w.n});
    });
    const HostTensor t1 = ids(B, T, V, 1), y1 = ids(B, T, V, 2);
    const HostTensor t2 = ids(B, T, V, 3), y2 = ids(B, T, V, 4);
    const ModelBatch b1{t1.view(), y1.view(), {}, {}}, b2{t2.view(), y2.view(), {}, {}};
    for (Model* m : {&a, &b}) {
        m->zero_grads();
        m->forward_backward(b1, 0.5f);
        m->forward_backward(b2, 0.5f);
    }
    const float* ga = a.grads_flat().as<float>();
    const float* gb = b.grads_flat().as<float>();
    double scale = 0.0;
    for (size_t u = 0; u < sl.units(); ++u) {
        const FlatRange r = sl.arena[u];
        const bool windowed = !(layers_only && (u == ShardLayout::kFront || u == sl.back()));
        const float* got = windowed ? windows[u].data.get() : gb + r.begin;
        EXPECT_EQ(std::memcmp(got, ga + r.begin, size_t(r.size()) * sizeof(float)), 0)
            << json.substr(0, 60) << " unit " << u;
        for (int64_t i = 0; i < r.size(); ++i) {
            scale = std::max(scale, double(std::abs(got[i])));
            if (windowed) {
                EXPECT_EQ(gb[r.begin + i], 0.0f) << "unit " << u << " element " << i;
            }
        }
    }
    EXPECT_GT(scale, 0.0);  // the backward wrote gradients, not zeros
    // Per backward: the layers once each, last first, and the front and back units.
    const int L = int(c.num_layers);
    std::vector<int> layers;
    int front = 0, back = 0;
    for (const int p : calls) {
        if (p >= 0) layers.push_back(p);
        front += p == Model::kInputWeights;
        back += p == Model::kOutputWeights;
    }
    std::vector<int> want;
    for (int k = 0; k < 2; ++k)
        for (int l = L - 1; l >= 0; --l) want.push_back(l);
    EXPECT_EQ(layers, want);
    EXPECT_GE(front, 2);
    EXPECT_GE(back, 2);
}

TEST(GradWindows, UntiedLlamaWritesEachUnitIntoItsWindowWithTheArenasBits) {
    expect_windows_hold_the_arena_bits(kLlamaJson, false);
}

TEST(GradWindows, TiedGpt2WithLearnedPositionsWritesEachUnitIntoItsWindow) {
    expect_windows_hold_the_arena_bits(kGpt2Json, false);
}

TEST(GradWindows, NeoxWritesEachUnitIntoItsWindow) {
    expect_windows_hold_the_arena_bits(kNeoxJson, false);
}

TEST(GradWindows, ANullWindowLeavesTheUnitInTheArena) {
    expect_windows_hold_the_arena_bits(kLlamaJson, true);
    expect_windows_hold_the_arena_bits(kGpt2Json, true);
}

// The plan with gradients sharded over 2 ranks: the shard holds half of the padded arena; the
// front and back windows their units' lengths; the layer windows (one on the CPU, two on CUDA)
// the longest layer's. gradient_bytes() is their sum, and the model allocates exactly that.
TEST(GradWindows, APlanWithShardedGradientsCountsTheShardAndTheWindows) {
    const ModelConfig c = parse(kLlamaJson);
    const ParamTable table = model_param_table(c);
    for (const Backend backend : {Backend::kCpu, Backend::kCuda}) {
        ModelShape s = sharded_shape(2, 8, 2, 2);
        s.backend = backend;
        Result<MemoryPlan> plan = memory_plan_make(c, table, s);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const ShardLayout& sl = plan->shards;
        const auto bytes = [&](size_t entry) { return plan->gradients.entries()[entry].bytes; };
        EXPECT_EQ(bytes(plan->grad_shard), size_t(sl.total / 2) * sizeof(float));
        EXPECT_EQ(bytes(plan->grad_front_window),
                  size_t(sl.arena[ShardLayout::kFront].size()) * sizeof(float));
        EXPECT_EQ(bytes(plan->grad_back_window),
                  size_t(sl.arena[sl.back()].size()) * sizeof(float));
        ASSERT_EQ(plan->grad_layer_windows.size(), backend == Backend::kCuda ? 2u : 1u);
        for (const size_t w : plan->grad_layer_windows)
            EXPECT_EQ(bytes(w), size_t(sl.arena[1].size()) * sizeof(float));
        size_t windows = bytes(plan->grad_front_window) + bytes(plan->grad_back_window);
        for (const size_t w : plan->grad_layer_windows) windows += bytes(w);
        EXPECT_EQ(plan->gradient_shard_bytes(), bytes(plan->grad_shard));
        EXPECT_EQ(plan->gradient_window_bytes(), windows);
        EXPECT_EQ(plan->gradient_bytes(), bytes(plan->grad_shard) + windows);
        EXPECT_EQ(plan->gradient_bytes(), plan->gradients.total_bytes());
        EXPECT_NE(plan->table("t").find("gradients sharded over 2 ranks: shard " +
                                        std::to_string(bytes(plan->grad_shard)) + " B"),
                  std::string::npos)
            << plan->table("t");
        // Unsharded, the gradients are the parameter arena's twin and the table has no such line.
        s.gradient_shards = 1;
        Result<MemoryPlan> whole = memory_plan_make(c, table, s);
        ASSERT_TRUE(whole.ok());
        EXPECT_EQ(whole->gradient_bytes(), whole->params.total_bytes());
        EXPECT_EQ(whole->gradient_shard_bytes(), 0u);
        EXPECT_EQ(whole->table("t").find("gradients sharded"), std::string::npos);
    }
    Model m = make(c, sharded_shape(2, 8, 2, 2));
    EXPECT_EQ(size_t(m.grads_flat().numel()) * sizeof(float), m.plan().gradient_bytes());
    EXPECT_EQ(m.gradient_arena_entry(m.plan().grad_shard).numel(), m.plan().shards.total / 2);
}

TEST(GradWindows, GradientShardsOtherThanOneOrTheUnitShardsAreRefused) {
    const ModelConfig c = parse(kLlamaJson);
    Result<MemoryPlan> plan = memory_plan_make(c, model_param_table(c), sharded_shape(2, 8, 2, 3));
    ASSERT_FALSE(plan.ok());
    EXPECT_NE(plan.status().message().find("gradient_shards 3"), std::string::npos)
        << plan.status().to_string();
}

}  // namespace
}  // namespace lathe
