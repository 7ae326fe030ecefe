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
    int vec4;  // offset a multiple of four elements
};

struct LaunchParams {
    SegmentParams seg[kSegmentsPerLaunch];
    int64_t block_begin[kSegmentsPerLaunch + 1];  // first block of each segment; [n] = total
    int n;
    float bc2_sqrt, w1, w1_minus_1, b2, w2, eps;
    int lerp_low;
    const float* clip_norm;  // null: no clipping
    float max_norm;
    int vec4;  // every array's base aligned for four elements at a time
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

struct Scalars {
    float coef, decay, neg_step_size;
    int apply_decay;
};

// One element's update: the CPU's operations in its order, with explicitly rounded intrinsics.
__device__ __forceinline__ void update_element(float g, float& p, float& mo, float& vo,
                                               const Scalars& c, const LaunchParams& lp) {
    if (c.coef < 1.0f) g = __fmul_rn(g, c.coef);
    if (c.apply_decay) p = __fmul_rn(p, c.decay);
    // torch's lerp: one fused multiply-add on either side of weight 0.5.
    const float mi =
        lp.lerp_low ? fmaf(lp.w1, __fsub_rn(g, mo), mo) : fmaf(lp.w1_minus_1, __fsub_rn(g, mo), g);
    const float vi = __fadd_rn(__fmul_rn(vo, lp.b2), __fmul_rn(__fmul_rn(lp.w2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), lp.bc2_sqrt), lp.eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(c.neg_step_size, mi), denom));
    mo = mi;
    vo = vi;
}

// Element i of every array, loaded, updated and stored one at a time.
template <typename M>
__device__ __forceinline__ void update_at(int64_t i, float* __restrict__ params, M* __restrict__ m,
                                          M* __restrict__ v, const float* __restrict__ grads,
                                          __nv_bfloat16* __restrict__ params_bf16, const Scalars& c,
                                          const LaunchParams& lp) {
    float p = params[i], mo = load_moment(m, i), vo = load_moment(v, i);
    update_element(grads[i], p, mo, vo, c, lp);
    params[i] = p;
    store_moment(m, i, mo);
    store_moment(v, i, vo);
    if (params_bf16 != nullptr) params_bf16[i] = __float2bfloat16_rn(p);
}

// Four consecutive moments in one load and one store (f32: 16 bytes, bf16: 8 bytes).
__device__ __forceinline__ void load4(const float* s, int64_t i, float (&x)[4]) {
    const float4 q = *reinterpret_cast<const float4*>(s + i);
    x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
}
__device__ __forceinline__ void load4(const uint16_t* s, int64_t i, float (&x)[4]) {
    const uint2 q = *reinterpret_cast<const uint2*>(s + i);
    x[0] = __uint_as_float(q.x << 16), x[1] = __uint_as_float(q.x & 0xFFFF0000u);
    x[2] = __uint_as_float(q.y << 16), x[3] = __uint_as_float(q.y & 0xFFFF0000u);
}
__device__ __forceinline__ void store4(float* s, int64_t i, const float (&x)[4]) {
    *reinterpret_cast<float4*>(s + i) = make_float4(x[0], x[1], x[2], x[3]);
}
__device__ __forceinline__ uint32_t moment_bits(float x) {
    uint16_t h;
    store_moment(&h, 0, x);
    return h;
}
__device__ __forceinline__ void store4(uint16_t* s, int64_t i, const float (&x)[4]) {
    *reinterpret_cast<uint2*>(s + i) = make_uint2(moment_bits(x[0]) | moment_bits(x[1]) << 16,
                                                  moment_bits(x[2]) | moment_bits(x[3]) << 16);
}

// Each block updates kElemsPerBlock elements of one segment. vec4 (every base pointer aligned for
// it, SegmentParams::vec4 for the segment's offset): each thread four consecutive elements with
// one load or store an array; otherwise (and at a segment's tail) one element at a time, strided
// over the block. Both run update_element, so the bits are the same.
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
    const Scalars c{clip_coefficient(lp.clip_norm, lp.max_norm), s.decay, s.neg_step_size,
                    s.apply_decay};
    if (lp.vec4 && s.vec4) {
        const int64_t i = first + int64_t(threadIdx.x) * kElemsPerThread;
        if (i + kElemsPerThread <= end) {
            float g[4], p[4], mo[4], vo[4];
            load4(grads, i, g);
            load4(params, i, p);
            load4(m, i, mo);
            load4(v, i, vo);
#pragma unroll
            for (int k = 0; k < 4; ++k) update_element(g[k], p[k], mo[k], vo[k], c, lp);
            store4(params, i, p);
            store4(m, i, mo);
            store4(v, i, vo);
            if (params_bf16 != nullptr) {
                const __nv_bfloat162 lo2 = __floats2bfloat162_rn(p[0], p[1]);
                const __nv_bfloat162 hi2 = __floats2bfloat162_rn(p[2], p[3]);
                uint2 q;
                q.x = *reinterpret_cast<const uint32_t*>(&lo2);
                q.y = *reinterpret_cast<const uint32_t*>(&hi2);
                *reinterpret_cast<uint2*>(params_bf16 + i) = q;
            }
            return;
        }
        for (int64_t j = i; j < end; ++j)  // the segment's last, partial group of four
            update_at(j, params, m, v, grads, params_bf16, c, lp);
        return;
    }
#pragma unroll
    for (int k = 0; k < kElemsPerThread; ++k) {
        const int64_t i = first + k * kThreads + threadIdx.x;
        if (i >= end) break;
        update_at(i, params, m, v, grads, params_bf16, c, lp);
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
    const auto aligned = [](const void* q, uintptr_t a) {
        return reinterpret_cast<uintptr_t>(q) % a == 0;
    };
    lp.vec4 = aligned(params, 16) && aligned(grads, 16) && aligned(m, 4 * sizeof(M)) &&
              aligned(v, 4 * sizeof(M)) && aligned(pb, 8);
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
            sp.vec4 = seg.offset % kElemsPerThread == 0;
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
