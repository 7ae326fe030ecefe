#include "ops/linear.h"

#include <algorithm>

#include "ops/cpu/gelu.h"
#include "ops/cpu/linear.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/fp8_cast.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/cuda/gelu.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/linear.h"
#include "ops/op_checks.h"
#include "ops/residual.h"

namespace lathe {

using namespace detail;

namespace {

struct LinearDims {
    int64_t N, I, O;
};

// The shapes every linear op checks: `x_name` (..., I) read as N rows, weight (O, I).
LinearDims linear_dims(const char* op, const char* x_name, ConstTensorView x,
                       ConstTensorView weight) {
    const auto [N, I] = op_rows_cols(op, x_name, x);
    LATHE_CHECK(weight.rank() == 2 && weight.dim(1) == I, "{}: weight {} for {} {}", op,
                weight.to_string(), x_name, x.to_string());
    return {N, I, weight.dim(0)};
}

// Whether the op runs `spec` through the FP8 path (kFp8PerTensor with buffers on CUDA; the
// precision check has stopped every other fp8 case).
bool fp8_path(const LinearSpec& spec) {
    return spec.precision == LinearPrecision::kFp8PerTensor;
}

void count_gemm(const Fp8LinearBuffers& b) {
    if (b.gemm_count != nullptr) ++*b.gemm_count;
}

// x (rows, cols) bf16 -> codes q, qt: tensor `t` of the linear (its amax and scale_inv in the
// scalar slot at `slot`). Current scaling: with x's own amax. Delayed: with b's scale of t; the
// amax the cast reports joins the step's (Fp8LinearBuffers::step_amax).
// ready_amax (current scaling only): amax(x) as the producer of x computed it.
void fp8_cast_tensor(const bf16* x, int64_t rows, int64_t cols, DType dtype, void* q, void* qt,
                     float* slot, const Fp8LinearBuffers& b, int t, CUstream_st* stream,
                     const float* ready_amax = nullptr) {
    Fp8CastArgs a;
    a.rows = rows;
    a.cols = cols;
    a.x = x;
    a.dtype = dtype;
    a.q = q;
    a.qt = qt;
    a.amax = slot;
    a.scale_inv = slot + 4;
    if (b.delayed_scale != nullptr) {
        a.scale = b.delayed_scale + t;
    } else if (ready_amax != nullptr) {
        // Read only (amax_ready): the cast writes neither it nor the slot's amax.
        a.amax = const_cast<float*>(ready_amax);
        a.amax_ready = true;
    }
    cuda::fp8_cast(a, stream);
    if (b.delayed_scale != nullptr) cuda::fp8_amax_max_into(b.step_amax + t, slot, stream);
}

// The FP8 forward: y = sx sw (xq . wq^T) + bias [+ residual].
void fp8_forward(bf16* y, const bf16* x, const bf16* bias, const bf16* residual, int64_t N,
                 int64_t I, int64_t O, const Fp8LinearBuffers& b, const float* x_amax,
                 CudaState& state, CUstream_st* stream) {
    fp8_cast_tensor(x, N, I, DType::kE4M3, b.xq, b.xqt, b.scalars + 0, b, 0, stream, x_amax);
    cuda::fp8_linear_forward(y, {b.xq, DType::kE4M3, b.scalars + 4},
                             {b.wq, DType::kE4M3, b.scalars + 12}, bias, residual, N, I, O, state,
                             stream);
    count_gemm(b);
}

}  // namespace

bool dweight_accumulates(TensorView dweight, const LinearSpec& spec, int64_t rows,
                         const Context& ctx) {
    if (dweight.is_null() || spec.dweight_mode == GradMode::kAccumulate) return true;
    LATHE_CHECK(dweight.dtype() == DType::kF32, "dweight_accumulates: dweight is {}, expected f32",
                dweight.to_string());
    if (ctx.backend == Backend::kCuda && rows > 0) return false;
    if (ctx.backend == Backend::kCuda)
        cuda_fill_bytes(dweight, 0, ctx.stream);
    else
        std::fill_n(dweight.as<float>(), dweight.numel(), 0.0f);
    return true;
}

std::string_view linear_precision_name(LinearPrecision p) {
    switch (p) {
        case LinearPrecision::kNative:
            return "native";
        case LinearPrecision::kFp8PerTensor:
            return "fp8_per_tensor";
        case LinearPrecision::kFp8Blockwise:
            return "fp8_blockwise";
    }
    return "?";
}

void linear_expect_precision(std::string_view op, const LinearSpec& spec, const Context& ctx) {
    if (spec.precision == LinearPrecision::kNative) return;
    const std::string_view role = spec.role.empty() ? std::string_view("linear") : spec.role;
    const bool fp8_op =
        op == "linear_forward" || op == "linear_residual_forward" || op == "linear_backward" ||
        op == "linear_fp8_cast_weight" || op == "lm_head_cross_entropy_forward" ||
        op == "lm_head_cross_entropy_backward" || op == "lm_head_cross_entropy_forward_backward";
    LATHE_CHECK(ctx.backend == Backend::kCuda && fp8_op,
                "{}: fp8 linear: no kernel for {} ({}) on the {} backend in this build; use the "
                "native precision for this linear",
                op, linear_precision_name(spec.precision), role, backend_name(ctx.backend));
    if (spec.precision == LinearPrecision::kFp8Blockwise) {
        LATHE_CHECK(spec.fp8_block != nullptr && spec.fp8_block->cast_scales != nullptr,
                    "{}: fp8 linear {} ({}) on the cuda backend without its buffers "
                    "(LinearSpec::fp8_block)",
                    op, linear_precision_name(spec.precision), role);
        return;
    }
    LATHE_CHECK(spec.fp8 != nullptr && spec.fp8->scalars != nullptr,
                "{}: fp8 linear {} ({}) on the cuda backend without its buffers (LinearSpec::fp8)",
                op, linear_precision_name(spec.precision), role);
    LATHE_CHECK(spec.fp8->delayed_scale == nullptr || spec.fp8->step_amax != nullptr,
                "{}: fp8 linear {} ({}) with delayed scales but no step_amax", op,
                linear_precision_name(spec.precision), role);
}

void linear_fp8_cast_weight(ConstTensorView weight, const Context& ctx, const LinearSpec& spec) {
    constexpr const char* kOp = "linear_fp8_cast_weight";
    linear_expect_precision(kOp, spec, ctx);
    LATHE_CHECK(weight.rank() == 2, "{}: weight {}", kOp, weight.to_string());
    op_expect_memory(kOp, ctx, {weight});
    op_expect_cuda_dtype(kOp, DType::kBF16, {weight});
    if (spec.precision == LinearPrecision::kFp8Blockwise) {
        fp8_blockwise_cast_weight(weight.as<bf16>(), weight.dim(0), weight.dim(1), *spec.fp8_block,
                                  ctx.stream);
        return;
    }
    fp8_cast_tensor(weight.as<bf16>(), weight.dim(0), weight.dim(1), DType::kE4M3, spec.fp8->wq,
                    spec.fp8->wqt, spec.fp8->scalars + 8, *spec.fp8, 1, ctx.stream);
}

void linear_forward(TensorView y, ConstTensorView x, ConstTensorView weight, ConstTensorView bias,
                    const Context& ctx, const LinearSpec& spec) {
    constexpr const char* kOp = "linear_forward";
    linear_expect_precision(kOp, spec, ctx);
    const auto [N, I, O] = linear_dims(kOp, "x", x, weight);
    op_expect_shape(kOp, "y", y, x.shape().with_dim(-1, O));
    if (!bias.is_null()) op_expect_shape(kOp, "bias", bias, Shape{O});
    op_expect_memory(kOp, ctx, {y, x, weight, bias});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {y, x, weight, bias});
            cpu::linear_forward(y.as<float>(), x.as<float>(), weight.as<float>(), bias.as<float>(),
                                N, I, O);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {y, x, weight, bias});
            if (spec.precision == LinearPrecision::kFp8Blockwise) {
                fp8_blockwise_forward(y.as<bf16>(), x.as<bf16>(), bias.as<bf16>(), nullptr, N, I, O,
                                      *spec.fp8_block, cuda_state_of(ctx, kOp), ctx.stream);
                return;
            }
            if (fp8_path(spec)) {
                fp8_forward(y.as<bf16>(), x.as<bf16>(), bias.as<bf16>(), nullptr, N, I, O,
                            *spec.fp8, spec.x_amax, cuda_state_of(ctx, kOp), ctx.stream);
                return;
            }
            if (spec.skinny_gemv && cuda::gemv_supports(N, I, O, x.data(), weight.data())) {
                cuda::gemv_forward(y.as<bf16>(), x.as<bf16>(), weight.as<bf16>(), bias.as<bf16>(),
                                   nullptr, N, I, O, ctx.stream);
                return;
            }
            cuda::linear_forward(y.as<bf16>(), x.as<bf16>(), weight.as<bf16>(), bias.as<bf16>(), N,
                                 I, O, cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void linear_residual_forward(TensorView y, ConstTensorView x, ConstTensorView weight,
                             ConstTensorView bias, ConstTensorView residual, const Context& ctx,
                             const LinearSpec& spec) {
    constexpr const char* kOp = "linear_residual_forward";
    linear_expect_precision(kOp, spec, ctx);
    op_expect_shape(kOp, "residual", residual, y.shape());
    LATHE_CHECK(y.data() != residual.data() && y.data() != x.data(),
                "{}: y must be another buffer than residual and x", kOp);
    if (ctx.backend == Backend::kCpu) {  // the two ops, checks and all
        linear_forward(y, x, weight, bias, ctx, spec);
        residual_forward(y, residual, y, ctx);
        return;
    }
    const auto [N, I, O] = linear_dims(kOp, "x", x, weight);
    op_expect_shape(kOp, "y", y, x.shape().with_dim(-1, O));
    if (!bias.is_null()) op_expect_shape(kOp, "bias", bias, Shape{O});
    op_expect_memory(kOp, ctx, {y, x, weight, bias, residual});
    if (ctx.backend == Backend::kCuda) {
        op_expect_cuda_dtype(kOp, DType::kBF16, {y, x, weight, bias, residual});
        if (spec.precision == LinearPrecision::kFp8Blockwise) {
            fp8_blockwise_forward(y.as<bf16>(), x.as<bf16>(), bias.as<bf16>(), residual.as<bf16>(),
                                  N, I, O, *spec.fp8_block, cuda_state_of(ctx, kOp), ctx.stream);
            return;
        }
        if (fp8_path(spec)) {
            fp8_forward(y.as<bf16>(), x.as<bf16>(), bias.as<bf16>(), residual.as<bf16>(), N, I, O,
                        *spec.fp8, spec.x_amax, cuda_state_of(ctx, kOp), ctx.stream);
            return;
        }
        if (spec.skinny_gemv && cuda::gemv_supports(N, I, O, x.data(), weight.data())) {
            cuda::gemv_forward(y.as<bf16>(), x.as<bf16>(), weight.as<bf16>(), bias.as<bf16>(),
                               residual.as<bf16>(), N, I, O, ctx.stream);
            return;
        }
        cuda::linear_residual_forward(y.as<bf16>(), x.as<bf16>(), weight.as<bf16>(),
                                      bias.as<bf16>(), residual.as<bf16>(), N, I, O,
                                      cuda_state_of(ctx, kOp), ctx.stream);
        return;
    }
    op_no_backend(kOp, ctx);
}

void linear_backward(TensorView dx, TensorView dweight, TensorView dbias, ConstTensorView dy,
                     ConstTensorView x, ConstTensorView weight, GradMode dx_mode,
                     const Context& ctx, const LinearSpec& spec) {
    constexpr const char* kOp = "linear_backward";
    linear_expect_precision(kOp, spec, ctx);
    const auto [N, I, O] = linear_dims(kOp, "x", x, weight);
    op_expect_shape(kOp, "dy", dy, x.shape().with_dim(-1, O));
    if (!dx.is_null()) op_expect_shape(kOp, "dx", dx, x.shape());
    if (!dweight.is_null()) op_expect_shape(kOp, "dweight", dweight, weight.shape());
    if (!dbias.is_null()) op_expect_shape(kOp, "dbias", dbias, Shape{O});
    op_expect_memory(kOp, ctx, {dx, dweight, dbias, dy, x, weight});
    const bool dw_accumulate = dweight_accumulates(dweight, spec, N, ctx);
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dx, dweight, dbias, dy, x, weight});
            cpu::linear_backward(dx.as<float>(), dweight.as<float>(), dbias.as<float>(),
                                 dy.as<float>(), x.as<float>(), weight.as<float>(), N, I, O,
                                 dx_mode == GradMode::kAccumulate);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dx, dy, x, weight});
            op_expect_cuda_dtype(kOp, DType::kF32, {dweight, dbias});
            if (spec.precision == LinearPrecision::kFp8Blockwise) {
                // x's transposed codes (xqt) and their scales are the forward's; dy is cast here.
                fp8_blockwise_backward(dx.as<bf16>(), dweight.as<float>(), dbias.as<float>(),
                                       dy.as<bf16>(), N, I, O, dx_mode == GradMode::kAccumulate,
                                       dw_accumulate, *spec.fp8_block, cuda_state_of(ctx, kOp),
                                       ctx.stream);
                return;
            }
            if (fp8_path(spec)) {
                // x's codes (xqt) and scale are the forward's; dy is cast here.
                const Fp8LinearBuffers& b = *spec.fp8;
                CudaState& state = cuda_state_of(ctx, kOp);
                fp8_cast_tensor(dy.as<bf16>(), N, O, b.grad_dtype, b.dyq, b.dyqt, b.scalars + 16, b,
                                2, ctx.stream, spec.dy_amax);
                if (!dx.is_null()) {
                    cuda::fp8_linear_backward_input(
                        dx.as<bf16>(), {b.dyq, b.grad_dtype, b.scalars + 20},
                        {b.wqt, DType::kE4M3, b.scalars + 12}, N, I, O,
                        dx_mode == GradMode::kAccumulate, state, ctx.stream);
                    count_gemm(b);
                }
                if (!dweight.is_null()) {
                    cuda::fp8_linear_backward_weight(dweight.as<float>(),
                                                     {b.dyqt, b.grad_dtype, b.scalars + 20},
                                                     {b.xqt, DType::kE4M3, b.scalars + 4}, N, I, O,
                                                     dw_accumulate, state, ctx.stream);
                    count_gemm(b);
                }
                if (!dbias.is_null())
                    cuda::fp8_linear_backward_bias(dbias.as<float>(), dy.as<bf16>(), N, O, state,
                                                   ctx.stream);
                return;
            }
            cuda::linear_backward(dx.as<bf16>(), dweight.as<float>(), dbias.as<float>(),
                                  dy.as<bf16>(), x.as<bf16>(), weight.as<bf16>(), N, I, O,
                                  dx_mode == GradMode::kAccumulate, dw_accumulate,
                                  cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void linear_gelu_forward(TensorView act, TensorView pre, ConstTensorView x, ConstTensorView weight,
                         ConstTensorView bias, GeluKind kind, const Context& ctx,
                         const LinearSpec& spec) {
    constexpr const char* kOp = "linear_gelu_forward";
    linear_expect_precision(kOp, spec, ctx);
    const auto [N, I, O] = linear_dims(kOp, "x", x, weight);
    op_expect_shape(kOp, "pre", pre, x.shape().with_dim(-1, O));
    op_expect_shape(kOp, "act", act, x.shape().with_dim(-1, O));
    if (!bias.is_null()) op_expect_shape(kOp, "bias", bias, Shape{O});
    op_expect_memory(kOp, ctx, {act, pre, x, weight, bias});
    const bool tanh_form = kind == GeluKind::kTanh;
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {act, pre, x, weight, bias});
            cpu::linear_forward(pre.as<float>(), x.as<float>(), weight.as<float>(),
                                bias.as<float>(), N, I, O);
            cpu::gelu_forward(act.as<float>(), pre.as<float>(), pre.numel(), tanh_form);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {act, pre, x, weight, bias});
            if (spec.skinny_gemv && cuda::gemv_supports(N, I, O, x.data(), weight.data())) {
                cuda::gemv_forward(pre.as<bf16>(), x.as<bf16>(), weight.as<bf16>(), bias.as<bf16>(),
                                   nullptr, N, I, O, ctx.stream);
                cuda::gelu_forward(act.as<bf16>(), pre.as<bf16>(), N * O, tanh_form, ctx.stream);
                return;
            }
            cuda::linear_gelu_forward(act.as<bf16>(), pre.as<bf16>(), x.as<bf16>(),
                                      weight.as<bf16>(), bias.as<bf16>(), N, I, O, tanh_form,
                                      cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void linear_gelu_backward(TensorView dpre, TensorView dpre_bias, TensorView dweight,
                          TensorView dbias, ConstTensorView dy, ConstTensorView act,
                          ConstTensorView pre, ConstTensorView weight, GeluKind kind,
                          const Context& ctx, const LinearSpec& spec) {
    constexpr const char* kOp = "linear_gelu_backward";
    linear_expect_precision(kOp, spec, ctx);
    const auto [N, I, O] = linear_dims(kOp, "act", act, weight);
    op_expect_shape(kOp, "dy", dy, act.shape().with_dim(-1, O));
    op_expect_shape(kOp, "pre", pre, act.shape());
    op_expect_shape(kOp, "dpre", dpre, act.shape());
    if (!dpre_bias.is_null()) op_expect_shape(kOp, "dpre_bias", dpre_bias, Shape{I});
    if (!dweight.is_null()) op_expect_shape(kOp, "dweight", dweight, weight.shape());
    if (!dbias.is_null()) op_expect_shape(kOp, "dbias", dbias, Shape{O});
    op_expect_memory(kOp, ctx, {dpre, dpre_bias, dweight, dbias, dy, act, pre, weight});
    const bool tanh_form = kind == GeluKind::kTanh;
    const bool dw_accumulate = dweight_accumulates(dweight, spec, N, ctx);
    switch (ctx.backend) {
        case Backend::kCpu: {
            op_expect_cpu_f32(kOp, {dpre, dpre_bias, dweight, dbias, dy, act, pre, weight});
            // The unfused sequence, step for step: d act lands in dpre, the GELU backward turns it
            // into d pre in place, and the bias sum is linear_backward's own.
            float* d = dpre.as<float>();
            cpu::linear_backward(d, dweight.as<float>(), dbias.as<float>(), dy.as<float>(),
                                 act.as<float>(), weight.as<float>(), N, I, O, false);
            cpu::gelu_backward(d, d, pre.as<float>(), dpre.numel(), tanh_form);
            if (!dpre_bias.is_null())
                cpu::linear_backward(nullptr, nullptr, dpre_bias.as<float>(), d, nullptr, nullptr,
                                     N, 0, I, false);
            return;
        }
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dpre, dy, act, pre, weight});
            op_expect_cuda_dtype(kOp, DType::kF32, {dpre_bias, dweight, dbias});
            cuda::linear_gelu_backward(dpre.as<bf16>(), dpre_bias.as<float>(), dweight.as<float>(),
                                       dbias.as<float>(), dy.as<bf16>(), act.as<bf16>(),
                                       pre.as<bf16>(), weight.as<bf16>(), N, I, O, tanh_form,
                                       dw_accumulate, cuda_state_of(ctx, kOp), ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
