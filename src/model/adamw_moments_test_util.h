#pragma once
// Test helper for the model's tests: AdamW moments beside a model, stepped with the op
// (ops/adamw.h) over the model's flat views, as optim/'s AdamWOptimizer steps a model over its
// whole parameter vector. The model layer's tests stay below optim/; optim/'s own tests check
// that the optimizer leaves the same bits as this.

#include <cstdint>
#include <span>

#include "core/check.h"
#include "model/model.h"
#include "ops/adamw.h"

namespace lathe {

struct TestAdamWMoments {
    ModelArena exp_avg, exp_avg_sq;

    // Zeroed moments with the model's parameter layout, where the model computes.
    static TestAdamWMoments of(const Model& model) {
        TestAdamWMoments t;
        Result<ModelArena> m = ModelArena::allocate(model.plan().params, model.context());
        Result<ModelArena> v = ModelArena::allocate(model.plan().params, model.context());
        LATHE_CHECK(m.ok() && v.ok(), "{} {}", m.status().to_string(), v.status().to_string());
        t.exp_avg = std::move(*m);
        t.exp_avg_sq = std::move(*v);
        return t;
    }

    // One update of `model` (its bf16 compute copy on CUDA too), clipped by the norm of its last
    // grad_norm() when max_grad_norm > 0.
    void step(Model& model, std::span<const AdamWSegment> segments, const AdamWHyper& hyper,
              int64_t step, float max_grad_norm = 0.0f) {
        adamw_update_with_copy(model.params_flat(), model.params_compute_flat(), exp_avg.flat_f32(),
                               exp_avg_sq.flat_f32(), model.grads_flat(), segments, hyper, step,
                               max_grad_norm > 0.0f ? model.grad_norm_value() : ConstTensorView(),
                               max_grad_norm, model.context());
    }
};

}  // namespace lathe
