#include "ops/embedding.h"

#include "ops/cpu/embedding.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/embedding.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

namespace {
struct EmbeddingDims {
    int64_t B, T, C, V, P;
};

EmbeddingDims embedding_check(const char* op, ConstTensorView tokens, ConstTensorView positions,
                              ConstTensorView wte, ConstTensorView wpe) {
    LATHE_CHECK(tokens.rank() == 2 && wte.rank() == 2, "{}: tokens {}, wte {}", op,
                tokens.to_string(), wte.to_string());
    op_expect_dtype(op, "tokens", tokens, DType::kI32);
    EmbeddingDims d{tokens.dim(0), tokens.dim(1), wte.dim(1), wte.dim(0), 0};
    if (!positions.is_null()) {
        op_expect_dtype(op, "positions", positions, DType::kI32);
        op_expect_shape(op, "positions", positions, Shape{d.B, d.T});
    }
    if (!wpe.is_null()) {
        LATHE_CHECK(wpe.rank() == 2 && wpe.dim(1) == d.C, "{}: wpe {} for C={}", op,
                    wpe.to_string(), d.C);
        d.P = wpe.dim(0);
    }
    return d;
}
}  // namespace

void embedding_forward(TensorView out, ConstTensorView tokens, ConstTensorView positions,
                       ConstTensorView wte, ConstTensorView wpe, const Context& ctx) {
    constexpr const char* kOp = "embedding_forward";
    const EmbeddingDims d = embedding_check(kOp, tokens, positions, wte, wpe);
    op_expect_shape(kOp, "out", out, Shape{d.B, d.T, d.C});
    op_expect_memory(kOp, ctx, {out, tokens, positions, wte, wpe});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {out, wte, wpe});
            cpu::embedding_forward(out.as<float>(), tokens.as<int32_t>(), positions.as<int32_t>(),
                                   wte.as<float>(), wpe.as<float>(), d.B, d.T, d.C, d.V, d.P);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, wte, wpe});
            cuda::embedding_forward(out.as<bf16>(), tokens.as<int32_t>(), positions.as<int32_t>(),
                                    wte.as<bf16>(), wpe.as<bf16>(), d.B, d.T, d.C, d.V, d.P,
                                    ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void embedding_backward(TensorView dwte, TensorView dwpe, ConstTensorView dout,
                        ConstTensorView tokens, ConstTensorView positions, const Context& ctx) {
    constexpr const char* kOp = "embedding_backward";
    LATHE_CHECK(!dwte.is_null() || !dwpe.is_null(), "{}: neither dwte nor dwpe given", kOp);
    LATHE_CHECK(tokens.rank() == 2 && dout.rank() == 3, "{}: tokens {}, dout {}", kOp,
                tokens.to_string(), dout.to_string());
    const int64_t B = tokens.dim(0), T = tokens.dim(1), C = dout.dim(2);
    op_expect_dtype(kOp, "tokens", tokens, DType::kI32);
    op_expect_shape(kOp, "dout", dout, Shape{B, T, C});
    if (!positions.is_null()) {
        op_expect_dtype(kOp, "positions", positions, DType::kI32);
        op_expect_shape(kOp, "positions", positions, Shape{B, T});
    }
    // V bounds the token check; without dwte there is no table to index.
    int64_t V = INT32_MAX, P = 0;
    if (!dwte.is_null()) {
        LATHE_CHECK(dwte.rank() == 2 && dwte.dim(1) == C, "{}: dwte {} for C={}", kOp,
                    dwte.to_string(), C);
        V = dwte.dim(0);
    }
    if (!dwpe.is_null()) {
        LATHE_CHECK(dwpe.rank() == 2 && dwpe.dim(1) == C, "{}: dwpe {} for C={}", kOp,
                    dwpe.to_string(), C);
        P = dwpe.dim(0);
    }
    op_expect_memory(kOp, ctx, {dwte, dwpe, dout, tokens, positions});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dwte, dwpe, dout});
            cpu::embedding_backward(dwte.as<float>(), dwpe.as<float>(), dout.as<float>(),
                                    tokens.as<int32_t>(), positions.as<int32_t>(), B, T, C, V, P);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kF32, {dwte, dwpe});
            op_expect_cuda_dtype(kOp, DType::kBF16, {dout});
            cuda::embedding_backward(dwte.as<float>(), dwpe.as<float>(), dout.as<bf16>(),
                                     tokens.as<int32_t>(), positions.as<int32_t>(), B, T, C, V, P,
                                     cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
