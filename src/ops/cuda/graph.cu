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

}  // namespace

namespace cuda::detail {

bool capture_invalidated() {
    if (capturing == nullptr) return false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(capturing, &status) == cudaSuccess &&
           status == cudaStreamCaptureStatusInvalidated;
}

}  // namespace cuda::detail

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
    if (began != cudaSuccess) {
        cudaGetLastError();
        return internal_error("CUDA graph capture did not start: {} ({})",
                              cudaGetErrorString(began), cudaGetErrorName(began));
    }
    capturing = stream;
    return ok_status();
}

Result<CudaGraph> CudaGraph::end_capture(CUstream_st* stream) {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    capturing = nullptr;
    if (ended != cudaSuccess || graph == nullptr) {
        if (graph != nullptr) cudaGraphDestroy(graph);
        cudaGetLastError();  // the capture's error is reported here, not left for the next check
        return internal_error("CUDA graph capture failed: {} ({})", cudaGetErrorString(ended),
                              cudaGetErrorName(ended));
    }
    CudaGraph g;
    g.graph_ = graph;
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    if (made != cudaSuccess) {
        cudaGetLastError();
        return internal_error("CUDA graph instantiation failed: {} ({})", cudaGetErrorString(made),
                              cudaGetErrorName(made));
    }
    g.exec_ = exec;
    return Result<CudaGraph>(std::move(g));
}

void CudaGraph::launch(CUstream_st* stream) const {
    LATHE_CHECK(exec_ != nullptr, "CudaGraph::launch of an empty graph");
    LATHE_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream));
}

}  // namespace lathe
