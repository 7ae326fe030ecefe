// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/graph.h"

#include <cuda_runtime.h>

#include <utility>

#include "core/check.h"
#include "ops/cuda/cuda_check.h"

namespace lathe {

namespace {

// The stream the calling thread is capturing (begin_capture to end_capture), or null.
thread_local cudaStream_t capturing = nullptr;

// A failed capture call's Status: kUnimplemented for the capture-specific errors (the work cannot
// be captured; the caller runs it without a graph), kInternal for every other error (the device
// failed or is exhausted; the caller returns it). The error is read back with cudaGetLastError so
// that a non-sticky one is not reported again by the next check; a sticky one stays.
Status capture_failed(const char* what, cudaError_t err) {
    cudaGetLastError();
    if (CudaGraph::capture_specific(err)) {
        return unimplemented_error("CUDA graph {}: {} ({})", what, cudaGetErrorString(err),
                                   cudaGetErrorName(err));
    }
    return internal_error("CUDA graph {}: {} ({})", what, cudaGetErrorString(err),
                          cudaGetErrorName(err));
}

}  // namespace

namespace cuda::detail {

bool capture_invalidated() {
    if (capturing == nullptr) return false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(capturing, &status) == cudaSuccess &&
           status == cudaStreamCaptureStatusInvalidated;
}

}  // namespace cuda::detail

bool CudaGraph::capture_invalidated() {
    return cuda::detail::capture_invalidated();
}

bool CudaGraph::capture_specific(int cuda_error) {
    switch (static_cast<cudaError_t>(cuda_error)) {
        case cudaErrorStreamCaptureUnsupported:  // an operation not allowed while capturing
        case cudaErrorStreamCaptureInvalidated:  // an earlier such operation ended the capture
        case cudaErrorStreamCaptureMerge:
        case cudaErrorStreamCaptureUnjoined:
        case cudaErrorStreamCaptureIsolation:
        case cudaErrorStreamCaptureImplicit:
        case cudaErrorCapturedEvent:
            return true;
        default:
            // cudaErrorStreamCaptureUnmatched and cudaErrorStreamCaptureWrongThread are not here:
            // they mean begin and end do not pair up (a bug), and the stream may still be
            // capturing, so running the work again eagerly on it is not possible.
            return false;
    }
}

CudaGraph::~CudaGraph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

CudaGraph::CudaGraph(CudaGraph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
    if (this != &other) {
        CudaGraph old(std::move(*this));
        graph_ = std::exchange(other.graph_, nullptr);
        exec_ = std::exchange(other.exec_, nullptr);
    }
    return *this;
}

Status CudaGraph::begin_capture(CUstream_st* stream) {
    LATHE_CHECK(stream != nullptr, "CUDA graph capture on the legacy default stream");
    const cudaError_t began = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed);
    if (began != cudaSuccess) return capture_failed("capture did not start", began);
    capturing = stream;
    return ok_status();
}

Result<CudaGraph> CudaGraph::end_capture(CUstream_st* stream) {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    capturing = nullptr;
    if (ended != cudaSuccess) {
        // The capture is over either way (an invalidated one returns no graph); a partial graph
        // is freed.
        if (graph != nullptr) cudaGraphDestroy(graph);
        return capture_failed("capture failed", ended);
    }
    if (graph == nullptr) return internal_error("CUDA graph capture ended without a graph");
    CudaGraph g;
    g.graph_ = graph;
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    if (made != cudaSuccess) return capture_failed("instantiation failed", made);
    g.exec_ = exec;
    return Result<CudaGraph>(std::move(g));
}

void CudaGraph::launch(CUstream_st* stream) const {
    LATHE_CHECK(exec_ != nullptr, "CudaGraph::launch of an empty graph");
    LATHE_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream));
}

}  // namespace lathe
