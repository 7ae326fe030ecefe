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
// A capture that CUDA refuses does not stop the process: once the capture is invalidated, the
// calls that fail after it (every launch into the stream) pass the CUDA and cuBLAS checks (ops/
// cuda/cuda_check.h) without effect, end_capture returns the error, and the caller runs the same
// work again without a graph (capture_refused). Any other CUDA error met by begin_capture or
// end_capture (a broken or exhausted device) is an error the caller returns: running the work
// again eagerly would meet it too.

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
    // stream) from the calling thread: nothing runs until the graph is launched. Errors (then
    // nothing is being captured): kUnimplemented, CUDA refuses the capture with a capture-specific
    // error; kInternal, any other CUDA error.
    static Status begin_capture(CUstream_st* stream);
    // Ends the capture begun on `stream` and instantiates the graph. Errors (the capture is over
    // either way): kUnimplemented, the capture was invalidated (an operation in it cannot be
    // captured) or its graph is refused with another capture-specific error, with CUDA's reason;
    // kInternal, any other CUDA error (instantiation out of memory, a device fault).
    static Result<CudaGraph> end_capture(CUstream_st* stream);
    // Whether a begin_capture or end_capture error means only that the work cannot be captured
    // (run it without a graph), not that CUDA failed (return the error).
    static bool capture_refused(const Status& s) { return s.code() == StatusCode::kUnimplemented; }
    // Whether `cuda_error` (a cudaError_t) is one of CUDA's capture-specific errors, which make
    // begin_capture and end_capture refusals: an operation not allowed while capturing, or a
    // capture invalidated by one (cudaErrorStreamCaptureUnsupported, _Invalidated, _Merge,
    // _Unjoined, _Isolation, _Implicit, cudaErrorCapturedEvent). Not _Unmatched or _WrongThread:
    // begin and end do not pair up, a bug after which the stream may still be capturing.
    static bool capture_specific(int cuda_error);
    // Whether the calling thread's capture (begin_capture, not yet ended) has been invalidated:
    // nothing enqueued from here until end_capture runs. A caller that enqueues through another
    // library (an NCCL collective) skips its call then, as the checked CUDA calls pass without
    // effect. False when the thread is not capturing.
    static bool capture_invalidated();

    bool empty() const { return exec_ == nullptr; }
    // Enqueues one replay on `stream` (checked: a captured graph).
    void launch(CUstream_st* stream) const;

private:
    void* graph_ = nullptr;  // cudaGraph_t
    void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace lathe
