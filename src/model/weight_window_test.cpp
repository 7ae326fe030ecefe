// Sharded parameters on one process: the model's weight windows hook (model.h) and the memory
// plan's parameter storage with ModelShape::param_shards (memory_plan.h). A model whose weights
// come from windows computes the bits it computes from its arena; a sharded model's init writes
// each rank's chunks of the unsharded values; the plan counts the rank's shard and the windows.
// Data parallel over ranks (run/data_parallel.h) is tested under mpirun
// (tests/test_data_parallel.py).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
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

ModelShape sharded_shape(int world, int param_shards, int rank) {
    ModelShape s{2, 8, 0};
    s.unit_shards = world;
    s.optimizer_shards = world;
    s.gradient_shards = param_shards;
    s.param_shards = param_shards;
    s.shard_rank = rank;
    return s;
}

size_t unit_of(const ShardLayout& sl, int piece) {
    return piece == Model::kInputWeights    ? ShardLayout::kFront
           : piece == Model::kOutputWeights ? sl.back()
                                            : sl.layer_unit(piece);
}

// Model b's weights copied unit by unit into windows and its own arena filled with NaN: its two
// micro-batches through the windows give model a's losses and gradients bit for bit (a NaN read
// from the arena would show in both), and the hook is asked for every layer in each forward
// (0 .. L-1) and each backward (L-1 .. 0) and for the front and back units.
void expect_windows_give_the_arena_bits(std::string_view json) {
    const ModelConfig c = parse(json);
    const int64_t B = 2, T = 8, V = c.vocab_size;
    const ModelShape shape = sharded_shape(2, 1, 0);
    Model a = make(c, shape), b = make(c, shape);
    const ShardLayout& sl = b.plan().shards;
    std::vector<Window> windows;
    float* arena = b.params_flat().as<float>();
    for (size_t u = 0; u < sl.units(); ++u) {
        windows.emplace_back(sl.arena[u].size());
        std::memcpy(windows.back().data.get(), arena + sl.arena[u].begin,
                    size_t(sl.arena[u].size()) * sizeof(float));
    }
    std::fill(arena, arena + b.params_flat().numel(), std::numeric_limits<float>::quiet_NaN());
    std::vector<int> layers;
    int front = 0, back = 0;
    b.set_weight_window_hook([&](int piece) {
        if (piece >= 0 && (layers.empty() || layers.back() != piece)) layers.push_back(piece);
        front += piece == Model::kInputWeights;
        back += piece == Model::kOutputWeights;
        return windows[unit_of(sl, piece)].view();
    });
    const HostTensor t1 = ids(B, T, V, 1), y1 = ids(B, T, V, 2);
    const HostTensor t2 = ids(B, T, V, 3), y2 = ids(B, T, V, 4);
    const ModelBatch b1{t1.view(), y1.view(), {}, {}}, b2{t2.view(), y2.view(), {}, {}};
    float losses[2][2];
    for (int k = 0; k < 2; ++k) {
        Model& m = k == 0 ? a : b;
        m.zero_grads();
        losses[k][0] = m.forward_backward(b1, 0.5f);
        losses[k][1] = m.forward_backward(b2, 0.5f);
    }
    for (int i = 0; i < 2; ++i) {
        EXPECT_TRUE(std::isfinite(losses[1][i])) << json.substr(0, 60);
        EXPECT_EQ(std::memcmp(&losses[0][i], &losses[1][i], sizeof(float)), 0)
            << losses[0][i] << " vs " << losses[1][i];
    }
    const TensorView ga = a.grads_flat(), gb = b.grads_flat();
    EXPECT_EQ(std::memcmp(ga.data(), gb.data(), size_t(ga.bytes())), 0) << json.substr(0, 60);
    // Logits (a forward of its own) read the windows too.
    HostTensor la(DType::kF32, Shape{B, T, V}), lb(DType::kF32, Shape{B, T, V});
    a.logits(la.view(), b1);
    b.logits(lb.view(), b1);
    EXPECT_EQ(std::memcmp(la.view().data(), lb.view().data(), size_t(la.view().bytes())), 0);
    const int L = int(c.num_layers);
    std::vector<int> want;
    for (int k = 0; k < 2; ++k) {
        for (int l = 0; l < L; ++l) want.push_back(l);
        for (int l = L - 1; l >= 0; --l) want.push_back(l);
    }
    for (int l = 0; l < L; ++l) want.push_back(l);  // the logits' forward
    // Consecutive asks for one layer count once (the backward may ask again for its recompute);
    // a one-layer model's forward and backward then run together.
    std::vector<int> collapsed;
    for (const int l : want)
        if (collapsed.empty() || collapsed.back() != l) collapsed.push_back(l);
    EXPECT_EQ(layers, collapsed);
    EXPECT_GE(front, 3);
    EXPECT_GE(back, 3);
}

TEST(WeightWindows, UntiedLlamaComputesFromWindowsWithTheArenasBits) {
    expect_windows_give_the_arena_bits(kLlamaJson);
}

TEST(WeightWindows, TiedGpt2WithLearnedPositionsComputesFromWindows) {
    expect_windows_give_the_arena_bits(kGpt2Json);
}

TEST(WeightWindows, NeoxComputesFromWindows) {
    expect_windows_give_the_arena_bits(kNeoxJson);
}

// Two ranks' sharded models, initialised from one seed: rank r's shard is chunk r of every unit
// of the unsharded model's arena, in unit order. Windows gathered by hand from the two shards give
// the unsharded model's loss, and its gradients through gradient windows, bit for bit.
TEST(WeightWindows, ShardedModelsHoldTheirChunksAndComputeFromGatheredWindows) {
    for (const std::string_view json : {kLlamaJson, kGpt2Json}) {
        const ModelConfig c = parse(json);
        const int64_t B = 2, T = 8, V = c.vocab_size;
        Model whole = make(c, sharded_shape(2, 1, 0));
        Model r0 = make(c, sharded_shape(2, 2, 0)), r1 = make(c, sharded_shape(2, 2, 1));
        const ShardLayout& sl = whole.plan().shards;
        ASSERT_TRUE(r0.params_sharded());
        ASSERT_EQ(r0.params_flat().numel(), sl.total / 2);
        ASSERT_EQ(r0.params_total(), sl.total);
        const float* all = whole.params_flat().as<float>();
        std::vector<Window> windows;
        int64_t at = 0;
        for (size_t u = 0; u < sl.units(); ++u) {
            windows.emplace_back(sl.arena[u].size());
            for (int r = 0; r < 2; ++r) {
                const FlatRange ch = sl.chunk(u, r);
                const float* shard = (r == 0 ? r0 : r1).params_flat().as<float>() + at;
                EXPECT_EQ(std::memcmp(shard, all + ch.begin, size_t(ch.size()) * sizeof(float)), 0)
                    << "unit " << u << " rank " << r;
                std::memcpy(windows.back().data.get() + (ch.begin - sl.arena[u].begin), shard,
                            size_t(ch.size()) * sizeof(float));
            }
            at += sl.chunk(u, 0).size();
        }
        std::vector<Window> grads;
        for (size_t u = 0; u < sl.units(); ++u) grads.emplace_back(sl.arena[u].size());
        r0.set_weight_window_hook([&](int piece) { return windows[unit_of(sl, piece)].view(); });
        r0.set_grad_window_hook([&](int piece) { return grads[unit_of(sl, piece)].view(); });
        const HostTensor t = ids(B, T, V, 5), y = ids(B, T, V, 6);
        const ModelBatch batch{t.view(), y.view(), {}, {}};
        whole.zero_grads();
        r0.zero_grads();
        const float lw = whole.forward_backward(batch, 1.0f), ls = r0.forward_backward(batch, 1.0f);
        EXPECT_EQ(std::memcmp(&lw, &ls, sizeof(float)), 0) << lw << " vs " << ls;
        const float* gw = whole.grads_flat().as<float>();
        for (size_t u = 0; u < sl.units(); ++u)
            EXPECT_EQ(std::memcmp(grads[u].data.get(), gw + sl.arena[u].begin,
                                  size_t(sl.arena[u].size()) * sizeof(float)),
                      0)
                << "unit " << u;
    }
}

// The plan with parameters sharded over 2 ranks: the masters' shard half of the padded arena (and
// on CUDA the bf16 copy's); the weight windows in the compute dtype (f32 on the CPU, bf16 on
// CUDA): the front and back units' lengths and two of the longest layer's. parameter_bytes() is
// their sum, and the table says so.
TEST(WeightWindows, APlanWithShardedParametersCountsTheShardAndTheWindows) {
    const ModelConfig c = parse(kLlamaJson);
    const ParamTable table = model_param_table(c);
    for (const Backend backend : {Backend::kCpu, Backend::kCuda}) {
        ModelShape s = sharded_shape(2, 2, 1);
        s.backend = backend;
        Result<MemoryPlan> plan = memory_plan_make(c, table, s);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const ShardLayout& sl = plan->shards;
        const bool cuda = backend == Backend::kCuda;
        const size_t unit_bytes = cuda ? 2 : 4;
        const ArenaLayout& computes = cuda ? plan->compute_storage : plan->param_storage;
        const auto bytes = [&](size_t entry) { return computes.entries()[entry].bytes; };
        size_t shard = plan->param_storage.entries()[plan->param_shard].bytes;
        EXPECT_EQ(shard, size_t(sl.total / 2) * sizeof(float));
        if (cuda) {
            EXPECT_EQ(plan->compute_storage.entries()[plan->compute_shard].bytes,
                      size_t(sl.total / 2) * 2);
            shard += size_t(sl.total / 2) * 2;
        }
        EXPECT_EQ(bytes(plan->weight_front_window),
                  size_t(sl.arena[ShardLayout::kFront].size()) * unit_bytes);
        EXPECT_EQ(bytes(plan->weight_back_window), size_t(sl.arena[sl.back()].size()) * unit_bytes);
        ASSERT_EQ(plan->weight_layer_windows.size(), size_t(kWeightLayerWindows));
        size_t windows = bytes(plan->weight_front_window) + bytes(plan->weight_back_window);
        for (const size_t w : plan->weight_layer_windows) {
            EXPECT_EQ(bytes(w), size_t(sl.arena[1].size()) * unit_bytes);
            windows += bytes(w);
        }
        EXPECT_EQ(plan->param_shard_bytes(), shard);
        EXPECT_EQ(plan->weight_window_bytes(), windows);
        EXPECT_EQ(plan->parameter_bytes(), shard + windows);
        EXPECT_NE(plan->table("t").find("parameters sharded over 2 ranks: shard " +
                                        std::to_string(shard) + " B"),
                  std::string::npos)
            << plan->table("t");
        // Unsharded: the whole arenas, and no such line.
        s.param_shards = 1;
        Result<MemoryPlan> full = memory_plan_make(c, table, s);
        ASSERT_TRUE(full.ok());
        EXPECT_EQ(full->parameter_bytes(),
                  full->params.total_bytes() + full->params_compute.total_bytes());
        EXPECT_EQ(full->param_shard_bytes(), 0u);
        EXPECT_EQ(full->table("t").find("parameters sharded"), std::string::npos);
    }
}

TEST(WeightWindows, ParameterShardsWithoutGradientShardsAreRefused) {
    const ModelConfig c = parse(kLlamaJson);
    ModelShape s = sharded_shape(2, 2, 0);
    s.gradient_shards = 1;
    Result<MemoryPlan> plan = memory_plan_make(c, model_param_table(c), s);
    ASSERT_FALSE(plan.ok());
    EXPECT_NE(plan.status().message().find("param_shards 2"), std::string::npos)
        << plan.status().to_string();
    s = sharded_shape(2, 2, 2);
    plan = memory_plan_make(c, model_param_table(c), s);
    ASSERT_FALSE(plan.ok());
    EXPECT_NE(plan.status().message().find("shard_rank 2"), std::string::npos);
}

}  // namespace
}  // namespace lathe
