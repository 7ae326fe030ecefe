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

// The CUDA FP8 head's buffers from `spec` (null: native), after the precision check.
const cuda::LmHeadFp8* head_fp8(const char* op, const LinearSpec& spec, const Context& ctx,
                                cuda::LmHeadFp8& out) {
    LATHE_CHECK(spec.precision != LinearPrecision::kFp8Blockwise,
                "{}: the LM head has no {} kernel (fp8.recipe: blockwise with fp8.lm_head: true); "
                "use per-tensor scales (tensorwise, delayed) or a native head",
                op, linear_precision_name(spec.precision));
    linear_expect_precision(op, spec, ctx);
    if (spec.precision == LinearPrecision::kNative) return nullptr;
    const Fp8LinearBuffers& b = *spec.fp8;
    out.wq = b.wq, out.wqt = b.wqt, out.xq = b.xq, out.xqt = b.xqt;
    out.scalars = b.scalars, out.grad_dtype = b.grad_dtype;
    out.delayed_scale = b.delayed_scale, out.step_amax = b.step_amax;
    out.x_amax = spec.x_amax;
    return &out;
}

void check_shard(const char* op, const LmHeadVocabShard& shard, int64_t V, const LinearSpec& spec) {
    if (shard.total == 0) return;
    LATHE_CHECK(shard.begin >= 0 && shard.begin + V <= shard.total,
                "{}: a weight of {} rows from vocabulary id {} in a vocabulary of {}", op, V,
                shard.begin, shard.total);
    LATHE_CHECK(spec.precision == LinearPrecision::kNative,
                "{}: a vocabulary shard runs the native head only, not {}", op,
                linear_precision_name(spec.precision));
}

void count_head_gemms(const LinearSpec& spec, int64_t n) {
    if (spec.fp8 != nullptr && spec.fp8->gemm_count != nullptr) *spec.fp8->gemm_count += n;
}
}  // namespace

void lm_head_cross_entropy_forward(TensorView loss, TensorView losses, TensorView lse,
                                   ConstTensorView x, ConstTensorView targets,
                                   ConstTensorView weight, TensorView scratch, const Context& ctx,
                                   const LinearSpec& spec, const LmHeadVocabShard& shard) {
    constexpr const char* kOp = "lm_head_cross_entropy_forward";
    cuda::LmHeadFp8 f8;
    const cuda::LmHeadFp8* fp8 = head_fp8(kOp, spec, ctx, f8);
    const LmHeadDims d = lm_head_check(kOp, x, targets, weight, scratch);
    check_shard(kOp, shard, d.V, spec);
    op_expect_shape(kOp, "loss", loss, Shape{1});
    op_expect_shape(kOp, "lse", lse, Shape{d.N});
    if (!losses.is_null()) op_expect_shape(kOp, "losses", losses, Shape{d.N});
    op_expect_memory(kOp, ctx, {loss, losses, lse, x, targets, weight, scratch});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {loss, losses, lse, x, weight});
            cpu::lm_head_cross_entropy_forward(
                loss.as<float>(), losses.as<float>(), lse.as<float>(), x.as<float>(),
                targets.as<int32_t>(), weight.as<float>(), scratch.as<float>(), d.N, d.C, d.V, d.Nc,
                shard.begin, shard.total);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {x, weight});
            op_expect_cuda_dtype(kOp, DType::kF32, {loss, losses, lse});
            cuda::lm_head_cross_entropy_forward(
                loss.as<float>(), losses.as<float>(), lse.as<float>(), x.as<bf16>(),
                targets.as<int32_t>(), weight.as<bf16>(), scratch.as<float>(), d.N, d.C, d.V, d.Nc,
                cuda_state_of(ctx, kOp), ctx.stream, fp8, shard.begin, shard.total);
            if (fp8) count_head_gemms(spec, 1);
            return;
    }
    op_no_backend(kOp, ctx);
}

void lm_head_cross_entropy_backward(TensorView dx, TensorView dweight, ConstTensorView x,
                                    ConstTensorView targets, ConstTensorView weight,
                                    ConstTensorView lse, float dloss, TensorView scratch,
                                    const Context& ctx, const LinearSpec& spec,
                                    const LmHeadVocabShard& shard) {
    constexpr const char* kOp = "lm_head_cross_entropy_backward";
    cuda::LmHeadFp8 f8;
    const cuda::LmHeadFp8* fp8 = head_fp8(kOp, spec, ctx, f8);
    const LmHeadDims d = lm_head_check(kOp, x, targets, weight, scratch);
    check_shard(kOp, shard, d.V, spec);
    op_expect_shape(kOp, "dx", dx, x.shape());
    op_expect_shape(kOp, "lse", lse, Shape{d.N});
    if (!dweight.is_null()) op_expect_shape(kOp, "dweight", dweight, weight.shape());
    op_expect_memory(kOp, ctx, {dx, dweight, x, targets, weight, lse, scratch});
    const bool dw_accumulate = dweight_accumulates(dweight, spec, d.N, ctx);
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dx, dweight, x, weight, lse});
            cpu::lm_head_cross_entropy_backward(dx.as<float>(), dweight.as<float>(), x.as<float>(),
                                                targets.as<int32_t>(), weight.as<float>(),
                                                lse.as<float>(), dloss, scratch.as<float>(), d.N,
                                                d.C, d.V, d.Nc, shard.begin, shard.total);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dx, x, weight});
            op_expect_cuda_dtype(kOp, DType::kF32, {dweight, lse});
            cuda::lm_head_cross_entropy_backward(
                dx.as<bf16>(), dweight.as<float>(), dw_accumulate, x.as<bf16>(),
                targets.as<int32_t>(), weight.as<bf16>(), lse.as<float>(), dloss,
                scratch.as<float>(), d.N, d.C, d.V, d.Nc, cuda_state_of(ctx, kOp), ctx.stream, fp8,
                shard.begin, shard.total);
            if (fp8) count_head_gemms(spec, dweight.is_null() ? 1 : 2);
            return;
    }
    op_no_backend(kOp, ctx);
}

void lm_head_cross_entropy_forward_backward(TensorView loss, TensorView losses, TensorView dx,
                                            TensorView dweight, ConstTensorView x,
                                            ConstTensorView targets, ConstTensorView weight,
                                            float dloss, TensorView scratch, const Context& ctx,
                                            const LinearSpec& spec) {
    constexpr const char* kOp = "lm_head_cross_entropy_forward_backward";
    cuda::LmHeadFp8 f8;
    const cuda::LmHeadFp8* fp8 = head_fp8(kOp, spec, ctx, f8);
    const LmHeadDims d = lm_head_check(kOp, x, targets, weight, scratch);
    op_expect_shape(kOp, "loss", loss, Shape{1});
    if (!losses.is_null()) op_expect_shape(kOp, "losses", losses, Shape{d.N});
    op_expect_shape(kOp, "dx", dx, x.shape());
    if (!dweight.is_null()) op_expect_shape(kOp, "dweight", dweight, weight.shape());
    op_expect_memory(kOp, ctx, {loss, losses, dx, dweight, x, targets, weight, scratch});
    const bool dw_accumulate = dweight_accumulates(dweight, spec, d.N, ctx);
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
                dw_accumulate, x.as<bf16>(), targets.as<int32_t>(), weight.as<bf16>(), dloss,
                scratch.as<float>(), d.N, d.C, d.V, d.Nc, cuda_state_of(ctx, kOp), ctx.stream, fp8);
            if (fp8) count_head_gemms(spec, dweight.is_null() ? 2 : 3);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
