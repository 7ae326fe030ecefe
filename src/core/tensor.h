#pragma once
// Tensor views: non-owning, typed, shaped pointers into memory that someone else owns (an arena, a
// HostTensor, an mmap). Ops take views; owners are move-only RAII types (STYLE.md, "Ownership").
//
// A view is always dense and row-major (the last dimension is contiguous, no strides): every op of
// the engine works on whole contiguous tensors, which keeps the CPU loops and the CUDA kernels
// plain. A view knows its element type, its shape (rank 0..kMaxRank) and its memory space (host or
// a CUDA device), so an op can check that it was handed what it expects before touching any byte.
// A default-constructed view is null: the way to pass an absent optional tensor (a bias,
// positions). Broken expectations on views (wrong dtype, shape, memory space) are bugs and stop via
// LATHE_CHECK.

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>

#include "core/check.h"
#include "core/dtype.h"

namespace lathe {

// Where a view's bytes live. kCuda memory is never dereferenced on the host.
enum class Device : uint8_t { kCpu, kCuda };

constexpr std::string_view device_name(Device d) {
    return d == Device::kCpu ? "cpu" : "cuda";
}

inline constexpr int kMaxRank = 5;

// Dimensions of a dense row-major tensor. Every dimension is >= 0.
class Shape {
public:
    Shape() = default;
    Shape(std::initializer_list<int64_t> dims) {
        LATHE_CHECK(dims.size() <= size_t(kMaxRank), "rank {} > {}", dims.size(), kMaxRank);
        for (int64_t d : dims) {
            LATHE_CHECK(d >= 0, "negative dimension {}", d);
            dims_[rank_++] = d;
        }
    }

    int rank() const { return rank_; }
    // Dimension i; negative i counts from the end (-1 is the last).
    int64_t operator[](int i) const {
        if (i < 0) i += rank_;
        LATHE_CHECK(i >= 0 && i < rank_, "dimension index {} of a rank-{} shape", i, rank_);
        return dims_[i];
    }
    // Product of the dimensions (1 for rank 0).
    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < rank_; ++i) n *= dims_[i];
        return n;
    }
    // A copy with dimension i (negative counts from the end) replaced by d.
    Shape with_dim(int i, int64_t d) const {
        if (i < 0) i += rank_;
        LATHE_CHECK(i >= 0 && i < rank_ && d >= 0, "with_dim({}, {}) of a rank-{} shape", i, d,
                    rank_);
        Shape s = *this;
        s.dims_[i] = d;
        return s;
    }
    bool operator==(const Shape& o) const {
        if (rank_ != o.rank_) return false;
        for (int i = 0; i < rank_; ++i)
            if (dims_[i] != o.dims_[i]) return false;
        return true;
    }
    // "(2, 3, 4)"; "()" for rank 0.
    std::string to_string() const {
        std::string s = "(";
        for (int i = 0; i < rank_; ++i) s += fmt::format("{}{}", i ? ", " : "", dims_[i]);
        return s + ")";
    }

private:
    std::array<int64_t, kMaxRank> dims_{};
    int rank_ = 0;
};

template <bool kConst>
class TensorViewT {
public:
    using Ptr = std::conditional_t<kConst, const void*, void*>;
    template <typename T>
    using ElemPtr = std::conditional_t<kConst, const T*, T*>;

    // A null view (an absent optional tensor).
    TensorViewT() = default;
    TensorViewT(Ptr data, DType dtype, Shape shape, Device device = Device::kCpu)
        : data_(data), dtype_(dtype), shape_(shape), device_(device) {}
    // Every TensorView converts to a ConstTensorView.
    template <bool kOther, typename = std::enable_if_t<kConst && !kOther>>
    TensorViewT(const TensorViewT<kOther>& v)  // NOLINT: implicit by design
        : data_(v.data()), dtype_(v.dtype()), shape_(v.shape()), device_(v.device()) {}

    bool is_null() const { return data_ == nullptr; }
    Ptr data() const { return data_; }
    DType dtype() const { return dtype_; }
    Device device() const { return device_; }
    const Shape& shape() const { return shape_; }
    int rank() const { return shape_.rank(); }
    int64_t dim(int i) const { return shape_[i]; }
    int64_t numel() const { return shape_.numel(); }
    size_t bytes() const { return size_t(numel()) * dtype_size(dtype_); }

    // Typed pointer; the element type must match the view's dtype. A null view gives nullptr.
    template <typename T>
    ElemPtr<T> as() const {
        LATHE_CHECK(is_null() || DTypeOf<T>::value == dtype_, "view holds {}, accessed as {}",
                    dtype_name(dtype_), dtype_name(DTypeOf<T>::value));
        return static_cast<ElemPtr<T>>(data_);
    }

    // The same bytes seen with another shape of equal element count.
    TensorViewT reshape(Shape shape) const {
        LATHE_CHECK(shape.numel() == numel(), "reshape {} -> {}", shape_.to_string(),
                    shape.to_string());
        return TensorViewT(data_, dtype_, shape, device_);
    }

    // Rows [begin, end) of dimension 0, a contiguous sub-tensor.
    TensorViewT slice(int64_t begin, int64_t end) const {
        LATHE_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0),
                    "slice [{}, {}) of {}", begin, end, shape_.to_string());
        const size_t row_bytes = shape_.numel() == 0 ? 0 : bytes() / size_t(dim(0));
        const Shape s = shape_.with_dim(0, end - begin);
        using BytePtr = std::conditional_t<kConst, const std::byte*, std::byte*>;
        return TensorViewT(static_cast<BytePtr>(data_) + size_t(begin) * row_bytes, dtype_, s,
                           device_);
    }

    // "f32 (2, 3) cpu", for check messages.
    std::string to_string() const {
        return fmt::format("{} {} {}", dtype_name(dtype_), shape_.to_string(),
                           device_name(device_));
    }

private:
    Ptr data_ = nullptr;
    DType dtype_ = DType::kF32;
    Shape shape_;
    Device device_ = Device::kCpu;
};

using TensorView = TensorViewT<false>;
using ConstTensorView = TensorViewT<true>;

// Copies src into dst element by element on the host, converting between floating-point types:
// any of f32, bf16, e4m3, e5m2 to any other (through fp32; narrowing rounds to nearest even, fp8
// per `fp8_overflow`), or a plain copy when the dtypes are equal. Both views live on the host and
// have the same number of elements (checked); integer dtypes convert only to themselves (checked).
// For preparing bf16 inputs of CUDA ops and reading their outputs back against the CPU twin.
void tensor_convert(TensorView dst, ConstTensorView src,
                    Fp8Overflow fp8_overflow = Fp8Overflow::kSaturate);

// Host memory that owns one dense tensor, 64-byte aligned and zero-filled. Move-only. For tests and
// CPU-side buffers; the training engine carves its tensors from arenas (core/arena.h) instead.
class HostTensor {
public:
    HostTensor() = default;
    HostTensor(DType dtype, Shape shape);

    TensorView view() { return TensorView(data_.get(), dtype_, shape_, Device::kCpu); }
    ConstTensorView view() const {
        return ConstTensorView(data_.get(), dtype_, shape_, Device::kCpu);
    }
    template <typename T>
    T* as() {
        return view().as<T>();
    }
    template <typename T>
    const T* as() const {
        return view().as<T>();
    }
    const Shape& shape() const { return shape_; }
    int64_t numel() const { return shape_.numel(); }

private:
    struct FreeAligned {
        void operator()(std::byte* p) const;
    };
    std::unique_ptr<std::byte[], FreeAligned> data_;
    DType dtype_ = DType::kF32;
    Shape shape_;
};

}  // namespace lathe
