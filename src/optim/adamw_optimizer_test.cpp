// AdamWOptimizer on the CPU: the same bits as the AdamW op it wraps (over a model and over raw
// vectors, with clipping), shards over a partition giving the bits of one optimizer over all,
// its state copied out and in, and the errors of creation.

#include "optim/adamw_optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "model/registry.h"
#include "model/tiny_model_test_util.h"
#include "ops/grad_norm.h"

namespace lathe {
namespace {

using tiny_model::ids;

Model make_model(bool training) {
    const ModelConfig c = tiny_model::parse(tiny_model::kLlamaJson);
    ModelShape shape;
    shape.batch = 2;
    shape.seq_len = 8;
    shape.training = training;
    Result<Model> m = Model::create(c, shape, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    m->init(5);
    return std::move(*m);
}

bool same_bits(ConstTensorView a, const std::vector<float>& b) {
    return a.numel() == int64_t(b.size()) && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

// Three steps of a model through the optimizer, and of a twin model through adamw_update_with_copy
// on moments of the arena's length (what the model's own step was): the same parameters and
// moments, bit for bit, with clipping (a small max norm, so that it clips) and without.
TEST(AdamWOptimizer, StepsAModelAsTheOpDoes) {
    for (const float max_norm : {0.0f, 0.05f}) {
        Model a = make_model(true), b = make_model(true);
        Result<AdamWOptimizer> opt = AdamWOptimizer::create_for(a);
        ASSERT_TRUE(opt.ok()) << opt.status().to_string();
        EXPECT_EQ(opt->total(), a.params_flat().numel());
        EXPECT_EQ(opt->range().size(), a.params_flat().numel());
        const int64_t n = b.params_flat().numel();
        std::vector<float> m(size_t(n), 0.0f), v(size_t(n), 0.0f);
        const AdamWHyper hyper{0.9, 0.95, 1e-8};
        float norm_a = 0, norm_b = 0;
        for (int step = 1; step <= 3; ++step) {
            const HostTensor t = ids(2, 8, 64, step), y = ids(2, 8, 64, step + 7);
            const ModelBatch batch{t.view(), y.view(), {}, {}};
            for (Model* model : {&a, &b}) {
                model->zero_grads();
                model->forward_backward(batch);
                (model == &a ? norm_a : norm_b) = model->grad_norm();
            }
            EXPECT_EQ(norm_a, norm_b);
            if (max_norm > 0) {
                EXPECT_GT(norm_a, max_norm);  // the clip is exercised
            }
            opt->step(optimizer_target(a), a.adamw_segments(1e-2, 0.1), hyper, step, max_norm);
            adamw_update_with_copy(
                b.params_flat(), TensorView(), TensorView(m.data(), DType::kF32, Shape{n}),
                TensorView(v.data(), DType::kF32, Shape{n}), b.grads_flat(),
                b.adamw_segments(1e-2, 0.1), hyper, step,
                max_norm > 0 ? b.grad_norm_value() : ConstTensorView(), max_norm, cpu_context());
        }
        const std::vector<float> pb(b.params_flat().as<float>(), b.params_flat().as<float>() + n);
        EXPECT_TRUE(same_bits(a.params_flat(), pb)) << "max_norm " << max_norm;
        EXPECT_TRUE(same_bits(opt->exp_avg(), m)) << "max_norm " << max_norm;
        EXPECT_TRUE(same_bits(opt->exp_avg_sq(), v)) << "max_norm " << max_norm;
        // And the parameters moved.
        Model fresh = make_model(true);
        EXPECT_FALSE(same_bits(fresh.params_flat(), pb));
    }
}

// Raw flat vectors of P elements, segments of several groups with gaps between them (elements
// outside every segment stay as they are).
struct Problem {
    int64_t P = 1000;
    std::vector<float> params, grads;
    std::vector<uint16_t> bf16;  // the twin the step rewrites
    std::vector<AdamWSegment> segments;
    float norm = 0;

    Problem() {
        std::mt19937 gen(42);
        std::normal_distribution<float> d(0.0f, 1.0f);
        params.resize(size_t(P));
        grads.resize(size_t(P));
        bf16.assign(size_t(P), 0);
        for (float& x : params) x = d(gen);
        for (float& x : grads) x = 0.1f * d(gen);
        segments = {{0, 130, 1e-2, 0.1},
                    {130, 7, 1e-2, 0.0},
                    {144, 500, 3e-3, 0.1},  // straddles P / 2
                    {700, 1, 1e-2, 0.0},
                    {704, 296, 2e-2, 0.05}};
        double s = 0;
        for (float g : grads) s += double(g) * g;
        norm = float(std::sqrt(s));
    }
    OptimizerTarget target() {
        OptimizerTarget t;
        t.params = TensorView(params.data(), DType::kF32, Shape{P});
        t.params_bf16 = TensorView(bf16.data(), DType::kBF16, Shape{P});
        t.grads = ConstTensorView(grads.data(), DType::kF32, Shape{P});
        t.grad_norm = ConstTensorView(&norm, DType::kF32, Shape{1});
        return t;
    }
};

std::vector<float> host(ConstTensorView v) {
    return std::vector<float>(v.as<float>(), v.as<float>() + v.numel());
}

// Optimizers over lists of ranges that together partition [0, P) (rank r owning piece r of each
// of several units, pieces of unequal length, some empty) leave the parameters, their bf16 twin
// and the moments, each element where its range puts it, bit for bit as one over all does; and
// a list that is unsorted, overlapping or outside the vector is refused.
TEST(AdamWOptimizer, ListsOfRangesOverAPartitionGiveTheBitsOfOne) {
    for (const int world : {2, 3, 5}) {
        Problem one, sharded;
        Result<AdamWOptimizer> all = AdamWOptimizer::create(one.P, {0, one.P}, cpu_context());
        ASSERT_TRUE(all.ok());
        // Units of lengths 1, 7, 0, 64, ... cut at P; piece r of unit u is its r-th of `world`.
        std::vector<std::vector<FlatRange>> lists(static_cast<size_t>(world));
        int64_t at = 0;
        for (int64_t u = 0; at < one.P; ++u) {
            const int64_t len = std::min<int64_t>(one.P - at, (u * 37 + 1) % 71);
            for (int r = 0; r < world; ++r) {
                const FlatRange piece = flat_shard(len, r, world);
                lists[size_t(r)].push_back(FlatRange{at + piece.begin, at + piece.end});
            }
            at += len;
        }
        std::vector<AdamWOptimizer> shards;
        for (int r = 0; r < world; ++r) {
            Result<AdamWOptimizer> s =
                AdamWOptimizer::create(sharded.P, lists[size_t(r)], cpu_context());
            ASSERT_TRUE(s.ok()) << s.status().to_string();
            shards.push_back(std::move(*s));
        }
        const AdamWHyper hyper{0.9, 0.999, 1e-8};
        for (int step = 1; step <= 3; ++step) {
            all->step(one.target(), one.segments, hyper, step, 0.5f);
            for (AdamWOptimizer& s : shards)
                s.step(sharded.target(), sharded.segments, hyper, step, 0.5f);
            for (size_t i = 0; i < one.grads.size(); ++i)
                one.grads[i] = sharded.grads[i] = 0.9f * one.grads[i] + 0.01f * float(i % 13);
        }
        EXPECT_EQ(std::memcmp(one.params.data(), sharded.params.data(), size_t(one.P) * 4), 0)
            << world;
        EXPECT_EQ(one.bf16, sharded.bf16) << world;
        const std::vector<float> am = host(all->exp_avg()), av = host(all->exp_avg_sq());
        std::vector<float> m(am.size(), -1.0f), v(av.size(), -1.0f);
        for (const AdamWOptimizer& s : shards) {
            const std::vector<float> sm = host(s.exp_avg()), sv = host(s.exp_avg_sq());
            ASSERT_EQ(int64_t(sm.size()), s.numel());
            int64_t k = 0;
            for (const FlatRange& r : s.ranges())
                for (int64_t i = r.begin; i < r.end; ++i, ++k) {
                    m[size_t(i)] = sm[size_t(k)];
                    v[size_t(i)] = sv[size_t(k)];
                }
        }
        EXPECT_EQ(std::memcmp(am.data(), m.data(), am.size() * 4), 0) << world;
        EXPECT_EQ(std::memcmp(av.data(), v.data(), av.size() * 4), 0) << world;
    }
    const Context ctx = cpu_context();
    EXPECT_FALSE(AdamWOptimizer::create(100, std::vector<FlatRange>{{10, 20}, {5, 8}}, ctx).ok());
    EXPECT_FALSE(AdamWOptimizer::create(100, std::vector<FlatRange>{{10, 20}, {15, 30}}, ctx).ok());
    EXPECT_FALSE(AdamWOptimizer::create(100, std::vector<FlatRange>{{90, 101}}, ctx).ok());
    EXPECT_FALSE(AdamWOptimizer::create(100, std::vector<FlatRange>{{9, 8}}, ctx).ok());
}

// Sharded gradients (OptimizerTarget::grads_of_ranges): each optimizer over a list of ranges
// reading only its ranges' gradients, concatenated in list order, leaves the parameters, their
// bf16 twin and the moments bit for bit as it does reading them from the full vector.
TEST(AdamWOptimizer, GradientsOfTheRangesAloneGiveTheBitsOfTheFullVector) {
    const int world = 3;
    Problem full, compact;
    std::vector<std::vector<FlatRange>> lists(static_cast<size_t>(world));
    int64_t at = 0;
    for (int64_t u = 0; at < full.P; ++u) {
        const int64_t len = std::min<int64_t>(full.P - at, (u * 37 + 1) % 71);
        for (int r = 0; r < world; ++r) {
            const FlatRange piece = flat_shard(len, r, world);
            lists[size_t(r)].push_back(FlatRange{at + piece.begin, at + piece.end});
        }
        at += len;
    }
    const AdamWHyper hyper{0.9, 0.999, 1e-8};
    for (int r = 0; r < world; ++r) {
        Result<AdamWOptimizer> a = AdamWOptimizer::create(full.P, lists[size_t(r)], cpu_context());
        Result<AdamWOptimizer> b = AdamWOptimizer::create(full.P, lists[size_t(r)], cpu_context());
        ASSERT_TRUE(a.ok() && b.ok());
        for (int step = 1; step <= 3; ++step) {
            std::vector<float> mine;
            for (const FlatRange& x : b->ranges())
                mine.insert(mine.end(), compact.grads.begin() + x.begin,
                            compact.grads.begin() + x.end);
            ASSERT_EQ(int64_t(mine.size()), b->numel());
            OptimizerTarget t = compact.target();
            t.grads = ConstTensorView(mine.data(), DType::kF32, Shape{b->numel()});
            t.grads_of_ranges = true;
            a->step(full.target(), full.segments, hyper, step, 0.5f);
            b->step(t, compact.segments, hyper, step, 0.5f);
            for (size_t i = 0; i < full.grads.size(); ++i)
                full.grads[i] = compact.grads[i] = 0.9f * full.grads[i] + 0.01f * float(i % 13);
        }
        EXPECT_EQ(host(a->exp_avg()), host(b->exp_avg())) << r;
        EXPECT_EQ(host(a->exp_avg_sq()), host(b->exp_avg_sq())) << r;
    }
    EXPECT_EQ(std::memcmp(full.params.data(), compact.params.data(), size_t(full.P) * 4), 0);
    EXPECT_EQ(full.bf16, compact.bf16);
    // Every element was updated by one of the shards: the parameters moved.
    EXPECT_NE(std::memcmp(full.params.data(), Problem().params.data(), size_t(full.P) * 4), 0);
}

// Shards over a partition of [0, P), each stepping only its range, leave the parameters, their
// bf16 twin and the moments (concatenated) bit for bit as one optimizer over all of them does.
TEST(AdamWOptimizer, ShardsOverAPartitionGiveTheBitsOfOne) {
    for (const int world : {2, 3, 7}) {
        Problem one, sharded;
        Result<AdamWOptimizer> all = AdamWOptimizer::create(one.P, {0, one.P}, cpu_context());
        ASSERT_TRUE(all.ok());
        std::vector<AdamWOptimizer> shards;
        for (int r = 0; r < world; ++r) {
            Result<AdamWOptimizer> s =
                AdamWOptimizer::create(sharded.P, flat_shard(sharded.P, r, world), cpu_context());
            ASSERT_TRUE(s.ok());
            shards.push_back(std::move(*s));
        }
        const AdamWHyper hyper{0.9, 0.999, 1e-8};
        for (int step = 1; step <= 3; ++step) {
            all->step(one.target(), one.segments, hyper, step, 0.5f);
            for (AdamWOptimizer& s : shards)
                s.step(sharded.target(), sharded.segments, hyper, step, 0.5f);
            for (size_t i = 0; i < one.grads.size(); ++i) {  // new gradients for the next step
                one.grads[i] = sharded.grads[i] = 0.9f * one.grads[i] + 0.01f * float(i % 13);
            }
        }
        EXPECT_EQ(std::memcmp(one.params.data(), sharded.params.data(), size_t(one.P) * 4), 0)
            << world;
        EXPECT_EQ(one.bf16, sharded.bf16) << world;
        std::vector<float> m, v;
        for (const AdamWOptimizer& s : shards) {
            const std::vector<float> sm = host(s.exp_avg()), sv = host(s.exp_avg_sq());
            m.insert(m.end(), sm.begin(), sm.end());
            v.insert(v.end(), sv.begin(), sv.end());
        }
        EXPECT_TRUE(same_bits(all->exp_avg(), m)) << world;
        EXPECT_TRUE(same_bits(all->exp_avg_sq(), v)) << world;
        // Elements between segments were left alone.
        Problem start;
        for (int64_t i : {130 + 7, 143, 644, 699, 701, 703})
            EXPECT_EQ(one.params[size_t(i)], start.params[size_t(i)]) << i;
    }
}

TEST(AdamWOptimizer, FlatShardsPartitionTheRange) {
    EXPECT_EQ(flat_shard(10, 0, 3).begin, 0);
    EXPECT_EQ(flat_shard(10, 0, 3).end, 4);
    EXPECT_EQ(flat_shard(10, 1, 3).begin, 4);
    EXPECT_EQ(flat_shard(10, 1, 3).end, 7);
    EXPECT_EQ(flat_shard(10, 2, 3).begin, 7);
    EXPECT_EQ(flat_shard(10, 2, 3).end, 10);
    for (int world : {1, 2, 5, 64}) {
        int64_t next = 0;
        for (int r = 0; r < world; ++r) {
            const FlatRange s = flat_shard(1001, r, world);
            EXPECT_EQ(s.begin, next);
            EXPECT_GE(s.size(), 1001 / world);
            EXPECT_LE(s.size(), 1001 / world + 1);
            next = s.end;
        }
        EXPECT_EQ(next, 1001);
    }
}

// Segments split over the units by their place in the units' coordinates (offset + the
// argument), kept as given: the offloaded part's segments, counted from its start, split as the
// same segments counted from the vector's start.
// The default ("fast", fork only) death-test style, which the aarch64 tests under qemu-user run.
TEST(AdamWOptimizer, SegmentsByUnitPlaceSegmentsAtTheirOffset) {
    const std::vector<FlatRange> units = {{0, 10}, {10, 30}, {30, 40}};
    const std::vector<AdamWSegment> whole = {
        {10, 5, 1e-3, 0.1}, {16, 14, 1e-3, 0.0}, {30, 10, 2e-3, 0.1}};
    std::vector<AdamWSegment> part = whole;
    for (AdamWSegment& g : part) g.offset -= 10;
    std::vector<std::vector<AdamWSegment>> by_whole, by_part;
    adamw_segments_by_unit(units, whole, by_whole);
    adamw_segments_by_unit(units, part, by_part, 10);
    ASSERT_EQ(by_whole.size(), 3u);
    ASSERT_EQ(by_part.size(), 3u);
    for (size_t u = 0; u < 3; ++u) {
        ASSERT_EQ(by_part[u].size(), by_whole[u].size()) << u;
        for (size_t i = 0; i < by_part[u].size(); ++i) {
            EXPECT_EQ(by_part[u][i].offset + 10, by_whole[u][i].offset) << u << " " << i;
            EXPECT_EQ(by_part[u][i].count, by_whole[u][i].count);
            EXPECT_EQ(by_part[u][i].lr, by_whole[u][i].lr);
        }
    }
    EXPECT_TRUE(by_part[0].empty());
    EXPECT_EQ(by_part[1].size(), 2u);
    EXPECT_EQ(by_part[2].size(), 1u);
    // Without the offset, the part's first segment [0, 5) lies in unit 0 and its second
    // [6, 20) across the boundary at 10: a broken invariant.
    EXPECT_DEATH(adamw_segments_by_unit(units, part, by_part), "segment \\[6, 20\\) outside");
}

TEST(AdamWOptimizer, StateCopiesOutAndIn) {
    Problem p;
    Result<AdamWOptimizer> opt = AdamWOptimizer::create(p.P, {100, 400}, cpu_context());
    ASSERT_TRUE(opt.ok());
    EXPECT_EQ(opt->exp_avg().numel(), 300);
    opt->step(p.target(), p.segments, AdamWHyper{}, 1);
    std::vector<float> m(300), v(300);
    opt->read_state(m, v);
    EXPECT_TRUE(same_bits(opt->exp_avg(), m));
    EXPECT_TRUE(same_bits(opt->exp_avg_sq(), v));
    EXPECT_NE(m, std::vector<float>(300, 0.0f));
    Result<AdamWOptimizer> other = AdamWOptimizer::create(p.P, {100, 400}, cpu_context());
    ASSERT_TRUE(other.ok());
    EXPECT_EQ(host(other->exp_avg()), std::vector<float>(300, 0.0f));  // created zeroed
    other->write_state(m, v);
    EXPECT_TRUE(same_bits(other->exp_avg(), m));
    EXPECT_TRUE(same_bits(other->exp_avg_sq(), v));
}

// bf16 moments (optimizer.state_dtype: bf16): stored as bf16, the op's bf16 update, the state
// widened on the way out and rounded on the way in; f32 moments through write_state round to
// the nearest bf16.
TEST(AdamWOptimizer, Bf16StateStepsAsTheOpAndCopiesOutWidened) {
    Problem p, q;
    Result<AdamWOptimizer> opt =
        AdamWOptimizer::create(p.P, {{100, 400}}, cpu_context(), AdamWStateDType::kBF16);
    ASSERT_TRUE(opt.ok()) << opt.status().to_string();
    EXPECT_EQ(opt->state_dtype(), AdamWStateDType::kBF16);
    EXPECT_EQ(opt->exp_avg().dtype(), DType::kBF16);
    opt->step(p.target(), p.segments, AdamWHyper{}, 1);
    // The op over bf16 moments of the range, on the twin problem.
    HostTensor m16(DType::kBF16, Shape{300}), v16(DType::kBF16, Shape{300});
    std::vector<AdamWSegment> local;
    for (AdamWSegment s : q.segments) {
        const int64_t b = std::max<int64_t>(s.offset, 100),
                      e = std::min<int64_t>(s.offset + s.count, 400);
        if (e <= b) continue;
        s.count = e - b;
        s.offset = b - 100;
        local.push_back(s);
    }
    const OptimizerTarget t = q.target();
    adamw_update_with_copy(t.params.slice(100, 400), TensorView(), m16.view(), v16.view(),
                           t.grads.slice(100, 400), local, AdamWHyper{}, 1, ConstTensorView(), 0.0f,
                           cpu_context());
    EXPECT_EQ(std::memcmp(opt->exp_avg().data(), m16.view().data(), 600), 0);
    EXPECT_EQ(std::memcmp(opt->exp_avg_sq().data(), v16.view().data(), 600), 0);
    EXPECT_EQ(std::memcmp(p.params.data(), q.params.data(), p.params.size() * sizeof(float)), 0);
    std::vector<float> m(300), v(300);
    opt->read_state(m, v);
    for (int64_t i = 0; i < 300; ++i) {
        EXPECT_EQ(m[size_t(i)], bf16_to_float(m16.as<bf16>()[i])) << i;
        EXPECT_EQ(v[size_t(i)], bf16_to_float(v16.as<bf16>()[i])) << i;
    }
    std::vector<float> in(300, 1.0f + 0x1p-12f);  // rounds to 1 in bf16
    opt->write_state(in, in);
    std::vector<float> back(300), back_sq(300);
    opt->read_state(back, back_sq);
    EXPECT_EQ(back, std::vector<float>(300, 1.0f));
    EXPECT_EQ(back_sq, std::vector<float>(300, 1.0f));
}

TEST(AdamWOptimizer, CreationErrors) {
    Result<AdamWOptimizer> outside = AdamWOptimizer::create(10, {5, 11}, cpu_context());
    ASSERT_FALSE(outside.ok());
    EXPECT_EQ(outside.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(outside.status().message().find("[5, 11)"), std::string::npos);
    EXPECT_FALSE(AdamWOptimizer::create(10, {6, 5}, cpu_context()).ok());

    const Model eval = make_model(false);
    Result<AdamWOptimizer> no_grads = AdamWOptimizer::create_for(eval);
    ASSERT_FALSE(no_grads.ok());
    EXPECT_EQ(no_grads.status().code(), StatusCode::kFailedPrecondition);

    // Offload (an optimizer on another device than the model) is refused, not half done.
    const Model train = make_model(true);
    Context cuda;
    cuda.backend = Backend::kCuda;
    Result<AdamWOptimizer> offload =
        AdamWOptimizer::create_for(train, {0, train.params_flat().numel()}, cuda);
    ASSERT_FALSE(offload.ok());
    EXPECT_EQ(offload.status().code(), StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace lathe
