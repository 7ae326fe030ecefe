// ops/cuda/graph.h in a build without CUDA (ops/cuda_stub/no_cuda.h): capture and launch stop; a
// graph here is always empty, so its destructor and moves have nothing to free.

#include <utility>

#include "ops/cuda/graph.h"
#include "ops/cuda_stub/no_cuda.h"

lathe::CudaGraph::~CudaGraph() = default;

lathe::CudaGraph::CudaGraph(CudaGraph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}

lathe::CudaGraph& lathe::CudaGraph::operator=(CudaGraph&& other) noexcept {
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
    return *this;
}

lathe::Status lathe::CudaGraph::begin_capture(CUstream_st*) {
    lathe::detail::no_cuda("CudaGraph::begin_capture");
}

lathe::Result<lathe::CudaGraph> lathe::CudaGraph::end_capture(CUstream_st*) {
    lathe::detail::no_cuda("CudaGraph::end_capture");
}

void lathe::CudaGraph::launch(CUstream_st*) const {
    lathe::detail::no_cuda("CudaGraph::launch");
}

bool lathe::CudaGraph::capture_specific(int) {
    lathe::detail::no_cuda("CudaGraph::capture_specific");
}

bool lathe::CudaGraph::capture_invalidated() {
    return false;  // nothing is ever captured
}
