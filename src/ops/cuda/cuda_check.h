#pragma once
// Checks for CUDA runtime and cuBLASLt calls. A failing call is never expected input: it is a bug,
// a broken device or an exhausted one, so it stops at once with file:line, the call's text and the
// library's own error name and message (STYLE.md, "Errors"). For .cu files and ops/cuda only.
//
//   LATHE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
//   kernel<<<grid, block, 0, stream>>>(...);
//   LATHE_CUDA_CHECK_LAUNCH();   // the launch's own error (bad configuration, too many resources)
//
// Errors of a kernel's execution surface at the next synchronizing call, which is checked too.
//
// One exception: while the calling thread captures a CUDA graph (ops/cuda/graph.h) and that
// capture is invalidated (an operation in it cannot be captured, such as a synchronization), a
// failing call does not stop: the failure belongs to the capture, which CudaGraph::end_capture
// reports, and nothing enqueued during it has run. Its caller runs the work again without a graph.

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace lathe::cuda::detail {
[[noreturn]] void cuda_call_failed(const char* file, int line, const char* call, cudaError_t err);
[[noreturn]] void cublas_call_failed(const char* file, int line, const char* call,
                                     cublasStatus_t status);
// Whether the calling thread's CUDA-graph capture (CudaGraph::begin_capture) is invalidated.
bool capture_invalidated();
}  // namespace lathe::cuda::detail

#define LATHE_CUDA_CHECK(call)                                                                   \
    do {                                                                                         \
        const cudaError_t lathe_cuda_err_ = (call);                                              \
        if (lathe_cuda_err_ != cudaSuccess && !::lathe::cuda::detail::capture_invalidated())     \
            [[unlikely]]                                                                         \
            ::lathe::cuda::detail::cuda_call_failed(__FILE__, __LINE__, #call, lathe_cuda_err_); \
    } while (0)

#define LATHE_CUBLAS_CHECK(call)                                                 \
    do {                                                                         \
        const cublasStatus_t lathe_cublas_status_ = (call);                      \
        if (lathe_cublas_status_ != CUBLAS_STATUS_SUCCESS &&                     \
            !::lathe::cuda::detail::capture_invalidated()) [[unlikely]]          \
            ::lathe::cuda::detail::cublas_call_failed(__FILE__, __LINE__, #call, \
                                                      lathe_cublas_status_);     \
    } while (0)

// After every kernel launch: the launch itself failed (invalid configuration, no kernel image for
// this device, too many resources requested).
#define LATHE_CUDA_CHECK_LAUNCH() LATHE_CUDA_CHECK(cudaGetLastError())
