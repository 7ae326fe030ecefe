#pragma once
// Test harness for the ops: seeded random tensors and a gradient check against central finite
// differences. Header-only and free of any test framework, so CPU tests and the CUDA backend's
// tests (against their CPU twins) share it; it is not compiled into the library.
//
// The check: an op's output `out` is reduced to a scalar L = sum(out * R) with fixed random
// weights R (in fp64). Running the op's backward with dout = R gives the analytic dL/dx. The
// numeric gradient perturbs one element of x at a time, x_i +- h, reruns the forward in fp32 and
// takes (L+ - L-) / (x_i+ - x_i-) using the perturbed values actually stored in fp32.
// fp32 forward noise limits what can be asserted: see GradCheckOptions for the tolerances.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace lathe::optest {

// Deterministic random numbers for tests (seed per test, so a failure reproduces).
class Rng {
public:
    explicit Rng(uint64_t seed) : gen_(seed) {}
    float uniform(float lo, float hi) {
        return std::uniform_real_distribution<float>(lo, hi)(gen_);
    }
    float normal(float stddev = 1.0f) {
        return std::normal_distribution<float>(0.0f, stddev)(gen_);
    }
    // Integer in [lo, hi].
    int64_t integer(int64_t lo, int64_t hi) {
        return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
    }

private:
    std::mt19937_64 gen_;
};

// A new f32 host tensor of `shape` with elements uniform in [lo, hi).
inline HostTensor random_tensor(Rng& rng, Shape shape, float lo = -1.0f, float hi = 1.0f) {
    HostTensor t(DType::kF32, shape);
    float* p = t.as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng.uniform(lo, hi);
    return t;
}

// A new f32 host tensor holding a copy of `src`.
inline HostTensor copy_tensor(ConstTensorView src) {
    HostTensor t(src.dtype(), src.shape());
    std::copy_n(static_cast<const std::byte*>(src.data()), src.bytes(),
                static_cast<std::byte*>(t.view().data()));
    return t;
}

// sum_i out[i] * r[i] in fp64.
inline double weighted_sum(ConstTensorView out, ConstTensorView r) {
    const float* o = out.as<float>();
    const float* w = r.as<float>();
    double s = 0.0;
    for (int64_t i = 0; i < out.numel(); ++i) s += double(o[i]) * double(w[i]);
    return s;
}

// Largest |a[i] - b[i]| / max(|b| over all i, tiny): an error relative to the reference's scale.
inline double max_scaled_diff(ConstTensorView a, ConstTensorView b) {
    const float* x = a.as<float>();
    const float* y = b.as<float>();
    double scale = 1e-30, worst = 0.0;
    for (int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::fabs(double(y[i])));
    for (int64_t i = 0; i < a.numel(); ++i)
        worst = std::max(worst, std::fabs(double(x[i]) - double(y[i])));
    return worst / scale;
}

struct GradCheckOptions {
    double step = 1e-2;        // absolute perturbation h (inputs are O(1) in these tests)
    double rtol = 1e-2;        // per element: |a - n| <= atol + rtol * |n| ...
    double atol_scale = 2e-3;  // ... with atol = atol_scale * max_i |n_i|
    double norm_tol = 3e-3;    // and overall ||a - n|| / ||n|| <= norm_tol
    int64_t max_elements = 0;  // check at most this many elements (evenly spaced); 0 = all
};

struct GradCheckResult {
    bool ok = true;
    int64_t checked = 0;
    double norm_rel_err = 0.0;
    int64_t worst_index = -1;  // the element closest to (or furthest past) its tolerance
    double worst_analytic = 0.0, worst_numeric = 0.0;
    std::string to_string() const {
        return fmt::format(
            "{} elements, norm rel err {:.3g}, worst [{}] analytic {:.7g} numeric {:.7g}", checked,
            norm_rel_err, worst_index, worst_analytic, worst_numeric);
    }
};

// Checks `analytic` (n elements, dL/dx from the op's backward) against finite differences of
// `loss` (which reruns the forward from the current contents of x and returns L in fp64).
// x is restored exactly afterwards.
inline GradCheckResult check_gradient(float* x, int64_t n, const float* analytic,
                                      const std::function<double()>& loss,
                                      const GradCheckOptions& opt = {}) {
    const int64_t stride = opt.max_elements > 0 && n > opt.max_elements
                               ? (n + opt.max_elements - 1) / opt.max_elements
                               : 1;
    std::vector<int64_t> idx;
    std::vector<double> num;
    for (int64_t i = 0; i < n; i += stride) {
        const float orig = x[i];
        const float xp = float(double(orig) + opt.step), xm = float(double(orig) - opt.step);
        x[i] = xp;
        const double lp = loss();
        x[i] = xm;
        const double lm = loss();
        x[i] = orig;
        idx.push_back(i);
        num.push_back((lp - lm) / (double(xp) - double(xm)));
    }
    GradCheckResult r;
    r.checked = int64_t(idx.size());
    double scale = 0.0, diff2 = 0.0, ref2 = 0.0;
    for (double v : num) scale = std::max(scale, std::fabs(v));
    const double atol = opt.atol_scale * std::max(scale, 1e-12);
    double worst_excess = -1e300;  // the element closest to (or furthest past) its tolerance
    for (size_t k = 0; k < idx.size(); ++k) {
        const double a = analytic[idx[k]], nv = num[k];
        diff2 += (a - nv) * (a - nv);
        ref2 += nv * nv;
        const double excess = std::fabs(a - nv) - (atol + opt.rtol * std::fabs(nv));
        if (excess > worst_excess) {
            worst_excess = excess;
            r.worst_index = idx[k];
            r.worst_analytic = a;
            r.worst_numeric = nv;
        }
    }
    r.norm_rel_err = std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-30);
    r.ok = worst_excess <= 0.0 && (r.norm_rel_err <= opt.norm_tol || diff2 == 0.0);
    return r;
}

}  // namespace lathe::optest
