#pragma once
// CUDA rotary position embedding (ops/rope.h has the math, HF rotate-half convention).
//   forward:  out (B, T, Hx, D) bf16 = x rotated by +angle(pos) in its first R dims, the rest
//   copied backward: dx = dout rotated by -angle(pos) (the transpose), dx overwritten (=)
// positions (B, T) i32 or null (pos = t); cos, sin (P, R/2) f32 tables (rope_build_table, copied
// to the device). out may be x and dx may be dout (in place): one thread owns each rotated pair,
// so no restrict qualifiers on those two pointers. A position outside [0, P) traps the kernel.
// Deterministic (no reductions). Enqueued on `stream`.

#include <cstdint>

#include "core/dtype.h"

struct CUstream_st;

namespace lathe::cuda {

void rope_forward(bf16* out, const bf16* x, const int32_t* positions, const float* cos,
                  const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                  int64_t P, CUstream_st* stream);

void rope_backward(bf16* dx, const bf16* dout, const int32_t* positions, const float* cos,
                   const float* sin, int64_t B, int64_t T, int64_t Hx, int64_t D, int64_t R,
                   int64_t P, CUstream_st* stream);

// Queries (B, T, H, D) and keys (B, T, Hkv, D) in one launch, forward (+angle) or backward
// (-angle): the same bits as rope_forward / rope_backward on each.
void rope_qk(bf16* q_out, bf16* k_out, const bf16* q, const bf16* k, const int32_t* positions,
             const float* cos, const float* sin, int64_t B, int64_t T, int64_t H, int64_t Hkv,
             int64_t D, int64_t R, int64_t P, bool backward, CUstream_st* stream);

// The queries and keys of a packed q, k, v buffer in place: qkv (B, T, Hs, D), its first Hx heads
// of each row rotated (Hx = H + Hkv of Hs = H + 2 Hkv), the rest untouched; the same bits as
// rope_forward / rope_backward on those heads.
void rope_qkv(bf16* qkv, const int32_t* positions, const float* cos, const float* sin, int64_t B,
              int64_t T, int64_t Hx, int64_t Hs, int64_t D, int64_t R, int64_t P, bool backward,
              CUstream_st* stream);

// rope_qk with one thread per pair whatever the shape: the kernel every shape can take, which
// rope_qk leaves for eight pairs a thread when R/2 and D - R are multiples of 8 and the pointers
// 16-byte aligned. The tests hold the two to the same bits.
void rope_qk_one_pair_per_thread(bf16* q_out, bf16* k_out, const bf16* q, const bf16* k,
                                 const int32_t* positions, const float* cos, const float* sin,
                                 int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t R,
                                 int64_t P, bool backward, CUstream_st* stream);

}  // namespace lathe::cuda
