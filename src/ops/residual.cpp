#include "ops/residual.h"

#include "ops/cpu/residual.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/residual.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

void residual_forward(TensorView out, ConstTensorView a, ConstTensorView b, const Context& ctx) {
    constexpr const char* kOp = "residual_forward";
    op_expect_shape(kOp, "b", b, a.shape());
    op_expect_shape(kOp, "out", out, a.shape());
    op_expect_memory(kOp, ctx, {out, a, b});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {out, a, b});
            cpu::residual_forward(out.as<float>(), a.as<float>(), b.as<float>(), a.numel());
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, a, b});
            cuda::residual_forward(out.as<bf16>(), a.as<bf16>(), b.as<bf16>(), a.numel(),
                                   ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void residual_backward(TensorView da, TensorView db, ConstTensorView dout, const Context& ctx) {
    constexpr const char* kOp = "residual_backward";
    if (!da.is_null()) op_expect_shape(kOp, "da", da, dout.shape());
    if (!db.is_null()) op_expect_shape(kOp, "db", db, dout.shape());
    LATHE_CHECK(da.data() != dout.data() && db.data() != dout.data() &&
                    (da.is_null() || da.data() != db.data()),
                "{}: da, db and dout must be distinct buffers (both gradients accumulate)", kOp);
    op_expect_memory(kOp, ctx, {da, db, dout});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {da, db, dout});
            cpu::residual_backward(da.as<float>(), db.as<float>(), dout.as<float>(), dout.numel());
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {da, db, dout});
            cuda::residual_backward(da.as<bf16>(), db.as<bf16>(), dout.as<bf16>(), dout.numel(),
                                    ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
