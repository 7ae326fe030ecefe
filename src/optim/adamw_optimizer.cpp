#include "optim/adamw_optimizer.h"

#include <algorithm>
#include <optional>

#include "core/check.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {

const char* optimizer_schedule_name(OptimizerSchedule s) {
    return s == OptimizerSchedule::kSerial ? "serial" : "overlapped";
}

void adamw_segments_by_unit(std::span<const FlatRange> units,
                            std::span<const AdamWSegment> segments,
                            std::vector<std::vector<AdamWSegment>>& out, int64_t offset) {
    LATHE_CHECK(!units.empty() || segments.empty(), "{} segments over no unit", segments.size());
    out.resize(units.size());
    for (auto& s : out) s.clear();
    size_t u = 0;
    for (const AdamWSegment& g : segments) {
        const int64_t at = g.offset + offset;
        while (u + 1 < units.size() && at >= units[u].end) ++u;
        while (u > 0 && at < units[u].begin) --u;
        LATHE_CHECK(at >= units[u].begin && at + g.count <= units[u].end,
                    "segment [{}, {}) outside the arena's units", at, at + g.count);
        out[u].push_back(g);
    }
}

// The overlapped schedule (header). Lives on the heap: the model's hook holds its address.
struct AdamWOptimizer::Overlap {
    Model* model = nullptr;
    std::vector<FlatRange> units;  // ShardLayout's arena units: forward order
    std::vector<std::vector<AdamWSegment>> unit_segments;
    // The posted update: its target, scalars, and (CPU) the units already run.
    OptimizerTarget target;
    TensorView grads;  // the model's gradients, zeroed unit by unit after the update
    TensorView m, v;
    AdamWHyper hyper;
    int64_t step = 0;
    float max_grad_norm = 0.0f;
    bool pending = false;
    std::vector<char> done;
    // CUDA: the optimizer stream's context, each unit's event (its weights updated) and the
    // event of the last gradient zeroing.
    bool cuda = false;
    Context stream_ctx;
    std::vector<CudaEvent> unit_done;
    std::optional<CudaEvent> grads_zeroed;
    // CUDA: the SMs the compute stream's GEMMs leave to the pending update (optimizer.overlap_sms,
    // 0: none). The state's GEMM target is set for them at each update and back to all SMs here
    // (setting it again is harmless: nothing else sets it beside an overlapped optimizer).
    int optimizer_sms = 0;

    void release_sms() {
        if (optimizer_sms > 0)
            cuda_state_of(model->context(), "adamw optimizer").set_gemm_sm_target(0);
    }

    // Unit u's update, on the optimizer stream (CUDA) or at once on the calling thread (CPU).
    void update_unit(size_t u) {
        if (unit_segments[u].empty()) return;
        const ConstTensorView clip = max_grad_norm > 0.0f ? target.grad_norm : ConstTensorView();
        adamw_update_with_copy(target.params, target.params_bf16, m, v, target.grads,
                               unit_segments[u], hyper, step, clip, max_grad_norm, stream_ctx);
    }
    // Unit u's gradients zeroed (after its update read them), as update_unit.
    void zero_unit_grads(size_t u) {
        const FlatRange r = units[u];
        if (r.size() == 0) return;
        const TensorView g = grads.slice(r.begin, r.end);
        if (cuda)
            cuda_fill_bytes(g, 0, stream_ctx.stream);
        else
            std::memset(g.data(), 0, g.bytes());
    }
    // CPU: unit u's update and zeroing, once per posted update.
    void run_unit(size_t u) {
        if (done[u]) return;
        update_unit(u);
        zero_unit_grads(u);
        done[u] = 1;
    }
    // The unit of a weights-needed hook's piece.
    size_t unit_of(int piece) const {
        return piece == Model::kInputWeights    ? ShardLayout::kFront
               : piece == Model::kOutputWeights ? units.size() - 1
                                                : size_t(piece) + 1;
    }
    // The forward's hook: unit u's weights first. The gradients are zeroed after every unit's
    // update on the optimizer stream (the forward's first units wait for the updates alone);
    // the back unit's piece, before the LM head whose fused backward writes the first
    // gradients, also waits for the zeroing.
    void on_weights_needed(int piece) {
        if (!pending) return;
        const size_t u = unit_of(piece);
        if (!cuda) {
            run_unit(u);
            return;
        }
        CUstream_st* compute = model->context().stream;
        unit_done[u].wait(compute);
        if (piece == Model::kOutputWeights) {
            grads_zeroed->wait(compute);
            release_sms();  // every unit is updated before what follows runs
        }
    }
    void finish() {
        if (!pending) return;
        if (cuda) {
            CudaState& st = cuda_state_of(model->context(), "adamw optimizer");
            st.wait_for(st.stream(), st.optimizer_stream());
            release_sms();
        } else {
            for (size_t u = 0; u < units.size(); ++u) run_unit(u);
        }
        pending = false;
    }
};

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
                                              const Context& ctx, AdamWStateDType state) {
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
    const DType dtype = state == AdamWStateDType::kBF16 ? DType::kBF16 : DType::kF32;
    ArenaLayout layout;
    LATHE_RETURN_IF_ERROR(layout.add("exp_avg", dtype, Shape{n}).status());
    LATHE_RETURN_IF_ERROR(layout.add("exp_avg_sq", dtype, Shape{n}).status());
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
                                                  const Context& ctx, AdamWStateDType state) {
    if (!model.training())
        return failed_precondition_error(
            "an optimizer needs a model created for training (ModelShape::training); this one "
            "has no gradients");
    if (ctx.backend != model.context().backend)
        return unimplemented_error(
            "an optimizer on {} over a model on {} needs its gradients and weights copied between "
            "the two, which lathe does not do; create it on the model's device",
            backend_name(ctx.backend), backend_name(model.context().backend));
    return create(model.params_total(), std::move(ranges), ctx, state);
}

Result<AdamWOptimizer> AdamWOptimizer::create_for(const Model& model) {
    return create_for(model, FlatRange{0, model.params_total()}, model.context());
}

AdamWOptimizer::AdamWOptimizer(AdamWOptimizer&&) noexcept = default;

AdamWOptimizer& AdamWOptimizer::operator=(AdamWOptimizer&& other) noexcept {
    if (this != &other) {
        if (overlap_) {
            overlap_->finish();
            overlap_->model->set_weights_needed_hook({});
        }
        total_ = other.total_;
        ranges_ = std::move(other.ranges_);
        numel_ = other.numel_;
        ctx_ = other.ctx_;
        moments_ = std::move(other.moments_);
        local_ = std::move(other.local_);
        overlap_ = std::move(other.overlap_);
    }
    return *this;
}

AdamWOptimizer::~AdamWOptimizer() {
    if (!overlap_) return;
    overlap_->finish();
    overlap_->model->set_weights_needed_hook({});
}

Status AdamWOptimizer::overlap_with(Model& model, int optimizer_sms) {
    if (overlap_)
        return failed_precondition_error("optimizer.schedule: the optimizer already overlaps");
    if (optimizer_sms < 0 || optimizer_sms > kMaxOptimizerSms)
        return invalid_argument_error("optimizer.overlap_sms is {}; choose 0 to {}", optimizer_sms,
                                      kMaxOptimizerSms);
    if (optimizer_sms > 0 && ctx_.backend == Backend::kCuda) {
        const int sms = cuda_state_of(ctx_, "adamw optimizer").sm_count();
        if (optimizer_sms >= sms)
            return invalid_argument_error(
                "optimizer.overlap_sms {} leaves no SM of the device's {} to the GEMMs; choose "
                "fewer (0: none reserved)",
                optimizer_sms, sms);
    }
    if (!model.training())
        return failed_precondition_error(
            "optimizer.schedule: overlapped needs a model created for training");
    if (ranges_.size() != 1 || ranges_[0].begin != 0 || ranges_[0].end != total_ ||
        total_ != model.params_total())
        return failed_precondition_error(
            "optimizer.schedule: overlapped steps the whole parameter vector of one process; this "
            "optimizer owns {} range(s) of {} elements (data parallel keeps the serial schedule: "
            "set optimizer.schedule: serial)",
            ranges_.size(), total_);
    if (model.plan().shape.gradient_shards > 1 || model.params_sharded() ||
        model.plan().shape.masters_on_host)
        return failed_precondition_error(
            "optimizer.schedule: overlapped needs the model's own unsharded masters and "
            "gradients (ZeRO-2/3 and optimizer.offload keep their own schedules: set "
            "optimizer.schedule: serial)");
    if (model.has_weights_needed_hook())
        return failed_precondition_error(
            "optimizer.schedule: overlapped needs the model's weights-needed hook, which another "
            "component holds (data parallel, optimizer offload): set optimizer.schedule: serial");
    if (ctx_.backend != model.context().backend || ctx_.stream != model.context().stream)
        return failed_precondition_error(
            "optimizer.schedule: overlapped needs the optimizer on the model's context");
    auto o = std::make_unique<Overlap>();
    o->model = &model;
    o->units = model.plan().shards.arena;
    LATHE_CHECK(o->units.size() == size_t(model.config().num_layers) + 2, "{} units for {} layers",
                o->units.size(), model.config().num_layers);
    for (size_t u = 0; u < o->units.size(); ++u)
        LATHE_CHECK(
            o->units[u].begin == (u == 0 ? 0 : o->units[u - 1].end) && o->units[u].end <= total_,
            "unit {} [{}, {}) does not follow the one before inside the {} parameters", u,
            o->units[u].begin, o->units[u].end, total_);
    o->cuda = ctx_.backend == Backend::kCuda;
    o->stream_ctx = ctx_;
    if (o->cuda) {
        o->stream_ctx.stream = cuda_state_of(ctx_, "adamw optimizer").optimizer_stream();
        o->unit_done.resize(o->units.size());
        o->grads_zeroed.emplace();
        o->optimizer_sms = optimizer_sms;
    }
    Overlap* p = o.get();
    model.set_weights_needed_hook([p](int piece) { p->on_weights_needed(piece); });
    overlap_ = std::move(o);
    return ok_status();
}

void AdamWOptimizer::finish() {
    if (overlap_) overlap_->finish();
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
    if (overlap_) {
        step_overlapped(target, segments, hyper, step, max_grad_norm);
        return;
    }
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

void AdamWOptimizer::step_overlapped(const OptimizerTarget& target,
                                     std::span<const AdamWSegment> segments,
                                     const AdamWHyper& hyper, int64_t step, float max_grad_norm) {
    Overlap& o = *overlap_;
    const TensorView grads = o.model->grads_flat();
    LATHE_CHECK(!target.grads_of_ranges && !target.params_of_ranges &&
                    target.grads.data() == grads.data() &&
                    target.params.data() == o.model->params_flat().data(),
                "overlapped optimizer: the target is not optimizer_target of its model");
    // CPU: the units a forward has not needed yet run before the next update is posted.
    o.finish();
    o.target = target;
    o.grads = grads;
    o.m = exp_avg();
    o.v = exp_avg_sq();
    o.hyper = hyper;
    o.step = step;
    o.max_grad_norm = max_grad_norm;
    adamw_segments_by_unit(o.units, segments, o.unit_segments);
    o.pending = true;
    if (!o.cuda) {
        o.done.assign(o.units.size(), 0);
        return;
    }
    // After the backward, the norm and every read of the weights enqueued so far.
    CudaState& st = cuda_state_of(ctx_, "adamw optimizer");
    st.wait_for(st.optimizer_stream(), st.stream());
    for (size_t u = 0; u < o.units.size(); ++u) {
        o.update_unit(u);
        o.unit_done[u].record(st.optimizer_stream());
    }
    // The gradients cleared for the next step after every unit's update read them: by the
    // model, which leaves the matrices its next backward writes (=) uncleared, or unit by unit.
    if (!o.model->clear_grads_for_next_backward(st.optimizer_stream()))
        for (size_t u = 0; u < o.units.size(); ++u) o.zero_unit_grads(u);
    o.grads_zeroed->record(st.optimizer_stream());
    // The GEMMs enqueued from here until the forward reaches the LM head's weights (every unit
    // updated by then, on_weights_needed) plan for the SMs the update leaves.
    if (o.optimizer_sms > 0) st.set_gemm_sm_target(st.sm_count() - o.optimizer_sms);
}

void AdamWOptimizer::read_state(std::span<float> m, std::span<float> v) const {
    if (overlap_) overlap_->finish();
    const int64_t n = numel_;
    LATHE_CHECK(int64_t(m.size()) == n && int64_t(v.size()) == n, "moments of {} / {} for {}",
                m.size(), v.size(), n);
    if (n == 0) return;
    // tensor_convert copies f32 as it is and widens bf16 exactly; CUDA moments come to the host
    // first (bf16 through a host copy of their own dtype).
    const std::pair<TensorView, float*> pairs[] = {{exp_avg(), m.data()}, {exp_avg_sq(), v.data()}};
    for (const auto& [src, dst] : pairs) {
        const TensorView host(dst, DType::kF32, Shape{n});
        if (ctx_.backend == Backend::kCpu) {
            tensor_convert(host, src);
        } else if (src.dtype() == DType::kF32) {
            cuda_copy_sync(host, src, ctx_.stream);
        } else {
            HostTensor raw(src.dtype(), src.shape());
            cuda_copy_sync(raw.view(), src, ctx_.stream);
            tensor_convert(host, raw.view());
        }
    }
}

void AdamWOptimizer::write_state(std::span<const float> m, std::span<const float> v) {
    if (overlap_) overlap_->finish();
    const int64_t n = numel_;
    LATHE_CHECK(int64_t(m.size()) == n && int64_t(v.size()) == n, "moments of {} / {} for {}",
                m.size(), v.size(), n);
    if (n == 0) return;
    // tensor_convert copies f32 as it is and rounds into bf16 to nearest even; CUDA moments are
    // written from the host (bf16 through a host copy of their own dtype).
    const std::pair<TensorView, const float*> pairs[] = {{exp_avg(), m.data()},
                                                         {exp_avg_sq(), v.data()}};
    for (const auto& [dst, src] : pairs) {
        const ConstTensorView host(src, DType::kF32, Shape{n});
        if (ctx_.backend == Backend::kCpu) {
            tensor_convert(dst, host);
        } else if (dst.dtype() == DType::kF32) {
            cuda_copy_sync(dst, host, ctx_.stream);
        } else {
            HostTensor rounded(dst.dtype(), dst.shape());
            tensor_convert(rounded.view(), host);
            cuda_copy_sync(dst, rounded.view(), ctx_.stream);
        }
    }
}

}  // namespace lathe
