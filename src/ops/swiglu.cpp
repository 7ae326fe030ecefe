#include "ops/swiglu.h"

#include "ops/cpu/fp8_cast.h"
#include "ops/cpu/swiglu.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/swiglu.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

void swiglu_forward(TensorView out, ConstTensorView gate_up, const Context& ctx,
                    TensorView out_amax) {
    constexpr const char* kOp = "swiglu_forward";
    const auto [N, F2] = op_rows_cols(kOp, "gate_up", gate_up);
    LATHE_CHECK(F2 % 2 == 0, "{}: gate_up {} has an odd last dimension", kOp, gate_up.to_string());
    op_expect_shape(kOp, "out", out, gate_up.shape().with_dim(-1, F2 / 2));
    if (!out_amax.is_null()) {
        op_expect_shape(kOp, "out_amax", out_amax, Shape{1});
        op_expect_dtype(kOp, "out_amax", out_amax, DType::kF32);
    }
    op_expect_memory(kOp, ctx, {out, gate_up, out_amax});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {out, gate_up});
            cpu::swiglu_forward(out.as<float>(), gate_up.as<float>(), N, F2 / 2);
            if (!out_amax.is_null())
                *out_amax.as<float>() = cpu::fp8_amax(out.as<float>(), out.numel());
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, gate_up});
            cuda::swiglu_forward(out.as<bf16>(), gate_up.as<bf16>(), N, F2 / 2, ctx.stream,
                                 out_amax.as<float>());
            return;
    }
    op_no_backend(kOp, ctx);
}

void swiglu_backward(TensorView dgate_up, ConstTensorView dout, ConstTensorView gate_up,
                     const Context& ctx, TensorView dgate_up_amax) {
    constexpr const char* kOp = "swiglu_backward";
    const auto [N, F2] = op_rows_cols(kOp, "gate_up", gate_up);
    LATHE_CHECK(F2 % 2 == 0, "{}: gate_up {} has an odd last dimension", kOp, gate_up.to_string());
    op_expect_shape(kOp, "dgate_up", dgate_up, gate_up.shape());
    op_expect_shape(kOp, "dout", dout, gate_up.shape().with_dim(-1, F2 / 2));
    if (!dgate_up_amax.is_null()) {
        op_expect_shape(kOp, "dgate_up_amax", dgate_up_amax, Shape{1});
        op_expect_dtype(kOp, "dgate_up_amax", dgate_up_amax, DType::kF32);
    }
    op_expect_memory(kOp, ctx, {dgate_up, dout, gate_up, dgate_up_amax});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dgate_up, dout, gate_up});
            cpu::swiglu_backward(dgate_up.as<float>(), dout.as<float>(), gate_up.as<float>(), N,
                                 F2 / 2);
            if (!dgate_up_amax.is_null())
                *dgate_up_amax.as<float>() = cpu::fp8_amax(dgate_up.as<float>(), dgate_up.numel());
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dgate_up, dout, gate_up});
            cuda::swiglu_backward(dgate_up.as<bf16>(), dout.as<bf16>(), gate_up.as<bf16>(), N,
                                  F2 / 2, ctx.stream, dgate_up_amax.as<float>());
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
