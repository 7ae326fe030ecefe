#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/memory.h"

namespace lathe {

namespace {

__global__ void cast_f32_to_bf16_kernel(__nv_bfloat16* dst, const float* src, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void cast_bf16_to_f32_kernel(float* dst, const __nv_bfloat16* src, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

// Up to kZeroRangesPerLaunch ranges of 4-byte words from `base`: blockIdx.y picks the range, the
// x blocks stride over its words (16-byte stores where the range's words allow, 4-byte at its
// ends).
struct ZeroRangesArgs {
    uint64_t first[kZeroRangesPerLaunch];  // in 4-byte words from base
    uint64_t words[kZeroRangesPerLaunch];
};

__global__ void zero_ranges_kernel(uint32_t* base, ZeroRangesArgs a) {
    uint32_t* p = base + a.first[blockIdx.y];
    uint64_t n = a.words[blockIdx.y];
    const uint64_t tid = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    // Words up to the first 16-byte boundary, then uint4 stores, then the tail.
    const uint64_t to_boundary = (16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / 4;
    const uint64_t head = to_boundary < n ? to_boundary : n;
    if (tid < head) p[tid] = 0;
    p += head;
    n -= head;
    uint4* v = reinterpret_cast<uint4*>(p);
    const uint64_t nv = n / 4;
    for (uint64_t i = tid; i < nv; i += stride) v[i] = make_uint4(0, 0, 0, 0);
    for (uint64_t i = nv * 4 + tid; i < n; i += stride) p[i] = 0;
}

}  // namespace

void cuda_zero_ranges(void* base, std::span<const ByteRange> ranges, CUstream_st* stream) {
    LATHE_CHECK(reinterpret_cast<uintptr_t>(base) % 4 == 0,
                "cuda_zero_ranges: the base {} is not 4-byte aligned", base);
    ZeroRangesArgs a{};
    int n = 0;
    uint64_t most = 0;
    const auto launch = [&] {
        if (n == 0) return;
        constexpr int kThreads = 256;
        // Enough blocks for the largest range's 16-byte stores, at most 1024 a range.
        const uint64_t blocks = std::min<uint64_t>(1024, (most / 4 + kThreads - 1) / kThreads);
        const dim3 grid(unsigned(std::max<uint64_t>(blocks, 1)), unsigned(n));
        zero_ranges_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint32_t*>(base), a);
        LATHE_CUDA_CHECK_LAUNCH();
        n = 0;
        most = 0;
    };
    for (const ByteRange& r : ranges) {
        LATHE_CHECK(r.begin <= r.end && r.begin % 4 == 0 && r.end % 4 == 0,
                    "cuda_zero_ranges: bytes [{}, {}) are not a range of 4-byte words", r.begin,
                    r.end);
        if (r.begin == r.end) continue;
        a.first[n] = r.begin / 4;
        a.words[n] = (r.end - r.begin) / 4;
        most = std::max<uint64_t>(most, a.words[n]);
        if (++n == kZeroRangesPerLaunch) launch();
    }
    launch();
}

bool cuda_backend_built() {
    return true;
}

void cuda_copy_async(TensorView dst, ConstTensorView src, CUstream_st* stream) {
    LATHE_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape(), "copy {} <- {}",
                dst.to_string(), src.to_string());
    if (src.bytes() == 0) return;
    LATHE_CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDefault, stream));
}

void cuda_copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                          size_t row_bytes, size_t rows, CUstream_st* stream) {
    if (row_bytes == 0 || rows == 0) return;
    LATHE_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                       cudaMemcpyDefault, stream));
}

void cuda_cast(TensorView dst, ConstTensorView src, CUstream_st* stream) {
    LATHE_CHECK(dst.device() == Device::kCuda && src.device() == Device::kCuda &&
                    dst.numel() == src.numel(),
                "cuda_cast {} <- {}", dst.to_string(), src.to_string());
    const int64_t n = src.numel();
    if (n == 0) return;
    const int threads = 256;
    const int blocks = int(std::min<int64_t>((n + threads - 1) / threads, 65536));
    if (src.dtype() == DType::kF32 && dst.dtype() == DType::kBF16) {
        cast_f32_to_bf16_kernel<<<blocks, threads, 0, stream>>>(
            static_cast<__nv_bfloat16*>(dst.data()), static_cast<const float*>(src.data()), n);
    } else if (src.dtype() == DType::kBF16 && dst.dtype() == DType::kF32) {
        cast_bf16_to_f32_kernel<<<blocks, threads, 0, stream>>>(
            static_cast<float*>(dst.data()), static_cast<const __nv_bfloat16*>(src.data()), n);
    } else {
        LATHE_CHECK(false, "cuda_cast {} -> {} is not implemented", dtype_name(src.dtype()),
                    dtype_name(dst.dtype()));
    }
    LATHE_CUDA_CHECK_LAUNCH();
}

PinnedHostBuffer::PinnedHostBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) LATHE_CUDA_CHECK(cudaMallocHost(&data_, bytes));
}

PinnedHostBuffer::~PinnedHostBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
    if (this != &other) {
        if (data_ != nullptr) cudaFreeHost(data_);
        data_ = std::exchange(other.data_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
}

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device / no driver" error
        return 0;
    }
    return n;
}

CudaMemoryInfo cuda_memory_info(int device) {
    LATHE_CUDA_CHECK(cudaSetDevice(device));
    CudaMemoryInfo info;
    LATHE_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
    return info;
}

std::string cuda_device_name(int device) {
    cudaDeviceProp prop{};
    LATHE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    return prop.name;
}

}  // namespace lathe
