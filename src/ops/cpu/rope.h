#pragma once
// CPU reference kernels behind ops/rope.h. x/out are (B, T, Hx, D); cos, sin are (P, R/2).
// stored_heads 0, or the heads a (b, t) row holds in storage when x/out are the first Hx heads of
// wider rows (a packed q, k, v buffer: Hx = H + Hkv of H + 2 Hkv); the rest is not touched.
#include <cstdint>

namespace lathe::cpu {

// positions may be null (pos = t). out may equal x.
void rope_forward(float* out, const float* x, const int32_t* positions, const float* cos,
                  const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                  int64_t P, int64_t stored_heads = 0);
// dx may equal dout.
void rope_backward(float* dx, const float* dout, const int32_t* positions, const float* cos,
                   const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                   int64_t P, int64_t stored_heads = 0);

}  // namespace lathe::cpu
