// HostOptimizer on CUDA (CTest label gpu): over GPU models created with their masters on the host,
// the overlapped schedule (gradients D2H unit by unit on the copy stream from the backward's
// hook, CpuAdamW on the worker thread, the bf16 weights H2D unit by unit while the next forward
// waits per unit) and the serial one give the bits of AdamWOptimizer on the device: losses,
// norms, masters, the bf16 compute copy and both moments, over steps of two micro-batches with
// clipping, weight decay and a frozen entry (whose compute copy neither schedule rewrites).
// With offload_fraction below 1 (the last units offloaded, the first ones' masters and moments
// kept on the GPU and stepped by the CUDA AdamW kernel) the same bits, with an entry of the GPU
// part read and written between steps (the host mirror reaches the device masters).
// The delayed schedule (each update's weights H2D on the optimizer stream during the next step's
// last backward) gives the bits of the serial schedule stepped by hand one update behind, with a
// finish() between steps applying the update in flight at once and a skipped step adding none.
// Exact equality, no tolerance: the kernels are deterministic, the copies move bytes, and
// CpuAdamW's math is the CUDA kernel's to the bit (optim/cpu_adamw.h).
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "optim/adamw_optimizer.h"
#include "optim/host_optimizer.h"
#include "optim/optimizer_gpu_test_util.h"

namespace lathe {
namespace {

using namespace optim_gpu_test;

constexpr float kMaxNorm = 0.05f;
constexpr size_t kFrozen = 3;  // an entry of layer 0

class HostOptimizerGpu : public CudaSuite {
protected:
    static Model make_model(bool masters_on_host, double fraction = 1.0) {
        return make_llama(state_->context(), 3, masters_on_host, fraction);
    }

    static std::vector<uint8_t> bytes(ConstTensorView v) { return device_bytes(v, *state_); }
    template <typename T>
    static std::vector<uint8_t> bytes(const std::vector<T>& v) {
        std::vector<uint8_t> out(v.size() * sizeof(T));
        std::memcpy(out.data(), v.data(), out.size());
        return out;
    }

    // What a run leaves: per micro-batch losses, per step norms, the masters, the compute copy,
    // both moments.
    struct Run {
        std::vector<float> losses, norms;
        std::vector<uint8_t> masters, compute, m, v;
    };

    // Every field of the two runs the same, bit for bit.
    static void expect_same(const Run& got, const Run& want) {
        EXPECT_EQ(got.losses, want.losses);
        EXPECT_EQ(got.norms, want.norms);
        EXPECT_EQ(got.masters, want.masters);
        EXPECT_EQ(got.compute, want.compute);
        EXPECT_EQ(got.m, want.m);
        EXPECT_EQ(got.v, want.v);
    }

    // TrainStep's sequence (run/train_step.h): two micro-batches with dloss 1/2, the gradient
    // copies armed before the last, the frozen entry's gradient zeroed, the norm read back.
    // `host` null: the device optimizer `dev`. finish_first false: the entry write between
    // steps comes without host->finish() (Model's host-masters hook finishes the step and
    // mirrors the device part first).
    static Run train(Model& model, HostOptimizer* host, AdamWOptimizer* dev, int steps,
                     bool finish_first = true) {
        Run r;
        const AdamWHyper hyper{0.9, 0.95, 1e-8};
        for (int step = 1; step <= steps; ++step) {
            if (host) host->before_zero_grads();
            model.zero_grads();
            for (int k = 0; k < 2; ++k) {
                const SaltedBatch b = salted_batch(2 * step + k);
                if (host && k == 1) host->arm_gradient_copies();
                r.losses.push_back(model.forward_backward(b.batch(), 0.5f));
            }
            model.zero_grad_entry(kFrozen);
            r.norms.push_back(model.grad_norm());
            std::vector<AdamWSegment> segments = model.adamw_segments(1e-2, 0.1);
            segments.erase(segments.begin() + std::ptrdiff_t(kFrozen));
            if (host)
                host->step(model, segments, hyper, step, r.norms.back(), kMaxNorm);
            else
                dev->step(optimizer_target(model), segments, hyper, step, kMaxNorm);
            if (step == 2) {
                // The first entry (the embeddings: the GPU part below fraction 1) halved between
                // steps, read and written as a checkpoint load does.
                if (host && finish_first) host->finish();
                const size_t e0 = model.params().entries()[0].arena_index;
                HostTensor w(DType::kF32, model.plan().params.entries()[e0].shape);
                model.read_param_entry(e0, w.view());
                for (int64_t i = 0; i < w.view().numel(); ++i) w.view().as<float>()[i] *= 0.5f;
                model.write_param_entry(e0, w.view());
            }
        }
        if (host) host->finish();
        model.synchronize();
        const size_t n = size_t(model.params_total());
        std::vector<float> m(n), v(n);
        if (host) {
            r.masters = bytes(std::vector<float>(host->masters().begin(), host->masters().end()));
            host->read_state(m, v);
        } else {
            r.masters = bytes(model.params_flat());
            dev->read_state(m, v);
        }
        r.compute = bytes(model.params_compute_flat());
        r.m = bytes(m);
        r.v = bytes(v);
        return r;
    }

    // The gradient arena's bytes, and the arena rewritten with `bytes`, on the model's stream.
    static void write_grads(Model& model, const std::vector<uint8_t>& b) {
        const TensorView g = model.grads_flat();
        cuda_copy_sync(TensorView(g.data(), DType::kU8, Shape{int64_t(g.bytes())}, Device::kCuda),
                       ConstTensorView(b.data(), DType::kU8, Shape{int64_t(b.size())}),
                       state_->stream());
    }

    // The steps of train() with the update of step s applied after step s + 1's gradients
    // (the delayed schedule), by `host` (delayed) or by hand over a serial `host`: its own
    // gradients put back into the arena for it. drain_after: finish() after that step, which
    // applies the update in flight at once; skip_at: a step whose gradients are dropped without
    // an update (the trainer's skip of a non-finite step). No entry write, no device part.
    static Run train_delayed(Model& model, HostOptimizer& host, int steps, int drain_after,
                             int skip_at) {
        Run r;
        const AdamWHyper hyper{0.9, 0.95, 1e-8};
        const bool by_hand = host.schedule() == OffloadSchedule::kSerial;
        std::vector<uint8_t> pending;
        int pending_step = 0;
        float pending_norm = 0.0f;
        auto segments = [&] {
            std::vector<AdamWSegment> s = model.adamw_segments(1e-2, 0.1);
            s.erase(s.begin() + std::ptrdiff_t(kFrozen));
            return s;
        };
        auto apply_pending = [&] {
            if (pending_step == 0) return;
            const std::vector<uint8_t> now = bytes(model.grads_flat());
            write_grads(model, pending);
            host.step(model, segments(), hyper, pending_step, pending_norm, kMaxNorm);
            write_grads(model, now);
            pending_step = 0;
        };
        for (int step = 1; step <= steps; ++step) {
            host.before_zero_grads();
            model.zero_grads();
            for (int k = 0; k < 2; ++k) {
                const SaltedBatch b = salted_batch(2 * step + k);
                if (k == 1) host.arm_gradient_copies();
                r.losses.push_back(model.forward_backward(b.batch(), 0.5f));
            }
            model.zero_grad_entry(kFrozen);
            r.norms.push_back(model.grad_norm());
            if (by_hand) {
                apply_pending();
                if (step == skip_at) continue;
                pending = bytes(model.grads_flat());
                pending_step = step;
                pending_norm = r.norms.back();
                if (step == drain_after) apply_pending();
            } else if (step != skip_at) {
                host.step(model, segments(), hyper, step, r.norms.back(), kMaxNorm);
                if (step == drain_after) host.finish();
            }
        }
        if (by_hand) apply_pending();
        host.finish();
        model.synchronize();
        const size_t n = size_t(model.params_total());
        std::vector<float> m(n), v(n);
        r.masters = bytes(std::vector<float>(host.masters().begin(), host.masters().end()));
        host.read_state(m, v);
        r.compute = bytes(model.params_compute_flat());
        r.m = bytes(m);
        r.v = bytes(v);
        return r;
    }
};

TEST_F(HostOptimizerGpu, DelayedScheduleStepsOneUpdateBehind) {
    for (const auto [drain_after, skip_at] : {std::pair{0, 0}, {2, 0}, {0, 3}}) {
        SCOPED_TRACE(drain_after);
        SCOPED_TRACE(skip_at);
        Model a = make_model(true), b = make_model(true);
        Result<HostOptimizer> by_hand =
            HostOptimizer::create_for(a, AdamWStateDType::kF32, 0, OffloadSchedule::kSerial);
        Result<HostOptimizer> delayed =
            HostOptimizer::create_for(b, AdamWStateDType::kF32, 0, OffloadSchedule::kDelayed);
        ASSERT_TRUE(by_hand.ok()) << by_hand.status().to_string();
        ASSERT_TRUE(delayed.ok()) << delayed.status().to_string();
        a.init(5);
        b.init(5);
        const Run want = train_delayed(a, *by_hand, 5, drain_after, skip_at);
        const Run got = train_delayed(b, *delayed, 5, drain_after, skip_at);
        for (const float n : want.norms) EXPECT_GT(n, kMaxNorm);  // the clip is exercised
        expect_same(got, want);
        // Step 2 computes with the initial weights, as step 1 did.
        Model c = make_model(true);
        Result<HostOptimizer> serial =
            HostOptimizer::create_for(c, AdamWStateDType::kF32, 0, OffloadSchedule::kSerial);
        ASSERT_TRUE(serial.ok()) << serial.status().to_string();
        c.init(5);
        const Run plain = train(c, &*serial, nullptr, 2);
        EXPECT_EQ(plain.losses[0], got.losses[0]);
        EXPECT_NE(plain.losses[2], got.losses[2]);
    }
}

TEST_F(HostOptimizerGpu, SchedulesGiveTheDeviceOptimizersBits) {
    Model d = make_model(false);
    d.init(5);
    Result<AdamWOptimizer> dev = AdamWOptimizer::create_for(d);
    ASSERT_TRUE(dev.ok()) << dev.status().to_string();
    ASSERT_EQ(d.params().entries()[kFrozen].layer, 0);
    const Run want = train(d, nullptr, &*dev, 4);
    for (const float n : want.norms) EXPECT_GT(n, kMaxNorm);  // the clip is exercised
    for (const double fraction : {1.0, 0.6, 0.2, 1e-6})
        for (const OffloadSchedule schedule :
             {OffloadSchedule::kSerial, OffloadSchedule::kOverlapped})
            for (const bool finish_first : {true, false}) {
                SCOPED_TRACE(offload_schedule_name(schedule));
                SCOPED_TRACE(fraction);
                SCOPED_TRACE(finish_first ? "finish before the entry write" : "entry write alone");
                Model h = make_model(true, fraction);
                EXPECT_EQ(h.plan().offload_begin == 0, fraction == 1.0);
                Result<HostOptimizer> host =
                    HostOptimizer::create_for(h, AdamWStateDType::kF32, 0, schedule);
                ASSERT_TRUE(host.ok()) << host.status().to_string();
                h.init(5);  // after create_for: init writes the host masters and the compute copy
                const Run got = train(h, &*host, nullptr, 4, finish_first);
                expect_same(got, want);
            }
}

}  // namespace
}  // namespace lathe
