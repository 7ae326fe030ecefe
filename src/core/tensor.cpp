#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace lathe {

namespace {
constexpr size_t kHostAlignment = 64;  // a cache line; also what AVX-512 loads like
}

HostTensor::HostTensor(DType dtype, Shape shape) : dtype_(dtype), shape_(shape) {
    const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
    // aligned_alloc wants a size that is a multiple of the alignment (and > 0 to be portable).
    const size_t padded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* p = std::aligned_alloc(kHostAlignment, padded == 0 ? kHostAlignment : padded);
    LATHE_CHECK(p != nullptr, "out of host memory allocating {} bytes for {} {}", bytes,
                dtype_name(dtype), shape.to_string());
    std::memset(p, 0, padded == 0 ? kHostAlignment : padded);
    data_.reset(static_cast<std::byte*>(p));
}

void HostTensor::FreeAligned::operator()(std::byte* p) const {
    std::free(p);
}

}  // namespace lathe
