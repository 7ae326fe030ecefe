#pragma once
// Host-callable memory helpers of the CUDA backend that the model and the trainer need besides the
// ops: asynchronous copies, dtype casts of whole tensors (the bf16 compute copy of the parameters),
// pinned host buffers (batches go to the GPU from them without a staging copy by the driver), and
// the device's memory figures. Like cuda_state.h, this header keeps CUDA headers out of the
// CPU-compiled code that includes it, in every build: without CUDA its functions are the stubs of
// ops/cuda_stub/memory.cpp (ops/cuda_stub/no_cuda.h).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/tensor.h"

struct CUstream_st;

namespace lathe {

// Whether this build has the CUDA backend (false from the stub of a build without CUDA): callers
// that return a Status refuse a CUDA context with it instead of reaching a stub that stops.
bool cuda_backend_built();

// Enqueues a copy of src into dst (same dtype and shape, checked) on `stream` and returns at once.
// Host memory on either side must stay untouched until the stream passes the copy; it must be
// pinned (PinnedHostBuffer) for the copy to be truly asynchronous.
void cuda_copy_async(TensorView dst, ConstTensorView src, CUstream_st* stream);

// Enqueues a copy of `rows` rows of `row_bytes` bytes each, from src (rows src_pitch bytes apart)
// to dst (rows dst_pitch bytes apart), in whichever direction their memory spaces say
// (cudaMemcpy2DAsync); returns at once, as cuda_copy_async. One call for what would be `rows`
// copies: e.g. a batch's new keys into the rows of a cache, at one position in each.
void cuda_copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                          size_t row_bytes, size_t rows, CUstream_st* stream);

// dst = src converted elementwise, both device tensors of equal element count: f32 -> bf16
// (round to nearest even, as core/dtype.h's float_to_bf16) or bf16 -> f32 (exact). Enqueued.
void cuda_cast(TensorView dst, ConstTensorView src, CUstream_st* stream);

// Bytes [begin, end) from some base; both multiples of 4.
struct ByteRange {
    size_t begin = 0;
    size_t end = 0;
};

// Zeroes the bytes of every range from device pointer `base` (4-byte aligned), enqueued on
// `stream`: one kernel launch for up to kZeroRangesPerLaunch ranges (the launch's argument), so a
// list of scattered entries (an arena's biases and norms between its matrices) costs one launch
// instead of a memset each. Empty ranges are skipped; a range not a multiple of 4 stops.
inline constexpr int kZeroRangesPerLaunch = 128;
void cuda_zero_ranges(void* base, std::span<const ByteRange> ranges, CUstream_st* stream);

// Page-locked host memory (cudaMallocHost), freed on destruction. Move-only.
class PinnedHostBuffer {
public:
    PinnedHostBuffer() = default;
    // Out of memory stops with the size asked for; 0 bytes gives a null buffer.
    explicit PinnedHostBuffer(size_t bytes);
    ~PinnedHostBuffer();
    PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
    PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
    PinnedHostBuffer(const PinnedHostBuffer&) = delete;
    PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

    void* data() const { return data_; }
    size_t bytes() const { return bytes_; }

private:
    void* data_ = nullptr;
    size_t bytes_ = 0;
};

struct CudaMemoryInfo {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
};

// Number of CUDA devices the driver reports; 0 when there is no GPU or no usable driver (never
// stops: a machine without a GPU is a normal case).
int cuda_device_count();

// cudaMemGetInfo for `device` (made current).
CudaMemoryInfo cuda_memory_info(int device);

// The device's name, e.g. "NVIDIA H100 80GB HBM3".
std::string cuda_device_name(int device);

}  // namespace lathe
