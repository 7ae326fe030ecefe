#pragma once
// The shared memory of one block of the split-K decode kernel (ops/cuda/attention_rows.cu,
// decode_split_kernel: attention_decode's split path and attention_decode_paged), as a function
// of the GQA group G = H / Hkv and the head dim D: its layout for the kernel, its size for the
// host, which checks it against the device's limit before a launch and, for the paged cache, when
// the inference engine is created (ops/attention.h, attention_decode_paged_supports). Plain C++
// so that the CPU-compiled callers share the one formula; host and device functions under nvcc.

#include <cstddef>

#if defined(__CUDACC__)
#define LATHE_DECODE_HD __host__ __device__
#else
#define LATHE_DECODE_HD
#endif

namespace lathe::cuda {

inline constexpr int kDecodeTile = 64;  // keys per shared-memory tile
inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeKPad = 8;       // bf16 padding of a K row (conflict-free 16-byte reads)
inline constexpr int kDecodeHeadChunk = 4;  // heads a thread accumulates at once (registers)

struct DecodeSmem {
    // Byte offsets into the dynamic shared memory of one block, and its size.
    size_t k, v, q, p, pt, acc, stats, red, bytes;
};

// G rounded up to a multiple of 4: the row of the transposed p (16-byte reads of 4 heads).
LATHE_DECODE_HD inline int decode_heads_padded(int G) {
    return (G + 3) / 4 * 4;
}

// D / 2 lanes per head in the value pass: D <= 2 kDecodeThreads (else `groups` is 0).
LATHE_DECODE_HD inline DecodeSmem decode_smem(int G, int D) {
    const int groups = kDecodeThreads / (D / 2), hc = G < kDecodeHeadChunk ? G : kDecodeHeadChunk;
    DecodeSmem s{};
    s.k = 0;                                                          // kTile x (D + kKPad) bf16
    s.v = s.k + size_t(kDecodeTile) * (D + kDecodeKPad) * 2;          // kTile x D bf16
    s.q = s.v + size_t(kDecodeTile) * D * 2;                          // G x D f32 (scaled query)
    s.p = s.q + size_t(G) * D * 4;                                    // 2 x G x kTile f32 (halves)
    s.pt = s.p + size_t(2) * G * kDecodeTile * 4;                     // kTile x Gp f32 (key-major)
    s.acc = s.pt + size_t(kDecodeTile) * decode_heads_padded(G) * 4;  // G x D f32
    s.stats = s.acc + size_t(G) * D * 4;                              // m, l, carry: 3 x G f32
    s.red = (s.stats + size_t(3) * G * 4 + 15) / 16 * 16;  // groups x hc x D f32 (P V sums)
    s.bytes = s.red + size_t(groups) * hc * D * 4;
    return s;
}

}  // namespace lathe::cuda
