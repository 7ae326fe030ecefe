#include "ops/argmax.h"

#include "ops/cpu/argmax.h"
#include "ops/cuda/argmax.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

void argmax_rows(TensorView ids, ConstTensorView x, const Context& ctx) {
    constexpr const char* kOp = "argmax_rows";
    const auto [N, V] = op_rows_cols(kOp, "x", x);
    op_expect_shape(kOp, "ids", ids, Shape{N});
    op_expect_dtype(kOp, "ids", ids, DType::kI32);
    op_expect_memory(kOp, ctx, {ids, x});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_dtype(kOp, "x", x, DType::kF32);
            cpu::argmax_rows(ids.as<int32_t>(), x.as<float>(), N, V);
            return;
        case Backend::kCuda:
            op_expect_dtype(kOp, "x", x, DType::kBF16);
            cuda::argmax_rows(ids.as<int32_t>(), x.as<bf16>(), N, V, ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
