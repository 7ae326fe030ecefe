#include "ops/rmsnorm.h"

#include "ops/cpu/fp8_cast.h"
#include "ops/cpu/rmsnorm.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/rmsnorm.h"
#include "ops/op_checks.h"
#include "ops/residual.h"

namespace lathe {

using namespace detail;

namespace {
// The optional amax output: (1) f32.
void expect_amax(const char* op, ConstTensorView y_amax) {
    if (y_amax.is_null()) return;
    op_expect_shape(op, "y_amax", y_amax, Shape{1});
    op_expect_dtype(op, "y_amax", y_amax, DType::kF32);
}
}  // namespace

void rmsnorm_forward(TensorView y, TensorView rstd, ConstTensorView x, ConstTensorView weight,
                     float eps, const Context& ctx, TensorView y_amax) {
    constexpr const char* kOp = "rmsnorm_forward";
    const auto [N, C] = op_rows_cols(kOp, "x", x);
    op_expect_shape(kOp, "y", y, x.shape());
    op_expect_shape(kOp, "rstd", rstd, Shape{N});
    op_expect_shape(kOp, "weight", weight, Shape{C});
    op_expect_dtype(kOp, "rstd", rstd, DType::kF32);
    expect_amax(kOp, y_amax);
    op_expect_memory(kOp, ctx, {y, rstd, x, weight, y_amax});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {y, x, weight});
            cpu::rmsnorm_forward(y.as<float>(), rstd.as<float>(), x.as<float>(), weight.as<float>(),
                                 N, C, eps);
            if (!y_amax.is_null()) *y_amax.as<float>() = cpu::fp8_amax(y.as<float>(), y.numel());
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {y, x, weight});
            cuda::rmsnorm_forward(y.as<bf16>(), rstd.as<float>(), x.as<bf16>(), weight.as<bf16>(),
                                  N, C, eps, ctx.stream, y_amax.as<float>());
            return;
    }
    op_no_backend(kOp, ctx);
}

void rmsnorm_residual_forward(TensorView x_out, TensorView y, TensorView rstd, ConstTensorView a,
                              ConstTensorView b, ConstTensorView weight, float eps,
                              const Context& ctx, TensorView y_amax) {
    constexpr const char* kOp = "rmsnorm_residual_forward";
    if (ctx.backend == Backend::kCpu) {  // the two ops, checks and all
        residual_forward(x_out, a, b, ctx);
        rmsnorm_forward(y, rstd, x_out, weight, eps, ctx, y_amax);
        return;
    }
    expect_amax(kOp, y_amax);
    const auto [N, C] = op_rows_cols(kOp, "a", a);
    op_expect_shape(kOp, "b", b, a.shape());
    op_expect_shape(kOp, "x_out", x_out, a.shape());
    op_expect_shape(kOp, "y", y, a.shape());
    op_expect_shape(kOp, "rstd", rstd, Shape{N});
    op_expect_shape(kOp, "weight", weight, Shape{C});
    op_expect_dtype(kOp, "rstd", rstd, DType::kF32);
    op_expect_memory(kOp, ctx, {x_out, y, rstd, a, b, weight, y_amax});
    if (ctx.backend == Backend::kCuda) {
        op_expect_cuda_dtype(kOp, DType::kBF16, {x_out, y, a, b, weight});
        cuda::rmsnorm_residual_forward(x_out.as<bf16>(), y.as<bf16>(), rstd.as<float>(),
                                       a.as<bf16>(), b.as<bf16>(), weight.as<bf16>(), N, C, eps,
                                       ctx.stream, y_amax.as<float>());
        return;
    }
    op_no_backend(kOp, ctx);
}

void rmsnorm_backward(TensorView dx, TensorView dweight, ConstTensorView dy, ConstTensorView x,
                      ConstTensorView weight, ConstTensorView rstd, GradMode dx_mode,
                      const Context& ctx) {
    constexpr const char* kOp = "rmsnorm_backward";
    const auto [N, C] = op_rows_cols(kOp, "x", x);
    op_expect_shape(kOp, "dx", dx, x.shape());
    op_expect_shape(kOp, "dy", dy, x.shape());
    op_expect_shape(kOp, "weight", weight, Shape{C});
    op_expect_shape(kOp, "rstd", rstd, Shape{N});
    if (!dweight.is_null()) op_expect_shape(kOp, "dweight", dweight, Shape{C});
    op_expect_memory(kOp, ctx, {dx, dweight, dy, x, weight, rstd});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dx, dweight, dy, x, weight, rstd});
            cpu::rmsnorm_backward(dx.as<float>(), dweight.as<float>(), dy.as<float>(),
                                  x.as<float>(), weight.as<float>(), rstd.as<float>(), N, C,
                                  dx_mode == GradMode::kAccumulate);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dx, dy, x, weight});
            op_expect_cuda_dtype(kOp, DType::kF32, {dweight, rstd});
            cuda::rmsnorm_backward(dx.as<bf16>(), dweight.as<float>(), dy.as<bf16>(), x.as<bf16>(),
                                   weight.as<bf16>(), rstd.as<float>(), N, C,
                                   dx_mode == GradMode::kAccumulate, cuda_state_of(ctx, kOp),
                                   ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
