// ops/cuda/cuda_state.h and ops/cuda/device_count.h in a build without CUDA
// (ops/cuda_stub/no_cuda.h): cuda_state_of, the state's constructor, context and
// synchronizations, the copies and fills stop, as do the constructors of DeviceBuffer that
// allocates and of CudaEvent. A state, buffer or event here therefore holds nothing: destructors
// and moves have nothing to free. cuda_visible_device_count answers 0, as it never stops.

#include <utility>

#include "ops/cuda/cuda_state.h"
#include "ops/cuda/device_count.h"
#include "ops/cuda_stub/no_cuda.h"

// Complete here only so that the state's destructor can be defined; no state is ever made.
struct lathe::CudaState::MatmulCache {};

int lathe::cuda_visible_device_count() {
    return 0;
}

lathe::CudaState::CudaState(int) {
    lathe::detail::no_cuda("CudaState");
}

lathe::CudaState::~CudaState() = default;

void lathe::CudaState::AttentionCacheDeleter::operator()(AttentionCache*) const {}

lathe::Context lathe::CudaState::context() {
    lathe::detail::no_cuda("CudaState::context");
}

lathe::DeviceBuffer::DeviceBuffer(size_t) {
    lathe::detail::no_cuda("DeviceBuffer");
}

lathe::DeviceBuffer::~DeviceBuffer() = default;

lathe::DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

lathe::DeviceBuffer& lathe::DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    return *this;
}

lathe::TensorView lathe::DeviceBuffer::view(DType, Shape) const {
    lathe::detail::no_cuda("DeviceBuffer::view");
}

lathe::CudaEvent::CudaEvent() {
    lathe::detail::no_cuda("CudaEvent");
}

lathe::CudaEvent::CudaEvent(Timing) {
    lathe::detail::no_cuda("CudaEvent");
}

lathe::CudaEvent::~CudaEvent() = default;

lathe::CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)) {}

lathe::CudaEvent& lathe::CudaEvent::operator=(CudaEvent&& other) noexcept {
    event_ = std::exchange(other.event_, nullptr);
    return *this;
}

void lathe::CudaEvent::record(CUstream_st*) {
    lathe::detail::no_cuda("CudaEvent::record");
}

void lathe::CudaEvent::wait(CUstream_st*) const {
    lathe::detail::no_cuda("CudaEvent::wait");
}

float lathe::CudaEvent::elapsed_ms(const CudaEvent&, const CudaEvent&) {
    lathe::detail::no_cuda("CudaEvent::elapsed_ms");
}

void lathe::CudaEvent::synchronize() const {
    lathe::detail::no_cuda("CudaEvent::synchronize");
}

void lathe::CudaState::synchronize() const {
    lathe::detail::no_cuda("CudaState::synchronize");
}

void lathe::CudaState::synchronize_all() const {
    lathe::detail::no_cuda("CudaState::synchronize_all");
}

void lathe::CudaState::wait_for(CUstream_st*, CUstream_st*) {
    lathe::detail::no_cuda("CudaState::wait_for");
}

lathe::CudaState& lathe::cuda_state_of(const Context&, std::string_view) {
    lathe::detail::no_cuda("cuda_state_of");
}

void lathe::cuda_copy_sync(TensorView, ConstTensorView, CUstream_st*) {
    lathe::detail::no_cuda("cuda_copy_sync");
}

void lathe::cuda_fill_bytes(TensorView, uint8_t, CUstream_st*) {
    lathe::detail::no_cuda("cuda_fill_bytes");
}
