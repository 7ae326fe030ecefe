#include "model/batch_staging.h"

#include <cstring>

#include "core/check.h"

#if LATHE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/memory.h"
#endif

namespace lathe {

Result<BatchStaging> BatchStaging::create(size_t half_bytes, const Context& ctx) {
    BatchStaging s;
    s.half_bytes_ = half_bytes;
    if (ctx.backend != Backend::kCuda) return s;
#if LATHE_HAVE_CUDA
    s.on_cuda_ = true;
    s.stream_ = ctx.stream;
    auto pinned = std::make_shared<PinnedHostBuffer>(2 * half_bytes);
    s.pinned_ = std::shared_ptr<void>(pinned, pinned->data());
    for (std::shared_ptr<CUevent_st>& e : s.staged_) {
        cudaEvent_t event = nullptr;
        LATHE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
        e = std::shared_ptr<CUevent_st>(event, [](cudaEvent_t ev) { cudaEventDestroy(ev); });
    }
    return s;
#else
    return unimplemented_error("this lathe was built without CUDA (no nvcc at configure time)");
#endif
}

size_t BatchStaging::begin() {
    if (!on_cuda_) return 0;
    half_ ^= 1;
#if LATHE_HAVE_CUDA
    LATHE_CUDA_CHECK(cudaEventSynchronize(staged_[size_t(half_)].get()));
#endif
    return size_t(half_) * half_bytes_;
}

void BatchStaging::copy(TensorView dst, ConstTensorView src, size_t offset) {
    LATHE_CHECK(src.device() == Device::kCpu && dst.bytes() == src.bytes(), "copy of {} into {}",
                src.to_string(), dst.to_string());
    if (!on_cuda_) {
        if (dst.data() != src.data()) std::memcpy(dst.data(), src.data(), src.bytes());
        return;
    }
#if LATHE_HAVE_CUDA
    const size_t half_begin = size_t(half_) * half_bytes_;
    LATHE_CHECK(offset >= half_begin && offset + src.bytes() <= half_begin + half_bytes_,
                "batch staging of {} bytes at {} outside the current half [{}, {})", src.bytes(),
                offset, half_begin, half_begin + half_bytes_);
    void* staged = static_cast<std::byte*>(pinned_.get()) + offset;
    std::memcpy(staged, src.data(), src.bytes());
    cuda_copy_async(dst, ConstTensorView(staged, src.dtype(), dst.shape(), Device::kCpu), stream_);
#endif
}

void BatchStaging::end() {
    if (!on_cuda_) return;
#if LATHE_HAVE_CUDA
    LATHE_CUDA_CHECK(cudaEventRecord(staged_[size_t(half_)].get(), stream_));
#endif
}

}  // namespace lathe
