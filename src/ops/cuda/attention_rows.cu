// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

// lathe's own attention kernels for the inference shapes (ops/cuda/attention.h:
// attention_forward_rows): queries that continue a key/value cache and the decode step. No cuDNN.
// Two paths: attention_rows_kernel (one block per (query row, head), any D <= 256) runs queries
// at an offset, and a decode step the split path does not take; the decode step (lengths given)
// with 16-byte K/V rows runs the split-K path (a split kernel + decode_combine_kernel), which
// cuts each row's keys into splits so that a batch of a few long rows still fills the GPU, and
// reads each K/V element once for all the query heads of its group. The split kernel is
// decode_mma_kernel (tensor cores, K/V tiles double-buffered) for D of 64 or 128 and at most 16
// query heads a KV head, decode_split_kernel (f32 FMA) otherwise. Its workspace (per split:
// m, l (B, H) f32 and acc (B, H, D) f32) is the CudaState's op scratch, so the step allocates
// nothing; the split count keeps it within CudaState::kScratchBytes.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_decode_smem.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/warp_mma.cuh"

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

// The decode step (with lengths): split-K ("flash-decoding"). Block (s, g, b) takes row b's kv head
// g, ALL the query heads h of its group (h / G == g, G = H / Hkv) and the keys
// [lo + s C_b, min(lo + (s + 1) C_b, p + 1)) of that row (C_b = decode_row_chunk of the row's
// p - lo + 1 keys and the grid's S splits, a multiple of kTile: the row's keys spread over the
// grid, however short the row against the cache's Tk; split s exists for the row when s < n_b =
// ceil((p - lo + 1) / C_b) <= S). Each K and V element it reads serves
// all G heads. It walks its keys in tiles of kTile rows: the tile's K and V rows are loaded into
// shared memory with 16-byte loads, the G x kTile scores are computed from shared memory (each
// K row read from shared memory once for all G heads, and each V row once per kHeadChunk heads,
// so that shared-memory traffic stays below the tile's global reads), and each head keeps an online
// softmax in f32 (running max m_h, sum l_h of exp(score - m_h), output sum acc_h scaled alike). A
// row of one split writes out = acc / l and lse = m + log l itself; otherwise the split writes its
// (m, l, acc) in f32 to the workspace and decode_combine_kernel merges the row's splits in split
// order:
//   M = max_s m_s,  L = sum_s l_s exp(m_s - M),  out = sum_s acc_s exp(m_s - M) / L,
//   lse = M + log L.
// Every split sees at least one key, so each m_s is finite.
constexpr int kTile = kDecodeTile;  // keys per shared-memory tile
constexpr int kLoadBatch = 8;       // 16-byte loads of K (and of V) a thread issues before storing
constexpr int64_t kMinChunk = 2 * kTile;  // the fewest keys of a split (a short row's one split)

// The keys of each of a row's splits (C_b above): its `span` keys over the grid's `splits`,
// rounded up to whole tiles, at least kMinChunk. A function of (span, splits) alone: the split
// and combine kernels agree, and a row's result depends on its length and the grid only.
__host__ __device__ inline int64_t decode_row_chunk(int64_t span, int splits) {
    const int64_t per = (span + splits - 1) / splits;
    const int64_t tiles = (per + kTile - 1) / kTile * kTile;
    return tiles > kMinChunk ? tiles : kMinChunk;
}
// A split-K decode block's keys: split s of row b's keys, [k0, k1), of the row's n_splits (every
// split kernel and the combine cut a row alike). False when the block has nothing to do: a length
// outside [1, Tk] (a caller bug the host cannot see without a synchronization; split 0 writes the
// group's out and lse NaN) or s past the row's splits.
struct DecodeBlockKeys {
    int64_t k0 = 0, k1 = 0, n_splits = 0;
};
__device__ inline bool decode_block_keys(DecodeBlockKeys& r, __nv_bfloat16* out, float* lse,
                                         const int32_t* lengths, int64_t b, int g, int s, int G,
                                         int H, int D, int64_t Tk, int64_t window, int splits) {
    const int64_t len = int64_t(lengths[b]);
    if (len < 1 || len > Tk) {
        if (s != 0) return false;
        for (int i = int(threadIdx.x); i < G * D; i += int(blockDim.x))
            out[(b * H + int64_t(g) * G) * D + i] = __float2bfloat16(NAN);
        for (int i = int(threadIdx.x); i < G; i += int(blockDim.x)) lse[b * H + g * G + i] = NAN;
        return false;
    }
    const int64_t p = len - 1;
    const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    const int64_t chunk = decode_row_chunk(p - lo + 1, splits);
    r.n_splits = (p - lo + chunk) / chunk;  // ceil((p - lo + 1) / chunk)
    if (s >= r.n_splits) return false;
    r.k0 = lo + int64_t(s) * chunk;
    r.k1 = r.k0 + chunk < p + 1 ? r.k0 + chunk : p + 1;
    return true;
}

constexpr int kKPad = kDecodeKPad;
constexpr int kHeadChunk = kDecodeHeadChunk;
static_assert(2 * kTile == kDecodeThreads, "the scores take one thread per (half, key)");

// The block's shared memory: DecodeSmem and decode_smem (ops/cuda/attention_decode_smem.h).

__device__ inline void bf16x8_to_float(const uint4& raw, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 x = __bfloat1622float2(h[i]);
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
    }
}

// kPaged: k and v are pools of (N, Bk, Hkv, D) blocks and row b's position t lives in block
// tables[b * table_width + t / Bk] at offset t % Bk (Tk = table_width * Bk); otherwise k and v are
// (B, Tk, Hkv, D) and row b's position t is row b * Tk + t. Only the address of a key differs.
template <bool kPaged>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_split_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                        float* __restrict__ ws_m, float* __restrict__ ws_l,
                        float* __restrict__ ws_acc, const __nv_bfloat16* __restrict__ q,
                        const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                        const int32_t* __restrict__ lengths, const int32_t* __restrict__ tables,
                        int64_t table_width, int block_size, int64_t Tk, int H, int Hkv, int D,
                        int64_t window, float scale, int splits) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int s = int(blockIdx.x), g = int(blockIdx.y);
    const int64_t b = blockIdx.z;
    const int G = H / Hkv, tid = int(threadIdx.x);
    const int lane = tid % kWarpSize, warp = tid / kWarpSize;
    const DecodeSmem L = decode_smem(G, D);
    auto* k_s = reinterpret_cast<__nv_bfloat16*>(smem + L.k);
    auto* v_s = reinterpret_cast<__nv_bfloat16*>(smem + L.v);
    auto* q_s = reinterpret_cast<float*>(smem + L.q);
    auto* p_s = reinterpret_cast<float*>(smem + L.p);
    auto* acc_s = reinterpret_cast<float*>(smem + L.acc);
    float* m_s = reinterpret_cast<float*>(smem + L.stats);
    float* l_s = m_s + G;
    float* carry_s = l_s + G;
    auto* red_s = reinterpret_cast<float*>(smem + L.red);
    auto* pt_s = reinterpret_cast<float*>(smem + L.pt);
    const int Gp = decode_heads_padded(G);

    DecodeBlockKeys keys;
    if (!decode_block_keys(keys, out, lse, lengths, b, g, s, G, H, D, Tk, window, splits)) return;
    const int64_t k0 = keys.k0, k1 = keys.k1, n_splits = keys.n_splits;

    for (int i = tid; i < G * D; i += kDecodeThreads) {
        q_s[i] = scale * __bfloat162float(q[(b * H + int64_t(g) * G) * D + i]);
        acc_s[i] = 0.0f;
    }
    for (int i = tid; i < G; i += kDecodeThreads) {
        m_s[i] = -INFINITY;
        l_s[i] = 0.0f;
    }
    const int vecs = D / 8;  // 16-byte vectors per K or V row
    const int64_t row_stride = int64_t(Hkv) * D;
    const __nv_bfloat16* kb = k + int64_t(g) * D;
    const __nv_bfloat16* vb = v + int64_t(g) * D;
    const int32_t* table = kPaged ? tables + b * table_width : nullptr;
    for (int64_t t0 = k0; t0 < k1; t0 += kTile) {
        const int n = int(k1 - t0 < kTile ? k1 - t0 : kTile);
        __syncthreads();  // the previous tile's K, V and p are consumed (and q_s, acc_s written)
        // kLoadBatch vectors of K and of V per thread in flight before any is stored.
        for (int base = 0; base < n * vecs; base += kLoadBatch * kDecodeThreads) {
            uint4 kr[kLoadBatch], vr[kLoadBatch];
#pragma unroll
            for (int u = 0; u < kLoadBatch; ++u) {
                const int i = base + u * kDecodeThreads + tid;
                if (i < n * vecs) {
                    const int64_t t = t0 + i / vecs;
                    const int64_t at =
                        kPaged ? int64_t(table[t / block_size]) * block_size + t % block_size
                               : b * Tk + t;
                    const int64_t off = at * row_stride + (i % vecs) * 8;
                    kr[u] = __ldg(reinterpret_cast<const uint4*>(kb + off));
                    vr[u] = __ldg(reinterpret_cast<const uint4*>(vb + off));
                }
            }
#pragma unroll
            for (int u = 0; u < kLoadBatch; ++u) {
                const int i = base + u * kDecodeThreads + tid;
                if (i < n * vecs) {
                    const int j = i / vecs, c = i % vecs;
                    *reinterpret_cast<uint4*>(k_s + j * (D + kKPad) + c * 8) = kr[u];
                    *reinterpret_cast<uint4*>(v_s + j * D + c * 8) = vr[u];
                }
            }
        }
        __syncthreads();
        // Scores: thread (half, j) = (tid / kTile, tid % kTile) reads key j's half of the 16-byte
        // columns from shared memory once and dots it with every head's query (the lanes of a
        // warp on consecutive keys, so their 16-byte K reads are conflict-free, and on one query
        // column, which shared memory broadcasts). The halves' partial sums go to p_s (half 0)
        // and p_s + G kTile (half 1); the softmax adds them. Past n: -inf + 0.
        {
            const int j = tid % kTile, half = tid / kTile;
            const int c_mid = (vecs + 1) / 2;
            const int c0 = half == 0 ? 0 : c_mid, c1 = half == 0 ? c_mid : vecs;
            float* part = p_s + half * G * kTile;
            const __nv_bfloat16* kr = k_s + j * (D + kKPad);
            for (int h0 = 0; h0 < G; h0 += kHeadChunk) {
                float dot[kHeadChunk];
#pragma unroll
                for (int hh = 0; hh < kHeadChunk; ++hh) dot[hh] = 0.0f;
                for (int c = c0; j < n && c < c1; ++c) {
                    float kf[8];
                    bf16x8_to_float(*reinterpret_cast<const uint4*>(kr + c * 8), kf);
#pragma unroll
                    for (int hh = 0; hh < kHeadChunk; ++hh) {
                        if (h0 + hh < G) {
                            const float* qr = q_s + (h0 + hh) * D + c * 8;
                            const float4 qa = *reinterpret_cast<const float4*>(qr);
                            const float4 qb = *reinterpret_cast<const float4*>(qr + 4);
                            dot[hh] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                                       qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                        }
                    }
                }
#pragma unroll
                for (int hh = 0; hh < kHeadChunk; ++hh) {
                    if (h0 + hh < G)
                        part[(h0 + hh) * kTile + j] =
                            j < n ? dot[hh] : (half == 0 ? -INFINITY : 0.0f);
                }
            }
        }
        __syncthreads();
        // Online softmax per head: warp w takes heads w, w + 4, ...
        for (int h = warp; h < G; h += kDecodeThreads / kWarpSize) {
            float* ph = p_s + h * kTile;
            const float* ph2 = p_s + (G + h) * kTile;
            const float a = ph[lane] + ph2[lane], c = ph[lane + kWarpSize] + ph2[lane + kWarpSize];
            const float m_old = m_s[h];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(a, c)));
            const float ea = expf(a - m_new), ec = expf(c - m_new);  // exp(-inf) = 0 past n
            pt_s[lane * Gp + h] = ea;
            pt_s[(lane + kWarpSize) * Gp + h] = ec;
            const float sum = warp_sum(ea + ec);
            if (lane == 0) {
                const float carry = expf(m_old - m_new);  // 0 for the first tile
                carry_s[h] = carry;
                l_s[h] = l_s[h] * carry + sum;
                m_s[h] = m_new;
            }
        }
        __syncthreads();
        // acc[h, :] = acc * carry_h + sum_j p[h, j] v[j, :]. Thread (kg, dp) = (tid / (D / 2),
        // tid % (D / 2)) takes dims 2 dp, 2 dp + 1 of keys kg, kg + groups, ... for up to
        // kHeadChunk heads at once (V read from shared memory once per key; p key-major, 4 heads
        // per broadcast 16-byte read); the key groups' sums meet in red and are added in group
        // order (no atomics: the same bits every run).
        {
            const int pairs = D / 2, groups = kDecodeThreads / pairs;
            const int hc = G < kHeadChunk ? G : kHeadChunk;
            const int dp = tid % pairs, kg = tid / pairs;
            for (int h0 = 0; h0 < G; h0 += kHeadChunk) {
                const int hn = G - h0 < kHeadChunk ? G - h0 : kHeadChunk;
                if (kg < groups) {
                    float a0[kHeadChunk], a1[kHeadChunk];
#pragma unroll
                    for (int hh = 0; hh < kHeadChunk; ++hh) a0[hh] = a1[hh] = 0.0f;
                    for (int j = kg; j < n; j += groups) {
                        const float2 x = __bfloat1622float2(
                            *reinterpret_cast<const __nv_bfloat162*>(v_s + j * D + 2 * dp));
                        float pj[kHeadChunk];
#pragma unroll
                        for (int q4 = 0; q4 < kHeadChunk / 4; ++q4) {
                            if (4 * q4 < hn) {
                                const float4 p4 =
                                    *reinterpret_cast<const float4*>(pt_s + j * Gp + h0 + 4 * q4);
                                pj[4 * q4] = p4.x;
                                pj[4 * q4 + 1] = p4.y;
                                pj[4 * q4 + 2] = p4.z;
                                pj[4 * q4 + 3] = p4.w;
                            }
                        }
#pragma unroll
                        for (int hh = 0; hh < kHeadChunk; ++hh) {
                            if (hh < hn) {
                                a0[hh] += pj[hh] * x.x;
                                a1[hh] += pj[hh] * x.y;
                            }
                        }
                    }
#pragma unroll
                    for (int hh = 0; hh < kHeadChunk; ++hh) {
                        if (hh < hn) {
                            *reinterpret_cast<float2*>(red_s + (kg * hc + hh) * D + 2 * dp) =
                                make_float2(a0[hh], a1[hh]);
                        }
                    }
                }
                __syncthreads();
                for (int i = tid; i < hn * D; i += kDecodeThreads) {
                    const int hh = i / D, d = i % D, h = h0 + hh;
                    float sum = 0.0f;
                    for (int k2 = 0; k2 < groups; ++k2) sum += red_s[(k2 * hc + hh) * D + d];
                    acc_s[h * D + d] = acc_s[h * D + d] * carry_s[h] + sum;
                }
                __syncthreads();  // red_s is rewritten by the next chunk of heads
            }
        }
    }
    __syncthreads();
    if (n_splits == 1) {
        for (int i = tid; i < G * D; i += kDecodeThreads)
            out[(b * H + int64_t(g) * G) * D + i] = __float2bfloat16(acc_s[i] / l_s[i / D]);
        for (int h = tid; h < G; h += kDecodeThreads)
            lse[b * H + g * G + h] = m_s[h] + logf(l_s[h]);
        return;
    }
    // Partials of head h = g G + hh at ((b H + h) splits + s).
    for (int i = tid; i < G * D; i += kDecodeThreads) {
        const int64_t bh = b * H + int64_t(g) * G + i / D;
        ws_acc[(bh * splits + s) * D + i % D] = acc_s[i];
    }
    for (int h = tid; h < G; h += kDecodeThreads) {
        const int64_t bh = b * H + int64_t(g) * G + h;
        ws_m[bh * splits + s] = m_s[h];
        ws_l[bh * splits + s] = l_s[h];
    }
}

// The decode step on tensor cores (decode_mma_takes: D of 64 or 128, G <= 16): the grid, the
// splits, each split's keys and its partials (m, l, acc) are decode_split_kernel's, so
// decode_combine_kernel merges either. Inside a block the split's keys stream through two
// shared-memory buffers of kTile keys (cp.async: tile i + 1 loads while tile i computes), and
// warp w takes keys 16 w .. 16 w + 15 of every tile with the group's G heads as the rows of one
// 16-row mma (rows past G are zero queries, computed and dropped):
//   S = Q K^T by m16n8k16 bf16 mma: the exact bf16 products accumulated in f32 by the tensor
//   cores (not rounded as IEEE f32 at each addition; far inside the tests' bound), then times
//   `scale`;
//   an online softmax per warp and head in f32 (running max m, this thread's share of the sum l,
//   output O scaled alike);
//   O += P V by two mma per product, P split as hi = bf16(p) and lo = bf16(p - hi): hi + lo is
//   p to within 2^-16 of p, so O is the f32 sum of p v as decode_split_kernel computes it, to
//   within 2^-16 relative (its bound in the tests holds unchanged).
// At the end the four warps' (m, l, O) merge in warp order through shared memory:
//   M = max_w m_w,  l = sum_w l_w exp(m_w - M),  acc = sum_w O_w exp(m_w - M).
// A warp that saw no key (a split shorter than 16 w + 1 keys) has m = -inf and adds nothing; a
// warp that saw any key has a finite m in every row (the zero rows' scores are 0).
template <int kD>
struct DecodeMmaSmem {
    static constexpr int kStride =
        kD + 8;  // bf16 a shared row: 16-byte pad, conflict-free ldmatrix
    static constexpr size_t kTileBytes = size_t(kTile) * kStride * 2;  // K or V of one tile
    static constexpr size_t kQ = 4 * kTileBytes;                       // after [buffer][K, V]
    static constexpr size_t kBytes = kQ + size_t(16) * kStride * 2;    // Q: 16 x kD bf16
    // The warps' merge (m, l: 4 x 16 f32; O: 4 x 16 x kD f32) reuses the K, V buffers.
    static_assert(size_t(4 * 16 * 2 + 4 * 16 * kD) * 4 <= kQ, "the merge fits the buffers");
};

template <bool kPaged, int kD>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_mma_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                      float* __restrict__ ws_m, float* __restrict__ ws_l,
                      float* __restrict__ ws_acc, const __nv_bfloat16* __restrict__ q,
                      const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                      const int32_t* __restrict__ lengths, const int32_t* __restrict__ tables,
                      int64_t table_width, int block_size, int64_t Tk, int H, int Hkv,
                      int64_t window, float scale, int splits) {
    static_assert(kDecodeThreads == 4 * kWarpSize && kTile == 4 * 16, "4 warps of 16 keys");
    using Smem = DecodeMmaSmem<kD>;
    constexpr int kStride = Smem::kStride, kVecs = kD / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    auto* kv_s = reinterpret_cast<__nv_bfloat16*>(smem);  // [buffer][K, V][kTile][kStride]
    auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem + Smem::kQ);
    const int s = int(blockIdx.x), g = int(blockIdx.y);
    const int64_t b = blockIdx.z;
    const int G = H / Hkv, tid = int(threadIdx.x);
    const int lane = tid % kWarpSize, warp = tid / kWarpSize, gid = lane / 4, tig = lane % 4;

    DecodeBlockKeys keys;
    if (!decode_block_keys(keys, out, lse, lengths, b, g, s, G, H, kD, Tk, window, splits)) return;
    const int64_t k0 = keys.k0, k1 = keys.k1, n_splits = keys.n_splits;

    const int64_t row_stride = int64_t(Hkv) * kD;
    const __nv_bfloat16* kb = k + int64_t(g) * kD;
    const __nv_bfloat16* vb = v + int64_t(g) * kD;
    const int32_t* table = kPaged ? tables + b * table_width : nullptr;
    // Tile [t0, t0 + kTile) into buffer `buf`; rows at or past k1 are zeros (read nothing), so a
    // short tile's P V adds 0 x 0.
    auto load_tile = [&](int64_t t0, int buf) {
        const int64_t n = k1 - t0 < kTile ? k1 - t0 : kTile;
        __nv_bfloat16* ks = kv_s + size_t(2 * buf) * kTile * kStride;
        __nv_bfloat16* vs = ks + kTile * kStride;
        for (int i = tid; i < kTile * kVecs; i += kDecodeThreads) {
            const int j = i / kVecs, c = i % kVecs;
            int64_t off = 0;
            int bytes = 0;
            if (j < n) {
                const int64_t t = t0 + j;
                const int64_t at =
                    kPaged ? int64_t(table[t / block_size]) * block_size + t % block_size
                           : b * Tk + t;
                off = at * row_stride + c * 8;
                bytes = 16;
            }
            cp_async_16(ks + j * kStride + c * 8, kb + off, bytes);
            cp_async_16(vs + j * kStride + c * 8, vb + off, bytes);
        }
    };
    load_tile(k0, 0);
    cp_async_commit();
    // The group's queries as 16 rows (zeros past G).
    for (int i = tid; i < 16 * kVecs; i += kDecodeThreads) {
        const int r = i / kVecs, c = i % kVecs;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (r < G)
            val = *reinterpret_cast<const uint4*>(q + (b * H + int64_t(g) * G + r) * kD + c * 8);
        *reinterpret_cast<uint4*>(q_s + r * kStride + c * 8) = val;
    }
    __syncthreads();
    uint32_t qa[kD / 16][4];  // Q's A fragments, one per 16 columns
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
        ldmatrix_x4(qa[kk], q_s + (lane % 16) * kStride + kk * 16 + (lane / 16) * 8);

    float o[kD / 8][4];  // O's C fragments, one per 8 columns: rows gid and gid + 8
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.0f, 0.0f};
    const int tiles = int((k1 - k0 + kTile - 1) / kTile);
    const int kw = warp * 16;  // this warp's keys in each tile
    for (int it = 0; it < tiles; ++it) {
        const int64_t t0 = k0 + int64_t(it) * kTile;
        if (it + 1 < tiles) load_tile(t0 + kTile, (it + 1) & 1);
        cp_async_commit();   // empty on the last tile: the wait below counts alike
        cp_async_wait<1>();  // tile it is in (this thread's copies) ...
        __syncthreads();     // ... and every thread's
        const int64_t n = k1 - t0 < kTile ? k1 - t0 : kTile;
        if (kw < n) {  // warp-uniform
            const __nv_bfloat16* ks = kv_s + size_t(2 * (it & 1)) * kTile * kStride;
            const __nv_bfloat16* vs = ks + kTile * kStride;
            const int mi = lane / 8, mr = lane % 8;  // ldmatrix: this lane's matrix and row
            // S: keys kw + 8 nt + (2 tig, 2 tig + 1) of rows gid, gid + 8 in sc[nt][0..3].
            float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int kk = 0; kk < kD / 16; ++kk) {
                uint32_t kf[4];
                ldmatrix_x4(kf, ks + (kw + mr + (mi / 2) * 8) * kStride + kk * 16 + (mi % 2) * 8);
                mma_bf16_m16n8k16(sc[0], qa[kk], kf[0], kf[1]);
                mma_bf16_m16n8k16(sc[1], qa[kk], kf[2], kf[3]);
            }
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kw + 8 * nt + 2 * tig + (e & 1);
                    sc[nt][e] = key < n ? sc[nt][e] * scale : -INFINITY;
                    mx[e / 2] = fmaxf(mx[e / 2], sc[nt][e]);
                }
            float carry[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
                const float m_new = fmaxf(m_r[r], mx[r]);  // finite: key kw < n is in every row
                carry[r] = expf(m_r[r] - m_new);           // 0 on this warp's first tile
                m_r[r] = m_new;
            }
            float rs[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    sc[nt][e] = expf(sc[nt][e] - m_r[e / 2]);  // exp(-inf) = 0 past n
                    rs[e / 2] += sc[nt][e];
                }
#pragma unroll
            for (int r = 0; r < 2; ++r) l_r[r] = l_r[r] * carry[r] + rs[r];
#pragma unroll
            for (int dt = 0; dt < kD / 8; ++dt) {
                o[dt][0] *= carry[0];
                o[dt][1] *= carry[0];
                o[dt][2] *= carry[1];
                o[dt][3] *= carry[1];
            }
            // P (16 rows x 16 keys) as an A fragment: C fragments of keys 0-7 and 8-15 side by
            // side; hi and lo parts.
            uint32_t ph[4], pl[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                const float x0 = sc[a / 2][2 * (a % 2)], x1 = sc[a / 2][2 * (a % 2) + 1];
                ph[a] = pack_bf16x2(x0, x1);
                const __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&ph[a]);
                const float2 hf = __bfloat1622float2(h);
                pl[a] = pack_bf16x2(x0 - hf.x, x1 - hf.y);
            }
#pragma unroll
            for (int dp = 0; dp < kD / 16; ++dp) {
                uint32_t vf[4];  // b0, b1 of columns 16 dp .. + 7, then of 16 dp + 8 .. + 15
                ldmatrix_x4_trans(vf,
                                  vs + (kw + mr + (mi % 2) * 8) * kStride + dp * 16 + (mi / 2) * 8);
                mma_bf16_m16n8k16(o[2 * dp], ph, vf[0], vf[1]);
                mma_bf16_m16n8k16(o[2 * dp], pl, vf[0], vf[1]);
                mma_bf16_m16n8k16(o[2 * dp + 1], ph, vf[2], vf[3]);
                mma_bf16_m16n8k16(o[2 * dp + 1], pl, vf[2], vf[3]);
            }
        }
        __syncthreads();  // buffer it & 1 is consumed before the next iteration reloads it
    }
    // Every copy is in (the last group was empty); the buffers become the merge area.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_r[r] += __shfl_xor_sync(kFullMask, l_r[r], 1);
        l_r[r] += __shfl_xor_sync(kFullMask, l_r[r], 2);
    }
    auto* mw = reinterpret_cast<float*>(smem);  // [warp][16]
    float* lw = mw + 4 * 16;                    // [warp][16]
    float* ow = lw + 4 * 16;                    // [warp][16][kD]
    if (tig == 0) {
        mw[warp * 16 + gid] = m_r[0];
        mw[warp * 16 + gid + 8] = m_r[1];
        lw[warp * 16 + gid] = l_r[0];
        lw[warp * 16 + gid + 8] = l_r[1];
    }
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
        *reinterpret_cast<float2*>(ow + (warp * 16 + gid) * kD + dt * 8 + 2 * tig) =
            make_float2(o[dt][0], o[dt][1]);
        *reinterpret_cast<float2*>(ow + (warp * 16 + gid + 8) * kD + dt * 8 + 2 * tig) =
            make_float2(o[dt][2], o[dt][3]);
    }
    __syncthreads();
    for (int i = tid; i < G * kD; i += kDecodeThreads) {
        const int h = i / kD, d = i % kD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < 4; ++w) M = fmaxf(M, mw[w * 16 + h]);
        float l = 0.0f, acc = 0.0f;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const float e = expf(mw[w * 16 + h] - M);  // 0 for a warp that saw no key
            l += lw[w * 16 + h] * e;
            acc += ow[(w * 16 + h) * kD + d] * e;
        }
        const int64_t bh = b * H + int64_t(g) * G + h;
        if (n_splits == 1) {
            out[bh * kD + d] = __float2bfloat16(acc / l);
            if (d == 0) lse[bh] = M + logf(l);
        } else {
            ws_acc[(bh * splits + s) * kD + d] = acc;
            if (d == 0) {
                ws_m[bh * splits + s] = M;
                ws_l[bh * splits + s] = l;
            }
        }
    }
}

// One block per (row b, head h): merges the row's n_b > 1 splits in split order (rows of one
// split, and rows of a bad length, were written by decode_split_kernel). The weights
// exp(m_s - M) go through shared memory (n_b <= kMaxSplits).
constexpr int kMaxSplits = 1024;

__global__ void __launch_bounds__(kDecodeThreads)
    decode_combine_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                          const float* __restrict__ ws_m, const float* __restrict__ ws_l,
                          const float* __restrict__ ws_acc, const int32_t* __restrict__ lengths,
                          int64_t Tk, int H, int D, int64_t window, int splits) {
    __shared__ float weight[kMaxSplits];
    const int64_t bh = blockIdx.x, b = bh / H;
    const int tid = int(threadIdx.x);
    const int64_t len = int64_t(lengths[b]);
    if (len < 1 || len > Tk) return;
    const int64_t p = len - 1;
    const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    const int64_t chunk = decode_row_chunk(p - lo + 1, splits);
    const int n = int((p - lo + chunk) / chunk);
    if (n == 1) return;
    const float* m = ws_m + bh * splits;
    const float* l = ws_l + bh * splits;
    // The splits' m and l through shared memory first (one load each, all in flight), then every
    // thread reduces them in split order: the same value on every thread.
    __shared__ float m_s[kMaxSplits], l_s[kMaxSplits];
    for (int s = tid; s < n; s += kDecodeThreads) {
        m_s[s] = m[s];
        l_s[s] = l[s];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int s = 0; s < n; ++s) M = fmaxf(M, m_s[s]);
    for (int s = tid; s < n; s += kDecodeThreads) weight[s] = expf(m_s[s] - M);
    __syncthreads();
    float total = 0.0f;
    for (int s = 0; s < n; ++s) total += l_s[s] * weight[s];
    const float* acc = ws_acc + bh * splits * D;
    constexpr int kBatch =
        8;  // acc loads in flight per thread; the sum's order stays s = 0, 1, ...
    for (int d = tid; d < D; d += kDecodeThreads) {
        float sum = 0.0f;
        int s = 0;
        for (; s + kBatch <= n; s += kBatch) {
            float a[kBatch];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) a[u] = acc[int64_t(s + u) * D + d];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) sum += a[u] * weight[s + u];
        }
        for (; s < n; ++s) sum += acc[int64_t(s) * D + d] * weight[s];
        out[bh * D + d] = __float2bfloat16(sum / total);
    }
    if (tid == 0) lse[bh] = M + logf(total);
}

// The decode path's launch plan for one call: the grid's splits S. S fills the GPU: about
// blocks_per_sm blocks per SM over the B x Hkv x S blocks (as many as fit an SM's shared memory:
// kBlocksPerSm for decode_split_kernel, kMmaBlocksPerSm for decode_mma_kernel's double-buffered
// tiles at D = 128, also used at D = 64), at least kMinChunk keys a split of the
// longest row the cache holds (Tk, or the window), at most kMaxSplits, and the workspace (B x H x S
// x (D + 2) f32) within the state's scratch. It depends on (B, Hkv, H, D, Tk, window), the kernel
// (decode_mma_takes: the shape and whether q is 16-byte aligned) and the device's SM count only,
// and a row's chunk on its length and S (decode_row_chunk): the same inputs give the same bits.
constexpr int kBlocksPerSm = 4;
constexpr int kMmaBlocksPerSm = 3;

struct DecodePlan {
    int splits = 1;
    size_t workspace_bytes = 0;  // 0 when splits == 1
};

DecodePlan decode_plan(const AttentionRowsShape& s, int sms, int blocks_per_sm) {
    const int64_t span = s.window > 0 && s.window < s.Tk ? s.window : s.Tk;
    const int64_t want = (int64_t(blocks_per_sm) * sms + s.B * s.Hkv - 1) / (s.B * s.Hkv);
    const int64_t most = (span + kMinChunk - 1) / kMinChunk;
    const size_t per_split = size_t(s.B * s.H * (s.D + 2)) * sizeof(float);
    const int64_t fit = int64_t(CudaState::kScratchBytes / per_split);
    const int64_t splits = std::max<int64_t>(1, std::min({want, most, int64_t(kMaxSplits), fit}));
    DecodePlan plan;
    // The splits the longest row uses (decode_row_chunk rounds chunks up: maybe fewer than asked).
    const int64_t chunk = decode_row_chunk(span, int(splits));
    plan.splits = int((span + chunk - 1) / chunk);
    plan.workspace_bytes = plan.splits > 1 ? size_t(plan.splits) * per_split : 0;
    return plan;
}

int sm_count(const CudaState& state) {
    int sms = 0;
    LATHE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, state.device()));
    return sms;
}

// Whether the split path runs this decode step: 16-byte K/V rows (D % 8 == 0, 16-byte aligned
// caches) and one block's shared memory within the device's limit. Otherwise the one-block-per-
// (row, head) kernel above runs it (any D <= kMaxD, any alignment, any group size).
bool decode_split_takes(const bf16* k, const bf16* v, const AttentionRowsShape& s,
                        const CudaState& state) {
    if (s.D % 8 != 0 || reinterpret_cast<uintptr_t>(k) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(v) % 16 != 0 || s.B > 65535 || s.Hkv > 65535)
        return false;
    int optin = 0;
    LATHE_CUDA_CHECK(
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, state.device()));
    return decode_smem(int(s.H / s.Hkv), int(s.D)).bytes <= size_t(optin);
}

// Whether decode_mma_kernel runs a decode step the split path takes: D of 64 or 128, at most 16
// query heads a KV head (the mma's 16 rows), a 16-byte aligned q. Otherwise decode_split_kernel.
bool decode_mma_takes(const bf16* q, const AttentionRowsShape& s) {
    return (s.D == 64 || s.D == 128) && s.H / s.Hkv <= 16 &&
           reinterpret_cast<uintptr_t>(q) % 16 == 0;
}

using DecodeKernel = void (*)(__nv_bfloat16*, float*, float*, float*, float*, const __nv_bfloat16*,
                              const __nv_bfloat16*, const __nv_bfloat16*, const int32_t*,
                              const int32_t*, int64_t, int, int64_t, int, int, int64_t, float, int);

// tables null: the contiguous cache; otherwise the paged pools (decode_*_kernel<true>).
void decode_split(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                  const int32_t* lengths, const int32_t* tables, int64_t table_width,
                  int64_t block_size, const AttentionRowsShape& s, CudaState& state,
                  CUstream_st* stream) {
    const bool mma = decode_mma_takes(q, s);
    const DecodePlan plan = decode_plan(s, sm_count(state), mma ? kMmaBlocksPerSm : kBlocksPerSm);
    const bool paged = tables != nullptr;
    size_t smem = 0;
    DecodeKernel mma_kernel = nullptr;
    if (mma && s.D == 128) {
        smem = DecodeMmaSmem<128>::kBytes;
        mma_kernel = paged ? decode_mma_kernel<true, 128> : decode_mma_kernel<false, 128>;
    } else if (mma) {
        smem = DecodeMmaSmem<64>::kBytes;
        mma_kernel = paged ? decode_mma_kernel<true, 64> : decode_mma_kernel<false, 64>;
    } else {
        smem = decode_smem(int(s.H / s.Hkv), int(s.D)).bytes;
    }
    auto* kernel = paged ? decode_split_kernel<true> : decode_split_kernel<false>;
    if (mma_kernel != nullptr)
        allow_dynamic_smem(mma_kernel, smem);
    else
        allow_dynamic_smem(kernel, smem);
    float* ws = plan.workspace_bytes > 0
                    ? static_cast<float*>(state.scratch(plan.workspace_bytes, "attention_decode"))
                    : nullptr;
    const int64_t parts = s.B * s.H * plan.splits;
    float* ws_m = ws;
    float* ws_l = ws != nullptr ? ws + parts : nullptr;
    float* ws_acc = ws != nullptr ? ws + 2 * parts : nullptr;
    auto* o = reinterpret_cast<__nv_bfloat16*>(out);
    const dim3 grid(unsigned(plan.splits), unsigned(s.Hkv), unsigned(s.B));
    const auto* qb = reinterpret_cast<const __nv_bfloat16*>(q);
    const auto* kb = reinterpret_cast<const __nv_bfloat16*>(k);
    const auto* vb = reinterpret_cast<const __nv_bfloat16*>(v);
    if (mma_kernel != nullptr)
        mma_kernel<<<grid, kDecodeThreads, smem, stream>>>(
            o, lse, ws_m, ws_l, ws_acc, qb, kb, vb, lengths, tables, table_width, int(block_size),
            s.Tk, int(s.H), int(s.Hkv), s.window, s.scale, plan.splits);
    else
        kernel<<<grid, kDecodeThreads, smem, stream>>>(
            o, lse, ws_m, ws_l, ws_acc, qb, kb, vb, lengths, tables, table_width, int(block_size),
            s.Tk, int(s.H), int(s.Hkv), int(s.D), s.window, s.scale, plan.splits);
    LATHE_CUDA_CHECK_LAUNCH();
    if (plan.splits == 1) return;
    decode_combine_kernel<<<unsigned(s.B * s.H), kDecodeThreads, 0, stream>>>(
        o, lse, ws_m, ws_l, ws_acc, lengths, s.Tk, int(s.H), int(s.D), s.window, plan.splits);
    LATHE_CUDA_CHECK_LAUNCH();
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
    if (lengths != nullptr && decode_split_takes(k, v, s, state)) {
        decode_split(out, lse, q, k, v, lengths, nullptr, 0, 0, s, state, stream);
        return;
    }
    const dim3 grid(unsigned(s.B * s.Tq), unsigned(s.H));
    attention_rows_kernel<<<grid, kWarps * kWarpSize, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(out), lse, reinterpret_cast<const __nv_bfloat16*>(q),
        reinterpret_cast<const __nv_bfloat16*>(k), reinterpret_cast<const __nv_bfloat16*>(v), docs,
        lengths, s.Tq, s.Tk, s.q_offset, int(s.H), int(s.Hkv), int(s.D), s.window, s.scale);
    LATHE_CUDA_CHECK_LAUNCH();
}

void attention_decode_paged(bf16* out, float* lse, const bf16* q, const bf16* k_pool,
                            const bf16* v_pool, const int32_t* tables, int64_t table_width,
                            int64_t block_size, const int32_t* lengths, const AttentionRowsShape& s,
                            CudaState& state, CUstream_st* stream) {
    constexpr const char* kOp = "attention_decode_paged";
    LATHE_CHECK(stream == state.stream(), "{}: not on the CudaState's stream", kOp);
    LATHE_CHECK(s.B > 0 && s.Tq == 1 && s.H > 0 && s.Hkv > 0 && s.H % s.Hkv == 0 && s.D > 0 &&
                    table_width > 0 && block_size > 0 && s.Tk == table_width * block_size,
                "{}: B={} Tq={} Tk={} H={} Hkv={} D={} table width {} block {}", kOp, s.B, s.Tq,
                s.Tk, s.H, s.Hkv, s.D, table_width, block_size);
    LATHE_CHECK(block_size <= (int64_t(1) << 30), "{}: block size {}", kOp, block_size);
    LATHE_CHECK(s.window >= 0, "{}: window {} (0 means none)", kOp, s.window);
    // The paged cache has the split path only: 16-byte K/V rows (D % 8 == 0) and a block's
    // shared memory within the device's limit.
    LATHE_CHECK(decode_split_takes(k_pool, v_pool, s, state),
                "{}: head dim D = {} with H / Hkv = {}: the paged decode kernel takes D % 8 == 0, "
                "16-byte aligned pools and its shared memory within the device's; use the row "
                "cache (kv_block_size 0)",
                kOp, s.D, s.H / s.Hkv);
    decode_split(out, lse, q, k_pool, v_pool, lengths, tables, table_width, block_size, s, state,
                 stream);
}

namespace {

// Row i of `rows` <-> row idx[i] of `pool`, in units U (16 bytes when the row's bytes allow).
template <typename U, bool kScatter>
__global__ void kv_rows_copy_kernel(U* __restrict__ dst, const U* __restrict__ src,
                                    const int32_t* __restrict__ idx, int64_t n, int units) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n * units) return;
    const int64_t r = i / units, u = i % units;
    if (kScatter && idx[r] < 0) return;  // a padding row of a CUDA-graph bucket
    const int64_t at = int64_t(idx[r]) * units + u;
    if (kScatter)
        dst[at] = src[r * units + u];
    else
        dst[r * units + u] = src[at];
}

template <bool kScatter>
void kv_rows_copy(void* dst, const void* src, const int32_t* idx, int64_t n, size_t row_bytes,
                  CUstream_st* stream) {
    if (n == 0) return;
    constexpr int kThreads = 256;
    const bool wide = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(src) % 16 == 0;
    if (wide) {
        const int units = int(row_bytes / 16);
        const unsigned blocks = unsigned((n * units + kThreads - 1) / kThreads);
        kv_rows_copy_kernel<uint4, kScatter><<<blocks, kThreads, 0, stream>>>(
            static_cast<uint4*>(dst), static_cast<const uint4*>(src), idx, n, units);
    } else {
        const int units = int(row_bytes);
        const unsigned blocks = unsigned((n * units + kThreads - 1) / kThreads);
        kv_rows_copy_kernel<unsigned char, kScatter><<<blocks, kThreads, 0, stream>>>(
            static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), idx, n,
            units);
    }
    LATHE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void kv_rows_scatter(void* pool, const void* rows, const int32_t* slots, int64_t n,
                     size_t row_bytes, CUstream_st* stream) {
    kv_rows_copy<true>(pool, rows, slots, n, row_bytes, stream);
}

void kv_rows_gather(void* rows, const void* pool, const int32_t* slots, int64_t n, size_t row_bytes,
                    CUstream_st* stream) {
    kv_rows_copy<false>(rows, pool, slots, n, row_bytes, stream);
}

}  // namespace lathe::cuda
