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

}  // namespace lathe::optest
