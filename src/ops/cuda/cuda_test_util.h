#pragma once
// Shared by the CUDA op tests (src/ops/cuda/*_test.cu): device tensors made from host data,
// poisoning, read-back, and comparison against the CPU twin with tolerances derived from the
// dtypes involved. Each test draws fresh random inputs (seeded, so a failure reproduces), rounds
// them to bf16 on the host so that both backends see exactly the same values, runs the CPU twin
// in f32 and the CUDA op in its storage dtypes, and compares.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "core/tensor.h"
#include "ops/context.h"
#include "ops/cuda/cuda_state.h"
#include "ops/gradcheck.h"

// GoogleTest's TEST macro declares a static test_info_ member that nvcc, unlike g++, reports as
// unused inside an anonymous namespace (177).
#if defined(__NVCC__)
#pragma nv_diag_suppress 177
#endif

namespace lathe::cudatest {

// bf16's unit roundoff: 8 significant bits (7 stored), so rounding to nearest errs by at most
// half an ulp, 2^-8 relative.
inline constexpr double kBf16Unit = 1.0 / 256;

// Per element |got - ref| <= rel * |ref| + abs * max|ref|, and overall
// ||got - ref|| / ||ref|| <= norm.
struct Tolerance {
    double rel;
    double abs;
    double norm;
};

// A bf16 output rounded once from an fp32 value that matches the reference to fp32 accuracy:
// off by at most one bf16 rounding (u); 2u leaves room for an fp32 difference that tips the
// rounding the other way. The absolute term covers values near zero, where fp32 math (erff,
// expf, 1 + tanh) against the CPU's fp64 loses relative, not absolute, accuracy.
inline constexpr Tolerance kBf16Rounded{2 * kBf16Unit, 1e-5, 2 * kBf16Unit};
// A bf16 output of a sum (a matmul, a norm's gradient): rounding error is relative to the
// output's scale, not to each element (cancellation).
inline constexpr Tolerance kBf16Sum{2 * kBf16Unit, 2 * kBf16Unit, 2 * kBf16Unit};
// An output computed from a bf16-rounded intermediate (the LM head's bf16 dlogits): one rounding
// of each term plus one of the result.
inline constexpr Tolerance kBf16Derived{4 * kBf16Unit, 4 * kBf16Unit, 3 * kBf16Unit};
// fp32 results from the same bf16 inputs, summed in another order (tensor cores, tree
// reductions) than the CPU's fp32/fp64 loops. Two orders of K fp32 terms differ by a random walk
// of about sqrt(K) 2^-24 of the terms' scale (under 4e-6 for K <= 4096; the worst case,
// 2 K 2^-24, is 5e-4 there but needs every rounding to fall the same way): 1e-4 relative / 1e-5
// of scale is 25x the random walk and 40x under one bf16 rounding.
inline constexpr Tolerance kF32Sum{1e-4, 1e-5, 1e-5};

// A device tensor that owns its memory.
struct DeviceTensor {
    DeviceBuffer buffer;
    TensorView view;
};

// An uninitialized device tensor, poisoned (every byte 0xFF: NaN in f32 and bf16).
inline DeviceTensor device_tensor(DType dtype, Shape shape, CudaState& state) {
    const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
    DeviceBuffer buffer(bytes > 0 ? bytes : 1);
    const TensorView view = buffer.view(dtype, shape);
    cuda_fill_bytes(view, 0xFF, state.stream());
    return {std::move(buffer), view};
}

// Host data converted to `dtype` (tensor_convert: f32 -> bf16 rounds to nearest even) and
// uploaded. Integer host tensors upload as they are (dtype must match).
inline DeviceTensor upload(const HostTensor& host, DType dtype, CudaState& state) {
    HostTensor staged(dtype, host.shape());
    tensor_convert(staged.view(), host.view());
    DeviceTensor d = device_tensor(dtype, host.shape(), state);
    cuda_copy_sync(d.view, staged.view(), state.stream());
    return d;
}

// The values a bf16 tensor made from `host` holds, as f32: what the CPU twin must be fed.
inline HostTensor round_to_bf16(const HostTensor& host) {
    HostTensor b(DType::kBF16, host.shape()), f(DType::kF32, host.shape());
    tensor_convert(b.view(), host.view());
    tensor_convert(f.view(), b.view());
    return f;
}

// Fresh uniform random values in [lo, hi), already rounded to bf16.
inline HostTensor random_bf16_values(optest::Rng& rng, Shape shape, float lo = -1.0f,
                                     float hi = 1.0f) {
    return round_to_bf16(optest::random_tensor(rng, shape, lo, hi));
}

// Waits for the stream, then reads a device tensor back as f32 (bf16 widens exactly).
inline HostTensor download_f32(ConstTensorView dev, CudaState& state) {
    HostTensor raw(dev.dtype(), dev.shape());
    cuda_copy_sync(raw.view(), dev, state.stream());
    if (dev.dtype() == DType::kF32) return raw;
    HostTensor f(DType::kF32, dev.shape());
    tensor_convert(f.view(), raw.view());
    return f;
}

// Raw bytes of a device tensor.
inline HostTensor download_raw(ConstTensorView dev, CudaState& state) {
    HostTensor raw(dev.dtype(), dev.shape());
    cuda_copy_sync(raw.view(), dev, state.stream());
    return raw;
}

// got and ref are f32 host tensors with the same element count. Fails on any element that is not
// finite (a poisoned element the op never wrote is NaN) unless ref has the same non-finite value.
inline ::testing::AssertionResult matches(const HostTensor& got, const HostTensor& ref,
                                          const Tolerance& tol) {
    if (got.numel() != ref.numel())
        return ::testing::AssertionFailure()
               << "element counts " << got.numel() << " vs " << ref.numel();
    const float* g = got.as<float>();
    const float* r = ref.as<float>();
    double scale = 0.0, diff2 = 0.0, ref2 = 0.0, worst = 0.0;
    int64_t worst_i = -1;
    for (int64_t i = 0; i < ref.numel(); ++i)
        if (std::isfinite(r[i])) scale = std::max(scale, std::fabs(double(r[i])));
    for (int64_t i = 0; i < ref.numel(); ++i) {
        if (!std::isfinite(r[i]) || !std::isfinite(g[i])) {
            const bool same = std::isnan(r[i]) ? std::isnan(g[i]) : g[i] == r[i];
            if (!same)
                return ::testing::AssertionFailure()
                       << "element " << i << ": got " << g[i] << ", reference " << r[i]
                       << (std::isnan(g[i]) ? " (NaN: unwritten or poisoned?)" : "");
            continue;
        }
        const double d = std::fabs(double(g[i]) - double(r[i]));
        diff2 += d * d;
        ref2 += double(r[i]) * double(r[i]);
        const double allowed = tol.rel * std::fabs(double(r[i])) + tol.abs * scale;
        if (d - allowed > worst || worst_i < 0) {
            worst = d - allowed;
            worst_i = i;
        }
    }
    const double norm_err = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    const std::string where = " (worst element " + std::to_string(worst_i) + ": got " +
                              std::to_string(worst_i >= 0 ? g[worst_i] : 0.0f) + ", reference " +
                              std::to_string(worst_i >= 0 ? r[worst_i] : 0.0f) + "; scale " +
                              std::to_string(scale) + "; norm error " + std::to_string(norm_err) +
                              ")";
    if (worst > 0.0) return ::testing::AssertionFailure() << "element beyond tolerance" << where;
    if (norm_err > tol.norm)
        return ::testing::AssertionFailure() << "norm error > " << tol.norm << where;
    return ::testing::AssertionSuccess() << where;
}

// Same bytes (bitwise equality, the determinism and exactness checks).
inline ::testing::AssertionResult bitwise_equal(const HostTensor& a, const HostTensor& b) {
    if (a.numel() != b.numel() || a.view().dtype() != b.view().dtype())
        return ::testing::AssertionFailure()
               << a.view().to_string() << " vs " << b.view().to_string();
    const auto* x = static_cast<const unsigned char*>(a.view().data());
    const auto* y = static_cast<const unsigned char*>(b.view().data());
    const size_t bytes = a.view().bytes();
    for (size_t i = 0; i < bytes; ++i)
        if (x[i] != y[i])
            return ::testing::AssertionFailure()
                   << "first difference at byte " << i << " of " << bytes;
    return ::testing::AssertionSuccess();
}

}  // namespace lathe::cudatest
