#include "ops/layernorm.h"

#include "ops/cpu/layernorm.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/layernorm.h"
#include "ops/op_checks.h"
#include "ops/residual.h"

namespace lathe {

using namespace detail;

void layernorm_forward(TensorView y, TensorView mean, TensorView rstd, ConstTensorView x,
                       ConstTensorView weight, ConstTensorView bias, float eps,
                       const Context& ctx) {
    constexpr const char* kOp = "layernorm_forward";
    const auto [N, C] = op_rows_cols(kOp, "x", x);
    op_expect_shape(kOp, "y", y, x.shape());
    op_expect_shape(kOp, "mean", mean, Shape{N});
    op_expect_shape(kOp, "rstd", rstd, Shape{N});
    op_expect_shape(kOp, "weight", weight, Shape{C});
    op_expect_shape(kOp, "bias", bias, Shape{C});
    op_expect_dtype(kOp, "mean", mean, DType::kF32);
    op_expect_dtype(kOp, "rstd", rstd, DType::kF32);
    op_expect_memory(kOp, ctx, {y, mean, rstd, x, weight, bias});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {y, x, weight, bias});
            cpu::layernorm_forward(y.as<float>(), mean.as<float>(), rstd.as<float>(), x.as<float>(),
                                   weight.as<float>(), bias.as<float>(), N, C, eps);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {y, x, weight, bias});
            cuda::layernorm_forward(y.as<bf16>(), mean.as<float>(), rstd.as<float>(), x.as<bf16>(),
                                    weight.as<bf16>(), bias.as<bf16>(), N, C, eps, ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void layernorm_residual_forward(TensorView x_out, TensorView y, TensorView mean, TensorView rstd,
                                ConstTensorView a, ConstTensorView b, ConstTensorView weight,
                                ConstTensorView bias, float eps, const Context& ctx) {
    constexpr const char* kOp = "layernorm_residual_forward";
    if (ctx.backend == Backend::kCpu) {  // the two ops, checks and all
        residual_forward(x_out, a, b, ctx);
        layernorm_forward(y, mean, rstd, x_out, weight, bias, eps, ctx);
        return;
    }
    const auto [N, C] = op_rows_cols(kOp, "a", a);
    op_expect_shape(kOp, "b", b, a.shape());
    op_expect_shape(kOp, "x_out", x_out, a.shape());
    op_expect_shape(kOp, "y", y, a.shape());
    op_expect_shape(kOp, "mean", mean, Shape{N});
    op_expect_shape(kOp, "rstd", rstd, Shape{N});
    op_expect_shape(kOp, "weight", weight, Shape{C});
    op_expect_shape(kOp, "bias", bias, Shape{C});
    op_expect_dtype(kOp, "mean", mean, DType::kF32);
    op_expect_dtype(kOp, "rstd", rstd, DType::kF32);
    op_expect_memory(kOp, ctx, {x_out, y, mean, rstd, a, b, weight, bias});
    if (ctx.backend == Backend::kCuda) {
        op_expect_cuda_dtype(kOp, DType::kBF16, {x_out, y, a, b, weight, bias});
        cuda::layernorm_residual_forward(x_out.as<bf16>(), y.as<bf16>(), mean.as<float>(),
                                         rstd.as<float>(), a.as<bf16>(), b.as<bf16>(),
                                         weight.as<bf16>(), bias.as<bf16>(), N, C, eps, ctx.stream);
        return;
    }
    op_no_backend(kOp, ctx);
}

void layernorm_backward(TensorView dx, TensorView dweight, TensorView dbias, ConstTensorView dy,
                        ConstTensorView x, ConstTensorView weight, ConstTensorView mean,
                        ConstTensorView rstd, GradMode dx_mode, const Context& ctx) {
    constexpr const char* kOp = "layernorm_backward";
    const auto [N, C] = op_rows_cols(kOp, "x", x);
    op_expect_shape(kOp, "dx", dx, x.shape());
    op_expect_shape(kOp, "dy", dy, x.shape());
    op_expect_shape(kOp, "weight", weight, Shape{C});
    op_expect_shape(kOp, "mean", mean, Shape{N});
    op_expect_shape(kOp, "rstd", rstd, Shape{N});
    if (!dweight.is_null()) op_expect_shape(kOp, "dweight", dweight, Shape{C});
    if (!dbias.is_null()) op_expect_shape(kOp, "dbias", dbias, Shape{C});
    op_expect_memory(kOp, ctx, {dx, dweight, dbias, dy, x, weight, mean, rstd});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dx, dweight, dbias, dy, x, weight, mean, rstd});
            cpu::layernorm_backward(dx.as<float>(), dweight.as<float>(), dbias.as<float>(),
                                    dy.as<float>(), x.as<float>(), weight.as<float>(),
                                    mean.as<float>(), rstd.as<float>(), N, C,
                                    dx_mode == GradMode::kAccumulate);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dx, dy, x, weight});
            op_expect_cuda_dtype(kOp, DType::kF32, {dweight, dbias, mean, rstd});
            cuda::layernorm_backward(
                dx.as<bf16>(), dweight.as<float>(), dbias.as<float>(), dy.as<bf16>(), x.as<bf16>(),
                weight.as<bf16>(), mean.as<float>(), rstd.as<float>(), N, C,
                dx_mode == GradMode::kAccumulate, cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
