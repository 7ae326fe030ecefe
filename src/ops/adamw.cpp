#include "ops/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/adamw.h"
#include "ops/cpu/grad_norm.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/dispatch.h"
#include "ops/grad_norm.h"
#include "ops/op_checks.h"

namespace lathe {

using namespace detail;

void adamw_update(TensorView params, TensorView m, TensorView v, ConstTensorView grads,
                  std::span<const AdamWSegment> segments, const AdamWHyper& hyper, int64_t step,
                  const Context& ctx) {
    adamw_update_with_copy(params, TensorView(), m, v, grads, segments, hyper, step,
                           ConstTensorView(), 0.0f, ctx);
}

void adamw_update_with_copy(TensorView params, TensorView params_bf16, TensorView m, TensorView v,
                            ConstTensorView grads, std::span<const AdamWSegment> segments,
                            const AdamWHyper& hyper, int64_t step, ConstTensorView clip_norm,
                            float max_norm, const Context& ctx) {
    constexpr const char* kOp = "adamw_update";
    LATHE_CHECK(clip_norm.is_null() || (clip_norm.numel() == 1 && clip_norm.dtype() == DType::kF32),
                "{}: clip_norm must be one f32, got {}", kOp, clip_norm.to_string());
    LATHE_CHECK(!params.is_null(), "{}: params missing", kOp);
    const int64_t P = params.numel();
    for (const auto& [name, view] : {std::pair{"m", ConstTensorView(m)},
                                     std::pair{"v", ConstTensorView(v)}, std::pair{"grads", grads}})
        LATHE_CHECK(!view.is_null() && view.numel() == P, "{}: {} is {}, params has {} elements",
                    kOp, name, view.is_null() ? std::string("missing") : view.to_string(), P);
    LATHE_CHECK(
        params_bf16.is_null() || (params_bf16.numel() == P && params_bf16.dtype() == DType::kBF16),
        "{}: params_bf16 is {}, expected {} bf16 elements", kOp, params_bf16.to_string(), P);
    LATHE_CHECK(step >= 1, "{}: step {} (the first update is step 1)", kOp, step);
    // Segments inside [0, P), pairwise disjoint.
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const AdamWSegment& s : segments) {
        LATHE_CHECK(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= P,
                    "{}: segment [{}, {}) outside the {} parameters", kOp, s.offset,
                    s.offset + s.count, P);
        ranges.push_back({s.offset, s.offset + s.count});
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
        LATHE_CHECK(ranges[i].first >= ranges[i - 1].second,
                    "{}: segments [{}, {}) and [{}, {}) overlap", kOp, ranges[i - 1].first,
                    ranges[i - 1].second, ranges[i].first, ranges[i].second);
    op_expect_memory(kOp, ctx, {params, params_bf16, m, v, grads, clip_norm});
    const bool bf16_moments = m.dtype() == DType::kBF16;
    LATHE_CHECK((m.dtype() == DType::kF32 || bf16_moments) && v.dtype() == m.dtype(),
                "{}: the moments are {} and {}; both f32 or both bf16", kOp, dtype_name(m.dtype()),
                dtype_name(v.dtype()));
    switch (ctx.backend) {
        case Backend::kCpu: {
            op_expect_cpu_f32(kOp, {params, grads});
            // Clipping: the scaled gradients of each segment in a copy, as grad_clip_by_norm
            // would have written them.
            float coef = 1.0f;
            if (!clip_norm.is_null() && std::isfinite(*clip_norm.as<float>()))
                coef = grad_clip_coefficient(*clip_norm.as<float>(), max_norm);
            std::vector<float> scaled;
            for (const AdamWSegment& s : segments) {
                const float* g = grads.as<float>() + s.offset;
                if (coef < 1.0f) {
                    scaled.assign(g, g + s.count);
                    cpu::scale_inplace(scaled.data(), s.count, coef);
                    g = scaled.data();
                }
                if (bf16_moments)
                    cpu::adamw_update(params.as<float>() + s.offset, m.as<bf16>() + s.offset,
                                      v.as<bf16>() + s.offset, g, s.count, s.lr, s.weight_decay,
                                      hyper.beta1, hyper.beta2, hyper.eps, step);
                else
                    cpu::adamw_update(params.as<float>() + s.offset, m.as<float>() + s.offset,
                                      v.as<float>() + s.offset, g, s.count, s.lr, s.weight_decay,
                                      hyper.beta1, hyper.beta2, hyper.eps, step);
            }
            if (!params_bf16.is_null())
                for (const AdamWSegment& s : segments)
                    for (int64_t i = s.offset; i < s.offset + s.count; ++i)
                        params_bf16.as<bf16>()[i] = float_to_bf16(params.as<float>()[i]);
            return;
        }
        case Backend::kCuda:
            op_expect_cuda_dtype(kOp, DType::kF32, {params, grads});
            op_expect_cuda_dtype(kOp, m.dtype(), {m, v});
            if (bf16_moments)
                cuda::adamw_update(params.as<float>(), params_bf16.as<bf16>(), m.as<bf16>(),
                                   v.as<bf16>(), grads.as<float>(), segments, hyper, step,
                                   clip_norm.as<float>(), max_norm, ctx.stream);
            else
                cuda::adamw_update(params.as<float>(), params_bf16.as<bf16>(), m.as<float>(),
                                   v.as<float>(), grads.as<float>(), segments, hyper, step,
                                   clip_norm.as<float>(), max_norm, ctx.stream);
            return;
    }
    op_no_backend(kOp, ctx);
}

}  // namespace lathe
