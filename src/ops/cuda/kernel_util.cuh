#pragma once
// Device-side helpers shared by the kernels of ops/cuda: warp and block reductions with a fixed
// order (so every reduction is deterministic), bf16 vector loads and stores, launch sizing, and a
// device-side invariant check. Internal to .cu files.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>

#include "ops/cuda/cuda_check.h"  // (every .cu includes ops/cuda/nvcc_compat.h first)

namespace lathe::cuda {

// Lets `kernel` launch with `smem` bytes of dynamic shared memory: past the 48 KiB any kernel may
// use, a kernel must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize) before such a launch.
// Host code, called before each launch that may need it (the attribute call is cheap).
template <typename Kernel>
inline void allow_dynamic_smem(Kernel kernel, size_t smem) {
    if (smem > 48 * 1024)
        LATHE_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Sum over the 32 lanes by a butterfly: every lane gets the same total, the same bits every run.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
    return v;
}

// Sum over the block, returned to every thread. blockDim.x is a multiple of 32 (at most 1024);
// `smem` holds 32 values of T. Fixed order: lanes within a warp, then warps by index. Contains
// __syncthreads(), so every thread of the block must call it.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* smem) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int warps = blockDim.x / kWarpSize;
    v = warp_sum(v);
    __syncthreads();  // smem may still be read by a previous call
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    T total = lane < warps ? smem[lane] : T(0);
    return warp_sum(total);
}

__device__ __forceinline__ float block_max(float v, float* smem) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int warps = blockDim.x / kWarpSize;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    float m = lane < warps ? smem[lane] : -INFINITY;
    return warp_max(m);
}

// kVec consecutive bf16 values to fp32: one 16-byte load for kVec == 8 (p 16-byte aligned),
// plain loads for kVec == 1.
template <int kVec>
__device__ __forceinline__ void load_bf16(float (&out)[kVec], const __nv_bfloat16* p) {
    static_assert(kVec == 1 || kVec == 8, "kVec is 1 or 8");
    if constexpr (kVec == 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __bfloat1622float2(h[i]);
            out[2 * i] = f.x;
            out[2 * i + 1] = f.y;
        }
    } else {
        out[0] = __bfloat162float(*p);
    }
}

// kVec fp32 values rounded to nearest even into bf16 at p (16-byte aligned for kVec == 8).
template <int kVec>
__device__ __forceinline__ void store_bf16(__nv_bfloat16* p, const float (&in)[kVec]) {
    static_assert(kVec == 1 || kVec == 8, "kVec is 1 or 8");
    if constexpr (kVec == 8) {
        uint4 raw;
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
        *reinterpret_cast<uint4*>(p) = raw;
    } else {
        *p = __float2bfloat16_rn(in[0]);
    }
}

// The amax an fp8 cast of a kernel's bf16 output needs (ops/fp8_cast.h), computed by that kernel
// as it writes the output, so the cast reads it once (Fp8CastArgs::amax_ready): |v|'s f32 bits
// once v is rounded to bf16, the integer ops/cuda/fp8_cast.cu's amax reduces (unsigned maxima of
// these are maxima of the magnitudes, NaNs above every number): bit for bit its amax.
__device__ __forceinline__ unsigned bf16_magnitude_bits(float v) {
    return (unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(v))) & 0x7FFFu) << 16;
}

// The warp's max of m, one atomicMax per warp into *amax (order-independent: the same bits every
// run). Every lane of the warp calls it.
__device__ __forceinline__ void warp_amax_into(unsigned m, unsigned* amax) {
    m = __reduce_max_sync(kFullMask, m);
    if (threadIdx.x % kWarpSize == 0 && m != 0) atomicMax(amax, m);
}

// The block's max of m into *amax: one atomicMax per block, none where *amax already holds at
// least it (values only grow, so a stale read only costs an atomic). For a kernel of many blocks
// over a large output (SwiGLU's): one atomic per warp on one address serializes in L2. Every
// thread of the block calls it; kThreads is the block's size, a multiple of 32.
template <int kThreads>
__device__ __forceinline__ void block_amax_into(unsigned m, unsigned* amax) {
    static_assert(kThreads % kWarpSize == 0 && kThreads <= kWarpSize * kWarpSize);
    __shared__ unsigned warp_max[kThreads / kWarpSize];
    m = __reduce_max_sync(kFullMask, m);
    const unsigned warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    if (lane == 0) warp_max[warp] = m;
    __syncthreads();
    if (warp != 0) return;
    m = __reduce_max_sync(kFullMask, lane < kThreads / kWarpSize ? warp_max[lane] : 0u);
    if (lane == 0 && m != 0 && m > __ldcg(amax)) atomicMax(amax, m);
}

// 1 / (1 + exp(-x)) from the hardware exponential and an approximate division: a few fp32 ulps
// off the correctly rounded value, far below the bf16 rounding of the activations that use it,
// and a few instructions where expf and an IEEE division take dozens (on an H200 the GELU backward
// ran at 80 % of the SMs' issue rate and 78 % of DRAM even with an IEEE reciprocal alone, ncu).
// Exactly 0 where exp(-x) overflows (x < -88) and 1 where it vanishes; NaN stays NaN.
__device__ __forceinline__ float fast_sigmoid(float x) {
    return __fdividef(1.0f, 1.0f + __expf(-x));
}

// v rounded to nearest even bf16 and back: what a bf16 store followed by a load gives.
__device__ __forceinline__ float round_bf16(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

// The block-per-row norms' read of kVec elements at `off`: x's, or with kResidual res_a + res_b
// rounded to bf16 as residual_forward rounds it, stored to x_out (the fused kernels stay bitwise
// equal to the unfused sequence); v gets the values the norm reads.
template <int kVec, bool kResidual>
__device__ __forceinline__ void load_norm_input(float (&v)[kVec], const __nv_bfloat16* x,
                                                __nv_bfloat16* x_out, const __nv_bfloat16* res_a,
                                                const __nv_bfloat16* res_b, int64_t off) {
    if constexpr (kResidual) {
        float b[kVec];
        load_bf16<kVec>(v, res_a + off);
        load_bf16<kVec>(b, res_b + off);
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = round_bf16(v[i] + b[i]);
        store_bf16<kVec>(x_out + off, v);
    } else {
        load_bf16<kVec>(v, x + off);
    }
}

// The residual step of the fused residual + norm kernels: out = a + b rounded to bf16 (as
// residual_forward rounds it) and stored; v gets the stored, rounded values, which is what the
// norm reads in the unfused sequence, so the fused kernels stay bitwise equal to it.
template <int kVec>
__device__ __forceinline__ void add_store_reload_bf16(float (&v)[kVec], const __nv_bfloat16* a,
                                                      const __nv_bfloat16* b, __nv_bfloat16* out) {
    float vb[kVec];
    load_bf16<kVec>(v, a);
    load_bf16<kVec>(vb, b);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] += vb[i];
    store_bf16<kVec>(out, v);
    load_bf16<kVec>(v, out);
}

// Whether the 8-wide path applies: n a multiple of 8 and every pointer 16-byte aligned.
inline bool vec8_ok(int64_t n, std::initializer_list<const void*> ptrs) {
    if (n % 8 != 0) return false;
    for (const void* p : ptrs)
        if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    return true;
}

// Blocks for `work_items` items at `per_block` items per block, capped for grid-stride loops.
inline unsigned blocks_for(int64_t work_items, int64_t per_block, int64_t cap = 65535 * 16) {
    int64_t b = (work_items + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > cap) b = cap;
    return unsigned(b);
}

// The row-wise norms' forward for few rows (a decode step's batch): one block per row, the row's
// C / vec vectors spread over the block's threads and kept in registers (iters vectors a thread),
// so the row is read once and every load of it is in flight at once. A warp per row (the kernels'
// other layout) walks a row of 8192 in 32 dependent steps: about 25 us for a handful of rows.
// Rows above kRowBlockMaxRows keep the warp layout (enough warps to fill the GPU; the training
// shapes); iters 0 means the block layout does not apply (a row wider than 2 x 1024 vectors).
inline constexpr int64_t kRowBlockMaxRows = 512;
inline constexpr int kRowBlockMaxThreads = 1024;
struct RowBlockPlan {
    int threads = 0;
    int iters = 0;
};
inline RowBlockPlan row_block_plan(int64_t N, int64_t C, int vec) {
    if (N > kRowBlockMaxRows) return {};
    const int64_t vectors = (C + vec - 1) / vec;
    const int64_t threads = std::min<int64_t>(kRowBlockMaxThreads, (vectors + 31) / 32 * 32);
    const int64_t iters = (vectors + threads - 1) / threads;
    if (iters > 2) return {};
    return {int(threads), int(iters)};
}

}  // namespace lathe::cuda

// A broken invariant inside a kernel (an id outside its table): prints the values and traps, which
// aborts the kernel; the host sees cudaErrorLaunchFailure (or similar) at its next checked call.
#define LATHE_DEVICE_CHECK(cond, fmt_str, ...)                                                   \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            printf("lathe: device check failed at %s:%d: %s: " fmt_str "\n", __FILE__, __LINE__, \
                   #cond, __VA_ARGS__);                                                          \
            __trap();                                                                            \
        }                                                                                        \
    } while (0)
