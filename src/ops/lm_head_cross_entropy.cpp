#include "ops/lm_head_cross_entropy.h"

#include "ops/cpu/lm_head_cross_entropy.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/lm_head_cross_entropy.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

namespace {
struct LmHeadDims {
    int64_t N, C, V, Nc;
};

LmHeadDims lm_head_check(const char* op, ConstTensorView x, ConstTensorView targets,
                         ConstTensorView weight, ConstTensorView scratch) {
    LATHE_CHECK(x.rank() == 2 && weight.rank() == 2 && weight.dim(1) == x.dim(1),
                "{}: x {} and weight {}; expected (N, C) and (V, C)", op, x.to_string(),
                weight.to_string());
    LmHeadDims d{x.dim(0), x.dim(1), weight.dim(0), 0};
    op_expect_dtype(op, "targets", targets, DType::kI32);
    op_expect_shape(op, "targets", targets, Shape{d.N});
    LATHE_CHECK(scratch.rank() == 2 && scratch.dim(1) == d.V && scratch.dim(0) >= 1,
                "{}: scratch is {}, expected (Nc, V = {}) with Nc >= 1", op,
                scratch.is_null() ? std::string("missing") : scratch.to_string(), d.V);
    op_expect_dtype(op, "scratch", scratch, DType::kF32);
    d.Nc = scratch.dim(0);
    return d;
}
}  // namespace

void lm_head_cross_entropy_forward(TensorView loss, TensorView losses, TensorView lse,
                                   ConstTensorView x, ConstTensorView targets,
                                   ConstTensorView weight, TensorView scratch, const Context& ctx) {
    constexpr const char* kOp = "lm_head_cross_entropy_forward";
    const LmHeadDims d = lm_head_check(kOp, x, targets, weight, scratch);
    op_expect_shape(kOp, "loss", loss, Shape{1});
    op_expect_shape(kOp, "lse", lse, Shape{d.N});
    if (!losses.is_null()) op_expect_shape(kOp, "losses", losses, Shape{d.N});
    op_expect_memory(kOp, ctx, {loss, losses, lse, x, targets, weight, scratch});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {loss, losses, lse, x, weight});
            cpu::lm_head_cross_entropy_forward(loss.as<float>(), losses.as<float>(),
                                               lse.as<float>(), x.as<float>(),
                                               targets.as<int32_t>(), weight.as<float>(),
                                               scratch.as<float>(), d.N, d.C, d.V, d.Nc);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {x, weight});
            op_expect_cuda_dtype(kOp, DType::kF32, {loss, losses, lse});
            cuda::lm_head_cross_entropy_forward(
                loss.as<float>(), losses.as<float>(), lse.as<float>(), x.as<bf16>(),
                targets.as<int32_t>(), weight.as<bf16>(), scratch.as<float>(), d.N, d.C, d.V, d.Nc,
                cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void lm_head_cross_entropy_backward(TensorView dx, TensorView dweight, ConstTensorView x,
                                    ConstTensorView targets, ConstTensorView weight,
                                    ConstTensorView lse, float dloss, TensorView scratch,
                                    const Context& ctx) {
    constexpr const char* kOp = "lm_head_cross_entropy_backward";
    const LmHeadDims d = lm_head_check(kOp, x, targets, weight, scratch);
    op_expect_shape(kOp, "dx", dx, x.shape());
    op_expect_shape(kOp, "lse", lse, Shape{d.N});
    if (!dweight.is_null()) op_expect_shape(kOp, "dweight", dweight, weight.shape());
    op_expect_memory(kOp, ctx, {dx, dweight, x, targets, weight, lse, scratch});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dx, dweight, x, weight, lse});
            cpu::lm_head_cross_entropy_backward(dx.as<float>(), dweight.as<float>(), x.as<float>(),
                                                targets.as<int32_t>(), weight.as<float>(),
                                                lse.as<float>(), dloss, scratch.as<float>(), d.N,
                                                d.C, d.V, d.Nc);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dx, x, weight});
            op_expect_cuda_dtype(kOp, DType::kF32, {dweight, lse});
            cuda::lm_head_cross_entropy_backward(
                dx.as<bf16>(), dweight.as<float>(), x.as<bf16>(), targets.as<int32_t>(),
                weight.as<bf16>(), lse.as<float>(), dloss, scratch.as<float>(), d.N, d.C, d.V, d.Nc,
                cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void lm_head_cross_entropy_forward_backward(TensorView loss, TensorView losses, TensorView dx,
                                            TensorView dweight, ConstTensorView x,
                                            ConstTensorView targets, ConstTensorView weight,
                                            float dloss, TensorView scratch, const Context& ctx) {
    constexpr const char* kOp = "lm_head_cross_entropy_forward_backward";
    const LmHeadDims d = lm_head_check(kOp, x, targets, weight, scratch);
    op_expect_shape(kOp, "loss", loss, Shape{1});
    if (!losses.is_null()) op_expect_shape(kOp, "losses", losses, Shape{d.N});
    op_expect_shape(kOp, "dx", dx, x.shape());
    if (!dweight.is_null()) op_expect_shape(kOp, "dweight", dweight, weight.shape());
    op_expect_memory(kOp, ctx, {loss, losses, dx, dweight, x, targets, weight, scratch});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {loss, losses, dx, dweight, x, weight});
            cpu::lm_head_cross_entropy_forward_backward(
                loss.as<float>(), losses.as<float>(), dx.as<float>(), dweight.as<float>(),
                x.as<float>(), targets.as<int32_t>(), weight.as<float>(), dloss,
                scratch.as<float>(), d.N, d.C, d.V, d.Nc);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dx, x, weight});
            op_expect_cuda_dtype(kOp, DType::kF32, {loss, losses, dweight});
            cuda::lm_head_cross_entropy_forward_backward(
                loss.as<float>(), losses.as<float>(), dx.as<bf16>(), dweight.as<float>(),
                x.as<bf16>(), targets.as<int32_t>(), weight.as<bf16>(), dloss, scratch.as<float>(),
                d.N, d.C, d.V, d.Nc, cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
