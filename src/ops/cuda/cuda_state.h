#pragma once
// Ownership of CUDA resources for the ops (STYLE.md, "Ownership"): device memory and the per-device
// state (stream, cuBLASLt handle, workspaces) that a Context points at.
//
// One CudaState per device. It owns the device's streams and everything an op may need besides its
// tensors:
// the cuBLASLt handle and workspace, and a fixed scratch area for an op's small temporaries
// (per-block partial sums of the deterministic reductions, per-row losses). All of it is
// allocated once, in the constructor (nothing is allocated per step), and sized by the constants
// below so that a memory plan can count it. The exception is the attention op's cuDNN state
// (handle, graphs, workspace), created at its first use and grown only when a new attention shape
// is prepared (ops/cuda/attention.h: attention_prepare, attention_buffer_bytes). Ops that use the
// handle, workspace or scratch must run on the state's own stream, one after another:
// cuda_state_of() checks that the context's stream is the state's, which is what makes sharing one
// scratch area between ops safe.
//
// Streams: `stream()` is the compute stream every op runs on. Beside it the state owns a copy
// stream (host<->device transfers: staging, offload), a communication stream (collectives,
// dist/communicator.h), a tensor-parallel stream (the collectives inside a layer, model/block.h,
// not enqueued behind the data-parallel gradient reductions on the communication stream) and an
// optimizer stream (the overlapped AdamW update, optim/adamw_optimizer.h), so that transfers,
// collectives and the update can overlap compute. Priorities: communication and tensor-parallel
// the device's highest, compute one level above the lowest, the optimizer stream the lowest, so
// that the update's blocks fill the SMs the forward leaves idle rather than delaying it (where
// the device has a single priority level, all share it). Work on two streams is unordered
// unless ordered by an event: `wait_for(waiter, signaller)` makes what is enqueued on `waiter`
// afterwards wait for everything enqueued on `signaller` so far, on the device, without blocking
// the host or allocating. A buffer handed from one stream to another needs such an order both ways:
// the reader waits for the writer, and the writer's next write waits for the reader. CudaEvent is
// the same tool for orders that must be kept past one call (e.g. "the gradients of layer i are
// ready").
//
// This header is included by CPU-compiled dispatchers (src/ops/<op>.cpp) and keeps CUDA headers
// out of them: cudaStream_t is CUstream_st*, cublasLtHandle_t is cublasLtContext*.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "core/tensor.h"
#include "ops/context.h"

struct cublasLtContext;
// cudaEvent_t is `struct CUevent_st*`.
struct CUevent_st;

namespace lathe {

// Device memory from cudaMalloc (never managed memory), freed on destruction. Move-only.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    // Allocates `bytes` on the current device (cudaMalloc aligns to at least 256 bytes); 0 bytes
    // gives a null buffer. Out of memory stops with the size asked for.
    explicit DeviceBuffer(size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& other) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* data() const { return data_; }
    size_t bytes() const { return bytes_; }
    // A view of the first numel(shape) elements; the buffer must hold them (checked).
    TensorView view(DType dtype, Shape shape) const;

private:
    void* data_ = nullptr;
    size_t bytes_ = 0;
};

// A CUDA event that orders streams (created with cudaEventDisableTiming, the cheapest kind: it
// cannot time). Created on the current device, destroyed with the object. Move-only.
class CudaEvent {
public:
    CudaEvent();
    // An event that also keeps the time it was reached, for elapsed_ms (a little dearer to record).
    enum class Timing { kOff, kOn };
    explicit CudaEvent(Timing timing);
    ~CudaEvent();
    CudaEvent(CudaEvent&& other) noexcept;
    CudaEvent& operator=(CudaEvent&& other) noexcept;
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;

    CUevent_st* get() const { return event_; }
    // Marks the point `stream` has reached: everything enqueued on it so far.
    void record(CUstream_st* stream);
    // Work enqueued on `stream` after this call waits for the point of the latest record() (a
    // later record() does not change what this wait waits for). The host does not block; an
    // event never recorded is complete.
    void wait(CUstream_st* stream) const;
    // Blocks the host until the point of the latest record() is reached.
    void synchronize() const;
    // Milliseconds between the points `start` and `end` were reached (both timing events, both
    // recorded and reached: call after a synchronize that covers them).
    static float elapsed_ms(const CudaEvent& start, const CudaEvent& end);

private:
    CUevent_st* event_ = nullptr;
};

struct CudaState {
public:
    // cuBLASLt workspace: NVIDIA's recommendation for Hopper (larger split-K and stream-K tiles).
    static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
    // Op scratch: the largest user is a column reduction's partial sums, at most
    // kMaxRowChunks (ops/cuda/column_reduce.h) x C fp32 values per pass.
    static constexpr size_t kScratchBytes = size_t(32) << 20;

    // Makes `device` current, creates the five non-blocking streams (the two collective ones at the
    // device's highest priority, so collectives are not queued behind compute kernels; the
    // optimizer stream below compute, file comment), their
    // ordering events, the cuBLASLt handle and the two buffers. Any failure (no such device, out
    // of memory) stops with the failing call.
    explicit CudaState(int device);
    ~CudaState();
    // Contexts hold a pointer to the state: it never moves.
    CudaState(const CudaState&) = delete;
    CudaState& operator=(const CudaState&) = delete;

    int device() const { return device_; }
    // The compute stream: every op runs here (Context::stream).
    CUstream_st* stream() const { return stream_; }
    // Host<->device transfers that overlap compute.
    CUstream_st* copy_stream() const { return copy_stream_; }
    // Collectives (Communicator calls on GPU buffers).
    CUstream_st* comm_stream() const { return comm_stream_; }
    // The tensor-parallel collectives of a layer when they overlap its compute (header comment).
    CUstream_st* tensor_stream() const { return tensor_stream_; }
    // The overlapped AdamW update (optim/adamw_optimizer.h), at the lowest priority.
    CUstream_st* optimizer_stream() const { return optimizer_stream_; }

    // Work enqueued on `waiter` after this call waits for all work enqueued on `signaller` before
    // it; both are streams of this state (checked). Records the state's event of `signaller` and
    // makes `waiter` wait on it: no host blocking, no allocation; reusing the event is safe since a
    // wait keeps the point recorded when it was enqueued. Call from the thread that drives the
    // state. A no-op when waiter == signaller (a stream is ordered with itself).
    void wait_for(CUstream_st* waiter, CUstream_st* signaller);
    cublasLtContext* cublaslt() const { return cublaslt_; }
    // The device's streaming multiprocessors.
    int sm_count() const { return sm_count_; }
    // The SMs the GEMMs launched from now on plan for (cuBLASLt's SM count target), for GEMMs
    // that run beside a collective holding the others (model/block.h, "Overlap"); 0: all of
    // them, the default. A different target is a different cached algorithm choice.
    int gemm_sm_target() const { return gemm_sm_target_; }
    void set_gemm_sm_target(int sms) { gemm_sm_target_ = sms; }
    // Whether a GEMM problem met for the first time times the heuristic's candidates and keeps
    // the fastest with the same bits (ops/cuda/gemm.h, "Algorithm search"); on by default. A
    // problem keeps the choice it got when first met.
    bool gemm_search() const { return gemm_search_; }
    void set_gemm_search(bool on) { gemm_search_ = on; }
    // The search's counts since the state was made: problems searched, those that kept a faster
    // candidate than the heuristic's first, and the sum of those gains per launch.
    struct GemmSearchCounts {
        int64_t searched = 0, faster = 0;
        double saved_ms = 0.0;
    };
    const GemmSearchCounts& gemm_search_counts() const { return gemm_search_counts_; }
    GemmSearchCounts& gemm_search_counts() { return gemm_search_counts_; }
    void* workspace() const { return workspace_.data(); }
    size_t workspace_bytes() const { return workspace_.bytes(); }

    // The scratch area, for an op needing `bytes` (<= kScratchBytes, checked with the op's name).
    // Its contents are undefined on entry and belong to the op until it returns (stream order).
    void* scratch(size_t bytes, std::string_view op) const;

    // A context that runs ops on this device, on this state's stream.
    Context context();

    // Waits for everything enqueued on the compute stream; an asynchronous kernel error stops
    // here. The other streams are not waited for (synchronize_all does).
    void synchronize() const;
    // Waits for all five streams.
    void synchronize_all() const;

    // Cache of cuBLASLt algorithm choices, keyed by problem (ops/cuda/gemm.cu owns its contents).
    struct MatmulCache;
    MatmulCache& matmul_cache() const { return *matmul_cache_; }

    // The attention op's cuDNN handle, cached cuDNN graphs and their device buffers (workspace,
    // docs bias). ops/cuda/attention.cu defines the type and attention_cache(), which creates it at
    // the first attention call (a process that never runs attention never loads cuDNN); its
    // buffers grow only when a graph is built (ops/cuda/attention.h: attention_prepare).
    struct AttentionCache;
    AttentionCache& attention_cache();
    // Null until the first attention call.
    const AttentionCache* attention_cache_if_created() const { return attention_cache_.get(); }

private:
    // Initialized by making the device current, so that the members below are created on it.
    int device_ = 0;
    CUstream_st* stream_ = nullptr;
    CUstream_st* copy_stream_ = nullptr;
    CUstream_st* comm_stream_ = nullptr;
    CUstream_st* optimizer_stream_ = nullptr;
    CUstream_st* tensor_stream_ = nullptr;
    // wait_for's events, one per signalling stream: compute, copy, communication, optimizer,
    // tensor-parallel.
    CudaEvent order_events_[5];
    cublasLtContext* cublaslt_ = nullptr;
    int sm_count_ = 0;
    int gemm_sm_target_ = 0;
    bool gemm_search_ = true;
    GemmSearchCounts gemm_search_counts_;
    DeviceBuffer workspace_;
    DeviceBuffer scratch_;
    std::unique_ptr<MatmulCache> matmul_cache_;
    // Defined in ops/cuda/attention.cu, where AttentionCache is a complete type.
    struct AttentionCacheDeleter {
        void operator()(AttentionCache* cache) const;
    };
    std::unique_ptr<AttentionCache, AttentionCacheDeleter> attention_cache_;
};

// The CudaState behind a CUDA context, for ops that need handles or scratch. Stops, naming the op,
// when the context has none or runs on another stream than the state's.
CudaState& cuda_state_of(const Context& ctx, std::string_view op);

// Copies src into dst (same dtype and shape, checked) in whichever direction their memory spaces
// say, enqueued on `stream`; when either side is host memory it waits for the copy to finish, so
// the host side may be reused or read at once. For tests and one-time uploads, not the step loop.
void cuda_copy_sync(TensorView dst, ConstTensorView src, CUstream_st* stream);

// Sets every byte of a device tensor to `byte`, enqueued on `stream`. 0xFF makes every f32 and
// bf16 element a NaN: tests poison outputs this way to catch elements an op failed to write.
void cuda_fill_bytes(TensorView dst, uint8_t byte, CUstream_st* stream);

}  // namespace lathe
