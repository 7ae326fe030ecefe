#pragma once
// GoogleTest glue for the op tests: gradcheck.h's harness as assertions, and a CPU context.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "ops/context.h"
#include "ops/gradcheck.h"

namespace lathe::optest {

// Success when the analytic gradient `grad` of `x` matches finite differences of `loss`.
inline ::testing::AssertionResult gradient_matches(HostTensor& x, const HostTensor& grad,
                                                   const std::function<double()>& loss,
                                                   const GradCheckOptions& opt = {}) {
    if (x.numel() != grad.numel())
        return ::testing::AssertionFailure()
               << "x has " << x.numel() << " elements, grad " << grad.numel();
    const GradCheckResult r = check_gradient(x.as<float>(), x.numel(), grad.as<float>(), loss, opt);
    if (r.ok) return ::testing::AssertionSuccess() << r.to_string();
    return ::testing::AssertionFailure() << r.to_string();
}

// Success when a and b (f32, same element count) differ by at most tol * max|b|.
inline ::testing::AssertionResult close_to(ConstTensorView a, ConstTensorView b, double tol) {
    if (a.numel() != b.numel())
        return ::testing::AssertionFailure() << a.to_string() << " vs " << b.to_string();
    const double d = max_scaled_diff(a, b);
    if (d <= tol) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "max difference " << d << " of the reference's scale > " << tol;
}

// Success when a and b (f32) have the same shape and the same bytes (-0.0 and +0.0 differ).
inline ::testing::AssertionResult bitwise_equal(const HostTensor& a, const HostTensor& b) {
    if (a.view().shape() != b.view().shape())
        return ::testing::AssertionFailure()
               << a.view().to_string() << " vs " << b.view().to_string();
    for (int64_t i = 0; i < a.numel(); ++i)
        if (std::memcmp(a.as<float>() + i, b.as<float>() + i, sizeof(float)) != 0)
            return ::testing::AssertionFailure()
                   << "element " << i << ": " << a.as<float>()[i] << " vs " << b.as<float>()[i];
    return ::testing::AssertionSuccess();
}

// A HostTensor of the given shape filled from a list (row-major).
inline HostTensor tensor_of(Shape shape, std::initializer_list<float> values) {
    HostTensor t(DType::kF32, shape);
    LATHE_CHECK(int64_t(values.size()) == t.numel(), "{} values for {}", values.size(),
                shape.to_string());
    std::copy(values.begin(), values.end(), t.as<float>());
    return t;
}

inline HostTensor ids_of(Shape shape, std::initializer_list<int32_t> values) {
    HostTensor t(DType::kI32, shape);
    LATHE_CHECK(int64_t(values.size()) == t.numel(), "{} ids for {}", values.size(),
                shape.to_string());
    std::copy(values.begin(), values.end(), t.as<int32_t>());
    return t;
}

inline HostTensor f32(Shape shape) {
    return HostTensor(DType::kF32, shape);
}

// (B, T, Hx, D) host tensors of one dtype side by side by rows, as the model packs q, k and v
// (ops/attention.h: attention_forward_qkv): (B, T, sum of Hx, D).
inline HostTensor pack_heads(std::initializer_list<ConstTensorView> parts) {
    const ConstTensorView first = *parts.begin();
    const int64_t rows = first.dim(0) * first.dim(1), D = first.dim(3);
    int64_t heads = 0;
    for (const ConstTensorView& p : parts) heads += p.dim(2);
    HostTensor packed(first.dtype(), Shape{first.dim(0), first.dim(1), heads, D});
    const size_t e = dtype_size(first.dtype());
    auto* out = static_cast<char*>(packed.view().data());
    size_t at = 0;  // bytes into a packed row
    for (const ConstTensorView& p : parts) {
        const size_t row = size_t(p.dim(2) * D) * e;
        for (int64_t r = 0; r < rows; ++r)
            std::memcpy(out + size_t(r * heads * D) * e + at,
                        static_cast<const char*>(p.data()) + size_t(r) * row, row);
        at += row;
    }
    return packed;
}

// Heads [h0, h0 + n) of each row of a packed (B, T, H, D) host tensor, as a (B, T, n, D) tensor.
inline HostTensor take_heads(ConstTensorView packed, int64_t h0, int64_t n) {
    const int64_t rows = packed.dim(0) * packed.dim(1), H = packed.dim(2), D = packed.dim(3);
    HostTensor out(packed.dtype(), Shape{packed.dim(0), packed.dim(1), n, D});
    const size_t e = dtype_size(packed.dtype()), row = size_t(n * D) * e;
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(static_cast<char*>(out.view().data()) + size_t(r) * row,
                    static_cast<const char*>(packed.data()) + size_t(r * H * D + h0 * D) * e, row);
    return out;
}

}  // namespace lathe::optest
