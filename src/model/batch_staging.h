#pragma once
// BatchStaging: the way a model's batch (host tensors) reaches its activation arena without the
// host waiting for the GPU. On CUDA it owns a pinned host buffer of two halves and one event per
// half: begin() returns the byte offset of the half the next batch goes into, once the copies
// that last read that half have finished (end() recorded an event after them, a micro-batch
// ago, so this rarely waits); copy() stages a host tensor at an offset inside that half and
// enqueues its copy on the stream; end() records the half's event. The caller's host memory may
// be reused as soon as copy() returns. On the CPU nothing is owned: copy() is a memcpy and
// begin() returns 0.
//
// Ownership: move-only by value (shared handles); the buffer and events are freed with the last
// copy. Per step it allocates nothing and synchronizes only on the half's event.

#include <array>
#include <cstddef>
#include <memory>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe {

class CudaEvent;  // ops/cuda/cuda_state.h

class BatchStaging {
public:
    BatchStaging() = default;
    // For halves of `half_bytes` bytes, copying on `ctx`'s stream: on CUDA allocates the pinned
    // buffer (2 * half_bytes) and the two events; on the CPU owns nothing.
    static Result<BatchStaging> create(size_t half_bytes, const Context& ctx);

    // The byte offset of the half the next batch stages into (the other one than last time),
    // after waiting for the copies that last read it. 0 on the CPU.
    size_t begin();
    // dst (model memory) = src (host), staged at `offset` (from begin(), plus the caller's slot;
    // offset + src.bytes() must stay inside the half, checked) and copied asynchronously on CUDA;
    // a plain copy on the CPU. src and dst have the same bytes (checked).
    void copy(TensorView dst, ConstTensorView src, size_t offset);
    // Marks the end of the copies out of the current half (the next begin() of it waits for them).
    void end();

private:
    bool on_cuda_ = false;
    CUstream_st* stream_ = nullptr;
    std::shared_ptr<void> pinned_;  // CUDA: the pinned buffer, two halves of half_bytes_
    size_t half_bytes_ = 0;
    int half_ = 0;                                      // the half the last begin() returned
    std::array<std::shared_ptr<CudaEvent>, 2> staged_;  // CUDA: recorded after each half's copies
};

}  // namespace lathe
