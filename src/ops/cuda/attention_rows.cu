// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

// lathe's own attention kernel for the inference shapes (ops/cuda/attention.h:
// attention_forward_rows): queries that continue a key/value cache and the decode step. No cuDNN.

#include <cmath>

#include "core/check.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/kernel_util.cuh"

namespace lathe::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head dims up to 32 * 8 = 256
constexpr int kMaxD = kWarpSize * kMaxPerLane;

// One block per (query row, head): blockIdx.x = b * Tq + i, blockIdx.y = h. The query sits at
// position p (q_offset + i, or lengths[b] - 1) and sees keys lo..p (lo = p - window + 1 with a
// window), those of another document skipped. Warp w takes keys lo + w, lo + w + kWarps, ...:
// each lane holds the dims lane, lane + 32, ... of the query and of its running output, the
// warp's dot product is a butterfly sum (every lane gets it), and the warp keeps an online
// softmax (running max m, sum s of exp(score - m), output sum acc scaled alike) in fp32. The
// warps' partial results are then merged in warp order:
//   M = max_w m_w,  S = sum_w s_w exp(m_w - M),  out = sum_w acc_w exp(m_w - M) / S,
//   lse = M + log S.
// A warp that saw no key has m = -inf, s = 0, acc = 0 and adds nothing (exp(-inf) = 0); key p is
// always visible, so M is finite.
__global__ void __launch_bounds__(kWarps* kWarpSize)
    attention_rows_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                          const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                          const __nv_bfloat16* __restrict__ v, const int32_t* __restrict__ docs,
                          const int32_t* __restrict__ lengths, int64_t Tq, int64_t Tk,
                          int64_t q_offset, int H, int Hkv, int D, int64_t window, float scale) {
    __shared__ float warp_m[kWarps], warp_s[kWarps];
    __shared__ float warp_acc[kWarps][kMaxD];
    const int64_t row = blockIdx.x;  // b * Tq + i
    const int h = int(blockIdx.y);
    const int64_t b = row / Tq, i = row % Tq;
    const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
    __nv_bfloat16* o = out + (row * H + h) * D;
    float* l = lse + (b * H + h) * Tq + i;

    const int64_t len = lengths != nullptr ? int64_t(lengths[b]) : q_offset + i + 1;
    if (len < 1 || len > Tk) {  // a caller bug the host cannot see without a synchronization
        for (int d = int(threadIdx.x); d < D; d += int(blockDim.x)) o[d] = __float2bfloat16(NAN);
        if (threadIdx.x == 0) *l = NAN;
        return;
    }
    const int64_t p = len - 1;
    const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    const int g = h / (H / Hkv);
    const int32_t* docs_b = docs != nullptr ? docs + b * Tk : nullptr;
    const int32_t doc = docs_b != nullptr ? docs_b[p] : 0;

    const __nv_bfloat16* qrow = q + (row * H + h) * D;
    float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
    for (int r = 0; r < kMaxPerLane; ++r) {
        const int d = lane + r * kWarpSize;
        qv[r] = d < D ? __bfloat162float(qrow[d]) : 0.0f;
        acc[r] = 0.0f;
    }
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = lo + warp; j <= p; j += kWarps) {
        if (docs_b != nullptr && docs_b[j] != doc) continue;  // the same j for the whole warp
        const __nv_bfloat16* krow = k + ((b * Tk + j) * Hkv + g) * D;
        const __nv_bfloat16* vrow = v + ((b * Tk + j) * Hkv + g) * D;
        float dot = 0.0f;
#pragma unroll
        for (int r = 0; r < kMaxPerLane; ++r) {
            const int d = lane + r * kWarpSize;
            if (d < D) dot += qv[r] * __bfloat162float(krow[d]);
        }
        const float score = scale * warp_sum(dot);
        const float m_new = fmaxf(m, score);
        const float carry = expf(m - m_new);  // 0 for the warp's first key
        const float e = expf(score - m_new);
        s = s * carry + e;
#pragma unroll
        for (int r = 0; r < kMaxPerLane; ++r) {
            const int d = lane + r * kWarpSize;
            if (d < D) acc[r] = acc[r] * carry + e * __bfloat162float(vrow[d]);
        }
        m = m_new;
    }
    if (lane == 0) {
        warp_m[warp] = m;
        warp_s[warp] = s;
    }
#pragma unroll
    for (int r = 0; r < kMaxPerLane; ++r) {
        const int d = lane + r * kWarpSize;
        if (d < D) warp_acc[warp][d] = acc[r];
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, warp_m[w]);
    float weight[kWarps], S = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        weight[w] = expf(warp_m[w] - M);
        S += warp_s[w] * weight[w];
    }
    for (int d = int(threadIdx.x); d < D; d += int(blockDim.x)) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) sum += warp_acc[w][d] * weight[w];
        o[d] = __float2bfloat16(sum / S);
    }
    if (threadIdx.x == 0) *l = M + logf(S);
}

}  // namespace

void attention_forward_rows(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                            const int32_t* docs, const int32_t* lengths,
                            const AttentionRowsShape& s, CudaState& state, CUstream_st* stream) {
    constexpr const char* kOp = "attention_forward_rows";
    LATHE_CHECK(stream == state.stream(), "{}: not on the CudaState's stream", kOp);
    LATHE_CHECK(
        s.B > 0 && s.Tq > 0 && s.Tk >= s.Tq && s.H > 0 && s.Hkv > 0 && s.H % s.Hkv == 0 && s.D > 0,
        "{}: B={} Tq={} Tk={} H={} Hkv={} D={}", kOp, s.B, s.Tq, s.Tk, s.H, s.Hkv, s.D);
    LATHE_CHECK(s.D <= kMaxD, "{}: head dim D = {}; this kernel takes D <= {}", kOp, s.D, kMaxD);
    LATHE_CHECK(s.H <= 65535, "{}: H = {} heads; the grid takes at most 65535", kOp, s.H);
    LATHE_CHECK(s.window >= 0, "{}: window {} (0 means none)", kOp, s.window);
    if (lengths != nullptr) {
        LATHE_CHECK(s.Tq == 1 && docs == nullptr,
                    "{}: with lengths (the decode step) Tq = 1 and no docs; got Tq = {}, docs {}",
                    kOp, s.Tq, docs != nullptr ? "given" : "null");
    } else {
        LATHE_CHECK(s.q_offset >= 0 && s.q_offset + s.Tq <= s.Tk,
                    "{}: q_offset {} with Tq = {}, Tk = {}", kOp, s.q_offset, s.Tq, s.Tk);
    }
    const dim3 grid(unsigned(s.B * s.Tq), unsigned(s.H));
    attention_rows_kernel<<<grid, kWarps * kWarpSize, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(out), lse, reinterpret_cast<const __nv_bfloat16*>(q),
        reinterpret_cast<const __nv_bfloat16*>(k), reinterpret_cast<const __nv_bfloat16*>(v), docs,
        lengths, s.Tq, s.Tk, s.q_offset, int(s.H), int(s.Hkv), int(s.D), s.window, s.scale);
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace lathe::cuda
