#include "ops/rope.h"

#include <cmath>
#include <numbers>
#include <utility>

#include "ops/cpu/rope.h"
#include "ops/cuda/dispatch.h"
#include "ops/cuda/rope.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

int64_t rope_rotary_dim(const RopeConfig& config) {
    // transformers: dim = int(head_dim * partial_rotary_factor) (truncation, in double).
    return int64_t(double(config.head_dim) * config.partial_rotary_factor);
}

Status rope_validate(const RopeConfig& config) {
    if (config.head_dim <= 0)
        return invalid_argument_error("head_dim must be positive, got {}", config.head_dim);
    if (!(config.theta > 0.0))
        return invalid_argument_error("rope_theta must be positive, got {}", config.theta);
    const int64_t R = rope_rotary_dim(config);
    if (R < 2 || R > config.head_dim || R % 2 != 0)
        return invalid_argument_error(
            "partial_rotary_factor (rotary_pct) {} gives int(head_dim {} * {}) = {} rotary dims; "
            "need an even number between 2 and head_dim",
            config.partial_rotary_factor, config.head_dim, config.partial_rotary_factor, R);
    if (config.scaling == RopeScaling::kLlama3) {
        if (!(config.factor > 0.0))
            return invalid_argument_error("rope_scaling.factor must be positive, got {}",
                                          config.factor);
        if (!(config.low_freq_factor > 0.0) || !(config.high_freq_factor > config.low_freq_factor))
            return invalid_argument_error(
                "rope_scaling needs high_freq_factor > low_freq_factor > 0, got high {} low {}",
                config.high_freq_factor, config.low_freq_factor);
        if (config.original_max_position_embeddings <= 0)
            return invalid_argument_error(
                "rope_scaling.original_max_position_embeddings must be positive, got {}",
                config.original_max_position_embeddings);
    }
    return ok_status();
}

std::vector<float> rope_inv_freq(const RopeConfig& config) {
    const Status valid = rope_validate(config);
    LATHE_CHECK(valid.ok(), "rope_inv_freq: {}", valid.to_string());
    const int64_t R = rope_rotary_dim(config);
    // Every step below is one fp32 tensor operation in transformers; Python scalars (doubles)
    // meet fp32 tensors as fp32, which the float() casts reproduce.
    std::vector<float> inv(size_t(R / 2));
    for (int64_t i = 0; i < R / 2; ++i) {
        const float exponent = float(2 * i) / float(R);
        inv[size_t(i)] = 1.0f / std::pow(float(config.theta), exponent);
    }
    if (config.scaling == RopeScaling::kNone) return inv;

    const double L0 = double(config.original_max_position_embeddings);
    const float factor = float(config.factor);
    const float low_wavelen = float(L0 / config.low_freq_factor);
    const float high_wavelen = float(L0 / config.high_freq_factor);
    const float two_pi = float(2.0 * std::numbers::pi);
    for (float& f : inv) {
        const float wavelen = two_pi / f;
        const float scaled = wavelen > low_wavelen ? f / factor : f;
        const float smooth = (float(L0) / wavelen - float(config.low_freq_factor)) /
                             float(config.high_freq_factor - config.low_freq_factor);
        const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        f = medium ? smoothed : scaled;
    }
    return inv;
}

void rope_build_table(TensorView cos, TensorView sin, const RopeConfig& config) {
    const std::vector<float> inv = rope_inv_freq(config);
    const int64_t half = int64_t(inv.size());
    LATHE_CHECK(cos.rank() == 2 && cos.dim(1) == half, "rope_build_table: cos {} for R/2 = {}",
                cos.to_string(), half);
    op_expect_shape("rope_build_table", "sin", sin, cos.shape());
    op_expect_cpu_f32("rope_build_table", {cos, sin});
    LATHE_CHECK(cos.device() == Device::kCpu && sin.device() == Device::kCpu,
                "rope_build_table fills host tables");
    float* c = cos.as<float>();
    float* s = sin.as<float>();
    for (int64_t p = 0; p < cos.dim(0); ++p) {
        for (int64_t i = 0; i < half; ++i) {
            const float angle = float(p) * inv[size_t(i)];  // fp32, as transformers' matmul
            c[p * half + i] = float(std::cos(double(angle)));
            s[p * half + i] = float(std::sin(double(angle)));
        }
    }
}

namespace {
struct RopeDims {
    int64_t B, T, Hx, D, R, P;
};

RopeDims rope_check(const char* op, ConstTensorView out, ConstTensorView x,
                    ConstTensorView positions, ConstTensorView cos, ConstTensorView sin) {
    LATHE_CHECK(x.rank() == 4, "{}: x is {}, expected (B, T, Hx, D)", op, x.to_string());
    op_expect_shape(op, "out", out, x.shape());
    LATHE_CHECK(cos.rank() == 2, "{}: cos is {}, expected (P, R/2)", op, cos.to_string());
    op_expect_shape(op, "sin", sin, cos.shape());
    RopeDims d{x.dim(0), x.dim(1), x.dim(2), x.dim(3), 2 * cos.dim(1), cos.dim(0)};
    LATHE_CHECK(d.R >= 2 && d.R <= d.D, "{}: rotary dim {} from cos {} for head dim {}", op, d.R,
                cos.to_string(), d.D);
    if (!positions.is_null()) {
        op_expect_dtype(op, "positions", positions, DType::kI32);
        op_expect_shape(op, "positions", positions, Shape{d.B, d.T});
    }
    return d;
}
}  // namespace

void rope_forward(TensorView out, ConstTensorView x, ConstTensorView positions, ConstTensorView cos,
                  ConstTensorView sin, const Context& ctx) {
    constexpr const char* kOp = "rope_forward";
    const RopeDims d = rope_check(kOp, out, x, positions, cos, sin);
    op_expect_memory(kOp, ctx, {out, x, positions, cos, sin});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {out, x, cos, sin});
            cpu::rope_forward(out.as<float>(), x.as<float>(), positions.as<int32_t>(),
                              cos.as<float>(), sin.as<float>(), d.B, d.T, d.Hx, d.D, d.R, d.P);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {out, x});
            op_expect_cuda_dtype(kOp, DType::kF32, {cos, sin});
            cuda::rope_forward(out.as<bf16>(), x.as<bf16>(), positions.as<int32_t>(),
                               cos.as<float>(), sin.as<float>(), d.B, d.T, d.Hx, d.D, d.R, d.P,
                               ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

void rope_backward(TensorView dx, ConstTensorView dout, ConstTensorView positions,
                   ConstTensorView cos, ConstTensorView sin, const Context& ctx) {
    constexpr const char* kOp = "rope_backward";
    const RopeDims d = rope_check(kOp, dx, dout, positions, cos, sin);
    op_expect_memory(kOp, ctx, {dx, dout, positions, cos, sin});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(kOp, {dx, dout, cos, sin});
            cpu::rope_backward(dx.as<float>(), dout.as<float>(), positions.as<int32_t>(),
                               cos.as<float>(), sin.as<float>(), d.B, d.T, d.Hx, d.D, d.R, d.P);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kBF16, {dx, dout});
            op_expect_cuda_dtype(kOp, DType::kF32, {cos, sin});
            cuda::rope_backward(dx.as<bf16>(), dout.as<bf16>(), positions.as<int32_t>(),
                                cos.as<float>(), sin.as<float>(), d.B, d.T, d.Hx, d.D, d.R, d.P,
                                ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

namespace {

// Both tensors checked as the single ops check them, and against each other (batch, sequence and
// head dim shared).
std::pair<RopeDims, RopeDims> rope_qk_check(const char* op, ConstTensorView q_out,
                                            ConstTensorView k_out, ConstTensorView q,
                                            ConstTensorView k, ConstTensorView positions,
                                            ConstTensorView cos, ConstTensorView sin) {
    const RopeDims dq = rope_check(op, q_out, q, positions, cos, sin);
    const RopeDims dk = rope_check(op, k_out, k, positions, cos, sin);
    LATHE_CHECK(dq.B == dk.B && dq.T == dk.T && dq.D == dk.D,
                "{}: q {} and k {} differ in batch, sequence or head dim", op, q.to_string(),
                k.to_string());
    return {dq, dk};
}

void rope_qk(const char* op, TensorView q_out, TensorView k_out, ConstTensorView q,
             ConstTensorView k, ConstTensorView positions, ConstTensorView cos, ConstTensorView sin,
             bool backward, const Context& ctx) {
    const auto [dq, dk] = rope_qk_check(op, q_out, k_out, q, k, positions, cos, sin);
    if (ctx.backend == Backend::kCpu) {  // the two single ops
        if (backward) {
            rope_backward(q_out, q, positions, cos, sin, ctx);
            rope_backward(k_out, k, positions, cos, sin, ctx);
        } else {
            rope_forward(q_out, q, positions, cos, sin, ctx);
            rope_forward(k_out, k, positions, cos, sin, ctx);
        }
        return;
    }
    op_expect_memory(op, ctx, {q_out, k_out, q, k, positions, cos, sin});
    if (ctx.backend == Backend::kCuda) {
        op_expect_cuda_dtype(op, DType::kBF16, {q_out, k_out, q, k});
        op_expect_cuda_dtype(op, DType::kF32, {cos, sin});
        cuda::rope_qk(q_out.as<bf16>(), k_out.as<bf16>(), q.as<bf16>(), k.as<bf16>(),
                      positions.as<int32_t>(), cos.as<float>(), sin.as<float>(), dq.B, dq.T, dq.Hx,
                      dk.Hx, dq.D, dq.R, dq.P, backward, ctx.stream);
        return;
    }
    op_no_backend(op, ctx);
}

void rope_qkv(const char* op, TensorView qkv, int64_t qk_heads, ConstTensorView positions,
              ConstTensorView cos, ConstTensorView sin, bool backward, const Context& ctx) {
    const RopeDims d = rope_check(op, qkv, qkv, positions, cos, sin);
    LATHE_CHECK(qk_heads > 0 && qk_heads < d.Hx,
                "{}: qk_heads {} of a row of {} heads; the queries and keys are the first H + Hkv "
                "of H + 2 Hkv",
                op, qk_heads, d.Hx);
    op_expect_memory(op, ctx, {qkv, positions, cos, sin});
    switch (ctx.backend) {
        case Backend::kCpu:
            op_expect_cpu_f32(op, {qkv, cos, sin});
            (backward ? cpu::rope_backward : cpu::rope_forward)(
                qkv.as<float>(), qkv.as<float>(), positions.as<int32_t>(), cos.as<float>(),
                sin.as<float>(), d.B, d.T, qk_heads, d.D, d.R, d.P, d.Hx);
            return;
        case Backend::kCuda:
            op_expect_cuda_dtype(op, DType::kBF16, {qkv});
            op_expect_cuda_dtype(op, DType::kF32, {cos, sin});
            cuda::rope_qkv(qkv.as<bf16>(), positions.as<int32_t>(), cos.as<float>(),
                           sin.as<float>(), d.B, d.T, qk_heads, d.Hx, d.D, d.R, d.P, backward,
                           ctx.stream);
            return;
    }
    op_no_backend(op, ctx);
}

}  // namespace

void rope_qkv_forward(TensorView qkv, int64_t qk_heads, ConstTensorView positions,
                      ConstTensorView cos, ConstTensorView sin, const Context& ctx) {
    rope_qkv("rope_qkv_forward", qkv, qk_heads, positions, cos, sin, false, ctx);
}

void rope_qkv_backward(TensorView dqkv, int64_t qk_heads, ConstTensorView positions,
                       ConstTensorView cos, ConstTensorView sin, const Context& ctx) {
    rope_qkv("rope_qkv_backward", dqkv, qk_heads, positions, cos, sin, true, ctx);
}

void rope_qk_forward(TensorView q_out, TensorView k_out, ConstTensorView q, ConstTensorView k,
                     ConstTensorView positions, ConstTensorView cos, ConstTensorView sin,
                     const Context& ctx) {
    rope_qk("rope_qk_forward", q_out, k_out, q, k, positions, cos, sin, false, ctx);
}

void rope_qk_backward(TensorView dq, TensorView dk, ConstTensorView dq_out, ConstTensorView dk_out,
                      ConstTensorView positions, ConstTensorView cos, ConstTensorView sin,
                      const Context& ctx) {
    rope_qk("rope_qk_backward", dq, dk, dq_out, dk_out, positions, cos, sin, true, ctx);
}

}  // namespace lathe
