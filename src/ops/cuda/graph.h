#pragma once
// CUDA graphs: a run of launches on one stream captured once and replayed as one launch, which
// saves the per-kernel launch cost of a step made of many small kernels (the inference engine's
// decode step). Every pointer and launch shape is fixed at capture: a replay reads the inputs
// from the same device buffers, so a caller updates those buffers (asynchronous copies on the
// stream) before each replay. Like memory.h, this header keeps CUDA headers out of the CPU-
// compiled code that includes it; without CUDA its functions are the stubs of
// ops/cuda_stub/graph.cpp (ops/cuda_stub/no_cuda.h).
//
// Capture runs in relaxed mode (cudaStreamCaptureModeRelaxed): host-side calls made while
// capturing (cudaFuncSetAttribute, device attribute queries, cuBLASLt's algorithm choice) are
// allowed; what cannot be captured is a synchronization or a copy to pageable host memory on the
// stream, which invalidates the capture (end_capture returns the error). cuBLASLt takes its
// workspace explicitly (CudaState::workspace), a fixed buffer, so its matmuls capture.
//
// A failed capture does not stop the process: once the capture is invalidated, the calls that
// fail after it (every launch into the stream) pass the CUDA and cuBLAS checks (ops/cuda/
// cuda_check.h) without effect, end_capture returns the error, and the caller runs the same work
// again without a graph.

#include "core/status.h"

struct CUstream_st;

namespace lathe {

class CudaGraph {
public:
    CudaGraph() = default;
    ~CudaGraph();
    CudaGraph(CudaGraph&& other) noexcept;
    CudaGraph& operator=(CudaGraph&& other) noexcept;
    CudaGraph(const CudaGraph&) = delete;
    CudaGraph& operator=(const CudaGraph&) = delete;

    // Starts capturing the launches enqueued on `stream` (which must not be the legacy default
    // stream) from the calling thread: nothing runs until the graph is launched. Errors: CUDA
    // refuses to start the capture (then nothing is being captured).
    static Status begin_capture(CUstream_st* stream);
    // Ends the capture begun on `stream` and instantiates the graph. Errors: the capture was
    // invalidated (an operation in it cannot be captured), with CUDA's reason.
    static Result<CudaGraph> end_capture(CUstream_st* stream);

    bool empty() const { return exec_ == nullptr; }
    // Enqueues one replay on `stream` (checked: a captured graph).
    void launch(CUstream_st* stream) const;

private:
    void* graph_ = nullptr;  // cudaGraph_t
    void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace lathe
