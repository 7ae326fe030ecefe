// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/rope.h"

namespace lathe::cuda {

namespace {

constexpr int kThreads = 256;

// One tensor of a launch: out/x (B, T, Hx, D), and its thread count B T Hx (D - R/2). Hs: the
// heads a row holds in storage (Hx for a tensor of its own; H + 2 Hkv for the queries and keys of a
// packed q, k, v buffer, whose first Hx heads rotate).
struct RopeTensor {
    __nv_bfloat16* out;
    const __nv_bfloat16* x;
    int64_t Hx;
    int64_t total;
    int64_t Hs;
};

// Where head `head` (n Hx + h) of a tensor starts, in elements.
__device__ __forceinline__ int64_t head_offset(const RopeTensor& t, int64_t head, int64_t n,
                                               int64_t D) {
    return (head + n * (t.Hs - t.Hx)) * D;
}

// The rotation of one pair (x1, x2) = (x[k], x[k + R/2]) by cos c and signed sin s, each output
// one fused multiply-add onto a rounded product, written out so that no kernel is left to the
// compiler's contraction: both kernels below run this, so they give the same bits.
__device__ __forceinline__ void rotate_pair(float x1, float x2, float c, float s, float& o1,
                                            float& o2) {
    o1 = __fmaf_rn(x1, c, -__fmul_rn(x2, s));
    o2 = __fmaf_rn(x2, c, __fmul_rn(x1, s));
}

// One thread per (tensor, row n, head h, k) with k < D - R/2: k < R/2 rotates the pair
// (k, k + R/2), larger k copies the unrotated dim R + (k - R/2) (skipped when in place). The
// first t0.total threads work on t0 (the queries), the next t1.total on t1 (the keys; 0 for a
// one-tensor launch), so q and k take one launch with the same per-element arithmetic. Any
// shape; rope_rotate_8_kernel takes those whose halves split into 16-byte pieces.
__global__ void rope_rotate_pair_per_thread_kernel(RopeTensor t0, RopeTensor t1,
                                                   const int32_t* __restrict__ positions,
                                                   const float* __restrict__ cos,
                                                   const float* __restrict__ sin, int64_t T,
                                                   int64_t D, int64_t R, int64_t P, float sign) {
    const int64_t half = R / 2, per_head = D - half;
    const int64_t total = t0.total + t1.total;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total;
         g += int64_t(gridDim.x) * blockDim.x) {
        const bool second = g >= t0.total;
        const RopeTensor& t = second ? t1 : t0;
        const int64_t idx = second ? g - t0.total : g;
        const int64_t k = idx % per_head;
        const int64_t head = idx / per_head;  // n * Hx + h
        const int64_t n = head / t.Hx;
        const __nv_bfloat16* xh = t.x + head_offset(t, head, n, D);
        __nv_bfloat16* oh = t.out + head_offset(t, head, n, D);
        if (k < half) {
            const int64_t pos = positions ? int64_t(positions[n]) : n % T;
            LATHE_DEVICE_CHECK(pos >= 0 && pos < P, "rope position %lld at row %lld, table %lld",
                               (long long)pos, (long long)n, (long long)P);
            const float c = cos[pos * half + k];
            const float s = sign * sin[pos * half + k];
            const float x1 = __bfloat162float(xh[k]);
            const float x2 = __bfloat162float(xh[k + half]);  // both read before either write
            float o1, o2;
            rotate_pair(x1, x2, c, s, o1, o2);
            oh[k] = __float2bfloat16_rn(o1);
            oh[k + half] = __float2bfloat16_rn(o2);
        } else if (oh != xh) {
            const int64_t j = R + (k - half);
            oh[j] = xh[j];
        }
    }
}

// Eight pairs a thread: k = 8u .. 8u + 7 of one head row, read and written as 16-byte pieces of
// x's two halves, cos and sin as two 16-byte pieces each; past R/2 a thread copies eight
// unrotated dims (none in place). t.total counts the one-pair threads, so a tensor has t.total / 8
// of these. Needs R/2 and D - R multiples of 8 and x, out, cos and sin 16-byte aligned
// (rope_vectorizes). The one-pair kernel's arithmetic (rotate_pair), so its bits.
__global__ void rope_rotate_8_kernel(RopeTensor t0, RopeTensor t1,
                                     const int32_t* __restrict__ positions,
                                     const float* __restrict__ cos, const float* __restrict__ sin,
                                     int64_t T, int64_t D, int64_t R, int64_t P, float sign) {
    const int64_t half = R / 2, units_per_head = (D - half) / 8;
    const int64_t n0 = t0.total / 8, total = n0 + t1.total / 8;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total;
         g += int64_t(gridDim.x) * blockDim.x) {
        const bool second = g >= n0;
        const RopeTensor& t = second ? t1 : t0;
        const int64_t idx = second ? g - n0 : g;
        const int64_t k = (idx % units_per_head) * 8;
        const int64_t head = idx / units_per_head;  // n * Hx + h
        const int64_t n = head / t.Hx;
        const __nv_bfloat16* xh = t.x + head_offset(t, head, n, D);
        __nv_bfloat16* oh = t.out + head_offset(t, head, n, D);
        if (k < half) {
            const int64_t pos = positions ? int64_t(positions[n]) : n % T;
            LATHE_DEVICE_CHECK(pos >= 0 && pos < P, "rope position %lld at row %lld, table %lld",
                               (long long)pos, (long long)n, (long long)P);
            const float4* cp = reinterpret_cast<const float4*>(cos + pos * half + k);
            const float4* sp = reinterpret_cast<const float4*>(sin + pos * half + k);
            const float4 c4[2] = {cp[0], cp[1]}, s4[2] = {sp[0], sp[1]};
            const float* c = reinterpret_cast<const float*>(c4);
            const float* s = reinterpret_cast<const float*>(s4);
            uint4 lo = *reinterpret_cast<const uint4*>(xh + k);
            uint4 hi = *reinterpret_cast<const uint4*>(xh + k + half);  // both read before writes
            __nv_bfloat162* l2 = reinterpret_cast<__nv_bfloat162*>(&lo);
            __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&hi);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 x1 = __bfloat1622float2(l2[i]), x2 = __bfloat1622float2(h2[i]);
                float a1, a2, b1, b2;
                rotate_pair(x1.x, x2.x, c[2 * i], sign * s[2 * i], a1, a2);
                rotate_pair(x1.y, x2.y, c[2 * i + 1], sign * s[2 * i + 1], b1, b2);
                l2[i] = __floats2bfloat162_rn(a1, b1);
                h2[i] = __floats2bfloat162_rn(a2, b2);
            }
            *reinterpret_cast<uint4*>(oh + k) = lo;
            *reinterpret_cast<uint4*>(oh + k + half) = hi;
        } else if (oh != xh) {
            const int64_t j = R + (k - half);
            *reinterpret_cast<uint4*>(oh + j) = *reinterpret_cast<const uint4*>(xh + j);
        }
    }
}

bool aligned16(const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether rope_rotate_8_kernel takes the launch.
bool rope_vectorizes(const RopeTensor& t0, const RopeTensor& t1, const float* cos, const float* sin,
                     int64_t D, int64_t R) {
    if ((R / 2) % 8 != 0 || (D - R) % 8 != 0 || !aligned16(cos) || !aligned16(sin)) return false;
    for (const RopeTensor* t : {&t0, &t1})
        if (t->total > 0 && (!aligned16(t->x) || !aligned16(t->out))) return false;
    return true;
}

RopeTensor rope_tensor(bf16* out, const bf16* x, int64_t B, int64_t T, int64_t Hx, int64_t D,
                       int64_t R) {
    return RopeTensor{reinterpret_cast<__nv_bfloat16*>(out),
                      reinterpret_cast<const __nv_bfloat16*>(x), Hx, B * T * Hx * (D - R / 2), Hx};
}

// The second tensor of a launch that rotates one: no heads (total 0), so no thread reaches it.
constexpr RopeTensor kNoTensor{nullptr, nullptr, 1, 0, 1};

void rope_launch(const RopeTensor& t0, const RopeTensor& t1, const int32_t* positions,
                 const float* cos, const float* sin, int64_t T, int64_t D, int64_t R, int64_t P,
                 float sign, CUstream_st* stream, bool one_pair_per_thread = false) {
    const int64_t total = t0.total + t1.total;
    if (total == 0) return;
    if (!one_pair_per_thread && rope_vectorizes(t0, t1, cos, sin, D, R))
        rope_rotate_8_kernel<<<blocks_for(total / 8, kThreads), kThreads, 0, stream>>>(
            t0, t1, positions, cos, sin, T, D, R, P, sign);
    else
        rope_rotate_pair_per_thread_kernel<<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
            t0, t1, positions, cos, sin, T, D, R, P, sign);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(bf16* out, const bf16* x, const int32_t* positions, const float* cos,
                  const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                  int64_t P, CUstream_st* stream) {
    rope_launch(rope_tensor(out, x, B, T, Hx, D, R), kNoTensor, positions, cos, sin, T, D, R, P,
                1.0f, stream);
}

void rope_backward(bf16* dx, const bf16* dout, const int32_t* positions, const float* cos,
                   const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                   int64_t P, CUstream_st* stream) {
    rope_launch(rope_tensor(dx, dout, B, T, Hx, D, R), kNoTensor, positions, cos, sin, T, D, R, P,
                -1.0f, stream);
}

void rope_qk(bf16* q_out, bf16* k_out, const bf16* q, const bf16* k, const int32_t* positions,
             const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t Hkv,
             int64_t D, int64_t R, int64_t P, bool backward, CUstream_st* stream) {
    rope_launch(rope_tensor(q_out, q, B, T, H, D, R), rope_tensor(k_out, k, B, T, Hkv, D, R),
                positions, cos, sin, T, D, R, P, backward ? -1.0f : 1.0f, stream);
}

void rope_qkv(bf16* qkv, const int32_t* positions, const float* cos, const float* sin, int64_t B,
              int64_t T, int64_t Hx, int64_t Hs, int64_t D, int64_t R, int64_t P, bool backward,
              CUstream_st* stream) {
    RopeTensor t = rope_tensor(qkv, qkv, B, T, Hx, D, R);
    t.Hs = Hs;
    rope_launch(t, kNoTensor, positions, cos, sin, T, D, R, P, backward ? -1.0f : 1.0f, stream);
}

void rope_qk_one_pair_per_thread(bf16* q_out, bf16* k_out, const bf16* q, const bf16* k,
                                 const int32_t* positions, const float* cos, const float* sin,
                                 int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t R,
                                 int64_t P, bool backward, CUstream_st* stream) {
    rope_launch(rope_tensor(q_out, q, B, T, H, D, R), rope_tensor(k_out, k, B, T, Hkv, D, R),
                positions, cos, sin, T, D, R, P, backward ? -1.0f : 1.0f, stream, true);
}

}  // namespace lathe::cuda
