#include "model/batch_staging.h"

#include <cstring>

#include "core/check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/memory.h"

namespace lathe {

Result<BatchStaging> BatchStaging::create(size_t half_bytes, const Context& ctx) {
    BatchStaging s;
    s.half_bytes_ = half_bytes;
    if (ctx.backend != Backend::kCuda) return s;
    if (!cuda_backend_built())
        return unimplemented_error("this lathe was built without CUDA (no nvcc at configure time)");
    s.on_cuda_ = true;
    s.stream_ = ctx.stream;
    auto pinned = std::make_shared<PinnedHostBuffer>(2 * half_bytes);
    s.pinned_ = std::shared_ptr<void>(pinned, pinned->data());
    for (std::shared_ptr<CudaEvent>& e : s.staged_) e = std::make_shared<CudaEvent>();
    return s;
}

size_t BatchStaging::begin() {
    if (!on_cuda_) return 0;
    half_ ^= 1;
    staged_[size_t(half_)]->synchronize();
    return size_t(half_) * half_bytes_;
}

void BatchStaging::copy(TensorView dst, ConstTensorView src, size_t offset) {
    LATHE_CHECK(src.device() == Device::kCpu && dst.bytes() == src.bytes(), "copy of {} into {}",
                src.to_string(), dst.to_string());
    if (!on_cuda_) {
        if (dst.data() != src.data()) std::memcpy(dst.data(), src.data(), src.bytes());
        return;
    }
    const size_t half_begin = size_t(half_) * half_bytes_;
    LATHE_CHECK(offset >= half_begin && offset + src.bytes() <= half_begin + half_bytes_,
                "batch staging of {} bytes at {} outside the current half [{}, {})", src.bytes(),
                offset, half_begin, half_begin + half_bytes_);
    void* staged = static_cast<std::byte*>(pinned_.get()) + offset;
    std::memcpy(staged, src.data(), src.bytes());
    cuda_copy_async(dst, ConstTensorView(staged, src.dtype(), dst.shape(), Device::kCpu), stream_);
}

void BatchStaging::end() {
    if (!on_cuda_) return;
    staged_[size_t(half_)]->record(stream_);
}

}  // namespace lathe
