#include "optim/adamw_optimizer.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {

FlatRange flat_shard(int64_t total, int rank, int world) {
    LATHE_CHECK(world >= 1 && rank >= 0 && rank < world && total >= 0,
                "shard {} of {} over {} elements", rank, world, total);
    const int64_t base = total / world, extra = total % world;
    const int64_t begin = int64_t(rank) * base + std::min<int64_t>(rank, extra);
    return FlatRange{begin, begin + base + (rank < extra ? 1 : 0)};
}

OptimizerTarget optimizer_target(const Model& model) {
    LATHE_CHECK(model.training(), "optimizer_target of a model created without gradients");
    OptimizerTarget t;
    t.params = model.params_flat();
    t.params_bf16 = model.params_compute_flat();
    if (model.plan().shape.gradient_shards > 1) {
        t.grads = model.gradient_arena_entry(model.plan().grad_shard);
        t.grads_of_ranges = true;
        t.params_of_ranges = model.params_sharded();
    } else {
        t.grads = model.grads_flat();
    }
    t.grad_norm = model.grad_norm_value();
    return t;
}

Result<AdamWOptimizer> AdamWOptimizer::create(int64_t total, FlatRange range, const Context& ctx) {
    return create(total, std::vector<FlatRange>{range}, ctx);
}

Result<AdamWOptimizer> AdamWOptimizer::create(int64_t total, std::vector<FlatRange> ranges,
                                              const Context& ctx) {
    int64_t at = 0, n = 0;
    for (const FlatRange& r : ranges) {
        if (total < 0 || r.begin < at || r.end < r.begin || r.end > total)
            return invalid_argument_error(
                "optimizer range [{}, {}) is not inside the {} elements of the parameters, after "
                "the ranges before it",
                r.begin, r.end, total);
        at = r.end;
        n += r.size();
    }
    AdamWOptimizer opt;
    opt.total_ = total;
    opt.ranges_ = std::move(ranges);
    opt.numel_ = n;
    opt.ctx_ = ctx;
    ArenaLayout layout;
    LATHE_RETURN_IF_ERROR(layout.add("exp_avg", DType::kF32, Shape{n}).status());
    LATHE_RETURN_IF_ERROR(layout.add("exp_avg_sq", DType::kF32, Shape{n}).status());
    LATHE_ASSIGN_OR_RETURN(opt.moments_, ModelArena::allocate(std::move(layout), ctx));
    return opt;
}

FlatRange AdamWOptimizer::range() const {
    LATHE_CHECK(ranges_.size() == 1, "range() of an optimizer over {} ranges", ranges_.size());
    return ranges_[0];
}

Result<AdamWOptimizer> AdamWOptimizer::create_for(const Model& model, FlatRange range,
                                                  const Context& ctx) {
    return create_for(model, std::vector<FlatRange>{range}, ctx);
}

Result<AdamWOptimizer> AdamWOptimizer::create_for(const Model& model, std::vector<FlatRange> ranges,
                                                  const Context& ctx) {
    if (!model.training())
        return failed_precondition_error(
            "an optimizer needs a model created for training (ModelShape::training); this one "
            "has no gradients");
    if (ctx.backend != model.context().backend)
        return unimplemented_error(
            "an optimizer on {} over a model on {} needs its gradients and weights copied between "
            "the two, which lathe does not do; create it on the model's device",
            backend_name(ctx.backend), backend_name(model.context().backend));
    return create(model.params_total(), std::move(ranges), ctx);
}

Result<AdamWOptimizer> AdamWOptimizer::create_for(const Model& model) {
    return create_for(model, FlatRange{0, model.params_total()}, model.context());
}

void AdamWOptimizer::step(const OptimizerTarget& target, std::span<const AdamWSegment> segments,
                          const AdamWHyper& hyper, int64_t step, float max_grad_norm) {
    const Device where = ctx_.memory();
    const int64_t params_numel = target.params_of_ranges ? numel_ : total_;
    LATHE_CHECK(target.params.numel() == params_numel &&
                    target.grads.numel() == (target.grads_of_ranges ? numel_ : total_) &&
                    target.params.device() == where && target.grads.device() == where,
                "optimizer over {} elements on {}: params {}, grads {}", total_,
                backend_name(ctx_.backend), target.params.to_string(), target.grads.to_string());
    LATHE_CHECK(target.params_bf16.is_null() || (target.params_bf16.numel() == params_numel &&
                                                 target.params_bf16.device() == where),
                "optimizer over {} elements: bf16 copy {}", total_, target.params_bf16.to_string());
    const ConstTensorView clip = max_grad_norm > 0.0f ? target.grad_norm : ConstTensorView();
    int64_t at = 0;  // the range's first element in the moments
    for (const FlatRange& range : ranges_) {
        local_.clear();
        for (const AdamWSegment& s : segments) {
            const int64_t lo = std::max(s.offset, range.begin);
            const int64_t hi = std::min(s.offset + s.count, range.end);
            if (hi > lo)
                local_.push_back(AdamWSegment{lo - range.begin, hi - lo, s.lr, s.weight_decay});
        }
        // Where the range lies in the parameter views: at its moments' offset when they hold
        // the ranges alone.
        const int64_t b = target.params_of_ranges ? at : range.begin, e = b + range.size();
        if (!local_.empty())
            adamw_update_with_copy(
                target.params.slice(b, e),
                target.params_bf16.is_null() ? TensorView() : target.params_bf16.slice(b, e),
                exp_avg().slice(at, at + range.size()), exp_avg_sq().slice(at, at + range.size()),
                target.grads_of_ranges ? target.grads.slice(at, at + range.size())
                                       : target.grads.slice(b, e),
                local_, hyper, step, clip, max_grad_norm, ctx_);
        at += range.size();
    }
}

void AdamWOptimizer::read_state(std::span<float> m, std::span<float> v) const {
    const int64_t n = numel_;
    LATHE_CHECK(int64_t(m.size()) == n && int64_t(v.size()) == n, "moments of {} / {} for {}",
                m.size(), v.size(), n);
    const std::pair<TensorView, float*> pairs[] = {{exp_avg(), m.data()}, {exp_avg_sq(), v.data()}};
    for (const auto& [src, dst] : pairs) {
        const TensorView host(dst, DType::kF32, Shape{n});
        if (ctx_.backend == Backend::kCpu) {
            if (n > 0) std::memcpy(dst, src.data(), host.bytes());
            continue;
        }
        cuda_copy_sync(host, src, ctx_.stream);
    }
}

void AdamWOptimizer::write_state(std::span<const float> m, std::span<const float> v) {
    const int64_t n = numel_;
    LATHE_CHECK(int64_t(m.size()) == n && int64_t(v.size()) == n, "moments of {} / {} for {}",
                m.size(), v.size(), n);
    const std::pair<TensorView, const float*> pairs[] = {{exp_avg(), m.data()},
                                                         {exp_avg_sq(), v.data()}};
    for (const auto& [dst, src] : pairs) {
        const ConstTensorView host(src, DType::kF32, Shape{n});
        if (ctx_.backend == Backend::kCpu) {
            if (n > 0) std::memcpy(dst.data(), src, host.bytes());
            continue;
        }
        cuda_copy_sync(dst, host, ctx_.stream);
    }
}

}  // namespace lathe
