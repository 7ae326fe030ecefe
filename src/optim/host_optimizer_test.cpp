// HostOptimizer on the CPU backend: over a model created with its masters on the host, three
// steps give the bits of AdamWOptimizer over the same model with device-side masters (with and
// without clipping, fp32 moments, both schedules); the overlapped schedule (gradients copied unit
// by unit from the gradients-ready hook, the update on the worker thread while the next forward
// waits per unit) gives the serial schedule's bits over steps of two micro-batches with a frozen
// entry, fp32 and bf16 moments; the model's entry reads and writes go through the host masters;
// bf16 moments round on write_state and widen exactly on read_state; creation refuses a model
// that keeps its masters. With offload_fraction below 1 (the last units on the host, the rest
// stepped by the device AdamW) every one of these gives the same bits, an entry written between
// steps included. The delayed schedule gives the bits of the serial schedule stepped by hand one
// update behind (each update applied after the next step's gradients, a finish() in between
// applying it at once, a skipped step adding none) and refuses a device part.

#include "optim/host_optimizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "model/model.h"
#include "model/tiny_model_test_util.h"
#include "optim/adamw_optimizer.h"

namespace lathe {
namespace {

using tiny_model::ids;

Model make_model(bool masters_on_host, double fraction = 1.0) {
    const ModelConfig c = tiny_model::parse(tiny_model::kLlamaJson);
    ModelShape shape;
    shape.batch = 2;
    shape.seq_len = 8;
    shape.masters_on_host = masters_on_host;
    shape.offload_fraction = fraction;
    Result<Model> m = Model::create(c, shape, cpu_context());
    LATHE_CHECK(m.ok(), "{}", m.status().to_string());
    return std::move(*m);
}

bool same_bits(const float* a, const float* b, int64_t n) {
    return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0;
}

// Fractions: everything offloaded; about half (the back unit and the last layer); the back unit
// alone (the smallest fraction).
constexpr double kFractions[] = {1.0, 0.5, 1e-6};

TEST(HostOptimizer, StepsAsTheDeviceOptimizerDoes) {
    for (const double fraction : kFractions)
        for (const OffloadSchedule schedule :
             {OffloadSchedule::kSerial, OffloadSchedule::kOverlapped})
            for (const float max_norm : {0.0f, 0.05f}) {
                SCOPED_TRACE(fraction);
                Model a = make_model(true, fraction), b = make_model(false);
                EXPECT_EQ(a.plan().offload_begin == 0, fraction == 1.0);
                Result<HostOptimizer> host =
                    HostOptimizer::create_for(a, AdamWStateDType::kF32, 2, schedule);
                ASSERT_TRUE(host.ok()) << host.status().to_string();
                a.init(5);  // after create_for: init writes the host masters
                b.init(5);
                const int64_t n = b.params_flat().numel();
                ASSERT_EQ(host->total(), n);
                EXPECT_TRUE(same_bits(host->masters().data(), b.params_flat().as<float>(), n));
                Result<AdamWOptimizer> dev = AdamWOptimizer::create_for(b);
                ASSERT_TRUE(dev.ok()) << dev.status().to_string();
                const AdamWHyper hyper{0.9, 0.95, 1e-8};
                for (int step = 1; step <= 3; ++step) {
                    const HostTensor t = ids(2, 8, 64, step), y = ids(2, 8, 64, step + 7);
                    const ModelBatch batch{t.view(), y.view(), {}, {}};
                    float norms[2];
                    int i = 0;
                    for (Model* model : {&a, &b}) {
                        model->zero_grads();
                        model->forward_backward(batch);
                        norms[i++] = model->grad_norm();
                    }
                    ASSERT_EQ(norms[0], norms[1]);
                    if (max_norm > 0) {
                        EXPECT_GT(norms[0], max_norm);  // the clip is exercised
                    }
                    host->step(a, a.adamw_segments(1e-2, 0.1), hyper, step, norms[0], max_norm);
                    dev->step(optimizer_target(b), b.adamw_segments(1e-2, 0.1), hyper, step,
                              max_norm);
                    if (step == 2) {
                        // An entry of the front unit (on the device with a fraction below 1) read
                        // and written between steps, halved: the next step starts from it.
                        host->finish();
                        for (Model* model : {&a, &b}) {
                            const size_t e0 = model->params().entries()[0].arena_index;
                            HostTensor w(DType::kF32, model->plan().params.entries()[e0].shape);
                            model->read_param_entry(e0, w.view());
                            for (int64_t i = 0; i < w.view().numel(); ++i)
                                w.view().as<float>()[i] *= 0.5f;
                            model->write_param_entry(e0, w.view());
                        }
                    }
                }
                host->finish();  // overlapped: the last update reaches the masters and the weights
                EXPECT_TRUE(same_bits(host->masters().data(), b.params_flat().as<float>(), n));
                // The weights the CPU model computes with are the masters.
                EXPECT_TRUE(same_bits(a.params_flat().as<float>(), b.params_flat().as<float>(), n));
                const size_t count = static_cast<size_t>(n);
                std::vector<float> m(count), v(count);
                host->read_state(m, v);
                EXPECT_TRUE(same_bits(m.data(), dev->exp_avg().as<float>(), n));
                EXPECT_TRUE(same_bits(v.data(), dev->exp_avg_sq().as<float>(), n));
                // Entry reads come from the host masters.
                const size_t e = a.params().entries()[0].arena_index;
                const ArenaEntry& ae = a.plan().params.entries()[e];
                HostTensor got(DType::kF32, ae.shape);
                a.read_param_entry(e, got.view());
                EXPECT_TRUE(same_bits(got.view().as<float>(),
                                      host->masters().data() + ae.offset / sizeof(float),
                                      ae.shape.numel()));
            }
}

// What one training run leaves: every micro-batch's loss, the norms, masters, the model's
// weights and both moments.
struct RunResult {
    std::vector<float> losses, norms, masters, weights, m, v;
};

constexpr AdamWHyper kHyper{0.9, 0.95, 1e-8};

// Two micro-batches of step `step` (dloss 1/2, the gradient copies armed before the last), entry
// `frozen`'s gradient zeroed; their losses and the norm appended to `r`.
void accumulate(Model& model, HostOptimizer& host, int step, size_t frozen, RunResult& r) {
    host.before_zero_grads();
    model.zero_grads();
    for (int k = 0; k < 2; ++k) {
        const HostTensor t = ids(2, 8, 64, 2 * step + k), y = ids(2, 8, 64, 2 * step + k + 9);
        if (k == 1) host.arm_gradient_copies();
        r.losses.push_back(model.forward_backward(ModelBatch{t.view(), y.view(), {}, {}}, 0.5f));
    }
    model.zero_grad_entry(frozen);
    r.norms.push_back(model.grad_norm());
}

std::vector<AdamWSegment> segments_without(const Model& model, size_t frozen) {
    std::vector<AdamWSegment> segments = model.adamw_segments(1e-2, 0.1);
    segments.erase(segments.begin() + std::ptrdiff_t(frozen));
    return segments;
}

// The masters, the model's weights and both moments after host.finish().
void finish_into(Model& model, HostOptimizer& host, RunResult& r) {
    host.finish();
    const size_t n = size_t(host.total());
    r.masters.assign(host.masters().begin(), host.masters().end());
    const float* w = model.params_flat().as<float>();
    r.weights.assign(w, w + n);
    r.m.resize(n);
    r.v.resize(n);
    host.read_state(r.m, r.v);
}

// `steps` steps of TrainStep's sequence (run/train_step.h) over `model` with `host`: two
// micro-batches (dloss 1/2), the gradient copies armed before the last, entry `frozen` kept out
// of the update (its gradient zeroed, as the trainer does), clipping at 0.05. drain_after: the
// step after which finish() runs (as a checkpoint's), 0 for none; skip_at: a step whose
// gradients are dropped without an update (as the trainer skips a non-finite step), 0 for none.
RunResult train(Model& model, HostOptimizer& host, int steps, size_t frozen, int drain_after = 0,
                int skip_at = 0) {
    RunResult r;
    for (int step = 1; step <= steps; ++step) {
        accumulate(model, host, step, frozen, r);
        if (step != skip_at)
            host.step(model, segments_without(model, frozen), kHyper, step, r.norms.back(), 0.05f);
        if (step == drain_after) host.finish();
    }
    finish_into(model, host, r);
    return r;
}

// The delayed schedule's sequence, stepped by hand with a serial optimizer: step s's gradients
// computed on the weights before update s - 1, which is applied after them (its own gradients
// put back into the arena for it), and kept for update s; at drain_after the kept update is
// applied at once, and at the end; at skip_at none is kept.
RunResult train_delayed_by_hand(Model& model, HostOptimizer& serial, int steps, size_t frozen,
                                int drain_after, int skip_at) {
    RunResult r;
    const size_t n = size_t(serial.total());
    float* g = model.grads_flat().as<float>();
    std::vector<float> pending(n), now(n);
    int pending_step = 0;
    float pending_norm = 0.0f;
    auto apply_pending = [&] {
        if (pending_step == 0) return;
        std::memcpy(now.data(), g, n * sizeof(float));
        std::memcpy(g, pending.data(), n * sizeof(float));
        serial.step(model, segments_without(model, frozen), kHyper, pending_step, pending_norm,
                    0.05f);
        std::memcpy(g, now.data(), n * sizeof(float));
        pending_step = 0;
    };
    for (int step = 1; step <= steps; ++step) {
        accumulate(model, serial, step, frozen, r);
        apply_pending();
        if (step == skip_at) continue;
        std::memcpy(pending.data(), g, n * sizeof(float));
        pending_step = step;
        pending_norm = r.norms.back();
        if (step == drain_after) apply_pending();
    }
    apply_pending();
    finish_into(model, serial, r);
    return r;
}

TEST(HostOptimizer, OverlappedScheduleGivesTheSerialBits) {
    for (const double fraction : kFractions)
        for (const AdamWStateDType dtype : {AdamWStateDType::kF32, AdamWStateDType::kBF16}) {
            SCOPED_TRACE(fraction);
            Model a = make_model(true, fraction), b = make_model(true, fraction);
            Result<HostOptimizer> serial =
                HostOptimizer::create_for(a, dtype, 2, OffloadSchedule::kSerial);
            Result<HostOptimizer> overlapped =
                HostOptimizer::create_for(b, dtype, 2, OffloadSchedule::kOverlapped);
            ASSERT_TRUE(serial.ok()) << serial.status().to_string();
            ASSERT_TRUE(overlapped.ok()) << overlapped.status().to_string();
            a.init(11);
            b.init(11);
            // A layer's entry: its unit is stepped without it, and its weights stay as written.
            const size_t frozen = 3;
            ASSERT_EQ(a.params().entries()[frozen].layer, 0);
            const RunResult x = train(a, *serial, 4, frozen), y = train(b, *overlapped, 4, frozen);
            ASSERT_EQ(x.losses.size(), 8u);
            for (size_t i = 0; i < x.losses.size(); ++i) EXPECT_EQ(x.losses[i], y.losses[i]) << i;
            for (size_t i = 0; i < x.norms.size(); ++i) {
                EXPECT_EQ(x.norms[i], y.norms[i]) << i;
                EXPECT_GT(x.norms[i], 0.05f);  // the clip is exercised
            }
            const int64_t n = serial->total();
            EXPECT_TRUE(same_bits(x.masters.data(), y.masters.data(), n));
            EXPECT_TRUE(same_bits(x.weights.data(), y.weights.data(), n));
            EXPECT_TRUE(same_bits(x.m.data(), y.m.data(), n));
            EXPECT_TRUE(same_bits(x.v.data(), y.v.data(), n));
            // The frozen entry kept its initial values; the others moved.
            Model c = make_model(false);
            c.init(11);
            const ArenaEntry& fe =
                a.plan().params.entries()[a.params().entries()[frozen].arena_index];
            const size_t off = fe.offset / sizeof(float);
            EXPECT_TRUE(same_bits(y.masters.data() + off, c.params_flat().as<float>() + off,
                                  fe.shape.numel()));
            EXPECT_FALSE(same_bits(y.masters.data(), c.params_flat().as<float>(), n));
        }
}

TEST(HostOptimizer, DelayedScheduleStepsOneUpdateBehind) {
    for (const AdamWStateDType dtype : {AdamWStateDType::kF32, AdamWStateDType::kBF16})
        for (const auto& [drain_after, skip_at] : {std::pair{0, 0}, {2, 0}, {0, 3}}) {
            SCOPED_TRACE(drain_after);
            SCOPED_TRACE(skip_at);
            Model a = make_model(true), b = make_model(true), c = make_model(true);
            Result<HostOptimizer> by_hand =
                HostOptimizer::create_for(a, dtype, 2, OffloadSchedule::kSerial);
            Result<HostOptimizer> delayed =
                HostOptimizer::create_for(b, dtype, 2, OffloadSchedule::kDelayed);
            Result<HostOptimizer> serial =
                HostOptimizer::create_for(c, dtype, 2, OffloadSchedule::kSerial);
            ASSERT_TRUE(by_hand.ok()) << by_hand.status().to_string();
            ASSERT_TRUE(delayed.ok()) << delayed.status().to_string();
            ASSERT_TRUE(serial.ok()) << serial.status().to_string();
            for (Model* m : {&a, &b, &c}) m->init(11);
            const size_t frozen = 3;
            const RunResult x = train_delayed_by_hand(a, *by_hand, 5, frozen, drain_after, skip_at);
            const RunResult y = train(b, *delayed, 5, frozen, drain_after, skip_at);
            ASSERT_EQ(y.losses.size(), 10u);
            EXPECT_EQ(x.losses, y.losses);
            EXPECT_EQ(x.norms, y.norms);
            const int64_t n = by_hand->total();
            EXPECT_TRUE(same_bits(x.masters.data(), y.masters.data(), n));
            EXPECT_TRUE(same_bits(x.weights.data(), y.weights.data(), n));
            EXPECT_TRUE(same_bits(x.m.data(), y.m.data(), n));
            EXPECT_TRUE(same_bits(x.v.data(), y.v.data(), n));
            // One update behind: step 1 and 2 compute with the initial weights, so step 2's
            // losses are step 1's weights' and not the serial schedule's.
            const RunResult z = train(c, *serial, 5, frozen);
            EXPECT_EQ(z.losses[0], y.losses[0]);
            EXPECT_NE(z.losses[2], y.losses[2]);
        }
    // Every update on the host: a model with a device part is refused.
    Model d = make_model(true, 0.5);
    ASSERT_GT(d.plan().offload_begin, 0);
    Result<HostOptimizer> refused =
        HostOptimizer::create_for(d, AdamWStateDType::kF32, 2, OffloadSchedule::kDelayed);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
}

TEST(HostOptimizer, Bf16MomentsRoundOnWriteAndWidenOnRead) {
    Model a = make_model(true);
    Result<HostOptimizer> host = HostOptimizer::create_for(a, AdamWStateDType::kBF16, 1);
    ASSERT_TRUE(host.ok()) << host.status().to_string();
    const int64_t n = host->total();
    const size_t count = static_cast<size_t>(n);
    std::vector<float> m(count), v(count), m2(count), v2(count);
    host->read_state(m2, v2);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(m2[size_t(i)], 0.0f);  // zeroed at creation
    for (int64_t i = 0; i < n; ++i) {
        m[size_t(i)] = 1.0f + float(i) * 1e-4f;
        v[size_t(i)] = 1e-6f * float(i % 97);
    }
    host->write_state(m, v);
    host->read_state(m2, v2);
    for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(m2[size_t(i)], bf16_to_float(float_to_bf16(m[size_t(i)]))) << i;
        ASSERT_EQ(v2[size_t(i)], bf16_to_float(float_to_bf16(v[size_t(i)]))) << i;
    }
    // Widened values go back in exactly.
    std::vector<float> m3(count), v3(count);
    host->write_state(m2, v2);
    host->read_state(m3, v3);
    EXPECT_TRUE(same_bits(m3.data(), m2.data(), n));
    EXPECT_TRUE(same_bits(v3.data(), v2.data(), n));
}

TEST(HostOptimizer, RefusesAModelThatKeepsItsMasters) {
    Model b = make_model(false);
    Result<HostOptimizer> host = HostOptimizer::create_for(b, AdamWStateDType::kF32);
    ASSERT_FALSE(host.ok());
    EXPECT_EQ(host.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace lathe
