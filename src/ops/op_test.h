#pragma once
// GoogleTest glue for the op tests: gradcheck.h's harness as assertions, and a CPU context.
#include <gtest/gtest.h>

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
