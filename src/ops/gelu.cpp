#include "ops/gelu.h"

#include "ops/cpu/gelu.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/gelu.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

void gelu_forward(TensorView y, ConstTensorView x, GeluKind kind, const Context& ctx) {
    constexpr const char* kOp = "gelu_forward";
    op_expect_shape(kOp, "y", y, x.shape());
    op_expect_memory(kOp, ctx, {y, x});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {y, x});
            cpu::gelu_forward(y.as<float>(), x.as<float>(), x.numel(), kind == GeluKind::kTanh);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {y, x});
            cuda::gelu_forward(y.as<bf16>(), x.as<bf16>(), x.numel(), kind == GeluKind::kTanh,
                               ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void gelu_backward(TensorView dx, ConstTensorView dy, ConstTensorView x, GeluKind kind,
                   const Context& ctx) {
    constexpr const char* kOp = "gelu_backward";
    op_expect_shape(kOp, "dx", dx, x.shape());
    op_expect_shape(kOp, "dy", dy, x.shape());
    op_expect_memory(kOp, ctx, {dx, dy, x});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dx, dy, x});
            cpu::gelu_backward(dx.as<float>(), dy.as<float>(), x.as<float>(), x.numel(),
                               kind == GeluKind::kTanh);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dx, dy, x});
            cuda::gelu_backward(dx.as<bf16>(), dy.as<bf16>(), x.as<bf16>(), x.numel(),
                                kind == GeluKind::kTanh, ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
