#pragma once
// The op context: which backend runs an op, on which device and stream, with which handles.
//
// Every op is a pair of free functions `<op>_forward` / `<op>_backward` taking views and, last, a
// Context (DESIGN.md: outputs, saved statistics, inputs, weights, sizes, then the context). The
// function in src/ops/<op>.cpp checks shapes once, then dispatches on `backend` to the CPU
// reference (src/ops/cpu/<op>.cpp) or the CUDA implementation (src/ops/cuda/<op>.cu, built when
// LATHE_HAVE_CUDA is defined). Model and trainer code only ever call the dispatching functions, so
// swapping the backend means handing them another Context, nothing else.
//
// Adding the CUDA twin of an op: src/ops/cuda/<op>.cu holds the kernels and a host launcher,
// declared in src/ops/cuda/<op>.h with CPU-visible types only (typed device pointers, sizes,
// `CudaState&` and `CUstream_st*`) in the order outputs, saved statistics, inputs, weights, sizes,
// then the state and stream; src/ops/cuda_stub/<op>.cpp defines the same launcher for builds
// without CUDA as a call to detail::no_cuda (ops/cuda_stub/no_cuda.h). src/ops/<op>.cpp then calls
// it under `case Backend::kCuda:`, with no preprocessor conditional, after the shared shape checks
// it already runs. Until then a kCuda call stops with "no cuda implementation". The CUDA test runs
// both backends on the same random inputs (ops/gradcheck.h, core/tensor.h's tensor_convert for
// bf16).
//
// A Context owns nothing: the stream and the CUDA library handles belong to an RAII owner in
// ops/cuda (one per device), which fills in `cuda`; the communicator belongs to whoever set up the
// processes (src/dist, run/). No op keeps global state.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/tensor.h"

// cudaStream_t is `struct CUstream_st*`; naming the struct keeps CUDA headers out of CPU code.
struct CUstream_st;

namespace lathe {

enum class Backend : uint8_t { kCpu, kCuda };

constexpr std::string_view backend_name(Backend b) {
    return b == Backend::kCpu ? "cpu" : "cuda";
}

// Per-device CUDA state (cuBLASLt/cuDNN handles, workspaces, the compute, copy and communication
// streams), defined by ops/cuda.
struct CudaState;
// The processes this one computes with (rank, world, collectives), defined by dist/communicator.h.
// Ops never include dist/: code above the op layer (model, optimizer, trainer) calls the
// collectives through this pointer.
class Communicator;

struct Context {
    Backend backend = Backend::kCpu;
    int device = 0;                 // CUDA device ordinal (kCuda only)
    CUstream_st* stream = nullptr;  // the stream ops are enqueued on (kCuda only; null = default)
    CudaState* cuda = nullptr;      // handles and workspaces (kCuda only), owned elsewhere
    // Ops are deterministic by default (same inputs, same bits). false lets an op pick a faster
    // variant that is not (it says so in its header: today the CUDA attention backward, whose
    // dQ is then accumulated with atomics, as PyTorch's flash attention does).
    bool deterministic = true;
    // The group of processes this one trains with, owned elsewhere (run/ sets it up for the
    // process's lifetime). Null means a single process: nothing to reduce, gather or broadcast.
    // A Communicator's GPU collectives run on a stream the caller names (usually CudaState's
    // communication stream, ordered against compute with CudaState::wait_for).
    Communicator* comm = nullptr;
    // A bound on the workspace of the CUDA attention backward (cuda::AttentionShape::
    // backward_workspace_cap): above it the deterministic backward runs in batch chunks, the
    // same bits in less memory. 0: no bound. A training model sets it in its own copy to the
    // scratch it lends the attention workspace (model/memory_plan.h, attention_backward_cap).
    size_t attention_backward_workspace_cap = 0;

    // The memory space every tensor handed to an op under this context must live in.
    Device memory() const { return backend == Backend::kCpu ? Device::kCpu : Device::kCuda; }
};

// How a backward writes the gradient of an input: overwrite (=) or accumulate (+=). Accumulating
// is for inputs read by several branches (the residual stream feeding a norm, GPT-NeoX's parallel
// attention and MLP), so their gradients sum in place without a temporary and an extra add.
enum class GradMode : uint8_t { kOverwrite, kAccumulate };

// The context for the CPU reference backend (OpenMP threads as OMP_NUM_THREADS says).
inline Context cpu_context() {
    return Context{};
}

}  // namespace lathe
