// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>

#include <string>

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/device_count.h"
#include "ops/cuda/gemm.h"

namespace lathe {

namespace cuda::detail {

void cuda_call_failed(const char* file, int line, const char* call, cudaError_t err) {
    ::lathe::detail::check_failed(
        file, line, call,
        fmt::format("CUDA error {} ({})", cudaGetErrorName(err), cudaGetErrorString(err)));
}

void cublas_call_failed(const char* file, int line, const char* call, cublasStatus_t status) {
    ::lathe::detail::check_failed(file, line, call,
                                  fmt::format("cuBLAS error {} ({})", cublasLtGetStatusName(status),
                                              cublasLtGetStatusString(status)));
}

}  // namespace cuda::detail

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t err = cudaMalloc(&data_, bytes);
    LATHE_CHECK(err == cudaSuccess, "cudaMalloc of {} bytes ({:.1f} MiB): {} ({})", bytes,
                double(bytes) / double(1 << 20), cudaGetErrorName(err), cudaGetErrorString(err));
}

DeviceBuffer::~DeviceBuffer() {
    if (data_ != nullptr) LATHE_CUDA_CHECK(cudaFree(data_));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_) {
    other.data_ = nullptr;
    other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
        if (data_ != nullptr) LATHE_CUDA_CHECK(cudaFree(data_));
        data_ = other.data_;
        bytes_ = other.bytes_;
        other.data_ = nullptr;
        other.bytes_ = 0;
    }
    return *this;
}

TensorView DeviceBuffer::view(DType dtype, Shape shape) const {
    const size_t need = size_t(shape.numel()) * dtype_size(dtype);
    LATHE_CHECK(need <= bytes_, "a {} {} view needs {} bytes of a {}-byte device buffer",
                dtype_name(dtype), shape.to_string(), need, bytes_);
    return TensorView(data_, dtype, shape, Device::kCuda);
}

CudaEvent::CudaEvent() {
    LATHE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

CudaEvent::CudaEvent(Timing timing) {
    LATHE_CUDA_CHECK(cudaEventCreateWithFlags(
        &event_, timing == Timing::kOn ? cudaEventDefault : cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
    if (event_ != nullptr) LATHE_CUDA_CHECK(cudaEventDestroy(event_));
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(other.event_) {
    other.event_ = nullptr;
}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
    if (this != &other) {
        if (event_ != nullptr) LATHE_CUDA_CHECK(cudaEventDestroy(event_));
        event_ = other.event_;
        other.event_ = nullptr;
    }
    return *this;
}

void CudaEvent::record(CUstream_st* stream) {
    LATHE_CHECK(event_ != nullptr, "record on a moved-from CudaEvent");
    LATHE_CUDA_CHECK(cudaEventRecord(event_, stream));
}

void CudaEvent::wait(CUstream_st* stream) const {
    LATHE_CHECK(event_ != nullptr, "wait on a moved-from CudaEvent");
    LATHE_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

void CudaEvent::synchronize() const {
    LATHE_CHECK(event_ != nullptr, "synchronize on a moved-from CudaEvent");
    LATHE_CUDA_CHECK(cudaEventSynchronize(event_));
}

float CudaEvent::elapsed_ms(const CudaEvent& start, const CudaEvent& end) {
    LATHE_CHECK(start.event_ != nullptr && end.event_ != nullptr,
                "elapsed_ms on a moved-from CudaEvent");
    float ms = 0.0f;
    LATHE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, end.event_));
    return ms;
}

namespace {

// Makes `device` current and returns it: CudaState's first member is initialized with it, so the
// events among the members are created on that device.
int make_current(int device) {
    LATHE_CUDA_CHECK(cudaSetDevice(device));
    return device;
}

}  // namespace

CudaState::CudaState(int device) : device_(make_current(device)) {
    // Numerically lower is higher priority: `greatest` is the most urgent. Compute one level
    // above the least, so that the optimizer stream, at the least, yields to it (header).
    int least = 0, greatest = 0;
    LATHE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    const int compute = least > greatest ? least - 1 : least;
    LATHE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, compute));
    LATHE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    LATHE_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest));
    LATHE_CUDA_CHECK(
        cudaStreamCreateWithPriority(&optimizer_stream_, cudaStreamNonBlocking, least));
    LATHE_CUDA_CHECK(
        cudaStreamCreateWithPriority(&tensor_stream_, cudaStreamNonBlocking, greatest));
    LATHE_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
    LATHE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
    workspace_ = DeviceBuffer(kWorkspaceBytes);
    scratch_ = DeviceBuffer(kScratchBytes);
    matmul_cache_ = std::make_unique<MatmulCache>();
}

CudaState::~CudaState() {
    // Work still queued may use the buffers freed below.
    synchronize_all();
    attention_cache_.reset();  // its cuDNN handle is bound to the stream destroyed below
    if (cublaslt_ != nullptr) LATHE_CUBLAS_CHECK(cublasLtDestroy(cublaslt_));
    for (CUstream_st* s : {stream_, copy_stream_, comm_stream_, optimizer_stream_, tensor_stream_})
        if (s != nullptr) LATHE_CUDA_CHECK(cudaStreamDestroy(s));
}

void CudaState::wait_for(CUstream_st* waiter, CUstream_st* signaller) {
    const CUstream_st* const streams[5] = {stream_, copy_stream_, comm_stream_, optimizer_stream_,
                                           tensor_stream_};
    int from = -1;
    bool waiter_ours = false;
    for (int i = 0; i < 5; ++i) {
        if (streams[i] == signaller) from = i;
        if (streams[i] == waiter) waiter_ours = true;
    }
    LATHE_CHECK(from >= 0 && waiter_ours,
                "CudaState::wait_for: both streams must be this state's (compute, copy, "
                "communication, optimizer or tensor-parallel); signaller ours: {}, waiter ours: {}",
                from >= 0, waiter_ours);
    if (waiter == signaller) return;
    order_events_[from].record(signaller);
    order_events_[from].wait(waiter);
}

void* CudaState::scratch(size_t bytes, std::string_view op) const {
    LATHE_CHECK(bytes <= scratch_.bytes(),
                "{}: needs {} bytes of CUDA op scratch, CudaState::kScratchBytes is {}", op, bytes,
                scratch_.bytes());
    return scratch_.data();
}

Context CudaState::context() {
    Context ctx;
    ctx.backend = Backend::kCuda;
    ctx.device = device_;
    ctx.stream = stream_;
    ctx.cuda = this;
    return ctx;
}

void CudaState::synchronize() const {
    LATHE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaState::synchronize_all() const {
    for (CUstream_st* s : {stream_, copy_stream_, comm_stream_, optimizer_stream_, tensor_stream_})
        if (s != nullptr) LATHE_CUDA_CHECK(cudaStreamSynchronize(s));
}

CudaState& cuda_state_of(const Context& ctx, std::string_view op) {
    LATHE_CHECK(ctx.backend == Backend::kCuda && ctx.cuda != nullptr,
                "{}: a CUDA context without a CudaState (make contexts with CudaState::context())",
                op);
    LATHE_CHECK(ctx.stream == ctx.cuda->stream(),
                "{}: the context's stream is not its CudaState's; ops sharing the state's "
                "workspace and scratch must run on its stream",
                op);
    return *ctx.cuda;
}

int cuda_visible_device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();  // a failed call leaves a sticky last error
        return 0;
    }
    return count;
}

void cuda_copy_sync(TensorView dst, ConstTensorView src, CUstream_st* stream) {
    LATHE_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape(), "copy {} <- {}",
                dst.to_string(), src.to_string());
    if (src.bytes() == 0) return;
    LATHE_CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDefault, stream));
    if (dst.device() == Device::kCpu || src.device() == Device::kCpu)
        LATHE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void cuda_fill_bytes(TensorView dst, uint8_t byte, CUstream_st* stream) {
    LATHE_CHECK(dst.device() == Device::kCuda, "cuda_fill_bytes on {}", dst.to_string());
    if (dst.bytes() == 0) return;
    LATHE_CUDA_CHECK(cudaMemsetAsync(dst.data(), byte, dst.bytes(), stream));
}

}  // namespace lathe
