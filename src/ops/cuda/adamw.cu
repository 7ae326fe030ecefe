// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <cmath>

#include "core/check.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kElemsPerThread = 4;
constexpr int64_t kElemsPerBlock = kThreads * kElemsPerThread;
constexpr int kSegmentsPerLaunch = 64;  // keeps the parameter block under 4 KiB

struct SegmentParams {
    int64_t offset;
    int64_t count;
    float decay;          // 1 - lr * wd, in fp32
    float neg_step_size;  // -(lr / (1 - beta1^t)), in fp32
    int apply_decay;
};

struct LaunchParams {
    SegmentParams seg[kSegmentsPerLaunch];
    int64_t block_begin[kSegmentsPerLaunch + 1];  // first block of each segment; [n] = total
    int n;
    float bc2_sqrt, w1, w1_minus_1, b2, w2, eps;
    int lerp_low;
    const float* clip_norm;  // null: no clipping
    float max_norm;
};

// The clipping coefficient grad_clip_by_norm would apply (ops/cuda/grad_norm.cu): 1 (no change)
// when the norm is not finite or not above max_norm.
__device__ float clip_coefficient(const float* norm, float max_norm) {
    if (norm == nullptr) return 1.0f;
    const float total = *norm;
    if (!isfinite(total)) return 1.0f;
    return fminf(__fdiv_rn(max_norm, __fadd_rn(total, 1e-6f)), 1.0f);
}

// Moment storage: f32 as is; bf16 widened exactly on load and rounded to nearest even on store
// with core/dtype.h's float_to_bf16 rule, so finite and infinite values round to the CPU's bits
// (optim/cpu_adamw.h kBF16). A NaN stays a NaN, but its bits may differ from the CPU's: the
// GPU's f32 arithmetic returns the canonical NaN whatever NaN went in, the CPU's keeps the input's.
__device__ __forceinline__ float load_moment(const float* s, int64_t i) {
    return s[i];
}
__device__ __forceinline__ float load_moment(const uint16_t* s, int64_t i) {
    return __uint_as_float(uint32_t(s[i]) << 16);
}
__device__ __forceinline__ void store_moment(float* s, int64_t i, float x) {
    s[i] = x;
}
__device__ __forceinline__ void store_moment(uint16_t* s, int64_t i, float x) {
    const uint32_t u = __float_as_uint(x);
    s[i] =
        isnan(x) ? uint16_t((u >> 16) | 0x0040u) : uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

template <typename M>
__global__ void adamw_update_kernel(float* __restrict__ params, M* __restrict__ m,
                                    M* __restrict__ v, const float* __restrict__ grads,
                                    __nv_bfloat16* __restrict__ params_bf16,
                                    const __grid_constant__ LaunchParams lp) {
    // The segment of this block: the last s with block_begin[s] <= blockIdx.x.
    int lo = 0, hi = lp.n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (lp.block_begin[mid] <= int64_t(blockIdx.x))
            lo = mid;
        else
            hi = mid - 1;
    }
    const SegmentParams& s = lp.seg[lo];
    const int64_t first = s.offset + (int64_t(blockIdx.x) - lp.block_begin[lo]) * kElemsPerBlock;
    const int64_t end = s.offset + s.count;
    const float coef = clip_coefficient(lp.clip_norm, lp.max_norm);
#pragma unroll
    for (int k = 0; k < kElemsPerThread; ++k) {
        const int64_t i = first + k * kThreads + threadIdx.x;
        if (i >= end) break;
        const float g = coef < 1.0f ? __fmul_rn(grads[i], coef) : grads[i];
        float p = params[i];
        if (s.apply_decay) p = __fmul_rn(p, s.decay);
        const float mo = load_moment(m, i);
        // torch's lerp: one fused multiply-add on either side of weight 0.5.
        const float mi = lp.lerp_low ? fmaf(lp.w1, __fsub_rn(g, mo), mo)
                                     : fmaf(lp.w1_minus_1, __fsub_rn(g, mo), g);
        const float vi =
            __fadd_rn(__fmul_rn(load_moment(v, i), lp.b2), __fmul_rn(__fmul_rn(lp.w2, g), g));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), lp.bc2_sqrt), lp.eps);
        p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, mi), denom));
        params[i] = p;
        store_moment(m, i, mi);
        store_moment(v, i, vi);
        if (params_bf16 != nullptr) params_bf16[i] = __float2bfloat16_rn(p);
    }
}

template <typename M>
void adamw_launch(float* params, bf16* params_bf16, M* m, M* v, const float* grads,
                  std::span<const AdamWSegment> segments, const AdamWHyper& hyper, int64_t step,
                  const float* clip_norm, float max_norm, CUstream_st* stream) {
    // The scalars exactly as ops/cpu/adamw.cpp forms them.
    const double bias_correction1 = 1.0 - std::pow(hyper.beta1, double(step));
    const double bias_correction2 = 1.0 - std::pow(hyper.beta2, double(step));
    LaunchParams lp{};
    lp.bc2_sqrt = float(std::sqrt(bias_correction2));
    lp.w1 = float(1.0 - hyper.beta1);
    lp.w1_minus_1 = lp.w1 - 1.0f;
    lp.b2 = float(hyper.beta2);
    lp.w2 = float(1.0 - hyper.beta2);
    lp.eps = float(hyper.eps);
    lp.lerp_low = std::fabs(1.0 - hyper.beta1) < 0.5;
    lp.clip_norm = clip_norm;
    lp.max_norm = max_norm;
    auto* pb = reinterpret_cast<__nv_bfloat16*>(params_bf16);
    size_t next = 0;
    while (next < segments.size()) {
        lp.n = 0;
        int64_t blocks = 0;
        for (; next < segments.size() && lp.n < kSegmentsPerLaunch; ++next) {
            const AdamWSegment& seg = segments[next];
            if (seg.count == 0) continue;
            SegmentParams& sp = lp.seg[lp.n];
            sp.offset = seg.offset;
            sp.count = seg.count;
            sp.decay = float(1.0 - seg.lr * seg.weight_decay);
            sp.apply_decay = seg.weight_decay != 0.0;
            sp.neg_step_size = float(-(seg.lr / bias_correction1));
            lp.block_begin[lp.n] = blocks;
            blocks += (seg.count + kElemsPerBlock - 1) / kElemsPerBlock;
            ++lp.n;
        }
        if (lp.n == 0) break;
        lp.block_begin[lp.n] = blocks;
        LATHE_CHECK(blocks <= INT32_MAX, "adamw_update: {} blocks in one launch", blocks);
        adamw_update_kernel<M>
            <<<unsigned(blocks), kThreads, 0, stream>>>(params, m, v, grads, pb, lp);
        LATHE_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace

void adamw_update(float* params, bf16* params_bf16, float* m, float* v, const float* grads,
                  std::span<const AdamWSegment> segments, const AdamWHyper& hyper, int64_t step,
                  const float* clip_norm, float max_norm, CUstream_st* stream) {
    adamw_launch(params, params_bf16, m, v, grads, segments, hyper, step, clip_norm, max_norm,
                 stream);
}

void adamw_update(float* params, bf16* params_bf16, bf16* m, bf16* v, const float* grads,
                  std::span<const AdamWSegment> segments, const AdamWHyper& hyper, int64_t step,
                  const float* clip_norm, float max_norm, CUstream_st* stream) {
    adamw_launch(params, params_bf16, reinterpret_cast<uint16_t*>(m),
                 reinterpret_cast<uint16_t*>(v), grads, segments, hyper, step, clip_norm, max_norm,
                 stream);
}

}  // namespace lathe::cuda
