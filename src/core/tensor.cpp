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

namespace {
bool is_float_dtype(DType t) {
    return t == DType::kF32 || t == DType::kBF16 || t == DType::kE4M3 || t == DType::kE5M2;
}

float load_as_float(const void* data, DType t, int64_t i) {
    switch (t) {
        case DType::kF32:
            return static_cast<const float*>(data)[i];
        case DType::kBF16:
            return bf16_to_float(static_cast<const bf16*>(data)[i]);
        case DType::kE4M3:
            return e4m3_to_float(static_cast<const fp8_e4m3*>(data)[i]);
        case DType::kE5M2:
            return e5m2_to_float(static_cast<const fp8_e5m2*>(data)[i]);
        default:
            LATHE_CHECK(false, "not a float dtype: {}", dtype_name(t));
    }
    return 0.0f;
}

void store_float(void* data, DType t, int64_t i, float v, Fp8Overflow mode) {
    switch (t) {
        case DType::kF32:
            static_cast<float*>(data)[i] = v;
            return;
        case DType::kBF16:
            static_cast<bf16*>(data)[i] = float_to_bf16(v);
            return;
        case DType::kE4M3:
            static_cast<fp8_e4m3*>(data)[i] = float_to_e4m3(v, mode);
            return;
        case DType::kE5M2:
            static_cast<fp8_e5m2*>(data)[i] = float_to_e5m2(v, mode);
            return;
        default:
            LATHE_CHECK(false, "not a float dtype: {}", dtype_name(t));
    }
}
}  // namespace

void tensor_convert(TensorView dst, ConstTensorView src, Fp8Overflow fp8_overflow) {
    LATHE_CHECK(dst.numel() == src.numel(), "tensor_convert {} -> {}", src.to_string(),
                dst.to_string());
    LATHE_CHECK(dst.device() == Device::kCpu && src.device() == Device::kCpu,
                "tensor_convert runs on the host: {} -> {}", src.to_string(), dst.to_string());
    if (dst.dtype() == src.dtype()) {
        std::memcpy(dst.data(), src.data(), src.bytes());
        return;
    }
    LATHE_CHECK(is_float_dtype(dst.dtype()) && is_float_dtype(src.dtype()),
                "tensor_convert between {} and {}", dtype_name(src.dtype()),
                dtype_name(dst.dtype()));
    for (int64_t i = 0; i < src.numel(); ++i)
        store_float(dst.data(), dst.dtype(), i, load_as_float(src.data(), src.dtype(), i),
                    fp8_overflow);
}

void HostTensor::FreeAligned::operator()(std::byte* p) const {
    std::free(p);
}

}  // namespace lathe
