#include "ops/attention.h"

#include "ops/cpu/attention.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/dispatch.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

namespace {
struct AttentionDims {
    int64_t B, Tq, Tk, H, Hkv, D;
};

// q (B, Tq, H, D), k and v (B, Tk, Hkv, D), lse (B, H, Tq) f32; the rules of ops/attention.h.
AttentionDims attention_check(const char* op, ConstTensorView q, ConstTensorView k,
                              ConstTensorView v, ConstTensorView lse, int64_t window) {
    LATHE_CHECK(q.rank() == 4 && k.rank() == 4,
                "{}: q {}, k {}; expected (B, Tq, H, D) and "
                "(B, Tk, Hkv, D)",
                op, q.to_string(), k.to_string());
    AttentionDims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
    LATHE_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0, "{}: Hkv = {} does not divide H = {}", op, d.Hkv,
                d.H);
    op_expect_shape(op, "k", k, Shape{d.B, d.Tk, d.Hkv, d.D});
    op_expect_shape(op, "v", v, Shape{d.B, d.Tk, d.Hkv, d.D});
    op_expect_shape(op, "lse", lse, Shape{d.B, d.H, d.Tq});
    op_expect_dtype(op, "lse", lse, DType::kF32);
    LATHE_CHECK(window >= 0, "{}: window {} (0 means none)", op, window);
    return d;
}

void docs_check(const char* op, ConstTensorView docs, const AttentionDims& d) {
    if (docs.is_null()) return;
    op_expect_dtype(op, "docs", docs, DType::kI32);
    op_expect_shape(op, "docs", docs, Shape{d.B, d.Tk});
}

// The training form: one length T for queries and keys (the backward's only form).
AttentionDims training_check(const char* op, ConstTensorView q, ConstTensorView k,
                             ConstTensorView v, ConstTensorView lse, ConstTensorView docs,
                             int64_t window) {
    const AttentionDims d = attention_check(op, q, k, v, lse, window);
    LATHE_CHECK(d.Tq == d.Tk, "{}: q {} and k {} differ in length; the backward takes Tq == Tk", op,
                q.to_string(), k.to_string());
    docs_check(op, docs, d);
    return d;
}

cuda::AttentionShape cuda_attention_shape(const char* op, const AttentionDims& d,
                                          ConstTensorView docs, int64_t window, float scale,
                                          const Context& ctx) {
    const char* missing = cuda::attention_unavailable_reason();
    LATHE_CHECK(missing == nullptr, "{}: {}", op, missing);
    cuda::AttentionShape shape{d.B, d.Tq, d.H, d.Hkv, d.D, window, !docs.is_null(), scale};
    shape.nondeterministic_backward = !ctx.deterministic;
    return shape;
}

cuda::AttentionRowsShape cuda_rows_shape(const AttentionDims& d, int64_t q_offset, int64_t window,
                                         float scale) {
    return {d.B, d.Tq, d.Tk, d.H, d.Hkv, d.D, q_offset, window, scale};
}
}  // namespace

const char* attention_unavailable_reason(Backend backend) {
    if (backend == Backend::kCpu) return nullptr;
    return cuda::attention_unavailable_reason();
}

void attention_forward(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k,
                       ConstTensorView v, ConstTensorView docs, int64_t window, float scale,
                       const Context& ctx) {
    attention_forward(out, lse, q, k, v, docs, window, scale, 0, ctx);
}

void attention_forward(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k,
                       ConstTensorView v, ConstTensorView docs, int64_t window, float scale,
                       int64_t q_offset, const Context& ctx) {
    constexpr const char* kOp = "attention_forward";
    const AttentionDims d = attention_check(kOp, q, k, v, lse, window);
    LATHE_CHECK(d.Tq <= d.Tk, "{}: q {} is longer than k {}; queries continue the keys (Tq <= Tk)",
                kOp, q.to_string(), k.to_string());
    LATHE_CHECK(q_offset >= 0 && q_offset <= d.Tk - d.Tq,
                "{}: q_offset {} with Tq = {}, Tk = {}; the queries' positions q_offset .. "
                "q_offset + Tq - 1 are keys, so 0 <= q_offset <= Tk - Tq",
                kOp, q_offset, d.Tq, d.Tk);
    docs_check(kOp, docs, d);
    op_expect_shape(kOp, "out", out, q.shape());
    op_expect_memory(kOp, ctx, {out, lse, q, k, v, docs});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {out, q, k, v});
            cpu::attention_forward(out.as<float>(), lse.as<float>(), q.as<float>(), k.as<float>(),
                                   v.as<float>(), docs.as<int32_t>(), d.B, d.Tq, d.Tk, q_offset,
                                   d.H, d.Hkv, d.D, window, scale);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, q, k, v});
            if (d.Tq == d.Tk) {  // q_offset is 0: the training shape, cuDNN's flash attention
                cuda::attention_forward(out.as<bf16>(), lse.as<float>(), q.as<bf16>(), k.as<bf16>(),
                                        v.as<bf16>(), docs.as<int32_t>(),
                                        cuda_attention_shape(kOp, d, docs, window, scale, ctx),
                                        cuda_state_of(ctx, kOp), ctx.stream);
            } else if (docs.is_null() && cuda::attention_unavailable_reason() == nullptr &&
                       d.D <= 128 && d.D % 8 == 0) {
                // Queries that continue a cache: cuDNN's bottom-right aligned forward (its own
                // kernel when cuDNN declines the shape).
                cuda::AttentionShape shape{d.B, d.Tq, d.H, d.Hkv, d.D, window, false, scale};
                shape.Tkv = q_offset + d.Tq;
                shape.kv_rows = d.Tk;
                cuda::attention_forward(out.as<bf16>(), lse.as<float>(), q.as<bf16>(), k.as<bf16>(),
                                        v.as<bf16>(), nullptr, shape, cuda_state_of(ctx, kOp),
                                        ctx.stream);
            } else {
                cuda::attention_forward_rows(out.as<bf16>(), lse.as<float>(), q.as<bf16>(),
                                             k.as<bf16>(), v.as<bf16>(), docs.as<int32_t>(),
                                             nullptr, cuda_rows_shape(d, q_offset, window, scale),
                                             cuda_state_of(ctx, kOp), ctx.stream);
            }
            return;
    }
    op_no_backend(kOp, ctx);
}

void attention_decode(TensorView out, TensorView lse, ConstTensorView q, ConstTensorView k_cache,
                      ConstTensorView v_cache, ConstTensorView lengths, int64_t window, float scale,
                      const Context& ctx) {
    constexpr const char* kOp = "attention_decode";
    const AttentionDims d = attention_check(kOp, q, k_cache, v_cache, lse, window);
    LATHE_CHECK(d.Tq == 1, "{}: q {}; one new token per row, (B, 1, H, D)", kOp, q.to_string());
    op_expect_shape(kOp, "out", out, q.shape());
    op_expect_dtype(kOp, "lengths", lengths, DType::kI32);
    op_expect_shape(kOp, "lengths", lengths, Shape{d.B});
    op_expect_memory(kOp, ctx, {out, lse, q, k_cache, v_cache, lengths});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {out, q, k_cache, v_cache});
            cpu::attention_decode(out.as<float>(), lse.as<float>(), q.as<float>(),
                                  k_cache.as<float>(), v_cache.as<float>(), lengths.as<int32_t>(),
                                  d.B, d.Tk, d.H, d.Hkv, d.D, window, scale);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, q, k_cache, v_cache});
            cuda::attention_forward_rows(
                out.as<bf16>(), lse.as<float>(), q.as<bf16>(), k_cache.as<bf16>(),
                v_cache.as<bf16>(), nullptr, lengths.as<int32_t>(),
                cuda_rows_shape(d, 0, window, scale), cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void attention_backward(TensorView dq, TensorView dk, TensorView dv, ConstTensorView dout,
                        ConstTensorView q, ConstTensorView k, ConstTensorView v,
                        ConstTensorView out, ConstTensorView lse, ConstTensorView docs,
                        int64_t window, float scale, const Context& ctx) {
    constexpr const char* kOp = "attention_backward";
    const AttentionDims d = training_check(kOp, q, k, v, lse, docs, window);
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
                                    out.as<float>(), lse.as<float>(), docs.as<int32_t>(), d.B, d.Tq,
                                    d.H, d.Hkv, d.D, window, scale);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dq, dk, dv, dout, q, k, v, out});
            cuda::attention_backward(dq.as<bf16>(), dk.as<bf16>(), dv.as<bf16>(), dout.as<bf16>(),
                                     q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), out.as<bf16>(),
                                     lse.as<float>(), docs.as<int32_t>(),
                                     cuda_attention_shape(kOp, d, docs, window, scale, ctx),
                                     cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
