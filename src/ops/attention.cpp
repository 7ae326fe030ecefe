#include "ops/attention.h"

#include "ops/cpu/attention.h"
#include "ops/op_checks.h"

#if LATHE_HAVE_CUDA
#include "ops/cuda/attention.h"
#include "ops/cuda/dispatch.h"
#endif

namespace lathe {

using namespace detail;

namespace {
struct AttentionDims {
    int64_t B, T, H, Hkv, D;
};

AttentionDims attention_check(const char* op, ConstTensorView q, ConstTensorView k,
                              ConstTensorView v, ConstTensorView lse, ConstTensorView docs,
                              int64_t window) {
    LATHE_CHECK(q.rank() == 4 && k.rank() == 4,
                "{}: q {}, k {}; expected (B, T, H, D) and "
                "(B, T, Hkv, D)",
                op, q.to_string(), k.to_string());
    AttentionDims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
    LATHE_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0, "{}: Hkv = {} does not divide H = {}", op, d.Hkv,
                d.H);
    op_expect_shape(op, "k", k, Shape{d.B, d.T, d.Hkv, d.D});
    op_expect_shape(op, "v", v, Shape{d.B, d.T, d.Hkv, d.D});
    op_expect_shape(op, "lse", lse, Shape{d.B, d.H, d.T});
    op_expect_dtype(op, "lse", lse, DType::kF32);
    if (!docs.is_null()) {
        op_expect_dtype(op, "docs", docs, DType::kI32);
        op_expect_shape(op, "docs", docs, Shape{d.B, d.T});
    }
    LATHE_CHECK(window >= 0, "{}: window {} (0 means none)", op, window);
    return d;
}

#if LATHE_HAVE_CUDA
cuda::AttentionShape cuda_attention_shape(const char* op, const AttentionDims& d,
                                          ConstTensorView docs, int64_t window, float scale,
                                          const Context& ctx) {
    const char* missing = cuda::attention_unavailable_reason();
    LATHE_CHECK(missing == nullptr, "{}: {}", op, missing);
    cuda::AttentionShape shape{d.B, d.T, d.H, d.Hkv, d.D, window, !docs.is_null(), scale};
    shape.nondeterministic_backward = !ctx.deterministic;
    return shape;
}
#endif
}  // namespace

const char* attention_unavailable_reason(Backend backend) {
    if (backend == Backend::kCpu) return nullptr;
#if LATHE_HAVE_CUDA
    return cuda::attention_unavailable_reason();
#else
    return "this lathe was built without the CUDA backend";
#endif
}

void attention_forward(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k,
                       ConstTensorView v, ConstTensorView docs, int64_t window, float scale,
                       const Context& ctx) {
    constexpr const char* kOp = "attention_forward";
    const AttentionDims d = attention_check(kOp, q, k, v, lse, docs, window);
    op_expect_shape(kOp, "out", out, q.shape());
    op_expect_memory(kOp, ctx, {out, lse, q, k, v, docs});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {out, q, k, v});
            cpu::attention_forward(out.as<float>(), lse.as<float>(), q.as<float>(), k.as<float>(),
                                   v.as<float>(), docs.as<int32_t>(), d.B, d.T, d.H, d.Hkv, d.D,
                                   window, scale);
            return;
        case Backend::kCuda:
#if LATHE_HAVE_CUDA
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, q, k, v});
            cuda::attention_forward(cuda_state_of(ctx, kOp), ctx.stream, out.as<bf16>(),
                                    lse.as<float>(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(),
                                    docs.as<int32_t>(),
                                    cuda_attention_shape(kOp, d, docs, window, scale, ctx));
            return;
#endif
            break;
    }
    op_no_backend(kOp, ctx);
}

void attention_backward(TensorView dq, TensorView dk, TensorView dv, ConstTensorView dout,
                        ConstTensorView q, ConstTensorView k, ConstTensorView v,
                        ConstTensorView out, ConstTensorView lse, ConstTensorView docs,
                        int64_t window, float scale, const Context& ctx) {
    constexpr const char* kOp = "attention_backward";
    const AttentionDims d = attention_check(kOp, q, k, v, lse, docs, window);
    op_expect_shape(kOp, "dq", dq, q.shape());
    op_expect_shape(kOp, "dk", dk, k.shape());
    op_expect_shape(kOp, "dv", dv, v.shape());
    op_expect_shape(kOp, "dout", dout, q.shape());
    op_expect_shape(kOp, "out", out, q.shape());
    op_expect_memory(kOp, ctx, {dq, dk, dv, dout, q, k, v, out, lse, docs});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dq, dk, dv, dout, q, k, v, out});
            cpu::attention_backward(dq.as<float>(), dk.as<float>(), dv.as<float>(),
                                    dout.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(),
                                    out.as<float>(), lse.as<float>(), docs.as<int32_t>(), d.B, d.T,
                                    d.H, d.Hkv, d.D, window, scale);
            return;
        case Backend::kCuda:
#if LATHE_HAVE_CUDA
            op_expect_cuda_dtype(kOp, DType::kBF16, {dq, dk, dv, dout, q, k, v, out});
            cuda::attention_backward(cuda_state_of(ctx, kOp), ctx.stream, dq.as<bf16>(),
                                     dk.as<bf16>(), dv.as<bf16>(), dout.as<bf16>(), q.as<bf16>(),
                                     k.as<bf16>(), v.as<bf16>(), out.as<bf16>(), lse.as<float>(),
                                     docs.as<int32_t>(),
                                     cuda_attention_shape(kOp, d, docs, window, scale, ctx));
            return;
#endif
            break;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
