#pragma once
// The optimizer schedules' training run shared by the CPU test (train_step_test.cpp) and the GPU
// test (train_step_gpu_test.cu): TrainStep over a model and its device AdamWOptimizer, serial or
// overlapped (optim/adamw_optimizer.h), through what a training run does between the steps, so
// that the two schedules can be compared bit for bit. Test code only.

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"
#include "model/model.h"
#include "ops/cuda/cuda_state.h"
#include "optim/adamw_optimizer.h"
#include "run/train_step.h"

namespace lathe::schedule_test {

// What the run does, step by step (steps count from 1).
struct RunPlan {
    int steps = 6;
    int64_t K = 2;          // micro-batches per step (gradient accumulation)
    float max_norm = 0.0f;  // optimizer.gradient_clipping; 0: off
    size_t frozen = 3;      // a parameter entry kept out of the update (train.freeze)
    int skip_at = 2;        // this step's gradients are computed but not applied (the trainer's
                            // skip policy), so the next step zeroes the gradients itself
    int eval_at = 3;        // after this step's update: a validation forward (eval_forward)
    int save_at = 4;        // after this step's update (and the eval): a checkpoint, and the run
                            // goes on in a fresh model and optimizer loaded from it
    int64_t B = 2, T = 8, V = 64;  // the batches' shape and token range
    int optimizer_sms = 0;         // overlapped: optimizer.overlap_sms (overlap_with)
};

// What a run leaves: every micro-batch's loss as TrainStep averaged it (per step), the norms,
// the validation losses, the f32 masters of every entry, the compute copy's bytes (CUDA), both
// moments.
struct RunResult {
    std::vector<float> losses, norms, evals;
    std::vector<float> params, m, v;
    std::vector<uint8_t> compute;
};

// Deterministic token ids in [0, V), shape (B, T), varied by `salt`.
inline HostTensor tokens(const RunPlan& p, int salt) {
    HostTensor t(DType::kI32, Shape{p.B, p.T});
    for (int64_t i = 0; i < p.B * p.T; ++i)
        t.as<int32_t>()[i] = int32_t((i * 7919 + int64_t(salt) * 104729) % p.V);
    return t;
}

// Every parameter entry's f32 values, in entry order, concatenated.
inline std::vector<float> read_params(const Model& model) {
    std::vector<float> out;
    for (const ParamEntry& e : model.params().entries()) {
        const ArenaEntry& ae = model.plan().params.entries()[e.arena_index];
        HostTensor h(DType::kF32, ae.shape);
        model.read_param_entry(e.arena_index, h.view());
        out.insert(out.end(), h.view().as<float>(), h.view().as<float>() + ae.shape.numel());
    }
    return out;
}

inline void write_params(Model& model, const std::vector<float>& values) {
    size_t at = 0;
    for (const ParamEntry& e : model.params().entries()) {
        const ArenaEntry& ae = model.plan().params.entries()[e.arena_index];
        HostTensor h(DType::kF32, ae.shape);
        std::memcpy(h.view().data(), values.data() + at, size_t(ae.shape.numel()) * sizeof(float));
        model.write_param_entry(e.arena_index, h.view());
        at += size_t(ae.shape.numel());
    }
}

// The run of `plan` with `schedule`. `make(seed)`: a model initialized from `seed` (the resumed
// model is made with another seed, so that only the checkpoint's values can make it match).
// `before_apply`, when given, is called just before each update (the GPU test delays the
// optimizer stream there, so that a read of the weights that does not wait for the update sees
// the old ones); `after_apply` just after it.
inline RunResult run(const RunPlan& plan, OptimizerSchedule schedule,
                     const std::function<Model(uint64_t seed)>& make,
                     const std::function<void()>& before_apply = nullptr,
                     const std::function<void()>& after_apply = nullptr) {
    RunResult r;
    std::optional<Model> model;
    std::optional<AdamWOptimizer> opt;
    std::optional<TrainStep> step;
    auto start = [&](uint64_t seed) {
        model.emplace(make(seed));
        Result<AdamWOptimizer> made = AdamWOptimizer::create_for(*model);
        LATHE_CHECK(made.ok(), "{}", made.status().to_string());
        opt.emplace(std::move(*made));
        if (schedule == OptimizerSchedule::kOverlapped) {
            const Status st = opt->overlap_with(*model, plan.optimizer_sms);
            LATHE_CHECK(st.ok(), "{}", st.to_string());
        }
        std::vector<char> frozen(model->params().entries().size(), 0);
        frozen[plan.frozen] = 1;
        step.emplace(*model, *opt, frozen);
    };
    start(1);
    const AdamWHyper hyper{0.9, 0.95, 1e-8};
    int64_t adam_step = 0;
    std::vector<HostTensor> tok, tgt;
    for (int s = 1; s <= plan.steps; ++s) {
        tok.clear();
        tgt.clear();
        for (int64_t k = 0; k < plan.K; ++k) {
            tok.push_back(tokens(plan, int(s * 10 + k)));
            tgt.push_back(tokens(plan, int(s * 10 + k + 5)));
        }
        Result<TrainStepValues> v = step->gradients(plan.K, [&](int64_t k) -> Result<ModelBatch> {
            return ModelBatch{tok[size_t(k)].view(), tgt[size_t(k)].view(), {}, {}};
        });
        LATHE_CHECK(v.ok(), "{}", v.status().to_string());
        r.losses.push_back(v->loss);
        r.norms.push_back(v->norm);
        if (s == plan.skip_at) continue;
        if (before_apply) before_apply();
        const Status applied = step->apply(1e-2, 0.1, hyper, ++adam_step, plan.max_norm);
        LATHE_CHECK(applied.ok(), "{}", applied.to_string());
        if (after_apply) after_apply();
        if (s == plan.eval_at)
            r.evals.push_back(
                model->eval_forward(ModelBatch{tok[0].view(), tgt[0].view(), {}, {}}));
        if (s == plan.save_at) {
            // The checkpoint (run/trainer.cpp): pending units first, then weights and moments.
            opt->finish();
            const std::vector<float> params = read_params(*model);
            const size_t n = size_t(opt->numel());
            std::vector<float> m(n), mv(n);
            opt->read_state(m, mv);
            step.reset();
            opt.reset();
            model.reset();
            start(99);
            write_params(*model, params);
            opt->write_state(m, mv);
        }
    }
    opt->finish();
    r.params = read_params(*model);
    const size_t n = size_t(opt->numel());
    r.m.resize(n);
    r.v.resize(n);
    opt->read_state(r.m, r.v);
    if (model->context().backend == Backend::kCuda) {
        const TensorView c = model->params_compute_flat();
        r.compute.resize(c.bytes());
        cuda_copy_sync(
            TensorView(r.compute.data(), DType::kU8, Shape{int64_t(c.bytes())}),
            ConstTensorView(c.data(), DType::kU8, Shape{int64_t(c.bytes())}, Device::kCuda),
            model->context().stream);
    }
    return r;
}

}  // namespace lathe::schedule_test
