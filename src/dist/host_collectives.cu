// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cuda_runtime.h>

#include <vector>

#include "dist/host_collectives.h"

namespace lathe {

namespace {

Status cuda_status(cudaError_t err, std::string_view what) {
    if (err == cudaSuccess) return ok_status();
    return internal_error("host collective through device memory ({}): CUDA error {} ({})", what,
                          cudaGetErrorName(err), cudaGetErrorString(err));
}

// This thread's staging buffer on one device. Never freed: it lives as long as the thread and
// freeing it from a static destructor could run after the CUDA runtime is gone.
struct Staging {
    int device = -1;
    std::byte* data = nullptr;
    size_t bytes = 0;
};

constexpr size_t kMinStagingBytes = 4096;

Result<std::byte*> staging_for(size_t bytes) {
    thread_local std::vector<Staging> buffers;
    int device = 0;
    LATHE_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
    Staging* s = nullptr;
    for (Staging& b : buffers)
        if (b.device == device) s = &b;
    if (s == nullptr) s = &buffers.emplace_back(Staging{device, nullptr, 0});
    if (s->bytes < bytes) {
        // Every earlier call ended with a wait for its stream, so the old buffer is idle.
        if (s->data != nullptr) cudaFree(s->data);
        s->data = nullptr;
        s->bytes = 0;
        const size_t grown = std::max(kMinStagingBytes, bytes);
        void* p = nullptr;
        LATHE_RETURN_IF_ERROR(cuda_status(cudaMalloc(&p, grown), "cudaMalloc"));
        s->data = static_cast<std::byte*>(p);
        s->bytes = grown;
    }
    return s->data;
}

}  // namespace

namespace detail {

Status all_gather_bytes_staged(Communicator& comm, std::span<const std::byte> mine,
                               std::span<std::byte> all, CUstream_st* stream) {
    LATHE_ASSIGN_OR_RETURN(std::byte * device, staging_for(all.size()));
    const size_t n = mine.size();
    const int64_t numel = int64_t(n);
    std::byte* chunk = device + size_t(comm.rank()) * n;
    Status status = cuda_status(
        cudaMemcpyAsync(chunk, mine.data(), n, cudaMemcpyHostToDevice, stream), "copy in");
    // In place: this rank's bytes already sit in its chunk.
    if (status.ok())
        status =
            comm.all_gather(TensorView(device, DType::kU8, {numel * comm.size()}, Device::kCuda),
                            ConstTensorView(chunk, DType::kU8, {numel}, Device::kCuda), stream);
    if (status.ok())
        status = cuda_status(
            cudaMemcpyAsync(all.data(), device, all.size(), cudaMemcpyDeviceToHost, stream),
            "copy out");
    // Waits even after an error, so that nothing still uses the buffer when the next call does.
    const Status synced = cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    LATHE_RETURN_IF_ERROR(status);
    return synced;
}

}  // namespace detail

}  // namespace lathe
