#include "optim/host_optimizer.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/memory.h"
#include "optim/adamw_optimizer.h"
#include "optim/optimizer_state.h"

namespace lathe {

namespace {

// Host memory of `bytes` bytes: pinned on CUDA, page-aligned plain memory on the CPU. Untouched
// (the moments are first written by CpuAdamW::zero_state's threads).
Result<std::shared_ptr<void>> host_block(size_t bytes, bool pinned) {
    if (bytes == 0) return std::shared_ptr<void>();
    if (pinned) {
        auto buf = std::make_shared<PinnedHostBuffer>(bytes);
        return std::shared_ptr<void>(buf, buf->data());
    }
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr)
        return internal_error("optimizer offload: allocating {} bytes of host memory", bytes);
    return std::shared_ptr<void>(p, std::free);
}

// Consecutive stepped segments (arena order) whose entries are adjacent in the model's entry
// list, merged: the ranges the bf16 weights are copied back over (the gap between two adjacent
// entries is alignment padding, zero in staging and in the compute copy alike).
// `entry_offsets`: every entry's offset, ascending. A segment's place among the entries and in
// the runs is its offset plus `offset` (as adamw_segments_by_unit's).
void append_runs(std::span<const AdamWSegment> segments, const std::vector<int64_t>& entry_offsets,
                 int64_t offset, std::vector<FlatRange>& runs) {
    size_t last = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
        const int64_t at = segments[i].offset + offset, count = segments[i].count;
        const size_t e = size_t(std::lower_bound(entry_offsets.begin(), entry_offsets.end(), at) -
                                entry_offsets.begin());
        if (i > 0 && e == last + 1 && runs.back().end <= at)
            runs.back().end = at + count;
        else
            runs.push_back(FlatRange{at, at + count});
        last = e;
    }
}

}  // namespace

struct HostOptimizer::Impl {
    bool cuda = false;
    OffloadSchedule schedule = OffloadSchedule::kSerial;
    int64_t total = 0;
    // MemoryPlan::offload_begin: elements [base, total) are offloaded; m, v, landing and staging
    // hold those alone (element i of them is element base + i of the vector); masters hold all.
    int64_t base = 0;
    AdamWStateDType state_dtype = AdamWStateDType::kF32;
    Model* model = nullptr;
    std::shared_ptr<void> masters, m, v, landing, staging;
    CpuAdamW adamw;
    std::vector<int64_t> entry_offsets;  // every parameter entry's arena offset, ascending
    // step()'s segments of [base, total), shifted by -base (the host buffers' coordinates).
    std::vector<AdamWSegment> host_segments;

    // ---- the part kept on the device, [0, base) (base > 0: offload_fraction < 1) ----
    std::optional<AdamWOptimizer> device;  // its moments, where the model computes
    ModelArena device_masters;             // CUDA: (base) f32; the CPU steps the model's weights
    // model->param_writes() at the latest copy of the mirror (masters[0, base)) to the device
    // masters; the mirror is behind the device masters after a device update until finish().
    uint64_t writes_seen = ~uint64_t(0);
    bool mirror_stale = false;

    // ---- overlapped and delayed schedules (host_optimizer.h) ----
    std::vector<FlatRange> units;  // ShardLayout's arena units: forward order
    // The update handed to the worker: per unit its segments and its weight copy ranges.
    std::vector<std::vector<AdamWSegment>> unit_segments;
    std::vector<std::vector<FlatRange>> unit_runs;
    AdamWHyper hyper;
    int64_t adam_step = 0;
    float norm = 0.0f, max_grad_norm = 0.0f;
    // Worker state, under `mu`: a job posted, units done of it, the job over, stop.
    std::mutex mu;
    std::condition_variable cv;
    bool job_posted = false, job_running = false, quit = false;
    size_t done = 0;
    bool update_timing = false;                               // set_update_timing()
    std::vector<HostOptimizer::HostUpdateTime> update_times;  // take_host_updates()
    std::thread worker;
    // Main thread only: an update is in flight (step() to finish()); its units uploaded (H2D
    // enqueued) so far; gradient copies armed for the next backward, the back unit copied, the
    // copies of a backward all enqueued.
    bool in_flight = false;
    size_t uploaded = 0;
    std::vector<char> awaited;  // per unit: a forward waited for it since the update was posted
    // Delayed: per unit, updated by the worker and not yet in the weights the model computes with.
    std::vector<char> fresh;
    bool armed = false, back_copied = false, landed_valid = false;
    // CUDA: the last gradient copy; each unit's weight copy; the delayed schedule's last weight
    // copy (staging is free to rewrite after it); the wait timing pairs.
    std::optional<CudaEvent> landed, uploads_done;
    std::vector<CudaEvent> unit_uploaded;
    bool wait_timing = false;
    std::vector<CudaEvent> wait_begin, wait_end;
    std::vector<char> wait_recorded;

    explicit Impl(CpuAdamW a) : adamw(std::move(a)) {}
    // The offloaded part's buffers (grads: its gradients, element i of them element base + i).
    CpuAdamWBuffers buffers(const float* grads) const {
        CpuAdamWBuffers b;
        b.numel = total - base;
        b.params = static_cast<float*>(masters.get()) + base;
        b.m = m.get();
        b.v = v.get();
        b.grads = grads;
        b.params_bf16 = static_cast<bf16*>(staging.get());
        b.state_dtype = state_dtype;
        return b;
    }
    float* landing_f32() const { return static_cast<float*>(landing.get()); }
    int64_t offloaded() const { return total - base; }
    bool delayed() const { return schedule == OffloadSchedule::kDelayed; }
    // The device part's masters (CUDA: device_masters; the CPU: the model's f32 weights).
    TensorView device_params() const {
        return cuda ? device_masters.flat_f32() : model->params_flat().slice(0, base);
    }

    void run_worker();
    void post(std::span<const AdamWSegment> segments);
    void wait_done(size_t unit);
    void upload_done();
    void upload_unit(size_t unit);
    void end_uploads();
    void finish();
    void copy_grads(size_t unit);
    void on_grads_ready(int layer);
    void on_weights_needed(int piece);
    void shutdown();
    void step_device(std::span<const AdamWSegment> segments, const AdamWHyper& hyper,
                     int64_t adam_step, float max_grad_norm);
    void refresh_mirror();
};

// The device part's update (enqueued on the model's stream): the device AdamW over [0, base),
// clipped by the norm in device memory, as the device optimizer steps; entry writes since the
// last update first reach its masters.
void HostOptimizer::Impl::step_device(std::span<const AdamWSegment> segments,
                                      const AdamWHyper& hyper, int64_t adam_step,
                                      float max_grad_norm) {
    if (!device) return;
    if (model->param_writes() != writes_seen) {
        // CUDA: the mirror (pinned) to the device masters; the CPU's weights are written by
        // write_param_entry itself.
        if (cuda)
            cuda_copy_async(device_masters.flat_f32(),
                            ConstTensorView(static_cast<const float*>(masters.get()), DType::kF32,
                                            Shape{base}, Device::kCpu),
                            model->context().stream);
        writes_seen = model->param_writes();
    }
    OptimizerTarget t;
    t.params = device_params();
    t.params_bf16 = cuda ? model->params_compute_flat().slice(0, base) : TensorView();
    t.params_of_ranges = true;
    t.grads = model->grads_flat();
    t.grad_norm = model->grad_norm_value();
    device->step(t, segments, hyper, adam_step, max_grad_norm);
    mirror_stale = true;
}

// The mirror made the device masters' again (a caller is about to read the masters).
void HostOptimizer::Impl::refresh_mirror() {
    if (!device || !mirror_stale) return;
    float* mirror = static_cast<float*>(masters.get());
    if (cuda)
        cuda_copy_sync(TensorView(mirror, DType::kF32, Shape{base}, Device::kCpu),
                       device_masters.flat_f32(), model->context().stream);
    else
        std::memcpy(mirror, model->params_flat().data(), size_t(base) * sizeof(float));
    mirror_stale = false;
}

// The worker: each posted update, unit by unit in forward order.
void HostOptimizer::Impl::run_worker() {
    std::unique_lock lock(mu);
    for (;;) {
        cv.wait(lock, [&] { return job_posted || quit; });
        if (quit) return;
        job_posted = false;
        lock.unlock();
        const auto t0 = std::chrono::steady_clock::now();
        const bool clip = max_grad_norm > 0.0f;
        // The delayed schedule's weights take the update in the next backward (upload_unit).
        float* params = cuda || delayed() ? nullptr : model->params_flat().as<float>();
        const float* src = static_cast<const float*>(masters.get());
        for (size_t u = 0; u < units.size(); ++u) {
            if (!unit_segments[u].empty())
                adamw.step(buffers(landing_f32()), unit_segments[u], hyper, adam_step,
                           clip ? &norm : nullptr, max_grad_norm);
            // CPU: the model computes with f32 weights, the masters' copy.
            if (params != nullptr)
                for (const FlatRange& r : unit_runs[u])
                    std::memcpy(params + r.begin, src + r.begin, size_t(r.size()) * sizeof(float));
            lock.lock();
            done = u + 1;
            lock.unlock();
            cv.notify_all();
        }
        lock.lock();
        if (update_timing)
            update_times.push_back({adam_step, std::chrono::duration<double, std::milli>(
                                                   std::chrono::steady_clock::now() - t0)
                                                   .count()});
        job_running = false;
        cv.notify_all();
    }
}

void HostOptimizer::Impl::post(std::span<const AdamWSegment> segments) {
    for (auto& r : unit_runs) r.clear();
    // `segments` are the offloaded part's (offsets less base, the host buffers' coordinates);
    // the units and runs are the vector's, base further on.
    adamw_segments_by_unit(units, segments, unit_segments, base);
    for (size_t i = 0; i < units.size(); ++i)
        append_runs(unit_segments[i], entry_offsets, base, unit_runs[i]);
    {
        std::lock_guard lock(mu);
        done = 0;
        job_posted = job_running = true;
    }
    cv.notify_all();
    in_flight = true;
    uploaded = 0;
    awaited.assign(units.size(), 0);
    if (delayed()) {
        fresh.resize(units.size());
        for (size_t i = 0; i < units.size(); ++i) fresh[i] = !unit_runs[i].empty();
    }
}

void HostOptimizer::Impl::wait_done(size_t unit) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done > unit; });
}

// CUDA: the H2D copies of every unit the worker has done and that is not uploaded yet.
void HostOptimizer::Impl::upload_done() {
    if (!cuda) return;
    size_t now;
    {
        std::lock_guard lock(mu);
        now = done;
    }
    CUstream_st* copy = cuda_state_of(model->context(), "optimizer offload").copy_stream();
    const TensorView compute = model->params_compute_flat();
    const bf16* stage = static_cast<const bf16*>(staging.get());
    for (; uploaded < now; ++uploaded) {
        for (const FlatRange& r : unit_runs[uploaded])
            cuda_copy_async(compute.slice(r.begin, r.end),
                            ConstTensorView(stage + (r.begin - base), DType::kBF16, Shape{r.size()},
                                            Device::kCpu),
                            copy);
        unit_uploaded[uploaded].record(copy);
    }
}

// Delayed: the unit's updated weights into the ones the model computes with (CUDA: H2D on the
// optimizer stream, which an offloaded run's device optimizer does not use, so that the copies
// run beside the gradients' D2H on the copy stream; the caller has ordered that stream after
// the compute stream's last read of the unit's weights). The CPU: the masters' f32 values.
void HostOptimizer::Impl::upload_unit(size_t unit) {
    if (!fresh[unit]) return;
    fresh[unit] = 0;
    wait_done(unit);
    if (!cuda) {
        float* params = model->params_flat().as<float>();
        const float* src = static_cast<const float*>(masters.get());
        for (const FlatRange& r : unit_runs[unit])
            std::memcpy(params + r.begin, src + r.begin, size_t(r.size()) * sizeof(float));
        return;
    }
    CUstream_st* up = cuda_state_of(model->context(), "optimizer offload").optimizer_stream();
    const TensorView compute = model->params_compute_flat();
    const bf16* stage = static_cast<const bf16*>(staging.get());
    for (const FlatRange& r : unit_runs[unit])
        cuda_copy_async(
            compute.slice(r.begin, r.end),
            ConstTensorView(stage + (r.begin - base), DType::kBF16, Shape{r.size()}, Device::kCpu),
            up);
}

// Delayed: every unit's weights are in. The compute stream goes on after their copies, whatever
// comes next (the update of the last backward's gradients, or none if the step is skipped), and
// the next forward casts the fp8 weight codes from them (model.h).
void HostOptimizer::Impl::end_uploads() {
    model->fp8_weights_updated();
    if (cuda) {
        CudaState& st = cuda_state_of(model->context(), "optimizer offload");
        uploads_done->record(st.optimizer_stream());
        st.wait_for(st.stream(), st.optimizer_stream());
    }
    in_flight = false;
}

void HostOptimizer::Impl::finish() {
    if (!in_flight) return;
    {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return !job_running; });
    }
    if (delayed()) {
        // The units the last backward did not take (all of them when no backward was armed),
        // after every read of the weights enqueued so far.
        if (cuda) {
            CudaState& st = cuda_state_of(model->context(), "optimizer offload");
            st.wait_for(st.optimizer_stream(), st.stream());
        }
        for (size_t u = 0; u < units.size(); ++u) upload_unit(u);
        end_uploads();
        return;
    }
    upload_done();
    if (cuda) {
        CudaState& st = cuda_state_of(model->context(), "optimizer offload");
        st.wait_for(st.stream(), st.copy_stream());
    }
    in_flight = false;
}

void HostOptimizer::Impl::copy_grads(size_t unit) {
    const FlatRange r = units[unit];
    if (r.size() == 0 || r.begin < base) return;  // empty, or stepped on the device
    // The worker reads the unit's landing gradients until it has stepped the unit (the forward
    // before this backward waited for every unit: no wait in practice).
    if (in_flight) wait_done(unit);
    const TensorView grads = model->grads_flat();
    if (cuda) {
        cuda_copy_async(TensorView(landing_f32() + (r.begin - base), DType::kF32, Shape{r.size()},
                                   Device::kCpu),
                        grads.slice(r.begin, r.end),
                        cuda_state_of(model->context(), "optimizer offload").copy_stream());
    } else {
        std::memcpy(landing_f32() + (r.begin - base), grads.as<float>() + r.begin,
                    size_t(r.size()) * sizeof(float));
    }
}

// Gradients-ready hook: layer l's unit (and the back unit, final since the LM head's and the
// final norm's backward ran before the layers'), then the front unit.
// Delayed: with an update in flight, the unit's updated weights go to the model as well, the
// backward being done with the unit's weights for this step; after the last unit the update is
// no longer in flight.
void HostOptimizer::Impl::on_grads_ready(int layer) {
    if (!armed) return;
    const bool upload = delayed() && in_flight;
    if (cuda) {
        CudaState& st = cuda_state_of(model->context(), "optimizer offload");
        st.wait_for(st.copy_stream(), st.stream());
        if (upload) st.wait_for(st.optimizer_stream(), st.stream());
    }
    auto take = [&](size_t u) {
        copy_grads(u);
        if (upload) upload_unit(u);
    };
    const size_t back = units.size() - 1;
    if (!back_copied) {
        take(back);
        back_copied = true;
    }
    if (layer >= 0) {
        take(size_t(layer) + 1);
        return;
    }
    take(0);
    if (cuda) landed->record(cuda_state_of(model->context(), "optimizer offload").copy_stream());
    armed = false;
    landed_valid = true;
    if (upload) end_uploads();
}

// Weights-needed hook: the unit of `piece` done by the worker, its copy waited for.
void HostOptimizer::Impl::on_weights_needed(int piece) {
    if (!in_flight) return;
    const size_t u = piece == Model::kInputWeights    ? 0
                     : piece == Model::kOutputWeights ? units.size() - 1
                                                      : size_t(piece) + 1;
    if (awaited[u]) return;
    awaited[u] = 1;
    CUstream_st* compute = model->context().stream;
    // Recorded before the host waits: the GPU's idle time from the end of the work enqueued so
    // far to the weights' arrival.
    if (cuda && wait_timing) wait_begin[u].record(compute);
    wait_done(u);
    upload_done();
    if (cuda) {
        unit_uploaded[u].wait(compute);
        if (wait_timing) {
            wait_end[u].record(compute);
            wait_recorded[u] = 1;
        }
    }
}

void HostOptimizer::Impl::shutdown() {
    if (schedule == OffloadSchedule::kSerial) return;
    finish();
    {
        std::lock_guard lock(mu);
        quit = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
    model->set_grads_ready_hook({});
    model->set_weights_needed_hook({});
}

HostOptimizer::HostOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HostOptimizer::HostOptimizer(HostOptimizer&&) noexcept = default;
HostOptimizer& HostOptimizer::operator=(HostOptimizer&& other) noexcept {
    if (this != &other) {
        if (impl_) impl_->shutdown();
        impl_ = std::move(other.impl_);
        total_ = other.total_;
        state_dtype_ = other.state_dtype_;
        schedule_ = other.schedule_;
    }
    return *this;
}
HostOptimizer::~HostOptimizer() {
    if (!impl_) return;
    impl_->shutdown();
    impl_->model->set_host_masters_hook({});
}

Result<HostOptimizer> HostOptimizer::create_for(Model& model, AdamWStateDType state_dtype,
                                                int threads, OffloadSchedule schedule) {
    if (!model.training() || !model.plan().shape.masters_on_host)
        return failed_precondition_error(
            "optimizer offload: the model was not created with its masters on the host");
    LATHE_ASSIGN_OR_RETURN(CpuAdamW adamw, CpuAdamW::create(threads));
    auto impl = std::make_unique<Impl>(std::move(adamw));
    impl->cuda = model.context().backend == Backend::kCuda;
    impl->schedule = schedule;
    impl->model = &model;
    const int64_t n = model.params_total();
    impl->total = n;
    impl->base = model.plan().offload_begin;
    LATHE_CHECK(impl->base >= 0 && impl->base <= n, "offload from element {} of {}", impl->base, n);
    const int64_t off = n - impl->base;  // the offloaded elements
    impl->state_dtype = state_dtype;
    // The overlapped and delayed schedules step unit by unit on a worker thread.
    const bool unit_wise = schedule != OffloadSchedule::kSerial;
    if (schedule == OffloadSchedule::kDelayed && impl->base > 0)
        return failed_precondition_error(
            "optimizer offload: the delayed schedule runs every update on the host, but the "
            "model's plan keeps elements [0, {}) on the device (offload_fraction below 1)",
            impl->base);
    const size_t sb = adamw_state_dtype_bytes(state_dtype);
    LATHE_ASSIGN_OR_RETURN(impl->masters, host_block(size_t(n) * sizeof(float), impl->cuda));
    LATHE_ASSIGN_OR_RETURN(impl->m, host_block(size_t(off) * sb, impl->cuda));
    LATHE_ASSIGN_OR_RETURN(impl->v, host_block(size_t(off) * sb, impl->cuda));
    if (impl->cuda || unit_wise) {
        LATHE_ASSIGN_OR_RETURN(impl->landing, host_block(size_t(off) * sizeof(float), impl->cuda));
    }
    if (impl->cuda) {
        LATHE_ASSIGN_OR_RETURN(impl->staging, host_block(size_t(off) * sizeof(bf16), true));
        // The padding between entries is copied with them (append_runs): zero, as on the device.
        if (off > 0) std::memset(impl->staging.get(), 0, size_t(off) * sizeof(bf16));
    }
    std::memset(impl->masters.get(), 0, size_t(n) * sizeof(float));
    if (impl->base > 0) {
        // The device part: moments (zeroed, of the run's state dtype, as the offloaded ones) and,
        // on CUDA, masters where the model computes.
        LATHE_ASSIGN_OR_RETURN(
            AdamWOptimizer device,
            AdamWOptimizer::create(n, {FlatRange{0, impl->base}}, model.context(), state_dtype));
        impl->device.emplace(std::move(device));
        if (impl->cuda) {
            ArenaLayout layout;
            LATHE_RETURN_IF_ERROR(
                layout.add("offload.device_masters", DType::kF32, Shape{impl->base}).status());
            LATHE_ASSIGN_OR_RETURN(impl->device_masters,
                                   ModelArena::allocate(std::move(layout), model.context()));
        }
    }
    for (const AdamWSegment& g : model.adamw_segments(0.0, 0.0))
        impl->entry_offsets.push_back(g.offset);
    std::sort(impl->entry_offsets.begin(), impl->entry_offsets.end());
    const AdamWSegment all{0, off, 0.0, 0.0};
    // zero_state writes the moments alone; the gradients it is given are not read.
    impl->adamw.zero_state(impl->buffers(static_cast<const float*>(impl->masters.get())),
                           std::span(&all, 1));
    if (unit_wise) {
        impl->units = model.plan().shards.arena;
        LATHE_CHECK(impl->units.size() == size_t(model.config().num_layers) + 2,
                    "{} units for {} layers", impl->units.size(), model.config().num_layers);
        impl->unit_segments.resize(impl->units.size());
        impl->unit_runs.resize(impl->units.size());
        if (impl->cuda) {
            impl->landed.emplace();
            impl->uploads_done.emplace();
            impl->unit_uploaded.resize(impl->units.size());
        }
        Impl* p = impl.get();
        impl->worker = std::thread([p] { p->run_worker(); });
        model.set_grads_ready_hook([p](int layer) { p->on_grads_ready(layer); });
        // Delayed: the forward computes with the weights it has (no wait).
        if (!impl->delayed())
            model.set_weights_needed_hook([p](int piece) { p->on_weights_needed(piece); });
    }
    Impl* const p = impl.get();
    HostOptimizer out(std::move(impl));
    out.total_ = n;
    out.state_dtype_ = state_dtype;
    out.schedule_ = schedule;
    model.attach_host_masters(out.masters());
    // An entry read or written between steps sees, and lands in, masters that hold the step's
    // whole update (the host part's finished, the device part's mirrored first): a write then
    // races no worker, is not lost to a later refresh, and is not made over a stale mirror that
    // the next step would copy to the device.
    model.set_host_masters_hook([p] {
        p->finish();
        p->refresh_mirror();
    });
    return out;
}

std::span<float> HostOptimizer::masters() const {
    return std::span<float>(static_cast<float*>(impl_->masters.get()), size_t(total_));
}

void HostOptimizer::step(Model& model, std::span<const AdamWSegment> segments,
                         const AdamWHyper& hyper, int64_t step, float norm, float max_grad_norm) {
    LATHE_CHECK(model.params_total() == total_ && &model == impl_->model,
                "a model of {} parameters, an optimizer of {} created for another",
                model.params_total(), total_);
    Impl& im = *impl_;
    im.finish();
    const bool clip = max_grad_norm > 0.0f;
    // The device part first (enqueued), then the offloaded segments, shifted to the host
    // buffers' coordinates (a segment is one entry, inside one unit: on one side of base).
    im.step_device(segments, hyper, step, max_grad_norm);
    im.host_segments.clear();
    for (const AdamWSegment& g : segments) {
        LATHE_CHECK(g.offset >= im.base || g.offset + g.count <= im.base,
                    "segment [{}, {}) straddles the offload split at {}", g.offset,
                    g.offset + g.count, im.base);
        if (g.offset < im.base) continue;
        im.host_segments.push_back(g);
        im.host_segments.back().offset -= im.base;
    }
    const std::span<const AdamWSegment> host_segments = im.host_segments;
    const int64_t off = im.offloaded();
    const TensorView grads_off = model.grads_flat().slice(im.base, total_);
    if (schedule_ != OffloadSchedule::kSerial) {
        // The gradients in landing: the armed backward's copies, waited for, or all of them now.
        if (im.landed_valid) {
            if (im.cuda) im.landed->synchronize();
        } else if (im.cuda) {
            cuda_copy_async(TensorView(im.landing_f32(), DType::kF32, Shape{off}, Device::kCpu),
                            grads_off, model.context().stream);
            model.synchronize();
        } else if (off > 0) {
            std::memcpy(im.landing_f32(), grads_off.data(), size_t(off) * sizeof(float));
        }
        im.landed_valid = false;
        im.armed = false;
        im.hyper = hyper;
        im.adam_step = step;
        im.norm = norm;
        im.max_grad_norm = max_grad_norm;
        if (im.cuda) {
            // Overlapped: the weight copies go after every read of the weights enqueued so far.
            CudaState& st = cuda_state_of(model.context(), "optimizer offload");
            st.wait_for(st.copy_stream(), st.stream());
            // Delayed: the worker rewrites staging, which the last weight copies read.
            if (im.delayed()) im.uploads_done->synchronize();
        }
        im.post(host_segments);
        return;
    }
    if (off == 0) return;
    const float* grads = nullptr;
    if (im.cuda) {
        // The whole step's gradients, then the wait (the norm's read back already waited for the
        // backward; this waits for the copy).
        cuda_copy_async(TensorView(im.landing_f32(), DType::kF32, Shape{off}, Device::kCpu),
                        grads_off, model.context().stream);
        model.synchronize();
        grads = im.landing_f32();
    } else {
        grads = grads_off.as<float>();
    }
    im.adamw.step(im.buffers(grads), host_segments, hyper, step, clip ? &norm : nullptr,
                  max_grad_norm);
    if (im.cuda) {
        // Enqueued: the next forward, on the same stream, reads the weights after the copies.
        std::vector<FlatRange> runs;
        append_runs(host_segments, im.entry_offsets, im.base, runs);
        const TensorView compute = model.params_compute_flat();
        const bf16* stage = static_cast<const bf16*>(im.staging.get());
        for (const FlatRange& r : runs)
            cuda_copy_async(compute.slice(r.begin, r.end),
                            ConstTensorView(stage + (r.begin - im.base), DType::kBF16,
                                            Shape{r.size()}, Device::kCpu),
                            model.context().stream);
    } else {
        std::memcpy(model.params_flat().as<float>() + im.base,
                    static_cast<const float*>(im.masters.get()) + im.base,
                    size_t(off) * sizeof(float));
    }
}

void HostOptimizer::arm_gradient_copies() {
    if (schedule_ == OffloadSchedule::kSerial) return;
    // No finish(): with one micro-batch this precedes the forward that overlaps the update.
    impl_->armed = true;
    impl_->back_copied = false;
    impl_->landed_valid = false;
}

void HostOptimizer::before_zero_grads() {
    if (schedule_ == OffloadSchedule::kSerial || !impl_->cuda) return;
    impl_->landed->wait(impl_->model->context().stream);
}

void HostOptimizer::finish() {
    impl_->finish();
    impl_->refresh_mirror();
}

void HostOptimizer::set_wait_timing(bool on) {
    Impl& im = *impl_;
    // Delayed: the forward never waits for the CPU.
    if (!im.cuda || schedule_ != OffloadSchedule::kOverlapped) return;
    im.wait_timing = on;
    if (on && im.wait_begin.empty()) {
        for (size_t u = 0; u < im.units.size(); ++u) {
            im.wait_begin.emplace_back(CudaEvent::Timing::kOn);
            im.wait_end.emplace_back(CudaEvent::Timing::kOn);
        }
        im.wait_recorded.assign(im.units.size(), 0);
    }
}

double HostOptimizer::take_weight_wait_ms() {
    Impl& im = *impl_;
    double ms = 0.0;
    for (size_t u = 0; u < im.wait_recorded.size(); ++u) {
        if (!im.wait_recorded[u]) continue;
        ms += double(CudaEvent::elapsed_ms(im.wait_begin[u], im.wait_end[u]));
        im.wait_recorded[u] = 0;
    }
    return ms;
}

void HostOptimizer::set_update_timing(bool on) {
    std::lock_guard lock(impl_->mu);
    impl_->update_timing = on;
}

std::vector<HostOptimizer::HostUpdateTime> HostOptimizer::take_host_updates() {
    Impl& im = *impl_;
    std::lock_guard lock(im.mu);
    return std::exchange(im.update_times, {});
}

Status HostOptimizer::save_state(const std::string& path) {
    Impl& im = *impl_;
    im.finish();
    const size_t n = size_t(total_), base = size_t(im.base);
    if (state_dtype_ == AdamWStateDType::kF32 && base == 0)
        return optimizer_state_write(path, std::span(static_cast<const float*>(im.m.get()), n),
                                     std::span(static_cast<const float*>(im.v.get()), n));
    // The device part's moments read back (f32, base elements each); the offloaded ones widened
    // from bf16 or read as they are, chunk by chunk as the file is written.
    std::vector<float> dm(base), dv(base);
    if (im.device) im.device->read_state(dm, dv);
    const float* device[2] = {dm.data(), dv.data()};
    const void* host[2] = {im.m.get(), im.v.get()};
    const bool f32 = state_dtype_ == AdamWStateDType::kF32;
    return optimizer_state_write_streamed(
        path, uint64_t(n), [&](int moment, uint64_t begin, std::span<float> out) {
            for (size_t i = 0; i < out.size(); ++i) {
                const size_t e = size_t(begin) + i;
                if (e < base)
                    out[i] = device[moment][e];
                else if (f32)
                    out[i] = static_cast<const float*>(host[moment])[e - base];
                else
                    out[i] = bf16_to_float(static_cast<const bf16*>(host[moment])[e - base]);
            }
        });
}

Status HostOptimizer::load_state(const std::string& dir, int64_t used) {
    LATHE_CHECK(used >= 0 && used <= total_, "used {} of a vector of {}", used, total_);
    Impl& im = *impl_;
    im.finish();
    const int64_t base = im.base, off = im.offloaded();
    if (im.device) {
        // [0, min(base, used)) from the file, the rest of the device part zero.
        std::vector<float> dm(size_t(base), 0.0f), dv(size_t(base), 0.0f);
        const int64_t k = std::min(base, used);
        const FlatRange r{0, k};
        if (k > 0)
            LATHE_RETURN_IF_ERROR(optimizer_state_load_ranges(dir, used, std::span(&r, 1),
                                                              std::span(dm.data(), size_t(k)),
                                                              std::span(dv.data(), size_t(k))));
        im.device->write_state(dm, dv);
    }
    // The offloaded part: elements [base, used) of the file, the rest zero.
    const int64_t u = std::max<int64_t>(0, used - base);
    if (state_dtype_ == AdamWStateDType::kF32) {
        float* m = static_cast<float*>(im.m.get());
        float* v = static_cast<float*>(im.v.get());
        std::fill(m + u, m + off, 0.0f);
        std::fill(v + u, v + off, 0.0f);
        if (u == 0) return ok_status();
        const FlatRange r{base, base + u};
        return optimizer_state_load_ranges(dir, used, std::span(&r, 1), std::span(m, size_t(u)),
                                           std::span(v, size_t(u)));
    }
    // bf16: read in ranges of kChunk elements, each rounded into the moments.
    constexpr int64_t kChunk = int64_t(1) << 24;
    bf16* m = static_cast<bf16*>(im.m.get());
    bf16* v = static_cast<bf16*>(im.v.get());
    std::fill(m + u, m + off, float_to_bf16(0.0f));
    std::fill(v + u, v + off, float_to_bf16(0.0f));
    std::vector<float> mf(size_t(std::min(kChunk, std::max<int64_t>(u, 1)))), vf(mf.size());
    for (int64_t b = 0; b < u; b += kChunk) {
        const FlatRange r{base + b, base + std::min(u, b + kChunk)};
        const size_t c = size_t(r.size());
        LATHE_RETURN_IF_ERROR(optimizer_state_load_ranges(
            dir, used, std::span(&r, 1), std::span(mf.data(), c), std::span(vf.data(), c)));
        for (size_t i = 0; i < c; ++i) {
            m[size_t(b) + i] = float_to_bf16(mf[i]);
            v[size_t(b) + i] = float_to_bf16(vf[i]);
        }
    }
    return ok_status();
}

void HostOptimizer::read_state(std::span<float> exp_avg, std::span<float> exp_avg_sq) const {
    impl_->finish();
    LATHE_CHECK(int64_t(exp_avg.size()) == total_ && int64_t(exp_avg_sq.size()) == total_,
                "read_state: {} and {} elements of {}", exp_avg.size(), exp_avg_sq.size(), total_);
    const size_t base = size_t(impl_->base), off = size_t(impl_->offloaded());
    if (impl_->device)
        impl_->device->read_state(exp_avg.subspan(0, base), exp_avg_sq.subspan(0, base));
    float* m_out = exp_avg.data() + base;
    float* v_out = exp_avg_sq.data() + base;
    if (state_dtype_ == AdamWStateDType::kF32) {
        if (off == 0) return;
        std::memcpy(m_out, impl_->m.get(), off * sizeof(float));
        std::memcpy(v_out, impl_->v.get(), off * sizeof(float));
        return;
    }
    const bf16* m = static_cast<const bf16*>(impl_->m.get());
    const bf16* v = static_cast<const bf16*>(impl_->v.get());
    for (size_t i = 0; i < off; ++i) {
        m_out[i] = bf16_to_float(m[i]);
        v_out[i] = bf16_to_float(v[i]);
    }
}

void HostOptimizer::write_state(std::span<const float> exp_avg, std::span<const float> exp_avg_sq) {
    impl_->finish();
    LATHE_CHECK(int64_t(exp_avg.size()) == total_ && int64_t(exp_avg_sq.size()) == total_,
                "write_state: {} and {} elements of {}", exp_avg.size(), exp_avg_sq.size(), total_);
    const size_t base = size_t(impl_->base), off = size_t(impl_->offloaded());
    if (impl_->device)
        impl_->device->write_state(exp_avg.subspan(0, base), exp_avg_sq.subspan(0, base));
    const float* m_in = exp_avg.data() + base;
    const float* v_in = exp_avg_sq.data() + base;
    if (state_dtype_ == AdamWStateDType::kF32) {
        if (off == 0) return;
        std::memcpy(impl_->m.get(), m_in, off * sizeof(float));
        std::memcpy(impl_->v.get(), v_in, off * sizeof(float));
        return;
    }
    bf16* m = static_cast<bf16*>(impl_->m.get());
    bf16* v = static_cast<bf16*>(impl_->v.get());
    for (size_t i = 0; i < off; ++i) {
        m[i] = float_to_bf16(m_in[i]);
        v[i] = float_to_bf16(v_in[i]);
    }
}

}  // namespace lathe
