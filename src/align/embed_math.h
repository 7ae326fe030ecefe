#pragma once
// Arithmetic shared by the stage-3 CPU twins (glove.cpp, sgns.cpp), written to give bitwise the
// numbers their CUDA kernels give with one warp (glove.h explains the order).

#include <cstdint>

namespace lathe {

inline constexpr int kEmbedWarp = 32;

// sum_d a[d] * b[d] in warp order: 32 strided partial sums (lane l takes d = l, l + 32, ...),
// then an xor butterfly (partial[l] += partial[l ^ m], m = 16, 8, 4, 2, 1); returns partial[0].
// Each product is rounded before it is added (no FMA), as the kernels' __fmul_rn / __fadd_rn.
inline float embed_dot_warp_order(const float* __restrict__ a, const float* __restrict__ b,
                                  int64_t D) {
    float part[kEmbedWarp] = {};
    int64_t d0 = 0;
    for (; d0 + kEmbedWarp <= D; d0 += kEmbedWarp)
        for (int l = 0; l < kEmbedWarp; ++l) part[l] += a[d0 + l] * b[d0 + l];
    for (int l = 0; d0 + l < D; ++l) part[l] += a[d0 + l] * b[d0 + l];
    for (int m = kEmbedWarp / 2; m >= 1; m /= 2) {
        float next[kEmbedWarp];
        for (int l = 0; l < kEmbedWarp; ++l) next[l] = part[l] + part[l ^ m];
        for (int l = 0; l < kEmbedWarp; ++l) part[l] = next[l];
    }
    return part[0];
}

}  // namespace lathe
