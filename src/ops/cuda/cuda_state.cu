// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>

#include <string>

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
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

CudaState::CudaState(int device) : device_(device) {
    LATHE_CUDA_CHECK(cudaSetDevice(device));
    LATHE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LATHE_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
    workspace_ = DeviceBuffer(kWorkspaceBytes);
    scratch_ = DeviceBuffer(kScratchBytes);
    matmul_cache_ = std::make_unique<MatmulCache>();
}

CudaState::~CudaState() {
    // Work still queued may use the buffers freed below.
    if (stream_ != nullptr) LATHE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    attention_cache_.reset();  // its cuDNN handle is bound to the stream destroyed below
    if (cublaslt_ != nullptr) LATHE_CUBLAS_CHECK(cublasLtDestroy(cublaslt_));
    if (stream_ != nullptr) LATHE_CUDA_CHECK(cudaStreamDestroy(stream_));
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
