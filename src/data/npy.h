#pragma once
// The numpy .npy format, as far as the index files GPT-NeoX and Megatron cache (doc_idx,
// sample_idx, shuffle_idx) need it: little-endian integer and float arrays in C order.
//
// On disk (numpy's format.py, versions 1.0 / 2.0 / 3.0):
//   bytes 0..5   "\x93NUMPY"
//   byte  6, 7   major, minor version (1.0: 2-byte header length; 2.0, 3.0: 4-byte; 3.0: UTF-8)
//   then         little-endian header length, then the header: a Python dict literal
//                "{'descr': '<i4', 'fortran_order': False, 'shape': (10,), }" padded with spaces
//                and ended by '\n' so that the data starts on a multiple of 64 bytes
//   then         the array bytes, prod(shape) * itemsize, C order.
// npy_write produces byte-identical files to numpy 2.x's np.save (same padding, including the
// spare spaces numpy leaves for growing the first axis). npy_open accepts any numpy version's
// layout for the supported dtypes and refuses everything else with an error naming the file.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/status.h"
#include "io/file.h"

namespace lathe {

// clang-format off
enum class NpyDtype { kInt8, kUint8, kInt16, kUint16, kInt32, kUint32, kInt64, kUint64, kFloat32,
                      kFloat64 };
// clang-format on

size_t npy_dtype_size(NpyDtype dtype);
// numpy's descr string: "<i4", "|u1", "<f8", ...
const char* npy_dtype_descr(NpyDtype dtype);

// The NpyDtype of a C++ element type (compile-time).
template <typename T>
constexpr NpyDtype npy_dtype_of() {
    if constexpr (std::is_same_v<T, int8_t>)
        return NpyDtype::kInt8;
    else if constexpr (std::is_same_v<T, uint8_t>)
        return NpyDtype::kUint8;
    else if constexpr (std::is_same_v<T, int16_t>)
        return NpyDtype::kInt16;
    else if constexpr (std::is_same_v<T, uint16_t>)
        return NpyDtype::kUint16;
    else if constexpr (std::is_same_v<T, int32_t>)
        return NpyDtype::kInt32;
    else if constexpr (std::is_same_v<T, uint32_t>)
        return NpyDtype::kUint32;
    else if constexpr (std::is_same_v<T, int64_t>)
        return NpyDtype::kInt64;
    else if constexpr (std::is_same_v<T, uint64_t>)
        return NpyDtype::kUint64;
    else if constexpr (std::is_same_v<T, float>)
        return NpyDtype::kFloat32;
    else {
        static_assert(std::is_same_v<T, double>, "no .npy dtype for this type");
        return NpyDtype::kFloat64;
    }
}

// The magic, version, length and padded header numpy 2.x writes for a C-order array (version 1.0
// unless the header needs more than 65535 bytes, then 2.0).
std::string npy_header(NpyDtype dtype, std::span<const int64_t> shape);

// Writes an array atomically (AtomicFile: nothing appears under `path` unless all of it was
// written). `bytes` must hold exactly prod(shape) * itemsize bytes (checked).
Status npy_write(const std::string& path, NpyDtype dtype, std::span<const int64_t> shape,
                 const void* bytes, size_t byte_count);

template <typename T>
Status npy_write(const std::string& path, std::span<const T> values,
                 std::span<const int64_t> shape) {
    return npy_write(path, npy_dtype_of<T>(), shape, values.data(), values.size_bytes());
}

// A read-only .npy array, memory-mapped (copied when the data offset is not aligned for its
// dtype, which numpy never writes but other tools might).
class NpyArray {
public:
    // Opens and validates `path`: magic, version, header syntax, a supported little-endian dtype,
    // C order (or Fortran order with at most one dimension), and a file size that matches the
    // shape exactly. Missing file: not found. Anything malformed: data loss, naming the file and
    // what is wrong.
    static Result<NpyArray> open(const std::string& path);

    NpyArray() = default;
    NpyArray(NpyArray&&) noexcept = default;
    NpyArray& operator=(NpyArray&&) noexcept = default;

    NpyDtype dtype() const { return dtype_; }
    const std::vector<int64_t>& shape() const { return shape_; }
    int64_t size() const { return size_; }  // number of elements
    const std::string& path() const { return path_; }
    const void* data() const { return data_; }

    // The elements as T; the dtype must be T's (checked: ask dtype() first).
    template <typename T>
    std::span<const T> values() const;

private:
    std::string path_;
    NpyDtype dtype_ = NpyDtype::kUint8;
    std::vector<int64_t> shape_;
    int64_t size_ = 0;
    MappedFile file_;
    std::vector<uint64_t> copy_;  // owns the data only when the mapped data was misaligned
    const void* data_ = nullptr;
};

}  // namespace lathe

#include "core/check.h"

namespace lathe {
template <typename T>
std::span<const T> NpyArray::values() const {
    LATHE_CHECK(npy_dtype_of<T>() == dtype_, "{}: asked for {} but the array is {}", path_,
                npy_dtype_descr(npy_dtype_of<T>()), npy_dtype_descr(dtype_));
    return {static_cast<const T*>(data_), static_cast<size_t>(size_)};
}
}  // namespace lathe
