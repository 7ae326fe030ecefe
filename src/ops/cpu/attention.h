#pragma once
// CPU reference kernels behind ops/attention.h. q/out (B, Tq, H, D); k/v (B, Tk, Hkv, D);
// lse (B, H, Tq); docs (B, Tk) or null; window 0 = none; queries at positions q_offset + i.
// attention_decode: q/out (B, 1, H, D), k/v caches (B, Tmax, Hkv, D), lengths (B) in [1, Tmax]
// (checked), lse (B, H, 1).
// qkv_heads 0: q, k, v (and dq, dk, dv) are tensors of their own. Otherwise H + 2 Hkv: they are
// head slices of one (B, T, H + 2 Hkv, D) buffer (q the first H heads of a row, k the next Hkv, v
// the last; the caller passes each slice's first element), out and dout stay (B, T, H, D).
#include <cstdint>

namespace lathe::cpu {

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* docs, int64_t B, int64_t Tq, int64_t Tk, int64_t q_offset,
                       int64_t H, int64_t Hkv, int64_t D, int64_t window, float scale,
                       int64_t qkv_heads = 0);

void attention_decode(float* out, float* lse, const float* q, const float* k_cache,
                      const float* v_cache, const int32_t* lengths, int64_t B, int64_t Tmax,
                      int64_t H, int64_t Hkv, int64_t D, int64_t window, float scale);

// Training shapes only (Tq == Tk == T, q_offset 0).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* docs, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                        int64_t D, int64_t window, float scale, int64_t qkv_heads = 0);

}  // namespace lathe::cpu
