#include "optim/host_optimizer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "ops/cuda/memory.h"
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

}  // namespace

struct HostOptimizer::Impl {
    bool cuda = false;
    std::shared_ptr<void> masters, m, v, landing, staging;
    CpuAdamW adamw;
    explicit Impl(CpuAdamW a) : adamw(std::move(a)) {}
    CpuAdamWBuffers buffers(int64_t n, AdamWStateDType dtype, const float* grads) const {
        CpuAdamWBuffers b;
        b.numel = n;
        b.params = static_cast<float*>(masters.get());
        b.m = m.get();
        b.v = v.get();
        b.grads = grads;
        b.params_bf16 = static_cast<bf16*>(staging.get());
        b.state_dtype = dtype;
        return b;
    }
};

HostOptimizer::HostOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HostOptimizer::HostOptimizer(HostOptimizer&&) noexcept = default;
HostOptimizer& HostOptimizer::operator=(HostOptimizer&&) noexcept = default;
HostOptimizer::~HostOptimizer() = default;

Result<HostOptimizer> HostOptimizer::create_for(Model& model, AdamWStateDType state_dtype,
                                                int threads) {
    if (!model.training() || !model.plan().shape.masters_on_host)
        return failed_precondition_error(
            "optimizer offload: the model was not created with its masters on the host");
    LATHE_ASSIGN_OR_RETURN(CpuAdamW adamw, CpuAdamW::create(threads));
    auto impl = std::make_unique<Impl>(std::move(adamw));
    impl->cuda = model.context().backend == Backend::kCuda;
    const int64_t n = model.params_total();
    const size_t sb = adamw_state_dtype_bytes(state_dtype);
    LATHE_ASSIGN_OR_RETURN(impl->masters, host_block(size_t(n) * sizeof(float), impl->cuda));
    LATHE_ASSIGN_OR_RETURN(impl->m, host_block(size_t(n) * sb, impl->cuda));
    LATHE_ASSIGN_OR_RETURN(impl->v, host_block(size_t(n) * sb, impl->cuda));
    if (impl->cuda) {
        LATHE_ASSIGN_OR_RETURN(impl->landing, host_block(size_t(n) * sizeof(float), true));
        LATHE_ASSIGN_OR_RETURN(impl->staging, host_block(size_t(n) * sizeof(bf16), true));
    }
    std::memset(impl->masters.get(), 0, size_t(n) * sizeof(float));
    const AdamWSegment all{0, n, 0.0, 0.0};
    // zero_state writes the moments alone; the gradients it is given are not read.
    impl->adamw.zero_state(
        impl->buffers(n, state_dtype, static_cast<const float*>(impl->masters.get())),
        std::span(&all, 1));
    HostOptimizer out(std::move(impl));
    out.total_ = n;
    out.state_dtype_ = state_dtype;
    model.attach_host_masters(out.masters());
    return out;
}

std::span<float> HostOptimizer::masters() const {
    return std::span<float>(static_cast<float*>(impl_->masters.get()), size_t(total_));
}

void HostOptimizer::step(Model& model, std::span<const AdamWSegment> segments,
                         const AdamWHyper& hyper, int64_t step, float norm, float max_grad_norm) {
    LATHE_CHECK(model.params_total() == total_, "a model of {} parameters, an optimizer of {}",
                model.params_total(), total_);
    const float* grads = nullptr;
    if (impl_->cuda) {
        // The whole step's gradients, then the wait (the norm's read back already waited for the
        // backward; this waits for the copy).
        float* landing = static_cast<float*>(impl_->landing.get());
        cuda_copy_async(TensorView(landing, DType::kF32, Shape{total_}, Device::kCpu),
                        model.grads_flat(), model.context().stream);
        model.synchronize();
        grads = landing;
    } else {
        grads = model.grads_flat().as<float>();
    }
    const bool clip = max_grad_norm > 0.0f;
    impl_->adamw.step(impl_->buffers(total_, state_dtype_, grads), segments, hyper, step,
                      clip ? &norm : nullptr, max_grad_norm);
    if (impl_->cuda) {
        // Enqueued: the next forward, on the same stream, reads the weights after the copy.
        cuda_copy_async(
            model.params_compute_flat(),
            ConstTensorView(impl_->staging.get(), DType::kBF16, Shape{total_}, Device::kCpu),
            model.context().stream);
    } else {
        std::memcpy(model.params_flat().data(), impl_->masters.get(),
                    size_t(total_) * sizeof(float));
    }
}

Status HostOptimizer::save_state(const std::string& path) {
    const size_t n = size_t(total_);
    if (state_dtype_ == AdamWStateDType::kF32)
        return optimizer_state_write(path, std::span(static_cast<const float*>(impl_->m.get()), n),
                                     std::span(static_cast<const float*>(impl_->v.get()), n));
    // bf16: widened chunk by chunk as the file is written.
    const bf16* moments[2] = {static_cast<const bf16*>(impl_->m.get()),
                              static_cast<const bf16*>(impl_->v.get())};
    return optimizer_state_write_streamed(path, uint64_t(n),
                                          [&](int moment, uint64_t begin, std::span<float> out) {
                                              const bf16* src = moments[moment] + begin;
                                              for (size_t i = 0; i < out.size(); ++i)
                                                  out[i] = bf16_to_float(src[i]);
                                          });
}

Status HostOptimizer::load_state(const std::string& dir, int64_t used) {
    LATHE_CHECK(used >= 0 && used <= total_, "used {} of a vector of {}", used, total_);
    const size_t n = size_t(total_), u = size_t(used);
    if (state_dtype_ == AdamWStateDType::kF32) {
        const FlatRange all{0, used};
        float* m = static_cast<float*>(impl_->m.get());
        float* v = static_cast<float*>(impl_->v.get());
        std::fill(m + u, m + n, 0.0f);
        std::fill(v + u, v + n, 0.0f);
        return optimizer_state_load_ranges(dir, used, std::span(&all, 1), std::span(m, u),
                                           std::span(v, u));
    }
    // bf16: read in ranges of kChunk elements, each rounded into the moments.
    constexpr int64_t kChunk = int64_t(1) << 24;
    bf16* m = static_cast<bf16*>(impl_->m.get());
    bf16* v = static_cast<bf16*>(impl_->v.get());
    std::fill(m + u, m + n, float_to_bf16(0.0f));
    std::fill(v + u, v + n, float_to_bf16(0.0f));
    std::vector<float> mf(size_t(std::min(kChunk, std::max<int64_t>(used, 1)))), vf(mf.size());
    for (int64_t b = 0; b < used; b += kChunk) {
        const FlatRange r{b, std::min(used, b + kChunk)};
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
    LATHE_CHECK(int64_t(exp_avg.size()) == total_ && int64_t(exp_avg_sq.size()) == total_,
                "read_state: {} and {} elements of {}", exp_avg.size(), exp_avg_sq.size(), total_);
    const size_t n = size_t(total_);
    if (state_dtype_ == AdamWStateDType::kF32) {
        std::memcpy(exp_avg.data(), impl_->m.get(), n * sizeof(float));
        std::memcpy(exp_avg_sq.data(), impl_->v.get(), n * sizeof(float));
        return;
    }
    const bf16* m = static_cast<const bf16*>(impl_->m.get());
    const bf16* v = static_cast<const bf16*>(impl_->v.get());
    for (size_t i = 0; i < n; ++i) {
        exp_avg[i] = bf16_to_float(m[i]);
        exp_avg_sq[i] = bf16_to_float(v[i]);
    }
}

void HostOptimizer::write_state(std::span<const float> exp_avg, std::span<const float> exp_avg_sq) {
    LATHE_CHECK(int64_t(exp_avg.size()) == total_ && int64_t(exp_avg_sq.size()) == total_,
                "write_state: {} and {} elements of {}", exp_avg.size(), exp_avg_sq.size(), total_);
    const size_t n = size_t(total_);
    if (state_dtype_ == AdamWStateDType::kF32) {
        std::memcpy(impl_->m.get(), exp_avg.data(), n * sizeof(float));
        std::memcpy(impl_->v.get(), exp_avg_sq.data(), n * sizeof(float));
        return;
    }
    bf16* m = static_cast<bf16*>(impl_->m.get());
    bf16* v = static_cast<bf16*>(impl_->v.get());
    for (size_t i = 0; i < n; ++i) {
        m[i] = float_to_bf16(exp_avg[i]);
        v[i] = float_to_bf16(exp_avg_sq[i]);
    }
}

}  // namespace lathe
