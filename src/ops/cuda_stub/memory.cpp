// ops/cuda/memory.h in a build without CUDA (ops/cuda_stub/no_cuda.h). The copies, casts and
// device queries stop; the pinned buffer's constructor that allocates stops, so a buffer here
// holds no memory and its destructor and moves have nothing to free. cuda_device_count answers
// 0 and cuda_backend_built false, as they never stop.

#include <utility>

#include "ops/cuda/memory.h"
#include "ops/cuda_stub/no_cuda.h"

bool lathe::cuda_backend_built() {
    return false;
}

void lathe::cuda_copy_async(TensorView, ConstTensorView, CUstream_st*) {
    lathe::detail::no_cuda("cuda_copy_async");
}

void lathe::cuda_copy_rows_async(void*, size_t, const void*, size_t, size_t, size_t, CUstream_st*) {
    lathe::detail::no_cuda("cuda_copy_rows_async");
}

void lathe::cuda_cast(TensorView, ConstTensorView, CUstream_st*) {
    lathe::detail::no_cuda("cuda_cast");
}

void lathe::cuda_zero_ranges(void*, std::span<const ByteRange>, CUstream_st*) {
    lathe::detail::no_cuda("cuda_zero_ranges");
}

lathe::PinnedHostBuffer::PinnedHostBuffer(size_t) {
    lathe::detail::no_cuda("PinnedHostBuffer");
}

lathe::PinnedHostBuffer::~PinnedHostBuffer() = default;

lathe::PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

lathe::PinnedHostBuffer& lathe::PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    return *this;
}

int lathe::cuda_device_count() {
    return 0;
}

lathe::CudaMemoryInfo lathe::cuda_memory_info(int) {
    lathe::detail::no_cuda("cuda_memory_info");
}

std::string lathe::cuda_device_name(int) {
    lathe::detail::no_cuda("cuda_device_name");
}
