#pragma once
// Casts of bf16 tensors to fp8 with their scales, the same for every backend: the CPU's
// (ops/cpu/fp8_cast.h) is the reference, the CUDA backend's (ops/cuda/fp8_cast.h) runs them in
// training. Every operand of an fp8 GEMM (ops/gemm_args.h) is made by one of these casts.
//
// Math, per scaling group G (a set of elements of x sharing one scale):
//   amax(G)      = max over G of |x|                 (a NaN in G makes it NaN; -0 counts as 0)
//   scale(G)     = fp8_max / max(amax(G), kFp8AmaxFloor)      fp32 division, rounded to nearest
//   q            = round_to_fp8(x * scale(G))        one fp32 multiply, then round to nearest even,
//                                                    saturating (core/dtype.h, kSaturate)
//   scale_inv(G) = 1 / scale(G)                      fp32; the GEMM's per-operand scale, so that
//                                                    q * scale_inv approximates x
// fp8_max is 448 (E4M3) or 57344 (E5M2). The floor keeps the scale finite for an all-zero group
// (q is then all zeros). Every step is one correctly rounded fp32 operation or an exact max, so the
// CPU and CUDA casts agree bit for bit (q, scale_inv, amax), NaN codes aside (a NaN input gives a
// NaN code of either sign on the GPU).
//
// Tensorwise (Fp8CastArgs): one group, the whole tensor (rows, cols). The scale comes either from
//   the tensor itself (current scaling: amax of x, computed by the cast or handed in by the kernel
//   that produced x) or from the caller (delayed scaling: a scale from an amax history; the cast
//   then also reports amax of x, in the same pass, for the history).
// Blockwise (Fp8BlockCastArgs), DeepSeek-V3's scheme:
//   k1x128:   groups of 1 row x 128 columns; scale_inv (rows, ceil(cols / 128)) row-major. The
//             transpose qt (cols, rows), when asked for, is quantized in groups of 1 x 128 of *its*
//             rows (128 rows x 1 column of x), scales scale_inv_t (cols, ceil(rows / 128)): the
//             layout the weight-gradient GEMM reads (K = the token dimension).
//   k128x128: groups of 128 x 128; scale_inv (ceil(rows / 128), ceil(cols / 128)) row-major; the
//             transpose qt uses the same groups (its scale for block (j, i) is scale_inv[i][j]),
//             scale_inv_t is not written.
//   Edge groups hold fewer elements (cols or rows not a multiple of 128).
//
// Layouts: x (rows, cols) bf16 row-major, contiguous; q (rows, cols) and qt (cols, rows) fp8
// (E4M3 or E5M2, `dtype`), row-major, contiguous. Pointers are in the memory of the backend that
// runs the cast (device pointers on CUDA). Deterministic: maxima are order-independent.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace lathe {

// The smallest amax a scale is computed from (see above).
inline constexpr float kFp8AmaxFloor = 1e-12f;

// The largest finite value of an fp8 dtype (448 for E4M3, 57344 for E5M2); 0 for other dtypes.
constexpr float fp8_max(DType t) {
    return t == DType::kE4M3 ? 448.0f : t == DType::kE5M2 ? 57344.0f : 0.0f;
}

constexpr bool is_fp8(DType t) {
    return t == DType::kE4M3 || t == DType::kE5M2;
}

// scale(G) from amax(G) (NaN stays NaN: std::max keeps its first argument when unordered).
inline float fp8_scale_from_amax(float amax, DType t) {
    return fp8_max(t) / (std::isnan(amax) ? amax : std::max(amax, kFp8AmaxFloor));
}

struct Fp8CastArgs {
    int64_t rows = 0, cols = 0;
    const bf16* x = nullptr;
    DType dtype = DType::kE4M3;  // of q and qt
    void* q = nullptr;           // (rows, cols), or null: not written
    void* qt = nullptr;          // (cols, rows), or null: not written (at least one of q, qt)

    // Current scaling (scale == null): *amax is amax(x). With amax_ready the caller (the kernel
    // that produced x) has written it; otherwise the cast computes it first (one more read of x).
    // Delayed scaling (scale != null): q = x * *scale, and *amax (when amax is not null) receives
    // amax(x), computed in the same pass. amax_ready is not read then.
    const float* scale = nullptr;
    float* amax = nullptr;
    bool amax_ready = false;

    float* scale_inv = nullptr;  // (1) written: 1 / the scale used
};

enum class Fp8Block : uint8_t { k1x128, k128x128 };

// Elements per side of a scaling block.
inline constexpr int64_t kFp8BlockSize = 128;

constexpr int64_t fp8_blocks(int64_t n) {
    return (n + kFp8BlockSize - 1) / kFp8BlockSize;
}

struct Fp8BlockCastArgs {
    int64_t rows = 0, cols = 0;
    const bf16* x = nullptr;
    DType dtype = DType::kE4M3;
    Fp8Block block = Fp8Block::k1x128;
    void* q = nullptr;             // (rows, cols), or null
    float* scale_inv = nullptr;    // with q: the layout of its block kind (above)
    void* qt = nullptr;            // (cols, rows), or null
    float* scale_inv_t = nullptr;  // with qt and k1x128: (cols, ceil(rows / 128))
};

}  // namespace lathe
