#pragma once
// CPU reference kernels behind ops/embedding.h (raw f32 pointers, sizes explicit).
#include <cstdint>

namespace lathe::cpu {

// positions, wpe may be null.
void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int64_t B, int64_t T, int64_t C,
                       int64_t V, int64_t P);
// dwte, dwpe may be null; positions may be null.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T, int64_t C, int64_t V,
                        int64_t P);

}  // namespace lathe::cpu
