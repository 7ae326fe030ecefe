#pragma once
// Shape, dtype and memory-space checks shared by the dispatching op functions (src/ops/<op>.cpp).
// A failed check is a bug in the caller (the model or trainer built a wrong view), so it stops
// with the op name, the argument name, what it got and what it expected (LATHE_CHECK).

#include <initializer_list>
#include <string_view>
#include <utility>

#include "core/check.h"
#include "core/tensor.h"
#include "ops/context.h"

namespace lathe::detail {

// `v` is not null and has exactly `shape`.
template <bool K>
void op_expect_shape(std::string_view op, std::string_view arg, const TensorViewT<K>& v,
                     const Shape& shape) {
    LATHE_CHECK(!v.is_null(), "{}: {} is missing, expected shape {}", op, arg, shape.to_string());
    LATHE_CHECK(v.shape() == shape, "{}: {} is {}, expected shape {}", op, arg, v.to_string(),
                shape.to_string());
}

// `v` is not null and holds elements of `dtype`.
template <bool K>
void op_expect_dtype(std::string_view op, std::string_view arg, const TensorViewT<K>& v,
                     DType dtype) {
    LATHE_CHECK(!v.is_null(), "{}: {} is missing", op, arg);
    LATHE_CHECK(v.dtype() == dtype, "{}: {} is {}, expected dtype {}", op, arg, v.to_string(),
                dtype_name(dtype));
}

// Rows and columns of a tensor seen as (N, C): C the last dimension, N the product of the others.
template <bool K>
std::pair<int64_t, int64_t> op_rows_cols(std::string_view op, std::string_view arg,
                                         const TensorViewT<K>& v) {
    LATHE_CHECK(!v.is_null() && v.rank() >= 1 && v.dim(-1) > 0, "{}: {} is {}, expected (N, C)", op,
                arg, v.is_null() ? std::string("missing") : v.to_string());
    return {v.numel() / v.dim(-1), v.dim(-1)};
}

// Every non-null view lives where the context's backend computes.
inline void op_expect_memory(std::string_view op, const Context& ctx,
                             std::initializer_list<ConstTensorView> views) {
    for (const ConstTensorView& v : views)
        LATHE_CHECK(v.is_null() || v.device() == ctx.memory(),
                    "{}: a {} tensor handed to the {} backend", op, device_name(v.device()),
                    backend_name(ctx.backend));
}

// The CPU reference computes in fp32 only: every non-null view given here is f32.
inline void op_expect_cpu_f32(std::string_view op, std::initializer_list<ConstTensorView> views) {
    for (const ConstTensorView& v : views)
        LATHE_CHECK(v.is_null() || v.dtype() == DType::kF32,
                    "{}: the CPU backend computes in f32, got {}", op, v.to_string());
}

// Stops: `op` has no implementation for the context's backend in this build.
[[noreturn]] inline void op_no_backend(std::string_view op, const Context& ctx) {
    LATHE_CHECK(false, "{}: no {} implementation in this build{}", op, backend_name(ctx.backend),
                ctx.backend == Backend::kCuda ? " (the CUDA backend does not provide it yet)" : "");
    __builtin_unreachable();
}

}  // namespace lathe::detail
