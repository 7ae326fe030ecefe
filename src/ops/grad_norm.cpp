#include "ops/grad_norm.h"

#include <cmath>
#include <vector>

#include "ops/cpu/grad_norm.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/grad_norm.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

float grad_clip_coefficient(float norm, float max_norm) {
    // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1, all in fp32.
    const float coef = max_norm / (norm + float(1e-6));
    return std::min(coef, 1.0f);
}

void grad_norm_l2(TensorView norm, std::span<const ConstTensorView> grads, const Context& ctx) {
    constexpr const char* kOp = "grad_norm_l2";
    op_expect_shape(kOp, "norm", norm, Shape{1});
    op_expect_dtype(kOp, "norm", norm, DType::kF32);
    for (const ConstTensorView& g : grads) {
        LATHE_CHECK(!g.is_null(), "{}: a null gradient", kOp);
        op_expect_memory(kOp, ctx, {g});
    }
    op_expect_memory(kOp, ctx, {norm});
    switch (ctx.backend) {
        case Backend::kCpu: {
            double total = 0.0;
            for (const ConstTensorView& g : grads) {
                op_expect_cpu_f32(kOp, {g});
                total += cpu::sum_of_squares(g.as<float>(), g.numel());
            }
            *norm.as<float>() = float(std::sqrt(total));
            return;
        }
        case Backend::kCuda: {
            std::vector<cuda::ConstGradSpan> spans;
            spans.reserve(grads.size());
            for (const ConstTensorView& g : grads) {
                op_expect_cuda_dtype(kOp, DType::kF32, {g});
                spans.push_back({g.as<float>(), g.numel()});
            }
            cuda::grad_norm_l2(norm.as<float>(), spans, cuda_state_of(ctx, kOp), ctx.stream);
            return;
        }
    }
    op_no_backend(kOp, ctx);
}

void grad_clip_by_norm(std::span<const TensorView> grads, ConstTensorView norm, float max_norm,
                       const Context& ctx) {
    constexpr const char* kOp = "grad_clip_by_norm";
    op_expect_shape(kOp, "norm", norm, Shape{1});
    op_expect_dtype(kOp, "norm", norm, DType::kF32);
    LATHE_CHECK(max_norm > 0.0f, "{}: max_norm {} must be positive", kOp, max_norm);
    for (const TensorView& g : grads) {
        LATHE_CHECK(!g.is_null(), "{}: a null gradient", kOp);
        op_expect_memory(kOp, ctx, {g});
    }
    op_expect_memory(kOp, ctx, {norm});
    switch (ctx.backend) {
        case Backend::kCpu: {
            const float n = *norm.as<float>();
            if (!std::isfinite(n)) return;  // the trainer skips this step; keep the evidence
            const float coef = grad_clip_coefficient(n, max_norm);
            if (coef >= 1.0f) return;
            for (const TensorView& g : grads) {
                op_expect_cpu_f32(kOp, {g});
                cpu::scale_inplace(g.as<float>(), g.numel(), coef);
            }
            return;
        }
        case Backend::kCuda: {
            std::vector<cuda::GradSpan> spans;
            spans.reserve(grads.size());
            for (const TensorView& g : grads) {
                op_expect_cuda_dtype(kOp, DType::kF32, {g});
                spans.push_back({g.as<float>(), g.numel()});
            }
            cuda::grad_clip_by_norm(spans, norm.as<float>(), max_norm, ctx.stream);
            return;
        }
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
