#pragma once
// CPU reference kernels behind ops/attention.h. q/out (B, T, H, D); k/v (B, T, Hkv, D);
// lse (B, H, T); docs (B, T) or null; window 0 = none.
#include <cstdint>

namespace lathe::cpu {

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* docs, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                       int64_t window, float scale);

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* docs, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                        int64_t D, int64_t window, float scale);

}  // namespace lathe::cpu
